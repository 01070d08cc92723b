//! libtreecast: treecast for tools written in C and C++ (`include/treecast.h`,
//! generated from this crate; `docs/c-api.md` is the guide).
//!
//! Conventions, as in rustls-ffi and wasmtime's C API: opaque handles made and freed
//! by the library; every fallible call returns a [`tc_result`] and, on failure, leaves
//! a message saying what failed and what to do, per thread, in [`tc_last_error`];
//! out-parameters are written only on success; NULL is checked everywhere; every
//! entry point catches panics, so none crosses into C. Blocking calls run on an
//! internal runtime and take a time limit in milliseconds (`TC_FOREVER` to wait as
//! long as it takes, 0 to look once).
//!
//! Variadic calls (`tc_stream_send(s, tag, "%d %lf", ...)`, `tc_packet_unpack`) are
//! inline C in the header over the value-array calls here, since stable Rust cannot
//! define a variadic function.

// The C boundary is raw pointers throughout: every unsafe block says why it holds.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

/// With the `mimalloc` feature, Rust's allocations in the library go to mimalloc. A C
/// tool's process has threads (the library's background thread at least), and in a
/// process with threads glibc's malloc takes its locks and atomic operations where a
/// single-threaded one, such as a treecast node, skips them: the MRNet layer's
/// front-end spent 30 % of its CPU in malloc and free against 24 % for treecast's
/// own, and with mimalloc kept 0.99 to 1.14 times treecast's reductions/s where it
/// kept 0.86 to 0.96 (docs/mrnet-compat.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod backend;
mod commnode;
mod error;
mod ffi;
mod files;
mod nap_policy;
mod network;
mod packet;
mod pollfd;
mod readyfd;
mod requests;
mod stream;
mod tree;
mod turns;
mod values;

pub use backend::*;
pub use commnode::*;
pub use error::{tc_last_error, tc_result, tc_result_name};
pub use ffi::{TC_DEFAULT_SEND_TIMEOUT_MS, TC_FOREVER};
pub use files::*;
pub use network::*;
pub use packet::*;
pub use pollfd::*;
pub use requests::*;
pub use stream::*;
pub use tree::*;
pub use values::*;

/// The library's version, e.g. `"0.1.0"` (static).
#[no_mangle]
pub extern "C" fn tc_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
