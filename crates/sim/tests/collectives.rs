//! Collective operations among back-ends on simulated trees: every result checked
//! against the same computation done locally, for random shapes, member sets,
//! operations and roots; lost members; members that disagree.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use treecast_proto::topology::Topology;
use treecast_proto::wire::{
    decode_collective, decode_entries, decode_values, encode_values, CollectiveCall, CollectiveHead,
    CollectiveOp, Combine, Frame, RankSet, Value,
};
use treecast_proto::Command;
use treecast_sim::{Sim, SimConfig};

const SETTLE: Duration = Duration::from_secs(5);

/// What back-end `rank` contributes: an array and a scalar, so element-wise folding
/// and scalars are both exercised; to a reduce-scatter, an array of two elements
/// per member (its blocks), as it needs.
fn values_of(call: &CollectiveCall, rank: u32) -> Vec<Value> {
    let r = i32::try_from(rank).unwrap();
    if call.op == CollectiveOp::ReduceScatter {
        let n = i32::try_from(call.members.len()).unwrap();
        return vec![Value::IntArray((0..2 * n).map(|i| (r * 31 + i * 7) % 97 - 40).collect())];
    }
    vec![Value::IntArray(vec![r, 7 * r - 50, (r * r) % 13]), Value::Double(f64::from(r) / 4.0)]
}

fn encoded(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_values(values, &mut out);
    out
}

/// The reduction of the members' values, computed here.
fn folded(call: &CollectiveCall) -> Vec<Value> {
    let all: Vec<Vec<Value>> = call.members.iter().map(|r| values_of(call, r)).collect();
    let n = all.len() as f64;
    // Every value here is a small integer or quarter, so sums are exact in any order.
    let pick = |xs: &mut dyn Iterator<Item = f64>| -> f64 {
        match call.combine {
            Combine::Sum => xs.sum(),
            Combine::Avg => xs.sum::<f64>() / n,
            Combine::Min => xs.fold(f64::INFINITY, f64::min),
            _ => xs.fold(f64::NEG_INFINITY, f64::max),
        }
    };
    (0..all[0].len())
        .map(|v| match &all[0][v] {
            Value::IntArray(first) => Value::IntArray(
                (0..first.len())
                    .map(|i| {
                        let mut xs = all.iter().map(|m| match &m[v] {
                            Value::IntArray(a) => f64::from(a[i]),
                            _ => unreachable!(),
                        });
                        pick(&mut xs) as i32
                    })
                    .collect(),
            ),
            _ => Value::Double(pick(&mut all.iter().map(|m| m[v].as_f64().unwrap()))),
        })
        .collect()
}

/// Every member enters `call` (in rank order).
fn enter_all(sim: &mut Sim, call: &CollectiveCall) {
    for rank in call.members.iter() {
        let frame = call.contribution(rank, &encoded(&values_of(call, rank)));
        sim.backend_command(rank, Command::Send(frame)).unwrap();
    }
}

/// The one result back-end `rank` received: its head and body.
fn result_at(sim: &mut Sim, rank: u32) -> Option<(CollectiveHead, Vec<u8>)> {
    let mut got: Vec<Frame> = sim.take_collective_results(rank);
    assert!(got.len() <= 1, "rank {rank} got {} results", got.len());
    let f = got.pop()?;
    let (head, at) = decode_collective(&f.payload).unwrap();
    Some((head, f.payload[at..].to_vec()))
}

/// Checks what every rank of `n` received for `call` when every member took part.
fn check_results(sim: &mut Sim, n: u32, call: &CollectiveCall) -> Result<(), TestCaseError> {
    for rank in 0..n {
        let expected_here =
            call.members.contains(rank) || (call.op == CollectiveOp::Reduce && rank == call.root);
        let got = result_at(sim, rank);
        prop_assert_eq!(got.is_some(), expected_here, "rank {} of {:?}", rank, call);
        let Some((head, body)) = got else { continue };
        prop_assert!(head.error.is_empty(), "{}", head.error);
        prop_assert_eq!(&head.contributors, &call.members);
        match call.op {
            CollectiveOp::Reduce if rank != call.root => prop_assert!(body.is_empty()),
            CollectiveOp::Reduce | CollectiveOp::AllReduce => {
                prop_assert_eq!(decode_values(&body).unwrap(), folded(call));
            }
            CollectiveOp::ReduceScatter => {
                // Narrowed on every link down: only this member's block reaches it.
                prop_assert_eq!(&head.order, &vec![rank]);
                let at = call.order.iter().position(|&r| r == rank).unwrap();
                let n = call.order.len();
                let want: Vec<Value> = folded(call).iter().map(|v| v.blocks(n, &[at]).unwrap()).collect();
                prop_assert_eq!(decode_values(&body).unwrap(), want);
            }
            CollectiveOp::AllGather => {
                let entries: BTreeMap<u32, Vec<Value>> = decode_entries(&body)
                    .unwrap()
                    .into_iter()
                    .map(|(r, v)| (r, decode_values(v).unwrap()))
                    .collect();
                let want: BTreeMap<u32, Vec<Value>> =
                    call.members.iter().map(|r| (r, values_of(call, r))).collect();
                prop_assert_eq!(entries, want);
            }
            CollectiveOp::Barrier => prop_assert!(body.is_empty()),
        }
    }
    Ok(())
}

fn op_of(i: u8) -> CollectiveOp {
    [
        CollectiveOp::Reduce,
        CollectiveOp::AllReduce,
        CollectiveOp::AllGather,
        CollectiveOp::ReduceScatter,
        CollectiveOp::Barrier,
    ][usize::from(i) % 5]
}

/// `members` in an order of their own, picked by `seed`.
fn shuffled(members: &RankSet, seed: u64) -> Vec<u32> {
    use rand::seq::SliceRandom;
    let mut order: Vec<u32> = members.iter().collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x5eed));
    order
}

fn launched(topo: Topology, seed: u64) -> Sim {
    let mut sim = Sim::new(SimConfig::new(topo, seed));
    assert!(sim.launch().unwrap().is_empty());
    sim
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// On any tree, for any members, operation and root, every member (and a
    /// reduction's root) gets exactly what the local computation gives, once.
    #[test]
    fn results_match_a_local_computation(
        seed in any::<u64>(),
        depth in 1usize..=4,
        fanout in 1usize..=8,
        pick in any::<u64>(),
        op in 0u8..5,
        combine in 1u8..5,
        root_pick in any::<u32>(),
    ) {
        let topo = treecast_sim::chaos::tree_of_shape(&mut StdRng::seed_from_u64(seed), depth, fanout, 200).unwrap();
        let n = topo.backends() as u32;
        let mut sim = launched(topo, seed);
        // A random non-empty subset of the ranks.
        let mut members: RankSet = (0..n).filter(|r| (pick >> (r % 64)) & 1 == 1).collect();
        if members.is_empty() {
            members.insert((pick % u64::from(n)) as u32);
        }
        let op = op_of(op);
        let combine = match (op.folds(), combine) {
            (false, _) => Combine::None,
            (true, 1) => Combine::Sum,
            (true, 2) => Combine::Min,
            (true, 3) => Combine::Max,
            _ => Combine::Avg,
        };
        let root = if op == CollectiveOp::Reduce { root_pick % n } else { u32::MAX };
        // Two operations of one series, entered back to back, complete apart.
        for seq in 0..2 {
            // A reduce-scatter's group order: not the ranks' own, so the blocks are
            // found by it.
            let order = if op == CollectiveOp::ReduceScatter { shuffled(&members, seed) } else { Vec::new() };
            let call = CollectiveCall { op, combine, context: 9, seq, root, members: members.clone(), order };
            enter_all(&mut sim, &call);
            sim.settle(SETTLE);
            check_results(&mut sim, n, &call)?;
        }
        prop_assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    }
}

#[test]
fn members_under_one_comm_node_never_reach_the_front_end() {
    // balanced:2x4: comm node 1 has ranks 0-3 below it.
    let mut sim = launched(Topology::from_spec("balanced:2x4", None).unwrap(), 1);
    let before = sim.stats(0).unwrap().frames_in;
    let call = CollectiveCall {
        op: CollectiveOp::AllReduce,
        combine: Combine::Sum,
        context: 1,
        seq: 0,
        root: u32::MAX,
        members: RankSet::range(0, 4),
        order: Vec::new(),
    };
    enter_all(&mut sim, &call);
    sim.settle(SETTLE);
    check_results(&mut sim, 8, &call).unwrap();
    assert_eq!(sim.stats(0).unwrap().frames_in, before, "the front-end saw the operation");
}

#[test]
fn a_lost_member_is_not_waited_for_and_the_result_says_who_took_part() {
    let mut sim = launched(Topology::from_spec("balanced:2x4", None).unwrap(), 2);
    let members = RankSet::range(0, 8);
    let call = CollectiveCall {
        op: CollectiveOp::AllReduce,
        combine: Combine::Sum,
        context: 2,
        seq: 0,
        root: u32::MAX,
        members,
        order: Vec::new(),
    };
    // Every member but rank 5 enters; rank 5 dies instead.
    for rank in (0..8).filter(|&r| r != 5) {
        sim.backend_command(rank, Command::Send(call.contribution(rank, &encoded(&values_of(&call, rank)))))
            .unwrap();
    }
    sim.settle(SETTLE);
    assert!(result_at(&mut sim, 0).is_none(), "done before rank 5 was known lost");
    sim.kill_at(sim.node_of_rank(5).unwrap(), Duration::ZERO);
    sim.settle(SETTLE);
    let took_part: RankSet = (0..8).filter(|&r| r != 5).collect();
    for rank in took_part.iter() {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert_eq!(head.contributors, took_part);
        assert_eq!(
            decode_values(&body).unwrap(),
            folded(&CollectiveCall { members: took_part.clone(), ..call.clone() })
        );
    }
}

#[test]
fn members_that_disagree_all_learn_why() {
    let mut sim = launched(Topology::from_spec("balanced:2x2", None).unwrap(), 3);
    let members = RankSet::range(0, 4);
    let sum = CollectiveCall {
        op: CollectiveOp::AllReduce,
        combine: Combine::Sum,
        context: 3,
        seq: 0,
        root: u32::MAX,
        members,
        order: Vec::new(),
    };
    let max = CollectiveCall { combine: Combine::Max, ..sum.clone() };
    for rank in 0..4 {
        let call = if rank == 3 { &max } else { &sum };
        sim.backend_command(rank, Command::Send(call.contribution(rank, &encoded(&values_of(call, rank)))))
            .unwrap();
    }
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert!(head.error.contains("disagree"), "{}", head.error);
        assert!(body.is_empty());
    }
    // Values a filter refuses (a string to add) fail the operation the same way.
    let call = CollectiveCall { seq: 1, ..sum.clone() };
    for rank in 0..4 {
        let values = if rank == 2 { vec![Value::Str("two".into())] } else { values_of(&call, rank) };
        sim.backend_command(rank, Command::Send(call.contribution(rank, &encoded(&values)))).unwrap();
    }
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, _) = result_at(&mut sim, rank).unwrap();
        assert!(!head.error.is_empty(), "rank {rank} got no error");
    }
    // An average refuses a string where it enters the tree, and says so to all.
    let avg = CollectiveCall { seq: 4, combine: Combine::Avg, ..sum.clone() };
    for rank in 0..4 {
        let values = if rank == 1 { vec![Value::Str("one".into())] } else { values_of(&call, rank) };
        sim.backend_command(rank, Command::Send(avg.contribution(rank, &encoded(&values)))).unwrap();
    }
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert!(head.error.contains("average"), "rank {rank}: {}", head.error);
        assert!(body.is_empty());
    }
    // A member that names other members is told, as well as the others.
    let call = CollectiveCall { seq: 3, ..sum.clone() };
    let odd = CollectiveCall { members: RankSet::range(0, 5), ..call.clone() };
    enter(&mut sim, &call, [0, 1, 2]);
    enter(&mut sim, &odd, [3]);
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, _) = result_at(&mut sim, rank).unwrap_or_else(|| panic!("rank {rank} got no result"));
        assert!(head.error.contains("disagree"), "rank {rank}: {}", head.error);
    }
    // A member whose values were refused where it runs enters with the refusal.
    let call = CollectiveCall { seq: 2, ..call };
    enter(&mut sim, &call, [0, 1, 3]);
    sim.backend_command(2, Command::Send(call.refusal(2, "rank 2: bad values".into()))).unwrap();
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, _) = result_at(&mut sim, rank).unwrap();
        assert_eq!(head.error, "rank 2: bad values", "rank {rank}");
    }
}

/// balanced:2x2x2 with recovery on: ranks 0-7, comm nodes in two levels.
fn recovering_tree(seed: u64) -> Sim {
    let mut config = SimConfig::new(Topology::from_spec("balanced:2x2x2", None).unwrap(), seed);
    config.rejoin = Some(Duration::from_secs(10));
    let mut sim = Sim::new(config);
    assert!(sim.launch().unwrap().is_empty());
    sim
}

fn all_reduce_of_eight(seq: u32) -> CollectiveCall {
    CollectiveCall {
        op: CollectiveOp::AllReduce,
        combine: Combine::Sum,
        context: 5,
        seq,
        root: u32::MAX,
        members: RankSet::range(0, 8),
        order: Vec::new(),
    }
}

fn enter(sim: &mut Sim, call: &CollectiveCall, ranks: impl IntoIterator<Item = u32>) {
    for rank in ranks {
        sim.backend_command(rank, Command::Send(call.contribution(rank, &encoded(&values_of(call, rank)))))
            .unwrap();
    }
}

#[test]
fn a_comm_node_looking_for_a_new_parent_holds_an_operation_until_it_has_one() {
    let mut sim = recovering_tree(7);
    let a1 = sim.parent_of(sim.node_of_rank(0).unwrap()).unwrap();
    let a = sim.parent_of(a1).unwrap();
    sim.kill_at(a, Duration::ZERO);
    sim.run_until(|s| s.core(a1).is_some_and(|n| n.is_rejoining()), SETTLE).unwrap();
    let call = all_reduce_of_eight(0);
    enter(&mut sim, &call, [0, 1]);
    sim.settle(SETTLE);
    // Rejoined by now; nobody got a result that left the others out.
    assert!(result_at(&mut sim, 0).is_none() && result_at(&mut sim, 1).is_none());
    enter(&mut sim, &call, 2..8);
    sim.settle(SETTLE);
    for rank in 0..8 {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert_eq!(head.contributors, RankSet::range(0, 8), "rank {rank}");
        assert_eq!(decode_values(&body).unwrap(), folded(&call));
    }
}

#[test]
fn contributions_lost_with_a_comm_node_are_sent_again_after_the_rejoin() {
    let mut sim = recovering_tree(8);
    let a1 = sim.parent_of(sim.node_of_rank(0).unwrap()).unwrap();
    let a = sim.parent_of(a1).unwrap();
    let call = all_reduce_of_eight(0);
    // Ranks 0 and 1 enter; their partial waits at `a` for ranks 2 and 3.
    enter(&mut sim, &call, [0, 1]);
    sim.settle(SETTLE);
    sim.kill_at(a, Duration::ZERO);
    sim.settle(SETTLE);
    enter(&mut sim, &call, 2..8);
    sim.settle(SETTLE);
    for rank in 0..8 {
        let (head, _) = result_at(&mut sim, rank).unwrap_or_else(|| panic!("rank {rank} got no result"));
        assert_eq!(head.contributors, RankSet::range(0, 8), "rank {rank}");
    }
}

#[test]
fn forged_results_from_below_close_the_link_and_an_operation_nobody_finishes_expires() {
    let mut sim = launched(Topology::from_spec("balanced:2x2", None).unwrap(), 9);
    // Rank 0 enters alone; the others never do.
    let call = all_reduce_of_eight(0);
    let call = CollectiveCall { members: RankSet::range(0, 4), ..call };
    enter(&mut sim, &call, [0]);
    sim.settle(SETTLE);
    assert!(result_at(&mut sim, 0).is_none());
    sim.settle(treecast_proto::COLLECTIVE_EXPIRY + SETTLE);
    let (head, _) = result_at(&mut sim, 0).unwrap();
    assert!(head.error.contains("never entered"), "{}", head.error);
    // A back-end that sends a result up is cut off.
    let forged = CollectiveHead {
        op: CollectiveOp::AllReduce,
        combine: Combine::Sum,
        down: true,
        context: 1,
        seq: 1,
        root: u32::MAX,
        members: RankSet::range(0, 4),
        contributors: RankSet::single(1),
        error: String::new(),
        order: Vec::new(),
    };
    let mut h = treecast_proto::wire::FrameHeader::peer(u32::MAX, 0, 1);
    h.flags = treecast_proto::wire::FLAG_PEER_COLL;
    let frame = Frame::new(h, treecast_proto::wire::encode_collective(&forged, &[]));
    // The core refuses it at its source; on the wire its parent would drop the link.
    assert!(sim.backend_command(1, Command::Send(frame)).is_err());
}

/// A reduce-scatter over ranks 0-3 of balanced:2x2 in the order 3, 1, 0, 2.
fn scatter_of_four(seq: u32) -> CollectiveCall {
    CollectiveCall {
        op: CollectiveOp::ReduceScatter,
        combine: Combine::Sum,
        context: 6,
        seq,
        root: u32::MAX,
        members: RankSet::range(0, 4),
        order: vec![3, 1, 0, 2],
    }
}

#[test]
fn members_that_disagree_on_a_reduce_scatters_order_all_learn_why() {
    let mut sim = launched(Topology::from_spec("balanced:2x2", None).unwrap(), 8);
    let call = scatter_of_four(0);
    let other = CollectiveCall { order: vec![0, 1, 2, 3], ..call.clone() };
    enter(&mut sim, &call, [0, 1, 2]);
    enter(&mut sim, &other, [3]);
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert!(head.error.contains("disagree on the order"), "rank {rank}: {}", head.error);
        assert!(body.is_empty());
    }
}

#[test]
fn a_reduce_scatter_whose_values_cannot_be_cut_goes_down_whole_with_its_order() {
    let mut sim = launched(Topology::from_spec("balanced:2x2", None).unwrap(), 9);
    let call = scatter_of_four(0);
    // A scalar cannot be cut into blocks: each member gets the whole result, and the
    // whole order to find its block by (the API refuses such values before they are
    // sent; a comm node must still not lose them).
    for rank in 0..4 {
        let values = [Value::Double(f64::from(rank))];
        sim.backend_command(rank, Command::Send(call.contribution(rank, &encoded(&values)))).unwrap();
    }
    sim.settle(SETTLE);
    for rank in 0..4 {
        let (head, body) = result_at(&mut sim, rank).unwrap();
        assert!(head.error.is_empty(), "{}", head.error);
        assert_eq!(head.order, call.order);
        assert_eq!(decode_values(&body).unwrap(), vec![Value::Double(6.0)]);
    }
}
