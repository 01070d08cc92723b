//! The filter ABI, version 1, as Rust types: the same layout as
//! `include/treecast_filter.h` (docs/filter-abi.md is the reference).
//!
//! Both sides use these types: a plug-in built with this crate exports a
//! [`FilterTable`], and the loader in `treecast-filters` reads one.

use std::ffi::{c_char, c_void};

/// The version of the table layout described here.
pub const ABI_VERSION: u32 = 1;
/// The symbol a plug-in exports: `const FilterTable *treecast_filter_v1(void)`.
pub const SYMBOL: &str = "treecast_filter_v1";

/// Success.
pub const OK: i32 = 0;
/// The filter failed; the message says why.
pub const ERR_FILTER: i32 = 1;
/// A packet is at fault; `bad_rank` names its source rank.
pub const ERR_PACKET: i32 = 2;
/// The parameters are refused.
pub const ERR_PARAMS: i32 = 3;

/// [`Place::role`] of the front-end.
pub const ROLE_FRONT_END: u32 = 0;
/// [`Place::role`] of a comm node.
pub const ROLE_COMM_NODE: u32 = 1;
/// [`Place::role`] of a back-end.
pub const ROLE_BACK_END: u32 = 2;

/// [`Host::emit`]: a packet going up.
pub const UP: u32 = 0;
/// [`Host::emit`]: a packet going down.
pub const DOWN: u32 = 1;
/// [`Host::emit`] from `get_state`: the instance's state.
pub const STATE: u32 = 2;

/// Where an instance runs (`treecast_place`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Place {
    /// The stream's id.
    pub stream: u32,
    /// The node's id in the tree (0: the front-end).
    pub rank: u32,
    /// One of the `ROLE_*` constants.
    pub role: u32,
    /// Children of the node that are members of the stream.
    pub children: u32,
    /// The node's depth (0 at the front-end).
    pub depth: u32,
    /// Back-end ranks of the stream below the node.
    pub leaves: u32,
}

/// One packet of a wave (`treecast_packet`), valid during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    /// The sender's tag.
    pub tag: i32,
    /// The source rank.
    pub rank: u32,
    /// The payload's format string, NUL-terminated.
    pub format: *const c_char,
    /// The typed values.
    pub payload: *const u8,
    /// Bytes at `payload`.
    pub payload_len: usize,
}

/// The host's side of one call (`treecast_sink`): opaque to plug-ins.
#[repr(C)]
pub struct Sink {
    _opaque: [u8; 0],
}

/// `emit`: a packet (or the state) out of a call.
pub type EmitFn = unsafe extern "C" fn(*mut Sink, u32, i32, *const u8, usize) -> i32;

/// What the host lends a plug-in during `reduce` and `get_state` (`treecast_host`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Host {
    /// `size_of::<Host>()` as the host knows it.
    pub size: u32,
    /// Emits a packet up or down, or the state; non-zero when the host refuses it.
    pub emit: EmitFn,
}

/// `create`.
pub type CreateFn =
    unsafe extern "C" fn(*const u8, usize, *const Place, *mut *mut c_void, *mut c_char, usize) -> i32;
/// `reduce`.
pub type ReduceFn = unsafe extern "C" fn(
    *mut c_void,
    *const Place,
    *const Packet,
    usize,
    *const Host,
    *mut Sink,
    *mut u32,
    *mut c_char,
    usize,
) -> i32;
/// `get_state`.
pub type GetStateFn = unsafe extern "C" fn(*mut c_void, *const Host, *mut Sink, *mut c_char, usize) -> i32;
/// `set_params`.
pub type SetParamsFn = unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut c_char, usize) -> i32;
/// `destroy`.
pub type DestroyFn = unsafe extern "C" fn(*mut c_void);
/// `adopt_state`: takes over a state another instance of the filter reported.
pub type AdoptStateFn = unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut c_char, usize) -> i32;

/// The first two fields of every table version: read before anything else.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TableHead {
    /// [`ABI_VERSION`] of the table.
    pub abi_version: u32,
    /// Its size in bytes.
    pub size: u32,
}

/// The table a plug-in exports (`treecast_filter_v1`).
#[repr(C)]
#[derive(Debug)]
pub struct FilterTable {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// `size_of::<FilterTable>()`.
    pub size: u32,
    /// The filter's name, NUL-terminated UTF-8.
    pub name: *const c_char,
    /// The filter's own version.
    pub version: u16,
    /// Zero.
    pub reserved: u16,
    /// Zero.
    pub reserved2: u32,
    /// Makes an instance.
    pub create: Option<CreateFn>,
    /// Reduces a wave.
    pub reduce: Option<ReduceFn>,
    /// Reports the state.
    pub get_state: Option<GetStateFn>,
    /// Takes new parameters.
    pub set_params: Option<SetParamsFn>,
    /// Ends an instance.
    pub destroy: Option<DestroyFn>,
    /// Takes over a lost instance's state (recovery); absent from tables of
    /// [`BASE_TABLE_SIZE`] bytes, built before it was added.
    pub adopt_state: Option<AdoptStateFn>,
}

/// The size of a version 1 table built before `adopt_state` was added: such
/// plug-ins still load, and cannot take over a lost instance's state.
pub const BASE_TABLE_SIZE: u32 = std::mem::offset_of!(FilterTable, adopt_state) as u32;

// SAFETY: a table is immutable static data (a pointer to a static string and
// function pointers); sharing it between threads reads it only.
#[allow(unsafe_code)]
unsafe impl Sync for FilterTable {}

/// The exported function's type.
pub type EntryFn = extern "C" fn() -> *const FilterTable;
