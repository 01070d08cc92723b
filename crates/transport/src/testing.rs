//! Test hooks: fault-injection knobs a test sets in the environment of one process
//! (one back-end, one server) to make that process misbehave. They are the only
//! settings the library reads from the environment, and only here: everything a
//! tool configures travels in the launch plan, and the `treecast` command validates
//! its `TREECAST_*` variables before anything starts.
//!
//! They stay per process on purpose: a test makes one member of a multicast group
//! deaf, or one back-end cut a connection of its striped link, which a setting the
//! plan carries to every node cannot say. A malformed value is never taken for
//! "off": each reader returns an error naming the variable, the place that uses
//! the hook fails what it was doing with that error (the multicast member gives up
//! its parent link, a striped link is refused), and the `treecast` binary refuses to
//! start at all ([`check`]).
//!
//! - [`UDP_DROP`] (`P[,SEED]`): a multicast member drops each datagram it would send
//!   (ACKs, NACKs) with chance P. The front-end's `TREECAST_UDP_DROP` setting, which
//!   the plan carries to the nodes that multicast, is the same syntax for senders.
//! - [`STRIPE_CUT`] (`N`): the process cuts connection 1 of each of its striped links
//!   once N pieces arrived on it.
//! - [`JOIN_GATE`] (a path): a back-end that announced itself waits for the file to
//!   exist before it connects.

use std::path::PathBuf;

use crate::mcast::McastConfig;
use crate::TransportError;

/// The multicast drop knob for the datagrams this process sends as a member.
pub const UDP_DROP: &str = "TREECAST_UDP_DROP";
/// Pieces after which this process cuts connection 1 of each of its striped links.
pub const STRIPE_CUT: &str = "TREECAST_STRIPE_CUT";
/// A file a back-end that announced itself waits for before it connects.
pub const JOIN_GATE: &str = "TREECAST_JOIN_GATE";

/// Every hook, for documentation and [`check`].
pub const HOOKS: [&str; 3] = [UDP_DROP, STRIPE_CUT, JOIN_GATE];

/// [`UDP_DROP`] as a chance and a seed; `None` when unset.
///
/// # Errors
/// [`TransportError::Config`] naming the variable when its value is not `P` or
/// `P,SEED` with P from 0 to 1.
pub fn udp_drop() -> Result<Option<(f64, u64)>, TransportError> {
    udp_drop_in(text(UDP_DROP)?)
}

fn udp_drop_in(text: Option<String>) -> Result<Option<(f64, u64)>, TransportError> {
    let Some(text) = text else { return Ok(None) };
    // The plan's parser, so that both roles of the variable take the same syntax.
    let c = McastConfig::from_env(|k| (k == UDP_DROP).then(|| text.clone()))?;
    Ok(Some((c.drop, c.drop_seed)))
}

/// [`STRIPE_CUT`] as a number of pieces; `None` when unset.
///
/// # Errors
/// [`TransportError::Config`] naming the variable when its value is not a whole number.
pub fn stripe_cut() -> Result<Option<u64>, TransportError> {
    stripe_cut_in(text(STRIPE_CUT)?)
}

fn stripe_cut_in(text: Option<String>) -> Result<Option<u64>, TransportError> {
    let Some(text) = text else { return Ok(None) };
    text.trim().parse().map(Some).map_err(|_| {
        TransportError::Config(format!(
            "{STRIPE_CUT}={text:?} (a test hook): write a whole number of pieces, or unset it"
        ))
    })
}

/// [`JOIN_GATE`] as a path; `None` when unset.
///
/// # Errors
/// [`TransportError::Config`] naming the variable when it is set but empty.
pub fn join_gate() -> Result<Option<PathBuf>, TransportError> {
    join_gate_in(std::env::var_os(JOIN_GATE))
}

fn join_gate_in(value: Option<std::ffi::OsString>) -> Result<Option<PathBuf>, TransportError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Err(TransportError::Config(format!(
            "{JOIN_GATE} (a test hook) is set but empty: name the file to wait for, or unset it"
        ))),
        Some(v) => Ok(Some(v.into())),
    }
}

/// The value of hook `var` as text, `None` when unset.
fn text(var: &str) -> Result<Option<String>, TransportError> {
    match std::env::var(var) {
        Ok(text) => Ok(Some(text)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(TransportError::Config(format!("{var} (a test hook) is set but is not UTF-8 text")))
        }
    }
}

/// Reads every hook, so that a program can refuse to start on a malformed one.
///
/// # Errors
/// The first hook whose value is malformed, named.
pub fn check() -> Result<(), TransportError> {
    udp_drop()?;
    stripe_cut()?;
    join_gate()?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unset_hooks_are_off_and_set_ones_are_read() {
        assert_eq!(udp_drop_in(None).unwrap(), None);
        assert_eq!(udp_drop_in(Some("1".into())).unwrap(), Some((1.0, 0)));
        assert_eq!(udp_drop_in(Some("0.25,7".into())).unwrap(), Some((0.25, 7)));
        assert_eq!(stripe_cut_in(None).unwrap(), None);
        assert_eq!(stripe_cut_in(Some(" 60 ".into())).unwrap(), Some(60));
        assert_eq!(join_gate_in(None).unwrap(), None);
        assert_eq!(join_gate_in(Some("/tmp/g".into())).unwrap(), Some(PathBuf::from("/tmp/g")));
    }

    #[test]
    fn a_malformed_hook_is_an_error_naming_it_never_off() {
        // Regression: TREECAST_STRIPE_CUT=sixty was taken as unset, and a member read
        // a malformed TREECAST_UDP_DROP as no drop at all.
        let e = udp_drop_in(Some("5%".into())).unwrap_err().to_string();
        assert!(e.contains(UDP_DROP) && e.contains("5%"), "{e}");
        let e = stripe_cut_in(Some("sixty".into())).unwrap_err().to_string();
        assert!(e.contains(STRIPE_CUT) && e.contains("sixty"), "{e}");
        let e = join_gate_in(Some("".into())).unwrap_err().to_string();
        assert!(e.contains(JOIN_GATE), "{e}");
    }
}
