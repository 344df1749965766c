//! Expire: calls whose deadline passed become EXPIRED (decided by the deadline, never recorded
//! as a denial), a chunk per transaction so other writes run between chunks; also those whose
//! deadline passed while the broker was down.

use std::time::Instant;

use super::tx::{Transactions, WriteTx, complete_batches};
use crate::domain::{Call, DecidedBy, OutcomeKind, Timestamp, ToolResultTexts};
use crate::error::Result;
use crate::observe::meters;

/// Expires every call due at `now`, a chunk per transaction. Returns them, decided.
pub async fn expire_due(
    store: &impl Transactions,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<Vec<Call>> {
    expire_in_chunks(|| expire_chunk(store, texts, now)).await
}

/// Runs `chunk` (an [`expire_chunk`]) until it reports the last one; returns every call expired.
pub async fn expire_in_chunks<F, Fut>(mut chunk: F) -> Result<Vec<Call>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<Call>, bool)>>,
{
    let mut expired = Vec::new();
    loop {
        let (calls, last) = chunk().await?;
        expired.extend(calls);
        if last {
            return Ok(expired);
        }
    }
}

/// Expires a chunk of the calls due at `now` in one transaction. Returns them, decided, and
/// whether it was the last chunk.
pub async fn expire_chunk(
    store: &impl Transactions,
    texts: &ToolResultTexts,
    now: Timestamp,
) -> Result<(Vec<Call>, bool)> {
    const CHUNK: i64 = 256;
    let started = Instant::now();
    let mut tx = store.begin_write().await?;
    let chunk = expire_some(&mut tx, texts, now, CHUNK).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    let last = (chunk.len() as i64) < CHUNK;
    Ok((chunk, last))
}

/// Expires up to `limit` due calls. Returns them, decided.
async fn expire_some(
    tx: &mut impl WriteTx,
    texts: &ToolResultTexts,
    now: Timestamp,
    limit: i64,
) -> Result<Vec<Call>> {
    let outcome = texts.outcome(OutcomeKind::Expired, DecidedBy::Deadline, "", now);
    let due = tx.due_calls(now, limit).await?;
    let mut batches: Vec<&str> = due.iter().map(|(_, batch)| batch.as_str()).collect();
    batches.sort_unstable();
    batches.dedup();
    tx.lock_batches(&batches).await?;
    let mut resolved = Vec::new();
    for (rowid, _) in &due {
        // Conditional: a call decided meanwhile (by another replica) keeps its outcome.
        resolved.extend(tx.resolve(*rowid, &outcome).await?);
    }
    complete_batches(tx, &resolved).await?;
    let mut expired = Vec::with_capacity(resolved.len());
    for r in &resolved {
        expired.push(tx.load_call(r.rowid).await?);
    }
    Ok(expired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Status;
    use crate::operations::WriteTx;
    use crate::operations::submit::submit_in;
    use crate::operations::testing::{Db, batch, call, key, texts};

    #[tokio::test]
    async fn due_calls_expire_in_chunks_and_the_others_stay_pending() {
        let db = Db::new().await;
        let now = Timestamp::now();
        let due_at = Timestamp::from_micros(now.as_micros() + 1_000);
        let later = Timestamp::from_micros(now.as_micros() + 60_000_000);
        let mut tx = db.tx().await;
        // More than one chunk of due calls (a chunk is 256), in batches of up to 128.
        for b in 0..3 {
            let calls = (0..100).map(|i| {
                let mut c = call(&format!("due-{b}-{i}"), "t", "{}");
                c.deadline = Some(due_at);
                c
            });
            submit_in(&mut tx, &batch("s", calls), &texts(), now)
                .await
                .unwrap();
        }
        let mut not_yet = call("later", "t", "{}");
        not_yet.deadline = Some(later);
        submit_in(
            &mut tx,
            &batch("s", [not_yet, call("never", "t", "{}")]),
            &texts(),
            now,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        let at = Timestamp::from_micros(due_at.as_micros() + 1);
        let expired = expire_due(db.writer(), &texts(), at).await.unwrap();
        assert_eq!(expired.len(), 300);
        assert!(expired.iter().all(|c| {
            let o = c.outcome.as_ref().unwrap();
            o.kind == OutcomeKind::Expired && o.decided_by == DecidedBy::Deadline
        }));
        let mut tx = db.tx().await;
        for id in ["later", "never"] {
            let stored = tx.find_call(&key("s", id)).await.unwrap().unwrap();
            assert_eq!(stored.call.status(), Status::Pending, "{id}");
        }
        drop(tx);
        assert!(
            expire_due(db.writer(), &texts(), at)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
