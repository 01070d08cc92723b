//! File distribution: a front-end pushes a file to every back-end of a communicator;
//! a C back-end's `tc_backend_recv` writes what comes without the tool seeing it.

use std::ffi::{c_char, c_void, CString};
use std::path::Path;

use treecast_files::{bcast_files, FileEntry, FileOptions, FileReport, Outcome, Progress, WriteMode};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{arg, block_on, c_text, handle, opt_text, out_ok, put, take, text};
use crate::network::{tc_communicator, tc_network};

/// Keep a destination that exists (the default).
pub const TC_WRITE_LEAVE: u32 = 0;
/// Overwrite a destination only if the source is newer.
pub const TC_WRITE_NEWER: u32 = 1;
/// Always overwrite.
pub const TC_WRITE_OVERWRITE: u32 = 2;

/// Ranks that received, checked and wrote the file.
pub const TC_FILE_WRITTEN: u32 = 0;
/// Ranks that skipped it: they already see it, or the write mode kept theirs.
pub const TC_FILE_SKIPPED: u32 = 1;
/// Ranks that failed to write it (the report's message says why).
pub const TC_FILE_FAILED: u32 = 2;
/// Ranks lost before they answered.
pub const TC_FILE_LOST: u32 = 3;

/// Told how a transfer goes, on the thread that called `tc_network_bcast_file`:
/// bytes sent of the file's size, and ranks done of the communicator's. It must not
/// call treecast.
#[allow(non_camel_case_types)]
pub type tc_progress_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, sent: u64, size: u64, ranks_done: u64, ranks_total: u64)>;

/// What happened to a file on every rank; freed with `tc_file_report_free`.
#[allow(non_camel_case_types)]
pub struct tc_file_report {
    report: FileReport,
    /// Rank sets by `TC_FILE_*`, as text.
    ranks: [CString; 4],
    message: CString,
}

impl tc_file_report {
    fn new(report: FileReport) -> tc_file_report {
        let mut skipped = report.ranks_with(Outcome::SkippedShared);
        skipped.union_with(&report.ranks_with(Outcome::SkippedLeave));
        skipped.union_with(&report.ranks_with(Outcome::SkippedOlder));
        let ranks = [
            c_text(&report.ranks_with(Outcome::Written).to_string()),
            c_text(&skipped.to_string()),
            c_text(&report.ranks_with(Outcome::Failed).to_string()),
            c_text(&report.lost_ranks().to_string()),
        ];
        let mut lines: Vec<String> = report
            .outcomes
            .iter()
            .filter(|o| o.outcome == Outcome::Failed)
            .map(|o| format!("ranks {}: {}", o.ranks, o.detail))
            .collect();
        lines.extend(report.lost.iter().map(|(r, why)| format!("ranks {r} lost: {why}")));
        tc_file_report { report, ranks, message: c_text(&lines.join("\n")) }
    }
}

fn write_mode(mode: u32) -> Result<WriteMode, Failure> {
    match mode {
        TC_WRITE_LEAVE => Ok(WriteMode::Leave),
        TC_WRITE_NEWER => Ok(WriteMode::Newer),
        TC_WRITE_OVERWRITE => Ok(WriteMode::Overwrite),
        other => Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            format!("no write mode {other}: use TC_WRITE_LEAVE, TC_WRITE_NEWER or TC_WRITE_OVERWRITE"),
        )),
    }
}

/// Pushes the file `src` to every rank of `comm`, at `dst` (NULL: the same absolute
/// path; a path ending in `/` is a folder to put it in), checked end to end, and
/// writes what happened on every rank to `out`. Ranks that fail are in the report,
/// not an error: check `tc_file_report_ok`. `progress` (may be NULL) is called with
/// `user` as the transfer goes.
///
/// # Safety
/// `net`, `comm` are NULL or live; `src` and `dst` are NULL or NUL-terminated;
/// `progress` is NULL or a function safe to call with `user`; `out` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tc_network_bcast_file(
    net: *const tc_network,
    comm: *const tc_communicator,
    src: *const c_char,
    dst: *const c_char,
    mode: u32,
    progress: tc_progress_fn,
    user: *mut c_void,
    out: *mut *mut tc_file_report,
) -> tc_result {
    guard("tc_network_bcast_file", || {
        // SAFETY: as the caller promised.
        let (n, c) = unsafe { (arg(net, "net")?, arg(comm, "comm")?) };
        // SAFETY: as the caller promised.
        let (src, dst) = unsafe { (text(src, "src")?, opt_text(dst, "dst")?) };
        out_ok(out, "out")?;
        let options = FileOptions { mode: write_mode(mode)?, ..FileOptions::default() };
        let entry = FileEntry::file(Path::new(src), dst.map(Into::into));
        let mut size = 0;
        let mut report = |p: Progress<'_>| {
            let Some(f) = progress else { return };
            let (sent, done, total) = match p {
                Progress::Started { size: s, .. } => {
                    size = s;
                    (0, 0, 0)
                }
                Progress::Sent { sent, .. } => (sent, 0, 0),
                Progress::Ranks { done, total, .. } => (size, done, total),
                _ => return,
            };
            // SAFETY: the caller promised `progress` is safe to call with `user`.
            unsafe { f(user, sent, size, done, total) };
        };
        let mut reports = block_on(bcast_files(&n.net, &c.comm, &[entry], &options, &mut report))??;
        let one =
            reports.pop().ok_or_else(|| Failure::new(tc_result::TC_ERR_OTHER, "no report came back"))?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(tc_file_report::new(one))) };
        Ok(())
    })
}

/// True when every rank wrote or skipped the file (none failed, none was lost).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_file_report_ok(report: *const tc_file_report) -> bool {
    // SAFETY: as the caller promised.
    quiet(false, || unsafe { report.as_ref() }.is_some_and(|r| r.report.ok()))
}

/// The ranks with one outcome (`TC_FILE_WRITTEN`, `_SKIPPED`, `_FAILED`, `_LOST`),
/// folded like `"0-3,8"`; owned by the report (`""` for none, an unknown outcome, or NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_file_report_ranks(report: *const tc_file_report, outcome: u32) -> *const c_char {
    quiet(c"".as_ptr(), || {
        // SAFETY: as the caller promised.
        let r = unsafe { report.as_ref() };
        r.and_then(|r| r.ranks.get(outcome as usize)).map_or(c"".as_ptr(), |s| s.as_ptr())
    })
}

/// Why ranks failed or were lost, one line per group of ranks (`""` when none did);
/// owned by the report.
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_file_report_message(report: *const tc_file_report) -> *const c_char {
    // SAFETY: as the caller promised.
    quiet(c"".as_ptr(), || unsafe { report.as_ref() }.map_or(c"".as_ptr(), |r| r.message.as_ptr()))
}

/// The file's size in bytes (0 for NULL).
///
/// # Safety
/// `report` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_file_report_size(report: *const tc_file_report) -> u64 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { report.as_ref() }.map_or(0, |r| r.report.size))
}

/// Frees a report; NULL is ignored.
///
/// # Safety
/// `report` is NULL or a report not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_file_report_free(report: *mut tc_file_report) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(report) }));
}
