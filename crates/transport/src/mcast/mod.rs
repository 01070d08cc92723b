//! The reliable multicast route over UDP, as a protocol with no I/O: a [`Sender`]
//! at the node that multicasts to its children and a [`Receiver`] at each child
//! (`docs/multicast.md`).
//!
//! Follows the published design of reliable UDP-broadcast MPI_Bcast (pgmcc-like):
//! fragments to the MTU; receivers NACK a gap or, in the middle of a message, a
//! silence; every receiver ACKs a message's last fragment and the *acker* (the
//! receiver that NACKed last, the slowest) ACKs every fragment; the sender resends
//! what is NACKed (only the fragment named, by default, or everything from the
//! lowest NACKed offset after a short gathering wait, as published: [`Repair`]),
//! resends the last fragment when final ACKs are missing, and paces fragments with
//! a congestion window (slow start to `ssthresh`, then +1/cwnd per ACK, halved on
//! NACK). Groups are one node's children, so a NACK implosion stays the size of a
//! fan-out. [`sim`] is a simulated LAN for tests and `treecast bench route --sim`.
//!
//! Every datagram carries an HMAC-SHA-256 tag (truncated to 128 bits) of header and
//! payload under a key derived from the session secret ([`McastKey`]); the driver
//! drops a datagram whose tag does not match before it reaches the protocol.

mod batch;
mod config;
mod group;
mod receiver;
mod sender;
pub mod sim;
mod udp;

pub use config::{
    HalveOn, McastConfig, Repair, DEFAULT_GROUP, KEEP_PAST_GAP_FLOOR, MAX_IN_FLIGHT, UDP_VARIABLES,
};
pub use group::{route_frame, shares_subnet, GroupMember, GroupSender};
pub use receiver::{Receiver, ReceiverEvent, ReceiverStats};
pub use sender::{Sender, SenderEvent, SenderStats, BURST_LOSSES};
pub use udp::{drive_receiver, drive_sender, EndpointStats, UdpEndpoint};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use treecast_wire::{McastDatagram, MCAST_TAG_LEN};

use crate::Secret;

/// The key of a session's multicast datagrams, derived from the session secret
/// (never the secret itself, so a datagram tag says nothing about the link handshake key).
#[derive(Clone)]
pub struct McastKey {
    /// The HMAC with the derived key already absorbed, cloned for each datagram.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for McastKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McastKey(..)")
    }
}

impl McastKey {
    /// The multicast key of the session whose secret is `secret`.
    pub fn new(secret: &Secret) -> McastKey {
        let derived = hmac_sha256(secret.as_bytes(), b"treecast udp multicast datagram tag v1");
        McastKey { keyed: keyed(&derived) }
    }

    fn tag(&self, signed: &[u8]) -> [u8; MCAST_TAG_LEN] {
        let mut mac = self.keyed.clone();
        mac.update(signed);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; MCAST_TAG_LEN];
        tag.copy_from_slice(&full[..MCAST_TAG_LEN]);
        tag
    }

    /// Writes the tag of a datagram made by [`treecast_wire::encode_mcast`] into its
    /// last [`MCAST_TAG_LEN`] bytes.
    pub fn sign(&self, datagram: &mut [u8]) {
        let Some(split) = datagram.len().checked_sub(MCAST_TAG_LEN) else { return };
        let tag = self.tag(&datagram[..split]);
        datagram[split..].copy_from_slice(&tag);
    }

    /// The datagram was made in this session: its tag matches (compared in constant time).
    pub fn verify(&self, datagram: &McastDatagram<'_>) -> bool {
        let expected = self.tag(datagram.signed);
        expected.iter().zip(datagram.tag).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }
}

fn keyed(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: this cannot fail.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = keyed(key);
    mac.update(data);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use treecast_wire::{decode_mcast, encode_mcast, McastHeader};

    use super::*;

    #[test]
    fn a_datagram_signed_in_the_session_verifies_and_any_change_or_other_key_does_not() {
        let key = McastKey::new(&Secret::from_bytes([7; 32]));
        let mut d = Vec::new();
        encode_mcast(&McastHeader::data(1, 2, 3, 0, false, 4), b"payload", &mut d);
        key.sign(&mut d);
        assert!(key.verify(&decode_mcast(&d).unwrap()));
        let other = McastKey::new(&Secret::from_bytes([8; 32]));
        assert!(!other.verify(&decode_mcast(&d).unwrap()), "another session's key");
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 1;
            if let Ok(parsed) = decode_mcast(&bad) {
                assert!(!key.verify(&parsed), "byte {i} changed");
            }
        }
    }
}
