//! Routes: the byte streams a link can run over, and how to listen for them.
//!
//! TCP reaches other hosts; a Unix socket is cheaper between processes of one
//! host and is what the local launcher uses. Addresses are text so they can be
//! handed to a child in its environment: `127.0.0.1:4000` or `unix:/tmp/tc-…/s`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::{tune_tcp, TransportError};

/// Prefix of Unix socket addresses.
const UNIX_PREFIX: &str = "unix:";

/// The read half of a stream, boxed so every route looks the same to a link.
pub type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
/// The write half of a stream.
pub type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

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
                Some(path) => UnixStream::connect(path).await.map(Stream::Unix).map_err(io),
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

    /// Hands the connection over to be driven directly (see [`crate::spawn_socket_link`]).
    ///
    /// # Errors
    /// The runtime could not release the socket.
    pub fn into_socket(self) -> std::io::Result<crate::Socket> {
        Ok(match self {
            Stream::Tcp(s) => crate::Socket::Tcp(s.into_std()?),
            Stream::Unix(s) => crate::Socket::Unix(s.into_std()?),
        })
    }

    /// Splits into independently owned halves for the reader and writer tasks.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
        }
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
    /// A Unix socket in a private directory, removed when the listener is dropped.
    Unix {
        /// The listening socket.
        listener: UnixListener,
        /// The directory (mode 0700) holding the socket.
        dir: PathBuf,
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

    /// Listens on a Unix socket in a new private directory under the system temp directory.
    ///
    /// # Errors
    /// The directory or socket could not be created.
    pub fn unix() -> Result<Listener, TransportError> {
        use std::os::unix::fs::DirBuilderExt;
        let io = |what: String| move |source| TransportError::Io { what, source };
        let mut tag = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut tag);
        let dir = std::env::temp_dir().join(format!("treecast-{}", hex::encode(tag)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!("creating {}", dir.display())))?;
        let path = dir.join("s");
        match UnixListener::bind(&path) {
            Ok(listener) => Ok(Listener::Unix { listener, dir }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(io(format!("listening on {}", path.display()))(e))
            }
        }
    }

    /// The address children connect to, for their environment.
    ///
    /// # Errors
    /// The OS could not report the bound address.
    pub fn address(&self) -> Result<String, TransportError> {
        let io = |source| TransportError::Io { what: "reading the listening address".into(), source };
        match self {
            Listener::Tcp(l) => Ok(l.local_addr().map_err(io)?.to_string()),
            Listener::Unix { dir, .. } => Ok(format!("{UNIX_PREFIX}{}", dir.join("s").display())),
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
            Listener::Unix { listener, dir } => {
                let (s, _) = listener.accept().await.map_err(io)?;
                Ok((Stream::Unix(s), format!("local peer on {}", dir.display())))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { dir, .. } = self {
            let _ = std::fs::remove_dir_all(dir);
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
        let Listener::Unix { dir, .. } = &unix else { panic!() };
        let dir = dir.clone();
        echo_once(unix).await;
        assert!(!dir.exists(), "the socket directory is removed with the listener");
    }

    #[tokio::test]
    async fn bad_addresses_are_named() {
        let err = Stream::connect("not-an-address", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("not-an-address"), "{err}");
        let err = Stream::connect("unix:/nonexistent/s", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/s"), "{err}");
    }
}
