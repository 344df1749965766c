//! A tool's input: a JSON object, kept in canonical form (sorted keys, no white space) so that
//! two submissions of the same input compare equal whatever their key order or spacing.

use crate::error::{Error, Result};

/// The default limit on an input's size, in bytes of JSON text.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolInput(String);

impl ToolInput {
    /// Parses `text` as a JSON object of at most `max_bytes`; the error names `field`.
    pub fn parse(field: &str, text: &str, max_bytes: usize) -> Result<Self> {
        if text.len() > max_bytes {
            return Err(Error::invalid(
                field,
                format!("must be at most {max_bytes} bytes, got {}", text.len()),
            ));
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid(field, format!("is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(Error::invalid(field, "must be a JSON object"));
        }
        // serde_json's map is ordered by key (no `preserve_order`), so this is canonical.
        Ok(Self(value.to_string()))
    }

    /// Wraps canonical JSON read back from the store.
    pub fn from_stored(canonical: String) -> Self {
        Self(canonical)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_white_space_do_not_matter() {
        let a = ToolInput::parse("input", r#"{"b": 1, "a": {"y": [1, 2], "x": null}}"#, 1024);
        let b = ToolInput::parse("input", r#"{"a":{"x":null,"y":[1,2]},"b":1}"#, 1024);
        assert_eq!(a.unwrap(), b.unwrap());
    }

    #[test]
    fn only_json_objects_within_the_limit_are_inputs() {
        assert!(ToolInput::parse("input", "[1]", 1024).is_err());
        assert!(ToolInput::parse("input", "not json", 1024).is_err());
        assert!(ToolInput::parse("input", "", 1024).is_err());
        assert!(ToolInput::parse("input", r#"{"a":"xxxxxxxx"}"#, 8).is_err());
    }
}
