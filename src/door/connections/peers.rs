//! Who holds the connection places. `--max-connections` alone let one peer take every place:
//! a single unauthenticated address re-opening idle sockets kept a 512-place cap full, and 103
//! of 117 health checks on new connections were refused over 30 s. So, by peer address:
//!
//! - no address holds more than three quarters of the places ([`per_peer_cap`]): a quarter is
//!   always left to everyone else, at no cost to a client that is alone;
//! - when every place is taken, a newcomer from an address holding fewer connections than the
//!   busiest address takes a place of the busiest: that address's newest connection is closed
//!   (the oldest are the likeliest to carry long-lived streams). A few greedy addresses thus
//!   cannot keep a kubelet's health check or another client out either, while connections
//!   from one address (a proxy in front of the broker) are never closed for each other.
//!
//! With authentication on, a connection that has not (yet) carried a valid token is *unvouched*,
//! and the unvouched share a budget smaller than the total ([`per_peer_cap`] again: three
//! quarters): past it, or with every place taken, a newcomer takes the place of an unvouched
//! connection (the busiest address's newest, by the same rule), never of one that authenticated.
//! Many addresses each holding an idle socket (where the rule above, a trade between equals,
//! would close an authenticated agent's connection) thus only ever displace one another, and a
//! quarter of the places stays with the clients that proved who they are. A newcomer that can
//! displace no one is refused. A connection is vouched for by the gate (`auth::Gate`) the
//! first time a request on it authenticates ([`vouch`](super::vouch)); it never goes back.
//!
//! Addresses are compared as IP addresses, ports ignored (an IPv4-mapped IPv6 peer is its IPv4
//! address).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

/// The most connections one address may hold out of `max_connections`: three quarters, rounded
/// up, and at least one.
pub fn per_peer_cap(max_connections: usize) -> usize {
    (max_connections * 3).div_ceil(4).max(1)
}

/// The connections each peer address holds.
pub struct Peers {
    per_peer: usize,
    /// With authentication on, the most places unvouched connections may hold; `None` with it
    /// off (no connection is ever vouched for).
    unvouched_budget: Option<usize>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    by_peer: HashMap<IpAddr, BTreeMap<u64, Arc<Closer>>>,
}

/// Closes one connection from outside it: its next read fails, which ends it. Also says whether
/// a request on it authenticated (see [`vouch`](super::vouch)).
#[derive(Default)]
pub struct Closer {
    closed: AtomicBool,
    vouched: AtomicBool,
    waker: AtomicWaker,
}

impl Closer {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn is_vouched(&self) -> bool {
        self.vouched.load(Ordering::Acquire)
    }

    /// A request on this connection authenticated: it leaves the unvouched budget for good.
    pub fn vouch(&self) {
        self.vouched.store(true, Ordering::Release);
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// An error once the connection was closed to make room for another peer; else registers
    /// `cx` to be woken when it is, and lets the read go on.
    pub fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<io::Error> {
        // Registered before the flag is read again, so a close in between is never missed.
        self.waker.register(cx.waker());
        if !self.closed.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        Poll::Ready(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed to make room for another peer (--max-connections)",
        ))
    }
}

/// A peer's hold on one connection place, given up when dropped.
pub struct Held {
    peers: Arc<Peers>,
    peer: IpAddr,
    id: u64,
    closer: Arc<Closer>,
}

impl Held {
    pub fn closer(&self) -> &Closer {
        &self.closer
    }

    pub fn closer_arc(&self) -> &Arc<Closer> {
        &self.closer
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut state = self.peers.lock();
        if let Some(held) = state.by_peer.get_mut(&self.peer) {
            held.remove(&self.id);
            if held.is_empty() {
                state.by_peer.remove(&self.peer);
            }
        }
    }
}

/// The address connections are counted under: an IPv4-mapped IPv6 address is its IPv4 one.
fn canonical(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    }
}

impl Peers {
    /// `authenticated`: whether the broker takes tokens (only then is anyone vouched for).
    pub fn new(max_connections: usize, authenticated: bool) -> Arc<Self> {
        Arc::new(Self {
            per_peer: per_peer_cap(max_connections),
            unvouched_budget: authenticated.then(|| per_peer_cap(max_connections)),
            state: Mutex::new(State::default()),
        })
    }

    /// Whether the open unvouched connections (a newcomer, already joined, among them) exceed
    /// their budget: one of them must then make room (see [`Self::make_room_for`]).
    pub fn over_unvouched_budget(&self) -> bool {
        let Some(budget) = self.unvouched_budget else {
            return false;
        };
        let state = self.lock();
        let unvouched = state
            .by_peer
            .values()
            .flat_map(BTreeMap::values)
            .filter(|c| !c.is_closed() && !c.is_vouched())
            .count();
        unvouched > budget
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection from `peer`, or `None` when that address holds its share.
    pub fn join(self: &Arc<Self>, peer: IpAddr) -> Option<Held> {
        let peer = canonical(peer);
        let mut state = self.lock();
        let id = state.next_id;
        let held = state.by_peer.entry(peer).or_default();
        if held.len() >= self.per_peer {
            return None;
        }
        let closer = Arc::new(Closer::default());
        held.insert(id, Arc::clone(&closer));
        state.next_id += 1;
        Some(Held {
            peers: Arc::clone(self),
            peer,
            id,
            closer,
        })
    }

    /// Every place is taken, or the unvouched are over their budget, and `peer` (already
    /// joined) wants a place: closes the newest connection of the address holding the most, if
    /// it holds at least as many as `peer` will with this one (so the two at most trade places:
    /// a peer never gains on one busier than itself). With authentication on, only unvouched
    /// connections are counted and closed: an authenticated one is never closed for a
    /// newcomer. Returns whether one was closed (its place comes free once its connection ends).
    pub fn make_room_for(&self, peer: IpAddr) -> bool {
        let peer = canonical(peer);
        let only_unvouched = self.unvouched_budget.is_some();
        // Connections already closed for another newcomer are on their way out: not counted.
        let movable = |c: &&Arc<Closer>| !(c.is_closed() || only_unvouched && c.is_vouched());
        let count = |held: &BTreeMap<u64, Arc<Closer>>| held.values().filter(movable).count();
        let state = self.lock();
        let theirs = state.by_peer.get(&peer).map_or(0, count);
        let busiest = state
            .by_peer
            .iter()
            .filter(|(address, _)| **address != peer)
            .map(|(_, held)| (count(held), held))
            .max_by_key(|(count, _)| *count);
        match busiest {
            // `theirs` counts the newcomer: the two at most trade places.
            Some((count, held)) if count > 0 && count >= theirs => {
                let newest = held.values().rev().find(movable);
                newest.expect("a movable one").close();
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn one_address_holds_at_most_three_quarters_of_the_places() {
        assert_eq!(per_peer_cap(512), 384);
        assert_eq!(per_peer_cap(3), 3);
        assert_eq!(per_peer_cap(1), 1);
        let peers = Peers::new(8, false);
        let held: Vec<_> = (0..6)
            .map(|_| peers.join(ip("10.0.0.1")).unwrap())
            .collect();
        assert!(
            peers.join(ip("10.0.0.1")).is_none(),
            "its share is six of eight"
        );
        assert!(
            peers.join(ip("::ffff:10.0.0.1")).is_none(),
            "the same address mapped into IPv6"
        );
        let other = peers.join(ip("10.0.0.2")).expect("another address gets in");
        drop(held);
        assert!(peers.join(ip("10.0.0.1")).is_some(), "places come back");
        drop(other);
    }

    #[test]
    fn a_newcomer_closes_the_busiest_addresses_newest_connection_never_its_own() {
        let peers = Peers::new(8, false);
        let greedy: Vec<_> = (0..3)
            .map(|_| peers.join(ip("10.0.0.1")).unwrap())
            .collect();
        let other: Vec<_> = (0..2)
            .map(|_| peers.join(ip("10.0.0.2")).unwrap())
            .collect();
        let newcomer = peers.join(ip("10.0.0.3")).unwrap();
        assert!(peers.make_room_for(ip("10.0.0.3")));
        let closed: Vec<bool> = greedy
            .iter()
            .chain(&other)
            .map(|h| h.closer.closed.load(Ordering::Acquire))
            .collect();
        assert_eq!(closed, [false, false, true, false, false]);
        // An address never makes room for itself at another's expense when it is the busiest,
        // and two addresses at most trade places: none gains on one busier than itself.
        let fourth = peers.join(ip("10.0.0.1")).unwrap();
        assert!(!peers.make_room_for(ip("10.0.0.1")), "3 open against 2");
        drop(fourth);
        let second = peers.join(ip("10.0.0.3")).unwrap();
        assert!(peers.make_room_for(ip("10.0.0.3")), "2 against 2: a trade");
        let third = peers.join(ip("10.0.0.3")).unwrap();
        assert!(!peers.make_room_for(ip("10.0.0.3")), "3 against at most 2");
        drop((greedy, other, newcomer, second, third));
    }

    #[test]
    fn with_authentication_on_only_unvouched_connections_make_room_and_they_share_a_budget() {
        let peers = Peers::new(8, true);
        // Two agents that authenticated, from one address each.
        let agents: Vec<_> = ["10.0.1.1", "10.0.1.2"]
            .into_iter()
            .map(|a| peers.join(ip(a)).unwrap())
            .collect();
        agents.iter().for_each(|held| held.closer.vouch());
        // Six idle sockets from six addresses: the whole budget (three quarters of 8).
        let idle: Vec<_> = (1..=6)
            .map(|n| peers.join(ip(&format!("10.0.2.{n}"))).unwrap())
            .collect();
        assert!(!peers.over_unvouched_budget());
        // A seventh from another address is over the budget: it takes an idle socket's place
        // (the two at most trade), never an agent's, though each agent holds as many as it.
        let seventh = peers.join(ip("10.0.2.7")).unwrap();
        assert!(peers.over_unvouched_budget());
        assert!(peers.make_room_for(ip("10.0.2.7")));
        assert!(!peers.over_unvouched_budget(), "one closed, on its way out");
        let closed = |held: &[Held]| held.iter().filter(|h| h.closer.is_closed()).count();
        assert_eq!((closed(&agents), closed(&idle)), (0, 1));
        // With nothing unvouched to close, a newcomer makes no room (it would close an agent).
        let alone = Peers::new(2, true);
        let vouched: Vec<_> = ["10.0.1.1", "10.0.1.2"]
            .into_iter()
            .map(|a| alone.join(ip(a)).unwrap())
            .collect();
        vouched.iter().for_each(|held| held.closer.vouch());
        let newcomer = alone.join(ip("10.0.2.1")).unwrap();
        assert!(!alone.make_room_for(ip("10.0.2.1")));
        assert_eq!(closed(&vouched), 0);
        // With authentication off there is no budget, and anyone's connection may make room.
        let open = Peers::new(2, false);
        let two: Vec<_> = (0..2).map(|_| open.join(ip("10.0.1.1")).unwrap()).collect();
        two.iter().for_each(|held| held.closer.vouch());
        let other = open.join(ip("10.0.2.1")).unwrap();
        assert!(!open.over_unvouched_budget());
        assert!(open.make_room_for(ip("10.0.2.1")));
        drop((seventh, newcomer, other));
    }

    use std::task::Waker;

    #[test]
    fn a_closed_connection_fails_its_pending_read() {
        let closer = Arc::new(Closer::default());
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let waker = Waker::from(Arc::new(Count(Arc::clone(&woken))));
        let mut cx = Context::from_waker(&waker);
        assert!(closer.poll_closed(&mut cx).is_pending());
        closer.close();
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the reader is woken");
        match closer.poll_closed(&mut cx) {
            Poll::Ready(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted),
            Poll::Pending => panic!("still open"),
        }
    }
}
