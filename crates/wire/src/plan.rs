//! The launch plan: everything a comm node needs to start its sub-tree, in one
//! versioned message, so the environment carries only the secret, the parent's
//! address and the node's identity.

use crate::codec::{put_string, put_strings, strings, Reader};
use crate::control::decode_bool;
use crate::frame::MAX_PAYLOAD_U32;
use crate::DecodeError;

/// Version of the [`LaunchPlan`] layout this build writes and reads.
pub const PLAN_VERSION: u16 = 12;

/// Default of [`LaunchPlan::max_control`] (4 MiB per back-end a child reaches): a
/// back-end's own monitoring report at its cell limit stays under it, and what a
/// child's control frames may make its parent hold grows with the child's sub-tree,
/// as its legitimate reports (joins, attach points, monitoring) do.
pub const DEFAULT_MAX_CONTROL: u32 = 4 << 20;
/// Version of the [`MemberPlan`] layout this build writes and reads.
pub const MEMBER_PLAN_VERSION: u16 = 3;

/// Settings of the global clock a node measures with; `None`: the node's default.
/// The front-end's user sets them, and every plan carries them down.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ClockPlan {
    /// Milliseconds between re-synchronisations after the first two rounds.
    pub resync_ms: Option<u32>,
    /// Probes per round.
    pub probes: Option<u32>,
    /// Probes of a round sent back to back.
    pub probe_burst: Option<u32>,
    /// Microseconds between the bursts of a round.
    pub probe_gap_us: Option<u32>,
    /// The clock-distortion test knob (`TREECAST_CLOCK_DISTORT`'s syntax; empty: none):
    /// each node draws its own distortion from it by its node id.
    pub distort: String,
}

/// Which spawned group a back-end belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupPlace {
    /// The group's id (its spawn's).
    pub group: u32,
    /// The back-end's rank within its group (0 for the group's first).
    pub rank: u32,
    /// Number of back-ends in the group.
    pub size: u32,
}

/// What a parent hands a new back-end when its link is up: who it is and the
/// network's limits, so that a back-end reads nothing but its parent's address,
/// its node id, the session and the secret from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberPlan {
    /// Node id of the receiver (it authenticated as this).
    pub node_id: u32,
    /// The receiver's back-end rank.
    pub rank: u32,
    /// Number of back-ends in the network.
    pub size: u32,
    /// A back-end started while the tree runs: its group (`None`: one of the tree's own).
    pub group: Option<GroupPlace>,
    /// Milliseconds between heartbeats on its link (0: none, and no silence limit).
    pub heartbeat_ms: u32,
    /// Milliseconds its link may stay silent before it is cut off as failed (0: never).
    pub dead_after_ms: u32,
    /// Milliseconds it has to rejoin the tree when its comm node is lost (0: no recovery).
    pub rejoin_ms: u32,
    /// The global clock's settings.
    pub clock: ClockPlan,
    /// Frames of at least this many bytes go to a local peer as a memory file (0: never).
    pub zero_copy_min: u32,
    /// Milliseconds a connection of a striped link may hold bytes without delivering
    /// any while another one moves (0: the route's default).
    pub stripe_stall_ms: u32,
}

/// Links between processes of one host: abstract Unix sockets or loopback TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalRoute {
    /// Abstract Unix sockets (the default).
    Unix,
    /// TCP on the plan's listen address.
    Tcp,
}

/// Name of the fork/exec launcher, this host only: another host name is an error.
pub const LOCAL_LAUNCHER: &str = "local";
/// Name of the launcher through the system `ssh`.
pub const SSH_LAUNCHER: &str = "ssh";
/// Name of the launcher by Slurm job steps (`srun`), for every child.
pub const SLURM_LAUNCHER: &str = "slurm";

/// The launcher a node uses for its children, with its options.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LauncherSpec {
    /// Which launcher, by the name every node's launcher registry knows it by
    /// ([`LOCAL_LAUNCHER`], [`SSH_LAUNCHER`], [`SLURM_LAUNCHER`], or one a tool
    /// registered): a new launcher is a name, not a change to the plan.
    pub name: String,
    /// The program (`ssh`, `srun`); empty for the local launcher.
    pub program: String,
    /// Extra arguments, already split (each survives every level as it is).
    pub args: Vec<String>,
    /// Seconds ssh may take to connect.
    pub connect_timeout_s: u32,
    /// Path of `treecast` on other hosts.
    pub remote_path: String,
    /// Shell text run on other hosts before the program, as a wrapper that runs it
    /// (MRNet's `XPLAT_REMCMD`); empty: none.
    pub remote_prefix: String,
}

/// What a parent hands a new comm node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Session id, shared by every process of the network.
    pub session: String,
    /// Node id of the receiver; its descendants follow in pre-order.
    pub node_id: u32,
    /// Rank of the first back-end of this sub-tree; the others follow in order.
    pub first_rank: u32,
    /// Number of back-ends in the whole network.
    pub total_backends: u32,
    /// The sub-tree rooted at the receiver, in the MRNet topology text format.
    pub topology: String,
    /// Back-end program and arguments; empty means the generic `treecast backend`.
    pub backend: Vec<String>,
    /// Extra environment for back-ends.
    pub env: Vec<(String, String)>,
    /// How long each level may take to start, in milliseconds.
    pub startup_timeout_ms: u32,
    /// Attach mode: milliseconds back-ends started by someone else have to connect (0: off).
    pub attach_ms: u32,
    /// Start without children that fail to start (they are reported lost).
    pub allow_missing: bool,
    /// Links to children on the same host.
    pub local_route: LocalRoute,
    /// Address TCP listeners for children on the same host bind to.
    pub listen: String,
    /// Address children on other hosts connect back to (empty: found from the route to them).
    pub remote_listen: String,
    /// How children are started.
    pub launcher: LauncherSpec,
    /// Largest frame payload a node accepts, in bytes.
    pub max_frame: u32,
    /// Log filter for comm nodes and back-ends (empty: their default).
    pub log: String,
    /// Milliseconds between heartbeats on every link (0: none, and no silence limit).
    pub heartbeat_ms: u32,
    /// Milliseconds a link may stay silent before it is cut off as failed (0: never).
    pub dead_after_ms: u32,
    /// Milliseconds the children of a lost comm node have to rejoin the tree under
    /// its parent before their ranks are reported lost (0: no recovery).
    pub rejoin_ms: u32,
    /// The multicast route over UDP for large downstream frames, with its
    /// `TREECAST_UDP_*` settings as the front-end read them (`None`: links carry everything).
    pub udp: Option<Vec<(String, String)>>,
    /// The receiver's depth in the whole tree (0: the front-end), which its filters are told.
    pub depth: u32,
    /// Plug-in filters (shared objects, by path on the receiver's host) every comm node
    /// loads before it takes part in a stream.
    pub filters: Vec<String>,
    /// Largest control frame payload a node accepts from a child, in bytes per
    /// back-end the child reaches (at least one), and never over `max_frame`.
    pub max_control: u32,
    /// The global clock's settings, for the receiver and everything below it.
    pub clock: ClockPlan,
    /// Frames of at least this many bytes go to a peer on the same host as a memory
    /// file instead of through the socket (0: never), for every node below.
    pub zero_copy_min: u32,
    /// Connections per link between the receiver and its children, and between
    /// them and theirs (0 or 1: one; more: striped links, up to [`MAX_STRIPES`]).
    pub stripes: u8,
    /// Links between the receiver and its children, and below, are opened as
    /// Multipath TCP where the kernel takes it (plain TCP where it refuses).
    pub mptcp: bool,
    /// Milliseconds a connection of a striped link may hold bytes without delivering
    /// any while another connection of the link moves, before it is given up, for
    /// every node below (0: the route's default).
    pub stripe_stall_ms: u32,
    /// The rails a striped link spreads its connections over, for the receiver and
    /// every node below: each an IP subnet (`10.1.0.0/16`) or an interface name
    /// (`ib0`) that every host of the tree has; a node listens for its children on
    /// its own address on each (empty: one address).
    pub rails: Vec<String>,
}

/// Most rails a plan may name (one per connection of the widest striped link).
pub const MAX_RAILS: usize = MAX_STRIPES as usize;

/// Longest launcher name a plan carries, bytes.
pub const MAX_LAUNCHER_NAME: usize = 64;

/// Most connections one striped link may have.
pub const MAX_STRIPES: u8 = 16;

fn put_pairs(out: &mut Vec<u8>, pairs: &[(String, String)]) {
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        put_string(out, k);
        put_string(out, v);
    }
}

fn pairs(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<(String, String)>, DecodeError> {
    let n = r.len_u32(what, r.remaining() / 8)?;
    (0..n).map(|_| Ok((r.string(what)?, r.string(what)?))).collect()
}

impl LauncherSpec {
    /// Fork/exec on this host only: the embedded default.
    pub fn local() -> LauncherSpec {
        LauncherSpec::named(LOCAL_LAUNCHER)
    }

    /// The launcher registered as `name`, with no options.
    pub fn named(name: impl Into<String>) -> LauncherSpec {
        LauncherSpec {
            name: name.into(),
            program: String::new(),
            args: Vec::new(),
            connect_timeout_s: 0,
            remote_path: String::new(),
            remote_prefix: String::new(),
        }
    }
}

impl LaunchPlan {
    /// A plan for a whole tree on this host, rooted at node 0: the local launcher, Unix
    /// links, 30 s per level, no attach mode, the largest frames the wire allows.
    pub fn local(session: impl Into<String>, topology: String, total_backends: u32) -> LaunchPlan {
        LaunchPlan {
            session: session.into(),
            node_id: 0,
            first_rank: 0,
            total_backends,
            topology,
            backend: Vec::new(),
            env: Vec::new(),
            startup_timeout_ms: 30_000,
            attach_ms: 0,
            allow_missing: false,
            local_route: LocalRoute::Unix,
            listen: String::new(),
            remote_listen: String::new(),
            launcher: LauncherSpec::local(),
            max_frame: MAX_PAYLOAD_U32,
            log: String::new(),
            heartbeat_ms: 1_000,
            dead_after_ms: 30_000,
            rejoin_ms: 0,
            udp: None,
            depth: 0,
            filters: Vec::new(),
            max_control: DEFAULT_MAX_CONTROL,
            clock: ClockPlan::default(),
            zero_copy_min: 0,
            stripes: 0,
            mptcp: false,
            stripe_stall_ms: 0,
            rails: Vec::new(),
        }
    }

    /// [`LaunchPlan::zero_copy_min`] as a size, `None` when off.
    pub fn zero_copy_min(&self) -> Option<usize> {
        zero_copy(self.zero_copy_min)
    }

    /// [`LaunchPlan::stripe_stall_ms`] as a time, `None` for the route's default.
    pub fn stripe_stall(&self) -> Option<std::time::Duration> {
        stall(self.stripe_stall_ms)
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&PLAN_VERSION.to_le_bytes());
        put_string(out, &self.session);
        for v in [self.node_id, self.first_rank, self.total_backends] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_string(out, &self.topology);
        put_strings(out, &self.backend);
        put_pairs(out, &self.env);
        out.extend_from_slice(&self.startup_timeout_ms.to_le_bytes());
        out.extend_from_slice(&self.attach_ms.to_le_bytes());
        out.push(u8::from(self.allow_missing));
        out.push(match self.local_route {
            LocalRoute::Unix => 0,
            LocalRoute::Tcp => 1,
        });
        put_string(out, &self.listen);
        put_string(out, &self.remote_listen);
        put_string(out, &self.launcher.name);
        put_string(out, &self.launcher.program);
        put_strings(out, &self.launcher.args);
        out.extend_from_slice(&self.launcher.connect_timeout_s.to_le_bytes());
        put_string(out, &self.launcher.remote_path);
        out.extend_from_slice(&self.max_frame.to_le_bytes());
        put_string(out, &self.log);
        out.extend_from_slice(&self.heartbeat_ms.to_le_bytes());
        out.extend_from_slice(&self.dead_after_ms.to_le_bytes());
        out.extend_from_slice(&self.rejoin_ms.to_le_bytes());
        out.push(u8::from(self.udp.is_some()));
        if let Some(settings) = &self.udp {
            put_pairs(out, settings);
        }
        out.extend_from_slice(&self.depth.to_le_bytes());
        put_strings(out, &self.filters);
        out.extend_from_slice(&self.max_control.to_le_bytes());
        self.clock.encode(out);
        out.extend_from_slice(&self.zero_copy_min.to_le_bytes());
        out.push(self.stripes);
        out.push(u8::from(self.mptcp));
        put_string(out, &self.launcher.remote_prefix);
        out.extend_from_slice(&self.stripe_stall_ms.to_le_bytes());
        put_strings(out, &self.rails);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<LaunchPlan, DecodeError> {
        let version = r.u16("launch plan version")?;
        if version != PLAN_VERSION {
            return Err(DecodeError::Invalid {
                what: "launch plan",
                detail: format!(
                    "version {version} is not supported (this build reads {PLAN_VERSION}); \
                     run the same treecast version on every host"
                ),
            });
        }
        let session = r.string("session")?;
        let node_id = r.u32("launch plan")?;
        let first_rank = r.u32("launch plan")?;
        let total_backends = r.u32("launch plan")?;
        let topology = r.string("sub-tree topology")?;
        let backend = strings(r, "back-end command")?;
        let env = pairs(r, "environment")?;
        let startup_timeout_ms = r.u32("launch plan")?;
        let attach_ms = r.u32("launch plan")?;
        let allow_missing = decode_bool(r, "allow missing")?;
        let local_route = match r.u8("local route")? {
            0 => LocalRoute::Unix,
            1 => LocalRoute::Tcp,
            other => return Err(invalid("local route", other)),
        };
        let listen = r.string("listen address")?;
        let remote_listen = r.string("remote listen address")?;
        let name = r.string("launcher name")?;
        if name.is_empty() || name.len() > MAX_LAUNCHER_NAME {
            return Err(DecodeError::Invalid {
                what: "launcher name",
                detail: format!("{} bytes, not 1 to {MAX_LAUNCHER_NAME}", name.len()),
            });
        }
        let launcher = LauncherSpec {
            name,
            program: r.string("launcher program")?,
            args: strings(r, "launcher argument")?,
            connect_timeout_s: r.u32("launcher")?,
            remote_path: r.string("remote path")?,
            // The last field of the plan: read in place below.
            remote_prefix: String::new(),
        };
        let mut plan = LaunchPlan {
            session,
            node_id,
            first_rank,
            total_backends,
            topology,
            backend,
            env,
            startup_timeout_ms,
            attach_ms,
            allow_missing,
            local_route,
            listen,
            remote_listen,
            launcher,
            max_frame: match r.u32("launch plan")? {
                n @ 1..=MAX_PAYLOAD_U32 => n,
                n => {
                    return Err(DecodeError::Invalid {
                        what: "launch plan",
                        detail: format!("largest frame {n} is not between 1 and {}", crate::MAX_PAYLOAD_LEN),
                    })
                }
            },
            log: r.string("log filter")?,
            heartbeat_ms: r.u32("heartbeat interval")?,
            dead_after_ms: r.u32("silence limit")?,
            rejoin_ms: r.u32("rejoin limit")?,
            udp: match decode_bool(r, "UDP route")? {
                true => Some(pairs(r, "UDP route setting")?),
                false => None,
            },
            depth: r.u32("depth")?,
            filters: strings(r, "plug-in filter path")?,
            max_control: match r.u32("launch plan")? {
                n @ 1..=MAX_PAYLOAD_U32 => n,
                n => {
                    return Err(DecodeError::Invalid {
                        what: "launch plan",
                        detail: format!(
                            "largest control frame {n} is not between 1 and {}",
                            crate::MAX_PAYLOAD_LEN
                        ),
                    })
                }
            },
            clock: ClockPlan::decode(r)?,
            zero_copy_min: r.u32("zero-copy threshold")?,
            stripes: match r.u8("connections per link")? {
                n @ 0..=MAX_STRIPES => n,
                n => {
                    return Err(DecodeError::Invalid {
                        what: "launch plan",
                        detail: format!(
                            "{n} connections per link is over the {MAX_STRIPES} a striped link may have"
                        ),
                    })
                }
            },
            mptcp: decode_bool(r, "Multipath TCP flag")?,
            stripe_stall_ms: 0,
            rails: Vec::new(),
        };
        plan.launcher.remote_prefix = r.string("remote prefix")?;
        plan.stripe_stall_ms = r.u32("stripe stall limit")?;
        plan.rails = strings(r, "rail")?;
        if plan.rails.len() > MAX_RAILS || plan.rails.iter().any(String::is_empty) {
            return Err(DecodeError::Invalid {
                what: "launch plan",
                detail: format!(
                    "{} rails, or an empty one: at most {MAX_RAILS}, none empty",
                    plan.rails.len()
                ),
            });
        }
        Ok(plan)
    }
}

fn put_option(out: &mut Vec<u8>, value: Option<u32>) {
    out.push(u8::from(value.is_some()));
    out.extend_from_slice(&value.unwrap_or(0).to_le_bytes());
}

fn option(r: &mut Reader<'_>, what: &'static str) -> Result<Option<u32>, DecodeError> {
    let set = decode_bool(r, what)?;
    let value = r.u32(what)?;
    Ok(set.then_some(value))
}

impl ClockPlan {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.resync_ms, self.probes, self.probe_burst, self.probe_gap_us] {
            put_option(out, v);
        }
        put_string(out, &self.distort);
    }

    fn decode(r: &mut Reader<'_>) -> Result<ClockPlan, DecodeError> {
        Ok(ClockPlan {
            resync_ms: option(r, "clock resync interval")?,
            probes: option(r, "clock probes")?,
            probe_burst: option(r, "clock probe burst")?,
            probe_gap_us: option(r, "clock probe gap")?,
            distort: r.string("clock distortion")?,
        })
    }
}

/// A stripe stall limit of the plans as a time (0: the route's default).
fn stall(ms: u32) -> Option<std::time::Duration> {
    (ms > 0).then(|| std::time::Duration::from_millis(ms.into()))
}

/// A zero-copy threshold of the plans as a size (0: off).
fn zero_copy(bytes: u32) -> Option<usize> {
    (bytes > 0).then_some(bytes as usize)
}

impl MemberPlan {
    /// [`MemberPlan::zero_copy_min`] as a size, `None` when off.
    pub fn zero_copy_min(&self) -> Option<usize> {
        zero_copy(self.zero_copy_min)
    }

    /// [`MemberPlan::stripe_stall_ms`] as a time, `None` for the route's default.
    pub fn stripe_stall(&self) -> Option<std::time::Duration> {
        stall(self.stripe_stall_ms)
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MEMBER_PLAN_VERSION.to_le_bytes());
        for v in [self.node_id, self.rank, self.size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(u8::from(self.group.is_some()));
        if let Some(g) = self.group {
            for v in [g.group, g.rank, g.size] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for v in [self.heartbeat_ms, self.dead_after_ms, self.rejoin_ms] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        self.clock.encode(out);
        out.extend_from_slice(&self.zero_copy_min.to_le_bytes());
        out.extend_from_slice(&self.stripe_stall_ms.to_le_bytes());
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<MemberPlan, DecodeError> {
        let version = r.u16("member plan version")?;
        if version != MEMBER_PLAN_VERSION {
            return Err(DecodeError::Invalid {
                what: "member plan",
                detail: format!(
                    "version {version} is not supported (this build reads {MEMBER_PLAN_VERSION}); \
                     run the same treecast version for the back-ends as for the tree"
                ),
            });
        }
        let (node_id, rank, size) = (r.u32("member plan")?, r.u32("member plan")?, r.u32("member plan")?);
        let group = match decode_bool(r, "member group")? {
            true => Some(GroupPlace { group: r.u32("group")?, rank: r.u32("group")?, size: r.u32("group")? }),
            false => None,
        };
        Ok(MemberPlan {
            node_id,
            rank,
            size,
            group,
            heartbeat_ms: r.u32("heartbeat interval")?,
            dead_after_ms: r.u32("silence limit")?,
            rejoin_ms: r.u32("rejoin limit")?,
            clock: ClockPlan::decode(r)?,
            zero_copy_min: r.u32("zero-copy threshold")?,
            stripe_stall_ms: r.u32("stripe stall limit")?,
        })
    }
}

fn invalid(what: &'static str, code: u8) -> DecodeError {
    DecodeError::Invalid { what, detail: format!("unknown code {code}") }
}

/// A plan with every field set, for tests.
#[cfg(test)]
pub(crate) fn sample_plan() -> LaunchPlan {
    LaunchPlan {
        session: "1f2e3d4c5b6a7988".into(),
        node_id: 1,
        first_rank: 0,
        total_backends: 4,
        topology: "localhost:1 => localhost:2 ;".into(),
        backend: vec!["/bin/tool".into(), "-v".into()],
        env: vec![("A".into(), "b".into())],
        startup_timeout_ms: 30_000,
        attach_ms: 0,
        allow_missing: true,
        local_route: LocalRoute::Tcp,
        listen: "127.0.0.1".into(),
        remote_listen: String::new(),
        launcher: LauncherSpec {
            name: SSH_LAUNCHER.into(),
            program: "ssh".into(),
            args: vec!["-o".into(), "ProxyCommand=ssh -W %h:%p gateway".into()],
            connect_timeout_s: 10,
            remote_path: "/opt/treecast".into(),
            remote_prefix: "/usr/bin/wrap --with 'two words'".into(),
        },
        max_frame: 64 << 20,
        log: "warn".into(),
        heartbeat_ms: 250,
        dead_after_ms: 5_000,
        rejoin_ms: 2_000,
        udp: Some(vec![("TREECAST_UDP_FRAGMENT".into(), "8000".into())]),
        depth: 1,
        filters: vec!["/opt/tool/libhistogram.so".into()],
        max_control: 1 << 20,
        clock: sample_clock(),
        zero_copy_min: 1 << 20,
        stripes: 2,
        mptcp: true,
        stripe_stall_ms: 1_500,
        rails: vec!["10.1.0.0/16".into(), "ib1".into()],
    }
}

#[cfg(test)]
fn sample_clock() -> ClockPlan {
    ClockPlan {
        resync_ms: Some(60_000),
        probes: None,
        probe_burst: Some(4),
        probe_gap_us: Some(0),
        distort: "seed:3,offset_us:500,drift_ppm:20".into(),
    }
}

/// A member plan with every field set, for tests.
#[cfg(test)]
pub(crate) fn sample_member_plan() -> MemberPlan {
    MemberPlan {
        node_id: 12,
        rank: 7,
        size: 16,
        group: Some(GroupPlace { group: 2, rank: 1, size: 4 }),
        heartbeat_ms: 250,
        dead_after_ms: 1_000,
        rejoin_ms: 0,
        clock: sample_clock(),
        zero_copy_min: 65_536,
        stripe_stall_ms: 250,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ControlMsg;

    #[test]
    fn a_plan_from_another_version_is_refused_by_name() {
        let mut bytes = ControlMsg::Plan(Box::new(sample_plan())).encode();
        bytes[1] = 10; // the version follows the tag byte
        let err = ControlMsg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("version 10 is not supported"), "{err}");
    }

    #[test]
    fn a_launcher_is_named_by_any_name_its_registry_may_know() {
        let mut plan = sample_plan();
        plan.launcher = LauncherSpec::named("flux");
        let ControlMsg::Plan(back) =
            ControlMsg::decode(&ControlMsg::Plan(Box::new(plan.clone())).encode()).unwrap()
        else {
            panic!("not a plan")
        };
        assert_eq!(back.launcher.name, "flux");
        for bad in [String::new(), "x".repeat(MAX_LAUNCHER_NAME + 1)] {
            plan.launcher.name = bad;
            let err = ControlMsg::decode(&ControlMsg::Plan(Box::new(plan.clone())).encode()).unwrap_err();
            assert!(err.to_string().contains("launcher name"), "{err}");
        }
    }

    #[test]
    fn a_member_plan_from_another_version_is_refused_by_name() {
        let mut bytes = ControlMsg::MemberPlan(Box::new(sample_member_plan())).encode();
        bytes[1] = 9; // the version follows the tag byte
        let err = ControlMsg::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("member plan") && err.contains("version 9 is not supported"), "{err}");
    }

    #[test]
    fn arguments_with_spaces_survive_as_they_are() {
        let plan = sample_plan();
        let ControlMsg::Plan(back) =
            ControlMsg::decode(&ControlMsg::Plan(Box::new(plan.clone())).encode()).unwrap()
        else {
            panic!("not a plan")
        };
        assert_eq!(back.launcher.args[1], "ProxyCommand=ssh -W %h:%p gateway");
        assert_eq!(*back, plan);
    }
}
