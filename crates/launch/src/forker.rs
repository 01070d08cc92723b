//! Every child is forked from one long-lived thread.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked a child exits, not the
//! process. A child forked from a thread that later ends (a retired runtime worker,
//! `spawn_blocking`, a tool's own short-lived thread) would be killed with it, and
//! with it the whole sub-tree below. So forks happen on a thread that lives as long as
//! the process: the signal then means what it is meant to mean, "the parent died".
//! The main thread is such a thread (the process ends when it returns), so a launch
//! from it forks at once; any other thread hands the fork to a forking thread. The
//! hand-over costs two wake-ups of another CPU per child, which on an idle virtual
//! machine doubled the start-up of 64 back-ends, so it is kept for the threads that need it.

use std::io;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::process::{Child, Command};

struct Request {
    cmd: Command,
    runtime: tokio::runtime::Handle,
    reply: mpsc::SyncSender<io::Result<Child>>,
}

static FORKER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

fn forker() -> io::Result<mpsc::Sender<Request>> {
    if let Some(tx) = FORKER.get() {
        return Ok(tx.lock().unwrap_or_else(PoisonError::into_inner).clone());
    }
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new().name("treecast-forker".into()).spawn(move || {
        while let Ok(mut req) = rx.recv() {
            // The child is registered with the caller's runtime (its pipes, its exit).
            let _context = req.runtime.enter();
            let _ = req.reply.send(req.cmd.spawn());
        }
    })?;
    let stored = FORKER.get_or_init(|| Mutex::new(tx));
    Ok(stored.lock().unwrap_or_else(PoisonError::into_inner).clone())
}

/// True on the process's main thread.
fn on_main_thread() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: gettid(2) and getpid(2) take no arguments, touch no memory and cannot fail.
    unsafe {
        libc::gettid() == libc::getpid()
    }
}

/// Spawns `cmd` from a thread that lives as long as the process (this one if it is
/// the main thread, else the forking thread); the child belongs to the current runtime.
///
/// # Errors
/// No runtime, the forking thread could not start, or the spawn failed.
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    // Asked first: tokio's spawn panics without a runtime, where this returns the error.
    let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    if on_main_thread() {
        return cmd.spawn();
    }
    let (reply, answer) = mpsc::sync_channel(1);
    forker()?
        .send(Request { cmd, runtime, reply })
        .map_err(|_| io::Error::other("the forking thread is gone"))?;
    answer.recv().map_err(|_| io::Error::other("the forking thread is gone"))?
}
