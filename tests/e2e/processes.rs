//! Process lifetimes: every treecast process is named after its role, and what the
//! commands of `run` start dies with the tree, the front-end or the time limit.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::local::*;
use crate::common::tree::finish;
use crate::common::{assert_no_leftovers, processes_with_env, TestDir};
use treecast::apps::protocol::*;
use treecast_api::{StreamOptions, Value};

#[test]
fn killing_the_front_end_takes_the_whole_tree_down() {
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x4", "--", "sleep", "60"])
        .env(k, v)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    // front-end + 2 comm nodes + 8 back-ends + 8 guards + 8 sleeps
    while processes_with_env(&t).len() < 27 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(processes_with_env(&t).len(), 27);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

/// Processes carrying `needle` in their environment whose program is `name`.
fn processes_named(needle: &str, name: &str) -> Vec<u32> {
    let named = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == name)
    };
    processes_with_env(needle).into_iter().filter(named).collect()
}

/// Waits until `n` processes carrying `needle` run `name`.
fn wait_for_processes(needle: &str, name: &str, n: usize) {
    let deadline = Instant::now() + LIMIT;
    while processes_named(needle, name).len() < n {
        assert!(Instant::now() < deadline, "never saw {n} {name} processes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command whose shell starts a grandchild (`; true` keeps the shell from exec'ing it).
const FORKING: [&str; 3] = ["sh", "-c", "sleep 60; true"];

#[test]
fn every_treecast_process_is_named_treecast_with_its_role() {
    // Regression: guards showed in `ps` as `exe` / `/proc/self/exe guard -- CMD`.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--", "sleep", "60"])
        .env(k, v)
        .spawn()
        .unwrap();
    wait_for_processes(&t, "sleep", 4);
    let mut roles = Vec::new();
    for pid in processes_with_env(&t) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == "sleep" {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        assert_eq!(comm.trim_end(), "treecast", "{args:?}");
        assert!(args[0].ends_with("treecast"), "{args:?}");
        roles.push(args[1].clone());
    }
    roles.sort();
    let count = |role: &str| roles.iter().filter(|r| *r == role).count();
    assert_eq!((count("run"), count("node"), count("backend"), count("guard")), (1, 2, 4, 4), "{roles:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

#[test]
fn processes_started_by_commands_die_when_the_front_end_is_killed() {
    // Regression: only a command's direct child had the die-with-parent signal, so
    // the shell died with its back-end and its `sleep` ran on.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--"])
        .args(FORKING)
        .env(k, v)
        .spawn()
        .unwrap();
    wait_for_processes(&t, "sleep", 4);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

#[test]
fn a_command_cut_off_by_its_time_limit_takes_the_processes_it_started_along() {
    let t = tag();
    let out = treecast(&t, &[&["run", "--local", "2", "--timeout", "1", "--"][..], &FORKING[..]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(124), "the status timeout(1) gives: {stdout}");
    assert!(stdout.contains("did not finish within 1.0 s and was killed"), "{stdout}");
    // `treecast` checked that no `sleep` (which carries the tag) was left behind.
}

#[tokio::test]
async fn processes_started_by_commands_die_when_the_network_shuts_down_under_them() {
    let net = launch("kary:2", 4).await;
    let needle = format!("TREECAST_SESSION={}", net.session());
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let argv: Vec<String> = FORKING.iter().map(|a| a.to_string()).collect();
    s.send(
        TAG_RUN,
        treecast::apps::protocol::RUN_REQUEST,
        &[argv.into(), Value::ULong(0), Value::ULong(1 << 20)],
    )
    .await
    .unwrap();
    let found = needle.clone();
    tokio::task::spawn_blocking(move || wait_for_processes(&found, "sleep", 4)).await.unwrap();
    // The back-ends leave while the commands run: each kills its command's group.
    finish(net).await;
}

#[tokio::test]
async fn a_command_cut_off_is_answered_even_if_a_process_that_left_its_group_holds_its_output() {
    let dir = TestDir::new("escaped");
    let net = launch("flat", 1).await;
    // `setsid` takes the sleep out of the command's process group; it keeps stdout open.
    let pidfile = dir.path("pid");
    let script = format!("setsid sleep 30 & echo $! > {}; sleep 60; true", pidfile.display());
    let argv = ["sh".to_owned(), "-c".to_owned(), script];
    let started = Instant::now();
    let report = treecast::apps::run::run_command(&net, &argv, Some(Duration::from_secs(1))).await;
    let escaped = std::fs::read_to_string(&pidfile).unwrap();
    Command::new("kill").args(["-9", escaped.trim()]).status().unwrap();
    let report = report.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "waited {:?}: {report:?}", started.elapsed());
    assert_eq!(report.classes.len(), 1, "{report:?}");
    assert!(report.classes[0].stderr_text().contains("was killed"), "{report:?}");
    finish(net).await;
}

#[tokio::test]
async fn a_run_asks_only_the_ranks_still_in_the_tree_and_calls_none_that_left_silent() {
    // Regression: ranks that left in order (a stopped group) counted among the
    // broadcast's, so a later run waited for news of them and reported them "still
    // connected" without an answer.
    let net = launch("flat", 2).await;
    let group = net.spawn(2, &[], &treecast_api::SpawnOptions::default()).await.unwrap();
    net.stop(&group, "done with them").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while net.left_ranks() != group.rank_set() {
        assert!(Instant::now() < deadline, "the stopped group did not leave: {:?}", net.left_ranks());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let argv = ["true".to_owned()];
    let report = treecast::apps::run::run_command(&net, &argv, Some(Duration::from_secs(30))).await.unwrap();
    assert!(report.lost.is_empty() && report.no_answer.is_empty(), "{report:?}");
    assert_eq!(report.classes.len(), 1, "{report:?}");
    assert_eq!(report.classes[0].ranks, "0-1", "{report:?}");
    finish(net).await;
}
