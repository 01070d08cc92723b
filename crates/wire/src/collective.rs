//! Payloads of collective operations among back-ends (peer frames with
//! [`FLAG_PEER_COLL`]): a head that names the operation, its members and who has
//! contributed so far, then a body.
//!
//! Going up (`down == false`) the body is a partial result: for a reduction the
//! encoded values folded so far, for a gather the entries of [`encode_entry`]. Going
//! down it is the result, for the ranks behind the link it is sent on (`members`);
//! a reduce-scatter's is narrowed on each link to their blocks. A head with an `error` carries no body: the
//! operation failed (a filter refused the values) and every member learns why.

use crate::codec::{put_string, Reader};
use crate::{DecodeError, Frame, FrameHeader, RankSet};

/// Peer frames only: part of a collective operation (head of
/// [`encode_collective`], then a body); the stream field is unused.
pub const FLAG_PEER_COLL: u16 = 64;

/// Longest error text a collective's head carries.
pub const MAX_COLLECTIVE_ERROR: usize = 4096;

/// What a collective operation computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// The members' values combined; the result goes to the root only (which need
    /// not be a member); the other members learn it is done.
    Reduce,
    /// The members' values combined; every member gets the result.
    AllReduce,
    /// Every member gets every member's values, by rank.
    AllGather,
    /// The members' arrays combined; each member keeps its block of the result.
    ReduceScatter,
    /// No values: every member returns once all have entered.
    Barrier,
}

impl CollectiveOp {
    fn code(self) -> u8 {
        match self {
            CollectiveOp::Reduce => 1,
            CollectiveOp::AllReduce => 2,
            CollectiveOp::AllGather => 3,
            CollectiveOp::ReduceScatter => 4,
            CollectiveOp::Barrier => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => CollectiveOp::Reduce,
            2 => CollectiveOp::AllReduce,
            3 => CollectiveOp::AllGather,
            4 => CollectiveOp::ReduceScatter,
            5 => CollectiveOp::Barrier,
            _ => return None,
        })
    }

    /// True for the operations that fold values with a [`Combine`].
    pub fn folds(self) -> bool {
        matches!(self, CollectiveOp::Reduce | CollectiveOp::AllReduce | CollectiveOp::ReduceScatter)
    }
}

/// How a reduction folds two members' values: element-wise over numeric scalars
/// and arrays, as the stream filters of the same names do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Combine {
    /// Nothing is folded (gathers and barriers).
    None,
    /// Sum (integers wrap around).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average, each member weighing one: partials inside the tree carry sums and
    /// weights as the `avg` stream filter's do, and the members' common ancestor
    /// turns them back into the members' types.
    Avg,
}

impl Combine {
    fn code(self) -> u8 {
        match self {
            Combine::None => 0,
            Combine::Sum => 1,
            Combine::Min => 2,
            Combine::Max => 3,
            Combine::Avg => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Combine::None,
            1 => Combine::Sum,
            2 => Combine::Min,
            3 => Combine::Max,
            4 => Combine::Avg,
            _ => return None,
        })
    }
}

/// The head of a collective's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveHead {
    /// What is computed.
    pub op: CollectiveOp,
    /// How values are folded ([`Combine::None`] unless `op` folds).
    pub combine: Combine,
    /// False for contributions on their way up, true for the result on its way down.
    pub down: bool,
    /// Which series of operations this is part of: every member computes it from
    /// the same member list, so no one has to hand it out.
    pub context: u64,
    /// The operation's number in its series (members number their calls alike).
    pub seq: u32,
    /// The rank a reduction's result goes to (`u32::MAX` for the other operations).
    pub root: u32,
    /// Up: every member. Down: the members (and root) behind the link it is sent on.
    pub members: RankSet,
    /// The members whose values are in the body.
    pub contributors: RankSet,
    /// Why the operation failed; empty when it did not.
    pub error: String,
    /// Reduce-scatter only (empty for the other operations): ranks in the group's
    /// order; the body's arrays hold one block per entry, block i for `order[i]`.
    /// Up, every member; down, the members behind the link, as the result is
    /// narrowed on each link to their blocks.
    pub order: Vec<u32>,
}

impl CollectiveHead {
    /// The key that tells one operation from another.
    pub fn key(&self) -> (u64, u32) {
        (self.context, self.seq)
    }
}

/// The payload of a collective frame: `head`, then `body`. An error text longer
/// than [`MAX_COLLECTIVE_ERROR`] bytes is cut at a character boundary so that the
/// frame always decodes.
pub fn encode_collective(head: &CollectiveHead, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 64 + head.error.len());
    out.push(head.op.code());
    out.push(head.combine.code());
    out.push(u8::from(head.down));
    out.extend_from_slice(&head.context.to_le_bytes());
    out.extend_from_slice(&head.seq.to_le_bytes());
    out.extend_from_slice(&head.root.to_le_bytes());
    head.members.encode(&mut out);
    head.contributors.encode(&mut out);
    put_string(&mut out, bounded(&head.error));
    out.extend_from_slice(&(head.order.len() as u32).to_le_bytes());
    for rank in &head.order {
        out.extend_from_slice(&rank.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// `text`, or as much of it as fits in [`MAX_COLLECTIVE_ERROR`] bytes.
fn bounded(text: &str) -> &str {
    if text.len() <= MAX_COLLECTIVE_ERROR {
        return text;
    }
    let mut end = MAX_COLLECTIVE_ERROR;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Splits a collective frame's payload into its head and the offset of its body.
///
/// # Errors
/// Truncation, an unknown operation or combine code, a direction byte other than 0
/// or 1, malformed rank sets, contributors outside the members on the way up, an
/// error text over [`MAX_COLLECTIVE_ERROR`] bytes, or an order that names a rank
/// twice, comes with another operation than reduce-scatter, or on the way up does
/// not name exactly the members.
pub fn decode_collective(payload: &[u8]) -> Result<(CollectiveHead, usize), DecodeError> {
    let mut r = Reader::new(payload);
    let what = "collective head";
    let op_code = r.u8(what)?;
    let op = CollectiveOp::from_code(op_code).ok_or_else(|| DecodeError::Invalid {
        what: "collective operation",
        detail: format!("code {op_code}"),
    })?;
    let combine_code = r.u8(what)?;
    let combine = Combine::from_code(combine_code).ok_or_else(|| DecodeError::Invalid {
        what: "collective combine",
        detail: format!("code {combine_code}"),
    })?;
    let down = match r.u8(what)? {
        0 => false,
        1 => true,
        other => {
            return Err(DecodeError::Invalid {
                what: "collective direction",
                detail: format!("byte {other}"),
            })
        }
    };
    let (context, seq, root) = (r.u64(what)?, r.u32(what)?, r.u32(what)?);
    let members = RankSet::decode(&mut r)?;
    let contributors = RankSet::decode(&mut r)?;
    if !down && !contributors.difference(&members).is_empty() {
        return Err(DecodeError::Invalid {
            what: "collective contributors",
            detail: format!("{contributors} are not all among the members {members}"),
        });
    }
    let len = r.len_u32("collective error", MAX_COLLECTIVE_ERROR)?;
    let offset = r.offset();
    let text = r.take(len, "collective error")?;
    let error = std::str::from_utf8(text)
        .map_err(|_| DecodeError::InvalidUtf8 { what: "collective error", offset })?
        .to_owned();
    let count = r.len_u32("collective order", r.remaining() / 4)?;
    let order = (0..count).map(|_| r.u32("collective order")).collect::<Result<Vec<u32>, _>>()?;
    let head = CollectiveHead { op, combine, down, context, seq, root, members, contributors, error, order };
    check_order(&head)?;
    Ok((head, r.offset()))
}

/// The ranks of a reduce-scatter's order as a set, or why they are not one: each
/// is named once (checked on a sorted copy, in O(n log n) whatever the order).
pub fn order_set(order: &[u32]) -> Result<RankSet, DecodeError> {
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(DecodeError::Invalid {
            what: "collective order",
            detail: "a rank is named twice".into(),
        });
    }
    // Ascending: each insert lands at the end of the set's ranges.
    Ok(sorted.into_iter().collect())
}

/// A reduce-scatter's order names each rank once, and on the way up exactly the
/// members; the other operations have none.
fn check_order(head: &CollectiveHead) -> Result<(), DecodeError> {
    let invalid = |detail: String| Err(DecodeError::Invalid { what: "collective order", detail });
    if head.op != CollectiveOp::ReduceScatter {
        if !head.order.is_empty() {
            return invalid(format!("{:?} has no order, but {} ranks came", head.op, head.order.len()));
        }
        return Ok(());
    }
    let set = order_set(&head.order)?;
    if !head.down && set != head.members {
        return invalid(format!("the order names {set}, the members are {}", head.members));
    }
    Ok(())
}

/// What a back-end computes with the other members: the parts of an operation its
/// members agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveCall {
    /// What is computed.
    pub op: CollectiveOp,
    /// How values are folded ([`Combine::None`] unless `op` folds).
    pub combine: Combine,
    /// The series ([`CollectiveHead::context`]).
    pub context: u64,
    /// The number in the series.
    pub seq: u32,
    /// A reduction's root (`u32::MAX` for the other operations).
    pub root: u32,
    /// Every member.
    pub members: RankSet,
    /// Reduce-scatter: the members in the group's order, whose blocks each gets
    /// (see [`CollectiveHead::order`]); empty for the other operations.
    pub order: Vec<u32>,
}

impl CollectiveCall {
    /// The frame with which back-end `rank` enters this operation with its encoded
    /// `values` (a gather's are wrapped in `rank`'s entry).
    pub fn contribution(&self, rank: u32, values: &[u8]) -> Frame {
        self.entry(rank, values, String::new())
    }

    /// The frame with which back-end `rank` enters this operation without values,
    /// failing it for every member with `error` (its values were refused locally).
    pub fn refusal(&self, rank: u32, error: String) -> Frame {
        self.entry(rank, &[], error)
    }

    fn entry(&self, rank: u32, values: &[u8], error: String) -> Frame {
        let failed = !error.is_empty();
        let head = CollectiveHead {
            op: self.op,
            combine: self.combine,
            down: false,
            context: self.context,
            seq: self.seq,
            root: self.root,
            members: self.members.clone(),
            contributors: RankSet::single(rank),
            error,
            order: if self.op == CollectiveOp::ReduceScatter { self.order.clone() } else { Vec::new() },
        };
        let payload = match self.op {
            _ if failed => encode_collective(&head, &[]),
            CollectiveOp::AllGather => {
                let mut body = Vec::with_capacity(values.len() + 8);
                encode_entry(&mut body, rank, values);
                encode_collective(&head, &body)
            }
            CollectiveOp::Barrier => encode_collective(&head, &[]),
            _ => encode_collective(&head, values),
        };
        let mut h = FrameHeader::peer(u32::MAX, 0, rank);
        h.flags = FLAG_PEER_COLL;
        Frame::new(h, payload)
    }
}

/// Appends one member's values to a gather's body: rank, length, encoded values.
pub fn encode_entry(out: &mut Vec<u8>, rank: u32, values: &[u8]) {
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    out.extend_from_slice(values);
}

/// Reads a gather's body: each member's rank and encoded values, in the order sent.
///
/// # Errors
/// A truncated entry.
pub fn decode_entries(body: &[u8]) -> Result<Vec<(u32, &[u8])>, DecodeError> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let rank = r.u32("gather entry")?;
        let len = r.len_u32("gather entry", r.remaining())?;
        out.push((rank, r.take(len, "gather entry")?));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head() -> CollectiveHead {
        CollectiveHead {
            op: CollectiveOp::Reduce,
            combine: Combine::Sum,
            down: false,
            context: 0x0102_0304_0506_0708,
            seq: 9,
            root: 40,
            members: RankSet::range(4, 8),
            contributors: RankSet::range(5, 2),
            error: String::new(),
            order: Vec::new(),
        }
    }

    #[test]
    fn a_reduce_scatter_carries_its_order_and_the_others_none() {
        let scatter =
            CollectiveHead { op: CollectiveOp::ReduceScatter, down: true, order: vec![9, 4, 7], ..head() };
        let payload = encode_collective(&scatter, b"body");
        let (back, at) = decode_collective(&payload).unwrap();
        assert_eq!((back, &payload[at..]), (scatter.clone(), &b"body"[..]));
        let twice = CollectiveHead { order: vec![9, 4, 9], ..scatter.clone() };
        assert!(decode_collective(&encode_collective(&twice, &[])).is_err());
        // Up, the order names exactly the members; down, those the frame is for
        // or, a result sent whole, more.
        let members = RankSet::range(4, 8);
        let up = CollectiveHead { down: false, order: (4..12).rev().collect(), members, ..scatter.clone() };
        assert!(decode_collective(&encode_collective(&up, &[])).is_ok());
        let short = CollectiveHead { order: (4..11).collect(), ..up.clone() };
        assert!(decode_collective(&encode_collective(&short, &[])).is_err());
        let down = CollectiveHead { down: true, members: RankSet::single(5), ..up };
        assert!(decode_collective(&encode_collective(&down, &[])).is_ok());
        let reduce = CollectiveHead { order: vec![4], ..head() };
        assert!(decode_collective(&encode_collective(&reduce, &[])).is_err());
    }

    #[test]
    fn heads_round_trip_and_bad_ones_are_errors() {
        let payload = encode_collective(&head(), b"body");
        let (back, at) = decode_collective(&payload).unwrap();
        assert_eq!((back, &payload[at..]), (head(), &b"body"[..]));
        for cut in 0..payload.len() - 4 {
            assert!(decode_collective(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = payload.clone();
        bad[0] = 9;
        assert!(decode_collective(&bad).is_err());
        bad = payload.clone();
        bad[2] = 2;
        assert!(decode_collective(&bad).is_err());
        let outside = CollectiveHead { contributors: RankSet::single(99), ..head() };
        assert!(decode_collective(&encode_collective(&outside, b"")).is_err());
        let failed = CollectiveHead { down: true, error: "no".into(), ..head() };
        assert_eq!(decode_collective(&encode_collective(&failed, b"")).unwrap().0, failed);
        // An error too long to carry is cut, never left to fail the decoder.
        let long = CollectiveHead { error: "é".repeat(MAX_COLLECTIVE_ERROR), ..failed };
        let (back, _) = decode_collective(&encode_collective(&long, b"")).unwrap();
        assert!(back.error.len() <= MAX_COLLECTIVE_ERROR && long.error.starts_with(&back.error));
    }

    #[test]
    fn entries_round_trip() {
        let mut body = Vec::new();
        encode_entry(&mut body, 3, b"abc");
        encode_entry(&mut body, 7, b"");
        assert_eq!(decode_entries(&body).unwrap(), vec![(3, &b"abc"[..]), (7, &b""[..])]);
        assert!(decode_entries(&body[..5]).is_err());
    }
}
