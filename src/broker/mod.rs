//! The broker: the one facade every surface (the gRPC services, and anything after them) calls.
//! Each operation judges what can be judged ahead (`prejudge`), writes through the `Writes` port
//! the store gives it (the group commit of `crate::operations::tx`, or Postgres's own
//! transactions; the operations are written once, in `crate::operations`), and only after it
//! committed tells the
//! event fan-out, the deadline sweeper and the meters. The services in `surface/grpc/` translate
//! protobuf to these calls and back, nothing more; they never reach the store themselves.
//!
//! - this file: the writes (submit, decide, cancel) and the stream slots;
//! - `reads`: what the API reads (calls, batches, grants, rules, the event log's head);
//! - `policy`: grant and rule administration (rule modes too), and Explain;
//! - `rule_replay`: ReplayRule, a candidate rule judged against decided calls (read-only);
//! - `prejudge`: matching large inputs off the store's writer;
//! - `webhooks`: webhook endpoint administration;
//! - `lifecycle`: the pruned horizon and backups;
//! - `receipts`: reading signed receipts and the key they verify with.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument as _;

use crate::background::events::EventBus;
use crate::background::expiry::{DeadlineSweeper, Sweeps};
use crate::background::webhooks::Dispatcher;
use crate::domain::Call;
use crate::domain::escalation::Ladder;
use crate::domain::{
    CallKey, CancelReport, CancelTarget, DecideReport, Decision, NewBatch, OutcomeKind, Status,
    SubmitReport, SubmitResult, Timestamp,
};
use crate::door::stream_slots::{StreamSlot, StreamSlots};
use crate::error::{Error, Result};
use crate::observe::meters::{self, StreamKind};
use crate::observe::traces;
use crate::operations::Writes;
use crate::receipts::PublicKey;
use crate::receipts::trust::KeySet;
use crate::store::Store;

mod lifecycle;
mod links;
mod passkeys;
mod policy;
mod prejudge;
mod reads;
mod receipts;
mod rule_replay;
mod webhooks;

pub use lifecycle::{BackupName, BackupReport};
pub use passkeys::{StepUpAsker, StepUpOffer};
pub use prejudge::PREJUDGE_FROM_BYTES;
pub use receipts::CheckedReceipt;
pub use rule_replay::{REPLAY_PAGE_BUDGET, ReplayPage};

/// Limits and defaults the broker applies to what clients send.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The largest tool input, in bytes of JSON text.
    pub max_input_bytes: usize,
    /// The deadline given to calls submitted without one.
    pub default_deadline: Option<Duration>,
    /// How many undelivered events a subscriber may have queued before its stream is ended.
    pub subscriber_buffer: usize,
    /// The most agent streams (`Connect`, `WatchOutcomes`) open at once.
    pub max_agent_streams: usize,
    /// The most `Subscribe` streams open at once.
    pub max_subscribers: usize,
    /// The largest reply, encoded (`grpc::oversize`).
    pub max_reply_bytes: usize,
    /// The most pending calls one agent may have; new calls beyond it are refused.
    pub max_pending_per_agent: u64,
    /// Who may decide calls no ask rule names approvers for (`--default-approvers`).
    pub default_approvers: Option<crate::domain::policy::Approvers>,
}

pub struct Broker {
    store: Arc<dyn Store>,
    /// The writes of calls (`operations::tx`'s `Writes` port): submit, decide, cancel.
    writes: Arc<dyn Writes>,
    bus: Arc<EventBus>,
    sweeper: Arc<DeadlineSweeper>,
    limits: Limits,
    agent_streams: Arc<StreamSlots>,
    subscribers: Arc<StreamSlots>,
    stopping: watch::Receiver<bool>,
    /// Webhook delivery, told of endpoint changes; `None` where nothing delivers (unit tests).
    webhooks: Option<Arc<Dispatcher>>,
    /// The escalation ladder of calls left to a human without an ask rule's own
    /// (`--escalation-file`).
    default_escalation: Option<Arc<Ladder>>,
    /// Where the Backup RPC writes; `None` where the store is not a file (Postgres).
    backup_dir: Option<std::path::PathBuf>,
    /// The key this broker's receipts verify with; `None` when receipts are off.
    receipt_key: Option<PublicKey>,
    /// Signed approval links (`door/links.rs`); `None` when this broker makes none.
    links: Option<links::Links>,
    /// Every key its receipts verify with: the current one first, then the retired ones
    /// (`--receipt-retired-keys`), each with its window. Empty when receipts are off.
    receipt_keys: KeySet,
    /// Who this broker is to passkeys (`passkeys.rs`); `None` where it serves none.
    relying_party: Option<Arc<crate::domain::passkey::RelyingParty>>,
}

impl Broker {
    pub fn new(
        store: Arc<dyn Store>,
        bus: Arc<EventBus>,
        sweeper: Arc<DeadlineSweeper>,
        limits: Limits,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            agent_streams: StreamSlots::new(
                StreamKind::Agent,
                "agent streams",
                "--max-agent-streams",
                limits.max_agent_streams,
            ),
            subscribers: StreamSlots::new(
                StreamKind::Subscriber,
                "subscribers",
                "--max-subscribers",
                limits.max_subscribers,
            ),
            writes: Arc::clone(&store).writes(),
            store,
            bus,
            sweeper,
            limits,
            stopping,
            webhooks: None,
            default_escalation: None,
            backup_dir: None,
            receipt_key: None,
            receipt_keys: KeySet::default(),
            links: None,
            relying_party: None,
        }
    }

    /// The broker with a default escalation ladder (an empty one is none).
    pub fn with_default_escalation(mut self, ladder: Ladder) -> Self {
        self.default_escalation = (!ladder.is_empty()).then(|| Arc::new(ladder));
        self
    }

    /// The broker with webhook delivery, which it tells of endpoint changes.
    pub fn with_webhooks(mut self, dispatcher: Arc<Dispatcher>) -> Self {
        self.webhooks = Some(dispatcher);
        self
    }

    /// The broker whose outcomes are signed by the key `public` verifies (see `receipts`).
    pub fn with_receipt_key(mut self, public: Option<PublicKey>) -> Self {
        self.receipt_key = public;
        self.receipt_keys = KeySet::of_broker(public, &KeySet::default());
        self
    }

    /// The broker that also knows the keys it signed with before (`--receipt-retired-keys`):
    /// served with their windows, and checked against when it reports a receipt's status. Set
    /// after [`Broker::with_receipt_key`].
    pub fn with_retired_receipt_keys(mut self, retired: &KeySet) -> Self {
        self.receipt_keys = KeySet::of_broker(self.receipt_key, retired);
        self
    }

    /// A slot for a new agent stream; refused while draining or when all are taken.
    pub fn open_agent_stream(&self) -> Result<StreamSlot> {
        self.refuse_if_stopping()?;
        self.agent_streams.take()
    }

    /// A slot for a new subscriber; refused while draining or when all are taken.
    pub fn open_subscriber(&self) -> Result<StreamSlot> {
        self.refuse_if_stopping()?;
        self.subscribers.take()
    }

    fn refuse_if_stopping(&self) -> Result<()> {
        if *self.stopping.borrow() {
            return Err(Error::Unavailable(
                "the broker is shutting down; connect to another replica or retry".into(),
            ));
        }
        Ok(())
    }

    pub fn bus(&self) -> &Arc<EventBus> {
        &self.bus
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Resolves when the server starts shutting down: long-lived streams end then.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.clone();
        // An error means the sender is gone: the server is gone too.
        let _ = stopping.wait_for(|stop| *stop).await;
    }

    /// Stores a batch (after giving calls without a deadline the default one).
    #[tracing::instrument(name = "submit", skip_all, fields(
        agent = %batch.agent,
        session = %batch.session,
        calls = %CallIds(batch.calls.iter().map(|c| &c.call_id)),
    ))]
    pub async fn submit(&self, mut batch: NewBatch) -> Result<SubmitReport> {
        batch.pending_cap = Some(self.limits.max_pending_per_agent);
        batch.default_escalation = self.default_escalation.clone();
        batch.default_approvers = self.limits.default_approvers.clone();
        if let Some(default) = self.limits.default_deadline {
            let deadline = Timestamp::now().saturating_add(default);
            for call in &mut batch.calls {
                call.deadline.get_or_insert(deadline);
            }
        }
        let has_deadline = batch.calls.iter().any(|c| c.deadline.is_some());
        let batch = self.prejudge(batch).await?;
        let report = self
            .writes
            .submit(batch)
            .instrument(traces::when_on(|| tracing::info_span!("store.submit")))
            .await?;
        let escalating = report.items.iter().any(|item| {
            matches!(&item.result, SubmitResult::Accepted(call)
                if call.escalation.as_ref().is_some_and(|e| e.next_at.is_some()))
        });
        let accepted: Vec<&Call> = report
            .items
            .iter()
            .filter_map(|item| match &item.result {
                SubmitResult::Accepted(call) => Some(call),
                _ => None,
            })
            .collect();
        meters::calls_submitted(accepted.len());
        for call in &accepted {
            traces::call_accepted(call);
        }
        // Calls a rule or grant decided at once, and those their denial skipped, count too; one
        // superseded by a later call of the batch counts once, among `superseded`.
        let decided_at_once = accepted
            .into_iter()
            .filter(|call| !matches!(call.status(), Status::Decided(OutcomeKind::Superseded)));
        let decided_at_once: Vec<&Call> = decided_at_once.chain(&report.superseded).collect();
        self.committed(decided_at_once.iter().copied());
        meters::shadow_verdicts(&report.shadow_verdicts);
        if has_deadline || escalating {
            self.sweeper.deadline_added();
        }
        tracing::debug!(
            batch = report.batch_id.as_ref().map(|b| b.as_str()),
            superseded = report.superseded.len(),
            "submitted"
        );
        Ok(report)
    }

    /// Decides a pending call. Its span joins the call's trace when traces are on (see
    /// `traces`), and carries the GenAI and `approvals.*` attributes of what was decided.
    pub async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        // The ids for the logs; the GenAI and `approvals.*` attributes only for a trace.
        macro_rules! decide_span {
            ($($traced:tt)*) => {
                tracing::info_span!(
                    "decide",
                    agent = %key.agent,
                    session = %key.session,
                    call = %key.call_id,
                    approver = %decision.approver,
                    $($traced)*
                )
            };
        }
        let span = if traces::on() {
            decide_span!(
                gen_ai.tool.call.id = %key.call_id,
                gen_ai.tool.name = tracing::field::Empty,
                approvals.outcome = tracing::field::Empty,
                approvals.decided_by = tracing::field::Empty,
            )
        } else {
            decide_span!()
        };
        traces::join_call(&span, key);
        self.decide_in(key, decision).instrument(span).await
    }

    /// What `decision` would do now (Remember, previewed: docs/answers.md), judged as
    /// [`Broker::decide`] judges it and written in a transaction that is rolled back: nothing
    /// is kept and nobody is told.
    pub async fn preview_decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        match self.prejudge_covered(key, decision).await? {
            Some(prejudged) => {
                let decision = Decision {
                    prejudged,
                    ..decision.clone()
                };
                self.writes.preview_decide(key, &decision).await
            }
            None => self.writes.preview_decide(key, decision).await,
        }
    }

    async fn decide_in(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let store_span = || traces::when_on(|| tracing::info_span!("store.decide"));
        let report = match self.prejudge_covered(key, decision).await? {
            Some(prejudged) => {
                let decision = Decision {
                    prejudged,
                    ..decision.clone()
                };
                self.writes
                    .decide(key, &decision)
                    .instrument(store_span())
                    .await?
            }
            None => {
                self.writes
                    .decide(key, decision)
                    .instrument(store_span())
                    .await?
            }
        };
        traces::record_outcome(&tracing::Span::current(), &report.call);
        if !report.replayed {
            let written = std::iter::once(&report.call)
                .chain(&report.skipped)
                .chain(&report.decided_by_grant);
            self.committed(written);
        }
        tracing::debug!(
            verdict = ?decision.verdict,
            replayed = report.replayed,
            skipped = report.skipped.len(),
            "decided"
        );
        Ok(report)
    }

    #[tracing::instrument(name = "cancel", skip_all, fields(
        agent = %target.agent,
        session = %target.session,
        scope = ?target.scope,
    ))]
    pub async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        let report = self.writes.cancel(target).await?;
        if !report.cancelled.is_empty() {
            self.committed(&report.cancelled);
        }
        tracing::debug!(
            cancelled = report.cancelled.len(),
            already_decided = report.already_decided.len(),
            "cancelled"
        );
        Ok(report)
    }
}

impl Broker {
    /// The one step after every commit of calls, whoever asked for it (an RPC, the deadline
    /// sweeper): the event pump is woken to publish what the commit logged, and each outcome the
    /// commit wrote is counted and logged once. Every write of calls goes through the broker,
    /// so none skips it (streams would wait for the next commit, the metrics would fall short).
    fn committed<'a>(&self, outcomes: impl IntoIterator<Item = &'a Call> + Clone) {
        self.bus.wake();
        meters::outcomes(outcomes.clone());
        crate::observe::telemetry::outcomes_written(outcomes);
    }
}

/// The deadline sweeper's writes (`background/expiry.rs`), through the broker like every write.
#[async_trait::async_trait]
impl Sweeps for Broker {
    async fn escalate_due(&self, now: Timestamp) -> Result<u64> {
        let fired = self.store.escalate_due(now).await?;
        if fired > 0 {
            tracing::info!(
                count = fired,
                "escalation steps fired for calls still pending"
            );
            self.committed(std::iter::empty());
        }
        Ok(fired)
    }

    async fn expire_due(&self, now: Timestamp) -> Result<usize> {
        let expired = self.store.expire_due(now).await?;
        if !expired.is_empty() {
            tracing::info!(count = expired.len(), "expired calls past their deadline");
            self.committed(&expired);
        }
        Ok(expired.len())
    }
}

/// Call ids for a span field: `a,b,c`.
struct CallIds<'a, I>(I)
where
    I: Iterator<Item = &'a crate::domain::CallId> + Clone;

impl<'a, I> std::fmt::Display for CallIds<'a, I>
where
    I: Iterator<Item = &'a crate::domain::CallId> + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, id) in self.0.clone().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{id}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolResultTexts;
    use crate::store::Database;

    #[tokio::test]
    async fn new_streams_are_refused_while_draining() {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::sqlite_file(dir.path().join("a.db"));
        let store = crate::store::open(&database, ToolResultTexts::default(), None)
            .await
            .unwrap();
        let bus = EventBus::new(store.clone(), 16).await.unwrap();
        let sweeper = DeadlineSweeper::new(store.clone());
        let limits = Limits {
            max_input_bytes: 1024,
            default_deadline: None,
            subscriber_buffer: 4,
            max_agent_streams: 4,
            max_subscribers: 4,
            max_reply_bytes: 64 * 1024,
            max_pending_per_agent: 4,
            default_approvers: None,
        };
        let (stop, stopping) = watch::channel(false);
        let broker = Broker::new(store, bus, sweeper, limits, stopping);
        let open = broker.open_subscriber().unwrap();
        stop.send(true).unwrap();
        for refused in [broker.open_subscriber(), broker.open_agent_stream()] {
            let err = refused.unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
        }
        drop(open);
    }
}
