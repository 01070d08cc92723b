//! Write a treecast plug-in filter in Rust, with no `unsafe` in the filter's code.
//!
//! Implement [`Filter`] for a type and export it from a `cdylib` with
//! [`export_filter!`]; the crate builds the C ABI's table ([`abi::FilterTable`],
//! `include/treecast_filter.h`) around it. Each call into the filter runs under
//! `catch_unwind`, so a panic comes back to the node as the filter's error and never
//! crosses the C ABI (this needs the plug-in built with `panic = "unwind"`, Rust's
//! default; under `panic = "abort"` a panic ends the node's process, which the tree
//! then treats as a failed node).
//!
//! ```ignore
//! use treecast_filter::{export_filter, Error, Filter, Output, Packet, Place, Value};
//! struct Count(u64);
//! impl Filter for Count {
//!     fn create(_params: &[Value], _place: &Place) -> Result<Self, Error> { Ok(Count(0)) }
//!     fn reduce(&mut self, wave: &[Packet<'_>], _place: &Place, out: &mut Output<'_>) -> Result<(), Error> {
//!         self.0 += wave.len() as u64;
//!         out.up(wave[0].tag, &[Value::ULong(self.0)])
//!     }
//! }
//! export_filter!(Count, name = "count", version = 1);
//! ```

// The ABI is raw pointers and function pointers: this crate is where the unsafe
// code lives so that filters written with it need none. Each block says why it holds.
#![allow(unsafe_code)]

pub mod abi;

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use treecast_wire::Value;
use treecast_wire::{decode_values, encode_values};

/// Where an instance runs: the node's rank, role, stream children, depth and leaves.
pub type Place = abi::Place;

/// Why a filter call failed: a message, and the source rank of the packet at fault
/// if one is (the node then drops that rank's packets and reduces the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
    rank: Option<u32>,
    code: i32,
}

impl Error {
    /// A failure of the filter as a whole.
    pub fn new(message: impl Into<String>) -> Error {
        Error { message: message.into(), rank: None, code: abi::ERR_FILTER }
    }

    /// The packet from `rank` is at fault.
    pub fn packet(rank: u32, message: impl Into<String>) -> Error {
        Error { message: message.into(), rank: Some(rank), code: abi::ERR_PACKET }
    }

    /// Parameters the filter refuses.
    pub fn params(message: impl Into<String>) -> Error {
        Error { message: message.into(), rank: None, code: abi::ERR_PARAMS }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// One packet of a wave.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The sender's tag.
    pub tag: i32,
    /// The source rank.
    pub rank: u32,
    /// The payload's format string, e.g. `%d %aud`.
    pub format: &'a str,
    /// The typed values, encoded (docs/wire-format.md).
    pub payload: &'a [u8],
}

impl Packet<'_> {
    /// The packet's values.
    ///
    /// # Errors
    /// A payload that does not decode, as an error naming this packet's rank.
    pub fn values(&self) -> Result<Vec<Value>, Error> {
        decode_values(self.payload).map_err(|e| Error::packet(self.rank, format!("cannot decode: {e}")))
    }
}

/// Where a call's packets go: up, down, or (from [`Filter::state`]) the state.
pub struct Output<'a> {
    host: &'a abi::Host,
    sink: *mut abi::Sink,
}

impl Output<'_> {
    fn emit(&mut self, direction: u32, tag: i32, values: &[Value]) -> Result<(), Error> {
        let mut bytes = Vec::new();
        encode_values(values, &mut bytes);
        // SAFETY: `host` and `sink` are what the host passed to this call, valid until
        // it returns (an Output never outlives the call); the bytes live across the call.
        let code = unsafe { (self.host.emit)(self.sink, direction, tag, bytes.as_ptr(), bytes.len()) };
        match code {
            abi::OK => Ok(()),
            _ => Err(Error::new(format!("the node refused an emitted packet (code {code})"))),
        }
    }

    /// Sends a packet on up the tree.
    ///
    /// # Errors
    /// The node refused it.
    pub fn up(&mut self, tag: i32, values: &[Value]) -> Result<(), Error> {
        self.emit(abi::UP, tag, values)
    }

    /// Sends a packet back down to this node's children in the stream (MRNet's
    /// `packets_out_reverse`), once the wave's reduction succeeds.
    ///
    /// # Errors
    /// The node refused it (not typed values, or called from [`Filter::state`]).
    pub fn down(&mut self, tag: i32, values: &[Value]) -> Result<(), Error> {
        self.emit(abi::DOWN, tag, values)
    }
}

/// A filter: one instance per stream per node, kept across waves.
pub trait Filter: Sized {
    /// Makes an instance from the stream's parameters (typed values) and its place.
    ///
    /// # Errors
    /// Parameters the filter refuses ([`Error::params`]).
    fn create(params: &[Value], place: &Place) -> Result<Self, Error>;

    /// Reduces one wave (its packets in child order), emitting through `out`.
    ///
    /// # Errors
    /// [`Error::packet`] when one packet is at fault, [`Error::new`] otherwise.
    fn reduce(&mut self, wave: &[Packet<'_>], place: &Place, out: &mut Output<'_>) -> Result<(), Error>;

    /// The instance's state for recovery; `None` (the default) when it keeps none.
    fn state(&self) -> Option<Vec<Value>> {
        None
    }

    /// New parameters while the stream runs.
    ///
    /// # Errors
    /// By default every change is refused.
    fn set_params(&mut self, params: &[Value]) -> Result<(), Error> {
        let _ = params;
        Err(Error::params("takes no parameters while the stream runs"))
    }

    /// Takes over `state`, what [`Filter::state`] of a lost instance of this filter
    /// reported (its node died and its children rejoined this one), so that a running
    /// reduction stays correct.
    ///
    /// # Errors
    /// By default a state is refused, since the filter cannot know how to merge it.
    fn adopt_state(&mut self, state: &[Value]) -> Result<(), Error> {
        let _ = state;
        Err(Error::new("cannot take over a lost instance's state"))
    }
}

/// Writes `message` into the host's error buffer, cut to fit, NUL-terminated.
fn write_err(err: *mut c_char, len: usize, message: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let n = message.len().min(len - 1);
    // SAFETY: the host passes a buffer of `len` writable bytes; n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(message.as_ptr().cast::<c_char>(), err, n);
        *err.add(n) = 0;
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text payload".to_owned());
    format!("the filter panicked: {what}")
}

/// Runs `f`, turning its error or panic into a code and a message.
fn guarded(err: *mut c_char, err_len: usize, f: impl FnOnce() -> Result<(), Error>) -> (i32, Option<u32>) {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => (abi::OK, None),
        Ok(Err(e)) => {
            write_err(err, err_len, &e.message);
            (e.code, e.rank)
        }
        Err(payload) => {
            write_err(err, err_len, &panic_message(payload.as_ref()));
            (abi::ERR_FILTER, None)
        }
    }
}

fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the host passes `len` readable bytes at `ptr`, valid during the call.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

fn params_of(ptr: *const u8, len: usize) -> Result<Vec<Value>, Error> {
    decode_values(bytes(ptr, len)).map_err(|e| Error::params(format!("parameters do not decode: {e}")))
}

unsafe extern "C" fn create<F: Filter>(
    params: *const u8,
    params_len: usize,
    place: *const Place,
    state: *mut *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let params = params_of(params, params_len)?;
        // SAFETY: the host passes a valid place and a writable state slot.
        let place = unsafe { place.as_ref() }.copied().unwrap_or_default();
        let instance = F::create(&params, &place)?;
        // SAFETY: as above; the box is reclaimed by `destroy::<F>`.
        unsafe { *state = Box::into_raw(Box::new(instance)).cast::<c_void>() };
        Ok(())
    })
    .0
}

unsafe extern "C" fn reduce<F: Filter>(
    state: *mut c_void,
    place: *const Place,
    packets: *const abi::Packet,
    n: usize,
    host: *const abi::Host,
    sink: *mut abi::Sink,
    bad_rank: *mut u32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    let (code, rank) = guarded(err, err_len, || {
        // SAFETY: `state` came from `create::<F>` and the host calls one instance from
        // one thread at a time; place, host and the n packets are valid during the call.
        let (instance, place, host) = unsafe { (&mut *state.cast::<F>(), *place, &*host) };
        let raw: &[abi::Packet] =
            if n == 0 { &[] } else { unsafe { std::slice::from_raw_parts(packets, n) } };
        let wave: Vec<Packet<'_>> = raw
            .iter()
            .map(|p| Packet {
                tag: p.tag,
                rank: p.rank,
                format: if p.format.is_null() {
                    ""
                } else {
                    // SAFETY: a non-null format is the host's NUL-terminated string, valid during the call.
                    unsafe { CStr::from_ptr(p.format) }.to_str().unwrap_or("")
                },
                payload: bytes(p.payload, p.payload_len),
            })
            .collect();
        instance.reduce(&wave, &place, &mut Output { host, sink })
    });
    if let (Some(rank), false) = (rank, bad_rank.is_null()) {
        // SAFETY: the host passes a writable slot.
        unsafe { *bad_rank = rank };
    }
    code
}

unsafe extern "C" fn get_state<F: Filter>(
    state: *mut c_void,
    host: *const abi::Host,
    sink: *mut abi::Sink,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: as in `reduce::<F>`.
        let (instance, host) = unsafe { (&*state.cast::<F>(), &*host) };
        match instance.state() {
            Some(values) => Output { host, sink }.emit(abi::STATE, 0, &values),
            None => Ok(()),
        }
    })
    .0
}

unsafe extern "C" fn set_params<F: Filter>(
    state: *mut c_void,
    params: *const u8,
    params_len: usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let params = params_of(params, params_len)?;
        // SAFETY: as in `reduce::<F>`.
        let instance = unsafe { &mut *state.cast::<F>() };
        instance.set_params(&params)
    })
    .0
}

unsafe extern "C" fn adopt_state<F: Filter>(
    state: *mut c_void,
    bytes_in: *const u8,
    len: usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let values = decode_values(bytes(bytes_in, len))
            .map_err(|e| Error::new(format!("the state does not decode: {e}")))?;
        // SAFETY: as in `reduce::<F>`.
        let instance = unsafe { &mut *state.cast::<F>() };
        instance.adopt_state(&values)
    })
    .0
}

unsafe extern "C" fn destroy<F: Filter>(state: *mut c_void) {
    if state.is_null() {
        return;
    }
    // A panic in the filter's Drop must not unwind into the host either.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `state` came from `Box::into_raw` in `create::<F>`; the host
        // destroys each instance once.
        drop(unsafe { Box::from_raw(state.cast::<F>()) });
    }));
}

/// The table for filter `F` named `name` (NUL-terminated), what [`export_filter!`]
/// exports; also usable in tests to load a filter without a shared object.
pub const fn table<F: Filter>(name: &'static CStr, version: u16) -> abi::FilterTable {
    abi::FilterTable {
        abi_version: abi::ABI_VERSION,
        size: std::mem::size_of::<abi::FilterTable>() as u32,
        name: name.as_ptr(),
        version,
        reserved: 0,
        reserved2: 0,
        create: Some(create::<F>),
        reduce: Some(reduce::<F>),
        get_state: Some(get_state::<F>),
        set_params: Some(set_params::<F>),
        destroy: Some(destroy::<F>),
        adopt_state: Some(adopt_state::<F>),
    }
}

/// Exports filter type `$ty` under `name` and `version` from a `cdylib`: defines the
/// `treecast_filter_v1` symbol. Use once per shared object.
#[macro_export]
macro_rules! export_filter {
    ($ty:ty, name = $name:literal, version = $version:literal) => {
        /// The plug-in's entry point (docs/filter-abi.md).
        #[allow(unsafe_code)] // `no_mangle` only: the symbol the loader looks up.
        #[no_mangle]
        pub extern "C" fn treecast_filter_v1() -> *const $crate::abi::FilterTable {
            static TABLE: $crate::abi::FilterTable = $crate::table::<$ty>(
                match ::std::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
                    Ok(name) => name,
                    Err(_) => panic!("a filter name has no NUL byte"),
                },
                $version,
            );
            &TABLE
        }
    };
}
