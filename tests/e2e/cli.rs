//! The command line itself: flags (pdsh's and clush's too), bad input from the
//! environment, flags and files, a closed stdout, log lines, `topo` and `demo`.

use std::process::Command;

use crate::common::local::*;
use crate::common::{assert_no_leftovers, TestDir};

/// The write end of a pipe whose reader has already gone: a process writing to it
/// gets EPIPE at once, whatever it writes and whenever.
pub(crate) fn closed_pipe() -> std::process::Stdio {
    let mut reader = Command::new("true").stdin(std::process::Stdio::piped()).spawn().unwrap();
    let writer = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    writer.into()
}

#[test]
fn every_subcommand_exits_quietly_with_status_0_on_a_closed_stdout() {
    // Regression: `treecast bcast ... --json | head -c 400` panicked with a backtrace
    // (print! on a broken pipe); `run` already returned the write error quietly.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let dir = TestDir::new("closed-stdout");
    std::fs::write(dir.path("src"), b"data").unwrap();
    let (src, dst) = (dir.path("src").display().to_string(), dir.path("dst").display().to_string());
    for args in [
        &["topo", "kary:4", "--backends", "64"][..],
        &["hosts", "-e", "n[1-100]"],
        &["bcast", &src, &dst, "--local", "2", "--json"],
        &["bcast", &src, &dst, "--local", "2", "--mode", "overwrite"],
        &["run", "--local", "2", "--", "echo", "hi"],
    ] {
        let out = Command::new(TREECAST).args(args).env(k, v).stdout(closed_pipe()).output().unwrap();
        assert_no_leftovers(&t);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn pdsh_and_clush_flags_work_and_unknown_ones_get_a_tip_naming_the_treecast_flag() {
    // Regression: `-w` got clap's tip "to pass '-w' as a value, use '-- -w'".
    let t = tag();
    let out = treecast(
        &t,
        &[
            "run",
            "-w",
            "localhost",
            "--per-host",
            "2",
            "-f",
            "4",
            "-t",
            "20",
            "-u",
            "20",
            "-b",
            "-S",
            "-L",
            "--",
        ]
        .into_iter()
        .chain(["sh", "-c", "echo out; echo err >&2; exit $((3 + TREECAST_RANK))"])
        .collect::<Vec<_>>(),
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "localhost#0: out\nlocalhost#1: out\n", "{stderr}");
    assert!(stderr.contains("localhost#1: err\ntreecast: localhost#1: exit 4\n"), "{stderr}");
    assert_eq!(out.status.code(), Some(4), "the largest status, as pdsh -S");
    let out = treecast(&t, &["run", "-R", "ssh", "-w", "localhost", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("tip: treecast starts processes with --launcher"), "{stderr}");
    assert!(!stderr.contains("use '-- -R'"), "{stderr}");
}

#[test]
fn bad_input_from_the_environment_flags_and_files_gets_a_clear_error_and_no_panic() {
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let dir = TestDir::new("bad-input");
    let with_env = |var: &str, value: &str, args: &[&str]| {
        let out = Command::new(TREECAST).args(args).env(k, v).env(var, value).output().unwrap();
        assert_no_leftovers(&t);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let run = ["run", "--local", "2", "--", "true"];
    for (var, value, says) in [
        (
            "TREECAST_STARTUP_TIMEOUT",
            "1e20",
            "TREECAST_STARTUP_TIMEOUT=\"1e20\" is not a number of seconds from 0.1",
        ),
        (
            "TREECAST_DEAD_AFTER",
            "1e-300",
            "TREECAST_DEAD_AFTER=\"1e-300\" is not 0 (off) or a number of seconds from 0.1",
        ),
        ("TREECAST_REJOIN_WITHIN", "nan", "TREECAST_REJOIN_WITHIN=\"nan\" is not 0 (off)"),
        ("TREECAST_MAX_FRAME", "1", "TREECAST_MAX_FRAME=\"1\" is not a number of bytes from 1114112"),
        // Regression: these were dropped or taken for their defaults in silence.
        ("TREECAST_STRIPE_STALL", "soon", "TREECAST_STRIPE_STALL=\"soon\" is not a number of seconds"),
        ("TREECAST_LOG", "info,[{", "TREECAST_LOG=\"info,[{\" is not a log filter"),
        ("TREECAST_UDP_GSO", "yes", "TREECAST_UDP_GSO=\"yes\": write on or off"),
        ("TREECAST_STRIPE_CUT", "sixty", "TREECAST_STRIPE_CUT=\"sixty\" (a test hook)"),
        ("TREECAST_UDP_DROP", "5%", "TREECAST_UDP_DROP=\"5%\": write P or P,SEED"),
        ("TREECAST_PATH", "", "TREECAST_PATH is set but empty"),
    ] {
        let (code, stderr) = with_env(var, value, &run);
        assert_eq!(code, Some(2), "{var}={value}: {stderr}");
        assert!(stderr.contains(says) && !stderr.contains("panicked"), "{var}={value}: {stderr}");
    }
    // The flag replaces the variable.
    let (code, stderr) = with_env(
        "TREECAST_DEAD_AFTER",
        "1e-300",
        &["run", "--local", "1", "--dead-after", "5", "--", "true"],
    );
    assert_eq!(code, Some(0), "{stderr}");

    let attach = dir.path("a.attach");
    let attach = attach.to_str().unwrap();
    let out = treecast(&t, &["run", "--local", "1", "--attach", attach, "--attach-timeout=-1", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("--attach-timeout -1 is not a number of seconds")
            && !stderr.contains("waiting up to"),
        "{stderr}"
    );

    // Files are read up to 64 MiB, as host files are.
    for (args, says) in [
        (&["topo", "/dev/zero"][..], "larger than 64 MiB, the limit of topology files"),
        (&["monitor", "/dev/zero"], "larger than 64 MiB, the limit of monitor reports"),
        (&["topo", "karry:4", "--backends", "16"], "did you mean `kary`?"),
    ] {
        let out = treecast(&t, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }

    // A long cycle is named by its first nodes and its length, on a short line.
    let mut cycle = String::from("fe:0 => x:0 ;\n");
    for i in 0..100_000 {
        cycle.push_str(&format!("n{i}:0 => n{}:0 ;\n", (i + 1) % 100_000));
    }
    let top = dir.path("cycle.top");
    std::fs::write(&top, cycle).unwrap();
    let out = treecast(&t, &["topo", top.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(100000 nodes in the cycle)") && stderr.len() < 1000,
        "{}",
        &stderr[..stderr.len().min(2000)]
    );

    // A damaged report: its own parse error, and a sum no recording makes.
    let mut rec = treecast_monitor::Recorder::default();
    let key = treecast_monitor::Key { link: 1, up: true, tag: 1, program: 0 };
    rec.record(key, treecast_monitor::Component::Net, 10, 1_000);
    let good: serde_json::Value = serde_json::from_str(&rec.report().to_json()).unwrap();
    for (field, value, says) in [
        ("count", serde_json::json!(-1), "invalid value: integer `-1`"),
        ("sum_ns", serde_json::json!(u64::MAX), "more than the 1"),
    ] {
        let mut bad = good.clone();
        bad["cells"][0][field] = value;
        let path = dir.path("bad.json");
        std::fs::write(&path, bad.to_string()).unwrap();
        let out = treecast(&t, &["monitor", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {stderr}");
        assert!(stderr.contains(says), "{field}: {stderr}");
    }
}

#[test]
fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--", "true"])
        .env(&k, &v)
        .env("TREECAST_LOG", "debug")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DEBUG"), "the comm nodes' log lines reach the user: {stderr}");
    assert!(!stderr.contains('\x1b'), "colour codes in a pipe: {stderr:?}");
}

#[test]
fn a_shape_without_a_count_says_what_is_missing() {
    let t = tag();
    let out = treecast(&t, &["run", "--topology", "kary:4", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kary:4 is a shape, not a topology file"), "{stderr}");
    let out = treecast(&t, &["run", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --local N, --hosts LIST or --topology FILE"));
}

#[test]
fn bad_values_of_the_new_flags_are_refused_before_anything_starts() {
    let t = tag();
    for (args, says) in [
        (
            &["run", "--local", "1", "--output-limit", "99999999", "--", "true"][..],
            "--output-limit 99999999 is not between",
        ),
        (&["run", "--local", "1", "--output-limit", "0", "--", "true"], "--output-limit 0 is not between"),
        (
            &["run", "--local", "1", "--dead-after", "0.001", "--", "true"],
            "--dead-after 0.001 is not 0 (off)",
        ),
        (&["run", "--local", "1", "--dead-after", "nan", "--", "true"], "--dead-after NaN is not 0 (off)"),
        (&["run", "--local", "1", "--rejoin-within=-1", "--", "true"], "--rejoin-within -1 is not 0 (off)"),
        (
            &["run", "--local", "1", "--rejoin-within", "nan", "--", "true"],
            "--rejoin-within NaN is not 0 (off)",
        ),
        (&["bench", "chaos", "--local", "2", "--stop-fraction", "nan"], "--stop-fraction NaN is not a share"),
        (&["bench", "chaos", "--local", "2", "--dead-after", "nan"], "--dead-after NaN must be a number"),
        (&["bench", "chaos", "--local", "2", "--kill-rate", "1.5"], "--kill-rate 1.5 is not a probability"),
        (&["bench", "chaos", "--local", "2", "--kill-rate", "0.1", "--faults", "2"], "cannot be used with"),
        (&["bench", "chaos", "--sim", "--during", "bcast"], "--during bcast needs real processes"),
        (&["bench", "chaos", "--sim", "--faults", "200000"], "--faults 200000 is over 100,000"),
        (
            &["bench", "chaos", "--local", "2", "--file-size", "2000000000"],
            "--file-size 2000000000 is not 1 byte to 1 GiB",
        ),
        (&["clock", "--local", "1", "--rounds", "0"], "--rounds needs at least 1"),
    ] {
        let out = treecast(&t, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let (k, v) = t.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["clock", "--local", "1"])
        .env(k, v)
        .env("TREECAST_CLOCK_DISTORT", "garbage")
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TREECAST_CLOCK_DISTORT: write OFFSET_US,DRIFT_PPM")
    );
}

#[test]
fn topo_prints_trees_and_names_line_and_column_of_errors() {
    let t = tag();
    let out = treecast(&t, &["topo", "balanced:2x2", "--format", "mrnet"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("=>"), "{text}");

    let dir = std::env::temp_dir().join(format!("treecast-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.top");
    std::fs::write(&bad, "fe.example.org:0 => n1.example.org:1 n2:2 ;\nn1.example.org:1 => n2:2 ;\n")
        .unwrap();
    let out = treecast(&t, &["topo", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("line 2, column"), "{err}");
    let out = treecast(&t, &["run", "--local", "2", "--topology", bad.to_str().unwrap(), "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demo_runs_and_explains_itself() {
    let t = tag();
    let out = treecast(&t, &["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("(expected 16120)") && text.contains("16120"), "{text}");
    assert!(text.contains("[0-15]"), "{text}");
}

/// The global clock's variables are checked before anything starts, as the others:
/// a malformed one is an error naming it, never a warning and a default.
#[test]
fn a_malformed_clock_variable_stops_the_command_naming_it() {
    for (var, value) in [("TREECAST_CLOCK_PROBES", "many"), ("TREECAST_CLOCK_DISTORT", "sideways")] {
        let t = tag();
        let (k, v) = t.split_once('=').unwrap();
        let out = Command::new(TREECAST)
            .args(["run", "--local", "2", "--", "true"])
            .env(k, v)
            .env(var, value)
            .output();
        let out = out.unwrap();
        assert_no_leftovers(&t);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {stderr}");
        assert!(stderr.contains(var) && stderr.contains(value), "{var}: {stderr}");
    }
}
