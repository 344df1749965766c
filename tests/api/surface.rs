//! The served surface: health for every service, and reflection v1 and v1alpha (grpcurl 1.8
//! speaks only v1alpha) listing the broker's services and health.

use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::helpers::*;

async fn health_reports_serving_for_the_server_and_each_service(app: TestApp) {
    let mut health = HealthClient::new(app.channel.clone());
    for service in [
        "",
        "approvals.v1.AgentService",
        "approvals.v1.ApproverService",
        "approvals.v1.AdminService",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
}

const EXPECTED: [&str; 4] = [
    "approvals.v1.AdminService",
    "approvals.v1.AgentService",
    "approvals.v1.ApproverService",
    "grpc.health.v1.Health",
];

/// Reads the next reflection response of `$responses` (a stream of reflection `$version`, `v1` or
/// `v1alpha`: the same messages in two generated modules, hence a macro) and asserts it is the
/// service list and names every service of [`EXPECTED`].
macro_rules! assert_lists_every_service {
    ($version:ident, $responses:expr) => {{
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        let Some(MessageResponse::ListServicesResponse(list)) = $responses
            .next()
            .await
            .expect("a response")
            .expect("ok")
            .message_response
        else {
            panic!("expected the service list");
        };
        let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
        for expected in EXPECTED {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
    }};
}

#[tokio::test]
async fn reflection_v1alpha_lists_every_service_and_resolves_their_files() {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let app = spawn_app().await;
    let mut client = ServerReflectionClient::new(app.channel.clone());
    let mut requests = vec![ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }];
    for service in EXPECTED {
        requests.push(ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(service.into())),
        });
    }
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection")
        .into_inner();
    assert_lists_every_service!(v1alpha, responses);
    for service in EXPECTED {
        let response = responses.next().await.expect("a response").expect("ok");
        assert!(
            matches!(response.message_response, Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
            "{service}: {:?}",
            response.message_response
        );
    }
}

#[tokio::test]
async fn reflection_v1_lists_every_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let app = spawn_app().await;
    let mut client = ServerReflectionClient::new(app.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    assert_lists_every_service!(v1, responses);
}

backend_tests! {
    health_reports_serving_for_the_server_and_each_service,
}
