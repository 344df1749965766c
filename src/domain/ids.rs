//! Identifiers, parsed once at the edge: a value of these types is known to be valid.

use std::fmt;

use super::invisible;
use crate::error::{Error, Result};

/// At most this many bytes in a session or call id.
pub const MAX_ID_BYTES: usize = 256;
/// At most this many bytes in a tool name.
pub const MAX_TOOL_BYTES: usize = 128;

fn parse_text(field: &str, value: String, max_bytes: usize) -> Result<String> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > max_bytes {
        return Err(Error::invalid(
            field,
            format!("must be at most {max_bytes} bytes, got {}", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    refuse_invisible(field, &value)?;
    Ok(value)
}

/// Refuses a name holding a character that changes how text looks without showing itself
/// (see [`super::invisible`]): two ids that look the same must be the same id.
pub fn refuse_invisible(field: &str, value: &str) -> Result<()> {
    match invisible::first_invisible(value) {
        Some(c) => Err(Error::invalid(
            field,
            format!(
                "must not contain the invisible or direction-changing character {}",
                invisible::code_point(c)
            ),
        )),
        None => Ok(()),
    }
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates `value`; the error names `field`.
            pub fn parse(field: &str, value: impl Into<String>) -> Result<Self> {
                parse_text(field, value.into(), $max).map(Self)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Wraps a value read back from the store, where it was validated on the way in.
            pub fn from_stored(value: String) -> Self {
                Self(value)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_id!(
    /// One conversation of one agent, chosen by the agent.
    SessionId,
    MAX_ID_BYTES
);
text_id!(
    /// The model's own tool-call id.
    CallId,
    MAX_ID_BYTES
);
text_id!(
    /// The name of the tool a call invokes.
    ToolName,
    MAX_TOOL_BYTES
);
text_id!(
    /// A batch: the calls of one submit. Assigned by the broker; clients name it to cancel.
    BatchId,
    MAX_ID_BYTES
);
text_id!(
    /// The agent that owns a session. Until authentication exists every call has the owner
    /// [`AgentId::default_owner`].
    AgentId,
    MAX_ID_BYTES
);

impl AgentId {
    /// The owner of every call while authentication is off.
    pub fn default_owner() -> Self {
        Self("default".to_owned())
    }

    /// `value`, or the default owner when it is empty.
    pub fn parse_or_default(field: &str, value: String) -> Result<Self> {
        if value.is_empty() {
            Ok(Self::default_owner())
        } else {
            Self::parse(field, value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_empty_oversized_and_control_characters() {
        assert!(CallId::parse("call_id", "").is_err());
        assert!(CallId::parse("call_id", "a".repeat(257)).is_err());
        assert!(CallId::parse("call_id", "a".repeat(256)).is_ok());
        assert!(CallId::parse("call_id", "a\nb").is_err());
        assert!(ToolName::parse("tool", "t".repeat(129)).is_err());
        let err = SessionId::parse("batch.session_id", "").unwrap_err();
        assert_eq!(err.to_string(), "batch.session_id: must not be empty");
    }

    #[test]
    fn ids_and_tool_names_refuse_invisible_and_direction_changing_characters() {
        for c in [
            '\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}', '\u{200B}', '\u{2060}', '\u{FEFF}',
        ] {
            let err = ToolName::parse("batch.calls[0].tool", format!("read{c}_file")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "batch.calls[0].tool: must not contain the invisible or direction-changing \
                     character {}",
                    invisible::code_point(c)
                )
            );
            assert!(CallId::parse("call_id", format!("{c}toolu_1")).is_err());
            assert!(SessionId::parse("session_id", format!("s{c}")).is_err());
            assert!(AgentId::parse("agent", format!("a{c}b")).is_err());
        }
        assert!(CallId::parse("call_id", "toolu_é中").is_ok());
    }
}
