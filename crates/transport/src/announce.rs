//! Light joins: a process started by a comm node announces itself with one
//! authenticated datagram before its link is connected, so that its parent can
//! count it as joined at once and keep what is sent to it until the link comes.
//!
//! ```text
//! child -> parent (one Unix datagram, abstract name):
//!     "TCJN" version node_id:u32 rank:u32 nonce[16] mac[32]
//!     mac = HMAC(secret, "treecast join" version node_id rank nonce)
//! ```
//!
//! The MAC proves the secret; the parent takes an announcement only for a node id
//! it started for a light join and has not heard from yet, so a replayed datagram
//! finds nothing to join. The link itself still opens with the full handshake
//! ([`crate::handshake`]): an announcement only lets the parent start early.

use hmac::Mac;
use rand::RngCore;

use crate::{Secret, TransportError};

const MAGIC: &[u8; 4] = b"TCJN";
const VERSION: u8 = 1;
const NONCE: usize = 16;
const MAC: usize = 32;
const LABEL: &[u8] = b"treecast join";
/// Bytes of an announcement.
pub const ANNOUNCE_LEN: usize = MAGIC.len() + 1 + 4 + 4 + NONCE + MAC;

/// What a checked announcement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announce {
    /// The node id the process was started as.
    pub node_id: u32,
    /// The back-end rank it announces: a back-end learns its rank only from its
    /// member plan, after announcing, so it sends "not known" and its parent takes
    /// the rank it started that node id as.
    pub rank: u32,
}

fn mac_of(secret: &Secret, signed: &[u8]) -> hmac::Hmac<sha2::Sha256> {
    let mut m = secret.mac(LABEL);
    m.update(signed);
    m
}

/// The datagram announcing `node_id` with `rank`, signed with `secret`.
pub fn encode_announce(secret: &Secret, node_id: u32, rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(ANNOUNCE_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&node_id.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    let mut nonce = [0u8; NONCE];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    out.extend_from_slice(&nonce);
    let tag = mac_of(secret, &out[MAGIC.len()..]).finalize().into_bytes();
    out.extend_from_slice(&tag);
    out
}

/// Checks a datagram from `peer` (for messages) and reads what it announces.
///
/// # Errors
/// [`TransportError::Auth`] for anything but a whole announcement of this version
/// signed with `secret`.
pub fn decode_announce(secret: &Secret, datagram: &[u8], peer: &str) -> Result<Announce, TransportError> {
    let refuse = |reason: String| TransportError::Auth { peer: peer.to_owned(), reason };
    if datagram.len() != ANNOUNCE_LEN {
        return Err(refuse(format!(
            "a join announcement has {ANNOUNCE_LEN} bytes, this one {}",
            datagram.len()
        )));
    }
    if &datagram[..MAGIC.len()] != MAGIC {
        return Err(refuse("not a treecast join announcement".into()));
    }
    let version = datagram[MAGIC.len()];
    if version != VERSION {
        return Err(refuse(format!("join announcement version {version}, expected {VERSION}")));
    }
    let (signed, tag) = datagram.split_at(ANNOUNCE_LEN - MAC);
    if mac_of(secret, &signed[MAGIC.len()..]).verify_slice(tag).is_err() {
        return Err(refuse("join announcement not signed with this session's secret".into()));
    }
    let word = |at: usize| u32::from_le_bytes([signed[at], signed[at + 1], signed[at + 2], signed[at + 3]]);
    Ok(Announce { node_id: word(MAGIC.len() + 1), rank: word(MAGIC.len() + 5) })
}

/// The abstract socket address `@name` names.
fn abstract_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// Sends the announcement of `node_id` with `rank` to `address` (`@name`, as
/// [`JoinSocket::address`] gives it). One datagram, never blocking: a full queue
/// at the parent is an error, and the caller joins by connecting instead.
///
/// # Errors
/// A malformed address, or a datagram the kernel did not take.
pub fn send_announce(address: &str, secret: &Secret, node_id: u32, rank: u32) -> Result<(), TransportError> {
    let io = |source| TransportError::Io { what: format!("announcing node {node_id} to {address}"), source };
    let Some(name) = address.strip_prefix('@') else {
        let source =
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not an abstract socket name (@name)");
        return Err(io(source));
    };
    let socket = std::os::unix::net::UnixDatagram::unbound().map_err(io)?;
    socket.set_nonblocking(true).map_err(io)?;
    let sent =
        socket.send_to_addr(&encode_announce(secret, node_id, rank), &abstract_addr(name).map_err(io)?);
    sent.map(drop).map_err(io)
}

/// Where a comm node's children announce themselves: a datagram socket under a
/// fresh abstract name (nothing in the file system; the MAC keeps strangers out).
#[derive(Debug)]
pub struct JoinSocket {
    socket: tokio::net::UnixDatagram,
    name: String,
}

impl JoinSocket {
    /// Binds a new socket.
    ///
    /// # Errors
    /// The socket could not be created or bound.
    pub fn bind() -> Result<JoinSocket, TransportError> {
        let mut tag = [0u8; 12];
        rand::rngs::OsRng.fill_bytes(&mut tag);
        let name = format!("treecast-join-{}", hex::encode(tag));
        let io = |source| TransportError::Io { what: format!("binding join socket @{name}"), source };
        let std_socket =
            std::os::unix::net::UnixDatagram::bind_addr(&abstract_addr(&name).map_err(io)?).map_err(io)?;
        std_socket.set_nonblocking(true).map_err(io)?;
        let socket = tokio::net::UnixDatagram::from_std(std_socket).map_err(io)?;
        Ok(JoinSocket { socket, name })
    }

    /// The address children send to, for their environment.
    pub fn address(&self) -> String {
        format!("@{}", self.name)
    }

    /// The next announcement signed with `secret`, or why a datagram was refused.
    ///
    /// # Errors
    /// A datagram that is not a valid announcement, or a failed receive.
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&self, secret: &Secret) -> Result<Announce, TransportError> {
        // One byte more than an announcement, so that a longer datagram is seen as such.
        let mut buf = [0u8; ANNOUNCE_LEN + 1];
        let n = self.socket.recv(&mut buf).await.map_err(|source| TransportError::Io {
            what: format!("reading join socket @{}", self.name),
            source,
        })?;
        decode_announce(secret, &buf[..n], "a join announcement")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_reads_back() {
        let secret = Secret::generate();
        let d = encode_announce(&secret, 7, 42);
        assert_eq!(d.len(), ANNOUNCE_LEN);
        assert_eq!(decode_announce(&secret, &d, "t").unwrap(), Announce { node_id: 7, rank: 42 });
    }

    #[test]
    fn another_secret_a_changed_byte_or_a_cut_datagram_is_refused() {
        let secret = Secret::generate();
        let d = encode_announce(&secret, 7, 42);
        let err = decode_announce(&Secret::generate(), &d, "t").unwrap_err();
        assert!(err.to_string().contains("not signed with this session's secret"), "{err}");
        for at in 0..d.len() {
            let mut bad = d.clone();
            bad[at] ^= 1;
            assert!(decode_announce(&secret, &bad, "t").is_err(), "byte {at} changed was taken");
        }
        assert!(decode_announce(&secret, &d[..d.len() - 1], "t").is_err());
        let mut long = d.clone();
        long.push(0);
        assert!(decode_announce(&secret, &long, "t").is_err());
    }

    #[tokio::test]
    async fn an_announcement_crosses_the_join_socket() {
        let secret = Secret::generate();
        let socket = JoinSocket::bind().unwrap();
        send_announce(&socket.address(), &Secret::generate(), 1, 1).unwrap();
        send_announce(&socket.address(), &secret, 3, 9).unwrap();
        assert!(socket.recv(&secret).await.is_err(), "a stranger's announcement was taken");
        assert_eq!(socket.recv(&secret).await.unwrap(), Announce { node_id: 3, rank: 9 });
    }

    #[test]
    fn an_address_that_is_not_abstract_is_refused() {
        let err = send_announce("/tmp/x", &Secret::generate(), 1, 1).unwrap_err();
        assert!(err.to_string().contains("abstract"), "{err}");
    }
}
