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
//!
//! An agent's stream wants only the events of the sessions it follows, a small share of them
//! at 64 agents. A broadcast wakes every consumer for every event, so its feed is routed instead
//! ([`EventBus::routed_feed`], [`Feed::follow`]): the pump hands each event to the queues of the
//! feeds that follow its session alone, waking one task where the broadcast woke one per agent
//! stream. A routed queue that is full is dropped by the pump, and its feed, seeing it closed,
//! takes a new one and catches up from the store exactly as a lagging broadcast consumer does.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc};

use crate::domain::{AgentId, Event, SessionId};
use crate::error::{Error, Result};
use crate::store::EventLog;

/// How many events one store read returns.
const PAGE: u32 = 256;

/// How many events a routed feed's queue holds before the pump drops it (and the feed catches
/// up from the store).
const ROUTED: usize = 256;

/// The routed feeds: each one's queue, and the sessions each follows.
#[derive(Default)]
struct Routes {
    next_id: u64,
    /// Each routed feed's queue, by the feed's id; none while the feed has to take a new one.
    queues: HashMap<u64, mpsc::Sender<Arc<Event>>>,
    /// The ids of the feeds following each session.
    followers: HashMap<AgentId, HashMap<SessionId, Vec<u64>>>,
}

impl Routes {
    /// Queues `event` for the feeds following its session. A queue that is full (its feed fell
    /// behind) or closed (its feed is gone) is dropped: a feed whose queue is dropped catches
    /// up from the store.
    fn route(&mut self, event: &Arc<Event>) {
        let key = &event.call.key;
        let Some(sessions) = self.followers.get_mut(&key.agent) else {
            return;
        };
        let Some(ids) = sessions.get_mut(&key.session) else {
            return;
        };
        let queues = &mut self.queues;
        ids.retain(|id| {
            let queued = queues
                .get(id)
                .is_some_and(|queue| queue.try_send(Arc::clone(event)).is_ok());
            if !queued {
                queues.remove(id);
            }
            queued
        });
        if ids.is_empty() {
            sessions.remove(&key.session);
            if sessions.is_empty() {
                self.followers.remove(&key.agent);
            }
        }
    }

    fn follow(&mut self, id: u64, agent: &AgentId, session: &SessionId) {
        let ids = self
            .followers
            .entry(agent.clone())
            .or_default()
            .entry(session.clone())
            .or_default();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }

    fn unfollow(&mut self, id: u64, agent: &AgentId, session: &SessionId) {
        let Some(sessions) = self.followers.get_mut(agent) else {
            return;
        };
        if let Some(ids) = sessions.get_mut(session) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                sessions.remove(session);
            }
        }
        if sessions.is_empty() {
            self.followers.remove(agent);
        }
    }
}

pub struct EventBus {
    log: Arc<dyn EventLog>,
    tx: broadcast::Sender<Arc<Event>>,
    /// The last sequence number broadcast. Updated before each send, so a feed that subscribes
    /// and then reads it cannot miss the event being sent.
    published: AtomicU64,
    committed: Notify,
    /// Routed feeds' queues. Locked while an event is published (and `published` updated), so
    /// a feed that takes a queue and then reads `published` cannot miss the event being sent.
    routes: Mutex<Routes>,
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
            routes: Mutex::default(),
        }))
    }

    /// The last sequence number published to live feeds.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }

    /// A commit logged events: the pump reads the log now (`Broker::committed`, the one
    /// after-commit step, is what calls it).
    pub fn wake(&self) {
        self.committed.notify_one();
    }

    /// A feed of every event after sequence number `after`.
    pub fn feed_after(self: &Arc<Self>, after: u64) -> Feed {
        Feed {
            log: Arc::clone(&self.log),
            source: Source::Broadcast(self.tx.subscribe()),
            last: after,
            backlog: VecDeque::new(),
            catching_up: true,
            read_to: 0,
        }
    }

    #[cfg(test)]
    /// A feed of the events published from now on.
    pub fn feed_live(self: &Arc<Self>) -> Feed {
        let rx = self.tx.subscribe();
        let last = self.published.load(Ordering::SeqCst);
        Feed {
            log: Arc::clone(&self.log),
            source: Source::Broadcast(rx),
            last,
            backlog: VecDeque::new(),
            catching_up: false,
            read_to: 0,
        }
    }

    /// A routed feed (see the module's doc) of the events published from now on of `agent`'s
    /// sessions that it follows ([`Feed::follow`]): none yet. Only their events wake it.
    pub fn routed_feed(self: &Arc<Self>, agent: &AgentId) -> Feed {
        let id = {
            let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
            routes.next_id += 1;
            routes.next_id
        };
        let mut route = Route {
            bus: Arc::clone(self),
            id,
            agent: agent.clone(),
            sessions: HashSet::new(),
            rx: None,
        };
        let last = route.open();
        Feed {
            log: Arc::clone(&self.log),
            source: Source::Routed(route),
            last,
            backlog: VecDeque::new(),
            catching_up: false,
            read_to: 0,
        }
    }

    /// A routed feed of `session`'s events after sequence number `after`: it reads the store
    /// up to the present, then follows its queue.
    pub fn session_feed_after(
        self: &Arc<Self>,
        agent: &AgentId,
        session: &SessionId,
        after: u64,
    ) -> Feed {
        let mut feed = self.routed_feed(agent);
        feed.follow(session);
        feed.last = after;
        feed.catching_up = true;
        feed
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
            // Whether to number committed events before reading (see `read_log`).
            let mut number = true;
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
                // Another replica numbered what it committed, then notified: read only. Running
                // the sequencer too was a transaction and a wait for its lock for nothing, on
                // every replica at every other replica's commit. Events a replica committed and
                // never numbered (it died between the two) are numbered by the next sequencer
                // that runs: any replica's after its own commit, or this one's poll. Nor read if
                // this pump published that far already: a replica's sequencer numbers every
                // replica's commits, and this one's own run often numbered and read them first.
                through = remote.announced() => {
                    number = false;
                    read = through > last;
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if read {
                last = self.read_log(last, number).await;
            }
        }
    }

    /// Publishes one event; returns its sequence number.
    fn publish(&self, event: Event) -> u64 {
        let seq = event.seq;
        let event = Arc::new(event);
        {
            let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
            self.published.store(seq, Ordering::SeqCst);
            routes.route(&event);
        }
        // No receiver is not an error: nobody is listening right now.
        let _ = self.tx.send(event);
        seq
    }

    /// Publishes what the log holds after `last`, after numbering what was committed without a
    /// number if `number`; returns the last sequence number published.
    async fn read_log(&self, mut last: u64, number: bool) -> u64 {
        if number && let Err(err) = self.log.sequence_events().await {
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
                    // A routed feed sees only its agent's events, so it cannot see the jump:
                    // dropping every queue makes each feed read the store, as a feed that
                    // sees the jump does.
                    let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
                    routes.queues.clear();
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

/// One consumer's ordered view of the event log, without gaps or repeats (a routed feed's: of
/// the events of the sessions it follows).
pub struct Feed {
    log: Arc<dyn EventLog>,
    source: Source,
    last: u64,
    backlog: VecDeque<Arc<Event>>,
    catching_up: bool,
    /// How far the store has been read while catching up: a routed feed leaves other sessions'
    /// events out of its backlog, so its last event may be well before that.
    read_to: u64,
}

/// Where a feed's live events come from.
enum Source {
    /// Every event, from the broadcast.
    Broadcast(broadcast::Receiver<Arc<Event>>),
    /// The events of the sessions followed, from the feed's own queue.
    Routed(Route),
}

/// A routed feed's queue in the bus, and the sessions it follows.
struct Route {
    bus: Arc<EventBus>,
    id: u64,
    agent: AgentId,
    sessions: HashSet<SessionId>,
    /// `None` after the pump dropped the queue, until the feed takes a new one.
    rx: Option<mpsc::Receiver<Arc<Event>>>,
}

impl Route {
    /// Takes a new queue for the sessions followed; returns the last sequence number published
    /// before it: the queue holds every later event of those sessions.
    fn open(&mut self) -> u64 {
        let (tx, rx) = mpsc::channel(ROUTED);
        let mut routes = self.bus.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.queues.insert(self.id, tx);
        for session in &self.sessions {
            routes.follow(self.id, &self.agent, session);
        }
        self.rx = Some(rx);
        self.bus.published.load(Ordering::SeqCst)
    }

    /// Whether the feed wants `event` (reading the store, which holds every event).
    fn wants(&self, event: &Event) -> bool {
        event.call.key.agent == self.agent && self.sessions.contains(&event.call.key.session)
    }

    /// The next routed event; `None` when the pump dropped the queue (it was full).
    async fn next(&mut self) -> Option<Arc<Event>> {
        match self.rx.as_mut() {
            Some(rx) => rx.recv().await,
            None => None,
        }
    }
}

impl Drop for Route {
    /// Removes the feed from the bus now, rather than when its sessions' next events find its
    /// queue closed: a session that never comes back leaves nothing behind.
    fn drop(&mut self) {
        let mut routes = self.bus.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.queues.remove(&self.id);
        for session in &self.sessions {
            routes.unfollow(self.id, &self.agent, session);
        }
    }
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

    /// Follows `session` too (a routed feed; a broadcast feed has every event already): its
    /// events published from now on are delivered, and those the store holds when the feed
    /// catches up.
    pub fn follow(&mut self, session: &SessionId) {
        let Source::Routed(route) = &mut self.source else {
            return;
        };
        if !route.sessions.insert(session.clone()) || route.rx.is_none() {
            // Followed already, or the queue is taken again (for every session) before the
            // next read.
            return;
        }
        let mut routes = route.bus.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.follow(route.id, &route.agent, session);
    }

    /// The next event after the last one returned.
    pub async fn next(&mut self) -> Result<Delivery> {
        loop {
            if let Some(event) = self.backlog.pop_front() {
                self.last = event.seq;
                return Ok(Delivery { event, live: false });
            }
            if self.catching_up {
                // A routed feed takes its new queue before reading: what is published from
                // then on is queued, what was published before is in the store.
                if let Source::Routed(route) = &mut self.source
                    && route.rx.is_none()
                {
                    route.open();
                }
                let from = self.last.max(self.read_to);
                let page = self.log.events_after(from, PAGE).await?;
                self.catching_up = page.len() == PAGE as usize;
                self.read_to = page.last().map_or(from, |e| e.seq);
                let wanted = page.into_iter().filter(|e| match &self.source {
                    Source::Broadcast(_) => true,
                    Source::Routed(route) => route.wants(e),
                });
                self.backlog.extend(wanted.map(Arc::new));
                continue;
            }
            let rx = match &mut self.source {
                Source::Broadcast(rx) => rx,
                Source::Routed(route) => {
                    match route.next().await {
                        Some(event) if event.seq <= self.last.max(self.read_to) => {}
                        Some(event) => {
                            self.last = event.seq;
                            return Ok(Delivery { event, live: true });
                        }
                        // The pump dropped the queue: it was full.
                        None => {
                            route.rx = None;
                            self.catching_up = true;
                        }
                    }
                    continue;
                }
            };
            match rx.recv().await {
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
    use crate::domain::{Call, EventKind, SessionId};
    use crate::store::{CommittedEvents, RemoteCommits};

    /// A log the test appends to ("commits"), and whose hand-overs the test makes, right or
    /// wrong: the pump is the only user.
    struct Log {
        events: Mutex<Vec<Event>>,
        reads: AtomicUsize,
        handed: Mutex<Option<CommittedEvents>>,
        /// The highest sequence number "retention pruned" (as the stores refuse below it).
        pruned_through: AtomicU64,
        /// Woken as another replica's notification wakes a Postgres store's.
        remote: Arc<RemoteCommits>,
        /// How many times the sequencer ran.
        numberings: AtomicUsize,
    }

    impl Log {
        fn commit(&self, seqs: impl IntoIterator<Item = u64>) {
            self.events
                .lock()
                .unwrap()
                .extend(seqs.into_iter().map(event));
        }
    }

    impl Log {
        /// Commits an event of each `agent/session`, numbered on from the last committed.
        fn commit_of<'a>(&self, sessions: impl IntoIterator<Item = &'a str>) {
            let mut events = self.events.lock().unwrap();
            for session in sessions {
                let seq = events.last().map_or(0, |e| e.seq) + 1;
                events.push(event_of(seq, session));
            }
        }

        fn empty() -> Arc<Log> {
            Arc::new(Log {
                events: Mutex::new(Vec::new()),
                reads: AtomicUsize::new(0),
                handed: Mutex::new(None),
                pruned_through: AtomicU64::new(0),
                remote: Arc::default(),
                numberings: AtomicUsize::new(0),
            })
        }
    }

    fn event(seq: u64) -> Event {
        event_of(seq, "agent/session")
    }

    /// An event of the call `call-{seq}` in `agent/session`.
    fn event_of(seq: u64, agent_session: &str) -> Event {
        let (agent, session) = agent_session.split_once('/').unwrap();
        Event {
            seq,
            kind: EventKind::Requested,
            call: Call::sample(
                agent,
                session,
                &format!("call-{seq}"),
                "tool",
                &format!("batch-{seq}"),
            ),
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
        async fn sequence_events(&self) -> Result<u64> {
            self.numberings.fetch_add(1, Ordering::SeqCst);
            Ok(0)
        }
        fn remote_commits(&self) -> Option<Arc<RemoteCommits>> {
            Some(Arc::clone(&self.remote))
        }
    }

    /// Another replica's sequencer numbers every replica's commits, so its notification often
    /// announces events this pump read already: announced no further than what it published, the
    /// pump does not read the log; announced further, or without saying how far (a reconnected
    /// listener, a replica of the previous version), it reads.
    #[tokio::test(start_paused = true)]
    async fn a_pump_told_of_events_it_published_already_does_not_read_again() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let mut published = bus.tx.subscribe();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        let mut next = async || published.recv().await.unwrap().seq;
        let reads = || log.reads.load(Ordering::SeqCst);
        let settle = || tokio::time::sleep(Duration::from_millis(10));

        log.commit([1, 2]);
        bus.wake();
        assert_eq!(next().await, 1);
        assert_eq!(next().await, 2);
        settle().await;
        let before = reads();

        log.remote.announce(Some(2));
        settle().await;
        assert_eq!(reads(), before, "2 was published already");

        log.commit([3]);
        log.remote.announce(Some(3));
        assert_eq!(next().await, 3);
        assert_eq!(reads(), before + 1);

        log.commit([4]);
        log.remote.announce(None);
        assert_eq!(next().await, 4);
        assert_eq!(reads(), before + 2);
        pump.abort();
    }

    /// Woken by another replica's notification (sent after that replica numbered what it
    /// committed), the pump reads the log without running the sequencer; woken by a commit of
    /// its own, or by its poll, it numbers first. So events a replica committed and died before
    /// numbering are numbered at the next poll at the latest. The clock is paused: "at once"
    /// means it did not move.
    #[tokio::test(start_paused = true)]
    async fn a_pump_woken_by_another_replica_reads_without_numbering() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let mut published = bus.tx.subscribe();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        let started = tokio::time::Instant::now();
        let mut next = async || published.recv().await.unwrap().seq;
        let numberings = || log.numberings.load(Ordering::SeqCst);

        log.commit([1]);
        log.remote.announce(None);
        assert_eq!(next().await, 1);
        assert_eq!(numberings(), 0, "another replica numbered it");
        assert_eq!(started.elapsed(), Duration::ZERO);

        log.commit([2]);
        bus.wake();
        assert_eq!(next().await, 2);
        assert_eq!(
            numberings(),
            1,
            "its own commit is numbered before the read"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);

        // Committed by a replica that died before numbering it: nobody notifies.
        log.commit([3]);
        assert_eq!(next().await, 3);
        assert_eq!(numberings(), 2, "the poll numbers");
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        pump.abort();
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
            remote: Arc::default(),
            numberings: AtomicUsize::new(0),
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
            remote: Arc::default(),
            numberings: AtomicUsize::new(0),
        });
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        log.commit([1, 2]);
        bus.wake();
        let mut behind = bus.feed_after(0);
        assert_eq!(behind.next().await.unwrap().event.seq, 1);
        assert_eq!(behind.next().await.unwrap().event.seq, 2);
        let mut live = bus.feed_after(2);

        // 3 and 4 are pruned before the pump read them; 5 is committed.
        log.events.lock().unwrap().retain(|e| e.seq > 4);
        log.pruned_through.store(4, Ordering::SeqCst);
        log.commit([5]);
        bus.wake();

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
    fn agent(name: &str) -> AgentId {
        AgentId::from_stored(name.to_owned())
    }

    fn session(name: &str) -> SessionId {
        SessionId::from_stored(name.to_owned())
    }

    /// A routed feed of agent `a` following the given sessions, from now on.
    fn following(bus: &Arc<EventBus>, sessions: &[&str]) -> Feed {
        let mut feed = bus.routed_feed(&agent("a"));
        for s in sessions {
            feed.follow(&session(s));
        }
        feed
    }

    /// The sequence numbers and `agent/session` of the next `n` events of `feed`.
    async fn next_of(feed: &mut Feed, n: usize) -> Vec<(u64, String)> {
        let mut got = Vec::new();
        for _ in 0..n {
            let delivery = feed.next().await.unwrap();
            let key = &delivery.event.call.key;
            got.push((delivery.event.seq, format!("{}/{}", key.agent, key.session)));
        }
        got
    }

    fn at(items: &[(u64, &str)]) -> Vec<(u64, String)> {
        items.iter().map(|(s, k)| (*s, (*k).to_owned())).collect()
    }

    /// A routed feed gets exactly the events of the sessions it follows, in order: live as
    /// they are published, from the store when it starts behind, and a session's from the
    /// moment it follows it. The broadcast still gets every event.
    #[tokio::test(start_paused = true)]
    async fn a_routed_feed_gets_exactly_the_events_of_the_sessions_it_follows() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        let mut published = bus.feed_live();
        log.commit_of(["a/1", "b/1", "a/1"]);
        bus.wake();
        assert_eq!(next_of(&mut published, 3).await.len(), 3, "published");
        let mut a1 = following(&bus, &["1"]);
        let mut a12 = following(&bus, &["1", "2"]);
        let mut b1 = bus.routed_feed(&agent("b"));
        b1.follow(&session("1"));
        let mut a1_from_start = bus.session_feed_after(&agent("a"), &session("1"), 0);
        let mut later = following(&bus, &[]);
        let mut every = bus.feed_live();

        log.commit_of(["b/1", "a/1", "a/2", "c/1", "b/1", "a/1"]);
        bus.wake();
        assert_eq!(next_of(&mut a1, 2).await, at(&[(5, "a/1"), (9, "a/1")]));
        let a12_got = next_of(&mut a12, 3).await;
        assert_eq!(a12_got, at(&[(5, "a/1"), (6, "a/2"), (9, "a/1")]));
        assert_eq!(next_of(&mut b1, 2).await, at(&[(4, "b/1"), (8, "b/1")]));
        let from_start = next_of(&mut a1_from_start, 4).await;
        assert_eq!(
            from_start,
            at(&[(1, "a/1"), (3, "a/1"), (5, "a/1"), (9, "a/1")])
        );
        let seqs: Vec<u64> = next_of(&mut every, 6).await.iter().map(|e| e.0).collect();
        assert_eq!(seqs, [4, 5, 6, 7, 8, 9]);

        // Nothing else is waiting for them: the next event of each is the next of its
        // sessions. `later` follows session 2 only now: what came before is not its.
        later.follow(&session("2"));
        log.commit_of(["c/1", "b/1", "a/2", "a/1"]);
        bus.wake();
        assert_eq!(next_of(&mut a1, 1).await, at(&[(13, "a/1")]));
        assert_eq!(next_of(&mut a12, 2).await, at(&[(12, "a/2"), (13, "a/1")]));
        assert_eq!(next_of(&mut b1, 1).await, at(&[(11, "b/1")]));
        assert_eq!(next_of(&mut later, 1).await, at(&[(12, "a/2")]));
        pump.abort();
    }

    /// A routed feed whose queue overflows (its reader is slower than its sessions' events)
    /// is dropped by the pump; the feed reads the store and goes on: every event of its
    /// sessions once, in order, nothing lost and nothing repeated.
    #[tokio::test(start_paused = true)]
    async fn a_routed_feed_that_falls_behind_catches_up_from_the_store_without_loss() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 16).await.unwrap();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        let mut a = following(&bus, &["1", "2"]);
        let rounds = ROUTED + 10;
        for _ in 0..rounds {
            log.commit_of(["a/1", "b/1", "a/2", "a/3"]);
            bus.wake();
            tokio::task::yield_now().await;
        }
        let last = 4 * rounds as u64;
        let mut every = bus.feed_live();
        log.commit_of(["a/1"]);
        bus.wake();
        assert_eq!(every.next().await.unwrap().event.seq, last + 1);
        let reads_before = log.reads.load(Ordering::SeqCst);
        let got = next_of(&mut a, 2 * rounds + 1).await;
        let mut expected = Vec::new();
        for i in 0..rounds as u64 {
            expected.push((4 * i + 1, "a/1"));
            expected.push((4 * i + 3, "a/2"));
        }
        expected.push((last + 1, "a/1"));
        assert_eq!(got, at(&expected));
        assert!(
            log.reads.load(Ordering::SeqCst) > reads_before,
            "the feed read the store: its queue had overflowed"
        );
        // Live again after catching up, for both sessions.
        log.commit_of(["b/1", "a/2", "a/3", "a/1"]);
        bus.wake();
        let live = next_of(&mut a, 2).await;
        assert_eq!(live, at(&[(last + 3, "a/2"), (last + 5, "a/1")]));
        pump.abort();
    }

    /// A dropped routed feed leaves nothing behind in the bus, whatever it followed.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_routed_feed_leaves_nothing_behind() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 16).await.unwrap();
        let a = following(&bus, &["1", "2"]);
        let a2 = bus.session_feed_after(&agent("a"), &session("1"), 0);
        let mut b = bus.routed_feed(&agent("b"));
        b.follow(&session("1"));
        let followers = |agent_name: &str, session_name: &str| {
            let routes = bus.routes.lock().unwrap();
            routes
                .followers
                .get(&agent(agent_name))
                .and_then(|s| s.get(&session(session_name)))
                .map_or(0, Vec::len)
        };
        assert_eq!((followers("a", "1"), followers("a", "2")), (2, 1));
        drop(a);
        assert_eq!((followers("a", "1"), followers("a", "2")), (1, 0));
        drop((a2, b));
        let routes = bus.routes.lock().unwrap();
        assert!(routes.followers.is_empty() && routes.queues.is_empty());
    }

    /// A routed feed cannot see the pump jump past pruned events among its sessions' events;
    /// it gets the store's refusal all the same, as a broadcast feed does, rather than a gap.
    #[tokio::test(start_paused = true)]
    async fn a_routed_feed_gets_the_refusal_when_the_pump_jumps_past_pruned_events() {
        let log = Log::empty();
        let bus = EventBus::new(log.clone(), 64).await.unwrap();
        let pump = tokio::spawn(Arc::clone(&bus).pump());
        log.commit_of(["a/1", "b/1"]);
        bus.wake();
        let mut a = bus.session_feed_after(&agent("a"), &session("1"), 0);
        assert_eq!(next_of(&mut a, 1).await, at(&[(1, "a/1")]));
        let mut every = bus.feed_after(0);
        assert_eq!(next_of(&mut every, 2).await.len(), 2);

        // 3 (a/1's) and 4 are pruned before the pump read them; 5 (a/1's) is committed.
        log.commit_of(["a/1", "b/1"]);
        log.events.lock().unwrap().clear();
        log.pruned_through.store(4, Ordering::SeqCst);
        log.events.lock().unwrap().push(event_of(5, "a/1"));
        bus.wake();
        let refused = a.next().await.err().expect("refused, not a gap");
        assert!(
            matches!(refused, Error::Pruned { through: 4, .. }),
            "{refused:?}"
        );
        pump.abort();
    }
}
