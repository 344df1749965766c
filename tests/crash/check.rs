//! Holds what the clients were acknowledged against the broker's own final state (every call
//! through AdminService/ListCalls, and the event log read from `after_seq: 0`), and counts, as
//! figures, everything lost or duplicated: acknowledged calls missing or doubled, acknowledged
//! decisions that are not the stored outcome, calls without exactly one outcome, outcomes an
//! agent never received, and events the resumed subscriber missed, repeated or saw out of order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use approval_broker::proto::v1 as pb;

use crate::load::{Acked, AgentReport, ApproverReport, EventRecord, Kind, SubscriberReport};

/// What the run collected.
pub struct Collected<'a> {
    pub agents: &'a [AgentReport],
    pub approver: &'a ApproverReport,
    pub sweeper: &'a [Acked],
    pub subscriber: &'a SubscriberReport,
    /// The broker's log, from `after_seq: 0` up to `latest_seq`.
    pub reference: &'a [EventRecord],
    pub latest_seq: u64,
    /// Every stored call.
    pub stored: &'a [pb::Call],
    /// Pending calls the last sweep still found after every agent finished.
    pub pending_at_end: usize,
}

#[derive(Debug, Default)]
pub struct Figures {
    pub backend: &'static str,
    pub seed: u64,
    pub kills: u32,
    pub starts: u32,
    pub restart_times: Vec<Duration>,
    pub wall: Duration,

    pub batches: usize,
    pub acknowledged_calls: usize,
    pub stored_calls: usize,
    /// Calls acknowledged as duplicates when their batch was resubmitted after a kill: they
    /// were committed, but the acknowledgement never arrived.
    pub duplicate_acks: u32,
    /// Batches resubmitted after a kill because their acknowledgement never arrived.
    pub resubmits: u32,
    pub reconnects: u32,
    pub cancels: u32,
    /// Acknowledged calls missing from the store.
    pub calls_missing: usize,
    /// Extra rows for one (session, call id).
    pub calls_duplicated: usize,
    /// Stored calls no agent was acknowledged (none expected: every batch is acknowledged in
    /// the end).
    pub calls_unexpected: usize,
    /// Acknowledgements naming another batch or position than the stored call (the
    /// acknowledged write was lost and the call written again).
    pub acks_moved: usize,

    pub acknowledged_decisions: usize,
    pub decisions_by_source: BTreeMap<&'static str, usize>,
    pub approver_retries: u32,
    pub approver_committed_unanswered: u32,
    /// Requests (submits, cancels, decisions) the broker refused with INTERNAL: not a loss
    /// (nothing was acknowledged; the harness retries), but a broker failure worth a look.
    pub internal_refusals: u32,
    pub approver_replays: u32,
    pub approver_refused: u32,
    /// Acknowledged decisions that are not the stored outcome.
    pub decisions_not_stored: usize,

    pub outcomes_by_status: BTreeMap<String, usize>,
    /// Stored calls without an outcome.
    pub calls_undecided: usize,
    pub agent_outcomes: usize,
    /// Acknowledged calls whose outcome never reached their agent.
    pub agent_missing: usize,
    /// Outcomes an agent received that differ from the stored one.
    pub agent_wrong: usize,
    /// A second, different outcome for one call.
    pub agent_conflicting: usize,
    pub batch_completes: usize,
    pub batch_complete_missing: usize,
    pub batch_complete_wrong: usize,
    pub agents_unfinished: usize,

    pub log_events: usize,
    pub latest_seq: u64,
    /// Sequence numbers of 1..=latest that the log does not hold.
    pub log_gaps: usize,
    /// Calls without their Requested or Resolved event.
    pub log_missing: usize,
    /// Calls with a second Requested or Resolved event.
    pub log_duplicated: usize,
    /// Resolved events whose outcome is not the stored one, or events of unknown calls.
    pub log_wrong: usize,
    pub subscriber_events: usize,
    pub subscriptions: u32,
    pub subscriber_missing: usize,
    pub subscriber_duplicated: usize,
    pub subscriber_out_of_order: usize,
    pub subscriber_wrong: usize,
    pub subscriber_caught_up: bool,

    pub errors: Vec<String>,
    pub examples: Vec<String>,
}

impl Figures {
    pub fn lost(&self) -> usize {
        self.calls_missing
            + self.acks_moved
            + self.decisions_not_stored
            + self.calls_undecided
            + self.agent_missing
            + self.agent_wrong
            + self.batch_complete_missing
            + self.batch_complete_wrong
            + self.log_gaps
            + self.log_missing
            + self.log_wrong
            + self.subscriber_missing
            + self.subscriber_wrong
    }

    pub fn duplicated(&self) -> usize {
        self.calls_duplicated
            + self.calls_unexpected
            + self.agent_conflicting
            + self.log_duplicated
            + self.subscriber_duplicated
            + self.subscriber_out_of_order
    }

    fn example(&mut self, text: String) {
        if self.examples.len() < 20 {
            self.examples.push(text);
        }
    }
}

type Key = (String, String);

fn key_of(outcome: &pb::Outcome) -> Key {
    (outcome.session_id.clone(), outcome.call_id.clone())
}

pub fn check(figures: &mut Figures, c: &Collected) {
    let f = figures;
    let mut stored: HashMap<Key, Vec<&pb::Call>> = HashMap::new();
    for call in c.stored {
        stored
            .entry((call.session_id.clone(), call.call_id.clone()))
            .or_default()
            .push(call);
    }
    let stored_outcome = |key: &Key| -> Option<&pb::Outcome> {
        stored.get(key).and_then(|calls| calls[0].outcome.as_ref())
    };
    f.stored_calls = c.stored.len();

    // 1. Every acknowledged call exists exactly once, where it was acknowledged.
    let mut acknowledged: HashSet<Key> = HashSet::new();
    for agent in c.agents {
        f.batches += agent.batches;
        f.duplicate_acks += agent.duplicate_acks;
        f.resubmits += agent.resubmits;
        f.reconnects += agent.reconnects;
        f.cancels += agent.cancels;
        f.internal_refusals += agent.internal;
        f.errors.extend(agent.errors.iter().cloned());
        for call_id in agent.acked.keys() {
            let key = (agent.session.clone(), call_id.clone());
            match stored.get(&key).map(Vec::len).unwrap_or(0) {
                0 => {
                    f.calls_missing += 1;
                    f.example(format!("acknowledged call {key:?} is not stored"));
                }
                1 => {}
                n => {
                    f.calls_duplicated += n - 1;
                    f.example(format!("acknowledged call {key:?} is stored {n} times"));
                }
            }
            acknowledged.insert(key);
        }
        for ack in &agent.acks {
            let key = (agent.session.clone(), ack.call_id.clone());
            if let Some(calls) = stored.get(&key)
                && (calls[0].batch_id != ack.batch_id || calls[0].position != ack.position)
            {
                f.acks_moved += 1;
                f.example(format!(
                    "{key:?} was acknowledged in batch {} at {}, is stored in batch {} at {}",
                    ack.batch_id, ack.position, calls[0].batch_id, calls[0].position
                ));
            }
        }
    }
    f.acknowledged_calls = acknowledged.len();
    for key in stored.keys() {
        if !acknowledged.contains(key) {
            f.calls_unexpected += 1;
            f.example(format!("stored call {key:?} was never acknowledged"));
        }
    }

    // 2. Every acknowledged decision is the stored outcome.
    let decisions = c
        .agents
        .iter()
        .flat_map(|a| a.decisions.iter())
        .chain(c.approver.decisions.iter())
        .chain(c.sweeper.iter());
    for acked in decisions {
        f.acknowledged_decisions += 1;
        *f.decisions_by_source.entry(acked.source).or_default() += 1;
        let key = key_of(&acked.outcome);
        let standing = stored_outcome(&key);
        if standing != Some(&acked.outcome) {
            f.decisions_not_stored += 1;
            f.example(format!(
                "{} decision {key:?} acknowledged as {:?} by {}, stored: {:?}",
                acked.source,
                status_name(acked.outcome.status),
                acked.outcome.decided_by,
                standing.map(|o| (status_name(o.status), o.decided_by.clone()))
            ));
        }
    }
    f.approver_retries = c.approver.retries;
    f.approver_committed_unanswered = c.approver.committed_unanswered;
    f.internal_refusals += c.approver.internal;
    f.approver_replays = c.approver.replays;
    f.approver_refused = c.approver.refused;
    f.errors.extend(c.approver.errors.iter().cloned());

    // 3. Every call ends with exactly one outcome, and its agent received it.
    for call in c.stored {
        match &call.outcome {
            Some(outcome) if call.status != pb::CallStatus::Pending as i32 => {
                *f.outcomes_by_status
                    .entry(status_name(outcome.status))
                    .or_default() += 1;
            }
            _ => {
                f.calls_undecided += 1;
                f.example(format!(
                    "call {}/{} has no outcome",
                    call.session_id, call.call_id
                ));
            }
        }
    }
    f.pending_check(c.pending_at_end);
    let mut batches: BTreeMap<&str, Vec<&pb::Call>> = BTreeMap::new();
    for call in c.stored {
        batches.entry(&call.batch_id).or_default().push(call);
    }
    for agent in c.agents {
        if !agent.finished {
            f.agents_unfinished += 1;
        }
        f.agent_conflicting += agent.conflicting.len();
        for (first, second) in agent.conflicting.iter().take(3) {
            f.example(format!(
                "{} saw two outcomes for {}: {:?} then {:?}",
                agent.session,
                first.call_id,
                status_name(first.status),
                status_name(second.status)
            ));
        }
        for call_id in agent.acked.keys() {
            let key = (agent.session.clone(), call_id.clone());
            match (agent.pushed.get(call_id), stored_outcome(&key)) {
                (None, _) => {
                    f.agent_missing += 1;
                    f.example(format!("{key:?}: its outcome never reached the agent"));
                }
                (Some(got), Some(standing)) if got == standing => f.agent_outcomes += 1,
                (Some(got), standing) => {
                    f.agent_wrong += 1;
                    f.example(format!(
                        "{key:?}: the agent got {:?} by {}, stored: {:?}",
                        status_name(got.status),
                        got.decided_by,
                        standing.map(|o| status_name(o.status))
                    ));
                }
            }
        }
        for (batch_id, calls) in &batches {
            if calls[0].session_id != agent.session {
                continue;
            }
            let mut calls = calls.clone();
            calls.sort_by_key(|c| c.position);
            let expected: Vec<Option<&pb::Outcome>> =
                calls.iter().map(|c| c.outcome.as_ref()).collect();
            match agent.batch_completes.get(*batch_id) {
                None => {
                    f.batch_complete_missing += 1;
                    f.example(format!(
                        "{}: batch {batch_id} never completed for the agent",
                        agent.session
                    ));
                }
                Some(got) if got.iter().map(Some).eq(expected.iter().copied()) => {
                    f.batch_completes += 1
                }
                Some(_) => {
                    f.batch_complete_wrong += 1;
                    f.example(format!(
                        "{}: batch {batch_id} completed with other outcomes than stored",
                        agent.session
                    ));
                }
            }
        }
    }

    // 4. The broker's log holds each call's two events once, and the resumed subscriber saw
    // exactly that log: every event once, in order.
    f.latest_seq = c.latest_seq;
    f.log_events = c.reference.len();
    let mut log_seqs = HashSet::new();
    let mut per_call: HashMap<Key, (usize, usize)> = HashMap::new();
    let mut previous = 0;
    for event in c.reference {
        if event.seq <= previous {
            f.log_duplicated += 1;
            f.example(format!("the log repeats or reorders seq {}", event.seq));
        }
        previous = event.seq;
        log_seqs.insert(event.seq);
        let key = (event.session.clone(), event.call_id.clone());
        if !stored.contains_key(&key) {
            f.log_wrong += 1;
            f.example(format!("event {} names an unknown call {key:?}", event.seq));
            continue;
        }
        let counts = per_call.entry(key.clone()).or_default();
        match event.kind {
            Kind::Requested => counts.0 += 1,
            Kind::Resolved => {
                counts.1 += 1;
                if event.outcome.as_ref() != stored_outcome(&key) {
                    f.log_wrong += 1;
                    f.example(format!(
                        "event {} resolves {key:?} otherwise than stored",
                        event.seq
                    ));
                }
            }
        }
    }
    f.log_gaps = (1..=c.latest_seq).filter(|s| !log_seqs.contains(s)).count();
    for key in stored.keys() {
        let (requested, resolved) = per_call.get(key).copied().unwrap_or_default();
        for (n, what) in [(requested, "Requested"), (resolved, "Resolved")] {
            if n == 0 {
                f.log_missing += 1;
                f.example(format!("the log has no {what} event for {key:?}"));
            } else if n > 1 {
                f.log_duplicated += n - 1;
                f.example(format!("the log has {n} {what} events for {key:?}"));
            }
        }
    }

    let by_seq: HashMap<u64, &EventRecord> = c.reference.iter().map(|e| (e.seq, e)).collect();
    let s = c.subscriber;
    f.subscriber_events = s.events.len();
    f.subscriptions = s.subscriptions;
    f.subscriber_caught_up = s.caught_up;
    f.errors.extend(s.errors.iter().cloned());
    if s.snapshot_items > 0 {
        f.errors.push(format!(
            "the subscriber's first snapshot held {} calls (it should start before the load)",
            s.snapshot_items
        ));
    }
    let mut seen = HashSet::new();
    let mut last = 0;
    for event in &s.events {
        if event.seq <= last {
            f.subscriber_out_of_order += 1;
            f.example(format!(
                "the subscriber saw seq {} after seq {last}",
                event.seq
            ));
        }
        last = last.max(event.seq);
        if !seen.insert(event.seq) {
            f.subscriber_duplicated += 1;
            f.example(format!("the subscriber saw seq {} twice", event.seq));
            continue;
        }
        match by_seq.get(&event.seq) {
            Some(logged) if *logged == event => {}
            Some(logged) => {
                f.subscriber_wrong += 1;
                f.example(format!(
                    "the subscriber's seq {} is {:?} {}/{}, the log's is {:?} {}/{}",
                    event.seq,
                    event.kind,
                    event.session,
                    event.call_id,
                    logged.kind,
                    logged.session,
                    logged.call_id
                ));
            }
            None => {
                f.subscriber_wrong += 1;
                f.example(format!(
                    "the subscriber saw seq {}, which the log does not hold",
                    event.seq
                ));
            }
        }
    }
    for event in c.reference {
        if !seen.contains(&event.seq) {
            f.subscriber_missing += 1;
            f.example(format!(
                "the subscriber never saw seq {} ({:?} {}/{})",
                event.seq, event.kind, event.session, event.call_id
            ));
        }
    }
}

impl Figures {
    fn pending_check(&mut self, pending_at_end: usize) {
        if pending_at_end > 0 {
            self.errors.push(format!(
                "{pending_at_end} calls were still pending after every agent finished"
            ));
        }
    }
}

fn status_name(status: i32) -> String {
    pb::CallStatus::try_from(status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("CALL_STATUS_")
                .to_owned()
        })
        .unwrap_or_else(|_| status.to_string())
}

impl fmt::Display for Figures {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sources: Vec<String> = self
            .decisions_by_source
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let statuses: Vec<String> = self
            .outcomes_by_status
            .iter()
            .map(|(k, v)| format!("{}={v}", k.to_lowercase()))
            .collect();
        let restarts = &self.restart_times;
        let max_restart = restarts.iter().max().copied().unwrap_or_default();
        let mean_restart = restarts.iter().sum::<Duration>() / (restarts.len().max(1) as u32);
        writeln!(
            out,
            "crash[{}] seed={} kills={} broker_starts={} restart_to_serving: mean={}ms max={}ms \
             wall={:.1}s",
            self.backend,
            self.seed,
            self.kills,
            self.starts,
            mean_restart.as_millis(),
            max_restart.as_millis(),
            self.wall.as_secs_f64()
        )?;
        writeln!(
            out,
            "  calls:     batches={} acknowledged_calls={} stored={} missing={} duplicated={} \
             unexpected={} moved={} | reconnects={} resubmits={} duplicate_acks={} cancels={}",
            self.batches,
            self.acknowledged_calls,
            self.stored_calls,
            self.calls_missing,
            self.calls_duplicated,
            self.calls_unexpected,
            self.acks_moved,
            self.reconnects,
            self.resubmits,
            self.duplicate_acks,
            self.cancels
        )?;
        writeln!(
            out,
            "  decisions: acknowledged_decisions={} ({}) not_stored={} | approver retries={} \
             committed_unanswered={} replays={} refused={} | internal_refusals={}",
            self.acknowledged_decisions,
            sources.join(" "),
            self.decisions_not_stored,
            self.approver_retries,
            self.approver_committed_unanswered,
            self.approver_replays,
            self.approver_refused,
            self.internal_refusals
        )?;
        writeln!(
            out,
            "  outcomes:  ({}) undecided={} agent_received={} agent_missing={} agent_wrong={} \
             agent_conflicting={} batch_completes={} batch_complete_missing={} \
             batch_complete_wrong={} agents_unfinished={}",
            statuses.join(" "),
            self.calls_undecided,
            self.agent_outcomes,
            self.agent_missing,
            self.agent_wrong,
            self.agent_conflicting,
            self.batch_completes,
            self.batch_complete_missing,
            self.batch_complete_wrong,
            self.agents_unfinished
        )?;
        writeln!(
            out,
            "  events:    log={} latest_seq={} gaps={} log_missing={} log_duplicated={} \
             log_wrong={} | subscriber={} subscriptions={} missing={} duplicated={} \
             out_of_order={} wrong={} caught_up={}",
            self.log_events,
            self.latest_seq,
            self.log_gaps,
            self.log_missing,
            self.log_duplicated,
            self.log_wrong,
            self.subscriber_events,
            self.subscriptions,
            self.subscriber_missing,
            self.subscriber_duplicated,
            self.subscriber_out_of_order,
            self.subscriber_wrong,
            self.subscriber_caught_up
        )?;
        write!(
            out,
            "  crash[{}] seed={} kills={} acknowledged_calls={} acknowledged_decisions={} \
             events={} lost={} duplicated={} errors={}",
            self.backend,
            self.seed,
            self.kills,
            self.acknowledged_calls,
            self.acknowledged_decisions,
            self.log_events,
            self.lost(),
            self.duplicated(),
            self.errors.len()
        )?;
        if self.internal_refusals > 0 {
            write!(
                out,
                "\n    note: the broker refused {} requests with INTERNAL (see its log); nothing \
                 acknowledged was lost, the harness retried them",
                self.internal_refusals
            )?;
        }
        for example in &self.examples {
            write!(out, "\n    example: {example}")?;
        }
        for error in self.errors.iter().take(20) {
            write!(out, "\n    error: {error}")?;
        }
        Ok(())
    }
}

/// The check itself: fed a run in which things were lost and duplicated, it counts them.
#[test]
fn the_check_counts_what_was_lost_or_duplicated() {
    use crate::load::AckRecord;

    let outcome = |call_id: &str, status: pb::CallStatus, by: &str| pb::Outcome {
        session_id: "s".into(),
        call_id: call_id.into(),
        status: status as i32,
        decided_by: by.into(),
        batch_id: "b1".into(),
        position: if call_id == "a" { 0 } else { 1 },
        ..Default::default()
    };
    let approved = outcome("a", pb::CallStatus::Approved, "approver:alice");
    let call = |call_id: &str, outcome: Option<pb::Outcome>| pb::Call {
        session_id: "s".into(),
        call_id: call_id.into(),
        batch_id: "b1".into(),
        position: if call_id == "a" { 0 } else { 1 },
        status: outcome
            .as_ref()
            .map_or(pb::CallStatus::Pending as i32, |o| o.status),
        outcome,
        ..Default::default()
    };
    // `a` is approved; `b` is still pending (its outcome never reached the agent); `x` was
    // acknowledged but is not stored.
    let stored = vec![call("a", Some(approved.clone())), call("b", None)];
    let ack = |call_id: &str, position| AckRecord {
        call_id: call_id.into(),
        batch_id: "b1".into(),
        position,
    };
    let mut agent = AgentReport {
        session: "s".into(),
        finished: true,
        ..Default::default()
    };
    for record in [ack("a", 0), ack("b", 1), ack("x", 2)] {
        agent.acked.insert(record.call_id.clone(), record.clone());
        agent.acks.push(record);
    }
    // The agent was told `a` was denied: not what is stored.
    let denied = outcome("a", pb::CallStatus::Denied, "approver:alice");
    agent.pushed.insert("a".into(), denied.clone());
    agent.conflicting.push((approved.clone(), denied.clone()));
    let approver = ApproverReport {
        decisions: vec![Acked {
            source: "approver",
            outcome: denied,
        }],
        ..Default::default()
    };
    let event = |seq, kind, call_id: &str, outcome: Option<pb::Outcome>| EventRecord {
        seq,
        kind,
        session: "s".into(),
        call_id: call_id.into(),
        outcome,
    };
    let reference = vec![
        event(1, Kind::Requested, "a", None),
        event(2, Kind::Resolved, "a", Some(approved.clone())),
        event(3, Kind::Requested, "b", None),
    ];
    // Seen twice, and never seen: seq 3.
    let subscriber = SubscriberReport {
        events: vec![
            reference[0].clone(),
            reference[1].clone(),
            reference[1].clone(),
        ],
        caught_up: true,
        ..Default::default()
    };
    let mut figures = Figures::default();
    check(
        &mut figures,
        &Collected {
            agents: &[agent],
            approver: &approver,
            sweeper: &[],
            subscriber: &subscriber,
            reference: &reference,
            latest_seq: 4,
            stored: &stored,
            pending_at_end: 0,
        },
    );
    assert_eq!(figures.calls_missing, 1, "{figures}");
    assert_eq!(figures.decisions_not_stored, 1, "{figures}");
    assert_eq!(figures.calls_undecided, 1, "{figures}");
    assert_eq!(figures.agent_missing, 2, "{figures}");
    assert_eq!(figures.agent_wrong, 1, "{figures}");
    assert_eq!(figures.agent_conflicting, 1, "{figures}");
    assert_eq!(figures.log_gaps, 1, "{figures}");
    assert_eq!(figures.log_missing, 1, "{figures}");
    assert_eq!(figures.subscriber_missing, 1, "{figures}");
    assert_eq!(figures.subscriber_duplicated, 1, "{figures}");
    assert_eq!(figures.subscriber_out_of_order, 1, "{figures}");
    assert!(
        figures.lost() >= 8 && figures.duplicated() >= 3,
        "{figures}"
    );
}
