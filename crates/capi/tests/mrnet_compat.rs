//! MRNet's interface over treecast (compat/mrnet, docs/mrnet-compat.md): `tools/mrnet-prefix`
//! lays out an install prefix from this build, the MRNet-style programs of `tests/mrnet`
//! (a front-end, a back-end and a filter function, written against MRNet 5.0.1's headers)
//! are compiled with g++ against it as MRNet tools are, and run on a local tree of 2 comm
//! nodes over 4 back-ends (a topology file MRNet's `BalancedTree` wrote, after
//! `tests/mrnet/tree.cpp` checked the generators): once linked to libmrnet.so, once to the static libraries, and
//! over back-ends written in C on MRNet's lightweight library (`be_lightweight.c`).
//! Then back-ends given MRNet's arguments join a tree in attach mode through its
//! attach file (`tests/mrnet/attach.cpp`), and an MRNet front-end in attach mode starts
//! its back-ends itself under the leaves it reads, as STAT does (`tests/mrnet/attach_fe.cpp`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest one program may run before it counts as hung.
const LIMIT: Duration = Duration::from_secs(180);

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put libtreecast.a and the treecast binary (this test runs from
/// `<target>/<profile>/deps`).
fn cargo_out() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("finding this test's path: {e}"));
    let dir =
        exe.parent().and_then(Path::parent).unwrap_or_else(|| panic!("{} has no grandparent", exe.display()));
    for f in ["libtreecast.a", "treecast"] {
        assert!(
            dir.join(f).exists(),
            "{f} is not in {}: build the workspace first (tools/test, the README's test command, does)",
            dir.display()
        );
    }
    dir.to_path_buf()
}

/// Runs `cmd` to its end, failing with its output unless it exits 0.
fn must(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// g++ with the prefix's headers, as an MRNet tool's build runs it.
fn gxx(prefix: &Path) -> Command {
    let mut c = Command::new("g++");
    c.args(["-std=c++11", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}/include", prefix.display()));
    c
}

/// The C compiler with the prefix's headers, as MRNet's lightweight programs are built.
fn gcc(prefix: &Path) -> Command {
    let mut c = Command::new("cc");
    c.args(["-g", "-Wall", "-Wextra", "-Werror"]).arg(format!("-I{}/include", prefix.display()));
    c
}

/// Runs the front-end in a process group of its own (its tree with it), output to
/// files in `dir`, with `env` added to its environment; kills the group when it ends
/// or hangs. Returns its stdout.
fn run_front_end(fe: &Path, args: &[&Path], env: &[(&str, &str)], dir: &Path) -> String {
    let (out, err) = (dir.join("fe.out"), dir.join("fe.err"));
    let file =
        |p: &Path| std::fs::File::create(p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
    let mut child = Command::new(fe)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::from(file(&out)))
        .stderr(Stdio::from(file(&err)))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", fe.display()));
    let group = format!("-{}", child.id());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("waiting for {}: {e}", fe.display())) {
            break Some(s);
        }
        if started.elapsed() > LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever is left of the tree goes with the group.
    let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    let _ = child.wait();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    match status {
        None => panic!("{} ran past {LIMIT:?} and was killed; stderr:\n{}", fe.display(), read(&err)),
        Some(s) => assert!(
            s.success(),
            "{} failed ({s}):\nstdout:\n{}\nstderr:\n{}",
            fe.display(),
            read(&out),
            read(&err)
        ),
    }
    read(&out)
}

#[test]
#[cfg_attr(not(has_gxx), ignore = "no g++ to build MRNet-style programs with")]
fn mrnet_style_programs_build_against_the_prefix_and_run() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let dir = tmp.path();
    let prefix = dir.join("prefix");
    must(
        Command::new(root().join("tools/mrnet-prefix")).arg("--from").arg(cargo_out()).arg(&prefix),
        "tools/mrnet-prefix",
    );
    for f in [
        "include/mrnet/MRNet.h",
        "include/xplat/NetUtils.h",
        "lib/libmrnet.so",
        "lib/libmrnet.a",
        "lib/libxplat.so",
        "lib/libxplat.a",
        "include/mrnet_lightweight/MRNet.h",
        "include/xplat_lightweight/NetUtils.h",
        "lib/libmrnet_lightweight.so",
        "lib/libmrnet_lightweight.a",
        "lib/libxplat_lightweight.so",
        "lib/libxplat_lightweight.a",
        "bin/mrnet_commnode",
    ] {
        assert!(prefix.join(f).exists(), "the prefix has no {f}");
    }
    let src = root().join("tests/mrnet");
    let lib = prefix.join("lib");
    let shared = |c: &mut Command| {
        c.arg(format!("-L{}", lib.display()))
            .args(["-lmrnet", "-lxplat"])
            .arg(format!("-Wl,-rpath,{}", lib.display()));
    };
    let (fe, fe_static, be, filter) =
        (dir.join("fe"), dir.join("fe_static"), dir.join("be"), dir.join("filter.so"));
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&fe).arg(src.join("fe.cpp"));
    shared(&mut c);
    must(&mut c, "compiling tests/mrnet/fe.cpp against libmrnet.so");
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&be).arg(src.join("be.cpp"));
    shared(&mut c);
    must(&mut c, "compiling tests/mrnet/be.cpp against libmrnet.so");
    // Built as MRNet's filters are: a shared object linking nothing.
    must(
        gxx(&prefix).args(["-fPIC", "-shared"]).arg("-o").arg(&filter).arg(src.join("filter.cpp")),
        "compiling tests/mrnet/filter.cpp",
    );
    must(
        gxx(&prefix)
            .arg("-o")
            .arg(&fe_static)
            .arg(src.join("fe.cpp"))
            .arg(format!("-L{}", lib.display()))
            .args(["-Wl,-Bstatic", "-lmrnet", "-lxplat", "-Wl,-Bdynamic", "-lpthread", "-ldl", "-lm"]),
        "compiling tests/mrnet/fe.cpp against libmrnet.a",
    );
    // MRNet's topology generators (Tree.h) check what they write, and write the tree
    // the front-ends run on: 2 comm nodes over 4 back-ends, all on localhost.
    let (tree, topology) = (dir.join("tree"), dir.join("topology"));
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&tree).arg(src.join("tree.cpp"));
    shared(&mut c);
    must(&mut c, "compiling tests/mrnet/tree.cpp");
    must(Command::new(&tree).arg(&topology), "tests/mrnet/tree.cpp");
    let written = std::fs::read_to_string(&topology).unwrap_or_default();
    assert!(written.starts_with("localhost:0 =>\n\tlocalhost:1\n\tlocalhost:2 ;"), "{written}");
    for front_end in [&fe, &fe_static] {
        let out = run_front_end(front_end, &[&topology, &be, &filter, dir], &[], dir);
        assert!(out.contains("mrnet-compat: ok"), "{} printed:\n{out}", front_end.display());
    }

    // The same front-end over back-ends written in C on MRNet's lightweight library,
    // compiled by a C compiler as MRNet's lightweight programs are: shared, then static.
    let (be_lw, be_lw_static) = (dir.join("be_lightweight"), dir.join("be_lightweight_static"));
    let mut c = gcc(&prefix);
    c.arg("-o").arg(&be_lw).arg(src.join("be_lightweight.c")).arg(format!("-L{}", lib.display()));
    c.args(["-lmrnet_lightweight", "-lxplat_lightweight"]).arg(format!("-Wl,-rpath,{}", lib.display()));
    must(&mut c, "compiling tests/mrnet/be_lightweight.c against libmrnet_lightweight.so");
    let mut c = gcc(&prefix);
    c.arg("-o").arg(&be_lw_static).arg(src.join("be_lightweight.c")).arg(format!("-L{}", lib.display()));
    c.args(["-Wl,-Bstatic", "-lmrnet_lightweight", "-lxplat_lightweight", "-Wl,-Bdynamic"]).args([
        "-lstdc++",
        "-lpthread",
        "-ldl",
        "-lm",
    ]);
    must(&mut c, "compiling tests/mrnet/be_lightweight.c against libmrnet_lightweight.a");
    for back_end in [&be_lw, &be_lw_static] {
        let args = [topology.as_path(), back_end, filter.as_path(), dir, Path::new("lightweight")];
        let out = run_front_end(&fe, &args, &[], dir);
        assert!(out.contains("mrnet-compat: ok"), "fe over {} printed:\n{out}", back_end.display());
    }
    // A tool's own comm node program (as MRNet's main is written), named by
    // MRNET_COMM_PATH: the tree's two comm nodes run it, and the test passes over it.
    let commnode = dir.join("commnode");
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&commnode).arg(src.join("commnode.cpp"));
    shared(&mut c);
    must(&mut c, "compiling tests/mrnet/commnode.cpp");
    let mark = dir.join("commnode.pids");
    let text = |p: &Path| p.to_str().unwrap_or_else(|| panic!("{} is not UTF-8", p.display())).to_owned();
    let (commnode_path, mark_path) = (text(&commnode), text(&mark));
    let env = [("MRNET_COMM_PATH", commnode_path.as_str()), ("MRNET_TEST_COMMNODE_MARK", mark_path.as_str())];
    let out = run_front_end(&fe, &[&topology, &be, &filter, dir], &env, dir);
    assert!(out.contains("mrnet-compat: ok"), "fe over commnode printed:\n{out}");
    let pids = std::fs::read_to_string(&mark).unwrap_or_default();
    assert_eq!(pids.lines().count(), 2, "the comm nodes that ran the tool's program: {pids:?}");
    // Not started by a tree, CreateNetworkIN fails and says why.
    let alone = Command::new(&commnode).output().unwrap_or_else(|e| panic!("running commnode: {e}"));
    let said = String::from_utf8_lossy(&alone.stderr);
    assert!(!alone.status.success() && said.contains("not started by treecast as a comm node"), "{said}");

    let attach = dir.join("attach");
    let mut c = gxx(&prefix);
    c.arg(format!("-I{}", root().join("include").display()))
        .arg("-o")
        .arg(&attach)
        .arg(src.join("attach.cpp"));
    shared(&mut c);
    must(c.arg("-lpthread"), "compiling tests/mrnet/attach.cpp");
    let out = run_front_end(&attach, &[&be, &prefix.join("bin/mrnet_commnode"), dir], &[], dir);
    assert!(out.contains("mrnet-attach: ok"), "attach printed:\n{out}");

    // MRNet's attach mode at the front-end: comm nodes only, then back-ends the tool
    // starts itself with MRNet's arguments (5 under 2 leaves: 3 and 2).
    let attach_fe = dir.join("attach_fe");
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&attach_fe).arg(src.join("attach_fe.cpp"));
    shared(&mut c);
    must(c.arg("-lpthread"), "compiling tests/mrnet/attach_fe.cpp");
    let leaves = dir.join("leaves");
    std::fs::write(
        &leaves,
        "# 2 comm nodes; back-ends attach under them\nlocalhost:0 => localhost:1 localhost:2 ;\n",
    )
    .unwrap_or_else(|e| panic!("writing the attach-mode topology file: {e}"));
    let out = run_front_end(
        &attach_fe,
        &[&leaves, &be, Path::new("5")],
        &[("TREECAST_MRNET_BACKENDS", "5"), ("MRNET_STARTUP_TIMEOUT", "60")],
        dir,
    );
    assert!(out.contains("mrnet-attach-fe: ok"), "attach_fe printed:\n{out}");
    // Fewer back-ends than announced: the launch gives up at its limit and the tool
    // is told (an error event, a failing receive), not left waiting.
    let out = run_front_end(
        &attach_fe,
        &[&leaves, &be, Path::new("3"), Path::new("short")],
        &[("TREECAST_MRNET_BACKENDS", "4"), ("MRNET_STARTUP_TIMEOUT", "3")],
        dir,
    );
    assert!(out.contains("mrnet-attach-fe: short: ok"), "attach_fe short printed:\n{out}");

    // Other hosts through MRNet's remote shell: XPLAT_RSH names a stand-in for ssh
    // that records its arguments and runs the command here, XPLAT_RSH_ARGS its
    // arguments (split as a shell would), XPLAT_REMCMD a wrapper the remote command
    // runs the program through (it records its first argument, then runs the rest).
    let rsh_fe = dir.join("rsh_fe");
    let mut c = gxx(&prefix);
    c.arg("-o").arg(&rsh_fe).arg(src.join("rsh_fe.cpp"));
    shared(&mut c);
    must(&mut c, "compiling tests/mrnet/rsh_fe.cpp");
    let rsh = FakeRsh::new(dir);
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        "# 2 comm nodes over 4 back-ends, on made-up hosts\nlocalhost:0 => n1:1 n2:2 ;\n\
         n1:1 => n3:3 n3:4 ;\nn2:2 => n4:5 n4:6 ;\n",
    )
    .unwrap_or_else(|e| panic!("writing the made-up hosts' topology file: {e}"));
    let program = rsh.program.display().to_string();
    let (wrapper, wrapped) = (dir.join("wrapper"), dir.join("wrapped.log"));
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nprintf '%s\\n' \"$1\" >> {}\nshift\nexec \"$@\"\n", wrapped.display()),
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", wrapper.display()));
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("making {} executable: {e}", wrapper.display()));
    }
    let remcmd = format!("{} 'two words'", wrapper.display());
    let out = run_front_end(
        &rsh_fe,
        &[&hosts, &be],
        &[("XPLAT_RSH", &program), ("XPLAT_RSH_ARGS", "-x -o 'SendEnv=A B'"), ("XPLAT_REMCMD", &remcmd)],
        dir,
    );
    assert!(out.contains("mrnet-rsh: ok"), "rsh_fe printed:\n{out}");
    let calls = rsh.calls();
    let mut started = std::collections::BTreeSet::new();
    let mut starts = 0;
    for call in &calls {
        let dash = call.iter().position(|a| a == "--").unwrap_or_else(|| panic!("no `--`: {call:?}"));
        let before = &call[..dash];
        assert!(
            before.windows(3).any(|w| w == ["-x", "-o", "SendEnv=A B"]),
            "XPLAT_RSH_ARGS are not before the host: {call:?}"
        );
        if let [command] = &call[dash + 2..] {
            assert!(
                command.starts_with(&format!("exec {remcmd} env ")),
                "XPLAT_REMCMD is not first: {call:?}"
            );
            started.insert(call[dash + 1].clone());
            starts += 1;
        }
    }
    // The front-end starts the comm nodes, which start the back-ends on their hosts.
    let want: std::collections::BTreeSet<String> = ["n1", "n2", "n3", "n4"].map(String::from).into();
    assert_eq!(started, want, "the remote shell started processes on: {calls:?}");
    // Every process started through it ran through the wrapper, its argument whole.
    let runs = std::fs::read_to_string(&wrapped).unwrap_or_else(|e| panic!("the wrapper never ran: {e}"));
    assert_eq!(runs.lines().collect::<Vec<_>>(), vec!["two words"; starts], "the wrapper's runs");
}

/// A stand-in for MRNet's remote shell (`XPLAT_RSH`): records each call's arguments,
/// one per line, in a file `call.*` of its own; answers ssh's `-G` with `hostname
/// localhost`; runs the remote command here (so made-up hosts run on this machine).
struct FakeRsh {
    program: PathBuf,
    calls: PathBuf,
}

impl FakeRsh {
    fn new(dir: &Path) -> FakeRsh {
        use std::os::unix::fs::PermissionsExt;
        let calls = dir.join("rsh-calls");
        std::fs::create_dir_all(&calls).unwrap_or_else(|e| panic!("creating {}: {e}", calls.display()));
        let program = dir.join("fake-rsh");
        let script = format!(
            "#!/bin/sh\nf=$(mktemp {}/call.XXXXXX)\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$f\"\n\
             for a in \"$@\"; do\n  [ \"$a\" = -- ] && break\n  [ \"$a\" = -G ] && {{ echo 'hostname localhost'; exit 0; }}\n\
             done\nfor last; do :; done\nexec sh -c \"$last\"\n",
            calls.display()
        );
        std::fs::write(&program, script).unwrap_or_else(|e| panic!("writing {}: {e}", program.display()));
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("making {} executable: {e}", program.display()));
        FakeRsh { program, calls }
    }

    /// Every call's arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.calls).unwrap_or_else(|e| panic!("reading the calls: {e}")) {
            let path = entry.unwrap_or_else(|e| panic!("reading the calls: {e}")).path();
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push(text.lines().map(str::to_owned).collect());
        }
        out
    }
}

#[test]
#[cfg_attr(not(has_gxx), ignore = "no g++ to build MRNet-style programs with")]
fn malformed_payloads_are_refused_not_crashed_on() {
    // The filter adapter reads every packet from the wire with this code at each comm
    // node: bad bytes must be refused, never crash it or allocate what they claim.
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary folder: {e}"));
    let exe = tmp.path().join("decode");
    let layer = root().join("compat/mrnet");
    must(
        Command::new("g++")
            .args(["-std=c++11", "-g", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-I{}", layer.join("include").display()))
            .arg(format!("-I{}", layer.join("src").display()))
            .arg(format!("-I{}", root().join("include").display()))
            .arg("-o")
            .arg(&exe)
            .arg(root().join("tests/mrnet/decode.cpp"))
            .arg(layer.join("src/packet.cpp")),
        "compiling tests/mrnet/decode.cpp",
    );
    let out = Command::new(&exe).output().unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("mrnet-decode: ok"),
        "decode ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
