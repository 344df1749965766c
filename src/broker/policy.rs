//! Grant and rule administration through the broker, and Explain. Each write is one
//! transaction of the store (`crate::operations::policy_admin`); Explain reads what a submit
//! would read now and asks the same pure function, so it cannot drift from behaviour.

use super::Broker;
use crate::domain::policy::{
    Approval, ExplainTarget, Explanation, Requirement, RevokeReport, RevokeTarget, Rule, RuleId,
    RuleMode,
};
use crate::error::Result;

impl Broker {
    /// Revokes what `target` names, recording `by` (the operator) as who revoked it.
    #[tracing::instrument(name = "revoke_grants", skip_all, fields(by = %by))]
    pub async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport> {
        let report = self.store.revoke_grants(target, by).await?;
        tracing::debug!(revoked = report.revoked, "revoked");
        Ok(report)
    }

    /// Adds a rule; the same rule again is answered with the stored one.
    #[tracing::instrument(name = "create_rule", skip_all, fields(rule = %rule.id))]
    pub async fn create_rule(&self, rule: &Rule) -> Result<Rule> {
        self.store.create_rule(rule).await
    }

    /// Removes a rule and returns it.
    #[tracing::instrument(name = "delete_rule", skip_all, fields(rule = %id))]
    pub async fn delete_rule(&self, id: &RuleId) -> Result<Rule> {
        self.store.delete_rule(id).await
    }

    /// Puts a rule in `mode` (enforce, shadow, disabled) and returns it.
    #[tracing::instrument(name = "set_rule_mode", skip_all, fields(rule = %id, mode = %mode))]
    pub async fn set_rule_mode(&self, id: &RuleId, mode: RuleMode) -> Result<Rule> {
        self.store.set_rule_mode(id, mode).await
    }

    /// What would decide `target` if it were submitted now; for a stored call, also what the
    /// shadow rules would have done with it at its submit.
    pub async fn explain(&self, target: &ExplainTarget) -> Result<Explanation> {
        let mut explanation = self.store.explain(target).await?;
        if let ExplainTarget::Stored(key) = target {
            explanation.recorded_shadow = self.store.shadow_verdicts(key).await?;
        }
        // The default applies to calls submitted from now on; a stored call keeps the
        // requirement (or none) fixed on it at submit.
        if let ExplainTarget::Inline { .. } = target
            && explanation.effect.is_none()
            && explanation.approval.is_none()
            && let Some(default) = &self.limits().default_approvers
        {
            let requirement = Requirement::default_of(default);
            explanation.reason.push_str(&format!(
                "; who may decide: {default} ({})",
                requirement.name()
            ));
            explanation.approval = Some(Approval {
                requirement,
                votes: Vec::new(),
            });
        }
        Ok(explanation)
    }
}
