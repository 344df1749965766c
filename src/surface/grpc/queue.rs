//! A server stream's bounded queue of messages, with the stream's final status kept beside it
//! rather than in it.
//!
//! A stream that ends with an error (a subscriber that fell behind, the broker shutting down)
//! must tell the client why, however long the client leaves its HTTP/2 window closed. Sending
//! that status through the message queue would wait for room the client may never make, and
//! a timeout on that wait would drop the stream as if it had ended well (`grpc-status: 0`).
//! Here the producer sets the status without waiting and goes away; the stream yields the
//! messages already queued, then the status, which travels in the trailers. The slot the stream
//! counts against is held until the client's stream itself is dropped, so a client that stops
//! reading keeps counting against the cap while its queued messages are held.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::door::stream_slots::StreamSlot;

/// A queue of at most `capacity` messages, and its final status.
pub fn channel<T>(capacity: usize, slot: StreamSlot) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let (end_tx, end_rx) = oneshot::channel();
    (
        Sender {
            tx,
            end: Some(end_tx),
        },
        Receiver {
            rx,
            end: Some(end_rx),
            _slot: slot,
        },
    )
}

/// The producer's side.
pub struct Sender<T> {
    tx: mpsc::Sender<Result<T, Status>>,
    end: Option<oneshot::Sender<Status>>,
}

/// The client's queue is closed: it went away.
#[derive(Debug)]
pub struct Closed;

/// The queue has no room for one more message.
#[derive(Debug)]
pub enum Full {
    Full,
    Closed,
}

impl<T> Sender<T> {
    /// Queues a message, waiting for room.
    pub async fn send(&self, message: T) -> Result<(), Closed> {
        self.tx.send(Ok(message)).await.map_err(|_| Closed)
    }

    /// Queues a message if there is room now.
    pub fn try_send(&self, message: T) -> Result<(), Full> {
        self.tx.try_send(Ok(message)).map_err(|err| match err {
            mpsc::error::TrySendError::Full(_) => Full::Full,
            mpsc::error::TrySendError::Closed(_) => Full::Closed,
        })
    }

    /// How many messages the queue holds at most.
    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    /// Resolves when the client's side is gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Ends the stream with `status`, after the messages already queued, without waiting for
    /// the client. Only the first status counts; nothing queued afterwards is sent.
    pub fn end(&mut self, status: Status) {
        if let Some(end) = self.end.take() {
            let _ = end.send(status);
        }
    }
}

/// The stream tonic sends: the queued messages, then the final status if one was set.
pub struct Receiver<T> {
    rx: mpsc::Receiver<Result<T, Status>>,
    end: Option<oneshot::Receiver<Status>>,
    _slot: StreamSlot,
}

impl<T> tokio_stream::Stream for Receiver<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(end) = this.end.as_mut() else {
            return Poll::Ready(None);
        };
        // A status set means the producer is done: what is queued goes first, then the status.
        if let Some(message) = ready!(this.rx.poll_recv(cx)) {
            return Poll::Ready(Some(message));
        }
        // Every producer is gone, so the status is either set or never will be.
        let status = ready!(Pin::new(end).poll(cx)).ok();
        this.end = None;
        Poll::Ready(status.map(Err))
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt as _;

    use super::*;
    use crate::door::stream_slots::StreamSlots;
    use crate::observe::meters::StreamKind;

    fn slot() -> StreamSlot {
        StreamSlots::new(
            StreamKind::Subscriber,
            "subscribers",
            "--max-subscribers",
            1,
        )
        .take()
        .unwrap()
    }

    /// The final status is set while the queue is full and nobody reads: the producer does not
    /// wait, and the reader, whenever it comes, gets every queued message and then the status.
    #[tokio::test]
    async fn the_final_status_follows_the_queued_messages_even_when_set_on_a_full_queue() {
        let (mut tx, mut rx) = channel::<u32>(2, slot());
        tx.send(1).await.unwrap();
        tx.try_send(2).unwrap();
        assert!(matches!(tx.try_send(3), Err(Full::Full)));
        tx.end(Status::resource_exhausted("behind"));
        drop(tx);
        assert_eq!(rx.next().await.unwrap().unwrap(), 1);
        assert_eq!(rx.next().await.unwrap().unwrap(), 2);
        let status = rx.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stream_ended_without_a_status_ends_after_its_messages() {
        let (tx, mut rx) = channel::<u32>(2, slot());
        tx.send(1).await.unwrap();
        drop(tx);
        assert_eq!(rx.next().await.unwrap().unwrap(), 1);
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn the_slot_is_held_until_the_clients_stream_is_dropped() {
        let slots = StreamSlots::new(
            StreamKind::Subscriber,
            "subscribers",
            "--max-subscribers",
            1,
        );
        let (mut tx, rx) = channel::<u32>(1, slots.take().unwrap());
        tx.end(Status::unavailable("stopping"));
        drop(tx);
        assert_eq!(slots.open(), 1, "the client has not read its status yet");
        drop(rx);
        assert_eq!(slots.open(), 0);
    }
}
