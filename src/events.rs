//! The in-memory fan-out of committed events.
//!
//! One pump task reads the durable log after the last sequence number it published and
//! broadcasts each event; it is woken after every local commit and (on Postgres) on other
//! replicas' notifications, and polls once a second in case a wake-up is missed. Where the store
//! hands over the events of each commit as it happens (SQLite's one writer), the pump publishes
//! those without reading them back, and reads the log only to fill a gap. Before reading
//! it asks the store to number newly committed events (Postgres assigns sequence numbers after
//! commit, in commit order). Consumers read through a [`Feed`], which first catches up from the store
//! and then follows the broadcast, skipping what it already delivered. Because the store is the
//! source and the broadcast only a cache of its tail, a consumer that lags behind the broadcast
//! catches up from the store again: events are delayed, never lost, and memory stays bounded.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc};

use crate::domain::Event;
use crate::error::{Error, Result};
use crate::store::EventLog;

/// How many events one store read returns.
const PAGE: u32 = 256;

pub struct EventBus {
    log: Arc<dyn EventLog>,
    tx: broadcast::Sender<Arc<Event>>,
    /// The last sequence number broadcast. Updated before each send, so a feed that subscribes
    /// and then reads it cannot miss the event being sent.
    published: AtomicU64,
    committed: Notify,
}

impl EventBus {
    /// `capacity` bounds the broadcast's ring of recent events shared by every consumer.
    /// Run [`EventBus::pump`] in a task for events to flow.
    pub async fn new(log: Arc<dyn EventLog>, capacity: usize) -> Result<Arc<Self>> {
        let (tx, _) = broadcast::channel(capacity.max(16));
        Ok(Arc::new(Self {
            published: AtomicU64::new(log.latest_seq().await?),
            log,
            tx,
            committed: Notify::new(),
        }))
    }

    /// The last sequence number published to live feeds.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }

    /// Tells the pump that new events were committed.
    pub fn notify_committed(&self) {
        self.committed.notify_one();
    }

    /// A feed of every event after sequence number `after`.
    pub fn feed_after(self: &Arc<Self>, after: u64) -> Feed {
        Feed {
            log: Arc::clone(&self.log),
            rx: self.tx.subscribe(),
            last: after,
            backlog: VecDeque::new(),
            catching_up: true,
        }
    }

    /// A feed of the events published from now on.
    pub fn feed_live(self: &Arc<Self>) -> Feed {
        let rx = self.tx.subscribe();
        let last = self.published.load(Ordering::SeqCst);
        Feed {
            log: Arc::clone(&self.log),
            rx,
            last,
            backlog: VecDeque::new(),
            catching_up: false,
        }
    }

    /// Publishes committed events until the task is dropped.
    pub async fn pump(self: Arc<Self>) {
        let mut last = self.published.load(Ordering::SeqCst);
        let remote = self.log.remote_commits().unwrap_or_default();
        let (mut handed, missed) = match self.log.take_committed_events() {
            Some(committed) => (Some(committed.events), committed.missed),
            None => (None, Arc::default()),
        };
        loop {
            let mut read = true;
            tokio::select! {
                events = next_handed(&mut handed) => match events {
                    // Exactly the next events: publish them as they are.
                    Some(events) if events.first().is_some_and(|e| e.seq == last + 1) => {
                        for event in events {
                            last = self.publish(event);
                        }
                        read = false;
                    }
                    // Already published (read from the log meanwhile).
                    Some(events) if events.last().is_some_and(|e| e.seq <= last) => read = false,
                    // After a gap (some were not handed over): read the log.
                    Some(_) => {}
                    None => handed = None,
                },
                // Where the store hands events over, a local commit needs no read, unless some
                // were not handed over.
                _ = self.committed.notified(), if handed.is_none() => {}
                _ = missed.notified() => {}
                _ = remote.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if read {
                last = self.read_log(last).await;
            }
        }
    }

    /// Publishes one event; returns its sequence number.
    fn publish(&self, event: Event) -> u64 {
        let seq = event.seq;
        self.published.store(seq, Ordering::SeqCst);
        // No receiver is not an error: nobody is listening right now.
        let _ = self.tx.send(Arc::new(event));
        seq
    }

    /// Publishes what the log holds after `last`; returns the last sequence number published.
    async fn read_log(&self, mut last: u64) -> u64 {
        if let Err(err) = self.log.sequence_events().await {
            tracing::warn!(error = %err, "numbering committed events failed; retrying");
        }
        loop {
            let events = match self.log.events_after(last, PAGE).await {
                Ok(events) => events,
                // Retention pruned past this replica's pump (it lagged behind for longer than
                // --retain-decided): go on from the horizon. Each feed that was further behind
                // sees the jump and reads the log, which refuses it precisely.
                Err(Error::Pruned { through, .. }) => {
                    tracing::warn!(
                        last,
                        through,
                        "retention pruned events this broker had not published yet"
                    );
                    last = through;
                    continue;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reading the event log failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return last;
                }
            };
            let full = events.len() == PAGE as usize;
            for event in events {
                last = self.publish(event);
            }
            if !full {
                return last;
            }
        }
    }
}

/// The next events the store handed over; pending forever where it hands none.
async fn next_handed(handed: &mut Option<mpsc::Receiver<Vec<Event>>>) -> Option<Vec<Event>> {
    match handed {
        Some(handed) => handed.recv().await,
        None => std::future::pending().await,
    }
}

/// One consumer's ordered view of the event log, without gaps or repeats.
pub struct Feed {
    log: Arc<dyn EventLog>,
    rx: broadcast::Receiver<Arc<Event>>,
    last: u64,
    backlog: VecDeque<Arc<Event>>,
    catching_up: bool,
}

/// An event, and whether it came live from the broadcast (as opposed to a catch-up read).
pub struct Delivery {
    pub event: Arc<Event>,
    pub live: bool,
}

impl Feed {
    /// The sequence number of the last event this feed returned (or started after).
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// The next event after the last one returned.
    pub async fn next(&mut self) -> Result<Delivery> {
        loop {
            if let Some(event) = self.backlog.pop_front() {
                self.last = event.seq;
                return Ok(Delivery { event, live: false });
            }
            if self.catching_up {
                let page = self.log.events_after(self.last, PAGE).await?;
                self.catching_up = page.len() == PAGE as usize;
                self.backlog.extend(page.into_iter().map(Arc::new));
                continue;
            }
            match self.rx.recv().await {
                Ok(event) if event.seq <= self.last => continue,
                // A jump (the pump went past pruned events): the log says what happened, either
                // the events in between or the refusal of a resume point it no longer keeps.
                Ok(event) if event.seq > self.last + 1 => self.catching_up = true,
                Ok(event) => {
                    self.last = event.seq;
                    return Ok(Delivery { event, live: true });
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.catching_up = true,
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(Error::Internal("the event bus stopped".into()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;

    use super::*;
    use crate::domain::{
        AgentId, BatchId, Call, CallId, CallKey, EventKind, SessionId, Timestamp, ToolInput,
        ToolName,
    };
    use crate::store::CommittedEvents;

    /// A log the test appends to ("commits"), and whose hand-overs the test makes, right or
    /// wrong: the pump is the only user.
    struct Log {
        events: Mutex<Vec<Event>>,
        reads: AtomicUsize,
        handed: Mutex<Option<CommittedEvents>>,
        /// The highest sequence number "retention pruned" (as the stores refuse below it).
        pruned_through: AtomicU64,
    }

    impl Log {
        fn commit(&self, seqs: impl IntoIterator<Item = u64>) {
            self.events
                .lock()
                .unwrap()
                .extend(seqs.into_iter().map(event));
        }
    }

    fn event(seq: u64) -> Event {
        let id = |s: &str| s.to_owned();
        Event {
            seq,
            kind: EventKind::Requested,
            call: Call {
                key: CallKey {
                    agent: AgentId::from_stored(id("agent")),
                    session: SessionId::from_stored(id("session")),
                    call_id: CallId::from_stored(format!("call-{seq}")),
                },
                batch_id: BatchId::from_stored(format!("batch-{seq}")),
                position: 0,
                batch_size: 1,
                tool: ToolName::from_stored(id("tool")),
                input: ToolInput::from_stored(id("{}")),
                title: String::new(),
                message: String::new(),
                workspace: String::new(),
                supersede_key: None,
                deadline: None,
                created_at: Timestamp::from_micros(0),
                outcome: None,
                escalation: None,
                requested_by: String::new(),
                approval: None,
            },
            batch_completed: false,
            step: None,
        }
    }

    #[async_trait]
    impl EventLog for Log {
        async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let through = self.pruned_through.load(Ordering::SeqCst);
            if after < through {
                return Err(Error::Pruned { after, through });
            }
            let events = self.events.lock().unwrap();
            let after = events.iter().filter(|e| e.seq > after);
            Ok(after.take(limit as usize).cloned().collect())
        }
        async fn latest_seq(&self) -> Result<u64> {
            Ok(0)
        }
        fn take_committed_events(&self) -> Option<CommittedEvents> {
            self.handed.lock().unwrap().take()
        }
    }

    /// The pump publishes a hand-over that follows what it published without reading the log,
    /// ignores one it already published (read from the log meanwhile), and on a gap reads the
    /// log at once, rather than at its next poll: every event is published once, in order.
    /// The clock is paused, and only advances when every task waits, so "at once" means the
    /// clock did not move (the poll is a second away).
    #[tokio::test(start_paused = true)]
    async fn hand_overs_are_published_once_in_order_and_a_gap_is_read_from_the_log_at_once() {
        let (hand, events) = mpsc::channel(16);
        let log = Arc::new(Log {
            events: Mutex::new(Vec::new()),
            reads: AtomicUsize::new(0),
            handed: Mutex::new(Some(CommittedEvents {
                events,
                missed: Arc::default(),
            })),
            pruned_through: AtomicU64::new(0),
        });
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let mut published = bus.tx.subscribe();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        let started = tokio::time::Instant::now();
        let mut next = async || published.recv().await.unwrap().seq;

        // The next events: published as handed, without a read.
        log.commit([1, 2]);
        hand.send(vec![event(1), event(2)]).await.unwrap();
        assert_eq!((next().await, next().await), (1, 2));

        // Handed again (say, late): not published twice. The next hand-over still follows.
        hand.send(vec![event(1), event(2)]).await.unwrap();
        log.commit([3]);
        hand.send(vec![event(3)]).await.unwrap();
        assert_eq!(next().await, 3);
        assert_eq!(log.reads.load(Ordering::SeqCst), 0, "no read so far");

        // 4 is committed but not handed over, 5 is: the pump reads the log and publishes both.
        log.commit([4, 5]);
        hand.send(vec![event(5)]).await.unwrap();
        assert_eq!((next().await, next().await), (4, 5));
        assert_eq!(log.reads.load(Ordering::SeqCst), 1, "the gap is read once");
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "the gap was read at once, not at the next poll"
        );

        // 4 and 5 handed late: ignored; then 6 follows as usual.
        hand.send(vec![event(4), event(5)]).await.unwrap();
        log.commit([6]);
        hand.send(vec![event(6)]).await.unwrap();
        assert_eq!(next().await, 6);
        assert_eq!(bus.published(), 6);
        assert_eq!(log.reads.load(Ordering::SeqCst), 1);
        pump.abort();
    }

    /// A feed following the broadcast that sees it jump (the pump went past events retention
    /// pruned) reads the log rather than deliver the event after the jump: a gap is never
    /// served, and the feed gets the log's precise refusal. The pump itself goes on after the
    /// horizon instead of retrying a read the log will always refuse.
    #[tokio::test(start_paused = true)]
    async fn a_jump_past_pruned_events_ends_a_feed_behind_it_with_the_refusal_not_a_gap() {
        let log = Arc::new(Log {
            events: Mutex::new(Vec::new()),
            reads: AtomicUsize::new(0),
            handed: Mutex::new(None),
            pruned_through: AtomicU64::new(0),
        });
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        log.commit([1, 2]);
        bus.notify_committed();
        let mut behind = bus.feed_after(0);
        assert_eq!(behind.next().await.unwrap().event.seq, 1);
        assert_eq!(behind.next().await.unwrap().event.seq, 2);
        let mut live = bus.feed_after(2);

        // 3 and 4 are pruned before the pump read them; 5 is committed.
        log.events.lock().unwrap().retain(|e| e.seq > 4);
        log.pruned_through.store(4, Ordering::SeqCst);
        log.commit([5]);
        bus.notify_committed();

        let refused = behind.next().await.err().expect("refused, not a gap");
        assert!(
            matches!(
                refused,
                Error::Pruned {
                    after: 2,
                    through: 4
                }
            ),
            "{refused:?}"
        );
        assert!(live.next().await.is_err(), "the other feed at 2 as well");
        // A feed from the horizon on gets 5, published by the pump past the horizon.
        let mut fresh = bus.feed_after(4);
        assert_eq!(fresh.next().await.unwrap().event.seq, 5);
        assert_eq!(bus.published(), 5);
        pump.abort();
    }
}
