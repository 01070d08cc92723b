//! `treecast run`: outputs grouped by equivalence class, JSON, exit statuses, time
//! limits, and the orphans of a lost comm node asked again once they rejoined.

use crate::common::local::*;

#[test]
fn run_groups_outputs_by_equivalence_class() {
    let t = tag();
    let out = treecast(
        &t,
        &[
            "run",
            "--local",
            "8",
            "--topology",
            "kary:4",
            "--",
            "sh",
            "-c",
            "echo $((TREECAST_RANK % 2)) of $TREECAST_SIZE",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("---- [0,2,4,6] (4 ranks) ----\n0 of 8\n"), "{stdout}");
    assert!(stdout.contains("---- [1,3,5,7] (4 ranks) ----\n1 of 8\n"), "{stdout}");
    assert!(stdout.contains("8 back-ends; exit 0: 8 [0-7]"), "{stdout}");
}

/// `TREECAST_ZERO_COPY_MIN` reaches every process through the plans: large outputs
/// come up as memory files and arrive whole; a malformed value stops the command
/// before anything starts, naming the variable.
#[test]
fn the_zero_copy_threshold_travels_in_the_plans_and_a_bad_one_is_refused_by_name() {
    let run = |value: &str| {
        let t = tag();
        let (k, v) = t.split_once('=').unwrap();
        let out = std::process::Command::new(TREECAST)
            .args(["run", "--local", "4", "--topology", "balanced:2x2", "--"])
            .args(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo"])
            .env(k, v)
            .env("TREECAST_ZERO_COPY_MIN", value)
            .output()
            .unwrap();
        crate::common::assert_no_leftovers(&t);
        out
    };
    let out = run("4096");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(&format!("---- [0-3] (4 ranks) ----\n{}\n", "x".repeat(100_000))),
        "{stdout:.300}"
    );
    let out = run("100");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("TREECAST_ZERO_COPY_MIN=\"100\""), "{stderr}");
}

/// Back-ends whose environment holds only their parent, node id, session and secret
/// still run with their rank and the network's size: both come in their plan, and
/// the command is given them as `TREECAST_RANK` and `TREECAST_SIZE`.
#[test]
fn backends_started_with_only_parent_node_id_session_and_secret_get_rank_and_size_from_the_plan() {
    let dir = crate::common::TestDir::new("bare-env");
    let wrapper = dir.path("treecast-wrapper");
    let keep =
        ["TREECAST_TEST_TAG", "TREECAST_PARENT", "TREECAST_NODE_ID", "TREECAST_SESSION", "TREECAST_SECRET"]
            .map(|v| format!("{v}=\"${v}\""))
            .join(" ");
    let text = format!(
        "#!/bin/sh\nif [ \"$1\" = backend ]; then exec env -i {keep} {TREECAST} backend; fi\nexec {TREECAST} \"$@\"\n"
    );
    std::fs::write(&wrapper, text).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let out = std::process::Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "balanced:2x2", "--"])
        .args(["sh", "-c", "echo $TREECAST_RANK/$TREECAST_SIZE"])
        .env(k, v)
        .env("TREECAST_PATH", &wrapper)
        .output()
        .unwrap();
    crate::common::assert_no_leftovers(&t);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for rank in 0..4 {
        assert!(stdout.contains(&format!("\n{rank}/4\n")), "rank {rank} missing: {stdout}");
    }
}

#[test]
fn run_reports_failures_in_json_and_exit_status() {
    let t = tag();
    let out = treecast(&t, &["run", "--local", "4", "--json", "--", "sh", "-c", "[ $TREECAST_RANK != 2 ]"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    assert_eq!(classes[0]["ranks"], "0-1,3");
    assert_eq!(classes[1]["ranks"], "2");
    assert_eq!(classes[1]["exit_code"], 1);
}

#[test]
fn run_groups_by_exact_bytes_and_json_keeps_them() {
    let t = tag();
    // Ranks 0 and 1 differ only in one invalid UTF-8 byte; rank 2 writes what rank 0 does.
    let script = r#"case $TREECAST_RANK in 1) printf 'a\376b' ;; *) printf 'a\377b' ;; esac"#;
    let out = treecast(&t, &["run", "--local", "3", "--json", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "{report}");
    assert_eq!(classes[0]["ranks"], "0,2");
    assert_eq!(classes[1]["ranks"], "1");
    use base64::Engine;
    let decode = |v: &serde_json::Value| {
        assert_eq!(v["stdout_encoding"], "base64", "{v}");
        base64::engine::general_purpose::STANDARD.decode(v["stdout"].as_str().unwrap()).unwrap()
    };
    assert_eq!(decode(&classes[0]), b"a\xffb");
    assert_eq!(decode(&classes[1]), b"a\xfeb");
    // Text output is written as the ranks wrote it, byte for byte.
    let out = treecast(&t, &["run", "--local", "3", "--", "sh", "-c", script]);
    let stdout = out.stdout;
    assert!(stdout.windows(4).any(|w| w == b"a\xffb\n"), "{}", String::from_utf8_lossy(&stdout));
    assert!(stdout.windows(4).any(|w| w == b"a\xfeb\n"), "{}", String::from_utf8_lossy(&stdout));
}

#[test]
fn run_groups_outputs_that_differ_past_the_output_limit_apart() {
    let t = tag();
    // 2 MiB of `x`, then a last line that differs by rank parity: the part shown is equal.
    let script = "head -c 2097152 /dev/zero | tr '\\0' x; echo; echo $((TREECAST_RANK % 2))";
    let out = treecast(&t, &["run", "--local", "4", "--json", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "ranks that differ after the first MiB are two groups");
    assert_eq!((classes[0]["ranks"].as_str(), classes[1]["ranks"].as_str()), (Some("0,2"), Some("1,3")));
    for c in classes {
        assert_eq!(c["stdout"].as_str().unwrap().len(), 1 << 20, "the default limit is 1 MiB");
        assert_eq!(c["stdout_bytes"], (2 << 20) + 3);
    }
    // The limit is a flag, and the text report says how much was cut.
    let out = treecast(&t, &["run", "--local", "2", "--output-limit", "10", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .contains("---- [0] (1 rank) ----\nxxxxxxxxxx\n[treecast: stdout cut: 10 of 2097155 bytes shown"),
        "{stdout}"
    );
    assert!(stdout.contains("---- [1] (1 rank) ----\n"), "{stdout}");
}

#[test]
fn run_exits_with_the_largest_status_and_names_signals() {
    let t = tag();
    let script = "case $TREECAST_RANK in 0) exit 0 ;; 1) exit 3 ;; 2) exit 137 ;; *) kill -KILL $$ ;; esac";
    let out = treecast(&t, &["run", "--local", "4", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // exit 137 and SIGKILL are different outcomes, though a shell would print 137 for both.
    assert!(stdout.contains("---- [2] (1 rank) exit 137 ----"), "{stdout}");
    assert!(stdout.contains("---- [3] (1 rank) killed by SIGKILL ----"), "{stdout}");
    assert!(
        stdout.contains("exit 0: 1 [0], exit 3: 1 [1], exit 137: 1 [2], killed by SIGKILL: 1 [3]"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(137), "the largest status");
    let out = treecast(
        &t,
        &["run", "--local", "2", "--json", "--", "sh", "-c", "[ $TREECAST_RANK = 0 ] || kill -TERM $$"],
    );
    assert_eq!(out.status.code(), Some(128 + 15), "128 + the signal");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["classes"][1]["signal"], "SIGTERM", "{report}");
    assert_eq!(report["classes"][1]["status"], "killed by SIGTERM", "{report}");
    assert_eq!(report["exit_status"], 143, "{report}");
    let out = treecast(&t, &["run", "--local", "2", "--", "sh", "-c", "exit $((TREECAST_RANK + 4))"]);
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn a_backend_killed_under_its_command_is_reported_lost_with_how_it_ended_and_its_host() {
    // Regression: the answer came up without the rank as soon as its link closed, and
    // the run reported it "still connected" before the news of its loss (which waits
    // for the exit status) arrived.
    let t = tag();
    // The guard's parent is the back-end ($PPID is the guard).
    let script = "[ $TREECAST_RANK = 2 ] && { read -r _ _ _ be _ < /proc/$PPID/stat; kill -KILL $be; }; true";
    for topology in ["flat", "balanced:2x2"] {
        let out = treecast(
            &t,
            &["run", "--local", "4", "--topology", topology, "--json", "--", "sh", "-c", script],
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["no_answer"], serde_json::json!([]), "{topology}: {report}");
        assert_eq!(report["lost"][0]["ranks"], "2", "{topology}: {report}");
        assert_eq!(report["lost"][0]["hosts"], "localhost", "{topology}: {report}");
        let reason = report["lost"][0]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("killed by signal 9"), "{topology}: {reason}");
        assert_eq!(out.status.code(), Some(255), "{topology}: a lost rank");
    }
    // Every back-end dies: the stream ends with no member left, before any news.
    let every = "read -r _ _ _ be _ < /proc/$PPID/stat; kill -KILL $be; true";
    let out = treecast(&t, &["run", "--local", "2", "--json", "--", "sh", "-c", every]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["no_answer"], serde_json::json!([]), "{report}");
    let mut lost: Vec<&str> =
        report["lost"].as_array().unwrap().iter().map(|l| l["ranks"].as_str().unwrap()).collect();
    lost.sort_unstable();
    assert_eq!(lost, ["0", "1"], "one entry per loss: {report}");
}

#[test]
fn run_with_a_timeout_cuts_off_a_stopped_comm_node_and_shows_the_ranks_that_answered() {
    let t = tag();
    // Rank 0's command stops its back-end's comm node (the back-end is the guard's parent).
    // Parents read from /proc with shell builtins only: no `ps` on a bare machine.
    let script = "[ $TREECAST_RANK = 0 ] && { read -r _ _ _ be _ < /proc/$PPID/stat; \
                  read -r _ _ _ cn _ < /proc/$be/stat; kill -STOP $cn; }; echo hi";
    let out = treecast(
        &t,
        &[
            "run",
            "--local",
            "4",
            "--topology",
            "kary:2",
            "--timeout",
            "1",
            "--dead-after",
            "5",
            // Without recovery the cut-off ranks are lost; with it they rejoin and are asked
            // again (run_asks_the_orphans_of_a_killed_comm_node_again_once_they_rejoined).
            "--rejoin-within",
            "0",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("---- [2-3] (2 ranks) ----\nhi\n"), "{stdout}");
    assert!(stdout.contains("lost [0-1]: "), "{stdout}");
    // The figure is the silence measured when the check ran: never under --dead-after,
    // and over it by however late a loaded machine woke the node.
    let silent: f64 = stdout
        .split("nothing arrived for ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("no silence figure in {stdout}"));
    assert!(silent >= 5.0, "{stdout}");
    assert_eq!(out.status.code(), Some(255), "{stdout}");
}

#[test]
fn run_asks_the_orphans_of_a_killed_comm_node_again_once_they_rejoined() {
    // Regression: after a comm node was killed, its orphans rejoined and their commands
    // finished, yet `run` reported them lost (exit 255): the answers the node held went
    // with it. Rank 0 kills its comm node once rank 1 (same node) has answered.
    let t = tag();
    let script = "if [ $TREECAST_RANK = 0 ]; then read -r _ _ _ be _ < /proc/$PPID/stat; \
                  read -r _ _ _ cn _ < /proc/$be/stat; sleep 0.5; kill -9 $cn; fi; echo hi";
    let out = treecast(&t, &["run", "--local", "4", "--topology", "kary:2", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("---- [0-3] (4 ranks) ----\nhi\n"), "{stdout}");
    assert!(!stdout.contains("lost"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}
