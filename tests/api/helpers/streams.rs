//! The long-lived streams a test holds open (`Connect`, `Subscribe`, `WatchOutcomes`), read one
//! message at a time; waiting for a message fails the test after [`PATIENCE`], never hangs it.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::PATIENCE;
use super::spawn::TestApp;

/// A `WatchOutcomes` stream of `session` (all its calls, or the named ones).
pub async fn watch(
    app: &TestApp,
    session: &str,
    call_ids: &[&str],
) -> tonic::Streaming<pb::WatchOutcomesResponse> {
    app.agent()
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: session.into(),
            call_ids: call_ids.iter().map(|s| s.to_string()).collect(),
        })
        .await
        .expect("watch outcomes")
        .into_inner()
}

/// An open `Connect` stream.
pub struct AgentStream {
    requests: mpsc::Sender<pb::AgentRequest>,
    responses: Streaming<pb::AgentResponse>,
}

impl AgentStream {
    pub async fn open(app: &TestApp) -> AgentStream {
        let (requests, rx) = mpsc::channel(64);
        let responses = app
            .agent()
            .connect(ReceiverStream::new(rx))
            .await
            .expect("connect")
            .into_inner();
        AgentStream {
            requests,
            responses,
        }
    }

    pub async fn send(&self, request_id: &str, request: pb::agent_request::Request) {
        self.requests
            .send(pb::AgentRequest {
                request_id: request_id.into(),
                request: Some(request),
            })
            .await
            .expect("stream open");
    }

    pub async fn send_raw(&self, request: pb::AgentRequest) {
        self.requests.send(request).await.expect("stream open");
    }

    pub async fn submit(&self, request_id: &str, batch: pb::BatchSpec) {
        self.send(request_id, pb::agent_request::Request::Submit(batch))
            .await;
    }

    /// The next response; fails the test after [`PATIENCE`].
    pub async fn next(&mut self) -> pb::agent_response::Response {
        let message = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        message.response.expect("a response")
    }

    /// The next response with its request id.
    pub async fn next_with_id(&mut self) -> (String, pb::agent_response::Response) {
        let message = tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        (message.request_id, message.response.expect("a response"))
    }

    /// Whether nothing arrives within `wait`.
    pub async fn is_quiet_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.responses.message())
            .await
            .is_err()
    }

    /// The acknowledgements of the next `submitted` response.
    pub async fn next_submitted(&mut self) -> pb::SubmitResponse {
        match self.next().await {
            pb::agent_response::Response::Submitted(s) => s,
            other => panic!("expected acknowledgements, got {other:?}"),
        }
    }

    pub async fn next_outcome(&mut self) -> pb::Outcome {
        match self.next().await {
            pb::agent_response::Response::Outcome(o) => o,
            other => panic!("expected an outcome, got {other:?}"),
        }
    }

    pub async fn next_batch_complete(&mut self) -> pb::BatchComplete {
        match self.next().await {
            pb::agent_response::Response::BatchComplete(b) => b,
            other => panic!("expected batch-complete, got {other:?}"),
        }
    }
}

/// An open `Subscribe` stream.
pub struct Subscription {
    pub stream: Streaming<pb::ApproverEvent>,
}

impl Subscription {
    pub async fn open(
        app: &TestApp,
        filter: pb::CallFilter,
        after_seq: Option<u64>,
    ) -> Subscription {
        let stream = app
            .approver()
            .subscribe(pb::SubscribeRequest {
                filter: Some(filter),
                after_seq,
            })
            .await
            .expect("subscribe")
            .into_inner();
        Subscription { stream }
    }

    pub async fn next(&mut self) -> pb::ApproverEvent {
        tokio::time::timeout(PATIENCE, self.stream.message())
            .await
            .expect("an event in time")
            .expect("stream healthy")
            .expect("stream open")
    }

    /// Reads until the snapshot marker; returns the snapshot's calls and its sequence number.
    pub async fn snapshot(&mut self) -> (Vec<pb::Call>, u64) {
        let mut calls = Vec::new();
        loop {
            let event = self.next().await;
            match event.event {
                Some(pb::approver_event::Event::Snapshot(call)) => calls.push(call),
                Some(pb::approver_event::Event::SnapshotComplete(done)) => {
                    assert_eq!(done.pending as usize, calls.len());
                    return (calls, event.seq);
                }
                other => panic!("expected the snapshot, got {other:?}"),
            }
        }
    }
}
