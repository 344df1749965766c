//! Explain, for every backend: reads what a submit reads (every rule, and the live grants of the
//! call's agent and tool), through the same primitives, and asks the same pure function,
//! [`evaluate`], so its answer is what a submit of the call would get now.

use super::writes::{PolicyTx, WriteTx};
use super::{ExplainTarget, Explanation};
use crate::domain::policy::{Decider, Ruling, Subject, evaluate};
use crate::domain::{Call, Timestamp};
use crate::error::{Error, Result};

/// Explains `target` inside `tx`, a read transaction (nothing is written, and it is dropped).
pub async fn explain(
    mut tx: impl WriteTx + PolicyTx,
    target: &ExplainTarget,
) -> Result<Explanation> {
    let now = Timestamp::now();
    let stored: Option<Call> = match target {
        ExplainTarget::Stored(key) => tx.find_call(key).await?.map(|stored| stored.call),
        ExplainTarget::Inline { .. } => None,
    };
    let subject = match (target, &stored) {
        (
            ExplainTarget::Inline {
                agent,
                session,
                workspace,
                tool,
                input,
            },
            _,
        ) => Subject::new(agent, session, workspace, tool, input),
        (ExplainTarget::Stored(_), Some(call)) => Subject::of_call(call),
        (ExplainTarget::Stored(key), None) => {
            return Err(Error::NotFound(format!(
                "no call `{}` in session `{}` of agent `{}`",
                key.call_id, key.session, key.agent
            )));
        }
    };
    let rules = tx.rules().await?;
    let grants = tx
        .live_grants(subject.agent, Some(subject.session), &[subject.tool], now)
        .await?;
    let ruling = evaluate(&subject, &rules, &grants, now);
    let (effect, decided_by, rule, grant) = match ruling {
        Ruling::Decided { effect, by } => {
            let decided_by = Some(by.decided_by());
            match by {
                Decider::Rule(rule) => (Some(effect), decided_by, Some(rule.clone()), None),
                Decider::Grant(grant) => (Some(effect), decided_by, None, Some(grant.clone())),
            }
        }
        Ruling::AskHuman { rule } => (None, None, rule.cloned(), None),
    };
    let reason = ruling.explain();
    Ok(Explanation {
        effect,
        decided_by,
        rule,
        grant,
        reason,
        call: stored,
    })
}
