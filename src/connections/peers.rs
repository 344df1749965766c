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
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    by_peer: HashMap<IpAddr, BTreeMap<u64, Arc<Closer>>>,
}

/// Closes one connection from outside it: its next read fails, which ends it.
#[derive(Default)]
pub struct Closer {
    closed: AtomicBool,
    waker: AtomicWaker,
}

impl Closer {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
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
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            per_peer: per_peer_cap(max_connections),
            state: Mutex::new(State::default()),
        })
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

    /// Every place is taken and `peer` (already joined) wants one: closes the newest connection
    /// of the address holding the most, if it holds at least as many as `peer` will with this
    /// one (so the two at most trade places: a peer never gains on one busier than itself).
    /// Returns whether one was closed (its place comes free once its connection ends).
    pub fn make_room_for(&self, peer: IpAddr) -> bool {
        let peer = canonical(peer);
        // Connections already closed for another newcomer are on their way out: not counted.
        let open =
            |held: &BTreeMap<u64, Arc<Closer>>| held.values().filter(|c| !c.is_closed()).count();
        let state = self.lock();
        let theirs = state.by_peer.get(&peer).map_or(0, open);
        let busiest = state
            .by_peer
            .iter()
            .filter(|(address, _)| **address != peer)
            .map(|(_, held)| (open(held), held))
            .max_by_key(|(count, _)| *count);
        match busiest {
            // `theirs` counts the newcomer: the two at most trade places.
            Some((count, held)) if count > 0 && count >= theirs => {
                let newest = held.values().rev().find(|c| !c.is_closed());
                newest.expect("an open one").close();
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
        let peers = Peers::new(8);
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
        let peers = Peers::new(8);
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
