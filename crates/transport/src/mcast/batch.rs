//! Batched datagram I/O for the multicast route: sending many equal datagrams in
//! one system call with UDP segmentation offload (`UDP_SEGMENT`, "GSO": the kernel,
//! or the device, cuts one buffer into datagrams of a given size), and receiving
//! many in one `recvmmsg` call with UDP receive offload (`UDP_GRO`: the kernel
//! hands over several datagrams of one flow coalesced, with their size).
//!
//! Where the kernel or the device refuses segmentation (`EIO` or `EINVAL` at the
//! send, as quinn-udp handles it), segmentation is turned off for that socket, the
//! batch is sent again one datagram at a time, and this is logged once. The
//! per-datagram format does not change: a receiver sees the same datagrams.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::task::Context;

use tokio::io::Interest;
use tokio::net::UdpSocket;

/// `UDP_SEGMENT` (linux/udp.h): a send's segment size, as a control message.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): the socket option, and the control message carrying a
/// coalesced receive's segment size.
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel takes in one segmented send (`UDP_MAX_SEGMENTS`).
pub(crate) const MAX_SEGMENTS: usize = 64;
/// Most bytes of one segmented send: a UDP datagram's largest payload, rounded down.
pub(crate) const MAX_BATCH_BYTES: usize = 65_000;
/// Messages one `recvmmsg` call reads at most.
const RECV_BATCH: usize = 16;
/// Room for one received buffer: a coalesced receive holds at most 64 KiB.
const RECV_BUFFER: usize = 65_536;

/// Datagrams sealed one after another into one buffer, sent together: every one
/// but the last of equal size, as segmentation needs.
#[derive(Debug, Default)]
pub(crate) struct SendBatch {
    buf: Vec<u8>,
    /// Size of each datagram but possibly the last.
    segment: usize,
    count: usize,
    /// The last one is shorter: nothing more may follow.
    closed: bool,
}

impl SendBatch {
    /// True when a datagram of `len` bytes can join this batch.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.count == 0
            || (!self.closed
                && len <= self.segment
                && self.count < MAX_SEGMENTS
                && self.buf.len() + len <= MAX_BATCH_BYTES)
    }

    /// Appends a datagram; call [`SendBatch::fits`] first.
    pub(crate) fn push(&mut self, datagram: &[u8]) {
        if self.count == 0 {
            self.segment = datagram.len();
        } else if datagram.len() < self.segment {
            self.closed = true;
        }
        if datagram.is_empty() {
            // An empty datagram cannot be a segment: nothing may follow it.
            self.closed = true;
        }
        self.buf.extend_from_slice(datagram);
        self.count += 1;
    }

    /// Datagrams in the batch.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The datagrams, one by one.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        split(&self.buf, self.segment, self.count)
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
        self.segment = 0;
        self.closed = false;
    }
}

/// `buf` cut into `count` datagrams of `segment` bytes, the last one what is left.
fn split(buf: &[u8], segment: usize, count: usize) -> impl Iterator<Item = &[u8]> {
    let mut rest = buf;
    (0..count).map(move |i| {
        let n = if i + 1 == count { rest.len() } else { segment.min(rest.len()) };
        let (one, tail) = rest.split_at(n);
        rest = tail;
        one
    })
}

/// Whether a socket still segments its sends, and whether the refusal was logged.
#[derive(Debug)]
pub(crate) struct Gso {
    enabled: bool,
}

impl Gso {
    /// Segmentation on (`TREECAST_UDP_GSO`, on by default) or off.
    pub(crate) fn new(enabled: bool) -> Gso {
        Gso { enabled }
    }

    /// True while sends are segmented.
    #[cfg(test)]
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Sends every datagram of `batch` to `dest`, in one segmented send when it can,
    /// and empties the batch. Returns how many went out and how many the kernel
    /// refused (a full buffer: lost like datagrams lost on the wire).
    pub(crate) fn send(&mut self, socket: &UdpSocket, batch: &mut SendBatch, dest: SocketAddr) -> (u64, u64) {
        let n = batch.len() as u64;
        if n == 0 {
            return (0, 0);
        }
        if self.enabled && n > 1 {
            let segment = batch.segment as u16;
            let res = socket.try_io(Interest::WRITABLE, || send_segmented(socket, &batch.buf, segment, dest));
            match res {
                Ok(_) => {
                    batch.clear();
                    return (n, 0);
                }
                Err(e) if refused(&e) => {
                    self.enabled = false;
                    tracing::info!(
                        "UDP segmentation offload refused on the socket to {dest} ({e}): \
                         sending one datagram per system call from now on"
                    );
                }
                Err(e) => {
                    tracing::trace!("{n} UDP datagrams to {dest} not sent: {e}");
                    batch.clear();
                    return (0, n);
                }
            }
        }
        let mut sent = 0;
        for d in batch.datagrams() {
            match socket.try_send_to(d, dest) {
                Ok(_) => sent += 1,
                Err(e) => tracing::trace!("UDP datagram to {dest} not sent: {e}"),
            }
        }
        batch.clear();
        (sent, n - sent)
    }
}

/// The errors with which a kernel or device refuses segmentation (quinn-udp's list).
fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT))
}

/// A socket address as the C calls take it.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    #[allow(unsafe_code)]
    // SAFETY: sockaddr_storage is plain data for which all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            #[allow(unsafe_code)]
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            let sin =
                unsafe { &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from(*a.ip()).to_be() };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            #[allow(unsafe_code)]
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            let sin6 =
                unsafe { &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address a received datagram came from.
fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            #[allow(unsafe_code)]
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            #[allow(unsafe_code)]
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Room for one control message holding one `c_int`.
const CMSG_ROOM: usize = 64;

/// Control-message buffer, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_ROOM]);

/// One `sendmsg` of `buf` to `dest`, cut by the kernel into datagrams of `segment` bytes.
fn send_segmented(socket: &UdpSocket, buf: &[u8], segment: u16, dest: SocketAddr) -> io::Result<usize> {
    let (mut addr, addr_len) = sockaddr(dest);
    let mut iov = libc::iovec { iov_base: buf.as_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut control = CmsgBuf([0; CMSG_ROOM]);
    #[allow(unsafe_code)]
    // SAFETY: msghdr is plain data for which all zeroes is valid; every pointer set
    // below points to a live local (address, iovec, control buffer) that outlives
    // the sendmsg call, with its true length; CMSG_FIRSTHDR of a control buffer of
    // CMSG_SPACE(2) bytes is non-null and has room for one u16 after its header.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = addr_len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        libc::sendmsg(socket.as_raw_fd(), &msg, 0)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Asks the kernel to coalesce received datagrams (`UDP_GRO`); false where it cannot,
/// which costs only the batching.
pub(crate) fn enable_gro(socket: &UdpSocket) -> bool {
    let on: libc::c_int = 1;
    #[allow(unsafe_code)]
    // SAFETY: setsockopt reads an int of the size given from a live local.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Buffers for batched reads: several messages per system call, each possibly
/// several coalesced datagrams.
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    /// Length, sender and segment size (0: one datagram) of each message read.
    got: Vec<(usize, Option<SocketAddr>, usize)>,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch").field("buffers", &self.bufs.len()).finish()
    }
}

impl RecvBatch {
    /// Buffers for `messages` reads of up to 64 KiB each (at least one).
    pub(crate) fn new(messages: usize) -> RecvBatch {
        let n = messages.clamp(1, RECV_BATCH);
        RecvBatch { bufs: vec![vec![0; RECV_BUFFER]; n], got: Vec::with_capacity(n) }
    }

    /// Reads what `socket` has now, at most about `budget` datagrams, handing each to
    /// `each` with its sender; true when any came. Registers the waker when nothing is left.
    pub(crate) fn read_each(
        &mut self,
        socket: &UdpSocket,
        cx: &mut Context<'_>,
        budget: usize,
        mut each: impl FnMut(&[u8], SocketAddr),
    ) -> bool {
        let mut any = false;
        let mut read = 0;
        while read < budget {
            if socket.poll_recv_ready(cx).is_pending() {
                break;
            }
            match socket.try_io(Interest::READABLE, || recv_messages(socket, &mut self.bufs, &mut self.got)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    // For UDP an error concerns one datagram (an ICMP error for an
                    // earlier send): the socket is still good.
                    tracing::debug!("UDP read: {e}");
                    read += 1;
                    continue;
                }
            }
            for (i, &(len, from, segment)) in self.got.iter().enumerate() {
                let Some(from) = from else { continue };
                let buf = &self.bufs[i][..len];
                let count = if segment == 0 || len == 0 { 1 } else { len.div_ceil(segment) };
                for d in split(buf, segment.max(1), count) {
                    any = true;
                    read += 1;
                    each(d, from);
                }
            }
        }
        if read >= budget {
            // More may wait: come back after the driver's other work.
            cx.waker().wake_by_ref();
        }
        any
    }
}

/// One `recvmmsg` into `bufs`; fills `got` with what each message holds. Would-block
/// when nothing waits.
fn recv_messages(
    socket: &UdpSocket,
    bufs: &mut [Vec<u8>],
    got: &mut Vec<(usize, Option<SocketAddr>, usize)>,
) -> io::Result<usize> {
    let n = bufs.len().min(RECV_BATCH);
    #[allow(unsafe_code)]
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut names: [libc::sockaddr_storage; RECV_BATCH] = unsafe { std::mem::zeroed() };
    let mut controls = [CmsgBuf([0; CMSG_ROOM]); RECV_BATCH];
    let mut iovs: Vec<libc::iovec> = bufs[..n]
        .iter_mut()
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
        .collect();
    #[allow(unsafe_code)]
    // SAFETY: as above, plain C structs.
    let mut msgs: [libc::mmsghdr; RECV_BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        let h = &mut msgs[i].msg_hdr;
        h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = controls[i].0.as_mut_ptr().cast();
        h.msg_controllen = CMSG_ROOM as _;
    }
    #[allow(unsafe_code)]
    // SAFETY: every msghdr points to live buffers (names, iovecs over `bufs`,
    // control buffers) of the lengths given, all outliving the call; the kernel
    // writes at most those lengths.
    let rc = unsafe {
        libc::recvmmsg(
            socket.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as _,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    got.clear();
    for m in msgs.iter().take(rc as usize) {
        let mut segment = 0;
        #[allow(unsafe_code)]
        // SAFETY: the kernel filled msg_control up to msg_controllen with well-formed
        // control messages; CMSG_FIRSTHDR/NXTHDR stay within it and a UDP_GRO
        // message carries one int.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&m.msg_hdr);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                    let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    segment = usize::try_from(size).unwrap_or(0);
                }
                cmsg = libc::CMSG_NXTHDR(&m.msg_hdr, cmsg);
            }
        }
        let i = got.len();
        got.push((m.msg_len as usize, from_sockaddr(&names[i]), segment));
    }
    Ok(got.len())
}

/// Polls until `socket` is readable (for tests and callers that wait).
#[cfg(test)]
fn readable(socket: &UdpSocket, cx: &mut Context<'_>) -> std::task::Poll<()> {
    socket.poll_recv_ready(cx).map(|_| ())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_batch_holds_equal_datagrams_and_ends_after_a_shorter_one() {
        let mut b = SendBatch::default();
        assert!(b.fits(1472));
        b.push(&[1; 1472]);
        assert!(b.fits(1472) && b.fits(100) && !b.fits(1473), "longer than the first cannot follow");
        b.push(&[2; 1472]);
        b.push(&[3; 100]);
        assert!(!b.fits(1472) && !b.fits(10), "nothing after a shorter one");
        let got: Vec<Vec<u8>> = b.datagrams().map(<[u8]>::to_vec).collect();
        assert_eq!(got, [vec![1; 1472], vec![2; 1472], vec![3; 100]]);
    }

    #[test]
    fn a_batch_stops_at_the_kernels_limits() {
        let mut b = SendBatch::default();
        for _ in 0..MAX_SEGMENTS {
            assert!(b.fits(100));
            b.push(&[0; 100]);
        }
        assert!(!b.fits(100), "64 segments at most");
        let mut b = SendBatch::default();
        while b.fits(1472) {
            b.push(&[0; 1472]);
        }
        assert_eq!(b.len(), MAX_BATCH_BYTES / 1472);
        let mut b = SendBatch::default();
        b.push(&[]);
        assert!(!b.fits(0), "an empty datagram ends a batch");
        assert_eq!(b.datagrams().count(), 1);
    }

    proptest::proptest! {
        /// Whatever the sizes, the batches taken in order give back every datagram.
        #[test]
        fn batches_give_back_every_datagram_in_order(sizes in proptest::collection::vec(0usize..3000, 0..200)) {
            let datagrams: Vec<Vec<u8>> =
                sizes.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect();
            let mut out = Vec::new();
            let mut b = SendBatch::default();
            for d in &datagrams {
                if !b.fits(d.len()) {
                    out.extend(b.datagrams().map(<[u8]>::to_vec));
                    b.clear();
                }
                b.push(d);
            }
            out.extend(b.datagrams().map(<[u8]>::to_vec));
            proptest::prop_assert_eq!(out, datagrams);
        }
    }

    async fn receive_all(rx: &UdpSocket, batch: &mut RecvBatch, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while got.len() < want {
            let wait =
                tokio::time::timeout(Duration::from_secs(10), std::future::poll_fn(|cx| readable(rx, cx)));
            assert!(wait.await.is_ok(), "got {} of {want}", got.len());
            std::future::poll_fn(|cx| {
                batch.read_each(rx, cx, 1000, |d, _| got.push(d.to_vec()));
                std::task::Poll::Ready(())
            })
            .await;
            assert!(tokio::time::Instant::now() < deadline, "got {} of {want}", got.len());
        }
        got
    }

    fn datagrams() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1472]).collect();
        v.push(vec![99; 300]);
        v
    }

    async fn send_all(gso: &mut Gso, tx: &UdpSocket, to: SocketAddr, datagrams: &[Vec<u8>]) -> u64 {
        let mut b = SendBatch::default();
        let mut sent = 0;
        for d in datagrams {
            if !b.fits(d.len()) {
                tx.writable().await.unwrap();
                sent += gso.send(tx, &mut b, to).0;
            }
            b.push(d);
        }
        tx.writable().await.unwrap();
        sent + gso.send(tx, &mut b, to).0
    }

    /// Segmented sends and coalesced, batched reads on loopback give back every
    /// datagram, whole and in order.
    #[tokio::test]
    async fn segmented_sends_arrive_as_the_same_datagrams() {
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let gro = enable_gro(&rx);
        let mut gso = Gso::new(true);
        let sent = send_all(&mut gso, &tx, rx.local_addr().unwrap(), &datagrams()).await;
        assert_eq!(sent, datagrams().len() as u64);
        let mut batch = RecvBatch::new(4);
        let got = receive_all(&rx, &mut batch, datagrams().len()).await;
        assert_eq!(got, datagrams(), "GRO on: {gro}, GSO still on: {}", gso.enabled());
    }

    /// A kernel that refuses segmentation (forced here with a segment size it
    /// rejects: EINVAL) turns it off for the socket, and the batch goes out one
    /// datagram at a time, nothing lost.
    #[tokio::test]
    async fn a_refused_segmented_send_is_sent_again_one_datagram_at_a_time() {
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // Room for every small datagram sent one by one.
        let _ = socket2::SockRef::from(&rx).set_recv_buffer_size(4 << 20);
        let to = rx.local_addr().unwrap();
        // A batch the kernel refuses: more segments than it takes in one send (64
        // before Linux 6.12, 128 since).
        let mut b = SendBatch { buf: vec![5; 130], segment: 1, count: 130, closed: false };
        let mut gso = Gso::new(true);
        tx.writable().await.unwrap();
        let (sent, failed) = gso.send(&tx, &mut b, to);
        assert!(!gso.enabled(), "turned off after the refusal");
        assert_eq!((sent, failed), (130, 0));
        let mut batch = RecvBatch::new(16);
        let got = receive_all(&rx, &mut batch, 130).await;
        assert!(got.iter().all(|d| d == &[5]), "{got:?}");
        // And later batches go out unsegmented.
        let sent = send_all(&mut gso, &tx, to, &datagrams()).await;
        assert_eq!(sent, datagrams().len() as u64);
        assert_eq!(receive_all(&rx, &mut batch, datagrams().len()).await, datagrams());
    }
}
