//! Attach mode: back-ends started by someone else (a shell loop, `mpirun`) join
//! through an attach file, which both sides check.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::local::*;
use crate::common::tree::finish;
use crate::common::{assert_no_leftovers, TestDir};
use treecast::apps::protocol::*;
use treecast_api::{Topology, Value};

/// Launches a network in attach mode, starts its back-ends with `start` once the
/// attach file exists, and checks a sum over them; leaves nothing behind.
async fn attach_and_sum(spec: &str, n: usize, start: impl FnOnce(&Path, &str) -> std::process::Child) {
    let dir = std::env::temp_dir().join(format!("treecast-attach-test-{}-{spec}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    let topo = Topology::from_spec(spec, Some(n)).unwrap();
    let launching = tokio::spawn(builder(topo).attach(&file, LIMIT).launch());
    let deadline = Instant::now() + LIMIT;
    while !file.exists() {
        assert!(Instant::now() < deadline, "no attach file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = tag();
    let mut launcher = start(&file, &t);
    let net = launching.await.unwrap().unwrap();
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), n as i64 + (0..n as i64).sum::<i64>());
    finish(net).await;
    assert!(!file.exists(), "the attach file outlived the network");
    let _ = tokio::task::spawn_blocking(move || launcher.wait()).await;
    assert_no_leftovers(&t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn backends_started_by_a_shell_loop_attach() {
    attach_and_sum("balanced:2x3", 6, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        let script = format!(
            "for r in 0 1 2 3 4 5; do TREECAST_RANK=$r {TREECAST} backend --attach {} & done; wait",
            file.display()
        );
        Command::new("/bin/sh").arg("-c").arg(script).env(k, v).spawn().unwrap()
    })
    .await;
}

/// A back-end that attaches needs its attach file and its rank, nothing more: the
/// rest comes in its plan.
#[tokio::test]
async fn backends_with_nothing_but_their_rank_in_the_environment_attach() {
    // A shape of its own: the attach file's folder is named after it.
    attach_and_sum("kary:3", 4, |file, tag| {
        let script = format!(
            "for r in 0 1 2 3; do env -i {tag} TREECAST_RANK=$r {TREECAST} backend --attach {} & done; wait",
            file.display()
        );
        let (k, v) = tag.split_once('=').unwrap();
        Command::new("/bin/sh").arg("-c").arg(script).env(k, v).spawn().unwrap()
    })
    .await;
}

#[tokio::test]
#[cfg_attr(not(has_mpirun), ignore = "needs mpirun (Debian: openmpi-bin)")]
async fn backends_started_by_mpirun_attach() {
    attach_and_sum("kary:2", 4, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-n", "4", "-x", k])
            .args([TREECAST, "backend", "--attach"])
            .arg(file)
            .env(k, v)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    })
    .await;
}

#[test]
fn a_backend_without_a_place_in_the_attach_file_says_so() {
    let dir = std::env::temp_dir().join(format!("treecast-attach-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    std::fs::write(
        &file,
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32)),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(TREECAST)
        .args(["backend", "--attach"])
        .arg(&file)
        .args(["--rank", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("rank 3 has no place in the attach file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_front_end_stops_at_once_when_it_cannot_write_the_attach_file() {
    // Regression: the front-end logged the error and still waited the whole attach
    // time for back-ends that had no file to find it by.
    let dir = TestDir::new("attach-unwritable");
    // A directory with something in it where the file should go: the rename fails.
    let file = dir.path("attach");
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("x"), b"").unwrap();
    let t = tag();
    let started = Instant::now();
    let path = file.to_str().unwrap();
    let args = ["run", "--local", "4", "--topology", "kary:2", "--attach-timeout", "300", "--attach", path];
    let out = treecast(&t, &[&args[..], &["--", "true"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot write the attach file"), "{err}");
    assert!(started.elapsed() < LIMIT, "waited {:?} for back-ends", started.elapsed());
    let names: Vec<_> = std::fs::read_dir(dir.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["attach"], "the temporary file with the secret survived the failure");
}

#[test]
fn a_backend_refuses_an_attach_file_others_can_read() {
    let dir = TestDir::new("attach-untrusted");
    let file = untrusted_attach_file(&dir);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = attach_backend(&file, "mode 0644");
    assert!(err.contains("has mode 0644") && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Trusted now: it gets as far as connecting to the (missing) parent.
    let err = attach_backend(&file, "private");
    assert!(err.contains("/nonexistent/s"), "{err}");
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root (changing a file's owner)")]
fn a_backend_refuses_an_attach_file_another_user_owns() {
    let dir = TestDir::new("attach-other-owner");
    let file = untrusted_attach_file(&dir);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&file, Some(1), None).unwrap();
    let err = attach_backend(&file, "owned by uid 1");
    assert!(err.contains("owned by uid 1"), "{err}");
}

/// An attach file for one back-end whose parent address does not exist.
fn untrusted_attach_file(dir: &TestDir) -> std::path::PathBuf {
    let file = dir.path("attach");
    let text =
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32));
    std::fs::write(&file, text).unwrap();
    file
}

/// Starts back-end rank 0 from `file`, expects it to refuse (exit 2), and returns its stderr.
fn attach_backend(file: &Path, what: &str) -> String {
    let out = Command::new(TREECAST).args(["backend", "--rank", "0", "--attach"]).arg(file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    err
}
