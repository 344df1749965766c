//! A tool's input: a JSON object, kept in canonical form (sorted keys, no white space) so that
//! two submissions of the same input compare equal whatever their key order or spacing.
//! Numbers keep their exact digits (serde_json's `arbitrary_precision`; only an exponent is
//! spelled `e+N`): the input an approved call runs must be the one submitted. The size limit
//! applies to the text sent and to the canonical form, so whatever the broker stores and returns
//! can be submitted again.

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
        let canonical = value.to_string();
        if canonical.len() > max_bytes {
            return Err(Error::invalid(
                field,
                format!(
                    "must be at most {max_bytes} bytes in canonical form, got {}",
                    canonical.len()
                ),
            ));
        }
        Ok(Self(canonical))
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
    fn numbers_keep_their_digits_and_what_is_stored_can_be_submitted_again() {
        let text = r#"{ "id": 12345678901234567890123, "big": 1e15, "x": 1.10, "neg": -0 }"#;
        let input = ToolInput::parse("input", text, 1024).unwrap();
        assert_eq!(
            input.as_str(),
            r#"{"big":1e+15,"id":12345678901234567890123,"neg":-0,"x":1.10}"#
        );
        let again = ToolInput::parse("input", input.as_str(), input.as_str().len()).unwrap();
        assert_eq!(
            again, input,
            "the canonical form is a fixed point within its own size"
        );
        // `{"a":1e15}` is 10 bytes, 11 in canonical form: the limit holds for both.
        assert!(ToolInput::parse("input", r#"{"a":1e15}"#, 11).is_ok());
        let err = ToolInput::parse("input", r#"{"a":1e15}"#, 10).unwrap_err();
        assert!(err.to_string().contains("canonical form"), "{err}");
    }

    #[test]
    fn only_json_objects_within_the_limit_are_inputs() {
        assert!(ToolInput::parse("input", "[1]", 1024).is_err());
        assert!(ToolInput::parse("input", "not json", 1024).is_err());
        assert!(ToolInput::parse("input", "", 1024).is_err());
        assert!(ToolInput::parse("input", r#"{"a":"xxxxxxxx"}"#, 8).is_err());
    }
}
