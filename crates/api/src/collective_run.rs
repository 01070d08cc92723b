//! A collective operation run by a back-end: enter it through the driver, wait for
//! the result the tree sends back.

use std::task::Poll;
use std::time::Duration;

use treecast_driver::{lock, Shared};
use treecast_wire::{CollectiveCall, CollectiveOp, Frame};

use crate::betool::BeTool;
use crate::collective::{check_scatter, context_of, result, Collected, Request};
use crate::encoding::encode_checked;
use crate::stream::send_with_credit;
use crate::ApiError;

/// Enters an operation as back-end `rank` and waits for its result.
pub(crate) async fn run(shared: &Shared<BeTool>, rank: u32, req: Request<'_>) -> Result<Collected, ApiError> {
    let group = req.group;
    let member = group.group_rank(rank).is_some();
    let root = req.op == CollectiveOp::Reduce && req.root == rank;
    if !(member || root) {
        return Err(ApiError::Collective(format!(
            "rank {rank} is not a member of group {} ({} ranks); only members (and a reduction's root) take part",
            group.id(),
            group.size()
        )));
    }
    if crate::remote::remote_members(group)
        || (req.op == CollectiveOp::Reduce && crate::remote::is_remote(req.root))
    {
        return Err(ApiError::Collective(format!(
            "group {} names ranks of another network: collectives do not cross between networks; \
             send those ranks messages (send_to_rank) instead",
            group.id()
        )));
    }
    let members = group.rank_set();
    if members.len() != group.size() as u64 {
        return Err(ApiError::Collective(format!("group {} names a rank twice", group.id())));
    }
    let context = context_of(group, (req.op == CollectiveOp::Reduce).then_some(req.root));
    // The number is taken before anything can fail, so that a member whose values
    // are refused here still enters (with the refusal) and no one falls out of step.
    let (seq, limit) = {
        let mut d = lock(shared);
        let book = &mut d.tool().collectives;
        let next = book.next.entry(context).or_insert(0);
        let seq = *next;
        *next = seq.wrapping_add(1);
        book.awaiting.insert((context, seq));
        (seq, book.limit)
    };
    let order = if req.op == CollectiveOp::ReduceScatter { group.ranks().to_vec() } else { Vec::new() };
    let call =
        CollectiveCall { op: req.op, combine: req.combine, context, seq, root: req.root, members, order };
    // However the call ends (cancelled too), the book forgets this operation.
    let _forget = Forget { shared, key: (context, seq) };
    let outcome = enter_and_wait(shared, rank, &call, member.then_some(&req), limit).await;
    result(&outcome?, group, rank, req.op)
}

/// Removes an operation from the back-end's book when its call ends.
struct Forget<'a> {
    shared: &'a Shared<BeTool>,
    key: (u64, u32),
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut d = lock(self.shared);
        let book = &mut d.tool().collectives;
        book.awaiting.remove(&self.key);
        book.results.remove(&self.key);
    }
}

/// Sends this member's contribution (or its refusal) and waits for the result.
async fn enter_and_wait(
    shared: &Shared<BeTool>,
    rank: u32,
    call: &CollectiveCall,
    member: Option<&Request<'_>>,
    limit: Duration,
) -> Result<Frame, ApiError> {
    let key = (call.context, call.seq);
    if let Some(req) = member {
        let values = req.values.map_or(&[][..], |(_, v)| v);
        let checked = match req.values {
            Some((format, values)) => encode_checked(format, values),
            None => Ok(bytes::Bytes::new()),
        }
        .and_then(|payload| match req.op {
            CollectiveOp::ReduceScatter => check_scatter(values, req.group.size()).map(|()| payload),
            _ => Ok(payload),
        });
        match checked {
            Ok(payload) => send_with_credit(shared, call.contribution(rank, &payload)).await?,
            Err(e) => {
                send_with_credit(shared, call.refusal(rank, format!("rank {rank} could not enter: {e}")))
                    .await?;
                return Err(e);
            }
        }
    }
    let arrived = std::future::poll_fn(|cx| {
        let mut d = lock(shared);
        let tool = d.tool();
        if let Some(frame) = tool.collectives.results.remove(&key) {
            return Poll::Ready(Ok(frame));
        }
        if let Some(reason) = &tool.over {
            return Poll::Ready(Err(ApiError::Closed(reason.clone())));
        }
        crate::request::register(&mut tool.collectives.waiters, cx);
        Poll::Pending
    });
    match tokio::time::timeout(limit, arrived).await {
        Ok(got) => got,
        Err(_) => Err(ApiError::Collective(format!(
            "{:?} number {} got no result within {limit:?}: a member has not entered it yet \
             (every member must make the same calls in the same order)",
            call.op, call.seq
        ))),
    }
}
