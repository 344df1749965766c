//! Receipts signed beside SQLite's writer, not on it. The writer is the one thread every write
//! goes through, and signing a receipt (Ed25519: a scalar multiplication and two SHA-512 passes
//! over the payload) was a sixth of its time at the 64-agent peak. A receipt's chain link is the
//! SHA-256 of the previous *payload*, not of its signature, so the writer can build each payload
//! and move the chain's head at once, hand the signing to this thread, and go on with the rest
//! of its group; it collects the signatures just before the group commits (see
//! `store::sqlite::writer`).
//!
//! Nothing waits for company here either: a payload the signer has not started on when the
//! writer needs its signature is signed by the writer itself, and one the signer is signing is
//! waited for.
//! A group of one write (one call in flight) has nothing to overlap the signing with: its
//! writer holds each payload back ([`Signer::hold`]) and hands it over only once it has another
//! to sign, so its last is signed by the writer at the commit, like any payload the thread has
//! not started on, and a lone write with one receipt never wakes this thread. Ed25519 is
//! deterministic, so who signs never changes a byte of the signature.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

use super::Notary;
use crate::error::{Error, Result};

/// The signing thread's queue. The thread ends when this is dropped.
pub struct Signer {
    notary: Arc<Notary>,
    queue: mpsc::Sender<Arc<Seal>>,
    /// How many payloads were handed to the thread, for the tests of who signs what.
    #[cfg(test)]
    handed: std::sync::atomic::AtomicU64,
}

/// One payload to sign, and where its signature goes.
struct Seal {
    payload: String,
    state: Mutex<State>,
    sealed: Condvar,
}

enum State {
    /// Nobody has started on it.
    Queued,
    /// The signing thread is signing it; `awaited` once the writer waits for it (only then is
    /// the writer woken: a wake-up is a system call whether anyone sleeps or not).
    Signing { awaited: bool },
    /// The signing thread signed it: the signature (base64, as [`Notary::sign`] gives it).
    Sealed(String),
    /// The writer took it to sign itself.
    Taken,
}

/// A payload handed to the signer, or held back: [`Sealing::signature`] gives its signature.
pub struct Sealing {
    seal: Arc<Seal>,
    notary: Arc<Notary>,
    /// Whether the signing thread was given it (see [`Signer::hand_over`]).
    handed: bool,
}

impl Signer {
    /// Starts the signing thread for `notary`'s key.
    pub fn start(notary: Arc<Notary>) -> Result<Self> {
        let (queue, seals) = mpsc::channel::<Arc<Seal>>();
        let key = Arc::clone(&notary);
        thread::Builder::new()
            .name("receipt-signer".into())
            .spawn(move || {
                for seal in seals {
                    seal.sign_queued(&key);
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the receipt signer: {e}")))?;
        Ok(Self {
            notary,
            queue,
            #[cfg(test)]
            handed: Default::default(),
        })
    }

    /// How many payloads were handed to the signing thread so far.
    #[cfg(test)]
    pub fn handed(&self) -> u64 {
        self.handed.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn notary(&self) -> &Arc<Notary> {
        &self.notary
    }

    /// Hands `payload` to the signing thread.
    pub fn sign(&self, payload: String) -> Sealing {
        let mut sealing = self.hold(payload);
        self.hand_over(&mut sealing);
        sealing
    }

    /// Keeps `payload` back: whoever asks for its signature signs it, unless it was handed to
    /// the signing thread first ([`Self::hand_over`]).
    pub fn hold(&self, payload: String) -> Sealing {
        Sealing {
            seal: Arc::new(Seal {
                payload,
                state: Mutex::new(State::Queued),
                sealed: Condvar::new(),
            }),
            notary: Arc::clone(&self.notary),
            handed: false,
        }
    }

    /// Hands a held payload to the signing thread (once: a payload handed over already stays
    /// where it is).
    pub fn hand_over(&self, sealing: &mut Sealing) {
        if std::mem::replace(&mut sealing.handed, true) {
            return;
        }
        // A thread that is gone leaves the seal queued: the writer signs it.
        let _ = self.queue.send(Arc::clone(&sealing.seal));
        #[cfg(test)]
        self.handed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Seal {
    /// On the signing thread: signs the payload unless the writer took it.
    fn sign_queued(&self, notary: &Notary) {
        if self.start_signing() {
            self.sealed_as(notary.sign(&self.payload));
        }
    }

    /// Claims the payload for the signing thread, unless the writer took it.
    fn start_signing(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*state, State::Queued) {
            return false;
        }
        *state = State::Signing { awaited: false };
        true
    }

    /// The signing thread's signature; the writer is woken if it waits for it.
    fn sealed_as(&self, signature: String) {
        let before = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(PoisonError::into_inner),
            State::Sealed(signature),
        );
        if matches!(before, State::Signing { awaited: true }) {
            self.sealed.notify_all();
        }
    }
}

impl Sealing {
    /// The payload being sealed.
    pub fn payload(&self) -> &str {
        &self.seal.payload
    }

    /// The id of the key it is sealed with.
    pub fn key_id(&self) -> &str {
        self.notary.key_id()
    }

    /// The signature: the signing thread's, waited for if it is being signed, or signed here if
    /// the thread has not started on it.
    pub fn signature(self) -> String {
        let mut state = self
            .seal
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            match std::mem::replace(&mut *state, State::Taken) {
                State::Queued => {
                    drop(state);
                    return self.notary.sign(&self.seal.payload);
                }
                State::Sealed(signature) => return signature,
                State::Signing { .. } => {
                    *state = State::Signing { awaited: true };
                    state = self
                        .seal
                        .sealed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                State::Taken => unreachable!("a signature is taken once"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notary() -> Arc<Notary> {
        Arc::new(Notary::from_seed(&[7; 32]).unwrap())
    }

    /// A signer whose queue nobody takes from, and that queue's receiving end.
    fn without_thread(notary: &Arc<Notary>) -> (Signer, mpsc::Receiver<Arc<Seal>>) {
        let (queue, seals) = mpsc::channel();
        let signer = Signer {
            notary: Arc::clone(notary),
            queue,
            handed: Default::default(),
        };
        (signer, seals)
    }

    fn payloads(n: usize) -> Vec<String> {
        (0..n).map(|i| format!(r#"{{"receipt":{i}}}"#)).collect()
    }

    #[test]
    fn signatures_are_the_notarys_whoever_signs_them() {
        let notary = notary();
        let signer = Signer::start(Arc::clone(&notary)).unwrap();
        let payloads = payloads(200);
        // Handed over all at once, then collected: the thread signs some, the caller the rest.
        let sealings: Vec<Sealing> = payloads.iter().map(|p| signer.sign(p.clone())).collect();
        for (payload, sealing) in payloads.iter().zip(sealings) {
            assert_eq!(sealing.signature(), notary.sign(payload));
        }
        // One at a time, each collected at once (one call in flight).
        for payload in &payloads[..20] {
            assert_eq!(
                signer.sign(payload.clone()).signature(),
                notary.sign(payload)
            );
        }
    }

    /// A held payload never reaches the thread: it is signed by whoever asks for it.
    /// Handed over, it is queued once, however often it is handed over.
    #[test]
    fn a_held_payload_is_signed_by_its_collector_and_handed_over_once() {
        let notary = notary();
        let (signer, seals) = without_thread(&notary);
        let payloads = payloads(2);
        let held = signer.hold(payloads[0].clone());
        let mut handed = signer.hold(payloads[1].clone());
        signer.hand_over(&mut handed);
        signer.hand_over(&mut handed);
        assert_eq!(signer.handed(), 1);
        assert_eq!(seals.try_iter().count(), 1, "queued once");
        assert_eq!(held.signature(), notary.sign(&payloads[0]));
        assert_eq!(handed.signature(), notary.sign(&payloads[1]));
    }

    #[test]
    fn the_thread_signs_what_nobody_collects_yet() {
        let notary = notary();
        let signer = Signer::start(Arc::clone(&notary)).unwrap();
        let payload = payloads(1).remove(0);
        let sealing = signer.sign(payload.clone());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !matches!(*sealing.seal.state.lock().unwrap(), State::Sealed(_)) {
            assert!(
                std::time::Instant::now() < deadline,
                "never sealed by the thread"
            );
            thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(sealing.signature(), notary.sign(&payload));
    }

    #[test]
    fn a_writer_waiting_for_the_signature_being_made_is_woken_with_it() {
        let notary = notary();
        let (signer, seals) = without_thread(&notary);
        let payload = payloads(1).remove(0);
        let sealing = signer.sign(payload.clone());
        let seal = seals.try_recv().unwrap();
        assert!(seal.start_signing());
        let (done, signature) = mpsc::channel();
        thread::spawn(move || done.send(sealing.signature()).unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !matches!(
            *seal.state.lock().unwrap(),
            State::Signing { awaited: true }
        ) {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never waited"
            );
            thread::sleep(std::time::Duration::from_millis(1));
        }
        seal.sealed_as(notary.sign(&payload));
        let signature = signature
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the waiting writer was not woken");
        assert_eq!(signature, notary.sign(&payload));
    }

    #[test]
    fn without_its_thread_the_caller_signs() {
        let notary = notary();
        let (signer, seals) = without_thread(&notary);
        drop(seals);
        let payload = payloads(1).remove(0);
        assert_eq!(
            signer.sign(payload.clone()).signature(),
            notary.sign(&payload)
        );
    }
}
