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
                    let sock: SocketAddr = addr.parse().map_err(|e| TransportError::Io {
                        what: format!("parsing address {addr:?}"),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                    })?;
                    let s = TcpStream::connect(sock).await.map_err(io)?;
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

    #[tokio::test]
    async fn bad_addresses_are_named() {
        let err = Stream::connect("not-an-address", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("not-an-address"), "{err}");
        let err = Stream::connect("unix:/nonexistent/s", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/s"), "{err}");
    }
}
