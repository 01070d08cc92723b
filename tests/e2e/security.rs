//! What a peer without the secret, or with it but misbehaving, can do: refused
//! handshakes, malformed and oversized frames, floods of bad connections; and the
//! secret kept out of `/proc` and out of the environment of commands.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::local::*;
use crate::common::tree::finish;
use crate::common::{assert_no_leftovers, processes_with_env, TestDir};
use treecast::apps::protocol::*;
use treecast_api::{Event, Network, RankSet, Topology, Value};

#[tokio::test]
async fn a_peer_with_the_wrong_secret_is_refused() {
    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let wrong = "00".repeat(32);
    let script = format!("TREECAST_SECRET={wrong} exec {TREECAST} backend");
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .startup_timeout(Duration::from_secs(5))
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused our proof"), "{err}");
}

/// Launches balanced:2x2 where rank 1 is the rogue back-end in `mode`.
async fn with_rogue_rank_1(mode: &str) -> Network {
    let script = format!(
        "if [ \"$TREECAST_RANK\" = 1 ]; then exec {TEST_BACKEND} rogue; else exec {TREECAST} backend; fi"
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .env("TREECAST_ROGUE", mode)
        .launch()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_frame_over_the_size_limit_is_refused_before_it_is_buffered() {
    // Regression: one header announcing 256 MiB from an authenticated child cost its
    // comm node 230 MB at once. Now it closes that link and nothing else.
    let net = with_rogue_rank_1("huge").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("over this node's limit"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

/// The next event of `net` is rank 1 lost for a control frame over its limit.
async fn rank_1_lost_for_its_control_frame(net: &mut Network) {
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            // The child, the frame's size, the limit and the setting that raises it.
            assert!(reason.contains("back-end 1") || reason.contains("rank 1"), "{reason}");
            assert!(reason.contains("control frame of 33554432 bytes"), "{reason}");
            assert!(
                reason.contains("limit of 4194304 bytes") && reason.contains("TREECAST_MAX_CONTROL"),
                "{reason}"
            );
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
}

#[tokio::test]
async fn a_childs_control_frame_over_its_limit_closes_its_link_before_it_is_buffered() {
    // Regression: a back-end could make its comm node buffer a control frame up to the
    // frame limit (64 MiB); this one announces 32 MiB and sends 8: the link closes at
    // the header, and the other ranks go on.
    let mut net = with_rogue_rank_1("control").await;
    rank_1_lost_for_its_control_frame(&mut net).await;
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

#[tokio::test]
async fn in_attach_mode_a_child_with_an_oversized_control_frame_is_refused_and_the_launch_goes_on() {
    // Regression: in attach mode, one such back-end aborted the whole launch.
    let dir = TestDir::new("attach-rogue-control");
    let file = dir.path("attach");
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let launching = tokio::spawn(builder(topo).attach(&file, LIMIT).launch());
    let deadline = Instant::now() + LIMIT;
    while !file.exists() {
        assert!(Instant::now() < deadline, "no attach file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let script = format!(
        "for r in 0 2 3; do TREECAST_RANK=$r {TREECAST} backend --attach {} & done; wait",
        file.display()
    );
    let mut others = Command::new("/bin/sh").arg("-c").arg(script).env(k, v).spawn().unwrap();
    let mut rogue = Command::new(TEST_BACKEND)
        .arg("rogue")
        .env("TREECAST_RANK", "1")
        .env("TREECAST_ATTACH", &file)
        .env("TREECAST_ROGUE", "control-at-once")
        .env(k, v)
        .spawn()
        .unwrap();
    let launched = launching.await.unwrap();
    let mut net = match launched {
        Ok(net) => net,
        Err(e) => {
            let _ = rogue.kill();
            let _ = rogue.wait();
            let _ = others.kill();
            panic!("the launch failed: {e}");
        }
    };
    rank_1_lost_for_its_control_frame(&mut net).await;
    assert_eq!(net.lost_ranks(), RankSet::single(1));
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
    // The rogue ends when its link is closed; the others when the network ends.
    let _ = tokio::task::spawn_blocking(move || (rogue.wait(), others.wait())).await;
    assert_no_leftovers(&t);
}

#[tokio::test]
async fn a_malformed_frame_closes_only_that_link() {
    let net = with_rogue_rank_1("malformed").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("malformed frame"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

#[tokio::test]
async fn once_the_tree_is_up_no_process_shows_the_secret_in_proc() {
    // Regression: `treecast run` kept the secret out of a command's environment, but
    // the command could read it in its back-end's /proc/PID/environ.
    let dir = TestDir::new("secret");
    // Each back-end's shell saves the secret it was given, then becomes the back-end.
    let script = format!(
        "printf %s \"$TREECAST_SECRET\" > {}/secret.$TREECAST_RANK; exec {TREECAST} backend",
        dir.root().display()
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let net = builder(topo).backend_command(["/bin/sh", "-c", &script]).launch().await.unwrap();
    let secret = std::fs::read_to_string(dir.path("secret.0")).unwrap();
    assert_eq!(secret.len(), 64, "{secret:?}");
    let session = processes_with_env(&format!("TREECAST_SESSION={}", net.session()));
    assert_eq!(session.len(), 2 + 4, "every comm node and back-end is readable here: {session:?}");
    for pid in session {
        for what in ["environ", "cmdline"] {
            let bytes = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
            let shown = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!shown, "process {pid} shows the secret in /proc/{pid}/{what}");
        }
    }
    // And the tree still works: the secret is gone from the environment only.
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 6);
    finish(net).await;
}

#[test]
fn run_does_not_leak_the_secret_to_commands() {
    let t = tag();
    let out =
        treecast(&t, &["run", "--local", "2", "--", "sh", "-c", "echo secret=${TREECAST_SECRET:-none}"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("secret=none"), "{stdout}");
}

/// Opens `count` hostile connections to `addr` (`unix:@name`) from four threads, a
/// quarter each of: silence, random bytes, a huge length prefix, and a well-formed
/// handshake answer without the secret. Each thread keeps its latest 100 open.
fn flood(addr: &str, count: usize) -> usize {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    let name = addr.strip_prefix("unix:@").expect("a Unix listener").to_owned();
    let threads: Vec<_> = (0..4u8)
        .map(|kind| {
            let name = name.clone();
            std::thread::spawn(move || {
                let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                let mut held = std::collections::VecDeque::new();
                let mut opened = 0;
                for i in 0..count / 4 {
                    let Ok(mut c) = std::os::unix::net::UnixStream::connect_addr(&sa) else { continue };
                    opened += 1;
                    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                    let noise: Vec<u8> = (0..64).map(|j| (i * 31 + j * 7) as u8).collect();
                    let _ = match kind {
                        0 => Ok(()),
                        1 => c.write_all(&noise),
                        2 => c.write_all(&[0xff, 0xff, 0xff, 0x7f]),
                        _ => {
                            let mut hello = [0u8; 37];
                            let _ = c.read_exact(&mut hello);
                            let mut answer = b"TCST\x01\x01\x00\x00\x00".to_vec();
                            answer.extend_from_slice(&noise);
                            c.write_all(&answer)
                        }
                    };
                    held.push_back(c);
                    if held.len() > 100 {
                        held.pop_front();
                    }
                }
                opened
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn a_flood_of_bad_connections_neither_stops_start_up_nor_floods_the_terminal() {
    let dir = TestDir::new("flood");
    let (addr_file, go) = (dir.path("parent"), dir.path("go"));
    // Back-ends that say where they connect, then wait for the flood to be under way.
    let wrapper = dir.path("treecast");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$TREECAST_PARENT\" >> {a}\nwhile [ ! -e {g} ]; do sleep 0.01; done\nexec {t} \"$@\"\n",
            a = addr_file.display(),
            g = go.display(),
            t = TREECAST
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let child = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "flat", "--", "echo", "ok"])
        .env(k, v)
        .env("TREECAST_PATH", &wrapper)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    let addr = loop {
        let text = std::fs::read_to_string(&addr_file).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no back-end started");
        std::thread::sleep(Duration::from_millis(10));
    };
    // The real back-ends connect while the flood goes on.
    let flooding = {
        let addr = addr.clone();
        std::thread::spawn(move || flood(&addr, 1000))
    };
    std::fs::write(&go, b"").unwrap();
    let opened = flooding.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&t);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "start-up failed under the flood: {stdout}\n{stderr}");
    assert!(stdout.contains("---- [0-7] (8 ranks) ----\nok\n"), "{stdout}");
    assert!(opened > 0, "the flood reached the listener");
    let warnings = stderr.lines().filter(|l| l.contains("refused")).count();
    assert!(warnings <= 4, "{opened} bad connections gave {warnings} warning lines: {stderr}");
}

#[test]
fn a_comm_node_expecting_200_children_admits_them_all_at_once_with_no_warning() {
    // Regression: the flood guard ran 64 handshakes per listener whatever the plan,
    // so a comm node with more children turned its own away ("no handshake before
    // newer connections needed its place", one warning line per comm node) and they
    // came back after a back-off: seen at 1,000 back-ends in balanced:10x100 and at
    // 10,000 in balanced:10x10x100.
    const CHILDREN: usize = 200;
    let dir = TestDir::new("admission");
    let topo = dir.path("one-comm-node.top");
    let leaves: Vec<String> = (2..CHILDREN + 2).map(|i| format!("localhost:{i}")).collect();
    std::fs::write(&topo, format!("localhost:0 => localhost:1 ;\nlocalhost:1 => {} ;\n", leaves.join(" ")))
        .unwrap();
    // The comm node says its pid. Every back-end says it started, waits for one line
    // from the FIFO (a shell's `read` takes no more than its line), says it goes on.
    let (pid_file, started, released, gate) =
        (dir.path("pid"), dir.path("started"), dir.path("released"), dir.path("gate"));
    let made = Command::new("mkfifo").arg(&gate).status().unwrap();
    assert!(made.success(), "mkfifo {}", gate.display());
    let wrapper = dir.path("treecast");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = backend ]; then echo >> {s}; read _ < {g}; echo >> {r}; \
             else echo $$ > {p}; fi\nexec {t} \"$@\"\n",
            s = started.display(),
            g = gate.display(),
            r = released.display(),
            p = pid_file.display(),
            t = TREECAST
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let topo_arg = topo.display().to_string();
    let child = Command::new(TREECAST)
        .args(["run", "--topology", &topo_arg, "--", "true"])
        .env(k, v)
        .env("TREECAST_PATH", &wrapper)
        .env_remove("TREECAST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |f: &std::path::Path| std::fs::read_to_string(f).unwrap_or_default().lines().count();
    let deadline = Instant::now() + LIMIT;
    while lines(&started) < CHILDREN {
        assert!(Instant::now() < deadline, "not every back-end started");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The comm node is stopped while its children connect: they all wait in its
    // listener's queue, and it takes them in one go when it continues.
    let comm_node = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    let signal = |sig: &str| {
        let _ = Command::new("kill").args([sig, &comm_node]).status();
    };
    struct Continue<F: Fn()>(F);
    impl<F: Fn()> Drop for Continue<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    let continued = Continue(|| signal("-CONT"));
    signal("-STOP");
    // Held open until the run ends: a back-end that opens the FIFO late still finds
    // its line there.
    let mut gate = std::fs::OpenOptions::new().write(true).open(&gate).unwrap();
    std::io::Write::write_all(&mut gate, "\n".repeat(CHILDREN).as_bytes()).unwrap();
    while lines(&released) < CHILDREN {
        assert!(Instant::now() < deadline, "not every back-end went on");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Time to connect (a back-end still on its way connects a little later: the
    // test is no weaker than without the stop then).
    std::thread::sleep(Duration::from_millis(500));
    drop(continued);
    let out = child.wait_with_output().unwrap();
    drop(gate);
    assert_no_leftovers(&t);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "start-up failed: {stdout}\n{stderr}");
    assert!(stdout.contains(&format!("({CHILDREN} ranks)")), "{stdout}");
    assert!(!stderr.contains("refused"), "the comm node turned its own children away: {stderr}");
}
