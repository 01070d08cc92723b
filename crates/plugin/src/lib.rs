//! Plug-in filters: shared objects that implement the C filter ABI
//! (docs/filter-abi.md, `include/treecast_filter.h`), loaded at run time and
//! registered in a [`FilterRegistry`] under their own name and version, so streams
//! use them as they use the built-ins.
//!
//! [`Plugin::load`] loads one from a path; [`Plugin::load_bytes`] from its bytes,
//! which it writes to a sealed memory file (`memfd_create` with `F_SEAL_*`) and loads
//! as `/proc/self/fd/N`, so no shared file system is needed. Before `dlopen` the ELF
//! header is checked (a shared object for another architecture is refused, naming
//! both), and after it the table's ABI version and size, before anything else in it
//! is read. Plug-ins are never unloaded: their code must outlive every instance, and
//! unloading C code that may have started threads is never safe.
//!
//! A loaded filter becomes a [`Transform`] per stream per node: its state lives
//! across waves, and an error return becomes a [`FilterError::Plugin`], which the
//! node reports with its own name like any filter error.

// The one place treecast loads C code (dlopen, memfd_create and the plug-in's own
// functions); each unsafe block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;
use treecast_filter::abi;
use treecast_wire::{decode_format, decode_values, Format, Frame, FrameHeader, MAX_FILTER_NAME};

use treecast_filters::{FilterContext, FilterError, FilterPlace, FilterRegistry, PlaceRole, Transform};

/// Why a plug-in could not be loaded. Every message names the plug-in (its path, or
/// the label given with its bytes).
#[derive(Error, Debug)]
#[non_exhaustive]
pub enum PluginError {
    /// The file could not be read.
    #[error("cannot read the plug-in {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The bytes are not an ELF shared object this process can load.
    #[error("{origin} is not a shared object this node can load: {detail}")]
    NotShared {
        /// The plug-in.
        origin: String,
        /// What is wrong with its header.
        detail: String,
    },
    /// A shared object for another architecture.
    #[error(
        "{origin} is built for {found_name} (ELF machine {found}) but this node runs on {expected_name} \
         (ELF machine {expected}); build the plug-in for this node's architecture"
    )]
    Machine {
        /// The plug-in.
        origin: String,
        /// Its ELF machine number.
        found: u16,
        /// Its architecture's name, if known.
        found_name: &'static str,
        /// This node's ELF machine number.
        expected: u16,
        /// This node's architecture.
        expected_name: &'static str,
    },
    /// The dynamic loader refused it (a missing library or symbol it needs, another libc).
    #[error("cannot load {origin}: {detail}")]
    Open {
        /// The plug-in.
        origin: String,
        /// The dynamic loader's message.
        detail: String,
    },
    /// It exports no entry point.
    #[error("{origin} exports no `{symbol}`: it is not a treecast filter plug-in ({detail})")]
    Symbol {
        /// The plug-in.
        origin: String,
        /// The symbol looked for.
        symbol: &'static str,
        /// The dynamic loader's message.
        detail: String,
    },
    /// Its table is of an ABI version this node does not know.
    #[error(
        "{origin} implements filter ABI version {found}; this node knows version {known}: rebuild the \
         plug-in against this treecast's include/treecast_filter.h"
    )]
    AbiVersion {
        /// The plug-in.
        origin: String,
        /// The version in its table.
        found: u32,
        /// The version this node knows.
        known: u32,
    },
    /// Its table's size is not the size of the version it claims.
    #[error(
        "{origin}'s filter table is {found} bytes but ABI version 1's is {expected} (or {base} without \
         adopt_state): the plug-in was built against a different include/treecast_filter.h",
        base = abi::BASE_TABLE_SIZE
    )]
    TableSize {
        /// The plug-in.
        origin: String,
        /// The size in its table.
        found: u32,
        /// The size of version 1's table.
        expected: u32,
    },
    /// Its table is malformed (no table, a bad name, a missing function).
    #[error("{origin}'s filter table is unusable: {detail}")]
    Table {
        /// The plug-in.
        origin: String,
        /// What is wrong.
        detail: String,
    },
    /// The sealed memory file for its bytes could not be made.
    #[error("cannot put the plug-in {origin} in a sealed memory file while {what}: {source}")]
    MemFile {
        /// The plug-in.
        origin: String,
        /// The step that failed.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
}

/// ELF machine numbers (`e_machine`) and names of the architectures Rust targets here.
const MACHINES: &[(u16, &str)] = &[
    (3, "x86"),
    (8, "mips"),
    (20, "powerpc"),
    (21, "powerpc64"),
    (22, "s390x"),
    (40, "arm"),
    (62, "x86_64"),
    (183, "aarch64"),
    (243, "riscv"),
    (258, "loongarch"),
];

/// This process's ELF machine number.
const HOST_MACHINE: u16 = if cfg!(target_arch = "x86_64") {
    62
} else if cfg!(target_arch = "aarch64") {
    183
} else if cfg!(target_arch = "x86") {
    3
} else if cfg!(target_arch = "arm") {
    40
} else if cfg!(any(target_arch = "riscv64", target_arch = "riscv32")) {
    243
} else if cfg!(target_arch = "powerpc64") {
    21
} else if cfg!(target_arch = "powerpc") {
    20
} else if cfg!(target_arch = "s390x") {
    22
} else if cfg!(target_arch = "loongarch64") {
    258
} else if cfg!(any(target_arch = "mips", target_arch = "mips64")) {
    8
} else {
    0
};

fn machine_name(machine: u16) -> &'static str {
    MACHINES.iter().find(|(m, _)| *m == machine).map_or("an unknown architecture", |(_, n)| n)
}

/// Checks the ELF header at the start of a plug-in: a shared object of this
/// process's class, byte order and architecture. `origin` names it in errors.
///
/// # Errors
/// [`PluginError::NotShared`] or [`PluginError::Machine`], saying what differs.
pub fn check_elf(head: &[u8], origin: &str) -> Result<(), PluginError> {
    let not = |detail: String| PluginError::NotShared { origin: origin.to_owned(), detail };
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return Err(not("it does not start with an ELF header".into()));
    }
    let class = if cfg!(target_pointer_width = "64") { 2 } else { 1 };
    if head[4] != class {
        let bits = |c: u8| if c == 2 { "64-bit" } else { "32-bit" };
        return Err(not(format!("it is {} but this node is {}", bits(head[4]), bits(class))));
    }
    let little = cfg!(target_endian = "little");
    if head[5] != if little { 1 } else { 2 } {
        return Err(not("its byte order is not this node's".into()));
    }
    let half = |at: usize| {
        let b = [head[at], head[at + 1]];
        if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    let machine = half(18);
    if machine != HOST_MACHINE {
        return Err(PluginError::Machine {
            origin: origin.to_owned(),
            found: machine,
            found_name: machine_name(machine),
            expected: HOST_MACHINE,
            expected_name: machine_name(HOST_MACHINE),
        });
    }
    let kind = half(16);
    if kind != 3 {
        return Err(not(format!("its ELF type is {kind}, not a shared object (3)")));
    }
    Ok(())
}

/// The validated functions of a table.
struct Functions {
    create: abi::CreateFn,
    reduce: abi::ReduceFn,
    get_state: abi::GetStateFn,
    set_params: abi::SetParamsFn,
    destroy: abi::DestroyFn,
    /// Absent from tables built before the entry was added, or left null.
    adopt_state: Option<abi::AdoptStateFn>,
}

struct Inner {
    name: String,
    version: u16,
    origin: String,
    fns: Functions,
}

/// A loaded plug-in filter. Cheap to clone; never unloaded.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.inner.name)
            .field("version", &self.inner.version)
            .field("origin", &self.inner.origin)
            .finish()
    }
}

// `memfd_create` and `fcntl` from the C library every Rust program on Linux links;
// declared here so this crate (below the protocol core) needs no libc crate.
extern "C" {
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
}
const MFD_CLOEXEC: c_uint = 1;
const MFD_ALLOW_SEALING: c_uint = 2;
const F_ADD_SEALS: c_int = 1033;
const F_SEAL_SEAL: c_int = 1;
const F_SEAL_SHRINK: c_int = 2;
const F_SEAL_GROW: c_int = 4;
const F_SEAL_WRITE: c_int = 8;

impl Plugin {
    /// Loads the plug-in at `path`.
    ///
    /// # Errors
    /// An unreadable file, a header for another architecture, a loader failure, no
    /// entry point, or a table of an unknown version or size.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin, PluginError> {
        let path = path.as_ref();
        let read = |source| PluginError::Read { path: path.to_owned(), source };
        let mut head = Vec::with_capacity(64);
        std::fs::File::open(path).map_err(read)?.take(64).read_to_end(&mut head).map_err(read)?;
        let origin = path.display().to_string();
        check_elf(&head, &origin)?;
        // Relative paths would be looked up in the loader's search path, not here.
        let full = if path.is_absolute() { path.to_owned() } else { Path::new(".").join(path) };
        Plugin::open(&full, origin)
    }

    /// Loads a plug-in from its bytes (`label` names it in errors): they go to a
    /// sealed memory file that is loaded as `/proc/self/fd/N`, so nothing touches a
    /// file system.
    ///
    /// # Errors
    /// As [`Plugin::load`], or the memory file could not be made.
    pub fn load_bytes(bytes: &[u8], label: &str) -> Result<Plugin, PluginError> {
        check_elf(bytes, label)?;
        let mem = |what, source| PluginError::MemFile { origin: label.to_owned(), what, source };
        let name = c"treecast-filter";
        // SAFETY: a NUL-terminated name and valid flags; the call only returns a new fd.
        let fd = unsafe { memfd_create(name.as_ptr(), MFD_CLOEXEC | MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(mem("creating it", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and nothing else owns it; the File closes it.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.write_all(bytes).map_err(|e| mem("writing it", e))?;
        let seals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
        // SAFETY: F_ADD_SEALS takes one int argument; `file` keeps the fd open.
        if unsafe { fcntl(file.as_raw_fd(), F_ADD_SEALS, seals) } < 0 {
            return Err(mem("sealing it", std::io::Error::last_os_error()));
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let plugin = Plugin::open(&path, label.to_owned());
        // Once loaded (even if its table is then refused), the descriptor stays open for
        // the life of the process, as the library does: the dynamic loader knows a
        // library by its path, and a closed descriptor's number, reused for the next
        // plug-in's memory file, would hand back this one.
        if !matches!(plugin, Err(PluginError::Open { .. })) {
            let _ = file.into_raw_fd();
        }
        plugin
    }

    fn open(path: &Path, origin: String) -> Result<Plugin, PluginError> {
        // SAFETY: loading a shared object runs its initializers: that is what loading
        // a plug-in means, and the user chose it; its header was checked to be a shared
        // object for this architecture first.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| PluginError::Open { origin: origin.clone(), detail: e.to_string() })?;
        // SAFETY: the ABI defines the symbol as `const treecast_filter_v1 *(void)`,
        // which `EntryFn` is.
        let entry = unsafe { library.get::<abi::EntryFn>(abi::SYMBOL.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|e| PluginError::Symbol {
                origin: origin.clone(),
                symbol: abi::SYMBOL,
                detail: e.to_string(),
            })?;
        // Never unloaded: the table and every instance point into its code.
        std::mem::forget(library);
        let table = entry();
        // SAFETY: `table` is what the plug-in's entry point returned, its static table.
        unsafe { Plugin::from_table(table, origin) }
    }

    /// A plug-in from its table (what its entry point returns), checked: the version
    /// and size first, then the name and every function.
    ///
    /// # Safety
    /// `table` is null or points to a table that stays valid for the life of the
    /// process (a static of a loaded, never unloaded plug-in, or of this program),
    /// whose first two fields are `u32`s, and whose functions follow the ABI.
    ///
    /// # Errors
    /// A null table, an unknown version or size, a bad name, a missing function.
    pub unsafe fn from_table(table: *const abi::FilterTable, origin: String) -> Result<Plugin, PluginError> {
        let bad = |detail: &str| PluginError::Table { origin: origin.clone(), detail: detail.to_owned() };
        if table.is_null() {
            return Err(bad("the entry point returned no table"));
        }
        // SAFETY: every version's table starts with its version and size (two u32s),
        // so this reads only what any table has, before its layout is known.
        let head = unsafe { table.cast::<abi::TableHead>().read_unaligned() };
        if head.abi_version != abi::ABI_VERSION {
            return Err(PluginError::AbiVersion { origin, found: head.abi_version, known: abi::ABI_VERSION });
        }
        let expected = std::mem::size_of::<abi::FilterTable>() as u32;
        if head.size != expected && head.size != abi::BASE_TABLE_SIZE {
            return Err(PluginError::TableSize { origin, found: head.size, expected });
        }
        // SAFETY: the version and size are version 1's: its fields up to `destroy` are
        // there in both sizes, and only those are read through `t` below; the caller
        // guarantees the table lives for the process.
        let t: &'static abi::FilterTable = unsafe { &*table };
        if t.name.is_null() {
            return Err(bad("it has no name"));
        }
        // SAFETY: a non-null name is a NUL-terminated string in the plug-in's static data.
        let name = unsafe { CStr::from_ptr(t.name) }.to_str().map_err(|_| bad("its name is not UTF-8"))?;
        if name.is_empty() || name.len() > MAX_FILTER_NAME {
            return Err(bad(&format!(
                "its name is {} bytes long; names have 1 to {MAX_FILTER_NAME}",
                name.len()
            )));
        }
        let missing = |f: &str| bad(&format!("it has no {f} function"));
        let fns = Functions {
            create: t.create.ok_or_else(|| missing("create"))?,
            reduce: t.reduce.ok_or_else(|| missing("reduce"))?,
            get_state: t.get_state.ok_or_else(|| missing("get_state"))?,
            set_params: t.set_params.ok_or_else(|| missing("set_params"))?,
            destroy: t.destroy.ok_or_else(|| missing("destroy"))?,
            // Only a table of the full size has the field (a null one is no entry).
            adopt_state: if head.size == expected {
                // SAFETY: the table is of the full size, so the field is within it.
                unsafe { std::ptr::addr_of!((*table).adopt_state).read_unaligned() }
            } else {
                None
            },
        };
        let inner = Inner { name: name.to_owned(), version: t.version, origin, fns };
        Ok(Plugin { inner: Arc::new(inner) })
    }

    /// The filter's name, as streams ask for it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The filter's version.
    pub fn version(&self) -> u16 {
        self.inner.version
    }

    /// Where it came from (its path, or the label of its bytes).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// Registers the filter in `registry` under its name and version (replacing a
    /// filter of the same name).
    pub fn register(&self, registry: &mut FilterRegistry) {
        let plugin = self.clone();
        let version = self.inner.version;
        registry.register_placed(&self.inner.name, version..=version, move |params, place| {
            plugin.instance(params, place).map(|t| Box::new(t) as Box<dyn Transform>)
        });
    }

    /// A fresh instance for one stream on one node.
    ///
    /// # Errors
    /// The filter's refusal (of its parameters, usually), with its code.
    pub fn instance(&self, params: &[u8], place: &FilterPlace) -> Result<PluginTransform, String> {
        let place = raw_place(place);
        let mut state: *mut c_void = std::ptr::null_mut();
        let mut err = ErrBuf::new();
        // SAFETY: every pointer is valid for the call: params, the place, the state
        // slot and the error buffer with its length.
        let code = unsafe {
            (self.inner.fns.create)(params.as_ptr(), params.len(), &place, &mut state, err.ptr(), err.len())
        };
        if code != abi::OK {
            return Err(format!("{} (code {code}, plug-in {})", err.message(), self.inner.origin));
        }
        Ok(PluginTransform { plugin: self.inner.clone(), state, place, down: Vec::new() })
    }
}

fn raw_place(place: &FilterPlace) -> abi::Place {
    abi::Place {
        stream: place.stream,
        rank: place.rank,
        role: match place.role {
            PlaceRole::FrontEnd => abi::ROLE_FRONT_END,
            PlaceRole::CommNode => abi::ROLE_COMM_NODE,
            PlaceRole::BackEnd => abi::ROLE_BACK_END,
        },
        children: place.children,
        depth: place.depth,
        leaves: place.leaves,
    }
}

/// The buffer a plug-in writes its error message into.
struct ErrBuf([c_char; 1024]);

impl ErrBuf {
    fn new() -> ErrBuf {
        ErrBuf([0; 1024])
    }
    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    /// What the plug-in wrote, even if it forgot the NUL or wrote bad UTF-8.
    fn message(&self) -> String {
        let bytes: Vec<u8> = self.0.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
        match String::from_utf8_lossy(&bytes).trim() {
            "" => "no message".to_owned(),
            m => m.to_owned(),
        }
    }
}

/// What the host collects during one call (the ABI's opaque `treecast_sink`).
struct Sink {
    stream: u32,
    rank: u32,
    up: Vec<Frame>,
    down: Vec<Frame>,
    state: Option<Vec<u8>>,
    taking_state: bool,
    refused: Option<String>,
}

impl Sink {
    fn new(stream: u32, rank: u32, taking_state: bool) -> Sink {
        Sink { stream, rank, up: Vec::new(), down: Vec::new(), state: None, taking_state, refused: None }
    }
}

/// `treecast_host.emit`.
unsafe extern "C" fn emit(
    sink: *mut abi::Sink,
    direction: u32,
    tag: i32,
    payload: *const u8,
    len: usize,
) -> i32 {
    // Nothing below panics, but no unwinding may cross into the plug-in's frames.
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `sink` is the `Sink` this module passed to the call the plug-in is
        // in; the plug-in hands it back unchanged and only during that call.
        let Some(sink) = (unsafe { sink.cast::<Sink>().as_mut() }) else { return -1 };
        let bytes: &[u8] = if payload.is_null() || len == 0 {
            &[]
        } else {
            // SAFETY: the ABI: `len` readable bytes at `payload` for the call.
            unsafe { std::slice::from_raw_parts(payload, len) }
        };
        let mut refuse = |why: String| {
            sink.refused.get_or_insert(why);
            -1
        };
        match direction {
            abi::UP | abi::DOWN if sink.taking_state => refuse("get_state may emit only its state".into()),
            abi::STATE if !sink.taking_state => refuse("only get_state may emit a state".into()),
            abi::UP | abi::DOWN => match decode_values(bytes) {
                Ok(_) if direction == abi::UP => {
                    let header = FrameHeader::data(sink.stream, tag, sink.rank);
                    sink.up.push(Frame::new(header, Bytes::copy_from_slice(bytes)));
                    abi::OK
                }
                Ok(_) => {
                    // Down, as from the front-end's tool: no source rank.
                    let header = FrameHeader::data(sink.stream, tag, u32::MAX);
                    sink.down.push(Frame::new(header, Bytes::copy_from_slice(bytes)));
                    abi::OK
                }
                Err(e) => refuse(format!("an emitted packet is not typed values: {e}")),
            },
            abi::STATE => {
                sink.state = Some(bytes.to_vec());
                abi::OK
            }
            other => refuse(format!("unknown direction {other}")),
        }
    }))
    .unwrap_or(-1)
}

static HOST: abi::Host = abi::Host { size: std::mem::size_of::<abi::Host>() as u32, emit };

/// One instance of a plug-in filter, for one stream on one node.
pub struct PluginTransform {
    plugin: Arc<Inner>,
    state: *mut c_void,
    place: abi::Place,
    /// What the last wave sent down, until the node takes it.
    down: Vec<Frame>,
}

// SAFETY: the ABI lets the host call an instance from any thread as long as it is
// one call at a time, which `&mut self` on every call guarantees.
unsafe impl Send for PluginTransform {}

impl std::fmt::Debug for PluginTransform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginTransform")
            .field("filter", &self.plugin.name)
            .field("place", &self.place)
            .finish()
    }
}

impl PluginTransform {
    fn error(&self, stream: u32, rank: Option<u32>, code: i32, message: String) -> FilterError {
        FilterError::Plugin { filter: self.plugin.name.clone(), stream, rank, code, message }
    }
}

impl Transform for PluginTransform {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply_borrowed(&wave, ctx)
    }

    fn apply_borrowed(&mut self, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.down.clear();
        // Each distinct format once (a wave's packets mostly share one), read from
        // the payloads without decoding their values.
        let mut formats: Vec<(Format, CString)> = Vec::new();
        let mut format_of = Vec::with_capacity(wave.len());
        for f in wave {
            let format = decode_format(&f.payload).map_err(|e| {
                let message = format!("the packet does not decode as typed values: {e}");
                self.error(ctx.stream, Some(f.header.rank), abi::ERR_PACKET, message)
            })?;
            let at = match formats.iter().position(|(known, _)| *known == format) {
                Some(at) => at,
                None => {
                    // A canonical format string has no NUL byte.
                    let text = CString::new(format.to_string()).unwrap_or_default();
                    formats.push((format, text));
                    formats.len() - 1
                }
            };
            format_of.push(at);
        }
        let packets: Vec<abi::Packet> = wave
            .iter()
            .zip(&format_of)
            .map(|(f, &at)| abi::Packet {
                tag: f.header.tag,
                rank: f.header.rank,
                format: formats[at].1.as_ptr(),
                payload: f.payload.as_ptr(),
                payload_len: f.payload.len(),
            })
            .collect();
        let lowest = wave.iter().map(|f| f.header.rank).min().unwrap_or(0);
        let mut sink = Sink::new(ctx.stream, lowest, false);
        let mut bad_rank = u32::MAX;
        let mut err = ErrBuf::new();
        let mut place = self.place;
        place.stream = ctx.stream;
        // SAFETY: `state` is this instance's, called once at a time (`&mut self`);
        // the packets, their formats and payloads, the sink and the buffers outlive
        // the call.
        let code = unsafe {
            (self.plugin.fns.reduce)(
                self.state,
                &place,
                packets.as_ptr(),
                packets.len(),
                &HOST,
                (&mut sink as *mut Sink).cast::<abi::Sink>(),
                &mut bad_rank,
                err.ptr(),
                err.len(),
            )
        };
        if code != abi::OK {
            let rank = (code == abi::ERR_PACKET && wave.iter().any(|f| f.header.rank == bad_rank))
                .then_some(bad_rank);
            let mut message = err.message();
            if let Some(why) = sink.refused {
                message = format!("{message} (the node refused what it emitted: {why})");
            }
            return Err(self.error(ctx.stream, rank, code, message));
        }
        if let Some(why) = sink.refused {
            return Err(self.error(
                ctx.stream,
                None,
                abi::ERR_FILTER,
                format!("it emitted what the node refused: {why}"),
            ));
        }
        self.down = sink.down;
        Ok(sink.up)
    }

    fn state(&mut self) -> Result<Option<Vec<u8>>, FilterError> {
        let mut sink = Sink::new(self.place.stream, 0, true);
        let mut err = ErrBuf::new();
        // SAFETY: as in `apply`.
        let code = unsafe {
            (self.plugin.fns.get_state)(
                self.state,
                &HOST,
                (&mut sink as *mut Sink).cast::<abi::Sink>(),
                err.ptr(),
                err.len(),
            )
        };
        match (code, sink.refused) {
            (abi::OK, None) => Ok(sink.state),
            (code, why) => {
                let message = match why {
                    Some(why) => format!("{} (the node refused: {why})", err.message()),
                    None => err.message(),
                };
                Err(self.error(self.place.stream, None, code, message))
            }
        }
    }

    fn adopt_state(&mut self, state: &[u8]) -> Result<(), String> {
        let Some(adopt) = self.plugin.fns.adopt_state else {
            return Err(format!(
                "cannot take over a lost instance's state: plug-in {} has no adopt_state",
                self.plugin.origin
            ));
        };
        let mut err = ErrBuf::new();
        // SAFETY: as in `apply`; the state bytes outlive the call.
        let code = unsafe { adopt(self.state, state.as_ptr(), state.len(), err.ptr(), err.len()) };
        match code {
            abi::OK => Ok(()),
            code => Err(format!("{} (code {code})", err.message())),
        }
    }

    fn take_down(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.down)
    }

    fn set_params(&mut self, params: &[u8]) -> Result<(), String> {
        let mut err = ErrBuf::new();
        // SAFETY: as in `apply`; the parameters outlive the call.
        let code = unsafe {
            (self.plugin.fns.set_params)(self.state, params.as_ptr(), params.len(), err.ptr(), err.len())
        };
        match code {
            abi::OK => Ok(()),
            code => Err(format!("{} (code {code})", err.message())),
        }
    }
}

impl Drop for PluginTransform {
    fn drop(&mut self) {
        // SAFETY: the instance's state, destroyed once, here; no call is in progress.
        unsafe { (self.plugin.fns.destroy)(self.state) };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use treecast_filter::{Error, Filter, Output, Packet, Place, Value};
    use treecast_wire::{encode_values, FilterSpec};

    use super::*;
    use treecast_filters::apply_dropping_bad;

    fn frame(rank: u32, values: &[Value]) -> Frame {
        let mut payload = Vec::new();
        encode_values(values, &mut payload);
        Frame::new(FrameHeader::data(7, 42, rank), payload)
    }

    fn values(f: &Frame) -> Vec<Value> {
        decode_values(&f.payload).unwrap()
    }

    fn params(values: &[Value]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_values(values, &mut out);
        out
    }

    const CTX: FilterContext = FilterContext { stream: 7, is_root: false };

    /// The C histogram example, compiled with the system's `cc` into a fresh folder.
    fn histogram_so() -> PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::temp_dir().join(format!(
            "treecast-plugin-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("libhistogram.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I"])
            .arg(root.join("include"))
            .arg("-o")
            .arg(&out)
            .arg(root.join("examples/filters/histogram.c"))
            .status()
            .expect("a C compiler (`cc`) to build the example plug-in");
        assert!(status.success(), "cc failed on examples/filters/histogram.c");
        out
    }

    #[test]
    fn a_c_plugin_loaded_by_path_merges_histograms_and_keeps_state_across_waves() {
        let so = histogram_so();
        let plugin = Plugin::load(&so).unwrap();
        // Loaded: the code stays mapped without the file.
        std::fs::remove_dir_all(so.parent().unwrap()).unwrap();
        assert_eq!((plugin.name(), plugin.version()), ("histogram", 1));
        let mut registry = FilterRegistry::builtin();
        plugin.register(&mut registry);
        let mut spec = FilterSpec::new("histogram", 1);
        spec.params = params(&[Value::UInt(3)]);
        let mut h = registry.make(&spec).unwrap();
        for wave in 1..=3u64 {
            let wave_in = vec![
                frame(4, &[Value::ULongArray(vec![1, 2, wave])]),
                frame(2, &[Value::ULongArray(vec![10, 0, 1])]),
            ];
            let out = h.apply(wave_in, &CTX).unwrap();
            assert_eq!(out.len(), 1);
            assert_eq!(values(&out[0]), vec![Value::ULongArray(vec![11, 2, wave + 1])]);
            assert_eq!((out[0].header.stream, out[0].header.tag, out[0].header.rank), (7, 42, 2));
        }
        // The state is the number of waves this instance merged.
        let state = h.state().unwrap().unwrap();
        assert_eq!(decode_values(&state).unwrap(), vec![Value::ULong(3)]);
        // A second stream's instance starts afresh.
        let mut other = registry.make(&spec).unwrap();
        assert_eq!(decode_values(&other.state().unwrap().unwrap()).unwrap(), vec![Value::ULong(0)]);
        // New parameters between waves.
        other.set_params(&params(&[Value::UInt(2)])).unwrap();
        let out = other.apply(vec![frame(1, &[Value::ULongArray(vec![5, 6])])], &CTX).unwrap();
        assert_eq!(values(&out[0]), vec![Value::ULongArray(vec![5, 6])]);
        let err = other.set_params(&params(&[Value::Str("x".into())])).unwrap_err();
        assert!(err.contains("number of bins"), "{err}");
    }

    #[test]
    fn a_c_plugin_refuses_bad_parameters_and_names_the_packet_at_fault() {
        let so = histogram_so();
        let plugin = Plugin::load(&so).unwrap();
        std::fs::remove_dir_all(so.parent().unwrap()).unwrap();
        let mut registry = FilterRegistry::default();
        plugin.register(&mut registry);
        let err = registry.make(&FilterSpec::new("histogram", 1)).err().unwrap().to_string();
        assert!(
            err.contains("histogram") && err.contains("number of bins") && err.contains("code 3"),
            "{err}"
        );
        let mut spec = FilterSpec::new("histogram", 1);
        spec.params = params(&[Value::UInt(2)]);
        let mut h = registry.make(&spec).unwrap();
        let wave = vec![
            frame(0, &[Value::ULongArray(vec![1, 1])]),
            frame(1, &[Value::ULongArray(vec![1, 1, 1])]),
            frame(2, &[Value::ULongArray(vec![2, 2])]),
        ];
        let (out, errors) = apply_dropping_bad(h.as_mut(), wave, &CTX);
        assert_eq!(values(&out[0]), vec![Value::ULongArray(vec![3, 3])]);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].rank(), Some(1));
        let text = errors[0].to_string();
        assert!(text.contains("histogram") && text.contains("rank 1") && text.contains("%auld"), "{text}");
    }

    #[test]
    fn a_plugin_loaded_from_its_bytes_runs_from_a_sealed_memory_file() {
        let so = histogram_so();
        let bytes = std::fs::read(&so).unwrap();
        std::fs::remove_dir_all(so.parent().unwrap()).unwrap();
        let plugin = Plugin::load_bytes(&bytes, "histogram from the front-end").unwrap();
        let mut h = plugin.instance(&params(&[Value::UInt(1)]), &FilterPlace::default()).unwrap();
        let out = h
            .apply(
                vec![frame(0, &[Value::ULongArray(vec![4])]), frame(1, &[Value::ULongArray(vec![5])])],
                &CTX,
            )
            .unwrap();
        assert_eq!(values(&out[0]), vec![Value::ULongArray(vec![9])]);
    }

    #[test]
    fn a_shared_object_without_the_entry_point_is_refused_naming_the_symbol() {
        let dir = std::env::temp_dir().join(format!("treecast-nosym-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, so) = (dir.join("other.c"), dir.join("libother.so"));
        std::fs::write(&src, "int treecast_filter_v2(void) { return 0; }\n").unwrap();
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .status()
            .expect("a C compiler (`cc`)");
        assert!(status.success());
        let err = Plugin::load(&so).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, PluginError::Symbol { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("libother.so") && text.contains("treecast_filter_v1"), "{text}");
    }

    #[test]
    fn two_plugins_loaded_from_bytes_in_one_process_stay_two() {
        let so = histogram_so();
        let first = std::fs::read(&so).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let other = so.with_file_name("libsum.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-I"])
            .arg(root.join("include"))
            .arg("-o")
            .arg(&other)
            .arg(root.join("examples/filters/sum.c"))
            .status()
            .unwrap();
        assert!(status.success());
        let second = std::fs::read(&other).unwrap();
        std::fs::remove_dir_all(so.parent().unwrap()).unwrap();
        let a = Plugin::load_bytes(&first, "libhistogram.so").unwrap();
        let b = Plugin::load_bytes(&second, "libsum.so").unwrap();
        assert_eq!((a.name(), b.name()), ("histogram", "plugin_sum"));
    }

    #[test]
    fn a_plugin_refused_once_loaded_does_not_stand_in_for_the_next_one() {
        let so = histogram_so();
        let good = std::fs::read(&so).unwrap();
        let src = so.with_file_name("tableless.c");
        std::fs::write(&src, "const void *treecast_filter_v1(void) { return 0; }\n").unwrap();
        let bad = so.with_file_name("libtableless.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&bad)
            .arg(&src)
            .status()
            .unwrap();
        assert!(status.success());
        let bad = std::fs::read(&bad).unwrap();
        std::fs::remove_dir_all(so.parent().unwrap()).unwrap();
        let err = Plugin::load_bytes(&bad, "libtableless.so").unwrap_err().to_string();
        assert!(err.contains("no table"), "{err}");
        // Its memory file's number, reused, handed back the refused library.
        let next = Plugin::load_bytes(&good, "libhistogram.so").unwrap();
        assert_eq!(next.name(), "histogram");
    }

    /// A header for `machine`, as a shared object of this process's class and byte order.
    fn elf_header(machine: u16, kind: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = if cfg!(target_pointer_width = "64") { 2 } else { 1 };
        h[5] = 1;
        h[6] = 1;
        h[16..18].copy_from_slice(&kind.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn a_shared_object_for_another_architecture_is_refused_before_loading() {
        let other = if HOST_MACHINE == 183 { 62 } else { 183 };
        let err = Plugin::load_bytes(&elf_header(other, 3), "filter.so").unwrap_err();
        assert!(matches!(err, PluginError::Machine { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("filter.so")
                && text.contains(machine_name(other))
                && text.contains(machine_name(HOST_MACHINE)),
            "{text}"
        );
        let so = std::env::temp_dir().join(format!("treecast-foreign-{}.so", std::process::id()));
        std::fs::write(&so, elf_header(other, 3)).unwrap();
        let text = Plugin::load(&so).unwrap_err().to_string();
        std::fs::remove_file(&so).unwrap();
        assert!(text.contains("built for"), "{text}");
        let text = check_elf(&elf_header(HOST_MACHINE, 2), "prog").unwrap_err().to_string();
        assert!(text.contains("not a shared object"), "{text}");
        let text = check_elf(b"#!/bin/sh\n", "script.so").unwrap_err().to_string();
        assert!(text.contains("script.so") && text.contains("ELF header"), "{text}");
        let text = Plugin::load("/nonexistent/filter.so").unwrap_err().to_string();
        assert!(text.contains("/nonexistent/filter.so"), "{text}");
    }

    /// A Rust filter made through `treecast-filter`, loaded from its table.
    struct Tricky {
        calls: u32,
    }

    impl Filter for Tricky {
        fn create(params: &[Value], place: &Place) -> Result<Self, Error> {
            match params {
                [] => Ok(Tricky { calls: place.children }),
                _ => Err(Error::params("takes no parameters")),
            }
        }

        fn reduce(&mut self, wave: &[Packet<'_>], place: &Place, out: &mut Output<'_>) -> Result<(), Error> {
            self.calls += 1;
            match wave.first().map(|p| p.tag) {
                Some(1) => panic!("tag 1 is not handled"),
                Some(2) => Err(Error::new("this wave is refused")),
                Some(3) => out.down(3, &[]),
                _ => out.up(
                    0,
                    &[Value::UInt(self.calls), Value::UInt(place.leaves), Value::Str(wave[0].format.into())],
                ),
            }
        }
    }

    static TRICKY: abi::FilterTable = treecast_filter::table::<Tricky>(c"tricky", 4);

    fn tricky() -> Plugin {
        // SAFETY: a static table of this program, built by `treecast_filter::table`.
        unsafe { Plugin::from_table(&TRICKY, "tricky (in this test)".into()) }.unwrap()
    }

    /// Sends up the format string of every packet of the wave, in order.
    struct Formats;

    impl Filter for Formats {
        fn create(_params: &[Value], _place: &Place) -> Result<Self, Error> {
            Ok(Formats)
        }

        fn reduce(&mut self, wave: &[Packet<'_>], _place: &Place, out: &mut Output<'_>) -> Result<(), Error> {
            out.up(0, &[Value::StrArray(wave.iter().map(|p| p.format.to_owned()).collect())])
        }
    }

    static FORMATS: abi::FilterTable = treecast_filter::table::<Formats>(c"formats", 4);

    #[test]
    fn each_packet_of_a_wave_of_mixed_formats_is_given_its_own_format_string() {
        // SAFETY: a static table of this program, built by `treecast_filter::table`.
        let plugin = unsafe { Plugin::from_table(&FORMATS, "formats (in this test)".into()) }.unwrap();
        let place =
            FilterPlace { stream: 7, rank: 0, role: PlaceRole::CommNode, children: 4, depth: 1, leaves: 4 };
        let mut t = plugin.instance(&[], &place).unwrap();
        let wave = vec![
            frame(0, &[Value::Int(1)]),
            frame(1, &[Value::Str("a".into()), Value::DoubleArray(vec![1.0])]),
            frame(2, &[Value::Int(2)]),
            frame(3, &[]),
        ];
        let out = t.apply(wave, &CTX).unwrap();
        let expected = ["%d", "%s %alf", "%d", ""].map(String::from).to_vec();
        assert_eq!(values(&out[0]), vec![Value::StrArray(expected)]);
    }

    fn tagged(tag: i32) -> Vec<Frame> {
        let mut f = frame(3, &[Value::Int(1), Value::UIntArray(vec![1])]);
        f.header.tag = tag;
        vec![f]
    }

    #[test]
    fn a_rust_filter_is_told_its_place_and_its_panics_and_errors_come_back_as_errors() {
        let place =
            FilterPlace { stream: 7, rank: 5, role: PlaceRole::CommNode, children: 10, depth: 1, leaves: 4 };
        let mut t = tricky().instance(&[], &place).unwrap();
        let out = t.apply(tagged(0), &CTX).unwrap();
        assert_eq!(values(&out[0]), vec![Value::UInt(11), Value::UInt(4), Value::Str("%d %aud".into())]);
        let err = t.apply(tagged(1), &CTX).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tricky") && text.contains("panicked") && text.contains("tag 1 is not handled"),
            "{text}"
        );
        assert_eq!(err.rank(), None);
        let text = t.apply(tagged(2), &CTX).unwrap_err().to_string();
        assert!(text.contains("this wave is refused") && text.contains("code 1"), "{text}");
        // Packets down wait for the node to take them, with no source rank.
        assert!(t.apply(tagged(3), &CTX).unwrap().is_empty());
        let down = t.take_down();
        assert_eq!(down.len(), 1);
        assert_eq!((down[0].header.stream, down[0].header.tag, down[0].header.rank), (7, 3, u32::MAX));
        assert!(t.take_down().is_empty());
        // It still works after a panic, with its state intact.
        let out = t.apply(tagged(0), &CTX).unwrap();
        assert_eq!(values(&out[0])[0], Value::UInt(15));
        assert_eq!(t.state().unwrap(), None);
        assert!(t.set_params(&[]).unwrap_err().contains("no parameters"));
        let err = tricky().instance(&params(&[Value::Int(1)]), &place).unwrap_err();
        assert!(err.contains("takes no parameters"), "{err}");
    }

    #[test]
    fn a_table_of_another_abi_version_or_size_is_refused_by_name() {
        static NEWER: abi::FilterTable =
            abi::FilterTable { abi_version: 2, ..treecast_filter::table::<Tricky>(c"tricky", 1) };
        // SAFETY: a static table of this program.
        let err = unsafe { Plugin::from_table(&NEWER, "newer.so".into()) }.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, PluginError::AbiVersion { found: 2, .. }), "{err:?}");
        assert!(
            text.contains("newer.so") && text.contains("version 2") && text.contains("version 1"),
            "{text}"
        );
        static BIGGER: abi::FilterTable =
            abi::FilterTable { size: 4096, ..treecast_filter::table::<Tricky>(c"tricky", 1) };
        // SAFETY: as above.
        let err = unsafe { Plugin::from_table(&BIGGER, "bigger.so".into()) }.unwrap_err();
        assert!(matches!(err, PluginError::TableSize { found: 4096, .. }), "{err:?}");
        static NAMELESS: abi::FilterTable =
            abi::FilterTable { name: std::ptr::null(), ..treecast_filter::table::<Tricky>(c"tricky", 1) };
        // SAFETY: as above.
        let text = unsafe { Plugin::from_table(&NAMELESS, "nameless.so".into()) }.unwrap_err().to_string();
        assert!(text.contains("no name"), "{text}");
        // SAFETY: null is allowed.
        let text = unsafe { Plugin::from_table(std::ptr::null(), "null.so".into()) }.unwrap_err().to_string();
        assert!(text.contains("no table"), "{text}");
    }

    /// Adds up `%ld` packets; its state is the total, which it can take over.
    struct Total(i64);

    impl Filter for Total {
        fn create(_params: &[Value], _place: &Place) -> Result<Self, Error> {
            Ok(Total(0))
        }

        fn reduce(&mut self, wave: &[Packet<'_>], _place: &Place, out: &mut Output<'_>) -> Result<(), Error> {
            for p in wave {
                if let [Value::Long(v)] = p.values()?.as_slice() {
                    self.0 += v;
                }
            }
            out.up(0, &[Value::Long(self.0)])
        }

        fn state(&self) -> Option<Vec<Value>> {
            Some(vec![Value::Long(self.0)])
        }

        fn adopt_state(&mut self, state: &[Value]) -> Result<(), Error> {
            match state {
                [Value::Long(v)] => {
                    self.0 += v;
                    Ok(())
                }
                other => Err(Error::new(format!("a total is one %ld, got {} values", other.len()))),
            }
        }
    }

    #[test]
    fn a_lost_instances_state_is_taken_over_and_a_table_without_the_entry_still_loads() {
        static TOTAL: abi::FilterTable = treecast_filter::table::<Total>(c"total", 1);
        // SAFETY: a static table of this program.
        let total = unsafe { Plugin::from_table(&TOTAL, "total.so".into()) }.unwrap();
        let place = FilterPlace::default();
        let mut lost = total.instance(&[], &place).unwrap();
        lost.apply(vec![frame(1, &[Value::Long(5)]), frame(2, &[Value::Long(7)])], &CTX).unwrap();
        let state = lost.state().unwrap().unwrap();
        let mut heir = total.instance(&[], &place).unwrap();
        heir.adopt_state(&state).unwrap();
        let out = heir.apply(vec![frame(3, &[Value::Long(1)])], &CTX).unwrap();
        assert_eq!(values(&out[0]), vec![Value::Long(13)]);
        let err = heir.adopt_state(&params(&[Value::Str("x".into())])).unwrap_err();
        assert!(err.contains("one %ld"), "{err}");
        // A table built before adopt_state existed is shorter: it loads, and refuses states.
        static OLDER: abi::FilterTable =
            abi::FilterTable { size: abi::BASE_TABLE_SIZE, ..treecast_filter::table::<Total>(c"total", 1) };
        // SAFETY: a static table of this program (longer than it says, which is allowed).
        let older = unsafe { Plugin::from_table(&OLDER, "older.so".into()) }.unwrap();
        let err = older.instance(&[], &place).unwrap().adopt_state(&state).unwrap_err();
        assert!(err.contains("older.so") && err.contains("no adopt_state"), "{err}");
        // A filter that does not implement it refuses in its own words.
        let err = tricky().instance(&[], &place).unwrap().adopt_state(&state).unwrap_err();
        assert!(err.contains("cannot take over"), "{err}");
    }
}
