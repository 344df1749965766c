//! Policy administration: revoking grants, and creating, deleting, loading rules and setting
//! their mode. Each is
//! one transaction; revoking takes the exclusive policy lock, so a submit reading the grants
//! finishes first and every later one sees them revoked.

use super::tx::{PolicyTx, WriteTx, tools_of};
use crate::domain::Timestamp;
use crate::domain::policy::{RevokeReport, RevokeTarget, Rule, RuleId, RuleMode, RuleSource};
use crate::error::{Error, Result};

/// Revokes what `target` names and commits.
pub async fn revoke_grants(
    mut tx: impl WriteTx + PolicyTx,
    target: &RevokeTarget,
    by: &str,
) -> Result<RevokeReport> {
    let now = Timestamp::now();
    let named = tx.grants_named(target, now).await?;
    if let RevokeTarget::Id(id) = target
        && named.is_empty()
    {
        return Err(Error::NotFound(format!("no grant with id {id}")));
    }
    let report = match named.first() {
        None => RevokeReport::default(),
        Some(first) => {
            // A submit reading these grants finishes first; every later one sees them revoked.
            let agent = first.spec.agent.clone();
            let host_calls = named.iter().any(|g| g.spec.kind.is_some());
            let tools = tools_of(
                (named.iter().map(|g| &g.spec.tool)).chain(host_calls.then(super::tx::host_calls)),
            );
            tx.lock_policy(&agent, &tools, true).await?;
            let ids: Vec<i64> = named.iter().map(|g| g.id).collect();
            let revoked = tx.revoke(&ids, by, now).await?;
            let count = revoked.len();
            let grants = match target {
                // The grant as it stands, revoked now or before.
                RevokeTarget::Id(_) if revoked.is_empty() => named,
                _ => revoked,
            };
            RevokeReport {
                revoked: count,
                grants,
            }
        }
    };
    tx.commit().await?;
    Ok(report)
}

/// Adds a rule and commits; the same rule again is answered with the stored one.
pub async fn create_rule(mut tx: impl WriteTx + PolicyTx, rule: &Rule) -> Result<Rule> {
    let stored = if tx.insert_rule(rule).await? {
        rule.clone()
    } else {
        match tx.find_rule(&rule.id).await? {
            Some(existing) if existing.same_terms_as(rule) => existing,
            Some(_) => {
                return Err(Error::AlreadyExists(format!(
                    "rule.id: a different rule `{}` exists; delete it first",
                    rule.id
                )));
            }
            None => return Err(Error::Internal("a conflicting rule vanished".into())),
        }
    };
    tx.commit().await?;
    Ok(stored)
}

/// Removes a rule and commits.
pub async fn delete_rule(mut tx: impl WriteTx + PolicyTx, id: &RuleId) -> Result<Rule> {
    let Some(rule) = tx.find_rule(id).await? else {
        return Err(Error::NotFound(format!("no rule `{id}`")));
    };
    tx.delete_rule(id).await?;
    tx.commit().await?;
    Ok(rule)
}

/// Sets a rule's mode and commits; returns the rule as it now stands.
pub async fn set_rule_mode(
    mut tx: impl WriteTx + PolicyTx,
    id: &RuleId,
    mode: RuleMode,
) -> Result<Rule> {
    if !tx.set_rule_mode(id, mode).await? {
        return Err(Error::NotFound(format!("no rule `{id}`")));
    }
    let rule = tx
        .find_rule(id)
        .await?
        .ok_or_else(|| Error::Internal("a rule vanished in its own transaction".into()))?;
    tx.commit().await?;
    Ok(rule)
}

/// Replaces the rules of the previous policy file with `rules` and commits.
pub async fn load_file_rules(mut tx: impl WriteTx + PolicyTx, rules: &[Rule]) -> Result<()> {
    tx.delete_file_rules().await?;
    for rule in rules {
        // A rule made through CreateRule with the same id gives way to the file's.
        tx.delete_rule(&rule.id).await?;
        let rule = Rule {
            source: RuleSource::File,
            ..rule.clone()
        };
        tx.insert_rule(&rule).await?;
    }
    tx.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::testing::{Db, rule};

    async fn rule_ids(db: &Db) -> Vec<String> {
        let mut tx = db.tx().await;
        tx.rules()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id.to_string())
            .collect()
    }

    #[tokio::test]
    async fn rules_kept_in_memory_follow_every_committed_change_and_no_rolled_back_one() {
        let db = Db::new().await;
        assert!(rule_ids(&db).await.is_empty(), "read, and kept");
        create_rule(db.tx().await, &rule("r", "t", "allow"))
            .await
            .unwrap();
        assert_eq!(rule_ids(&db).await, ["r"], "a committed change is seen");
        {
            let mut tx = db.tx().await;
            assert_eq!(tx.rules().await.unwrap().len(), 1);
            tx.insert_rule(&rule("uncommitted", "t", "deny"))
                .await
                .unwrap();
            let ids: Vec<String> = tx
                .rules()
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id.to_string())
                .collect();
            assert_eq!(ids.len(), 2, "a transaction sees its own change");
            // Dropped: rolled back.
        }
        assert_eq!(
            rule_ids(&db).await,
            ["r"],
            "a rolled-back change is not kept"
        );
        delete_rule(db.tx().await, &RuleId::from_stored("r".into()))
            .await
            .unwrap();
        assert!(rule_ids(&db).await.is_empty(), "a deletion is seen");
    }

    #[tokio::test]
    async fn the_same_rule_again_is_answered_with_the_stored_one_another_is_refused() {
        let db = Db::new().await;
        let stored = create_rule(db.tx().await, &rule("r", "t", "allow"))
            .await
            .unwrap();
        let again = create_rule(db.tx().await, &rule("r", "t", "allow"))
            .await
            .unwrap();
        assert_eq!(again, stored);
        let err = create_rule(db.tx().await, &rule("r", "t", "deny"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        assert!(err.to_string().contains("rule.id"), "{err}");
    }

    #[tokio::test]
    async fn a_rules_mode_is_stored_and_an_unknown_rule_is_not_found() {
        let db = Db::new().await;
        create_rule(db.tx().await, &rule("r", "t", "allow"))
            .await
            .unwrap();
        let id = rule("r", "t", "allow").id;
        let shadowed = set_rule_mode(db.tx().await, &id, RuleMode::Shadow)
            .await
            .unwrap();
        assert_eq!(shadowed.mode, RuleMode::Shadow);
        {
            let mut tx = db.tx().await;
            assert_eq!(
                tx.find_rule(&id).await.unwrap().unwrap().mode,
                RuleMode::Shadow
            );
        }
        let unknown = RuleId::parse("id", "nope").unwrap();
        let err = set_rule_mode(db.tx().await, &unknown, RuleMode::Enforce)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn deleting_returns_the_rule_and_an_unknown_one_is_not_found() {
        let db = Db::new().await;
        create_rule(db.tx().await, &rule("r", "t", "allow"))
            .await
            .unwrap();
        let deleted = delete_rule(db.tx().await, &rule("r", "t", "allow").id)
            .await
            .unwrap();
        assert_eq!(deleted.id.to_string(), "r");
        let err = delete_rule(db.tx().await, &deleted.id).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn a_policy_file_replaces_the_previous_files_rules_and_same_id_admin_rules() {
        let db = Db::new().await;
        create_rule(db.tx().await, &rule("shared", "t", "deny"))
            .await
            .unwrap();
        create_rule(db.tx().await, &rule("admin-only", "t", "ask"))
            .await
            .unwrap();
        load_file_rules(db.tx().await, &[rule("old", "t", "allow")])
            .await
            .unwrap();
        load_file_rules(db.tx().await, &[rule("shared", "t", "allow")])
            .await
            .unwrap();
        let mut tx = db.tx().await;
        let mut ids: Vec<(String, RuleSource)> = tx
            .rules()
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id.to_string(), r.source))
            .collect();
        ids.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            ids,
            [
                ("admin-only".to_owned(), RuleSource::Admin),
                ("shared".to_owned(), RuleSource::File),
            ]
        );
    }

    #[tokio::test]
    async fn revoking_an_unknown_grant_is_not_found_and_an_empty_scope_revokes_nothing() {
        let db = Db::new().await;
        let err = revoke_grants(db.tx().await, &RevokeTarget::Id(7), "admin")
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        let target = RevokeTarget::Workspace(
            crate::domain::AgentId::from_stored("agent".into()),
            "ws".into(),
        );
        let report = revoke_grants(db.tx().await, &target, "admin")
            .await
            .unwrap();
        assert_eq!(report.revoked, 0);
    }
}
