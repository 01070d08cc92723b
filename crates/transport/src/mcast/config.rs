//! Every size and timer of the multicast protocol, with its default and the
//! `TREECAST_UDP_*` variable that sets it.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::TransportError;

/// How the sender repairs what receivers NACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// Resend only the fragment each NACK names; receivers keep fragments that
    /// arrive after a gap. The default: it keeps its rate under loss.
    Selective,
    /// The published design: after gathering NACKs, resend everything from the
    /// lowest offset asked for; receivers still keep fragments past a gap.
    GoBackN,
}

/// Which losses the sender takes for congestion and halves its window on (selective
/// repair; go-back-N halves on every go-back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalveOn {
    /// Runs of [`BURST_LOSSES`](super::BURST_LOSSES) fragments or more in a
    /// row missed by one receiver: what an overflowing queue drops. Scattered
    /// losses (a lossy wire, one receiver's isolated drops) are repaired without
    /// slowing the group down. The default.
    Bursts,
    /// Every repair, at most once per `nack_coalesce`: the published design, which
    /// at 5 % loss at each of 8 receivers keeps the window at a few fragments.
    EveryLoss,
}

/// Sizes and timers of the multicast protocol.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct McastConfig {
    /// Payload bytes per fragment: 1432 fills a 1472-byte UDP payload (Ethernet's
    /// 1500-byte MTU less IP and UDP headers) with the 24-byte header and the
    /// 16-byte tag. A node's group fits its fragments to its interface's MTU
    /// instead, unless `TREECAST_UDP_FRAGMENT` set this ([`McastConfig::fragment_set`]).
    pub fragment: u32,
    /// `fragment` was set (`TREECAST_UDP_FRAGMENT`), not left to the interface's MTU.
    pub fragment_set: bool,
    /// Congestion window the sender starts with, fragments. `TREECAST_UDP_INITIAL_CWND`.
    pub initial_cwnd: f64,
    /// Messages under way at once at most: the next message starts once the one
    /// before is all sent, without waiting for its acknowledgements, while fewer
    /// than this many wait for theirs. `TREECAST_UDP_IN_FLIGHT` (1 to [`MAX_IN_FLIGHT`]).
    pub in_flight: u32,
    /// A receiver that finds a gap waits a random time up to this long before it
    /// NACKs, and does not NACK when the repair another receiver asked for fills
    /// the gap meanwhile. `TREECAST_UDP_NACK_BACKOFF_US`.
    pub nack_backoff: Duration,
    /// Send with UDP segmentation offload (many datagrams per system call), falling
    /// back to one datagram per call where the kernel refuses. `TREECAST_UDP_GSO=on|off`.
    pub gso: bool,
    /// The first port of the nodes' groups: node N's group uses this port plus N
    /// (wrapping within the ports from this one up), so a firewall can open a range;
    /// 0 (the default) lets each node's system pick a free port. `TREECAST_UDP_PORT`.
    pub port: u16,
    /// Slow-start threshold, fragments: below it the window grows by one per ACK,
    /// above by 1/cwnd. `TREECAST_UDP_SSTHRESH`.
    pub ssthresh: f64,
    /// Largest congestion window, fragments, bounding a burst. `TREECAST_UDP_MAX_CWND`.
    pub max_cwnd: f64,
    /// A receiver in the middle of a message that hears nothing this long NACKs
    /// what it misses. `TREECAST_UDP_RECEIVER_TIMEOUT_MS`.
    pub receiver_timeout: Duration,
    /// A sender that sent a message's last fragment and misses final ACKs this long
    /// sends the last fragment again. `TREECAST_UDP_SENDER_TIMEOUT_MS`.
    pub sender_timeout: Duration,
    /// NACKs within this long count as one loss: go-back-N gathers them before
    /// going back; selective repair resends a fragment at most once per this long,
    /// and the window is halved at most once per this long.
    /// `TREECAST_UDP_NACK_COALESCE_US`.
    pub nack_coalesce: Duration,
    /// How NACKed fragments are resent. `TREECAST_UDP_REPAIR=selective|go-back-n`.
    pub repair: Repair,
    /// Which losses halve the window under selective repair.
    /// `TREECAST_UDP_HALVE_ON=bursts|every-loss`.
    pub halve_on: HalveOn,
    /// A receiver does not send the same NACK again sooner than this.
    /// `TREECAST_UDP_NACK_REPEAT_MS`.
    pub nack_repeat: Duration,
    /// The acker changes at most once per this, however many receivers NACK.
    /// `TREECAST_UDP_ACKER_HOLD_MS`.
    pub acker_hold: Duration,
    /// A receiver that a message waits for and that stays silent this long is
    /// reported lost. `TREECAST_UDP_SILENT_LIMIT_MS`.
    pub silent_limit: Duration,
    /// Largest message a receiver assembles, bytes. `TREECAST_UDP_MAX_MESSAGE`.
    pub max_message: u32,
    /// Test knob: the chance that an endpoint does not send a datagram, to inject
    /// loss where no network emulator is at hand. `TREECAST_UDP_DROP=P[,SEED]`.
    pub drop: f64,
    /// Seed of the drop knob's draws, so that a lossy run can be repeated.
    pub drop_seed: u64,
    /// A node multicasts a downstream data frame only when its payload has at least
    /// this many bytes; smaller ones go over each child's link, where they wait for
    /// nobody's ACK. `TREECAST_UDP_MIN_FRAME`.
    pub min_frame: u32,
    /// A node multicasts a frame only to at least this many members at once (a frame
    /// for fewer goes over their links). `TREECAST_UDP_MIN_MEMBERS`.
    pub min_members: u32,
    /// Where a node's group datagrams go: an IPv4 multicast group (the default,
    /// [`DEFAULT_GROUP`]) or, for a LAN without multicast, the subnet's broadcast
    /// address. Each node's group uses its own port. `TREECAST_UDP_GROUP`.
    pub group: IpAddr,
}

/// The multicast group nodes send to unless `TREECAST_UDP_GROUP` says otherwise: in
/// the organisation-local scope (239.255.0.0/16), which routers do not forward out
/// of a site, and the datagrams' TTL of 1 keeps them on the LAN anyway.
pub const DEFAULT_GROUP: IpAddr = IpAddr::V4(Ipv4Addr::new(239, 255, 84, 67));

/// Messages a receiver assembles at once at most, and so the most a sender may have
/// under way (`TREECAST_UDP_IN_FLIGHT`): a datagram of a message further ahead means
/// the sender went on without the receiver.
pub const MAX_IN_FLIGHT: u32 = 64;

/// The least a receiver keeps past a gap in one message, bytes ([`McastConfig::keep_past_gap`]).
pub const KEEP_PAST_GAP_FLOOR: u64 = 2 << 20;

/// Every variable [`McastConfig::from_env`] reads: what a front-end passes down the tree.
pub const UDP_VARIABLES: [&str; 21] = [
    "TREECAST_UDP_FRAGMENT",
    "TREECAST_UDP_SSTHRESH",
    "TREECAST_UDP_MAX_CWND",
    "TREECAST_UDP_RECEIVER_TIMEOUT_MS",
    "TREECAST_UDP_SENDER_TIMEOUT_MS",
    "TREECAST_UDP_NACK_COALESCE_US",
    "TREECAST_UDP_REPAIR",
    "TREECAST_UDP_NACK_REPEAT_MS",
    "TREECAST_UDP_ACKER_HOLD_MS",
    "TREECAST_UDP_SILENT_LIMIT_MS",
    "TREECAST_UDP_MAX_MESSAGE",
    "TREECAST_UDP_DROP",
    "TREECAST_UDP_MIN_FRAME",
    "TREECAST_UDP_MIN_MEMBERS",
    "TREECAST_UDP_GROUP",
    "TREECAST_UDP_INITIAL_CWND",
    "TREECAST_UDP_IN_FLIGHT",
    "TREECAST_UDP_NACK_BACKOFF_US",
    "TREECAST_UDP_GSO",
    "TREECAST_UDP_PORT",
    "TREECAST_UDP_HALVE_ON",
];

impl Default for McastConfig {
    fn default() -> Self {
        McastConfig {
            fragment: 1432,
            fragment_set: false,
            initial_cwnd: 1.0,
            in_flight: 8,
            nack_backoff: Duration::from_micros(200),
            gso: true,
            port: 0,
            ssthresh: 8.0,
            max_cwnd: 256.0,
            receiver_timeout: Duration::from_millis(100),
            sender_timeout: Duration::from_millis(50),
            nack_coalesce: Duration::from_micros(500),
            repair: Repair::Selective,
            halve_on: HalveOn::Bursts,
            nack_repeat: Duration::from_millis(1),
            acker_hold: Duration::from_millis(5),
            silent_limit: Duration::from_secs(10),
            max_message: 256 << 20,
            drop: 0.0,
            drop_seed: 0,
            min_frame: 8192,
            min_members: 2,
            group: DEFAULT_GROUP,
        }
    }
}

impl McastConfig {
    /// Bytes a receiver keeps past a gap in one message at most: twice the largest
    /// window, and at least [`KEEP_PAST_GAP_FLOOR`], so that a small window does
    /// not make receivers drop what comes while their gap is repaired. The sender
    /// sends no further past the acker's first gap than half of this.
    pub fn keep_past_gap(&self) -> u64 {
        (self.max_cwnd.max(1.0) as u64)
            .saturating_mul(u64::from(self.fragment))
            .saturating_mul(2)
            .max(KEEP_PAST_GAP_FLOOR)
    }

    /// The settings made safe to compute with, whoever filled them in: a fragment of
    /// at least one byte, and timers of at most a day (an `Instant` plus more could
    /// overflow).
    pub fn sanitized(self) -> McastConfig {
        const DAY: Duration = Duration::from_secs(86_400);
        McastConfig {
            fragment: self.fragment.max(1),
            initial_cwnd: self.initial_cwnd.max(1.0),
            in_flight: self.in_flight.clamp(1, MAX_IN_FLIGHT),
            nack_backoff: self.nack_backoff.min(DAY),
            receiver_timeout: self.receiver_timeout.min(DAY),
            sender_timeout: self.sender_timeout.min(DAY),
            nack_coalesce: self.nack_coalesce.min(DAY),
            nack_repeat: self.nack_repeat.min(DAY),
            acker_hold: self.acker_hold.min(DAY),
            silent_limit: self.silent_limit.min(DAY),
            ..self
        }
    }

    /// The defaults, changed by whichever `TREECAST_UDP_*` variables `lookup` finds.
    ///
    /// # Errors
    /// [`TransportError::Config`] naming a variable whose value is not a number in
    /// its range.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<McastConfig, TransportError> {
        let mut c = McastConfig::default();
        let number = |name: &'static str, min: u64, max: u64| -> Result<Option<u64>, TransportError> {
            let Some(text) = lookup(name) else { return Ok(None) };
            match text.trim().parse::<u64>() {
                Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(TransportError::Config(format!(
                    "{name}={text:?}: write a whole number from {min} to {max}"
                ))),
            }
        };
        if let Some(v) = number("TREECAST_UDP_FRAGMENT", 64, 65_000)? {
            c.fragment = v as u32;
            c.fragment_set = true;
        }
        if let Some(v) = number("TREECAST_UDP_SSTHRESH", 1, 65_536)? {
            c.ssthresh = v as f64;
        }
        if let Some(v) = number("TREECAST_UDP_MAX_CWND", 1, 65_536)? {
            c.max_cwnd = v as f64;
        }
        if let Some(v) = number("TREECAST_UDP_INITIAL_CWND", 1, 65_536)? {
            c.initial_cwnd = v as f64;
        }
        if let Some(v) = number("TREECAST_UDP_IN_FLIGHT", 1, u64::from(MAX_IN_FLIGHT))? {
            c.in_flight = v as u32;
        }
        if let Some(v) = number("TREECAST_UDP_NACK_BACKOFF_US", 0, 1_000_000)? {
            c.nack_backoff = Duration::from_micros(v);
        }
        if let Some(v) = number("TREECAST_UDP_PORT", 0, 65_535)? {
            c.port = v as u16;
        }
        if let Some(text) = lookup("TREECAST_UDP_GSO") {
            c.gso = match text.trim() {
                "on" | "1" => true,
                "off" | "0" => false,
                _ => {
                    return Err(TransportError::Config(format!("TREECAST_UDP_GSO={text:?}: write on or off")))
                }
            };
        }
        let ms = |d: &mut Duration, name, min, max| -> Result<(), TransportError> {
            if let Some(v) = number(name, min, max)? {
                *d = Duration::from_millis(v);
            }
            Ok(())
        };
        ms(&mut c.receiver_timeout, "TREECAST_UDP_RECEIVER_TIMEOUT_MS", 1, 60_000)?;
        ms(&mut c.sender_timeout, "TREECAST_UDP_SENDER_TIMEOUT_MS", 1, 60_000)?;
        ms(&mut c.nack_repeat, "TREECAST_UDP_NACK_REPEAT_MS", 0, 60_000)?;
        ms(&mut c.acker_hold, "TREECAST_UDP_ACKER_HOLD_MS", 0, 60_000)?;
        ms(&mut c.silent_limit, "TREECAST_UDP_SILENT_LIMIT_MS", 10, 3_600_000)?;
        if let Some(v) = number("TREECAST_UDP_NACK_COALESCE_US", 0, 1_000_000)? {
            c.nack_coalesce = Duration::from_micros(v);
        }
        if let Some(v) = number("TREECAST_UDP_MAX_MESSAGE", 1, u64::from(u32::MAX))? {
            c.max_message = v as u32;
        }
        let choice = |name: &str, options: &[&str]| -> Result<Option<usize>, TransportError> {
            let Some(text) = lookup(name) else { return Ok(None) };
            match options.iter().position(|o| *o == text.trim()) {
                Some(i) => Ok(Some(i)),
                None => {
                    Err(TransportError::Config(format!("{name}={text:?}: write {}", options.join(" or "))))
                }
            }
        };
        if let Some(i) = choice("TREECAST_UDP_REPAIR", &["selective", "go-back-n"])? {
            c.repair = [Repair::Selective, Repair::GoBackN][i];
        }
        if let Some(i) = choice("TREECAST_UDP_HALVE_ON", &["bursts", "every-loss"])? {
            c.halve_on = [HalveOn::Bursts, HalveOn::EveryLoss][i];
        }
        if let Some(v) = number("TREECAST_UDP_MIN_FRAME", 0, u64::from(u32::MAX))? {
            c.min_frame = v as u32;
        }
        if let Some(v) = number("TREECAST_UDP_MIN_MEMBERS", 1, 65_536)? {
            c.min_members = v as u32;
        }
        if let Some(text) = lookup("TREECAST_UDP_GROUP") {
            c.group = match text.trim().parse::<Ipv4Addr>() {
                Ok(ip) if !ip.is_unspecified() && !ip.is_loopback() => IpAddr::V4(ip),
                _ => {
                    return Err(TransportError::Config(format!(
                        "TREECAST_UDP_GROUP={text:?}: write an IPv4 multicast group (239.255.84.67) \
                         or the LAN's broadcast address (10.0.0.255)"
                    )))
                }
            };
        }
        if let Some(text) = lookup("TREECAST_UDP_DROP") {
            let bad = || {
                TransportError::Config(format!(
                    "TREECAST_UDP_DROP={text:?}: write P or P,SEED, P from 0 to 1"
                ))
            };
            let (p, seed) = text.split_once(',').unwrap_or((&text, "0"));
            c.drop = p.trim().parse::<f64>().ok().filter(|p| (0.0..=1.0).contains(p)).ok_or_else(bad)?;
            c.drop_seed = seed.trim().parse().map_err(|_| bad())?;
        }
        Ok(c)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn variables_change_their_setting_and_a_bad_one_is_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let c = McastConfig::from_env(env(&[
            ("TREECAST_UDP_FRAGMENT", "8000"),
            ("TREECAST_UDP_RECEIVER_TIMEOUT_MS", "250"),
            ("TREECAST_UDP_NACK_COALESCE_US", "0"),
            ("TREECAST_UDP_DROP", "0.05,7"),
            ("TREECAST_UDP_INITIAL_CWND", "16"),
            ("TREECAST_UDP_IN_FLIGHT", "4"),
            ("TREECAST_UDP_NACK_BACKOFF_US", "0"),
            ("TREECAST_UDP_GSO", "off"),
            ("TREECAST_UDP_PORT", "40000"),
            ("TREECAST_UDP_HALVE_ON", " every-loss "),
        ]))
        .unwrap();
        assert_eq!((c.halve_on, McastConfig::default().halve_on), (HalveOn::EveryLoss, HalveOn::Bursts));
        assert_eq!(
            (c.initial_cwnd, c.in_flight, c.nack_backoff, c.gso, c.port),
            (16.0, 4, Duration::ZERO, false, 40000)
        );
        assert_eq!(c.fragment, 8000);
        assert_eq!(c.receiver_timeout, Duration::from_millis(250));
        assert_eq!(c.nack_coalesce, Duration::ZERO);
        assert_eq!(c.sender_timeout, McastConfig::default().sender_timeout);
        assert_eq!((c.drop, c.drop_seed), (0.05, 7));
        let err = McastConfig::from_env(env(&[("TREECAST_UDP_DROP", "5%")])).unwrap_err().to_string();
        assert!(err.contains("TREECAST_UDP_DROP=\"5%\": write P or P,SEED"), "{err}");
        let err = McastConfig::from_env(env(&[("TREECAST_UDP_FRAGMENT", "9")])).unwrap_err().to_string();
        assert!(err.contains("TREECAST_UDP_FRAGMENT=\"9\": write a whole number from 64 to 65000"), "{err}");
        let err = McastConfig::from_env(env(&[("TREECAST_UDP_IN_FLIGHT", "65")])).unwrap_err().to_string();
        assert!(err.contains("TREECAST_UDP_IN_FLIGHT=\"65\": write a whole number from 1 to 64"), "{err}");
        let err = McastConfig::from_env(env(&[("TREECAST_UDP_GSO", "yes")])).unwrap_err().to_string();
        assert!(err.contains("TREECAST_UDP_GSO=\"yes\": write on or off"), "{err}");
        let err = McastConfig::from_env(env(&[("TREECAST_UDP_HALVE_ON", "all")])).unwrap_err().to_string();
        assert!(err.contains("TREECAST_UDP_HALVE_ON=\"all\": write bursts or every-loss"), "{err}");
    }
}
