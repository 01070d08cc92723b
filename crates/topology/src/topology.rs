//! The [`Topology`] type and its queries.

use std::fmt;
use std::ops::Range;

/// The largest tree this crate builds or accepts, in nodes. It protects the front-end
/// against hostile or mistyped specs such as `balanced:1000x1000x1000`.
pub const MAX_NODES: usize = 1_000_000;

/// One process of the tree: the front-end (the root), a comm node (interior) or a
/// back-end (a leaf).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopoNode {
    /// Host the process runs on, kept whole (`n1.cluster.example.org`), with the user
    /// ssh logs in as when one was given (`bob@n1`; see
    /// [`hostlist::bare_host`](crate::hostlist::bare_host)).
    pub host: String,
    /// Index of the process on its host; unique per host.
    pub index: u32,
    /// Id of the parent node; `None` for the root.
    pub parent: Option<usize>,
    /// Ids of the children, in the order they were listed.
    pub children: Vec<usize>,
}

impl TopoNode {
    /// The node's name as written in topology files: `host:index`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.host, self.index)
    }
}

impl fmt::Display for TopoNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.index)
    }
}

/// A validated tree of processes.
///
/// Nodes are stored in depth-first pre-order from the root, children in the order they
/// were listed: the root has id 0 and every sub-tree's node ids are contiguous
/// (`id .. id + subtree_len(id)`). Leaves are the back-ends; their ranks `0..N` follow
/// the same pre-order, so every sub-tree's back-end ranks are contiguous too
/// (`first_rank(id) .. first_rank(id) + subtree_backends(id)`).
///
/// A one-node tree (a lone front-end) has no back-ends: its root is not a leaf.
///
/// Build one with [`Topology::parse`], [`Topology::generate`] or [`Topology::from_spec`];
/// every constructor validates, so a `Topology` is always a well-formed tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<TopoNode>,
    /// `leaves_before[i]`: number of leaves among ids `0..i`; length `len() + 1`.
    leaves_before: Vec<u32>,
    /// Number of nodes in the sub-tree of each node.
    sizes: Vec<u32>,
    /// Edges from the root to each node.
    depths: Vec<u32>,
    /// Maximum of `depths`.
    depth: usize,
}

impl Topology {
    /// Builds the cached tables from nodes already in pre-order with consistent links.
    pub(crate) fn from_preorder(nodes: Vec<TopoNode>) -> Topology {
        let n = nodes.len();
        let lone = n == 1;
        let mut leaves_before = Vec::with_capacity(n + 1);
        let mut count = 0u32;
        let mut depths = vec![0u32; n];
        for (i, node) in nodes.iter().enumerate() {
            leaves_before.push(count);
            if node.children.is_empty() && !lone {
                count += 1;
            }
            if let Some(p) = node.parent {
                depths[i] = depths[p] + 1;
            }
        }
        leaves_before.push(count);
        let mut sizes = vec![1u32; n];
        for i in (0..n).rev() {
            if let Some(p) = nodes[i].parent {
                sizes[p] += sizes[i];
            }
        }
        let depth = depths.iter().copied().max().unwrap_or(0) as usize;
        Topology { nodes, leaves_before, sizes, depths, depth }
    }

    /// Builds a tree from child lists in any numbering: `label(old_id, preorder_id)` names
    /// each node. Walks without recursion, so chains of any length are fine. The caller
    /// guarantees a tree (every node reachable from `root` exactly once).
    pub(crate) fn from_children(
        root: usize,
        children: &[Vec<usize>],
        mut label: impl FnMut(usize, usize) -> (String, u32),
    ) -> Topology {
        let mut new_id = vec![usize::MAX; children.len()];
        let mut order = Vec::with_capacity(children.len());
        let mut stack = vec![root];
        while let Some(old) = stack.pop() {
            new_id[old] = order.len();
            order.push(old);
            stack.extend(children[old].iter().rev());
        }
        let mut nodes: Vec<TopoNode> = Vec::with_capacity(order.len());
        for (id, &old) in order.iter().enumerate() {
            let (host, index) = label(old, id);
            nodes.push(TopoNode {
                host,
                index,
                parent: None,
                children: children[old].iter().map(|&c| new_id[c]).collect(),
            });
        }
        for id in 0..nodes.len() {
            for k in 0..nodes[id].children.len() {
                let c = nodes[id].children[k];
                nodes[c].parent = Some(id);
            }
        }
        Topology::from_preorder(nodes)
    }

    /// All nodes, in pre-order; index 0 is the root.
    pub fn nodes(&self) -> &[TopoNode] {
        &self.nodes
    }

    /// The node with this id.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn node(&self, id: usize) -> &TopoNode {
        &self.nodes[id]
    }

    /// The number of nodes, front-end included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a topology has at least its root. Present for API symmetry with
    /// [`len`](Self::len).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The id of the root (the front-end): always 0.
    pub fn root(&self) -> usize {
        0
    }

    /// Whether the node is a back-end: a node with no children, other than a lone root.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn is_leaf(&self, id: usize) -> bool {
        self.nodes[id].children.is_empty() && self.nodes.len() > 1
    }

    /// The number of back-ends (leaves); 0 for a one-node tree.
    pub fn backends(&self) -> usize {
        self.leaves_before[self.nodes.len()] as usize
    }

    /// The number of comm nodes: interior nodes other than the root.
    pub fn comm_nodes(&self) -> usize {
        self.nodes.len().saturating_sub(1 + self.backends())
    }

    /// The back-end rank of a leaf; `None` for the root and comm nodes.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn backend_rank(&self, id: usize) -> Option<u32> {
        self.is_leaf(id).then(|| self.leaves_before[id])
    }

    /// The rank of the first back-end under `id` (its own rank for a leaf). For a node
    /// without back-ends under it (a lone root) this is 0.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn first_rank(&self, id: usize) -> u32 {
        assert!(id < self.nodes.len(), "node id {id} out of range (tree has {} nodes)", self.nodes.len());
        self.leaves_before[id]
    }

    /// The number of back-ends in the sub-tree rooted at `id` (1 for a leaf).
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn subtree_backends(&self, id: usize) -> usize {
        let end = id + self.sizes[id] as usize;
        (self.leaves_before[end] - self.leaves_before[id]) as usize
    }

    /// The back-end ranks in the sub-tree rooted at `id`:
    /// `first_rank(id) .. first_rank(id) + subtree_backends(id)`.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn rank_range(&self, id: usize) -> Range<u32> {
        let end = id + self.sizes[id] as usize;
        self.leaves_before[id]..self.leaves_before[end]
    }

    /// The number of nodes in the sub-tree rooted at `id`, `id` included; the sub-tree's
    /// ids are `id .. id + subtree_len(id)`.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn subtree_len(&self, id: usize) -> usize {
        self.sizes[id] as usize
    }

    /// The number of edges on the longest root-to-leaf path (0 for a one-node tree).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The number of edges from the root to `id`.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn node_depth(&self, id: usize) -> usize {
        self.depths[id] as usize
    }

    /// The id of the leaf with this back-end rank, if there is one.
    pub fn leaf_of_rank(&self, rank: u32) -> Option<usize> {
        if rank as usize >= self.backends() {
            return None;
        }
        // The leaf with rank r is the last id i with leaves_before[i] == r.
        let i = self.leaves_before.partition_point(|&c| c <= rank);
        Some(i - 1)
    }

    /// The id of the node named `host:index`, if it is in the tree. Linear in the size.
    pub fn find(&self, host: &str, index: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.index == index && n.host == host)
    }

    /// The sub-tree rooted at `id` as a topology of its own, in the same pre-order: node
    /// `id` becomes node 0 and node `id + k` becomes node `k`. Back-end ranks restart at 0
    /// (subtract [`first_rank`](Self::first_rank) to map them back). The sub-tree of a
    /// leaf is a one-node tree, which has no back-ends.
    ///
    /// # Panics
    ///
    /// If `id >= self.len()`.
    pub fn subtree(&self, id: usize) -> Topology {
        let range = id..id + self.sizes[id] as usize;
        let nodes = self.nodes[range]
            .iter()
            .enumerate()
            .map(|(k, n)| TopoNode {
                host: n.host.clone(),
                index: n.index,
                parent: if k == 0 { None } else { n.parent.map(|p| p - id) },
                children: n.children.iter().map(|c| c - id).collect(),
            })
            .collect();
        Topology::from_preorder(nodes)
    }

    /// Writes the tree in the MRNet text format, one statement per interior node in
    /// pre-order (long child lists wrap onto indented lines). `Topology::parse` of the
    /// result gives back an equal topology; a one-node tree is written `host:index ;`.
    pub fn to_mrnet(&self) -> String {
        use std::fmt::Write as _;
        const PER_LINE: usize = 8;
        let mut out = String::new();
        if self.nodes.len() == 1 {
            let _ = writeln!(out, "{} ;", self.nodes[0]);
            return out;
        }
        for node in &self.nodes {
            if node.children.is_empty() {
                continue;
            }
            let _ = write!(out, "{} =>", node);
            for (k, &c) in node.children.iter().enumerate() {
                if k > 0 && k % PER_LINE == 0 {
                    out.push_str("\n   ");
                }
                let _ = write!(out, " {}", self.nodes[c]);
            }
            out.push_str(" ;\n");
        }
        out
    }
}
