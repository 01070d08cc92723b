//! The Slurm launcher against a real single-machine Slurm (`tools/slurmbed`:
//! munge, slurmctld and slurmd from Debian's packages, started here and stopped
//! after). Needs root; without it the test shows as ignored.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");

struct Bed {
    script: PathBuf,
    dir: String,
    /// The sessions of this test: every command it runs carries their tag.
    sessions: common::OwnSessions,
}

impl Bed {
    fn up() -> Option<Bed> {
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        assert!(root, "the Slurm test bed needs root, but the build ran as root: rebuild");
        let bed = Bed {
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/slurmbed"),
            dir: format!("/tmp/treecast-slurmbed-test-{}", std::process::id()),
            sessions: common::OwnSessions::watch(None),
        };
        let out =
            Command::new(&bed.script).arg("up").env("TREECAST_SLURMBED_DIR", &bed.dir).output().unwrap();
        assert!(
            out.status.success(),
            "slurmbed up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(bed)
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        let (k, v) = self.sessions.tag();
        Command::new(&self.script)
            .env(k, v)
            .args(["run", "--ntasks", "8", "--", TREECAST])
            .args(args)
            .env("TREECAST_SLURMBED_DIR", &self.dir)
            .output()
            .unwrap()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("down").env("TREECAST_SLURMBED_DIR", &self.dir).status();
    }
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root (Slurm and munge daemons)")]
fn every_process_is_a_slurm_job_step() {
    let out = Command::new(TREECAST)
        .args(["run", "--launcher", "slurm", "--", "true"])
        .env_remove("SLURM_JOB_NODELIST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs an allocation"));

    let Some(bed) = Bed::up() else { return };
    let out = bed.run(&[
        "run",
        "--launcher",
        "slurm",
        "--per-host",
        "4",
        "--fanout",
        "2",
        "--json",
        "--",
        "sh",
        "-c",
        "echo $SLURM_STEP_ID",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = report["classes"].as_array().unwrap();
    // Each back-end is a step of its own, so each prints a different step id.
    assert_eq!(classes.len(), 4, "{report}");
    let steps: std::collections::BTreeSet<&str> =
        classes.iter().map(|c| c["stdout"].as_str().unwrap().trim()).collect();
    assert_eq!(steps.len(), 4, "{report}");
    assert!(steps.iter().all(|s| s.parse::<u32>().is_ok()), "{report}");
    common::assert_no_session_left();
}
