//! The hello two networks' front-ends exchange once their link is authenticated
//! (`NetworkPort::accept` and `Network::connect_network` in the API): which session each
//! is, how many ranks it has, and the number it gives the other network, whose
//! ranks it counts from there.

use crate::codec::{put_string, Reader};
use crate::{DecodeError, PROTOCOL_VERSION};

/// The first bytes of a hello.
pub const NETWORK_HELLO_MAGIC: &[u8; 4] = b"TCNW";
/// Bytes of a hello before its session name: magic, version, size, index, name length.
pub const NETWORK_HELLO_HEAD: usize = 4 + 1 + 4 + 4 + 4;
/// Longest session name a hello carries.
pub const MAX_HELLO_SESSION: usize = 256;

/// One front-end's hello to another network's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkHello {
    /// The sender's session.
    pub session: String,
    /// The sender's ranks, 0 to `size - 1`.
    pub size: u32,
    /// The sender's number for the receiver's network.
    pub index: u32,
}

/// The bytes of `hello` (a session name past [`MAX_HELLO_SESSION`] is cut).
pub fn encode_network_hello(hello: &NetworkHello) -> Vec<u8> {
    let mut session = hello.session.as_str();
    while session.len() > MAX_HELLO_SESSION {
        let mut end = MAX_HELLO_SESSION;
        while !session.is_char_boundary(end) {
            end -= 1;
        }
        session = &session[..end];
    }
    let mut out = Vec::with_capacity(NETWORK_HELLO_HEAD + session.len());
    out.extend_from_slice(NETWORK_HELLO_MAGIC);
    out.push(PROTOCOL_VERSION);
    out.extend_from_slice(&hello.size.to_le_bytes());
    out.extend_from_slice(&hello.index.to_le_bytes());
    put_string(&mut out, session);
    out
}

/// The whole length of the hello that starts with `head` (its first
/// [`NETWORK_HELLO_HEAD`] bytes), so that a reader knows how much more to read.
///
/// # Errors
/// Not a hello of this version, or a session name past [`MAX_HELLO_SESSION`].
pub fn network_hello_len(head: &[u8]) -> Result<usize, DecodeError> {
    let mut r = Reader::new(head);
    let magic = r.take(4, "network hello")?;
    if magic != NETWORK_HELLO_MAGIC {
        return Err(DecodeError::Invalid {
            what: "network hello",
            detail: "the peer is not a treecast front-end".into(),
        });
    }
    let version = r.u8("network hello version")?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::BadVersion { found: version, expected: PROTOCOL_VERSION });
    }
    r.take(8, "network hello")?;
    let len = r.len_u32("network hello session", MAX_HELLO_SESSION)?;
    Ok(NETWORK_HELLO_HEAD + len)
}

/// Reads a hello.
///
/// # Errors
/// Those of [`network_hello_len`], truncation, trailing bytes, a session name
/// that is not UTF-8.
pub fn decode_network_hello(bytes: &[u8]) -> Result<NetworkHello, DecodeError> {
    network_hello_len(bytes)?;
    let mut r = Reader::new(bytes);
    r.take(5, "network hello")?;
    let size = r.u32("network hello size")?;
    let index = r.u32("network hello index")?;
    let session = r.string("network hello session")?;
    r.finish("network hello")?;
    Ok(NetworkHello { session, size, index })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_round_trips_and_says_its_length_from_its_head() {
        let hello = NetworkHello { session: "1f2e3d4c".into(), size: 16, index: 3 };
        let bytes = encode_network_hello(&hello);
        assert_eq!(network_hello_len(&bytes[..NETWORK_HELLO_HEAD]).unwrap(), bytes.len());
        assert_eq!(decode_network_hello(&bytes).unwrap(), hello);
    }

    #[test]
    fn bad_hellos_are_errors_that_say_why() {
        let bytes = encode_network_hello(&NetworkHello { session: "s".into(), size: 1, index: 0 });
        let mut other = bytes.clone();
        other[0] = b'X';
        assert!(decode_network_hello(&other).unwrap_err().to_string().contains("not a treecast front-end"));
        let mut old = bytes.clone();
        old[4] = PROTOCOL_VERSION - 1;
        assert!(matches!(decode_network_hello(&old), Err(DecodeError::BadVersion { .. })));
        assert!(decode_network_hello(&bytes[..bytes.len() - 1]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_network_hello(&long).is_err());
        let mut huge = bytes;
        huge[13..17].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(network_hello_len(&huge[..NETWORK_HELLO_HEAD]), Err(DecodeError::TooLong { .. })));
    }

    #[test]
    fn a_long_session_name_is_cut_at_a_character() {
        let hello = NetworkHello { session: "é".repeat(200), size: 1, index: 0 };
        let back = decode_network_hello(&encode_network_hello(&hello)).unwrap();
        assert!(back.session.len() <= MAX_HELLO_SESSION && back.session.chars().all(|c| c == 'é'));
    }
}
