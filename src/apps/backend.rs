//! `treecast backend`: the generic back-end that answers [`super::protocol`] requests.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::Context;
use treecast_api::{ApiError, BackEnd, BackEndEvent, BackEndSender, Group, Packet, ReduceOp, Value};
use treecast_files::{FileReceivers, FileWorker};

use sha2::{Digest, Sha256};

use super::cli::BackendArgs;
use super::guard::Ended;
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
    let mut pinging: Option<Pinging> = None;
    let mut runs = RunAnswers::default();
    loop {
        let packet = match be.next_event().await {
            Ok(BackEndEvent::Packet(p)) if matches!(p.tag(), TAG_PEER_PING | TAG_PEER_CAST) => {
                // A malformed request or a peer gone is the requester's problem, not a reason to leave.
                match Pinging::start(&be, &p).await {
                    Ok(started) => pinging = started.or(pinging),
                    Err(e) => tracing::warn!(rank, "could not start a message exchange: {e}"),
                }
                continue;
            }
            Ok(BackEndEvent::Message(m)) => {
                if let Err(e) = on_message(&be, &mut pinging, m).await {
                    tracing::warn!(rank, "could not answer a message: {e}");
                }
                continue;
            }
            Ok(BackEndEvent::Packet(p)) => p,
            Ok(BackEndEvent::StreamClosed(id)) => {
                runs.0.remove(&id);
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
        if packet.tag() == TAG_RUN {
            let (tx, rx) = tokio::sync::watch::channel(None);
            runs.0.insert(packet.stream(), rx);
            tokio::spawn(async move {
                if let Err(e) = answer_run(&sender, rank, packet, tx).await {
                    tracing::warn!(rank, "could not answer a request: {e}");
                }
            });
            continue;
        }
        if packet.tag() == TAG_RUN_AGAIN {
            let kept = packet.unpack(RUN_AGAIN_REQUEST).ok().and_then(|v| match v[..] {
                [Value::UInt(stream)] => runs.0.get(&stream).cloned(),
                _ => None,
            });
            tokio::spawn(async move {
                if let Err(e) = answer_again(&sender, packet, kept).await {
                    tracing::warn!(rank, "could not answer a request: {e}");
                }
            });
            continue;
        }
        // Requests that take time run as tasks of their own so they hold up no other
        // stream; quick ones are answered at once, which keeps round trips short.
        if matches!(
            packet.tag(),
            TAG_SLEEP | TAG_BURST | TAG_BURST_BYTES | TAG_SPAWN_HELPERS | TAG_COLLECTIVE
        ) {
            tokio::spawn(async move {
                if let Err(e) = answer(&sender, rank, packet).await {
                    tracing::warn!(rank, "could not answer a request: {e}");
                }
            });
        } else {
            // Awaited here, but not past the end of the network: a back-end stalled on
            // purpose must still go when the tree does (its parent no longer kills it).
            // Biased: the answer, which is usually ready at once, is polled first, so
            // that most requests never register for the end of the network.
            let answered = tokio::select! {
                biased;
                a = answer(&sender, rank, packet) => a,
                _ = sender.closed() => break,
            };
            if let Err(e) = answered {
                tracing::warn!(rank, "could not answer a request: {e}");
            }
        }
    }
    // Unfinished transfers remove their temporary files before the back-end goes.
    drop(files);
    be.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The answer of each [`TAG_RUN`] request by its stream, as soon as its command
/// ended, until the stream closes: what [`TAG_RUN_AGAIN`] asks for.
#[derive(Default)]
struct RunAnswers(std::collections::HashMap<u32, tokio::sync::watch::Receiver<Option<Vec<Value>>>>);

/// Runs the command of a [`TAG_RUN`] request, keeps its answer in `kept`, and sends it.
async fn answer_run(
    be: &BackEndSender,
    rank: u32,
    p: Packet,
    kept: tokio::sync::watch::Sender<Option<Vec<Value>>>,
) -> Result<(), ApiError> {
    let v = p.unpack(RUN_REQUEST)?;
    let [Value::StrArray(argv), Value::ULong(limit_ms), Value::ULong(keep)] = v.as_slice() else {
        return Ok(());
    };
    // A request from another tool may ask for more than a frame can carry back.
    let keep = usize::try_from((*keep).min(MAX_OUTPUT_LIMIT)).unwrap_or(usize::MAX);
    let values = run_command(argv, *limit_ms, keep, rank, be.size()).await.values();
    kept.send_replace(Some(values.clone()));
    be.send(p.stream(), TAG_RUN, RUN_ANSWER, &values).await
}

/// Answers a [`TAG_RUN_AGAIN`] request with the kept answer, once the command ended.
async fn answer_again(
    be: &BackEndSender,
    p: Packet,
    kept: Option<tokio::sync::watch::Receiver<Option<Vec<Value>>>>,
) -> Result<(), ApiError> {
    let values = match kept {
        Some(mut rx) => match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_default(),
            // The command's task ended without an answer: it could not send one either.
            Err(_) => Finished::failed("treecast: the command's answer was lost\n".into(), EXIT_NOT_STARTED)
                .values(),
        },
        None => Finished::failed(
            "treecast: the command never reached this back-end (its comm node was lost first)\n".into(),
            EXIT_NOT_STARTED,
        )
        .values(),
    };
    be.send(p.stream(), TAG_RUN_AGAIN, RUN_ANSWER, &values).await
}

/// A ping-pong with another rank under way (see [`TAG_PEER_PING`]).
struct Pinging {
    stream: u32,
    peer: u32,
    payload: Vec<u8>,
    rounds_left: u32,
    rounds: u32,
    identical: u32,
    started: std::time::Instant,
}

impl Pinging {
    /// Starts the ping-pong `request` asks for (none for a malformed request), or
    /// sends the one message to several ranks a [`TAG_PEER_CAST`] asks for.
    async fn start(be: &BackEnd, request: &Packet) -> anyhow::Result<Option<Pinging>> {
        if request.tag() == TAG_PEER_CAST {
            let values = request.unpack("%aud %ud")?;
            let [Value::UIntArray(ranks), Value::UInt(bytes)] = &values[..] else { return Ok(None) };
            let targets: treecast_api::RankSet = ranks.iter().copied().collect();
            let body = vec![Value::UInt(request.stream()), Value::UCharArray(vec![7; *bytes as usize])];
            be.send_to_ranks(&targets, TAG_PEER_CAST, "%ud %auc", &body).await?;
            return Ok(None);
        }
        let values = request.unpack("%ud %ud %ud")?;
        let [Value::UInt(peer), Value::UInt(bytes), Value::UInt(rounds)] = values[..] else {
            return Ok(None);
        };
        let payload: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        let ping = Pinging {
            stream: request.stream(),
            peer,
            payload,
            rounds_left: rounds.max(1),
            rounds: rounds.max(1),
            identical: 0,
            started: std::time::Instant::now(),
        };
        ping.send(be).await?;
        Ok(Some(ping))
    }

    async fn send(&self, be: &BackEnd) -> anyhow::Result<()> {
        be.send_to_rank(self.peer, TAG_PEER_PING, "%auc", &[Value::UCharArray(self.payload.clone())]).await?;
        Ok(())
    }
}

/// A message from another rank: a ping is echoed to its sender; an echo counts
/// towards the ping-pong under way, which answers up once its rounds are done.
async fn on_message(be: &BackEnd, pinging: &mut Option<Pinging>, m: Packet) -> anyhow::Result<()> {
    if m.tag() == TAG_PEER_CAST {
        let values = m.unpack("%ud %auc")?;
        let [Value::UInt(stream), Value::UCharArray(bytes)] = &values[..] else { return Ok(()) };
        let report = [Value::UInt(m.rank()), Value::UInt(bytes.len() as u32)];
        be.send(*stream, TAG_PEER_CAST, "%ud %ud", &report).await?;
        return Ok(());
    }
    let values = m.unpack("%auc")?;
    let [Value::UCharArray(bytes)] = &values[..] else { return Ok(()) };
    match m.tag() {
        TAG_PEER_PING => {
            be.send_to_rank(m.rank(), TAG_PEER_ECHO, "%auc", &[Value::UCharArray(bytes.clone())]).await?;
        }
        TAG_PEER_ECHO => {
            let Some(p) = pinging.as_mut().filter(|p| p.peer == m.rank()) else { return Ok(()) };
            p.identical += u32::from(*bytes == p.payload);
            p.rounds_left -= 1;
            if p.rounds_left > 0 {
                return p.send(be).await;
            }
            let mean_us = p.started.elapsed().as_secs_f64() * 1e6 / f64::from(p.rounds);
            let answer = [Value::Double(mean_us), Value::UInt(p.identical)];
            be.send(p.stream, TAG_PEER_PING, "%lf %ud", &answer).await?;
            *pinging = None;
        }
        _ => {}
    }
    Ok(())
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
        TAG_ADD_RANK => {
            let v = p.unpack("%d")?;
            let x = v[0].as_i64().unwrap_or(0) as i32;
            be.send(stream, tag, "%d", &[x.wrapping_add(rank as i32).into()]).await
        }
        TAG_RANK => {
            let v = p.unpack("%d")?;
            let x = v[0].as_i64().unwrap_or(0) as i32;
            be.send(stream, tag, "%aud %ad", &[Value::UIntArray(vec![rank]), Value::IntArray(vec![x])]).await
        }
        TAG_SINK => be.send(stream, tag, "%d", &[Value::Int(1)]).await,
        TAG_STACK => {
            let v = p.unpack("%ud %ud")?;
            let (depth, classes) = (v[0].as_u64().unwrap_or(1) as u32, v[1].as_u64().unwrap_or(1) as u32);
            be.send(stream, tag, "%as", &[Value::StrArray(synthetic_stack(rank, depth.min(256), classes))])
                .await
        }
        TAG_SPAWN_HELPERS => {
            let v = p.unpack("%ud")?;
            let [Value::UInt(n)] = v[..] else { return Ok(()) };
            match be.spawn(n, &[]).await {
                Ok(group) => be.send(stream, tag, "%aud", &[Value::UIntArray(group.ranks().to_vec())]).await,
                Err(e) => be.send(stream, tag, "%s", &[e.to_string().into()]).await,
            }
        }
        TAG_COLLECTIVE => match collective(be, rank, &p).await {
            Ok(answer) => be.send(stream, tag, COLLECTIVE_ANSWER, &answer).await,
            Err(e) => be.send(stream, tag, "%s", &[e.to_string().into()]).await,
        },
        TAG_WHERE => {
            let parent = std::env::var(treecast_driver::env::PARENT).unwrap_or_default();
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
        // TAG_ECHO, a tool's own tag (below FIRST_RESERVED_TAG) and a reserved tag this
        // back-end does not know: answer with what arrived.
        _ => {
            let values = p.values()?;
            let format = values.iter().map(|v| v.spec()).collect::<Vec<_>>().join(" ");
            be.send(stream, tag, &format, &values).await
        }
    }
}

/// Runs the collective operations a [`TAG_COLLECTIVE`] request asks for; returns
/// the answer's values.
async fn collective(be: &BackEndSender, rank: u32, p: &Packet) -> Result<Vec<Value>, ApiError> {
    let v = p.unpack(COLLECTIVE_REQUEST)?;
    let [Value::UInt(op), Value::UInt(combine), Value::UIntArray(members), Value::UInt(root), Value::UInt(elements), Value::UInt(rounds)] =
        &v[..]
    else {
        return Ok(Vec::new());
    };
    let group = Group::from_ranks(0, members.iter().copied());
    let reduce = match combine {
        2 => ReduceOp::Min,
        3 => ReduceOp::Max,
        4 => ReduceOp::Avg,
        _ => ReduceOp::Sum,
    };
    let own = [Value::LongArray((0..i64::from(*elements)).map(|i| i64::from(rank) * 1000 + i).collect())];
    let started = std::time::Instant::now();
    let rounds = (*rounds).max(1);
    let mut last = None;
    for _ in 0..rounds {
        let done = match op {
            1 => be.reduce(&group, *root, reduce, "%ald", &own).await?,
            2 => be.all_reduce(&group, reduce, "%ald", &own).await?,
            3 => be.all_gather(&group, "%ald", &own).await?,
            4 => be.reduce_scatter(&group, reduce, "%ald", &own).await?,
            _ => be.barrier(&group).await?,
        };
        last = Some(done);
    }
    let mean_us = started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
    let Some(last) = last else { return Ok(Vec::new()) };
    let mut result: Vec<i64> = Vec::new();
    let values = last.values.iter().chain(last.gathered.iter().flat_map(|(_, v)| v.iter()));
    for value in values {
        result.extend(value.to_i64_vec().unwrap_or_default());
    }
    let order: Vec<u32> = last.gathered.iter().map(|(r, _)| *r).collect();
    let contributors = u32::try_from(last.contributors.len()).unwrap_or(u32::MAX);
    Ok(vec![
        Value::Double(mean_us),
        Value::LongArray(result),
        Value::UIntArray(order),
        Value::UInt(contributors),
    ])
}

/// How long a command's guard is waited for after its group was killed.
const REAP_GRACE: Duration = Duration::from_secs(1);

/// What one rank's command did, as `treecast run` groups it.
#[derive(Debug, Default)]
struct Finished {
    stdout: Captured,
    stderr: Captured,
    ended: Option<Ended>,
}

impl Finished {
    /// A command that did not run (or was cut off): treecast's message as its stderr.
    fn failed(message: String, code: i32) -> Finished {
        let bytes = message.into_bytes();
        let stderr =
            Captured { total: bytes.len() as u64, digest: Sha256::digest(&bytes).into(), head: bytes };
        Finished { stdout: Captured::empty(), stderr, ended: Some(Ended::Exited(code)) }
    }

    /// The answer's values, in [`RUN_ANSWER`]'s order.
    fn values(self) -> Vec<Value> {
        let ended = self.ended.unwrap_or(Ended::Exited(-1));
        let mut digest = Vec::with_capacity(64);
        digest.extend_from_slice(&self.stdout.digest);
        digest.extend_from_slice(&self.stderr.digest);
        vec![
            Value::Bytes(self.stdout.head),
            Value::Bytes(self.stderr.head),
            Value::Int(ended.code()),
            Value::Int(ended.signal()),
            Value::ULong(self.stdout.total),
            Value::ULong(self.stderr.total),
            Value::Bytes(digest),
        ]
    }
}

/// One output stream of a command: its first bytes, and the length and SHA-256 of
/// all of it, so that outputs differing past the kept part are still told apart.
#[derive(Debug, Default)]
struct Captured {
    head: Vec<u8>,
    total: u64,
    digest: [u8; 32],
}

impl Captured {
    fn empty() -> Captured {
        Captured { head: Vec::new(), total: 0, digest: Sha256::digest([]).into() }
    }
}

/// Reads `pipe` to its end, keeping the first `keep` bytes and hashing everything.
async fn capture(pipe: Option<impl tokio::io::AsyncRead + Unpin>, keep: usize) -> std::io::Result<Captured> {
    use tokio::io::AsyncReadExt;
    let Some(mut pipe) = pipe else { return Ok(Captured::empty()) };
    let mut hasher = Sha256::new();
    let mut head = Vec::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        let room = keep.saturating_sub(head.len());
        head.extend_from_slice(&buf[..n.min(room)]);
    }
    Ok(Captured { head, total, digest: hasher.finalize().into() })
}

/// Runs `argv` without the session secret in its environment; returns what it wrote
/// (the first `keep` bytes of each stream) and how it ended.
///
/// The command runs under `treecast guard` in a process group of its own, so that
/// when it is cut off by the time limit, when this request is dropped (the back-end
/// leaves the tree) or when the back-end dies, every process it started goes with it
/// (see [`super::guard`]).
async fn run_command(argv: &[String], limit_ms: u64, keep: usize, rank: u32, size: u32) -> Finished {
    let Some(program) = argv.first() else {
        return Finished::failed("treecast: empty command\n".into(), EXIT_NOT_STARTED);
    };
    let not_started = |e: std::io::Error| {
        Finished::failed(format!("treecast: cannot run {program}: {e}\n"), EXIT_NOT_STARTED)
    };
    // The guard's standard input; it kills the group when this end closes, which the
    // kernel does however this process ends. Close-on-exec: no other child inherits it.
    let (lifeline, guard_end) = match std::os::unix::net::UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => return not_started(e),
    };
    // The same binary, even if it was replaced or removed on disk since it started.
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    // Named as every other treecast process in `ps`, not `/proc/self/exe`.
    cmd.arg0("treecast")
        .arg("guard")
        .arg("--")
        .args(argv)
        .env_remove(treecast_transport::SECRET_ENV)
        .env_remove(treecast_driver::env::PARENT)
        .env_remove(treecast_driver::env::NODE_ID)
        // Set here too: a back-end that attached was not given them by treecast.
        .env(treecast_driver::env::RANK, rank.to_string())
        .env(treecast_driver::env::SIZE, size.to_string())
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(guard_end)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // Neither a die-with-parent signal nor kill-on-drop for the guard: killed alone,
    // it would leave the command's processes running. It goes with its group, which
    // `GroupKiller` kills, or kills the group itself once the lifeline closes.
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return not_started(e),
    };
    let Some(pgid) = child.id() else {
        return Finished::failed(
            format!("treecast: {program} ended before it could be watched\n"),
            EXIT_NOT_STARTED,
        );
    };
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let output = async {
        let (stdout, stderr, status) =
            tokio::join!(capture(stdout, keep), capture(stderr, keep), child.wait());
        Ok::<_, std::io::Error>((stdout?, stderr?, status?))
    };
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
                return Finished::failed(msg, EXIT_TIMED_OUT);
            }
        }
    } else {
        output.await
    };
    // The guard is reaped: the command ended on its own, and what it left running is its own.
    group.0 = None;
    match result {
        Ok((stdout, stderr, status)) => {
            // The guard's own status says 128 + N for a signal; its report says which.
            let ended = super::guard::read_status(&lifeline).unwrap_or_else(|| Ended::of(status));
            Finished { stdout, stderr, ended: Some(ended) }
        }
        Err(e) => Finished::failed(format!("treecast: waiting for {program}: {e}\n"), EXIT_NOT_STARTED),
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
