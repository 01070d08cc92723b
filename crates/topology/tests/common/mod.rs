//! Checks shared by the topology test binaries.

use treecast_topology::Topology;

/// Every invariant a topology promises: pre-order ids, unique names, contiguous
/// ranks per sub-tree, and consistent counts.
pub(crate) fn check_invariants(t: &Topology) {
    assert!(!t.is_empty());
    assert_eq!(t.root(), 0);
    assert_eq!(t.node(0).parent, None);
    assert_eq!(t.subtree_len(0), t.len());
    let mut next_rank = 0u32;
    let mut leaves = 0;
    let mut names = std::collections::HashSet::new();
    for id in 0..t.len() {
        let node = t.node(id);
        assert!(names.insert((node.host.clone(), node.index)), "duplicate {node}");
        // Pre-order: the first child follows its parent, and siblings' sub-trees abut.
        let mut expect = id + 1;
        for &c in &node.children {
            assert_eq!(c, expect, "pre-order broken at {id}");
            assert_eq!(t.node(c).parent, Some(id));
            expect += t.subtree_len(c);
        }
        assert_eq!(expect, id + t.subtree_len(id));
        assert_eq!(t.first_rank(id), next_rank);
        if t.is_leaf(id) {
            assert_eq!(t.backend_rank(id), Some(next_rank));
            assert_eq!(t.leaf_of_rank(next_rank), Some(id));
            assert_eq!(t.first_rank(id), next_rank);
            assert_eq!(t.subtree_backends(id), 1);
            next_rank += 1;
            leaves += 1;
        } else {
            assert_eq!(t.backend_rank(id), None);
            // Ranks under an interior node are those of its children's sub-trees, in order.
            let mut r = t.first_rank(id);
            for &c in &node.children {
                assert_eq!(t.first_rank(c), r);
                r += t.subtree_backends(c) as u32;
            }
            assert_eq!(r, t.first_rank(id) + t.subtree_backends(id) as u32);
        }
        assert_eq!(t.rank_range(id), t.first_rank(id)..t.first_rank(id) + t.subtree_backends(id) as u32);
    }
    assert_eq!(t.backends(), leaves);
    assert_eq!(t.leaf_of_rank(leaves as u32), None);
    let interior = t.len() - leaves;
    assert_eq!(t.comm_nodes(), interior.saturating_sub(1));
    assert_eq!(t.depth(), (0..t.len()).map(|i| t.node_depth(i)).max().unwrap());
}
