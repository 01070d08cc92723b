//! Back-ends that misbehave on purpose, for the end-to-end tests (`tests/e2e`): a
//! test starts one in place of `treecast backend` for a rank or two of its tree.
//! Cargo builds this binary before the tests run and names it to them in
//! `CARGO_BIN_EXE_treecast-test-backend`.
//!
//! `treecast-test-backend panicking | rogue | send-and-return`

#![allow(clippy::unwrap_used)]

use std::process::ExitCode;
use std::time::Duration;

use treecast_api::{RankSet, Value};

/// How long the rogue back-end may take to connect.
const LIMIT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match std::env::args().nth(1).as_deref() {
        Some("panicking") => panicking_backend_entry(),
        Some("rogue") => runtime().block_on(rogue_backend_entry()),
        Some("send-and-return") => runtime().block_on(send_and_return_backend_entry()),
        other => {
            eprintln!("usage: treecast-test-backend panicking|rogue|send-and-return (not {other:?})");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

fn int(p: &treecast_api::Packet) -> i64 {
    p.values().unwrap()[0].as_i64().unwrap()
}

/// A back-end that panics at once, for
/// `a_start_up_error_is_printed_once_with_the_childs_panic_message`.
fn panicking_backend_entry() {
    let rank = std::env::var("TREECAST_RANK").unwrap_or_default();
    panic!("rank {rank} cannot read its settings file /etc/tool-test.conf");
}

/// A rogue back-end that authenticates, reports ready, then sends bytes that are
/// not a frame (`TREECAST_ROGUE=malformed`), announces a frame far over the limit
/// (`huge`), or sends a control frame under the frame limit but far over what a
/// back-end's reports need (`control`, or `control-at-once` before it joined), for `a_malformed_frame_closes_only_that_link`,
/// `a_frame_over_the_size_limit_is_refused_before_it_is_buffered` and the control
/// frame tests. With `TREECAST_ATTACH` set it joins through that attach file.
async fn rogue_backend_entry() {
    use tokio::io::AsyncWriteExt;
    let rank: u32 = std::env::var("TREECAST_RANK").unwrap().parse().unwrap();
    let (parent, node_id, secret) = match std::env::var_os("TREECAST_ATTACH") {
        Some(file) => {
            let info = treecast_api::AttachInfo::read(std::path::Path::new(&file)).unwrap();
            let (node_id, parent) = info.point(rank).unwrap();
            (parent.to_owned(), node_id, info.secret.clone())
        }
        None => (
            std::env::var("TREECAST_PARENT").unwrap(),
            std::env::var("TREECAST_NODE_ID").unwrap().parse().unwrap(),
            treecast_driver::read_secret().unwrap(),
        ),
    };
    let mut stream = treecast_driver::connect_to(&parent, node_id, &secret, LIMIT).await.unwrap();
    let mode = std::env::var("TREECAST_ROGUE").unwrap_or_default();
    // `control-at-once` sends its oversized control frame in place of its join,
    // while its parent still waits for the tree to start.
    if mode != "control-at-once" {
        let join = treecast_wire::ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 };
        let mut bytes = bytes::BytesMut::new();
        treecast_proto::control_frame(&join).encode(&mut bytes);
        stream.write_all(&bytes).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if mode == "huge" {
        // A header announcing 200 MiB, then a trickle: the parent must refuse it, not buffer it.
        let mut header = bytes::BytesMut::new();
        treecast_wire::FrameHeader::data(1, 0, rank).encode(200 << 20, &mut header);
        // The parent may close the link as soon as it reads the header: a failed
        // write is the expected end of this rogue, not an error of the test.
        let _ = stream.write_all(&header).await;
        let _ = stream.write_all(&[0u8; 4096]).await;
    } else if mode.starts_with("control") {
        // A control frame of 32 MiB, under the frame limit: before control frames had
        // a limit of their own, the parent buffered all of it.
        let mut header = bytes::BytesMut::new();
        treecast_wire::FrameHeader::control().encode(32 << 20, &mut header);
        let _ = stream.write_all(&header).await;
        let _ = stream.write_all(&vec![0u8; 8 << 20]).await;
    } else {
        let _ = stream.write_all(&[0xEE; 64]).await;
    }
    // Until the parent closes the link (what every mode is expected to make it do).
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt;
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// A back-end that answers the first request (`%d n`) with `n` packets of its rank
/// and returns at once, dropping its `BackEnd` without `close()` as a tool's `main`
/// would, for `a_backend_that_returns_right_after_sending_loses_nothing`.
async fn send_and_return_backend_entry() {
    let mut be = treecast_api::BackEnd::connect().await.unwrap();
    let p = be.recv().await.unwrap();
    for _ in 0..int(&p) {
        be.send(p.stream(), p.tag(), "%d", &[Value::Int(be.rank() as i32)]).await.unwrap();
    }
}
