//! Result codes, the per-thread message of the last error, and the guard every entry
//! point runs its body in, so that no Rust panic crosses into C.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use treecast_api::ApiError;

/// What a call did: `TC_OK`, or the kind of failure; `tc_last_error()` on the same
/// thread says what failed, where, and what to do.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tc_result {
    /// The call did what it says; its out-parameters are written.
    TC_OK = 0,
    /// A pointer argument that must not be NULL was NULL.
    TC_ERR_NULL = 1,
    /// An argument is malformed: not UTF-8, a bad rank set, topology or option value.
    TC_ERR_INVALID = 2,
    /// A format string is malformed, or values do not match it.
    TC_ERR_FORMAT = 3,
    /// The call's time limit passed first.
    TC_ERR_TIMEOUT = 4,
    /// Nothing is ready now (a call with a time limit of 0).
    TC_ERR_AGAIN = 5,
    /// The network, the stream or the link is gone.
    TC_ERR_CLOSED = 6,
    /// The tree could not start.
    TC_ERR_LAUNCH = 7,
    /// A back-end that was not started by treecast: its environment lacks a variable.
    TC_ERR_NOT_LAUNCHED = 8,
    /// No rank answered a request (the stream goes on).
    TC_ERR_NO_ANSWER = 9,
    /// A node refused: a stream whose filter it could not make, a command.
    TC_ERR_REFUSED = 10,
    /// A plug-in filter could not be read or loaded.
    TC_ERR_PLUGIN = 11,
    /// An index or a value out of range (a packet's value, a rank).
    TC_ERR_RANGE = 12,
    /// A bug inside treecast was caught before it reached the caller; please report it.
    TC_ERR_PANIC = 13,
    /// Any other failure; the message says which.
    TC_ERR_OTHER = 14,
    /// The request was cancelled before it completed.
    TC_ERR_CANCELLED = 15,
}

/// A failure on its way to C: the code the call returns and the thread's message.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) code: tc_result,
    /// Borrowed when fixed: a poll loop's `TC_ERR_AGAIN` then allocates nothing.
    pub(crate) message: Cow<'static, str>,
}

impl Failure {
    pub(crate) fn new(code: tc_result, message: impl Into<Cow<'static, str>>) -> Failure {
        Failure { code, message: message.into() }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        let code = match &e {
            ApiError::Format(_)
            | ApiError::WrongFormat { .. }
            | ApiError::Decode(_)
            | ApiError::EqClassPacket { .. } => tc_result::TC_ERR_FORMAT,
            ApiError::Timeout(_) | ApiError::ClockTimeout { .. } => tc_result::TC_ERR_TIMEOUT,
            ApiError::Closed(_)
            | ApiError::StreamClosed(_)
            | ApiError::Join(_)
            | ApiError::Link { .. }
            | ApiError::NoPlan { .. } => tc_result::TC_ERR_CLOSED,
            ApiError::Startup(_) | ApiError::Launcher(_) | ApiError::NoBinary(_) | ApiError::NoBackends => {
                tc_result::TC_ERR_LAUNCH
            }
            ApiError::NotLaunched { .. } | ApiError::BadEnv { .. } | ApiError::NoAttachFile { .. } => {
                tc_result::TC_ERR_NOT_LAUNCHED
            }
            ApiError::NoAnswer(_) => tc_result::TC_ERR_NO_ANSWER,
            ApiError::StreamRefused { .. }
            | ApiError::Refused(_)
            | ApiError::StreamFilter { .. }
            | ApiError::FilterRefused { .. }
            | ApiError::FilterUnconfirmed { .. } => tc_result::TC_ERR_REFUSED,
            ApiError::Plugin(_) => tc_result::TC_ERR_PLUGIN,
            ApiError::NoSuchRanks { .. } | ApiError::UnknownStream(_) => tc_result::TC_ERR_RANGE,
            ApiError::Topology(_)
            | ApiError::FilterName { .. }
            | ApiError::EmptyWindow { .. }
            | ApiError::RouteNotCarried { .. }
            | ApiError::Source(_)
            | ApiError::Attach(_)
            | ApiError::Env(_) => tc_result::TC_ERR_INVALID,
            _ => tc_result::TC_ERR_OTHER,
        };
        let message = match &e {
            // The library's own text names its Rust calls; a C tool has these.
            ApiError::NoBinary(looked) => format!(
                "cannot find the treecast binary that comm nodes run: {looked}; set TREECAST_PATH to its \
                 full path, or call tc_network_options_set_treecast_path, or make this program its own \
                 comm node (tc_started_as_comm_node, then tc_run_comm_node, first thing in main; \
                 docs/c-api.md)"
            ),
            _ => e.to_string(),
        };
        Failure { code, message: message.into() }
    }
}

thread_local! {
    /// The last message as C reads it, NUL-terminated; its buffer is kept from one
    /// failure to the next.
    static LAST_ERROR: RefCell<Vec<u8>> = RefCell::new(vec![0]);
}

/// Makes `parts`, joined, the thread's message.
fn set_last_error(parts: &[&str]) {
    // A call made while the thread goes away (a TLS destructor) keeps no message.
    let _ = LAST_ERROR.try_with(|e| {
        let mut text = e.borrow_mut();
        text.clear();
        for part in parts {
            text.extend_from_slice(part.as_bytes());
        }
        // A message cannot hold NUL for C: cut there rather than lose it all.
        if let Some(nul) = text.iter().position(|&b| b == 0) {
            text.truncate(nul);
        }
        text.push(0);
    });
}

/// Runs `body` for the entry point `what`: its error becomes the returned code and
/// the thread's message, and a panic becomes `TC_ERR_PANIC` instead of unwinding into C.
pub(crate) fn guard(what: &str, body: impl FnOnce() -> Result<(), Failure>) -> tc_result {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => tc_result::TC_OK,
        Ok(Err(f)) => {
            set_last_error(&[what, ": ", &f.message]);
            f.code
        }
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            set_last_error(&[
                what,
                ": internal error (a bug in treecast; please report it with this message): ",
                &detail,
            ]);
            tc_result::TC_ERR_PANIC
        }
    }
}

/// Runs a body that cannot fail but must not unwind into C (a destructor, a getter);
/// a panic is swallowed and `fallback` returned.
pub(crate) fn quiet<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The message of the last failed call on this thread ("" when none failed yet): what
/// failed, where, and what to do. The pointer stays valid until the next call on this
/// thread fails; copy the text to keep it.
#[no_mangle]
pub extern "C" fn tc_last_error() -> *const c_char {
    quiet(std::ptr::null(), || {
        LAST_ERROR.try_with(|e| e.borrow().as_ptr().cast::<c_char>()).unwrap_or(c"".as_ptr())
    })
}

/// A static name for a result code, e.g. `"TC_ERR_TIMEOUT"`, for logs.
#[no_mangle]
pub extern "C" fn tc_result_name(result: c_int) -> *const c_char {
    // An int, not the enum: a value C makes up must not become an invalid Rust enum.
    let name: &'static [u8] = match result {
        0 => b"TC_OK\0",
        1 => b"TC_ERR_NULL\0",
        2 => b"TC_ERR_INVALID\0",
        3 => b"TC_ERR_FORMAT\0",
        4 => b"TC_ERR_TIMEOUT\0",
        5 => b"TC_ERR_AGAIN\0",
        6 => b"TC_ERR_CLOSED\0",
        7 => b"TC_ERR_LAUNCH\0",
        8 => b"TC_ERR_NOT_LAUNCHED\0",
        9 => b"TC_ERR_NO_ANSWER\0",
        10 => b"TC_ERR_REFUSED\0",
        11 => b"TC_ERR_PLUGIN\0",
        12 => b"TC_ERR_RANGE\0",
        13 => b"TC_ERR_PANIC\0",
        14 => b"TC_ERR_OTHER\0",
        15 => b"TC_ERR_CANCELLED\0",
        _ => b"TC_ERR_UNKNOWN\0",
    };
    name.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        let p = tc_last_error();
        // SAFETY: tc_last_error returns this thread's NUL-terminated message.
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_failure_sets_the_code_and_the_thread_message() {
        let r = guard("tc_test", || Err(Failure::new(tc_result::TC_ERR_RANGE, "value 3 of 2")));
        assert_eq!(r, tc_result::TC_ERR_RANGE);
        assert_eq!(last(), "tc_test: value 3 of 2");
        let other = std::thread::spawn(last).join().ok();
        assert_eq!(other.as_deref(), Some(""), "the message is per thread");
    }

    #[test]
    fn a_missing_binary_names_the_c_calls_not_the_rust_ones() {
        let f = Failure::from(ApiError::NoBinary("not beside /x/tool, not on PATH".into()));
        assert_eq!(f.code, tc_result::TC_ERR_LAUNCH);
        for part in [
            "not beside /x/tool",
            "TREECAST_PATH",
            "tc_network_options_set_treecast_path",
            "tc_run_comm_node",
        ] {
            assert!(f.message.contains(part), "{part}: {}", f.message);
        }
        assert!(!f.message.contains("NetworkBuilder"), "{}", f.message);
    }

    /// What the test panics with; the hook below keeps it out of the test output.
    const TEST_PANIC: &str = "a panic on purpose";

    #[test]
    fn a_panic_becomes_a_code_not_an_unwind() {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&TEST_PANIC) {
                default(info);
            }
        }));
        let r = guard("tc_test", || panic!("{}", TEST_PANIC));
        assert_eq!(r, tc_result::TC_ERR_PANIC);
        assert!(last().contains(TEST_PANIC), "{}", last());
    }
}
