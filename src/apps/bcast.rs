//! `treecast bcast`: copy a file to every back-end's host through the tree.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use treecast_api::{bcast_file_with_progress, FileReport, WriteMode};

use super::cli::BcastArgs;

/// Ranks that had one outcome.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeClass {
    /// `written`, `skipped-shared`, `skipped-leave`, `skipped-older` or `failed`.
    pub outcome: String,
    /// Ranks, compact (`0-15,32`).
    pub ranks: String,
    /// Number of ranks.
    pub count: u64,
    /// Why (empty for a plain success).
    pub detail: String,
}

/// Ranks that never answered.
#[derive(Debug, Clone, Serialize)]
pub struct LostRanks {
    /// Ranks, compact.
    pub ranks: String,
    /// Why, as the node that noticed said it.
    pub reason: String,
}

/// What `bcast` did, as printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct BcastReport {
    /// Absolute source path.
    pub source: String,
    /// Destination path sent to the back-ends.
    pub destination: String,
    /// Bytes in the file.
    pub size: u64,
    /// BLAKE3 of the content, hex.
    pub blake3: String,
    /// Back-ends started.
    pub backends: u32,
    /// Seconds from the status packet to the last answer.
    pub seconds: f64,
    /// Outcomes by class.
    pub classes: Vec<OutcomeClass>,
    /// Ranks lost before answering.
    pub lost: Vec<LostRanks>,
    /// True when no rank failed or was lost.
    pub ok: bool,
}

/// Converts the API's report for printing.
pub fn report_of(report: &FileReport, backends: u32) -> BcastReport {
    BcastReport {
        source: report.source.display().to_string(),
        destination: report.destination.display().to_string(),
        size: report.size,
        blake3: report.hash.clone(),
        backends,
        seconds: report.elapsed.as_secs_f64(),
        classes: report
            .outcomes
            .iter()
            .map(|o| OutcomeClass {
                outcome: o.outcome.word().to_owned(),
                ranks: o.ranks.to_string(),
                count: o.ranks.len(),
                detail: o.detail.clone(),
            })
            .collect(),
        lost: report
            .lost
            .iter()
            .map(|(r, why)| LostRanks { ranks: r.to_string(), reason: why.clone() })
            .collect(),
        ok: report.ok(),
    }
}

/// The text summary: one line per outcome class, then lost ranks.
pub fn render(r: &BcastReport) -> String {
    let mut out = format!(
        "{} -> {} ({} bytes, {} back-end{}, {:.2} s)\n",
        r.source,
        r.destination,
        r.size,
        r.backends,
        if r.backends == 1 { "" } else { "s" },
        r.seconds
    );
    for c in &r.classes {
        out.push_str(&format!("{}: {} [{}]", c.outcome, c.count, c.ranks));
        if !c.detail.is_empty() {
            out.push_str(&format!(": {}", c.detail));
        }
        out.push('\n');
    }
    for l in &r.lost {
        out.push_str(&format!("lost [{}]: {}\n", l.ranks, l.reason));
    }
    out
}

/// Starts the tree, sends the file, prints the summary; exit 1 if a rank failed or was lost.
pub async fn main(args: BcastArgs) -> anyhow::Result<ExitCode> {
    let mode: WriteMode = args.mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    // Check the source before starting any process.
    let meta = std::fs::metadata(&args.src).with_context(|| format!("source {}", args.src.display()))?;
    anyhow::ensure!(meta.is_file(), "source {} is not a regular file", args.src.display());
    anyhow::ensure!(
        (1..=treecast_api::MAX_CHUNK).contains(&args.chunk),
        "--chunk must be between 1 and {} bytes",
        treecast_api::MAX_CHUNK
    );
    let mut net = super::run::launch(&args.tree).await?;
    let comm = net.broadcast_communicator();
    let show = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last = Instant::now();
    let progress = |sent: u64, size: u64| {
        if show && (sent == size || last.elapsed().as_millis() >= 100) {
            last = Instant::now();
            let pct = if size == 0 { 100.0 } else { sent as f64 * 100.0 / size as f64 };
            let rate = sent as f64 / started.elapsed().as_secs_f64().max(1e-6) / (1 << 20) as f64;
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r[{:<30}] {pct:5.1}% {:.1} MiB/s ",
                "#".repeat((pct / 100.0 * 30.0) as usize),
                rate
            );
            let _ = err.flush();
        }
    };
    let result =
        bcast_file_with_progress(&mut net, &comm, &args.src, args.dst.as_deref(), mode, args.chunk, progress)
            .await;
    if show {
        eprintln!();
    }
    let backends = net.backends();
    net.shutdown().await;
    let report = report_of(&result?, backends);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
