//! MRNet's integer-addition example, on the treecast API.
//!
//! One program plays all three roles, as a real tool's binary can:
//!
//! * run with no arguments, it is the **front-end**: it launches a tree whose
//!   comm nodes and back-ends are this same program, creates a stream with the
//!   sum filter, multicasts an integer and receives one sum per wave;
//! * started by treecast with `TREECAST_RANK` set, it is a **back-end**: it
//!   answers every packet with the integer times its rank… plus one;
//! * started as `<program> node`, it is a **comm node** (what `treecast node` does),
//!   through `treecast_api::run_comm_node`: no `treecast` binary is needed.
//!
//! ```sh
//! cargo run --example integer_addition -- kary:4 16 5   # shape, back-ends, waves
//! ```

use std::time::Duration;

use treecast_api::{ApiError, BackEnd, NetworkBuilder, StreamOptions, Topology, TransformKind, Value};

/// Tag of the request the front-end multicasts.
const TAG_ADD: i32 = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if treecast_api::started_as_comm_node() {
        // Started by a parent as `<this program> node`.
        treecast_api::run_comm_node().await?;
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    if std::env::var("TREECAST_RANK").is_ok() {
        return back_end().await;
    }
    let shape = args.get(1).map(String::as_str).unwrap_or("kary:4");
    let backends: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let waves: i32 = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(5);
    front_end(shape, backends, waves).await
}

async fn front_end(shape: &str, backends: usize, waves: i32) -> Result<(), Box<dyn std::error::Error>> {
    // The topology: a generated shape (or a topology file) with this many back-ends.
    let topology = Topology::from_spec(shape, Some(backends))?;
    let me = std::env::current_exe()?;
    // This program is the comm node (`me node`) and the back-end (`me` with TREECAST_RANK set).
    let net = NetworkBuilder::new(topology)
        .treecast_path(&me)
        .backend_command([me.to_string_lossy().into_owned()])
        .launch()
        .await?;
    println!(
        "launched {} back-ends under {} comm nodes in {:?}",
        net.backends(),
        net.commnodes(),
        net.startup_time()
    );

    // A stream over every back-end whose packets are summed at every comm node on the way up.
    let comm = net.broadcast_communicator();
    let stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?;
    let n = i64::from(net.backends());
    for wave in 1..=waves {
        stream.send(TAG_ADD, "%d", &[Value::Int(wave)]).await?;
        // One packet per wave: the sum of what every back-end sent.
        let packet = stream.recv_timeout(Duration::from_secs(30)).await?;
        let sum = packet.unpack("%d")?[0].as_i64().unwrap_or_default();
        let expected = i64::from(wave) * (n * (n - 1) / 2) + n;
        println!("wave {wave}: sum {sum} (expected {expected})");
        if sum != expected {
            return Err(format!("wave {wave}: got {sum}, expected {expected}").into());
        }
    }
    // Lost back-ends (none here) are events: waves complete without them.
    while let Some(event) = net.try_event() {
        println!("event: {event}");
    }
    net.shutdown().await;
    Ok(())
}

async fn back_end() -> Result<(), Box<dyn std::error::Error>> {
    // Joins the tree with what the launcher put in the environment.
    let mut be = BackEnd::connect().await?;
    answer(&mut be).await?;
    // Leaves the tree in order. On an error, returning without it makes the
    // front-end report this rank lost with the error this program prints on stderr.
    // (What was sent is delivered either way.)
    be.close().await;
    Ok(())
}

/// Answers every request until the front-end shuts the network down.
async fn answer(be: &mut BackEnd) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        // Packets of every stream arrive here; the packet says which stream.
        let packet = match be.recv().await {
            Ok(p) => p,
            Err(ApiError::Closed(_)) => return Ok(()), // the front-end shut the network down
            Err(e) => return Err(e.into()),
        };
        if packet.tag() == TAG_ADD {
            let x = packet.unpack("%d")?[0].as_i64().unwrap_or_default() as i32;
            let answer = x * be.rank() as i32 + 1;
            be.send(packet.stream(), TAG_ADD, "%d", &[Value::Int(answer)]).await?;
        }
    }
}
