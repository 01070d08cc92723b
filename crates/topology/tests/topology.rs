//! Integration tests of treecast-topology, grouped by area: parse, errors, generate,
//! queries, render, spec, properties.
#![allow(clippy::unwrap_used)]

mod common;

use common::check_invariants;
use proptest::prelude::*;
use treecast_topology::{Shape, Topology, TopologyError, MAX_NODES};

fn parse(text: &str) -> Topology {
    Topology::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn err(text: &str) -> TopologyError {
    match Topology::parse(text) {
        Ok(t) => panic!("parsed:\n{}", t.to_mrnet()),
        Err(e) => e,
    }
}

/// Line and column of a text error, from its message.
fn line_col(e: &TopologyError) -> (usize, usize) {
    let msg = e.to_string();
    let rest = msg.strip_prefix("topology line ").unwrap_or_else(|| panic!("no position: {msg}"));
    let (line, rest) = rest.split_once(", column ").unwrap();
    let (col, _) = rest.split_once(':').unwrap();
    (line.parse().unwrap(), col.parse().unwrap())
}

fn gen(spec: &str, n: Option<usize>) -> Topology {
    Topology::generate(&spec.parse::<Shape>().unwrap(), n, "localhost").unwrap_or_else(|e| panic!("{e}"))
}

fn gen_err(spec: &str, n: Option<usize>) -> TopologyError {
    Topology::generate(&spec.parse::<Shape>().unwrap(), n, "localhost").unwrap_err()
}

// ---------------------------------------------------------------- parse

#[test]
fn parse_simple_tree_in_preorder() {
    let t = parse("fe:0 => c:1 c:2 ;\nc:1 => b:1 b:2 ;\nc:2 => b:3 ;\n");
    let names: Vec<String> = t.nodes().iter().map(|n| n.name()).collect();
    assert_eq!(names, ["fe:0", "c:1", "b:1", "b:2", "c:2", "b:3"]);
    assert_eq!(t.backends(), 3);
    assert_eq!(t.comm_nodes(), 2);
    assert_eq!(t.depth(), 2);
    assert_eq!(t.backend_rank(2), Some(0));
    assert_eq!(t.backend_rank(5), Some(2));
    assert_eq!(t.first_rank(4), 2);
    check_invariants(&t);
}

#[test]
fn parse_statements_in_any_order() {
    let t = parse("c:2 => b:3 ;\nc:1 => b:1 b:2 ;\nfe:0 => c:1 c:2 ;\n");
    assert_eq!(t, parse("fe:0 => c:1 c:2 ; c:1 => b:1 b:2 ; c:2 => b:3 ;"));
}

#[test]
fn parse_comments_and_free_whitespace() {
    let t = parse(
        "# a comment\n  fe:0 # the front-end\n =>\n\tb:1   # first\n b:2 # second\n ;   # done\n# trailing",
    );
    assert_eq!(t.backends(), 2);
    assert_eq!(t.node(2).name(), "b:2");
}

#[test]
fn parse_lone_node_is_one_node_tree() {
    let t = parse("fe:0 ;");
    assert_eq!(t.len(), 1);
    assert_eq!(t.backends(), 0);
    assert_eq!(t.comm_nodes(), 0);
    assert!(!t.is_leaf(0));
    assert_eq!(t.backend_rank(0), None);
    assert_eq!(t.depth(), 0);
    assert_eq!(t.to_mrnet(), "fe:0 ;\n");
    assert_eq!(parse(&t.to_mrnet()), t);
}

#[test]
fn parse_lone_statement_for_a_leaf_is_harmless() {
    let t = parse("fe:0 => b:1 ;\nb:1 ;");
    assert_eq!(t.backends(), 1);
}

#[test]
fn dotted_host_names_are_kept_whole() {
    let t = parse(
        "fe.cluster.example.org:0 => n1.cluster.example.org:3 n-2_x.rack7.example.org:0 ;\n\
         n1.cluster.example.org:3 => n1.cluster.example.org:4 ;",
    );
    assert_eq!(t.node(0).host, "fe.cluster.example.org");
    assert_eq!(t.node(1).host, "n1.cluster.example.org");
    assert_eq!(t.node(1).index, 3);
    assert_eq!(t.node(2).name(), "n1.cluster.example.org:4");
    assert_eq!(t.node(3).host, "n-2_x.rack7.example.org");
    // Same short name, different domains: different hosts.
    let t = parse("a.x:0 => a.y:0 a.z:0 ;");
    assert_eq!(t.backends(), 2);
    let text = t.to_mrnet();
    assert!(text.contains("a.y:0") && text.contains("a.z:0"), "{text}");
}

#[test]
fn same_index_on_different_hosts_are_different_nodes() {
    let t = parse("h0:0 => h1:0 h2:0 ;");
    assert_eq!(t.backends(), 2);
}

#[test]
fn ipv4_addresses_are_host_names() {
    let t = parse("10.0.0.1:0 => 10.0.0.2:0 ;");
    assert_eq!(t.node(1).host, "10.0.0.2");
}

#[test]
fn parse_from_str() {
    let t: Topology = "a:0 => a:1 ;".parse().unwrap();
    assert_eq!(t.len(), 2);
}

// ---------------------------------------------------------------- errors

#[test]
fn error_empty() {
    assert_eq!(err(""), TopologyError::Empty);
    assert_eq!(err("  \n# only a comment\n"), TopologyError::Empty);
    assert_eq!(err("").to_string(), "topology is empty: expected at least `host:0 ;`");
}

#[test]
fn error_missing_arrow() {
    let e = err("fe:0 => a:1 ;\na:1 a:2 ;");
    assert!(matches!(e, TopologyError::MissingArrow { line: 2, column: 5, .. }), "{e:?}");
    assert!(e.to_string().contains("expected `=>` or `;` after a:1"), "{e}");
}

#[test]
fn error_missing_semicolon_at_end() {
    let e = err("fe:0 => a:1\n  a:2");
    assert!(
        matches!(
            e,
            TopologyError::MissingSemicolon { line: 2, column: 6, statement_line: 1, statement_column: 1 }
        ),
        "{e:?}"
    );
    let e = err("fe:0");
    assert_eq!(line_col(&e), (1, 5));
}

#[test]
fn error_missing_semicolon_between_statements() {
    let e = err("fe:0 => a:1 a:2\na:1 => a:3 ;");
    assert!(
        matches!(
            e,
            TopologyError::MissingSemicolon { line: 2, column: 1, statement_line: 1, statement_column: 1 }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "topology line 2, column 1: missing `;` to end the statement that starts at line 1, column 1"
    );
}

#[test]
fn error_missing_child() {
    let e = err("fe:0 => ;");
    assert!(matches!(e, TopologyError::MissingChild { line: 1, column: 9, .. }), "{e:?}");
}

#[test]
fn error_stray_tokens() {
    let e = err("fe:0 => a:1 ;\n=> a:2 ;");
    assert!(matches!(e, TopologyError::UnexpectedToken { line: 2, column: 1, .. }), "{e:?}");
    let e = err("fe:0 => a:1 ;;");
    assert!(matches!(e, TopologyError::UnexpectedToken { line: 1, column: 14, .. }), "{e:?}");
    let e = err("fe:0 = a:1 ;");
    assert!(matches!(e, TopologyError::UnexpectedChar { line: 1, column: 6, ch: '=', .. }), "{e:?}");
    let e = err("fe:0 => => a:1 ;");
    assert!(matches!(e, TopologyError::UnexpectedToken { line: 1, column: 9, .. }), "{e:?}");
}

#[test]
fn error_bad_index() {
    let e = err("fe:0 => a:x ;");
    assert!(matches!(e, TopologyError::BadIndex { line: 1, column: 11, .. }), "{e:?}");
    let e = err("fe:0 =>\n   a: ;");
    assert!(matches!(e, TopologyError::BadIndex { line: 2, column: 6, .. }), "{e:?}");
    let e = err("fe:-1 ;");
    assert_eq!(line_col(&e), (1, 4));
    let e = err("fe:4294967296 ;");
    assert!(matches!(e, TopologyError::BadIndex { .. }), "{e:?}");
    parse("fe:4294967295 ;");
}

#[test]
fn error_missing_index() {
    let e = err("fe:0 => node ;");
    assert!(matches!(e, TopologyError::MissingIndex { line: 1, column: 9, .. }), "{e:?}");
}

#[test]
fn error_empty_host() {
    let e = err("fe:0 =>\n  :1 ;");
    assert!(matches!(e, TopologyError::EmptyHost { line: 2, column: 3, .. }), "{e:?}");
}

#[test]
fn error_bad_host() {
    let e = err("fe:0 => a/b:1 ;");
    assert!(matches!(e, TopologyError::BadHost { line: 1, column: 10, ch: '/', .. }), "{e:?}");
    let e = err("fe:0 => a:b:1 ;");
    assert!(matches!(e, TopologyError::BadHost { ch: ':', .. }), "{e:?}");
    // Columns count characters, not bytes.
    let e = err("fé:0 ;");
    assert!(matches!(e, TopologyError::BadHost { line: 1, column: 2, ch: 'é', .. }), "{e:?}");
}

#[test]
fn error_two_parents() {
    let e = err("fe:0 => n1:1 n1:2 ;\nn1:1 => n1:3 ;\nn1:3 => n1:2 ;");
    assert_eq!(
        e.to_string(),
        "topology line 3, column 9: node n1:2 has two parents (first at line 1, column 14)"
    );
}

#[test]
fn error_child_listed_twice() {
    let e = err("fe:0 => a:1 a:2 a:1 ;");
    assert!(
        matches!(
            e,
            TopologyError::DuplicateChild { line: 1, column: 17, first_line: 1, first_column: 9, .. }
        ),
        "{e:?}"
    );
}

#[test]
fn a_parent_over_several_statements_as_in_mrnet() {
    // MRNet's parser adds the children of every statement to the parent, in order.
    let t = parse("fe:0 => a:1 ;\na:1 => b:1 ;\n  a:1 => b:2 ;\nfe:0 => c:1 ;\na:1 => b:3 b:4 ;");
    let names: Vec<String> = t.nodes().iter().map(|n| n.name()).collect();
    assert_eq!(names, ["fe:0", "a:1", "b:1", "b:2", "b:3", "b:4", "c:1"]);
    assert_eq!(t.backends(), 5);
    check_invariants(&t);
    assert_eq!(parse(&t.to_mrnet()), t);
    assert_eq!(t, parse("fe:0 => a:1 c:1 ; a:1 => b:1 b:2 b:3 b:4 ;"));
    // A lone statement before the others changes nothing.
    assert_eq!(parse("fe:0 ;\nfe:0 => a:1 ;\nfe:0 => a:2 ;"), parse("fe:0 => a:1 a:2 ;"));
    // Still refused: the same child twice, even across statements, and two parents.
    let e = err("fe:0 => a:1 ;\nfe:0 => a:1 ;");
    assert!(
        matches!(e, TopologyError::DuplicateChild { line: 2, column: 9, first_line: 1, first_column: 9, .. }),
        "{e:?}"
    );
    let e = err("fe:0 => a:1 b:1 ;\nb:1 => c:1 ;\na:1 => c:1 ;");
    assert!(matches!(e, TopologyError::TwoParents { line: 3, column: 8, .. }), "{e:?}");
}

#[test]
fn host_names_start_with_a_letter_or_a_digit_as_in_mrnet() {
    let e = err("fe:0 => n1:0\n   -oProxyCommand:0 ;");
    assert!(matches!(e, TopologyError::BadHostStart { line: 2, column: 4, ch: '-', .. }), "{e:?}");
    assert!(e.to_string().contains("starts with `-`"), "{e}");
    assert!(e.to_string().contains("never take it for an option"), "{e}");
    for (text, column) in
        [("-Fevil:0 ;", 1), ("fe:0 => .n1:0 ;", 9), ("fe:0 => _n1:0 ;", 9), ("fe:0 => bob@-x:0 ;", 13)]
    {
        let e = err(text);
        assert!(
            matches!(e, TopologyError::BadHostStart { line: 1, column: c, .. } if c == column),
            "{text}: {e:?}"
        );
    }
    // Digits first are fine (MRNet's lexer takes them), and so are IPv4 addresses.
    assert_eq!(parse("fe:0 => 10.0.0.2:0 1n:0 ;").backends(), 2);
}

#[test]
fn user_at_host_for_ssh() {
    let t = parse("fe:0 => bob@n1:0 bob@n1:1 _svc@n2:0 ;\nbob@n1:0 => bob@n1:2 ;");
    assert_eq!(t.node(1).host, "bob@n1");
    assert_eq!(t.node(4).host, "_svc@n2");
    assert_eq!(parse(&t.to_mrnet()), t);
    let e = err("fe:0 => bob@n1:0 ;\nn1:0 => n1:1 ;");
    assert!(
        matches!(e, TopologyError::UserMismatch { line: 2, column: 1, first_line: 1, first_column: 9, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("node n1:0 is written bob@n1:0 at line 1, column 9"), "{e}");
    let e = err("fe:0 => @n1:0 ;");
    assert!(matches!(e, TopologyError::EmptyUser { line: 1, column: 9, .. }), "{e:?}");
    let e = err("fe:0 => bob@:0 ;");
    assert!(matches!(e, TopologyError::EmptyHost { line: 1, column: 13, .. }), "{e:?}");
    let e = err("fe:0 => a@b@c:0 ;");
    assert!(matches!(e, TopologyError::BadHost { line: 1, column: 12, ch: '@', .. }), "{e:?}");
}

#[test]
fn error_self_child() {
    let e = err("fe:0 => a:1 ;\na:1 => a:2 a:1 ;");
    assert!(matches!(e, TopologyError::SelfChild { line: 2, column: 12, .. }), "{e:?}");
}

#[test]
fn error_cycle() {
    let e = err("fe:0 => x:1 ;\na:1 => b:1 ;\nb:1 => a:1 ;");
    match &e {
        TopologyError::Cycle { line: 3, column: 8, path } => assert_eq!(path, "b:1 => a:1 => b:1"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn error_no_root() {
    let e = err("a:0 => b:0 ;\nb:0 => c:0 ;\nc:0 => a:0 ;");
    assert!(matches!(e, TopologyError::NoRoot { line: 1, column: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("no root"), "{e}");
}

#[test]
fn error_more_than_one_root() {
    let e = err("fe:0 => a:1 ;\nother:0 ;");
    assert!(matches!(e, TopologyError::MultipleRoots { line: 2, column: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("more than one root"), "{e}");
    let e = err("a:0 ;\nb:0 ;");
    assert!(matches!(e, TopologyError::MultipleRoots { line: 2, column: 1, .. }), "{e:?}");
}

#[test]
fn error_unreachable_statement() {
    let e = err("fe:0 => a:1 a:2 ;\n# oops\n   x:1 => x:2 ;");
    assert!(matches!(e, TopologyError::Unreachable { line: 3, column: 4, .. }), "{e:?}");
    assert!(e.to_string().contains("not connected to the root fe:0"), "{e}");
    // The root is the top of the first statement's branch, wherever it is written.
    let e = err("a:1 => b:1 ;\nfe:0 => a:1 ;\nx:1 => y:1 ;");
    assert!(matches!(e, TopologyError::Unreachable { line: 3, column: 1, .. }), "{e:?}");
}

#[test]
fn errors_from_text_all_name_a_position() {
    for text in [
        "a:0 a:1 ;",
        "a:0 => a:1",
        "a:0 => a:q ;",
        "a:0 => :1 ;",
        "a:0 => a:1 a:1 ;",
        "a:0 => a:1 ; b:0 => a:1 ;",
        "a:0 => a:1 ; a:0 => a:1 ;",
        "a:0 => -a:1 ;",
        "a:0 => b@a:1 ; a:1 ;",
        "a:0 => a:0 ;",
        "a:0 => a:1 ; a:1 => a:0 ;",
        "a:0 ; b:0 ;",
        "a:0 => a:1 ; b:0 => b:1 ;",
    ] {
        let e = err(text);
        let (line, col) = line_col(&e);
        assert!(line >= 1 && col >= 1, "{text}: {e}");
    }
}

#[test]
fn too_many_nodes_in_text() {
    let mut text = String::from("fe:0 =>");
    for i in 1..=MAX_NODES {
        text.push_str(&format!(" b:{i}"));
    }
    text.push_str(" ;");
    let e = err(&text);
    assert!(matches!(e, TopologyError::TooManyNodes { line: 1, .. }), "{e:?}");
}

// ---------------------------------------------------------------- generate

#[test]
fn flat() {
    let t = gen("flat", Some(5));
    assert_eq!(t.len(), 6);
    assert_eq!(t.node(0).children, vec![1, 2, 3, 4, 5]);
    assert_eq!(t.depth(), 1);
    assert!(t.nodes().iter().enumerate().all(|(i, n)| n.host == "localhost" && n.index == i as u32));
    check_invariants(&t);
}

#[test]
fn kary_8_with_64() {
    let t = gen("kary:8", Some(64));
    assert_eq!(t.depth(), 2);
    assert_eq!(t.comm_nodes(), 8);
    assert_eq!(t.node(0).children.len(), 8);
    for &c in &t.node(0).children {
        assert_eq!(t.node(c).children.len(), 8);
    }
    check_invariants(&t);
}

#[test]
fn kary_16_with_1000() {
    let t = gen("kary:16", Some(1000));
    assert_eq!(t.backends(), 1000);
    assert_eq!(t.depth(), 3);
    assert_eq!(t.node(0).children.len(), 16);
    for &c in &t.node(0).children {
        let under = t.subtree_backends(c);
        assert!(under == 62 || under == 63, "{under}");
    }
    assert!(t.nodes().iter().all(|n| n.children.len() <= 16));
    check_invariants(&t);
}

#[test]
fn kary_4_with_64_is_depth_3() {
    let t = gen("kary:4", Some(64));
    assert_eq!(t.depth(), 3);
    assert_eq!(t.comm_nodes(), 4 + 16);
    check_invariants(&t);
}

#[test]
fn kary_small_n_is_flat() {
    let t = gen("kary:8", Some(8));
    assert_eq!(t, gen("flat", Some(8)));
    let t = gen("kary:8", Some(1));
    assert_eq!(t.len(), 2);
    assert_eq!(t.backends(), 1);
}

#[test]
fn kary_is_shallowest() {
    for k in 2..7usize {
        for n in 1..400usize {
            let t = gen(&format!("kary:{k}"), Some(n));
            let mut min_depth = 1;
            while k.pow(min_depth as u32) < n {
                min_depth += 1;
            }
            assert_eq!(t.depth(), min_depth, "k={k} n={n}");
        }
    }
}

#[test]
fn fanout_is_kary() {
    let a = gen("fanout:5", Some(77));
    let b = gen("kary:5", Some(77));
    assert_eq!(a, b);
}

#[test]
fn knomial_binomial() {
    // Node r's parent is r without its top bit: 1, 2, 4 -> 0; 3, 5 -> 1. Adding 1..=5
    // gives 4 leaves (3 turns 1 into a comm node). Pre-order 0 1 3 5 2 4.
    let t = gen("knomial:2", Some(4));
    assert_eq!(t.len(), 6);
    assert_eq!(t.node(0).children, vec![1, 4, 5]);
    assert_eq!(t.node(1).children, vec![2, 3]);
    assert_eq!(t.backends(), 4);
    check_invariants(&t);
}

#[test]
fn knomial_leaf_count_is_exact() {
    for k in 2..6 {
        for n in 1..300 {
            let t = gen(&format!("knomial:{k}"), Some(n));
            assert_eq!(t.backends(), n, "k={k} n={n}");
            check_invariants(&t);
        }
    }
}

#[test]
fn knomial_trinomial() {
    // k = 3, node r's parent: 1, 2, 3 -> 0; 4 -> 1; 5 -> 2; 6 -> 0; 7 -> 1: five leaves.
    // Pre-order 0 1 4 7 2 5 3 6.
    let t = gen("knomial:3", Some(5));
    assert_eq!(t.len(), 8);
    assert_eq!(t.node(0).children, vec![1, 4, 6, 7]);
    assert_eq!(t.node(1).children, vec![2, 3]);
    assert_eq!(t.node(4).children, vec![5]);
    assert_eq!(t.backends(), 5);
}

#[test]
fn balanced() {
    let t = gen("balanced:4x4x4", None);
    assert_eq!(t.backends(), 64);
    assert_eq!(t.comm_nodes(), 20);
    assert_eq!(t.depth(), 3);
    assert_eq!(gen("4x4x4", Some(64)), t);
    assert_eq!(gen("1x4x4x4", None), t);
    assert_eq!(gen("balanced:1x4x4x4", None), t);
    assert_eq!(gen("balanced:2x3", None).node(0).children.len(), 2);
    assert_eq!(gen("balanced:7", None), gen("flat", Some(7)));
    check_invariants(&t);
}

#[test]
fn balanced_mismatch() {
    let e = gen_err("balanced:4x4", Some(20));
    assert_eq!(e.to_string(), "balanced:4x4 has 16 back-ends but 20 were asked for");
}

#[test]
fn generator_errors() {
    assert_eq!(gen_err("kary:8", Some(0)), TopologyError::NoBackends);
    assert_eq!(gen_err("kary:8", Some(0)).to_string(), "a tree needs at least one back-end");
    assert!(matches!(gen_err("flat", None), TopologyError::MissingBackendCount { .. }));
    assert!(matches!(gen_err("kary:4", None), TopologyError::MissingBackendCount { .. }));
    for spec in ["kary:0", "kary:1", "fanout:1", "knomial:1", "knomial:0"] {
        let e = gen_err(spec, Some(4));
        assert!(matches!(e, TopologyError::FanoutTooSmall { .. }), "{spec}: {e:?}");
        assert!(e.to_string().contains(spec) && e.to_string().contains("at least 2"), "{e}");
    }
    assert!(matches!(gen_err("balanced:4x0", None), TopologyError::BadSpec { .. }));
    let e = Topology::generate(&Shape::Balanced(vec![]), None, "h").unwrap_err();
    assert!(matches!(e, TopologyError::BadSpec { .. }));
    let e = Topology::generate(&Shape::Flat, Some(3), "bad host").unwrap_err();
    assert!(matches!(e, TopologyError::BadHostName { .. }));
    let e = Topology::generate(&Shape::Flat, Some(3), "").unwrap_err();
    assert!(matches!(e, TopologyError::BadHostName { .. }));
}

#[test]
fn generator_limits() {
    for (spec, n) in [
        ("flat", Some(MAX_NODES)),
        ("kary:2", Some(900_000)),
        ("kary:2", Some(usize::MAX)),
        ("knomial:2", Some(600_000)),
        ("balanced:1000x1000x1000", None),
        ("balanced:100000000000x100000000000x100000000000", None),
    ] {
        let e = gen_err(spec, n);
        assert!(matches!(e, TopologyError::TooLarge { .. }), "{spec}: {e:?}");
        assert!(e.to_string().contains("1000000 nodes"), "{e}");
    }
    // Just under the limit works.
    assert_eq!(gen("flat", Some(MAX_NODES - 1)).len(), MAX_NODES);
}

#[test]
fn generate_on_a_host() {
    let t = Topology::generate(&Shape::Kary(2), Some(4), "n1.cluster.example.org").unwrap();
    assert!(t.nodes().iter().all(|n| n.host == "n1.cluster.example.org"));
    assert_eq!(parse(&t.to_mrnet()), t);
}

// ---------------------------------------------------------------- shape specs

#[test]
fn shape_from_str() {
    assert_eq!("flat".parse::<Shape>().unwrap(), Shape::Flat);
    assert_eq!(" Kary:16 ".parse::<Shape>().unwrap(), Shape::Kary(16));
    assert_eq!("knomial:2".parse::<Shape>().unwrap(), Shape::Knomial(2));
    assert_eq!("fanout:32".parse::<Shape>().unwrap(), Shape::Fanout(32));
    assert_eq!("balanced:4x4x4".parse::<Shape>().unwrap(), Shape::Balanced(vec![4, 4, 4]));
    assert_eq!("4x4x4".parse::<Shape>().unwrap(), Shape::Balanced(vec![4, 4, 4]));
    assert_eq!("1x4x4".parse::<Shape>().unwrap(), Shape::Balanced(vec![4, 4]));
    for bad in
        ["", "tree", "kary", "kary:", "kary:x", "kary:-1", "flat:3", "balanced", "balanced:4x", "4x", "x4"]
    {
        let e = bad.parse::<Shape>().unwrap_err();
        assert!(matches!(e, TopologyError::BadSpec { .. }), "{bad}: {e:?}");
        assert!(e.to_string().contains("kary:K"), "{e}");
        // (The empty spec itself is quoted empty; its reason says so.)
        assert!(bad.is_empty() || !e.to_string().contains("``"), "an empty quote says nothing: {e}");
    }
    let e = "balanced:4x".parse::<Shape>().unwrap_err().to_string();
    assert!(e.contains("`4x` has a level with no fan-out"), "{e}");
    let e = "balanced:".parse::<Shape>().unwrap_err().to_string();
    assert!(e.contains("no fan-outs given"), "{e}");
}

#[test]
fn shape_display_round_trips() {
    for s in
        [Shape::Flat, Shape::Kary(3), Shape::Knomial(4), Shape::Fanout(9), Shape::Balanced(vec![2, 3, 4])]
    {
        assert_eq!(s.to_string().parse::<Shape>().unwrap(), s);
    }
}

// ---------------------------------------------------------------- from_spec

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("treecast-topology-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn from_spec_generators() {
    assert_eq!(Topology::from_spec("kary:4", Some(10)).unwrap(), gen("kary:4", Some(10)));
    assert_eq!(Topology::from_spec("4x4", None).unwrap().backends(), 16);
    assert!(matches!(Topology::from_spec("kary:1", Some(4)), Err(TopologyError::FanoutTooSmall { .. })));
    assert!(matches!(Topology::from_spec("kary:x", Some(4)), Err(TopologyError::BadSpec { .. })));
}

#[test]
fn from_spec_file() {
    let path = temp_file("ok.top", "fe.example.org:0 => n1.example.org:0 n2.example.org:0 ;\n");
    let p = path.to_str().unwrap();
    let t = Topology::from_spec(p, None).unwrap();
    assert_eq!(t.backends(), 2);
    assert_eq!(Topology::from_spec(p, Some(2)).unwrap(), t);
    let e = Topology::from_spec(p, Some(3)).unwrap_err();
    assert_eq!(e.to_string(), format!("topology file {p} has 2 back-ends but 3 were asked for"));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn from_spec_bad_file() {
    let path = temp_file("bad.top", "fe:0 => a:1 ;\na:1 => a:1 ;\n");
    let p = path.to_str().unwrap();
    let e = Topology::from_spec(p, None).unwrap_err();
    assert!(
        matches!(&e, TopologyError::File { source, .. } if matches!(**source, TopologyError::SelfChild { line: 2, column: 8, .. })),
        "{e:?}"
    );
    assert!(e.to_string().starts_with(&format!("{p}: topology line 2, column 8")), "{e}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn from_spec_missing_file() {
    let e = Topology::from_spec("/nonexistent/treecast.top", None).unwrap_err();
    assert!(matches!(e, TopologyError::ReadFile { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("/nonexistent/treecast.top"), "{msg}");
    assert!(msg.contains("flat, kary:K, knomial:K, balanced:AxB..., fanout:F or a topology file"), "{msg}");
}

// ---------------------------------------------------------------- queries

#[test]
fn subtree_is_its_own_tree() {
    let t = parse("fe:0 => c:1 c:2 ;\nc:1 => b:1 b:2 ;\nc:2 => b:3 c:3 ;\nc:3 => b:4 b:5 ;");
    let s = t.subtree(4);
    assert_eq!(s.to_mrnet(), "c:2 => b:3 c:3 ;\nc:3 => b:4 b:5 ;\n");
    assert_eq!(s.backends(), 3);
    assert_eq!(t.first_rank(4), 2);
    assert_eq!(t.subtree_backends(4), 3);
    assert_eq!(t.subtree_len(4), 5);
    assert_eq!(s.node(0).parent, None);
    check_invariants(&s);
    // A leaf's sub-tree is a lone node.
    let leaf = t.subtree(2);
    assert_eq!(leaf.len(), 1);
    assert_eq!(leaf.backends(), 0);
    assert_eq!(t.subtree(0), t);
}

#[test]
fn find_and_leaf_of_rank() {
    let t = parse("fe:0 => c:1 b:9 ;\nc:1 => b:1 b:2 ;");
    assert_eq!(t.find("b", 9), Some(4));
    assert_eq!(t.find("b", 7), None);
    assert_eq!(t.leaf_of_rank(0), Some(2));
    assert_eq!(t.leaf_of_rank(2), Some(4));
    assert_eq!(t.leaf_of_rank(3), None);
    assert_eq!(parse("fe:0 ;").leaf_of_rank(0), None);
}

#[test]
fn deep_chain_needs_no_recursion() {
    // A chain of 200k nodes: parse, queries and printing must not overflow the stack.
    let n = 200_000;
    let mut text = String::new();
    for i in 0..n - 1 {
        text.push_str(&format!("h:{i} => h:{} ;\n", i + 1));
    }
    let t = parse(&text);
    assert_eq!(t.depth(), n - 1);
    assert_eq!(t.backends(), 1);
    assert_eq!(t.subtree_len(0), n);
    assert_eq!(parse(&t.to_mrnet()), t);
    assert!(t.render().ends_with(&format!("1 back-end, {} comm nodes, depth {}\n", n - 2, n - 1)));
}

// ---------------------------------------------------------------- render

#[test]
fn render_small_tree() {
    let t = parse("localhost:0 => localhost:1 localhost:4 ;\nlocalhost:1 => localhost:2 localhost:3 ;");
    assert_eq!(
        t.render(),
        "localhost:0 (front-end)\n\
         ├── localhost:1 (comm node)\n\
         │   ├── localhost:2 (back-end rank 0)\n\
         │   └── localhost:3 (back-end rank 1)\n\
         └── localhost:4 (back-end rank 2)\n\
         3 back-ends, 1 comm node, depth 2\n"
    );
    assert_eq!(t.to_string(), t.render());
}

#[test]
fn render_nested_last_branches() {
    let t = parse("a:0 => a:1 a:5 ;\na:1 => a:2 ;\na:2 => a:3 a:4 ;\na:5 => a:6 ;");
    assert_eq!(
        t.render(),
        "a:0 (front-end)\n\
         ├── a:1 (comm node)\n\
         │   └── a:2 (comm node)\n\
         │       ├── a:3 (back-end rank 0)\n\
         │       └── a:4 (back-end rank 1)\n\
         └── a:5 (comm node)\n    \
             └── a:6 (back-end rank 2)\n\
         3 back-ends, 3 comm nodes, depth 3\n"
    );
}

#[test]
fn render_lone_node() {
    assert_eq!(parse("fe:0 ;").render(), "fe:0 (front-end)\n0 back-ends, 0 comm nodes, depth 0\n");
}

#[test]
fn render_large_tree_summarises() {
    let t = gen("kary:16", Some(1000));
    let r = t.render();
    let lines: Vec<&str> = r.lines().collect();
    assert!(lines.len() < 10, "{r}");
    assert_eq!(lines[0], "localhost:0 (front-end), 1273 nodes on 1 host, 4 levels:");
    assert_eq!(lines[1], "level 0: front-end (fan-out 16)");
    assert_eq!(lines[2], "level 1: 16 comm nodes (fan-out 16)");
    assert_eq!(lines[3], "level 2: 256 comm nodes (fan-out 3..4)");
    assert_eq!(lines[4], "level 3: 1000 back-ends (ranks 0-999)");
    assert_eq!(*lines.last().unwrap(), "1000 back-ends, 272 comm nodes, depth 3");
    // Leaves at several levels.
    let r = gen("knomial:2", Some(300)).render();
    assert!(r.lines().count() < 20, "{r}");
    assert!(r.contains("\n300 back-ends, "), "{r}");
}

// ---------------------------------------------------------------- properties

fn shape_strategy() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Flat),
        (2usize..40).prop_map(Shape::Kary),
        (2usize..40).prop_map(Shape::Fanout),
        (2usize..8).prop_map(Shape::Knomial),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn generated_trees_are_well_formed(shape in shape_strategy(), n in 1usize..2000) {
        let t = Topology::generate(&shape, Some(n), "localhost").unwrap();
        prop_assert_eq!(t.backends(), n);
        if let Shape::Kary(k) | Shape::Fanout(k) = shape {
            prop_assert!(t.nodes().iter().all(|node| node.children.len() <= k));
        }
        check_invariants(&t);
        let text = t.to_mrnet();
        prop_assert_eq!(Topology::parse(&text).unwrap(), t.clone());
        let id = n % t.len();
        let sub = t.subtree(id);
        prop_assert_eq!(sub.len(), t.subtree_len(id));
        let reparsed = Topology::parse(&sub.to_mrnet()).unwrap();
        prop_assert_eq!(&reparsed, &sub);
        if !t.is_leaf(id) {
            prop_assert_eq!(sub.backends(), t.subtree_backends(id));
        }
        let r = t.render();
        let plural = |k: usize, what: &str| if k == 1 { format!("1 {what}") } else { format!("{k} {what}s") };
        let summary =
            format!("{}, {}, depth {}\n", plural(n, "back-end"), plural(t.comm_nodes(), "comm node"), t.depth());
        prop_assert!(r.ends_with(&summary), "{}", r);
    }

    #[test]
    fn balanced_trees_are_well_formed(levels in proptest::collection::vec(1usize..6, 1..5)) {
        let t = Topology::generate(&Shape::Balanced(levels.clone()), None, "h").unwrap();
        prop_assert_eq!(t.backends(), levels.iter().product::<usize>());
        prop_assert_eq!(t.depth(), levels.len());
        check_invariants(&t);
        prop_assert_eq!(Topology::parse(&t.to_mrnet()).unwrap(), t);
    }

    #[test]
    fn parse_never_panics(text in "[a-z0-9.:=>; #\n]{0,200}") {
        let _ = Topology::parse(&text);
    }

    #[test]
    fn parse_never_panics_on_any_text(text in "\\PC{0,100}") {
        let _ = Topology::parse(&text);
    }

    #[test]
    fn parsed_trees_round_trip(
        parents in proptest::collection::vec(0usize..1000, 1..60),
        hosts in proptest::collection::vec("[a-z][a-z0-9-]{0,6}(\\.[a-z0-9]{1,4}){0,2}", 1..4),
    ) {
        // Random tree: node i+1's parent is one of 0..=i.
        let n = parents.len() + 1;
        let mut children = vec![Vec::new(); n];
        for (i, p) in parents.iter().enumerate() {
            children[p % (i + 1)].push(i + 1);
        }
        let name = |i: usize| format!("{}:{}", hosts[i % hosts.len()], i);
        let mut text = String::new();
        // Statements in reverse order: the parser must not depend on it.
        for (p, kids) in children.iter().enumerate().rev() {
            if !kids.is_empty() {
                text.push_str(&name(p));
                text.push_str(" =>");
                for &c in kids {
                    text.push(' ');
                    text.push_str(&name(c));
                }
                text.push_str(" ;\n");
            }
        }
        let t = Topology::parse(&text).unwrap();
        prop_assert_eq!(t.len(), n);
        check_invariants(&t);
        prop_assert_eq!(Topology::parse(&t.to_mrnet()).unwrap(), t.clone());
        for id in 0..t.len() {
            let sub = t.subtree(id);
            prop_assert_eq!(Topology::parse(&sub.to_mrnet()).unwrap(), sub);
        }
    }
}
