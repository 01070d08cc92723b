//! Asynchronous requests, as CoR's handles and MPI's `MPI_Request`: a send or a
//! receive started now, completed on treecast's threads, and tested, waited for or
//! cancelled later.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use treecast_api::Packet;

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{arg, block_on, block_on_for, handle, out_ok, put, ran_out, runtime, take, text};
use crate::packet::tc_packet;
use crate::stream::tc_stream;
use crate::turns::Turns;
use crate::values::{from_c, tc_value};

/// How a request ended: sent, a packet, or why not.
type Outcome = Result<Option<Packet>, Failure>;

/// Woken whenever any request completes, for the waits over several.
static FINISHED: Notify = Notify::const_new();

/// Where a request stands.
enum State {
    /// Queued behind earlier requests of its stream and kind.
    Waiting,
    /// Sending or receiving now.
    Started,
    /// Over, with its outcome (taken once by `tc_request_packet` for a packet).
    Done(Outcome),
}

/// A send or receive in flight; freed with `tc_request_free` (which cancels it if it
/// has not completed). A request may be tested and waited for from several threads.
#[allow(non_camel_case_types)]
pub struct tc_request {
    state: Arc<Mutex<State>>,
    /// Tells a started request to stop.
    stop: Arc<Notify>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ends a request's task: a request still under way then (its task panicked) fails
/// with `TC_ERR_PANIC`, waiters are woken, and the next request of its kind starts.
struct Finish {
    state: Arc<Mutex<State>>,
    /// The queue whose turn passes (receives have none: see [`tc_request::receive`]).
    turns: Option<Arc<Turns>>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.state);
            if !matches!(*s, State::Done(_)) {
                let panic =
                    "the request's task stopped without an outcome (a bug in treecast; please report it)";
                *s = State::Done(Err(Failure::new(tc_result::TC_ERR_PANIC, panic)));
            }
        }
        FINISHED.notify_waiters();
        if let Some(turns) = &self.turns {
            turns.serving.send_modify(|s| *s += 1);
        }
    }
}

/// Which of a request's work and its stop wins when both are ready at once.
#[derive(Clone, Copy)]
enum Bias {
    /// A send that completed wins over a cancel that came with it.
    Work,
    /// A cancel wins: a receive's packet is taken only when the receive is polled, so
    /// a receive cancelled first leaves its packet in the stream for the next one
    /// (nothing is lost even when nobody waits for the cancel, as from a callback).
    Stop,
}

/// Runs a started request's `work` until it ends or `stop` tells it to, and records
/// its outcome.
async fn run<F: std::future::Future<Output = Outcome>>(
    state: &Mutex<State>,
    stop: &Notify,
    work: F,
    bias: Bias,
) {
    let stopped = stop.notified();
    let outcome = match bias {
        Bias::Work => tokio::select! {
            biased;
            done = work => done,
            () = stopped => Err(cancelled()),
        },
        Bias::Stop => tokio::select! {
            biased;
            () = stopped => Err(cancelled()),
            done = work => done,
        },
    };
    *lock(state) = State::Done(outcome);
}

fn cancelled() -> Failure {
    Failure::new(tc_result::TC_ERR_CANCELLED, "the request was cancelled")
}

impl tc_request {
    /// Queues `work` behind the earlier requests of `turns` and runs it at its turn.
    fn start<F>(turns: &Arc<Turns>, work: F) -> Result<tc_request, Failure>
    where
        F: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let ticket = turns.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let turns = turns.clone();
        tc_request::spawn(State::Waiting, move |state, stop| async move {
            // Whatever happens below, even a panic, the request ends and its turn passes.
            let _finish = Finish { state: state.clone(), turns: Some(turns.clone()) };
            let mut serving = turns.serving.subscribe();
            // Waits for its turn even when cancelled meanwhile, so later ones keep theirs.
            let _ = serving.wait_for(|s| *s == ticket).await;
            let go = {
                let mut s = lock(&state);
                let go = matches!(*s, State::Waiting);
                if go {
                    *s = State::Started;
                }
                go
            };
            if go {
                run(&state, &stop, work, Bias::Work).await;
            }
        })
    }

    /// A receive of the next packet `only` matches on stream `s`, posted now in the
    /// stream's mailbox: it takes its packet before every receive posted after it,
    /// blocking or not, and one that never matches holds no later one back.
    fn receive(s: &tc_stream, only: treecast_api::Match) -> Result<tc_request, Failure> {
        let work = s.receiver.post_recv(only);
        // Started from the first: there is no queue to wait in.
        tc_request::spawn(State::Started, move |state, stop| async move {
            let _finish = Finish { state: state.clone(), turns: None };
            let work = async move { work.await.map(Some).map_err(Failure::from) };
            run(&state, &stop, work, Bias::Stop).await;
        })
    }

    /// A request in state `first` whose task, made by `task` from its state and stop,
    /// runs on the runtime.
    fn spawn<T>(
        first: State,
        task: impl FnOnce(Arc<Mutex<State>>, Arc<Notify>) -> T,
    ) -> Result<tc_request, Failure>
    where
        T: std::future::Future<Output = ()> + Send + 'static,
    {
        let state = Arc::new(Mutex::new(first));
        let stop = Arc::new(Notify::new());
        runtime()?.spawn(task(state.clone(), stop.clone()));
        Ok(tc_request { state, stop })
    }

    fn done(&self) -> bool {
        matches!(*lock(&self.state), State::Done(_))
    }

    /// The request's result as a call returns it: `Ok` for a completed send or a
    /// receive, the operation's failure, or `TC_ERR_CANCELLED`.
    fn result(&self) -> Result<(), Failure> {
        match &*lock(&self.state) {
            State::Done(Ok(_)) => Ok(()),
            State::Done(Err(f)) => Err(f.clone()),
            _ => Err(Failure::new(tc_result::TC_ERR_AGAIN, "the request has not completed")),
        }
    }

    /// Stops the request if it has not completed; a receive that had taken its packet
    /// keeps it (the request completes instead).
    fn cancel(&self) -> Result<(), Failure> {
        {
            let mut s = lock(&self.state);
            match *s {
                State::Waiting => {
                    *s = State::Done(Err(cancelled()));
                    drop(s);
                    FINISHED.notify_waiters();
                    return Ok(());
                }
                State::Done(_) => return Ok(()),
                State::Started => {}
            }
        }
        // Sending and receiving stop at once when told (both are cancel safe).
        self.stop.notify_one();
        let state = self.state.clone();
        block_on(async move {
            loop {
                let notified = FINISHED.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if matches!(*lock(&state), State::Done(_)) {
                    return;
                }
                notified.await;
            }
        })
    }
}

/// Starts multicasting `values[0..count]` on `stream` (as `tc_stream_send_values`);
/// the values are copied before this returns.
///
/// # Safety
/// As `tc_stream_send_values`; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_isend_values(
    stream: *const tc_stream,
    tag: i32,
    format: *const std::ffi::c_char,
    values: *const tc_value,
    count: usize,
    out: *mut *mut tc_request,
) -> tc_result {
    guard("tc_stream_isend_values", || {
        // SAFETY: as the caller promised.
        let (s, format) = unsafe { (arg(stream, "stream")?, text(format, "format")?) };
        out_ok(out, "out")?;
        // SAFETY: as the caller promised.
        let values = unsafe { from_c(format, values, count) }?;
        let sender = s.sender.clone();
        let format = format.to_owned();
        let request = tc_request::start(&s.send_turns, async move {
            sender.send(tag, &format, &values).await.map(|()| None).map_err(Failure::from)
        })?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(request)) };
        Ok(())
    })
}

/// Starts receiving the stream's next packet; `tc_request_packet` takes it once the
/// request completed. Receives take packets in the order they were posted, requests
/// and blocking calls alike.
///
/// # Safety
/// `stream` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_irecv(stream: *const tc_stream, out: *mut *mut tc_request) -> tc_result {
    guard("tc_stream_irecv", || {
        // SAFETY: as the caller promised.
        let s = unsafe { arg(stream, "stream") }?;
        out_ok(out, "out")?;
        let request = tc_request::receive(s, treecast_api::Match::any())?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(request)) };
        Ok(())
    })
}

/// As `tc_stream_irecv`, but the request takes only a packet with tag `tag`
/// (`TC_ANY_TAG`: any) from rank `rank` (`TC_ANY_RANK`: any); packets it skips stay,
/// in order, for later receives. A packet goes to the earliest receive posted on the
/// stream that matches it (requests and blocking calls alike, MPI's rule), so one
/// that never matches holds no later one back.
///
/// # Safety
/// `stream` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_irecv_match(
    stream: *const tc_stream,
    tag: i32,
    rank: i64,
    out: *mut *mut tc_request,
) -> tc_result {
    guard("tc_stream_irecv_match", || {
        // SAFETY: as the caller promised.
        let s = unsafe { arg(stream, "stream") }?;
        out_ok(out, "out")?;
        let only = crate::stream::receive_match(tag, rank)?;
        let request = tc_request::receive(s, only)?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(request)) };
        Ok(())
    })
}

/// Whether the request completed, into `done`, without waiting. `TC_OK` also when it
/// completed with a failure: `tc_request_wait` then returns that failure.
///
/// # Safety
/// `request` is NULL or live; `done` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_request_test(request: *const tc_request, done: *mut bool) -> tc_result {
    guard("tc_request_test", || {
        // SAFETY: as the caller promised.
        let r = unsafe { arg(request, "request") }?;
        out_ok(done, "done")?;
        // SAFETY: checked not NULL.
        unsafe { put(done, r.done()) };
        Ok(())
    })
}

/// # Safety
/// `requests` points to `count` live requests (or is NULL with `count` 0).
unsafe fn all<'a>(requests: *const *const tc_request, count: usize) -> Result<Vec<&'a tc_request>, Failure> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if requests.is_null() {
        return Err(crate::ffi::null("requests"));
    }
    // SAFETY: as the caller promised.
    let ptrs = unsafe { std::slice::from_raw_parts(requests, count) };
    // SAFETY: as the caller promised, each pointer is NULL or live.
    ptrs.iter().enumerate().map(|(i, p)| unsafe { arg(*p, &format!("requests[{i}]")) }).collect()
}

/// Waits until one of `requests` completed (`Some(index)`), or all of them (`None`).
fn wait_for(requests: &[&tc_request], every: bool, timeout_ms: u64) -> Result<Option<usize>, Failure> {
    let found = block_on_for(timeout_ms, async {
        loop {
            // Registered before looking, so a completion in between still wakes us.
            let notified = FINISHED.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match every {
                true if requests.iter().all(|r| r.done()) => return None,
                false => {
                    if let Some(i) = requests.iter().position(|r| r.done()) {
                        return Some(i);
                    }
                }
                true => {}
            }
            notified.await;
        }
    })?;
    found.ok_or_else(|| ran_out(timeout_ms, "request's completion"))
}

/// Waits up to `timeout_ms` (0: look once; `TC_FOREVER`) for the request to complete;
/// returns its outcome: `TC_OK`, the failure of its send or receive, or
/// `TC_ERR_CANCELLED`.
///
/// # Safety
/// `request` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_request_wait(request: *const tc_request, timeout_ms: u64) -> tc_result {
    guard("tc_request_wait", || {
        // SAFETY: as the caller promised.
        let r = unsafe { arg(request, "request") }?;
        if !r.done() {
            wait_for(&[r], true, timeout_ms)?;
        }
        r.result()
    })
}

/// Waits up to `timeout_ms` for any of `requests[0..count]` to complete and writes
/// its index to `index`; the request's own outcome comes from `tc_request_wait` on it.
///
/// # Safety
/// `requests` points to `count` live requests; `index` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_request_wait_any(
    requests: *const *const tc_request,
    count: usize,
    timeout_ms: u64,
    index: *mut usize,
) -> tc_result {
    guard("tc_request_wait_any", || {
        // SAFETY: as the caller promised.
        let rs = unsafe { all(requests, count) }?;
        out_ok(index, "index")?;
        if rs.is_empty() {
            return Err(Failure::new(tc_result::TC_ERR_INVALID, "count is 0: no request to wait for"));
        }
        let i = wait_for(&rs, false, timeout_ms)?
            .ok_or_else(|| Failure::new(tc_result::TC_ERR_OTHER, "no request completed"))?;
        // SAFETY: checked not NULL.
        unsafe { put(index, i) };
        Ok(())
    })
}

/// Waits up to `timeout_ms` for every one of `requests[0..count]` to complete; returns
/// the first failure among them, in order, or `TC_OK`.
///
/// # Safety
/// `requests` points to `count` live requests.
#[no_mangle]
pub unsafe extern "C" fn tc_request_wait_all(
    requests: *const *const tc_request,
    count: usize,
    timeout_ms: u64,
) -> tc_result {
    guard("tc_request_wait_all", || {
        // SAFETY: as the caller promised.
        let rs = unsafe { all(requests, count) }?;
        wait_for(&rs, true, timeout_ms)?;
        rs.iter().try_for_each(|r| r.result())
    })
}

/// Cancels the request if it has not completed (its wait then returns
/// `TC_ERR_CANCELLED`); a request that completed meanwhile keeps its outcome, and a
/// receive never loses a packet to a cancel.
///
/// # Safety
/// `request` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_request_cancel(request: *const tc_request) -> tc_result {
    guard("tc_request_cancel", || {
        // SAFETY: as the caller promised.
        unsafe { arg(request, "request") }?.cancel()
    })
}

/// Takes the packet a completed `tc_stream_irecv` received (once); `TC_ERR_AGAIN`
/// while it has not completed, its failure if it failed.
///
/// # Safety
/// `request` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_request_packet(
    request: *const tc_request,
    out: *mut *mut tc_packet,
) -> tc_result {
    guard("tc_request_packet", || {
        // SAFETY: as the caller promised.
        let r = unsafe { arg(request, "request") }?;
        out_ok(out, "out")?;
        r.result()?;
        let packet = match &mut *lock(&r.state) {
            State::Done(Ok(p)) => p.take(),
            _ => None,
        };
        let packet = packet.ok_or_else(|| {
            Failure::new(
                tc_result::TC_ERR_INVALID,
                "no packet: the request is a send, or its packet was taken",
            )
        })?;
        let p = tc_packet::new(packet)?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(p)) };
        Ok(())
    })
}

/// Frees a request, cancelling it first if it has not completed; NULL is ignored.
///
/// # Safety
/// `request` is NULL or a request not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_request_free(request: *mut tc_request) {
    quiet((), || {
        // SAFETY: as the caller promised.
        if let Some(r) = unsafe { take(request) } {
            let _ = r.cancel();
        }
    });
}
