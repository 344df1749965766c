//! What the gateway lets through to the MCP library at all: every message the client sends is
//! screened here, as raw JSON, before the library types it. The library types what it can and
//! puts everything else (a `tools/call` whose `requestState` is a number, an unknown method)
//! into a catch-all "custom" request, which a relay would pass on as it is; and what it cannot
//! type at all it answers with no id (standard I/O) or with an HTTP error and no JSON-RPC reply
//! (Streamable HTTP), or not at all. So the gateway decides first, deny-by-default:
//!
//! - a request passes only when its method is one the gateway knows to be free of side effects
//!   ([`RequestRoute::Relay`]) or is `tools/call` ([`RequestRoute::Review`], which only the
//!   reviewed path handles), and the library types it as that very method; a `tools/call` must
//!   moreover hold only `name` (a string), `arguments` (an object) and `_meta` (an object);
//! - every other request gets a JSON-RPC error reply carrying its id (-32601 for a method the
//!   gateway does not relay, -32602 for params it cannot read, -32600 for a message that is not
//!   a JSON-RPC 2.0 request, -32700 for text that is not JSON); nothing of it goes on;
//! - a batch (a JSON array; MCP dropped batches in 2025-06-18) is refused as a whole, each
//!   request of it answered with its own error;
//! - a notification passes only when it is one of the four a client sends and the library types
//!   it as such; any other is dropped and logged (a notification cannot be answered);
//! - a response (the client answering the server's sampling, elicitation or `roots/list`
//!   request) passes: the library matches it to the request it answers, or drops it.

use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage};
use serde_json::{Map, Value, json};

/// JSON-RPC's error codes, as the gateway uses them.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// What the gateway does with a request of a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestRoute {
    /// Answered by the gateway or relayed to the server as it is: the method only reads, or
    /// changes nothing but what this session is sent.
    Relay,
    /// `tools/call`: submitted to the broker, run only when APPROVED.
    Review,
}

/// The methods of requests the gateway relays. Each reads, or sets what the server sends this
/// session (`logging/setLevel`, resource subscriptions); none runs anything the model chose. A
/// server may still do what it likes when asked to read: `resources/read` and `prompts/get` are
/// reads by the protocol's definition, and the gateway reviews only `tools/call`.
const RELAYED_REQUESTS: [&str; 12] = [
    "initialize",
    "ping",
    "tools/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
];

/// The notifications a client sends that the gateway passes on: the end of the handshake, a
/// cancellation (which only stops things), progress on a server's request, and a change of the
/// client's roots (the server then asks for them through the gateway).
const PASSED_NOTIFICATIONS: [&str; 4] = [
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// The fields a `tools/call` may hold. The library knows others (`requestState`,
/// `inputResponses`, of a protocol revision the gateway does not speak) and ignores unknown
/// ones; the approver sees only the name and the arguments, so nothing else may come along.
const TOOL_CALL_FIELDS: [&str; 3] = ["name", "arguments", "_meta"];

/// The route of a request method; `None` for every method the gateway does not relay.
pub fn request_route(method: &str) -> Option<RequestRoute> {
    if method == "tools/call" {
        Some(RequestRoute::Review)
    } else if RELAYED_REQUESTS.contains(&method) {
        Some(RequestRoute::Relay)
    } else {
        None
    }
}

/// Whether a client notification of this method is passed on.
pub fn notification_passes(method: &str) -> bool {
    PASSED_NOTIFICATIONS.contains(&method)
}

/// What becomes of one message (one line on standard I/O, one HTTP request body).
#[derive(Debug)]
pub enum Screened {
    /// The library gets it, typed exactly as screened.
    Pass(Box<ClientJsonRpcMessage>),
    /// Nothing goes on; the client gets this reply (one error response, or an array of them
    /// for a batch).
    Refuse(Value),
    /// Nothing goes on and nothing can be answered (a notification, or a batch of them).
    Drop(String),
}

/// Screens one message as it came.
pub fn screen_bytes(raw: &[u8]) -> Screened {
    let raw = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
    match serde_json::from_slice::<Value>(raw) {
        Ok(value) => screen(value),
        Err(error) => Screened::Refuse(error_reply(
            &Value::Null,
            PARSE_ERROR,
            format!(
                "The approval gateway could not read this message as JSON ({error}); nothing was \
                 sent to the MCP server."
            ),
        )),
    }
}

/// Screens one parsed message.
pub fn screen(value: Value) -> Screened {
    match value {
        Value::Array(batch) => screen_batch(batch),
        Value::Object(message) => screen_message(message),
        other => Screened::Refuse(error_reply(
            &Value::Null,
            INVALID_REQUEST,
            format!(
                "The approval gateway takes one JSON-RPC 2.0 message, a JSON object; this is {}. \
                 Nothing was sent to the MCP server.",
                kind(&other)
            ),
        )),
    }
}

/// Every request of a batch gets its own error; nothing of it goes on.
fn screen_batch(batch: Vec<Value>) -> Screened {
    let text = "The approval gateway does not accept JSON-RPC batches (MCP removed them in its \
                2025-06-18 revision): send each message on its own. Nothing in this batch was \
                sent to the MCP server.";
    if batch.is_empty() {
        return Screened::Refuse(error_reply(&Value::Null, INVALID_REQUEST, text.to_owned()));
    }
    let replies: Vec<Value> = batch
        .iter()
        .filter_map(|member| {
            let id = member.get("id")?;
            Some(error_reply(&reply_id(id), INVALID_REQUEST, text.to_owned()))
        })
        .collect();
    if replies.is_empty() {
        Screened::Drop(format!(
            "a batch of {} notifications (batches are refused)",
            batch.len()
        ))
    } else {
        Screened::Refuse(Value::Array(replies))
    }
}

fn screen_message(message: Map<String, Value>) -> Screened {
    let id = message.get("id").map(reply_id);
    let refuse = |code: i64, text: String| {
        Screened::Refuse(error_reply(id.as_ref().unwrap_or(&Value::Null), code, text))
    };
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return refuse(
            INVALID_REQUEST,
            "The approval gateway takes JSON-RPC 2.0 messages only (`\"jsonrpc\": \"2.0\"`); \
             nothing was sent to the MCP server."
                .to_owned(),
        );
    }
    let method = match message.get("method") {
        Some(Value::String(method)) => Some(method.clone()),
        Some(other) => {
            return refuse(
                INVALID_REQUEST,
                format!(
                    "`method` must be a string, got {}; nothing was sent to the MCP server.",
                    kind(other)
                ),
            );
        }
        None => None,
    };
    match (method, message.contains_key("id")) {
        (Some(method), true) => screen_request(&method, message),
        (Some(method), false) => screen_notification(&method, message),
        // A response to a request of the server's: the library matches it or drops it.
        (None, _) => match typed(message) {
            Ok(typed @ (JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_))) => {
                Screened::Pass(Box::new(typed))
            }
            Ok(_) | Err(_) => refuse(
                INVALID_REQUEST,
                "The approval gateway could not read this message as a JSON-RPC 2.0 request, \
                 notification or response; nothing was sent to the MCP server."
                    .to_owned(),
            ),
        },
    }
}

fn screen_request(method: &str, message: Map<String, Value>) -> Screened {
    let id = message.get("id").map(reply_id).unwrap_or(Value::Null);
    let refuse = |code: i64, text: String| Screened::Refuse(error_reply(&id, code, text));
    if !matches!(message.get("id"), Some(Value::String(_))) && !is_integer(message.get("id")) {
        return refuse(
            INVALID_REQUEST,
            "A request's `id` must be a string or an integer; nothing was sent to the MCP server."
                .to_owned(),
        );
    }
    let Some(route) = request_route(method) else {
        return refuse(
            METHOD_NOT_FOUND,
            format!(
                "The approval gateway does not relay `{method}`: it passes on only requests known \
                 to have no side effects ({}) and `tools/call` after approval. Nothing was sent \
                 to the MCP server.",
                RELAYED_REQUESTS.join(", ")
            ),
        );
    };
    if route == RequestRoute::Review
        && let Err(problem) = check_tool_call(message.get("params"))
    {
        return refuse(INVALID_PARAMS, refused_call(&problem));
    }
    let params = message.get("params").cloned();
    match typed(message) {
        Ok(JsonRpcMessage::Request(request))
            if !matches!(request.request, ClientRequest::CustomRequest(_))
                && request.request.method() == method =>
        {
            Screened::Pass(Box::new(JsonRpcMessage::Request(request)))
        }
        Ok(_) | Err(_) => {
            let problem = match &params {
                Some(params) if !params.is_object() => {
                    format!("`params` must be an object, got {}", kind(params))
                }
                Some(Value::Object(params))
                    if params.get("_meta").is_some_and(|meta| !meta.is_object()) =>
                {
                    format!(
                        "`params._meta` must be an object, got {}",
                        kind(&params["_meta"])
                    )
                }
                _ => "its params do not have the types the MCP specification gives them".to_owned(),
            };
            match route {
                RequestRoute::Review => refuse(INVALID_PARAMS, refused_call(&problem)),
                RequestRoute::Relay => refuse(
                    INVALID_PARAMS,
                    format!(
                        "The approval gateway could not read this `{method}` request: {problem}. \
                         Nothing was sent to the MCP server."
                    ),
                ),
            }
        }
    }
}

fn refused_call(problem: &str) -> String {
    format!(
        "The approval gateway refused this tools/call: {problem}. Nothing was sent to the MCP \
         server or to approvers, and the tool was not run. Call it again with `name` (a string) \
         and `arguments` (an object) only."
    )
}

/// The shape a `tools/call` must have before the library may type it: the library ignores
/// unknown fields and treats a wrong type as a custom request, so both are refused here.
fn check_tool_call(params: Option<&Value>) -> Result<(), String> {
    let Some(params) = params else {
        return Err("it has no `params`".to_owned());
    };
    let Value::Object(params) = params else {
        return Err(format!("`params` must be an object, got {}", kind(params)));
    };
    if let Some(field) = params
        .keys()
        .find(|k| !TOOL_CALL_FIELDS.contains(&k.as_str()))
    {
        return Err(format!(
            "`params.{field}` is not a field the gateway accepts (it takes `name`, `arguments` \
             and `_meta` only, since approvers see only the name and the arguments)"
        ));
    }
    match params.get("name") {
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(format!(
                "`params.name` must be a string, got {}",
                kind(other)
            ));
        }
        None => return Err("`params.name` is missing".to_owned()),
    }
    for field in ["arguments", "_meta"] {
        if let Some(value) = params.get(field)
            && !value.is_object()
        {
            return Err(format!(
                "`params.{field}` must be an object, got {}",
                kind(value)
            ));
        }
    }
    Ok(())
}

fn screen_notification(method: &str, message: Map<String, Value>) -> Screened {
    if !notification_passes(method) {
        return Screened::Drop(format!(
            "the notification `{method}` (the gateway passes on only {})",
            PASSED_NOTIFICATIONS.join(", ")
        ));
    }
    match typed(message) {
        Ok(JsonRpcMessage::Notification(notification))
            if !matches!(
                notification.notification,
                ClientNotification::CustomNotification(_)
            ) =>
        {
            Screened::Pass(Box::new(JsonRpcMessage::Notification(notification)))
        }
        Ok(_) | Err(_) => Screened::Drop(format!(
            "a `{method}` notification whose params do not have the types the MCP specification \
             gives them"
        )),
    }
}

fn typed(message: Map<String, Value>) -> Result<ClientJsonRpcMessage, serde_json::Error> {
    serde_json::from_value(Value::Object(message))
}

fn is_integer(value: Option<&Value>) -> bool {
    matches!(value, Some(Value::Number(n)) if n.is_i64())
}

/// The id a reply carries: the request's, when it is one JSON-RPC allows; else null.
fn reply_id(id: &Value) -> Value {
    match id {
        Value::String(_) | Value::Number(_) => id.clone(),
        _ => Value::Null,
    }
}

/// A JSON-RPC error response.
pub fn error_reply(id: &Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
    }

    fn refusal(screened: Screened) -> (Value, i64, String) {
        match screened {
            Screened::Refuse(reply) => (
                reply["id"].clone(),
                reply["error"]["code"].as_i64().unwrap(),
                reply["error"]["message"].as_str().unwrap().to_owned(),
            ),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn only_side_effect_free_methods_are_relayed_and_tools_call_is_reviewed() {
        assert_eq!(request_route("tools/call"), Some(RequestRoute::Review));
        for method in [
            "initialize",
            "ping",
            "tools/list",
            "resources/read",
            "prompts/get",
            "completion/complete",
        ] {
            assert_eq!(request_route(method), Some(RequestRoute::Relay), "{method}");
        }
        for method in [
            "tasks/get",
            "tasks/cancel",
            "tasks/result",
            "skills/get",
            "subscriptions/listen",
            "sampling/createMessage",
            "x/y",
            "tools/call ",
            "TOOLS/CALL",
            "",
        ] {
            assert_eq!(request_route(method), None, "{method}");
        }
        assert!(notification_passes("notifications/cancelled"));
        assert!(!notification_passes("notifications/x"));
        assert!(!notification_passes("notifications/tools/list_changed"));
    }

    #[test]
    fn a_well_formed_tool_call_passes_typed_as_a_tool_call() {
        let message = call(json!({"name": "write_file", "arguments": {"path": "/a"},
                                  "_meta": {"progressToken": 3}}));
        let Screened::Pass(typed) = screen(message) else {
            panic!("refused");
        };
        let JsonRpcMessage::Request(request) = *typed else {
            panic!("not a request");
        };
        assert!(matches!(request.request, ClientRequest::CallToolRequest(_)));
    }

    #[test]
    fn a_tool_call_with_any_field_of_the_wrong_type_or_unknown_is_refused_with_its_id() {
        let base = || json!({"name": "write_file", "arguments": {"path": "/a"}});
        let mut cases = vec![];
        for (field, wrong) in [
            ("name", json!(5)),
            ("name", json!(null)),
            ("arguments", json!([1])),
            ("arguments", json!("x")),
            ("arguments", json!(null)),
            ("_meta", json!(1)),
            ("_meta", json!("x")),
            ("_meta", json!(true)),
            ("_meta", json!(null)),
            ("_meta", json!([])),
            ("requestState", json!(1)),
            ("requestState", json!("state")),
            ("inputResponses", json!("x")),
            ("task", json!({"ttl": 1})),
            ("bogus", json!(1)),
        ] {
            let mut params = base();
            params[field] = wrong;
            cases.push(params);
        }
        cases.extend([
            json!([1]),
            json!("x"),
            json!(null),
            json!({"arguments": {}}),
        ]);
        for params in cases {
            let (id, code, text) = refusal(screen(call(params.clone())));
            assert_eq!((id, code), (json!(7), INVALID_PARAMS), "{params}");
            assert!(text.contains("the tool was not run"), "{text}");
        }
        let (id, code, _) = refusal(screen(json!({"jsonrpc": "2.0", "id": "s",
                                                   "method": "tools/call"})));
        assert_eq!((id, code), (json!("s"), INVALID_PARAMS));
    }

    #[test]
    fn unknown_methods_are_refused_naming_why_and_relayed_ones_must_type() {
        let (id, code, text) = refusal(screen(
            json!({"jsonrpc": "2.0", "id": "u", "method": "x/y", "params": {}}),
        ));
        assert_eq!((id, code), (json!("u"), METHOD_NOT_FOUND));
        assert!(text.contains("`x/y`"), "{text}");
        let (_, code, text) = refusal(screen(
            json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": 5}}),
        ));
        assert_eq!(code, INVALID_PARAMS, "{text}");
        assert!(matches!(
            screen(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
            Screened::Pass(_)
        ));
    }

    #[test]
    fn messages_that_are_not_json_rpc_requests_get_an_error_reply() {
        let (id, code, _) = refusal(screen_bytes(b"{not json"));
        assert_eq!((id, code), (Value::Null, PARSE_ERROR));
        for message in [
            json!({"id": 3, "method": "tools/list"}),
            json!({"jsonrpc": "1.0", "id": 3, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "id": 3, "method": 5}),
            json!({"jsonrpc": "2.0", "id": 3}),
        ] {
            let (id, code, _) = refusal(screen(message.clone()));
            assert_eq!((id, code), (json!(3), INVALID_REQUEST), "{message}");
        }
        for message in [
            json!({"jsonrpc": "2.0", "id": null, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "id": {}, "method": "tools/list"}),
            json!(5),
        ] {
            let (id, code, _) = refusal(screen(message.clone()));
            assert_eq!((id, code), (Value::Null, INVALID_REQUEST), "{message}");
        }
        let (id, code, _) = refusal(screen(
            json!({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}),
        ));
        assert_eq!((id, code), (json!(1.5), INVALID_REQUEST));
    }

    #[test]
    fn a_batch_is_refused_request_by_request() {
        let batch = json!([
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": "b", "method": "tools/call", "params": {"name": "x"}},
        ]);
        let Screened::Refuse(Value::Array(replies)) = screen(batch) else {
            panic!("a batch was not refused");
        };
        let ids: Vec<Value> = replies.iter().map(|r| r["id"].clone()).collect();
        assert_eq!(ids, [json!(1), json!("b")]);
        assert!(matches!(
            screen(json!([])),
            Screened::Refuse(Value::Object(_))
        ));
        assert!(matches!(
            screen(json!([{"jsonrpc": "2.0", "method": "notifications/initialized"}])),
            Screened::Drop(_)
        ));
    }

    #[test]
    fn only_the_clients_own_notifications_pass_and_only_when_typed() {
        assert!(matches!(
            screen(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Screened::Pass(_)
        ));
        assert!(matches!(
            screen(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": 3}})
            ),
            Screened::Pass(_)
        ));
        for message in [
            json!({"jsonrpc": "2.0", "method": "notifications/x", "params": {}}),
            json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "rm"}}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": []}}),
        ] {
            assert!(
                matches!(screen(message.clone()), Screened::Drop(_)),
                "{message}"
            );
        }
    }

    #[test]
    fn the_clients_responses_to_the_servers_requests_pass() {
        assert!(matches!(
            screen(json!({"jsonrpc": "2.0", "id": 0, "result": {"roots": []}})),
            Screened::Pass(_)
        ));
        assert!(matches!(
            screen(json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -1, "message": "no"}})),
            Screened::Pass(_)
        ));
    }
}
