//! Group commit: the writes queued while a commit is on its way to disk share the next
//! transaction, and so one fsync.
//!
//! One task owns the write path. It takes every write waiting in its queue (up to
//! [`MAX_GROUP`]), runs each inside its own savepoint of one transaction, commits, and only then
//! answers each caller. A write that fails (a client mistake such as an unknown call) rolls back
//! to its savepoint and fails alone; a commit that fails fails every write of the group, and none
//! of them was acknowledged. Writes run in queue order, one after the other, exactly as if each
//! had its own transaction: a later write of the group sees the earlier ones.
//!
//! No write waits for company: the first write of an idle broker is committed at once, and a
//! group forms only from the writes that arrived while the previous commit was in flight. Under
//! load that turns one fsync per write into one per group, which is what lets a single SQLite
//! file serve many agents.

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::writes::{self, Savepoint, WriteTx, Writer};
use super::{CancelReport, CancelTarget, DecideReport, SubmitReport};
use crate::domain::{CallKey, Decision, NewBatch, Timestamp, ToolResultTexts};
use crate::error::{Error, Result};
use crate::meters;

/// The most writes one transaction takes. Bounds how long the first of them waits for the last.
pub const MAX_GROUP: usize = 256;

/// How many writes may wait for the writer before callers wait to enqueue (backpressure).
const QUEUE: usize = 4 * MAX_GROUP;

/// The handle callers write through. Cheap to share; the writer task ends when the last handle
/// is dropped, after finishing what was queued.
pub struct GroupCommit {
    queue: mpsc::Sender<Job>,
}

/// One queued write: its request, its result once it ran, and where to send that result once
/// the group committed.
enum Job {
    Submit(Slot<NewBatch, SubmitReport>),
    /// Boxed: a decision and its report are several times larger than the other writes.
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
            (Err(cause), _) => Err(Error::Internal(format!(
                "the write was not committed: {cause}"
            ))),
        };
        let _ = self.reply.send(result);
    }
}

impl GroupCommit {
    /// Starts the writer task over `writer`.
    pub fn start<W>(writer: W, texts: ToolResultTexts) -> Self
    where
        W: Writer + Send + 'static,
    {
        let (queue, jobs) = mpsc::channel(QUEUE);
        tokio::spawn(write_groups(writer, texts, jobs));
        Self { queue }
    }

    pub async fn submit(&self, batch: NewBatch) -> Result<SubmitReport> {
        let (slot, answer) = Slot::new(batch);
        self.enqueue(Job::Submit(slot)).await?;
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
        self.queue.send(job).await.map_err(writer_gone)
    }
}

fn writer_gone(_: impl std::fmt::Debug) -> Error {
    Error::Internal("the store's writer task has stopped".into())
}

async fn write_groups<W: Writer>(writer: W, texts: ToolResultTexts, mut jobs: mpsc::Receiver<Job>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
        write_group(&writer, &texts, group.drain(..)).await;
    }
}

/// Runs `group` in one transaction and answers every caller. Returns whether it committed.
async fn write_group<W: Writer>(
    writer: &W,
    texts: &ToolResultTexts,
    group: impl Iterator<Item = Job>,
) -> bool {
    let mut jobs: Vec<Job> = group.collect();
    let started = Instant::now();
    let committed = async {
        let mut tx = writer.begin_write().await?;
        for job in &mut jobs {
            run_isolated(&mut tx, texts, job).await?;
        }
        tx.commit().await
    }
    .await;
    match &committed {
        Ok(()) => meters::committed(jobs.len(), started.elapsed()),
        Err(e) => {
            tracing::error!(error = %e, writes = jobs.len(), "a group of writes failed to commit");
        }
    }
    for job in jobs {
        match job {
            Job::Submit(slot) => slot.answer(committed.as_ref().copied()),
            Job::Decide(slot) => (*slot).answer(committed.as_ref().copied()),
            Job::Cancel(slot) => slot.answer(committed.as_ref().copied()),
        }
    }
    committed.is_ok()
}

/// Runs one write inside a savepoint, so that its failure undoes only its own changes. An error
/// returned from here means the transaction itself is broken: the whole group fails.
async fn run_isolated(tx: &mut impl WriteTx, texts: &ToolResultTexts, job: &mut Job) -> Result<()> {
    tx.savepoint(Savepoint::Mark).await?;
    let now = Timestamp::now();
    let succeeded = match job {
        Job::Submit(slot) => {
            slot.result = Some(writes::submit_in(tx, &slot.request, texts, now).await);
            slot.succeeded()
        }
        Job::Decide(slot) => {
            let (key, decision) = &slot.request;
            slot.result = Some(writes::decide_in(tx, key, decision, texts, now).await);
            slot.succeeded()
        }
        Job::Cancel(slot) => {
            slot.result = Some(writes::cancel_in(tx, &slot.request, texts, now).await);
            slot.succeeded()
        }
    };
    let step = if succeeded {
        Savepoint::Release
    } else {
        Savepoint::RollBack
    };
    tx.savepoint(step).await
}
