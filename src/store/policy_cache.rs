//! The rules and grants a submit judges by, kept in memory between transactions, so a submit
//! need not read every rule and its agent's grants from storage (issue 19).
//!
//! What keeps the copy honest is the policy version: a counter in the database (`policy_version`,
//! migrations sqlite 0013 and postgres 0010) that triggers move in every transaction that changes
//! rules or grants, whoever makes it, on any replica. A transaction (each write of a group that
//! shares one) reads the version once, at its first policy read (every operation reads policy
//! after taking its policy locks; a Postgres submit reads it in the statement that takes them,
//! `lock_submit`, migrations 0012 and 0014), and uses a copy only if it was read at that same version;
//! otherwise it reads the tables and keeps what it read under the version. So a change
//! committed anywhere applies to the next submit everywhere, at the price of one one-row read
//! per transaction (SQLite: in process, on the writer's connection; a Postgres submit: no round
//! trip of its own).
//!
//! Two things the version cannot say are handled here: a transaction that changes rules or grants
//! itself sees its own uncommitted change, so from then on it reads the tables and keeps nothing
//! (its change might roll back); and grants expire without any change, so expiry is checked at
//! each use, against the caller's `now`.
//!
//! This must never serve a copy read at another version than the one the transaction read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::domain::policy::{Grant, Rule};
use crate::domain::{AgentId, SessionId, Timestamp, ToolName};

/// How many (agent, session) grant sets are kept at most; past it, the grant sets start over
/// (each is read again at its next submit). Bounds memory with many short sessions.
const MAX_GRANT_SETS: usize = 4_096;

/// One process's copy of the rules and grants, shared by all its transactions.
#[derive(Default)]
pub struct PolicyCache {
    kept: Mutex<Kept>,
}

/// Everything kept, all read at `version`.
#[derive(Default)]
struct Kept {
    version: i64,
    rules: Option<Vec<Rule>>,
    grants: HashMap<(AgentId, Option<SessionId>), GrantSet>,
}

/// An agent's grants (for one session, or for every session), unrevoked and unexpired when read.
struct GrantSet {
    read_at: Timestamp,
    grants: Vec<Grant>,
}

impl Kept {
    /// Whether what is kept was read at `version`, after dropping it if `version` is newer.
    /// Older versions (a transaction that read the counter before another's commit) neither use
    /// nor replace a newer copy.
    fn at(&mut self, version: i64) -> bool {
        if version > self.version {
            *self = Kept {
                version,
                ..Kept::default()
            };
        }
        version == self.version
    }
}

impl PolicyCache {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every rule, if they were read at `version`.
    pub fn rules(&self, version: i64) -> Option<Vec<Rule>> {
        let mut kept = self.kept();
        if !kept.at(version) {
            return None;
        }
        kept.rules.clone()
    }

    /// Keeps every rule, as read at `version`.
    pub fn keep_rules(&self, version: i64, rules: &[Rule]) {
        let mut kept = self.kept();
        if kept.at(version) {
            kept.rules = Some(rules.to_vec());
        }
    }

    /// The grants of `agent` (`session`'s and those of no session; every session's without one)
    /// for `tools`, live at `now`, if they were read at `version` no later than `now`.
    pub fn grants(
        &self,
        version: i64,
        agent: &AgentId,
        session: Option<&SessionId>,
        tools: &[&ToolName],
        now: Timestamp,
    ) -> Option<Vec<Grant>> {
        let mut kept = self.kept();
        if !kept.at(version) {
            return None;
        }
        let set = kept.grants.get(&(agent.clone(), session.cloned()))?;
        // A set read after `now` may lack a grant that expired in between but was live at `now`.
        if set.read_at > now {
            return None;
        }
        Some(of_tools(&set.grants, tools, now))
    }

    /// Keeps the grants of `agent` (as [`Self::grants`] names them), read at `version` and
    /// live at `now`.
    pub fn keep_grants(
        &self,
        version: i64,
        agent: &AgentId,
        session: Option<&SessionId>,
        now: Timestamp,
        grants: &[Grant],
    ) {
        let mut kept = self.kept();
        if !kept.at(version) {
            return;
        }
        if kept.grants.len() >= MAX_GRANT_SETS {
            kept.grants.clear();
        }
        kept.grants.insert(
            (agent.clone(), session.cloned()),
            GrantSet {
                read_at: now,
                grants: grants.to_vec(),
            },
        );
    }
}

/// The grants among `grants` for one of `tools` that are live at `now`, in their order: what
/// the statement `live_grants` selects, applied in memory.
pub fn of_tools(grants: &[Grant], tools: &[&ToolName], now: Timestamp) -> Vec<Grant> {
    grants
        .iter()
        // A grant of an action kind may cover a call of any tool.
        .filter(|g| g.is_live(now) && (g.spec.kind.is_some() || tools.contains(&&g.spec.tool)))
        .cloned()
        .collect()
}

/// What one transaction knows of the policy version: the process's copy, and whether (and at
/// which version) this transaction may use it.
pub struct PolicyView {
    cache: Arc<PolicyCache>,
    seen: Seen,
}

#[derive(Clone, Copy)]
enum Seen {
    /// Not read yet: the first policy read of the transaction reads it.
    Unread,
    Version(i64),
    /// This transaction changed rules or grants: it reads the tables from now on.
    Changed,
}

impl PolicyView {
    /// A view for a new transaction.
    pub fn new(cache: &Arc<PolicyCache>) -> Self {
        Self {
            cache: Arc::clone(cache),
            seen: Seen::Unread,
        }
    }

    /// The copy, and the version this transaction reads it at (`None` until read); `None` if
    /// this transaction may not use the copy.
    pub fn usable(&self) -> Option<(Arc<PolicyCache>, Option<i64>)> {
        match self.seen {
            Seen::Unread => Some((Arc::clone(&self.cache), None)),
            Seen::Version(version) => Some((Arc::clone(&self.cache), Some(version))),
            Seen::Changed => None,
        }
    }

    /// Records the version this transaction read.
    pub fn read(&mut self, version: i64) {
        if let Seen::Unread = self.seen {
            self.seen = Seen::Version(version);
        }
    }

    /// Starts the next write of a group sharing this transaction: it reads the version again
    /// (a version it read for an earlier write may be old by now), unless the transaction
    /// changed rules or grants itself, which it still must not take from the copy.
    pub fn next_write(&mut self) {
        if let Seen::Version(_) = self.seen {
            self.seen = Seen::Unread;
        }
    }

    /// Records that this transaction is changing rules or grants.
    pub fn changed(&mut self) {
        self.seen = Seen::Changed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::RuleId;

    fn rule(id: &str) -> Rule {
        let json = serde_json::json!({"id": id, "tool": "t", "effect": "allow"});
        Rule::from_json(&json, 1 << 20, Timestamp::now()).expect("a valid rule")
    }

    fn ids(rules: Option<Vec<Rule>>) -> Option<Vec<RuleId>> {
        rules.map(|rules| rules.into_iter().map(|r| r.id).collect())
    }

    #[test]
    fn rules_are_served_only_at_the_version_they_were_read_at() {
        let cache = PolicyCache::default();
        assert!(cache.rules(2).is_none(), "nothing kept yet");
        cache.keep_rules(2, &[rule("a")]);
        assert_eq!(ids(cache.rules(2)), ids(Some(vec![rule("a")])));
        assert!(cache.rules(3).is_none(), "a newer version drops the copy");
        cache.keep_rules(2, &[rule("old")]);
        assert!(
            cache.rules(3).is_none(),
            "an older read does not replace a newer version"
        );
        assert!(cache.rules(2).is_none(), "nor is an older version served");
    }

    /// A group's later write reads the version again (another replica may have changed policy
    /// since the group's first write read it), but a transaction that changed policy itself
    /// never goes back to the copy.
    #[test]
    fn each_write_of_a_group_reads_the_version_again_unless_the_group_changed_policy() {
        let cache = Arc::new(PolicyCache::default());
        let mut view = PolicyView::new(&cache);
        view.read(4);
        assert!(matches!(view.usable(), Some((_, Some(4)))));
        view.next_write();
        assert!(
            matches!(view.usable(), Some((_, None))),
            "the next write reads the version again"
        );
        view.read(5);
        assert!(matches!(view.usable(), Some((_, Some(5)))));
        view.changed();
        view.next_write();
        assert!(
            view.usable().is_none(),
            "a changed transaction keeps off the copy"
        );
    }
}
