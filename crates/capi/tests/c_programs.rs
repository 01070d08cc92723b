//! The C programs of `tests/c/`, compiled against libtreecast and run: each is its
//! own front-end, comm node and back-end on a local tree, and exits 0 only when every
//! check in it held. Also under AddressSanitizer and valgrind, and as C++ from two
//! translation units.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a C program may run before it counts as hung.
const LIMIT: Duration = Duration::from_secs(120);

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put libtreecast (this test runs from `<target>/<profile>/deps`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("finding this test's path: {e}"));
    let dir =
        exe.parent().and_then(Path::parent).unwrap_or_else(|| panic!("{} has no grandparent", exe.display()));
    assert!(
        dir.join("libtreecast.so").exists() && dir.join("libtreecast.a").exists(),
        "libtreecast.so and libtreecast.a are not in {}: build them with `cargo build -p treecast-capi` (tools/test, the README's test command, does)",
        dir.display()
    );
    dir.to_path_buf()
}

/// How to build one program.
struct Build<'a> {
    compiler: &'a str,
    sources: &'a [&'a str],
    flags: &'a [&'a str],
    /// Link the static library instead of the shared one.
    static_lib: bool,
}

/// Compiles `build` into `out`, failing with the compiler's messages.
fn compile(build: &Build<'_>, out: &Path) {
    let lib = lib_dir();
    let mut cmd = Command::new(build.compiler);
    cmd.args(build.flags).arg("-Wall").arg("-Wextra").arg("-Werror").arg("-pthread");
    cmd.arg("-I").arg(root().join("include"));
    cmd.args(build.sources.iter().map(|s| root().join("tests/c").join(s)));
    match build.static_lib {
        true => cmd.arg(lib.join("libtreecast.a")).args(["-lm", "-ldl"]),
        false => cmd.arg("-L").arg(&lib).arg("-ltreecast").arg(format!("-Wl,-rpath,{}", lib.display())),
    };
    let output =
        cmd.arg("-o").arg(out).output().unwrap_or_else(|e| panic!("running {}: {e}", build.compiler));
    assert!(
        output.status.success(),
        "compiling {:?} failed:\n{}",
        build.sources,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `program` (with `wrapper` before it, if any) in a process group of its own,
/// so that a hung run takes its whole tree with it; returns its stdout.
fn run(wrapper: &[&str], program: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let (exe, mut all_args): (PathBuf, Vec<PathBuf>) = match wrapper.split_first() {
        Some((first, rest)) => {
            (PathBuf::from(first), rest.iter().map(PathBuf::from).chain([program.into()]).collect())
        }
        None => (program.to_path_buf(), Vec::new()),
    };
    all_args.extend(args.iter().map(PathBuf::from));
    let mut child = Command::new(&exe)
        .args(&all_args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
    let group = child.id();
    let started = Instant::now();
    // The pipes are read once it ends: the programs write a few lines at most.
    while child.try_wait().ok().flatten().is_none() {
        if started.elapsed() > LIMIT {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
            let _ = child.wait();
            panic!("{} ran past {LIMIT:?} and was killed with its process group", program.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output =
        child.wait_with_output().unwrap_or_else(|e| panic!("waiting for {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        wrapper.join(" "),
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Builds the C test `name` (with the shared roles) and runs it.
fn c_test(name: &str, flags: &[&str], static_lib: bool, wrapper: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let exe = dir.path().join(name);
    let source = format!("{name}.c");
    let mut all_flags = vec!["-std=c11", "-g"];
    all_flags.extend_from_slice(flags);
    compile(&Build { compiler: "cc", sources: &[&source, "common.c"], flags: &all_flags, static_lib }, &exe);
    run(wrapper, &exe, &[], env)
}

#[test]
fn c_front_end_and_back_ends_add_integers_and_survive_a_lost_rank() {
    assert!(c_test("sum", &[], false, &[], &[]).contains("sum: ok"));
}

#[test]
fn c_program_links_the_static_library() {
    assert!(c_test("sum", &[], true, &[], &[]).contains("sum: ok"));
}

#[test]
fn c_error_paths_give_codes_and_messages() {
    assert!(c_test("errors", &[], false, &[], &[]).contains("errors: ok"));
}

#[test]
fn c_poll_loop_wakes_on_the_descriptors() {
    assert!(c_test("poll", &[], false, &[], &[]).contains("poll: ok"));
}

#[test]
fn c_requests_complete_wait_and_cancel() {
    assert!(c_test("requests", &[], false, &[], &[]).contains("requests: ok"));
}

#[test]
fn c_files_reach_every_back_end_with_progress() {
    assert!(c_test("files", &[], false, &[], &[]).contains("files: ok"));
}

#[test]
fn c_spawn_clock_monitor_and_topology() {
    assert!(c_test("tree", &[], false, &[], &[]).contains("tree: ok"));
}

#[test]
fn c_back_ends_attach_through_the_attach_file() {
    assert!(c_test("attach", &[], false, &[], &[]).contains("attach: ok"));
}

#[test]
fn c_handles_are_shared_by_threads() {
    assert!(c_test("threads", &[], false, &[], &[]).contains("threads: ok"));
}

/// AddressSanitizer and UndefinedBehaviorSanitizer in every process of the tree (the
/// comm nodes and back-ends are the same program); leaks are reported at exit.
#[test]
fn c_programs_are_clean_under_address_sanitizer() {
    let flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"];
    let env = [("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=23")];
    for name in ["sum", "errors", "threads", "poll", "requests", "files", "tree", "attach"] {
        assert!(c_test(name, &flags, false, &[], &env).contains(": ok"));
    }
}

/// The front-end under valgrind's memcheck: no invalid access, no definite or
/// indirect leak (threads of the runtime still running at exit are "possibly lost"
/// and not counted).
#[test]
#[cfg_attr(not(has_valgrind), ignore = "valgrind is not installed")]
fn c_front_end_is_clean_under_valgrind() {
    let wrapper = [
        "valgrind",
        "-q",
        "--error-exitcode=9",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect",
        "--show-leak-kinds=definite,indirect",
    ];
    for name in ["sum", "errors", "requests"] {
        assert!(c_test(name, &[], false, &wrapper, &[]).contains(": ok"));
    }
}

#[test]
#[cfg_attr(not(has_cxx), ignore = "no C++ compiler (c++)")]
fn cpp_includes_the_header_twice_and_from_two_units() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let exe = dir.path().join("two_units");
    let build = Build {
        compiler: "c++",
        sources: &["two_units_a.cpp", "two_units_b.cpp"],
        flags: &["-std=c++17"],
        static_lib: false,
    };
    compile(&build, &exe);
    assert!(run(&[], &exe, &[], &[]).contains("two units: ok"));
}

/// The complete example of docs/c-api.md compiles as it is written and prints the sum.
#[test]
fn the_guide_example_builds_and_runs() {
    let guide = std::fs::read_to_string(root().join("docs/c-api.md"))
        .unwrap_or_else(|e| panic!("reading docs/c-api.md: {e}"));
    let code = guide
        .split("```c\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("docs/c-api.md has no ```c block"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let source = dir.path().join("example.c");
    std::fs::write(&source, code).unwrap_or_else(|e| panic!("writing {}: {e}", source.display()));
    let exe = dir.path().join("example");
    let lib = lib_dir();
    let output = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(&source)
        .arg("-L")
        .arg(&lib)
        .arg("-ltreecast")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(
        output.status.success(),
        "the guide's example does not compile:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(run(&[], &exe, &[], &[]).trim(), format!("sum: {}", 7 * (1..=16).sum::<i32>()));
}

/// The C twin of `treecast bench microbench` builds and measures a small tree on its
/// own (as its own comm node and back-end): one JSON line with every figure.
#[test]
fn the_microbench_twin_runs() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let exe = dir.path().join("microbench");
    let lib = lib_dir();
    let output = Command::new("cc")
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join("examples/c/microbench.c"))
        .arg(lib.join("libtreecast.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(
        output.status.success(),
        "examples/c/microbench.c does not compile:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = run(&[], &exe, &["-", "balanced:2x2", "0", "20", "50"], &[]);
    let figures: serde_json::Value =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
    assert_eq!(figures["backends"], 4, "{line}");
    for key in ["instantiation_s", "rtt_us_median", "rtt_us_mean", "rtt_us_p99", "reductions_per_s"] {
        assert!(figures[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {line}");
    }

    // `treecast bench microbench --c-twin` runs it beside the Rust API, in rounds.
    let treecast = lib.join("treecast");
    assert!(treecast.exists(), "{} is missing: build it with `cargo build --workspace`", treecast.display());
    let exe_arg = exe.to_string_lossy();
    let args = ["bench", "microbench", "--topology", "balanced:2x2", "--rt", "20", "--tp", "50"];
    let out = run(
        &[],
        &treecast,
        &[&args[..], &["--c-twin", &exe_arg, "--twin-rounds", "2", "--json"]].concat(),
        &[],
    );
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    assert_eq!(lines.len(), 5, "two rounds of two measurements, then the summary:\n{out}");
    for round in lines[..4].chunks(2) {
        assert!(round[0]["api"].is_null() && round[1]["api"] == "c", "{out}");
    }
    let summary = &lines[4]["summary"];
    assert_eq!(summary["rounds"], 2, "{out}");
    for key in ["rtt_ratio", "reductions_ratio", "c_rtt_us_median", "rust_reductions_per_s"] {
        assert!(summary[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {out}");
    }
    assert!(summary["targets_met"].is_boolean(), "{out}");
}
