//! Host lists and topology files, with a fake `ssh` and `srun` on `PATH`: what
//! reaches the launcher, hostile host names, and every name of this host started
//! locally.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::local::*;
use crate::common::{assert_no_leftovers, TestDir};

/// A directory with an `ssh` that logs its arguments to `ssh.log` and fails, to put
/// first on `PATH`: any use of ssh shows.
fn fake_ssh(dir: &TestDir) -> (String, std::path::PathBuf) {
    let log = dir.path("ssh.log");
    let script = dir.path("ssh");
    std::fs::write(&script, format!("#!/bin/sh\necho \"$@\" >> {}\nexit 255\n", log.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.root().display(), std::env::var("PATH").unwrap_or_default());
    (path, log)
}

#[test]
fn a_topology_file_alone_starts_its_tree_and_every_name_of_this_host_is_local() {
    let dir = TestDir::new("localnames");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned();
    // MRNet files name the front-end and comm nodes by any name of the machine: every
    // one of them is started with fork/exec, at every level, with ssh the launcher.
    let file = dir.path("mixed.top");
    std::fs::write(
        &file,
        format!(
            "localhost:0 => 127.0.0.1:1 {host}:2 ;\n127.0.0.1:1 => localhost:3 127.0.0.2:4 ;\n\
             {host}:2 => {host}:5 127.0.0.1:6 localhost:7 ;\n"
        ),
    )
    .unwrap();
    let (path, log) = fake_ssh(&dir);
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(TREECAST)
            .args(["run", "--topology", file.to_str().unwrap()])
            .args(extra)
            .args(["--", "sh", "-c", "echo $TREECAST_RANK/$TREECAST_SIZE"])
            .env(k, v)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert_no_leftovers(&t);
        out
    };
    for extra in [&[][..], &["--launcher", "ssh"], &["--launcher", "local"], &["--local", "5"]] {
        let out = run(extra);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{extra:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for rank in 0..5 {
            assert!(stdout.contains(&format!("\n{rank}/5\n")), "{extra:?}: rank {rank} missing: {stdout}");
        }
        assert!(stdout.contains("5 back-ends; exit 0: 5 [0-4]"), "{stdout}");
    }
    assert!(!log.exists(), "ssh was used: {}", std::fs::read_to_string(&log).unwrap_or_default());
    // --local N with a file is only a check.
    let out = run(&["--local", "4"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has 5 back-ends but 4 were asked for"), "{stderr}");
    // --hosts and a file that names the hosts contradict each other.
    let out = run(&["--hosts", "a,b"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hosts and the topology file"), "{stderr}");
    // `bench microbench` takes the file alone too.
    let out = Command::new(TREECAST)
        .args([
            "bench",
            "microbench",
            "--topology",
            file.to_str().unwrap(),
            "--rt",
            "5",
            "--tp",
            "5",
            "--json",
        ])
        .env(k, v)
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(result["backends"], 5, "{result}");
}

/// A directory holding a stand-in for `program` (ssh or srun) that records each call's
/// arguments, one per line, in a file `call.*` of its own. As ssh it answers `-G` with
/// `hostname localhost`, then runs the remote command here, so a whole tree over
/// made-up hosts starts on this machine; as srun it fails.
struct FakeLauncher {
    dir: TestDir,
}

impl FakeLauncher {
    fn new(program: &str) -> FakeLauncher {
        let dir = TestDir::new(&format!("fake-{program}"));
        let bin = dir.path("bin");
        std::fs::create_dir(&bin).unwrap();
        let calls = dir.path("calls");
        std::fs::create_dir(&calls).unwrap();
        let log = format!(
            "f=$(mktemp {}/call.XXXXXX)\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$f\"\n",
            calls.display()
        );
        let body = match program {
            "ssh" => concat!(
                "for a in \"$@\"; do\n",
                "  [ \"$a\" = -- ] && break\n",
                "  [ \"$a\" = -G ] && { echo 'hostname localhost'; exit 0; }\n",
                "done\n",
                "for last; do :; done\n",
                "exec sh -c \"$last\"\n"
            ),
            _ => "echo 'fake srun: no Slurm here' >&2\nexit 1\n",
        };
        let script = bin.join(program);
        std::fs::write(&script, format!("#!/bin/sh\n{log}{body}")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeLauncher { dir }
    }

    /// `PATH` with the fake first.
    fn path(&self) -> String {
        format!("{}:{}", self.dir.path("bin").display(), std::env::var("PATH").unwrap_or_default())
    }

    /// The arguments of every call so far.
    fn calls(&self) -> Vec<Vec<String>> {
        let mut calls: Vec<Vec<String>> = std::fs::read_dir(self.dir.path("calls"))
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().lines().map(String::from).collect())
            .collect();
        calls.sort();
        calls
    }

    /// Runs treecast with the fake on `PATH` and no extra launcher arguments.
    fn treecast(&self, tag: &str, args: &[&str]) -> std::process::Output {
        let (k, v) = tag.split_once('=').unwrap();
        let out = Command::new(TREECAST)
            .args(args)
            .env(k, v)
            .env("PATH", self.path())
            .env_remove("TREECAST_SSH_ARGS")
            .env_remove("TREECAST_SRUN_ARGS")
            .env_remove("TREECAST_LISTEN")
            .output()
            .unwrap();
        assert_no_leftovers(tag);
        out
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_topology_file_may_list_a_parents_children_over_several_statements() {
    let dir = TestDir::new("split-statements");
    let file = dir.path("tree.top");
    std::fs::write(
        &file,
        "localhost:0 => localhost:1 ;\nlocalhost:1 => localhost:2 ;\n\
         localhost:0 => localhost:3 ;   # the root again\nlocalhost:1 => localhost:4 ;\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = Command::new(TREECAST).args(["topo", "--format", "mrnet", path]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "localhost:0 => localhost:1 localhost:3 ;\nlocalhost:1 => localhost:2 localhost:4 ;\n"
    );
    // The tree runs: three back-ends, in the pre-order of the combined statements.
    let t = tag();
    let out = treecast(
        &t,
        &["run", "--local", "3", "--topology", path, "--json", "--", "sh", "-c", "echo $TREECAST_RANK"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backends"], 3);
    assert_eq!(report["classes"].as_array().unwrap().len(), 3, "{report}");

    // MRNet's lexer refuses a host name that does not start with a letter or a digit.
    std::fs::write(&file, "localhost:0 => localhost:1\n   -oProxyCommand:1 ;\n").unwrap();
    let out = Command::new(TREECAST).args(["topo", path]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("topology line 2, column 4: host name in `-oProxyCommand:1` starts with `-`"),
        "{err}"
    );
}

#[test]
fn hostile_host_names_never_reach_ssh() {
    let ssh = FakeLauncher::new("ssh");
    let dir = TestDir::new("hostile-hosts");
    let top = dir.path("evil.top");
    std::fs::write(&top, "localhost:0 => n1:0\n  -Fevil.conf:0 ;\n").unwrap();
    let hosts = dir.path("hosts");
    std::fs::write(&hosts, "n1\n-Fevil.conf\n").unwrap();
    let top_arg = top.to_str().unwrap();
    let file_list = format!("n2,^{}", hosts.display());
    let cases: [(&[&str], &str); 4] = [
        (
            &["--local", "2", "--topology", top_arg],
            "topology line 2, column 3: host name in `-Fevil.conf:0` starts with `-`",
        ),
        (&["--hosts=--Fevil.conf"], "column 2: `-Fevil.conf`: a host name starts with a letter or a digit"),
        (&["--hosts", &file_list], "line 2: host list `-Fevil.conf`, column 1"),
        (&["--hosts", "n1", "--exclude=-n2"], "`-` in an exclusion list"),
    ];
    for (flags, want) in cases {
        let t = tag();
        let args =
            [&["run", "--launcher", "ssh", "--remote-path", TREECAST][..], flags, &["--", "true"]].concat();
        let out = ssh.treecast(&t, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    assert_eq!(ssh.calls(), Vec::<Vec<String>>::new(), "ssh was run");
}

#[test]
fn a_tree_over_a_host_list_reaches_each_host_after_every_ssh_option() {
    // pdsh's `-HOST` and `^FILE`, ClusterShell's steps, repeats dropped, --exclude and
    // `user@host`: made-up hosts, each reached through the fake ssh, which runs the
    // process here.
    let ssh = FakeLauncher::new("ssh");
    let dir = TestDir::new("host-list-tree");
    let hosts = dir.path("more-hosts");
    std::fs::write(&hosts, "# more hosts\nn11 n3\n\n").unwrap();
    let list = format!("bob@n[1-9/2] -n5,^{}", hosts.display());
    let t = tag();
    let out = ssh.treecast(
        &t,
        &[
            "run",
            "--launcher",
            "ssh",
            "--remote-path",
            TREECAST,
            "--hosts",
            &list,
            "--exclude",
            "n9",
            "--fanout",
            "2",
            "--json",
            "--",
            "sh",
            "-c",
            "echo rank $TREECAST_RANK",
        ],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", text(&out.stdout));
    assert!(err.contains("treecast: warning: n3 listed more than once"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let on: Vec<(String, String)> = report["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["stdout"].as_str().unwrap().trim().to_owned(), c["hosts"].as_str().unwrap().to_owned()))
        .collect();
    let want = [("rank 0", "n1"), ("rank 1", "n3"), ("rank 2", "n7"), ("rank 3", "n11")];
    assert_eq!(on, want.map(|(r, h)| (r.to_owned(), h.to_owned())), "{report}");

    // Every call puts the host right after `--`, after every option; a start adds only
    // the remote command after it.
    let mut started = BTreeSet::new();
    for call in ssh.calls() {
        let dash = call.iter().position(|a| a == "--").unwrap_or_else(|| panic!("no `--`: {call:?}"));
        let host = &call[dash + 1];
        assert!(call[..dash].iter().all(|a| !a.contains("n1") && !a.contains("bob")), "{call:?}");
        match &call[dash + 2..] {
            [] => assert!(call[..dash].contains(&"-G".to_owned()), "{call:?}"),
            [command] => {
                assert!(command.starts_with("exec env "), "{call:?}");
                started.insert(host.clone());
            }
            _ => panic!("more than the host and the command after `--`: {call:?}"),
        }
    }
    // The comm nodes run on bob@n1 and bob@n7 and start the back-end on their own host
    // by fork; n5 and n9 are excluded.
    let want: BTreeSet<String> = ["bob@n1", "bob@n3", "bob@n7", "n11"].map(String::from).into();
    assert_eq!(started, want);
}

#[test]
fn the_host_reaches_srun_inside_its_nodelist_argument() {
    let srun = FakeLauncher::new("srun");
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--launcher", "slurm", "--hosts", "node1", "--", "true"])
        .env(k, v)
        .env("PATH", srun.path())
        .env("TREECAST_LISTEN", "127.0.0.1")
        .env_remove("TREECAST_SRUN_ARGS")
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert!(!out.status.success());
    let calls = srun.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    let dash = call.iter().position(|a| a == "--").unwrap();
    assert!(call[..dash].contains(&"--nodelist=node1".to_owned()), "{call:?}");
    assert!(!call.contains(&"node1".to_owned()), "{call:?}");

    // srun cannot log in as another user, and hostile names never reach it.
    for (hosts, want) in
        [("bob@node1", "`user@` cannot be honoured"), ("--jobid", "starts with a letter or a digit")]
    {
        let t = tag();
        let out =
            srun.treecast(&t, &["run", "--launcher", "slurm", &format!("--hosts={hosts}"), "--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{hosts}: {err}");
        assert!(err.contains(want), "{hosts}: {err}");
    }
    assert_eq!(srun.calls().len(), 1);
}

#[test]
fn exclude_applies_to_host_lists_only() {
    let t = tag();
    let out = treecast(&t, &["run", "--local", "2", "--exclude", "n1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--exclude leaves hosts out of --hosts"), "{}", text(&out.stderr));
    let out =
        treecast(&t, &["run", "--launcher", "local", "--hosts", "n[1-2]", "-x", "n[1-2]", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no host left"), "{}", text(&out.stderr));
}

#[test]
fn treecast_hosts_expands_folds_and_counts_like_nodeset() {
    let dir = TestDir::new("hosts-cmd");
    let file = dir.path("hosts");
    std::fs::write(&file, "n[10-11]  # two more\nlogin1\n").unwrap();
    let hosts = |args: &[&str]| {
        let out = Command::new(TREECAST).arg("hosts").args(args).output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    assert_eq!(hosts(&["n[1-4],n[6-7]"]), (Some(0), "n[1-4,6-7]\n".into(), String::new()));
    assert_eq!(hosts(&["-f", "n[1-3]", "n4"]), (Some(0), "n[1-4]\n".into(), String::new()));
    assert_eq!(hosts(&["-e", "n[01-10/3]"]), (Some(0), "n01 n04 n07 n10\n".into(), String::new()));
    assert_eq!(
        hosts(&["-c", "n[1-100]", "m[1-5]", "-x", "n[50-200]"]),
        (Some(0), "54\n".into(), String::new())
    );
    assert_eq!(hosts(&["-e", "bob@n[1-3],-n2"]), (Some(0), "bob@n1 bob@n3\n".into(), String::new()));
    assert_eq!(hosts(&["-c", "n1", "-x", "n1"]), (Some(0), "0\n".into(), String::new()));
    let list = format!("n[1-3] ^{}", file.display());
    assert_eq!(hosts(&["-e", &list]), (Some(0), "n1 n2 n3 n10 n11 login1\n".into(), String::new()));
    let (code, out, err) = hosts(&["--", "n[1-4]", "n2", "-n4"]);
    assert_eq!((code, out.as_str()), (Some(0), "n[1-3]\n"));
    assert_eq!(err, "treecast: warning: n2 listed more than once; each host is kept once, where it first appears (1 repeat dropped)\n");
    let (code, out, err) = hosts(&["n[1-3", "x"]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert!(err.contains("host list `n[1-3`, column 2: unbalanced brackets"), "{err}");
    let (code, _, err) = hosts(&["-e", "-c", "n1"]);
    assert_eq!(code, Some(2), "{err}");
    let out = Command::new(TREECAST).args(["hosts", "--help"]).output().unwrap();
    assert!(text(&out.stdout).contains("ClusterShell's `nodeset`"), "{}", text(&out.stdout));
}
