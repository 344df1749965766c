//! A tool's input: a JSON object, kept in canonical form (RFC 8785, see [`super::json`]) so that
//! two submissions of the same input compare equal whatever their key order, spacing or
//! spelling of numbers (`1`, `1.0` and `1e0` are one input). An object naming a key twice is
//! refused. The size limit applies to the text sent and to the canonical form, so whatever the
//! broker stores and returns can be submitted again.

use super::json;
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
        let value = json::parse(field, text)?;
        if !value.is_object() {
            return Err(Error::invalid(field, "must be a JSON object"));
        }
        let canonical = json::canonical(&value);
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

    /// Whether this input is `stored`. Stored inputs are canonical, but a row written before
    /// canonical form was RFC 8785 (numbers as typed: `1.10`, `1e+15`) holds other text for
    /// the same input; it is read again in today's form, so a retry across the upgrade is still
    /// the same call.
    pub fn is_stored_as(&self, stored: &ToolInput) -> bool {
        self == stored
            || json::parse("input", &stored.0).is_ok_and(|value| json::canonical(&value) == self.0)
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
    fn numbers_are_canonical_doubles_and_what_is_stored_can_be_submitted_again() {
        let text = r#"{ "id": 12345678901234568000000, "big": 1e15, "x": 1.10, "neg": -0 }"#;
        let input = ToolInput::parse("input", text, 1024).unwrap();
        assert_eq!(
            input.as_str(),
            r#"{"big":1000000000000000,"id":1.2345678901234568e+22,"neg":0,"x":1.1}"#
        );
        let again = ToolInput::parse("input", input.as_str(), input.as_str().len()).unwrap();
        assert_eq!(
            again, input,
            "the canonical form is a fixed point within its own size"
        );
        // `{"a":1e20}` is 10 bytes, 27 in canonical form: the limit holds for both.
        assert!(ToolInput::parse("input", r#"{"a":1e20}"#, 27).is_ok());
        let err = ToolInput::parse("input", r#"{"a":1e20}"#, 26).unwrap_err();
        assert!(err.to_string().contains("canonical form"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_refused_naming_the_field_and_the_key() {
        let err = ToolInput::parse("batch.calls[0].input_json", r#"{"a":1,"a":2}"#, 1024)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("batch.calls[0].input_json: "), "{err}");
        assert!(err.contains("`a` appears twice"), "{err}");
        let err = ToolInput::parse("edited_input_json", r#"{"o":{"k":1,"k":1}}"#, 1024)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`o.k` appears twice"), "{err}");
    }

    /// A row stored before canonical form was RFC 8785 kept numbers as typed.
    #[test]
    fn an_input_stored_in_the_older_canonical_form_is_the_same_input() {
        let stored = ToolInput::from_stored(r#"{"big":1e+15,"x":1.10}"#.to_owned());
        let sent = ToolInput::parse("input", r#"{"x":1.1,"big":1000000000000000}"#, 1024).unwrap();
        assert!(sent.is_stored_as(&stored));
        let other = ToolInput::parse("input", r#"{"x":1.2,"big":1e15}"#, 1024).unwrap();
        assert!(!other.is_stored_as(&stored));
    }

    #[test]
    fn only_json_objects_within_the_limit_are_inputs() {
        assert!(ToolInput::parse("input", "[1]", 1024).is_err());
        assert!(ToolInput::parse("input", "not json", 1024).is_err());
        assert!(ToolInput::parse("input", "", 1024).is_err());
        assert!(ToolInput::parse("input", r#"{"a":"xxxxxxxx"}"#, 8).is_err());
    }
}
