//! The front-end: options, launching a tree, communicators and events.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use treecast_api::{
    Communicator, Event, Network, NetworkBuilder, RankSet, SrunOptions, SshOptions, Topology,
};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{
    arg, block_on, block_on_for, c_text, handle, opt_text, out_ok, put, ran_out, take, text, TC_FOREVER,
};

/// How a tree is to be launched: made by `tc_network_options_new`, set by the
/// `tc_network_options_set_*` calls, read by `tc_network_launch`, freed by
/// `tc_network_options_free`. Not for use from several threads at once.
#[allow(non_camel_case_types)]
#[derive(Default)]
pub struct tc_network_options {
    topology: Option<Topology>,
    backend: Vec<String>,
    treecast_path: Option<PathBuf>,
    dead_after: Option<Option<Duration>>,
    rejoin: Option<Option<Duration>>,
    attach: Option<(PathBuf, Duration)>,
    startup_timeout: Option<Duration>,
    env: Vec<(String, String)>,
    plugins: Vec<PathBuf>,
    launcher: Launcher,
    /// The ssh launcher's program, extra arguments and remote prefix
    /// (`tc_network_options_set_ssh`).
    ssh: Option<(String, Vec<String>, String)>,
    unix_links: Option<bool>,
    udp_route: bool,
    /// Connections per link (`"striped:N"`); 0: one.
    stripes: u8,
    /// How long a striped connection may hold bytes without delivering any while
    /// another moves (`tc_network_options_set_stripe_stall`).
    stripe_stall: Option<Duration>,
    /// The rails striped links spread over (`tc_network_options_set_rails`).
    rails: Vec<String>,
    mptcp: bool,
    send_limit_ms: Option<u64>,
}

#[derive(Default)]
enum Launcher {
    #[default]
    Local,
    Ssh,
    Slurm,
}

/// A running tree, seen from its front-end. Every call taking it may be made from
/// several threads at once; `tc_network_free` (which shuts the tree down) must be the
/// last, after every stream and communicator made from it is freed.
#[allow(non_camel_case_types)]
pub struct tc_network {
    pub(crate) net: Network,
    /// Versions of the plug-in filters loaded, by name, for streams that name them.
    pub(crate) plugins: Mutex<HashMap<String, u16>>,
    /// The descriptor of `tc_network_fd`, once asked for.
    pub(crate) ready: crate::readyfd::ReadySlot,
    /// How long a blocking send on one of its streams waits for room, milliseconds.
    pub(crate) send_limit_ms: u64,
}

/// A set of back-end ranks streams are made over; immutable, usable from any thread.
#[allow(non_camel_case_types)]
pub struct tc_communicator {
    pub(crate) comm: Communicator,
}

/// Something that happened in the tree besides data (a lost rank, a rejoin, a filter
/// error); read with the `tc_event_*` getters, freed with `tc_event_free`.
#[allow(non_camel_case_types)]
pub struct tc_event {
    event: Event,
    ranks: CString,
    text: CString,
}

/// No event (what `tc_event_kind` returns for NULL).
pub const TC_EVENT_NONE: u32 = 0;
/// Back-ends can no longer be reached; waves complete without them.
pub const TC_EVENT_RANKS_LOST: u32 = 1;
/// A comm node was lost; the ranks below it are awaited back.
pub const TC_EVENT_NODE_LOST: u32 = 2;
/// Ranks orphaned by a lost comm node rejoined the tree.
pub const TC_EVENT_RANKS_REJOINED: u32 = 3;
/// Back-ends joined while the tree runs (spawned).
pub const TC_EVENT_RANKS_JOINED: u32 = 4;
/// Back-ends left on purpose.
pub const TC_EVENT_RANKS_LEFT: u32 = 5;
/// A filter refused a packet (`tc_event_stream` and `tc_event_rank` say where).
pub const TC_EVENT_FILTER_ERROR: u32 = 6;
/// A node could not make a stream's filters; the stream is closed.
pub const TC_EVENT_STREAM_REFUSED: u32 = 7;
/// A message between back-ends found no way to its destination.
pub const TC_EVENT_MESSAGE_UNDELIVERABLE: u32 = 8;
/// The link to another network closed.
pub const TC_EVENT_NETWORK_CLOSED: u32 = 9;
/// An event of a kind this version of the header does not name.
pub const TC_EVENT_OTHER: u32 = 255;

/// A limit that `TC_FOREVER` switches off.
fn ms(ms: u64) -> Option<Duration> {
    (ms != TC_FOREVER).then(|| crate::ffi::duration(ms))
}

/// Runs `set` on the options behind `options`.
///
/// # Safety
/// `options` is NULL or live options used by no other thread.
unsafe fn with_options(
    what: &str,
    options: *mut tc_network_options,
    set: impl FnOnce(&mut tc_network_options) -> Result<(), Failure>,
) -> tc_result {
    guard(what, || {
        // SAFETY: as the caller promised.
        let o = unsafe { options.as_mut() }.ok_or_else(|| crate::ffi::null("options"))?;
        set(o)
    })
}

/// New launch options: no topology yet, the generic back-end, local processes.
#[no_mangle]
pub extern "C" fn tc_network_options_new() -> *mut tc_network_options {
    quiet(std::ptr::null_mut(), || handle(tc_network_options::default()))
}

/// Frees launch options; NULL is ignored.
///
/// # Safety
/// `options` is NULL or options not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_free(options: *mut tc_network_options) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(options) }));
}

/// The tree's shape from a generator, e.g. `"balanced:4x4"`, `"flat"` or `"kary:8"`
/// with `backends` back-ends (0: what the shape implies).
///
/// # Safety
/// `options` is NULL or live options; `spec` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_topology(
    options: *mut tc_network_options,
    spec: *const c_char,
    backends: u32,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_topology", options, |o| {
            let spec = text(spec, "spec")?;
            let n = (backends > 0).then_some(backends as usize);
            o.topology = Some(Topology::from_spec(spec, n).map_err(treecast_api::ApiError::from)?);
            Ok(())
        })
    }
}

/// The tree's shape from a topology file in MRNet's format; a bad file is refused
/// with the line and column of what is wrong.
///
/// # Safety
/// `options` is NULL or live options; `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_topology_file(
    options: *mut tc_network_options,
    path: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_topology_file", options, |o| {
            let path = text(path, "path")?;
            let body = std::fs::read_to_string(path).map_err(|e| {
                Failure::new(tc_result::TC_ERR_INVALID, format!("cannot read the topology file {path}: {e}"))
            })?;
            let topology = Topology::parse(&body).map_err(|e| {
                Failure::new(tc_result::TC_ERR_INVALID, format!("the topology file {path}: {e}"))
            })?;
            o.topology = Some(topology);
            Ok(())
        })
    }
}

/// The tree over a host list in pdsh's syntax, e.g. `"node[01-64]"` (`-x` style
/// exclusions are not taken here): `per_host` back-ends on each host (0: 1), comm
/// nodes with at most `fanout` children (0: 16), placed on the hosts below them.
///
/// # Safety
/// `options` is NULL or live options; `hosts` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_hosts(
    options: *mut tc_network_options,
    hosts: *const c_char,
    fanout: u32,
    per_host: u32,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_hosts", options, |o| {
            let list = text(hosts, "hosts")?;
            let names = treecast_topology::hostlist::expand(list).map_err(|e| {
                Failure::new(tc_result::TC_ERR_INVALID, format!("the host list {list:?}: {e}"))
            })?;
            let fanout = if fanout == 0 { 16 } else { fanout as usize };
            let per_host = per_host.max(1) as usize;
            let me = treecast_launch::this_host_name();
            let topology = Topology::from_hosts(&names, fanout, per_host, &me).map_err(|e| {
                Failure::new(tc_result::TC_ERR_INVALID, format!("the host list {list:?}: {e}"))
            })?;
            o.topology = Some(topology);
            Ok(())
        })
    }
}

/// How processes on one host link: `"unix"` (Unix sockets, the default) or `"tcp"`;
/// `"udp"` adds the reliable UDP multicast route for files (docs/multicast.md);
/// `"striped:N"` carries every link over N connections (2 to 16), large frames cut
/// across them, and `"mptcp"` opens links by Multipath TCP, plain TCP where the
/// kernel refuses it (docs/routes.md). Each call sets one of these.
///
/// # Safety
/// `options` is NULL or live options; `route` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_route(
    options: *mut tc_network_options,
    route: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_route", options, |o| {
            match text(route, "route")? {
                "unix" => o.unix_links = Some(true),
                "tcp" => o.unix_links = Some(false),
                "udp" => o.udp_route = true,
                "mptcp" => o.mptcp = true,
                other => o.stripes = stripes(other)?,
            }
            Ok(())
        })
    }
}

/// The N of a `"striped:N"` route, 2 to 16.
fn stripes(route: &str) -> Result<u8, Failure> {
    let max = treecast_api::MAX_STRIPES;
    match route.strip_prefix("striped:").map(str::parse::<u8>) {
        Some(Ok(n)) if (2..=max).contains(&n) => Ok(n),
        Some(_) => Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            format!("route {route:?}: striped:N takes N from 2 to {max}"),
        )),
        None => Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            format!("no route {route:?}: use \"unix\", \"tcp\", \"udp\", \"striped:N\" or \"mptcp\""),
        )),
    }
}

/// The command every back-end runs, `argv[0..argc]` (default: treecast's generic back-end).
///
/// # Safety
/// `options` is NULL or live options; `argv` points to `argc` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_backend(
    options: *mut tc_network_options,
    argv: *const *const c_char,
    argc: usize,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_backend", options, |o| {
            o.backend = crate::ffi::command(argv, argc)?;
            Ok(())
        })
    }
}

/// The `treecast` program comm nodes run (default: `TREECAST_PATH`, then beside
/// this program, then on `PATH`; a `TREECAST_PATH` set but empty makes
/// tc_network_launch fail with TC_ERR_INVALID, naming it); with the ssh or Slurm launcher, the same path on
/// every host (default there: `treecast` on the remote `PATH`).
///
/// # Safety
/// `options` is NULL or live options; `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_treecast_path(
    options: *mut tc_network_options,
    path: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_treecast_path", options, |o| {
            o.treecast_path = Some(text(path, "path")?.into());
            Ok(())
        })
    }
}

/// How processes start: `"local"` (default), `"ssh"` or `"slurm"` (their default options).
///
/// # Safety
/// `options` is NULL or live options; `name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_launcher(
    options: *mut tc_network_options,
    name: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_launcher", options, |o| {
            o.launcher = match text(name, "name")? {
                "local" => Launcher::Local,
                "ssh" => Launcher::Ssh,
                "slurm" => Launcher::Slurm,
                other => {
                    return Err(Failure::new(
                        tc_result::TC_ERR_INVALID,
                        format!("no launcher {other:?}: use \"local\", \"ssh\" or \"slurm\""),
                    ))
                }
            };
            Ok(())
        })
    }
}

/// Starts processes on other hosts through `program` (NULL or empty: `ssh`) with
/// `args` before the host (NULL: none; split as a shell would, so quoted words with
/// spaces stay whole), at every level of the tree; selects the `"ssh"` launcher. The
/// program is called as ssh is: `program -o BatchMode=yes -o ConnectTimeout=10 ARGS
/// -- HOST COMMAND` (and `... -G -- HOST` to learn the host's address), so a
/// stand-in must accept those. `remote_prefix` (NULL or empty: none) is shell text
/// the remote command runs first, a wrapper that runs the program (MRNet's
/// `XPLAT_REMCMD`): `exec PREFIX env VAR=... PROGRAM ARGS`.
///
/// # Safety
/// `options` is NULL or live options; `program`, `args` and `remote_prefix` are NULL
/// or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_ssh(
    options: *mut tc_network_options,
    program: *const c_char,
    args: *const c_char,
    remote_prefix: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_ssh", options, |o| {
            let program =
                crate::ffi::opt_text(program, "program")?.filter(|p| !p.is_empty()).unwrap_or("ssh");
            let args = match crate::ffi::opt_text(args, "args")? {
                Some(text) => treecast_launch::split_args(text).map_err(|e| {
                    Failure::new(tc_result::TC_ERR_INVALID, e.from("the ssh arguments").to_string())
                })?,
                None => Vec::new(),
            };
            let prefix = crate::ffi::opt_text(remote_prefix, "remote_prefix")?.unwrap_or("");
            o.ssh = Some((program.to_owned(), args, prefix.to_owned()));
            o.launcher = Launcher::Ssh;
            Ok(())
        })
    }
}

/// Cuts off a node silent for `ms` milliseconds (`TC_FOREVER`: never; default 30 s).
///
/// # Safety
/// `options` is NULL or live options.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_dead_after(
    options: *mut tc_network_options,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_dead_after", options, |o| {
            o.dead_after = Some(self::ms(ms));
            Ok(())
        })
    }
}

/// On striped links (`tc_network_options_set_route(o, "striped:N")`), gives up a
/// connection that holds bytes and delivers none for `ms` milliseconds while another
/// connection of the link moves (a rail that went down): its pieces go on the
/// others. 10 ms to one hour; default 5 s. Checked when the network is launched
/// (`TC_ERR_INVALID` then, naming the range).
///
/// # Safety
/// `options` is NULL or live options.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_stripe_stall(
    options: *mut tc_network_options,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_stripe_stall", options, |o| {
            o.stripe_stall = Some(Duration::from_millis(ms.min(u64::from(u32::MAX))));
            Ok(())
        })
    }
}

/// On striped links (`tc_network_options_set_route(o, "striped:N")`), spreads each
/// link's connections over `rails`, comma-separated, connection `i` on rail `i`
/// modulo their number: each an IP subnet (`"10.1.0.0/16"`) or an interface name
/// (`"ib1"`) every host of the tree has. Each node listens for children on other
/// hosts on its own address on each rail (docs/routes.md). At most 16; NULL or `""`:
/// one address. `TC_ERR_INVALID` for a rail that is neither.
///
/// # Safety
/// `options` is NULL or live options; `rails` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_rails(
    options: *mut tc_network_options,
    rails: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_rails", options, |o| {
            let list = opt_text(rails, "rails")?.unwrap_or_default();
            let rails: Vec<String> =
                list.split(',').map(str::trim).filter(|r| !r.is_empty()).map(str::to_owned).collect();
            treecast_api::check_rails(&rails)
                .map_err(|e| Failure::new(tc_result::TC_ERR_INVALID, e.to_string()))?;
            o.rails = rails;
            Ok(())
        })
    }
}

/// How long the orphans of a lost comm node may take to rejoin, in milliseconds
/// (`TC_FOREVER`: recovery off).
///
/// # Safety
/// `options` is NULL or live options.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_rejoin(
    options: *mut tc_network_options,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_rejoin", options, |o| {
            o.rejoin = Some(self::ms(ms));
            Ok(())
        })
    }
}

/// Attach mode: launch the comm nodes only, write the attach file at `path`, and
/// wait up to `ms` milliseconds for back-ends started by someone else to connect.
///
/// # Safety
/// `options` is NULL or live options; `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_attach(
    options: *mut tc_network_options,
    path: *const c_char,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_attach", options, |o| {
            o.attach = Some((text(path, "path")?.into(), crate::ffi::duration(ms)));
            Ok(())
        })
    }
}

/// How long each level of the tree may take to start, in milliseconds (default 30 s).
///
/// # Safety
/// `options` is NULL or live options.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_startup_timeout(
    options: *mut tc_network_options,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_startup_timeout", options, |o| {
            o.startup_timeout = Some(crate::ffi::duration(ms));
            Ok(())
        })
    }
}

/// How long a blocking send (`tc_stream_send` and kin) waits for room in its
/// stream's window before it fails with `TC_ERR_TIMEOUT`, sending nothing
/// (`TC_FOREVER`: as long as it takes; default 60 s).
///
/// # Safety
/// `options` is NULL or live options.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_send_timeout(
    options: *mut tc_network_options,
    ms: u64,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_send_timeout", options, |o| {
            o.send_limit_ms = Some(ms);
            Ok(())
        })
    }
}

/// An environment variable every process of the tree gets.
///
/// # Safety
/// `options` is NULL or live options; `name` and `value` are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_set_env(
    options: *mut tc_network_options,
    name: *const c_char,
    value: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_set_env", options, |o| {
            o.env.push((text(name, "name")?.to_owned(), text(value, "value")?.to_owned()));
            Ok(())
        })
    }
}

/// A plug-in filter (a shared object, see docs/filter-abi.md) every node loads by
/// path at start-up (for shared file systems; `tc_network_load_filter` ships it instead).
///
/// # Safety
/// `options` is NULL or live options; `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_options_add_plugin(
    options: *mut tc_network_options,
    path: *const c_char,
) -> tc_result {
    // SAFETY: as the caller promised.
    unsafe {
        with_options("tc_network_options_add_plugin", options, |o| {
            o.plugins.push(text(path, "path")?.into());
            Ok(())
        })
    }
}

/// The one variable the C API reads, and only when the tool named no program.
const TREECAST_PATH: &str = "TREECAST_PATH";

/// `TREECAST_PATH`'s value as the program comm nodes run; `None` when unset.
fn treecast_path_from(value: Option<std::ffi::OsString>) -> Result<Option<PathBuf>, Failure> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() => Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            "TREECAST_PATH is set but empty: name the treecast program comm nodes run \
             (or call tc_network_options_set_treecast_path), or unset it",
        )),
        Some(v) => Ok(Some(v.into())),
    }
}

fn builder(o: &tc_network_options) -> Result<NetworkBuilder, Failure> {
    let topology = o.topology.clone().ok_or_else(|| {
        Failure::new(
            tc_result::TC_ERR_INVALID,
            "no topology: call tc_network_options_set_topology or tc_network_options_set_topology_file first",
        )
    })?;
    let mut b = NetworkBuilder::new(topology);
    if !o.backend.is_empty() {
        b = b.backend_command(o.backend.iter().cloned());
    }
    // The C API, like the `treecast` command, honours TREECAST_PATH when the tool
    // named no program: a C tool has no binary in front of it to read its
    // environment, so this layer does, strictly (the Rust library below reads none).
    let path = match &o.treecast_path {
        Some(path) => Some(path.clone()),
        None => treecast_path_from(std::env::var_os(TREECAST_PATH))?,
    };
    if let Some(path) = path {
        b = b.treecast_path(path);
    }
    if let Some(limit) = o.dead_after {
        b = b.dead_after(limit);
    }
    if let Some(limit) = o.rejoin {
        b = b.rejoin_within(limit);
    }
    if let Some((path, limit)) = &o.attach {
        b = b.attach(path, *limit);
    }
    if let Some(limit) = o.startup_timeout {
        b = b.startup_timeout(limit);
    }
    for (name, value) in &o.env {
        b = b.env(name, value);
    }
    for path in &o.plugins {
        b = b.plugin(path);
    }
    if let Some(unix) = o.unix_links {
        b = b.unix_links(unix);
    }
    if o.udp_route {
        b = b.udp_route(true);
    }
    if o.stripes > 1 {
        b = b.stripes(o.stripes);
    }
    if let Some(limit) = o.stripe_stall {
        b = b.stripe_stall(limit);
    }
    if !o.rails.is_empty() {
        b = b.rails(o.rails.clone());
    }
    if o.mptcp {
        b = b.mptcp(true);
    }
    Ok(match o.launcher {
        Launcher::Local => b,
        Launcher::Ssh => {
            let mut ssh = SshOptions::default();
            if let Some((program, args, prefix)) = &o.ssh {
                ssh.program.clone_from(program);
                ssh.args.clone_from(args);
                ssh.remote_prefix.clone_from(prefix);
            }
            // The program the comm nodes run, at the same path on every host.
            if let Some(path) = &o.treecast_path {
                ssh.remote_path = path.display().to_string();
            }
            b.ssh(ssh)
        }
        Launcher::Slurm => {
            // Slurm clusters share their file systems: the nodes run the same program.
            let remote_path =
                o.treecast_path.as_ref().map_or_else(|| "treecast".to_owned(), |p| p.display().to_string());
            b.slurm(SrunOptions { program: "srun".into(), args: Vec::new(), remote_path })
        }
    })
}

/// Launches a tree as `options` say and waits until every back-end reported (or the
/// start-up time limit passed); writes the new network to `out`.
///
/// # Safety
/// `options` is NULL or live options; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_launch(
    options: *const tc_network_options,
    out: *mut *mut tc_network,
) -> tc_result {
    guard("tc_network_launch", || {
        // SAFETY: as the caller promised.
        let o = unsafe { arg(options, "options") }?;
        out_ok(out, "out")?;
        let b = builder(o)?;
        let net = block_on(b.launch())??;
        let n = handle(tc_network {
            net,
            plugins: Mutex::new(HashMap::new()),
            ready: Default::default(),
            send_limit_ms: o.send_limit_ms.unwrap_or(crate::ffi::TC_DEFAULT_SEND_TIMEOUT_MS),
        });
        // SAFETY: checked not NULL.
        unsafe { put(out, n) };
        Ok(())
    })
}

/// Shuts the tree down (every node exits, at most 5 s) and frees the network; NULL
/// is ignored. Free its streams and communicators first.
///
/// # Safety
/// `net` is NULL or a network not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_network_free(net: *mut tc_network) {
    quiet((), || {
        // SAFETY: as the caller promised.
        if let Some(n) = unsafe { take(net) } {
            // Without a runtime the tree still goes: dropping the network kills it.
            let _ = block_on(n.net.shutdown());
        }
    });
}

/// The number of back-end ranks given out (0 for NULL).
///
/// # Safety
/// `net` is NULL or a live network.
#[no_mangle]
pub unsafe extern "C" fn tc_network_backends(net: *const tc_network) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { net.as_ref() }.map_or(0, |n| n.net.backends()))
}

/// The number of comm nodes, the front-end not counted (0 for NULL).
///
/// # Safety
/// `net` is NULL or a live network.
#[no_mangle]
pub unsafe extern "C" fn tc_network_commnodes(net: *const tc_network) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { net.as_ref() }.map_or(0, |n| n.net.commnodes()))
}

/// Waits until everything the front-end sent (packets, stream commands) is written
/// out to its links (MRNet's `flush`), at most `timeout_ms` (`TC_FOREVER`: no
/// limit): the writes sends left for later are done at once; beyond that it waits
/// only while a link is full. `TC_ERR_TIMEOUT` when one stayed full that long.
///
/// # Safety
/// `net` is NULL or a live network.
#[no_mangle]
pub unsafe extern "C" fn tc_network_flush(net: *const tc_network, timeout_ms: u64) -> tc_result {
    guard("tc_network_flush", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        crate::ffi::flush_within(timeout_ms, n.net.flush(), "a child comm node or back-end")
    })
}

/// Loads the plug-in filter at `path` here and ships its bytes down the tree (no
/// shared file system needed); streams then name it by the name it exports.
///
/// # Safety
/// `net` is NULL or a live network; `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_network_load_filter(net: *const tc_network, path: *const c_char) -> tc_result {
    guard("tc_network_load_filter", || {
        // SAFETY: as the caller promised.
        let (n, path) = unsafe { (arg(net, "net")?, text(path, "path")?) };
        let plugin = block_on(n.net.load_filter(path))??;
        let mut versions = n.plugins.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        versions.insert(plugin.name().to_owned(), plugin.version());
        Ok(())
    })
}

/// The communicator of every back-end.
///
/// # Safety
/// `net` is NULL or a live network; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_broadcast_communicator(
    net: *const tc_network,
    out: *mut *mut tc_communicator,
) -> tc_result {
    guard("tc_network_broadcast_communicator", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(out, "out")?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(tc_communicator { comm: n.net.broadcast_communicator() })) };
        Ok(())
    })
}

/// A communicator over the ranks `ranks` names, e.g. `"0-3,8,10-11"`.
///
/// # Safety
/// `net` is NULL or a live network; `ranks` is NULL or NUL-terminated; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_communicator_new(
    net: *const tc_network,
    ranks: *const c_char,
    out: *mut *mut tc_communicator,
) -> tc_result {
    guard("tc_communicator_new", || {
        // SAFETY: as the caller promised.
        let (n, text) = unsafe { (arg(net, "net")?, text(ranks, "ranks")?) };
        out_ok(out, "out")?;
        let set: RankSet = text
            .parse()
            .map_err(|e| Failure::new(tc_result::TC_ERR_INVALID, format!("the rank set {text:?}: {e}")))?;
        let comm = n.net.communicator(set)?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(tc_communicator { comm })) };
        Ok(())
    })
}

/// The number of ranks in a communicator (0 for NULL).
///
/// # Safety
/// `comm` is NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn tc_communicator_size(comm: *const tc_communicator) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { comm.as_ref() }.map_or(0, |c| c.comm.ranks().len() as u32))
}

/// Frees a communicator; NULL is ignored. Streams made over it keep working.
///
/// # Safety
/// `comm` is NULL or a communicator not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_communicator_free(comm: *mut tc_communicator) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(comm) }));
}

/// Waits up to `timeout_ms` (0: do not wait; `TC_FOREVER`) for the next event;
/// `TC_ERR_CLOSED` once the tree is over and every event was read.
///
/// # Safety
/// `net` is NULL or a live network; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_next_event(
    net: *const tc_network,
    timeout_ms: u64,
    out: *mut *mut tc_event,
) -> tc_result {
    guard("tc_network_next_event", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(out, "out")?;
        // A time limit of 0 still looks once: the future is polled before the limit.
        let event = block_on_for(timeout_ms, n.net.next_event())?
            .ok_or_else(|| ran_out(timeout_ms, "event"))?
            .ok_or_else(|| {
                Failure::new(tc_result::TC_ERR_CLOSED, "the network is over: no event will come")
            })?;
        let ranks = event_ranks(&event).map(|r| r.to_string()).unwrap_or_default();
        let text = event.to_string();
        let e = tc_event { event, ranks: c_text(&ranks), text: c_text(&text) };
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(e)) };
        Ok(())
    })
}

fn event_ranks(e: &Event) -> Option<&RankSet> {
    match e {
        Event::RanksLost { ranks, .. }
        | Event::NodeLost { ranks, .. }
        | Event::RanksRejoined { ranks, .. }
        | Event::RanksJoined { ranks }
        | Event::RanksLeft { ranks, .. } => Some(ranks),
        Event::MessageUndeliverable { to, .. } => Some(to),
        _ => None,
    }
}

/// The kind of an event, a `TC_EVENT_*` code (`TC_EVENT_NONE` for NULL).
///
/// # Safety
/// `event` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn tc_event_kind(event: *const tc_event) -> u32 {
    quiet(TC_EVENT_NONE, || {
        // SAFETY: as the caller promised.
        unsafe { event.as_ref() }.map_or(TC_EVENT_NONE, |e| match e.event {
            Event::RanksLost { .. } => TC_EVENT_RANKS_LOST,
            Event::NodeLost { .. } => TC_EVENT_NODE_LOST,
            Event::RanksRejoined { .. } => TC_EVENT_RANKS_REJOINED,
            Event::RanksJoined { .. } => TC_EVENT_RANKS_JOINED,
            Event::RanksLeft { .. } => TC_EVENT_RANKS_LEFT,
            Event::FilterError { .. } => TC_EVENT_FILTER_ERROR,
            Event::StreamRefused { .. } => TC_EVENT_STREAM_REFUSED,
            Event::MessageUndeliverable { .. } => TC_EVENT_MESSAGE_UNDELIVERABLE,
            Event::NetworkClosed { .. } => TC_EVENT_NETWORK_CLOSED,
            _ => TC_EVENT_OTHER,
        })
    })
}

/// The ranks an event concerns, folded like `"0-3,8"` (`""` when none; owned by the event).
///
/// # Safety
/// `event` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn tc_event_ranks(event: *const tc_event) -> *const c_char {
    // SAFETY: as the caller promised.
    quiet(std::ptr::null(), || unsafe { event.as_ref() }.map_or(c"".as_ptr(), |e| e.ranks.as_ptr()))
}

/// The event as one line for a log, e.g. `lost rank 5: …` (owned by the event).
///
/// # Safety
/// `event` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn tc_event_message(event: *const tc_event) -> *const c_char {
    // SAFETY: as the caller promised.
    quiet(std::ptr::null(), || unsafe { event.as_ref() }.map_or(c"".as_ptr(), |e| e.text.as_ptr()))
}

/// The stream of a filter error or refused stream (0 otherwise).
///
/// # Safety
/// `event` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn tc_event_stream(event: *const tc_event) -> u32 {
    quiet(0, || {
        // SAFETY: as the caller promised.
        unsafe { event.as_ref() }.map_or(0, |e| match e.event {
            Event::FilterError { stream, .. } | Event::StreamRefused { stream, .. } => stream,
            _ => 0,
        })
    })
}

/// The rank whose packet a filter refused (`UINT32_MAX` when unknown, for other
/// events, and for NULL).
///
/// # Safety
/// `event` is NULL or a live event.
#[no_mangle]
pub unsafe extern "C" fn tc_event_rank(event: *const tc_event) -> u32 {
    quiet(u32::MAX, || {
        // SAFETY: as the caller promised.
        unsafe { event.as_ref() }.map_or(u32::MAX, |e| match e.event {
            Event::FilterError { rank, .. } => rank,
            _ => u32::MAX,
        })
    })
}

/// Frees an event; NULL is ignored.
///
/// # Safety
/// `event` is NULL or an event not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_event_free(event: *mut tc_event) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(event) }));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn treecast_path_is_read_strictly() {
        assert_eq!(treecast_path_from(None).unwrap(), None);
        assert_eq!(treecast_path_from(Some("/opt/tc".into())).unwrap(), Some(PathBuf::from("/opt/tc")));
        // Regression: an empty TREECAST_PATH was taken as unset.
        let e = treecast_path_from(Some("".into())).unwrap_err();
        assert!(e.message.contains("TREECAST_PATH"), "{}", e.message);
    }
}
