//! Replaying a session's outcomes to an agent that (re)connects: `Connect`'s `resume` and
//! `WatchOutcomes` send every outcome logged by a sequence number, and each batch all of whose
//! calls were decided by then, before the live feed takes over.
//!
//! A session may hold tens of thousands of calls. The replay reads them in pages of [`PAGE`]
//! (keyset-paged, oldest first) and sends each page before reading the next, so its memory is
//! one page plus the batches whose calls it has not all seen yet, and its work is linear in the
//! session: one hash lookup per call, never a scan of what was already sent. It must never load
//! a whole session at once, nor stall other requests for as long as a big session takes.

use std::collections::{HashMap, HashSet};

use super::render;
use crate::broker::Broker;
use crate::domain::{AgentId, BatchId, Call, CallId, CallQuery, SessionId};
use crate::error::Result;
use crate::proto::v1 as pb;

/// Calls read per page of a replay.
pub const PAGE: u32 = 64;

/// A session's calls, a page at a time, oldest first.
pub struct SessionPages<'a> {
    broker: &'a Broker,
    query: CallQuery,
    done: bool,
}

impl<'a> SessionPages<'a> {
    pub fn new(broker: &'a Broker, agent: &AgentId, session: &SessionId) -> Self {
        Self {
            broker,
            query: CallQuery {
                agent: Some(agent.clone()),
                session: Some(session.to_string()),
                limit: PAGE,
                ..CallQuery::default()
            },
            done: false,
        }
    }

    /// The next page, its outcomes with their receipts; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<Call>>> {
        if self.done {
            return Ok(None);
        }
        let mut page = self.broker.list_calls(&self.query).await?;
        match page.next {
            Some(cursor) => self.query.after = Some(cursor),
            None => self.done = true,
        }
        self.broker.seal_outcomes(page.calls.iter_mut()).await?;
        Ok(Some(page.calls))
    }
}

/// One message of a replay, in the order it is to be sent.
#[derive(Debug)]
pub enum Replayed {
    Outcome(pb::Outcome),
    BatchComplete(pb::BatchComplete),
}

/// What a session holds for a set of wanted calls, as of sequence number `upto`, fed a page at a
/// time: the outcomes logged by then, each batch whose every call was decided by then (right
/// after its last call's outcome), and the calls pending then (their outcomes come later, live)
/// or unknown.
pub struct Replay<'a> {
    wanted: Option<&'a HashSet<CallId>>,
    upto: u64,
    /// Whether to list the pending calls (a `ResumeDone` names them; a whole-session watch
    /// need not).
    list_pending: bool,
    pending: Vec<CallId>,
    /// The named calls seen so far (at most the named ones).
    found: HashSet<CallId>,
    /// Batches some but not all of whose calls were seen.
    open: HashMap<BatchId, OpenBatch>,
}

/// A batch being read.
struct OpenBatch {
    seen: u32,
    size: u32,
    /// Whether a wanted call of it has a logged outcome (only then is its completion sent).
    touched: bool,
    /// The outcomes of its calls seen so far, by position; `None` once one of them was not
    /// logged by `upto` (the batch was not complete then).
    outcomes: Option<Vec<(u32, pb::Outcome)>>,
}

impl<'a> Replay<'a> {
    /// `wanted`: the call ids asked for (all if `None`).
    pub fn new(wanted: Option<&'a HashSet<CallId>>, upto: u64, list_pending: bool) -> Self {
        Self {
            wanted,
            upto,
            list_pending,
            pending: Vec::new(),
            found: HashSet::new(),
            open: HashMap::new(),
        }
    }

    /// The messages one page of calls (continuing the pages before) makes.
    pub fn page(&mut self, calls: Vec<Call>) -> Vec<Replayed> {
        let mut messages = Vec::new();
        for call in calls {
            let is_wanted = self.wanted.is_none_or(|w| w.contains(&call.key.call_id));
            let logged = call
                .outcome
                .as_ref()
                .is_some_and(|o| o.is_logged_by(self.upto));
            let outcome = render::outcome(&call).filter(|_| logged);
            if is_wanted {
                if self.wanted.is_some() {
                    self.found.insert(call.key.call_id.clone());
                }
                match &outcome {
                    Some(outcome) => messages.push(Replayed::Outcome(outcome.clone())),
                    None if self.list_pending => self.pending.push(call.key.call_id.clone()),
                    None => {}
                }
            }
            let batch = self
                .open
                .entry(call.batch_id.clone())
                .or_insert_with(|| OpenBatch {
                    seen: 0,
                    size: call.batch_size,
                    touched: false,
                    outcomes: Some(Vec::new()),
                });
            batch.seen += 1;
            batch.touched |= is_wanted && outcome.is_some();
            match outcome {
                Some(outcome) => {
                    if let Some(outcomes) = &mut batch.outcomes {
                        outcomes.push((call.position, outcome));
                    }
                }
                None => batch.outcomes = None,
            }
            if batch.seen >= batch.size
                && let Some(batch) = self.open.remove(&call.batch_id)
                && let Some(complete) = batch.complete(&call)
            {
                messages.push(Replayed::BatchComplete(complete));
            }
        }
        messages
    }

    #[cfg(test)]
    /// How many batches the replay holds open (read in part): what it keeps between pages.
    pub fn open_batches(&self) -> usize {
        self.open.len()
    }

    /// After the last page: the wanted calls pending as of `upto` (if listed), and the named
    /// ids the session does not hold, sorted.
    pub fn finish(self) -> (Vec<CallId>, Vec<CallId>) {
        let mut unknown: Vec<CallId> = self
            .wanted
            .map(|w| {
                w.iter()
                    .filter(|id| !self.found.contains(*id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        unknown.sort();
        (self.pending, unknown)
    }
}

impl OpenBatch {
    /// The batch's completion, if a wanted call touched it and every call of it was logged.
    /// `last` is the batch's call read last (for the session and batch ids).
    fn complete(self, last: &Call) -> Option<pb::BatchComplete> {
        let mut outcomes = self.outcomes.filter(|_| self.touched)?;
        outcomes.sort_by_key(|(position, _)| *position);
        Some(pb::BatchComplete {
            session_id: last.key.session.to_string(),
            batch_id: last.batch_id.as_str().to_owned(),
            outcomes: outcomes.into_iter().map(|(_, o)| o).collect(),
            // Cut, if need be, where the stream sends it.
            truncated: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DecidedBy, Outcome, OutcomeKind, Timestamp, ToolResultTexts};

    /// Call `n` of a session, in a batch of `size` at `position`; decided with its Resolved
    /// event at sequence number `seq` if given.
    fn call(n: usize, batch: usize, position: u32, size: u32, seq: Option<u64>) -> Call {
        let outcome = seq.map(|seq| Outcome {
            seq: Some(seq),
            ..ToolResultTexts::default().outcome(
                OutcomeKind::Cancelled,
                DecidedBy::Agent,
                "",
                Timestamp::from_micros(0),
            )
        });
        Call {
            position,
            batch_size: size,
            outcome,
            ..Call::sample(
                "agent",
                "session",
                &format!("call-{n}"),
                "tool",
                &format!("batch-{batch}"),
            )
        }
    }

    fn labels(messages: &[Replayed]) -> Vec<String> {
        messages
            .iter()
            .map(|m| match m {
                Replayed::Outcome(o) => o.call_id.clone(),
                Replayed::BatchComplete(b) => format!("{}: {}", b.batch_id, b.outcomes.len()),
            })
            .collect()
    }

    /// Batches cut by page boundaries: each outcome once, in order, each complete batch once,
    /// right after its last call; a batch with a call not logged by `upto` (decided later, or
    /// pending) is not complete.
    #[test]
    fn batches_across_page_boundaries_complete_once_after_their_last_call() {
        // Batch 0: three calls decided; batch 1: two calls, the second decided after `upto`;
        // batch 2: one call pending.
        let calls = [
            call(0, 0, 0, 3, Some(1)),
            call(1, 0, 1, 3, Some(2)),
            call(2, 0, 2, 3, Some(3)),
            call(3, 1, 0, 2, Some(4)),
            call(4, 1, 1, 2, Some(9)),
            call(5, 2, 0, 1, None),
        ];
        for page in 1..=calls.len() {
            let mut replay = Replay::new(None, 5, true);
            let mut messages = Vec::new();
            for chunk in calls.chunks(page) {
                messages.extend(replay.page(chunk.to_vec()));
            }
            assert_eq!(
                labels(&messages),
                ["call-0", "call-1", "call-2", "batch-0: 3", "call-3"],
                "pages of {page}"
            );
            assert_eq!(replay.open_batches(), 0);
            let (pending, unknown) = replay.finish();
            let pending: Vec<&str> = pending.iter().map(CallId::as_str).collect();
            assert_eq!(pending, ["call-4", "call-5"], "pages of {page}");
            assert!(unknown.is_empty());
        }
    }

    /// Named calls: only theirs are sent, a batch completes if a named call of it is decided,
    /// and the named ids the session does not hold are reported.
    #[test]
    fn named_calls_replay_only_theirs_and_report_the_unknown() {
        let calls = [
            call(0, 0, 0, 2, Some(1)),
            call(1, 0, 1, 2, Some(2)),
            call(2, 1, 0, 1, Some(3)),
        ];
        let wanted: HashSet<CallId> = ["call-1", "nowhere"]
            .into_iter()
            .map(|id| CallId::from_stored(id.into()))
            .collect();
        let mut replay = Replay::new(Some(&wanted), 5, true);
        let messages: Vec<Replayed> = calls
            .chunks(1)
            .flat_map(|c| replay.page(c.to_vec()))
            .collect();
        assert_eq!(labels(&messages), ["call-1", "batch-0: 2"]);
        let (pending, unknown) = replay.finish();
        assert!(pending.is_empty());
        assert_eq!(unknown, [CallId::from_stored("nowhere".into())]);
    }

    /// A replay of a big session is linear and holds little: 40,000 single-call batches (what
    /// took 13.5 s when every batch id was looked up in a list of those already sent) read in
    /// pages, with at most one batch held open between pages, each outcome and batch sent once.
    #[test]
    fn a_big_session_replays_each_call_once_holding_at_most_one_batch_between_pages() {
        const CALLS: usize = 40_000;
        let mut replay = Replay::new(None, u64::MAX, true);
        let mut sent = 0;
        let mut held = 0;
        for first in (0..CALLS).step_by(PAGE as usize) {
            let page = (first..CALLS.min(first + PAGE as usize))
                .map(|n| call(n, n, 0, 1, Some(n as u64 + 1)))
                .collect();
            for message in replay.page(page) {
                match message {
                    Replayed::Outcome(o) => assert_eq!(o.call_id, format!("call-{}", sent / 2)),
                    Replayed::BatchComplete(b) => {
                        assert_eq!(b.batch_id, format!("batch-{}", sent / 2))
                    }
                }
                sent += 1;
            }
            held = held.max(replay.open_batches());
        }
        assert_eq!(sent, 2 * CALLS);
        assert_eq!(held, 0);
    }
}
