//! Judging ahead: the field matchers of rules and grants (globs, JSON paths) that may decide a
//! call are matched against large inputs on a blocking thread before the write is queued, so the
//! store's one writer only looks the results up ([`Prejudged`]) and never holds every other
//! write while a glob runs over a megabyte. Best effort: what it did not judge, the transaction
//! judges itself.

use std::collections::HashMap;

use super::Broker;
use crate::domain::policy::{GrantScope, InputView, Matcher, Prejudged, Remember, Rule, Scope};
use crate::domain::{
    AgentId, Call, CallKey, CallQuery, Decision, GrantQuery, NewBatch, NewCall, SessionId, Status,
    ToolName,
};
use crate::error::{Error, Result};

/// Inputs at least this large have their rules' and grants' matchers judged before the submit
/// is queued, off the store's writer (see `Broker::prejudge`).
pub const PREJUDGE_FROM_BYTES: usize = 16 * 1024;

/// Pending calls a remembered decision's grant covers that are judged ahead, at most.
const PREJUDGED_PENDING: u32 = 1000;

impl Broker {
    /// Judges the field matchers of the rules and grants that may decide `batch`'s calls against
    /// their inputs, on a blocking thread: neither the store's writer (whose transaction then
    /// only looks the results up, see [`Prejudged`]) nor the runtime's workers wait for it.
    /// Best effort: a matcher it did not read (created since, or past the first page of an
    /// agent's grants for a tool) is judged in the transaction. Only inputs of at least
    /// [`PREJUDGE_FROM_BYTES`] are judged ahead: matching a small input costs the writer less
    /// than reading the rules and grants twice would cost every submit.
    pub(super) async fn prejudge(&self, mut batch: NewBatch) -> Result<NewBatch> {
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
    pub(super) async fn prejudge_covered(
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
}
