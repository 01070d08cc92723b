//! Route messages: what two nodes' drivers tell each other about how frames travel
//! between them, in frames of kind [`crate::FrameKind::Route`]. The protocol core
//! never sees them.
//!
//! Today they set up the multicast route over UDP: a parent offers its children a
//! place in its multicast group, a child joins or declines, the parent makes a
//! joined child a member from a given message on, and for a frame sent by
//! multicast the link itself carries a placeholder, [`RouteMsg::Carried`], in the
//! frame's place, so that the frame keeps its order among the link's other frames.
//!
//! Layout (little-endian): a tag byte, then the fields in order. An address is a
//! family byte (4 or 6), the address bytes and a `u16` port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::codec::put_string;
use crate::{DecodeError, Reader};

/// A parent's offer of a place in its multicast group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McastOffer {
    /// The parent's node id, which names its group in every datagram.
    pub node: u32,
    /// Where the group's data goes: an IP multicast group or a broadcast address, and a port.
    pub group: SocketAddr,
    /// The parent's socket: data comes only from it, answers go to it.
    pub sender: SocketAddr,
    /// Largest congestion window of the sender, fragments: what a member keeps
    /// past a gap is bounded by it.
    pub max_cwnd: u32,
    /// Payload bytes of every fragment but a message's last.
    pub fragment: u32,
    /// Silence within a message before the child asks for what it misses, microseconds.
    pub receiver_timeout_us: u32,
    /// Shortest time between two identical requests, microseconds.
    pub nack_repeat_us: u32,
    /// Silence of the sender, while the child waits for data, before the link is
    /// given up, milliseconds.
    pub silent_limit_ms: u32,
    /// Largest message the child assembles, bytes.
    pub max_message: u32,
    /// Longest random wait before the child NACKs a gap, microseconds (0: at once).
    pub nack_backoff_us: u32,
}

/// A route message; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteMsg {
    /// Parent to child: join my multicast group.
    Offer(McastOffer),
    /// Child to parent: bound and joined (reading nothing yet); my answers come from
    /// `answers_from`.
    Joined {
        /// The child's socket for ACKs and NACKs; the parent takes answers only from it.
        answers_from: SocketAddr,
    },
    /// Child to parent: not joined, so the link carries everything.
    Declined {
        /// Why, for the parent's log.
        reason: String,
    },
    /// Parent to child: in this place the link carries multicast message `message`.
    Carried {
        /// The message's id in the parent's group.
        message: u32,
    },
    /// Parent to child, after `Joined`: you are a member from message `first` on
    /// (every message from it waits for your acknowledgement); start reading.
    Member {
        /// The first message the child is a member for; earlier ones are not for it.
        first: u32,
    },
}

const OFFER: u8 = 1;
const JOINED: u8 = 2;
const DECLINED: u8 = 3;
const CARRIED: u8 = 4;
const MEMBER: u8 = 5;

/// Longest reason a decline carries, bytes.
pub const MAX_DECLINE_REASON: usize = 1024;

impl RouteMsg {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            RouteMsg::Offer(o) => {
                out.push(OFFER);
                put_addr(&mut out, &o.group);
                put_addr(&mut out, &o.sender);
                for v in [
                    o.node,
                    o.max_cwnd,
                    o.fragment,
                    o.receiver_timeout_us,
                    o.nack_repeat_us,
                    o.silent_limit_ms,
                    o.max_message,
                    o.nack_backoff_us,
                ] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            RouteMsg::Joined { answers_from } => {
                out.push(JOINED);
                put_addr(&mut out, answers_from);
            }
            RouteMsg::Declined { reason } => {
                out.push(DECLINED);
                let cut = cut_at_char(reason, MAX_DECLINE_REASON);
                put_string(&mut out, cut);
            }
            RouteMsg::Carried { message } => {
                out.push(CARRIED);
                out.extend_from_slice(&message.to_le_bytes());
            }
            RouteMsg::Member { first } => {
                out.push(MEMBER);
                out.extend_from_slice(&first.to_le_bytes());
            }
        }
        out
    }

    /// Reads a message; every byte must belong to it.
    ///
    /// # Errors
    /// An unknown tag, truncation, an address family other than 4 or 6, a fragment
    /// of 0 bytes, a reason too long, trailing bytes.
    pub fn decode(buf: &[u8]) -> Result<RouteMsg, DecodeError> {
        let mut r = Reader::new(buf);
        let msg = match r.u8("route message")? {
            OFFER => {
                let group = addr(&mut r, "offer group")?;
                let sender = addr(&mut r, "offer sender")?;
                let offer = McastOffer {
                    group,
                    sender,
                    node: r.u32("offer")?,
                    max_cwnd: r.u32("offer")?,
                    fragment: r.u32("offer")?,
                    receiver_timeout_us: r.u32("offer")?,
                    nack_repeat_us: r.u32("offer")?,
                    silent_limit_ms: r.u32("offer")?,
                    max_message: r.u32("offer")?,
                    nack_backoff_us: r.u32("offer")?,
                };
                if offer.fragment == 0 {
                    return Err(DecodeError::Invalid {
                        what: "offer fragment",
                        detail: "a fragment of 0 bytes".into(),
                    });
                }
                RouteMsg::Offer(offer)
            }
            JOINED => RouteMsg::Joined { answers_from: addr(&mut r, "joined address")? },
            DECLINED => {
                let reason = r.string("decline reason")?;
                if reason.len() > MAX_DECLINE_REASON {
                    return Err(DecodeError::TooLong {
                        what: "decline reason",
                        len: reason.len() as u64,
                        max: MAX_DECLINE_REASON as u64,
                    });
                }
                RouteMsg::Declined { reason }
            }
            CARRIED => RouteMsg::Carried { message: r.u32("carried message")? },
            MEMBER => RouteMsg::Member { first: r.u32("member's first message")? },
            other => {
                return Err(DecodeError::Invalid {
                    what: "route message tag",
                    detail: format!("{other} is not a route message (1 to 5)"),
                })
            }
        };
        r.finish("route message")?;
        Ok(msg)
    }
}

fn cut_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn addr(r: &mut Reader<'_>, what: &'static str) -> Result<SocketAddr, DecodeError> {
    let ip = match r.u8(what)? {
        4 => {
            let b = r.take(4, what)?;
            IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        }
        6 => {
            let b = r.take(16, what)?;
            let mut o = [0u8; 16];
            o.copy_from_slice(b);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        other => {
            return Err(DecodeError::Invalid {
                what,
                detail: format!("address family {other} (4 or 6 expected)"),
            })
        }
    };
    Ok(SocketAddr::new(ip, r.u16(what)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn offer() -> RouteMsg {
        RouteMsg::Offer(McastOffer {
            group: "239.255.84.67:4000".parse().unwrap(),
            sender: "[::1]:5000".parse().unwrap(),
            node: 3,
            max_cwnd: 256,
            fragment: 1432,
            receiver_timeout_us: 100_000,
            nack_repeat_us: 1000,
            silent_limit_ms: 10_000,
            max_message: 1 << 28,
            nack_backoff_us: 200,
        })
    }

    #[test]
    fn every_message_round_trips() {
        for m in [
            offer(),
            RouteMsg::Joined { answers_from: "10.0.0.2:999".parse().unwrap() },
            RouteMsg::Declined { reason: "no multicast here".into() },
            RouteMsg::Carried { message: u32::MAX },
            RouteMsg::Member { first: 7 },
        ] {
            assert_eq!(RouteMsg::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn the_carried_placeholder_is_five_bytes() {
        assert_eq!(RouteMsg::Carried { message: 0x0102_0304 }.encode(), vec![4, 4, 3, 2, 1]);
    }

    #[test]
    fn bad_bytes_say_what_is_wrong() {
        let err = RouteMsg::decode(&[9]).unwrap_err();
        assert!(err.to_string().contains("route message tag"), "{err}");
        let mut bad_family = offer().encode();
        bad_family[1] = 5;
        assert!(RouteMsg::decode(&bad_family).unwrap_err().to_string().contains("address family 5"));
        let mut trailing = RouteMsg::Carried { message: 1 }.encode();
        trailing.push(0);
        assert!(matches!(RouteMsg::decode(&trailing), Err(DecodeError::TrailingBytes { .. })));
        let full = offer().encode();
        assert!(matches!(RouteMsg::decode(&full[..full.len() - 1]), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn a_long_reason_is_cut_on_a_character_boundary() {
        let reason = "é".repeat(MAX_DECLINE_REASON);
        let RouteMsg::Declined { reason: back } =
            RouteMsg::decode(&RouteMsg::Declined { reason }.encode()).unwrap()
        else {
            panic!("not a decline")
        };
        assert_eq!(back.len(), MAX_DECLINE_REASON);
    }
}
