//! Two running networks linked through their front-ends: real comm nodes and
//! back-ends of both on loopback, their back-ends exchanging messages.
//!
//! Every test checks that no process of either network is left behind, by looking
//! for its session id in the environment of every process.

use crate::common;
use crate::common::tree::{finish, launch};

use std::os::linux::net::SocketAddrExt;
use std::time::Duration;

use treecast::apps::protocol::*;
use treecast_api::{
    ApiError, AttachError, Event, Network, NetworkPort, RankSet, RemoteNetwork, Stream, StreamOptions,
    SyncMode, TransformKind, Value,
};

const LIMIT: Duration = Duration::from_secs(20);

/// A stream over every back-end whose answers come up one by one.
async fn answers(net: &Network) -> Stream {
    let opts = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
    net.new_stream(&net.broadcast_communicator(), opts).await.unwrap()
}

/// `from` (of `s`'s network) plays ping-pong with `to` (as that network numbers
/// it): `rounds` rounds of `bytes` bytes; returns how many echoes came back identical.
async fn ping(s: &mut Stream, from: u32, to: u32, bytes: u32, rounds: u32) -> u32 {
    let request = [Value::UInt(to), Value::UInt(bytes), Value::UInt(rounds)];
    s.send_to(from, TAG_PEER_PING, "%ud %ud %ud", &request).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.rank(), from);
    p.unpack("%lf %ud").unwrap()[1].as_i64().unwrap() as u32
}

/// Waits for `net`'s next event that `pick` takes.
async fn event_where(net: &mut Network, pick: impl Fn(&Event) -> bool) -> Event {
    loop {
        let e = tokio::time::timeout(LIMIT, net.next_event()).await.unwrap().unwrap();
        if pick(&e) {
            return e;
        }
        eprintln!("{e}");
    }
}

/// `net` opens a port with its file in `dir`: the file's path, and the port.
async fn open_port(net: &Network, dir: &common::TestDir) -> (std::path::PathBuf, NetworkPort) {
    let path = dir.path("network.port");
    let port = net.open_network_port(&path, None).await.unwrap();
    (path, port)
}

/// `a` opens a port in `dir`, `b` connects to it: each gets the other as a remote network.
async fn link(a: &Network, b: &Network, dir: &common::TestDir) -> (RemoteNetwork, RemoteNetwork) {
    let (path, port) = open_port(a, dir).await;
    let mode = std::fs::metadata(&path).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    let (in_a, in_b) = tokio::join!(port.accept(a, LIMIT), b.connect_network(&path, LIMIT));
    drop(port);
    assert!(!path.exists(), "the port file holds the port's secret: it goes with the port");
    (in_a.unwrap(), in_b.unwrap())
}

#[tokio::test]
async fn two_networks_see_each_others_ranks_and_their_backends_exchange_messages() {
    let mut a = launch("balanced:2x2", 4).await;
    let mut b = launch("flat", 3).await;
    let dir = common::TestDir::new("networks-link");
    let (b_in_a, a_in_b) = link(&a, &b, &dir).await;
    assert_eq!((b_in_a.size(), a_in_b.size()), (3, 4));
    assert_eq!((b_in_a.session(), a_in_b.session()), (b.session(), a.session()));
    assert_eq!(b_in_a.group().size(), 3);
    assert!(b_in_a.group().ranks().iter().all(|&r| r >= 4 && b_in_a.their_rank(r).is_some()));
    let (mut sa, mut sb) = (answers(&a).await, answers(&b).await);
    // A cast reports on its sender's stream id in the receiver's network: the same here.
    assert_eq!(sa.id(), sb.id());

    // Both ways, small and large, from ranks under different comm nodes; the first
    // while a records (its route stamps what it sends).
    let b2 = b_in_a.rank(2).unwrap();
    a.monitor_start(1).await.unwrap();
    assert_eq!(ping(&mut sa, 0, b2, 1000, 5).await, 5);
    a.monitor_stop().await.unwrap();
    assert_eq!(ping(&mut sa, 3, b_in_a.rank(0).unwrap(), 300_000, 2).await, 2);
    assert_eq!(ping(&mut sb, 1, a_in_b.rank(3).unwrap(), 1, 3).await, 3);

    // One message from a's rank 1 to a rank of its own and two of b's: each gets it once.
    let targets = vec![2, b_in_a.rank(0).unwrap(), b_in_a.rank(1).unwrap()];
    sa.send_to(1, TAG_PEER_CAST, "%aud %ud", &[Value::UIntArray(targets), Value::UInt(700)]).await.unwrap();
    let p = sa.recv_timeout(LIMIT).await.unwrap();
    assert_eq!((p.rank(), p.unpack("%ud %ud").unwrap()), (2, vec![Value::UInt(1), Value::UInt(700)]));
    let sender_in_b = a_in_b.rank(1).unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let p = sb.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.unpack("%ud %ud").unwrap(), vec![Value::UInt(sender_in_b), Value::UInt(700)]);
        got.push(p.rank());
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1]);

    // A collective does not cross: the member is told to send messages instead.
    let members = vec![0, b_in_a.rank(0).unwrap()];
    let request = [2, 1].map(Value::UInt).into_iter().chain([Value::UIntArray(members)]);
    let request: Vec<Value> = request.chain([0, 1, 1].map(Value::UInt)).collect();
    sa.send_to(0, TAG_COLLECTIVE, COLLECTIVE_REQUEST, &request).await.unwrap();
    let p = sa.recv_timeout(LIMIT).await.unwrap();
    let said = p.values().unwrap()[0].as_str().unwrap().to_owned();
    assert!(said.contains("collectives do not cross between networks"), "{said}");

    // Disconnected: both are told, and a message to the other network is reported
    // undeliverable rather than lost silently.
    a.disconnect_network(&b_in_a).unwrap();
    event_where(&mut a, |e| matches!(e, Event::NetworkClosed { index, .. } if *index == b_in_a.index()))
        .await;
    event_where(&mut b, |e| matches!(e, Event::NetworkClosed { .. })).await;
    let request = [Value::UInt(b2), Value::UInt(10), Value::UInt(1)];
    sa.send_to(0, TAG_PEER_PING, "%ud %ud %ud", &request).await.unwrap();
    event_where(
        &mut a,
        |e| matches!(e, Event::MessageUndeliverable { from: 0, to } if *to == RankSet::single(b2)),
    )
    .await;
    drop((sa, sb));
    finish(a).await;
    finish(b).await;
}

#[tokio::test]
async fn a_network_that_ends_closes_the_link_and_the_next_links_through_the_same_port_under_a_new_number() {
    let mut a = launch("flat", 2).await;
    let b = launch("flat", 1).await;
    let c = launch("flat", 1).await;
    let dir = common::TestDir::new("networks-again");
    let (path, port) = open_port(&a, &dir).await;
    let (first, _) = tokio::join!(port.accept(&a, LIMIT), b.connect_network(&path, LIMIT));
    let first = first.unwrap();
    finish(b).await;
    let closed = event_where(&mut a, |e| matches!(e, Event::NetworkClosed { .. })).await;
    assert!(matches!(closed, Event::NetworkClosed { index, .. } if index == first.index()), "{closed}");
    // The port takes the next network, under a new number: what was still on its
    // way to the old one must not reach it, nor an old handle name it.
    let (second, c_side) = tokio::join!(port.accept(&a, LIMIT), c.connect_network(&path, LIMIT));
    let (second, c_side) = (second.unwrap(), c_side.unwrap());
    assert_ne!(second.index(), first.index());
    assert_ne!(second.group().id(), first.group().id());
    assert!(matches!(a.disconnect_network(&first), Err(ApiError::Refused(_))));
    let mut sc = answers(&c).await;
    assert_eq!(ping(&mut sc, 0, c_side.rank(1).unwrap(), 64, 2).await, 2);
    // A rank a spawned since the link was made is not known to c: its message is
    // undeliverable, and the link stays for the others.
    let spawned = a.spawn(1, &[], &treecast_api::SpawnOptions::default()).await.unwrap();
    let mut sa = answers(&a).await;
    let request = [Value::UInt(second.rank(0).unwrap()), Value::UInt(8), Value::UInt(1)];
    sa.send_to(spawned.ranks()[0], TAG_PEER_PING, "%ud %ud %ud", &request).await.unwrap();
    let from = spawned.ranks()[0];
    event_where(&mut a, |e| matches!(e, Event::MessageUndeliverable { from: f, .. } if *f == from)).await;
    assert_eq!(ping(&mut sa, 1, second.rank(0).unwrap(), 64, 2).await, 2);
    drop((port, sc, sa));
    finish(c).await;
    finish(a).await;
}

#[tokio::test]
async fn a_network_port_refuses_a_forged_secret_and_a_silent_peer_holds_up_no_one() {
    let a = launch("flat", 1).await;
    let b = launch("flat", 1).await;
    let dir = common::TestDir::new("networks-refused");
    let (path, port) = open_port(&a, &dir).await;
    // The port file with another secret: b cannot prove it, and a goes on waiting.
    let text = std::fs::read_to_string(&path).unwrap();
    let forged_text: Vec<String> = text
        .lines()
        .map(|l| if l.starts_with("secret ") { format!("secret {}", "ab".repeat(32)) } else { l.to_owned() })
        .collect();
    let forged = dir.path("forged.port");
    std::fs::write(&forged, forged_text.join("\n")).unwrap();
    std::fs::set_permissions(&forged, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (accepted, refused) =
        tokio::join!(port.accept(&a, Duration::from_secs(2)), b.connect_network(&forged, LIMIT));
    let err = refused.unwrap_err();
    assert!(matches!(err, ApiError::Join(_)), "{err}");
    assert!(err.to_string().contains("refused our proof"), "{err}");
    assert!(matches!(accepted, Err(ApiError::Timeout(_))), "{accepted:?}");
    // A connection that never answers the challenge does not hold up one that does.
    let address = text.lines().find_map(|l| l.strip_prefix("network unix:@")).unwrap();
    let name = <std::os::unix::net::SocketAddr as SocketAddrExt>::from_abstract_name(address).unwrap();
    let silent = std::os::unix::net::UnixStream::connect_addr(&name).unwrap();
    // (Both wait less than the 10 s a handshake may take: waiting for the silent
    // one's would fail them.)
    let short = Duration::from_secs(5);
    let (accepted, connected) = tokio::join!(port.accept(&a, short), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        b.connect_network(&path, short).await
    });
    assert_eq!((accepted.unwrap().size(), connected.unwrap().size()), (1, 1));
    drop(silent);
    // A back-end given a network's port, and a network given a back-ends' file.
    let err = treecast_api::BackEnd::connect_port(&path, Some(0)).await.unwrap_err();
    assert!(matches!(err, ApiError::Attach(AttachError::NetworkPort { .. })), "{err}");
    let attach = dir.path("attach");
    let info = treecast_api::AttachInfo {
        session: "s".into(),
        secret: treecast_transport::Secret::generate(),
        size: 1,
        points: vec![(0, 1, "unix:@nowhere".into())],
        base: 0,
        network: None,
    };
    info.write(&attach).unwrap();
    let err = b.connect_network(&attach, LIMIT).await.unwrap_err();
    assert!(matches!(err, ApiError::Attach(AttachError::NotNetworkPort { .. })), "{err}");
    drop(port);
    finish(a).await;
    finish(b).await;
}

#[tokio::test]
async fn a_link_that_fails_after_taking_a_network_number_gives_it_back() {
    let a = launch("flat", 1).await;
    let b = launch("flat", 1).await;
    let dir = common::TestDir::new("networks-numbers");
    let (path, port) = open_port(&a, &dir).await;
    let info = treecast_api::AttachInfo::read(&path).unwrap();
    let address = info.network.clone().unwrap();
    // More peers than a front-end has numbers for networks, each proving the
    // port's secret (so that `a` takes a number for it) and hanging up before its
    // hello: each link fails, and each number must come back, or the last ones fail
    // for want of a number and so does the real link after them.
    for k in 0..=treecast_proto::MAX_REMOTES {
        let (accepted, ()) = tokio::join!(port.accept(&a, LIMIT), async {
            drop(treecast_driver::connect_to(&address, 0, &info.secret, LIMIT).await.unwrap());
        });
        let err = accepted.unwrap_err();
        assert!(err.to_string().contains("hello"), "peer {k}: {err}");
    }
    let (in_a, in_b) = tokio::join!(port.accept(&a, LIMIT), b.connect_network(&path, LIMIT));
    assert_eq!((in_a.unwrap().size(), in_b.unwrap().size()), (1, 1));
    drop(port);
    finish(a).await;
    finish(b).await;
}
