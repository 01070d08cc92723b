//! `treecast bench route --sim`: the UDP multicast protocol in the simulated LAN,
//! from the command line.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");

/// The JSON rows of `treecast bench route --sim` with these flags.
fn rows(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(TREECAST).args(["bench", "route", "--sim", "--json"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_simulated_route_benchmark_prints_a_row_per_group_and_size_and_delivers_under_loss() {
    let args = ["--receivers", "1,4", "--sizes", "1,64K", "--loss", "0.05"];
    let rows = rows(&args);
    let shape: Vec<(u64, u64)> =
        rows.iter().map(|r| (r["receivers"].as_u64().unwrap(), r["bytes"].as_u64().unwrap())).collect();
    assert_eq!(shape, [(1, 1), (1, 65536), (4, 1), (4, 65536)]);
    for r in &rows {
        assert_eq!(r["lost"], 0, "{r}");
        assert!(r["time_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["fragments_per_fragment"].as_f64().unwrap() >= 1.0, "{r}");
    }
    // The same seed gives the same virtual figures.
    assert_eq!(self::rows(&args), rows);
}

/// On real sockets: a TCP and a UDP row per size, the UDP rows multicast every
/// message and carry their ratio to the TCP row of the same run.
#[test]
fn the_live_route_benchmark_times_both_routes_and_the_udp_rows_multicast() {
    let out = Command::new(TREECAST)
        .args(["bench", "route", "--json", "--receivers", "2", "--sizes", "1,64K", "--rounds", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shape: Vec<(&str, u64)> =
        rows.iter().map(|r| (r["route"].as_str().unwrap(), r["bytes"].as_u64().unwrap())).collect();
    assert_eq!(shape, [("tcp", 1), ("tcp", 65536), ("udp", 1), ("udp", 65536)]);
    for r in &rows {
        assert!(r["rtt_us"].as_f64().unwrap() > 0.0 && r["rate_mb_s"].as_f64().unwrap() > 0.0, "{r}");
        let sent = r["rounds"].as_u64().unwrap() + r["messages"].as_u64().unwrap();
        if r["route"] == "udp" {
            assert_eq!(r["multicast"].as_u64().unwrap(), sent, "every message multicast, once: {r}");
            assert!(r["rtt_vs_tcp"].as_f64().unwrap() > 0.0, "{r}");
        } else {
            assert_eq!(r["multicast"], 0, "{r}");
        }
    }
}

#[test]
fn the_route_benchmark_says_which_flag_is_wrong() {
    let run = |args: &[&str]| {
        let out = Command::new(TREECAST).args(["bench", "route"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--sim", "--route", "tcp"]).contains("models the UDP multicast route only"));
    assert!(run(&["--sim", "--sizes", "big"]).contains("write 4096, 64K or 1M"));
    assert!(run(&["--sim", "--loss", "1.5"]).contains("--loss 1.5 must be at least 0 and below 1"));
    assert!(run(&["--sim", "--receivers", "0"]).contains("group sizes from 1 to 1024"));
}

/// The warm transfer benchmark: the file goes `--runs` times over the running tree,
/// by multicast with --route udp, and the route's counts come with the times.
#[test]
fn the_bcast_benchmark_times_warm_transfers_and_reports_the_route() {
    let out = Command::new(TREECAST)
        .args(["bench", "bcast", "--local", "2", "--topology", "flat", "--route", "udp"])
        .args(["--size", "2", "--runs", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(b["backends"], 2, "{b}");
    assert_eq!(b["bytes"], 2 << 20, "{b}");
    assert_eq!(b["runs_s"].as_array().unwrap().len(), 2, "{b}");
    let route = &b["routes"][0];
    assert_eq!(route["udp_children"], serde_json::json!([1, 2]), "{b}");
    // Two runs of two 1 MiB chunks, each multicast once.
    assert_eq!(route["frames"], 4, "{b}");
    assert!(b["fragments_per_fragment"].as_f64().unwrap() >= 1.0, "{b}");
    // The reference measured in the same run: the same transfers over TCP.
    let (tcp, ratio) = (b["tcp_median_s"].as_f64().unwrap(), b["vs_tcp"].as_f64().unwrap());
    assert!(tcp > 0.0 && (ratio - b["median_s"].as_f64().unwrap() / tcp).abs() < 1e-9, "{b}");
}

/// A bad `TREECAST_UDP_*` value stops the launch, naming the variable and its range,
/// before any process starts.
#[test]
fn a_bad_udp_setting_stops_the_launch_and_names_the_variable() {
    let out = Command::new(TREECAST)
        .args(["run", "--local", "2", "--route", "udp", "--", "true"])
        .env("TREECAST_UDP_FRAGMENT", "9")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TREECAST_UDP_FRAGMENT=\"9\": write a whole number from 64 to 65000"), "{err}");
}
