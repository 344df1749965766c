//! ApproverService/ListPending: a malformed listing is refused naming the field; filters full of
//! quotes, `%`, `_` and SQL fragments are valid and match literally. (`page_size` is a `uint32`: a
//! negative size cannot be sent.)

use approval_broker::proto::v1 as pb;

use super::table::*;
use crate::helpers::*;

fn list_pending(name: &'static str, request: pb::ListPendingRequest, expect: Expect) -> Case {
    case(name, expect, move |channel| {
        let request = request.clone();
        async move {
            match ApproverServiceClient::new(channel)
                .list_pending(request)
                .await
            {
                Ok(response) => Got::Listed(listed(&response.into_inner().calls)),
                Err(status) => Got::Status(status),
            }
        }
    })
}

fn pending_where(filter: pb::CallFilter) -> pb::ListPendingRequest {
    pb::ListPendingRequest {
        filter: Some(filter),
        ..Default::default()
    }
}

fn page(size: u32, token: &str) -> pb::ListPendingRequest {
    pb::ListPendingRequest {
        filter: None,
        page_size: size,
        page_token: token.into(),
    }
}

pub(super) fn list_pending_cases() -> Vec<Case> {
    vec![
        list_pending(
            "list_pending: page size 1001",
            page(1001, ""),
            invalid("page_size"),
        ),
        list_pending(
            "list_pending: page size u32::MAX",
            page(u32::MAX, ""),
            invalid("page_size"),
        ),
        list_pending(
            "list_pending: forged token `garbage`",
            page(10, "garbage"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token `v1.-1`",
            page(10, "v1.-1"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token beyond i64",
            page(10, "v1.9223372036854775808"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token `v2.5`",
            page(10, "v2.5"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: forged token with a trailing space",
            page(10, "v1.5 "),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: token that is an SQL fragment",
            page(10, "v1.0 OR 1=1"),
            invalid("page_token"),
        ),
        list_pending(
            "list_pending: a well-formed token past the end lists nothing (valid)",
            page(10, &format!("v1.{}", i64::MAX)),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: filter session id with a tab",
            pending_where(filter(|f| f.session_id = "\tseed".into())),
            invalid("filter.session_id"),
        ),
        list_pending(
            "list_pending: filter workspace with NUL",
            pending_where(filter(|f| f.workspace = "\0".into())),
            invalid("filter.workspace"),
        ),
        list_pending(
            "list_pending: filter agent of 257 bytes",
            pending_where(filter(|f| f.agent = "a".repeat(257))),
            invalid("filter.agent"),
        ),
        list_pending(
            "list_pending: quotes, `%` and `_` in the workspace match literally (valid)",
            pending_where(filter(|f| f.workspace = TRICKY.into())),
            Expect::Lists(&["tricky/w1"]),
        ),
        list_pending(
            "list_pending: workspace `%` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: workspace `_` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "_".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: workspace prefix with `%` matches nothing (valid)",
            pending_where(filter(|f| f.workspace = "it's%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: session id `' OR '1'='1` matches nothing (valid)",
            pending_where(filter(|f| f.session_id = "seed' OR '1'='1".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: tool with `%` and `_` matches itself only (valid)",
            pending_where(filter(|f| f.tool = PCT_TOOL.into())),
            Expect::Lists(&["pct/p1"]),
        ),
        list_pending(
            "list_pending: tool `50%` matches nothing (valid)",
            pending_where(filter(|f| f.tool = "50%".into())),
            Expect::Lists(&[]),
        ),
        list_pending(
            "list_pending: tool `' OR 1=1 --` matches nothing (valid)",
            pending_where(filter(|f| f.tool = "' OR 1=1 --".into())),
            Expect::Lists(&[]),
        ),
    ]
}

/// ListPending.
async fn a_malformed_list_pending_is_refused_naming_its_field_and_odd_filters_match_literally(
    app: TestApp,
) {
    refuses_every_case(&app, |_| list_pending_cases()).await;
}

backend_tests! {
    a_malformed_list_pending_is_refused_naming_its_field_and_odd_filters_match_literally => crate::bad_input::table::small_limits,
}
