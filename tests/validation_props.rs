//! Property tests of the validation layer (`approval_broker::surface::grpc::parse`), driven
//! directly with arbitrary protobuf values: strings with control characters, multi-byte
//! characters and lengths around and far beyond every limit, arbitrary enum numbers, timestamps
//! with out-of-range nanos and i64 extremes, batches of 0 to 200 calls. They prove that
//! `parse::batch`, `approver::decision`, `cancel`, `filter`, `page` (and the small helpers) never panic;
//! that they accept exactly the values an independent model of the documented limits accepts
//! (ids 1..=256 bytes without control characters, tools 1..=128 bytes, inputs that are JSON
//! objects within the byte limit, deadlines within range...); that every refusal is an
//! INVALID_ARGUMENT naming the exact field (`batch.calls[i].<field>`); that a batch's accepted
//! and refused calls partition its indices; and that canonical JSON is idempotent and blind to
//! key order and white space.
//!
//! Case counts are per property; `PROPTEST_CASES=n` overrides them all (e.g. for a long soak).
//! The last property holds the size limit to the canonical form too: whatever the broker stores
//! and returns as `input_json` can be submitted again (`{"a":1e15}` used to grow past its limit
//! when stored as `1000000000000000.0`).

use std::collections::HashSet;

use approval_broker::Error;
use approval_broker::domain::{
    AgentId, Identity, OnDeny, Timestamp, ToolInput, Verdict, invisible, json,
};
use approval_broker::domain::{CallQuery, CancelScope, Cursor};
use approval_broker::proto::v1 as pb;
use approval_broker::surface::grpc::{approver, parse};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use prost_types::Timestamp as PbTimestamp;
use serde_json::Value;

const MAX_ID: usize = 256;
const MAX_TOOL: usize = 128;
const MAX_TITLE: usize = 512;
const MAX_MESSAGE: usize = 16 * 1024;
const MAX_WORKSPACE: usize = 1024;
const MAX_SUPERSEDE_KEY: usize = 256;
const MAX_REASON: usize = 4 * 1024;
const MAX_APPROVER: usize = 256;
const MAX_BATCH: usize = 128;
const MAX_LOOKUP: usize = 1024;

/// `cases` runs per property, unless `PROPTEST_CASES` says otherwise. Failures are not
/// persisted to files: proptest prints the minimal failing input.
fn config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config.failure_persistence = None;
    config
}

// ---- Strategies --------------------------------------------------------------------------

/// Characters that are fine in every field: letters, any non-control character, and the
/// characters that trouble SQL, JSON and terminals.
fn printable_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => proptest::char::range('a', 'z'),
        1 => any::<char>().prop_map(|c| if c.is_control() { '?' } else { c }),
        1 => select(vec!['é', '€', '😀', '%', '_', '\'', '"', '\\', ' ', ';', '\u{200b}', '\u{202e}']),
    ]
}

/// Control characters: C0 (with NUL, tab, newline, escape), DEL and C1.
fn control_char() -> impl Strategy<Value = char> {
    select(vec![
        '\0', '\n', '\r', '\t', '\u{7}', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}',
    ])
}

/// Mostly printable, sometimes a control character.
fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![8 => printable_char(), 1 => control_char()]
}

fn short_text(max_chars: usize) -> impl Strategy<Value = String> {
    vec(any_char(), 0..=max_chars).prop_map(|chars| chars.into_iter().collect())
}

/// A short string of printable characters (at most 4 bytes each).
fn valid_text(min_chars: usize, max_chars: usize) -> impl Strategy<Value = String> {
    vec(printable_char(), min_chars..=max_chars).prop_map(|chars| chars.into_iter().collect())
}

/// `n` ASCII bytes with `c` inserted somewhere.
fn padded(n: usize, c: char, at: prop::sample::Index) -> String {
    let mut s = "a".repeat(n);
    s.insert(at.index(n + 1), c);
    s
}

/// Trouble for a field limited to `limit` bytes: empty, control characters, lengths within a
/// few bytes of the limit (with one arbitrary, possibly multi-byte character), huge lengths.
fn wild_text(limit: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        2 => short_text(12),
        1 => (valid_text(0, 6), control_char(), valid_text(0, 6)).prop_map(|(a, c, b)| format!("{a}{c}{b}")),
        2 => (limit.saturating_sub(4)..=limit + 2, any_char(), any::<prop::sample::Index>())
            .prop_map(|(n, c, at)| padded(n, c, at)),
        2 => (limit.saturating_sub(2)..=limit + 1).prop_map(|n| "a".repeat(n)),
        1 => (limit * 2..limit * 40, any_char(), any::<prop::sample::Index>())
            .prop_map(|(n, c, at)| padded(n, c, at)),
    ]
}

/// A required field (ids, tool): mostly a valid value, often trouble.
fn required(limit: usize) -> impl Strategy<Value = String> {
    prop_oneof![5 => valid_text(1, 12), 1 => wild_text(limit)]
}

/// An optional field: mostly empty or valid, sometimes trouble.
fn optional(limit: usize) -> impl Strategy<Value = String> {
    prop_oneof![4 => Just(String::new()), 3 => valid_text(1, 12), 1 => wild_text(limit)]
}

/// A float as JSON (not-a-number and infinities, which JSON cannot hold, as null).
fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(float),
        select(vec![
            0.1,
            1e15,
            1e16,
            1e-7,
            123456.789e3,
            -0.0,
            5e-324,
            f64::MAX
        ])
        .prop_map(float),
        number_text().prop_map(|n| serde_json::from_str::<Value>(&n).unwrap_or(Value::Null)),
        short_text(8).prop_map(Value::String),
    ]
}

/// A JSON number spelled any valid way: sign, digits, fraction, exponent (`e`/`E`, `+`/`-`).
fn number_text() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop_oneof![Just("0".to_owned()), "[1-9][0-9]{0,25}"],
        prop::option::of("[0-9]{1,20}"),
        prop::option::of((
            select(vec!["e", "E"]),
            select(vec!["", "+", "-"]),
            "[0-9]{1,4}",
        )),
    )
        .prop_map(|(negative, int, fraction, exponent)| {
            let mut n = String::new();
            if negative {
                n.push('-');
            }
            n.push_str(&int);
            if let Some(fraction) = fraction {
                n.push('.');
                n.push_str(&fraction);
            }
            if let Some((e, sign, digits)) = exponent {
                n.push_str(e);
                n.push_str(sign);
                n.push_str(&digits);
            }
            n
        })
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(short_text(6), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Value> {
    btree_map(short_text(6), json_value(), 0..6)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// A tiny deterministic generator, so one `seed` fixes one rendering.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn space(&mut self) -> &'static str {
        ["", "", " ", "\n", "\t", "  ", "\r\n "][(self.next() % 7) as usize]
    }
}

/// `value` as JSON text, its objects' keys in an order and with white space chosen by `seed`.
fn render(value: &Value, seed: u64) -> String {
    fn go(value: &Value, rng: &mut Rng, out: &mut String) {
        out.push_str(rng.space());
        match value {
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    go(item, rng, out);
                }
                out.push_str(rng.space());
                out.push(']');
            }
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                for i in (1..entries.len()).rev() {
                    entries.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(rng.space());
                    out.push_str(&serde_json::to_string(key).expect("a key"));
                    out.push_str(rng.space());
                    out.push(':');
                    go(item, rng, out);
                }
                out.push_str(rng.space());
                out.push('}');
            }
            leaf => out.push_str(&serde_json::to_string(leaf).expect("a leaf")),
        }
        out.push_str(rng.space());
    }
    let mut out = String::new();
    go(value, &mut Rng(seed | 1), &mut out);
    out
}

/// Tool inputs: mostly objects, and every way of not being one.
fn input_json() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (json_object(), any::<u64>()).prop_map(|(v, seed)| render(&v, seed)),
        2 => json_value().prop_map(|v| v.to_string()),
        1 => short_text(20),
        1 => select(vec!["", "{}", "{", "null", "[]", "{\"a\":1}{}", "{\"a\":1,}", "{'a':1}", "\u{feff}{}", "{\"a\":NaN}", "{\"a\":1e400}"])
            .prop_map(str::to_owned),
        2 => vec(number_text(), 1..4).prop_map(|numbers| {
            let fields: Vec<String> = numbers.iter().enumerate().map(|(i, n)| format!("\"n{i}\":{n}")).collect();
            format!("{{{}}}", fields.join(","))
        }),
        1 => (900usize..1100).prop_map(|n| format!("{{\"k\":\"{}\"}}", "x".repeat(n))),
        1 => (100usize..300).prop_map(|depth| format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth))),
    ]
}

fn now_seconds() -> i64 {
    Timestamp::now().as_micros() / 1_000_000
}

fn any_timestamp() -> impl Strategy<Value = PbTimestamp> {
    let now = now_seconds();
    let extreme_seconds = select(vec![
        i64::MIN,
        i64::MIN / 1_000_000,
        i64::MIN / 1_000_000 - 1,
        -1,
        0,
        i64::MAX / 1_000_000,
        i64::MAX / 1_000_000 + 1,
        i64::MAX,
    ]);
    let extreme_nanos = select(vec![
        i32::MIN,
        -1,
        0,
        999_999,
        999_999_999,
        1_000_000_000,
        i32::MAX,
    ]);
    let nanos = 0..1_000_000_000i32;
    prop_oneof![
        3 => (60i64..100_000_000, nanos.clone()).prop_map(move |(s, n)| PbTimestamp { seconds: now + s, nanos: n }),
        2 => (60i64..100_000_000, nanos).prop_map(move |(s, n)| PbTimestamp { seconds: now - s, nanos: n }),
        1 => (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| PbTimestamp { seconds, nanos }),
        1 => (extreme_seconds, extreme_nanos).prop_map(|(seconds, nanos)| PbTimestamp { seconds, nanos }),
    ]
}

fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![4 => -1..9i32, 1 => any::<i32>()]
}

/// Deadlines may be at most 366 days ahead.
const MAX_DEADLINE_AHEAD_SECONDS: i64 = 366 * 24 * 3600;

fn future_deadline() -> impl Strategy<Value = PbTimestamp> {
    let now = now_seconds();
    (
        60i64..MAX_DEADLINE_AHEAD_SECONDS - 3600,
        0..1_000_000_000i32,
    )
        .prop_map(move |(s, nanos)| PbTimestamp {
            seconds: now + s,
            nanos,
        })
}

fn call_spec() -> impl Strategy<Value = pb::CallSpec> {
    (
        prop_oneof![
            10 => valid_text(1, 12),
            2 => wild_text(MAX_ID),
            1 => select(vec!["a", "b"]).prop_map(str::to_owned),
        ],
        required(MAX_TOOL),
        prop_oneof![
            5 => (json_object(), any::<u64>()).prop_map(|(v, seed)| render(&v, seed)),
            2 => input_json(),
        ],
        optional(MAX_TITLE),
        prop_oneof![4 => Just(String::new()), 3 => short_text(20), 1 => wild_text(MAX_MESSAGE)],
        optional(MAX_WORKSPACE),
        optional(MAX_SUPERSEDE_KEY),
        // `requested_by`: a name of at most 256 bytes, as a supersede key is.
        optional(MAX_SUPERSEDE_KEY),
        prop_oneof![
            4 => Just(None),
            2 => future_deadline().prop_map(Some),
            1 => any_timestamp().prop_map(Some),
        ],
    )
        .prop_map(
            |(
                call_id,
                tool,
                input_json,
                title,
                message,
                workspace,
                supersede_key,
                requested_by,
                deadline,
            )| {
                pb::CallSpec {
                    requested_by,
                    call_id,
                    tool,
                    input_json,
                    title,
                    message,
                    workspace,
                    supersede_key,
                    deadline,
                    // Its own property: `host` is one of a short list (tests/api/hosts.rs).
                    host: String::new(),
                }
            },
        )
}

fn batch_spec() -> impl Strategy<Value = Option<pb::BatchSpec>> {
    let calls = prop_oneof![
        1 => Just(vec![]),
        16 => vec(call_spec(), 1..6),
        1 => vec(call_spec(), 120..=128),
        1 => vec(call_spec(), 129..=200),
    ];
    let spec = (
        required(MAX_ID),
        calls,
        prop_oneof![8 => 0..=2i32, 1 => enum_value()],
        any::<bool>(),
        prop::bool::weighted(0.8),
    )
        .prop_map(
            |(session_id, mut calls, on_deny, supersede_pending, distinct)| {
                if distinct {
                    // Most batches should get past the duplicate check.
                    let mut seen = HashSet::new();
                    for (i, call) in calls.iter_mut().enumerate() {
                        if !seen.insert(call.call_id.clone()) {
                            call.call_id = format!("{}~{i}", call.call_id);
                            seen.insert(call.call_id.clone());
                        }
                    }
                }
                pb::BatchSpec {
                    session_id,
                    calls,
                    on_deny,
                    supersede_pending,
                }
            },
        );
    prop::option::weighted(0.99, spec)
}

// ---- An independent model of the documented limits ------------------------------------------

fn is_id(value: &str, max: usize) -> bool {
    !value.is_empty()
        && value.len() <= max
        && !value.chars().any(char::is_control)
        && is_visible(value)
}

/// No character that hides itself (the set is `domain::invisible`'s, tested there).
fn is_visible(value: &str) -> bool {
    !value.chars().any(invisible::is_invisible)
}

/// A one-line text that names something (workspace, supersede key): no hidden characters.
fn is_name(value: &str, max: usize) -> bool {
    is_line(value, max) && is_visible(value)
}

fn is_requester(value: &str) -> bool {
    value.is_empty() || Identity::parse("requested_by", value).is_ok()
}

fn requester(value: &str) -> String {
    if value.is_empty() {
        return String::new();
    }
    Identity::parse("requested_by", value)
        .expect("a valid identity")
        .into_string()
}

fn is_line(value: &str, max: usize) -> bool {
    value.len() <= max && !value.chars().any(char::is_control)
}

fn is_text(value: &str, max: usize) -> bool {
    value.len() <= max && !value.contains('\0')
}

/// A JSON object whose text, and whose canonical form, are within `max` bytes.
fn is_input(text: &str, max: usize) -> bool {
    text.len() <= max
        && serde_json::from_str::<Value>(text)
            .is_ok_and(|v| v.is_object() && json::canonical(&v).len() <= max)
        && numbers_kept(text)
}

/// Whether canonical form keeps every number of `text` as written (else the broker refuses it,
/// I-JSON: `9007199254740993` would become `9007199254740992`). Which numbers those are is
/// `json::parse`'s rule, modelled and tested in src/domain/json.rs; here it is taken as given.
fn numbers_kept(text: &str) -> bool {
    json::parse("input_json", text)
        .map_err(|e| e.to_string())
        .err()
        .is_none_or(|e| !e.contains("cannot be held exactly by a double"))
}

/// A timestamp's microseconds, if it is valid: nanos in 0..1e9, and the whole seconds in
/// microseconds (then with the nanos) within i64. (The seconds alone must fit: `seconds =
/// -9223372036855, nanos = 999999999` is refused although its -9223372036854000001 µs would fit;
/// a harmless edge, refused naming the field like any other out-of-range time.)
fn micros(t: &PbTimestamp) -> Option<i64> {
    if !(0..1_000_000_000).contains(&t.nanos) {
        return None;
    }
    // The protobuf Timestamp range: years 1 to 9999.
    if !(-62_135_596_800..=253_402_300_799).contains(&t.seconds) {
        return None;
    }
    t.seconds
        .checked_mul(1_000_000)?
        .checked_add(i64::from(t.nanos / 1000))
}

/// The first field of `call` that breaks a documented limit (in the order the broker checks).
/// A deadline that has passed is not one: it refuses a new call only, which the store judges
/// (a retry of a stored call is answered whatever the clock says).
fn call_fault(call: &pb::CallSpec, max_input: usize) -> Option<&'static str> {
    if let Some(deadline) = &call.deadline
        && micros(deadline)
            .is_none_or(|at| at > (now_seconds() + MAX_DEADLINE_AHEAD_SECONDS) * 1_000_000)
    {
        return Some("deadline");
    }
    [
        ("call_id", is_id(&call.call_id, MAX_ID)),
        ("tool", is_id(&call.tool, MAX_TOOL)),
        ("input_json", is_input(&call.input_json, max_input)),
        ("title", is_line(&call.title, MAX_TITLE)),
        ("message", is_text(&call.message, MAX_MESSAGE)),
        ("workspace", is_name(&call.workspace, MAX_WORKSPACE)),
        (
            "supersede_key",
            is_name(&call.supersede_key, MAX_SUPERSEDE_KEY),
        ),
        // Empty, or an identity (its own rules and unit tests are `domain::identity`'s).
        ("requested_by", is_requester(&call.requested_by)),
    ]
    .into_iter()
    .find(|(_, ok)| !ok)
    .map(|(field, _)| field)
}

/// The field a whole batch is refused for, if it is.
fn batch_fault(spec: &Option<pb::BatchSpec>) -> Option<String> {
    let Some(spec) = spec else {
        return Some("batch".into());
    };
    if !is_id(&spec.session_id, MAX_ID) {
        return Some("batch.session_id".into());
    }
    if spec.calls.is_empty() || spec.calls.len() > MAX_BATCH {
        return Some("batch.calls".into());
    }
    if !(0..=2).contains(&spec.on_deny) {
        return Some("batch.on_deny".into());
    }
    let mut seen = HashSet::new();
    spec.calls
        .iter()
        .position(|c| !seen.insert(c.call_id.as_str()))
        .map(|i| format!("batch.calls[{i}].call_id"))
}

/// The field an INVALID_ARGUMENT names, or a description of what else it was.
fn invalid_field(err: &Error) -> Result<&str, String> {
    match err {
        Error::InvalidArgument { field, .. } => {
            if err.code() != tonic::Code::InvalidArgument {
                return Err(format!("{err} maps to {:?}", err.code()));
            }
            if !err.to_string().starts_with(&format!("{field}: ")) {
                return Err(format!("`{err}` does not start with its field"));
            }
            Ok(field)
        }
        other => Err(format!("not INVALID_ARGUMENT: {other:?}")),
    }
}

fn show(s: &str) -> String {
    if s.len() > 80 {
        format!(
            "{:?}... ({} bytes)",
            &s[..s.floor_char_boundary(80)],
            s.len()
        )
    } else {
        format!("{s:?}")
    }
}

/// The canonical form of `text` as a submit stores it.
fn canonical(text: &str, max_input: usize) -> Option<String> {
    ToolInput::parse("input_json", text, max_input)
        .ok()
        .map(|input| input.as_str().to_owned())
}

// ---- Properties --------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(2500))]

    /// `parse::batch` accepts exactly what the model accepts; every accepted call keeps its
    /// values and meets every limit; every refusal names `batch...` precisely; accepted and
    /// refused indices partition the batch.
    #[test]
    fn batch_accepts_exactly_the_valid_calls(
        spec in batch_spec(),
        max_input in select(vec![64usize, 1024, approval_broker::domain::DEFAULT_MAX_INPUT_BYTES]),
    ) {
        let result = parse::batch("batch", spec.clone(), max_input);
        match (batch_fault(&spec), result) {
            (Some(fault), Err(err)) => {
                prop_assert_eq!(invalid_field(&err), Ok(fault.as_str()), "{}", err);
            }
            (Some(fault), Ok(_)) => prop_assert!(false, "accepted a batch with a bad {}", fault),
            (None, Err(err)) => prop_assert!(false, "refused a valid batch: {}", err),
            (None, Ok(parsed)) => {
                let spec = spec.expect("a batch");
                let batch = &parsed.batch;
                prop_assert_eq!(batch.session.as_str(), spec.session_id.as_str());
                prop_assert_eq!(&batch.agent, &AgentId::default_owner());
                prop_assert_eq!(batch.supersede_pending, spec.supersede_pending);
                let on_deny = if spec.on_deny == 2 { OnDeny::Independent } else { OnDeny::SkipRest };
                prop_assert_eq!(batch.on_deny, on_deny);

                // Accepted and refused indices partition 0..n, each in order.
                let accepted: Vec<u32> = batch.calls.iter().map(|c| c.index).collect();
                let refused: Vec<u32> = parsed.refused.iter().map(|r| r.0).collect();
                prop_assert!(accepted.is_sorted() && refused.is_sorted());
                let mut all: Vec<u32> = accepted.iter().chain(&refused).copied().collect();
                all.sort_unstable();
                prop_assert_eq!(all, (0..spec.calls.len() as u32).collect::<Vec<_>>());

                for call in &batch.calls {
                    let i = call.index as usize;
                    let sent = &spec.calls[i];
                    // Each accepted call is valid by the model...
                    prop_assert_eq!(call_fault(sent, max_input), None, "call {}", i);
                    // ...meets every documented limit...
                    prop_assert!(is_id(call.call_id.as_str(), MAX_ID));
                    prop_assert!(is_id(call.tool.as_str(), MAX_TOOL));
                    prop_assert!(sent.input_json.len() <= max_input);
                    prop_assert!(serde_json::from_str::<Value>(call.input.as_str()).is_ok_and(|v| v.is_object()));
                    prop_assert!(is_line(&call.title, MAX_TITLE));
                    prop_assert!(is_text(&call.message, MAX_MESSAGE));
                    prop_assert!(is_name(&call.workspace, MAX_WORKSPACE));
                    prop_assert!(call.supersede_key.as_deref().is_none_or(|k| !k.is_empty() && is_name(k, MAX_SUPERSEDE_KEY)));
                    // ...and keeps what was sent.
                    prop_assert_eq!(call.call_id.as_str(), sent.call_id.as_str());
                    prop_assert_eq!(call.tool.as_str(), sent.tool.as_str());
                    prop_assert_eq!(&call.title, &sent.title);
                    prop_assert_eq!(&call.message, &sent.message);
                    prop_assert_eq!(&call.workspace, &sent.workspace);
                    // The person named, in the one canonical form identities are compared in.
                    prop_assert_eq!(&call.requested_by, &requester(&sent.requested_by));
                    prop_assert_eq!(call.supersede_key.as_deref().unwrap_or(""), sent.supersede_key.as_str());
                    prop_assert_eq!(call.deadline.map(Timestamp::as_micros), sent.deadline.as_ref().and_then(micros));
                }
                for (index, call_id, err) in &parsed.refused {
                    let i = *index as usize;
                    prop_assert_eq!(call_id, &spec.calls[i].call_id);
                    // Refused for the field the model finds at fault.
                    let fault = call_fault(&spec.calls[i], max_input);
                    prop_assert!(fault.is_some(), "refused a valid call {}: {}", i, err);
                    let expected = format!("batch.calls[{i}].{}", fault.unwrap_or_default());
                    prop_assert_eq!(invalid_field(err), Ok(expected.as_str()), "{}", err);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(4000))]

    /// Canonical JSON is idempotent, keeps the value, and does not depend on key order or
    /// white space.
    #[test]
    fn canonical_json_is_idempotent_and_blind_to_key_order_and_white_space(
        value in json_object(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        let limit = usize::MAX;
        let a = render(&value, seed_a);
        if !numbers_kept(&value.to_string()) {
            // A number canonical form would change is refused, whatever the spelling.
            prop_assert_eq!(canonical(&a, limit), None, "{}", show(&a));
            return Ok(());
        }
        let b = render(&value, seed_b);
        let canon_a = canonical(&a, limit);
        prop_assert!(canon_a.is_some(), "an object was refused: {}", show(&a));
        let canon_a = canon_a.unwrap_or_default();
        prop_assert_eq!(canonical(&canon_a, limit), Some(canon_a.clone()), "not idempotent");
        prop_assert_eq!(canonical(&b, limit), Some(canon_a.clone()), "{} vs {}", show(&a), show(&b));
        // The same value (numbers as doubles, RFC 8785), and compact: reading the canonical
        // text and writing it again changes nothing.
        let reread: Value = serde_json::from_str(&canon_a).expect("canonical JSON parses");
        let rendered: Value = serde_json::from_str(&a).expect("rendered JSON parses");
        prop_assert_eq!(&json::canonical(&rendered), &canon_a);
        prop_assert_eq!(&json::canonical(&reread), &canon_a);
    }

    /// Decide accepts exactly the valid requests; refusals name the field.
    #[test]
    fn decide_accepts_exactly_the_valid_requests(
        agent in prop_oneof![3 => Just(String::new()), 1 => required(MAX_ID)],
        session_id in required(MAX_ID),
        call_id in required(MAX_ID),
        decision in prop_oneof![6 => 1..=2i32, 1 => enum_value()],
        reason in prop_oneof![3 => short_text(20), 1 => wild_text(MAX_REASON)],
        edited_input_json in prop_oneof![3 => Just(String::new()), 1 => (json_object(), any::<u64>()).prop_map(|(v, seed)| render(&v, seed)), 2 => input_json()],
        approver in prop_oneof![3 => Just("alice@example.com".to_owned()), 1 => Just(String::new()), 2 => required(MAX_APPROVER)],
        max_input in select(vec![64usize, 1024]),
        scope in prop_oneof![6 => Just(0i32), 4 => 1..=4i32, 1 => enum_value()],
        matcher_kind in prop_oneof![6 => Just(0u8), 1 => 1..=7u8],
        expires in prop_oneof![6 => Just(None), 2 => (1i64..1_000_000).prop_map(Some), 1 => (-5i64..=0).prop_map(Some)],
    ) {
        use pb::input_matcher::Kind;
        let condition = |field: &str| pb::FieldConditions {
            conditions: vec![pb::FieldCondition {
                field: field.into(),
                test: Some(pb::field_condition::Test::Prefix("git status".into())),
            }],
        };
        // 0 absent; 1 any; 2 this call's input; 3 an exact input; 4 fields; then faults:
        // 5 an exact input that is not an object; 6 no conditions; 7 a bad field path.
        let kind = match matcher_kind {
            0 => None,
            1 => Some(Kind::Any(pb::AnyInput {})),
            2 => Some(Kind::ExactJson(String::new())),
            3 => Some(Kind::ExactJson(r#"{"a":1}"#.into())),
            4 => Some(Kind::Fields(condition("command"))),
            5 => Some(Kind::ExactJson("[1]".into())),
            6 => Some(Kind::Fields(pb::FieldConditions { conditions: vec![] })),
            _ => Some(Kind::Fields(condition("a..b"))),
        };
        let request = pb::DecideRequest {
            session_id: session_id.clone(),
            call_id: call_id.clone(),
            agent: agent.clone(),
            decision,
            reason: reason.clone(),
            edited_input_json: edited_input_json.clone(),
            approver: approver.clone(),
            scope,
            matcher: kind.clone().map(|kind| pb::InputMatcher { kind: Some(kind) }),
            grant_expires_in: expires.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
            response: String::new(),
            passkey: None,
        };
        let once = scope == 0 || scope == 1;
        let fault = if !(agent.is_empty() || is_id(&agent, MAX_ID)) {
            Some("agent")
        } else if !is_id(&session_id, MAX_ID) {
            Some("session_id")
        } else if !is_id(&call_id, MAX_ID) {
            Some("call_id")
        } else if !(1..=3).contains(&decision) {
            Some("decision")
        } else if decision == 3 {
            // DECISION_RESPOND without its message (docs/answers.md).
            Some("response")
        } else if !edited_input_json.is_empty() && (decision == 2 || !is_input(&edited_input_json, max_input)) {
            Some("edited_input_json")
        } else if !is_line(&approver, MAX_APPROVER) {
            // (An empty approver passes here: the service requires one unless a token names
            // the approver.)
            Some("approver")
        } else if !is_text(&reason, MAX_REASON) {
            Some("reason")
        } else if !(0..=4).contains(&scope) {
            Some("scope")
        } else if once && kind.is_some() {
            Some("matcher")
        } else if once && expires.is_some() {
            Some("grant_expires_in")
        } else if !once && !edited_input_json.is_empty() {
            Some("scope")
        } else if !once && matcher_kind == 5 {
            Some("matcher.exact_json")
        } else if !once && matcher_kind == 6 {
            Some("matcher.fields.conditions")
        } else if !once && matcher_kind == 7 {
            Some("matcher.fields.conditions[0].field")
        } else if !once && expires.is_some_and(|s| s <= 0) {
            Some("grant_expires_in")
        } else {
            None
        };
        match (fault, approver::decision(request, max_input)) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok(fault), "{}", err),
            (Some(fault), Ok(_)) => prop_assert!(false, "accepted a bad {}", fault),
            (None, Err(err)) => prop_assert!(false, "refused a valid decision: {}", err),
            (None, Ok((key, decided))) => {
                let owner = if agent.is_empty() { "default" } else { agent.as_str() };
                prop_assert_eq!(key.agent.as_str(), owner);
                prop_assert_eq!(key.session.as_str(), session_id.as_str());
                prop_assert_eq!(key.call_id.as_str(), call_id.as_str());
                let verdict = if decision == 1 { Verdict::Approve } else { Verdict::Deny };
                prop_assert!(decided.verdict == verdict);
                prop_assert_eq!(&decided.reason, &reason);
                prop_assert_eq!(&decided.approver, &approver);
                prop_assert_eq!(decided.edited_input.is_some(), !edited_input_json.is_empty());
                match &decided.remember {
                    None => prop_assert!(once),
                    Some(remember) => {
                        prop_assert!(!once);
                        prop_assert_eq!(remember.scope.code(), i64::from(scope));
                        // Absent, or "" for exact: the decided call's own input.
                        prop_assert_eq!(remember.matcher.is_none(), matcher_kind == 0 || matcher_kind == 2);
                        prop_assert_eq!(remember.expires_in.map(|d| d.as_secs() as i64), expires);
                    }
                }
            }
        }
    }

    /// Cancel accepts exactly the valid targets; refusals name the field.
    #[test]
    fn cancel_accepts_exactly_the_valid_targets(
        present in prop::bool::weighted(0.97),
        session_id in required(MAX_ID),
        kind in prop_oneof![1 => Just(0u8), 6 => 1..=3u8, 1 => Just(4u8)],
        ids in prop_oneof![1 => Just(vec![]), 8 => vec(required(MAX_ID), 1..5), 1 => (1020usize..1030).prop_map(|n| (0..n).map(|i| i.to_string()).collect())],
        batch_id in prop_oneof![1 => Just(String::new()), 3 => required(MAX_ID)],
        reason in prop_oneof![3 => short_text(20), 1 => wild_text(MAX_REASON)],
    ) {
        use pb::cancel_target::Target;
        let target = match kind {
            0 => None,
            1 => Some(Target::Calls(pb::CallIds { call_ids: ids.clone() })),
            2 => Some(Target::BatchId(batch_id.clone())),
            3 => Some(Target::WholeSession(true)),
            _ => Some(Target::WholeSession(false)),
        };
        let spec = present.then(|| pb::CancelTarget { session_id: session_id.clone(), target, reason: reason.clone() });
        let fault = if !present {
            Some("target".to_owned())
        } else if !is_id(&session_id, MAX_ID) {
            Some("target.session_id".into())
        } else {
            match kind {
                1 if ids.is_empty() || ids.len() > MAX_LOOKUP => Some("target.calls.call_ids".into()),
                1 => ids.iter().position(|id| !is_id(id, MAX_ID)).map(|i| format!("target.calls.call_ids[{i}]")),
                2 if !is_id(&batch_id, MAX_ID) => Some("target.batch_id".into()),
                0 | 4 => Some("target.target".into()),
                _ => None,
            }
            .or_else(|| (!is_text(&reason, MAX_REASON)).then(|| "target.reason".into()))
        };
        match (fault, parse::cancel(spec, "target")) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok(fault.as_str()), "{}", err),
            (Some(fault), Ok(_)) => prop_assert!(false, "accepted a bad {}", fault),
            (None, Err(err)) => prop_assert!(false, "refused a valid target: {}", err),
            (None, Ok(parsed)) => {
                prop_assert_eq!(parsed.session.as_str(), session_id.as_str());
                prop_assert_eq!(&parsed.reason, &reason);
                match (kind, &parsed.scope) {
                    (1, CancelScope::Calls(parsed_ids)) => {
                        // A call named twice is kept once, where it first appears.
                        let parsed_ids: Vec<&str> = parsed_ids.iter().map(|i| i.as_str()).collect();
                        let mut seen = std::collections::HashSet::new();
                        let expected: Vec<&str> =
                            ids.iter().map(String::as_str).filter(|id| seen.insert(*id)).collect();
                        prop_assert_eq!(parsed_ids, expected);
                    }
                    (2, CancelScope::Batch(id)) => prop_assert_eq!(id.as_str(), batch_id.as_str()),
                    (3, CancelScope::Session) => {}
                    (kind, scope) => prop_assert!(false, "target kind {} became {:?}", kind, scope),
                }
            }
        }
    }

    /// A filter is literal: empty fields match everything, others are kept exactly as sent
    /// (quotes, `%`, `_` and all), or refused naming the field.
    #[test]
    fn filter_keeps_values_literally_or_names_the_field(
        present in any::<bool>(),
        session_id in optional(MAX_ID),
        workspace in optional(MAX_WORKSPACE),
        tool in optional(MAX_TOOL),
        agent in optional(MAX_ID),
    ) {
        let spec = pb::CallFilter { session_id: session_id.clone(), workspace: workspace.clone(), tool: tool.clone(), agent: agent.clone() };
        let (session_id, workspace, tool, agent) = if present {
            (session_id, workspace, tool, agent)
        } else {
            Default::default()
        };
        let fault = [
            ("filter.agent", agent.is_empty() || is_id(&agent, MAX_ID)),
            ("filter.session_id", session_id.is_empty() || is_id(&session_id, MAX_ID)),
            ("filter.workspace", is_name(&workspace, MAX_WORKSPACE)),
            ("filter.tool", tool.is_empty() || is_id(&tool, MAX_TOOL)),
        ]
        .into_iter()
        .find(|(_, ok)| !ok)
        .map(|(field, _)| field);
        match (fault, parse::filter("filter.", present.then_some(spec))) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok(fault), "{}", err),
            (Some(fault), Ok(_)) => prop_assert!(false, "accepted a bad {}", fault),
            (None, Err(err)) => prop_assert!(false, "refused a valid filter: {}", err),
            (None, Ok(query)) => {
                let kept = |v: &str| (!v.is_empty()).then(|| v.to_owned());
                prop_assert_eq!(query.agent.map(|a| a.as_str().to_owned()), kept(&agent));
                prop_assert_eq!(query.session, kept(&session_id));
                prop_assert_eq!(query.workspace, kept(&workspace));
                prop_assert_eq!(query.tool, kept(&tool));
            }
        }
    }

    /// Page sizes and tokens: 0 means 100, 1..=1000 are kept, more is refused; a token is
    /// `v1.<non-negative i64>` or refused; every issued token reads back as its cursor.
    #[test]
    fn page_sizes_and_tokens_are_checked(
        page_size in prop_oneof![1 => Just(0u32), 2 => 1..=1002u32, 1 => any::<u32>()],
        token in prop_oneof![
            1 => Just(String::new()),
            2 => any::<i64>().prop_map(|n| format!("v1.{n}")),
            1 => short_text(24),
            1 => (select(vec!["v1.", "v2.", "V1.", "v1", ""]), short_text(6)).prop_map(|(p, s)| format!("{p}{s}")),
        ],
        issued in 0..=i64::MAX,
    ) {
        let mut query = CallQuery::default();
        let result = parse::page(&mut query, page_size, &token);
        let cursor = token.strip_prefix("v1.").and_then(|n| n.parse::<i64>().ok()).filter(|n| *n >= 0);
        if page_size > 1000 {
            prop_assert_eq!(result.as_ref().map_err(invalid_field).err(), Some(Ok("page_size")));
        } else if !token.is_empty() && cursor.is_none() {
            prop_assert_eq!(result.as_ref().map_err(invalid_field).err(), Some(Ok("page_token")));
        } else {
            prop_assert!(result.is_ok(), "{:?}", result.err());
            prop_assert_eq!(query.limit, if page_size == 0 { 100 } else { page_size });
            prop_assert_eq!(query.after, cursor.map(Cursor));
        }
        // Round trip of the tokens the broker issues.
        let mut query = CallQuery::default();
        let issued_token = parse::page_token(Some(Cursor(issued)));
        prop_assert!(parse::page(&mut query, 10, &issued_token).is_ok());
        prop_assert_eq!(query.after, Some(Cursor(issued)));
    }

    /// The small helpers: lookups of call ids, status lists, time bounds and call keys never
    /// panic and name the field (with the index) when they refuse.
    #[test]
    fn lookup_helpers_name_the_field(
        ids in prop_oneof![1 => Just(vec![]), 8 => vec(required(MAX_ID), 1..6), 1 => (1020usize..1030).prop_map(|n| (0..n).map(|i| i.to_string()).collect())],
        allow_empty in any::<bool>(),
        statuses in vec(prop_oneof![6 => 1..=7i32, 1 => enum_value()], 0..6),
        bound in prop::option::of(any_timestamp()),
        key in (optional(MAX_ID), required(MAX_ID), required(MAX_ID)),
    ) {
        let fault = if (ids.is_empty() && !allow_empty) || ids.len() > MAX_LOOKUP {
            Some("call_ids".to_owned())
        } else {
            ids.iter().position(|id| !is_id(id, MAX_ID)).map(|i| format!("call_ids[{i}]"))
        };
        let result = parse::call_ids("call_ids", ids.clone(), allow_empty);
        match (&fault, &result) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(err), Ok(fault.as_str())),
            (None, Ok(parsed)) => prop_assert_eq!(parsed.len(), ids.len()),
            _ => prop_assert!(false, "call_ids {:?}: expected {:?}, got {:?}", ids, fault, result.as_ref().map(|v| v.len())),
        }

        let fault = statuses.iter().position(|s| !(1..=7).contains(s)).map(|i| format!("statuses[{i}]"));
        match (&fault, parse::statuses("statuses", statuses.clone())) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok(fault.as_str())),
            (None, Ok(parsed)) => {
                let codes: Vec<i64> = parsed.iter().map(|s| s.code()).collect();
                prop_assert_eq!(codes, statuses.iter().map(|s| i64::from(*s)).collect::<Vec<_>>());
            }
            (fault, result) => prop_assert!(false, "statuses {:?}: expected {:?}, got {:?}", statuses, fault, result.as_ref().map(|v| v.len())),
        }

        let expected = bound.as_ref().map(micros);
        match (expected, parse::time_bound("created_after", bound)) {
            (None, Ok(None)) => {}
            (Some(Some(m)), Ok(Some(t))) => prop_assert_eq!(t.as_micros(), m),
            (Some(None), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok("created_after")),
            (expected, got) => prop_assert!(false, "expected {:?}, got {:?}", expected, got.map(|t| t.map(Timestamp::as_micros))),
        }

        let (agent, session_id, call_id) = key;
        let fault = if !(agent.is_empty() || is_id(&agent, MAX_ID)) {
            Some("agent")
        } else if !is_id(&session_id, MAX_ID) {
            Some("session_id")
        } else if !is_id(&call_id, MAX_ID) {
            Some("call_id")
        } else {
            None
        };
        match (fault, parse::call_key(agent, session_id, call_id)) {
            (Some(fault), Err(err)) => prop_assert_eq!(invalid_field(&err), Ok(fault)),
            (None, Ok(_)) => {}
            (fault, got) => prop_assert!(false, "call key: expected {:?}, got {:?}", fault, got.map(|k| k.call_id)),
        }
    }
}

// ---- Canonical inputs within the limit ------------------------------------------------------

proptest! {
    #![proptest_config(config(4000))]

    /// An accepted input's canonical form (what the broker stores, shows approvers and hands back
    /// as `input_json`) is within the limit the input passed, and is itself accepted again under
    /// a limit of its own size: the broker's own output can always be submitted again.
    #[test]
    fn canonical_input_stays_within_the_limit_and_is_accepted_again(
        text in prop_oneof![
            (json_object(), any::<u64>()).prop_map(|(v, seed)| render(&v, seed)),
            vec(number_text(), 1..6).prop_map(|numbers| {
                let fields: Vec<String> = numbers.iter().enumerate().map(|(i, n)| format!("\"n{i}\":{n}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
        ],
        slack in 0usize..4,
    ) {
        // The tightest limits the text itself passes.
        let limit = text.len() + slack;
        if let Some(canon) = canonical(&text, limit) {
            prop_assert!(canon.len() <= limit, "{} ({} bytes, limit {}) became {} ({} bytes)", show(&text), text.len(), limit, show(&canon), canon.len());
            prop_assert_eq!(canonical(&canon, canon.len()), Some(canon.clone()), "{}", show(&text));
        } else {
            // Refused only because the canonical form is longer than the limit, or a number is
            // beyond the range of a double or would be changed by canonical form.
            let canon = serde_json::from_str::<Value>(&text).map(|v| json::canonical(&v));
            prop_assert!(canon.as_ref().is_err() || canon.as_ref().is_ok_and(|c| c.len() > limit) || !numbers_kept(&text), "{} refused; canonical {:?}", show(&text), canon.map(|c| show(&c)));
        }
    }
}

/// The case the random search found once: a call named twice in a cancel is kept once.
#[test]
fn a_cancel_naming_a_call_twice_keeps_it_once() {
    let target = pb::CancelTarget {
        session_id: "s".into(),
        target: Some(pb::cancel_target::Target::Calls(pb::CallIds {
            call_ids: vec!["x".into(), "y".into(), "x".into()],
        })),
        reason: String::new(),
    };
    match parse::cancel(Some(target), "target").expect("valid").scope {
        CancelScope::Calls(ids) => {
            let ids: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
            assert_eq!(ids, ["x", "y"]);
        }
        other => panic!("{other:?}"),
    }
}
