//! The broker's operations as the gRPC surface sees them: each one applies the domain's rules,
//! persists through the store, and only then tells the event fan-out and the deadline sweeper.
//! The services in `grpc/` translate protobuf to these calls and back, nothing more.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::policy::{GrantScope, InputView, Matcher, Prejudged, Remember, Rule, Scope};
use crate::domain::{
    AgentId, Call, CallKey, Decision, NewBatch, NewCall, OutcomeKind, SessionId, Status, Timestamp,
    ToolName,
};
use crate::error::{Error, Result};
use crate::events::EventBus;
use crate::expiry::DeadlineSweeper;
use crate::limits::{Slot, StreamSlots};
use crate::meters::{self, StreamKind};
use crate::store::{
    CallQuery, CancelReport, CancelTarget, DecideReport, GrantQuery, Store, SubmitReport,
    SubmitResult,
};

/// Inputs at least this large have their rules' and grants' matchers judged before the submit
/// is queued, off the store's writer (see `Broker::prejudge`).
pub const PREJUDGE_FROM_BYTES: usize = 16 * 1024;

/// Pending calls a remembered decision's grant covers that are judged ahead, at most.
const PREJUDGED_PENDING: u32 = 1000;

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
}

pub struct Broker {
    store: Arc<dyn Store>,
    bus: Arc<EventBus>,
    sweeper: Arc<DeadlineSweeper>,
    limits: Limits,
    agent_streams: Arc<StreamSlots>,
    subscribers: Arc<StreamSlots>,
    stopping: watch::Receiver<bool>,
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
            store,
            bus,
            sweeper,
            limits,
            stopping,
        }
    }

    /// A slot for a new agent stream; refused while draining or when all are taken.
    pub fn open_agent_stream(&self) -> Result<Slot> {
        self.refuse_if_stopping()?;
        self.agent_streams.take()
    }

    /// A slot for a new subscriber; refused while draining or when all are taken.
    pub fn open_subscriber(&self) -> Result<Slot> {
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

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
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
        if let Some(default) = self.limits.default_deadline {
            let deadline = Timestamp::now().saturating_add(default);
            for call in &mut batch.calls {
                call.deadline.get_or_insert(deadline);
            }
        }
        let has_deadline = batch.calls.iter().any(|c| c.deadline.is_some());
        let batch = self.prejudge(batch).await?;
        let report = self.store.submit(batch).await?;
        self.bus.notify_committed();
        let accepted: Vec<&Call> = report
            .items
            .iter()
            .filter_map(|item| match &item.result {
                SubmitResult::Accepted(call) => Some(call),
                _ => None,
            })
            .collect();
        meters::calls_submitted(accepted.len());
        // Calls a rule or grant decided at once, and those their denial skipped, count too; one
        // superseded by a later call of the batch counts once, among `superseded`.
        let decided_at_once = accepted
            .into_iter()
            .filter(|call| !matches!(call.status(), Status::Decided(OutcomeKind::Superseded)));
        meters::outcomes(decided_at_once.chain(&report.superseded));
        if has_deadline {
            self.sweeper.deadline_added();
        }
        tracing::debug!(
            batch = report.batch_id.as_ref().map(|b| b.as_str()),
            superseded = report.superseded.len(),
            "submitted"
        );
        Ok(report)
    }

    /// Judges the field matchers of the rules and grants that may decide `batch`'s calls against
    /// their inputs, on a blocking thread: neither the store's writer (whose transaction then
    /// only looks the results up, see [`Prejudged`]) nor the runtime's workers wait for it.
    /// Best effort: a matcher it did not read (created since, or past the first page of an
    /// agent's grants for a tool) is judged in the transaction. Only inputs of at least
    /// [`PREJUDGE_FROM_BYTES`] are judged ahead: matching a small input costs the writer less
    /// than reading the rules and grants twice would cost every submit.
    async fn prejudge(&self, mut batch: NewBatch) -> Result<NewBatch> {
        let large = |c: &NewCall| c.input.as_str().len() >= PREJUDGE_FROM_BYTES;
        if !batch.calls.iter().any(large) {
            return Ok(batch);
        }
        let rules = self.store.list_rules().await?;
        let mut tools: Vec<&ToolName> = batch
            .calls
            .iter()
            .filter(|c| large(c))
            .map(|c| &c.tool)
            .collect();
        tools.sort_unstable();
        tools.dedup();
        let mut by_tool: Vec<(ToolName, Vec<Matcher>)> = Vec::new();
        for tool in tools {
            let matchers = self
                .matchers_for(&rules, &batch.agent, Some(&batch.session), tool, None)
                .await?;
            if !matchers.is_empty() {
                by_tool.push((tool.clone(), matchers));
            }
        }
        if by_tool.is_empty() {
            return Ok(batch);
        }
        tokio::task::spawn_blocking(move || {
            for call in batch.calls.iter_mut().filter(|c| large(c)) {
                let Some((_, matchers)) = by_tool.iter().find(|(tool, _)| *tool == call.tool)
                else {
                    continue;
                };
                let input = InputView::new(&call.input);
                let mut prejudged = Prejudged::default();
                for matcher in matchers {
                    prejudged.judge(matcher, &input);
                }
                call.prejudged = prejudged;
            }
            batch
        })
        .await
        .map_err(|e| Error::Internal(format!("judging matchers ahead failed: {e}")))
    }

    /// The field matchers that may decide a call of `agent` calling `tool`: the rules' for the
    /// tool, the agent's grants' for it (only `session`'s among session grants, when given),
    /// and `extra` (a grant about to be created).
    async fn matchers_for(
        &self,
        rules: &[Rule],
        agent: &AgentId,
        session: Option<&SessionId>,
        tool: &ToolName,
        extra: Option<&Matcher>,
    ) -> Result<Vec<Matcher>> {
        /// Grants of one agent for one tool judged ahead, at most.
        const GRANTS_PER_TOOL: u32 = 1000;
        let mut matchers: Vec<Matcher> = rules
            .iter()
            .filter(|r| r.tool.matches(tool.as_str()))
            .map(|r| r.matcher.clone())
            .collect();
        let grants = self
            .store
            .list_grants(&GrantQuery {
                agent: Some(agent.clone()),
                tool: Some(tool.clone()),
                limit: GRANTS_PER_TOOL,
                ..GrantQuery::default()
            })
            .await?;
        matchers.extend(
            grants
                .grants
                .into_iter()
                .filter(|g| match (&g.spec.scope, session) {
                    (GrantScope::Session(of), Some(session)) => of == session,
                    _ => true,
                })
                .map(|g| g.spec.matcher),
        );
        matchers.extend(extra.cloned());
        matchers.retain(|m| matches!(m, Matcher::Fields(_)));
        matchers.dedup();
        Ok(matchers)
    }

    /// For a decision remembered with a field matcher: judges, as [`Broker::prejudge`] does for
    /// a submit, the matchers that may decide the pending calls its grant covers (the grant's
    /// own, the rules', the agent's other grants') against their large inputs, off the store's
    /// writer. An approver's matcher then costs the writer lookups, however many calls it
    /// covers. At most [`PREJUDGED_PENDING`] pending calls; any others are judged in the
    /// transaction.
    async fn prejudge_covered(
        &self,
        key: &CallKey,
        decision: &Decision,
    ) -> Result<Option<HashMap<CallKey, Prejudged>>> {
        let Some(Remember {
            scope,
            matcher: Some(matcher @ Matcher::Fields(_)),
            ..
        }) = &decision.remember
        else {
            return Ok(None);
        };
        let Some(Some(call)) = self
            .store
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await?
            .pop()
        else {
            return Ok(None);
        };
        let mut query = CallQuery {
            agent: Some(key.agent.clone()),
            tool: Some(call.tool.as_str().to_owned()),
            statuses: vec![Status::Pending],
            limit: PREJUDGED_PENDING,
            ..CallQuery::default()
        };
        match scope {
            Scope::Session => query.session = Some(key.session.as_str().to_owned()),
            Scope::Workspace => query.workspace = Some(call.workspace.clone()),
            Scope::Always | Scope::Once => {}
        }
        let pending: Vec<Call> = self
            .store
            .list_calls(&query)
            .await?
            .calls
            .into_iter()
            .filter(|c| c.input.as_str().len() >= PREJUDGE_FROM_BYTES)
            .collect();
        if pending.is_empty() {
            return Ok(None);
        }
        let rules = self.store.list_rules().await?;
        let matchers = self
            .matchers_for(&rules, &key.agent, None, &call.tool, Some(matcher))
            .await?;
        let prejudged = tokio::task::spawn_blocking(move || {
            pending
                .into_iter()
                .map(|call| {
                    let input = InputView::new(&call.input);
                    let mut prejudged = Prejudged::default();
                    for matcher in &matchers {
                        prejudged.judge(matcher, &input);
                    }
                    drop(input);
                    (call.key, prejudged)
                })
                .collect()
        })
        .await
        .map_err(|e| Error::Internal(format!("judging matchers ahead failed: {e}")))?;
        Ok(Some(prejudged))
    }

    #[tracing::instrument(name = "decide", skip_all, fields(
        agent = %key.agent,
        session = %key.session,
        call = %key.call_id,
        approver = %decision.approver,
    ))]
    pub async fn decide(&self, key: &CallKey, decision: &Decision) -> Result<DecideReport> {
        let report = match self.prejudge_covered(key, decision).await? {
            Some(prejudged) => {
                let decision = Decision {
                    prejudged,
                    ..decision.clone()
                };
                self.store.decide(key, &decision).await?
            }
            None => self.store.decide(key, decision).await?,
        };
        if !report.replayed {
            self.bus.notify_committed();
            meters::outcomes(
                std::iter::once(&report.call)
                    .chain(&report.skipped)
                    .chain(&report.decided_by_grant),
            );
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
        let report = self.store.cancel(target).await?;
        if !report.cancelled.is_empty() {
            self.bus.notify_committed();
            meters::outcomes(&report.cancelled);
        }
        tracing::debug!(
            cancelled = report.cancelled.len(),
            already_decided = report.already_decided.len(),
            "cancelled"
        );
        Ok(report)
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
        let store = crate::store::open(&database, ToolResultTexts::default())
            .await
            .unwrap();
        let bus = EventBus::new(Arc::clone(&store), 16).await.unwrap();
        let sweeper = DeadlineSweeper::new(Arc::clone(&store), Arc::clone(&bus));
        let limits = Limits {
            max_input_bytes: 1024,
            default_deadline: None,
            subscriber_buffer: 4,
            max_agent_streams: 4,
            max_subscribers: 4,
            max_reply_bytes: 64 * 1024,
            max_pending_per_agent: 4,
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
