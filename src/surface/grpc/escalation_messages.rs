//! Escalation ladders at the edge: the `EscalationStep` list of a Rule parsed into a validated
//! [`Ladder`], and ladders, a call's progress and fired steps rendered back. Kept beside
//! `parse` and `render` so the whole protobuf shape of escalation reads in one place.

use std::time::Duration;

use crate::domain::escalation::{Escalation, EscalationStep, Ladder, StepKind};
use crate::domain::webhook::WebhookId;
use crate::domain::{Event, MAX_DEADLINE_AHEAD};
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

use super::render::timestamp;

/// A rule's ladder, found at `field` (`rule.escalation`); errors name the step and its part.
pub fn ladder(field: &str, steps: Vec<pb::EscalationStep>) -> Result<Ladder> {
    let steps = steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| self::step(&format!("{field}[{i}]"), step))
        .collect::<Result<Vec<_>>>()?;
    Ladder::new(field, steps)
}

fn step(field: &str, step: pb::EscalationStep) -> Result<EscalationStep> {
    let at = |name: &str| format!("{field}.{name}");
    let after = step
        .after
        .ok_or_else(|| Error::invalid(at("after"), "is required"))?;
    if after.seconds < 0 || after.nanos < 0 || after.nanos >= 1_000_000_000 {
        return Err(Error::invalid(at("after"), "must be a positive duration"));
    }
    let after = Duration::new(after.seconds as u64, after.nanos as u32);
    if after > MAX_DEADLINE_AHEAD {
        return Err(Error::invalid(at("after"), "must be at most 366d"));
    }
    let kind = match pb::EscalationStepKind::try_from(step.kind) {
        Ok(pb::EscalationStepKind::Unspecified | pb::EscalationStepKind::Reminder) => {
            StepKind::Reminder
        }
        Ok(pb::EscalationStepKind::Escalation) => StepKind::Escalation,
        Err(_) => {
            return Err(Error::invalid(
                at("kind"),
                "must be ESCALATION_STEP_KIND_REMINDER or ESCALATION_STEP_KIND_ESCALATION",
            ));
        }
    };
    let endpoints = step
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, id)| WebhookId::parse(&format!("{}[{i}]", at("endpoints")), id))
        .collect::<Result<Vec<_>>>()?;
    Ok(EscalationStep {
        after,
        kind,
        endpoints,
    })
}

fn step_kind(kind: StepKind) -> pb::EscalationStepKind {
    match kind {
        StepKind::Reminder => pb::EscalationStepKind::Reminder,
        StepKind::Escalation => pb::EscalationStepKind::Escalation,
    }
}

/// A ladder's steps as a Rule and a Call carry them.
pub fn steps(ladder: &Ladder) -> Vec<pb::EscalationStep> {
    ladder
        .steps()
        .iter()
        .map(|s| pb::EscalationStep {
            after: Some(prost_types::Duration {
                seconds: s.after.as_secs() as i64,
                nanos: s.after.subsec_nanos() as i32,
            }),
            kind: step_kind(s.kind) as i32,
            endpoints: s.endpoints.iter().map(|e| e.as_str().to_owned()).collect(),
        })
        .collect()
}

/// A call's escalation: its ladder and progress.
pub fn escalation(e: &Escalation) -> pb::Escalation {
    pb::Escalation {
        steps: steps(&e.ladder),
        fired: e.fired,
        next_step_at: e.next_at.map(timestamp),
    }
}

/// A fired step's event for subscribers; `None` for any other event.
pub fn fired(event: &Event) -> Option<pb::EscalationFired> {
    let step = event.fired_step()?;
    Some(pb::EscalationFired {
        call: Some(super::render::call(&event.call)),
        step: event.step?,
        kind: step_kind(step.kind) as i32,
    })
}
