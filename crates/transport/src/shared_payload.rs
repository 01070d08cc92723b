//! Large payloads between processes of one host, passed as sealed memory files over
//! a Unix link instead of being copied through the socket.
//!
//! The sender writes the payload once into a `memfd` and seals it against writes and
//! resizing; the descriptor travels in `SCM_RIGHTS` beside the frame's header, which
//! carries [`FLAG_PAYLOAD_FD`](treecast_wire::FLAG_PAYLOAD_FD) and no payload bytes.
//! The receiver maps the file read-only: the payload is a [`Bytes`] over that
//! mapping. A comm node that passes such a payload on to another Unix link sends the
//! same descriptor again, so the bytes are never copied on the way through
//! (docs/processes.md, "Large messages within a host").
//!
//! The seals are what make this safe: a peer cannot shrink the file under our
//! mapping (which would raise `SIGBUS` on access) or change bytes we already read.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

/// Most descriptors one `sendmsg` carries, and one `recvmsg` takes.
pub(crate) const MAX_FDS_PER_MSG: usize = 32;

/// Seals a payload's file must have before it is mapped.
const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_WRITE;

/// The payloads mapped in this process, by the address of their first byte: the
/// length and the file, so that a payload passed on whole reuses its descriptor.
type Mapped = HashMap<usize, (usize, Arc<OwnedFd>)>;

fn mapped() -> &'static Mutex<Mapped> {
    static MAPPED: OnceLock<Mutex<Mapped>> = OnceLock::new();
    MAPPED.get_or_init(Mutex::default)
}

/// The file a payload received from a peer is mapped from, when `payload` is that
/// whole payload; `None` for any other bytes.
pub(crate) fn file_of(payload: &Bytes) -> Option<Arc<OwnedFd>> {
    let map = mapped().lock().ok()?;
    let (len, fd) = map.get(&(payload.as_ptr() as usize))?;
    (*len == payload.len()).then(|| fd.clone())
}

/// A sealed memory file holding `payload`: the payload's own file if it came as
/// one, else a new one (one copy).
///
/// # Errors
/// The kernel could not make, fill or seal the file (no `memfd` support, no memory).
pub(crate) fn file_for(payload: &Bytes) -> io::Result<Arc<OwnedFd>> {
    if let Some(fd) = file_of(payload) {
        return Ok(fd);
    }
    #[allow(unsafe_code)]
    // SAFETY: the name is a NUL-terminated string literal; memfd_create returns a new
    // descriptor this process owns, or -1.
    let raw = unsafe {
        libc::memfd_create(c"treecast-payload".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: `raw` is a valid descriptor nothing else owns (just created).
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    file.write_all(payload)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    #[allow(unsafe_code)]
    // SAFETY: F_ADD_SEALS takes an int argument; the descriptor is open (owned by `file`).
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Arc::new(OwnedFd::from(file)))
}

/// Maps the first `len` bytes of a payload file a peer sent, once it is sure the
/// file cannot shrink or change.
///
/// # Errors
/// The descriptor is not a memory file sealed against shrinking and writing, is
/// shorter than `len`, or cannot be mapped: the peer is not one of ours.
pub(crate) fn map(fd: OwnedFd, len: usize) -> Result<Bytes, String> {
    #[allow(unsafe_code)]
    // SAFETY: F_GET_SEALS takes no argument; the descriptor is open (owned by `fd`).
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & REQUIRED_SEALS != REQUIRED_SEALS {
        return Err("a payload came as a descriptor that is not a memory file sealed against change".into());
    }
    let size = File::from(fd.try_clone().map_err(|e| e.to_string())?)
        .metadata()
        .map_err(|e| format!("cannot read a payload file's size: {e}"))?
        .len();
    if size < len as u64 {
        return Err(format!("a payload file holds {size} bytes, its frame says {len}"));
    }
    if len == 0 {
        return Ok(Bytes::new());
    }
    #[allow(unsafe_code)]
    // SAFETY: a new read-only shared mapping of `len` bytes of an open file at offset
    // 0, at an address the kernel picks; it aliases no Rust memory.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if at == libc::MAP_FAILED {
        // Out of mappings (vm.max_map_count) or address space: read it instead.
        let mut payload = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&File::from(fd), &mut payload, 0)
            .map_err(|e| format!("cannot map or read a payload file: {e}"))?;
        return Ok(Bytes::from(payload));
    }
    let fd = Arc::new(fd);
    if let Ok(mut map) = mapped().lock() {
        map.insert(at as usize, (len, fd.clone()));
    }
    Ok(Bytes::from_owner(Mapping { at: at as usize, len, _file: fd }))
}

/// A read-only mapping of a sealed payload file, unmapped when the last [`Bytes`]
/// over it goes.
struct Mapping {
    at: usize,
    len: usize,
    _file: Arc<OwnedFd>,
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        #[allow(unsafe_code)]
        // SAFETY: `at` is the start of a live mapping of `len` readable bytes (unmapped
        // only in `drop`); the file is sealed against writes and shrinking, so the
        // bytes neither change nor vanish while the slice is borrowed.
        unsafe {
            std::slice::from_raw_parts(self.at as *const u8, self.len)
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Ok(mut map) = mapped().lock() {
            map.remove(&self.at);
        }
        #[allow(unsafe_code)]
        // SAFETY: the mapping was made by `map` with this address and length, and no
        // slice of it outlives `self` (every `Bytes` over it is gone).
        unsafe {
            libc::munmap(self.at as *mut libc::c_void, self.len);
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit, once: each
/// large payload on its way holds a descriptor until it is passed on or dropped,
/// and a receiver out of descriptors would lose its link.
pub(crate) fn raise_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        #[allow(unsafe_code)]
        // SAFETY: getrlimit and setrlimit read or write one rlimit through a pointer
        // to a live local.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    });
}

/// Writes `bufs` to the Unix socket `sock` with `fds` beside them (`SCM_RIGHTS`).
///
/// # Errors
/// As `sendmsg`: `WouldBlock` when the socket is full (nothing went, descriptors
/// included).
pub(crate) fn send_with_fds(sock: RawFd, bufs: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds);
    #[allow(unsafe_code)]
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    #[allow(unsafe_code)]
    // SAFETY: `msg` points at `bufs` (IoSlice is ABI-compatible with iovec) and at
    // `control`, both alive for the call; CMSG_FIRSTHDR of a control buffer of
    // CMSG_SPACE(fd_bytes) bytes is a valid header with room for `fd_bytes` of data,
    // written in full before sendmsg reads it.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len();
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Reads from the Unix socket `sock` into `buf`, adding the descriptors that came
/// with the bytes to `fds`.
///
/// # Errors
/// As `recvmsg`; also when descriptors were cut off (more than
/// [`MAX_FDS_PER_MSG`] in one message, or none left to this process).
pub(crate) fn recv_with_fds(sock: RawFd, buf: &mut [u8], fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    recv_into(sock, buf.as_mut_ptr(), buf.len(), fds)
}

/// [`recv_with_fds`] into `len` writable bytes at `at`, which need not be initialized.
pub(crate) fn recv_into(
    sock: RawFd,
    at: *mut u8,
    len: usize,
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    const FD_BYTES: usize = MAX_FDS_PER_MSG * std::mem::size_of::<RawFd>();
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; FD_BYTES / 8 + 8];
    let mut iov = libc::iovec { iov_base: at.cast(), iov_len: len };
    #[allow(unsafe_code)]
    // SAFETY: `msg` points at one iovec of `len` writable bytes (the caller's
    // promise) and at `control`, both alive for the call.
    let (n, msg) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        (n, msg)
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    #[allow(unsafe_code)]
    // SAFETY: recvmsg filled `control` and set `msg.msg_controllen`; the CMSG macros
    // walk only within it. Each SCM_RIGHTS descriptor is new to this process and
    // owned by nothing else.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                raise_file_limit();
                let data = libc::CMSG_DATA(cmsg);
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push_back(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "payload files sent with the frames were cut off (out of open files? raise `ulimit -n`)",
        ));
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_crosses_as_a_sealed_file_and_is_passed_on_without_a_new_one() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let payload = Bytes::from((0..200_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let fd = file_for(&payload).unwrap();
        assert_eq!(send_with_fds(a.as_raw_fd(), &[IoSlice::new(b"x")], &[fd.as_raw_fd()]).unwrap(), 1);
        let mut fds = VecDeque::new();
        let mut buf = [0u8; 4];
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), 1);
        let got = map(fds.pop_front().unwrap(), payload.len()).unwrap();
        assert_eq!(got, payload);
        // Passed on whole, it is its own file; a part of it is not.
        let again = file_of(&got).unwrap();
        assert!(Arc::ptr_eq(&again, &file_for(&got).unwrap()));
        assert!(file_of(&got.slice(1..)).is_none());
        let at = got.as_ptr() as usize;
        drop(got);
        assert!(!mapped().lock().unwrap().contains_key(&at));
    }

    #[test]
    fn an_unsealed_or_short_file_is_refused() {
        #[allow(unsafe_code)]
        // SAFETY: as in `file_for`.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        #[allow(unsafe_code)]
        // SAFETY: new descriptor, owned by nothing else.
        let mut file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.write_all(&[1; 100]).unwrap();
        let err = map(OwnedFd::from(file), 100).unwrap_err();
        assert!(err.contains("not a memory file sealed"), "{err}");

        let sealed = file_for(&Bytes::from_static(&[7; 100])).unwrap();
        let err = map(sealed.try_clone().unwrap(), 101).unwrap_err();
        assert!(err.contains("holds 100 bytes, its frame says 101"), "{err}");
        assert_eq!(map(sealed.try_clone().unwrap(), 100).unwrap(), Bytes::from_static(&[7; 100]));
    }
}
