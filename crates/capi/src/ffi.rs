//! What every entry point needs: the runtime blocking calls run on, and checked
//! conversions of C arguments (pointers, strings, time limits, out-parameters).

use std::ffi::{c_char, CStr, CString};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{tc_result, Failure};

/// A time limit meaning "wait as long as it takes"; every other value is milliseconds,
/// and 0 means "do not wait".
pub const TC_FOREVER: u64 = u64::MAX;

/// The runtime every handle's tasks and every blocking call run on: two worker
/// threads, made at the first call that needs it.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("treecast")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Failure::new(tc_result::TC_ERR_OTHER, format!("cannot start treecast's threads: {e}")))
}

/// Runs `fut` to its end on the runtime, from a thread of the caller's.
pub(crate) fn block_on<F: Future>(fut: F) -> Result<F::Output, Failure> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            "a blocking treecast call was made from one of treecast's own threads (a callback); \
             call it from a thread of the tool's",
        ));
    }
    Ok(runtime()?.block_on(fut))
}

/// Runs `fut` with the time limit `ms` (see [`TC_FOREVER`]); `Ok(None)` when it ran out.
pub(crate) fn block_on_for<F: Future>(ms: u64, fut: F) -> Result<Option<F::Output>, Failure> {
    if ms == TC_FOREVER {
        return block_on(fut).map(Some);
    }
    block_on(async move { tokio::time::timeout(duration(ms), fut).await.ok() })
}

/// Longest finite time limit taken as it is; larger ones wait this long (a year), so
/// that no deadline computed from one overflows.
const LONGEST_MS: u64 = 365 * 24 * 3600 * 1000;

/// A time limit in milliseconds as a duration: `TC_FOREVER` and anything over a
/// year is a year.
pub(crate) fn duration(ms: u64) -> Duration {
    Duration::from_millis(ms.min(LONGEST_MS))
}

/// Waits for `flush` at most `ms` milliseconds: `TC_ERR_TIMEOUT` when a link stayed
/// full that long (`TC_ERR_AGAIN` for 0), naming `whose` peer that is not reading.
pub(crate) fn flush_within(ms: u64, flush: impl Future<Output = ()>, whose: &str) -> Result<(), Failure> {
    match block_on_for(ms, flush)? {
        Some(()) => Ok(()),
        None => Err(Failure::new(
            if ms == 0 { tc_result::TC_ERR_AGAIN } else { tc_result::TC_ERR_TIMEOUT },
            format!(
                "what was sent is not all written out after {ms} ms: {whose} is not reading; \
                 wait longer, or go on (it is still sent when the link drains)"
            ),
        )),
    }
}

/// The failure of a call whose time limit of `ms` ran out: `TC_ERR_AGAIN` for 0.
pub(crate) fn ran_out(ms: u64, what: &str) -> Failure {
    match ms {
        0 => Failure::new(tc_result::TC_ERR_AGAIN, format!("no {what} is ready now")),
        _ => Failure::new(tc_result::TC_ERR_TIMEOUT, format!("no {what} came within {ms} ms")),
    }
}

/// The failure for a NULL argument `name`.
pub(crate) fn null(name: &str) -> Failure {
    Failure::new(tc_result::TC_ERR_NULL, format!("{name} is NULL"))
}

/// Borrows the object behind a handle argument.
///
/// # Safety
/// `p` is NULL or points to a live `T` the library made.
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises `p` is NULL or a live handle.
    unsafe { p.as_ref() }.ok_or_else(|| null(name))
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn text<'a>(p: *const c_char, name: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(null(name));
    }
    // SAFETY: not NULL, and the caller promises it is NUL-terminated.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|e| Failure::new(tc_result::TC_ERR_INVALID, format!("{name} is not UTF-8: {e}")))
}

/// An optional C string argument: `None` for NULL.
///
/// # Safety
/// As [`text`].
pub(crate) unsafe fn opt_text<'a>(p: *const c_char, name: &str) -> Result<Option<&'a str>, Failure> {
    match p.is_null() {
        true => Ok(None),
        // SAFETY: as the caller promised.
        false => unsafe { text(p, name) }.map(Some),
    }
}

/// A command line from C, `argv[0..argc]`, as owned strings.
///
/// # Safety
/// `argv` is NULL or points to `argc` NULL-or-NUL-terminated strings.
pub(crate) unsafe fn command(argv: *const *const c_char, argc: usize) -> Result<Vec<String>, Failure> {
    if argc == 0 {
        return Err(Failure::new(tc_result::TC_ERR_INVALID, "argc is 0: a command needs a program"));
    }
    if argv.is_null() {
        return Err(null("argv"));
    }
    // SAFETY: as the caller promised.
    let args = unsafe { std::slice::from_raw_parts(argv, argc) };
    args.iter()
        .enumerate()
        // SAFETY: as the caller promised, for each string.
        .map(|(i, a)| unsafe { text(*a, &format!("argv[{i}]")) }.map(str::to_owned))
        .collect()
}

/// Text for C, owned: a NUL inside it (which C cannot hold) becomes a space.
pub(crate) fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Checks that an out-parameter can be written, before the call does anything.
pub(crate) fn out_ok<T>(p: *mut T, name: &str) -> Result<(), Failure> {
    match p.is_null() {
        true => Err(null(name)),
        false => Ok(()),
    }
}

/// Writes an out-parameter (checked with [`out_ok`]); only on success.
///
/// # Safety
/// `p` is a valid, aligned pointer to a `T`.
pub(crate) unsafe fn put<T>(p: *mut T, value: T) {
    // SAFETY: as the caller promised (checked not NULL by `out_ok`).
    unsafe { p.write(value) };
}

/// Hands a new object to C as an owned handle.
pub(crate) fn handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back a handle made by [`handle`]; NULL is ignored.
///
/// # Safety
/// `p` is NULL or a handle from [`handle`] not freed yet, and no other thread uses it.
pub(crate) unsafe fn take<T>(p: *mut T) -> Option<Box<T>> {
    match p.is_null() {
        true => None,
        // SAFETY: as the caller promised.
        false => Some(unsafe { Box::from_raw(p) }),
    }
}

/// How long a send waits for room in its stream's window unless told otherwise: a
/// back-end that stopped reading fails the send instead of hanging the tool.
pub const TC_DEFAULT_SEND_TIMEOUT_MS: u64 = 60_000;

/// Runs a send that may wait for room, at most `ms` (see [`TC_FOREVER`]).
pub(crate) fn send_within<F, E>(ms: u64, send: F) -> Result<(), Failure>
where
    F: Future<Output = Result<(), E>>,
    Failure: From<E>,
{
    match block_on_for(ms, send)? {
        Some(done) => Ok(done?),
        None => Err(Failure::new(
            tc_result::TC_ERR_TIMEOUT,
            format!(
                "the stream's window stayed full for {ms} ms (a back-end or the front-end is not \
                 reading); nothing was sent. Raise the limit with tc_network_options_set_send_timeout \
                 or tc_backend_set_send_timeout"
            ),
        )),
    }
}
