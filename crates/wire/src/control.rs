//! Control messages: how nodes build the tree, create streams and report failures.
//!
//! A control frame's payload is one tag byte followed by the message's fields,
//! little-endian, strings as `u32` length + UTF-8.

use crate::codec::{put_string, Reader};
use crate::{DecodeError, RankSet};

/// How a node groups packets arriving from its children into waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// One packet from every live child that reaches a stream member (the default).
    WaitForAll,
    /// Wait for all, but release what has arrived after this many milliseconds.
    TimeOut(u32),
    /// Every packet is a wave of its own.
    DoNotWait,
}

/// The built-in transformation filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TransformKind {
    /// Pass every packet through unchanged.
    Null = 0,
    /// Element-wise sum of numeric values.
    Sum = 1,
    /// Element-wise minimum.
    Min = 2,
    /// Element-wise maximum.
    Max = 3,
    /// Element-wise average, weighted by the number of back-ends behind each packet.
    Avg = 4,
    /// Concatenation of arrays (scalars become one-element arrays).
    Concat = 5,
    /// Equivalence classes: ranks grouped by equal payload.
    EqClass = 6,
}

impl TransformKind {
    /// Every built-in kind, for help texts and tests.
    pub const ALL: [TransformKind; 7] = [
        TransformKind::Null,
        TransformKind::Sum,
        TransformKind::Min,
        TransformKind::Max,
        TransformKind::Avg,
        TransformKind::Concat,
        TransformKind::EqClass,
    ];

    /// The lower-case name used on command lines and in errors.
    pub fn name(self) -> &'static str {
        match self {
            TransformKind::Null => "null",
            TransformKind::Sum => "sum",
            TransformKind::Min => "min",
            TransformKind::Max => "max",
            TransformKind::Avg => "avg",
            TransformKind::Concat => "concat",
            TransformKind::EqClass => "eqclass",
        }
    }

    fn from_u8(b: u8) -> Result<Self, DecodeError> {
        TransformKind::ALL.into_iter().find(|k| *k as u8 == b).ok_or(DecodeError::Invalid {
            what: "transformation filter",
            detail: format!("unknown filter id {b}"),
        })
    }
}

impl SyncMode {
    fn encode(self, out: &mut Vec<u8>) {
        let (code, param) = match self {
            SyncMode::WaitForAll => (0u8, 0u32),
            SyncMode::TimeOut(ms) => (1, ms),
            SyncMode::DoNotWait => (2, 0),
        };
        out.push(code);
        out.extend_from_slice(&param.to_le_bytes());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let code = r.u8("sync mode")?;
        let param = r.u32("sync mode")?;
        match code {
            0 => Ok(SyncMode::WaitForAll),
            1 => Ok(SyncMode::TimeOut(param)),
            2 => Ok(SyncMode::DoNotWait),
            other => Err(DecodeError::Invalid { what: "sync mode", detail: format!("unknown mode {other}") }),
        }
    }
}

/// A message between nodes, carried in a [`crate::FrameKind::Control`] frame.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ControlMsg {
    /// Parent to a new comm node: the sub-tree it is responsible for.
    Subtree {
        /// The sub-tree rooted at the receiver, in the MRNet topology text format.
        topology: String,
        /// Node id of the receiver; its descendants follow in pre-order.
        first_id: u32,
        /// Rank of the first back-end of this sub-tree; the others follow in order.
        first_rank: u32,
        /// Number of back-ends in the whole network.
        total_backends: u32,
        /// Back-end program and arguments; empty means the generic `treecast backend`.
        backend: Vec<String>,
        /// Extra environment for back-ends.
        env: Vec<(String, String)>,
        /// How long each level may take to start, in milliseconds.
        startup_timeout_ms: u32,
    },
    /// Child to parent: the sub-tree is up.
    Ready {
        /// Back-end ranks reached through the sender.
        ranks: RankSet,
        /// Comm nodes in the sender's sub-tree, the sender included.
        commnodes: u32,
    },
    /// Child to parent: the sub-tree could not be started.
    LaunchFailed {
        /// What failed, naming the node, its host and its output.
        message: String,
    },
    /// Front-end to the tree: a new stream.
    NewStream {
        /// Stream id (1 and up).
        id: u32,
        /// The communicator: back-end ranks of the stream.
        ranks: RankSet,
        /// Upstream synchronisation.
        sync: SyncMode,
        /// Upstream transformation.
        up: TransformKind,
        /// Downstream transformation.
        down: TransformKind,
    },
    /// Front-end to the tree: a stream is closed.
    CloseStream {
        /// Stream id.
        id: u32,
    },
    /// Upstream: back-ends were lost.
    RanksLost {
        /// The ranks no longer reachable.
        ranks: RankSet,
        /// Why, naming the node that noticed.
        reason: String,
    },
    /// Upstream: a filter refused a packet.
    FilterError {
        /// Stream of the packet.
        stream: u32,
        /// Source rank of the refused packet.
        rank: u32,
        /// What did not match.
        message: String,
    },
    /// Upstream, in attach mode: where the back-ends of these ranks must connect.
    AttachPoints {
        /// `(rank, node id, parent address)` for every back-end slot of the sub-tree.
        points: Vec<(u32, u32, String)>,
    },
    /// Downstream: exit now, taking every descendant down.
    Shutdown,
}

const SUBTREE: u8 = 1;
const READY: u8 = 2;
const LAUNCH_FAILED: u8 = 3;
const NEW_STREAM: u8 = 4;
const CLOSE_STREAM: u8 = 5;
const RANKS_LOST: u8 = 6;
const FILTER_ERROR: u8 = 7;
const SHUTDOWN: u8 = 8;
const ATTACH_POINTS: u8 = 9;

impl ControlMsg {
    /// The payload bytes of a control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            ControlMsg::Subtree {
                topology,
                first_id,
                first_rank,
                total_backends,
                backend,
                env,
                startup_timeout_ms,
            } => {
                out.push(SUBTREE);
                put_string(&mut out, topology);
                for v in [first_id, first_rank, total_backends] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&(backend.len() as u32).to_le_bytes());
                for arg in backend {
                    put_string(&mut out, arg);
                }
                out.extend_from_slice(&(env.len() as u32).to_le_bytes());
                for (k, v) in env {
                    put_string(&mut out, k);
                    put_string(&mut out, v);
                }
                out.extend_from_slice(&startup_timeout_ms.to_le_bytes());
            }
            ControlMsg::Ready { ranks, commnodes } => {
                out.push(READY);
                ranks.encode(&mut out);
                out.extend_from_slice(&commnodes.to_le_bytes());
            }
            ControlMsg::LaunchFailed { message } => {
                out.push(LAUNCH_FAILED);
                put_string(&mut out, message);
            }
            ControlMsg::NewStream { id, ranks, sync, up, down } => {
                out.push(NEW_STREAM);
                out.extend_from_slice(&id.to_le_bytes());
                ranks.encode(&mut out);
                sync.encode(&mut out);
                out.push(*up as u8);
                out.push(*down as u8);
            }
            ControlMsg::CloseStream { id } => {
                out.push(CLOSE_STREAM);
                out.extend_from_slice(&id.to_le_bytes());
            }
            ControlMsg::RanksLost { ranks, reason } => {
                out.push(RANKS_LOST);
                ranks.encode(&mut out);
                put_string(&mut out, reason);
            }
            ControlMsg::FilterError { stream, rank, message } => {
                out.push(FILTER_ERROR);
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&rank.to_le_bytes());
                put_string(&mut out, message);
            }
            ControlMsg::Shutdown => out.push(SHUTDOWN),
            ControlMsg::AttachPoints { points } => {
                out.push(ATTACH_POINTS);
                out.extend_from_slice(&(points.len() as u32).to_le_bytes());
                for (rank, id, addr) in points {
                    out.extend_from_slice(&rank.to_le_bytes());
                    out.extend_from_slice(&id.to_le_bytes());
                    put_string(&mut out, addr);
                }
            }
        }
        out
    }

    /// Decodes a control frame's payload.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the malformed field; trailing bytes are an error.
    pub fn decode(buf: &[u8]) -> Result<ControlMsg, DecodeError> {
        let mut r = Reader::new(buf);
        let msg = match r.u8("control tag")? {
            SUBTREE => {
                let topology = r.string("sub-tree topology")?;
                let first_id = r.u32("sub-tree")?;
                let first_rank = r.u32("sub-tree")?;
                let total_backends = r.u32("sub-tree")?;
                let n = r.len_u32("back-end command", r.remaining() / 4)?;
                let backend = (0..n).map(|_| r.string("back-end argument")).collect::<Result<_, _>>()?;
                let n = r.len_u32("environment", r.remaining() / 8)?;
                let env = (0..n)
                    .map(|_| Ok((r.string("environment name")?, r.string("environment value")?)))
                    .collect::<Result<_, DecodeError>>()?;
                let startup_timeout_ms = r.u32("sub-tree")?;
                ControlMsg::Subtree {
                    topology,
                    first_id,
                    first_rank,
                    total_backends,
                    backend,
                    env,
                    startup_timeout_ms,
                }
            }
            READY => ControlMsg::Ready { ranks: RankSet::decode(&mut r)?, commnodes: r.u32("ready")? },
            LAUNCH_FAILED => ControlMsg::LaunchFailed { message: r.string("launch failure")? },
            NEW_STREAM => ControlMsg::NewStream {
                id: r.u32("new stream")?,
                ranks: RankSet::decode(&mut r)?,
                sync: SyncMode::decode(&mut r)?,
                up: TransformKind::from_u8(r.u8("new stream")?)?,
                down: TransformKind::from_u8(r.u8("new stream")?)?,
            },
            CLOSE_STREAM => ControlMsg::CloseStream { id: r.u32("close stream")? },
            RANKS_LOST => {
                ControlMsg::RanksLost { ranks: RankSet::decode(&mut r)?, reason: r.string("ranks lost")? }
            }
            FILTER_ERROR => ControlMsg::FilterError {
                stream: r.u32("filter error")?,
                rank: r.u32("filter error")?,
                message: r.string("filter error")?,
            },
            SHUTDOWN => ControlMsg::Shutdown,
            ATTACH_POINTS => {
                let n = r.len_u32("attach points", r.remaining() / 12)?;
                let points = (0..n)
                    .map(|_| {
                        Ok((r.u32("attach point")?, r.u32("attach point")?, r.string("attach address")?))
                    })
                    .collect::<Result<_, DecodeError>>()?;
                ControlMsg::AttachPoints { points }
            }
            other => return Err(DecodeError::UnknownControl(other)),
        };
        r.finish("control message")?;
        Ok(msg)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn samples() -> Vec<ControlMsg> {
        vec![
            ControlMsg::Subtree {
                topology: "localhost:1 => localhost:2 ;".into(),
                first_id: 1,
                first_rank: 0,
                total_backends: 4,
                backend: vec!["/bin/tool".into(), "-v".into()],
                env: vec![("A".into(), "b".into())],
                startup_timeout_ms: 30_000,
            },
            ControlMsg::Ready { ranks: RankSet::range(0, 16), commnodes: 5 },
            ControlMsg::LaunchFailed { message: "node 3 on localhost: exited".into() },
            ControlMsg::NewStream {
                id: 3,
                ranks: RankSet::range(4, 4),
                sync: SyncMode::TimeOut(50),
                up: TransformKind::Sum,
                down: TransformKind::Null,
            },
            ControlMsg::CloseStream { id: 3 },
            ControlMsg::RanksLost { ranks: RankSet::single(7), reason: "link closed".into() },
            ControlMsg::FilterError { stream: 2, rank: 1, message: "bad".into() },
            ControlMsg::Shutdown,
            ControlMsg::AttachPoints {
                points: vec![(0, 3, "unix:/tmp/x/s".into()), (1, 3, "10.0.0.1:4000".into())],
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(ControlMsg::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn truncation_anywhere_is_an_error_not_a_panic() {
        for m in samples() {
            let bytes = m.encode();
            for cut in 0..bytes.len() {
                assert!(ControlMsg::decode(&bytes[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ControlMsg::decode(&longer).is_err());
        }
    }
}
