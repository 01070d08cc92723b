//! The `TREECAST_*` variables the `treecast` command honours, read and checked once
//! before anything starts (ripgrep's pattern: flags and the environment become a
//! validated configuration first). The library reads no environment: a tool that
//! embeds it sets what it wants on its `NetworkBuilder`.
//!
//! A malformed value is an error naming the variable and what it accepts, never a
//! silent default. Flags given on the command line are applied after these, so they
//! win.

use std::net::IpAddr;
use std::time::Duration;

use treecast_api::NetworkBuilder;
use treecast_driver::env;
use treecast_transport::mcast::{McastConfig, UDP_VARIABLES};
use treecast_transport::striped::rails::check_rails;
use treecast_transport::striped::stall;

/// The program comm nodes run (as `<program> node`), and a comm node its children
/// on its host: the `treecast` binary, or a wrapper standing in for it.
pub const TREECAST_PATH: &str = "TREECAST_PATH";

/// What the environment asks of a network, each `None` when its variable is unset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvSettings {
    /// `TREECAST_STARTUP_TIMEOUT`.
    pub startup_timeout: Option<Duration>,
    /// `TREECAST_MAX_FRAME`, bytes.
    pub max_frame: Option<usize>,
    /// `TREECAST_MAX_CONTROL`, bytes per back-end a child reaches.
    pub max_control: Option<usize>,
    /// `TREECAST_DEAD_AFTER` (`Some(None)`: `0`, heartbeats off).
    pub dead_after: Option<Option<Duration>>,
    /// `TREECAST_REJOIN_WITHIN` (`Some(None)`: `0`, recovery off).
    pub rejoin_within: Option<Option<Duration>>,
    /// `TREECAST_ROUTE`: `unix` (true) or `tcp` (false) between processes of one host.
    pub unix_links: Option<bool>,
    /// `TREECAST_LISTEN`: the address children on other hosts connect to.
    pub remote_listen: Option<IpAddr>,
    /// `TREECAST_LOG`: the log filter every process of the tree uses.
    pub log: Option<String>,
    /// The UDP route's `TREECAST_UDP_*` settings that are set.
    pub udp: Vec<(String, String)>,
    /// `TREECAST_CLOCK_*`: the global clock's settings (unset ones keep their defaults).
    pub clock: treecast_api::ClockPlan,
    /// `TREECAST_PATH`: the program comm nodes run.
    pub treecast_path: Option<std::path::PathBuf>,
    /// `TREECAST_ZERO_COPY_MIN` (`Some(None)`: `off`).
    pub zero_copy_min: Option<Option<usize>>,
    /// `TREECAST_STRIPE_STALL`: how long a connection of a striped link may stall.
    pub stripe_stall: Option<Duration>,
    /// `TREECAST_RAILS`: the rails striped links spread over, comma-separated.
    pub rails: Vec<String>,
}

impl EnvSettings {
    /// Reads this process's environment.
    ///
    /// # Errors
    /// A set variable whose value is malformed or out of range, named with what it takes.
    pub fn read() -> anyhow::Result<EnvSettings> {
        EnvSettings::read_unless(&[])
    }

    /// Reads this process's environment but the variables in `overridden`, which flags
    /// of the command line replace (so a malformed one does not stop the command).
    ///
    /// # Errors
    /// As [`EnvSettings::read`].
    pub fn read_unless(overridden: &[&str]) -> anyhow::Result<EnvSettings> {
        unreadable()?;
        EnvSettings::from_lookup(|var| match overridden.contains(&var) {
            true => None,
            false => std::env::var(var).ok(),
        })
    }

    /// Reads the variables through `lookup` (the environment, or a table in tests).
    ///
    /// # Errors
    /// As [`EnvSettings::read`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<EnvSettings> {
        let secs = |var: &str, range, zero_off| -> anyhow::Result<Option<Option<Duration>>> {
            lookup(var)
                .map(|text| env::secs_in(var, &text, range, zero_off).map_err(anyhow::Error::msg))
                .transpose()
        };
        let startup_timeout = secs(env::STARTUP_TIMEOUT, env::STARTUP_SECS, false)?.flatten();
        let dead_after = secs(env::DEAD_AFTER, env::LIMIT_SECS, true)?;
        let rejoin_within = secs(env::REJOIN_WITHIN, env::LIMIT_SECS, true)?;
        let max_frame = lookup(env::MAX_FRAME).map(|text| max_frame(&text)).transpose()?;
        let max_control = lookup(env::MAX_CONTROL).map(|text| max_control(&text)).transpose()?;
        let unix_links = match lookup(env::ROUTE).as_deref().map(str::trim) {
            None => None,
            Some("unix") => Some(true),
            Some("tcp") => Some(false),
            Some(other) => anyhow::bail!(
                "{}={other:?} is not `unix` or `tcp` (how processes of one host are linked)",
                env::ROUTE
            ),
        };
        let remote_listen = match lookup(env::LISTEN) {
            None => None,
            Some(text) => Some(text.trim().parse::<IpAddr>().map_err(|_| {
                anyhow::anyhow!(
                    "{}={text:?} is not an IP address (where children on other hosts connect)",
                    env::LISTEN
                )
            })?),
        };
        let udp: Vec<(String, String)> =
            UDP_VARIABLES.iter().filter_map(|&k| lookup(k).map(|v| (k.to_owned(), v))).collect();
        // Checked here, naming the variable, rather than when the network launches.
        McastConfig::from_env(|k| udp.iter().find(|(s, _)| s == k).map(|(_, v)| v.clone()))
            .map_err(anyhow::Error::msg)?;
        let log = lookup(env::LOG).map(|text| log_filter(&text)).transpose()?;
        let treecast_path = match lookup(TREECAST_PATH) {
            Some(p) if p.is_empty() => anyhow::bail!(
                "{TREECAST_PATH} is set but empty: name the program comm nodes run, or unset it"
            ),
            p => p.map(Into::into),
        };
        let clock = env::clock_plan_from(&lookup).map_err(anyhow::Error::msg)?;
        let zero_copy_min = lookup(env::ZERO_COPY_MIN)
            .map(|t| env::zero_copy_min_in(&t))
            .transpose()
            .map_err(anyhow::Error::msg)?;
        Ok(EnvSettings {
            startup_timeout,
            max_frame,
            max_control,
            dead_after,
            rejoin_within,
            unix_links,
            remote_listen,
            log,
            udp,
            clock,
            treecast_path,
            zero_copy_min,
            stripe_stall: stripe_stall_from(&lookup)?,
            rails: rails_from(&lookup)?,
        })
    }

    /// `builder` with what the environment set; the rest stays as the builder has it.
    pub fn apply(&self, mut builder: NetworkBuilder) -> NetworkBuilder {
        if let Some(limit) = self.startup_timeout {
            builder = builder.startup_timeout(limit);
        }
        if let Some(bytes) = self.max_frame {
            builder = builder.max_frame(bytes);
        }
        if let Some(bytes) = self.max_control {
            builder = builder.max_control(bytes);
        }
        if let Some(limit) = self.dead_after {
            builder = builder.dead_after(limit);
        }
        if let Some(limit) = self.rejoin_within {
            builder = builder.rejoin_within(limit);
        }
        if let Some(unix) = self.unix_links {
            builder = builder.unix_links(unix);
        }
        if let Some(addr) = self.remote_listen {
            builder = builder.remote_listen(addr);
        }
        if let Some(filter) = &self.log {
            builder = builder.log_filter(filter.clone());
        }
        for (name, value) in &self.udp {
            builder = builder.udp_setting(name.clone(), value.clone());
        }
        if let Some(path) = &self.treecast_path {
            builder = builder.treecast_path(path);
        }
        if let Some(bytes) = self.zero_copy_min {
            builder = builder.zero_copy_min(bytes);
        }
        if let Some(limit) = self.stripe_stall {
            builder = builder.stripe_stall(limit);
        }
        if !self.rails.is_empty() {
            builder = builder.rails(self.rails.clone());
        }
        builder.clock(self.clock.clone())
    }
}

/// The value of the variable `name`, `None` when unset.
///
/// # Errors
/// It is set but not UTF-8 text (never taken for unset).
pub fn var(name: &str) -> anyhow::Result<Option<String>> {
    match std::env::var(name) {
        Ok(text) => Ok(Some(text)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("{name} is set but is not UTF-8 text"),
    }
}

/// Refuses a `TREECAST_*` variable whose value is not UTF-8, which reading it as
/// text would take for unset.
fn unreadable() -> anyhow::Result<()> {
    for (name, value) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("TREECAST_")) && value.to_str().is_none() {
            anyhow::bail!("{} is set but is not UTF-8 text", name.to_string_lossy());
        }
    }
    Ok(())
}

/// `TREECAST_STRIPE_STALL` through `lookup`, as the time it asks for; `None` when unset.
///
/// # Errors
/// Not a number of seconds in [`stall::LIMIT_RANGE`], said with the variable.
pub fn stripe_stall_from(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Duration>> {
    let Some(text) = lookup(stall::STALL_ENV) else { return Ok(None) };
    let (min, max) = (stall::LIMIT_RANGE.start().as_secs_f64(), stall::LIMIT_RANGE.end().as_secs_f64());
    env::secs_in(stall::STALL_ENV, &text, min..=max, false).map_err(|e| {
        anyhow::anyhow!(
            "{e}: how long a connection of a striped link may hold bytes without delivering any \
                 while another one moves (default {} s)",
            stall::DEFAULT_LIMIT.as_secs()
        )
    })
}

/// `TREECAST_RAILS` through `lookup`: the rails, each checked; empty when unset.
///
/// # Errors
/// A rail that is neither a subnet nor an interface name, an empty one, or more
/// than [`treecast_wire::MAX_RAILS`], said with the variable.
pub fn rails_from(lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Vec<String>> {
    let var = env::RAILS;
    let Some(text) = lookup(var) else { return Ok(Vec::new()) };
    let rails: Vec<String> = text.split(',').map(|r| r.trim().to_owned()).collect();
    if rails.iter().any(String::is_empty) {
        anyhow::bail!(
            "{var}={text:?}: give 1 to {} rails, comma-separated, none empty (as \
             10.1.0.0/16,10.2.0.0/16 or ib0,ib1)",
            treecast_wire::MAX_RAILS
        );
    }
    check_rails(&rails).map_err(|e| anyhow::anyhow!("{var}: {e}"))?;
    Ok(rails)
}

/// `TREECAST_LOG`'s value, checked as a whole: a directive the filter cannot parse
/// is an error, not dropped (the filter every process of the tree is started with).
///
/// # Errors
/// A directive tracing's filter syntax refuses, named with the variable.
pub fn log_filter(text: &str) -> anyhow::Result<String> {
    match tracing_subscriber::EnvFilter::try_new(text) {
        Ok(_) => Ok(text.to_owned()),
        Err(e) => anyhow::bail!(
            "{}={text:?} is not a log filter ({e}); write levels and targets such as `warn` or \
             `info,treecast_driver=debug`",
            env::LOG
        ),
    }
}

/// `TREECAST_MAX_FRAME`'s value as a number of bytes the builder accepts.
fn max_frame(text: &str) -> anyhow::Result<usize> {
    let (min, max) = (NetworkBuilder::MIN_MAX_FRAME, treecast_wire::MAX_PAYLOAD_LEN);
    match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => anyhow::bail!(
            "{}={text:?} is not a number of bytes from {min} to {max}: every frame, a file chunk or the \
             launch plan, must fit in it (default {})",
            env::MAX_FRAME,
            treecast_driver::DEFAULT_MAX_FRAME
        ),
    }
}

/// `TREECAST_MAX_CONTROL`'s value as a number of bytes the builder accepts.
fn max_control(text: &str) -> anyhow::Result<usize> {
    let (min, max) = (NetworkBuilder::MIN_MAX_CONTROL, treecast_wire::MAX_PAYLOAD_LEN);
    match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => anyhow::bail!(
            "{}={text:?} is not a number of bytes from {min} to {max}: the largest control frame a \
             child may send, per back-end it reaches (default {})",
            env::MAX_CONTROL,
            treecast_wire::DEFAULT_MAX_CONTROL
        ),
    }
}

/// A builder for `topology` with this process's `TREECAST_*` variables applied.
///
/// # Errors
/// A malformed variable (see [`EnvSettings::read`]).
pub fn builder(topology: treecast_api::Topology) -> anyhow::Result<NetworkBuilder> {
    builder_unless(topology, &[])
}

/// As [`builder`], leaving out the variables in `overridden`, which flags replace.
///
/// # Errors
/// As [`builder`].
pub fn builder_unless(
    topology: treecast_api::Topology,
    overridden: &[&str],
) -> anyhow::Result<NetworkBuilder> {
    Ok(EnvSettings::read_unless(overridden)?.apply(NetworkBuilder::new(topology)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> anyhow::Result<EnvSettings> {
        EnvSettings::from_lookup(|k| vars.iter().find(|(v, _)| *v == k).map(|(_, x)| (*x).to_owned()))
    }

    #[test]
    fn rails_are_read_and_a_malformed_one_is_named() {
        let s = read(&[("TREECAST_RAILS", "10.203.16.0/24, ib1")]).unwrap();
        assert_eq!(s.rails, ["10.203.16.0/24", "ib1"]);
        for bad in ["10.1.0.0/40", "ib0,,ib1", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q"] {
            let e = read(&[("TREECAST_RAILS", bad)]).unwrap_err().to_string();
            assert!(e.contains("TREECAST_RAILS"), "{e}");
        }
    }

    #[test]
    fn unset_variables_change_nothing() {
        assert_eq!(read(&[]).unwrap(), EnvSettings::default());
    }

    #[test]
    fn set_variables_are_read_and_zero_switches_limits_off() {
        let s = read(&[
            ("TREECAST_DEAD_AFTER", "0"),
            ("TREECAST_REJOIN_WITHIN", "2.5"),
            ("TREECAST_ROUTE", "tcp"),
            ("TREECAST_LISTEN", "10.1.2.3"),
            ("TREECAST_STARTUP_TIMEOUT", "12"),
            ("TREECAST_MAX_CONTROL", "1048576"),
            ("TREECAST_PATH", "/opt/wrapper"),
            ("TREECAST_ZERO_COPY_MIN", "65536"),
        ])
        .unwrap();
        assert_eq!(s.treecast_path, Some("/opt/wrapper".into()));
        assert_eq!(s.zero_copy_min, Some(Some(65536)));
        assert_eq!(read(&[("TREECAST_ZERO_COPY_MIN", "off")]).unwrap().zero_copy_min, Some(None));
        assert_eq!(s.max_control, Some(1 << 20));
        assert_eq!(s.dead_after, Some(None));
        assert_eq!(s.rejoin_within, Some(Some(Duration::from_millis(2500))));
        assert_eq!(s.unix_links, Some(false));
        assert_eq!(s.remote_listen, Some("10.1.2.3".parse().unwrap()));
        assert_eq!(s.startup_timeout, Some(Duration::from_secs(12)));
        let s = read(&[("TREECAST_STRIPE_STALL", "1.5"), ("TREECAST_LOG", "info,treecast_driver=debug")])
            .unwrap();
        assert_eq!(s.stripe_stall, Some(Duration::from_millis(1500)));
        assert_eq!(s.log.as_deref(), Some("info,treecast_driver=debug"));
    }

    #[test]
    fn clock_variables_become_the_plan_s_clock_settings() {
        let s = read(&[
            ("TREECAST_CLOCK_RESYNC", "60"),
            ("TREECAST_CLOCK_PROBES", "8"),
            ("TREECAST_CLOCK_PROBE_GAP_MS", "0.5"),
            ("TREECAST_CLOCK_DISTORT", "seed:1,offset_us:10"),
        ])
        .unwrap();
        let expected = treecast_api::ClockPlan {
            resync_ms: Some(60_000),
            probes: Some(8),
            probe_burst: None,
            probe_gap_us: Some(500),
            distort: "seed:1,offset_us:10".into(),
        };
        assert_eq!(s.clock, expected);
    }

    #[test]
    fn a_malformed_value_is_an_error_naming_its_variable_never_a_silent_default() {
        // Regression: TREECAST_ROUTE=udp and TREECAST_LISTEN=nowhere were taken silently.
        for (var, value) in [
            ("TREECAST_ROUTE", "udp"),
            ("TREECAST_LISTEN", "nowhere"),
            ("TREECAST_STARTUP_TIMEOUT", "1e20"),
            ("TREECAST_DEAD_AFTER", "1e-300"),
            ("TREECAST_MAX_FRAME", "1"),
            ("TREECAST_MAX_CONTROL", "1"),
            ("TREECAST_CLOCK_RESYNC", "soon"),
            ("TREECAST_CLOCK_PROBES", "0"),
            ("TREECAST_CLOCK_PROBE_BURST", "2000"),
            ("TREECAST_CLOCK_PROBE_GAP_MS", "-1"),
            ("TREECAST_CLOCK_DISTORT", "seed:1,skew:3"),
            ("TREECAST_ZERO_COPY_MIN", "100"),
            ("TREECAST_ZERO_COPY_MIN", "big"),
            ("TREECAST_STRIPE_STALL", "soon"),
            ("TREECAST_STRIPE_STALL", "0"),
            ("TREECAST_STRIPE_STALL", "1e9"),
            ("TREECAST_LOG", "info,[{"),
            ("TREECAST_UDP_FRAGMENT", "9"),
            ("TREECAST_UDP_GSO", "yes"),
            ("TREECAST_PATH", ""),
        ] {
            let e = read(&[(var, value)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(value), "{var}={value}: {e}");
        }
    }
}
