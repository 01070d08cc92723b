//! Monitoring and the global clock: every node of a real tree records the latency
//! components of its links while asked to, and the front-end collects them through
//! the tree; `treecast clock` finds injected clock offsets within its bounds.

use crate::common;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use crate::common::assert_no_leftovers;
use crate::common::local::tag;
use treecast::apps::protocol::TAG_ADD_RANK;
use treecast_api::{
    Collection, LatencyComponent, MonitorReport, Network, NetworkBuilder, StreamOptions, Topology,
    TransformKind, Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);

async fn launch(spec: &str, backends: usize) -> (Network, Topology) {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    let net = NetworkBuilder::new(topo.clone())
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .launch()
        .await
        .unwrap();
    (net, topo)
}

/// Sends `waves` sum requests and checks every answer.
async fn sums(net: &Network, stream: &mut treecast_api::Stream, waves: i32) {
    let n = i64::from(net.backends());
    for wave in 0..waves {
        stream.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
    }
    for wave in 0..waves {
        let p = stream.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.values().unwrap()[0].as_i64().unwrap(), i64::from(wave) * n + n * (n - 1) / 2);
    }
}

/// Samples of `component` for frames with `tag`, going up or down.
fn samples(report: &MonitorReport, component: LatencyComponent, tag: i32, up: bool) -> u64 {
    report
        .cells
        .iter()
        .filter(|c| c.component == component && c.tag == tag && c.up == up)
        .map(|c| c.count)
        .sum()
}

#[tokio::test]
async fn every_node_records_its_links_while_asked_and_the_front_end_collects_them_through_the_tree() {
    let (net, topo) = launch("balanced:2x2", 4).await;
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    // Before recording: nothing is kept.
    sums(&net, &mut s, 5).await;
    assert!(net.monitor_start(42).await.unwrap().is_empty());
    sums(&net, &mut s, 20).await;
    assert!(net.monitor_stop().await.unwrap().is_empty());

    let per_node: Collection = net.monitor_collect(true, LIMIT).await.unwrap();
    assert!(per_node.missing.is_empty(), "{:?}", per_node.missing);
    let nodes: BTreeSet<u32> = per_node.reports.keys().copied().collect();
    assert_eq!(nodes, (0..topo.len() as u32).collect(), "one report per node, the front-end's included");
    let all = per_node.merged().unwrap();
    assert!(all.cells.iter().all(|c| c.program == 42), "recorded under the program tag");
    // 20 requests down each of the 6 links (2 comm nodes, 4 back-ends), 20 answers up.
    let links = (topo.len() - 1) as u64;
    for component in
        [LatencyComponent::Queue, LatencyComponent::Send, LatencyComponent::Net, LatencyComponent::Deliver]
    {
        for up in [false, true] {
            assert_eq!(samples(&all, component, TAG_ADD_RANK, up), 20 * links, "{component:?} up={up}");
        }
    }
    // Each link's sender records queue and send, its receiver net and deliver: a
    // back-end sent its 20 answers up and read 20 requests.
    let backend = &per_node.reports[&(topo.len() as u32 - 1)];
    assert_eq!(samples(backend, LatencyComponent::Send, TAG_ADD_RANK, true), 20);
    assert_eq!(samples(backend, LatencyComponent::Net, TAG_ADD_RANK, false), 20);
    assert_eq!(samples(backend, LatencyComponent::Send, TAG_ADD_RANK, false), 0);

    // Stopped: later waves add nothing; merged through the tree, the same report.
    sums(&net, &mut s, 5).await;
    let merged = net.monitor_collect(false, LIMIT).await.unwrap();
    assert_eq!(merged.reports.keys().copied().collect::<Vec<_>>(), [0], "one report, merged on the way up");
    assert_eq!(merged.merged().unwrap(), all);

    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

/// Striped links record too: every link of the tree runs over two connections, and
/// each frame's net latency and delivery are counted at its receiver as on a TCP
/// link (the sender's queue and send are not split on a striped link).
#[tokio::test]
async fn striped_links_record_net_and_deliver_for_every_frame() {
    let topo = Topology::from_spec("balanced:2x2", Some(4)).unwrap();
    let net = NetworkBuilder::new(topo.clone())
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .unix_links(false)
        .stripes(2)
        .launch()
        .await
        .unwrap();
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    assert!(net.monitor_start(9).await.unwrap().is_empty());
    sums(&net, &mut s, 20).await;
    assert!(net.monitor_stop().await.unwrap().is_empty());
    let all = net.monitor_collect(true, LIMIT).await.unwrap().merged().unwrap();
    let links = (topo.len() - 1) as u64;
    for component in [LatencyComponent::Net, LatencyComponent::Deliver] {
        for up in [false, true] {
            assert_eq!(samples(&all, component, TAG_ADD_RANK, up), 20 * links, "{component:?} up={up}");
        }
    }
    for component in [LatencyComponent::Queue, LatencyComponent::Send] {
        assert_eq!(samples(&all, component, TAG_ADD_RANK, true), 0, "{component:?}");
    }
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

#[tokio::test]
async fn two_workloads_running_at_once_are_kept_apart_by_their_streams_program_tags() {
    let (net, topo) = launch("balanced:2x2", 4).await;
    let comm = net.broadcast_communicator();
    let tagged = |program| StreamOptions { program, ..StreamOptions::reduce(TransformKind::Sum) };
    let mut tool_a = net.new_stream(&comm, tagged(11)).await.unwrap();
    let mut tool_b = net.new_stream(&comm, tagged(22)).await.unwrap();
    assert!(net.monitor_start(5).await.unwrap().is_empty());
    // Same frame tag, same links, interleaved in the same batches: only the program
    // tag tells them apart.
    tokio::join!(sums(&net, &mut tool_a, 20), sums(&net, &mut tool_b, 30));
    assert!(net.monitor_stop().await.unwrap().is_empty());
    let all = net.monitor_collect(false, LIMIT).await.unwrap().merged().unwrap();
    let links = (topo.len() - 1) as u64;
    for (program, waves) in [(11, 20), (22, 30), (5, 0)] {
        let mine = MonitorReport {
            cells: all.cells.iter().filter(|c| c.program == program).cloned().collect(),
            ..MonitorReport::default()
        };
        for component in [
            LatencyComponent::Queue,
            LatencyComponent::Send,
            LatencyComponent::Net,
            LatencyComponent::Deliver,
        ] {
            for up in [false, true] {
                let n = samples(&mine, component, TAG_ADD_RANK, up);
                assert_eq!(n, waves * links, "program {program} {component:?} up={up}");
            }
        }
    }
    assert!(all.cells.iter().any(|c| c.program == 5), "control frames stay under the recording's tag");
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

/// The published cross-check of a global clock: equal-size frames down and up each
/// link, under clocks distorted by up to 0.9 s, show the same shortest one-way
/// latency both ways, as far as the clock's error bound allows.
#[test]
fn the_one_way_cross_check_sees_both_directions_of_every_link_alike_under_distorted_clocks() {
    let tag = format!("TREECAST_TEST_TAG=monitor-cross-{}", std::process::id());
    let (k, v) = tag.split_once('=').unwrap();
    let out = std::process::Command::new(TREECAST)
        .args([
            "clock",
            "--local",
            "8",
            "--topology",
            "kary:2",
            "--rounds",
            "1",
            "--cross-check",
            "100",
            "--json",
        ])
        .env(k, v)
        .env("TREECAST_CLOCK_DISTORT", "seed:5,offset_us:900000,drift_ppm:0")
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = report["nodes"].as_array().unwrap();
    let far = nodes.iter().filter(|n| n["injected_ns"].as_i64().unwrap().unsigned_abs() > 1_000_000).count();
    assert!(far > nodes.len() / 2, "the knob distorted the clocks by milliseconds at least: {report}");
    let cross = &report["cross_check"];
    let links = cross["links"].as_array().unwrap();
    let ids: BTreeSet<u64> = links.iter().map(|l| l["link"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=nodes.len() as u64).collect(), "every link of the tree, once: {cross}");
    for l in links {
        let n = |key: &str| l[key].as_u64().unwrap();
        assert!(n("down_frames") >= 100 && n("up_frames") >= 100, "every wave crossed it both ways: {l}");
        // A clock left uncorrected would make nearly every frame one way arrive before
        // it was sent; a correction within its bound leaves at most a few.
        assert!(2 * n("down_early") < n("down_frames") && 2 * n("up_early") < n("up_frames"), "{l}");
        // Half of down minus up is (d - u) / 2 plus the estimate's error e, with
        // |e| <= bound and d, u the true shortest times: it cannot pass this.
        let skew = l["skew_ns"].as_i64().unwrap().unsigned_abs();
        let limit = n("down_min_ns").max(n("up_min_ns")) / 2 + 3 * n("bound_ns") / 2;
        assert!(skew <= limit, "{l}");
    }
}

#[test]
fn microbench_records_a_run_into_a_report_per_node() {
    let dir = common::TestDir::new("microbench-monitor");
    let path = dir.path("report.json");
    // Marks this test's processes, so the leftover check looks at them only.
    let tag = format!("TREECAST_TEST_TAG=monitor-{}", std::process::id());
    let (k, v) = tag.split_once('=').unwrap();
    let out = std::process::Command::new(TREECAST)
        .args([
            "bench",
            "microbench",
            "--local",
            "4",
            "--topology",
            "balanced:2x2",
            "--rt",
            "10",
            "--tp",
            "10",
        ])
        .arg("--monitor")
        .arg(&path)
        .env(k, v)
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = Collection::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(c.missing.is_empty(), "{:?}", c.missing);
    assert_eq!(c.reports.len(), 7, "the front-end, 2 comm nodes, 4 back-ends");
    let all = c.merged().unwrap();
    // 10 round trips and 10 reductions, at least, went down and up every link.
    for component in [LatencyComponent::Queue, LatencyComponent::Net] {
        for up in [false, true] {
            let n: u64 = all
                .cells
                .iter()
                .filter(|c| c.component == component && c.up == up && c.tag != 0)
                .map(|c| c.count)
                .sum();
            assert!(n >= 20 * 6, "{component:?} up={up}: {n}");
        }
    }
    signature_of_the_recorded_run(&dir, &path);
}

/// `treecast monitor` on a recorded run, against itself as the baseline: the JSON
/// signature has every component the run recorded, nothing deviates, and the SVG
/// holds one latency line per component for each of the two runs.
fn signature_of_the_recorded_run(dir: &common::TestDir, report: &std::path::Path) {
    let svg = dir.path("signature.svg");
    let out = std::process::Command::new(TREECAST)
        .arg("monitor")
        .arg(report)
        .arg("--baseline")
        .arg(report)
        .arg("--svg")
        .arg(&svg)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let series = shown["signature"]["series"].as_array().unwrap();
    let names: Vec<&str> = series.iter().map(|s| s["component"].as_str().unwrap()).collect();
    assert_eq!(names, ["queue", "send", "net", "deliver"]);
    for s in series {
        assert!(!s["points"].as_array().unwrap().is_empty(), "{s}");
    }
    let deviations = shown["deviations"].as_array().unwrap();
    assert!(!deviations.is_empty());
    for d in deviations {
        assert_eq!(d["run"], d["baseline"], "a run against itself moves nowhere: {d}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let lines = |color: &str| {
        doc.descendants()
            .filter(|n| {
                n.has_tag_name("polyline")
                    && n.attribute("stroke").is_some_and(|c| c.eq_ignore_ascii_case(color))
            })
            .count()
    };
    assert_eq!(lines("#1F77B4"), 4, "the run's line per component");
    assert_eq!(lines("#D62728"), 4, "the baseline's line per component");
}

#[test]
fn monitor_says_which_file_is_not_a_report_and_what_it_expected() {
    let dir = common::TestDir::new("monitor-bad-input");
    let junk = dir.path("junk.json");
    std::fs::write(&junk, "{\"cells\": 3}").unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(TREECAST).arg("monitor").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = dir.path("absent.json");
    let err = run(&[missing.as_os_str()]);
    assert!(err.contains("reading") && err.contains("absent.json"), "{err}");
    let err = run(&[junk.as_os_str()]);
    assert!(
        err.contains("junk.json has `cells` but is no valid report") && err.contains("invalid type"),
        "{err}"
    );
    std::fs::write(&junk, "{\"other\": 3}").unwrap();
    let err = run(&[junk.as_os_str()]);
    assert!(err.contains("junk.json is neither a collection"), "{err}");
    let err = run(&[junk.as_os_str(), "--threshold=-5".as_ref()]);
    assert!(err.contains("--threshold must be a percentage of 0 or more"), "{err}");
}

#[test]
fn microbench_overhead_measures_off_and_on_rounds_and_records_the_on_rounds() {
    let tag = format!("TREECAST_TEST_TAG=overhead-{}", std::process::id());
    let (k, v) = tag.split_once('=').unwrap();
    let args =
        ["bench", "microbench", "--local", "4", "--topology", "balanced:2x2", "--rt", "10", "--tp", "10"];
    let out = std::process::Command::new(TREECAST)
        .args(args)
        .args(["--overhead", "2", "--overhead-null", "--json"])
        .env(k, v)
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["rounds"], 2, "{o}");
    for field in ["rtt_us_median_off", "rtt_us_median_on", "reductions_per_s_off", "reductions_per_s_on"] {
        assert!(o[field].as_f64().is_some_and(|x| x > 0.0), "{field}: {o}");
    }
    for field in ["rtt_change_percent", "null_rtt_change_percent", "null_reductions_change_percent"] {
        assert!(o[field].as_f64().is_some_and(f64::is_finite), "{field}: {o}");
    }
    // Two recorded rounds of 20 waves, each down and up 6 links, queue and net at
    // least: the on rounds were recorded.
    assert!(o["samples"].as_u64().is_some_and(|n| n >= 2 * 20 * 6 * 2 * 2), "{o}");
    // Monitoring is one flag: with --monitor it is refused.
    let both = std::process::Command::new(TREECAST)
        .args(args)
        .args(["--overhead", "--monitor", "x.json"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"), "{both:?}");
    // The null pairs are a control for --overhead, and mean nothing without it.
    let alone = std::process::Command::new(TREECAST).args(args).arg("--overhead-null").output().unwrap();
    assert!(!alone.status.success());
    assert!(String::from_utf8_lossy(&alone.stderr).contains("--overhead"), "{alone:?}");
}

#[test]
fn a_cross_check_of_zero_waves_is_refused_before_anything_starts() {
    let out = std::process::Command::new(TREECAST)
        .args(["clock", "--local", "2", "--cross-check", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cross-check needs at least 1 wave"), "{err}");
}

// ---- the global clock from the command line ----

#[test]
fn the_global_clock_recovers_injected_offsets_within_its_bounds() {
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args(["clock", "--local", "8", "--topology", "kary:2", "--rounds", "1", "--json"])
        .env(&k, &v)
        .env("TREECAST_CLOCK_DISTORT", "seed:11,offset_us:900000,drift_ppm:0")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = report["nodes"].as_array().unwrap();
    let topo = Topology::from_spec("kary:2", Some(8)).unwrap();
    assert_eq!(nodes.len(), topo.len() - 1, "every node but the front-end: {report}");
    let mut far = 0;
    for n in nodes {
        let injected = n["injected_ns"].as_i64().unwrap();
        let error = n["estimate_error_ns"].as_i64().unwrap().unsigned_abs();
        // A reply is stamped between the probe's sending and the answer's arrival, so
        // the estimate cannot be further off than half the round trip of each link.
        assert!(error <= n["error_bound_ns"].as_u64().unwrap(), "{n}");
        far += usize::from(injected.unsigned_abs() > 1_000);
    }
    assert!(far > nodes.len() / 2, "the knob distorted the clocks: {report}");
}

#[test]
fn the_cross_check_compares_the_estimates_with_the_truth_at_the_same_instant() {
    // Regression: with --cross-check the injected offsets were read after the
    // cross-check, so a drifting clock showed errors of its drift times 0.3 s.
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args([
            "clock",
            "--local",
            "4",
            "--topology",
            "kary:2",
            "--rounds",
            "2",
            "--cross-check",
            "400",
            "--json",
        ])
        .env(&k, &v)
        .env("TREECAST_CLOCK_DISTORT", "seed:5,offset_us:900000,drift_ppm:2000")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["cross_check"]["compared"].as_u64().unwrap() > 0, "{report}");
    for n in report["nodes"].as_array().unwrap() {
        let error = n["estimate_error_ns"].as_i64().unwrap().unsigned_abs();
        assert!(error <= n["error_bound_ns"].as_u64().unwrap(), "{n}");
    }
}
