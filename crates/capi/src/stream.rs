//! Streams at the front-end: made over a communicator with filters, sending down
//! with format strings, receiving reductions.

use std::ffi::c_char;
use std::sync::Arc;

use treecast_api::{FilterSpec, RouteChoice, Stream, StreamOptions, StreamSender, SyncMode, TransformKind};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{
    arg, block_on, handle, out_ok, put, ran_out, runtime, send_within, take, text, took_without_waiting,
    wait_for,
};
use crate::network::{tc_communicator, tc_network};
use crate::packet::tc_packet;
use crate::values::{from_c, parse_c, tc_value, values_of};

/// Waves wait for a packet from every live child (the default).
pub const TC_SYNC_WAIT_FOR_ALL: u32 = 0;
/// Waves wait for every child but at most the stream's time-out, in milliseconds.
pub const TC_SYNC_TIME_OUT: u32 = 1;
/// Every packet is a wave of its own.
pub const TC_SYNC_DO_NOT_WAIT: u32 = 2;

/// A stream: a communicator bound to filters. Sends, receives and `tc_stream_id` may
/// run from several threads at once (each packet goes to the earliest posted receive
/// that matches it); `tc_stream_free` must be the last call.
#[allow(non_camel_case_types)]
pub struct tc_stream {
    pub(crate) sender: StreamSender,
    /// Its receives: blocking ones and `tc_stream_irecv` requests take packets in the
    /// order they were posted (the stream's mailbox, see `Stream::recv_matching`).
    pub(crate) receiver: Stream,
    /// The order of the stream's asynchronous sends.
    pub(crate) send_turns: Arc<crate::turns::Turns>,
    /// How long a blocking send waits for room in the window, milliseconds.
    send_limit_ms: u64,
    /// The stream's own descriptor (`tc_stream_fd`), made when first asked for.
    pub(crate) ready: crate::readyfd::ReadySlot,
}

/// A filter named by `name`: a built-in (`sum`, `min`, `max`, `avg`, `concat`,
/// `eqclass`, `null`) or a plug-in the network loaded.
fn filter(net: &tc_network, name: &str) -> FilterSpec {
    if let Some(kind) = TransformKind::from_name(name) {
        return kind.spec();
    }
    let versions = net.plugins.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    FilterSpec::new(name, versions.get(name).copied().unwrap_or(1))
}

fn sync_mode(sync: u32, timeout_ms: u32) -> Result<SyncMode, Failure> {
    match sync {
        TC_SYNC_WAIT_FOR_ALL => Ok(SyncMode::WaitForAll),
        TC_SYNC_TIME_OUT => Ok(SyncMode::TimeOut(timeout_ms)),
        TC_SYNC_DO_NOT_WAIT => Ok(SyncMode::DoNotWait),
        other => Err(Failure::new(
            tc_result::TC_ERR_INVALID,
            format!(
                "no sync mode {other}: use TC_SYNC_WAIT_FOR_ALL, TC_SYNC_TIME_OUT or TC_SYNC_DO_NOT_WAIT"
            ),
        )),
    }
}

/// Makes a stream over `comm`: `up` reduces waves on the way up and `down` transforms
/// packets on the way down (NULL: `"null"`, pass through); `sync` is a `TC_SYNC_*`
/// mode, `sync_timeout_ms` its time-out for `TC_SYNC_TIME_OUT`.
///
/// # Safety
/// `net` and `comm` are NULL or live; `up` and `down` are NULL or NUL-terminated;
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_new(
    net: *const tc_network,
    comm: *const tc_communicator,
    up: *const c_char,
    down: *const c_char,
    sync: u32,
    sync_timeout_ms: u32,
    out: *mut *mut tc_stream,
) -> tc_result {
    guard("tc_stream_new", || {
        // SAFETY: as the caller promised.
        unsafe { new_stream(net, comm, up, down, sync, sync_timeout_ms, Extras::default(), out) }
    })
}

/// As `tc_stream_new`, its frames kept to part of the network's route: `route` is
/// `"tcp"` (each frame whole on one connection of each link: no multicast, no
/// striping), `"udp"` (multicast, needs the udp route), `"striped"` (needs striped
/// links) or `"network"` (NULL too: whatever the network's route does).
/// `TC_ERR_INVALID` for a route the network's links do not carry, naming the
/// route to launch with.
///
/// # Safety
/// As `tc_stream_new`; `route` is NULL or NUL-terminated.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tc_stream_new_routed(
    net: *const tc_network,
    comm: *const tc_communicator,
    up: *const c_char,
    down: *const c_char,
    sync: u32,
    sync_timeout_ms: u32,
    route: *const c_char,
    out: *mut *mut tc_stream,
) -> tc_result {
    guard("tc_stream_new_routed", || {
        // SAFETY: as the caller promised.
        let route = match unsafe { opt(route, "route") }? {
            None => RouteChoice::Network,
            Some(r) => r.parse().map_err(|e: String| Failure::new(tc_result::TC_ERR_INVALID, e))?,
        };
        let extras = Extras { params: None, route };
        // SAFETY: as the caller promised.
        unsafe { new_stream(net, comm, up, down, sync, sync_timeout_ms, extras, out) }
    })
}

/// As `tc_stream_new`, with parameters for the `up` filter from its creation on,
/// typed as `format` says: every node's instance is made with them (a plug-in's
/// `create` gets them), so no wave is ever reduced without them.
///
/// # Safety
/// As `tc_stream_new`; `format` is NULL or NUL-terminated; `values` points to
/// `count` values valid as `tc_value` says.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tc_stream_new_params(
    net: *const tc_network,
    comm: *const tc_communicator,
    up: *const c_char,
    down: *const c_char,
    sync: u32,
    sync_timeout_ms: u32,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
    out: *mut *mut tc_stream,
) -> tc_result {
    guard("tc_stream_new_params", || {
        // SAFETY: as the caller promised.
        let format = unsafe { text(format, "format") }?;
        // SAFETY: as the caller promised.
        let values = unsafe { from_c(format, values, count) }?;
        let mut params = Vec::new();
        treecast_api::encode_values(&values, &mut params);
        // SAFETY: as the caller promised.
        let extras = Extras { params: Some(params), route: RouteChoice::Network };
        // SAFETY: as the caller promised.
        unsafe { new_stream(net, comm, up, down, sync, sync_timeout_ms, extras, out) }
    })
}

/// What some ways of making a stream add to `tc_stream_new`'s arguments.
#[derive(Default)]
struct Extras {
    /// The up filter's parameters.
    params: Option<Vec<u8>>,
    route: RouteChoice,
}

/// The work of `tc_stream_new`, `tc_stream_new_params` and `tc_stream_new_routed`.
///
/// # Safety
/// As `tc_stream_new`.
#[allow(clippy::too_many_arguments)]
unsafe fn new_stream(
    net: *const tc_network,
    comm: *const tc_communicator,
    up: *const c_char,
    down: *const c_char,
    sync: u32,
    sync_timeout_ms: u32,
    extras: Extras,
    out: *mut *mut tc_stream,
) -> Result<(), Failure> {
    // SAFETY: as the caller promised.
    let (n, c) = unsafe { (arg(net, "net")?, arg(comm, "comm")?) };
    // SAFETY: as the caller promised.
    let (up, down) = unsafe { (opt(up, "up")?, opt(down, "down")?) };
    out_ok(out, "out")?;
    let mut options = StreamOptions::reduce(TransformKind::Null);
    options.up = filter(n, up.unwrap_or("null"));
    if let Some(p) = extras.params {
        options.up.params = p;
    }
    options.route = extras.route;
    options.down = filter(n, down.unwrap_or("null"));
    options.sync = sync_mode(sync, sync_timeout_ms)?;
    let stream = block_on(n.net.new_stream(&c.comm, options))??;
    let s = tc_stream {
        sender: stream.sender(),
        receiver: stream,
        send_turns: Arc::default(),
        send_limit_ms: n.send_limit_ms,
        ready: Default::default(),
    };
    // SAFETY: checked not NULL.
    unsafe { put(out, handle(s)) };
    Ok(())
}

/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn opt<'a>(p: *const c_char, name: &str) -> Result<Option<&'a str>, Failure> {
    // SAFETY: as the caller promised.
    unsafe { crate::ffi::opt_text(p, name) }
}

/// The stream's id, as packets carry it (0 for NULL).
///
/// # Safety
/// `stream` is NULL or a live stream.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_id(stream: *const tc_stream) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { stream.as_ref() }.map_or(0, |s| s.sender.id()))
}

/// Multicasts `values[0..count]`, typed as `format` says (e.g. `"%d %lf %as"`), to
/// every back-end of the stream; waits while the stream's window is full. A value of
/// the wrong kind is refused, naming it, and nothing is sent.
///
/// # Safety
/// `stream` is NULL or live; `format` is NULL or NUL-terminated; `values` points to
/// `count` values valid as `tc_value` says.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_send_values(
    stream: *const tc_stream,
    tag: i32,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
) -> tc_result {
    guard("tc_stream_send_values", || {
        // SAFETY: as the caller promised.
        let (s, (format, fmt)) = unsafe { (arg(stream, "stream")?, parse_c(format)?) };
        // SAFETY: as the caller promised.
        let values = unsafe { values_of(&fmt, format, values, count) }?;
        send_within(s.send_limit_ms, s.sender.send(tag, format, &values))
    })
}

/// Sends `values[0..count]` to one back-end `rank` of the stream (point to point).
///
/// # Safety
/// As [`tc_stream_send_values`].
#[no_mangle]
pub unsafe extern "C" fn tc_stream_send_values_to(
    stream: *const tc_stream,
    rank: u32,
    tag: i32,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
) -> tc_result {
    guard("tc_stream_send_values_to", || {
        // SAFETY: as the caller promised.
        let (s, (format, fmt)) = unsafe { (arg(stream, "stream")?, parse_c(format)?) };
        // SAFETY: as the caller promised.
        let values = unsafe { values_of(&fmt, format, values, count) }?;
        send_within(s.send_limit_ms, s.sender.send_to(rank, tag, format, &values))
    })
}

/// New parameters for the stream's upward filter, typed as `format` says; waves
/// answering what is sent after this call are reduced with them.
///
/// # Safety
/// As [`tc_stream_send_values`].
#[no_mangle]
pub unsafe extern "C" fn tc_stream_set_params_values(
    stream: *const tc_stream,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
) -> tc_result {
    guard("tc_stream_set_params_values", || {
        // SAFETY: as the caller promised.
        let (s, format) = unsafe { (arg(stream, "stream")?, text(format, "format")?) };
        // SAFETY: as the caller promised.
        let values = unsafe { from_c(format, values, count) }?;
        Ok(s.sender.set_params(&values)?)
    })
}

/// New parameters for the stream's downstream filter, typed as `format` says; every
/// comm node takes them before any packet sent down after this call.
///
/// # Safety
/// As [`tc_stream_send_values`].
#[no_mangle]
pub unsafe extern "C" fn tc_stream_set_down_params_values(
    stream: *const tc_stream,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
) -> tc_result {
    guard("tc_stream_set_down_params_values", || {
        // SAFETY: as the caller promised.
        let (s, format) = unsafe { (arg(stream, "stream")?, text(format, "format")?) };
        // SAFETY: as the caller promised.
        let values = unsafe { from_c(format, values, count) }?;
        Ok(s.sender.set_down_params(&values)?)
    })
}

/// Waits up to `timeout_ms` (0: do not wait; `TC_FOREVER`) for the stream's next
/// packet: a reduction, or a back-end's packet with the null filter. `TC_ERR_CLOSED`
/// once every member is gone; `TC_ERR_NO_ANSWER` for a request no rank answered.
///
/// # Safety
/// `stream` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_recv(
    stream: *const tc_stream,
    timeout_ms: u64,
    out: *mut *mut tc_packet,
) -> tc_result {
    // SAFETY: as the caller promised.
    guard("tc_stream_recv", || unsafe { receive_into(stream, treecast_api::Match::any(), timeout_ms, out) })
}

/// The receive of `tc_stream_recv` and `tc_stream_recv_match`: waits up to
/// `timeout_ms` for a packet `only` takes and writes it to `out`.
///
/// # Safety
/// `stream` is NULL or live; `out` is NULL or writable.
unsafe fn receive_into(
    stream: *const tc_stream,
    only: treecast_api::Match,
    timeout_ms: u64,
    out: *mut *mut tc_packet,
) -> Result<(), Failure> {
    // SAFETY: as the caller promised.
    let s = unsafe { arg(stream, "stream") }?;
    out_ok(out, "out")?;
    took_without_waiting(timeout_ms)?;
    // A packet already here is taken without driving the runtime: the common case of
    // a tool reading a burst. Its context is entered for whatever the delivery wakes.
    let now = {
        let _inside = runtime()?.enter();
        s.receiver.try_recv_matching(only)?
    };
    let packet = match now {
        Some(p) => p,
        None => wait_for(timeout_ms, s.receiver.recv_matching(only))?
            .ok_or_else(|| ran_out(timeout_ms, "packet"))??,
    };
    let p = tc_packet::new(packet)?;
    // SAFETY: checked not NULL.
    unsafe { put(out, handle(p)) };
    Ok(())
}

/// Matches any tag in `tc_stream_recv_match` and `tc_stream_irecv_match`.
pub const TC_ANY_TAG: i32 = i32::MIN;
/// Matches any source rank in `tc_stream_recv_match` and `tc_stream_irecv_match`.
pub const TC_ANY_RANK: i64 = -1;
/// The first of the tags treecast keeps for itself (0x7FFFFF00 and up: the generic
/// back-end's requests, file transfers); a tool's own tags are the ones below it.
pub const TC_FIRST_RESERVED_TAG: i32 = 0x7fff_ff00;

/// What a matched receive takes: `tag` (`TC_ANY_TAG`: any) from `rank`
/// (`TC_ANY_RANK`: any; else a rank, 0 to 2^32 - 1).
pub(crate) fn receive_match(tag: i32, rank: i64) -> Result<treecast_api::Match, Failure> {
    let rank = match rank {
        TC_ANY_RANK => None,
        r => Some(u32::try_from(r).map_err(|_| {
            Failure::new(
                tc_result::TC_ERR_INVALID,
                format!("rank {r} is not a rank: give 0 to 4294967295, or TC_ANY_RANK for any"),
            )
        })?),
    };
    let tag = (tag != TC_ANY_TAG).then_some(tag);
    Ok(treecast_api::Match { tag, rank, stream: None })
}

/// As `tc_stream_recv`, but takes only a packet with tag `tag` (`TC_ANY_TAG`: any)
/// from rank `rank` (`TC_ANY_RANK`: any; for a reduction, the lowest rank of its
/// wave); the packets it skips stay, in order, for later receives.
///
/// # Safety
/// `stream` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_recv_match(
    stream: *const tc_stream,
    tag: i32,
    rank: i64,
    timeout_ms: u64,
    out: *mut *mut tc_packet,
) -> tc_result {
    guard("tc_stream_recv_match", || {
        let only = receive_match(tag, rank)?;
        // SAFETY: as the caller promised.
        unsafe { receive_into(stream, only, timeout_ms, out) }
    })
}

/// Closes the stream in the whole tree (after what was sent on it) and frees it;
/// NULL is ignored.
///
/// # Safety
/// `stream` is NULL or a stream not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_free(stream: *mut tc_stream) {
    quiet((), || {
        // SAFETY: as the caller promised.
        if let Some(s) = unsafe { take(stream) } {
            // Closed now, not when the last request holding its receiver goes: those
            // requests end with TC_ERR_CLOSED.
            s.sender.close();
        }
    });
}

#[cfg(test)]
mod tests {
    /// The header's constant is a literal (cbindgen reads no other crate's constants):
    /// it must stay the library's.
    #[test]
    fn the_reserved_tags_begin_where_the_library_says() {
        assert_eq!(super::TC_FIRST_RESERVED_TAG, treecast_api::FIRST_RESERVED_TAG);
    }
}
