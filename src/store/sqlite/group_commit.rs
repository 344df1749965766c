//! Group commit: the writes queued while a commit is on its way to disk share the next
//! transaction, and so one fsync.
//!
//! One thread owns the write path. It takes every write waiting in its queue (up to
//! [`MAX_GROUP`]), runs them in one transaction, commits, and only then answers each caller. A
//! write that fails fails alone, and none of its changes are kept (see [`write_group`]); a commit
//! that fails fails every write of the group, and none of them was acknowledged. Writes run in queue order, one after the other, exactly as if each
//! had its own transaction: a later write of the group sees the earlier ones.
//!
//! No write waits for company: the first write of an idle broker is committed at once, and a
//! group forms only from the writes that arrived while the previous commit was in flight. Under
//! load that turns one fsync per write into one per group, which is what lets a single SQLite
//! file serve many agents.
//!
//! The writer is a thread of its own, not a task: its backend runs statements synchronously
//! (SQLite in-process), so a group runs start to commit without yielding, and the runtime's
//! workers never wait on a disk. Work that needs a transaction of its own (expiry, rule and grant
//! changes, Explain) is queued to the same thread with [`GroupCommit::alone`], so there is one
//! write connection and writes never contend for SQLite's lock.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::domain::{
    CallKey, CancelReport, CancelTarget, DecideReport, Decision, NewBatch, SubmitReport, Timestamp,
    ToolResultTexts,
};
use crate::error::{Error, Result};
use crate::meters;
use crate::operations::{PolicyTx, Transactions, WriteTx, cancel, decide, submit};

/// The most writes one transaction takes. Bounds how long the first of them waits for the last.
pub const MAX_GROUP: usize = 256;

/// How many writes may wait for the writer before callers wait to enqueue (backpressure).
const QUEUE: usize = 4 * MAX_GROUP;

/// The handle callers write through. Cheap to share; the writer thread ends when the last
/// handle is dropped, after finishing what was queued.
pub struct GroupCommit<W> {
    queue: mpsc::Sender<Queued<W>>,
}

/// What the writer thread takes from its queue.
enum Queued<W> {
    /// A write that joins the current group.
    Write(Job),
    /// Work that runs its own transactions (given the writer), between groups.
    Alone(Work<W>),
}

/// Work given the writer; it answers its caller itself.
type Work<W> = Box<dyn FnOnce(W) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// One queued write: its request, its result once it ran, and where to send that result once
/// the group committed.
enum Job {
    /// Boxed, as a decision: a batch and a decision (with their reports) are several times
    /// larger than a cancel, and a queued write should not cost the largest one's size.
    Submit(Box<Slot<NewBatch, SubmitReport>>),
    Decide(Box<Slot<(CallKey, Decision), DecideReport>>),
    Cancel(Slot<CancelTarget, CancelReport>),
}

struct Slot<Q, A> {
    request: Q,
    result: Option<Result<A>>,
    reply: oneshot::Sender<Result<A>>,
}

impl<Q, A> Slot<Q, A> {
    fn new(request: Q) -> (Self, oneshot::Receiver<Result<A>>) {
        let (reply, answer) = oneshot::channel();
        let slot = Self {
            request,
            result: None,
            reply,
        };
        (slot, answer)
    }

    fn succeeded(&self) -> bool {
        matches!(self.result, Some(Ok(_)))
    }

    /// Sends the result if the group committed, or the commit's failure if it did not (or this
    /// write never ran). A caller that went away is not an error: what it wrote stands, and a
    /// retry is answered idempotently.
    fn answer(self, committed: std::result::Result<(), &Error>) {
        let result = match (committed, self.result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(Error::Internal("a write of the group did not run".into())),
            (Err(cause), _) => Err(Error::not_committed(cause)),
        };
        let _ = self.reply.send(result);
    }
}

impl<W> GroupCommit<W>
where
    W: Transactions + Clone + Send + 'static,
{
    /// Starts the writer thread over `writer`, whose transactions must not need an async
    /// runtime (the thread has none).
    pub fn start(writer: W, texts: ToolResultTexts) -> Result<Self> {
        let (queue, jobs) = mpsc::channel(QUEUE);
        thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || run_here(write_groups(writer, texts, jobs)))
            .map_err(|e| Error::Internal(format!("cannot start the store's writer thread: {e}")))?;
        Ok(Self { queue })
    }

    /// Runs `work` on the writer thread, between groups, and returns its result. It opens (and
    /// commits) its own transactions from the writer it is given.
    pub async fn alone<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: FnOnce(W) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work = move |writer: W| -> Pin<Box<dyn Future<Output = ()>>> {
            Box::pin(async move {
                let _ = reply.send(work(writer).await);
            })
        };
        self.queue
            .send(Queued::Alone(Box::new(work)))
            .await
            .map_err(writer_gone)?;
        answer.await.map_err(writer_gone)?
    }

    pub async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        let (slot, answer) = Slot::new(batch);
        self.enqueue(Job::Submit(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    pub async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let (slot, answer) = Slot::new((key.clone(), decision.clone()));
        self.enqueue(Job::Decide(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    pub async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        let (slot, answer) = Slot::new(target.clone());
        self.enqueue(Job::Cancel(slot)).await?;
        answer.await.map_err(writer_gone)?
    }

    async fn enqueue(&self, job: Job) -> Result<()> {
        self.queue
            .send(Queued::Write(job))
            .await
            .map_err(writer_gone)
    }
}

fn writer_gone<E>(_: E) -> Error {
    Error::Internal("the store's writer thread has stopped".into())
}

/// Polls `future` to completion on this thread, parking it while the future waits (here: for
/// the queue). The writer's only executor.
fn run_here<F: Future>(future: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        thread::park();
    }
}

async fn write_groups<W: Transactions + Clone>(
    writer: W,
    texts: ToolResultTexts,
    mut queue: mpsc::Receiver<Queued<W>>,
) {
    let mut taken = Vec::with_capacity(MAX_GROUP);
    let mut group = Vec::with_capacity(MAX_GROUP);
    while queue.recv_many(&mut taken, MAX_GROUP).await > 0 {
        for queued in taken.drain(..) {
            match queued {
                Queued::Write(job) => group.push(job),
                Queued::Alone(work) => {
                    // In queue order: the writes taken before it commit first.
                    if !group.is_empty() {
                        write_group(&writer, &texts, group.drain(..)).await;
                        writer.after_commit();
                    }
                    work(writer.clone()).await;
                    writer.after_commit();
                }
            }
        }
        if !group.is_empty() {
            write_group(&writer, &texts, group.drain(..)).await;
            writer.after_commit();
        }
    }
}

/// Runs `group` in one transaction and answers every caller. Returns whether it committed.
///
/// A write that fails before it changed anything (the usual client mistake: an unknown call)
/// simply fails. One that fails after changing something (a storage error half-way) leaves its
/// changes in the transaction, so the transaction is dropped (rolled back) and the group starts
/// over without it. No savepoints: they would cost two statements on every write to save work
/// only on a path that almost never runs.
async fn write_group<W: Transactions>(
    writer: &W,
    texts: &ToolResultTexts,
    group: impl Iterator<Item = Job>,
) -> bool {
    let mut jobs: Vec<Job> = group.collect();
    let mut failed: Vec<Job> = Vec::new();
    let started = Instant::now();
    let committed = loop {
        let attempt = async {
            let mut tx = writer.begin_write().await?;
            for (i, job) in jobs.iter_mut().enumerate() {
                let before = tx.statements_written();
                if !job.run(&mut tx, texts).await {
                    let wrote = match (before, tx.statements_written()) {
                        (Some(before), Some(after)) => after > before,
                        _ => true,
                    };
                    if wrote {
                        return Ok(Some(i));
                    }
                }
            }
            tx.commit().await.map(|()| None)
        }
        .await;
        match attempt {
            Ok(None) => break Ok(()),
            Ok(Some(i)) => {
                tracing::warn!("a write failed half-way; its group starts over without it");
                failed.push(jobs.remove(i));
            }
            Err(e) => break Err(e),
        }
    };
    match &committed {
        Ok(()) => meters::committed(jobs.len(), started.elapsed()),
        Err(e) => {
            tracing::error!(error = %e, writes = jobs.len(), "a group of writes failed to commit");
        }
    }
    for job in jobs {
        job.answer(committed.as_ref().copied());
    }
    // Their own errors, whatever became of the group.
    for job in failed {
        job.answer(Ok(()));
    }
    committed.is_ok()
}

impl Job {
    /// Runs the write in `tx`, keeping its result; returns whether it succeeded.
    async fn run(&mut self, tx: &mut (impl WriteTx + PolicyTx), texts: &ToolResultTexts) -> bool {
        let now = Timestamp::now();
        match self {
            Job::Submit(slot) => {
                slot.result = Some(submit::submit_in(tx, &slot.request, texts, now).await);
                slot.succeeded()
            }
            Job::Decide(slot) => {
                let (key, decision) = &slot.request;
                slot.result = Some(decide::decide_in(tx, key, decision, texts, now).await);
                slot.succeeded()
            }
            Job::Cancel(slot) => {
                slot.result = Some(cancel::cancel_in(tx, &slot.request, texts, now).await);
                slot.succeeded()
            }
        }
    }

    fn answer(self, committed: std::result::Result<(), &Error>) {
        match self {
            Job::Submit(slot) => (*slot).answer(committed),
            Job::Decide(slot) => (*slot).answer(committed),
            Job::Cancel(slot) => slot.answer(committed),
        }
    }
}
