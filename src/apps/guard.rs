//! `treecast guard`: runs one command for `treecast backend` and kills the command's
//! whole process group when the back-end goes away.
//!
//! Only the direct child of a process gets the die-with-parent signal, so a command
//! that starts processes of its own (`sh -c 'sleep 30; true'`) would leave them
//! running after the tree is gone. The back-end therefore starts this guard as the
//! leader of a new process group, with one end of a socket pair as its standard
//! input, and the guard starts the command, which joins that group with everything
//! it starts. The back-end keeps the other end. However the back-end ends (it
//! returns, it is killed, or the tree goes down and the kernel kills it), the kernel
//! closes that end; the guard then reads end of file and kills the group, itself
//! included. The back-end also kills the group itself when the command's time limit
//! passes or its request is dropped. A process that leaves the group (`setsid`, a
//! daemon) escapes; what the command leaves running after it exited normally is
//! left alone.

use std::io::Read;
use std::process::{ExitCode, Stdio};

use anyhow::Context;

use super::cli::GuardArgs;
use super::protocol::EXIT_NOT_STARTED;

/// Runs the command, and kills this process group when standard input ends.
pub fn main(args: GuardArgs) -> anyhow::Result<ExitCode> {
    // Started as `/proc/self/exe`, the kernel names this process `exe`: `pgrep treecast`
    // and `ps` would miss it. Only a hint to people, so a failure is no error.
    let _ = std::fs::write("/proc/self/comm", "treecast");
    let Some((program, rest)) = args.command.split_first() else {
        anyhow::bail!("treecast guard needs a command to run");
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest).stdin(Stdio::null());
    // If the guard itself is killed, the command goes too.
    treecast_launch::die_with_parent_std(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("treecast: cannot run {program}: {e}");
            return Ok(ExitCode::from(EXIT_NOT_STARTED as u8));
        }
    };
    std::thread::spawn(|| {
        wait_for_end_of_input();
        // This guard leads the group (the back-end started it so): its pid is the group id.
        if let Err(e) = treecast_launch::kill_process_group(std::process::id()) {
            eprintln!("treecast: could not stop the command's processes: {e}");
        }
    });
    let status = child.wait().with_context(|| format!("waiting for {program}"))?;
    report_status(status);
    Ok(ExitCode::from(u8::try_from(exit_code(status)).unwrap_or(u8::MAX)))
}

/// Tells the back-end how the command ended, through the socket that is this guard's
/// standard input: an exit status alone cannot tell `exit 137` from a SIGKILL.
/// One line, `exit N` or `signal N`; see [`read_status`].
fn report_status(status: std::process::ExitStatus) {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::process::ExitStatusExt;
    let line = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}\n"),
        (None, Some(signal)) => format!("signal {signal}\n"),
        (None, None) => return,
    };
    // A guard started by hand has a terminal or nothing there: the report is only a hint.
    if let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() {
        let _ = std::fs::File::from(fd).write_all(line.as_bytes());
    }
}

/// How a command ended, as the guard wrote it on the back-end's end of the
/// socket pair, once the guard has exited: `Ended::Exited(code)` or `Ended::Signal(n)`.
pub fn read_status(lifeline: &std::os::unix::net::UnixStream) -> Option<Ended> {
    use std::io::Read;
    lifeline.set_nonblocking(true).ok()?;
    let mut buf = [0u8; 32];
    let n = (&*lifeline).read(&mut buf).ok()?;
    let line = std::str::from_utf8(&buf[..n]).ok()?.trim_end();
    match line.split_once(' ')? {
        ("exit", code) => code.parse().ok().map(Ended::Exited),
        ("signal", signal) => signal.parse().ok().map(Ended::Signal),
        _ => None,
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal with this number killed it.
    Signal(i32),
}

impl Ended {
    /// From the status of a process the back-end waited for itself.
    pub fn of(status: std::process::ExitStatus) -> Ended {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Exited(code),
            (None, Some(signal)) => Ended::Signal(signal),
            (None, None) => Ended::Exited(-1),
        }
    }

    /// The status a shell would report: the exit status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(code) => code,
            Ended::Signal(signal) => 128 + signal,
        }
    }

    /// The signal that killed the command, or 0.
    pub fn signal(self) -> i32 {
        match self {
            Ended::Exited(_) => 0,
            Ended::Signal(signal) => signal,
        }
    }
}

/// The name of a Linux signal (`SIGKILL`), or `signal N` for one without a name here.
pub fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(signal).ok().and_then(|i| NAMES.get(i)) {
        Some(name) if !name.is_empty() => (*name).to_owned(),
        _ => format!("signal {signal}"),
    }
}

/// Returns when standard input ends: nothing is ever written to it, so a read
/// returns only once the back-end's end of the socket pair is closed.
fn wait_for_end_of_input() {
    let mut stdin = std::io::stdin();
    let mut byte = [0u8; 1];
    loop {
        match stdin.read(&mut byte) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The command's exit code, or 128 + the signal that killed it (as shells report it).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(-1)
}
