//! [`FileWorker`]: a back-end's file transfers on a thread of their own, so writing
//! to a slow disk never holds up the back-end's event loop (its links, its other
//! streams, its credits).

use tokio::sync::mpsc;

use super::{FileAnswer, FileReceivers};
use treecast_api::{ApiError, Packet};

/// Packets queued for the writing thread before the back-end waits (which, through
/// flow control, slows the file's sender).
const QUEUE: usize = 64;

enum Job {
    Packet(Packet),
    StreamClosed(u32),
}

/// A back-end's [`FileReceivers`] on a thread of their own.
///
/// Feed it the packets [`FileReceivers::handles`] and the streams that close, in the
/// order they arrive; read the answers to send with [`FileWorker::next_answer`].
/// Dropping it ends the thread, which removes the temporary files of unfinished
/// transfers.
#[derive(Debug)]
pub struct FileWorker {
    jobs: Option<mpsc::Sender<Job>>,
    answers: mpsc::Receiver<FileAnswer>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Packet(p) => write!(f, "packet on stream {}", p.stream()),
            Job::StreamClosed(id) => write!(f, "stream {id} closed"),
        }
    }
}

impl FileWorker {
    /// Starts the thread for the back-end of rank `rank`.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(rank: u32) -> Result<FileWorker, ApiError> {
        let (jobs, mut rx) = mpsc::channel::<Job>(QUEUE);
        let (answer_tx, answers) = mpsc::channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("treecast-files".into())
            .spawn(move || {
                let mut files = FileReceivers::new(rank);
                while let Some(job) = rx.blocking_recv() {
                    let answer = match job {
                        Job::Packet(p) => files.on_packet(&p),
                        Job::StreamClosed(id) => {
                            files.on_stream_closed(id);
                            None
                        }
                    };
                    if let Some(a) = answer {
                        if answer_tx.blocking_send(a).is_err() {
                            return;
                        }
                    }
                }
            })
            .map_err(|source| ApiError::Link { what: "starting the file-writing thread", source })?;
        Ok(FileWorker { jobs: Some(jobs), answers, thread: Some(thread) })
    }

    async fn queue(&self, job: Job) -> Result<(), ApiError> {
        let jobs = self.jobs.as_ref().ok_or(ApiError::FileWorkerGone)?;
        jobs.send(job).await.map_err(|_| ApiError::FileWorkerGone)
    }

    /// Queues a packet of the file protocol.
    ///
    /// # Errors
    /// The thread is gone.
    ///
    /// Cancel safety: cancel safe; a cancelled call queued nothing.
    pub async fn packet(&self, packet: Packet) -> Result<(), ApiError> {
        self.queue(Job::Packet(packet)).await
    }

    /// Says a stream closed (its transfer, if unfinished, is dropped).
    ///
    /// # Errors
    /// The thread is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn stream_closed(&self, stream: u32) -> Result<(), ApiError> {
        self.queue(Job::StreamClosed(stream)).await
    }

    /// The next answer to send up; `None` once the thread ended.
    ///
    /// Cancel safety: cancel safe.
    pub async fn next_answer(&mut self) -> Option<FileAnswer> {
        self.answers.recv().await
    }

    /// Splits off the answers, to read them in another task.
    pub fn take_answers(&mut self) -> mpsc::Receiver<FileAnswer> {
        let (_, empty) = mpsc::channel(1);
        std::mem::replace(&mut self.answers, empty)
    }
}

impl Drop for FileWorker {
    fn drop(&mut self) {
        self.jobs = None;
        self.answers.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
