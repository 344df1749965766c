//! JSON as the broker reads and writes it: parsed strictly, written canonically (RFC 8785, the
//! JSON Canonicalization Scheme), so that what an approver is shown, what a rule or grant
//! matches and what runs are one and the same text.
//!
//! Strict: an object that names a key twice is refused, at any depth. Parsers disagree on which
//! of the two counts (serde_json and JavaScript keep the last, others the first), so the
//! approver could be shown one value while the tool runs the other.
//!
//! Canonical (RFC 8785): object keys sorted by their UTF-16 code units; no white space; strings
//! escaped as ECMAScript's `JSON.stringify` does (`\"`, `\\`, `\b \f \n \r \t`, other control
//! characters as `\u00xx`, everything else as is); every number an IEEE-754 double printed as
//! ECMAScript prints it. So `1`, `1.0` and `1e0` are one number, `1`, and an integer beyond
//! 2^53 becomes the nearest double (`12345678901234567890` is `12345678901234567000`), as in
//! any JavaScript client. A number beyond the range of a double is refused, not rounded to
//! infinity; one too small for it becomes `0`, as in JavaScript.

use std::fmt::{self, Write};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Result};

/// Parses `text` as JSON, refusing duplicate keys; the error names `field` and, for a
/// duplicate, the key's path in the document.
pub fn parse(field: &str, text: &str) -> Result<Value> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Strict { at: &Path::Root }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| Error::invalid(field, format!("is not valid JSON: {e}")))?;
    Ok(value)
}

/// The canonical (RFC 8785) text of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// Where a value sits in the document, for naming a duplicate key.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => write!(f, "{}", key.escape_debug()),
            Path::Key(parent, key) => write!(f, "{parent}.{}", key.escape_debug()),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// A value at `at`, built like serde_json's own but refusing a key named twice.
struct Strict<'a> {
    at: &'a Path<'a>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let mut list = Vec::new();
        while let Some(value) = seq.next_element_seed(Strict {
            at: &Path::Index(self.at, list.len()),
        })? {
            list.push(value);
        }
        Ok(Value::Array(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "the key `{}` appears twice (refused: parsers disagree on which one counts)",
                    Path::Key(self.at, &key)
                )));
            }
            let value = map.next_value_seed(Strict {
                at: &Path::Key(self.at, &key),
            })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(list) => {
            out.push('[');
            for (i, item) in list.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(object) => {
            let mut entries: Vec<(&String, &Value)> = object.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(item, out);
            }
            out.push('}');
        }
    }
}

/// The largest integer every smaller one of which a double holds exactly.
const EXACT_INTEGERS: u64 = 1 << 53;

fn write_number(n: &Number, out: &mut String) {
    match (n.as_u64(), n.as_i64()) {
        // Exactly representable integers print as themselves (as ECMAScript prints them).
        (Some(u), _) if u <= EXACT_INTEGERS => write!(out, "{u}").expect("a String"),
        (_, Some(i)) if i.unsigned_abs() <= EXACT_INTEGERS => write!(out, "{i}").expect("a String"),
        (Some(u), _) => write_double(u as f64, out),
        (_, Some(i)) => write_double(i as f64, out),
        _ => write_double(n.as_f64().expect("a finite number"), out),
    }
}

/// ECMAScript's Number::toString for a finite double (ECMA-262, 6.1.6.1.20), as RFC 8785
/// requires: the shortest digits that read back as the same double, in plain notation from
/// 1e-6 up to 1e21 and in exponent notation (`1e+21`, `1.5e-7`) beyond.
fn write_double(x: f64, out: &mut String) {
    if x == 0.0 {
        out.push('0'); // `-0` too.
        return;
    }
    if x < 0.0 {
        out.push('-');
    }
    let (digits, exponent) = shortest_digits(x.abs());
    let k = digits.len() as i32;
    // x = 0.digits * 10^n
    let n = exponent + 1;
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if n - 1 < 0 { '-' } else { '+' };
        write!(out, "e{sign}{}", (n - 1).abs()).expect("a String");
    }
}

/// The shortest digits that read back as `x` (positive), and the exponent of the first one:
/// x ~ d.ddd * 10^exponent. Among digit strings of that length, ECMAScript takes the one closest
/// to `x`, and on a tie the even one; Rust's `{:e}` prints the shortest digits but settles a tie
/// upwards (`1424953923781206.25` prints `…206.3`, ECMAScript `…206.2`), so a tie is looked for.
fn shortest_digits(x: f64) -> (String, i32) {
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` has an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    let mut digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let last = digits.as_bytes()[digits.len() - 1];
    if last % 2 == 1 && digits != "1" {
        // The one below, if it reads back as `x` too, is as short: take the closer of the two.
        let mut below = digits.clone();
        below.pop();
        below.push(char::from(last - 1));
        let text = format!("{}.{}e{exponent}", &below[..1], &below[1..]);
        if text.parse::<f64>() == Ok(x) {
            // `x`'s exact decimal expansion (a double has at most 767 significant digits),
            // against the midpoint of the two.
            let exact = format!("{x:.800e}");
            let (exact, _) = exact.split_once('e').expect("an exponent");
            let exact: String = exact.chars().filter(|c| *c != '.').collect();
            let midpoint = format!("{below}5");
            let exact_head = &exact[..midpoint.len()];
            let tail_is_zero = exact[midpoint.len()..].bytes().all(|b| b == b'0');
            if exact_head < midpoint.as_str() || (exact_head == midpoint && tail_is_zero) {
                digits = below;
            }
        }
    }
    (digits, exponent)
}

fn write_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Runs of characters that need no escape are copied whole: inputs and receipts are mostly
    // such runs, and copying a character at a time was most of the cost of writing them.
    let mut plain = 0;
    for (at, byte) in s.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            byte if byte < b' ' => "",
            _ => continue,
        };
        out.push_str(&s[plain..at]);
        if escape.is_empty() {
            write!(out, "\\u{byte:04x}").expect("a String");
        } else {
            out.push_str(escape);
        }
        plain = at + 1;
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical_text(text: &str) -> String {
        canonical(&parse("input", text).unwrap())
    }

    fn double(x: f64) -> String {
        let mut out = String::new();
        write_double(x, &mut out);
        out
    }

    /// RFC 8785, appendix B: IEEE-754 bit patterns and their canonical text.
    #[test]
    fn numbers_print_as_rfc_8785_appendix_b_says() {
        let vectors: [(u64, &str); 24] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, text) in vectors {
            let x = f64::from_bits(bits);
            assert_eq!(double(x), text, "{bits:#018x}");
            // And the same through parsing, from the text a client might send.
            let sent = format!(r#"{{"n":{x:e}}}"#);
            assert_eq!(
                canonical_text(&sent),
                format!(r#"{{"n":{text}}}"#),
                "{sent}"
            );
        }
    }

    #[test]
    fn spellings_of_one_number_are_one_canonical_text() {
        for text in [
            r#"{"n":1}"#,
            r#"{"n":1.0}"#,
            r#"{"n":1e0}"#,
            r#"{"n":10E-1}"#,
        ] {
            assert_eq!(canonical_text(text), r#"{"n":1}"#, "{text}");
        }
        assert_eq!(canonical_text(r#"{"n":-0}"#), r#"{"n":0}"#);
        assert_eq!(canonical_text(r#"{"n":-0.0}"#), r#"{"n":0}"#);
        assert_eq!(canonical_text(r#"{"n":1e21}"#), r#"{"n":1e+21}"#);
        assert_eq!(
            canonical_text(r#"{"n":1e20}"#),
            r#"{"n":100000000000000000000}"#
        );
        assert_eq!(canonical_text(r#"{"n":1.5e-7}"#), r#"{"n":1.5e-7}"#);
        assert_eq!(
            canonical_text(r#"{"n":-9007199254740993}"#),
            r#"{"n":-9007199254740992}"#
        );
    }

    /// JavaScript reads an integer beyond 2^53 as the nearest double, and so does the broker.
    #[test]
    fn integers_beyond_two_to_the_53_become_the_nearest_double() {
        assert_eq!(
            canonical_text(r#"{"n":9007199254740993}"#),
            r#"{"n":9007199254740992}"#
        );
        assert_eq!(
            canonical_text(r#"{"n":12345678901234567890}"#),
            r#"{"n":12345678901234567000}"#
        );
        assert_eq!(
            canonical_text(r#"{"n":123456789012345678901234567890}"#),
            r#"{"n":1.2345678901234568e+29}"#
        );
    }

    #[test]
    fn numbers_beyond_a_double_are_refused() {
        for text in [r#"{"n":1e309}"#, r#"{"n":-1e400}"#] {
            let err = parse("input_json", text).unwrap_err().to_string();
            assert!(err.starts_with("input_json: "), "{err}");
            assert!(err.contains("out of range"), "{err}");
        }
        assert_eq!(canonical_text(r#"{"n":1e-400}"#), r#"{"n":0}"#);
    }

    /// RFC 8785, 3.2.3: keys sorted by UTF-16 code units, not by UTF-8 bytes or code points
    /// (U+1F600 sorts before U+FB33 in UTF-16, after it in UTF-8); strings as `JSON.stringify`.
    #[test]
    fn keys_sort_by_utf16_code_units_and_strings_escape_as_json_stringify() {
        let text = "{\"\u{fb33}\":1,\"\u{1f600}\":2,\"b\":3,\"a\":{\"z\":1,\"y\":2},\"\u{80}\":4}";
        assert_eq!(
            canonical_text(text),
            "{\"a\":{\"y\":2,\"z\":1},\"b\":3,\"\u{80}\":4,\"\u{1f600}\":2,\"\u{fb33}\":1}"
        );
        assert_eq!(
            canonical_text(r#"{"s":"\u0041\u000f\n\"\\/\u007f\u2028\b\f\r\t\u00e9"}"#),
            "{\"s\":\"A\\u000f\\n\\\"\\\\/\u{7f}\u{2028}\\b\\f\\r\\t\u{e9}\"}"
        );
    }

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth_naming_its_path() {
        let err = parse("batch.calls[0].input_json", r#"{"a":1,"a":2}"#)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("batch.calls[0].input_json: "), "{err}");
        assert!(err.contains("the key `a` appears twice"), "{err}");
        let err = parse("input", r#"{"x":[{"ok":1},{"y":{"b":1,"b":1}}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the key `x[1].y.b` appears twice"), "{err}");
        // The same key in two different objects is no duplicate.
        assert!(parse("input", r#"{"a":{"a":1},"b":{"a":2}}"#).is_ok());
    }

    #[test]
    fn trailing_text_and_malformed_json_are_refused() {
        assert!(parse("input", r#"{"a":1} x"#).is_err());
        assert!(parse("input", r#"{"a":1,}"#).is_err());
        assert!(parse("input", "").is_err());
    }
}
