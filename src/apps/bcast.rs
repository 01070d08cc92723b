//! `treecast bcast`: copy a file to every back-end's host through the tree.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use treecast_api::{bcast_file_with_progress, FileReport, Network, WriteMode};

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

/// One file to send: where from, where to (`None`: the same absolute path).
#[derive(Debug, Clone)]
struct Entry {
    source: PathBuf,
    destination: Option<PathBuf>,
}

/// Directories to create on every host before the files: `mkdir -p` of `dirs`
/// (relative) inside `base`, which must exist.
#[derive(Debug, Clone)]
struct MakeDirs {
    base: PathBuf,
    dirs: Vec<PathBuf>,
}

/// What a multi-file call will do, worked out on the front-end before any process starts.
#[derive(Debug, Default)]
struct Plan {
    entries: Vec<Entry>,
    mkdirs: Vec<MakeDirs>,
    /// Paths under a source directory that are not regular files or directories.
    ignored: Vec<PathBuf>,
}

fn name_of(path: &Path) -> anyhow::Result<std::ffi::OsString> {
    let canonical = std::fs::canonicalize(path).with_context(|| format!("source {}", path.display()))?;
    canonical
        .file_name()
        .map(ToOwned::to_owned)
        .with_context(|| format!("source {} has no name", path.display()))
}

/// Lists the files of several sources (directories with `recursive`), in a stable order.
fn plan(sources: &[PathBuf], dst: Option<&Path>, recursive: bool) -> anyhow::Result<Plan> {
    let mut plan = Plan::default();
    for src in sources {
        let meta = std::fs::metadata(src).with_context(|| format!("source {}", src.display()))?;
        let abs = std::path::absolute(src).with_context(|| format!("source {}", src.display()))?;
        if meta.is_file() {
            let destination = dst.map(|d| name_of(src).map(|n| d.join(n))).transpose()?;
            plan.entries.push(Entry { source: abs, destination });
            continue;
        }
        anyhow::ensure!(meta.is_dir(), "source {} is not a regular file or a directory", src.display());
        anyhow::ensure!(recursive, "source {} is a directory (use -r)", src.display());
        let name = name_of(src)?;
        let parent = match dst {
            Some(d) => d.to_path_buf(),
            None => abs.parent().context("a source directory has no parent")?.to_path_buf(),
        };
        let mut dirs = vec![PathBuf::from(&name)];
        let mut stack = vec![PathBuf::from(&name)];
        while let Some(rel) = stack.pop() {
            let here = if rel.as_os_str() == name { abs.clone() } else { abs.join(rel.strip_prefix(&name)?) };
            let mut children: Vec<_> = std::fs::read_dir(&here)
                .with_context(|| format!("reading {}", here.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading {}", here.display()))?;
            children.sort_by_key(std::fs::DirEntry::file_name);
            let mut subdirs = Vec::new();
            for child in children {
                let kind = child.file_type().with_context(|| format!("{}", child.path().display()))?;
                let child_rel = rel.join(child.file_name());
                if kind.is_file() {
                    plan.entries
                        .push(Entry { source: child.path(), destination: Some(parent.join(&child_rel)) });
                } else if kind.is_dir() {
                    dirs.push(child_rel.clone());
                    subdirs.push(child_rel);
                } else {
                    plan.ignored.push(child.path());
                }
            }
            // Depth first, in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        plan.mkdirs.push(MakeDirs { base: parent, dirs });
    }
    Ok(plan)
}

/// Creates the directories of a recursive copy on every back-end (one `mkdir -p` per source directory).
async fn make_dirs(net: &mut Network, m: &MakeDirs) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for batch in m.dirs.chunks(1000) {
        let mut argv: Vec<String> = ["sh", "-c", "cd -- \"$1\" && shift && mkdir -p -- \"$@\"", "sh"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        argv.push(m.base.display().to_string());
        argv.extend(batch.iter().map(|d| d.display().to_string()));
        let report = super::run::run_command(net, &argv, Some(std::time::Duration::from_secs(60))).await?;
        for c in report.classes.iter().filter(|c| c.exit_code != 0) {
            problems.push(format!(
                "creating directories under {} failed on ranks [{}] (exit {}): {}",
                m.base.display(),
                c.ranks,
                c.exit_code,
                c.stderr.trim()
            ));
        }
        for l in &report.lost {
            problems.push(format!("lost [{}] while creating directories: {}", l.ranks, l.reason));
        }
    }
    Ok(problems)
}

/// The total of a multi-file call, as printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct TreeReport {
    /// One report per file, in the order sent.
    pub files: Vec<BcastReport>,
    /// Directory creation problems (empty when every directory was made).
    pub directory_errors: Vec<String>,
    /// Paths under a source directory that were not sent (not regular files or directories).
    pub ignored: Vec<String>,
    /// Files sent.
    pub count: usize,
    /// Bytes in all files.
    pub bytes: u64,
    /// Seconds for the whole call (directories and files, not the start-up).
    pub seconds: f64,
    /// Files with a failed or lost rank.
    pub files_not_ok: usize,
    /// True when every file is ok and every directory was made.
    pub ok: bool,
}

/// The total line of a multi-file call.
pub fn render_total(t: &TreeReport) -> String {
    let mut out = String::new();
    for e in &t.directory_errors {
        out.push_str(&format!("error: {e}\n"));
    }
    for i in &t.ignored {
        out.push_str(&format!("ignored (not a regular file or directory): {i}\n"));
    }
    out.push_str(&format!(
        "total: {} file{}, {} bytes, {:.2} s, {} with failures\n",
        t.count,
        if t.count == 1 { "" } else { "s" },
        t.bytes,
        t.seconds,
        t.files_not_ok
    ));
    out
}

/// Starts the tree, sends the file(s), prints the summary; exit 1 if a rank failed or was lost.
pub async fn main(args: BcastArgs) -> anyhow::Result<ExitCode> {
    let mode: WriteMode = args.mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        (1..=treecast_api::MAX_CHUNK).contains(&args.chunk),
        "--chunk must be between 1 and {} bytes",
        treecast_api::MAX_CHUNK
    );
    let (sources, dst) = match args.paths.as_slice() {
        [src] => (vec![src.clone()], None),
        [sources @ .., dst] => (sources.to_vec(), Some(dst.clone())),
        [] => anyhow::bail!("no source given"),
    };
    // Check the sources before starting any process.
    let single = sources.len() == 1 && std::fs::metadata(&sources[0]).is_ok_and(|m| m.is_file());
    let plan = if single {
        Plan { entries: vec![Entry { source: sources[0].clone(), destination: dst }], ..Plan::default() }
    } else {
        plan(&sources, dst.as_deref(), args.recursive)?
    };
    if !single {
        // The usual message for a missing or special single source.
        let meta =
            std::fs::metadata(&sources[0]).with_context(|| format!("source {}", sources[0].display()))?;
        anyhow::ensure!(
            sources.len() > 1 || meta.is_dir(),
            "source {} is not a regular file",
            sources[0].display()
        );
    }
    let mut net = super::run::launch(&args.tree).await?;
    let backends = net.backends();
    let comm = net.broadcast_communicator();
    let show = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut directory_errors = Vec::new();
    for m in &plan.mkdirs {
        match make_dirs(&mut net, m).await {
            Ok(problems) => directory_errors.extend(problems),
            Err(e) => {
                directory_errors.push(format!("creating directories under {}: {e:#}", m.base.display()))
            }
        }
    }
    let mut reports = Vec::new();
    let mut error = None;
    for entry in &plan.entries {
        // Bytes sent, rate and time left, on a terminal only.
        let bar = show.then(|| {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(format!("{} -> {backends} back-ends", entry.source.display()));
            bar
        });
        let progress = |sent: u64, size: u64| {
            if let Some(bar) = &bar {
                bar.set_length(size);
                bar.set_position(sent);
            }
        };
        let result = bcast_file_with_progress(
            &mut net,
            &comm,
            &entry.source,
            entry.destination.as_deref(),
            mode,
            args.chunk,
            progress,
        )
        .await;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        match result {
            Ok(r) => {
                let report = report_of(&r, backends);
                if !args.json {
                    print!("{}", render(&report));
                    let _ = std::io::stdout().flush();
                }
                reports.push(report);
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    net.shutdown().await;
    if let Some(e) = error {
        return Err(e.into());
    }
    if single {
        let report = &reports[0];
        if args.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        }
        return Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    let files_not_ok = reports.iter().filter(|r| !r.ok).count();
    let total = TreeReport {
        count: reports.len(),
        bytes: reports.iter().map(|r| r.size).sum(),
        seconds: started.elapsed().as_secs_f64(),
        files_not_ok,
        ok: files_not_ok == 0 && directory_errors.is_empty(),
        directory_errors,
        ignored: plan.ignored.iter().map(|p| p.display().to_string()).collect(),
        files: reports,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&total)?);
    } else {
        print!("{}", render_total(&total));
    }
    Ok(if total.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
