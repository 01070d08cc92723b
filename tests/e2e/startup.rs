//! Start-up failures: a back-end that cannot start is named with its stderr, and
//! the error is printed once, with the child's panic message.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::local::*;
use crate::common::{assert_no_leftovers, TestDir};
use treecast_api::Topology;

#[tokio::test]
async fn a_backend_that_cannot_start_is_named_with_its_stderr() {
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", "echo boom on $TREECAST_RANK >&2; exit 7"])
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("back-end rank"), "{err}");
    assert!(err.contains("exited with status 7"), "{err}");
    assert!(err.contains("boom on"), "{err}");

    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let err = builder(topo).backend_command(["/nonexistent/tool"]).launch().await.unwrap_err().to_string();
    assert!(err.contains("/nonexistent/tool") && err.contains("back-end rank 0"), "{err}");
    assert_eq!(err.matches("back-end rank 0").count(), 1, "the child is named once: {err}");
}

#[test]
fn a_start_up_error_is_printed_once_with_the_childs_panic_message() {
    // Regression: at depth 3 every comm node logged the error, its parent forwarded
    // the log, and the front-end printed it again (three times in all); with
    // RUST_BACKTRACE set the backtrace pushed the panic message out of the report.
    let dir = TestDir::new("printed-once");
    let script = dir.path("treecast-wrapper");
    let text = format!(
        "#!/bin/sh\nif [ \"$1\" = backend ] && [ \"$TREECAST_RANK\" = 5 ]; then exec {TEST_BACKEND} panicking; fi\n\
         exec {TREECAST} \"$@\"\n"
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tag = tag();
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x2x2", "--", "true"])
        .env(k, v)
        .env("TREECAST_PATH", &script)
        .env("RUST_BACKTRACE", "1")
        .env_remove("TREECAST_LOG")
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("exited with status 101").count(), 1, "{stderr}");
    assert!(!stderr.contains("ERROR"), "no comm node logs it on the way: {stderr}");
    let (_, error) = stderr.split_once("treecast: error: ").unwrap_or_default();
    assert!(!error.contains("treecast: error: "), "printed once: {stderr}");
    assert!(
        error.starts_with(
            "starting the network failed: back-end rank 5 on localhost (node 11) exited before connecting"
        ),
        "{error}"
    );
    assert!(error.contains("rank 5 cannot read its settings file /etc/tool-test.conf"), "{error}");
}
