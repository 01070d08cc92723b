//! `treecast monitor`: a recorded run's performance signature, against a baseline.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use treecast_monitor::{compare, signature_svg, size_class_label, Collection, Deviation, Report, Signature};

use super::cli::MonitorArgs;

/// Prints the signature of the recorded run (and where it deviates from the
/// baseline), and draws it when asked.
pub fn main(args: MonitorArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.threshold.is_finite() && args.threshold >= 0.0,
        "--threshold must be a percentage of 0 or more, not {}",
        args.threshold
    );
    let report = read_report(&args.report)?;
    let programs: std::collections::BTreeSet<u32> = report.cells.iter().map(|c| c.program).collect();
    let run = Signature::of(&report, args.program);
    let baseline = match &args.baseline {
        Some(path) => Some(Signature::of(&read_report(path)?, args.program)),
        None => None,
    };
    if run.is_empty() {
        eprintln!("monitor: {} holds no samples{}", args.report.display(), program_note(args.program));
    }
    if let Some(path) = &args.svg {
        let title = format!("treecast signature: {}", args.report.display());
        let svg = signature_svg(&title, &run, baseline.as_ref())?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    let deviations = baseline.as_ref().map(|b| compare(&run, b));
    if args.json {
        let shown = serde_json::json!({ "signature": run, "baseline": baseline, "deviations": deviations });
        println!("{shown}");
    } else {
        let tags: Vec<String> = programs.iter().map(u32::to_string).collect();
        println!("program tags recorded: {} (--program picks one)", tags.join(", "));
        print!("{}", signature_table(&run));
        if let Some(d) = &deviations {
            print!("{}", deviation_table(d, args.threshold));
        }
    }
    if let Some(path) = &args.svg {
        eprintln!("monitor: signature drawn into {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn program_note(program: Option<u32>) -> String {
    program.map(|p| format!(" under program tag {p}")).unwrap_or_default()
}

/// The largest report file read, as for host and topology files.
pub const MAX_REPORT_FILE_BYTES: u64 = 64 << 20;

/// A collection (per node or merged) or a single report, merged into one report
/// (which checks every cell); at most [`MAX_REPORT_FILE_BYTES`] are read.
fn read_report(path: &Path) -> anyhow::Result<Report> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_REPORT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_REPORT_FILE_BYTES,
        "{} is larger than {} MiB, the limit of monitor reports",
        path.display(),
        MAX_REPORT_FILE_BYTES >> 20
    );
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    // Which of the two it means to be, so that its own parse error is the one shown.
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let has = |key: &str| value.as_object().is_some_and(|o| o.contains_key(key));
    if has("reports") {
        let collection = Collection::from_json(&text).with_context(|| {
            format!("{} has `reports` but is no valid collection of reports", path.display())
        })?;
        for missing in &collection.missing {
            eprintln!("monitor: {}: the run has no report from {missing}", path.display());
        }
        return collection.merged().with_context(|| format!("merging the reports of {}", path.display()));
    }
    anyhow::ensure!(
        has("cells"),
        "{} is neither a collection (as `treecast bench microbench --monitor` writes, with `reports`) nor one report (with `cells`)",
        path.display()
    );
    let report = Report::from_json(&text)
        .with_context(|| format!("{} has `cells` but is no valid report", path.display()))?;
    Report::merged([&report]).with_context(|| format!("reading the report {}", path.display()))
}

fn signature_table(s: &Signature) -> String {
    let mut out = String::new();
    for series in &s.series {
        let _ = writeln!(out, "{}:", series.component.name());
        if series.points.is_empty() {
            let _ = writeln!(out, "  (no samples)");
            continue;
        }
        let _ = writeln!(out, "  {:<18} {:>12} {:>14}", "frame size", "frames", "mean µs");
        for p in &series.points {
            let _ = writeln!(
                out,
                "  {:<18} {:>12} {:>14.2}",
                size_class_label(p.size_class),
                p.frames,
                p.mean_ns / 1_000.0
            );
        }
    }
    out
}

fn deviation_table(deviations: &[Deviation], threshold: f64) -> String {
    let mut out = String::new();
    let compared = deviations.iter().filter(|d| d.change_pct().is_some()).count();
    // One-sided points always get a row: a size that appeared or vanished is news.
    let shown: Vec<&Deviation> =
        deviations.iter().filter(|d| d.change_pct().map_or(true, |c| c.abs() >= threshold)).collect();
    let moved = shown.iter().filter(|d| d.change_pct().is_some()).count();
    let _ = writeln!(
        out,
        "against the baseline: {moved} of {compared} points moved by {threshold} % or more; {} found in one run only",
        shown.len() - moved
    );
    if shown.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "  {:<9} {:<18} {:>14} {:>14} {:>9} {:>10} {:>10}",
        "component", "frame size", "mean µs", "baseline µs", "change", "frames", "base frames"
    );
    for d in shown {
        let mean = |p: Option<treecast_monitor::Point>| {
            p.map_or("-".into(), |p| format!("{:.2}", p.mean_ns / 1_000.0))
        };
        let frames = |p: Option<treecast_monitor::Point>| p.map_or("-".into(), |p| p.frames.to_string());
        let change = d.change_pct().map_or("-".into(), |c| format!("{c:+.1} %"));
        let _ = writeln!(
            out,
            "  {:<9} {:<18} {:>14} {:>14} {:>9} {:>10} {:>10}",
            d.component.name(),
            size_class_label(d.size_class),
            mean(d.run),
            mean(d.baseline),
            change,
            frames(d.run),
            frames(d.baseline)
        );
    }
    out
}
