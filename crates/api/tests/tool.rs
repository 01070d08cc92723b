//! End-to-end tests of the API as a tool writer uses it: this program is a tool
//! written against `treecast_api` alone. Run with no arguments it is the test runner
//! (the front-end of each test's network); started as `<program> node` it is a comm
//! node; started by treecast with `TREECAST_RANK` set it is a back-end. No `treecast`
//! binary takes part.
//!
//! It has its own `main` (no libtest harness), as a tool has, so that it can answer
//! `<program> node`. Arguments: test names to run (all by default).

#![allow(clippy::unwrap_used)]

use std::error::Error;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use treecast_api::{
    AddressLookup, ApiError, BackEnd, Event, FilterRegistry, LaunchError, Launched, Launcher,
    LauncherRegistry, LauncherSpec, LocalLauncher, Network, NetworkBuilder, ProcessSpec, StreamOptions,
    Topology, TransformKind, Value,
};

const LIMIT: Duration = Duration::from_secs(20);

/// `%d x` → `%d` (x + rank); a tag not listed here → `%d` rank.
const TAG_ADD: i32 = 1;
/// Rank 2 first sends `%s` twice (refused at its `send` both times), then `%d` with a
/// string (refused too), then `%d 100` if every refusal was as it should be and
/// `%d -100` if not; the others answer `%d` rank.
const TAG_WRONG_TYPE: i32 = 2;
/// → `%d` (rank % 2), for the equivalence-class filter.
const TAG_PARITY: i32 = 3;
/// → `%ad [1, rank]`.
const TAG_ARRAY: i32 = 4;
/// Rank 1 returns an error from `main`, as a tool using `?` does; the others answer `%d` rank.
const TAG_FAIL: i32 = 5;
/// → `%d` 1 when [`LAUNCHED_BY`] says two launches of [`WRAPPED`] led to this
/// back-end (the front-end's, then its comm node's), else 0.
const TAG_LAUNCHED: i32 = 6;

// ---- a launcher of the tool's own ----

/// The name the tool registers its launcher under, in its front-end and its comm nodes.
const WRAPPED: &str = "tool-wrapped-local";
/// What [`Wrapped`] adds to the environment of each process it starts: the marks of
/// the launches that led to it, one `WRAPPED/` per level.
const LAUNCHED_BY: &str = "TOOL_TEST_LAUNCHED_BY";

/// A launcher no build of treecast knows: fork/exec on this host, marking each
/// process it starts. That it takes every child (this host's included, as Slurm
/// does) and reaches them over TCP on loopback makes every start go through it.
/// One type and one registration ([`launchers`]): no change to the plan, the wire
/// or any enum.
#[derive(Debug)]
struct Wrapped {
    /// The program its children run: the plan's `remote_path`.
    program: String,
}

impl Launcher for Wrapped {
    fn launch(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError> {
        let mut spec = spec.clone();
        let before = std::env::var(LAUNCHED_BY).unwrap_or_default();
        spec.env.push((LAUNCHED_BY.into(), format!("{before}{WRAPPED}/")));
        LocalLauncher.launch(&spec)
    }

    fn kind(&self) -> &'static str {
        WRAPPED
    }

    fn takes_local_hosts(&self) -> bool {
        true
    }

    fn remote_path(&self) -> &str {
        &self.program
    }

    fn local_address_towards<'a>(&'a self, _host: &'a str) -> AddressLookup<'a> {
        Box::pin(async { Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)) })
    }
}

/// The built-in launchers and [`Wrapped`].
fn launchers() -> LauncherRegistry {
    let mut registry = LauncherRegistry::builtin();
    registry.register(WRAPPED, |spec| Ok(Arc::new(Wrapped { program: spec.remote_path.clone() })));
    registry
}

/// Set for the back-ends of a test whose rank 1 panics before it connects.
const PANIC_VAR: &str = "TOOL_TEST_PANIC";
/// Set for a front-end that must fail to find a comm-node binary, in a run of its own.
const NO_BINARY_VAR: &str = "TOOL_TEST_NO_BINARY";

type Outcome = Result<(), Box<dyn Error>>;
/// A test: its name and its body.
type Test = (&'static str, fn() -> Outcome);

fn main() -> Outcome {
    if treecast_api::started_as_comm_node() {
        // As a tool with a launcher of its own does: its comm nodes know it too.
        return runtime()?.block_on(async {
            Ok(treecast_api::run_comm_node_with_launchers(FilterRegistry::builtin(), launchers()).await?)
        });
    }
    if std::env::var_os("TREECAST_RANK").is_some() {
        return runtime()?.block_on(back_end());
    }
    if std::env::var_os(NO_BINARY_VAR).is_some() {
        // As a tool's main does: the error goes out through `main`'s `Result`.
        return runtime()?.block_on(async {
            let topo = Topology::from_spec("flat", Some(2))?;
            NetworkBuilder::new(topo).launch().await?;
            Ok(())
        });
    }
    run_tests()
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

// ---- the back-end ----

async fn back_end() -> Outcome {
    if std::env::var_os(PANIC_VAR).is_some() && std::env::var("TREECAST_RANK").as_deref() == Ok("1") {
        panic!("rank 1 cannot read its settings file /etc/tool-test.conf");
    }
    let mut be = BackEnd::connect().await?;
    let rank = be.rank();
    loop {
        let p = match be.recv().await {
            Ok(p) => p,
            Err(ApiError::Closed(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let (stream, tag) = (p.stream(), p.tag());
        let me = Value::Int(rank as i32);
        match tag {
            TAG_ADD => {
                let x = p.unpack("%d")?[0].as_i64().unwrap_or_default() as i32;
                be.send(stream, tag, "%d", &[Value::Int(x + rank as i32)]).await?;
            }
            TAG_WRONG_TYPE if rank == 2 => {
                // Twice: a refused format is refused again, and the refusal does not
                // stick to the next send.
                let mut right = true;
                for _ in 0..2 {
                    let refused = be.send(stream, tag, "%s", &[Value::from("two")]).await;
                    let said = refused.map_err(|e| e.to_string()).err().unwrap_or_default();
                    let as_it_should = said.starts_with("stream ")
                        && said.contains("sum cannot add %s")
                        && said.contains("nothing was sent");
                    if !as_it_should {
                        eprintln!("rank 2's refused send said: {said:?}");
                    }
                    right &= as_it_should;
                }
                let mismatched = be.send(stream, tag, "%d", &[Value::from("x")]).await;
                right &= mismatched.is_err();
                be.send(stream, tag, "%d", &[Value::Int(if right { 100 } else { -100 })]).await?;
            }
            TAG_PARITY => be.send(stream, tag, "%d", &[Value::Int(rank as i32 % 2)]).await?,
            TAG_ARRAY => be.send(stream, tag, "%ad", &[Value::IntArray(vec![1, rank as i32])]).await?,
            TAG_LAUNCHED => {
                let twice = std::env::var(LAUNCHED_BY).ok() == Some(format!("{WRAPPED}/{WRAPPED}/"));
                be.send(stream, tag, "%d", &[Value::Int(i32::from(twice))]).await?
            }
            TAG_FAIL if rank == 1 => {
                return Err("rank 1 cannot open /nonexistent/input.dat: No such file or directory".into())
            }
            _ => be.send(stream, tag, "%d", &[me]).await?,
        }
    }
}

// ---- the tests ----

fn run_tests() -> Outcome {
    // Comm nodes must come from this program, never from a `treecast` found elsewhere.
    std::env::remove_var("TREECAST_PATH");
    let tests: [Test; 7] = [
        ("a_tool_is_its_own_comm_node", a_tool_is_its_own_comm_node),
        ("a_launcher_of_the_tool_s_own_starts_every_level_by_its_name", a_launcher_of_its_own),
        ("a_missing_comm_node_binary_says_what_to_do_in_main_s_error", a_missing_binary_says_what_to_do),
        ("a_backend_sending_a_wrong_type_sees_it_and_the_front_end_names_it", wrong_type),
        ("equivalence_classes_and_arrays_are_read_as_documented", classes_and_arrays),
        ("a_rank_lost_at_run_time_says_how_its_process_ended", a_lost_rank_says_how),
        ("a_backend_panicking_at_start_up_is_named_with_its_panic_message", a_start_up_panic),
    ];
    let wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in tests {
        if !wanted.is_empty() && !wanted.iter().any(|w| name.contains(w.as_str())) {
            continue;
        }
        ran += 1;
        match test() {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                println!("test {name} ... FAILED\n    {e}");
                failed.push(name);
            }
        }
    }
    println!("\ntest result: {} passed; {} failed", ran - failed.len(), failed.len());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")).into())
    }
}

/// Fails the test with a message when `cond` does not hold.
macro_rules! check {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!("{}: {}", stringify!($cond), format!($($msg)*)).into());
        }
    };
}

fn me() -> PathBuf {
    std::env::current_exe().unwrap()
}

/// A network of `spec` whose comm nodes and back-ends are this program.
fn tool_network(spec: &str) -> NetworkBuilder {
    let topo = Topology::from_spec(spec, None).unwrap();
    NetworkBuilder::new(topo)
        .treecast_path(me())
        .backend_command([me().to_string_lossy().into_owned()])
        .startup_timeout(LIMIT)
}

async fn sum_stream(net: &Network) -> Result<treecast_api::Stream, ApiError> {
    net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum)).await
}

/// Shuts the network down and checks that none of its processes is left.
async fn finish(net: Network) -> Outcome {
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_with_env(&needle);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            for pid in &left {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
            return Err(format!("processes left behind: {left:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Live processes (not zombies) whose environment holds `needle`.
fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        if !zombie && env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// A tool that handles `<program> node` needs no `treecast` binary.
fn a_tool_is_its_own_comm_node() -> Outcome {
    runtime()?.block_on(async {
        let net = tool_network("balanced:2x2").launch().await?;
        check!(net.commnodes() == 2, "{}", net.commnodes());
        // The comm nodes are this program, started as `<program> node`.
        let session = format!("TREECAST_SESSION={}", net.session());
        let mut commnodes = 0;
        for pid in processes_with_env(&session) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if cmdline.ends_with(b"\0node\0") {
                check!(exe == me(), "comm node {pid} runs {}", exe.display());
                commnodes += 1;
            }
        }
        check!(commnodes == 2, "{commnodes} comm nodes found");
        let s = sum_stream(&net).await?;
        s.send(TAG_ADD, "%d", &[Value::Int(10)]).await?;
        let sum = s.recv_timeout(LIMIT).await?.unpack("%d")?[0].as_i64();
        check!(sum == Some(4 * 10 + 6), "{sum:?}");
        finish(net).await
    })
}

/// A launcher registered under a new name, in the front-end (`NetworkBuilder::launchers`)
/// and in the comm nodes (`run_comm_node_with_launchers`), starts the whole tree:
/// the comm nodes carry the front-end's mark, the back-ends their comm node's too.
fn a_launcher_of_its_own() -> Outcome {
    runtime()?.block_on(async {
        let spec =
            LauncherSpec { remote_path: me().to_string_lossy().into_owned(), ..LauncherSpec::named(WRAPPED) };
        let net = tool_network("balanced:2x2").launchers(launchers()).launcher(spec).launch().await?;
        check!(net.commnodes() == 2, "{}", net.commnodes());
        let session = format!("TREECAST_SESSION={}", net.session());
        let marked = format!("{LAUNCHED_BY}={WRAPPED}/");
        let mut commnodes = 0;
        for pid in processes_with_env(&session) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.ends_with(b"\0node\0") {
                let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let has = env.split(|b| *b == 0).any(|kv| kv == marked.as_bytes());
                check!(has, "comm node {pid} was not started by the front-end's {WRAPPED}");
                commnodes += 1;
            }
        }
        check!(commnodes == 2, "{commnodes} comm nodes found");
        let s = sum_stream(&net).await?;
        s.send(TAG_LAUNCHED, "%d", &[Value::Int(0)]).await?;
        let twice = s.recv_timeout(LIMIT).await?.unpack("%d")?[0].as_i64();
        check!(twice == Some(4), "{twice:?} of 4 back-ends were started by {WRAPPED} at both levels");
        finish(net).await?;
        // A name the front-end does not know stops the launch before a process starts.
        let unknown = tool_network("balanced:2x2").launcher(LauncherSpec::named("pbs")).launch().await;
        let said = unknown.err().map(|e| e.to_string()).unwrap_or_default();
        check!(said.contains("`pbs`") && said.contains("local, ssh, slurm"), "{said}");
        Ok(())
    })
}

/// With no `treecast` named or anywhere, what `main` prints
/// (the error's Debug form) says what failed and what to do.
fn a_missing_binary_says_what_to_do() -> Outcome {
    // A copy of this program where no `treecast` is beside it, with an empty PATH.
    let dir = tempfile::Builder::new().prefix("tool-alone-").tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    let alone = dir.path().join("bin/deeper/mytool");
    std::fs::create_dir_all(alone.parent().unwrap())?;
    if std::fs::hard_link(me(), &alone).is_err() {
        std::fs::copy(me(), &alone)?;
    }
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty)?;
    let out = Command::new(&alone)
        .env_remove("TREECAST_PATH")
        .env("PATH", &empty)
        .env(NO_BINARY_VAR, "1")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    check!(!out.status.success(), "{stderr}");
    check!(stderr.starts_with("Error: cannot find the treecast binary that comm nodes run"), "{stderr}");
    check!(stderr.contains(&format!("this program ({})", alone.display())), "{stderr}");
    check!(stderr.contains("name its full path with NetworkBuilder::treecast_path"), "{stderr}");
    check!(stderr.contains("run_comm_node"), "{stderr}");
    check!(!stderr.contains("NoBinary"), "the Debug form is the message: {stderr}");
    Ok(())
}

/// `%s` on a `sum` stream fails at the back-end's `send`, and the front-end
/// gets a filter error naming the rank (not a hang, not only a lost rank).
fn wrong_type() -> Outcome {
    runtime()?.block_on(async {
        let net = tool_network("balanced:2x2").launch().await?;
        let s = sum_stream(&net).await?;
        s.send(TAG_WRONG_TYPE, "", &[]).await?;
        let event = tokio::time::timeout(LIMIT, net.next_event()).await?;
        let Some(Event::FilterError { stream, rank, message }) = event.clone() else {
            return Err(format!("expected a filter error, got {event:?}").into());
        };
        check!(stream == s.id() && rank == 2, "{event:?}");
        check!(
            message.starts_with("back-end rank 2 did not send its packet: sum cannot add %s"),
            "{message}"
        );
        let shown = event.map(|e| e.to_string()).unwrap_or_default();
        check!(shown.starts_with(&format!("stream {stream}: the packet of rank 2 was refused:")), "{shown}");
        // The second refusal is reported too.
        let again = tokio::time::timeout(LIMIT, net.next_event()).await?;
        check!(matches!(again, Some(Event::FilterError { rank: 2, .. })), "{again:?}");
        // Rank 2 saw the error itself (100, not -100), then sent what the filter takes.
        let sum = s.recv_timeout(LIMIT).await?.unpack("%d")?[0].as_i64();
        check!(sum == Some(1 + 3 + 100), "{sum:?}");
        check!(net.lost_ranks().is_empty(), "{}", net.lost_ranks());
        finish(net).await
    })
}

/// An equivalence-class packet points `unpack` to `eq_classes`; arrays are
/// read with `as_array`.
fn classes_and_arrays() -> Outcome {
    runtime()?.block_on(async {
        let net = tool_network("balanced:2x2").launch().await?;
        let comm = net.broadcast_communicator();
        let classes = net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await?;
        classes.send(TAG_PARITY, "", &[]).await?;
        let p = classes.recv_timeout(LIMIT).await?;
        let err = p.unpack("%d").map(|_| ()).unwrap_err();
        check!(matches!(err, ApiError::EqClassPacket { .. }), "{err}");
        check!(err.to_string().contains("read it with Packet::eq_classes()"), "{err}");
        let found: Vec<(Vec<Value>, String)> =
            p.eq_classes()?.into_iter().map(|c| (c.values, c.ranks.to_string())).collect();
        let want = vec![(vec![Value::Int(0)], "0,2".to_owned()), (vec![Value::Int(1)], "1,3".to_owned())];
        check!(found == want, "{found:?}");

        let sums = sum_stream(&net).await?;
        sums.send(TAG_ARRAY, "", &[]).await?;
        let values = sums.recv_timeout(LIMIT).await?.unpack("%ad")?;
        check!(values[0].as_array::<i32>() == Some(&[4, 6][..]), "{values:?}");
        check!(values[0].to_i64_vec() == Some(vec![4, 6]), "{values:?}");
        drop((classes, sums));
        finish(net).await
    })
}

/// A back-end that returns an error from `main` at run time is reported
/// lost with its exit status and what it wrote to stderr, under a readable name.
fn a_lost_rank_says_how() -> Outcome {
    runtime()?.block_on(async {
        let net = tool_network("balanced:2x2").launch().await?;
        let s = sum_stream(&net).await?;
        s.send(TAG_FAIL, "", &[]).await?;
        let sum = s.recv_timeout(LIMIT).await?.unpack("%d")?[0].as_i64();
        check!(sum == Some(2 + 3), "the wave completes without rank 1: {sum:?}");
        let event = tokio::time::timeout(LIMIT, net.next_event()).await?;
        let Some(Event::RanksLost { ranks, reason }) = event.clone() else {
            return Err(format!("expected lost ranks, got {event:?}").into());
        };
        check!(ranks.to_string() == "1", "{ranks}");
        // balanced:2x2 in pre-order: 0 front-end, 1 comm node, 2 and 3 its back-ends.
        // The link closed, or, when the process exited with bytes of ours unread, its
        // kernel reset the connection: either way the exit and the stderr tell why.
        let head = "comm node localhost (node 1): link to back-end rank 1 on localhost (node 3) ";
        check!(reason.starts_with(head), "{reason}");
        check!(reason.contains("; the process exited with status 1; its stderr:\n"), "{reason}");
        check!(reason.contains("Error: \"rank 1 cannot open /nonexistent/input.dat"), "{reason}");
        let shown = event.map(|e| e.to_string()).unwrap_or_default();
        check!(shown.starts_with("lost rank 1: comm node localhost (node 1): link to"), "{shown}");
        finish(net).await
    })
}

/// A back-end that panics while the tree starts, with `RUST_BACKTRACE` set,
/// fails the launch with its panic message, not only the frames of its backtrace.
fn a_start_up_panic() -> Outcome {
    runtime()?.block_on(async {
        let err = tool_network("balanced:2x2")
            .env(PANIC_VAR, "1")
            .env("RUST_BACKTRACE", "1")
            .launch()
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        check!(err.contains("back-end rank 1 on localhost (node 3)"), "{err}");
        check!(err.contains("exited with status 101"), "{err}");
        check!(err.contains("rank 1 cannot read its settings file /etc/tool-test.conf"), "{err}");
        check!(err.contains("stack backtrace: ["), "{err}");
        Ok(())
    })
}
