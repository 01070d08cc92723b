//! The human-readable picture of a tree.

use std::collections::BTreeSet;
use std::fmt;
use std::fmt::Write as _;

use crate::Topology;

/// Trees up to this many nodes are drawn node by node; larger ones are summarised.
pub(crate) const RENDER_FULL_LIMIT: usize = 200;

fn label(t: &Topology, id: usize) -> String {
    let node = t.node(id);
    match t.backend_rank(id) {
        _ if id == t.root() => format!("{node} (front-end)"),
        Some(rank) => format!("{node} (back-end rank {rank})"),
        None => format!("{node} (comm node)"),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl Topology {
    /// A human-readable picture of the tree for people, ending with the line
    /// `N back-ends, M comm nodes, depth D`. Trees of up to 200 nodes are drawn node by
    /// node; larger ones are summarised per level (node counts and fan-outs).
    pub fn render(&self) -> String {
        render(self)
    }
}
impl fmt::Display for Topology {
    /// The same text as [`Topology::render`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

pub(crate) fn render(t: &Topology) -> String {
    let mut out = String::new();
    if t.len() <= RENDER_FULL_LIMIT {
        draw(t, &mut out);
    } else {
        summarise(t, &mut out);
    }
    let _ = writeln!(
        out,
        "{}, {}, depth {}",
        plural(t.backends(), "back-end", "back-ends"),
        plural(t.comm_nodes(), "comm node", "comm nodes"),
        t.depth()
    );
    out
}

/// Draws every node with box-drawing branches.
fn draw(t: &Topology, out: &mut String) {
    let _ = writeln!(out, "{}", label(t, t.root()));
    // Stack of (node, prefix for its children, whether it is its parent's last child).
    let mut stack: Vec<(usize, String)> = Vec::new();
    let push_children = |stack: &mut Vec<(usize, String)>, id: usize, prefix: &str| {
        let kids = &t.node(id).children;
        for (k, &c) in kids.iter().enumerate().rev() {
            let last = k + 1 == kids.len();
            stack.push((c, format!("{prefix}{}", if last { "└── " } else { "├── " })));
        }
    };
    push_children(&mut stack, t.root(), "");
    while let Some((id, line_prefix)) = stack.pop() {
        let _ = writeln!(out, "{line_prefix}{}", label(t, id));
        // The prefix for this node's children continues the lines of its ancestors.
        let base = &line_prefix[..line_prefix.len() - "├── ".len()];
        let cont = if line_prefix.ends_with("└── ") { "    " } else { "│   " };
        let prefix = format!("{base}{cont}");
        push_children(&mut stack, id, &prefix);
    }
}

/// One line per level: how many nodes of each kind and the fan-outs of its interior nodes.
fn summarise(t: &Topology, out: &mut String) {
    let hosts: BTreeSet<&str> = t.nodes().iter().map(|n| n.host.as_str()).collect();
    let _ = writeln!(
        out,
        "{}, {} nodes on {}, {} levels:",
        label(t, t.root()),
        t.len(),
        plural(hosts.len(), "host", "hosts"),
        t.depth() + 1
    );
    #[derive(Default, Clone)]
    struct Level {
        interior: usize,
        leaves: usize,
        min_fan: usize,
        max_fan: usize,
        first_rank: Option<u32>,
        last_rank: u32,
    }
    let mut levels = vec![Level { min_fan: usize::MAX, ..Level::default() }; t.depth() + 1];
    for id in 0..t.len() {
        let l = &mut levels[t.node_depth(id)];
        let fan = t.node(id).children.len();
        if let Some(rank) = t.backend_rank(id) {
            l.leaves += 1;
            l.first_rank.get_or_insert(rank);
            l.last_rank = rank;
        } else {
            l.interior += 1;
            l.min_fan = l.min_fan.min(fan);
            l.max_fan = l.max_fan.max(fan);
        }
    }
    for (d, l) in levels.iter().enumerate() {
        let mut parts = Vec::new();
        if l.interior > 0 {
            let what =
                if d == 0 { "front-end".to_string() } else { plural(l.interior, "comm node", "comm nodes") };
            let fan = if l.min_fan == l.max_fan {
                format!("{}", l.min_fan)
            } else {
                format!("{}..{}", l.min_fan, l.max_fan)
            };
            parts.push(format!("{what} (fan-out {fan})"));
        }
        if let Some(first) = l.first_rank {
            let span = (l.last_rank - first) as usize + 1;
            let ranks = if first == l.last_rank {
                format!(" (rank {first})")
            } else if span == l.leaves {
                format!(" (ranks {first}-{})", l.last_rank)
            } else {
                String::new()
            };
            parts.push(format!("{}{ranks}", plural(l.leaves, "back-end", "back-ends")));
        }
        let _ = writeln!(out, "level {d}: {}", parts.join(", "));
    }
}
