//! The gRPC surface: one file per service, plus the two translations at the edge (`parse`:
//! protobuf to validated domain values; `render`: domain values to protobuf). Services are thin:
//! parse, call the [`Broker`](crate::broker::Broker), render.

pub mod admin;
pub mod agent;
pub mod approver;
pub mod codec;
mod escalation_messages;
pub mod health;
pub mod observed;
pub mod oversize;
mod paging;
pub mod parse;
mod passkey_messages;
pub mod queue;
pub mod reflection;
mod render;
pub mod replay;
mod shadow_messages;
mod subscribe;
mod webhook_messages;

/// A stream is over for the broker: its client went away, or was told why it ends (it fell
/// behind, the broker drains). Whoever sees it stops working for that stream.
struct StreamOver;

/// GetReceipt's answer: the receipt of `key` as `viewer` may read it, with the key that signs
/// now. Both services serve it (an agent for its own calls, an approver for what it may see).
async fn receipt(
    broker: &crate::broker::Broker,
    key: &crate::domain::CallKey,
    viewer: &crate::domain::Viewer,
) -> Result<tonic::Response<crate::proto::v1::GetReceiptResponse>, tonic::Status> {
    let receipt = broker.receipt(key, viewer).await?;
    Ok(tonic::Response::new(render::receipt_response(
        &receipt,
        broker.receipt_key().as_ref(),
    )))
}

/// ListReceiptKeys' answer, for both services.
fn receipt_keys(
    broker: &crate::broker::Broker,
) -> tonic::Response<crate::proto::v1::ListReceiptKeysResponse> {
    tonic::Response::new(render::receipt_keys(
        broker.receipt_keys(),
        broker.receipt_key().as_ref(),
    ))
}
