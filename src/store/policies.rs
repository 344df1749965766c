//! Rules and grants: their administration and Explain, written once for both backends over
//! their transactions ([`Transact`]). Each change is an operation of `operations::policy_admin`
//! in a transaction of its own (on SQLite, alone on the one writer, between groups of writes);
//! Explain reads in a snapshot that sees what a submit beginning now would
//! ([`Transact::snapshot`]). The reads are the shared ones (`store::reads`).

use async_trait::async_trait;

use super::Policies;
use super::primitives::Transact;
use crate::domain::policy::{
    ExplainTarget, Explanation, RevokeReport, RevokeTarget, Rule, RuleId, RuleMode,
};
use crate::error::Result;
use crate::operations::{explain, policy_admin};

#[async_trait]
impl<S: Transact> Policies for S {
    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport> {
        let (target, by) = (target.clone(), by.to_owned());
        self.transaction(
            move |tx| async move { policy_admin::revoke_grants(tx, &target, &by).await },
        )
        .await
    }

    async fn create_rule(&self, rule: &Rule) -> Result<Rule> {
        let rule = rule.clone();
        self.transaction(move |tx| async move { policy_admin::create_rule(tx, &rule).await })
            .await
    }

    async fn delete_rule(&self, id: &RuleId) -> Result<Rule> {
        let id = id.clone();
        self.transaction(move |tx| async move { policy_admin::delete_rule(tx, &id).await })
            .await
    }

    async fn set_rule_mode(&self, id: &RuleId, mode: RuleMode) -> Result<Rule> {
        let id = id.clone();
        self.transaction(move |tx| async move { policy_admin::set_rule_mode(tx, &id, mode).await })
            .await
    }

    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()> {
        let rules = rules.to_vec();
        self.transaction(move |tx| async move { policy_admin::load_file_rules(tx, &rules).await })
            .await
    }

    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation> {
        let target = target.clone();
        self.snapshot(move |tx| async move { explain::explain(tx, &target).await })
            .await
    }
}
