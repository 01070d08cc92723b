//! A master/worker Mandelbrot renderer whose master grows its pool of workers at
//! run time (`Network::spawn`) and shrinks it at the end (`Network::stop`).
//!
//! One program plays every role:
//!
//! * with no `TREECAST_RANK`, it is the **master** (the front-end): it renders the
//!   image twice, first with a fixed pool of workers started at launch, then with a
//!   pool that starts with one worker and spawns more while tiles are queued; it
//!   prints both times and checks that both images are identical;
//! * started by treecast with `TREECAST_RANK` set, it is a **worker** (a back-end):
//!   it renders each tile it is sent and sends the pixels back up the tree;
//! * started as `<program> node`, it is a **comm node**.
//!
//! ```sh
//! cargo run --release --example mandelbrot -- 800 600 8 mandelbrot.ppm   # width height workers [file]
//! ```
//!
//! Tiles are bands of rows; a worker gets its next tile as soon as it sends one
//! back, so fast and slow workers share the image by what they can do.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use treecast_api::{
    BackEnd, BackEndEvent, Event, Group, Network, NetworkBuilder, Placement, SpawnOptions, Stream,
    StreamOptions, SyncMode, Topology, TransformKind, Value,
};

/// Master to worker: render this tile (`%ud %ud %ud`: the tile's index, the
/// image's width and height).
const TAG_TILE: i32 = 200;
/// Worker to master: a tile's pixels (`%ud %auc`: the index, one byte per pixel).
const TAG_PIXELS: i32 = 201;
/// Rows per tile.
const TILE_ROWS: u32 = 8;
/// Longest wait for any one answer.
const LIMIT: Duration = Duration::from_secs(60);

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    if treecast_api::started_as_comm_node() {
        treecast_api::run_comm_node().await?;
        return Ok(());
    }
    if std::env::var("TREECAST_RANK").is_ok() {
        return worker().await;
    }
    let args: Vec<String> = std::env::args().collect();
    let number = |i: usize, default: u32| -> Result<u32, Failure> {
        Ok(args.get(i).map(|s| s.parse::<u32>()).transpose()?.unwrap_or(default))
    };
    let image = Image { width: number(1, 640)?.max(1), height: number(2, 480)?.max(1) };
    let workers = number(3, 8)?.max(1);
    let out = args.get(4).cloned();

    let t0 = Instant::now();
    let fixed = render(&image, workers, workers).await?;
    let fixed_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let growing = render(&image, 1, workers).await?;
    let growing_s = t1.elapsed().as_secs_f64();

    println!("{}x{} pixels, {} tiles of {TILE_ROWS} rows", image.width, image.height, image.tiles());
    println!("fixed pool of {workers} started at launch:   {fixed_s:.3} s (launch included)");
    println!("pool of 1 grown to {workers} by spawning: {growing_s:.3} s (launch included)");
    println!("ratio growing/fixed: {:.2}", growing_s / fixed_s);
    if fixed != growing {
        return Err("the two images differ".into());
    }
    println!("images identical: yes");
    if let Some(path) = out {
        std::fs::write(&path, image.ppm(&growing))?;
        println!("wrote {path}");
    }
    Ok(())
}

/// The picture: its size, and the part of the complex plane it shows.
struct Image {
    width: u32,
    height: u32,
}

impl Image {
    fn tiles(&self) -> u32 {
        self.height.div_ceil(TILE_ROWS)
    }

    /// The pixels of one tile: iteration counts scaled to a byte, row by row.
    fn tile(&self, index: u32) -> Vec<u8> {
        let first = index * TILE_ROWS;
        let rows = TILE_ROWS.min(self.height - first);
        let mut pixels = Vec::with_capacity((rows * self.width) as usize);
        for y in first..first + rows {
            for x in 0..self.width {
                let cr = -2.2 + 3.2 * f64::from(x) / f64::from(self.width);
                let ci = -1.2 + 2.4 * f64::from(y) / f64::from(self.height);
                pixels.push(escape_time(cr, ci));
            }
        }
        pixels
    }

    /// A binary greyscale PPM of `pixels`.
    fn ppm(&self, pixels: &[u8]) -> Vec<u8> {
        let mut out = format!("P6\n{} {}\n255\n", self.width, self.height).into_bytes();
        for &p in pixels {
            out.extend_from_slice(&[p, p / 2, 255 - p]);
        }
        out
    }
}

/// Iterations before `c` escapes, scaled to 0..=255 (255: it never did).
fn escape_time(cr: f64, ci: f64) -> u8 {
    const MAX: u32 = 1000;
    let (mut zr, mut zi) = (0.0f64, 0.0f64);
    for i in 0..MAX {
        if zr * zr + zi * zi > 4.0 {
            return (i * 255 / MAX) as u8;
        }
        (zr, zi) = (zr * zr - zi * zi + cr, 2.0 * zr * zi + ci);
    }
    255
}

/// A tile to render: the worker's rank, then the tile's index and the image's size.
type Order = (u32, [u32; 3]);

/// A finished tile: the worker that rendered it, its index, its pixels.
type Rendered = (u32, u32, Vec<u8>);

/// Renders `image` with `start` workers launched with the tree, spawning more (up
/// to `most`) while tiles wait; returns the pixels.
async fn render(image: &Image, start: u32, most: u32) -> Result<Vec<u8>, Failure> {
    let topology = Topology::from_spec("kary:4", Some(start as usize))?;
    let me = std::env::current_exe()?;
    let net = NetworkBuilder::new(topology)
        .treecast_path(&me)
        .backend_command([me.to_string_lossy().into_owned()])
        .launch()
        .await?;
    let (results_tx, mut results) = mpsc::channel::<Result<Rendered, String>>(64);
    let mut pool = Pool { groups: Vec::new(), results: results_tx };
    pool.add(&net, net.launch_group()).await?;
    let mut idle: VecDeque<u32> = pool.ranks().into();
    let mut queued: VecDeque<u32> = (0..image.tiles()).collect();
    let mut pixels = vec![0u8; (image.width * image.height) as usize];
    let mut pending = image.tiles();
    while pending > 0 {
        // More workers while tiles wait: double the pool, up to `most`.
        let workers = pool.ranks().len() as u32;
        if workers < most && queued.len() as u32 > 2 * workers {
            let n = workers.min(most - workers);
            let options = SpawnOptions { placement: Placement::LeastLoaded, ..SpawnOptions::default() };
            let group = net.spawn(n, &[me.to_string_lossy().into_owned()], &options).await?;
            idle.extend(group.ranks());
            pool.add(&net, group).await?;
        }
        while let (Some(&rank), Some(&tile)) = (idle.front(), queued.front()) {
            pool.assign(rank, [tile, image.width, image.height]).await?;
            idle.pop_front();
            queued.pop_front();
        }
        let (rank, tile, tile_pixels) = tokio::time::timeout(LIMIT, results.recv())
            .await
            .map_err(|_| "no tile came back within a minute")?
            .ok_or("every worker stream ended")??;
        let at = (tile * TILE_ROWS * image.width) as usize;
        let Some(dst) = pixels.get_mut(at..at + tile_pixels.len()) else {
            return Err(format!("tile {tile} from rank {rank} does not fit the image").into());
        };
        dst.copy_from_slice(&tile_pixels);
        pending -= 1;
        idle.push_back(rank);
    }
    // Shrink: the spawned workers go first, then the tree.
    for (group, _) in pool.groups.iter().skip(1) {
        net.stop(group, "the image is done")?;
    }
    while let Some(e) = net.try_event() {
        // Joins and the stops above are the pool growing and shrinking; anything else is news.
        if !matches!(e, Event::RanksJoined { .. } | Event::RanksLeft { .. }) {
            eprintln!("{e}");
        }
    }
    net.shutdown().await;
    Ok(pixels)
}

/// The master's workers: one stream per group (a stream's communicator is fixed
/// when it is made), each served by a task that sends tiles and reads pixels.
struct Pool {
    groups: Vec<(Group, mpsc::Sender<Order>)>,
    results: mpsc::Sender<Result<Rendered, String>>,
}

impl Pool {
    async fn add(&mut self, net: &Network, group: Group) -> Result<(), Failure> {
        let options =
            StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
        let stream = net.new_stream(&group.communicator(), options).await?;
        let (assign, orders) = mpsc::channel(64);
        tokio::spawn(serve(stream, orders, self.results.clone()));
        self.groups.push((group, assign));
        Ok(())
    }

    fn ranks(&self) -> Vec<u32> {
        self.groups.iter().flat_map(|(g, _)| g.ranks().iter().copied()).collect()
    }

    async fn assign(&self, rank: u32, tile: [u32; 3]) -> Result<(), Failure> {
        let Some((_, orders)) = self.groups.iter().find(|(g, _)| g.group_rank(rank).is_some()) else {
            return Err(format!("rank {rank} is in no group").into());
        };
        orders.send((rank, tile)).await.map_err(|_| format!("the stream of rank {rank} ended"))?;
        Ok(())
    }
}

/// Sends the tiles ordered for one group's workers and hands their pixels back.
async fn serve(
    stream: Stream,
    mut orders: mpsc::Receiver<Order>,
    results: mpsc::Sender<Result<Rendered, String>>,
) {
    loop {
        let outcome = tokio::select! {
            order = orders.recv() => match order {
                Some((rank, order)) => {
                    let values = order.map(Value::UInt);
                    match stream.send_to(rank, TAG_TILE, "%ud %ud %ud", &values).await {
                        Ok(()) => continue,
                        Err(e) => Err(format!("sending tile {} to rank {rank}: {e}", order[0])),
                    }
                }
                None => return,
            },
            packet = stream.recv() => packet.map_err(|e| e.to_string()).and_then(|p| {
                match p.unpack("%ud %auc").map_err(|e| e.to_string())?.as_slice() {
                    [Value::UInt(tile), Value::UCharArray(pixels)] => Ok((p.rank(), *tile, pixels.clone())),
                    other => Err(format!("rank {} sent {other:?}", p.rank())),
                }
            }),
        };
        let failed = outcome.is_err();
        if results.send(outcome).await.is_err() || failed {
            return;
        }
    }
}

/// A worker: renders the tiles it is sent until the master stops it.
async fn worker() -> Result<(), Failure> {
    let mut be = BackEnd::connect().await?;
    loop {
        let packet = match be.next_event().await {
            Ok(BackEndEvent::Packet(p)) => p,
            Ok(_) => continue,
            // Stopped, or the tree shut down: done.
            Err(_) => return Ok(()),
        };
        if packet.tag() != TAG_TILE {
            continue;
        }
        let values = packet.unpack("%ud %ud %ud")?;
        let [Value::UInt(tile), Value::UInt(width), Value::UInt(height)] = values[..] else { continue };
        let pixels = Image { width, height }.tile(tile);
        be.send(packet.stream(), TAG_PIXELS, "%ud %auc", &[Value::UInt(tile), Value::UCharArray(pixels)])
            .await?;
    }
}
