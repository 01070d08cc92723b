//! The HMAC-SHA256 challenge–response that opens every link.
//!
//! ```text
//! parent -> child : "TCST" version nonce_p[32]
//! child  -> parent: "TCST" version node_id:u32 nonce_c[32] mac_c[32]
//!                   mac_c = HMAC(secret, "treecast child" nonce_p nonce_c node_id)
//! parent -> child : mac_p[32]
//!                   mac_p = HMAC(secret, "treecast parent" nonce_c nonce_p node_id)
//! ```
//!
//! Both sides prove they hold the secret, fresh nonces defeat replay, and the
//! child's claimed node id is covered by its MAC.
//!
//! A connection that is one of the `count` connections of a striped link (see
//! `crate::striped`) answers with version 2 and says which link and which place:
//!
//! ```text
//! child  -> parent: "TCST" 2 node_id:u32 token[16] index:u8 count:u8 nonce_c[32] mac_c[32]
//!                   mac_c = HMAC(secret, "treecast rail" nonce_p nonce_c node_id token index count)
//! ```
//!
//! The token is drawn by the child once per striped link and is the same on all its
//! connections, so the parent ties them together; each connection proves the
//! secret on its own. The parent's proof is as for a plain link. [`accept`] refuses
//! version 2; [`accept_any`] takes both. A parent that rejects a child
//! closes the connection without answering; nothing the child sends after the
//! handshake is read.

use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Secret, TransportError};

const MAGIC: &[u8; 4] = b"TCST";
const VERSION: u8 = 1;
/// The version byte of a child's answer for one connection of a striped link.
const RAIL_VERSION: u8 = 2;
/// Bytes of the token that ties the connections of one striped link together.
pub const TOKEN: usize = 16;
const NONCE: usize = 32;
const MAC: usize = 32;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &Secret, label: &[u8], first: &[u8], second: &[u8], node_id: u32) -> HmacSha256 {
    let mut m = secret.mac(label);
    m.update(first);
    m.update(second);
    m.update(&node_id.to_le_bytes());
    m
}

fn nonce() -> [u8; NONCE] {
    let mut n = [0u8; NONCE];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

async fn timed<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, TransportError>>,
) -> Result<T, TransportError> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| TransportError::Timeout { what: what.to_owned(), secs: limit.as_secs_f64() })?
}

fn io_err(peer: &str, what: &str) -> impl FnOnce(std::io::Error) -> TransportError {
    let what = format!("{what} with {peer}");
    move |source| TransportError::Io { what, source }
}

/// Parent side: challenges a freshly accepted connection and returns the child's node id.
///
/// # Errors
/// [`TransportError::Auth`] when the child does not prove the secret (the caller
/// must close the connection), I/O errors and a timeout after `limit`.
///
/// Cancel safety: not cancel safe; drop the stream if cancelled.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    peer: &str,
    limit: Duration,
) -> Result<u32, TransportError> {
    timed(limit, &format!("handshake with {peer}"), async {
        let nonce_p = nonce();
        let mut hello = Vec::with_capacity(4 + 1 + NONCE);
        hello.extend_from_slice(MAGIC);
        hello.push(VERSION);
        hello.extend_from_slice(&nonce_p);
        stream.write_all(&hello).await.map_err(io_err(peer, "sending challenge"))?;

        let mut answer = [0u8; 4 + 1 + 4 + NONCE + MAC];
        stream.read_exact(&mut answer).await.map_err(io_err(peer, "reading challenge answer"))?;
        if &answer[..4] != MAGIC || answer[4] != VERSION {
            return Err(TransportError::Auth {
                peer: peer.to_owned(),
                reason: "the peer does not speak the treecast handshake (wrong program or version)".into(),
            });
        }
        let node_id = u32::from_le_bytes([answer[5], answer[6], answer[7], answer[8]]);
        let nonce_c = &answer[9..9 + NONCE];
        let mac_c = &answer[9 + NONCE..];
        mac(secret, b"treecast child", &nonce_p, nonce_c, node_id).verify_slice(mac_c).map_err(|_| {
            TransportError::Auth {
                peer: peer.to_owned(),
                reason: format!("node id {node_id} did not prove the session secret"),
            }
        })?;
        let mac_p = mac(secret, b"treecast parent", nonce_c, &nonce_p, node_id).finalize().into_bytes();
        stream.write_all(&mac_p).await.map_err(io_err(peer, "sending challenge response"))?;
        Ok(node_id)
    })
    .await
}

/// What a parent sends instead of its proof to a handshake it turns away (see
/// [`turn_away`]); no HMAC output is expected to equal it.
pub const BUSY: &[u8; MAC] = b"TCST busy: connect again later.\n";

/// Parent side: ends a handshake under way because newer connections need its place,
/// telling a real child so ([`TransportError::Busy`]) so that it tries again instead
/// of taking it for a refused secret. Waits at most 100 ms for the write.
///
/// Cancel safety: cancel safe; the connection is only left unanswered.
pub async fn turn_away<S: AsyncWrite + Unpin>(stream: &mut S) {
    let _ = tokio::time::timeout(Duration::from_millis(100), async {
        let _ = stream.write_all(BUSY).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Child side: answers the parent's challenge as `node_id` and checks the parent's proof.
///
/// # Errors
/// [`TransportError::Auth`] when the parent closes the connection (it refused
/// our proof) or does not prove the secret itself; I/O errors; a timeout.
///
/// Cancel safety: not cancel safe; drop the stream if cancelled.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    node_id: u32,
    peer: &str,
    limit: Duration,
) -> Result<(), TransportError> {
    answer_and_check(stream, secret, node_id, None, peer, limit).await
}

async fn answer_and_check<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    node_id: u32,
    rail: Option<([u8; TOKEN], u8, u8)>,
    peer: &str,
    limit: Duration,
) -> Result<(), TransportError> {
    timed(limit, &format!("handshake with {peer}"), async {
        let mut hello = [0u8; 4 + 1 + NONCE];
        stream.read_exact(&mut hello).await.map_err(io_err(peer, "reading challenge"))?;
        if &hello[..4] != MAGIC || hello[4] != VERSION {
            return Err(TransportError::Auth {
                peer: peer.to_owned(),
                reason: "the peer is not a treecast node of this version".into(),
            });
        }
        let nonce_p = &hello[5..];
        let nonce_c = nonce();
        let mut answer = Vec::with_capacity(4 + 1 + 4 + TOKEN + 2 + NONCE + MAC);
        answer.extend_from_slice(MAGIC);
        match rail {
            None => {
                answer.push(VERSION);
                answer.extend_from_slice(&node_id.to_le_bytes());
                answer.extend_from_slice(&nonce_c);
                answer.extend_from_slice(
                    &mac(secret, b"treecast child", nonce_p, &nonce_c, node_id).finalize().into_bytes(),
                );
            }
            Some((token, index, count)) => {
                answer.push(RAIL_VERSION);
                answer.extend_from_slice(&node_id.to_le_bytes());
                answer.extend_from_slice(&token);
                answer.extend_from_slice(&[index, count]);
                answer.extend_from_slice(&nonce_c);
                let m = rail_mac(secret, nonce_p, &nonce_c, node_id, &token, [index, count]);
                answer.extend_from_slice(&m.finalize().into_bytes());
            }
        }
        stream.write_all(&answer).await.map_err(io_err(peer, "answering challenge"))?;
        let mut mac_p = [0u8; MAC];
        let read = stream.read_exact(&mut mac_p).await;
        if read.is_ok() && mac_p == *BUSY {
            return Err(TransportError::Busy { peer: peer.to_owned() });
        }
        read.map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => TransportError::Auth {
                peer: peer.to_owned(),
                reason:
                    "the parent closed the link: it refused our proof (is TREECAST_SECRET from this session?)"
                        .into(),
            },
            _ => TransportError::Io { what: format!("reading challenge response from {peer}"), source: e },
        })?;
        mac(secret, b"treecast parent", &nonce_c, nonce_p, node_id).verify_slice(&mac_p).map_err(|_| {
            TransportError::Auth {
                peer: peer.to_owned(),
                reason: "the parent did not prove the session secret".into(),
            }
        })
    })
    .await
}

/// What a child's answer said it is (see [`accept_any`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// A link of its own.
    Link {
        /// The child's node id.
        node_id: u32,
    },
    /// Connection `index` of the `count` connections of the striped link `token`.
    Rail {
        /// The child's node id.
        node_id: u32,
        /// Names the striped link, the same on all its connections.
        token: [u8; TOKEN],
        /// This connection's place, from 0.
        index: u8,
        /// How many connections the link has.
        count: u8,
    },
}

fn rail_mac(
    secret: &Secret,
    nonce_p: &[u8],
    nonce_c: &[u8],
    node_id: u32,
    token: &[u8],
    place: [u8; 2],
) -> HmacSha256 {
    let mut m = mac(secret, b"treecast rail", nonce_p, nonce_c, node_id);
    m.update(token);
    m.update(&place);
    m
}

/// Parent side: as [`accept`], and also takes a connection of a striped link
/// ([`connect_rail`]), saying which.
///
/// # Errors
/// As [`accept`]; also a rail whose index is not below its count.
///
/// Cancel safety: not cancel safe; drop the stream if cancelled.
pub async fn accept_any<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    peer: &str,
    limit: Duration,
) -> Result<Accepted, TransportError> {
    timed(limit, &format!("handshake with {peer}"), async {
        let nonce_p = nonce();
        let mut hello = Vec::with_capacity(4 + 1 + NONCE);
        hello.extend_from_slice(MAGIC);
        hello.push(VERSION);
        hello.extend_from_slice(&nonce_p);
        stream.write_all(&hello).await.map_err(io_err(peer, "sending challenge"))?;

        let mut head = [0u8; 4 + 1 + 4];
        stream.read_exact(&mut head).await.map_err(io_err(peer, "reading challenge answer"))?;
        let refuse = |reason: &str| TransportError::Auth { peer: peer.to_owned(), reason: reason.to_owned() };
        if &head[..4] != MAGIC || !(head[4] == VERSION || head[4] == RAIL_VERSION) {
            return Err(refuse("the peer does not speak the treecast handshake (wrong program or version)"));
        }
        let node_id = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
        let rail = head[4] == RAIL_VERSION;
        let mut place = [0u8; TOKEN + 2];
        if rail {
            stream.read_exact(&mut place).await.map_err(io_err(peer, "reading challenge answer"))?;
        }
        let mut rest = [0u8; NONCE + MAC];
        stream.read_exact(&mut rest).await.map_err(io_err(peer, "reading challenge answer"))?;
        let (nonce_c, mac_c) = rest.split_at(NONCE);
        let (token, index_count) = place.split_at(TOKEN);
        let expected = match rail {
            true => rail_mac(secret, &nonce_p, nonce_c, node_id, token, [index_count[0], index_count[1]]),
            false => mac(secret, b"treecast child", &nonce_p, nonce_c, node_id),
        };
        expected
            .verify_slice(mac_c)
            .map_err(|_| refuse(&format!("node id {node_id} did not prove the session secret")))?;
        let (index, count) = (index_count[0], index_count[1]);
        if rail && index >= count {
            return Err(refuse(&format!("connection {index} of a striped link of {count} connections")));
        }
        let mac_p = mac(secret, b"treecast parent", nonce_c, &nonce_p, node_id).finalize().into_bytes();
        stream.write_all(&mac_p).await.map_err(io_err(peer, "sending challenge response"))?;
        let mut t = [0u8; TOKEN];
        t.copy_from_slice(token);
        Ok(match rail {
            true => Accepted::Rail { node_id, token: t, index, count },
            false => Accepted::Link { node_id },
        })
    })
    .await
}

/// Child side: answers the parent's challenge as connection `index` of the `count`
/// connections of the striped link `token`, and checks the parent's proof.
///
/// # Errors
/// As [`connect`].
///
/// Cancel safety: not cancel safe; drop the stream if cancelled.
pub async fn connect_rail<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    node_id: u32,
    token: [u8; TOKEN],
    (index, count): (u8, u8),
    peer: &str,
    limit: Duration,
) -> Result<(), TransportError> {
    answer_and_check(stream, secret, node_id, Some((token, index, count)), peer, limit).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_child_turned_away_is_told_to_try_again_not_that_its_secret_is_wrong() {
        let (mut parent, mut child) = tokio::io::duplex(1024);
        let s = Secret::generate();
        let connecting = tokio::spawn(async move { connect(&mut child, &s, 3, "parent", LIMIT).await });
        // The parent's hello, then, instead of reading the answer, it turns the child away.
        let mut hello = MAGIC.to_vec();
        hello.push(VERSION);
        hello.extend_from_slice(&nonce());
        parent.write_all(&hello).await.unwrap();
        let mut answer = [0u8; 4 + 1 + 4 + NONCE + MAC];
        parent.read_exact(&mut answer).await.unwrap();
        turn_away(&mut parent).await;
        let err = connecting.await.unwrap().unwrap_err();
        assert!(matches!(err, TransportError::Busy { .. }), "{err}");
        assert!(err.to_string().contains("try again"), "{err}");
    }

    #[tokio::test]
    async fn matching_secrets_authenticate_both_ways() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = Secret::generate();
        let s2 = s.clone();
        let child = tokio::spawn(async move { connect(&mut b, &s2, 42, "parent", LIMIT).await });
        assert_eq!(accept(&mut a, &s, "child", LIMIT).await.unwrap(), 42);
        child.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_and_child_learns_it() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let child = tokio::spawn(async move {
            let r = connect(&mut b, &Secret::generate(), 7, "parent", LIMIT).await;
            drop(b);
            r
        });
        let err = accept(&mut a, &Secret::generate(), "child", LIMIT).await.unwrap_err();
        assert!(err.to_string().contains("did not prove the session secret"), "{err}");
        drop(a);
        let child_err = child.await.unwrap().unwrap_err();
        assert!(matches!(child_err, TransportError::Auth { .. }), "{child_err}");
    }

    #[tokio::test]
    async fn garbage_peer_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            let mut buf = [0u8; 37];
            let _ = b.read_exact(&mut buf).await;
            let _ = b.write_all(&[0x47; 73]).await;
        });
        let err = accept(&mut a, &Secret::generate(), "child", LIMIT).await.unwrap_err();
        assert!(err.to_string().contains("does not speak"), "{err}");
    }

    #[tokio::test]
    async fn a_rail_is_accepted_with_its_token_and_place_and_refused_by_plain_accept() {
        let s = Secret::generate();
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s2 = s.clone();
        let child =
            tokio::spawn(
                async move { connect_rail(&mut b, &s2, 9, [7; TOKEN], (1, 2), "parent", LIMIT).await },
            );
        let got = accept_any(&mut a, &s, "child", LIMIT).await.unwrap();
        assert_eq!(got, Accepted::Rail { node_id: 9, token: [7; TOKEN], index: 1, count: 2 });
        child.await.unwrap().unwrap();

        let (mut a, mut b) = tokio::io::duplex(1024);
        let s2 = s.clone();
        tokio::spawn(async move { connect_rail(&mut b, &s2, 9, [7; TOKEN], (0, 2), "parent", LIMIT).await });
        assert!(accept(&mut a, &s, "child", LIMIT).await.is_err());

        let (mut a, mut b) = tokio::io::duplex(1024);
        let s2 = s.clone();
        tokio::spawn(async move { connect(&mut b, &s2, 4, "parent", LIMIT).await });
        assert_eq!(accept_any(&mut a, &s, "child", LIMIT).await.unwrap(), Accepted::Link { node_id: 4 });

        let (mut a, mut b) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            connect_rail(&mut b, &Secret::generate(), 9, [7; TOKEN], (0, 2), "parent", LIMIT).await
        });
        let err = accept_any(&mut a, &s, "child", LIMIT).await.unwrap_err();
        assert!(err.to_string().contains("did not prove"), "{err}");
    }

    #[tokio::test]
    async fn silent_peer_times_out() {
        let (mut a, _b) = tokio::io::duplex(1024);
        let err = accept(&mut a, &Secret::generate(), "child", Duration::from_millis(50)).await.unwrap_err();
        assert!(matches!(err, TransportError::Timeout { .. }));
    }
}
