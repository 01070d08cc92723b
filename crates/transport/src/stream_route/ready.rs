//! The ready list: per-link wakers put a link on it when its socket is readable (or
//! writable again), and the owning task reads only the links listed.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

use crate::LinkId;

/// Links ready for a read or a write, and the task to wake when one becomes ready.
#[derive(Debug, Default)]
pub(super) struct ReadyList {
    state: Mutex<ReadyState>,
}

#[derive(Debug, Default)]
struct ReadyState {
    links: Vec<LinkId>,
    task: Option<Waker>,
}

impl ReadyList {
    pub(super) fn push(&self, link: LinkId) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.links.contains(&link) {
            s.links.push(link);
        }
        if let Some(w) = s.task.take() {
            w.wake();
        }
    }

    /// Swaps the links ready for `out`, an empty list whose room the next readiness
    /// takes: no allocation per pass.
    pub(super) fn take_into(&self, task: &Waker, out: &mut Vec<LinkId>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.task.as_ref().is_some_and(|w| w.will_wake(task)) {
            s.task = Some(task.clone());
        }
        out.clear();
        std::mem::swap(&mut s.links, out);
    }
}

/// A link's waker: readiness of its socket puts it on the ready list.
pub(super) struct LinkWaker {
    pub(super) link: LinkId,
    pub(super) list: Arc<ReadyList>,
}

impl Wake for LinkWaker {
    fn wake(self: Arc<Self>) {
        self.list.push(self.link);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.list.push(self.link);
    }
}
