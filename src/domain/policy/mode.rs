//! A rule's mode: whether it decides calls (`enforce`), is only tried on them and its would-be
//! verdict recorded (`shadow`), or is set aside (`disabled`). Shadow lets an operator see what
//! a rule would do to real traffic before it decides anything.

use std::fmt;

use crate::error::{Error, Result};

/// Whether a rule decides, is tried in shadow, or is set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RuleMode {
    /// It decides the calls it rules (the default, and every rule before modes existed).
    #[default]
    Enforce,
    /// It decides nothing; at submit, what it would have done is recorded with the call.
    Shadow,
    /// It is ignored by submit, grants and Explain; kept so it can be turned on again.
    Disabled,
}

impl RuleMode {
    /// The stored code; the same numbers as the protobuf `RuleMode`.
    pub fn code(self) -> i64 {
        match self {
            RuleMode::Enforce => 1,
            RuleMode::Shadow => 2,
            RuleMode::Disabled => 3,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(RuleMode::Enforce),
            2 => Some(RuleMode::Shadow),
            3 => Some(RuleMode::Disabled),
            _ => None,
        }
    }

    /// The policy file's spelling: `enforce`, `shadow` or `disabled`.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        match text {
            "enforce" => Ok(RuleMode::Enforce),
            "shadow" => Ok(RuleMode::Shadow),
            "disabled" => Ok(RuleMode::Disabled),
            other => Err(Error::invalid(
                field,
                format!("must be `enforce`, `shadow` or `disabled`, got `{other}`"),
            )),
        }
    }
}

impl fmt::Display for RuleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleMode::Enforce => "enforce",
            RuleMode::Shadow => "shadow",
            RuleMode::Disabled => "disabled",
        })
    }
}
