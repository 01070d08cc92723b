//! A simulated LAN for the multicast protocol: one sender, a group of receivers,
//! virtual time, and datagrams lost, duplicated and reordered at seeded random.

#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use treecast_wire::McastHeader;

use super::*;

/// What the network does to each datagram.
#[derive(Debug, Clone, Copy)]
struct Faults {
    loss: f64,
    duplicate: f64,
    /// Chance of an extra delay of up to ten latencies, which reorders.
    reorder: f64,
}

const CLEAN: Faults = Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0 };
const LATENCY: Duration = Duration::from_micros(50);

enum Packet {
    Data { to: usize, header: McastHeader, payload: Bytes },
    Answer { header: McastHeader },
}

struct InFlight {
    at: Instant,
    seq: u64,
    packet: Packet,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The group and its LAN.
struct Lan {
    now: Instant,
    start: Instant,
    rng: StdRng,
    faults: Faults,
    sender: Sender,
    receivers: Vec<Receiver>,
    /// A receiver whose process died: it hears and says nothing.
    dead: Vec<bool>,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    delivered: Vec<Vec<Bytes>>,
    completed: Vec<u32>,
    lost: Vec<u32>,
    receiver_events: Vec<ReceiverEvent>,
}

/// Receiver `i` has node id `10 + i`; the sender is group 1.
fn id(i: usize) -> u32 {
    10 + i as u32
}

impl Lan {
    fn new(config: McastConfig, receivers: usize, faults: Faults, seed: u64) -> Lan {
        let start = Instant::now();
        Lan {
            now: start,
            start,
            rng: StdRng::seed_from_u64(seed),
            faults,
            sender: Sender::new(config, 1, (0..receivers).map(id)),
            receivers: (0..receivers).map(|i| Receiver::new(config, id(i), 1, 0)).collect(),
            dead: vec![false; receivers],
            queue: BinaryHeap::new(),
            seq: 0,
            delivered: vec![Vec::new(); receivers],
            completed: Vec::new(),
            lost: Vec::new(),
            receiver_events: Vec::new(),
        }
    }

    fn transmit(&mut self, packet: Packet) {
        if self.rng.gen_bool(self.faults.loss) {
            return;
        }
        let copies = if self.rng.gen_bool(self.faults.duplicate) { 2 } else { 1 };
        for copy in 0..copies {
            // A LAN keeps one sender's datagrams in order unless reordering is asked for.
            let mut delay = LATENCY;
            if self.rng.gen_bool(self.faults.reorder) {
                delay += Duration::from_nanos(self.rng.gen_range(1_000..500_000));
            }
            self.seq += 1;
            let packet = match (&packet, copy) {
                (Packet::Data { to, header, payload }, _) => {
                    Packet::Data { to: *to, header: *header, payload: payload.clone() }
                }
                (Packet::Answer { header }, _) => Packet::Answer { header: *header },
            };
            self.queue.push(Reverse(InFlight { at: self.now + delay, seq: self.seq, packet }));
        }
    }

    /// Moves every output of every party onto the network and every event into the record.
    fn collect(&mut self) {
        while let Some((header, payload)) = self.sender.poll_datagram() {
            for to in 0..self.receivers.len() {
                self.transmit(Packet::Data { to, header, payload: payload.clone() });
            }
        }
        while let Some(e) = self.sender.poll_event() {
            match e {
                SenderEvent::Completed { message, .. } => self.completed.push(message),
                SenderEvent::Lost { receiver, .. } => self.lost.push(receiver),
            }
        }
        for i in 0..self.receivers.len() {
            while let Some(header) = self.receivers[i].poll_answer() {
                if !self.dead[i] {
                    self.transmit(Packet::Answer { header });
                }
            }
            while let Some(e) = self.receivers[i].poll_event() {
                match e {
                    ReceiverEvent::Message { data, .. } => self.delivered[i].push(data),
                    other => self.receiver_events.push(other),
                }
            }
        }
    }

    fn next_time(&self) -> Option<Instant> {
        let net = self.queue.peek().map(|Reverse(p)| p.at);
        let timers = self
            .receivers
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.dead[*i])
            .filter_map(|(_, r)| r.deadline());
        net.into_iter().chain(self.sender.deadline()).chain(timers).min()
    }

    /// Runs until nothing is left to do, or `limit` of virtual time passed; returns
    /// whether everything settled.
    fn run(&mut self, limit: Duration) -> bool {
        self.collect();
        while let Some(t) = self.next_time() {
            if t.saturating_duration_since(self.start) > limit {
                return false;
            }
            self.now = self.now.max(t);
            self.step();
        }
        self.sender.is_idle()
    }

    fn step(&mut self) {
        let now = self.now;
        while self.queue.peek().is_some_and(|Reverse(p)| p.at <= now) {
            let Some(Reverse(p)) = self.queue.pop() else { break };
            match p.packet {
                Packet::Data { to, header, payload } if !self.dead[to] => {
                    self.receivers[to].handle_data(&header, &payload, now);
                }
                Packet::Data { .. } => {}
                Packet::Answer { header } => self.sender.handle_answer(&header, now),
            }
        }
        if self.sender.deadline().is_some_and(|t| t <= now) {
            self.sender.handle_timeout(now);
        }
        for (i, r) in self.receivers.iter_mut().enumerate() {
            if !self.dead[i] && r.deadline().is_some_and(|t| t <= now) {
                r.handle_timeout(now);
            }
        }
        self.collect();
    }

    fn send_all(&mut self, messages: &[Bytes]) {
        for m in messages {
            self.sender.send(0, m.clone(), self.now).unwrap();
        }
    }
}

fn message(len: usize, seed: u8) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>().into()
}

fn config() -> McastConfig {
    McastConfig { fragment: 100, silent_limit: Duration::from_secs(2), ..McastConfig::default() }
}

#[test]
fn without_faults_every_receiver_gets_every_size_once_and_nothing_is_sent_twice() {
    let sizes = [0, 1, 100, 101, 1007, 0, 250];
    let messages: Vec<Bytes> = sizes.iter().enumerate().map(|(i, &n)| message(n, i as u8)).collect();
    let mut lan = Lan::new(config(), 4, CLEAN, 1);
    lan.send_all(&messages);
    assert!(lan.run(Duration::from_secs(10)));
    for got in &lan.delivered {
        assert_eq!(got, &messages);
    }
    assert_eq!(lan.completed, (0..sizes.len() as u32).collect::<Vec<_>>());
    let stats = lan.sender.stats();
    assert_eq!(stats.retransmitted, 0, "{stats:?}");
    assert_eq!(stats.nacks, 0, "{stats:?}");
    // One fragment per started 100 bytes, an empty message being one fragment.
    let fragments: u64 = sizes.iter().map(|&n: &usize| n.div_ceil(100).max(1) as u64).sum();
    assert_eq!(stats.fragments, fragments);
    assert!(lan.lost.is_empty() && lan.receiver_events.is_empty());
}

#[test]
fn the_window_opens_by_slow_start_then_grows_slowly_and_halves_on_a_nack() {
    let mut lan = Lan::new(config(), 1, CLEAN, 2);
    lan.send_all(&[message(100 * 40, 1)]);
    // The window starts at one fragment.
    lan.collect();
    assert_eq!(lan.queue.len(), 1);
    assert_eq!(lan.sender.cwnd(), 1.0);
    // One ACK each from 1 to the threshold of 8, then a fraction per ACK.
    let mut seen = vec![lan.sender.cwnd()];
    while let Some(t) = lan.next_time() {
        lan.now = t;
        lan.step();
        seen.push(lan.sender.cwnd());
    }
    seen.dedup();
    // ACKs arriving together move it several steps at once (it doubles per round trip).
    assert_eq!(&seen[..2], &[1.0, 2.0]);
    assert!(seen.contains(&8.0), "{seen:?}");
    assert!(seen.iter().filter(|&&w| w <= 8.0).all(|w| w.fract() == 0.0), "{seen:?}");
    let last = *seen.last().unwrap();
    assert!(last > 9.0 && last < 13.0, "{seen:?}");
    assert_eq!(lan.delivered[0].len(), 1);
    // A NACK (gathered, then acted on) halves it.
    lan.send_all(&[message(100 * 40, 2)]);
    let nack = McastHeader::answer(treecast_wire::McastKind::Nack, 1, id(0), 0, 1, 0);
    lan.sender.handle_answer(&nack, lan.now);
    lan.sender.handle_timeout(lan.now + config().nack_coalesce);
    assert!((lan.sender.cwnd() - last / 2.0).abs() < 1e-9);
}

#[test]
fn at_one_five_and_twenty_percent_loss_every_byte_arrives_in_order() {
    for (loss, seed) in [(0.01, 3), (0.05, 4), (0.20, 5)] {
        let messages: Vec<Bytes> = (0..6).map(|i| message(100 * 50 + i * 37, i as u8)).collect();
        let faults = Faults { loss, duplicate: 0.0, reorder: 0.0 };
        let mut lan = Lan::new(config(), 8, faults, seed);
        lan.send_all(&messages);
        assert!(lan.run(Duration::from_secs(600)), "loss {loss}: did not settle");
        for (i, got) in lan.delivered.iter().enumerate() {
            assert_eq!(got, &messages, "loss {loss}, receiver {i}");
        }
        assert!(lan.lost.is_empty(), "loss {loss}: {:?}", lan.lost);
        let stats = lan.sender.stats();
        assert!(stats.retransmitted > 0 && stats.nacks > 0, "loss {loss}: {stats:?}");
    }
}

#[test]
fn a_receiver_that_dies_mid_message_is_reported_lost_and_the_others_complete() {
    let messages: Vec<Bytes> = (0..4).map(|i| message(100 * 30, i)).collect();
    let mut lan = Lan::new(config(), 4, CLEAN, 6);
    lan.send_all(&messages);
    lan.collect();
    // Run until receiver 2 has the first message, then kill it.
    while lan.delivered[2].is_empty() {
        let t = lan.next_time().unwrap();
        lan.now = t;
        lan.step();
    }
    lan.dead[2] = true;
    assert!(lan.run(Duration::from_secs(60)));
    assert_eq!(lan.lost, vec![id(2)]);
    assert_eq!(lan.completed.len(), messages.len());
    for i in [0, 1, 3] {
        assert_eq!(lan.delivered[i], messages, "receiver {i}");
    }
    assert!(lan.sender.receivers().all(|r| r != id(2)));
    // Reported once the silence passed the limit, not before.
    assert!(lan.now.saturating_duration_since(lan.start) >= config().silent_limit);
}

#[test]
fn the_acker_is_the_receiver_that_nacked_last() {
    let mut lan = Lan::new(config(), 3, CLEAN, 7);
    let first = lan.sender.acker();
    assert_eq!(first, Some(id(0)));
    lan.send_all(&[message(1000, 1)]);
    lan.collect();
    // Receiver 2 says it misses everything.
    let nack = McastHeader::answer(treecast_wire::McastKind::Nack, 1, id(2), 0, 0, 0);
    lan.sender.handle_answer(&nack, lan.now);
    assert_eq!(lan.sender.acker(), Some(id(2)));
    assert_eq!(lan.sender.stats().acker_changes, 1);
    // Within the hold, another NACK does not move it.
    let nack = McastHeader::answer(treecast_wire::McastKind::Nack, 1, id(1), 0, 0, 0);
    lan.sender.handle_answer(&nack, lan.now + Duration::from_millis(1));
    assert_eq!(lan.sender.acker(), Some(id(2)));
    lan.sender.handle_answer(&nack, lan.now + config().acker_hold);
    assert_eq!(lan.sender.acker(), Some(id(1)));
}

#[test]
fn answers_from_outside_the_group_or_about_other_messages_change_nothing() {
    let mut lan = Lan::new(config(), 2, CLEAN, 8);
    lan.send_all(&[message(1000, 1)]);
    lan.collect();
    let before = lan.sender.stats();
    for header in [
        McastHeader::answer(treecast_wire::McastKind::Ack, 1, 99, 0, 0, 1000),
        McastHeader::answer(treecast_wire::McastKind::Ack, 2, id(0), 0, 0, 1000),
        McastHeader::answer(treecast_wire::McastKind::Ack, 1, id(0), 0, 5, 1000),
        McastHeader::answer(treecast_wire::McastKind::Ack, 1, id(0), 0, 0, 5000),
    ] {
        lan.sender.handle_answer(&header, lan.now);
    }
    assert_eq!(lan.sender.stats(), before);
    assert!(lan.completed.is_empty());
    assert!(lan.run(Duration::from_secs(10)));
    assert_eq!(lan.completed, vec![0]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the network loses, duplicates or reorders, every receiver gets every
    /// message once, whole and in order, and the sender completes them all.
    #[test]
    fn every_message_arrives_whole_and_in_order_at_every_receiver(
        sizes in prop::collection::vec(0usize..2_000, 1..8),
        receivers in 1usize..8,
        loss in 0.0f64..0.3,
        duplicate in 0.0f64..0.1,
        reorder in 0.0f64..0.2,
        seed in any::<u64>(),
    ) {
        let messages: Vec<Bytes> = sizes.iter().enumerate().map(|(i, &n)| message(n, i as u8)).collect();
        let mut lan = Lan::new(config(), receivers, Faults { loss, duplicate, reorder }, seed);
        lan.send_all(&messages);
        prop_assert!(lan.run(Duration::from_secs(600)), "did not settle: {:?}", lan.sender.stats());
        for got in &lan.delivered {
            prop_assert_eq!(got, &messages);
        }
        prop_assert_eq!(lan.completed.len(), messages.len());
        prop_assert!(lan.lost.is_empty(), "{:?}", lan.lost);
        prop_assert!(lan.receiver_events.is_empty(), "{:?}", lan.receiver_events);
    }
}
