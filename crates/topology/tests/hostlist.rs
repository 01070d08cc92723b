//! Integration tests of host lists and host-based trees (`Topology::from_hosts`).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

mod common;

use common::check_invariants;
use proptest::prelude::*;
use treecast_topology::hostlist::{compress, expand};
use treecast_topology::{Shape, Topology, TopologyError, MAX_NODES};

fn hosts(expr: &str) -> Vec<String> {
    expand(expr).unwrap_or_else(|e| panic!("{e}"))
}

fn tree(expr: &str, fanout: usize, per_host: usize, fe: &str) -> Topology {
    Topology::from_hosts_spec(expr, fanout, per_host, fe).unwrap_or_else(|e| panic!("{e}"))
}

/// Everything `from_hosts` promises about a tree built over `hosts`.
fn check_host_tree(t: &Topology, hosts: &[String], fanout: usize, per_host: usize, fe: &str) {
    check_invariants(t);
    let n = hosts.len() * per_host;
    assert_eq!(t.backends(), n);
    assert_eq!(t.node(0).name(), format!("{fe}:0"));
    // Minimal depth: the smallest d with fanout^d >= n.
    let mut d = 1;
    while fanout.pow(d as u32) < n {
        d += 1;
    }
    assert_eq!(t.depth(), d, "{}", t.to_mrnet());
    let base = |h: &str| u32::from(h == fe);
    let mut comm_indexes: HashMap<&str, Vec<u32>> = HashMap::new();
    for id in 0..t.len() {
        let node = t.node(id);
        assert!(node.children.len() <= fanout, "{node} has {} children", node.children.len());
        if let Some(rank) = t.backend_rank(id) {
            // Ranks in host order, back-ends on their own host, indexes 0.. per host.
            let h = &hosts[rank as usize / per_host];
            assert_eq!(&node.host, h);
            assert_eq!(node.index, base(h) + rank % per_host as u32);
        } else if id != 0 {
            // A comm node runs on the host of the first back-end it serves.
            let first = t.leaf_of_rank(t.first_rank(id)).unwrap();
            assert_eq!(node.host, t.node(first).host);
            assert!(t.rank_range(id).any(|r| hosts[r as usize / per_host] == node.host));
            comm_indexes
                .entry(hosts.iter().find(|h| **h == node.host).unwrap())
                .or_default()
                .push(node.index);
        }
    }
    // Comm nodes take the indexes just after their host's back-ends, in pre-order.
    for (h, idx) in comm_indexes {
        let start = base(h) + per_host as u32;
        assert_eq!(idx, (start..start + idx.len() as u32).collect::<Vec<_>>(), "on {h}");
    }
    // Same shape as kary:F.
    let k = Topology::generate(&Shape::Kary(fanout), Some(n), "x").unwrap();
    assert_eq!(t.len(), k.len());
    for id in 0..t.len() {
        assert_eq!(t.node(id).children, k.node(id).children);
    }
    // The text format keeps everything.
    assert_eq!(Topology::parse(&t.to_mrnet()).unwrap(), *t);
}

#[test]
fn eight_hosts_fanout_three() {
    let h = hosts("n[1-8]");
    let t = Topology::from_hosts(&h, 3, 1, "fe").unwrap();
    assert_eq!(t.depth(), 2);
    assert_eq!(t.comm_nodes(), 3);
    check_host_tree(&t, &h, 3, 1, "fe");
    assert_eq!(
        t.to_mrnet(),
        "fe:0 => n1:1 n4:1 n7:1 ;\nn1:1 => n1:0 n2:0 n3:0 ;\nn4:1 => n4:0 n5:0 n6:0 ;\nn7:1 => n7:0 n8:0 ;\n"
    );
}

#[test]
fn several_backends_per_host() {
    // 4 hosts x 2 back-ends, fan-out 3: depth 2, comm nodes on h1, h2 (second share) and h4.
    let h = hosts("h[1-4]");
    let t = Topology::from_hosts(&h, 3, 2, "fe").unwrap();
    check_host_tree(&t, &h, 3, 2, "fe");
    assert_eq!(
        t.to_mrnet(),
        "fe:0 => h1:2 h2:2 h4:2 ;\nh1:2 => h1:0 h1:1 h2:0 ;\nh2:2 => h2:1 h3:0 h3:1 ;\nh4:2 => h4:0 h4:1 ;\n"
    );
    // More back-ends per host than the fan-out: several comm nodes on one host.
    let t = Topology::from_hosts(&h, 2, 4, "fe").unwrap();
    check_host_tree(&t, &h, 2, 4, "fe");
    assert!(t.find("h1", 6).is_some(), "{}", t.to_mrnet());
}

#[test]
fn small_trees_are_flat() {
    let h = hosts("a,b,c");
    let t = Topology::from_hosts(&h, 8, 2, "fe").unwrap();
    assert_eq!((t.depth(), t.comm_nodes(), t.backends()), (1, 0, 6));
    assert_eq!(t.to_mrnet(), "fe:0 => a:0 a:1 b:0 b:1 c:0 c:1 ;\n");
    let t = Topology::from_hosts(&h, 3, 1, "fe").unwrap();
    assert_eq!(t.to_mrnet(), "fe:0 => a:0 b:0 c:0 ;\n");
    let t = Topology::from_hosts(&hosts("solo"), 2, 1, "fe").unwrap();
    assert_eq!(t.to_mrnet(), "fe:0 => solo:0 ;\n");
}

#[test]
fn dotted_host_names_are_kept_whole() {
    let expr = "n[01-05].cluster.example.org";
    let t = tree(expr, 2, 1, "fe.cluster.example.org");
    let h = hosts(expr);
    check_host_tree(&t, &h, 2, 1, "fe.cluster.example.org");
    assert_eq!(t.node(0).host, "fe.cluster.example.org");
    for id in 1..t.len() {
        assert!(t.node(id).host.ends_with(".cluster.example.org"), "{}", t.node(id));
    }
    let text = t.to_mrnet();
    assert!(text.contains("n05.cluster.example.org:0"), "{text}");
    assert_eq!(Topology::parse(&text).unwrap(), t);
}

#[test]
fn front_end_host_in_the_list() {
    let h = hosts("h[1-4]");
    let t = Topology::from_hosts(&h, 2, 2, "h1").unwrap();
    check_host_tree(&t, &h, 2, 2, "h1");
    assert_eq!(t.node(0).name(), "h1:0");
    // h1's back-ends move up to 1 and 2, its comm nodes start at 3.
    assert!(t.find("h1", 1).is_some_and(|id| t.is_leaf(id)));
    assert!(t.find("h1", 3).is_some_and(|id| !t.is_leaf(id)));
}

#[test]
fn mixed_list_from_spec() {
    let t = tree("rack[1-2]-n[01-03], login1", 4, 3, "fe");
    let h = hosts("rack[1-2]-n[01-03],login1");
    assert_eq!(h.len(), 7);
    check_host_tree(&t, &h, 4, 3, "fe");
    assert_eq!(t.node(t.leaf_of_rank(20).unwrap()).name(), "login1:2");
}

#[test]
fn errors() {
    let h = hosts("a,b");
    assert_eq!(Topology::from_hosts(&[], 2, 1, "fe"), Err(TopologyError::NoHosts));
    assert!(matches!(Topology::from_hosts(&h, 1, 1, "fe"), Err(TopologyError::FanoutTooSmall { .. })));
    assert_eq!(Topology::from_hosts(&h, 2, 0, "fe"), Err(TopologyError::NoBackends));
    assert!(matches!(Topology::from_hosts(&h, 2, 1, "f e"), Err(TopologyError::BadHostName { .. })));
    let bad = vec!["a".to_string(), "b[1]".to_string()];
    assert!(matches!(Topology::from_hosts(&bad, 2, 1, "fe"), Err(TopologyError::BadHostName { .. })));
    let twice = vec!["a".to_string(), "b".to_string(), "a".to_string()];
    let e = Topology::from_hosts(&twice, 2, 1, "fe").unwrap_err();
    assert_eq!(e, TopologyError::RepeatedHost { host: "a".to_string(), first: 1, second: 3 });
    assert!(e.to_string().contains("`a` is listed twice"), "{e}");
    assert!(matches!(Topology::from_hosts(&h, 2, MAX_NODES, "fe"), Err(TopologyError::TooLarge { .. })));
    assert!(matches!(Topology::from_hosts(&h, 2, usize::MAX, "fe"), Err(TopologyError::TooLarge { .. })));
    // Host-list errors come through from_hosts_spec.
    assert!(matches!(
        Topology::from_hosts_spec("n[5-3]", 2, 1, "fe"),
        Err(TopologyError::BadHostList { column: 3, .. })
    ));
    // Repeats are dropped, as ClusterShell's node sets have none.
    assert_eq!(Topology::from_hosts_spec("n[1-3],n2", 2, 1, "fe").unwrap().backends(), 3);
    // A host is a host, with or without a user.
    let bob = vec!["bob@a".to_string(), "a".to_string()];
    assert!(matches!(Topology::from_hosts(&bob, 2, 1, "fe"), Err(TopologyError::RepeatedHost { .. })));
    let dash = vec!["a".to_string(), "-Fevil".to_string()];
    let e = Topology::from_hosts(&dash, 2, 1, "fe").unwrap_err();
    assert!(e.to_string().contains("starts with a letter or a digit"), "{e}");
}

#[test]
fn compress_shows_the_hosts_of_a_tree() {
    let expr = "node[01-16,20],login1";
    let h = hosts(expr);
    let t = Topology::from_hosts(&h, 4, 1, "fe").unwrap();
    let mut seen = Vec::new();
    for id in 1..t.len() {
        if t.is_leaf(id) {
            seen.push(t.node(id).host.clone());
        }
    }
    assert_eq!(compress(&seen), expr);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn host_trees_are_well_formed(
        n_hosts in 1usize..60,
        fanout in 2usize..7,
        per_host in 1usize..5,
        fe_in_list in any::<bool>(),
    ) {
        let h: Vec<String> = (1..=n_hosts).map(|i| format!("n{i:03}.c.org")).collect();
        let fe = if fe_in_list { "n001.c.org" } else { "fe.c.org" };
        let t = Topology::from_hosts(&h, fanout, per_host, fe).unwrap();
        check_host_tree(&t, &h, fanout, per_host, fe);
    }
}

/// Expressions on which ClusterShell 1.10.1 (`nodeset -e`, same hosts; it sorts them)
/// and pdsh 2.34 (`pdsh -N -R exec -f 1 -w EXPR echo %h`, same hosts in the same order)
/// agree: padding, several bracket groups, suffixes, FQDNs, addresses. Where they
/// differ, treecast takes one side on purpose (see `docs/topology-format.md`).
#[test]
fn agrees_with_clustershell_and_pdsh() {
    for (expr, want) in [
        ("login1", "login1"),
        ("a,b,c", "a b c"),
        ("n1.cluster.org,n2.cluster.org", "n1.cluster.org n2.cluster.org"),
        ("h[1-4],login1", "h1 h2 h3 h4 login1"),
        ("node[01-03,20]", "node01 node02 node03 node20"),
        ("node[08-11]", "node08 node09 node10 node11"),
        ("node[8-11]", "node8 node9 node10 node11"),
        ("n[0-2]", "n0 n1 n2"),
        ("n[098-100]", "n098 n099 n100"),
        ("n[00]", "n00"),
        ("n[007,8]", "n007 n8"),
        ("rack[1-2]-n[01-03]", "rack1-n01 rack1-n02 rack1-n03 rack2-n01 rack2-n02 rack2-n03"),
        ("[1-2]x[3,5].org", "1x3.org 1x5.org 2x3.org 2x5.org"),
        ("n[1-2].cluster.org", "n1.cluster.org n2.cluster.org"),
        ("n[1-3]-ib", "n1-ib n2-ib n3-ib"),
        ("gpu[01-04].rack[1-2].example.com", "gpu01.rack1.example.com gpu01.rack2.example.com gpu02.rack1.example.com gpu02.rack2.example.com gpu03.rack1.example.com gpu03.rack2.example.com gpu04.rack1.example.com gpu04.rack2.example.com"),
        ("n[1-3],n[5-7]", "n1 n2 n3 n5 n6 n7"),
        ("n[1-3,5-7]", "n1 n2 n3 n5 n6 n7"),
        ("n[9-11]", "n9 n10 n11"),
        ("n[09-11]", "n09 n10 n11"),
        ("n[1-3]a,n[1-3]b", "n1a n2a n3a n1b n2b n3b"),
        ("n-1_x", "n-1_x"),
        ("10.0.0.[1-3]", "10.0.0.1 10.0.0.2 10.0.0.3"),
        ("n[1-16]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10 n11 n12 n13 n14 n15 n16"),
        ("n[001-010]", "n001 n002 n003 n004 n005 n006 n007 n008 n009 n010"),
        ("n[1,3,5]", "n1 n3 n5"),
        ("node[1-2],node[3-4]", "node1 node2 node3 node4"),
        ("a1,a2,a3", "a1 a2 a3"),
        ("n[3,1-2],login", "n3 n1 n2 login"),
        ("n[0-1]", "n0 n1"),
    ] {
        let want: Vec<&str> = want.split(' ').collect();
        assert_eq!(hosts(expr), want, "{expr}");
        // Writing them back and reading again changes nothing.
        assert_eq!(hosts(&compress(&hosts(expr))).len(), want.len(), "{expr}");
    }
}

#[test]
fn users_go_to_ssh_and_hosts_place_the_tree() {
    let h = hosts("bob@h[1-4]");
    let t = Topology::from_hosts(&h, 2, 2, "h1").unwrap();
    assert_eq!(t.node(0).name(), "h1:0");
    // bob@h1 is the front-end's host: its back-ends move up by one.
    assert!(t.find("bob@h1", 1).is_some_and(|id| t.is_leaf(id)), "{}", t.to_mrnet());
    assert!(t.find("bob@h1", 0).is_none());
    assert_eq!(Topology::parse(&t.to_mrnet()).unwrap(), t);
}
