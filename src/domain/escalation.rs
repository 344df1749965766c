//! Escalation ladders: what happens to a call nobody answers before its deadline. A ladder is a
//! list of steps, each due a fixed time after the call was requested: a reminder, or an
//! escalation, sent to the webhook endpoints it names (and seen by every subscriber). A ladder
//! comes from the ask rule that sent the call to a human, or else from the default ladder
//! (`--escalation-file`); it is stored with the call when the call is accepted, with the due time
//! of its next step, so a step survives restarts and fires once. The deadline stays what ends a
//! call: a step due at or after it never fires (the call is EXPIRED first).
//!
//! In files and in the policy file a step is `{"after": "15m", "kind": "reminder" |
//! "escalation", "endpoints": ["oncall"]}`. Nothing here does I/O.

use std::time::Duration;

use serde_json::{Value, json};

use super::Timestamp;
use super::webhook::WebhookId;
use crate::error::{Error, Result};

/// At most this many steps in a ladder, and endpoints in a step.
pub const MAX_STEPS: usize = 16;
pub const MAX_STEP_ENDPOINTS: usize = 16;

/// What a step is, to the people it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// The same people are reminded the call still waits.
    Reminder,
    /// Other people are asked to step in.
    Escalation,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Reminder => "reminder",
            StepKind::Escalation => "escalation",
        }
    }

    fn parse(field: &str, text: &str) -> Result<Self> {
        match text {
            "reminder" => Ok(StepKind::Reminder),
            "escalation" => Ok(StepKind::Escalation),
            other => Err(Error::invalid(
                field,
                format!(
                    "must be `reminder` or `escalation`, got `{}`",
                    other.escape_debug()
                ),
            )),
        }
    }
}

/// One rung of a ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationStep {
    /// How long after the call was requested the step is due (positive).
    pub after: Duration,
    pub kind: StepKind,
    /// The webhook endpoints that receive this step's event (besides endpoints whose filter
    /// names its kind). An id no endpoint has delivers nowhere.
    pub endpoints: Vec<WebhookId>,
}

/// A validated ladder: at most [`MAX_STEPS`] steps, each due strictly later than the one before.
/// Empty means "no ladder".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ladder {
    steps: Vec<EscalationStep>,
}

impl Ladder {
    /// A ladder of `steps`, checked; errors name `field[i].after` (or `.endpoints`).
    pub fn new(field: &str, steps: Vec<EscalationStep>) -> Result<Self> {
        if steps.len() > MAX_STEPS {
            return Err(Error::invalid(
                field,
                format!("at most {MAX_STEPS} steps, got {}", steps.len()),
            ));
        }
        for (i, step) in steps.iter().enumerate() {
            if step.after.is_zero() {
                return Err(Error::invalid(
                    format!("{field}[{i}].after"),
                    "must be positive",
                ));
            }
            if step.after > super::MAX_DEADLINE_AHEAD {
                return Err(Error::invalid(
                    format!("{field}[{i}].after"),
                    "must be at most 366d (no deadline is further away)",
                ));
            }
            if i > 0 && step.after <= steps[i - 1].after {
                return Err(Error::invalid(
                    format!("{field}[{i}].after"),
                    format!(
                        "must be later than the step before ({field}[{}].after, {})",
                        i - 1,
                        humantime::format_duration(steps[i - 1].after)
                    ),
                ));
            }
            if step.endpoints.len() > MAX_STEP_ENDPOINTS {
                return Err(Error::invalid(
                    format!("{field}[{i}].endpoints"),
                    format!("at most {MAX_STEP_ENDPOINTS} endpoints"),
                ));
            }
        }
        Ok(Self { steps })
    }

    pub fn steps(&self) -> &[EscalationStep] {
        &self.steps
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// When step `index` of a call requested at `requested` falls due, if that step exists and
    /// comes before the call's `deadline` (a step at or after the deadline never fires).
    pub fn due_at(
        &self,
        index: u32,
        requested: Timestamp,
        deadline: Option<Timestamp>,
    ) -> Option<Timestamp> {
        let step = self.steps.get(index as usize)?;
        let at = requested.saturating_add(step.after);
        deadline.is_none_or(|d| at < d).then_some(at)
    }

    /// A ladder as the policy file and `--escalation-file` write it: a list of steps.
    pub fn from_json(field: &str, value: &Value) -> Result<Self> {
        let list = value
            .as_array()
            .ok_or_else(|| Error::invalid(field, "must be a list of steps"))?;
        let steps = list
            .iter()
            .enumerate()
            .map(|(i, step)| step_from_json(&format!("{field}[{i}]"), step))
            .collect::<Result<Vec<_>>>()?;
        Self::new(field, steps)
    }

    /// The ladder as stored with a call or a rule: JSON with `after` in microseconds.
    pub fn to_stored(&self) -> String {
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| {
                json!({
                    "after_us": s.after.as_micros() as u64,
                    "kind": s.kind.as_str(),
                    "endpoints": s.endpoints.iter().map(WebhookId::as_str).collect::<Vec<_>>(),
                })
            })
            .collect();
        Value::Array(steps).to_string()
    }

    /// A ladder this broker stored (empty text: none).
    pub fn from_stored(text: &str) -> Result<Self> {
        if text.is_empty() {
            return Ok(Self::default());
        }
        let corrupt = |what: &str| Error::Internal(format!("a stored escalation ladder {what}"));
        let value: Value = serde_json::from_str(text).map_err(|_| corrupt("is not JSON"))?;
        let list = value.as_array().ok_or_else(|| corrupt("is not a list"))?;
        let mut steps = Vec::with_capacity(list.len());
        for step in list {
            let after = step["after_us"]
                .as_u64()
                .ok_or_else(|| corrupt("has no after_us"))?;
            let kind = StepKind::parse("kind", step["kind"].as_str().unwrap_or(""))
                .map_err(|_| corrupt("has an unknown kind"))?;
            let endpoints = step["endpoints"]
                .as_array()
                .ok_or_else(|| corrupt("has no endpoints"))?
                .iter()
                .map(|e| WebhookId::from_stored(e.as_str().unwrap_or_default().to_owned()))
                .collect();
            steps.push(EscalationStep {
                after: Duration::from_micros(after),
                kind,
                endpoints,
            });
        }
        Ok(Self { steps })
    }
}

fn step_from_json(field: &str, value: &Value) -> Result<EscalationStep> {
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid(field, "must be a JSON object"))?;
    const KEYS: [&str; 3] = ["after", "kind", "endpoints"];
    if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(Error::invalid(
            format!("{field}.{unknown}"),
            format!("unknown key (the keys are {})", KEYS.join(", ")),
        ));
    }
    let at = |key: &str| format!("{field}.{key}");
    let after = object
        .get("after")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(at("after"), "is required: a duration such as `15m`"))?;
    let after = humantime::parse_duration(after).map_err(|e| {
        Error::invalid(
            at("after"),
            format!("is not a duration such as `90s`, `15m` or `1h30m`: {e}"),
        )
    })?;
    let kind = match object.get("kind") {
        None => StepKind::Reminder,
        Some(Value::String(kind)) => StepKind::parse(&at("kind"), kind)?,
        Some(_) => return Err(Error::invalid(at("kind"), "must be a string")),
    };
    let endpoints = match object.get("endpoints") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let field = format!("{}[{i}]", at("endpoints"));
                let id = id
                    .as_str()
                    .ok_or_else(|| Error::invalid(&field, "must be a string"))?;
                WebhookId::parse(&field, id)
            })
            .collect::<Result<Vec<_>>>()?,
        Some(_) => return Err(Error::invalid(at("endpoints"), "must be a list")),
    };
    Ok(EscalationStep {
        after,
        kind,
        endpoints,
    })
}

/// Parses `--escalation-file`: `{"steps": [...]}`, the ladder of every call left to a human
/// that no ask rule gives a ladder of its own.
pub fn parse_escalation_file(text: &str) -> Result<Ladder> {
    let value: Value = crate::domain::json::parse("escalation file", text)?;
    let steps = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("steps"))
        .ok_or_else(|| {
            Error::invalid(
                "escalation file",
                "must be a JSON object with one key, `steps`, holding a list",
            )
        })?;
    Ladder::from_json("steps", steps)
}

/// A call's ladder and how far up it the call has gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    pub ladder: Ladder,
    /// How many steps have fired: the index of the next one.
    pub fired: u32,
    /// When the next step falls due; `None` once no step is left before the deadline.
    pub next_at: Option<Timestamp>,
}

impl Escalation {
    /// A ladder starting for a call requested at `requested` with `deadline`.
    pub fn start(ladder: Ladder, requested: Timestamp, deadline: Option<Timestamp>) -> Self {
        let next_at = ladder.due_at(0, requested, deadline);
        Self {
            ladder,
            fired: 0,
            next_at,
        }
    }

    /// The step due next, if one is left before the deadline.
    pub fn next_step(&self) -> Option<&EscalationStep> {
        self.next_at?;
        self.ladder.steps().get(self.fired as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(text: &str) -> Result<Ladder> {
        Ladder::from_json("escalation", &serde_json::from_str(text).unwrap())
    }

    #[test]
    fn a_ladder_parses_and_round_trips_through_its_stored_form() {
        let l = ladder(
            r#"[{"after": "5m", "endpoints": ["team"]},
                {"after": "1h", "kind": "escalation", "endpoints": ["oncall", "lead"]}]"#,
        )
        .unwrap();
        assert_eq!(l.steps().len(), 2);
        assert_eq!(l.steps()[0].kind, StepKind::Reminder);
        assert_eq!(l.steps()[1].after, Duration::from_secs(3600));
        assert_eq!(l.steps()[1].endpoints[1].as_str(), "lead");
        assert_eq!(Ladder::from_stored(&l.to_stored()).unwrap(), l);
        assert!(Ladder::from_stored("").unwrap().is_empty());
    }

    #[test]
    fn steps_out_of_order_or_malformed_are_refused_naming_the_field() {
        let err = |text: &str| ladder(text).unwrap_err().to_string();
        let e = err(r#"[{"after": "10m"}, {"after": "10m"}]"#);
        assert!(e.starts_with("escalation[1].after: must be later"), "{e}");
        assert!(err(r#"[{"after": "0s"}]"#).starts_with("escalation[0].after: must be positive"));
        assert!(err(r#"[{"after": "soon"}]"#).starts_with("escalation[0].after: is not"));
        assert!(err(r#"[{}]"#).starts_with("escalation[0].after: is required"));
        assert!(err(r#"[{"after": "1m", "kind": "nag"}]"#).starts_with("escalation[0].kind"));
        assert!(
            err(r#"[{"after": "1m", "endpoints": ["no spaces"]}]"#)
                .starts_with("escalation[0].endpoints[0]")
        );
        assert!(err(r#"[{"after": "1m", "to": []}]"#).starts_with("escalation[0].to: unknown key"));
        assert!(err(r#"{"after": "1m"}"#).starts_with("escalation: must be a list"));
    }

    #[test]
    fn a_step_at_or_after_the_deadline_is_never_due() {
        let l = ladder(r#"[{"after": "1s"}, {"after": "2s"}]"#).unwrap();
        let t0 = Timestamp::from_micros(0);
        assert_eq!(
            l.due_at(0, t0, None),
            Some(Timestamp::from_micros(1_000_000))
        );
        let deadline = Some(Timestamp::from_micros(2_000_000));
        assert_eq!(l.due_at(1, t0, deadline), None);
        assert_eq!(l.due_at(2, t0, None), None);
        let started = Escalation::start(l, t0, Some(Timestamp::from_micros(500_000)));
        assert_eq!(started.next_at, None);
        assert!(started.next_step().is_none());
    }

    #[test]
    fn the_escalation_file_holds_one_key_steps() {
        let l =
            parse_escalation_file(r#"{"steps": [{"after": "30s", "endpoints": ["a"]}]}"#).unwrap();
        assert_eq!(l.steps().len(), 1);
        let e = parse_escalation_file(r#"{"steps": [{"after": "30s"}], "x": 1}"#).unwrap_err();
        assert!(e.to_string().contains("one key, `steps`"), "{e}");
        let e =
            parse_escalation_file(r#"{"steps": [{"after": "2m"}, {"after": "1m"}]}"#).unwrap_err();
        assert!(e.to_string().starts_with("steps[1].after"), "{e}");
    }
}
