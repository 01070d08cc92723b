//! `treecast`: the command line, the comm node (`treecast node`) and the generic
//! back-end (`treecast backend`) in one binary.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Parser;

use treecast::apps;
use treecast::apps::cli::{Cli, Command};

fn main() -> ExitCode {
    // Front-end, comm node or back-end, this process may move large frames.
    treecast_transport::keep_large_buffers();
    quiet_on_closed_output();
    let cli = started_by_parent(std::env::args_os()).unwrap_or_else(|| {
        Cli::try_parse().unwrap_or_else(|e| {
            exit_with_tip(e, std::env::args_os().map(|a| a.to_string_lossy().into_owned()))
        })
    });
    // Every process of the tree, comm nodes and back-ends included, refuses a
    // malformed log filter or test hook before it starts, naming the variable.
    let checked = init_logging(cli.verbose).and_then(|()| Ok(treecast_transport::testing::check()?));
    if let Err(e) = checked {
        eprintln!("treecast: error: {}", chain(&e));
        return ExitCode::from(2);
    }
    let outcome = match cli.command {
        // Comm nodes and back-ends are many per machine: one thread each keeps them light.
        Command::Node => single_threaded(apps::node::main()),
        Command::Backend(args) => single_threaded(apps::backend::main(args)),
        Command::Guard(args) => apps::guard::main(args),
        Command::Topo(args) => apps::topo::main(args),
        Command::Clock(args) => multi_threaded(apps::clock::main(args)),
        Command::Hosts(args) => apps::hosts::main(args),
        Command::Monitor(args) => apps::monitor::main(args),
        Command::Bench(args) => single_threaded(apps::bench::main(args)),
        Command::Run(args) => multi_threaded(apps::run::main(args)),
        Command::Bcast(args) => multi_threaded(apps::bcast::main(args)),
        Command::Demo(args) => multi_threaded(apps::demo::main(args)),
    };
    match outcome {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("treecast: error: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}

/// The command line of a comm node or back-end started by its parent, exactly
/// `treecast node` or `treecast backend`, read without building the parser: clap
/// builds every subcommand's flags before it looks at one, which was a third of the
/// page faults of such a process's start (10,000 of them start at once).
fn started_by_parent(args: impl IntoIterator<Item = std::ffi::OsString>) -> Option<Cli> {
    let mut args = args.into_iter().skip(1);
    let (Some(first), None) = (args.next(), args.next()) else { return None };
    let command = match first.to_str()? {
        "node" => Command::Node,
        "backend" => Command::Backend(apps::cli::BackendArgs { attach: None, rank: None }),
        _ => return None,
    };
    Some(Cli { verbose: 0, command })
}

/// Runs `fut` on one thread, as a task rather than as `block_on`'s own future: a
/// task woken by another (the tool by the node's driver, and back) runs in the same
/// turn of the scheduler, where waking `block_on`'s future costs one more look at
/// the reactor (a zero-timeout `epoll_wait`) per wake-up.
fn single_threaded(
    fut: impl std::future::Future<Output = anyhow::Result<ExitCode>> + Send + 'static,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match runtime.block_on(async { tokio::spawn(fut).await }) {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(anyhow::anyhow!("the main task was cancelled: {e}")),
    }
}

fn multi_threaded(
    fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(fut)
}

/// Prints clap's error and exits (2 for errors, 0 for --help): for an argument clap
/// does not know, the tip says what to type instead (see
/// [`apps::cli::unknown_argument_tip`]), unless clap found a flag of a similar name
/// and it is no pdsh or clush flag.
/// `args` is the command line (lossy: only for the tip's text).
fn exit_with_tip(mut e: clap::Error, args: impl Iterator<Item = String>) -> ! {
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
            // A pdsh or clush flag keeps its tip even where clap found a similar name
            // (`--group`: `--route`).
            let pdsh_flag = apps::cli::tip_for_unknown_flag(arg).is_some();
            if pdsh_flag || e.get(ContextKind::SuggestedArg).is_none() {
                let args: Vec<String> = args.collect();
                let tip = apps::cli::unknown_argument_tip(arg, &args);
                e.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
            }
        }
    }
    e.exit()
}

/// The error and its causes, each cause added only when the text so far does not
/// already say it (many messages quote their cause).
fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// Every subcommand ends quietly with status 0 when its reader went away (`treecast
/// bcast --json | head -c 400`), as `run` does by returning the write error.
///
/// `print!` and `println!` panic on a closed pipe (Rust ignores SIGPIPE), so the exit
/// happens in the panic hook, whichever thread printed: children die with this
/// process (their die-with-parent signal), as they would after any other exit.
///
/// Every other panic is a bug: the hook reports it as before and, in a release build,
/// ends the process, so that its parent reports it lost at once; unwinding would kill
/// one task and leave a half-working node that can hang its tree. (Test builds unwind,
/// so that `bench chaos --sim` can catch and count a run's panic.)
fn quiet_on_closed_output() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_print_to_closed_pipe(info.payload()) {
            std::process::exit(0);
        }
        previous(info);
        if !cfg!(debug_assertions) {
            std::process::abort();
        }
    }));
}

/// True for the panic of `print!`/`eprint!` on a pipe whose reader has gone:
/// std's message is `failed printing to stdout: Broken pipe (os error 32)`.
fn is_print_to_closed_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = match (payload.downcast_ref::<String>(), payload.downcast_ref::<&str>()) {
        (Some(s), _) => s.as_str(),
        (None, Some(s)) => s,
        (None, None) => return false,
    };
    let closed = std::io::Error::from_raw_os_error(EPIPE).to_string();
    text.starts_with("failed printing to std") && text.ends_with(&closed)
}

/// `EPIPE` on Linux, the one platform treecast runs on.
const EPIPE: i32 = 32;

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Logs to stderr through `TREECAST_LOG`'s filter, else by `-v`.
///
/// # Errors
/// `TREECAST_LOG` holds a directive the filter syntax refuses (never dropped silently).
fn init_logging(verbose: u8) -> anyhow::Result<()> {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = match std::env::var(treecast_driver::env::LOG) {
        Ok(text) => apps::settings::log_filter(&text)?,
        Err(_) => default.to_owned(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)?;
    // Colour codes only for a person watching a terminal, never in a pipe or a log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A comm node's or back-end's stderr is a pipe to its parent. An orphan that
    // outlived its parent writes into a closed pipe: its logs are lost, and that must
    // not panic it (the subscriber's own error report would print to stderr again).
    let _ = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_s_command_line_reads_as_clap_reads_it_and_any_other_goes_to_clap() {
        for line in [["treecast", "node"], ["treecast", "backend"]] {
            let fast = started_by_parent(line.map(Into::into)).map(|c| format!("{c:?}"));
            let clap = Cli::try_parse_from(line).map(|c| format!("{c:?}")).ok();
            assert_eq!(fast, clap, "{line:?}");
        }
        for line in [
            &["treecast"][..],
            &["treecast", "run"],
            &["treecast", "node", "--help"],
            &["treecast", "backend", "--attach", "file"],
            &["treecast", "-v", "backend"],
        ] {
            assert!(started_by_parent(line.iter().map(Into::into)).is_none(), "{line:?}");
        }
    }
}
