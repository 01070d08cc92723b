//! End-to-end tests of plug-in filters (docs/filter-abi.md): the C and Rust examples
//! loaded by the front-end and, named by the launch plan, by every comm node of a
//! real local tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::tree::finish;
use crate::common::{assert_no_leftovers, commnode_pid, TestDir};
use treecast::apps::protocol::{TAG_ADD_RANK, TAG_ECHO, TAG_SLEEP};
use treecast_api::{
    ApiError, Event, FilterSpec, Network, NetworkBuilder, RankSet, Stream, StreamOptions, Topology, Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);

/// The C histogram example, compiled with the system's `cc`.
fn histogram_so(dir: &TestDir) -> PathBuf {
    c_plugin(dir, "histogram")
}

/// The C example `examples/filters/NAME.c`, compiled with the system's `cc`.
fn c_plugin(dir: &TestDir, name: &str) -> PathBuf {
    compiled(dir, "cc", &format!("{name}.c"), &[])
}

/// An example plug-in `examples/filters/FILE` compiled by `compiler` into `dir`.
fn compiled(dir: &TestDir, compiler: &str, file: &str, flags: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = file.rsplit_once('.').map_or(file, |(n, _)| n);
    let out = dir.path(&format!("lib{name}.so"));
    let status = Command::new(compiler)
        .args(flags)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("examples/filters").join(file))
        .status()
        .unwrap_or_else(|e| panic!("{compiler}, to build examples/filters/{file}: {e}"));
    assert!(status.success(), "{compiler} failed on examples/filters/{file}");
    out
}

/// The Rust top-k example (`cargo build --example topk_filter`), built into this
/// test's own target folder (a no-op when it is up to date).
fn topk_so() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/plugins-<hash>
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let target = profile.parent().unwrap();
    let mut cargo = Command::new(env!("CARGO"));
    if profile.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let status = cargo
        .args(["build", "--quiet", "--example", "topk_filter", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .status()
        .unwrap();
    assert!(status.success(), "building the topk_filter example failed");
    profile.join("examples/libtopk_filter.so")
}

fn params(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    treecast_wire::encode_values(values, &mut out);
    out
}

fn options(name: &str, values: &[Value]) -> StreamOptions {
    let mut up = FilterSpec::new(name, 1);
    up.params = params(values);
    StreamOptions { up, ..StreamOptions::default() }
}

async fn launch_with(spec: &str, plugins: &[&Path]) -> Network {
    let topo = Topology::from_spec(spec, None).unwrap();
    let mut builder = NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(LIMIT);
    for p in plugins {
        builder = builder.plugin(*p);
    }
    builder.launch().await.unwrap()
}

#[tokio::test]
async fn c_and_rust_plugins_reduce_at_every_node_of_a_three_level_tree_with_parameters_changed_between_waves_and_state(
) {
    let dir = TestDir::new("plugins");
    let histogram = histogram_so(&dir);
    let topk = topk_so();
    // Front-end, two comm nodes, four back-ends: a stream whose filter a comm node
    // lacked would be refused there.
    let net = launch_with("balanced:2x2", &[&histogram, &topk]).await;
    assert_eq!(net.backends(), 4);

    // The C histogram merge, 3 bins.
    let h =
        net.new_stream(&net.broadcast_communicator(), options("histogram", &[Value::UInt(3)])).await.unwrap();
    h.send(TAG_ECHO, "%auld", &[Value::ULongArray(vec![1, 2, 3])]).await.unwrap();
    let p = h.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::ULongArray(vec![4, 8, 12])]);
    // A histogram of 2 bins from rank 1 is refused by its comm node, naming it and the
    // rank; the others are merged.
    for rank in 0..4u32 {
        let bins = if rank == 1 { vec![1, 1] } else { vec![1, 1, 1] };
        h.send_to(rank, TAG_ECHO, "%auld", &[Value::ULongArray(bins)]).await.unwrap();
    }
    let p = h.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::ULongArray(vec![3, 3, 3])]);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::FilterError { rank, message, .. }) => {
            assert_eq!(rank, 1);
            assert!(message.contains("comm node") && message.contains("histogram"), "{message}");
            assert!(message.contains("expected 3 bins") && message.contains("%auld"), "{message}");
        }
        other => panic!("expected FilterError, got {other:?}"),
    }

    // The Rust top-k, k = 2: each node keeps its best values across waves.
    let t = net.new_stream(&net.broadcast_communicator(), options("topk", &[Value::UInt(2)])).await.unwrap();
    for (x, best) in [(100, [103, 102]), (0, [103, 102]), (200, [203, 202])] {
        t.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
        let p = match t.recv_timeout(LIMIT).await {
            Ok(p) => p,
            Err(e) => panic!("{e}; events: {:?}", std::iter::from_fn(|| net.try_event()).collect::<Vec<_>>()),
        };
        assert_eq!(p.values().unwrap(), vec![Value::LongArray(best.to_vec())], "after x = {x}");
    }

    // New parameters between waves, at every node: 2 bins now.
    h.set_params(&[Value::UInt(2)]).unwrap();
    h.send(TAG_ECHO, "%auld", &[Value::ULongArray(vec![2, 3])]).await.unwrap();
    let p = h.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::ULongArray(vec![8, 12])]);
    // Parameters the front-end's instance refuses are an error there, and change nothing.
    let err = h.set_params(&[Value::Str("many".into())]).unwrap_err().to_string();
    assert!(err.contains("front-end") && err.contains("number of bins"), "{err}");
    t.set_params(&[Value::UInt(1)]).unwrap();
    t.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    let p = t.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::LongArray(vec![203])]);

    // Parameters a plug-in refuses refuse the stream, naming the filter's reason.
    let err = net.new_stream(&net.broadcast_communicator(), options("histogram", &[])).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("histogram") && text.contains("number of bins"), "{text}");
    finish(net).await;
}

#[tokio::test]
async fn a_plugin_for_another_architecture_is_refused_before_any_process_starts() {
    let dir = TestDir::new("plugins-foreign");
    let mut header = std::fs::read(histogram_so(&dir)).unwrap();
    // e_machine: aarch64 (183), or x86_64 (62) on an aarch64 host.
    let other: u16 = if cfg!(target_arch = "aarch64") { 62 } else { 183 };
    header[18..20].copy_from_slice(&other.to_le_bytes());
    let foreign = dir.path("libforeign.so");
    std::fs::write(&foreign, &header).unwrap();
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let err = NetworkBuilder::new(topo).treecast_path(TREECAST).plugin(&foreign).launch().await.unwrap_err();
    assert!(matches!(err, ApiError::Plugin(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("libforeign.so") && text.contains("built for"), "{text}");
}

#[tokio::test]
async fn a_plugin_shipped_down_the_tree_runs_at_every_level_once_its_file_is_gone() {
    let dir = TestDir::new("plugins-shipped");
    let histogram = histogram_so(&dir);
    // Comm nodes at two levels: the bytes pass through the first to the second.
    let net = launch_with("balanced:2x2x2", &[]).await;
    assert_eq!(net.backends(), 8);
    let plugin = net.load_filter(&histogram).await.unwrap();
    assert_eq!((plugin.name(), plugin.version()), ("histogram", 1));
    std::fs::remove_file(&histogram).unwrap();
    let h =
        net.new_stream(&net.broadcast_communicator(), options("histogram", &[Value::UInt(2)])).await.unwrap();
    h.send(TAG_ECHO, "%auld", &[Value::ULongArray(vec![1, 5])]).await.unwrap();
    let p = h.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::ULongArray(vec![8, 40])]);
    assert!(net.try_event().is_none(), "no node refused the plug-in");
    // Without the file, loading again is an error naming it.
    let err = net.load_filter(&histogram).await.unwrap_err().to_string();
    assert!(err.contains("libhistogram.so"), "{err}");
    finish(net).await;
}

#[test]
fn run_with_a_filter_sums_the_number_every_host_printed_at_every_node() {
    let dir = TestDir::new("plugins-run");
    let so = c_plugin(&dir, "sum_outputs");
    let tag = format!("{}", std::process::id());
    let run = |filter: String| {
        let out = Command::new(TREECAST)
            .args(["run", "--local", "8", "--topology", "kary:2", "--filter", &filter])
            .args(["--", "sh", "-c", "echo $((TREECAST_RANK + 1))"])
            .env("TREECAST_TEST_TAG", &tag)
            .output()
            .unwrap();
        assert_no_leftovers(&format!("TREECAST_TEST_TAG={tag}"));
        out
    };
    let out = run(format!("{}:sum_outputs", so.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // 1 + 2 + ... + 8, from 8 ranks.
    assert_eq!(stdout, "36\n8\n");
    let out = run(format!("{}:median", so.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("sum_outputs") && stderr.contains("median"), "{stderr}");
}

/// `treecast bench prefix-tree` runs the C++ merge in a tree and at a flat front-end,
/// checks both merged the same prefix tree over every rank, and prints the ratio.
#[test]
fn bench_prefix_tree_merges_in_the_tree_and_at_the_front_end_alone() {
    let dir = TestDir::new("plugins-bench-prefix");
    let so = compiled(&dir, "c++", "prefix_tree.cpp", &["-std=c++17"]);
    let tag = format!("{}", std::process::id());
    let out = Command::new(TREECAST)
        .args(["bench", "prefix-tree", "--local", "12", "--topology", "kary:3", "--waves", "2"])
        .args(["--depth", "5", "--classes", "6"])
        .arg(&so)
        .env("TREECAST_TEST_TAG", &tag)
        .output()
        .unwrap();
    assert_no_leftovers(&format!("TREECAST_TEST_TAG={tag}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // Six classes: main, two at f1, four at f2, six at f3 and f4 (19 paths).
    assert!(stdout.contains("12 back-ends") && stdout.contains("(19 call paths)"), "{stdout}");
    assert!(
        stdout.contains("kary:3") && stdout.contains("flat") && stdout.contains("merged in the tree"),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_cpp_filter_merges_call_graph_prefix_trees_at_every_node() {
    let dir = TestDir::new("plugins-stat");
    let so = compiled(&dir, "c++", "prefix_tree.cpp", &["-std=c++17"]);
    let net = launch_with("balanced:2x2", &[]).await;
    net.load_filter(&so).await.unwrap();
    let s = net.new_stream(&net.broadcast_communicator(), options("prefix_tree", &[])).await.unwrap();
    let traces: [&[&str]; 4] = [
        &["main", "solve", "mpi_wait"],
        &["main", "solve", "mpi_wait"],
        &["main", "solve", "compute"],
        &["main", "io"],
    ];
    for (rank, trace) in traces.iter().enumerate() {
        let frames = Value::StrArray(trace.iter().map(|f| (*f).to_owned()).collect());
        s.send_to(rank as u32, TAG_ECHO, "%as", &[frames]).await.unwrap();
    }
    let p = s.recv_timeout(LIMIT).await.unwrap();
    let strings = |items: &[&str]| Value::StrArray(items.iter().map(|i| (*i).to_owned()).collect());
    let paths = strings(&["main", "main/io", "main/solve", "main/solve/compute", "main/solve/mpi_wait"]);
    let ranks = strings(&["0,1,2,3", "3", "0,1,2", "2", "0,1"]);
    assert_eq!(p.values().unwrap(), vec![paths, ranks]);
    assert!(net.try_event().is_none(), "no node refused a packet");
    finish(net).await;
}

#[test]
fn bench_filter_compares_a_plugin_sum_with_the_built_in_on_one_tree() {
    let dir = TestDir::new("plugins-bench");
    let so = c_plugin(&dir, "sum");
    let tag = format!("{}-bench", std::process::id());
    let out = Command::new(TREECAST)
        .args(["bench", "filter", "--local", "4", "--topology", "kary:2", "--tp", "20", "--rounds", "1"])
        .arg(format!("{}:plugin_sum", so.display()))
        .env("TREECAST_TEST_TAG", &tag)
        .output()
        .unwrap();
    assert_no_leftovers(&format!("TREECAST_TEST_TAG={tag}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("built-in sum") && stdout.contains("plug-in plugin_sum") && stdout.contains("ratio"),
        "{stdout}"
    );
}

/// A plug-in that sums `%d` packets and, at a comm node, answers a wave of
/// `TAG_ADD_RANK` with a packet down: `TAG_SLEEP`, `%d 0`, which the generic
/// back-ends answer with their rank.
const ASK_AGAIN_C: &str = r#"
#include <string.h>
#include "treecast_filter.h"
#include "treecast_filter_helpers.h"
static int32_t create(const uint8_t *p, size_t n, const treecast_place *pl, void **s, char *e, size_t el) {
    (void)p; (void)n; (void)pl; (void)e; (void)el; *s = NULL; return TREECAST_OK;
}
static int32_t reduce(void *s, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad, char *e, size_t el) {
    (void)s;
    int32_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        tc_reader r = tc_reader_of(packets[i].payload, packets[i].payload_len);
        int32_t v;
        if (tc_read_scalar(&r, TC_I32, &v) != 0) { *bad = packets[i].rank; tc_error(e, el, "not %d"); return TREECAST_ERR_PACKET; }
        sum += v;
    }
    uint8_t out[5] = {TC_I32};
    memcpy(out + 1, &sum, 4);
    if (host->emit(sink, TREECAST_UP, packets[0].tag, out, 5) != 0) return TREECAST_ERR_FILTER;
    if (place->role == TREECAST_ROLE_COMM_NODE && packets[0].tag == TAG_ADD_RANK) {
        int32_t zero = 0;
        memcpy(out + 1, &zero, 4);
        if (host->emit(sink, TREECAST_DOWN, TAG_SLEEP, out, 5) != 0) return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}
static int32_t get_state(void *s, const treecast_host *h, treecast_sink *k, char *e, size_t el) {
    (void)s; (void)h; (void)k; (void)e; (void)el; return TREECAST_OK;
}
static int32_t set_params(void *s, const uint8_t *p, size_t n, char *e, size_t el) {
    (void)s; (void)p; (void)n; (void)e; (void)el; return TREECAST_ERR_PARAMS;
}
static void destroy(void *s) { (void)s; }
static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "ask_again", 1, 0, 0,
    create, reduce, get_state, set_params, destroy,
};
const treecast_filter_table *treecast_filter_v1(void) { return &table; }
"#;

#[tokio::test]
async fn packets_a_comm_node_filter_sends_down_reach_its_back_ends_and_their_answers_come_up() {
    let dir = TestDir::new("plugins-down");
    // The generic back-end's request tags, as the filter's C knows them.
    let tags = format!("#define TAG_ADD_RANK {TAG_ADD_RANK}\n#define TAG_SLEEP {TAG_SLEEP}\n");
    let so = c_source(&dir, "ask_again", &format!("{tags}{ASK_AGAIN_C}"));
    let net = launch_with("balanced:2x2", &[]).await;
    net.load_filter(&so).await.unwrap();
    let s = net.new_stream(&net.broadcast_communicator(), options("ask_again", &[])).await.unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    let first = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!((first.tag(), first.values().unwrap()), (TAG_ADD_RANK, vec![Value::Int(6)]));
    // The tool never sent TAG_SLEEP: each comm node's filter did, to its own back-ends.
    let second = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!((second.tag(), second.values().unwrap()), (TAG_SLEEP, vec![Value::Int(6)]));
    finish(net).await;
}

/// Kills comm node `node` (SIGKILL) and waits until `ranks`, the back-ends below it,
/// have rejoined `parent`.
async fn kill_and_await_rejoin(net: &mut Network, node: u32, ranks: RankSet, parent: &str) {
    let pid = commnode_pid(net.session(), node);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    let mut back = RankSet::new();
    while back != ranks {
        match tokio::time::timeout(LIMIT, net.next_event()).await {
            Ok(Some(Event::NodeLost { ranks: lost, .. })) => assert_eq!(lost, ranks),
            Ok(Some(Event::RanksRejoined { ranks: r, parent: p })) => {
                assert_eq!(p, parent);
                back.union_with(&r);
            }
            other => panic!("expected node {node}'s back-ends {ranks} to rejoin {parent}: {other:?}"),
        }
    }
}

/// Sends `x` to every rank (each answers `x + rank`) and checks the front-end's
/// running total, which grows by the wave's sum.
async fn next_total(s: &mut Stream, x: i32, total: &mut i64) {
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
    *total += (0..8).map(|r| i64::from(x + r)).sum::<i64>();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::Long(*total)], "after x = {x}");
}

#[tokio::test]
async fn a_running_total_stays_right_when_comm_nodes_are_killed_and_their_children_rejoin() {
    let dir = TestDir::new("plugins-recovery");
    let so = c_plugin(&dir, "running_total");
    // Pre-order ids of balanced:2x2x2: 0 front-end; 1 comm node (ranks 0-3) over comm
    // nodes 2 and 5; 8 comm node (ranks 4-7) over comm nodes 9 (ranks 4-5) and 12.
    let topo = Topology::from_spec("balanced:2x2x2", None).unwrap();
    let mut net = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .rejoin_within(Some(LIMIT))
        .plugin(&so)
        .launch()
        .await
        .unwrap();
    let mut s = net.new_stream(&net.broadcast_communicator(), options("running_total", &[])).await.unwrap();
    let mut total = 0;
    for x in 1..=3 {
        next_total(&mut s, x, &mut total).await;
    }
    // Node 9 held the total of ranks 4 and 5 so far: node 8 takes it over.
    kill_and_await_rejoin(&mut net, 9, RankSet::range(4, 2), "comm node localhost (node 8)").await;
    for x in 4..=6 {
        next_total(&mut s, x, &mut total).await;
    }
    // Node 1 held nothing of its own (its children sum their back-ends): the
    // front-end takes over its empty state and its children's totals come up again.
    kill_and_await_rejoin(&mut net, 1, RankSet::range(0, 4), "front-end").await;
    for x in 7..=9 {
        next_total(&mut s, x, &mut total).await;
    }
    assert!(net.try_event().is_none(), "no filter error: {:?}", net.try_event());
    finish(net).await;
}

/// A plug-in that passes the first packet of each wave on, but whose entry point
/// gives no table in comm node 5 (`TREECAST_NODE_ID=5`): that node alone refuses it.
const PICKY_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include "treecast_filter.h"
#include "treecast_filter_helpers.h"
static int32_t create(const uint8_t *p, size_t n, const treecast_place *pl, void **s, char *e, size_t el) {
    (void)p; (void)n; (void)pl; (void)e; (void)el; *s = NULL; return TREECAST_OK;
}
static int32_t reduce(void *s, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad, char *e, size_t el) {
    (void)s; (void)place; (void)bad; (void)e; (void)el;
    if (n == 0) return TREECAST_OK;
    return host->emit(sink, TREECAST_UP, packets[0].tag, packets[0].payload, packets[0].payload_len) == 0
        ? TREECAST_OK : TREECAST_ERR_FILTER;
}
static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "picky", 1, 0, 0,
    create, reduce, tc_no_state, tc_no_params, tc_no_destroy, NULL,
};
const treecast_filter_table *treecast_filter_v1(void) {
    const char *node = getenv("TREECAST_NODE_ID");
    return node != NULL && strcmp(node, "5") == 0 ? NULL : &table;
}
"#;

#[tokio::test]
async fn load_filter_returns_once_every_comm_node_loaded_it_or_names_the_one_that_refused() {
    let dir = TestDir::new("plugins-refused");
    let picky = c_source(&dir, "picky", PICKY_C);
    // Comm nodes 1, 2, 5, 8, 9 and 12; node 5 is at the second level.
    let net = launch_with("balanced:2x2x2", &[]).await;
    let err = net.load_filter(&picky).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ApiError::FilterRefused { others: 0, .. }), "{err:?}");
    assert!(text.contains("libpicky.so") && text.contains("(node 5)"), "{text}");
    assert!(text.contains("returned no table"), "{text}");
    // Tools that watch events see it too.
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::FilterError { message, .. }) => assert!(message.contains("(node 5)"), "{message}"),
        other => panic!("expected FilterError, got {other:?}"),
    }
    // One every node loads: once the call returns, a stream finds it everywhere.
    let histogram = histogram_so(&dir);
    net.load_filter(&histogram).await.unwrap();
    let h =
        net.new_stream(&net.broadcast_communicator(), options("histogram", &[Value::UInt(2)])).await.unwrap();
    h.send(TAG_ECHO, "%auld", &[Value::ULongArray(vec![1, 2])]).await.unwrap();
    let p = h.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::ULongArray(vec![8, 16])]);
    assert!(net.try_event().is_none(), "no node refused the histogram");
    finish(net).await;
}

/// A downstream plug-in: multiplies the `%d` of each packet going down by its
/// parameter k (`%d`), which can change while the stream runs.
const SCALE_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include "treecast_filter.h"
#include "treecast_filter_helpers.h"
static int read_k(const uint8_t *p, size_t n, int32_t *k, char *e, size_t el) {
    tc_reader r = tc_reader_of(p, n);
    if (tc_read_scalar(&r, TC_I32, k) != 0 || r.left != 0) { tc_error(e, el, "scale takes k (%d)"); return -1; }
    return 0;
}
static int32_t create(const uint8_t *p, size_t n, const treecast_place *pl, void **s, char *e, size_t el) {
    (void)pl;
    int32_t *k = malloc(sizeof *k);
    if (k == NULL) return TREECAST_ERR_FILTER;
    if (read_k(p, n, k, e, el) != 0) { free(k); return TREECAST_ERR_PARAMS; }
    *s = k;
    return TREECAST_OK;
}
static int32_t reduce(void *s, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad, char *e, size_t el) {
    (void)place;
    for (size_t i = 0; i < n; i++) {
        tc_reader r = tc_reader_of(packets[i].payload, packets[i].payload_len);
        int32_t v;
        if (tc_read_scalar(&r, TC_I32, &v) != 0) { *bad = packets[i].rank; tc_error(e, el, "not %d"); return TREECAST_ERR_PACKET; }
        v *= *(int32_t *)s;
        uint8_t out[5] = {TC_I32};
        memcpy(out + 1, &v, 4);
        if (host->emit(sink, TREECAST_UP, packets[i].tag, out, 5) != 0) return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}
static int32_t set_params(void *s, const uint8_t *p, size_t n, char *e, size_t el) {
    int32_t k;
    if (read_k(p, n, &k, e, el) != 0) return TREECAST_ERR_PARAMS;
    *(int32_t *)s = k;
    return TREECAST_OK;
}
static void destroy(void *s) { free(s); }
static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "scale", 1, 0, 0,
    create, reduce, tc_no_state, set_params, destroy, NULL,
};
const treecast_filter_table *treecast_filter_v1(void) { return &table; }
"#;

/// `source`, a C plug-in, compiled with the system's `cc` into `dir` as `libNAME.so`.
fn c_source(dir: &TestDir, name: &str, source: &str) -> PathBuf {
    let src = dir.path(&format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let so = dir.path(&format!("lib{name}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg("-o")
        .arg(&so)
        .arg(&src)
        .status()
        .expect("a C compiler (`cc`)");
    assert!(status.success(), "cc failed on {name}.c");
    so
}

#[tokio::test]
async fn a_downstream_plugin_transforms_packets_at_every_comm_node_with_parameters_changed_between_waves() {
    let dir = TestDir::new("plugins-downstream");
    let so = c_source(&dir, "scale", SCALE_C);
    // Two levels of comm nodes: a packet going down is scaled twice.
    let net = launch_with("balanced:2x2x2", &[]).await;
    net.load_filter(&so).await.unwrap();
    let mut down = FilterSpec::new("scale", 1);
    down.params = params(&[Value::Int(2)]);
    let opts = StreamOptions { up: FilterSpec::new("sum", 1), down, ..StreamOptions::default() };
    let s = net.new_stream(&net.broadcast_communicator(), opts).await.unwrap();
    // Each back-end answers x + rank with x as it reached it: 5 * k * k.
    let wave = |k: i32| i64::from(5 * k * k) * 8 + (0..8).sum::<i64>();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(5)]).await.unwrap();
    assert_eq!(s.recv_timeout(LIMIT).await.unwrap().values().unwrap(), vec![Value::Int(wave(2) as i32)]);
    s.set_down_params(&[Value::Int(3)]).unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(5)]).await.unwrap();
    assert_eq!(s.recv_timeout(LIMIT).await.unwrap().values().unwrap(), vec![Value::Int(wave(3) as i32)]);
    // Parameters the comm nodes refuse are reported by each of the first level (which
    // do not pass them on), naming it; k stays 3.
    s.set_down_params(&[Value::Str("many".into())]).unwrap();
    for _ in 0..2 {
        match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
            Some(Event::FilterError { message, .. }) => {
                assert!(message.contains("comm node") && message.contains("scale takes k"), "{message}")
            }
            other => panic!("expected FilterError, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(5)]).await.unwrap();
    assert_eq!(s.recv_timeout(LIMIT).await.unwrap().values().unwrap(), vec![Value::Int(wave(3) as i32)]);
    // A stream without a downstream filter refuses them at once.
    let plain = net.new_stream(&net.broadcast_communicator(), options("sum", &[])).await.unwrap();
    let err = plain.set_down_params(&[Value::Int(1)]).unwrap_err().to_string();
    assert!(err.contains("no downstream filter"), "{err}");
    finish(net).await;
}
