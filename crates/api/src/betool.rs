//! The back-end's tool state inside its driver ([`BeTool`]): what its calls wait on.

use std::task::{Context, Waker};

use treecast_driver::Tool;
use treecast_proto::{EndReason, Event};

use crate::stream::WaitsForCredit;

/// The back-end's tool state, inside its driver.
#[derive(Debug, Default)]
pub(crate) struct BeTool {
    pub(crate) reader: Option<Waker>,
    pub(crate) writers: std::collections::HashMap<u32, Vec<Waker>>,
    /// Tasks awaiting [`BackEndSender::closed`].
    pub(crate) closers: Vec<Waker>,
    pub(crate) over: Option<EndReason>,
    /// Collective operations: results until taken, series numbers.
    pub(crate) collectives: crate::collective::CollectiveBook,
    /// Answers to this back-end's spawn requests, by request number, until taken.
    pub(crate) spawn_replies: std::collections::HashMap<u32, SpawnAnswer>,
    /// Tasks awaiting a spawn answer.
    pub(crate) spawn_waiters: Vec<Waker>,
    /// The next spawn request's number.
    pub(crate) next_spawn: u32,
    /// Told of every packet and of the end, for a tool's own event loop.
    pub(crate) ready: Option<crate::frontend::ReadyHook>,
    /// Who this back-end is, once its member plan arrived.
    pub(crate) placed: Option<Placed>,
    /// The task awaiting the member plan.
    pub(crate) placer: Option<Waker>,
    /// The stream and format the last send was checked against its stream's filter:
    /// a stream's filter never changes, so a send loop checks once.
    pub(crate) checked: Option<(u32, treecast_wire::Format)>,
}

/// What a back-end's member plan says it is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) group: Option<treecast_wire::GroupPlace>,
}

/// The front-end's answer to a spawn request: the group, or why not.
type SpawnAnswer = Result<crate::Group, String>;

impl WaitsForCredit for BeTool {
    fn wait_writable(&mut self, stream: u32, cx: &Context<'_>) {
        crate::request::register(self.writers.entry(stream).or_default(), cx);
    }
}

impl Tool for BeTool {
    fn event(&mut self, event: Event) {
        match event {
            Event::Readable { .. } => {
                if let Some(w) = self.reader.take() {
                    w.wake();
                }
                crate::frontend::ReadyHook::call(&self.ready);
            }
            Event::Writable { stream } => {
                self.writers.remove(&stream).into_iter().flatten().for_each(Waker::wake);
            }
            Event::SpawnReplied { id, group, ranks, error } => {
                let answer = match error.is_empty() {
                    true => Ok(crate::Group::new(group, ranks.iter().collect())),
                    false => Err(error),
                };
                self.spawn_replies.insert(id, answer);
                self.spawn_waiters.drain(..).for_each(Waker::wake);
            }
            Event::CollectiveDone { context, seq, frame } => self.collectives.arrived(context, seq, frame),
            Event::Placed { rank, size, group } => {
                self.placed = Some(Placed { rank, size, group });
                self.placer.take().into_iter().for_each(Waker::wake);
            }
            Event::Shutdown { reason } => {
                self.over = Some(reason);
                self.placer.take().into_iter().for_each(Waker::wake);
                self.collectives.wake_all();
                self.spawn_waiters.drain(..).for_each(Waker::wake);
                self.reader.take().into_iter().for_each(Waker::wake);
                self.writers.drain().flat_map(|(_, w)| w).for_each(Waker::wake);
                self.closers.drain(..).for_each(Waker::wake);
                crate::frontend::ReadyHook::call(&self.ready);
            }
            other => tracing::debug!("back-end: {other:?}"),
        }
    }
}
