//! What every entry point needs: the runtime blocking calls run on, and checked
//! conversions of C arguments (pointers, strings, time limits, out-parameters).

use std::ffi::{c_char, CStr, CString};
use std::future::Future;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::error::{tc_result, Failure};

/// A time limit meaning "wait as long as it takes"; every other value is milliseconds,
/// and 0 means "do not wait".
pub const TC_FOREVER: u64 = u64::MAX;

/// The runtime every handle's tasks run on (see [`Driver`]), made at the first call
/// that needs it, with its background thread.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    driver().map(|d| &d.rt)
}

/// The runtime's [`Driver`], its background thread started.
fn driver() -> Result<&'static Driver, Failure> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    static BACKGROUND: OnceLock<Result<(), String>> = OnceLock::new();
    let cannot =
        |e: &String| Failure::new(tc_result::TC_ERR_OTHER, format!("cannot start treecast's threads: {e}"));
    let d: &'static Driver = DRIVER.get_or_init(Driver::new).as_ref().map_err(cannot)?;
    BACKGROUND
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("treecast".into())
                .spawn(move || d.background())
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(cannot)?;
    Ok(d)
}

/// The runtime every handle's tasks run on, and who drives it.
///
/// One current-thread runtime: a blocking call drives it on the caller's own thread
/// while it waits (its sends are written and its answers read there, with no hand-over
/// between threads: what the Rust API's own loop does), and a thread of the library's,
/// `treecast`, drives it while no call does, so that the descriptors of `tc_*_fd`
/// still become readable when data comes between calls. Several callers at once take
/// turns driving (tokio hands the runtime's core from one `block_on` to the next);
/// the others wait for their own futures on their own threads.
pub(crate) struct Driver {
    rt: tokio::runtime::Runtime,
    /// Blocking calls under way (driving or waiting for the core).
    callers: AtomicUsize,
    /// Blocking calls started since the library began, to see a quiet spell.
    calls: AtomicU64,
    /// Tells the background driver to hand the core to a caller.
    wanted: tokio::sync::Notify,
    /// Guards the background driver's wait for `callers` to reach 0.
    idle: Mutex<()>,
    idle_cv: Condvar,
    /// Whether the background driver waits on `idle_cv` longer than [`LONGEST_NAP`]
    /// (a call blocked that long): the last call to end then wakes it.
    waiting: AtomicBool,
    /// Whether the background driver holds the runtime now (it then runs what a
    /// call queued without driving).
    driving: AtomicBool,
    /// Since when (ns on [`send_clock_ns`]; 0: nothing) a send has left the task
    /// writing its frame woken and not run: the sends after it only look, and the
    /// first of them a [`WRITE_WITHIN`] later runs it. A drive that waits runs it and
    /// clears this. Only a hint: wrong either way, a send costs one more system call
    /// or its frame leaves a few milliseconds later, nothing else.
    unwritten_since: AtomicU64,
}

/// How long a frame a send queued may wait for its writer while the tool keeps
/// calling without ever waiting (a send loop with room in its window): the first
/// send after this long (up to one tick of the clock [`send_clock_ns`] reads more)
/// runs the writer on its own thread. Until then the sends of a burst share their
/// writes.
const WRITE_WITHIN: Duration = Duration::from_millis(1);

/// The coarsest tick of the coarse monotonic clock taken for [`send_clock_ns`]:
/// kernels built with a slower tick (`HZ=100`: 10 ms) use the precise clock.
const COARSEST_TICK_NS: libc::c_long = 4_000_000;

/// A monotonic clock in ns, never 0, read on every send of a burst: the coarse
/// clock (3 ns a read against the precise clock's 20, which were a tenth of a
/// send's cost) where its tick is at most [`COARSEST_TICK_NS`], else the precise
/// one.
fn send_clock_ns() -> u64 {
    static COARSE: OnceLock<bool> = OnceLock::new();
    let coarse = *COARSE.get_or_init(|| {
        let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `res` is a valid timespec for the call to fill.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0;
        ok && res.tv_sec == 0 && res.tv_nsec <= COARSEST_TICK_NS
    });
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let clock = if coarse { libc::CLOCK_MONOTONIC_COARSE } else { libc::CLOCK_MONOTONIC };
    // SAFETY: `t` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        // Never seen on Linux; a clock that stood still would stop the writes.
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    }
    let ns = u64::try_from(t.tv_sec).unwrap_or(0).saturating_mul(1_000_000_000);
    ns.saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0)).max(1)
}

/// How long no blocking call must have started before the background thread drives
/// again: calls that follow one another closer than this (a round trip's send and
/// receive) keep the core on the callers' threads and never wake it.
const QUIET: Duration = Duration::from_micros(200);

/// The longest the background thread sleeps between looks while calls keep coming
/// (the quiet spell doubles from [`QUIET`] up to this): what arrives after a tool's
/// last blocking call waits at most about this long to be read, and a tool making
/// calls all the time wakes the thread a few hundred times a second, not thousands.
const LONGEST_NAP: Duration = Duration::from_millis(2);

/// The longest the background thread sleeps between looks while the tool is busy
/// calling: [`BUSY_CALLS`] calls or more in the last look's time (a burst of sends). Each
/// look wakes the thread for nothing while the calls go on: at 2 ms, a C back-end's
/// burst of sends lost about a twentieth of its throughput to them, and at 10 ms the
/// looks of 64 back-ends sharing two cores with 20 comm nodes still cost that tree
/// a few hundredths of its reductions/s (docs/mrnet-compat.md). What arrives just
/// after a busy tool's last call, and what its last sends left unwritten, may wait
/// up to about twice this: the nap under way, then one more, since that one saw calls.
/// At 20 ms that tree still read 0.87x of treecast's own back-ends; at 40 ms, 0.93x
/// to 0.95x (docs/mrnet-compat.md).
const BUSY_NAP: Duration = Duration::from_millis(40);

/// Calls in one look's time that make a tool busy (see [`BUSY_NAP`]).
const BUSY_CALLS: u64 = 100;

/// The next wait between looks after `wait`, with `calls` made during it: longer
/// while nothing changed or the tool is busy, else back to [`LONGEST_NAP`].
fn next_look(wait: Duration, calls: u64, idle_limit: Duration) -> Duration {
    match calls {
        0 => (wait * 2).min(idle_limit),
        n if n >= BUSY_CALLS => (wait * 2).clamp(LONGEST_NAP, BUSY_NAP),
        _ => LONGEST_NAP.min(wait * 2),
    }
}

/// The longest the background thread waits between looks while one blocking call
/// stays blocked (a tool waiting in a receive): it wakes less and less often, and
/// that call's end wakes it.
const LONGEST_WAIT: Duration = Duration::from_millis(100);

impl Driver {
    fn new() -> Result<Driver, String> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        Ok(Driver {
            rt,
            callers: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            wanted: tokio::sync::Notify::new(),
            idle: Mutex::new(()),
            idle_cv: Condvar::new(),
            waiting: AtomicBool::new(false),
            driving: AtomicBool::new(false),
            unwritten_since: AtomicU64::new(0),
        })
    }

    /// Whether a send with limit `ms` runs on the runtime from the start rather than
    /// only looking (see [`drive_for`]): the first send after a drive, when no thread
    /// drives and nothing sent waits for its writer.
    fn drives_first(&self, ms: u64) -> bool {
        ms != 0 && !self.driving.load(SeqCst) && self.unwritten_since.load(SeqCst) == 0
    }

    /// After a send that only looked: notes when its frame began to wait for the
    /// writer, or, when an earlier one has waited [`WRITE_WITHIN`], runs the writer
    /// (and whatever else is ready) now on this thread. Nothing when the background
    /// thread drives: it runs the writer itself.
    fn write_if_late(&self) {
        if self.driving.load(SeqCst) {
            return;
        }
        let since = self.unwritten_since.load(SeqCst);
        let now = send_clock_ns();
        if since == 0 {
            self.unwritten_since.store(now, SeqCst);
        } else if now.saturating_sub(since) >= WRITE_WITHIN.as_nanos() as u64 {
            // The future yields once, so that `block_on` runs the tasks ready before
            // it polls the future again (it polls its future first, before any task).
            self.drive(tokio::task::yield_now());
        }
    }

    /// The background thread: drives while no caller does, steps aside as soon as one
    /// comes, and takes over again after a quiet spell.
    fn background(&'static self) {
        // Batch while it naps, its own policy while it drives (crate::nap_policy).
        let mut policy = crate::nap_policy::NapPolicy::for_this_thread();
        loop {
            #[cfg(test)]
            tests::hold_background();
            policy.driving();
            self.driving.store(true, SeqCst);
            self.unwritten_since.store(0, SeqCst);
            self.rt.block_on(async {
                loop {
                    let wanted = self.wanted.notified();
                    tokio::pin!(wanted);
                    wanted.as_mut().enable();
                    if self.callers.load(SeqCst) > 0 {
                        return;
                    }
                    wanted.await;
                }
            });
            self.driving.store(false, SeqCst);
            policy.napping();
            let mut nap = QUIET;
            loop {
                self.wait_for_no_caller();
                let seen = self.calls.load(SeqCst);
                std::thread::sleep(nap);
                let made = self.calls.load(SeqCst).wrapping_sub(seen);
                if self.callers.load(SeqCst) == 0 && made == 0 {
                    break;
                }
                // Calls keep coming: look less often, up to LONGEST_NAP (BUSY_NAP
                // while the tool is busy).
                nap = next_look(nap, made.max(1), LONGEST_NAP);
            }
        }
    }

    /// Returns once no blocking call is under way. Looks every [`LONGEST_NAP`] while
    /// calls come and go (their ends wake nobody: a tool's round trips cost no wake-up
    /// of this thread); while one call stays blocked the looks grow rarer, up to
    /// [`LONGEST_WAIT`], and that call's end wakes this thread.
    fn wait_for_no_caller(&self) {
        let mut g = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut wait = LONGEST_NAP;
        let mut seen = self.calls.load(SeqCst);
        let mut busy = false;
        loop {
            // Stored before `callers` is read: a call ending after that read sees it.
            // A busy tool's calls end all the time: they wake nobody.
            self.waiting.store(wait > LONGEST_NAP && !busy, SeqCst);
            if self.callers.load(SeqCst) == 0 {
                break;
            }
            g = self.idle_cv.wait_timeout(g, wait).unwrap_or_else(PoisonError::into_inner).0;
            let now = self.calls.load(SeqCst);
            let made = now.wrapping_sub(seen);
            busy = made >= BUSY_CALLS;
            wait = next_look(wait, made, LONGEST_WAIT);
            seen = now;
        }
        self.waiting.store(false, SeqCst);
    }

    /// Drives `fut` with the time limit `ms` (see [`TC_FOREVER`]); `None` when it ran
    /// out, and at once for a limit of 0 (which drives nothing).
    fn drive_within<F: Future>(&self, ms: u64, fut: F) -> Option<F::Output> {
        match ms {
            0 => None,
            TC_FOREVER => Some(self.drive(fut)),
            _ => self.drive(within(ms, fut)),
        }
    }

    /// Runs `fut` to its end, driving the runtime on this thread when no other caller
    /// is. What the call made ready and did not run (a credit frame to write once a
    /// packet was taken) runs at the next call that waits, or on the background
    /// thread once calls stop: a yield here to run it first cost every call one more
    /// look at the reactor (a zero-timeout `epoll_wait`). Sends bound that delay
    /// themselves (see [`drive_for`]).
    fn drive<F: Future>(&self, fut: F) -> F::Output {
        /// Counts the caller out, even on a panic.
        struct Out<'a>(&'a Driver);
        impl Drop for Out<'_> {
            fn drop(&mut self) {
                // The background thread is woken only when it waits long for the last
                // caller, and once per wait: the flag is taken, so the calls that end
                // before it runs again (a send loop's hundreds) make no system call.
                if self.0.callers.fetch_sub(1, SeqCst) == 1 && self.0.waiting.swap(false, SeqCst) {
                    let _g = self.0.idle.lock().unwrap_or_else(PoisonError::into_inner);
                    self.0.idle_cv.notify_one();
                }
            }
        }
        self.calls.fetch_add(1, SeqCst);
        self.callers.fetch_add(1, SeqCst);
        self.unwritten_since.store(0, SeqCst);
        let _out = Out(self);
        // Counted in before `driving` is read: a background thread that starts driving
        // after this read sees the caller and steps aside on its own, so only one that
        // drives already needs telling (a notify takes a lock on every call).
        if self.driving.load(SeqCst) {
            self.wanted.notify_waiters();
        }
        self.rt.block_on(fut)
    }
}

/// The failure of a blocking call made where it would wait on itself.
fn nested() -> Failure {
    Failure::new(
        tc_result::TC_ERR_INVALID,
        "a blocking treecast call was made from one of treecast's own threads (a callback); \
         call it from a thread of the tool's",
    )
}

/// Runs `fut` to its end: looked at once on this thread first (a packet already
/// queued, a send with room in its window: no thread is woken and the runtime stays
/// with whoever drives it), then, if it must wait, driving the runtime on this thread
/// (see [`Driver`]).
pub(crate) fn block_on<F: Future>(fut: F) -> Result<F::Output, Failure> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(nested());
    }
    let d = driver()?;
    let mut fut = std::pin::pin!(fut);
    match look_once(d, fut.as_mut(), true) {
        Some(out) => {
            d.calls.fetch_add(1, SeqCst);
            Ok(out)
        }
        None => Ok(d.drive(fut)),
    }
}

/// Runs `fut` with the time limit `ms` (see [`TC_FOREVER`]); `Ok(None)` when it ran
/// out. A limit of 0 looks once and drives nothing, so a tool's `poll` loop that
/// receives what its descriptor announced leaves the runtime to the thread driving it
/// between calls.
pub(crate) fn block_on_for<F: Future>(ms: u64, fut: F) -> Result<Option<F::Output>, Failure> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(nested());
    }
    let d = driver()?;
    look_then_wait(d, ms, std::pin::pin!(fut), true)
}

/// [`block_on_for`]'s work once the caller is known not to be in a runtime: one look
/// (in the runtime's context when `enter`), then a wait of at most `ms`.
/// The future is pinned by the caller and passed by reference: a send's future is a
/// few hundred bytes, and each move was a copy.
fn look_then_wait<F: Future>(
    d: &Driver,
    ms: u64,
    mut fut: std::pin::Pin<&mut F>,
    enter: bool,
) -> Result<Option<F::Output>, Failure> {
    if let Some(out) = look_once(d, fut.as_mut(), enter) {
        if ms != 0 {
            // A tool that would have waited is busy calling: the background thread
            // stays away, or a burst of receives would hand the runtime back and
            // forth each time the queue runs dry. A look with limit 0 (a `poll`
            // loop's) leaves it driving.
            d.calls.fetch_add(1, SeqCst);
        }
        return Ok(Some(out));
    }
    Ok(d.drive_within(ms, fut))
}

/// As [`block_on_for`] for a caller that has just looked itself and found nothing:
/// waits from the start, with no second look (a limit of 0 then gives `Ok(None)`).
pub(crate) fn wait_for<F: Future>(ms: u64, fut: F) -> Result<Option<F::Output>, Failure> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(nested());
    }
    let d = driver()?;
    Ok(d.drive_within(ms, fut))
}

/// Counts a call with time limit `ms` that looks on its own before it waits (and may
/// find what it wants at once) as [`block_on_for`] counts it: a tool that would have
/// waited is busy calling, so the background thread stays away.
pub(crate) fn took_without_waiting(ms: u64) -> Result<(), Failure> {
    if ms != 0 {
        driver()?.calls.fetch_add(1, SeqCst);
    }
    Ok(())
}

/// The functions of a waker that does nothing, for [`look_once`]: whoever polls the
/// future next registers its own. No allocation, so nothing for a leak checker to
/// report.
const NO_WAKE: std::task::RawWakerVTable = std::task::RawWakerVTable::new(
    |_| std::task::RawWaker::new(std::ptr::null(), &NO_WAKE),
    |_| {},
    |_| {},
    |_| {},
);

/// Polls `fut` once on this thread, in the runtime's context: its output if ready.
fn look_once<F: Future>(d: &Driver, fut: std::pin::Pin<&mut F>, enter: bool) -> Option<F::Output> {
    // SAFETY: every function of the table ignores its (null) data pointer and does
    // nothing, which is all a waker's contract asks of them.
    let waker = unsafe { std::task::Waker::from_raw(std::task::RawWaker::new(std::ptr::null(), &NO_WAKE)) };
    let _context = enter.then(|| d.rt.enter());
    match fut.poll(&mut std::task::Context::from_waker(&waker)) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}

/// Longest finite time limit taken as it is; larger ones wait this long (a year), so
/// that no deadline computed from one overflows.
const LONGEST_MS: u64 = 365 * 24 * 3600 * 1000;

/// Runs a send `fut` with the time limit `ms` as [`block_on_for`] does. When no
/// thread drives the runtime, the first send after a drive drives from the start
/// instead of looking first: the task it wakes (the one writing the frame) is then
/// scheduled on the runtime itself, with no wake-up through its event descriptor.
/// The sends that follow only look; the writer runs at the next call that waits, on
/// the background thread once calls stop, or at the first send a [`WRITE_WITHIN`]
/// later, whichever comes first.
fn drive_for<F: Future>(ms: u64, fut: F) -> Result<Option<F::Output>, Failure> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(nested());
    }
    let d = driver()?;
    let fut = std::pin::pin!(fut);
    if d.drives_first(ms) {
        let out = d.drive_within(ms, fut);
        d.unwritten_since.store(send_clock_ns(), SeqCst);
        return Ok(out);
    }
    // A burst of sends: waking a task already scheduled costs nothing, so these only
    // look, which spares each of them entering the runtime; not even its context is
    // entered (a tenth of a C back-end's CPU in a burst): a send needs none, as the
    // driver leaves what would (its core's events) to its task.
    let out = look_then_wait(d, ms, fut, false)?;
    if out.is_some() {
        d.write_if_late();
    }
    Ok(out)
}

/// `fut` with the time limit `ms`; `None` when it ran out. The clock is read and the
/// timer set only once `fut` must wait: a send with room in its window, the common
/// case, costs no clock read.
async fn within<F: Future>(ms: u64, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut limit: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        let sleep = limit.get_or_insert_with(|| Box::pin(tokio::time::sleep(duration(ms))));
        sleep.as_mut().poll(cx).map(|()| None)
    })
    .await
}

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

/// Whether the C string at `p` is `bytes` (which hold no NUL); reads no further
/// than its first difference, so never past the string's NUL.
///
/// # Safety
/// `p` is not NULL and NUL-terminated.
pub(crate) unsafe fn c_equals(p: *const c_char, bytes: &[u8]) -> bool {
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: every byte before this one matched a non-NUL byte: still inside the string.
        if unsafe { *p.add(i) } as u8 != b {
            return false;
        }
    }
    // SAFETY: as above.
    unsafe { *p.add(bytes.len()) == 0 }
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

/// A send that tries at once on this thread, `try_now` handing back what a full window
/// refused, and only then waits for room with `later`, at most `ms`, as
/// [`send_within`] does. In a burst of sends (see [`drive_for`]) a send with room thus
/// builds no future; the first send after a drive still runs on the runtime.
pub(crate) fn send_now_or_within<U, E, F>(
    ms: u64,
    try_now: impl FnOnce() -> Result<Option<U>, E>,
    later: impl FnOnce(U) -> F,
) -> Result<(), Failure>
where
    F: Future<Output = Result<(), E>>,
    Failure: From<E>,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(nested());
    }
    let d = driver()?;
    if d.drives_first(ms) {
        return send_within(ms, async move {
            match try_now()? {
                None => Ok(()),
                Some(unsent) => later(unsent).await,
            }
        });
    }
    match try_now()? {
        None => {
            if ms != 0 {
                d.calls.fetch_add(1, SeqCst);
            }
            d.write_if_late();
            Ok(())
        }
        Some(unsent) => send_within(ms, later(unsent)),
    }
}

/// Runs a send that may wait for room, at most `ms` (see [`TC_FOREVER`]).
pub(crate) fn send_within<F, E>(ms: u64, send: F) -> Result<(), Failure>
where
    F: Future<Output = Result<(), E>>,
    Failure: From<E>,
{
    match drive_for(ms, send)? {
        Some(done) => {
            done?;
            Ok(())
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// Asks the background thread to stay out of the runtime (see [`hold_background`]).
    static HOLD: AtomicBool = AtomicBool::new(false);
    /// Whether the background thread is held now.
    static HELD: AtomicBool = AtomicBool::new(false);

    /// Serialises the tests that steer the one background thread: one holds it away
    /// from the runtime, another waits for it to nap and to drive.
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static ONE: Mutex<()> = Mutex::new(());
        ONE.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the background thread waits, before it drives, while a test asks it to.
    pub(super) fn hold_background() {
        while HOLD.load(SeqCst) {
            HELD.store(true, SeqCst);
            std::thread::sleep(Duration::from_micros(100));
        }
        HELD.store(false, SeqCst);
    }

    /// A stand-in for a stream's writer: a task that counts the times it ran on the
    /// thread `on` (and not on the background thread).
    fn writer(d: &Driver, on: std::thread::ThreadId) -> (Arc<tokio::sync::Notify>, Arc<AtomicU64>) {
        let wake = Arc::new(tokio::sync::Notify::new());
        let ran = Arc::new(AtomicU64::new(0));
        let (w, r) = (wake.clone(), ran.clone());
        d.rt.spawn(async move {
            loop {
                w.notified().await;
                if std::thread::current().id() == on {
                    r.fetch_add(1, SeqCst);
                }
            }
        });
        (wake, ran)
    }

    /// A tool sending all the time with room in its window never waits, so no
    /// waiting call runs the writer, and the background thread (held away here, as
    /// the calls would keep it away) does not either: the sends must run it
    /// themselves, or every frame stays queued until the window fills.
    #[test]
    fn a_send_loop_that_never_waits_still_runs_its_writer() -> Result<(), Failure> {
        let _alone = one_at_a_time();
        let d = driver()?;
        let (wake, ran) = writer(d, std::thread::current().id());
        /// Lets the background thread go again, even when the test fails.
        struct Release;
        impl Drop for Release {
            fn drop(&mut self) {
                HOLD.store(false, SeqCst);
            }
        }
        HOLD.store(true, SeqCst);
        let _release = Release;
        let start = Instant::now();
        // A call that drives sends the background thread out of the runtime.
        while !HELD.load(SeqCst) && start.elapsed() < Duration::from_secs(10) {
            if d.driving.load(SeqCst) {
                d.drive(tokio::task::yield_now());
            } else {
                std::thread::yield_now();
            }
        }
        assert!(HELD.load(SeqCst), "the background thread never stepped aside");
        // Give up after 10 s: without the bound the loop would spin forever.
        while ran.load(SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
            let send = async { wake.notify_one() };
            assert_eq!(drive_for(TC_FOREVER, send)?, Some(()));
        }
        assert!(ran.load(SeqCst) > 0, "the writer never ran while the sends kept coming");
        Ok(())
    }

    /// The thread id of the library's background thread, `treecast`, once it has its
    /// name (a new thread names itself, a little after it starts).
    fn background_tid() -> Option<libc::pid_t> {
        let tasks = std::fs::read_dir("/proc/self/task").ok()?;
        tasks
            .flatten()
            .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "treecast"))
            .and_then(|t| t.file_name().to_str()?.parse().ok())
    }

    /// Looks every millisecond, for up to 10 s, until `look` finds something.
    fn eventually<T>(mut look: impl FnMut() -> Option<T>) -> Option<T> {
        let start = Instant::now();
        loop {
            if let Some(found) = look() {
                return Some(found);
            }
            if start.elapsed() > Duration::from_secs(10) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// While a call blocks, the background thread naps, as a batch thread (its looks
    /// preempt nobody); once calls stop it drives the runtime under the normal policy,
    /// which the threads and processes a task starts then inherit.
    #[test]
    fn the_background_thread_naps_as_batch_and_drives_under_the_normal_policy() {
        let _alone = one_at_a_time();
        let d = driver().expect("the runtime starts");
        let tid = eventually(background_tid).expect("a thread named treecast in /proc/self/task");
        // SAFETY: a thread id of this process; no pointer is passed.
        let policy = || unsafe { libc::sched_getscheduler(tid) };
        let release = Arc::new(tokio::sync::Notify::new());
        let wait = release.clone();
        let caller = std::thread::spawn(move || d.drive(async move { wait.notified().await }));
        let napped_as_batch = eventually(|| (policy() == libc::SCHED_BATCH).then_some(())).is_some();
        release.notify_one();
        caller.join().expect("the blocking call ends");
        assert!(napped_as_batch, "the background thread never napped as SCHED_BATCH while a call blocked");
        let drove_as_normal =
            eventually(|| (d.driving.load(SeqCst) && policy() == libc::SCHED_OTHER).then_some(())).is_some();
        assert!(drove_as_normal, "the background thread never drove again under SCHED_OTHER");
    }
}
