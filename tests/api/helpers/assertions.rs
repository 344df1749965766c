//! Assertions shared by several areas: a refusal's code and the field it names, and that an
//! adversarial request does not stall an unrelated one.

use tonic::Code;

use super::clients::{CallStatus, ack_status, submit};
use super::requests::{batch, call};
use super::spawn::TestApp;

/// Asserts a gRPC error's code and that its message names `field`.
pub fn assert_status(result: Result<impl std::fmt::Debug, tonic::Status>, code: Code, field: &str) {
    match result {
        Ok(value) => panic!("expected {code:?} naming `{field}`, got {value:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().contains(field),
                "`{}` should name `{field}`",
                status.message()
            );
        }
    }
}

/// Times a one-call submit of an unrelated session sent while `behind` is being judged, and
/// asserts it was answered (pending) within three seconds: "not stalled", as opposed to the many
/// seconds a quadratic matcher on the writer took (about 8 s for these inputs in release, more in
/// debug). A second was too close to a loaded debug build's commit of the batch before it.
pub async fn assert_an_unrelated_submit_is_not_stalled(app: &TestApp, behind: &str) {
    let started = std::time::Instant::now();
    let unrelated = submit(
        app,
        batch("unrelated", vec![call("c1", "t", r#"{"x":"a"}"#)]),
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(ack_status(&unrelated, 0), CallStatus::Pending);
    assert!(
        waited < std::time::Duration::from_secs(3),
        "an unrelated submit waited {waited:?} behind the adversarial {behind}"
    );
}
