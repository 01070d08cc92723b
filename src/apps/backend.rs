//! `treecast backend`: the generic back-end that answers [`super::protocol`] requests.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::Context;
use treecast_api::{
    ApiError, BackEnd, BackEndEvent, BackEndSender, FileReceivers, FileWorker, Packet, Value,
};

use super::cli::BackendArgs;
use super::protocol::*;

/// Joins the tree and answers requests until the network shuts down.
pub async fn main(args: BackendArgs) -> anyhow::Result<ExitCode> {
    let mut be = match &args.attach {
        Some(file) => BackEnd::attach(Some(file), args.rank).await.context("attaching to the tree")?,
        None => BackEnd::connect().await.context("joining the tree")?,
    };
    // File transfers write on a thread of their own, started with the first one, in
    // packet order; their answers go up from a task, so a slow disk holds up no other stream.
    let mut files: Option<FileWorker> = None;
    let rank = be.rank();
    loop {
        let packet = match be.next_event().await {
            Ok(BackEndEvent::Packet(p)) => p,
            Ok(BackEndEvent::StreamClosed(id)) => {
                // A transfer the front-end gave up on leaves no temporary file behind.
                if let Some(files) = &files {
                    files.stream_closed(id).await?;
                }
                continue;
            }
            Ok(_) => continue,
            Err(ApiError::Closed(_)) => break,
            Err(e) => return Err(e.into()),
        };
        let sender = be.sender();
        if FileReceivers::handles(packet.tag()) {
            let worker = match files.as_mut() {
                Some(w) => w,
                None => files.insert(start_file_worker(&be)?),
            };
            worker.packet(packet).await?;
            continue;
        }
        // Requests that take time run as tasks of their own so they hold up no other
        // stream; quick ones are answered at once, which keeps round trips short.
        if matches!(packet.tag(), TAG_RUN | TAG_SLEEP | TAG_BURST | TAG_BURST_BYTES) {
            tokio::spawn(async move {
                if let Err(e) = answer(&sender, rank, packet).await {
                    tracing::warn!(rank, "could not answer a request: {e}");
                }
            });
        } else if let Err(e) = answer(&sender, rank, packet).await {
            tracing::warn!(rank, "could not answer a request: {e}");
        }
    }
    // Unfinished transfers remove their temporary files before the back-end goes.
    drop(files);
    be.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Starts the file-writing thread and the task that sends its answers up.
fn start_file_worker(be: &BackEnd) -> anyhow::Result<FileWorker> {
    let mut files = FileWorker::start(be.rank()).context("starting the file writer")?;
    let mut answers = files.take_answers();
    let answering = be.sender();
    let rank = be.rank();
    tokio::spawn(async move {
        while let Some(a) = answers.recv().await {
            if let Err(e) = answering.send(a.stream, a.tag, a.format, &a.values).await {
                tracing::warn!(rank, "could not answer a file transfer: {e}");
            }
        }
    });
    Ok(files)
}

async fn answer(be: &BackEndSender, rank: u32, p: Packet) -> Result<(), ApiError> {
    let (stream, tag) = (p.stream(), p.tag());
    match tag {
        TAG_RUN => {
            let v = p.unpack("%as %uld")?;
            let (Value::StrArray(argv), Value::ULong(limit_ms)) = (&v[0], &v[1]) else { return Ok(()) };
            let (out, err, code) = run_command(argv, *limit_ms, rank, be.size()).await;
            be.send(stream, tag, "%s %s %d", &[out.into(), err.into(), code.into()]).await
        }
        TAG_ADD_RANK => {
            let v = p.unpack("%d")?;
            let x = v[0].as_i64().unwrap_or(0) as i32;
            be.send(stream, tag, "%d", &[x.wrapping_add(rank as i32).into()]).await
        }
        TAG_WHERE => {
            let parent = std::env::var(treecast_node::env::PARENT).unwrap_or_default();
            be.send(stream, tag, "%s", &[format!("parent {parent}").into()]).await
        }
        TAG_DIE => {
            let v = p.unpack("%ad")?;
            if let Value::IntArray(ranks) = &v[0] {
                if ranks.contains(&(rank as i32)) {
                    std::process::exit(3);
                }
            }
            be.send(stream, tag, "%d", &[(rank as i32).into()]).await
        }
        TAG_BURST => {
            let v = p.unpack("%d")?;
            for _ in 0..v[0].as_i64().unwrap_or(0).max(0) {
                be.send(stream, tag, "%d", &[Value::Int(1)]).await?;
            }
            Ok(())
        }
        TAG_BURST_BYTES => {
            let v = p.unpack("%d %d")?;
            let count = v[0].as_i64().unwrap_or(0).max(0);
            let size = usize::try_from(v[1].as_i64().unwrap_or(0).max(0)).unwrap_or(0);
            let text = "x".repeat(size);
            for _ in 0..count {
                be.send(stream, tag, "%s", &[Value::Str(text.clone())]).await?;
            }
            Ok(())
        }
        TAG_STALL => {
            let v = p.unpack("%ad %d")?;
            if let (Value::IntArray(ranks), Value::Int(ms)) = (&v[0], &v[1]) {
                if ranks.contains(&(rank as i32)) {
                    // Awaited in the receive loop: no packet of any stream is read meanwhile.
                    tokio::time::sleep(Duration::from_millis((*ms).max(0) as u64)).await;
                }
            }
            be.send(stream, tag, "%d", &[(rank as i32).into()]).await
        }
        TAG_SLEEP => {
            let v = p.unpack("%d")?;
            let ms = v[0].as_i64().unwrap_or(0).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            be.send(stream, tag, "%d", &[(rank as i32).into()]).await
        }
        // TAG_ECHO, and any tag this back-end does not know: answer with what arrived.
        _ => {
            let values = p.values()?;
            let format = values.iter().map(|v| v.spec()).collect::<Vec<_>>().join(" ");
            be.send(stream, tag, &format, &values).await
        }
    }
}

/// How long a command's guard is waited for after its group was killed.
const REAP_GRACE: Duration = Duration::from_secs(1);

/// Runs `argv` without the session secret in its environment; returns stdout, stderr and the exit code.
///
/// The command runs under `treecast guard` in a process group of its own, so that
/// when it is cut off by the time limit, when this request is dropped (the back-end
/// leaves the tree) or when the back-end dies, every process it started goes with it
/// (see [`super::guard`]).
async fn run_command(argv: &[String], limit_ms: u64, rank: u32, size: u32) -> (String, String, i32) {
    let Some(program) = argv.first() else {
        return (String::new(), "treecast: empty command".into(), EXIT_NOT_STARTED);
    };
    let not_started = |e: std::io::Error| {
        (String::new(), format!("treecast: cannot run {program}: {e}\n"), EXIT_NOT_STARTED)
    };
    // The guard's standard input; it kills the group when this end closes, which the
    // kernel does however this process ends. Close-on-exec: no other child inherits it.
    let (lifeline, guard_end) = match std::os::unix::net::UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => return not_started(e),
    };
    // The same binary, even if it was replaced or removed on disk since it started.
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg("guard")
        .arg("--")
        .args(argv)
        .env_remove(treecast_transport::SECRET_ENV)
        .env_remove(treecast_node::env::PARENT)
        .env_remove(treecast_node::env::NODE_ID)
        // Set here too: a back-end that attached was not given them by treecast.
        .env(treecast_node::env::RANK, rank.to_string())
        .env(treecast_node::env::SIZE, size.to_string())
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(guard_end)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Neither a die-with-parent signal nor kill-on-drop for the guard: killed alone,
    // it would leave the command's processes running. It goes with its group, which
    // `GroupKiller` kills, or kills the group itself once the lifeline closes.
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return not_started(e),
    };
    let Some(pgid) = child.id() else {
        return (
            String::new(),
            format!("treecast: {program} ended before it could be watched\n"),
            EXIT_NOT_STARTED,
        );
    };
    let output = child.wait_with_output();
    tokio::pin!(output);
    // Killing the group while the guard is not yet reaped: its id cannot have been reused.
    let mut group = GroupKiller(Some(pgid));
    let result = if limit_ms > 0 {
        match tokio::time::timeout(Duration::from_millis(limit_ms), &mut output).await {
            Ok(r) => r,
            Err(_) => {
                group.kill();
                // Reaps the guard: its pipes end as the group is gone, unless a process
                // that left the group (a daemon) holds them, which must not hold us up.
                let _ = tokio::time::timeout(REAP_GRACE, output).await;
                let msg = format!(
                    "treecast: {program} did not finish within {:.1} s and was killed\n",
                    limit_ms as f64 / 1e3
                );
                return (String::new(), msg, EXIT_TIMED_OUT);
            }
        }
    } else {
        output.await
    };
    // The guard is reaped: the command ended on its own, and what it left running is its own.
    group.0 = None;
    drop(lifeline);
    match result {
        Ok(out) => (text(out.stdout), text(out.stderr), super::guard::exit_code(out.status)),
        Err(e) => (String::new(), format!("treecast: waiting for {program}: {e}\n"), EXIT_NOT_STARTED),
    }
}

/// Kills a command's process group when dropped (its request was dropped: the
/// back-end is leaving) or told to, unless disarmed.
struct GroupKiller(Option<u32>);

impl GroupKiller {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            if let Err(e) = treecast_launch::kill_process_group(pgid) {
                tracing::warn!("could not kill the processes of a command (group {pgid}): {e}");
            }
        }
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

fn text(mut bytes: Vec<u8>) -> String {
    let cut = bytes.len() > MAX_OUTPUT;
    bytes.truncate(MAX_OUTPUT);
    let mut s = String::from_utf8_lossy(&bytes).into_owned();
    if cut {
        s.push_str("\n[treecast: output truncated at 1 MiB]\n");
    }
    s
}
