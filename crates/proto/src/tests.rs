//! Unit tests of the core: one node at a time, frames in, outputs checked.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use treecast_filters::{FilterRegistry, TransformKind};
use treecast_wire::{
    encode_values, AttachPoint, ControlMsg, FilterSpec, Frame, FrameHeader, Grant, LaunchPlan, MemberPlan,
    RankSet, RouteChoice, StreamSpec, SyncMode, Value, Window,
};

use super::*;
use crate::startup::REPORT_HOLD;

fn node(role: Role, id: u32) -> Node {
    Node::new(NodeConfig {
        role,
        node_id: id,
        name: format!("node {id}"),
        registry: FilterRegistry::builtin(),
        tool_window: Window { packets: 1000, bytes: 1 << 20 },
    })
}

fn plan(topology: &str, node_id: u32, allow_missing: bool) -> LaunchPlan {
    let mut plan = LaunchPlan::local("s", topology.into(), 2);
    plan.node_id = node_id;
    plan.startup_timeout_ms = 1000;
    plan.allow_missing = allow_missing;
    // Heartbeats would add deadlines and frames to every test; their own test sets them.
    (plan.heartbeat_ms, plan.dead_after_ms) = (0, 0);
    // Likewise recovery's Fallback messages.
    plan.rejoin_ms = 0;
    plan
}

/// The member plan of back-end `rank` (node `node_id`) of `size`, with recovery for
/// `rejoin_ms` and no heartbeats.
fn member(node_id: u32, rank: u32, size: u32, rejoin_ms: u32) -> MemberPlan {
    MemberPlan {
        node_id,
        rank,
        size,
        group: None,
        heartbeat_ms: 0,
        dead_after_ms: 0,
        rejoin_ms,
        clock: Default::default(),
        zero_copy_min: 0,
        stripe_stall_ms: 0,
    }
}

/// A back-end linked to its parent on `link` that took `plan` (and sent its Join).
fn placed_backend(plan: MemberPlan, link: LinkId, now: Instant) -> Node {
    let mut be = node(Role::BackEnd { rank: u32::MAX, size: 0 }, plan.node_id);
    be.handle_link_up(link, Peer::Parent, now);
    be.handle_frame(link, control(&ControlMsg::MemberPlan(Box::new(plan))), now);
    transmits(&mut be);
    events(&mut be);
    be
}

fn ids(n: usize) -> Vec<LinkId> {
    let mut t = LinkTable::new();
    (0..n).map(|_| t.insert(())).collect()
}

fn events(n: &mut Node) -> Vec<Event> {
    std::iter::from_fn(|| n.poll_event()).collect()
}

fn transmits(n: &mut Node) -> Vec<Transmit> {
    std::iter::from_fn(|| n.poll_transmit()).collect()
}

fn control(msg: &ControlMsg) -> Frame {
    control_frame(msg)
}

fn int(stream: u32, rank: u32, v: i32) -> Frame {
    let mut payload = Vec::new();
    encode_values(&[Value::Int(v)], &mut payload);
    Frame::new(FrameHeader::data(stream, 0, rank), payload)
}

fn spec(id: u32, up_window: Window) -> StreamSpec {
    StreamSpec {
        id,
        ranks: RankSet::range(0, 2),
        sync: SyncMode::WaitForAll,
        up: TransformKind::Sum.spec(),
        down: FilterSpec::new("null", 1),
        up_window,
        down_window: Window { packets: 4, bytes: 1000 },
        program: 0,
        route: treecast_wire::RouteChoice::Network,
    }
}

/// A front-end with two back-end children (node ids 1 and 2), both joined.
fn front_end_with_two_backends() -> (Node, Vec<LinkId>) {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    let links = ids(2);
    for (i, &l) in links.iter().enumerate() {
        fe.handle_link_up(l, Peer::Child { node_id: i as u32 + 1 }, now);
        fe.handle_frame(
            l,
            control(&ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 }),
            now,
        );
    }
    assert!(fe.is_running());
    events(&mut fe);
    transmits(&mut fe);
    (fe, links)
}

#[test]
fn a_child_sending_beyond_its_window_loses_its_link() {
    let (mut fe, links) = front_end_with_two_backends();
    let now = Instant::now();
    fe.handle_command(Command::NewStream(spec(1, Window { packets: 2, bytes: 1000 })), now).unwrap();
    for v in 0..2 {
        fe.handle_frame(links[0], int(1, 0, v), now);
    }
    assert!(events(&mut fe).is_empty(), "two frames are within the window");
    fe.handle_frame(links[0], int(1, 0, 2), now);
    let evs = events(&mut fe);
    assert!(
        evs.iter().any(|e| matches!(e, Event::CloseLink { link, reason } if *link == links[0] && reason.contains("beyond its window"))),
        "{evs:?}"
    );
    assert!(
        evs.iter().any(|e| matches!(e, Event::RanksLost { ranks, .. } if *ranks == RankSet::single(0))),
        "{evs:?}"
    );
    // The survivor's packets complete the waves without the dropped child.
    fe.handle_frame(links[1], int(1, 1, 10), now);
    let got = fe.poll_delivery(Some(1));
    assert!(matches!(got, Some(Delivery::Packet(_))), "{got:?}");
}

#[test]
fn a_link_claiming_a_node_id_that_is_not_a_child_is_closed() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    let links = ids(3);
    fe.handle_link_up(links[0], Peer::Child { node_id: 7 }, now);
    fe.handle_link_up(links[1], Peer::Child { node_id: 1 }, now);
    fe.handle_link_up(links[2], Peer::Child { node_id: 1 }, now);
    let closed: Vec<LinkId> = events(&mut fe)
        .into_iter()
        .filter_map(|e| match e {
            Event::CloseLink { link, .. } => Some(link),
            _ => None,
        })
        .collect();
    assert_eq!(closed, [links[0], links[2]], "an unknown id, then a second link for one child");
}

#[test]
fn a_child_that_never_connects_fails_the_start_with_its_name_and_how_it_ended() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    fe.handle_command(Command::ChildExited { node_id: 2, detail: "exited with status 3".into() }, now)
        .unwrap();
    let failed = events(&mut fe).into_iter().find_map(|e| match e {
        Event::StartupFailed { message } => Some(message),
        _ => None,
    });
    let message = failed.unwrap();
    assert_eq!(
        message,
        "back-end rank 1 on h (node 2) exited before connecting; the process exited with status 3"
    );
    assert!(fe.is_over());
}

/// The `RanksLost` events among `evs`, as (ranks, reason).
fn lost(evs: &[Event]) -> Vec<(RankSet, String)> {
    evs.iter()
        .filter_map(|e| match e {
            Event::RanksLost { ranks, reason } => Some((ranks.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_child_lost_while_running_is_reported_with_how_its_process_ended() {
    // Regression: the link closes before the driver hears of the exit, and the loss
    // was reported as "link … closed" alone, without the exit status or stderr.
    let (mut fe, links) = front_end_with_two_backends();
    let now = Instant::now();
    fe.handle_command(Command::NewStream(spec(1, Window { packets: 4, bytes: 1000 })), now).unwrap();
    fe.handle_link_closed(links[1], None, now);
    let evs = events(&mut fe);
    assert!(lost(&evs).is_empty(), "the report waits for the process news: {evs:?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::AbandonChild { .. })), "{evs:?}");
    // Its rank left the stream at once: rank 0 alone completes a wave.
    fe.handle_frame(links[0], int(1, 0, 7), now);
    assert!(matches!(fe.poll_delivery(Some(1)), Some(Delivery::Packet(_))));
    assert_eq!(fe.poll_timeout(), Some(now + EXIT_WAIT));
    let later = now + Duration::from_millis(20);
    let detail = "exited with status 3; its stderr:\nError: the config file is missing";
    fe.handle_command(Command::ChildExited { node_id: 2, detail: detail.into() }, later).unwrap();
    let evs = events(&mut fe);
    assert_eq!(
        lost(&evs),
        [(
            RankSet::single(1),
            "node 0: link to back-end rank 1 on h (node 2) closed; the process exited with status 3; \
             its stderr:\nError: the config file is missing"
                .to_owned()
        )]
    );
    assert!(evs.contains(&Event::AbandonChild { node_id: 2 }), "{evs:?}");
    assert_eq!(fe.poll_timeout(), None, "nothing is held any more");
    assert_eq!(fe.lost().ranks(), &RankSet::single(1));
}

#[test]
fn a_lost_child_whose_process_news_never_comes_is_reported_at_the_deadline() {
    let (mut fe, links) = front_end_with_two_backends();
    let now = Instant::now();
    fe.handle_link_closed(links[0], Some("connection reset by peer".into()), now);
    assert!(lost(&events(&mut fe)).is_empty());
    fe.handle_timeout(now + EXIT_WAIT - Duration::from_millis(1));
    assert!(lost(&events(&mut fe)).is_empty(), "not before the deadline");
    fe.handle_timeout(now + EXIT_WAIT);
    let evs = events(&mut fe);
    assert_eq!(
        lost(&evs),
        [(
            RankSet::single(0),
            "node 0: link to back-end rank 0 on h (node 1) failed: connection reset by peer".to_owned()
        )]
    );
    // Its process, if it still runs, is stopped only now.
    assert!(evs.contains(&Event::AbandonChild { node_id: 1 }), "{evs:?}");
    // News that comes after the report changes nothing.
    fe.handle_command(Command::ChildExited { node_id: 1, detail: "exited with status 0".into() }, now)
        .unwrap();
    assert!(lost(&events(&mut fe)).is_empty());
}

#[test]
fn a_child_this_node_cut_off_is_reported_at_once() {
    // Dropped for breaking the protocol: the reason is known, and nothing waits.
    let (mut fe, links) = front_end_with_two_backends();
    let now = Instant::now();
    fe.handle_frame(links[0], Frame::new(FrameHeader::control(), vec![0xEE]), now);
    let evs = events(&mut fe);
    let lost = lost(&evs);
    assert_eq!(lost.len(), 1, "{evs:?}");
    assert!(lost[0].1.contains("malformed control message"), "{}", lost[0].1);
    assert_eq!(fe.poll_timeout(), None);
}

#[test]
fn in_attach_mode_a_backend_refused_during_start_up_is_missing_and_the_start_goes_on() {
    // Regression: one back-end whose link this node cut off (a control frame over its
    // limit) failed the whole launch, although anyone with the attach file takes a slot.
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    let mut p = plan("h:0 => h:1 h:2 ;", 0, false);
    p.attach_ms = 5_000;
    fe.handle_command(Command::Launch(Box::new(p)), now).unwrap();
    let points = (0..2).map(|r| AttachPoint { rank: r, node_id: r + 1, address: "unix:@x".into() }).collect();
    fe.handle_command(Command::OwnAttachPoints(points), now).unwrap();
    let links = ids(2);
    fe.handle_link_up(links[0], Peer::Child { node_id: 1 }, now);
    fe.handle_link_closed(links[0], Some("a control frame of 33554432 bytes is over".into()), now);
    fe.handle_link_up(links[1], Peer::Child { node_id: 2 }, now);
    fe.handle_frame(links[1], control(&ControlMsg::Join { ranks: RankSet::single(1), commnodes: 0 }), now);
    let evs = events(&mut fe);
    assert!(!evs.iter().any(|e| matches!(e, Event::StartupFailed { .. })), "{evs:?}");
    let missing = evs.iter().find_map(|e| match e {
        Event::Ready { missing, .. } => Some(missing.clone()),
        _ => None,
    });
    let missing = missing.expect("ready");
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing[0].0, RankSet::single(0));
    assert!(
        missing[0].1.contains("refused during start-up: ") && missing[0].1.contains("33554432"),
        "{}",
        missing[0].1
    );
}

#[test]
fn a_late_child_is_given_up_on_at_its_deadline_not_before() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, true))), now).unwrap();
    let link = ids(1)[0];
    fe.handle_link_up(link, Peer::Child { node_id: 1 }, now);
    fe.handle_frame(link, control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 0 }), now);
    let deadline = fe.poll_timeout().unwrap();
    assert_eq!(deadline, now + Duration::from_millis(1000));
    fe.handle_timeout(deadline - Duration::from_millis(1));
    assert!(!fe.is_running());
    fe.handle_timeout(deadline);
    let evs = events(&mut fe);
    let ready = evs.iter().find_map(|e| match e {
        Event::Ready { ranks, missing, .. } => Some((ranks.clone(), missing.clone())),
        _ => None,
    });
    let (ranks, missing) = ready.unwrap();
    assert_eq!(ranks, RankSet::single(0));
    assert_eq!(missing[0].0, RankSet::single(1));
    assert!(missing[0].1.contains("did not connect within 1.0 s"), "{}", missing[0].1);
    assert_eq!(fe.lost().ranks(), &RankSet::single(1));
}

#[test]
fn a_comm_node_gets_its_plan_checked_and_hands_sub_plans_down() {
    let now = Instant::now();
    let mut cn = node(Role::CommNode, 1);
    let links = ids(3);
    cn.handle_link_up(links[0], Peer::Parent, now);
    // A plan for another node closes the parent link, and with it the node.
    let mut wrong = plan("h:1 => h:2 h:3 ;", 5, false);
    wrong.first_rank = 0;
    cn.handle_frame(links[0], control(&ControlMsg::Plan(Box::new(wrong))), now);
    assert!(cn.is_over());

    let mut cn = node(Role::CommNode, 1);
    cn.handle_link_up(links[0], Peer::Parent, now);
    cn.handle_frame(
        links[0],
        control(&ControlMsg::Plan(Box::new(plan("h:1 => h:2 ;\nh:2 => h:3 ;", 1, false)))),
        now,
    );
    let start = events(&mut cn).into_iter().find_map(|e| match e {
        Event::StartChildren { children, own_host, .. } => Some((children, own_host)),
        _ => None,
    });
    let (children, own_host) = start.unwrap();
    assert_eq!(own_host, "h");
    assert_eq!(children.len(), 1);
    assert_eq!((children[0].node_id, children[0].is_backend), (2, false));
    cn.handle_link_up(links[1], Peer::Child { node_id: 2 }, now);
    let sent = transmits(&mut cn);
    let sub = sent.iter().find_map(|t| match ControlMsg::decode(&t.frame.payload) {
        Ok(ControlMsg::Plan(p)) => Some(p),
        _ => None,
    });
    let sub = sub.unwrap();
    assert_eq!((sub.node_id, sub.first_rank), (2, 0));
    assert!(sub.topology.starts_with("h:2 => h:3"), "{}", sub.topology);
    // Its join makes the comm node join its parent with the same ranks.
    cn.handle_frame(links[1], control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 1 }), now);
    let up = transmits(&mut cn).into_iter().find_map(|t| match ControlMsg::decode(&t.frame.payload) {
        Ok(ControlMsg::Join { ranks, commnodes }) => Some((ranks, commnodes)),
        _ => None,
    });
    assert_eq!(up, Some((RankSet::single(0), 2)));
}

/// What a node sent on `link`: data frames as their value, control messages by kind.
fn sent_on(sent: &[Transmit], link: LinkId) -> Vec<String> {
    sent.iter()
        .filter(|t| matches!(t.to, Destination::Link(l) if l == link))
        .filter_map(|t| match t.frame.header.kind {
            FrameKind::Data => {
                Some(format!("data {:?}", treecast_wire::decode_values(&t.frame.payload).ok()?))
            }
            FrameKind::Control => match ControlMsg::decode(&t.frame.payload) {
                Ok(ControlMsg::Leave { ranks, .. }) => Some(format!("leave {ranks}")),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A comm node over one back-end (rank 0) on a do-not-wait stream of window 2, whose
/// back-end sent four frames (two went up, two wait for credit) and was then lost.
fn comm_node_holding_data_of_a_lost_child(now: Instant) -> (Node, LinkId) {
    let (parent, child) = (ids(2)[0], ids(2)[1]);
    let mut cn = node(Role::CommNode, 1);
    cn.handle_link_up(parent, Peer::Parent, now);
    cn.handle_frame(parent, control(&ControlMsg::Plan(Box::new(plan("h:1 => h:2 ;", 1, false)))), now);
    cn.handle_link_up(child, Peer::Child { node_id: 2 }, now);
    cn.handle_frame(child, control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 0 }), now);
    let mut each = spec(1, Window { packets: 2, bytes: 1000 });
    (each.ranks, each.sync, each.up) = (RankSet::single(0), SyncMode::DoNotWait, FilterSpec::new("null", 1));
    cn.handle_frame(parent, control(&ControlMsg::NewStream(each)), now);
    transmits(&mut cn);
    for v in 0..2 {
        cn.handle_frame(child, int(1, 0, v), now);
    }
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["data [Int(0)]", "data [Int(1)]"]);
    for v in 2..4 {
        cn.handle_frame(child, int(1, 0, v), now);
    }
    assert!(sent_on(&transmits(&mut cn), parent).is_empty(), "no credit: nothing more goes up");
    cn.handle_link_closed(child, None, now);
    cn.handle_command(Command::ChildExited { node_id: 2, detail: "exited with status 0".into() }, now)
        .unwrap();
    (cn, parent)
}

#[test]
fn a_comm_node_reports_a_lost_child_only_after_the_data_it_sent_before() {
    // Regression (an MRNet-style back-end that sent 2,000 packets and exited, the
    // front-end slow to read them): the loss went up at once, ahead of the data still
    // waiting here for up credit, and the front-end ended the stream without it.
    let now = Instant::now();
    let (mut cn, parent) = comm_node_holding_data_of_a_lost_child(now);
    let sent = transmits(&mut cn);
    assert!(
        sent_on(&sent, parent).is_empty(),
        "nothing may go before the held data: {:?}",
        sent_on(&sent, parent)
    );
    cn.handle_frame(parent, Frame::credit(1, Grant { packets: 2, bytes: 1000 }), now);
    let sent = transmits(&mut cn);
    assert_eq!(sent_on(&sent, parent), ["data [Int(2)]", "data [Int(3)]", "leave 0"]);
}

#[test]
fn a_lost_child_is_reported_after_a_while_even_if_its_data_never_gets_credit() {
    // A tool that never reads one stream must not keep the loss from another one.
    let now = Instant::now();
    let (mut cn, parent) = comm_node_holding_data_of_a_lost_child(now);
    transmits(&mut cn);
    assert!(cn.poll_timeout().is_some_and(|t| t <= now + REPORT_HOLD), "{:?}", cn.poll_timeout());
    cn.handle_timeout(now + REPORT_HOLD - Duration::from_millis(1));
    assert!(sent_on(&transmits(&mut cn), parent).is_empty(), "not before the limit");
    cn.handle_timeout(now + REPORT_HOLD);
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["leave 0"]);
}

#[test]
fn a_lost_child_s_report_waits_while_its_data_still_goes_up_slowly() {
    // Regression (CI under load: the MRNet-style front-end read a back-end's last
    // 2,000 packets for more than a second): the loss went up after a second however
    // much data still followed, and the front-end ended the stream without it.
    let now = Instant::now();
    let (mut cn, parent) = comm_node_holding_data_of_a_lost_child(now);
    transmits(&mut cn);
    let one = Grant { packets: 1, bytes: 1000 };
    let later = now + REPORT_HOLD - Duration::from_millis(100);
    cn.handle_frame(parent, Frame::credit(1, one), later);
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["data [Int(2)]"]);
    cn.handle_timeout(now + REPORT_HOLD + Duration::from_millis(500));
    assert!(sent_on(&transmits(&mut cn), parent).is_empty(), "data moved less than a hold ago");
    cn.handle_timeout(later + REPORT_HOLD);
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["leave 0"], "nothing moved for a hold");
    cn.handle_frame(parent, Frame::credit(1, one), later + REPORT_HOLD);
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["data [Int(3)]"]);
}

#[test]
fn a_lost_child_s_report_follows_its_data_at_once_when_that_data_went_up() {
    let now = Instant::now();
    let (mut cn, parent) = comm_node_holding_data_of_a_lost_child(now);
    transmits(&mut cn);
    let late = now + REPORT_HOLD * 5;
    for (k, v) in [(1, 2), (2, 3)] {
        cn.handle_frame(
            parent,
            Frame::credit(1, Grant { packets: 1, bytes: 1000 }),
            now + REPORT_HOLD * k / 2,
        );
        let sent = sent_on(&transmits(&mut cn), parent);
        let mut want = vec![format!("data [Int({v})]")];
        if v == 3 {
            want.push("leave 0".into());
        }
        assert_eq!(sent, want);
    }
    cn.handle_timeout(late);
    assert!(sent_on(&transmits(&mut cn), parent).is_empty(), "the report went once");
}

#[test]
fn a_lost_child_s_report_is_not_held_by_a_stream_that_moves_past_its_data() {
    // Two streams hold the lost rank 0's data: stream 2 is never read, stream 1 keeps
    // moving with rank 1's data after its own backlog went. Only the stuck stream
    // still holds the report, and it lets it go a hold after the last move of data
    // that was ahead of the report.
    let now = Instant::now();
    let (parent, a, b) = (ids(3)[0], ids(3)[1], ids(3)[2]);
    let mut cn = node(Role::CommNode, 1);
    cn.handle_link_up(parent, Peer::Parent, now);
    let topo = "h:1 => h:2 h:3 ;";
    cn.handle_frame(parent, control(&ControlMsg::Plan(Box::new(plan(topo, 1, false)))), now);
    for (link, id, rank) in [(a, 2, 0), (b, 3, 1)] {
        cn.handle_link_up(link, Peer::Child { node_id: id }, now);
        cn.handle_frame(link, control(&ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 }), now);
    }
    for (id, ranks) in [(1, RankSet::range(0, 2)), (2, RankSet::single(0))] {
        let mut each = spec(id, Window { packets: 1, bytes: 1000 });
        (each.ranks, each.sync, each.up) = (ranks, SyncMode::DoNotWait, FilterSpec::new("null", 1));
        cn.handle_frame(parent, control(&ControlMsg::NewStream(each)), now);
    }
    transmits(&mut cn);
    for (stream, v) in [(1, 0), (1, 1), (2, 0), (2, 1)] {
        cn.handle_frame(a, int(stream, 0, v), now);
    }
    assert_eq!(sent_on(&transmits(&mut cn), parent), ["data [Int(0)]", "data [Int(0)]"]);
    cn.handle_link_closed(a, None, now);
    cn.handle_command(Command::ChildExited { node_id: 2, detail: "exited with status 0".into() }, now)
        .unwrap();
    assert!(sent_on(&transmits(&mut cn), parent).is_empty(), "data waits ahead of the report");
    let one = Grant { packets: 1, bytes: 1000 };
    // Stream 1's own backlog (rank 0's 1) goes at 0.5 s; then rank 1's data keeps
    // stream 1 moving every half second (each packet once the last one went up).
    let step = REPORT_HOLD / 2;
    let mut sent = Vec::new();
    for k in 1..6u32 {
        cn.handle_frame(parent, Frame::credit(1, one), now + step * k);
        cn.handle_frame(b, int(1, 1, 10 + k as i32), now + step * k);
        sent.extend(sent_on(&transmits(&mut cn), parent));
    }
    let at = |what: &str| sent.iter().position(|s| s == what);
    let leave = at("leave 0");
    assert!(leave.is_some(), "the report still waits while stream 1 moves: {sent:?}");
    assert!(leave > at("data [Int(1)]"), "the report overtook data before it: {sent:?}");
}

#[test]
fn a_credit_reopens_a_blocked_backend_and_a_parent_may_not_overrun_its_window() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    let window = Window { packets: 2, bytes: 1000 };
    be.handle_frame(parent, control(&ControlMsg::NewStream(spec(1, window))), now);
    transmits(&mut be);
    for v in 0..2 {
        be.handle_command(Command::Send(int(1, 0, v)), now).unwrap();
    }
    let blocked = be.handle_command(Command::Send(int(1, 0, 2)), now);
    let Err(CommandError::Blocked(frame)) = blocked else { panic!("{blocked:?}") };
    events(&mut be);
    be.handle_frame(parent, Frame::credit(1, Grant { packets: 1, bytes: 5 }), now);
    assert!(events(&mut be).contains(&Event::Writable { stream: 1 }));
    be.handle_command(Command::Send(frame), now).unwrap();
    // Down: the parent may have four packets outstanding, not five.
    for v in 0..4 {
        be.handle_frame(parent, int(1, u32::MAX, v), now);
    }
    transmits(&mut be);
    be.handle_frame(parent, int(1, u32::MAX, 9), now);
    assert!(
        events(&mut be).iter().any(|e| matches!(e, Event::CloseLink { .. })),
        "a fifth frame overruns the window"
    );
}

#[test]
fn a_malformed_control_or_credit_frame_closes_only_that_link() {
    let (mut fe, links) = front_end_with_two_backends();
    let now = Instant::now();
    fe.handle_frame(links[0], Frame::new(FrameHeader::control(), vec![0xEE]), now);
    fe.handle_frame(links[1], Frame::new(FrameHeader::credit(1), vec![1, 2, 3]), now);
    let reasons: Vec<String> = events(&mut fe)
        .into_iter()
        .filter_map(|e| match e {
            Event::CloseLink { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert!(reasons[0].contains("malformed control message"), "{reasons:?}");
    assert!(reasons[1].contains("malformed credit frame"), "{reasons:?}");
}

#[test]
fn a_stream_with_an_unknown_filter_is_refused_at_the_front_end_naming_it() {
    let (mut fe, _) = front_end_with_two_backends();
    let mut s = spec(1, Window { packets: 2, bytes: 1000 });
    s.up = FilterSpec::new("median", 1);
    let err = fe.handle_command(Command::NewStream(s), Instant::now()).unwrap_err().to_string();
    assert!(err.contains("node 0") && err.contains("median"), "{err}");
    assert!(transmits(&mut fe).is_empty(), "nothing went down");
}

#[test]
fn a_stream_with_its_own_program_tag_has_its_frames_recorded_under_it_while_it_lives() {
    let now = Instant::now();
    let program = |n: &mut Node| -> Vec<(u32, Option<u32>)> {
        events(n)
            .into_iter()
            .filter_map(|e| match e {
                Event::StreamProgram { stream, program } => Some((stream, program)),
                _ => None,
            })
            .collect()
    };
    // The front-end that opens it.
    let (mut fe, _) = front_end_with_two_backends();
    events(&mut fe);
    let tagged = StreamSpec { program: 42, ..spec(1, Window { packets: 2, bytes: 1000 }) };
    fe.handle_command(Command::NewStream(tagged.clone()), now).unwrap();
    fe.handle_command(Command::NewStream(spec(2, Window { packets: 2, bytes: 1000 })), now).unwrap();
    assert_eq!(program(&mut fe), [(1, Some(42))], "an untagged stream tells nothing");
    // A back-end that learns of it and then sees it closed.
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    be.handle_frame(parent, control(&ControlMsg::NewStream(tagged)), now);
    assert_eq!(program(&mut be), [(1, Some(42))]);
    be.handle_frame(parent, control(&ControlMsg::CloseStream { id: 1 }), now);
    assert_eq!(program(&mut be), [(1, None)]);
}

#[test]
fn a_stream_that_chose_a_route_tells_the_driver_when_it_is_made_and_when_it_ends() {
    let now = Instant::now();
    let routes = |n: &mut Node| std::iter::from_fn(|| n.poll_stream_route()).collect::<Vec<_>>();
    let (mut fe, _) = front_end_with_two_backends();
    let tcp = StreamSpec { route: RouteChoice::Tcp, ..spec(1, Window { packets: 2, bytes: 1000 }) };
    fe.handle_command(Command::NewStream(tcp.clone()), now).unwrap();
    fe.handle_command(Command::NewStream(spec(2, Window { packets: 2, bytes: 1000 })), now).unwrap();
    assert_eq!(routes(&mut fe), [(1, Some(RouteChoice::Tcp))], "the network's route tells nothing");
    // A back-end learns it from its parent, and sees the stream closed.
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    be.handle_frame(parent, control(&ControlMsg::NewStream(tcp)), now);
    assert_eq!(routes(&mut be), [(1, Some(RouteChoice::Tcp))]);
    be.handle_frame(parent, control(&ControlMsg::CloseStream { id: 1 }), now);
    assert_eq!(routes(&mut be), [(1, None)], "its end");
}

#[test]
fn a_send_waiting_for_credit_is_woken_when_its_stream_closes() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    be.handle_frame(
        parent,
        control(&ControlMsg::NewStream(spec(1, Window { packets: 1, bytes: 1000 }))),
        now,
    );
    be.handle_command(Command::Send(int(1, 0, 0)), now).unwrap();
    assert!(matches!(be.handle_command(Command::Send(int(1, 0, 1)), now), Err(CommandError::Blocked(_))));
    events(&mut be);
    be.handle_frame(parent, control(&ControlMsg::CloseStream { id: 1 }), now);
    assert!(events(&mut be).contains(&Event::Writable { stream: 1 }));
    assert!(matches!(
        be.handle_command(Command::Send(int(1, 0, 1)), now),
        Err(CommandError::UnknownStream(1))
    ));
}

#[test]
fn a_stream_refused_below_after_its_window_filled_ends_and_wakes_the_sender() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 ;\nh:1 => h:2 h:3 ;", 0, false))), now)
        .unwrap();
    let link = ids(1)[0];
    fe.handle_link_up(link, Peer::Child { node_id: 1 }, now);
    fe.handle_frame(link, control(&ControlMsg::Join { ranks: RankSet::range(0, 2), commnodes: 1 }), now);
    events(&mut fe);
    transmits(&mut fe);
    fe.handle_command(Command::NewStream(spec(1, Window { packets: 4, bytes: 1000 })), now).unwrap();
    let blocked = (0..20).any(|v| {
        matches!(fe.handle_command(Command::Send(int(1, u32::MAX, v)), now), Err(CommandError::Blocked(_)))
    });
    assert!(blocked, "the down window filled");
    events(&mut fe);
    let refused =
        ControlMsg::StreamRefused { stream: 1, node: "comm node".into(), message: "no filter".into() };
    fe.handle_frame(link, control(&refused), now);
    let evs = events(&mut fe);
    assert!(evs.contains(&Event::Writable { stream: 1 }), "{evs:?}");
    assert_eq!(fe.poll_delivery(Some(1)), Some(Delivery::StreamClosed(1)));
    assert!(!fe.has_stream(1), "nothing of the stream is left");
}

#[test]
fn a_child_that_falls_silent_after_its_heartbeats_is_cut_off_at_the_limit() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    let mut p = plan("h:0 => h:1 h:2 ;", 0, false);
    (p.heartbeat_ms, p.dead_after_ms) = (100, 1000);
    fe.handle_command(Command::Launch(Box::new(p)), now).unwrap();
    let links = ids(2);
    for (i, link) in links.iter().enumerate() {
        let rank = i as u32;
        fe.handle_link_up(*link, Peer::Child { node_id: rank + 1 }, now);
        fe.handle_frame(
            *link,
            control(&ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 }),
            now,
        );
        fe.handle_frame(*link, heartbeat_frame(), now);
    }
    assert!(fe.is_running());
    fe.handle_timeout(now);
    let beats = transmits(&mut fe)
        .into_iter()
        .filter(|t| t.frame.header.kind == FrameKind::Credit && t.frame.header.stream == 0)
        .count();
    assert_eq!(beats, 2, "a heartbeat on each link");
    // Child 2 keeps talking; child 1 says nothing more.
    let limit = now + Duration::from_millis(1000);
    let mut steps = 0;
    while let Some(t) = fe.poll_timeout().filter(|t| *t < limit) {
        steps += 1;
        fe.handle_frame(links[1], heartbeat_frame(), t);
        fe.handle_timeout(t);
        assert!(fe.lost().ranks().is_empty(), "cut off before the limit, at {:?}", t - now);
    }
    assert_eq!(steps, 9, "a heartbeat every 100 ms until the limit");
    assert_eq!(fe.poll_timeout(), Some(limit));
    fe.handle_timeout(limit);
    let lost = events(&mut fe).into_iter().find_map(|e| match e {
        Event::RanksLost { ranks, reason } => Some((ranks, reason)),
        _ => None,
    });
    let (ranks, reason) = lost.unwrap();
    assert_eq!(ranks, RankSet::single(0));
    assert!(reason.contains("nothing arrived for 1.0 s"), "{reason}");
    assert!(fe.is_running(), "the rest of the tree goes on");
}

#[test]
fn a_backend_reports_a_packet_it_refused_to_send_naming_its_rank() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 7, size: 8 }, 3);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    transmits(&mut be);
    let report = Command::ReportFilterError { stream: 1, message: "sum cannot add %s".into() };
    be.handle_command(report, now).unwrap();
    let sent: Vec<ControlMsg> =
        transmits(&mut be).iter().filter_map(|t| ControlMsg::decode(&t.frame.payload).ok()).collect();
    assert_eq!(sent, [ControlMsg::FilterError { stream: 1, rank: 7, message: "sum cannot add %s".into() }]);
    // The front-end turns it into an event for its tool.
    let (mut fe, links) = front_end_with_two_backends();
    fe.handle_frame(links[0], control(&sent[0]), now);
    assert_eq!(
        events(&mut fe),
        [Event::FilterError { stream: 1, rank: 7, message: "sum cannot add %s".into() }]
    );
    let refused = fe.handle_command(Command::ReportFilterError { stream: 1, message: String::new() }, now);
    assert!(matches!(refused, Err(CommandError::NotNow(_))), "{refused:?}");
}

#[test]
fn a_child_lost_during_start_up_fails_it_with_how_its_process_ended() {
    // A back-end that connects, then panics: its link closes before the driver hears
    // of the exit, and the start-up error must still quote its panic message.
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    let links = ids(2);
    fe.handle_link_up(links[0], Peer::Child { node_id: 1 }, now);
    fe.handle_link_up(links[1], Peer::Child { node_id: 2 }, now);
    fe.handle_frame(links[1], control(&ControlMsg::Join { ranks: RankSet::single(1), commnodes: 0 }), now);
    fe.handle_link_closed(links[1], None, now);
    // Rank 1 joined, then went: the tree is neither ready nor failed before the news.
    fe.handle_frame(links[0], control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 0 }), now);
    let evs = events(&mut fe);
    assert!(!evs.iter().any(|e| matches!(e, Event::Ready { .. } | Event::StartupFailed { .. })), "{evs:?}");
    assert_eq!(fe.poll_timeout(), Some(now + EXIT_WAIT));
    let detail = "exited with status 101; its stderr:\nthread 'main' panicked at src/main.rs:9:5:\nno config";
    fe.handle_command(Command::ChildExited { node_id: 2, detail: detail.into() }, now).unwrap();
    let failed = events(&mut fe).into_iter().find_map(|e| match e {
        Event::StartupFailed { message } => Some(message),
        _ => None,
    });
    assert_eq!(
        failed.unwrap(),
        format!(
            "back-end rank 1 on h (node 2) failed during start-up: node 0: link to back-end rank 1 on h \
             (node 2) closed; the process {detail}"
        )
    );
}

/// A front-end and one back-end child with distorted clocks, frames between them
/// delayed `delay(k)` for the k-th frame, in virtual time from `t0`. Runs until the
/// front-end has `rounds` rounds of the child's clock or `until` passes.
fn clock_pair(
    child_clock: ClockSource,
    t0: Instant,
    until: Instant,
    delay: &mut dyn FnMut(u64) -> Duration,
    rounds: u32,
) -> (Node, Node, Vec<treecast_wire::ClockSample>) {
    clock_pair_held(child_clock, t0, until, delay, rounds, Duration::ZERO)
}

/// [`clock_pair`] where the child writes each answer `hold` after it read the probe,
/// and every probe and answer is stamped at its write, as a route does.
fn clock_pair_held(
    child_clock: ClockSource,
    t0: Instant,
    until: Instant,
    delay: &mut dyn FnMut(u64) -> Duration,
    rounds: u32,
    hold: Duration,
) -> (Node, Node, Vec<treecast_wire::ClockSample>) {
    let mut fe = node(Role::FrontEnd, 0);
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let config = ClockConfig::default();
    fe.set_clock(ClockSource::new(t0, 1_000_000_000_000), config);
    be.set_clock(child_clock, config);
    let mut p = plan("h:0 => h:1 ;", 0, false);
    p.total_backends = 1;
    fe.handle_command(Command::Launch(Box::new(p)), t0).unwrap();
    let link = ids(1)[0];
    fe.handle_link_up(link, Peer::Child { node_id: 1 }, t0);
    be.handle_link_up(link, Peer::Parent, t0);
    // The member plan reaches the back-end at once; the Join it answers with stays
    // queued and goes on the wire in the loop, after the one put there below.
    for t in transmits(&mut fe) {
        be.handle_frame(link, t.frame, t0);
    }
    // Frames in flight: (arrival, to the front-end?, frame).
    let mut wire: Vec<(Instant, bool, Frame)> = Vec::new();
    let join = control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 0 });
    wire.push((t0, true, join));
    let mut samples = Vec::new();
    let mut k = 0u64;
    loop {
        let next_timer = fe.poll_timeout();
        let next_frame = wire.iter().map(|(at, _, _)| *at).min();
        let Some(now) = [next_timer, next_frame].into_iter().flatten().min() else { break };
        if now > until {
            break;
        }
        if next_frame == Some(now) {
            let i = wire.iter().position(|(at, _, _)| *at == now).unwrap();
            let (_, to_fe, frame) = wire.remove(i);
            if to_fe {
                fe.handle_frame(link, frame, now);
            } else {
                be.handle_frame(link, frame, now);
            }
        } else {
            fe.handle_timeout(now);
        }
        for (from_fe, n) in [(true, &mut fe), (false, &mut be)] {
            let write_at = if from_fe { now } else { now + hold };
            let clock = n.clock_source();
            while let Some(mut t) = n.poll_transmit() {
                if t.frame.header.kind == FrameKind::Control {
                    if let Some(c) = clock.filter(|_| t.frame.header.flags & treecast_wire::FLAG_TIMED != 0) {
                        t.frame.header.timestamp_ns = c.read(write_at) as u64;
                        t.frame.header.flags |= treecast_wire::FLAG_STAMPED;
                    }
                    k += 1;
                    wire.push((write_at + delay(k), !from_fe, t.frame));
                }
            }
        }
        samples = fe.clock_samples().map(|(s, _)| *s).collect();
        if fe.clock_samples().any(|(_, r)| r >= rounds) {
            break;
        }
    }
    // What the front-end sent last (the offset it measured) reaches the back-end.
    wire.sort_by_key(|(at, _, _)| *at);
    for (at, _, frame) in wire.into_iter().filter(|(_, to_fe, _)| !to_fe) {
        be.handle_frame(link, frame, at);
    }
    (fe, be, samples)
}

#[test]
fn the_clock_of_a_child_is_recovered_within_the_bound_and_its_drift_interpolates() {
    let t0 = Instant::now();
    let base = 1_000_000_000_000i64;
    let mut child = ClockSource::new(t0, base);
    child.distortion = Distortion { offset_ns: -734_250_000, drift_ppb: 87_000, epoch_ns: base };
    let truth = |t: Instant| child.read(t) - ClockSource::new(t0, base).read(t);
    // Nearly symmetric links: 5 µs each way, give or take 100 ns.
    let mut rng = 7u64;
    let mut delay = |_k: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        Duration::from_nanos(4_900 + (rng >> 33) % 200)
    };
    // One round: the offset right after it.
    let (fe, _, samples) = clock_pair(child, t0, t0 + Duration::from_secs(1), &mut delay, 1);
    let s = samples[0];
    let measured_at = t0 + Duration::from_nanos((s.measured_ns - base) as u64);
    let error = (s.offset_ns - truth(measured_at)).abs();
    assert!(error <= s.error_ns as i64, "error {error} ns past the bound {} ns", s.error_ns);
    assert!(error <= 200, "right after a sync: {error} ns");
    assert!((9_800..=10_200).contains(&s.rtt_ns), "{s:?}");
    assert!(fe.clock_now(t0).is_some());
    // Three rounds: at once, after `drift_after`, after `resync`; then ten minutes on.
    let config = ClockConfig::default();
    let end = t0 + config.drift_after + config.resync + Duration::from_secs(1);
    let (_, _, samples) = clock_pair(child, t0, end, &mut delay, 3);
    let s = samples[0];
    assert!((s.drift_ppb - 87_000).abs() <= 10, "drift {} ppb", s.drift_ppb);
    let later = t0 + config.drift_after + config.resync + Duration::from_secs(600);
    let later_ns = ClockSource::new(t0, base).read(later);
    let predicted =
        s.offset_ns + (i128::from(later_ns - s.measured_ns) * i128::from(s.drift_ppb) / 1_000_000_000) as i64;
    let error = (predicted - truth(later)).abs();
    assert!(error <= 5_000, "ten minutes after the last sync: {error} ns");
    let bound = s.error_ns + (later_ns - s.measured_ns) as u64 * s.drift_error_ppb / 1_000_000_000;
    assert!(error as u64 <= bound, "error {error} ns past the aged bound {bound} ns");
}

#[test]
fn the_time_a_child_takes_to_answer_is_no_part_of_the_round_trip() {
    let t0 = Instant::now();
    let base = 1_000_000_000_000i64;
    let mut child = ClockSource::new(t0, base);
    child.distortion = Distortion { offset_ns: 312_000_000, drift_ppb: 0, epoch_ns: base };
    let mut delay = |_: u64| Duration::from_micros(5);
    // Each answer leaves a millisecond after its probe was read: the stamps taken at
    // the writes and the reads leave that millisecond out.
    let hold = Duration::from_millis(1);
    let (_, _, samples) = clock_pair_held(child, t0, t0 + Duration::from_secs(1), &mut delay, 1, hold);
    let s = samples[0];
    assert_eq!((s.offset_ns, s.rtt_ns), (312_000_000, 10_000), "{s:?}");
    assert!(s.error_ns <= 5_000, "{s:?}");
}

#[test]
fn both_ends_of_a_measured_link_learn_the_other_ends_clock_for_the_route() {
    let t0 = Instant::now();
    let base = 1_000_000_000_000i64;
    let mut child = ClockSource::new(t0, base);
    child.distortion = Distortion { offset_ns: 2_000_000_000, drift_ppb: 0, epoch_ns: base };
    let mut delay = |_: u64| Duration::from_micros(5);
    let (mut fe, mut be, samples) = clock_pair(child, t0, t0 + Duration::from_secs(1), &mut delay, 1);
    let s = samples[0];
    let link_clocks = |n: &mut Node| -> Vec<treecast_monitor::clock::PeerClock> {
        std::iter::from_fn(|| n.poll_event())
            .filter_map(|e| match e {
                Event::LinkClock { clock, .. } => Some(clock),
                _ => None,
            })
            .collect()
    };
    // The parent's route: the child's clock minus its own, as measured.
    let at_parent = link_clocks(&mut fe);
    assert_eq!(at_parent.len(), 1);
    assert_eq!((at_parent[0].offset_ns, at_parent[0].at_ns), (s.offset_ns, s.measured_ns));
    assert_eq!(s.offset_ns, 2_000_000_000, "symmetric links: exact");
    // The child's route: the parent's clock minus its own, on its own clock.
    let at_child = link_clocks(&mut be);
    assert_eq!(at_child.len(), 1);
    assert_eq!(at_child[0].offset_ns, -2_000_000_000);
    assert_eq!(at_child[0].at_ns, s.measured_ns + 2_000_000_000);
}

#[test]
fn an_asymmetric_link_is_off_by_at_most_half_its_round_trip() {
    let t0 = Instant::now();
    let child = ClockSource::new(t0, 1_000_000_000_000);
    // Frames alternate 50 µs and 2 µs; the Join goes first, so probes take 2 µs down
    // and answers 50 µs up: the estimate is off by half the asymmetry, within the bound.
    let mut k = 0;
    let mut delay = |_: u64| {
        k += 1;
        Duration::from_micros(if k % 2 == 1 { 50 } else { 2 })
    };
    let (_, _, samples) = clock_pair(child, t0, t0 + Duration::from_secs(1), &mut delay, 1);
    let s = samples[0];
    assert!(s.offset_ns.unsigned_abs() <= s.error_ns, "{s:?}");
    assert_eq!((s.offset_ns, s.error_ns), (-24_000, 26_000), "half the asymmetry, half the round trip");
}

#[test]
fn a_backend_that_loses_its_parent_rejoins_at_its_fallback_and_says_what_it_brings_back() {
    let t0 = Instant::now();
    let l = ids(2);
    let mut be = placed_backend(member(7, 3, 4, 10_000), l[0], t0);
    be.handle_frame(l[0], control(&fallback("unix:@gp", &[])), t0);
    transmits(&mut be);
    events(&mut be);
    be.handle_link_closed(l[0], None, t0);
    let within = be.rejoin_limit().unwrap();
    assert_eq!(events(&mut be), vec![Event::Rejoin { address: "unix:@gp".into(), within }]);
    assert!(be.is_rejoining());
    be.handle_link_up(l[1], Peer::Parent, t0);
    let sent = transmits(&mut be);
    let rejoin = ControlMsg::decode(&sent[0].frame.payload).unwrap();
    assert!(
        matches!(rejoin, ControlMsg::Rejoin { ref ranks, commnodes: 0, .. } if *ranks == RankSet::single(3))
    );
    be.handle_frame(l[1], control(&fallback("", &[])), t0);
    assert!(!be.is_rejoining());
    assert!(events(&mut be).contains(&Event::ParentChanged { parent: "unix:@gp".into() }));
    // With no new parent in time, it ends.
    be.handle_link_closed(l[1], None, t0);
    assert!(be.is_over(), "no fallback: nowhere to rejoin");
}

/// A parent's `Fallback`: `address`, then the ancestors above it.
fn fallback(address: &str, further: &[&str]) -> ControlMsg {
    ControlMsg::Fallback { address: address.into(), further: further.iter().map(|a| a.to_string()).collect() }
}

#[test]
fn an_orphan_whose_fallback_does_not_answer_tries_the_ancestors_above_it_in_turn() {
    // Its grandparent stopped (or was lost) too: the connection to it never ends,
    // and the time left is shared so that the ancestors above still get their turn.
    let t0 = Instant::now();
    let l = ids(2);
    let mut be = placed_backend(member(7, 3, 4, 10_000), l[0], t0);
    be.handle_frame(l[0], control(&fallback("unix:@gp", &["unix:@ggp", "unix:@fe"])), t0);
    transmits(&mut be);
    events(&mut be);
    be.handle_link_closed(l[0], None, t0);
    let limit = be.rejoin_limit().unwrap();
    assert_eq!(events(&mut be), vec![Event::Rejoin { address: "unix:@gp".into(), within: limit / 3 }]);
    let t1 = t0 + limit / 3;
    be.handle_command(Command::RejoinFailed { reason: "no answer".into() }, t1).unwrap();
    let within = (limit - limit / 3) / 2;
    assert_eq!(events(&mut be), vec![Event::Rejoin { address: "unix:@ggp".into(), within }]);
    assert!(be.is_rejoining() && !be.is_over());
    be.handle_link_up(l[1], Peer::Parent, t1);
    transmits(&mut be);
    be.handle_frame(l[1], control(&fallback("unix:@fe", &[])), t1);
    assert!(events(&mut be).contains(&Event::ParentChanged { parent: "unix:@ggp".into() }));
    // Where it rejoined is where its children would go now; its own fallbacks are
    // the new parent's.
    be.handle_link_closed(l[1], None, t1);
    assert_eq!(events(&mut be), vec![Event::Rejoin { address: "unix:@fe".into(), within: limit }]);
    // Every fallback tried in vain: a new round begins after a pause (a fallback that
    // refused may not have noticed the loss yet), until the limit.
    be.handle_command(Command::RejoinFailed { reason: "connection refused".into() }, t1).unwrap();
    assert!(be.is_rejoining() && events(&mut be).is_empty());
    let t2 = t1 + Duration::from_millis(200);
    assert!(be.poll_timeout().is_some_and(|d| d <= t2), "{:?}", be.poll_timeout());
    be.handle_timeout(t2);
    let within = t1 + limit - t2;
    assert_eq!(events(&mut be), vec![Event::Rejoin { address: "unix:@fe".into(), within }]);
    be.handle_command(Command::RejoinFailed { reason: "connection refused".into() }, t1 + limit).unwrap();
    assert!(be.is_over(), "past the limit it ends");
}

#[test]
fn an_orphan_gives_up_at_its_rejoin_limit_even_with_ancestors_left_to_try() {
    let t0 = Instant::now();
    let l = ids(1);
    let mut be = placed_backend(member(7, 3, 4, 10_000), l[0], t0);
    be.handle_frame(l[0], control(&fallback("unix:@gp", &["unix:@ggp"])), t0);
    transmits(&mut be);
    be.handle_link_closed(l[0], None, t0);
    let limit = be.rejoin_limit().unwrap();
    be.handle_command(Command::RejoinFailed { reason: "late".into() }, t0 + limit).unwrap();
    assert!(be.is_over(), "past the limit, no further ancestor is tried");
}

/// A front-end over two joined back-ends (nodes 1 and 2), on links `l[0]`, `l[1]`.
fn front_end_over_two(t0: Instant) -> (Node, Vec<LinkId>) {
    let mut fe = node(Role::FrontEnd, 0);
    let mut p = plan("h:0 => h:1 h:2 ;", 0, false);
    p.total_backends = 2;
    fe.handle_command(Command::Launch(Box::new(p)), t0).unwrap();
    let l = ids(2);
    for (i, &link) in l.iter().enumerate() {
        fe.handle_link_up(link, Peer::Child { node_id: i as u32 + 1 }, t0);
        let join = ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 };
        fe.handle_frame(link, control(&join), t0);
    }
    transmits(&mut fe);
    events(&mut fe);
    (fe, l)
}

fn monitor_msgs(n: &mut Node) -> Vec<ControlMsg> {
    transmits(n)
        .into_iter()
        .filter_map(|t| ControlMsg::decode(&t.frame.payload).ok())
        .filter(|m| matches!(m, ControlMsg::MonitorCollect { .. } | ControlMsg::MonitorStart { .. }))
        .collect()
}

#[test]
fn a_collection_ends_without_a_lost_or_silent_child_and_names_it() {
    use treecast_monitor::{Collection, Report};
    let t0 = Instant::now();
    let (mut fe, l) = front_end_over_two(t0);
    let limit = Duration::from_secs(4);
    fe.handle_command(
        Command::MonitorCollect { id: 1, mode: treecast_wire::CollectMode::PerNode, limit },
        t0,
    )
    .unwrap();
    // Each child gets three quarters of the limit, so its answer comes in time.
    let asked = monitor_msgs(&mut fe);
    assert_eq!(
        asked,
        vec![
            ControlMsg::MonitorCollect { id: 1, mode: treecast_wire::CollectMode::PerNode, limit_ms: 3000 };
            2
        ]
    );
    assert!(events(&mut fe).iter().any(|e| matches!(e, Event::MonitorCollectLocal { id: 1 })));
    fe.handle_command(Command::MonitorLocal { id: 1, report: Report::default() }, t0).unwrap();
    let answer = ControlMsg::MonitorReport { id: 1, json: Collection::of(1, Report::default()).to_json() };
    fe.handle_frame(l[0], control(&answer), t0);
    assert_eq!(fe.take_monitor_collection(1), None, "node 2 has not answered");
    fe.handle_link_closed(l[1], Some("gone".into()), t0);
    assert!(events(&mut fe).iter().any(|e| matches!(e, Event::MonitorCollected { id: 1 })));
    let c = fe.take_monitor_collection(1).unwrap();
    assert_eq!(c.reports.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(c.missing, ["back-end rank 1 on h (node 2): lost before it answered, with any node below it"]);

    // A child that stays silent is named when the limit passes; a late answer is dropped.
    fe.handle_command(Command::MonitorCollect { id: 2, mode: treecast_wire::CollectMode::Merged, limit }, t0)
        .unwrap();
    fe.handle_command(Command::MonitorLocal { id: 2, report: Report::default() }, t0).unwrap();
    assert!(fe.poll_timeout().is_some_and(|t| t <= t0 + limit), "a timer is set for the limit");
    fe.handle_timeout(t0 + limit);
    let c = fe.take_monitor_collection(2).unwrap();
    assert_eq!(c.reports.keys().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(c.missing, ["back-end rank 0 on h (node 1): no report within 3.0 s"]);
    let late = ControlMsg::MonitorReport { id: 2, json: Collection::default().to_json() };
    fe.handle_frame(l[0], control(&late), t0 + limit);
    assert_eq!(fe.take_monitor_collection(2), None);
}

#[test]
fn only_the_front_end_orders_monitoring_and_orders_reach_every_joined_child() {
    let t0 = Instant::now();
    let (mut fe, _) = front_end_over_two(t0);
    fe.handle_command(Command::MonitorStart { program: 7 }, t0).unwrap();
    assert_eq!(monitor_msgs(&mut fe), vec![ControlMsg::MonitorStart { program: 7 }; 2]);
    assert!(events(&mut fe).contains(&Event::MonitorStart { program: 7 }));
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    let err = be.handle_command(Command::MonitorStop, t0).unwrap_err();
    assert!(err.to_string().contains("ordered by the front-end"), "{err}");
}

#[test]
fn a_child_answer_that_is_not_a_report_is_named_and_the_rest_is_kept() {
    use treecast_monitor::{Collection, Report};
    let t0 = Instant::now();
    let (mut fe, l) = front_end_over_two(t0);
    let mode = treecast_wire::CollectMode::PerNode;
    fe.handle_command(Command::MonitorCollect { id: 1, mode, limit: Duration::from_secs(4) }, t0).unwrap();
    fe.handle_command(Command::MonitorLocal { id: 1, report: Report::default() }, t0).unwrap();
    let good = ControlMsg::MonitorReport { id: 1, json: Collection::of(1, Report::default()).to_json() };
    fe.handle_frame(l[0], control(&good), t0);
    fe.handle_frame(l[1], control(&ControlMsg::MonitorReport { id: 1, json: "{\"reports\": 7".into() }), t0);
    let c = fe.take_monitor_collection(1).unwrap();
    assert_eq!(c.reports.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(c.missing.len(), 1);
    assert!(
        c.missing[0]
            .starts_with("back-end rank 1 on h (node 2): its report was refused: not a monitor report"),
        "{:?}",
        c.missing
    );
}

/// With a multicasting route, a frame for both children waits until the one out of
/// credit gets some, then goes to both in one send; without, the open child gets it
/// at once and the other later, on its own.
#[test]
fn a_multicasting_node_sends_a_frame_for_the_whole_group_once_every_child_can_take_it() {
    let now = Instant::now();
    let targets = |t: &[Transmit]| -> Vec<Vec<LinkId>> {
        t.iter().filter(|t| t.frame.header.kind == FrameKind::Data).map(|t| t.to.links().to_vec()).collect()
    };
    for together in [true, false] {
        let (mut fe, links) = front_end_with_two_backends();
        fe.send_together(together.then_some(0));
        fe.handle_command(Command::NewStream(spec(1, Window { packets: 2, bytes: 1000 })), now).unwrap();
        transmits(&mut fe);
        // Four frames fill both children's windows of four packets.
        for v in 0..4 {
            fe.handle_command(Command::Send(int(1, 0, v)), now).unwrap();
        }
        assert_eq!(targets(&transmits(&mut fe)), vec![links.clone(); 4]);
        fe.handle_frame(links[0], Frame::credit(1, Grant { packets: 4, bytes: 1000 }), now);
        fe.handle_command(Command::Send(int(1, 0, 4)), now).unwrap();
        let first = targets(&transmits(&mut fe));
        fe.handle_frame(links[1], Frame::credit(1, Grant { packets: 4, bytes: 1000 }), now);
        let second = targets(&transmits(&mut fe));
        if together {
            assert!(first.is_empty(), "child 1 has no credit yet: {first:?}");
            assert_eq!(second, vec![links.clone()], "then one send to both");
        } else {
            assert_eq!((first, second), (vec![vec![links[0]]], vec![vec![links[1]]]));
        }
    }
}

fn peer(to: u32, from: u32, bytes: usize) -> Frame {
    Frame::new(FrameHeader::peer(to, 7, from), vec![0xab; bytes])
}

fn peer_ack(to: u32, from: u32, messages: u32, bytes: u64) -> Frame {
    let mut h = FrameHeader::peer(to, 0, from);
    h.flags = treecast_wire::FLAG_PEER_ACK;
    Frame::new(h, treecast_wire::encode_ack(messages, bytes))
}

fn is_ack(f: &Frame) -> bool {
    f.header.kind == treecast_wire::FrameKind::Peer && f.header.flags & treecast_wire::FLAG_PEER_ACK != 0
}

#[test]
fn a_peer_message_turns_at_the_common_ancestor_and_one_for_nobody_is_acknowledged_for_it() {
    let now = Instant::now();
    let (mut fe, links) = front_end_with_two_backends();
    // Rank 0 to rank 1: down the other child's link, untouched.
    fe.handle_frame(links[0], peer(1, 0, 10), now);
    let out = transmits(&mut fe);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to, Destination::Link(links[1]));
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (1, 0));
    // Rank 1's acknowledgement finds its way back to rank 0.
    fe.handle_frame(links[1], peer_ack(0, 1, 1, 10), now);
    assert_eq!(transmits(&mut fe)[0].to, Destination::Link(links[0]));
    // Rank 0 to rank 9, which is nowhere: dropped, acknowledged back, reported.
    fe.handle_frame(links[0], peer(9, 0, 10), now);
    let out = transmits(&mut fe);
    assert_eq!(out.len(), 1);
    assert!(is_ack(&out[0].frame) && out[0].to == Destination::Link(links[0]));
    assert!(events(&mut fe).contains(&Event::PeerUndeliverable { from: 0, to: RankSet::single(9) }));
    // For several ranks: a copy for each link naming only its own, the rest acknowledged.
    let mut targets = RankSet::single(0);
    targets.union_with(&RankSet::single(7));
    let mut multi =
        Frame::new(FrameHeader::peer(u32::MAX, 7, 1), treecast_wire::encode_multi(&targets, b"hello"));
    multi.header.flags = treecast_wire::FLAG_PEER_MULTI;
    fe.handle_frame(links[1], multi, now);
    let out = transmits(&mut fe);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].to, Destination::Link(links[0]));
    let (to, at) = treecast_wire::decode_multi(&out[0].frame.payload).unwrap();
    assert_eq!((to, &out[0].frame.payload[at..]), (RankSet::single(0), &b"hello"[..]));
    assert!(is_ack(&out[1].frame) && out[1].to == Destination::Link(links[1]));
    assert_eq!(treecast_wire::decode_ack(&out[1].frame.payload).unwrap(), (1, 5));
}

#[test]
fn a_backend_holds_at_most_its_peer_window_of_unread_messages_and_acknowledges_what_it_reads() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 0, size: 2 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    transmits(&mut be);
    for _ in 0..PEER_WINDOW.packets {
        be.handle_command(Command::Send(peer(1, 0, 1)), now).unwrap();
    }
    let blocked = be.handle_command(Command::Send(peer(1, 0, 1)), now);
    let Err(CommandError::Blocked(frame)) = blocked else { panic!("{blocked:?}") };
    be.handle_frame(parent, peer_ack(0, 1, 1, 1), now);
    assert!(events(&mut be).contains(&Event::Writable { stream: PEER_CREDIT }));
    be.handle_command(Command::Send(frame), now).unwrap();
    transmits(&mut be);
    // A message for this rank is delivered, and acknowledged to its sender once read.
    be.handle_frame(parent, peer(0, 1, 5), now);
    assert!(transmits(&mut be).is_empty(), "not acknowledged before the tool reads it");
    let Some(Delivery::Packet(m)) = be.poll_delivery(None) else { panic!("no delivery") };
    assert_eq!((m.header.rank, m.payload.len()), (1, 5));
    let out = transmits(&mut be);
    assert!(is_ack(&out[0].frame));
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (1, 0));
    // One for another rank breaks the protocol: the link goes.
    be.handle_frame(parent, peer(5, 1, 5), now);
    assert!(events(&mut be).iter().any(|e| matches!(e, Event::CloseLink { .. })));
}

#[test]
fn messages_a_backend_never_read_are_acknowledged_for_it_when_it_goes() {
    let now = Instant::now();
    let (mut fe, links) = front_end_with_two_backends();
    fe.handle_frame(links[0], peer(1, 0, 10), now);
    fe.handle_frame(links[0], peer(1, 0, 20), now);
    fe.handle_frame(links[1], peer_ack(0, 1, 1, 10), now);
    transmits(&mut fe);
    // Rank 1 goes with the second message unread: rank 0 gets its window back.
    fe.handle_link_closed(links[1], Some("gone".into()), now);
    let acks: Vec<Frame> = transmits(&mut fe).into_iter().map(|t| t.frame).filter(is_ack).collect();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!((acks[0].header.stream, acks[0].header.rank), (0, 1));
    assert_eq!(treecast_wire::decode_ack(&acks[0].payload).unwrap(), (1, 20));
}

#[test]
fn a_message_for_several_ranks_counts_once_per_receiver_and_never_reaches_its_sender() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 2, size: 80 }, 3);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    transmits(&mut be);
    let multi = |targets: &RankSet| {
        let mut f =
            Frame::new(FrameHeader::peer(u32::MAX, 1, 2), treecast_wire::encode_multi(targets, b"xy"));
        f.header.flags = treecast_wire::FLAG_PEER_MULTI;
        f
    };
    // Only to itself: nothing goes.
    be.handle_command(Command::Send(multi(&RankSet::single(2))), now).unwrap();
    assert!(transmits(&mut be).is_empty());
    // To 64 others and itself: one frame, naming the 64, which fill the window.
    be.handle_command(Command::Send(multi(&RankSet::range(0, 65))), now).unwrap();
    let out = transmits(&mut be);
    let (to, at) = treecast_wire::decode_multi(&out[0].frame.payload).unwrap();
    assert_eq!(to.len(), 64);
    assert!(!to.contains(2));
    assert_eq!(&out[0].frame.payload[at..], b"xy");
    let blocked = be.handle_command(Command::Send(peer(5, 2, 1)), now);
    assert!(matches!(blocked, Err(CommandError::Blocked(_))), "{blocked:?}");
}

#[test]
fn messages_a_backend_leaving_in_order_never_read_are_acknowledged_for_it() {
    let now = Instant::now();
    let (mut fe, links) = front_end_with_two_backends();
    fe.handle_frame(links[0], peer(1, 0, 10), now);
    transmits(&mut fe);
    let leave = ControlMsg::Leave { ranks: RankSet::single(1), reason: "rank 1 left".into(), graceful: true };
    fe.handle_frame(links[1], control(&leave), now);
    let acks: Vec<Frame> = transmits(&mut fe).into_iter().map(|t| t.frame).filter(is_ack).collect();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!((acks[0].header.stream, acks[0].header.rank), (0, 1));
    assert_eq!(treecast_wire::decode_ack(&acks[0].payload).unwrap(), (1, 10));
}

#[test]
fn a_backend_rejoining_holds_its_messages_instead_of_failing_them() {
    let now = Instant::now();
    let parent = ids(1)[0];
    let mut be = placed_backend(member(1, 0, 2, 10_000), parent, now);
    be.handle_frame(parent, control(&fallback("unix:@gp", &[])), now);
    transmits(&mut be);
    be.handle_link_closed(parent, Some("the comm node died".into()), now);
    let held = be.handle_command(Command::Send(peer(1, 0, 3)), now);
    assert!(matches!(held, Err(CommandError::Blocked(_))), "{held:?}");
}

#[test]
fn a_message_claiming_a_sender_outside_the_link_it_came_on_closes_that_link() {
    let now = Instant::now();
    let (mut fe, links) = front_end_with_two_backends();
    // Rank 0's link carries a message "from rank 1".
    fe.handle_frame(links[0], peer(1, 1, 10), now);
    assert!(transmits(&mut fe).iter().all(|t| t.to != Destination::Link(links[1])), "it went on");
    assert!(events(&mut fe).iter().any(|e| matches!(e, Event::CloseLink { link, .. } if *link == links[0])));
}

/// A front-end, its back-end children's links, and its link to the other network.
type LinkedFrontEnd = (Node, Vec<LinkId>, LinkId);

/// Two front-ends, each with back-ends 0 and 1, linked as remote networks: `a`
/// numbers `b`'s ranks as its remote 0, `b` numbers `a`'s as its remote 3.
fn linked_front_ends() -> (LinkedFrontEnd, LinkedFrontEnd) {
    let now = Instant::now();
    let (mut a, a_links) = front_end_with_two_backends();
    let (mut b, b_links) = front_end_with_two_backends();
    let bridge = ids(3)[2];
    a.handle_link_up(
        bridge,
        Peer::Remote(RemoteSpec { index: 0, size: 2, their_index: 3, own_size: 2 }),
        now,
    );
    b.handle_link_up(
        bridge,
        Peer::Remote(RemoteSpec { index: 3, size: 2, their_index: 0, own_size: 2 }),
        now,
    );
    ((a, a_links, bridge), (b, b_links, bridge))
}

#[test]
fn a_message_crosses_to_another_network_in_its_numbering_and_its_acknowledgement_comes_back() {
    let now = Instant::now();
    let ((mut a, a_links, a_bridge), (mut b, b_links, b_bridge)) = linked_front_ends();
    let (in_a, in_b) = (remote_base(0), remote_base(3));
    // a's rank 0 to b's rank 1, which a numbers in_a + 1.
    a.handle_frame(a_links[0], peer(in_a + 1, 0, 10), now);
    let out = transmits(&mut a);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].to, Destination::Link(a_bridge));
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (1, in_b));
    b.handle_frame(b_bridge, out[0].frame.clone(), now);
    let out = transmits(&mut b);
    assert_eq!(out[0].to, Destination::Link(b_links[1]));
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (1, in_b));
    // b's rank 1 read it: the acknowledgement goes back to a's rank 0.
    b.handle_frame(b_links[1], peer_ack(in_b, 1, 1, 10), now);
    let out = transmits(&mut b);
    assert_eq!(out[0].to, Destination::Link(b_bridge));
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (0, in_a + 1));
    a.handle_frame(a_bridge, out[0].frame.clone(), now);
    let out = transmits(&mut a);
    assert!(is_ack(&out[0].frame) && out[0].to == Destination::Link(a_links[0]), "{out:?}");
    // Answered: closing the link now acknowledges nothing more.
    a.handle_command(Command::CloseRemote { index: 0 }, now).unwrap();
    assert!(transmits(&mut a).is_empty());
    assert!(a.handle_command(Command::CloseRemote { index: 0 }, now).is_err(), "closed already");
    let evs = events(&mut a);
    assert!(evs.iter().any(|e| matches!(e, Event::CloseLink { link, .. } if *link == a_bridge)), "{evs:?}");
    assert!(evs.iter().any(|e| matches!(e, Event::RemoteClosed { index: 0, .. })), "{evs:?}");
}

#[test]
fn what_crossed_unanswered_is_acknowledged_when_the_link_between_networks_closes() {
    let now = Instant::now();
    let ((mut a, a_links, a_bridge), _) = linked_front_ends();
    a.handle_frame(a_links[0], peer(remote_base(0), 0, 10), now);
    a.handle_frame(a_links[1], peer(remote_base(0) + 1, 1, 3), now);
    assert_eq!(transmits(&mut a).len(), 2);
    a.handle_link_closed(a_bridge, Some("reset".into()), now);
    let out = transmits(&mut a);
    let acked: Vec<(LinkId, u32, (u32, u64))> = out
        .iter()
        .map(|t| {
            assert!(is_ack(&t.frame));
            (t.to.links()[0], t.frame.header.stream, treecast_wire::decode_ack(&t.frame.payload).unwrap())
        })
        .collect();
    assert_eq!(acked, vec![(a_links[0], 0, (1, 10)), (a_links[1], 1, (1, 3))]);
    // From now on b's ranks are nowhere.
    a.handle_frame(a_links[0], peer(remote_base(0), 0, 1), now);
    assert!(is_ack(&transmits(&mut a)[0].frame));
    let evs = events(&mut a);
    assert!(evs.iter().any(|e| matches!(e, Event::RemoteClosed { index: 0, reason } if reason == "reset")));
    assert!(evs.iter().any(|e| matches!(e, Event::PeerUndeliverable { .. })), "{evs:?}");
}

#[test]
fn a_message_for_several_ranks_is_split_between_the_networks() {
    let now = Instant::now();
    let ((mut a, a_links, a_bridge), _) = linked_front_ends();
    let mut targets = RankSet::range(remote_base(0), 2);
    targets.insert(1);
    let mut multi =
        Frame::new(FrameHeader::peer(u32::MAX, 7, 0), treecast_wire::encode_multi(&targets, b"hi"));
    multi.header.flags = treecast_wire::FLAG_PEER_MULTI;
    a.handle_frame(a_links[0], multi, now);
    let out = transmits(&mut a);
    assert_eq!(out.len(), 2, "{out:?}");
    let to = |t: &Transmit| treecast_wire::decode_multi(&t.frame.payload).unwrap().0;
    assert_eq!((out[0].to.clone(), to(&out[0])), (Destination::Link(a_links[1]), RankSet::single(1)));
    assert_eq!((out[1].to.clone(), to(&out[1])), (Destination::Link(a_bridge), RankSet::range(0, 2)));
    assert_eq!(out[1].frame.header.rank, remote_base(3));
    // Closing the link answers both destinations over there.
    a.handle_link_closed(a_bridge, None, now);
    let acks = transmits(&mut a);
    assert_eq!(acks.len(), 2);
    assert!(acks.iter().all(|t| is_ack(&t.frame) && t.to == Destination::Link(a_links[0])));
}

#[test]
fn a_front_end_refuses_from_another_network_what_is_not_its_message() {
    let now = Instant::now();
    let closed = |n: &mut Node| events(n).iter().any(|e| matches!(e, Event::CloseLink { .. }));
    // A sender the other network does not have.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    b.handle_frame(bridge, peer(0, remote_base(3) + 2, 1), now);
    assert!(closed(&mut b));
    // A stream's data.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    b.handle_frame(bridge, int(1, remote_base(3), 5), now);
    assert!(closed(&mut b));
    // A collective's contribution.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    let mut coll = peer(0, remote_base(3), 1);
    coll.header.flags = treecast_wire::FLAG_PEER_COLL;
    b.handle_frame(bridge, coll, now);
    assert!(closed(&mut b));
    // An acknowledgement that is also a message for several ranks.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    let mut both = Frame::new(
        FrameHeader::peer(1, 0, remote_base(3)),
        treecast_wire::encode_multi(&RankSet::single(0), &[]),
    );
    both.header.flags = treecast_wire::FLAG_PEER_ACK | treecast_wire::FLAG_PEER_MULTI;
    b.handle_frame(bridge, both, now);
    assert!(closed(&mut b));
    // A sender past its window.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    for _ in 0..PEER_WINDOW.packets {
        b.handle_frame(bridge, peer(0, remote_base(3), 1), now);
    }
    assert!(!closed(&mut b), "a window's worth is taken");
    b.handle_frame(bridge, peer(0, remote_base(3), 1), now);
    assert!(closed(&mut b));
    // A message on to a third network.
    let (_, (mut b, _, bridge)) = linked_front_ends();
    b.handle_frame(bridge, peer(remote_base(3) + 1, remote_base(3), 4), now);
    assert!(closed(&mut b));
    // A heartbeat is welcome; a message for a rank gone is answered for it.
    let (_, (mut b, b_links, bridge)) = linked_front_ends();
    b.handle_link_closed(b_links[1], None, now);
    events(&mut b);
    transmits(&mut b);
    b.handle_frame(bridge, heartbeat_frame(), now);
    b.handle_frame(bridge, peer(1, remote_base(3), 4), now);
    assert!(!closed(&mut b));
    let out = transmits(&mut b);
    assert_eq!(out.len(), 1);
    assert!(is_ack(&out[0].frame) && out[0].to == Destination::Link(bridge), "{out:?}");
    assert_eq!((out[0].frame.header.stream, out[0].frame.header.rank), (0, remote_base(0) + 1));
    // Only a front-end links to another network.
    let mut be = node(Role::BackEnd { rank: 0, size: 1 }, 1);
    be.handle_link_up(
        ids(1)[0],
        Peer::Remote(RemoteSpec { index: 0, size: 1, their_index: 0, own_size: 1 }),
        now,
    );
    assert!(closed(&mut be));
}

#[test]
fn a_window_given_back_to_another_network_lets_its_sender_go_on_and_stamps_do_not_matter() {
    let now = Instant::now();
    let ((mut a, a_links, a_bridge), _) = linked_front_ends();
    let closed = |n: &mut Node| events(n).iter().any(|e| matches!(e, Event::CloseLink { .. }));
    let from_b = remote_base(0);
    for _ in 0..PEER_WINDOW.packets {
        let mut m = peer(0, from_b, 1);
        // Stamped by the other front-end's route while it records: not a kind of frame.
        m.header.flags |= treecast_wire::FLAG_STAMPED;
        a.handle_frame(a_bridge, m, now);
    }
    assert!(!closed(&mut a));
    transmits(&mut a);
    // a's rank 0 read them all: the acknowledgements go back, and b's sender may go on.
    for _ in 0..PEER_WINDOW.packets {
        a.handle_frame(a_links[0], peer_ack(from_b, 0, 1, 1), now);
    }
    let acks = transmits(&mut a);
    assert_eq!(acks.len(), PEER_WINDOW.packets as usize);
    assert!(acks.iter().all(|t| is_ack(&t.frame) && t.to == Destination::Link(a_bridge)));
    a.handle_frame(a_bridge, peer(1, from_b, 1), now);
    assert!(!closed(&mut a));
}

#[test]
fn a_rank_the_other_network_was_not_told_of_cannot_send_to_it() {
    let now = Instant::now();
    let (mut a, links) = front_end_with_two_backends();
    let bridge = ids(3)[2];
    // Told of rank 0 only: rank 1 came later.
    a.handle_link_up(
        bridge,
        Peer::Remote(RemoteSpec { index: 0, size: 2, their_index: 3, own_size: 1 }),
        now,
    );
    a.handle_frame(links[1], peer(remote_base(0), 1, 4), now);
    let out = transmits(&mut a);
    assert_eq!(out.len(), 1);
    assert!(is_ack(&out[0].frame) && out[0].to == Destination::Link(links[1]), "{out:?}");
    assert!(events(&mut a).iter().any(|e| matches!(e, Event::PeerUndeliverable { from: 1, .. })));
    a.handle_frame(links[0], peer(remote_base(0), 0, 4), now);
    assert_eq!(transmits(&mut a)[0].to, Destination::Link(bridge));
}

#[test]
fn a_front_end_that_is_over_links_to_no_other_network() {
    let now = Instant::now();
    let (mut a, _) = front_end_with_two_backends();
    a.handle_command(Command::Shutdown, now).unwrap();
    events(&mut a);
    let bridge = ids(3)[2];
    a.handle_link_up(
        bridge,
        Peer::Remote(RemoteSpec { index: 0, size: 1, their_index: 0, own_size: 2 }),
        now,
    );
    let evs = events(&mut a);
    assert!(
        evs.iter().any(|e| matches!(e, Event::CloseLink { reason, .. } if reason.contains("over"))),
        "{evs:?}"
    );
}

#[test]
fn the_link_to_another_network_gets_no_heartbeats_and_is_never_cut_for_silence() {
    let now = Instant::now();
    let ((mut a, a_links, bridge), _) = linked_front_ends();
    a.set_liveness(
        Some(LivenessLimits { heartbeat: Duration::from_millis(100), dead_after: Duration::from_secs(1) }),
        now,
    );
    // A heartbeat from the other side would arm the check on a link in it.
    a.handle_frame(bridge, heartbeat_frame(), now);
    let later = now + Duration::from_secs(5);
    for link in &a_links {
        a.handle_frame(*link, heartbeat_frame(), later);
    }
    a.handle_timeout(later);
    let out = transmits(&mut a);
    assert!(out.iter().all(|t| !t.to.links().contains(&bridge)), "{out:?}");
    let evs = events(&mut a);
    assert!(!evs.iter().any(|e| matches!(e, Event::CloseLink { link, .. } if *link == bridge)), "{evs:?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::RemoteClosed { .. })), "{evs:?}");
}

#[test]
fn a_comm_node_loads_the_plug_ins_its_plan_names_and_hands_them_down_one_level_deeper() {
    let now = Instant::now();
    let loaded = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = loaded.clone();
    let mut cn = node(Role::CommNode, 1);
    cn.set_plugin_loader(std::sync::Arc::new(
        move |source: PluginSource<'_>, registry: &mut FilterRegistry| {
            let PluginSource::Path(path) = source else { panic!("{source:?}") };
            seen.lock().unwrap().push(path.to_owned());
            registry.register("mine", 1..=1, |_| Ok(treecast_filters::builtin(TransformKind::Null)));
            Ok(())
        },
    ));
    let links = ids(2);
    cn.handle_link_up(links[0], Peer::Parent, now);
    let mut p = plan("h:1 => h:2 ;\nh:2 => h:3 ;", 1, false);
    p.depth = 1;
    p.filters = vec!["/opt/tool/libmine.so".into()];
    cn.handle_frame(links[0], control(&ControlMsg::Plan(Box::new(p))), now);
    assert_eq!(*loaded.lock().unwrap(), vec!["/opt/tool/libmine.so".to_owned()]);
    assert!(cn.registry().contains("mine"));
    cn.handle_link_up(links[1], Peer::Child { node_id: 2 }, now);
    let sub = transmits(&mut cn)
        .iter()
        .find_map(|t| match ControlMsg::decode(&t.frame.payload) {
            Ok(ControlMsg::Plan(p)) => Some(p),
            _ => None,
        })
        .unwrap();
    assert_eq!((sub.depth, sub.filters.clone()), (2, vec!["/opt/tool/libmine.so".to_owned()]));
}

#[test]
fn a_plug_in_a_comm_node_cannot_load_fails_its_start_up_naming_the_node_and_the_reason() {
    let now = Instant::now();
    for loader in [true, false] {
        let mut cn = node(Role::CommNode, 1);
        if loader {
            cn.set_plugin_loader(std::sync::Arc::new(|_: PluginSource<'_>, _: &mut FilterRegistry| {
                Err("built for aarch64 but this node runs on x86_64".to_owned())
            }));
        }
        let parent = ids(1)[0];
        cn.handle_link_up(parent, Peer::Parent, now);
        let mut p = plan("h:1 => h:2 ;", 1, false);
        p.filters = vec!["/opt/tool/libbad.so".into()];
        cn.handle_frame(parent, control(&ControlMsg::Plan(Box::new(p))), now);
        let message = transmits(&mut cn)
            .iter()
            .find_map(|t| match ControlMsg::decode(&t.frame.payload) {
                Ok(ControlMsg::LaunchFailed { message }) => Some(message),
                _ => None,
            })
            .unwrap();
        assert!(message.contains("node 1") && message.contains("/opt/tool/libbad.so"), "{message}");
        let why = if loader { "built for aarch64" } else { "cannot load plug-in filters" };
        assert!(message.contains(why), "{message}");
        assert!(cn.is_over());
        assert!(events(&mut cn).iter().all(|e| !matches!(e, Event::StartChildren { .. })));
    }
}

#[test]
fn filters_are_told_where_they_run() {
    let now = Instant::now();
    let place = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = place.clone();
    let mut registry = FilterRegistry::builtin();
    registry.register_placed("probe", 1..=1, move |_, at| {
        *seen.lock().unwrap() = Some(*at);
        Ok(treecast_filters::builtin(TransformKind::Null))
    });
    let mut fe = Node::new(NodeConfig {
        role: Role::FrontEnd,
        node_id: 0,
        name: "front-end".into(),
        registry,
        tool_window: Window { packets: 1000, bytes: 1 << 20 },
    });
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    for (i, l) in ids(2).into_iter().enumerate() {
        fe.handle_link_up(l, Peer::Child { node_id: i as u32 + 1 }, now);
        fe.handle_frame(
            l,
            control(&ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 }),
            now,
        );
    }
    let mut s = spec(3, Window { packets: 4, bytes: 1000 });
    s.up = FilterSpec::new("probe", 1);
    s.ranks = RankSet::single(1);
    fe.handle_command(Command::NewStream(s), now).unwrap();
    let at = place.lock().unwrap().unwrap();
    let expected = treecast_filters::FilterPlace {
        stream: 3,
        rank: 0,
        role: treecast_filters::PlaceRole::FrontEnd,
        children: 1,
        depth: 0,
        leaves: 1,
    };
    assert_eq!(at, expected);
}

#[test]
fn packets_a_filter_sends_down_reach_the_children_of_its_node() {
    /// Sums nothing: answers each wave with one packet down, tag 77.
    struct Answer(Vec<Frame>);
    impl treecast_filters::Transform for Answer {
        fn apply(
            &mut self,
            wave: Vec<Frame>,
            _ctx: &treecast_filters::FilterContext,
        ) -> Result<Vec<Frame>, treecast_filters::FilterError> {
            let mut payload = Vec::new();
            encode_values(&[Value::Int(wave.len() as i32)], &mut payload);
            self.0.push(Frame::new(FrameHeader::data(wave[0].header.stream, 77, u32::MAX), payload));
            Ok(Vec::new())
        }
        fn take_down(&mut self) -> Vec<Frame> {
            std::mem::take(&mut self.0)
        }
    }
    let now = Instant::now();
    let mut registry = FilterRegistry::builtin();
    registry.register("answer", 1..=1, |_| Ok(Box::new(Answer(Vec::new()))));
    let mut fe = Node::new(NodeConfig {
        role: Role::FrontEnd,
        node_id: 0,
        name: "front-end".into(),
        registry,
        tool_window: Window { packets: 1000, bytes: 1 << 20 },
    });
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), now).unwrap();
    let links = ids(2);
    for (i, &l) in links.iter().enumerate() {
        fe.handle_link_up(l, Peer::Child { node_id: i as u32 + 1 }, now);
        fe.handle_frame(
            l,
            control(&ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 }),
            now,
        );
    }
    let mut s = spec(4, Window { packets: 4, bytes: 1000 });
    s.up = FilterSpec::new("answer", 1);
    fe.handle_command(Command::NewStream(s), now).unwrap();
    transmits(&mut fe);
    fe.handle_frame(links[0], int(4, 0, 1), now);
    fe.handle_frame(links[1], int(4, 1, 2), now);
    let down: Vec<Transmit> =
        transmits(&mut fe).into_iter().filter(|t| t.frame.header.kind == FrameKind::Data).collect();
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!(down[0].to, Destination::Links(links.clone().into()));
    assert_eq!((down[0].frame.header.stream, down[0].frame.header.tag), (4, 77));
    assert_eq!(treecast_wire::decode_values(&down[0].frame.payload).unwrap(), vec![Value::Int(2)]);
    assert!(fe.poll_delivery(Some(4)).is_none(), "nothing went up to the tool");
}

#[test]
fn a_comm_node_loads_a_shipped_plug_in_and_passes_it_on_or_reports_why_not() {
    let now = Instant::now();
    for works in [true, false] {
        let mut cn = node(Role::CommNode, 1);
        cn.set_plugin_loader(std::sync::Arc::new(move |source: PluginSource<'_>, _: &mut FilterRegistry| {
            let PluginSource::Bytes { label, bytes, .. } = source else { panic!("{source:?}") };
            assert_eq!((label, bytes), ("libmine.so", &b"\x7fELF"[..]));
            if works {
                Ok(())
            } else {
                Err("its bytes do not have the SHA-256 the front-end sent".into())
            }
        }));
        let links = ids(2);
        cn.handle_link_up(links[0], Peer::Parent, now);
        let p = plan("h:1 => h:2 ;\nh:2 => h:3 ;", 1, false);
        cn.handle_frame(links[0], control(&ControlMsg::Plan(Box::new(p))), now);
        cn.handle_link_up(links[1], Peer::Child { node_id: 2 }, now);
        cn.handle_frame(
            links[1],
            control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 1 }),
            now,
        );
        transmits(&mut cn);
        let msg = ControlMsg::LoadFilter {
            label: "libmine.so".into(),
            sha256: [1; 32],
            bytes: b"\x7fELF".to_vec(),
        };
        cn.handle_frame(links[0], control(&msg), now);
        let sent: Vec<(LinkId, ControlMsg)> = transmits(&mut cn)
            .into_iter()
            .filter_map(|t| match (t.to, ControlMsg::decode(&t.frame.payload)) {
                (Destination::Link(l), Ok(m)) => Some((l, m)),
                _ => None,
            })
            .collect();
        if works {
            assert_eq!(sent, vec![(links[1], msg.clone())]);
        } else {
            assert_eq!(sent.len(), 1, "{sent:?}");
            let (to, ControlMsg::FilterRefused { sha256, node, reason }) = &sent[0] else {
                panic!("{sent:?}")
            };
            assert_eq!((*to, *sha256), (links[0], [1; 32]));
            assert!(node.contains("node 1"), "{node}");
            assert!(reason.contains("libmine.so") && reason.contains("SHA-256"), "{reason}");
        }
    }
}

#[test]
fn a_backend_holds_its_join_until_its_member_plan_and_takes_rank_and_limits_from_it() {
    let now = Instant::now();
    // Made with a rank and limits the plan then overrides.
    let mut be = node(Role::BackEnd { rank: 99, size: 100 }, 5);
    be.set_rejoin(None);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    assert!(transmits(&mut be).is_empty(), "no join before the plan");
    assert!(!be.is_running());
    let mut plan = member(5, 3, 8, 2_000);
    plan.group = Some(treecast_wire::GroupPlace { group: 1, rank: 0, size: 2 });
    (plan.heartbeat_ms, plan.dead_after_ms) = (250, 1_000);
    plan.clock.probes = Some(4);
    plan.zero_copy_min = 65_536;
    plan.stripe_stall_ms = 1_500;
    assert_eq!(be.zero_copy_min(), None);
    be.handle_frame(parent, control(&ControlMsg::MemberPlan(Box::new(plan.clone()))), now);
    let sent: Vec<_> =
        transmits(&mut be).iter().map(|t| ControlMsg::decode(&t.frame.payload).unwrap()).collect();
    assert_eq!(sent, vec![ControlMsg::Join { ranks: RankSet::single(3), commnodes: 0 }]);
    assert_eq!(be.role(), Role::BackEnd { rank: 3, size: 8 });
    assert!(be.is_running());
    assert_eq!(be.rejoin_limit(), Some(Duration::from_secs(2)));
    assert_eq!(be.liveness(), LivenessLimits::from_ms(250, 1_000));
    assert_eq!(be.clock.config.probes, 4);
    assert_eq!(be.zero_copy_min(), Some(65_536), "for the driver's route");
    assert_eq!(be.stripe_stall(), Some(Duration::from_millis(1_500)), "for the driver's route");
    assert!(events(&mut be).contains(&Event::Placed { rank: 3, size: 8, group: plan.group }));
}

#[test]
fn a_member_plan_of_another_version_ends_the_backend_with_the_reason() {
    let now = Instant::now();
    let mut be = node(Role::BackEnd { rank: 0, size: 0 }, 1);
    let parent = ids(1)[0];
    be.handle_link_up(parent, Peer::Parent, now);
    let mut payload = ControlMsg::MemberPlan(Box::new(member(1, 0, 1, 0))).encode();
    payload[1] = 9; // the version follows the tag byte
    be.handle_frame(parent, Frame::new(FrameHeader::control(), payload), now);
    assert!(be.is_over());
    let reason = events(&mut be).into_iter().find_map(|e| match e {
        Event::Shutdown { reason } => Some(reason.to_string()),
        _ => None,
    });
    let reason = reason.unwrap();
    assert!(reason.contains("member plan: version 9 is not supported"), "{reason}");
}

#[test]
fn a_parent_sends_each_backend_child_its_member_plan_first() {
    let now = Instant::now();
    let mut fe = node(Role::FrontEnd, 0);
    let mut p = plan("h:0 => h:1 h:2 ;", 0, false);
    (p.heartbeat_ms, p.dead_after_ms, p.rejoin_ms) = (500, 2_000, 3_000);
    p.clock.distort = "seed:1,offset_us:10".into();
    p.zero_copy_min = 1 << 20;
    p.stripe_stall_ms = 2_500;
    fe.handle_command(Command::Launch(Box::new(p)), now).unwrap();
    events(&mut fe);
    let link = ids(2)[1];
    fe.handle_link_up(link, Peer::Child { node_id: 2 }, now);
    let sent = transmits(&mut fe);
    let Ok(ControlMsg::MemberPlan(plan)) = ControlMsg::decode(&sent[0].frame.payload) else {
        panic!("{sent:?}")
    };
    assert_eq!((plan.node_id, plan.rank, plan.size, plan.group), (2, 1, 2, None));
    assert_eq!((plan.heartbeat_ms, plan.dead_after_ms, plan.rejoin_ms), (500, 2_000, 3_000));
    assert_eq!(plan.clock.distort, "seed:1,offset_us:10");
    assert_eq!(plan.zero_copy_min, 1 << 20);
    assert_eq!(plan.stripe_stall_ms, 2_500);
}

/// A running comm node with a clock, node 1 of `h:1 => h:2 ;`, whose back-end child
/// (node 2, on the second link) joined at `t0`; the first link is its parent.
fn comm_node_with_a_clock(t0: Instant) -> (Node, Vec<LinkId>) {
    let mut cn = node(Role::CommNode, 1);
    cn.set_clock(ClockSource::new(t0, 1_000_000_000_000), ClockConfig::default());
    let links = ids(2);
    cn.handle_link_up(links[0], Peer::Parent, t0);
    cn.handle_frame(links[0], control(&ControlMsg::Plan(Box::new(plan("h:1 => h:2 ;", 1, false)))), t0);
    cn.handle_link_up(links[1], Peer::Child { node_id: 2 }, t0);
    cn.handle_frame(links[1], control(&ControlMsg::Join { ranks: RankSet::single(0), commnodes: 0 }), t0);
    assert!(cn.is_running());
    transmits(&mut cn);
    (cn, links)
}

/// Runs `n`'s timers up to `until`; the probes it sent on `link` meanwhile.
fn probes_until(n: &mut Node, link: LinkId, until: Instant) -> usize {
    let mut probes = 0;
    loop {
        probes += transmits(n)
            .iter()
            .filter(|t| t.to.links() == [link])
            .filter(|t| matches!(ControlMsg::decode(&t.frame.payload), Ok(ControlMsg::ClockProbe { .. })))
            .count();
        match n.poll_timeout() {
            Some(at) if at <= until => n.handle_timeout(at),
            _ => return probes,
        }
    }
}

#[test]
fn a_comm_node_probes_its_children_only_once_its_parent_probed_it() {
    // Rounds during start-up take the CPU start-up needs: at 1,000 local back-ends
    // on 2 cores, the first rounds made start-up two thirds longer. The front-end
    // begins once the whole tree is up, and each level when its own round began.
    let t0 = Instant::now();
    let config = ClockConfig::default();
    let usual = config.first_round_after * 5;
    let (mut cn, links) = comm_node_with_a_clock(t0);
    let t1 = t0 + usual + Duration::from_secs(1);
    assert_eq!(probes_until(&mut cn, links[1], t1), 0, "probed a child before its own parent probed it");
    cn.handle_frame(links[0], control(&ControlMsg::ClockProbe { seq: 0, sent_ns: 1 }), t1);
    let answered = transmits(&mut cn).iter().any(|t| {
        t.to.links() == [links[0]]
            && matches!(ControlMsg::decode(&t.frame.payload), Ok(ControlMsg::ClockReply { .. }))
    });
    assert!(answered, "the parent's probe is answered at once");
    assert_eq!(probes_until(&mut cn, links[1], t1 + usual), 1, "the child's first round starts soon after");

    // A parent that never probes (it has no clock) holds the children's rounds back
    // only so long.
    let (mut cn, links) = comm_node_with_a_clock(t0);
    let late = t0 + clock::FIRST_ROUND_UNPROBED;
    assert_eq!(probes_until(&mut cn, links[1], late - Duration::from_millis(1)), 0);
    assert_eq!(probes_until(&mut cn, links[1], late + usual), 1);
}

#[test]
fn the_front_end_spreads_its_childrens_first_rounds_once_the_tree_is_up() {
    // Due since they joined, every child's first round went at once when start-up
    // ended: on a flat tree, every back-end probed in the same instant.
    let t0 = Instant::now();
    let config = ClockConfig::default();
    let mut fe = node(Role::FrontEnd, 0);
    fe.set_clock(ClockSource::new(t0, 1_000_000_000_000), config);
    fe.handle_command(Command::Launch(Box::new(plan("h:0 => h:1 h:2 ;", 0, false))), t0).unwrap();
    let links = ids(2);
    for (i, &l) in links.iter().enumerate() {
        fe.handle_link_up(l, Peer::Child { node_id: i as u32 + 1 }, t0);
    }
    // Node 1 joins at once, node 2 three seconds later, which ends start-up.
    let up = t0 + Duration::from_secs(3);
    for (i, (&l, at)) in links.iter().zip([t0, up]).enumerate() {
        fe.handle_frame(l, control(&ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 }), at);
    }
    assert!(fe.is_running());
    // Probes sent per link (node 1's, node 2's) while the timers run up to `until`.
    let mut probes = |until: Instant| {
        let mut sent = [0, 0];
        loop {
            for t in transmits(&mut fe) {
                if matches!(ControlMsg::decode(&t.frame.payload), Ok(ControlMsg::ClockProbe { .. })) {
                    let i = links.iter().position(|l| t.to.links() == [*l]).unwrap();
                    sent[i] += 1;
                }
            }
            match fe.poll_timeout() {
                Some(at) if at <= until => fe.handle_timeout(at),
                _ => return sent,
            }
        }
    };
    // Node 2's first round starts 50 + 167.6 ms after, node 1's 50 + 183.8 ms after.
    let node_2 = up + config.first_round_after + Duration::from_micros(167_600);
    let node_1 = up + config.first_round_after + Duration::from_micros(183_800);
    assert_eq!(probes(node_2 - Duration::from_micros(100)), [0, 0]);
    assert_eq!(probes(node_1 - Duration::from_micros(100)), [0, 1]);
    assert_eq!(probes(node_1 + Duration::from_micros(100)), [1, 0]);
}
