//! Explain, for every backend: reads what a submit reads (every rule, and the live grants of the
//! call's agent and tool), through the same primitives, and asks the same pure function,
//! [`evaluate_gated`] with the call's [`Gate`], so its answer is what a submit of the call would get now; and what the shadow
//! rules would do, by [`shadow_verdicts`], as a submit records it.

use super::routing::requirement_of;
use super::tx::{PolicyTx, WriteTx};
use crate::domain::policy::{
    ActionView, Approval, Decider, Gate, Ruling, Subject, evaluate_gated, shadow_verdicts,
};
use crate::domain::policy::{ExplainTarget, Explanation};
use crate::domain::{Action, Call, Timestamp};
use crate::error::Result;

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
    // A call described inline with its host is read as a stored one would be.
    let inline_action = match target {
        ExplainTarget::Inline {
            host: Some(host),
            tool,
            input,
            workspace,
            ..
        } => Some(Action::of(*host, tool, input, workspace)),
        _ => None,
    };
    let subject = match (target, &stored) {
        (
            ExplainTarget::Inline {
                agent,
                session,
                workspace,
                tool,
                input,
                ..
            },
            _,
        ) => {
            let mut subject = Subject::new(agent, session, workspace, tool, input);
            subject.action = inline_action.as_ref().map(ActionView::new);
            subject
        }
        (ExplainTarget::Stored(_), Some(call)) => Subject::of_call(call),
        (ExplainTarget::Stored(key), None) => {
            return Err(key.not_found());
        }
    };
    let rules = tx.rules().await?;
    let grants = tx
        .live_grants(subject.agent, Some(subject.session), &[subject.tool], now)
        .await?;
    // Grants are judged by the gate, as at submit: a stored call's own requirement, or (for a
    // call described inline) anyone alone, since Explain does not know `--default-approvers`.
    let requirement = stored
        .as_ref()
        .and_then(|call| call.approval.as_ref().map(|a| &a.requirement));
    let gate = match &stored {
        Some(call) => Gate::with(call, requirement),
        None => Gate::new("(described)", subject.agent, "", None),
    };
    let ruling = evaluate_gated(&subject, &rules, &grants, now, |grant| {
        gate.admits_grant(&grant.spec).is_ok()
    });
    // Grants that cover the call but that the gate keeps from deciding it, and why.
    let kept_out: Vec<String> = grants
        .iter()
        .filter(|g| g.is_live(now) && g.covers(&subject))
        .filter_map(|g| {
            gate.admits_grant(&g.spec)
                .err()
                .map(|why| format!("grant {} covers it but may not decide it: {why}", g.id))
        })
        .collect();
    let shadow = shadow_verdicts(&subject, &rules, &grants, now);
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
    // Who may decide: a stored call's requirement as fixed at submit (with its votes), or what
    // the ask rule would fix on a call submitted now.
    let approval = match &stored {
        Some(call) => call.approval.clone(),
        None => requirement_of(&ruling, None).map(|requirement| Approval {
            requirement,
            votes: Vec::new(),
        }),
    };
    let mut reason = ruling.explain();
    // Which host's call the rule or grant of an action kind matched, and as what.
    let by_kind = (rule.as_ref().and_then(|r| r.kind)).or(grant.as_ref().and_then(|g| g.spec.kind));
    let host_call = match (target, &stored) {
        (ExplainTarget::Inline { host, tool, .. }, _) => {
            host.zip(inline_action.as_ref()).map(|(h, a)| (h, tool, a))
        }
        (ExplainTarget::Stored(_), Some(call)) => call
            .host
            .zip(call.action.as_ref())
            .map(|(h, a)| (h, &call.tool, a)),
        (ExplainTarget::Stored(_), None) => None,
    };
    if by_kind.is_some()
        && let Some((host, tool, action)) = host_call
    {
        reason.push_str(&format!(
            "; the call is {host}'s `{tool}`, read as the {} action {}",
            action.kind,
            action.fields.as_str()
        ));
    }
    if ruling.rule().is_none() {
        for note in &kept_out {
            reason.push_str("; ");
            reason.push_str(note);
        }
    }
    if effect.is_none()
        && let Some(approval) = &approval
    {
        reason.push_str(&format!(
            "; who may decide: {} ({}, {} so far)",
            approval.requirement.approvers,
            approval.requirement.name(),
            approval.progress()
        ));
    }
    Ok(Explanation {
        approval,
        effect,
        decided_by,
        rule,
        grant,
        reason,
        call: stored,
        shadow,
        // Read beside the transaction by the broker, which knows whether the call is stored.
        recorded_shadow: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::Effect;
    use crate::domain::{AgentId, SessionId, ToolInput, ToolName};
    use crate::operations::testing::{Db, key, rule};

    fn inline(tool: &str) -> ExplainTarget {
        ExplainTarget::Inline {
            agent: AgentId::from_stored("agent".into()),
            session: SessionId::from_stored("s".into()),
            workspace: String::new(),
            tool: ToolName::from_stored(tool.into()),
            input: ToolInput::from_stored("{}".into()),
            host: None,
        }
    }

    #[tokio::test]
    async fn with_no_rule_and_no_grant_a_human_decides() {
        let db = Db::new().await;
        let explanation = explain(db.tx().await, &inline("t")).await.unwrap();
        assert_eq!(explanation.effect, None);
        assert!(explanation.rule.is_none() && explanation.grant.is_none());
    }

    #[tokio::test]
    async fn a_matching_rule_is_named_with_its_effect() {
        let db = Db::new().await;
        let mut tx = db.tx().await;
        tx.insert_rule(&rule("allow-ls", "ls", "allow"))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let explanation = explain(db.tx().await, &inline("ls")).await.unwrap();
        assert_eq!(explanation.effect, Some(Effect::Allow));
        assert_eq!(explanation.rule.unwrap().id.to_string(), "allow-ls");
        let other = explain(db.tx().await, &inline("rm")).await.unwrap();
        assert_eq!(other.effect, None);
    }

    #[tokio::test]
    async fn an_unknown_stored_call_is_not_found() {
        let db = Db::new().await;
        let target = ExplainTarget::Stored(key("s", "nope"));
        let err = explain(db.tx().await, &target).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}
