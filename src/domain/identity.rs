//! Who a person (or an agent acting for one) is, in the one form every comparison uses.
//!
//! Two-person rules and "nobody approves their own call" count people, so `Carol`, `carol` and a
//! fullwidth `ｃａｒｏｌ` must be one person, and no identity may read as two (`x,y` once decided
//! alone as `approver:x,y`). An identity is therefore parsed once, where it enters (a token file,
//! a request's `approver` while auth is off, a call's `requested_by`): Unicode NFKC, full case
//! folding, NFKC again (folding can undo a composition), trimmed; control, separator and format
//! characters, and commas, are refused. Everything inside compares the canonical text only.
//!
//! Stored texts written before identities were canonical are compared through [`canonical`]
//! too, so an old row's `Carol` still meets the token of `carol`.

use std::fmt;

use unicode_normalization::UnicodeNormalization;

use crate::error::{Error, Result};

/// At most this many bytes, canonical.
pub const MAX_IDENTITY_BYTES: usize = 256;

/// A canonical identity (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Identity(String);

impl Identity {
    /// Parses `text` into its canonical form, refusing what could hide or split a person;
    /// `field` names the setting or request field in errors.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        let canonical = canonical(text);
        if canonical.is_empty() {
            return Err(Error::invalid(field, "an identity must not be empty"));
        }
        if canonical.len() > MAX_IDENTITY_BYTES {
            return Err(Error::invalid(
                field,
                format!("an identity is at most {MAX_IDENTITY_BYTES} bytes"),
            ));
        }
        if let Some(c) = canonical.chars().find(|&c| refused(c)) {
            let what = if c == ',' {
                "a comma (several people are a list, never one identity with commas)".to_owned()
            } else {
                format!(
                    "U+{:04X}, a control, separator or format character (they hide or split \
                     what a person reads)",
                    c as u32
                )
            };
            return Err(Error::invalid(
                field,
                format!("the identity `{}` contains {what}", text.escape_debug()),
            ));
        }
        Ok(Self(canonical))
    }

    /// An identity stored by this broker (canonical when written, or from before identities
    /// were; either way compared canonically from here on).
    pub fn from_stored(text: &str) -> Self {
        Self(canonical(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Whether `text`, as stored or sent, names this identity.
    pub fn is(&self, text: &str) -> bool {
        !text.is_empty() && canonical(text) == self.0
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The canonical form of `text`: NFKC, case-folded, NFKC again, trimmed. Refuses nothing (see
/// [`Identity::parse`] for what an identity may not contain).
pub fn canonical(text: &str) -> String {
    let composed: String = text.nfkc().collect();
    let folded = caseless::default_case_fold_str(&composed);
    folded.nfkc().collect::<String>().trim().to_owned()
}

/// Control (Cc), format (Cf), separator (Zs, Zl, Zp: `is_whitespace` holds them all) characters,
/// and commas.
fn refused(c: char) -> bool {
    c == ',' || c.is_control() || c.is_whitespace() || is_format(c)
}

/// Unicode's format characters (Cf) an identity could carry unseen: soft hyphen, Arabic and
/// Syriac marks, Mongolian vowel separator, zero-width and direction marks, invisible operators,
/// the BOM, interlinear annotation marks, tag characters, and the rest of the Cf list.
fn is_format(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_width_variants_are_one_identity() {
        let carol = Identity::parse("approver", "carol").unwrap();
        for variant in ["Carol", "CAROL", " carol ", "ｃａｒｏｌ", "Ｃａｒｏｌ"] {
            assert_eq!(
                Identity::parse("approver", variant).unwrap(),
                carol,
                "{variant}"
            );
            assert!(carol.is(variant), "{variant}");
        }
        // Full case folding, not just lowercase: ß and ss are one.
        assert_eq!(
            Identity::parse("a", "STRASSE").unwrap(),
            Identity::parse("a", "straße").unwrap()
        );
        assert!(!carol.is(""));
    }

    #[test]
    fn commas_separators_controls_and_format_characters_are_refused_naming_the_field() {
        for bad in [
            "x,y",
            "a b",
            "a\tb",
            "a\u{200B}b",
            "a\u{202E}b",
            "a\u{00AD}b",
            "a\u{2028}b",
            "a\u{E0041}b",
            "a\u{0007}b",
            "",
            "   ",
        ] {
            let err = Identity::parse("requested_by", bad).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(err.to_string().starts_with("requested_by"), "{err}");
        }
        // A fullwidth comma is a comma once normalised.
        assert!(Identity::parse("a", "x\u{FF0C}y").is_err());
        assert!(Identity::parse("a", &"x".repeat(257)).is_err());
    }
}
