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
//! ECMAScript prints it. So `1`, `1.0` and `1e0` are one number, `1`.
//!
//! Exact (I-JSON, RFC 7493, 2.2): canonical form must never change the number a client wrote,
//! or the tool runs with another id or amount than the one the approver was asked about. So a
//! number is refused, naming its path, unless
//! - it is an integer (however spelt: `1.0`, `1e3`) whose canonical text is that same integer:
//!   `9007199254740993` (2^53 + 1, whose nearest double is 2^53) and `18446744073709551616`
//!   (2^64, a double, but printed `18446744073709552000`) are refused, `12345678901234567000`
//!   is not; or
//! - it has a fraction, at most 17 significant digits (a double's precision: `0.1` and
//!   `0.10000000000000001` are one double, printed `0.1`, the convention every JSON reader
//!   follows) and a normal double's magnitude, or else a canonical text that says the same
//!   decimal as written. `3.141592653589793238` (more digits than a double holds), `1e-400`
//!   (which would become `0`) and `1.5e-320` (a subnormal double holds fewer digits) are
//!   refused. A number beyond the range of a double (`1e400`) is refused too.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt::{self, Write};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::error::{Error, Result};

/// Parses `text` as JSON, refusing duplicate keys; the error names `field` and, for a
/// duplicate, the key's path in the document.
/// A number canonical form would change (see the module's doc) is refused naming its path.
pub fn parse(field: &str, text: &str) -> Result<Value> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let numbers = Numbers {
        text: text.as_bytes(),
        at: Cell::new(0),
        inexact: RefCell::new(None),
    };
    let value = Strict {
        at: &Path::Root,
        numbers: &numbers,
    }
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value))
    .map_err(|e| match numbers.inexact.take() {
        Some(reason) => Error::invalid(field, reason),
        None => Error::invalid(field, format!("is not valid JSON: {e}")),
    })?;
    Ok(value)
}

/// The numbers of the text being parsed, in the order the parser meets them, so that each one
/// the parser reads as a double or an integer is judged by what was written: serde_json (without
/// `arbitrary_precision`) keeps only the value.
struct Numbers<'t> {
    text: &'t [u8],
    /// Where the next number is looked for: after the last one met.
    at: Cell<usize>,
    /// Why the number that stopped the parse is refused.
    inexact: RefCell<Option<String>>,
}

impl<'t> Numbers<'t> {
    /// The text of the next number: the parser has just read it, so everything between the
    /// last one and it is strings (skipped whole, as they may hold digits) and punctuation.
    fn next(&self) -> &'t str {
        let bytes = self.text;
        let mut at = self.at.get();
        while at < bytes.len() {
            match bytes[at] {
                b'"' => {
                    at += 1;
                    while at < bytes.len() && bytes[at] != b'"' {
                        at += if bytes[at] == b'\\' { 2 } else { 1 };
                    }
                    at += 1;
                }
                b'-' | b'0'..=b'9' => break,
                _ => at += 1,
            }
        }
        let start = at.min(bytes.len());
        while at < bytes.len()
            && matches!(bytes[at], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
        {
            at += 1;
        }
        self.at.set(at);
        // Only ASCII bytes were taken, so this is whole characters.
        std::str::from_utf8(&bytes[start..at.min(bytes.len())]).unwrap_or_default()
    }

    /// `n` as parsed from the next number in the text, if canonical form keeps what was written
    /// (see the module's doc); else why not, and the parse stops.
    fn exact<E: de::Error>(&self, n: Number, at: &Path<'_>) -> std::result::Result<Value, E> {
        let written = self.next();
        // Most numbers are small integers, which a double holds and canonical form prints as
        // written: no second look.
        let digits = written.trim_start_matches('-');
        if digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Value::Number(n));
        }
        let mut canonical = String::new();
        write_number(&n, &mut canonical);
        let (sent, kept) = (Decimal::of(written), Decimal::of(&canonical));
        let normal = n.as_f64().is_some_and(f64::is_normal);
        if sent == kept || (!sent.is_integer() && sent.digits.len() <= 17 && normal) {
            return Ok(Value::Number(n));
        }
        let shown = if written.len() > 40 {
            format!("{}... ({} characters)", &written[..32], written.len())
        } else {
            written.to_owned()
        };
        let place = match at {
            Path::Root => String::new(),
            at => format!(" at `{at}`"),
        };
        *self.inexact.borrow_mut() = Some(format!(
            "the number {shown}{place} cannot be held exactly by a double: canonical JSON \
             (RFC 8785) would make it {canonical}, so it is refused rather than changed \
             (I-JSON, RFC 7493); send it as a string"
        ));
        Err(E::custom("inexact number"))
    }
}

/// A number's exact decimal value, `digits` x 10^`exponent`, written one way only: no leading
/// or trailing zero in `digits` (none at all for zero, whose sign does not count).
#[derive(Debug, PartialEq, Eq)]
struct Decimal<'t> {
    negative: bool,
    digits: Cow<'t, str>,
    exponent: i64,
}

impl<'t> Decimal<'t> {
    /// The value of JSON number text (`-?int(.frac)?([eE][+-]?exp)?`, already checked by the
    /// parser). An exponent too large to matter saturates: its number is refused either way.
    fn of(text: &'t str) -> Self {
        let (negative, text) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(e) => (&text[..e], &text[e + 1..]),
            None => (text, "0"),
        };
        let (exponent_negative, exponent) = match exponent.as_bytes().first() {
            Some(b'-') => (true, &exponent[1..]),
            Some(b'+') => (false, &exponent[1..]),
            _ => (false, exponent),
        };
        let magnitude = exponent.bytes().fold(0i64, |e, b| {
            (e * 10 + i64::from(b - b'0')).min(1_000_000_000_000)
        });
        let mut exponent = if exponent_negative {
            -magnitude
        } else {
            magnitude
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        exponent -= fraction.len() as i64;
        let digits: Cow<'t, str> = if fraction.is_empty() {
            Cow::Borrowed(whole)
        } else {
            Cow::Owned(format!("{whole}{fraction}"))
        };
        let leading = digits.len() - digits.trim_start_matches('0').len();
        let trailing = digits.len() - digits.trim_end_matches('0').len();
        let digits = if leading == digits.len() {
            Cow::Borrowed("")
        } else {
            exponent += trailing as i64;
            match digits {
                Cow::Borrowed(d) => Cow::Borrowed(&d[leading..d.len() - trailing]),
                Cow::Owned(d) => Cow::Owned(d[leading..d.len() - trailing].to_owned()),
            }
        };
        Self {
            negative: negative && !digits.is_empty(),
            exponent: if digits.is_empty() { 0 } else { exponent },
            digits,
        }
    }

    fn is_integer(&self) -> bool {
        self.exponent >= 0
    }
}

/// The canonical (RFC 8785) text of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// Writes `text`, JSON the broker stored itself, in canonical form: as it is when
/// [`is_canonical`] says it already is (most of what is stored since canonical form became
/// RFC 8785), else parsed and written again (an older row: `1.10`, `1e+15`; a fraction; a key
/// the scan does not follow), or as a JSON string if it is not JSON the parser reads (not JSON
/// at all, or nested deeper than it follows), so that what was stored is always said.
pub fn write_stored(text: &str, out: &mut String) {
    if is_canonical(text) {
        out.push_str(text);
        return;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) => write_value(&value, out),
        Err(_) => write_string(text, out),
    }
}

/// Whether `text` is JSON in canonical form already, judged by one pass over its bytes,
/// building nothing: `true` means `canonical(&parse(text)) == text`. Conservative where a
/// scan cannot tell cheaply, so `false` is also said of some canonical text: a key with an
/// escape (its escaped bytes do not sort as the character they stand for) or with a character
/// beyond U+FFFF (UTF-8 and UTF-16 order those differently), a number other than an integer of
/// at most 15 digits, and nesting deeper than serde_json parses (127 levels).
pub fn is_canonical(text: &str) -> bool {
    let mut scan = Scan {
        bytes: text.as_bytes(),
        at: 0,
    };
    scan.value(0) && scan.at == scan.bytes.len()
}

/// How deep [`is_canonical`] follows a document: serde_json's own limit, past which the broker
/// never parsed an input, so never stored one.
const SCAN_DEPTH: usize = 127;

/// [`is_canonical`]'s cursor.
struct Scan<'t> {
    bytes: &'t [u8],
    at: usize,
}

impl<'t> Scan<'t> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        self.at += usize::from(next);
        next
    }

    fn value(&mut self, depth: usize) -> bool {
        match self.peek() {
            Some(b'{') => depth < SCAN_DEPTH && self.object(depth + 1),
            Some(b'[') => depth < SCAN_DEPTH && self.array(depth + 1),
            Some(b'"') => self.string().is_some(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.integer(),
            _ => false,
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self.bytes[self.at..].starts_with(word);
        self.at += if found { word.len() } else { 0 };
        found
    }

    /// An integer as canonical form prints it: no `-0`, no leading zero, no fraction or
    /// exponent, and at most 15 digits (below 2^53, so a double holds it exactly).
    fn integer(&mut self) -> bool {
        let negative = self.eat(b'-');
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        let plain = match &self.bytes[start..self.at] {
            [] => false,
            [b'0'] => !negative,
            [b'0', ..] => false,
            digits => digits.len() <= 15,
        };
        plain && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))
    }

    /// A string's bytes between its quotes, if every escape in it is the one canonical form
    /// writes for its character (see `write_string`).
    fn string(&mut self) -> Option<&'t [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.at;
        loop {
            match *self.bytes.get(self.at)? {
                b'"' => {
                    let contents = &self.bytes[start..self.at];
                    self.at += 1;
                    return Some(contents);
                }
                b'\\' => {
                    self.at += match &self.bytes[self.at + 1..] {
                        [b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't', ..] => 2,
                        [b'u', b'0', b'0', high @ (b'0' | b'1'), low, ..]
                            if low.is_ascii_digit() || (b'a'..=b'f').contains(low) =>
                        {
                            let byte = (high - b'0') * 16 + (*low as char).to_digit(16)? as u8;
                            match byte {
                                0x08 | 0x09 | 0x0a | 0x0c | 0x0d => return None,
                                _ => 6,
                            }
                        }
                        _ => return None,
                    };
                }
                0x00..=0x1f => return None,
                _ => self.at += 1,
            }
        }
    }

    fn array(&mut self, depth: usize) -> bool {
        self.at += 1;
        if self.eat(b']') {
            return true;
        }
        loop {
            if !self.value(depth) {
                return false;
            }
            if self.eat(b']') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    /// Members in canonical order: keys strictly ascending (so none twice), compared as UTF-8
    /// bytes, which is their UTF-16 order only without escapes and characters beyond U+FFFF.
    fn object(&mut self, depth: usize) -> bool {
        self.at += 1;
        if self.eat(b'}') {
            return true;
        }
        let mut previous: Option<&[u8]> = None;
        loop {
            let Some(key) = self.string() else {
                return false;
            };
            if key.iter().any(|&b| b == b'\\' || b >= 0xf0) || previous.is_some_and(|p| p >= key) {
                return false;
            }
            previous = Some(key);
            if !self.eat(b':') || !self.value(depth) {
                return false;
            }
            if self.eat(b'}') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }
}

/// A JSON object written in canonical form as it goes, for a document of fixed shape (a
/// receipt's statement) written without building a [`Value`] first: its members must be given
/// in canonical key order, which debug builds check.
pub struct ObjectWriter<'o> {
    out: &'o mut String,
    last: Option<&'static str>,
}

impl<'o> ObjectWriter<'o> {
    pub fn open(out: &'o mut String) -> Self {
        out.push('{');
        Self { out, last: None }
    }

    /// Starts the member `key`, whose value the caller writes next into what this returns.
    pub fn key(&mut self, key: &'static str) -> &mut String {
        debug_assert!(
            self.last
                .is_none_or(|last| last.encode_utf16().lt(key.encode_utf16())),
            "`{key}` written after `{}`: not canonical order",
            self.last.unwrap_or_default()
        );
        if self.last.is_some() {
            self.out.push(',');
        }
        self.last = Some(key);
        write_string(key, self.out);
        self.out.push(':');
        self.out
    }

    pub fn close(self) {
        self.out.push('}');
    }
}

/// A JSON array written as it goes, beside [`ObjectWriter`]: the commas and brackets in one
/// place.
pub struct ArrayWriter<'o> {
    out: &'o mut String,
    empty: bool,
}

impl<'o> ArrayWriter<'o> {
    pub fn open(out: &'o mut String) -> Self {
        out.push('[');
        Self { out, empty: true }
    }

    /// Starts the next item, which the caller writes next into what this returns.
    pub fn item(&mut self) -> &mut String {
        if !std::mem::take(&mut self.empty) {
            self.out.push(',');
        }
        self.out
    }

    pub fn close(self) {
        self.out.push(']');
    }
}

/// A string, or `null` for none, in canonical form.
pub fn write_opt_string(s: Option<&str>, out: &mut String) {
    match s {
        Some(s) => write_string(s, out),
        None => out.push_str("null"),
    }
}

/// An unsigned integer in canonical form.
pub fn write_unsigned(n: u64, out: &mut String) {
    write_number(&Number::from(n), out);
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

/// A value at `at`, built like serde_json's own but refusing a key named twice and a number
/// canonical form would change.
struct Strict<'a> {
    at: &'a Path<'a>,
    numbers: &'a Numbers<'a>,
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

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
        self.numbers.exact(v.into(), self.at)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
        self.numbers.exact(v.into(), self.at)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        let n = Number::from_f64(v).ok_or_else(|| E::custom("number out of range"))?;
        self.numbers.exact(n, self.at)
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
            numbers: self.numbers,
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
                numbers: self.numbers,
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

/// A string in canonical form: escaped as ECMAScript's `JSON.stringify` escapes it.
pub fn write_string(s: &str, out: &mut String) {
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
    }

    /// The reason `text` is refused, which must be for a number.
    fn refused(text: &str) -> String {
        let err = parse("calls[0].input_json", text).unwrap_err().to_string();
        assert!(err.starts_with("calls[0].input_json: the number "), "{err}");
        err
    }

    /// I-JSON (RFC 7493, 2.2): an integer canonical form would print as another integer is
    /// refused, naming its path, never rounded: the tool would run with another id.
    #[test]
    fn integers_canonical_form_would_change_are_refused_naming_their_path() {
        let err = refused(r#"{"order":{"id":18446744073709551617}}"#);
        assert_eq!(
            err,
            "calls[0].input_json: the number 18446744073709551617 at `order.id` cannot be held \
             exactly by a double: canonical JSON (RFC 8785) would make it 18446744073709552000, \
             so it is refused rather than changed (I-JSON, RFC 7493); send it as a string"
        );
        let err = refused(r#"{"a":[1,{"n":9007199254740993}]}"#);
        assert!(err.contains("9007199254740993 at `a[1].n`"), "{err}");
        assert!(err.contains("would make it 9007199254740992"), "{err}");
        for text in [
            r#"{"n":-9007199254740993}"#,
            r#"{"n":123456789012345678901234567890}"#,
            r#"{"n":12345678901234567890}"#,
            // 2^64 is a double, but canonical form prints it `18446744073709552000`, which an
            // exact reader (Python) takes for another integer.
            r#"{"n":18446744073709551616}"#,
            // Integers however spelt.
            r#"{"n":9007199254740993.0}"#,
            r#"{"n":9.007199254740993e15}"#,
            r#"{"n":1.8446744073709551617E19}"#,
            r#"{"n":123456789012345678901234567890e-5}"#,
            r#"{"n":-1e400}"#,
        ] {
            let err = parse("input", text).unwrap_err().to_string();
            assert!(err.starts_with("input: "), "{text}: {err}");
            assert!(
                !err.contains("input: is not valid JSON: the"),
                "{text}: {err}"
            );
        }
        // A number that is not in a document still says what it is.
        assert!(refused("9007199254740993").contains("9007199254740993 cannot be held"));
        // A very long number is not echoed whole.
        let long = format!(r#"{{"n":{}}}"#, "9".repeat(5000));
        assert!(parse("input", &long).unwrap_err().to_string().len() < 400);
    }

    #[test]
    fn integers_whose_canonical_text_says_them_are_kept() {
        for (sent, kept) in [
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            ("12345678901234567000", "12345678901234567000"),
            ("1.2345678901234567e19", "12345678901234567000"),
            ("1e21", "1e+21"),
            ("100000000000000000000.000", "100000000000000000000"),
            ("1E300", "1e+300"),
            ("123456789012345", "123456789012345"),
            ("-0", "0"),
            ("0e999999999999999999999", "0"),
            ("-0.000e-5", "0"),
        ] {
            assert_eq!(
                canonical_text(&format!(r#"{{"n":{sent}}}"#)),
                format!(r#"{{"n":{kept}}}"#),
                "{sent}"
            );
        }
    }

    /// A fraction is held to a double's precision, 17 significant digits: within it, texts of
    /// one double are one number (`0.10000000000000001` is how `%.17g` writes `0.1`); beyond
    /// it, or where the double would lose it (zero, subnormal), refused.
    #[test]
    fn fractions_are_kept_to_a_doubles_precision_and_refused_beyond() {
        for (sent, kept) in [
            ("0.1", "0.1"),
            ("0.10000000000000001", "0.1"),
            ("1424953923781206.3", "1424953923781206.2"),
            ("3.141592653589793", "3.141592653589793"),
            ("3.1415926535897931", "3.141592653589793"),
            ("5.6843418860808015E-14", "5.684341886080802e-14"),
            ("2.2250738585072014e-308", "2.2250738585072014e-308"),
            ("5e-324", "5e-324"),
            ("1.5e-7", "1.5e-7"),
            ("0.30000000000000004", "0.30000000000000004"),
        ] {
            assert_eq!(
                canonical_text(&format!(r#"{{"n":{sent}}}"#)),
                format!(r#"{{"n":{kept}}}"#),
                "{sent}"
            );
        }
        for (sent, would_be) in [
            ("3.141592653589793238462643383279", "3.141592653589793"),
            ("0.100000000000000000001", "0.1"),
            ("1e-400", "0"),
            ("-1e-400", "0"),
            ("1.5e-320", "1.5e-320"),
            ("1.2345e-320", "1.2347e-320"),
        ] {
            let err = parse("input", &format!(r#"{{"n":{sent}}}"#));
            match err {
                Ok(value) => assert_eq!(
                    canonical(&value),
                    format!(r#"{{"n":{sent}}}"#),
                    "{sent}: kept only if said exactly"
                ),
                Err(err) => {
                    let err = err.to_string();
                    assert!(err.contains(&format!("the number {sent} at `n`")), "{err}");
                    assert!(err.contains(&format!("make it {would_be},")), "{err}");
                }
            }
        }
        assert!(parse("input", r#"{"n":1.2345e-320}"#).is_err());
        assert!(parse("input", r#"{"n":1e-400}"#).is_err());
    }

    /// Digits in strings, keys included, are not numbers: the numbers are found in order.
    #[test]
    fn numbers_are_told_apart_from_digits_in_strings() {
        let text = r#"{"9007199254740993":"9007199254740993","s":"\"1e-400\\","n":[1.5,9007199254740992]}"#;
        parse("input", text).unwrap();
        let text = r#"{"a":"\"9\"","b":[0.5,"x",9007199254740993]}"#;
        assert!(refused(text).contains("at `b[2]`"));
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

    /// What `is_canonical` says of `text`, checked against the slow truth: when it says yes,
    /// parsing and writing again gives `text` back.
    fn judged(text: &str) -> bool {
        let said = is_canonical(text);
        if said {
            assert_eq!(canonical_text(text), text, "judged canonical but is not");
        }
        said
    }

    #[test]
    fn canonical_text_is_recognised_without_being_written_again() {
        // What canonical form writes, and so what the broker stores, is recognised.
        for text in [
            r#"{"command":"ls -la","cwd":"/tmp"}"#,
            r#"{"a":[1,-2,0,123456789012345,true,false,null,[],{}],"b":{"c":"d"}}"#,
            "{\"s\":\"A\\u000f\\n\\\"\\\\/\u{7f}\u{2028}\\b\\f\\r\\t\u{e9}\"}",
            "{\"a\u{e9}\":3,\"\u{80}\":1,\"\u{fb33}\":2}",
            r#"{"":1,"a":2,"aa":3,"b":4}"#,
            "[]",
            r#""a string""#,
            "7",
        ] {
            assert!(judged(text), "{text}");
            assert_eq!(canonical_text(text), text);
        }
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        assert!(judged(&deep));
    }

    #[test]
    fn text_not_canonical_or_not_sure_is_written_again() {
        for text in [
            // Not canonical: white space, order, a duplicate, numbers as typed, escapes
            // canonical form does not write.
            r#"{ "a":1}"#,
            r#"{"a":1 }"#,
            r#"{"b":1,"a":2}"#,
            r#"{"ab":1,"a":2}"#,
            "{\"\u{fb33}\":1,\"\u{e9}\":2}",
            r#"{"a":{"y":1,"x":2}}"#,
            r#"{"a":1,"a":1}"#,
            r#"{"n":1.0}"#,
            r#"{"n":1.10}"#,
            r#"{"n":1e3}"#,
            r#"{"n":-0}"#,
            r#"{"n":007}"#,
            r#"{"s":"\u0041"}"#,
            r#"{"s":"\/"}"#,
            r#"{"s":"\u000a"}"#,
            r#"{"s":"\u001F"}"#,
            r#"{"s":"\u00e9"}"#,
            r#"{"s":"\u007f"}"#,
            // Canonical perhaps, but not followed: an escape in a key, a key beyond U+FFFF,
            // a large integer, nesting past the parser's limit.
            r#"{"\n":1}"#,
            "{\"\u{1f600}\":2,\"\u{fb33}\":1}",
            r#"{"n":1234567890123456}"#,
            // Not JSON.
            "",
            "{",
            r#"{"a":1"#,
            r#"{"a":1}x"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":tru}"#,
            r#"{"a"}"#,
            "[1,]",
            "{\"a\":\"\u{1}\"}",
        ] {
            assert!(!judged(text), "{text}");
        }
        let deeper = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(!judged(&deeper));
    }

    proptest::proptest! {
        /// Any document the generator makes: written canonically, it is recognised as such
        /// (unless it holds what the scan does not follow); as serde_json writes it (numbers as
        /// typed, escapes of its own), recognised only where that is canonical (`judged`).
        #[test]
        fn is_canonical_agrees_with_writing_again(value in arbitrary_json(3)) {
            let written = canonical(&value);
            judged(&serde_json::to_string(&value).unwrap());
            // Members in the reverse of canonical order: never recognised where an object has
            // two of them.
            if judged(&reversed(&value)) {
                proptest::prop_assert!(!has_two_members(&value), "{}", reversed(&value));
            }
            let followed = followed(&value);
            proptest::prop_assert_eq!(judged(&written), followed, "{}", written);
        }
    }

    /// Whether the scan follows `value` written canonically: no key with an escape or a
    /// character beyond U+FFFF, no number but integers of at most 15 digits.
    fn followed(value: &Value) -> bool {
        match value {
            Value::Object(map) => map.iter().all(|(key, item)| {
                !key.chars()
                    .any(|c| c < ' ' || c == '"' || c == '\\' || c > '\u{ffff}')
                    && followed(item)
            }),
            Value::Array(items) => items.iter().all(followed),
            Value::Number(n) => n
                .as_f64()
                .is_some_and(|x| x.fract() == 0.0 && x.abs() < 1e15),
            _ => true,
        }
    }

    fn has_two_members(value: &Value) -> bool {
        match value {
            Value::Object(map) => map.len() > 1 || map.values().any(has_two_members),
            Value::Array(items) => items.iter().any(has_two_members),
            _ => false,
        }
    }

    /// `value` in canonical form but with every object's members in reverse order.
    fn reversed(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|(a, _), (b, _)| b.encode_utf16().cmp(a.encode_utf16()));
                let members: Vec<String> = entries
                    .into_iter()
                    .map(|(key, item)| {
                        let mut member = String::new();
                        write_string(key, &mut member);
                        format!("{member}:{}", reversed(item))
                    })
                    .collect();
                format!("{{{}}}", members.join(","))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reversed).collect();
                format!("[{}]", items.join(","))
            }
            other => canonical(other),
        }
    }

    /// Short text of the characters canonical form treats apart: escaped ones, `/`, ones
    /// beyond ASCII, and the pair whose UTF-8 and UTF-16 orders differ.
    fn short_text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex(
            "[a-c\\x00-\\x1f\"\\\\/\u{e9}\u{2028}\u{fb33}\u{1f600}]{0,4}",
        )
        .unwrap()
    }

    fn arbitrary_json(depth: u32) -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-10_000_000_000_000_000i64..10_000_000_000_000_000).prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(Value::from),
            short_text().prop_map(Value::String),
        ];
        leaf.prop_recursive(depth, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(short_text(), inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }
}
