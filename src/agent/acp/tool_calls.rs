//! What an ACP agent has announced of its tool calls: the fields of every `session/update`
//! `tool_call` and `tool_call_update`, merged per (session, `toolCallId`), so a permission request
//! that carries only part of the tool call (claude-code-acp sends its id, raw input and title;
//! the kind, locations and diff come in the `tool_call` before it) is submitted whole. It only
//! remembers; it never changes what is relayed. A finished tool call is forgotten, and the memory
//! is bounded: a forgotten call is submitted with the request's own fields.

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value};

use super::permission::lay_over;

/// The most tool calls remembered at once; the oldest is forgotten first.
const REMEMBERED: usize = 4096;

/// The announced tool calls of every session.
#[derive(Debug, Default)]
pub struct ToolCalls {
    calls: HashMap<(String, String), Map<String, Value>>,
    order: VecDeque<(String, String)>,
}

impl ToolCalls {
    /// Takes in `params` of a `session/update` notification; anything but a tool call's
    /// announcement or update is ignored.
    pub fn observe(&mut self, params: Option<&Value>) {
        let Some(params) = params else { return };
        let (Some(session_id), Some(Value::Object(update))) = (
            params.get("sessionId").and_then(Value::as_str),
            params.get("update"),
        ) else {
            return;
        };
        let first = match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("tool_call") => true,
            Some("tool_call_update") => false,
            _ => return,
        };
        let Some(tool_call_id) = update.get("toolCallId").and_then(Value::as_str) else {
            return;
        };
        let key = (session_id.to_owned(), tool_call_id.to_owned());
        if matches!(
            update.get("status").and_then(Value::as_str),
            Some("completed" | "failed")
        ) {
            self.calls.remove(&key);
            return;
        }
        let mut fields = update.clone();
        fields.remove("sessionUpdate");
        match self.calls.get_mut(&key) {
            // A second `tool_call` for the same id announces it anew.
            Some(known) if !first => lay_over(known, &fields),
            _ => {
                if self.calls.insert(key.clone(), fields).is_none() {
                    self.order.push_back(key);
                }
                self.forget_oldest();
            }
        }
    }

    /// What was announced of `tool_call_id` in `session_id`.
    pub fn announced(&self, session_id: &str, tool_call_id: &str) -> Option<Map<String, Value>> {
        self.calls
            .get(&(session_id.to_owned(), tool_call_id.to_owned()))
            .cloned()
    }

    fn forget_oldest(&mut self) {
        while self.calls.len() > REMEMBERED {
            match self.order.pop_front() {
                Some(key) => {
                    self.calls.remove(&key);
                }
                None => break,
            }
        }
        // Keys of calls already forgotten (finished) are dropped from the order as well.
        if self.order.len() > 2 * REMEMBERED {
            self.order.retain(|key| self.calls.contains_key(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(update: Value) -> Value {
        json!({"sessionId": "s", "update": update})
    }

    #[test]
    fn updates_are_merged_by_tool_call_id_and_finished_calls_forgotten() {
        let mut calls = ToolCalls::default();
        calls.observe(Some(&update(json!({
            "sessionUpdate": "tool_call", "toolCallId": "t1", "kind": "execute",
            "title": "ls", "rawInput": {"command": "ls"}, "status": "pending",
        }))));
        calls.observe(Some(&update(json!({
            "sessionUpdate": "tool_call_update", "toolCallId": "t1", "title": "ls -l",
            "kind": null,
        }))));
        calls.observe(Some(&update(
            json!({"sessionUpdate": "agent_message_chunk"}),
        )));
        let known = calls.announced("s", "t1").expect("announced");
        assert_eq!(known["kind"], json!("execute"));
        assert_eq!(known["title"], json!("ls -l"));
        assert!(calls.announced("other", "t1").is_none());

        calls.observe(Some(&update(json!({
            "sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
        }))));
        assert!(calls.announced("s", "t1").is_none());
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut calls = ToolCalls::default();
        for n in 0..=REMEMBERED {
            calls.observe(Some(&update(json!({
                "sessionUpdate": "tool_call", "toolCallId": format!("t{n}"),
            }))));
        }
        assert!(calls.announced("s", "t0").is_none());
        assert!(calls.announced("s", &format!("t{REMEMBERED}")).is_some());
        assert_eq!(calls.calls.len(), REMEMBERED);
    }
}
