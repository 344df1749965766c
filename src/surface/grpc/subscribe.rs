//! Subscribe's stream, for ApproverService (`approver.rs`): a snapshot of the pending calls the
//! subscriber may see, then every event after it, filtered the same way.
//!
//! A subscriber's stream has a bounded queue. Catch-up (snapshot pages, events after a cursor)
//! waits for the client; a live event that finds the queue full ends the stream with
//! RESOURCE_EXHAUSTED naming the last sequence number queued, so the UI resumes from there:
//! never a silent drop, never unbounded memory. That status, and the one a shutdown ends the
//! stream with, travel beside the queue (see [`queue`]): however long the client leaves its
//! window closed, it gets every queued event and then the status, with the resume position in
//! the `approvals-last-seq` trailer.

use std::sync::Arc;

use tonic::Status;
use tonic::metadata::MetadataValue;

use super::approver::LAST_SEQ_TRAILER;
use super::queue::{self, Full};
use super::{StreamOver, render};
use crate::background::events::Feed;
use crate::broker::Broker;
use crate::domain::{CallQuery, EventKind, Status as CallStatus, Viewer};
use crate::observe::meters;
use crate::proto::v1 as pb;
use crate::proto::v1::approver_event::Event as E;

pub(super) struct Subscriber {
    pub(super) broker: Arc<Broker>,
    /// Who subscribed: calls they may not see (their groups may not decide them) are left out
    /// of the snapshot and the events alike.
    pub(super) viewer: Viewer,
    pub(super) filter: CallQuery,
    pub(super) out: queue::Sender<pb::ApproverEvent>,
    /// The sequence number of the last event queued for the client.
    pub(super) last_queued: u64,
}

impl Subscriber {
    pub(super) async fn run(mut self, with_snapshot: bool) {
        let snapshot_seq = self.last_queued;
        if with_snapshot && self.send_snapshot(snapshot_seq).await.is_err() {
            return;
        }
        let mut feed = self.broker.bus().feed_after(snapshot_seq);
        let _ = self.follow(&mut feed).await;
    }

    /// Every pending call that matches, as of `seq`, then the marker.
    async fn send_snapshot(&mut self, seq: u64) -> Result<(), StreamOver> {
        let mut query = self.filter.clone();
        query.statuses = vec![CallStatus::Pending];
        query.requested_at_or_before = Some(seq);
        query.limit = 256;
        let mut pending = 0u64;
        loop {
            let page = match self.broker.list_calls(&query).await {
                Ok(page) => page,
                Err(err) => return self.fail(err.into()),
            };
            let viewer = self.viewer.clone();
            for call in page.calls.iter().filter(|c| c.visible_to(&viewer)) {
                pending += 1;
                self.queue(seq, E::Snapshot(render::call(call))).await?;
            }
            match page.next {
                Some(cursor) => query.after = Some(cursor),
                None => break,
            }
        }
        self.queue(seq, E::SnapshotComplete(pb::SnapshotComplete { pending }))
            .await
    }

    async fn follow(&mut self, feed: &mut Feed) -> Result<(), StreamOver> {
        let broker = Arc::clone(&self.broker);
        loop {
            let delivery = tokio::select! {
                delivery = feed.next() => delivery,
                _ = self.out.closed() => return Err(StreamOver),
                _ = broker.stopping() => {
                    let status = self.resume_status(tonic::Code::Unavailable, format!(
                        "the broker is shutting down; resume with after_seq={}",
                        self.last_queued
                    ));
                    return self.fail(status);
                }
            };
            let delivery = match delivery {
                Ok(delivery) => delivery,
                Err(err) => return self.fail(err.into()),
            };
            let event = &delivery.event;
            if !self.filter.matches(&event.call) || !event.call.visible_to(&self.viewer) {
                continue;
            }
            let item = match event.kind {
                EventKind::Requested => E::Requested(render::call(&event.call)),
                EventKind::Resolved => match render::outcome_unsealed(&event.call) {
                    Some(outcome) => E::Resolved(outcome),
                    None => continue,
                },
                EventKind::Reminded | EventKind::Escalated => {
                    match super::escalation_messages::fired(event) {
                        Some(fired) => E::Escalation(fired),
                        None => continue,
                    }
                }
                EventKind::ApprovalRecorded => E::ApprovalRecorded(render::call(&event.call)),
            };
            if delivery.live {
                self.offer(event.seq, item).await?;
            } else {
                self.queue(event.seq, item).await?;
            }
        }
    }

    fn message(seq: u64, event: E) -> pb::ApproverEvent {
        pb::ApproverEvent {
            seq,
            event: Some(event),
        }
    }

    /// Queues an item, waiting for room (catch-up reads pace themselves to the client).
    async fn queue(&mut self, seq: u64, event: E) -> Result<(), StreamOver> {
        meters::subscriber_lag(self.broker.bus().published().saturating_sub(seq));
        self.out
            .send(Self::message(seq, event))
            .await
            .map_err(|_| StreamOver)?;
        self.last_queued = seq;
        Ok(())
    }

    /// Queues a live item if there is room; otherwise the subscriber has fallen too far behind.
    async fn offer(&mut self, seq: u64, event: E) -> Result<(), StreamOver> {
        meters::subscriber_lag(self.broker.bus().published().saturating_sub(seq));
        match self.out.try_send(Self::message(seq, event)) {
            Ok(()) => {
                self.last_queued = seq;
                Ok(())
            }
            Err(Full::Closed) => Err(StreamOver),
            Err(Full::Full) => {
                let status = self.resume_status(
                    tonic::Code::ResourceExhausted,
                    format!(
                        "subscriber fell behind: {} events were waiting to be read; \
                         resume with after_seq={}",
                        self.out.capacity(),
                        self.last_queued
                    ),
                );
                tracing::info!(
                    last_seq = self.last_queued,
                    "ending a subscriber that fell behind"
                );
                self.fail(status)
            }
        }
    }

    /// A status ending the stream, with the position to resume from in the
    /// [`LAST_SEQ_TRAILER`] (the message says it too, for people reading it).
    fn resume_status(&self, code: tonic::Code, message: String) -> Status {
        let mut status = Status::new(code, message);
        if let Ok(value) = MetadataValue::try_from(self.last_queued.to_string()) {
            status.metadata_mut().insert(LAST_SEQ_TRAILER, value);
        }
        status
    }

    /// Ends the stream with `status`, after the events already queued. It does not wait for
    /// the client: the status is kept beside the queue until the client reads it, however long
    /// that takes.
    fn fail(&mut self, status: Status) -> Result<(), StreamOver> {
        self.out.end(status);
        Err(StreamOver)
    }
}
