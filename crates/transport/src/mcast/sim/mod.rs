//! A simulated LAN for the multicast protocol: one sender, a group of receivers,
//! virtual time, a line rate per uplink, and datagrams lost, duplicated and
//! reordered at seeded random. The protocol's tests run in it, and so does
//! `treecast bench route --sim`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use treecast_wire::{McastAnswer, McastHeader, MCAST_HEADER_LEN, MCAST_TAG_LEN};

use super::{McastConfig, Receiver, ReceiverEvent, ReceiverStats, Sender, SenderEvent, SenderStats};

#[cfg(test)]
mod tests;

/// Bytes a datagram takes on an Ethernet wire besides the protocol's: IPv4 and UDP
/// headers (28), Ethernet header, FCS, preamble and inter-frame gap (38).
const WIRE_OVERHEAD: u64 = 66;

/// What the LAN does to each datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Chance that a datagram does not reach one of its destinations.
    pub loss: f64,
    /// Chance that it arrives twice.
    pub duplicate: f64,
    /// Chance of an extra delay of up to half a millisecond, which reorders.
    pub reorder: f64,
}

impl Faults {
    /// A LAN that loses, duplicates and reorders nothing.
    pub const NONE: Faults = Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0 };
}

/// The LAN's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LanConfig {
    /// One-way latency of every datagram, after its last bit left the uplink.
    pub latency: Duration,
    /// Line rate of every node's uplink, bits per second (`None`: unlimited). A
    /// multicast datagram crosses the sender's uplink once, whatever the group size.
    pub rate_bps: Option<u64>,
    /// What happens to datagrams.
    pub faults: Faults,
    /// Seed of every random draw.
    pub seed: u64,
    /// A receiver slower than the wire: the last receiver (not the first acker)
    /// takes data at this many bits per second into a socket buffer of
    /// `slow_buffer` datagrams, and the kernel drops what arrives while it is full
    /// (congestion at a receiver; `None`: it keeps up).
    pub slow_receiver_bps: Option<u64>,
    /// The slow receiver's socket buffer, datagrams.
    pub slow_buffer: u32,
}

impl Default for LanConfig {
    fn default() -> Self {
        LanConfig {
            latency: Duration::from_micros(50),
            rate_bps: None,
            faults: Faults::NONE,
            seed: 0,
            slow_receiver_bps: None,
            slow_buffer: 64,
        }
    }
}

#[derive(Clone)]
enum Packet {
    Data { to: usize, header: McastHeader, payload: Bytes },
    Answer { header: McastHeader, answer: McastAnswer },
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

/// What a run of the LAN did.
#[derive(Debug, Clone, PartialEq)]
pub struct LanOutcome {
    /// Virtual time from the start until everything settled.
    pub elapsed: Duration,
    /// Everything settled before the limit.
    pub settled: bool,
    /// The sender's counters.
    pub sender: SenderStats,
    /// The receivers' counters, added up.
    pub receivers: ReceiverStats,
    /// Receivers reported lost.
    pub lost: Vec<u32>,
}

/// A sender and its group on one simulated LAN.
pub struct Lan {
    now: Instant,
    start: Instant,
    rng: StdRng,
    lan: LanConfig,
    sender: Sender,
    receivers: Vec<Receiver>,
    /// A receiver whose process died: it hears and says nothing.
    dead: Vec<bool>,
    /// When each uplink is free again: the sender's, then each receiver's.
    uplink_free: Vec<Instant>,
    /// When the slow receiver has taken everything in its socket buffer.
    slow_free: Instant,
    /// Datagrams the slow receiver's buffer dropped.
    overrun: u64,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    delivered: Vec<Vec<Bytes>>,
    completed: Vec<u32>,
    lost: Vec<u32>,
    receiver_events: Vec<ReceiverEvent>,
}

/// Node id of receiver `i`; the sender is group 1.
pub fn receiver_id(i: usize) -> u32 {
    10 + i as u32
}

impl Lan {
    /// A sender (group 1) and `receivers` receivers (ids from [`receiver_id`]).
    pub fn new(config: McastConfig, receivers: usize, lan: LanConfig) -> Lan {
        let start = Instant::now();
        Lan {
            now: start,
            start,
            rng: StdRng::seed_from_u64(lan.seed),
            lan,
            sender: Sender::new(config, 1, (0..receivers).map(receiver_id)),
            receivers: (0..receivers).map(|i| Receiver::new(config, receiver_id(i), 1, 0)).collect(),
            dead: vec![false; receivers],
            uplink_free: vec![start; receivers + 1],
            slow_free: start,
            overrun: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            delivered: vec![Vec::new(); receivers],
            completed: Vec::new(),
            lost: Vec::new(),
            receiver_events: Vec::new(),
        }
    }

    /// Queues a message at the sender.
    pub fn send(&mut self, data: Bytes) {
        // Under 4 GiB by construction of every caller here; a larger one is skipped.
        let _ = self.sender.send(0, data, self.now);
    }

    /// Messages receiver `i` got so far, in order.
    pub fn delivered(&self, i: usize) -> &[Bytes] {
        &self.delivered[i]
    }

    /// The time the last bit of a datagram of `payload` bytes leaves uplink `node`
    /// (0: the sender), the uplink being busy until then.
    fn leave(&mut self, node: usize, payload: usize) -> Instant {
        let Some(rate) = self.lan.rate_bps.filter(|&r| r > 0) else { return self.now };
        let bits = (payload as u64 + (MCAST_HEADER_LEN + MCAST_TAG_LEN) as u64 + WIRE_OVERHEAD) * 8;
        let start = self.uplink_free[node].max(self.now);
        let done = start + Duration::from_nanos(bits.saturating_mul(1_000_000_000) / rate);
        self.uplink_free[node] = done;
        done
    }

    fn arrive(&mut self, left: Instant, packet: Packet) {
        let faults = self.lan.faults;
        if self.rng.gen_bool(faults.loss) {
            return;
        }
        let slow = self.receivers.len().checked_sub(1);
        let (left, packet) = match (packet, self.lan.slow_receiver_bps) {
            (Packet::Data { to, header, payload }, Some(bps)) if Some(to) == slow => {
                let Some(taken) = self.slow_take(left + self.lan.latency, payload.len(), bps) else { return };
                (taken - self.lan.latency, Packet::Data { to, header, payload })
            }
            (packet, _) => (left, packet),
        };
        let copies = if self.rng.gen_bool(faults.duplicate) { 2 } else { 1 };
        for _ in 0..copies {
            // A LAN keeps one sender's datagrams in order unless reordering is asked for.
            let mut at = left + self.lan.latency;
            if self.rng.gen_bool(faults.reorder) {
                at += Duration::from_nanos(self.rng.gen_range(1_000..500_000));
            }
            self.seq += 1;
            self.queue.push(Reverse(InFlight { at, seq: self.seq, packet: packet.clone() }));
        }
    }

    /// When the slow receiver takes a datagram of `payload` bytes that reaches it at
    /// `at`, or `None` when its full buffer drops it.
    fn slow_take(&mut self, at: Instant, payload: usize, bps: u64) -> Option<Instant> {
        let bits = (payload as u64 + (MCAST_HEADER_LEN + MCAST_TAG_LEN) as u64) * 8;
        let each = Duration::from_nanos(bits.saturating_mul(1_000_000_000) / bps.max(1));
        let queued = self.slow_free.saturating_duration_since(at).as_nanos() / each.as_nanos().max(1);
        if queued >= u128::from(self.lan.slow_buffer) {
            self.overrun += 1;
            return None;
        }
        self.slow_free = self.slow_free.max(at) + each;
        Some(self.slow_free)
    }

    /// Datagrams the slow receiver's full buffer dropped so far.
    pub fn overrun(&self) -> u64 {
        self.overrun
    }

    /// Moves every output of every party onto the network and every event into the record.
    fn collect(&mut self) {
        while let Some((header, payload)) = self.sender.poll_datagram() {
            let left = self.leave(0, payload.len());
            for to in 0..self.receivers.len() {
                self.arrive(left, Packet::Data { to, header, payload: payload.clone() });
            }
        }
        while let Some(e) = self.sender.poll_event() {
            match e {
                SenderEvent::Completed { message, .. } => self.completed.push(message),
                SenderEvent::Lost { receiver, .. } => self.lost.push(receiver),
            }
        }
        for i in 0..self.receivers.len() {
            while let Some((header, answer)) = self.receivers[i].poll_answer() {
                if !self.dead[i] {
                    let left = self.leave(i + 1, 4 * (1 + answer.holes.len()));
                    self.arrive(left, Packet::Answer { header, answer });
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

    /// Runs until nothing is left to do, or `limit` of virtual time passed.
    pub fn run(&mut self, limit: Duration) -> LanOutcome {
        self.collect();
        let mut settled = true;
        while let Some(t) = self.next_time() {
            if t.saturating_duration_since(self.start) > limit {
                settled = false;
                break;
            }
            self.now = self.now.max(t);
            self.step();
        }
        let receivers =
            self.receivers.iter().map(Receiver::stats).fold(ReceiverStats::default(), |a, s| ReceiverStats {
                fragments: a.fragments + s.fragments,
                duplicates: a.duplicates + s.duplicates,
                out_of_order: a.out_of_order + s.out_of_order,
                nacks: a.nacks + s.nacks,
                acks: a.acks + s.acks,
                timeouts: a.timeouts + s.timeouts,
                invalid: a.invalid + s.invalid,
            });
        LanOutcome {
            elapsed: self.now.saturating_duration_since(self.start),
            settled: settled && self.sender.is_idle(),
            sender: self.sender.stats(),
            receivers,
            lost: self.lost.clone(),
        }
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
                Packet::Answer { header, answer } => self.sender.handle_answer(&header, &answer, now),
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
}
