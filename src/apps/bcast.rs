//! `treecast bcast`: copy a file to every back-end's host through the tree.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use treecast_api::Network;
use treecast_files::{
    bcast_files, EntryKind, FileEntry, FileOptions, FileReport, Progress, WriteMode, MAX_TIMEOUT,
};

use treecast_monitor::RouteReport;

use super::cli::{BcastArgs, RouteKind};

/// How long the tree has to report what its multicast routes did.
const ROUTE_REPORT_LIMIT: Duration = Duration::from_secs(5);

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
    /// `file`, `symlink` or `directory` (its mode and mtime).
    pub kind: &'static str,
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
        kind: kind_name(report.kind),
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

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Symlink => "symlink",
        EntryKind::Directory => "directory",
        _ => "file",
    }
}

/// What each node's multicast route did, gathered from the whole tree (empty when
/// the tree does not answer in time: the transfer's own report still stands).
pub(crate) async fn route_reports(net: &Network) -> Vec<RouteReport> {
    match net.monitor_collect(true, ROUTE_REPORT_LIMIT).await {
        Ok(c) => {
            for m in &c.missing {
                eprintln!("treecast: no route report from {m}");
            }
            c.reports.into_values().flat_map(|r| r.routes).collect()
        }
        Err(e) => {
            eprintln!("treecast: no route report: {e}");
            Vec::new()
        }
    }
}

/// A report as JSON with the route reports beside its fields.
fn with_routes(report: &impl Serialize, routes: &[RouteReport]) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(report)?;
    if let serde_json::Value::Object(map) = &mut v {
        map.insert("routes".into(), serde_json::to_value(routes)?);
    }
    Ok(v)
}

/// One line per node that multicast: to which children, and what the protocol did.
pub fn render_routes(routes: &[RouteReport]) -> String {
    let list = |nodes: &[u32]| nodes.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut out = String::new();
    for r in routes {
        out.push_str(&format!(
            "route: node {} udp to nodes [{}] via {}, tcp to [{}]: {} frames ({} bytes), {} fragments, {} resent, {} NACKs, {} acker changes, {} time-outs\n",
            r.node,
            list(&r.udp_children),
            r.group,
            list(&r.tcp_children),
            r.frames,
            r.bytes,
            r.fragments,
            r.retransmitted,
            r.nacks,
            r.acker_changes,
            r.timeouts
        ));
    }
    out
}

/// The text summary: one line per outcome class, then lost ranks.
pub fn render(r: &BcastReport) -> String {
    let what = match r.kind {
        "symlink" => "symbolic link".to_owned(),
        "directory" => "directory mode and mtime".to_owned(),
        _ => format!("{} bytes", r.size),
    };
    let mut out = format!(
        "{} -> {} ({what}, {} back-end{}, {:.2} s)\n",
        r.source,
        r.destination,
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
    entries: Vec<FileEntry>,
    mkdirs: Vec<MakeDirs>,
    /// Paths under a source directory that are not regular files, links or directories.
    ignored: Vec<PathBuf>,
}

/// `path` made absolute against the working directory, with `.` and `..` removed
/// lexically: symbolic links are never resolved, so a link keeps its own name.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(path).with_context(|| format!("making {} absolute", path.display()))?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The name a source is copied under: its last component, as given (a symbolic link
/// keeps its own name, as with `cp`).
fn name_of(path: &Path) -> anyhow::Result<std::ffi::OsString> {
    absolute(path)?
        .file_name()
        .map(ToOwned::to_owned)
        .with_context(|| format!("source {} has no name", path.display()))
}

/// Lists the files of several sources (directories with `recursive`), in a stable order.
///
/// `dst` is made absolute here, against the front-end's working directory: the
/// back-ends' working directories differ (`$HOME` over ssh), and directories and files
/// must land in the same place.
fn plan(sources: &[PathBuf], dst: Option<&Path>, recursive: bool) -> anyhow::Result<Plan> {
    let dst = dst.map(absolute).transpose()?;
    let dst = dst.as_deref();
    let mut plan = Plan::default();
    for src in sources {
        let meta = std::fs::metadata(src).with_context(|| format!("source {}", src.display()))?;
        let abs = std::path::absolute(src).with_context(|| format!("source {}", src.display()))?;
        if meta.is_file() {
            let entry = match dst {
                // DST/NAME exactly: an existing directory there is an error, as with cp.
                Some(d) => FileEntry::file_at(abs, d.join(name_of(src)?)),
                None => FileEntry::file(abs, None),
            };
            plan.entries.push(entry);
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
                    plan.entries.push(FileEntry::file_at(child.path(), parent.join(&child_rel)));
                } else if kind.is_symlink() {
                    // Recreated as a link with the same target text, never followed.
                    plan.entries.push(FileEntry::symlink(child.path(), parent.join(&child_rel)));
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
        // Modes and mtimes last, deepest first: writing a directory's entries (and its
        // subdirectories' attributes, which come before it) would change its mtime again.
        let mut attrs: Vec<&PathBuf> = dirs.iter().collect();
        attrs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for rel in attrs {
            let here = match rel.strip_prefix(&name) {
                Ok(inner) if inner.as_os_str().is_empty() => abs.clone(),
                Ok(inner) => abs.join(inner),
                Err(_) => continue,
            };
            plan.entries.push(FileEntry::directory(here, parent.join(rel)));
        }
        plan.mkdirs.push(MakeDirs { base: parent, dirs });
    }
    Ok(plan)
}

/// Creates the directories of a recursive copy on every back-end (one `mkdir -p` per
/// source directory); ranks that do not answer within `limit` (plus a grace) are problems.
async fn make_dirs(net: &mut Network, m: &MakeDirs, limit: Duration) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for batch in m.dirs.chunks(1000) {
        let mut argv: Vec<String> = ["sh", "-c", "cd -- \"$1\" && shift && mkdir -p -- \"$@\"", "sh"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        argv.push(m.base.display().to_string());
        argv.extend(batch.iter().map(|d| d.display().to_string()));
        let report = super::run::run_command(net, &argv, Some(limit)).await?;
        for c in report.classes.iter().filter(|c| c.exit_code != 0) {
            problems.push(format!(
                "creating directories under {} failed on ranks [{}] (exit {}): {}",
                m.base.display(),
                c.ranks,
                c.exit_code,
                c.stderr_text().trim()
            ));
        }
        for l in &report.lost {
            problems.push(format!("lost [{}] while creating directories: {}", l.ranks, l.reason));
        }
        for l in &report.no_answer {
            problems.push(format!(
                "creating directories under {} on ranks [{}]: {}",
                m.base.display(),
                l.ranks,
                l.reason
            ));
        }
    }
    Ok(problems)
}

/// The total of a multi-file call, as printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct TreeReport {
    /// One report per entry (files, links, directory attributes), in the order sent.
    pub files: Vec<BcastReport>,
    /// Directory creation problems (empty when every directory was made).
    pub directory_errors: Vec<String>,
    /// Paths under a source directory that were not sent (not regular files, links or directories).
    pub ignored: Vec<String>,
    /// Regular files sent.
    pub count: usize,
    /// Bytes in all files.
    pub bytes: u64,
    /// Seconds for the whole call (directories and files, not the start-up).
    pub seconds: f64,
    /// Entries with a failed or lost rank.
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
        out.push_str(&format!("ignored (not a regular file, link or directory): {i}\n"));
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

/// A progress bar per file (bytes sent, rate, time left, ranks done) and each file's summary as it completes.
struct Display {
    show_bar: bool,
    json: bool,
    backends: u32,
    bar: Option<ProgressBar>,
    reports: Vec<BcastReport>,
}

impl Display {
    fn on(&mut self, p: Progress<'_>) {
        match p {
            Progress::Started { entry, size, .. } if self.show_bar && entry.kind == EntryKind::File => {
                let bar = ProgressBar::new(size);
                let style = ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {prefix}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
                bar.set_style(style);
                bar.set_message(format!("{} -> {} back-ends", entry.source.display(), self.backends));
                self.bar = Some(bar);
            }
            Progress::Sent { sent, .. } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(sent);
                }
            }
            Progress::Ranks { done, total, .. } => {
                if let Some(bar) = &self.bar {
                    bar.set_prefix(format!("{done}/{total} ranks done"));
                }
            }
            Progress::Done { report, .. } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                let report = report_of(report, self.backends);
                if !self.json {
                    print!("{}", render(&report));
                    let _ = std::io::stdout().flush();
                }
                self.reports.push(report);
            }
            _ => {}
        }
    }
}

/// True when `path` is written with a trailing `/` (or `/.`): it can only be a directory.
fn names_a_directory(path: &Path) -> bool {
    let bytes = path.as_os_str().as_encoded_bytes();
    bytes.ends_with(b"/") || bytes.ends_with(b"/.") || bytes == b"."
}

/// The directory `--mkdir` creates on every host: DST when it names a directory (a
/// trailing `/`, several sources, `-r`), else the directory the destination is in.
fn mkdir_target(args: &BcastArgs, single: bool) -> anyhow::Result<PathBuf> {
    let (dst, src) = match args.paths.as_slice() {
        [src] => (None, src),
        [src, .., dst] => (Some(dst), src),
        [] => anyhow::bail!("no source given"),
    };
    let target = match dst {
        Some(d) if !single || names_a_directory(d) => absolute(d)?,
        Some(d) => absolute(d)?.parent().map(Path::to_path_buf).unwrap_or_default(),
        None => absolute(src)?.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    Ok(target)
}

/// `mkdir -p DIR` on every back-end; returns what went wrong, per class of ranks.
async fn mkdir_everywhere(net: &mut Network, dir: &Path, limit: Duration) -> anyhow::Result<Vec<String>> {
    let argv = ["mkdir".to_owned(), "-p".to_owned(), "--".to_owned(), dir.display().to_string()];
    let report = super::run::run_command(net, &argv, Some(limit)).await?;
    let mut problems = Vec::new();
    for c in report.classes.iter().filter(|c| c.exit_code != 0) {
        problems.push(format!(
            "--mkdir: creating {} failed on ranks [{}] ({}): {}",
            dir.display(),
            c.ranks,
            c.status(),
            c.stderr_text().trim()
        ));
    }
    for l in report.lost.iter().chain(&report.no_answer) {
        problems.push(format!("--mkdir: creating {} on ranks [{}]: {}", dir.display(), l.ranks, l.reason));
    }
    Ok(problems)
}

/// Every failed or lost rank of `reports` on stderr, one line per class, so that a
/// failure shows when stdout goes to a file or a pipe (`--json`).
fn failures_to_stderr(reports: &[BcastReport]) {
    for r in reports {
        for c in r.classes.iter().filter(|c| c.outcome == "failed") {
            eprintln!(
                "treecast: {}: failed on {} rank{} [{}]: {}",
                r.destination,
                c.count,
                if c.count == 1 { "" } else { "s" },
                c.ranks,
                c.detail
            );
        }
        for l in &r.lost {
            eprintln!("treecast: {}: lost [{}]: {}", r.destination, l.ranks, l.reason);
        }
    }
}

/// A failure detail that a missing destination directory explains.
fn is_missing_directory(detail: &str) -> bool {
    detail.starts_with("destination directory ") && detail.ends_with(" does not exist")
}

/// The exit status, as the README's table gives it for `run`: 255 when a rank was
/// lost or did not answer (as ssh reports a host it could not reach), else 1 when a
/// rank failed (or a directory could not be made), else 0.
pub fn exit_status(reports: &[BcastReport], directory_errors: usize) -> u8 {
    let unreachable = reports.iter().any(|r| {
        !r.lost.is_empty()
            || r.classes.iter().any(|c| c.outcome == "failed" && c.detail.starts_with("no answer within"))
    });
    if unreachable {
        super::run::EXIT_LOST
    } else if directory_errors > 0 || reports.iter().any(|r| !r.ok) {
        1
    } else {
        0
    }
}

/// Works out what to send before any process starts.
fn plan_of(args: &BcastArgs) -> anyhow::Result<(Plan, bool)> {
    let (sources, dst) = match args.paths.as_slice() {
        [src] => (vec![src.clone()], None),
        [sources @ .., dst] => (sources.to_vec(), Some(dst.clone())),
        [] => anyhow::bail!("no source given"),
    };
    let single = sources.len() == 1 && std::fs::metadata(&sources[0]).is_ok_and(|m| m.is_file());
    if single {
        let entry = match dst {
            // `DST/` means a directory: the file goes in it, under its own name, and a
            // missing directory is named as such.
            Some(d) if names_a_directory(&d) => {
                let abs = std::path::absolute(&sources[0])
                    .with_context(|| format!("source {}", sources[0].display()))?;
                FileEntry::file_at(abs, absolute(&d)?.join(name_of(&sources[0])?))
            }
            dst => FileEntry::file(sources[0].clone(), dst),
        };
        let entries = vec![entry];
        return Ok((Plan { entries, ..Plan::default() }, true));
    }
    // The usual message for a missing or special single source.
    let meta = std::fs::metadata(&sources[0]).with_context(|| format!("source {}", sources[0].display()))?;
    anyhow::ensure!(
        sources.len() > 1 || meta.is_dir(),
        "source {} is not a regular file",
        sources[0].display()
    );
    Ok((plan(&sources, dst.as_deref(), args.recursive)?, false))
}

/// Starts the tree, sends the file(s), prints the summary; exits as [`exit_status`] says.
pub async fn main(args: BcastArgs) -> anyhow::Result<ExitCode> {
    let mode: WriteMode = args.mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        (1..=treecast_files::MAX_CHUNK).contains(&args.chunk),
        "--chunk must be between 1 and {} bytes",
        treecast_files::MAX_CHUNK
    );
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|t| !t.is_zero() && *t <= MAX_TIMEOUT)
        .with_context(|| {
            format!(
                "--timeout {} is not a number of seconds between 0.001 and {}",
                args.timeout,
                MAX_TIMEOUT.as_secs()
            )
        })?;
    let options = FileOptions { mode, chunk: args.chunk, timeout };
    options.validate()?;
    let (plan, single) = plan_of(&args)?;
    // `/` is on every host already.
    let mkdir = if args.mkdir { Some(mkdir_target(&args, single)?) } else { None };
    let mkdir = mkdir.filter(|d| d.parent().is_some());
    let mut net = super::run::launch(&args.tree).await?;
    let backends = net.backends();
    let comm = net.broadcast_communicator();
    let started = Instant::now();
    let mut directory_errors = Vec::new();
    if let Some(dir) = &mkdir {
        match mkdir_everywhere(&mut net, dir, options.timeout).await {
            Ok(problems) => directory_errors.extend(problems),
            Err(e) => directory_errors.push(format!("--mkdir: creating {}: {e:#}", dir.display())),
        }
    }
    for m in &plan.mkdirs {
        match make_dirs(&mut net, m, options.timeout).await {
            Ok(problems) => directory_errors.extend(problems),
            Err(e) => {
                directory_errors.push(format!("creating directories under {}: {e:#}", m.base.display()))
            }
        }
    }
    let show_bar = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let mut display = Display { show_bar, json: args.json, backends, bar: None, reports: Vec::new() };
    let result = bcast_files(&net, &comm, &plan.entries, &options, |p| display.on(p)).await;
    if let Some(bar) = display.bar.take() {
        bar.finish_and_clear();
    }
    let routes = match (&result, args.tree.route) {
        (Ok(_), RouteKind::Udp) => route_reports(&net).await,
        _ => Vec::new(),
    };
    net.shutdown().await;
    result?;
    let reports = display.reports;
    if !args.json {
        print!("{}", render_routes(&routes));
    }
    for e in &directory_errors {
        eprintln!("treecast: error: {e}");
    }
    failures_to_stderr(&reports);
    let missing_dir = reports.iter().flat_map(|r| &r.classes).any(|c| is_missing_directory(&c.detail));
    if missing_dir && !args.mkdir {
        eprintln!("treecast: tip: --mkdir creates the destination directory on every host first");
    }
    let status = ExitCode::from(exit_status(&reports, directory_errors.len()));
    if single {
        let report = reports.first().context("no report for the file")?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&with_routes(report, &routes)?)?);
        }
        return Ok(status);
    }
    let files = reports.iter().filter(|r| r.kind == "file");
    let files_not_ok = reports.iter().filter(|r| !r.ok).count();
    let total = TreeReport {
        count: files.clone().count(),
        bytes: files.map(|r| r.size).sum(),
        seconds: started.elapsed().as_secs_f64(),
        files_not_ok,
        ok: files_not_ok == 0 && directory_errors.is_empty(),
        directory_errors,
        ignored: plan.ignored.iter().map(|p| p.display().to_string()).collect(),
        files: reports,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&with_routes(&total, &routes)?)?);
    } else {
        print!("{}", render_total(&total));
    }
    Ok(status)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_destination_puts_directories_and_files_in_the_same_absolute_place() {
        let s = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(s.path().join("tool/sub")).unwrap();
        std::fs::write(s.path().join("tool/sub/f"), b"x").unwrap();
        let plan = plan(&[s.path().join("tool")], Some(Path::new("./rel/../out")), true).unwrap();
        let base = std::env::current_dir().unwrap().join("out");
        assert_eq!(plan.mkdirs[0].base, base, "{plan:?}");
        for e in &plan.entries {
            let dst = e.destination.as_ref().unwrap();
            assert!(dst.starts_with(&base), "{dst:?} is not under {base:?}");
        }
    }

    fn bcast_args(args: &[&str]) -> BcastArgs {
        use crate::apps::cli::{Cli, Command};
        use clap::Parser;
        match Cli::try_parse_from([&["treecast", "bcast"][..], args].concat()).unwrap().command {
            Command::Bcast(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_destination_ending_in_a_slash_is_a_directory_the_file_goes_into() {
        let s = tempfile::tempdir().unwrap();
        let src = s.path().join("tool.tar");
        std::fs::write(&src, b"x").unwrap();
        let src = src.to_str().unwrap();
        let (plan, single) = plan_of(&bcast_args(&[src, "/scratch/"])).unwrap();
        assert!(single);
        assert_eq!(plan.entries[0].destination.as_deref(), Some(Path::new("/scratch/tool.tar")));
        assert!(plan.entries[0].exact, "{plan:?}");
        let (plan, _) = plan_of(&bcast_args(&[src, "/scratch/t"])).unwrap();
        assert_eq!(plan.entries[0].destination.as_deref(), Some(Path::new("/scratch/t")));
        assert!(!plan.entries[0].exact, "an existing directory still takes the file: {plan:?}");
        for (args, single, dir) in [
            (&[src, "/a/b/"][..], true, "/a/b"),
            (&[src, "/a/b"], true, "/a"),
            (&[src, src, "/a/b"], false, "/a/b"),
        ] {
            assert_eq!(mkdir_target(&bcast_args(args), single).unwrap(), Path::new(dir), "{args:?}");
        }
    }

    fn report(classes: &[(&str, &str)], lost: bool) -> BcastReport {
        BcastReport {
            kind: "file",
            source: "/s".into(),
            destination: "/d".into(),
            size: 1,
            blake3: String::new(),
            backends: 2,
            seconds: 0.0,
            classes: classes
                .iter()
                .map(|(o, d)| OutcomeClass {
                    outcome: (*o).into(),
                    ranks: "0".into(),
                    count: 1,
                    detail: (*d).into(),
                })
                .collect(),
            lost: if lost {
                vec![LostRanks { ranks: "1".into(), reason: "gone".into() }]
            } else {
                Vec::new()
            },
            ok: !lost && classes.iter().all(|(o, _)| *o != "failed"),
        }
    }

    #[test]
    fn the_exit_status_follows_the_table_of_run() {
        assert_eq!(exit_status(&[report(&[("written", "")], false)], 0), 0);
        assert_eq!(exit_status(&[report(&[("written", "")], false)], 1), 1);
        assert_eq!(
            exit_status(&[report(&[("failed", "destination directory /x does not exist")], false)], 0),
            1
        );
        assert_eq!(exit_status(&[report(&[("written", "")], true)], 0), 255);
        assert_eq!(
            exit_status(&[report(&[("failed", "no answer within 60 s after the status")], false)], 0),
            255
        );
        assert!(is_missing_directory("destination directory /x/nodir does not exist"));
    }

    #[test]
    fn a_symlinked_source_keeps_its_own_name() {
        let s = tempfile::tempdir().unwrap();
        std::fs::write(s.path().join("liba.so.1.2"), b"x").unwrap();
        std::os::unix::fs::symlink("liba.so.1.2", s.path().join("lib.so")).unwrap();
        std::fs::write(s.path().join("b.so"), b"y").unwrap();
        let sources = [s.path().join("lib.so"), s.path().join("b.so")];
        let plan = plan(&sources, Some(Path::new("/d")), false).unwrap();
        let dsts: Vec<_> = plan.entries.iter().map(|e| e.destination.clone().unwrap()).collect();
        assert_eq!(dsts, [PathBuf::from("/d/lib.so"), PathBuf::from("/d/b.so")]);
        assert!(plan.entries.iter().all(|e| e.exact), "DST/NAME is exact: {plan:?}");
        assert_eq!(name_of(&s.path().join("sub/..").join("b.so")).unwrap(), "b.so");
    }
}
