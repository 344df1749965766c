//! Bad input: a table of malformed requests covering every RPC of the three services
//! (AgentService: Submit, Connect, GetOutcomes, WatchOutcomes, Cancel; ApproverService:
//! Subscribe, Decide, ListPending; AdminService: ListCalls, GetCall) proves, case by case, that
//! each is refused with its exact status code and a message naming the field at fault (guarantee
//! 7), that filters full of quotes, `%`, `_` and SQL fragments are valid and match literally, that
//! after every case the broker still serves, and that no rejected request changed the database
//! (every call, every status, the last event's sequence number). The broker runs with a 64 KiB
//! gRPC message limit so that oversized messages can be sent: they get RESOURCE_EXHAUSTED, the
//! code guarantee 7 names for limits (tonic's own OUT_OF_RANGE is rewritten by the broker), and
//! on a `Connect` stream, which cannot decode past such a message, the stream ends with it.
//!
//! Notes on what the table cannot or does not express:
//! - `page_size` is a `uint32`: a negative page size cannot be encoded, so only huge ones are sent.
//! - A page token of the right shape (`v1.<n>`) that this broker never issued cannot be told from
//!   one it did (tokens are plain positions): it is accepted, and one past the end lists nothing.
//!
//! One file per service area, one test per promise; `table` runs the cases.

mod admin;
mod cancel;
mod connect;
mod decide;
mod list_pending;
mod outcomes;
mod submit;
mod subscribe;
mod table;

/// The table as a whole still covers every RPC with at least 40 cases.
#[test]
fn the_table_holds_at_least_forty_cases() {
    let total = [
        submit::batch_cases(),
        submit::call_cases(),
        connect::request_cases(),
        connect::oversized_connect_message_cases(),
        outcomes::get_outcomes_cases(),
        outcomes::watch_cases(),
        cancel::cancel_cases(),
        cancel::control_characters_in_batch_id_cases(),
        subscribe::subscribe_cases(table::SEED_EVENTS),
        decide::decide_cases(),
        list_pending::list_pending_cases(),
        admin::list_calls_cases(),
        admin::get_call_cases(),
    ]
    .iter()
    .map(Vec::len)
    .sum::<usize>();
    assert!(total >= 40, "the table holds {total} cases");
}
