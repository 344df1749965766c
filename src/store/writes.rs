//! The write path: the three writes the API makes (submit, decide, cancel), as the one port the
//! broker writes through ([`Writes`]), and the group commit that runs them on both backends.
//! Each write is one transaction in which its operation (`crate::operations`) runs, acknowledged
//! only after it commits. SQLite's writes all take the group commit below; Postgres's take it
//! under `--postgres-group-commit`, else each runs in a transaction of its own
//! (`PostgresStore`'s [`Writes`]).
//!
//! Group commit: the writes queued while a commit is on its way to disk share the next
//! transaction, and so one commit.
//!
//! One writer owns the write path: SQLite's writer thread ([`GroupCommit::start`]), or one task
//! per Postgres replica ([`GroupCommit::spawn`]). It takes every write waiting in its queue (up to
//! [`MAX_GROUP`]), runs them in one transaction, commits, and only then answers each caller. A
//! write that fails fails alone, and none of its changes are kept (see [`write_group`]); a
//! commit that fails fails every write of the group, and none of them was acknowledged. Writes
//! run in queue order, one after the other, exactly as if each had its own transaction: a later
//! write of the group sees the earlier ones.
//!
//! No write waits for company: the first write of an idle broker is committed at once, and a
//! group forms only from the writes that arrived while the previous commit was in flight. Under
//! load that turns one commit per write into one per group, which is what lets a single SQLite
//! file serve many agents, and what saves Postgres a transaction per write.
//!
//! SQLite's writer is a thread of its own, not a task: its backend runs statements synchronously
//! (SQLite in-process), so a group runs start to commit without yielding, and the runtime's
//! workers never wait on a disk. Work that needs a transaction of its own (expiry, rule and grant
//! changes, Explain) is queued to the same thread with [`GroupCommit::alone`], so there is one
//! write connection and writes never contend for SQLite's lock. Postgres's writer is a task (its
//! statements are network round trips), and the rest of its writes keep their own transactions.
//!
//! Where writers run concurrently (Postgres replicas), a group takes the locks of its writes in
//! queue order, not in the one order of `operations::tx`, so two groups can deadlock; the
//! database aborts one, and that group is run again, whole, up to [`CONFLICT_ATTEMPTS`] times
//! (see [`Error::is_transaction_conflict`]). Nothing of an attempt that rolled back is answered.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::domain::{
    CallKey, CancelReport, CancelTarget, DecideReport, Decision, NewBatch, SubmitReport, Timestamp,
    ToolResultTexts,
};
use crate::error::{Error, Result};
use crate::observe::meters;
use crate::operations::{PolicyTx, Transactions, WriteTx, cancel, decide, submit};

/// The writes of the API, each one transaction acknowledged only after it commits: what the
/// broker writes through (`Calls::writes` gives it). On SQLite (and Postgres under
/// `--postgres-group-commit`) the [`GroupCommit`] below; on Postgres otherwise `PostgresStore`.
#[async_trait]
pub trait Writes: Send + Sync {
    /// Stores a batch's new calls, recognising duplicates and refusing conflicting reuse of a
    /// call id, and supersedes what the batch supersedes (`operations::submit`).
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport>;

    /// Writes an approver's decision if the call is pending (first decision wins), and skips the
    /// rest of its batch on a denial when the batch says so. A decision to remember creates its
    /// grant and decides the pending calls the grant matches (`operations::decide`).
    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport>;

    /// What [`decide`](Writes::decide) would report now, written in a transaction that is rolled
    /// back: nothing is kept (`operations::decide::preview`).
    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport>;

    /// Cancels what `target` names; reports calls already decided as they stand
    /// (`operations::cancel`).
    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport>;
}

/// The most writes one transaction takes. Bounds how long the first of them waits for the last.
pub const MAX_GROUP: usize = 256;

/// How many times a group is run when the database keeps aborting it for a deadlock or a
/// serialization failure; after that its writes fail (none was acknowledged).
pub const CONFLICT_ATTEMPTS: usize = 5;

/// How many writes may wait for the writer before callers wait to enqueue (backpressure).
const QUEUE: usize = 4 * MAX_GROUP;

/// The handle callers write through: `M` is what the writer takes from its queue ([`Queued`] on
/// SQLite's thread, a bare [`Job`] on Postgres's task). Cheap to share; the writer ends when the
/// last handle is dropped, after finishing what was queued.
pub struct GroupCommit<M> {
    queue: mpsc::Sender<M>,
    /// The texts tool results carry, for a preview run beside the groups.
    texts: ToolResultTexts,
}

/// What SQLite's writer thread takes from its queue.
pub enum Queued<W> {
    /// A write that joins the current group.
    Write(Job),
    /// Work that runs its own transactions (given the writer), between groups.
    Alone(Work<W>),
}

impl<W> From<Job> for Queued<W> {
    fn from(job: Job) -> Self {
        Queued::Write(job)
    }
}

/// Work given the writer; it answers its caller itself.
type Work<W> = Box<dyn FnOnce(W) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// One queued write: its request, its result once it ran, and where to send that result once
/// the group committed.
pub enum Job {
    /// Boxed, as a decision: a batch and a decision (with their reports) are several times
    /// larger than a cancel, and a queued write should not cost the largest one's size.
    Submit(Box<Errand<NewBatch, SubmitReport>>),
    Decide(Box<Errand<(CallKey, Decision), DecideReport>>),
    Cancel(Errand<CancelTarget, CancelReport>),
}

pub struct Errand<Q, A> {
    request: Q,
    result: Option<Result<A>>,
    reply: oneshot::Sender<Result<A>>,
}

impl<Q, A> Errand<Q, A> {
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

impl<W> GroupCommit<Queued<W>>
where
    W: Transactions + Clone + Send + 'static,
{
    /// Starts the writer thread over `writer`, whose transactions must not need an async
    /// runtime (the thread has none).
    pub fn start(writer: W, texts: ToolResultTexts) -> Result<Self> {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let written = texts.clone();
        thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || run_here(write_groups(writer, written, jobs)))
            .map_err(|e| Error::Internal(format!("cannot start the store's writer thread: {e}")))?;
        Ok(Self { queue, texts })
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
}

/// SQLite's writes: every one joins a group on the writer thread; a preview runs there too,
/// between groups, in a transaction that is rolled back.
#[async_trait]
impl<W> Writes for GroupCommit<Queued<W>>
where
    W: Transactions + Clone + Send + 'static,
{
    async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        self.submit_queued(batch).await
    }

    async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        self.decide_queued(key, decision).await
    }

    async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let (key, decision, texts) = (key.clone(), decision.clone(), self.texts.clone());
        self.alone(move |writer| async move {
            decide::preview(writer.begin_write().await?, &key, &decision, &texts).await
        })
        .await
    }

    async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        self.cancel_queued(target).await
    }
}

impl GroupCommit<Job> {
    /// Starts the writer as a task on the current runtime, over `writer`.
    pub fn spawn<W>(writer: W, texts: ToolResultTexts) -> Self
    where
        W: Transactions + Send + 'static,
        W::Tx: 'static,
    {
        let (queue, mut jobs) = mpsc::channel::<Job>(QUEUE);
        let written = texts.clone();
        tokio::spawn(async move {
            let mut group = Vec::with_capacity(MAX_GROUP);
            while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
                write_group(&writer, &written, group.drain(..)).await;
                writer.after_commit();
            }
        });
        Self { queue, texts }
    }
}

impl<M: From<Job> + Send> GroupCommit<M> {
    /// Queues a submit on the group commit; its report once its group committed.
    pub async fn submit_queued(&self, batch: NewBatch) -> Result<SubmitReport> {
        let (slot, answer) = Errand::new(batch);
        self.enqueue(Job::Submit(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    /// Queues a decision on the group commit; its report once its group committed.
    pub async fn decide_queued(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let (slot, answer) = Errand::new((key.clone(), decision.clone()));
        self.enqueue(Job::Decide(Box::new(slot))).await?;
        answer.await.map_err(writer_gone)?
    }

    /// Queues a cancel on the group commit; its report once its group committed.
    pub async fn cancel_queued(&self, target: &CancelTarget) -> Result<CancelReport> {
        let (slot, answer) = Errand::new(target.clone());
        self.enqueue(Job::Cancel(slot)).await?;
        answer.await.map_err(writer_gone)?
    }

    async fn enqueue(&self, job: Job) -> Result<()> {
        self.queue.send(job.into()).await.map_err(writer_gone)
    }
}

fn writer_gone<E>(_: E) -> Error {
    Error::Internal("the store's writer has stopped".into())
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
/// simply fails. One that fails after changing something (a storage error half-way), or whose
/// statement failed (which aborts a Postgres transaction), leaves the transaction unusable, so it
/// is dropped (rolled back) and the group starts over without that write. No savepoints: they
/// would cost two statements on every write to save work only on a path that almost never runs.
///
/// A deadlock or serialization failure (the database aborted the transaction to break a cycle
/// of waits) is no write's fault: the whole group runs again, at most [`CONFLICT_ATTEMPTS`]
/// times, each write from scratch.
async fn write_group<W: Transactions>(
    writer: &W,
    texts: &ToolResultTexts,
    group: impl Iterator<Item = Job>,
) -> bool {
    let mut jobs: Vec<Job> = group.collect();
    let mut failed: Vec<Job> = Vec::new();
    let mut conflicts = 0;
    let started = Instant::now();
    let committed = loop {
        let attempt = async {
            let mut tx = writer.begin_write().await?;
            let alone = jobs.len() == 1;
            for (i, job) in jobs.iter_mut().enumerate() {
                let before = tx.statements_written();
                tx.next_write(alone);
                if !job.run(&mut tx, texts).await {
                    if job.conflicted() {
                        return Ok(Attempt::Conflict);
                    }
                    let wrote = match (before, tx.statements_written()) {
                        (Some(before), Some(after)) => after > before,
                        _ => true,
                    };
                    if wrote {
                        return Ok(Attempt::Without(i));
                    }
                }
            }
            tx.commit().await.map(|()| Attempt::Committed)
        }
        .await;
        match attempt {
            Ok(Attempt::Committed) => break Ok(()),
            Ok(Attempt::Without(i)) => {
                tracing::warn!("a write failed half-way; its group starts over without it");
                failed.push(jobs.remove(i));
            }
            Ok(Attempt::Conflict) if conflicts + 1 < CONFLICT_ATTEMPTS => {
                conflicts += 1;
                tracing::info!(
                    conflicts,
                    "a group was aborted by a deadlock or conflict; retrying it"
                );
            }
            Ok(Attempt::Conflict) => {
                break Err(Error::Unavailable(
                    "the write kept conflicting with concurrent writes; retry".into(),
                ));
            }
            Err(e) if e.is_transaction_conflict() && conflicts + 1 < CONFLICT_ATTEMPTS => {
                conflicts += 1;
                tracing::info!(conflicts, error = %e, "a group's commit conflicted; retrying it");
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

/// How one run of a group ended.
enum Attempt {
    Committed,
    /// The write at this index failed and left the transaction unusable.
    Without(usize),
    /// The database aborted the transaction to break a deadlock (or a serialization conflict).
    Conflict,
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

    /// Whether the write failed because the database aborted its transaction for a deadlock or
    /// a serialization conflict.
    fn conflicted(&self) -> bool {
        let result = match self {
            Job::Submit(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
            Job::Decide(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
            Job::Cancel(slot) => slot.result.as_ref().map(|r| r.as_ref().err()),
        };
        result.flatten().is_some_and(Error::is_transaction_conflict)
    }

    fn answer(self, committed: std::result::Result<(), &Error>) {
        match self {
            Job::Submit(slot) => (*slot).answer(committed),
            Job::Decide(slot) => (*slot).answer(committed),
            Job::Cancel(slot) => slot.answer(committed),
        }
    }
}
