//! The scheduling policy of the library's background thread. While it only naps and
//! looks whether the tool stopped calling, it runs as `SCHED_BATCH`, so that its
//! looks never preempt the tool, its comm nodes or the application sharing the core:
//! a woken batch thread waits for the running one's turn to end instead of taking
//! the core at once. While it drives the runtime (the tool is quiet: reads, writes,
//! timers, and the threads and processes a task starts) it runs under the thread's
//! own policy, which is what those inherit.
//!
//! Measured with MRNet's micro-benchmark over the layer on `balanced:4x4x4`, 64
//! back-ends and 20 comm nodes on two cores (docs/mrnet-compat.md): the looks of 64
//! background threads, each preempting whoever ran, cost the tree several hundredths
//! of its reductions/s.

/// Switches the calling thread between its own policy and `SCHED_BATCH`.
pub(crate) struct NapPolicy {
    /// Whether switching is on: the thread's own policy was `SCHED_OTHER` and no
    /// switch was refused.
    enabled: bool,
    /// Whether the thread runs as `SCHED_BATCH` now.
    batch: bool,
}

impl NapPolicy {
    /// For the calling thread. A policy the tool chose for it (real-time, idle) is
    /// left alone: only a `SCHED_OTHER` thread switches.
    pub(crate) fn for_this_thread() -> NapPolicy {
        // SAFETY: no pointer is passed; 0 names the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        NapPolicy { enabled: policy == libc::SCHED_OTHER, batch: false }
    }

    /// Before the thread naps: `SCHED_BATCH`.
    pub(crate) fn napping(&mut self) {
        if !self.batch {
            self.batch = self.set(libc::SCHED_BATCH);
        }
    }

    /// Before the thread drives the runtime: its own policy again.
    pub(crate) fn driving(&mut self) {
        if self.batch {
            // Switching back between the two normal policies needs no privilege; if
            // it is refused anyway (a sandbox's rule), the thread stays batch and stops
            // switching, so this is said once.
            self.batch = !self.set(libc::SCHED_OTHER);
            if self.batch {
                tracing::warn!(
                    "the library's background thread could not leave SCHED_BATCH ({}): it \
                     drives as a batch thread, and the threads and processes its tasks start \
                     inherit batch",
                    std::io::Error::last_os_error()
                );
            }
        }
    }

    /// Sets `policy` on the calling thread; whether it took. A refusal (a seccomp
    /// filter, say) turns switching off.
    fn set(&mut self, policy: libc::c_int) -> bool {
        if !self.enabled {
            return false;
        }
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param for the call; 0 names the calling thread.
        let took = unsafe { libc::sched_setscheduler(0, policy, &param) } == 0;
        self.enabled = took;
        took
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduling policy the calling thread runs under now.
    fn policy_of_this_thread() -> libc::c_int {
        // SAFETY: as in `for_this_thread`.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// A thread started while the background thread naps would inherit batch; one
    /// started while it drives gets the normal policy.
    #[test]
    fn napping_is_batch_and_driving_gives_the_threads_it_starts_the_normal_policy() {
        std::thread::spawn(|| {
            let mut p = NapPolicy::for_this_thread();
            assert!(p.enabled, "a test thread runs SCHED_OTHER");
            p.napping();
            assert_eq!(policy_of_this_thread(), libc::SCHED_BATCH);
            let inherited = std::thread::spawn(policy_of_this_thread).join().expect("the thread ends");
            assert_eq!(inherited, libc::SCHED_BATCH, "threads inherit the policy (why it is switched back)");
            p.driving();
            assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
            let started = std::thread::spawn(policy_of_this_thread).join().expect("the thread ends");
            assert_eq!(started, libc::SCHED_OTHER);
        })
        .join()
        .expect("the test's thread passes");
    }

    /// A policy chosen for the thread is kept: a batch thread is not switched to
    /// SCHED_OTHER when it drives.
    #[test]
    fn a_policy_the_tool_chose_is_left_alone() {
        std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `set`.
            assert_eq!(unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) }, 0);
            let mut p = NapPolicy::for_this_thread();
            p.napping();
            p.driving();
            assert_eq!(policy_of_this_thread(), libc::SCHED_BATCH);
        })
        .join()
        .expect("the test's thread passes");
    }
}
