//! The rest of the front-end: the tree's shape, spawning back-ends while it runs, the
//! global clock and monitoring reports. Text results are JSON or MRNet's topology
//! format, in strings the caller frees with `tc_string_free`.

use std::ffi::{c_char, CString};

use treecast_api::SpawnOptions;

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{arg, block_on, c_text, duration, handle, out_ok, put};
use crate::network::{tc_communicator, tc_network};

/// Hands a string to C, to be freed with `tc_string_free`.
fn c_string(s: String) -> *mut c_char {
    c_text(&s).into_raw()
}

/// Frees a string the library handed out; NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string from this library not freed yet.
#[no_mangle]
pub unsafe extern "C" fn tc_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: as the caller promised, it came from `CString::into_raw`.
        quiet((), || drop(unsafe { CString::from_raw(s) }));
    }
}

/// The tree as a topology file in MRNet's format (`host:index => child:index ... ;`).
///
/// # Safety
/// `net` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_topology(net: *const tc_network, out: *mut *mut c_char) -> tc_result {
    guard("tc_network_topology", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(out, "out")?;
        // SAFETY: checked not NULL.
        unsafe { put(out, c_string(n.net.topology().to_mrnet())) };
        Ok(())
    })
}

/// The tree's depth: 1 for a front-end over back-ends only (0 for NULL).
///
/// # Safety
/// `net` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_network_depth(net: *const tc_network) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { net.as_ref() }.map_or(0, |n| n.net.topology().depth() as u32))
}

/// Starts `n` more back-ends running `argv[0..argc]` while the tree runs, under the
/// comm nodes with the fewest, and waits (the spawn's own limit, 60 s by default)
/// until every one joined; writes the new group's id and a communicator over its
/// ranks, for streams to them.
///
/// # Safety
/// `net` is NULL or live; `argv` points to `argc` NUL-terminated strings; `group` and
/// `out` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_spawn(
    net: *const tc_network,
    n: u32,
    argv: *const *const c_char,
    argc: usize,
    group: *mut u32,
    out: *mut *mut tc_communicator,
) -> tc_result {
    guard("tc_network_spawn", || {
        // SAFETY: as the caller promised.
        let net = unsafe { arg(net, "net") }?;
        out_ok(group, "group")?;
        out_ok(out, "out")?;
        // SAFETY: as the caller promised.
        let command = unsafe { crate::ffi::command(argv, argc) }?;
        let g = block_on(net.net.spawn(n, &command, &SpawnOptions::default()))??;
        let ranks = g.ranks().iter().copied().collect();
        let comm = net.net.communicator(ranks)?;
        // SAFETY: both checked not NULL.
        unsafe {
            put(group, g.id());
            put(out, handle(tc_communicator { comm }));
        }
        Ok(())
    })
}

/// Every node's clock against the front-end's, as a JSON array of `{node_id, name,
/// offset_ns, drift_ppm, error_ns, rtt_ns, age_s, rounds}`, after waiting up to
/// `timeout_ms` until every node was measured `rounds` times (0: as measured so far).
///
/// # Safety
/// `net` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_clock(
    net: *const tc_network,
    rounds: u32,
    timeout_ms: u64,
    out: *mut *mut c_char,
) -> tc_result {
    guard("tc_network_clock", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(out, "out")?;
        let clocks = match rounds {
            0 => n.net.clock(),
            r => block_on(n.net.wait_clock(r, duration(timeout_ms)))??,
        };
        let rows: Vec<serde_json::Value> = clocks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "node_id": c.node_id, "name": c.name, "offset_ns": c.offset_ns,
                    "drift_ppm": c.drift_ppm, "error_ns": c.error_ns, "rtt_ns": c.rtt_ns,
                    "age_s": c.age_s, "rounds": c.rounds,
                })
            })
            .collect();
        // SAFETY: checked not NULL.
        unsafe { put(out, c_string(serde_json::Value::Array(rows).to_string())) };
        Ok(())
    })
}

/// Every node starts recording its links' latency histograms under `program` (a
/// program tag, 0 for none); returns once every node confirmed.
///
/// # Safety
/// `net` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_network_monitor_start(net: *const tc_network, program: u32) -> tc_result {
    guard("tc_network_monitor_start", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        block_on(n.net.monitor_start(program))??;
        Ok(())
    })
}

/// Every node stops recording; returns once every node confirmed.
///
/// # Safety
/// `net` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_network_monitor_stop(net: *const tc_network) -> tc_result {
    guard("tc_network_monitor_stop", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        block_on(n.net.monitor_stop())??;
        Ok(())
    })
}

/// What every node recorded, merged up the tree (or one report per node with
/// `per_node`), as JSON (the format `treecast monitor` reads, docs/monitoring.md);
/// nodes that do not answer within `timeout_ms` are listed under `missing`.
///
/// # Safety
/// `net` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_monitor_collect(
    net: *const tc_network,
    per_node: bool,
    timeout_ms: u64,
    out: *mut *mut c_char,
) -> tc_result {
    guard("tc_network_monitor_collect", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(out, "out")?;
        let collection = block_on(n.net.monitor_collect(per_node, duration(timeout_ms)))??;
        let json = serde_json::to_string(&collection)
            .map_err(|e| Failure::new(tc_result::TC_ERR_OTHER, format!("writing the report as JSON: {e}")))?;
        // SAFETY: checked not NULL.
        unsafe { put(out, c_string(json)) };
        Ok(())
    })
}
