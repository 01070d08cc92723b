//! Collective operations among back-ends of one or several groups, computed in the
//! tree: each comm node folds what its children send, and the members' lowest
//! common ancestor sends the result down, one copy per link (see
//! `treecast_proto`'s collective module). Every member of a [`Group`] makes the
//! same calls in the same order, as in MPI; a member that is lost is not waited
//! for, and each result names the members that took part.

use std::collections::HashMap;
use std::task::Waker;
use std::time::Duration;

use treecast_wire::{
    decode_collective, decode_entries, decode_values, CollectiveOp, Combine, Frame, RankSet, Value,
};

use crate::{ApiError, Group};

/// How long a back-end waits for the other members of a collective operation
/// unless told otherwise ([`crate::BackEndSender::set_collective_limit`]).
pub const DEFAULT_COLLECTIVE_LIMIT: Duration = Duration::from_secs(120);

/// How a reduction combines the members' values: element-wise over numeric scalars
/// and arrays (integer sums wrap around), as the stream filters of the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average, each member weighing one (integers rounded toward zero), as the
    /// `avg` stream filter computes it.
    Avg,
}

impl ReduceOp {
    pub(crate) fn combine(self) -> Combine {
        match self {
            ReduceOp::Sum => Combine::Sum,
            ReduceOp::Min => Combine::Min,
            ReduceOp::Max => Combine::Max,
            ReduceOp::Avg => Combine::Avg,
        }
    }
}

/// The result of a collective operation at one member.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// The reduced values (reduce at its root, all-reduce), this member's block of
    /// them (reduce-scatter), or nothing (barrier, reduce at the other members).
    pub values: Vec<Value>,
    /// Every member's values, in group order (all-gather only).
    pub gathered: Vec<(u32, Vec<Value>)>,
    /// The members whose values are in the result; those missing were lost or left
    /// before they entered.
    pub contributors: RankSet,
}

/// Most results kept for calls not made yet.
const MAX_EARLY_RESULTS: usize = 256;

/// The back-end's side of its collective operations, inside its driver.
#[derive(Debug)]
pub(crate) struct CollectiveBook {
    /// Operations a call waits for; a result for any other is dropped.
    pub(crate) awaiting: std::collections::HashSet<(u64, u32)>,
    /// Results that arrived, by (series, number), until their caller takes them.
    pub(crate) results: HashMap<(u64, u32), Frame>,
    /// Tasks awaiting a result.
    pub(crate) waiters: Vec<Waker>,
    /// The next number of each series.
    pub(crate) next: HashMap<u64, u32>,
    /// How long a call waits.
    pub(crate) limit: Duration,
}

impl Default for CollectiveBook {
    fn default() -> Self {
        CollectiveBook {
            awaiting: std::collections::HashSet::new(),
            results: HashMap::new(),
            waiters: Vec::new(),
            next: HashMap::new(),
            limit: DEFAULT_COLLECTIVE_LIMIT,
        }
    }
}

impl CollectiveBook {
    /// A result arrived.
    pub(crate) fn arrived(&mut self, context: u64, seq: u32, frame: Frame) {
        // A result for a number not taken yet is kept for the call that takes it (a
        // root outside the group may call after the members are done); one for a
        // number whose call is over, or one too many, is dropped.
        let taken = self.next.get(&context).is_some_and(|&next| seq < next);
        let room = self.results.len() < MAX_EARLY_RESULTS;
        if !self.awaiting.contains(&(context, seq)) && (taken || !room) {
            tracing::debug!(
                "a collective result nobody waits for (series {context:#x}, number {seq}): dropped"
            );
            return;
        }
        self.results.insert((context, seq), frame);
        self.waiters.drain(..).for_each(Waker::wake);
    }

    /// The network is over for this back-end: waiting calls learn it.
    pub(crate) fn wake_all(&mut self) {
        self.waiters.drain(..).for_each(Waker::wake);
    }
}

/// The series of a group's operations: a hash of its ranks in order (FNV-1a),
/// which every member computes alike; reductions to one root form a series of
/// their own, which the root, maybe outside the group, counts alike too.
pub(crate) fn context_of(group: &Group, root: Option<u32>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let tail = root.map(|r| [u32::MAX, r]);
    for rank in group.ranks().iter().chain(tail.iter().flatten()) {
        for b in rank.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// What one call asks for.
pub(crate) struct Request<'a> {
    pub(crate) group: &'a Group,
    pub(crate) op: CollectiveOp,
    pub(crate) combine: Combine,
    pub(crate) root: u32,
    /// Format and values of this member's contribution.
    pub(crate) values: Option<(&'a str, &'a [Value])>,
}

impl<'a> Request<'a> {
    /// A call of `op` over `group`.
    pub(crate) fn new(
        group: &'a Group,
        op: CollectiveOp,
        combine: Combine,
        root: u32,
        values: Option<(&'a str, &'a [Value])>,
    ) -> Self {
        Request { group, op, combine, root, values }
    }
}

/// Reads a result as member `rank` sees it.
pub(crate) fn result(
    frame: &Frame,
    group: &Group,
    rank: u32,
    op: CollectiveOp,
) -> Result<Collected, ApiError> {
    let bad = |e: &dyn std::fmt::Display| ApiError::Collective(format!("a malformed result arrived: {e}"));
    let (head, at) = decode_collective(&frame.payload).map_err(|e| bad(&e))?;
    if !head.error.is_empty() {
        return Err(ApiError::Collective(head.error));
    }
    let body = &frame.payload[at..];
    let mut out = Collected { values: Vec::new(), gathered: Vec::new(), contributors: head.contributors };
    match op {
        CollectiveOp::Barrier => {}
        CollectiveOp::AllGather => {
            let mut by_rank = HashMap::new();
            for (r, values) in decode_entries(body).map_err(|e| bad(&e))? {
                by_rank.insert(r, decode_values(values).map_err(|e| bad(&e))?);
            }
            out.gathered = group.ranks().iter().filter_map(|r| by_rank.remove(r).map(|v| (*r, v))).collect();
        }
        _ if body.is_empty() => {}
        CollectiveOp::ReduceScatter => {
            // The comm nodes narrowed the result to the blocks behind each link:
            // its order says which block is whose.
            let all = decode_values(body).map_err(|e| bad(&e))?;
            let index = head.order.iter().position(|&r| r == rank);
            let index = index.ok_or_else(|| bad(&format!("rank {rank} has no block in it")))?;
            out.values =
                all.iter().map(|v| block_of(v, index, head.order.len())).collect::<Result<_, _>>()?;
        }
        _ => out.values = decode_values(body).map_err(|e| bad(&e))?,
    }
    Ok(out)
}

/// Block `i` of `n` equal blocks of an array value.
fn block_of(value: &Value, i: usize, n: usize) -> Result<Value, ApiError> {
    value.blocks(n, &[i]).ok_or_else(|| {
        ApiError::Collective(format!(
            "reduce-scatter needs numeric arrays whose length is a multiple of the group's {n} members; got a {}",
            value.spec()
        ))
    })
}

/// Checks reduce-scatter's values before they are sent, so a wrong length fails at
/// the member that gave it (and, through its refusal, at every member).
pub(crate) fn check_scatter(values: &[Value], n: usize) -> Result<(), ApiError> {
    values.iter().try_for_each(|v| block_of(v, 0, n).map(drop))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn series_depend_on_the_ranks_and_their_order() {
        let a = Group::new(1, vec![0, 1, 2]);
        let b = Group::new(2, vec![0, 1, 2]);
        let c = Group::new(1, vec![2, 1, 0]);
        assert_eq!(context_of(&a, None), context_of(&b, None));
        assert_ne!(context_of(&a, None), context_of(&c, None));
        // Reductions to a root count apart, one series per root.
        assert_ne!(context_of(&a, Some(7)), context_of(&a, None));
        assert_ne!(context_of(&a, Some(7)), context_of(&a, Some(8)));
    }

    #[test]
    fn blocks_split_arrays_evenly_and_refuse_the_rest() {
        let v = Value::IntArray(vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(block_of(&v, 1, 3).unwrap(), Value::IntArray(vec![3, 4]));
        assert!(block_of(&v, 0, 4).is_err());
        let err = block_of(&Value::Int(3), 0, 1).unwrap_err();
        assert!(err.to_string().contains("numeric arrays"), "{err}");
        assert!(check_scatter(&[Value::DoubleArray(vec![1.0; 4])], 2).is_ok());
    }
}
