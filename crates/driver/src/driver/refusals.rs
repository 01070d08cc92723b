//! Connections a listener refuses (wrong secret, garbage, silence), logged at a
//! bounded rate: a flood of bad peers must not bury the user's terminal in warnings.

use std::time::{Duration, Instant};

/// Shortest time between two warnings about refused connections.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(5);

/// Counts refusals and says when a warning is due; what it returns is the one line to log.
#[derive(Debug)]
pub(crate) struct Refusals {
    /// Says what happened `n` times: `refused 3 connections`.
    describe: fn(u64) -> String,
    /// Said after the count: the likely cause.
    hint: &'static str,
    last_warning: Option<Instant>,
    /// Refusals since the last warning, not yet reported.
    unreported: u64,
    /// Why the latest of them was refused.
    last_reason: String,
}

impl Refusals {
    pub(crate) fn new(describe: fn(u64) -> String, hint: &'static str) -> Refusals {
        Refusals { describe, hint, last_warning: None, unreported: 0, last_reason: String::new() }
    }

    /// For connections that fail the handshake or stay silent.
    pub(crate) fn connections() -> Refusals {
        let describe =
            |n| if n == 1 { "refused a connection".to_owned() } else { format!("refused {n} connections") };
        Refusals::new(describe, "(failed or no handshake)")
    }

    /// For join announcements that are not signed, not awaited, or wrong.
    pub(crate) fn announcements() -> Refusals {
        let describe = |n| {
            if n == 1 {
                "refused a join announcement".to_owned()
            } else {
                format!("refused {n} join announcements")
            }
        };
        Refusals::new(describe, "(not signed with the session's secret, or not awaited)")
    }

    /// For failures of the listener's own accept.
    pub(crate) fn accepts() -> Refusals {
        let describe =
            |n| if n == 1 { "accepting failed".to_owned() } else { format!("accepting failed {n} times") };
        Refusals::new(describe, "(out of file descriptors? raise `ulimit -n`)")
    }

    /// Notes one refusal at `now`; returns the warning to log, if one is due: the first
    /// refusal at once, later ones at most once per [`WARN_EVERY`], with their count.
    pub(crate) fn refused(&mut self, reason: String, now: Instant) -> Option<String> {
        self.unreported += 1;
        self.last_reason = reason;
        match self.last_warning {
            Some(at) if now.duration_since(at) < WARN_EVERY => None,
            _ => self.report(now),
        }
    }

    /// The warning for refusals not yet reported (when the listener closes), if any.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<String> {
        self.report(now)
    }

    fn report(&mut self, now: Instant) -> Option<String> {
        let line = match self.unreported {
            0 => return None,
            1 => format!("{}: {}", (self.describe)(1), self.last_reason),
            n => format!(
                "{} since the last warning {}; the latest: {}",
                (self.describe)(n),
                self.hint,
                self.last_reason
            ),
        };
        self.unreported = 0;
        self.last_warning = Some(now);
        Some(line)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_gives_one_line_per_interval_with_its_count() {
        let mut r = Refusals::connections();
        let t0 = Instant::now();
        let first = r.refused("bad secret".into(), t0).unwrap();
        assert_eq!(first, "refused a connection: bad secret");
        let mut lines = 0;
        for i in 1..=1000u32 {
            if r.refused(format!("peer {i}"), t0 + Duration::from_millis(u64::from(i))).is_some() {
                lines += 1;
            }
        }
        assert_eq!(lines, 0, "1,000 refusals within the interval log nothing more");
        let later = r.refused("peer x".into(), t0 + WARN_EVERY).unwrap();
        assert!(later.starts_with("refused 1001 connections since the last warning"), "{later}");
        assert!(later.ends_with("the latest: peer x"), "{later}");
        assert_eq!(r.flush(t0 + WARN_EVERY), None, "nothing left to report");
        r.refused("y".into(), t0 + WARN_EVERY + Duration::from_secs(1));
        assert_eq!(r.flush(t0 + WARN_EVERY * 2).as_deref(), Some("refused a connection: y"));
    }
}
