//! Routes: the byte streams a link can run over, and how to listen for them.
//!
//! TCP reaches other hosts; a Unix socket is cheaper between processes of one
//! host and is what the local launcher uses. Addresses are text so they can be
//! handed to a child in its environment: `127.0.0.1:4000` or `unix:/tmp/tc-…/s`.

use std::net::{IpAddr, SocketAddr};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::{tune_tcp, TransportError};

/// Prefix of Unix socket addresses.
const UNIX_PREFIX: &str = "unix:";
/// Prefix of TCP addresses to reach by Multipath TCP (`mptcp:10.0.0.1:4000`).
pub const MPTCP_PREFIX: &str = "mptcp:";
/// `IPPROTO_MPTCP` (Linux 5.6 and later).
const IPPROTO_MPTCP: i32 = 262;
/// `TCP_IS_MPTCP`: whether a socket opened as MPTCP still is (Linux 5.16 and later).
const TCP_IS_MPTCP: libc::c_int = 43;

/// Logs once per process that the kernel refused Multipath TCP.
fn mptcp_refused(e: &std::io::Error) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "the kernel refuses Multipath TCP ({e}); links use plain TCP (sysctl net.mptcp.enabled=1 turns it on)"
        );
    });
}

/// A TCP socket for `addr` opened with `protocol` (MPTCP), or a plain one where the
/// kernel refuses it (logged once).
fn mptcp_socket(addr: &SocketAddr, protocol: i32) -> std::io::Result<socket2::Socket> {
    let domain = socket2::Domain::for_address(*addr);
    match socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::from(protocol))) {
        Ok(s) => Ok(s),
        Err(e) => {
            mptcp_refused(&e);
            socket2::Socket::new(domain, socket2::Type::STREAM, None)
        }
    }
}

/// Connects to `addr` by Multipath TCP, or plain TCP where the kernel refuses it.
async fn connect_mptcp(addr: SocketAddr, protocol: i32) -> std::io::Result<TcpStream> {
    let socket = mptcp_socket(&addr, protocol)?;
    socket.set_nonblocking(true)?;
    let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    socket.connect(addr).await
}

/// True when `stream` runs Multipath TCP (opened so, and neither end fell back).
pub fn is_mptcp(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid descriptor, and `on`/`len` are a c_int and its size, as
    // getsockopt expects; it writes at most `len` bytes.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_TCP,
            TCP_IS_MPTCP,
            std::ptr::addr_of_mut!(on).cast(),
            &mut len,
        )
    };
    rc == 0 && on != 0
}

/// A connected byte stream over one of the routes.
#[derive(Debug)]
pub enum Stream {
    /// TCP, to any host.
    Tcp(TcpStream),
    /// A Unix socket, on this host.
    Unix(UnixStream),
}

impl Stream {
    /// Connects to an address as written by [`Listener::address`].
    ///
    /// # Errors
    /// A malformed address, a refused connection, or no answer within `limit`.
    ///
    /// Cancel safety: cancel safe.
    pub async fn connect(addr: &str, limit: Duration) -> Result<Stream, TransportError> {
        let io = |source| TransportError::Io { what: format!("connecting to {addr}"), source };
        let connecting = async {
            match addr.strip_prefix(UNIX_PREFIX) {
                Some(name) => connect_unix(name).await.map(Stream::Unix).map_err(io),
                None => {
                    let (tcp, mptcp) = match addr.strip_prefix(MPTCP_PREFIX) {
                        Some(tcp) => (tcp, true),
                        None => (addr, false),
                    };
                    let sock: SocketAddr = tcp.parse().map_err(|e| TransportError::Io {
                        what: format!("parsing address {addr:?}"),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                    })?;
                    let s = match mptcp {
                        true => connect_mptcp(sock, IPPROTO_MPTCP).await,
                        false => TcpStream::connect(sock).await,
                    }
                    .map_err(io)?;
                    tune_tcp(&s)?;
                    Ok(Stream::Tcp(s))
                }
            }
        };
        tokio::time::timeout(limit, connecting).await.map_err(|_| TransportError::Timeout {
            what: format!("connecting to {addr}"),
            secs: limit.as_secs_f64(),
        })?
    }

    /// Hands the connection over to be driven directly (see [`crate::StreamRoute::add`]).
    ///
    /// # Errors
    /// The runtime could not release the socket.
    pub fn into_socket(self) -> std::io::Result<crate::Socket> {
        Ok(match self {
            Stream::Tcp(s) => crate::Socket::Tcp(s.into_std()?),
            Stream::Unix(s) => crate::Socket::Unix(s.into_std()?),
        })
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Where a node waits for its children to connect.
#[derive(Debug)]
pub enum Listener {
    /// A TCP port on one address.
    Tcp(TcpListener),
    /// An abstract Unix socket, on this host only.
    Unix {
        /// The listening socket.
        listener: UnixListener,
        /// Its abstract name (without the leading `@`).
        name: String,
    },
}

impl Listener {
    /// Listens on an ephemeral TCP port of `ip`.
    ///
    /// # Errors
    /// The OS refused to bind.
    pub async fn tcp(ip: IpAddr) -> Result<Listener, TransportError> {
        TcpListener::bind((ip, 0))
            .await
            .map(Listener::Tcp)
            .map_err(|source| TransportError::Io { what: format!("listening on {ip}"), source })
    }

    /// Listens on an ephemeral port of `ip` by Multipath TCP (it takes plain TCP
    /// peers too), or plain TCP where the kernel refuses it (logged once). Children
    /// reach it at `mptcp:` and [`Listener::address`].
    ///
    /// # Errors
    /// The OS refused to bind.
    pub fn mptcp(ip: IpAddr) -> Result<Listener, TransportError> {
        Self::mptcp_with(SocketAddr::new(ip, 0), IPPROTO_MPTCP)
    }

    /// [`Listener::mptcp`] on a given port (a benchmark's server, whose clients
    /// know its port).
    ///
    /// # Errors
    /// The OS refused to bind.
    pub fn mptcp_at(addr: SocketAddr) -> Result<Listener, TransportError> {
        Self::mptcp_with(addr, IPPROTO_MPTCP)
    }

    fn mptcp_with(addr: SocketAddr, protocol: i32) -> Result<Listener, TransportError> {
        let io =
            |source| TransportError::Io { what: format!("listening on {addr} by Multipath TCP"), source };
        let socket = mptcp_socket(&addr, protocol).map_err(io)?;
        socket.set_nonblocking(true).map_err(io)?;
        socket.set_reuse_address(true).map_err(io)?;
        socket.bind(&addr.into()).map_err(io)?;
        socket.listen(1024).map_err(io)?;
        TcpListener::from_std(std::net::TcpListener::from(socket)).map(Listener::Tcp).map_err(io)
    }

    /// Listens on a new abstract Unix socket (Linux): nothing in the file system,
    /// so a node killed outright leaves nothing behind; the handshake, not file
    /// permissions, keeps strangers out.
    ///
    /// # Errors
    /// The socket could not be created.
    pub fn unix() -> Result<Listener, TransportError> {
        let mut tag = [0u8; 12];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut tag);
        let name = format!("treecast-{}", hex::encode(tag));
        let io =
            |source| TransportError::Io { what: format!("listening on abstract socket @{name}"), source };
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
        let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(io)?;
        std_listener.set_nonblocking(true).map_err(io)?;
        let listener = UnixListener::from_std(std_listener).map_err(io)?;
        Ok(Listener::Unix { listener, name })
    }

    /// The address children connect to, for their environment.
    ///
    /// # Errors
    /// The OS could not report the bound address.
    pub fn address(&self) -> Result<String, TransportError> {
        let io = |source| TransportError::Io { what: "reading the listening address".into(), source };
        match self {
            Listener::Tcp(l) => Ok(l.local_addr().map_err(io)?.to_string()),
            Listener::Unix { name, .. } => Ok(format!("{UNIX_PREFIX}@{name}")),
        }
    }

    /// Accepts the next connection and names its peer for messages.
    ///
    /// # Errors
    /// The OS failed to accept.
    ///
    /// Cancel safety: cancel safe.
    pub async fn accept(&self) -> Result<(Stream, String), TransportError> {
        let io = |source| TransportError::Io { what: "accepting a connection".into(), source };
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await.map_err(io)?;
                tune_tcp(&s)?;
                Ok((Stream::Tcp(s), peer.to_string()))
            }
            Listener::Unix { listener, name } => {
                let (s, _) = listener.accept().await.map_err(io)?;
                Ok((Stream::Unix(s), format!("local peer on @{name}")))
            }
        }
    }
}

/// Connects to `unix:@name` (abstract) or `unix:/path` without blocking the thread:
/// a listener whose queue is full (a flood of connections) makes a blocking
/// `connect` wait with no way for the caller's time limit to fire. The kernel
/// answers a non-blocking one with `EAGAIN` instead, and this tries again, backing
/// off, until the caller's limit cancels it.
async fn connect_unix(name: &str) -> std::io::Result<UnixStream> {
    let addr = match name.strip_prefix('@') {
        Some(abstract_name) => {
            let mut bytes = vec![0u8];
            bytes.extend_from_slice(abstract_name.as_bytes());
            socket2::SockAddr::unix(std::ffi::OsStr::from_bytes(&bytes))?
        }
        None => socket2::SockAddr::unix(name)?,
    };
    let mut backoff = Duration::from_millis(1);
    loop {
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        match socket.connect(&addr) {
            Ok(()) => return UnixStream::from_std(std::os::unix::net::UnixStream::from(socket)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_once(listener: Listener) {
        let addr = listener.address().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
            listener
        });
        let mut c = Stream::connect(&addr, Duration::from_secs(5)).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn both_routes_carry_bytes() {
        echo_once(Listener::tcp("127.0.0.1".parse().unwrap()).await.unwrap()).await;
        let unix = Listener::unix().unwrap();
        assert!(unix.address().unwrap().starts_with("unix:@treecast-"));
        echo_once(unix).await;
    }

    fn mptcp_enabled() -> bool {
        std::fs::read_to_string("/proc/sys/net/mptcp/enabled").is_ok_and(|s| s.trim() == "1")
    }

    #[tokio::test]
    async fn mptcp_links_carry_bytes_and_say_whether_they_run_mptcp() {
        let listener = Listener::mptcp("127.0.0.1".parse().unwrap()).unwrap();
        let addr = format!("{MPTCP_PREFIX}{}", listener.address().unwrap());
        let server = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        let Stream::Tcp(c) = Stream::connect(&addr, Duration::from_secs(5)).await.unwrap() else { panic!() };
        let Stream::Tcp(s) = server.await.unwrap() else { panic!() };
        // Where the kernel has it on, both ends run it; elsewhere both fell back.
        assert_eq!(is_mptcp(&c), mptcp_enabled());
        assert_eq!(is_mptcp(&s), mptcp_enabled());
        // An MPTCP client reaches a plain listener too (it falls back).
        echo_once(Listener::tcp("127.0.0.1".parse().unwrap()).await.unwrap()).await;
        let plain = Listener::tcp("127.0.0.1".parse().unwrap()).await.unwrap();
        let addr = format!("{MPTCP_PREFIX}{}", plain.address().unwrap());
        let server = tokio::spawn(async move { plain.accept().await.unwrap().0 });
        let Stream::Tcp(c) = Stream::connect(&addr, Duration::from_secs(5)).await.unwrap() else { panic!() };
        drop(server.await.unwrap());
        assert!(!is_mptcp(&c), "a plain listener answers plain TCP");
    }

    #[tokio::test]
    async fn where_the_kernel_refuses_mptcp_links_fall_back_to_tcp() {
        // A protocol no kernel has stands for a kernel without MPTCP.
        let listener = Listener::mptcp_with("127.0.0.1:0".parse().unwrap(), 253).unwrap();
        let Listener::Tcp(l) = &listener else { panic!() };
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        let c = connect_mptcp(addr, 253).await.unwrap();
        let Stream::Tcp(s) = server.await.unwrap() else { panic!() };
        assert!(!is_mptcp(&c) && !is_mptcp(&s));
    }

    #[tokio::test]
    async fn bad_addresses_are_named() {
        let err = Stream::connect("not-an-address", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("not-an-address"), "{err}");
        let err = Stream::connect("unix:/nonexistent/s", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/s"), "{err}");
    }
}
