//! Asynchronous operations as handles (CoR's requests, MPI's `MPI_Request`): a send or
//! a receive started now, completed on the runtime, then tested, waited for, raced
//! against others or cancelled; and the matching a receive does on tag and source
//! rank, which leaves the packets it skips for later receives.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::task::JoinHandle;

use crate::{ApiError, Packet};

/// Which packets a receive takes; a field left `None` matches anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Match {
    /// The stream (a back-end's receives; a stream's own receives ignore it).
    pub stream: Option<u32>,
    /// The tag the sender chose.
    pub tag: Option<i32>,
    /// The source rank (for a reduction, the lowest rank of its wave).
    pub rank: Option<u32>,
}

impl Match {
    /// Matches every packet.
    pub fn any() -> Self {
        Match::default()
    }

    /// Matches packets with this tag.
    pub fn tag(tag: i32) -> Self {
        Match { tag: Some(tag), ..Match::default() }
    }

    /// Matches packets from this rank.
    pub fn rank(rank: u32) -> Self {
        Match { rank: Some(rank), ..Match::default() }
    }

    /// Matches packets of this stream.
    pub fn stream(stream: u32) -> Self {
        Match { stream: Some(stream), ..Match::default() }
    }

    /// Also requires this tag.
    pub fn and_tag(self, tag: i32) -> Self {
        Match { tag: Some(tag), ..self }
    }

    /// Also requires this source rank.
    pub fn and_rank(self, rank: u32) -> Self {
        Match { rank: Some(rank), ..self }
    }

    /// True when `packet` is one this receive takes.
    pub fn accepts(&self, packet: &Packet) -> bool {
        self.stream.map_or(true, |s| s == packet.stream())
            && self.tag.map_or(true, |t| t == packet.tag())
            && self.rank.map_or(true, |r| r == packet.rank())
    }
}

/// Packets a receive skipped, held for later receives; past this, a receive that
/// matches none of them fails instead of reading more (a tool that never takes some
/// tag would otherwise grow its memory without bound).
pub const HELD_LIMIT: usize = 65_536;

/// What arrived on a stream and is not yet taken.
#[derive(Debug)]
pub(crate) enum Item {
    /// A packet.
    Packet(Packet),
    /// A wave no rank answered: the next receive, whatever it matches, reports it.
    NoAnswer(u32),
}

impl Item {
    fn accepted_by(&self, m: &Match) -> bool {
        match self {
            Item::Packet(p) => m.accepts(p),
            Item::NoAnswer(_) => true,
        }
    }
}

/// One stream's receive side: what arrived and was not taken, and the receives
/// posted, in the order they were posted. An item goes to the earliest posted receive
/// that matches it (MPI's rule), so receives posted one after the other take packets
/// in that order and a matched receive skips what it does not match without loss.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    held: VecDeque<Item>,
    posted: Vec<PostedReceive>,
    next_id: u64,
    wakers: Vec<Waker>,
    /// Counts the receives withdrawn: each may give a receive an item it already
    /// looked at and left (the withdrawn one's items go to later ones). Items held,
    /// taken or receives posted since change no owner for the receives before them.
    changes: u64,
}

/// A receive posted on a [`Mailbox`], and how far it has looked.
#[derive(Debug)]
struct PostedReceive {
    id: u64,
    m: Match,
    /// The held items, from the first, that this receive looked at and that were
    /// not its own, as of `Mailbox::changes` equal to the first number: so a receive
    /// skipping many packets looks at each one once, not once per packet read.
    looked: (u64, usize),
}

impl Mailbox {
    /// Posts a receive; it takes items until [`Mailbox::unpost`].
    pub(crate) fn post(&mut self, m: Match) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.posted.push(PostedReceive { id, m, looked: (self.changes, 0) });
        id
    }

    /// Withdraws a receive; what it would have taken goes to the next ones, which are woken.
    pub(crate) fn unpost(&mut self, id: u64) {
        self.posted.retain(|p| p.id != id);
        self.changes += 1;
        self.wakers.drain(..).for_each(Waker::wake);
    }

    /// Holds an item that arrived.
    pub(crate) fn hold(&mut self, item: Item) {
        self.held.push_back(item);
    }

    /// True when no more items may be held.
    pub(crate) fn is_full(&self) -> bool {
        self.held.len() >= HELD_LIMIT
    }

    /// How many items are held.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes the first held item whose earliest matching posted receive is `id`,
    /// looking only at the items it has not looked at since the last change.
    pub(crate) fn take_for(&mut self, id: u64) -> Option<Item> {
        let at = self.posted.iter().position(|p| p.id == id)?;
        let from = match self.posted[at].looked {
            (changes, n) if changes == self.changes => n,
            _ => 0,
        };
        let posted = &self.posted;
        let owner = |item: &Item| posted.iter().find(|p| item.accepted_by(&p.m)).map(|p| p.id);
        match self.held.iter().skip(from).position(|item| owner(item) == Some(id)) {
            Some(i) => {
                let taken = from + i;
                // The items after it move up one place; no owner changes.
                for p in &mut self.posted {
                    if p.looked.0 == self.changes && p.looked.1 > taken {
                        p.looked.1 -= 1;
                    }
                }
                self.held.remove(taken)
            }
            None => {
                self.posted[at].looked = (self.changes, self.held.len());
                None
            }
        }
    }

    /// Wakes every receive waiting on the mailbox (the stream ended).
    pub(crate) fn wake_all(&mut self) {
        self.wakers.drain(..).for_each(Waker::wake);
    }

    /// Wakes `cx` when the posted receives change.
    pub(crate) fn wait(&mut self, cx: &Context<'_>) {
        register(&mut self.wakers, cx);
    }
}

/// A send or receive under way on the runtime, as a handle.
///
/// Await it (it is a future), or [`test`](Request::test) it now and then; race
/// several with [`Request::wait_any`]. Dropping a receive's request cancels it, so no
/// packet goes to a handle nobody holds; dropping a send's request lets the send go
/// on. Requests of one stream and kind start in the order they were made.
#[derive(Debug)]
pub struct Request<T> {
    task: JoinHandle<Result<T, ApiError>>,
    /// The outcome, once seen by a test that was not allowed to take it.
    done: Option<Result<T, ApiError>>,
    cancel_on_drop: bool,
}

impl<T: Send + 'static> Request<T> {
    /// Runs `work` on the current runtime as a request.
    ///
    /// # Panics
    /// Outside a tokio runtime, as `tokio::spawn`.
    pub(crate) fn spawn<F>(work: F, cancel_on_drop: bool) -> Self
    where
        F: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        Request { task: tokio::spawn(work), done: None, cancel_on_drop }
    }

    /// True once the request completed (successfully or not, or cancelled), without
    /// waiting; its outcome is then ready for [`Request::wait`] (or an await).
    pub fn test(&mut self) -> bool {
        if self.done.is_some() {
            return true;
        }
        if !self.task.is_finished() {
            return false;
        }
        let waker = Waker::from(std::sync::Arc::new(NoWake));
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(joined) = Pin::new(&mut self.task).poll(&mut cx) {
            self.done = Some(outcome(joined));
        }
        self.done.is_some()
    }

    /// True once the request completed (successfully or not), or was cancelled.
    pub fn is_complete(&self) -> bool {
        self.done.is_some() || self.task.is_finished()
    }

    /// Waits for the outcome (the same as awaiting the request).
    ///
    /// # Errors
    /// The operation's error, or [`ApiError::Cancelled`].
    pub async fn wait(self) -> Result<T, ApiError> {
        self.await
    }

    /// Stops the request: a receive that has not taken a packet takes none, and a
    /// send whose frame the tree has not taken sends nothing. A request that already
    /// completed keeps its outcome; otherwise it ends with [`ApiError::Cancelled`].
    pub fn cancel(&self) {
        self.task.abort();
    }

    /// Waits until one of `requests` completes, removes it, and returns its index (in
    /// `requests` as given) and outcome; `None` when `requests` is empty.
    ///
    /// Cancel safety: cancel safe: an outcome not returned stays in its request.
    pub async fn wait_any(requests: &mut Vec<Request<T>>) -> Option<(usize, Result<T, ApiError>)> {
        if requests.is_empty() {
            return None;
        }
        std::future::poll_fn(|cx| {
            for (index, request) in requests.iter_mut().enumerate() {
                if let Poll::Ready(result) = Pin::new(&mut *request).poll(cx) {
                    requests.remove(index);
                    return Poll::Ready(Some((index, result)));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Waits for every one of `requests` and returns their outcomes in order.
    pub async fn wait_all(requests: Vec<Request<T>>) -> Vec<Result<T, ApiError>> {
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            outcomes.push(request.await);
        }
        outcomes
    }
}

/// A waker for a poll that only looks: the task is finished, nothing is to be woken.
struct NoWake;

impl std::task::Wake for NoWake {
    fn wake(self: std::sync::Arc<Self>) {}
}

fn outcome<T>(joined: Result<Result<T, ApiError>, tokio::task::JoinError>) -> Result<T, ApiError> {
    match joined {
        Ok(result) => result,
        Err(e) if e.is_cancelled() => Err(ApiError::Cancelled),
        Err(e) => Err(ApiError::RequestPanicked(e.to_string())),
    }
}

// Nothing in a request is pinned: the task is behind its join handle.
impl<T> Unpin for Request<T> {}

impl<T> Future for Request<T> {
    type Output = Result<T, ApiError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(done) = this.done.take() {
            return Poll::Ready(done);
        }
        Pin::new(&mut this.task).poll(cx).map(outcome)
    }
}

impl<T> Drop for Request<T> {
    fn drop(&mut self) {
        if self.cancel_on_drop {
            self.task.abort();
        }
    }
}

/// Makes requests of one kind start in the order they were made: each waits for the
/// one made before it to end (or to be cancelled) before it starts.
#[derive(Debug, Default)]
pub(crate) struct InOrder {
    last: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl InOrder {
    /// Takes the next place: await the returned `turn` before starting, and drop
    /// `done` once over (dropping it also passes the turn when the request is cancelled).
    pub(crate) fn next(&self) -> (Turn, tokio::sync::oneshot::Sender<()>) {
        let (done, next) = tokio::sync::oneshot::channel();
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (Turn(last.replace(next)), done)
    }
}

/// The wait for the previous request of the same kind.
pub(crate) struct Turn(Option<tokio::sync::oneshot::Receiver<()>>);

impl Turn {
    /// Waits until the previous request ended.
    pub(crate) async fn come(self) {
        if let Some(previous) = self.0 {
            // An error only says the previous one ended without a word: the turn passes.
            let _ = previous.await;
        }
    }
}

/// Adds `cx`'s waker to `wakers` unless one that wakes the same task is there: a
/// call polled again and again (in a `select!`, with a time-out) adds it once.
pub(crate) fn register(wakers: &mut Vec<Waker>, cx: &Context<'_>) {
    if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
        wakers.push(cx.waker().clone());
    }
}

#[cfg(test)]
impl Mailbox {
    /// The posted receives' ids, oldest first.
    pub(crate) fn posted_ids(&self) -> Vec<u64> {
        self.posted.iter().map(|p| p.id).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::{Frame, FrameHeader};

    fn packet(tag: i32, rank: u32) -> Item {
        Item::Packet(Packet::from_frame(Frame::new(FrameHeader::data(3, tag, rank), Vec::new())))
    }

    fn tag_of(item: Option<Item>) -> Option<i32> {
        match item? {
            Item::Packet(p) => Some(p.tag()),
            Item::NoAnswer(_) => None,
        }
    }

    #[test]
    fn an_item_goes_to_the_earliest_posted_receive_that_matches_it() {
        let mut mail = Mailbox::default();
        let any = mail.post(Match::any());
        let seven = mail.post(Match::tag(7));
        mail.hold(packet(7, 0));
        mail.hold(packet(8, 0));
        // The first receive matches both, so the tag-7 receive waits for a later 7.
        assert_eq!(tag_of(mail.take_for(seven)), None);
        assert_eq!(tag_of(mail.take_for(any)), Some(7));
        assert_eq!(mail.held(), 1);
        mail.unpost(any);
        assert_eq!(tag_of(mail.take_for(seven)), None);
        mail.hold(packet(7, 1));
        assert_eq!(tag_of(mail.take_for(seven)), Some(7));
        // The skipped packet is still there, for the next receive.
        let next = mail.post(Match::any());
        assert_eq!(tag_of(mail.take_for(next)), Some(8));
    }

    /// The rule of [`Mailbox::take_for`] with no memory of what was looked at.
    fn take_naive(held: &mut VecDeque<(i32, u32)>, posted: &[(u64, Match)], id: u64) -> Option<(i32, u32)> {
        let owner = |&(tag, rank): &(i32, u32)| {
            let Item::Packet(p) = packet(tag, rank) else { unreachable!() };
            posted.iter().find(|(_, m)| m.accepts(&p)).map(|(o, _)| *o)
        };
        let i = held.iter().position(|item| owner(item) == Some(id))?;
        held.remove(i)
    }

    /// What each receive looked at is remembered across holds, takes, posts and
    /// withdrawals; a long random run of them gives exactly what looking at every
    /// held item each time gives.
    #[test]
    fn remembered_looks_take_what_looking_at_everything_takes() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for run in 0..20 {
            let mut mail = Mailbox::default();
            let (mut held, mut posted) = (VecDeque::new(), Vec::<(u64, Match)>::new());
            for step in 0..5_000 {
                match next(20) {
                    0..=7 => {
                        let item = (next(4) as i32, next(3) as u32);
                        mail.hold(packet(item.0, item.1));
                        held.push_back(item);
                    }
                    8 | 9 if posted.len() < 5 => {
                        // Mostly narrow matches: a receive taking anything owns every
                        // item while it is posted, and the later ones never take.
                        let m = match next(8) {
                            0 => Match::any(),
                            1..=4 => Match::tag(next(4) as i32),
                            _ => Match::tag(next(4) as i32).and_rank(next(3) as u32),
                        };
                        posted.push((mail.post(m), m));
                    }
                    10 if !posted.is_empty() => {
                        let (id, _) = posted.remove(next(posted.len() as u64) as usize);
                        mail.unpost(id);
                    }
                    _ if !posted.is_empty() => {
                        let id = posted[next(posted.len() as u64) as usize].0;
                        let got = mail.take_for(id).map(|item| match item {
                            Item::Packet(p) => (p.tag(), p.rank()),
                            Item::NoAnswer(_) => unreachable!(),
                        });
                        assert_eq!(got, take_naive(&mut held, &posted, id), "run {run}, step {step}");
                    }
                    _ => {}
                }
                assert_eq!(mail.held(), held.len(), "run {run}, step {step}");
            }
        }
    }

    #[test]
    fn a_match_checks_stream_tag_and_rank_together() {
        let Item::Packet(p) = packet(5, 9) else { unreachable!() };
        assert!(Match::any().accepts(&p));
        assert!(Match::tag(5).and_rank(9).accepts(&p));
        assert!(!Match::tag(5).and_rank(8).accepts(&p));
        assert!(Match::stream(3).accepts(&p));
        assert!(!Match::stream(4).and_tag(5).accepts(&p));
    }

    #[tokio::test]
    async fn requests_of_one_kind_start_in_the_order_they_were_made() {
        let order = std::sync::Arc::new(InOrder::default());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut requests = Vec::new();
        for i in 0..8u32 {
            let (turn, done) = order.next();
            let seen = seen.clone();
            requests.push(Request::spawn(
                async move {
                    turn.come().await;
                    // Later requests would overtake an earlier one that yields here.
                    tokio::task::yield_now().await;
                    seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(i);
                    drop(done);
                    Ok(i)
                },
                false,
            ));
        }
        let outcomes = Request::wait_all(requests).await;
        assert_eq!(outcomes.into_iter().map(Result::unwrap).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        assert_eq!(*seen.lock().unwrap(), (0..8).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_cancelled_request_ends_cancelled_and_passes_its_turn() {
        let order = InOrder::default();
        let (turn, done) = order.next();
        let (gate_tx, gate_rx) = tokio::sync::oneshot::channel::<()>();
        let first = Request::spawn(
            async move {
                turn.come().await;
                let _ = gate_rx.await;
                drop(done);
                Ok(1u32)
            },
            false,
        );
        let (turn, done) = order.next();
        let second = Request::spawn(
            async move {
                turn.come().await;
                drop(done);
                Ok(2u32)
            },
            false,
        );
        first.cancel();
        assert!(matches!(first.await, Err(ApiError::Cancelled)));
        assert_eq!(second.await.unwrap(), 2);
        drop(gate_tx);
    }

    #[tokio::test]
    async fn wait_any_returns_the_one_that_completed_and_keeps_the_others() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let slow = Request::spawn(
            async move {
                let _ = rx.await;
                Ok(0u32)
            },
            true,
        );
        let mut fast = Request::spawn(async { Ok(1u32) }, true);
        while !fast.test() {
            tokio::task::yield_now().await;
        }
        let mut requests = vec![slow, fast];
        let (index, result) = Request::wait_any(&mut requests).await.unwrap();
        assert_eq!((index, result.unwrap()), (1, 1));
        assert_eq!(requests.len(), 1);
        assert!(!requests[0].test());
        tx.send(()).unwrap();
        let (index, result) = Request::wait_any(&mut requests).await.unwrap();
        assert_eq!((index, result.unwrap()), (0, 0));
        assert!(Request::<u32>::wait_any(&mut requests).await.is_none());
    }
}
