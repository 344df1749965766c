//! Escalate: the steps of a pending call's escalation ladder. When a submit leaves a call to a
//! human, its ladder (the ask rule's, or the default) is stored with it and the first step's due
//! time beside it ([`start_escalations`], in the submit's transaction). When a step falls due,
//! one transaction fires it: moves the call to its next step and appends the step's event
//! (Reminded or Escalated) to the log ([`escalate_due`]), a chunk per transaction as expiry
//! does. The move is conditional on the call still pending with that step next, so a step fires
//! once, whichever replica (or restart) gets there first, and a decided call fires no more.

use std::collections::BTreeMap;
use std::time::Instant;

use super::tx::{PolicyTx, Resolved, Transactions, WriteTx, batches_of};
use crate::domain::escalation::{Escalation, Ladder};
use crate::domain::policy::{Prejudged, Rule, Ruling, Subject, evaluate};
use crate::domain::{Call, EventKind, NewBatch, Timestamp};
use crate::error::Result;
use crate::observe::meters;

/// Starts the escalation of each call this submit stored and left pending: the ladder of the
/// ask rule that sent it to a human if that rule has one, else the batch's default ladder.
/// Returns the escalations started, by row id. `resolved`: what the submit decided.
pub(super) async fn start_escalations(
    tx: &mut (impl WriteTx + PolicyTx),
    batch: &NewBatch,
    accepted: &[(i64, &Call)],
    rules: &[Rule],
    prejudged: &BTreeMap<i64, &Prejudged>,
    resolved: &[Resolved],
) -> Result<Vec<(i64, Escalation)>> {
    let rule_ladders = rules.iter().any(|r| !r.escalation.is_empty());
    let mut started = Vec::new();
    if !rule_ladders && batch.default_escalation.is_none() {
        return Ok(started);
    }
    for &(rowid, call) in accepted {
        if resolved.iter().any(|r| r.rowid == rowid) {
            continue;
        }
        let ladder = rule_ladders
            .then(|| ask_rule_ladder(call, rules, prejudged.get(&rowid).copied()))
            .flatten()
            .or(batch.default_escalation.as_deref());
        let Some(ladder) = ladder.filter(|l| !l.is_empty()) else {
            continue;
        };
        let escalation = Escalation::start(ladder.clone(), call.created_at, call.deadline);
        tx.start_escalation(rowid, &escalation).await?;
        started.push((rowid, escalation));
    }
    Ok(started)
}

/// The ladder of the ask rule that leaves `call` to a human, if one does and has a ladder. The
/// call is pending, so no rule or grant decided it: the rules alone name the same ask rule.
fn ask_rule_ladder<'r>(
    call: &Call,
    rules: &'r [Rule],
    prejudged: Option<&Prejudged>,
) -> Option<&'r Ladder> {
    let subject = Subject::of_call(call).with_prejudged(prejudged);
    match evaluate(&subject, rules, &[], call.created_at) {
        Ruling::AskHuman { rule: Some(rule) } if !rule.escalation.is_empty() => {
            Some(&rule.escalation)
        }
        _ => None,
    }
}

/// Fires every step due at `now`, a chunk per transaction. Returns how many fired.
pub async fn escalate_due(store: &impl Transactions, now: Timestamp) -> Result<u64> {
    escalate_in_chunks(|| escalate_chunk(store, now)).await
}

/// Runs `chunk` (an [`escalate_chunk`]) until it reports the last one; returns how many fired.
pub async fn escalate_in_chunks<F, Fut>(mut chunk: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(u64, bool)>>,
{
    let mut fired = 0;
    loop {
        let (n, last) = chunk().await?;
        fired += n;
        if last {
            return Ok(fired);
        }
    }
}

/// Fires a chunk of the steps due at `now` in one transaction. Returns how many fired and
/// whether it was the last chunk.
pub async fn escalate_chunk(store: &impl Transactions, now: Timestamp) -> Result<(u64, bool)> {
    const CHUNK: i64 = 256;
    let started = Instant::now();
    let mut tx = store.begin_write().await?;
    let (fired, seen) = fire_some(&mut tx, now, CHUNK).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok((fired, (seen as i64) < CHUNK))
}

/// Fires the next step of up to `limit` calls with a step due. Returns how many fired and how
/// many calls were due.
async fn fire_some(tx: &mut impl WriteTx, now: Timestamp, limit: i64) -> Result<(u64, usize)> {
    let due = tx.due_steps(now, limit).await?;
    // The lock order every writer keeps (see `tx`): batches before calls, so a step firing
    // never waits in a cycle with a decision of the same calls.
    tx.lock_batches(&batches_of(due.iter().map(|s| &s.call)))
        .await?;
    let mut fired = 0;
    for stored in &due {
        let call = &stored.call;
        let Some(escalation) = &call.escalation else {
            continue;
        };
        let Some(step) = escalation.next_step() else {
            continue;
        };
        let next_at =
            escalation
                .ladder
                .due_at(escalation.fired + 1, call.created_at, call.deadline);
        let kind = EventKind::of_step(step.kind);
        if tx
            .fire_step(stored.rowid, escalation.fired, kind, next_at, now)
            .await?
        {
            fired += 1;
        }
    }
    Ok((fired, due.len()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::escalation::StepKind;
    use crate::domain::{OutcomeKind, Verdict};
    use crate::operations::decide::decide;
    use crate::operations::policy_admin::create_rule;
    use crate::operations::submit::submit_in;
    use crate::operations::testing::{Db, batch, call, decision, key, rule, texts};
    use crate::store::EventLog as _;

    fn ladder(text: &str) -> Ladder {
        Ladder::from_json("escalation", &serde_json::from_str(text).unwrap()).unwrap()
    }

    fn at(t0: Timestamp, secs: u64) -> Timestamp {
        t0.saturating_add(std::time::Duration::from_secs(secs))
    }

    /// Submits `calls` with `default` as the default ladder at `now`, and commits.
    async fn submit_at(
        db: &Db,
        calls: Vec<crate::domain::NewCall>,
        default: Option<Ladder>,
        now: Timestamp,
    ) {
        let mut b = batch("s", calls);
        b.default_escalation = default.map(Arc::new);
        let mut tx = db.tx().await;
        submit_in(&mut tx, &b, &texts(), now).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// The step events in the log: (kind, call id, step).
    async fn step_events(db: &Db) -> Vec<(EventKind, String, u32)> {
        db.store()
            .events_after(0, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| {
                let step = e.step?;
                Some((e.kind, e.call.key.call_id.to_string(), step))
            })
            .collect()
    }

    #[tokio::test]
    async fn each_step_fires_once_when_due_in_order_and_the_last_leaves_nothing_due() {
        let db = Db::new().await;
        let t0 = Timestamp::now();
        let default = ladder(
            r#"[{"after": "10s", "endpoints": ["team"]},
                {"after": "20s", "kind": "escalation", "endpoints": ["oncall"]}]"#,
        );
        submit_at(&db, vec![call("a", "t", "{}")], Some(default), t0).await;

        assert_eq!(escalate_due(db.writer(), at(t0, 9)).await.unwrap(), 0);
        assert_eq!(escalate_due(db.writer(), at(t0, 10)).await.unwrap(), 1);
        // Due again at the same instant: already fired.
        assert_eq!(escalate_due(db.writer(), at(t0, 15)).await.unwrap(), 0);
        assert_eq!(escalate_due(db.writer(), at(t0, 25)).await.unwrap(), 1);
        assert_eq!(escalate_due(db.writer(), at(t0, 3600)).await.unwrap(), 0);
        assert_eq!(
            step_events(&db).await,
            vec![
                (EventKind::Reminded, "a".into(), 0),
                (EventKind::Escalated, "a".into(), 1)
            ]
        );
        let events = db.store().events_after(0, 1000).await.unwrap();
        let escalated = events.last().unwrap();
        assert_eq!(escalated.fired_step().unwrap().kind, StepKind::Escalation);
        assert_eq!(escalated.step_endpoints()[0].as_str(), "oncall");
        let mut tx = db.tx().await;
        let stored = tx.find_call(&key("s", "a")).await.unwrap().unwrap().call;
        let escalation = stored.escalation.unwrap();
        assert_eq!((escalation.fired, escalation.next_at), (2, None));
    }

    #[tokio::test]
    async fn steps_overdue_at_once_each_fire_once_in_order() {
        // A broker down past both steps: each fires on the sweeps after start, once.
        let db = Db::new().await;
        let t0 = Timestamp::now();
        let default = ladder(r#"[{"after": "1s"}, {"after": "2s", "kind": "escalation"}]"#);
        submit_at(&db, vec![call("a", "t", "{}")], Some(default), t0).await;
        let late = at(t0, 60);
        let mut total = 0;
        for _ in 0..4 {
            total += escalate_due(db.writer(), late).await.unwrap();
        }
        assert_eq!(total, 2);
        let kinds: Vec<u32> = step_events(&db).await.iter().map(|e| e.2).collect();
        assert_eq!(kinds, vec![0, 1]);
    }

    #[tokio::test]
    async fn a_decided_call_fires_no_more_steps() {
        let db = Db::new().await;
        let t0 = Timestamp::now();
        let default = ladder(r#"[{"after": "1s"}, {"after": "2s"}]"#);
        submit_at(&db, vec![call("a", "t", "{}")], Some(default), t0).await;
        assert_eq!(escalate_due(db.writer(), at(t0, 1)).await.unwrap(), 1);
        let report = decide(
            db.tx().await,
            &key("s", "a"),
            &decision(Verdict::Deny, "no"),
            &texts(),
        )
        .await
        .unwrap();
        assert_eq!(
            report.call.outcome.as_ref().map(|o| o.kind),
            Some(OutcomeKind::Denied)
        );
        assert_eq!(escalate_due(db.writer(), at(t0, 60)).await.unwrap(), 0);
        assert_eq!(step_events(&db).await.len(), 1);
    }

    #[tokio::test]
    async fn steps_at_or_after_the_deadline_never_fire_the_call_expires_instead() {
        let db = Db::new().await;
        let t0 = Timestamp::now();
        let default = ladder(r#"[{"after": "1s"}, {"after": "5s"}]"#);
        let mut c = call("a", "t", "{}");
        c.deadline = Some(at(t0, 5));
        submit_at(&db, vec![c], Some(default), t0).await;
        assert_eq!(escalate_due(db.writer(), at(t0, 60)).await.unwrap(), 1);
        assert_eq!(escalate_due(db.writer(), at(t0, 60)).await.unwrap(), 0);
        let expired = crate::operations::expire::expire_due(db.writer(), &texts(), at(t0, 60))
            .await
            .unwrap();
        assert_eq!(
            expired[0].outcome.as_ref().unwrap().kind,
            OutcomeKind::Expired
        );
    }

    #[tokio::test]
    async fn an_ask_rules_ladder_wins_over_the_default_and_decided_calls_get_none() {
        let db = Db::new().await;
        let mut ask = rule("ask-shell", "shell", "ask");
        ask.escalation = ladder(r#"[{"after": "1s", "kind": "escalation", "endpoints": ["x"]}]"#);
        create_rule(db.tx().await, &ask).await.unwrap();
        create_rule(db.tx().await, &rule("allow-read", "read", "allow"))
            .await
            .unwrap();
        let t0 = Timestamp::now();
        let default = ladder(r#"[{"after": "1s", "endpoints": ["d"]}]"#);
        submit_at(
            &db,
            vec![
                call("by-rule", "shell", "{}"),
                call("by-default", "edit", "{}"),
                call("allowed", "read", "{}"),
            ],
            Some(default),
            t0,
        )
        .await;
        let mut tx = db.tx().await;
        let ladder_of = |c: Call| {
            c.escalation
                .map(|e| e.ladder.steps()[0].endpoints[0].clone())
        };
        let by_rule = tx.find_call(&key("s", "by-rule")).await.unwrap().unwrap();
        assert_eq!(ladder_of(by_rule.call).unwrap().as_str(), "x");
        let by_default = tx
            .find_call(&key("s", "by-default"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ladder_of(by_default.call).unwrap().as_str(), "d");
        let allowed = tx.find_call(&key("s", "allowed")).await.unwrap().unwrap();
        assert!(allowed.call.escalation.is_none());
        drop(tx);
        assert_eq!(escalate_due(db.writer(), at(t0, 2)).await.unwrap(), 2);
        let mut events = step_events(&db).await;
        events.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            events,
            vec![
                (EventKind::Reminded, "by-default".into(), 0),
                (EventKind::Escalated, "by-rule".into(), 0)
            ]
        );
    }

    #[tokio::test]
    async fn without_any_ladder_no_call_escalates() {
        let db = Db::new().await;
        let t0 = Timestamp::now();
        submit_at(&db, vec![call("a", "t", "{}")], None, t0).await;
        assert_eq!(escalate_due(db.writer(), at(t0, 3600)).await.unwrap(), 0);
        let mut tx = db.tx().await;
        let stored = tx.find_call(&key("s", "a")).await.unwrap().unwrap();
        assert!(stored.call.escalation.is_none());
    }
}
