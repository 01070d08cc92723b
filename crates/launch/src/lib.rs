//! The launch layer of treecast: how a parent starts the processes below it.
//!
//! * [`ProcessSpec`]: program, arguments and environment of one process, plus
//!   the name and host used in error messages.
//! * [`LocalLauncher`]: fork/exec on this host, the embedded default.
//! * [`SshOptions`]: the system `ssh` for other hosts; the secret goes over stdin.
//! * [`SrunOptions`]: Slurm job steps inside an allocation.
//! * [`LauncherRegistry`]: launchers by the name a launch plan gives them; a node
//!   builds its launcher from its plan once. A new launcher is one type and one
//!   registration.
//! * [`LocalHosts`]: which host names are this machine (started with fork/exec,
//!   never through ssh), whatever the spelling.
//! * [`Launcher`]: the seam every way of starting a process sits behind; used at
//!   start-up, and by run-time spawns later.
//! * [`Launched`]: a running child. It is killed when dropped, and the kernel
//!   kills it if its parent dies (`PR_SET_PDEATHSIG`; every fork happens on one
//!   long-lived thread, see `forker`), so no process outlives the tree. The last
//!   lines it wrote to stderr are kept for error reports.
//!   That signal reaches direct children only: [`kill_process_group`] ends what
//!   a command started (`treecast guard` runs each command in a group of its own).
//!
//! Environment, never argv, carries the session secret: see [`ProcessSpec::env`].

#![deny(unsafe_code)]

mod forker;
mod local;
mod registry;
mod slurm;
mod ssh;

pub use local::{is_local_address, this_host_name, LocalHosts};
pub use registry::{LauncherRegistry, MakeLauncher};
pub use slurm::{RouteError, SrunOptions, SRUN_ARGS_ENV};
pub use ssh::{
    secret_from_stdin, shell_quote, split_args, ArgsError, SshOptions, SECRET_STDIN_ENV, SSH_ARGS_ENV,
};

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Lines of a child's stderr kept for error reports.
const STDERR_TAIL_LINES: usize = 40;

/// Starts processes somewhere: on this host, over ssh, as Slurm job steps.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// Starts `spec` on `spec.host`.
    ///
    /// # Errors
    /// [`LaunchError::Spawn`] naming the node, host and program.
    fn launch(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError>;

    /// What this launcher is, for messages (`local`, `ssh`, `slurm`).
    fn kind(&self) -> &'static str;

    /// True when it starts processes on other hosts; a node whose launcher does
    /// not refuses children on other hosts, naming the host.
    fn reaches_other_hosts(&self) -> bool {
        true
    }

    /// True when every child goes through it, this host's included (Slurm steps, so
    /// that the allocation accounts for them); otherwise this host's children are
    /// started with fork/exec.
    fn takes_local_hosts(&self) -> bool {
        false
    }

    /// Path of `treecast` where children on other hosts run (empty: the same path as
    /// here).
    fn remote_path(&self) -> &str {
        ""
    }

    /// The address of this host that a child on `host` can reach, which children on
    /// other hosts connect back to.
    ///
    /// # Errors
    /// [`RouteError`] when the host does not resolve or no route leads to it.
    fn local_address_towards<'a>(&'a self, host: &'a str) -> AddressLookup<'a> {
        Box::pin(slurm::local_address_towards(bare_host(host)))
    }
}

/// What [`Launcher::local_address_towards`] returns: a lookup that may run a
/// program (`ssh -G`) or resolve a name.
pub type AddressLookup<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<std::net::IpAddr, RouteError>> + Send + 'a>>;

/// Why a process could not be started.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A host that ssh or srun could take for an option, or that srun cannot honour;
    /// nothing was started.
    #[error("refusing to start {name} on `{host}`: {reason}")]
    BadHost {
        /// The node's name.
        name: String,
        /// The host as given.
        host: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A launcher's name that the launch plan cannot carry.
    #[error(
        "a launcher's name must be 1 to {max} bytes (`{name}` is {len}): register it under a shorter one"
    )]
    BadName {
        /// The name.
        name: String,
        /// Its length in bytes.
        len: usize,
        /// The longest the plan carries.
        max: usize,
    },
    /// The launch plan names a launcher this node does not have.
    #[error("no launcher called `{name}` on this node (it has: {known}); register it in the node's LauncherRegistry")]
    Unknown {
        /// The name the plan gave.
        name: String,
        /// The names registered.
        known: String,
    },
    /// The OS refused to start the program.
    #[error("cannot start {name} on {host} ({program}): {source}")]
    Spawn {
        /// The node's name.
        name: String,
        /// The host it was meant to run on.
        host: String,
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl LaunchError {
    /// Why the process did not start, without the node's name and host, for a
    /// message that names them already (a child reported by its parent).
    pub fn reason(&self) -> String {
        match self {
            LaunchError::BadHost { host, reason, .. } => format!("refusing host `{host}`: {reason}"),
            LaunchError::Spawn { program, source, .. } => format!("{program}: {source}"),
            other => other.to_string(),
        }
    }
}

/// Why `host` (`host` or `user@host`) must not reach ssh or srun, or `None` when it may:
/// empty parts, a part starting with `-` (an option), white space or control
/// characters. Topology files and host lists refuse such names already; this is the
/// last line of defence in front of the programs that would read them.
pub fn host_problem(host: &str) -> Option<&'static str> {
    let (user, bare) = match host.split_once('@') {
        Some((user, bare)) => (Some(user), bare),
        None => (None, host),
    };
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("a host name cannot hold white space or control characters");
    }
    if bare.is_empty() || user.is_some_and(str::is_empty) {
        return Some("empty host or user name");
    }
    if bare.starts_with('-') || user.is_some_and(|u| u.starts_with('-')) {
        return Some("a host or user name starting with `-` would be taken for an option");
    }
    None
}

pub(crate) use treecast_topology::hostlist::bare_host;

/// Everything needed to start one process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Human name for errors, e.g. `comm node localhost (node 3)`.
    pub name: String,
    /// Host the process runs on: `host`, or `user@host` to log in as `user` over ssh.
    pub host: String,
    /// Program to execute.
    pub program: PathBuf,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Variables added to the inherited environment (never secret: over ssh they are on a command line).
    pub env: Vec<(String, String)>,
    /// The session secret's variable and value: in the environment for a local
    /// process, on standard input for a remote one.
    pub secret: Option<(String, String)>,
    /// Forward the child's stderr lines to ours, prefixed by its name.
    pub forward_stderr: bool,
    /// The kernel kills it when this process dies. Off for children that rejoin
    /// the tree elsewhere when their parent is lost (and exit on their own if they
    /// cannot).
    pub die_with_parent: bool,
}

/// A started child process.
#[derive(Debug)]
pub struct Launched {
    pub(crate) child: Child,
    pub(crate) name: String,
    pub(crate) stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Launched {
    /// The name given in the spec.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The last lines the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        match self.stderr_tail.lock() {
            Ok(tail) => tail.iter().cloned().collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    /// Waits for the process to exit and describes how it ended.
    ///
    /// Cancel safety: cancel safe.
    pub async fn wait(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => describe_status(status),
            Err(e) => format!("could not be waited for: {e}"),
        }
    }

    /// Returns the exit description if the process has already ended.
    pub fn try_wait(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(describe_status(status)),
            Ok(None) => None,
            Err(e) => Some(format!("could not be waited for: {e}")),
        }
    }

    /// Kills the process (if still running) and reaps it.
    ///
    /// Cancel safety: cancel safe; the kill is sent before the first await.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".to_owned(),
    }
}

/// Starts processes on this host by fork/exec.
#[derive(Debug, Clone, Default)]
pub struct LocalLauncher;

impl Launcher for LocalLauncher {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn reaches_other_hosts(&self) -> bool {
        false
    }

    /// Starts `spec` by fork/exec. Stdin is closed, stdout inherited, stderr captured.
    fn launch(&self, spec: &ProcessSpec) -> Result<Launched, LaunchError> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_remove(SECRET_STDIN_ENV)
            .envs(spec.env.iter().chain(spec.secret.iter()).map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::inherit());
        spawn(cmd, spec, &spec.program.display().to_string())
    }
}

/// Starts `cmd` for `spec` (`program` names what runs, for errors): it dies with
/// this process, and the tail of its stderr is kept (and forwarded if asked).
pub(crate) fn spawn(mut cmd: Command, spec: &ProcessSpec, program: &str) -> Result<Launched, LaunchError> {
    cmd.stderr(Stdio::piped()).kill_on_drop(true);
    if spec.die_with_parent {
        die_with_parent(&mut cmd);
    }
    let mut child = forker::spawn(cmd).map_err(|source| LaunchError::Spawn {
        name: spec.name.clone(),
        host: spec.host.clone(),
        program: program.to_owned(),
        source,
    })?;
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(keep_stderr(stderr, spec.name.clone(), spec.forward_stderr, stderr_tail.clone()));
    }
    Ok(Launched { child, name: spec.name.clone(), stderr_tail })
}

pub(crate) async fn keep_stderr(
    stderr: tokio::process::ChildStderr,
    name: String,
    forward: bool,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
    let mut lines = BufReader::new(stderr).lines();
    let mut backtrace = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if forward {
            // Not eprintln!: a node whose own parent is gone has a closed stderr,
            // and losing a forwarded line must not panic it.
            let _ = writeln!(std::io::stderr().lock(), "[{name}] {line}");
        }
        if let Ok(mut t) = tail.lock() {
            keep_line(&mut t, &mut backtrace, line);
        }
    }
}

/// The line that starts the stack backtrace Rust prints after a panic message when
/// `RUST_BACKTRACE` is set.
const BACKTRACE_START: &str = "stack backtrace:";

/// Adds `line` to the stderr tail, keeping the last [`STDERR_TAIL_LINES`] lines.
///
/// The frames of a Rust stack backtrace (the indented lines after
/// [`BACKTRACE_START`]) are counted, not kept: with `RUST_BACKTRACE` set, they would
/// push the panic message that precedes them out of the tail, and the message is
/// what a report needs. `backtrace` counts the frame lines of the one in progress.
fn keep_line(tail: &mut VecDeque<String>, backtrace: &mut Option<usize>, line: String) {
    if let Some(skipped) = backtrace.as_mut() {
        if line.starts_with([' ', '\t']) {
            *skipped += 1;
            if let Some(last) = tail.back_mut() {
                *last = format!("{BACKTRACE_START} [{skipped} lines left out of this report]");
            }
            return;
        }
        *backtrace = None;
    }
    if line.trim_end() == BACKTRACE_START {
        *backtrace = Some(0);
    }
    if tail.len() == STDERR_TAIL_LINES {
        tail.pop_front();
    }
    tail.push_back(line);
}

/// The effective user id of this process (who owns the files it creates).
pub fn effective_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid(2) takes no arguments, touches no memory and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// Asks the kernel to kill the child when its parent dies, so a crashed or killed
/// parent never leaves orphans behind. The signal is tied to the thread that forks:
/// fork through [`Launcher`]s (one long-lived thread), or from a thread that lives
/// as long as the process.
pub fn die_with_parent(cmd: &mut Command) {
    die_with_parent_std(cmd.as_std_mut());
}

/// [`die_with_parent`] for a `std::process::Command`.
pub fn die_with_parent_std(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl(2) and getppid(2), which are async-signal-safe; it touches no memory of
    // the parent but the copied `parent` integer.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the signal was armed: then nobody waits for us.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("the parent exited before the child started"));
            }
            Ok(())
        });
    }
}

/// Removes `name` from this process's environment and overwrites its value where
/// `/proc/PID/environ` shows it, so that other processes of the same user (the
/// commands a back-end runs, say) cannot read it there; returns false when it is not
/// in that block (it was not in the environment at start-up) or the block cannot be found.
///
/// `std::env::remove_var` alone is not enough: `/proc/PID/environ` reads the block the
/// kernel copied onto the stack at exec, which `unsetenv` leaves as it is. Call this
/// early, before other threads may read the variable.
pub fn clear_env_var(name: &str) -> bool {
    let cleared = overwrite_initial_env_value(name).unwrap_or(false);
    std::env::remove_var(name);
    cleared
}

/// Overwrites with `x` the value of every `name=value` entry of the initial
/// environment block; returns whether there was one.
fn overwrite_initial_env_value(name: &str) -> std::io::Result<bool> {
    let (start, end) = initial_env_range()?;
    // The same bytes as memory [start, end): the kernel reads them from there.
    let block = std::fs::read("/proc/self/environ")?;
    if block.len() != end - start {
        return Ok(false);
    }
    let prefix = format!("{name}=");
    let mut found = false;
    let mut offset = 0;
    for entry in block.split(|b| *b == 0) {
        if entry.starts_with(prefix.as_bytes()) {
            let value_at = start + offset + prefix.len();
            let len = entry.len() - prefix.len();
            #[allow(unsafe_code)]
            // SAFETY: [start, end) is this process's initial environment block, which the
            // kernel copied onto the main thread's stack at exec: mapped, writable and
            // alive for the whole life of the process. `block` was read from exactly that
            // range (same length, checked above), so the `len` bytes at `value_at` are
            // the value of this entry, inside the range, and end before its NUL, which
            // is not touched: every C string pointing into the block (libc's `environ`)
            // stays a valid string of the same length. No Rust reference points into the
            // block (std reads the environment through libc and copies it out), so
            // nothing Rust relies on changes under it. A thread reading this same
            // variable at this moment could see a mix of old and new bytes of the value;
            // callers clear it at start-up, before anything else reads it.
            unsafe {
                std::ptr::write_bytes(value_at as *mut u8, b'x', len);
            }
            found = true;
        }
        offset += entry.len() + 1;
    }
    Ok(found)
}

/// Start and end addresses of this process's initial environment block: fields 50
/// and 51 of `/proc/self/stat` (Linux 3.5 and later).
fn initial_env_range() -> std::io::Result<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<usize>().ok());
    match (field(50), field(51)) {
        (Some(start), Some(end)) if start < end => Ok((start, end)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "no environment range in /proc/self/stat",
        )),
    }
}

/// Kills (SIGKILL) every process of the process group `pgid`: a command started as
/// the leader of a group of its own, and everything it started that stayed in it.
/// A group that no longer exists is not an error.
///
/// # Errors
/// `pgid` is 0 or 1 (which would mean this process's own group, or every process),
/// or the kernel refused (a group of another user).
pub fn kill_process_group(pgid: u32) -> std::io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid).ok().filter(|p| *p > 1).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{pgid} is not a process group to kill"),
        )
    })?;
    #[allow(unsafe_code)]
    // SAFETY: kill(2) with a negative pid signals the process group -pid; it takes no
    // pointers. pgid > 1 was checked, so it is never this process's group (0) or every process (-1).
    let rc = unsafe { libc::kill(-pgid, libc::SIGKILL) };
    if rc == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        e => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(program: &str, args: &[&str]) -> ProcessSpec {
        ProcessSpec {
            name: "test node".into(),
            host: "localhost".into(),
            program: program.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![("TREECAST_TEST_VAR".into(), "v".into())],
            secret: None,
            forward_stderr: false,
            die_with_parent: true,
        }
    }

    #[tokio::test]
    async fn stderr_tail_and_exit_status_are_kept() {
        let mut p = LocalLauncher
            .launch(&spec("/bin/sh", &["-c", "echo oops >&2; echo $TREECAST_TEST_VAR >&2; exit 3"]))
            .unwrap();
        assert_eq!(p.wait().await, "exited with status 3");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(p.stderr_tail(), "oops\nv");
    }

    #[test]
    fn a_backtrace_leaves_the_panic_message_in_the_tail() {
        // Regression: with RUST_BACKTRACE set, a panicking back-end's frames filled
        // the tail and its start-up error lost the panic message.
        let mut tail = VecDeque::new();
        let mut backtrace = None;
        let mut lines = vec![
            "starting".to_owned(),
            "thread 'main' (6273) panicked at src/main.rs:1:31:".to_owned(),
            "the config file is missing".to_owned(),
            "stack backtrace:".to_owned(),
        ];
        for i in 0..60 {
            lines.push(format!("  {i:3}: tool::deep"));
            lines.push("             at ./src/main.rs:1:102".to_owned());
        }
        lines.push(
            "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.".into(),
        );
        for line in lines {
            keep_line(&mut tail, &mut backtrace, line);
        }
        let kept: Vec<&str> = tail.iter().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "starting",
                "thread 'main' (6273) panicked at src/main.rs:1:31:",
                "the config file is missing",
                "stack backtrace: [120 lines left out of this report]",
                "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.",
            ]
        );
        // Other indented lines are kept, and the tail stays bounded.
        for i in 0..100 {
            keep_line(&mut tail, &mut backtrace, format!("  line {i}"));
        }
        assert_eq!(tail.len(), STDERR_TAIL_LINES);
        assert_eq!(tail.back().map(String::as_str), Some("  line 99"));
    }

    #[test]
    fn a_child_outlives_the_thread_that_launched_it() {
        // Regression: PR_SET_PDEATHSIG fires when the forking *thread* exits, so a
        // launch from a thread that retires (here a blocking-pool thread that lives
        // 10 ms) used to kill the child, and with it the whole tree below.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_keep_alive(std::time::Duration::from_millis(10))
            .enable_all()
            .build()
            .unwrap();
        let mut child = rt.block_on(async {
            tokio::task::spawn_blocking(|| {
                tokio::runtime::Handle::current()
                    .block_on(async { LocalLauncher.launch(&spec("/bin/sleep", &["30"])) })
            })
            .await
            .unwrap()
            .unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(child.try_wait(), None, "the child died with the thread that launched it");
        rt.block_on(child.kill());
    }

    fn alive(pid: u32) -> bool {
        // A zombie (not reaped by a container's init) is dead too.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    }

    #[tokio::test]
    async fn killing_a_process_group_reaches_the_processes_its_leader_started() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "sleep 60 & echo $!; wait"]).stdout(Stdio::piped()).process_group(0);
        let mut leader = cmd.spawn().unwrap();
        let mut line = String::new();
        let mut out = BufReader::new(leader.stdout.take().unwrap());
        out.read_line(&mut line).await.unwrap();
        let background: u32 = line.trim().parse().unwrap();
        assert!(alive(background));
        kill_process_group(leader.id().unwrap()).unwrap();
        leader.wait().await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(background) {
            assert!(std::time::Instant::now() < deadline, "the background sleep survived");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Gone groups are no error; 0 and 1 (this group, every process) are refused.
        // (No pid is ever this large: the kernel's limit is 2^22.)
        kill_process_group(i32::MAX as u32).unwrap();
        assert!(kill_process_group(0).is_err() && kill_process_group(1).is_err());
    }

    /// Not a test on its own: run by `a_cleared_variable_is_gone_from_proc_environ`
    /// in a process that has `TREECAST_TEST_CLEAR` in its initial environment.
    #[test]
    fn clear_env_var_entry() {
        let Ok(value) = std::env::var("TREECAST_TEST_CLEAR") else { return };
        assert!(clear_env_var("TREECAST_TEST_CLEAR"));
        assert!(std::env::var("TREECAST_TEST_CLEAR").is_err(), "still in the environment");
        let block = std::fs::read("/proc/self/environ").unwrap();
        assert!(!block.windows(value.len()).any(|w| w == value.as_bytes()), "still in /proc/self/environ");
        // The other variables are intact, there and in the environment.
        assert!(block.split(|b| *b == 0).any(|kv| kv == b"TREECAST_TEST_OTHER=kept"));
        assert_eq!(std::env::var("TREECAST_TEST_OTHER").unwrap(), "kept");
        assert!(!clear_env_var("TREECAST_TEST_UNSET"), "a variable that is not there");
        println!("cleared");
    }

    #[test]
    fn a_cleared_variable_is_gone_from_proc_environ() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["tests::clear_env_var_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env("TREECAST_TEST_CLEAR", "s3cr3t-value-0123456789")
            .env("TREECAST_TEST_OTHER", "kept")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("cleared"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[tokio::test]
    async fn missing_program_names_node_and_host() {
        let err = LocalLauncher.launch(&spec("/nonexistent/treecast", &[])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("test node")
                && text.contains("localhost")
                && text.contains("/nonexistent/treecast"),
            "{text}"
        );
    }
}
