//! Input matchers: how narrowly a grant or a rule applies to a tool's input. Any input; exactly
//! one input (compared in canonical JSON, so key order and white space do not matter); or
//! conditions on fields of the input, all of which must hold.
//!
//! A field is a top-level key (`command`) or a dotted path into nested objects (`options.force`).
//! A condition on a field that is missing never holds; `prefix` and `glob` hold only for string
//! fields; `equals` compares any JSON value, by its canonical text (RFC 8785: so the number `1`
//! is `1.0`, and `"\u0041"` is `"A"`). Matchers are stored, and written in the policy file, as JSON:
//! `{"any": true}`, `{"exact": {...}}` or `{"fields": [{"field": "command", "prefix": "git status"}]}`.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value, json};

use super::glob::Glob;
use crate::domain::{ToolInput, json};
use crate::error::{Error, Result};

/// At most this many conditions in one matcher.
pub const MAX_CONDITIONS: usize = 16;
/// At most this many bytes in a field path or a condition's value.
pub const MAX_FIELD_BYTES: usize = 256;
pub const MAX_VALUE_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// Every input.
    Any,
    /// Exactly this input.
    Exact(ToolInput),
    /// Inputs where every condition holds (at least one condition).
    Fields(Vec<FieldCondition>),
}

/// One condition on one field of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCondition {
    path: FieldPath,
    test: FieldTest,
}

/// A top-level key or a dotted path into nested objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    segments: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldTest {
    /// The field is this JSON value (equal values have equal canonical text).
    Equals(Value),
    /// The field is a string starting with this.
    Prefix(String),
    /// The field is a string matching this glob.
    Glob(Glob),
    /// The field is a command that is these words, or these words then a space and arguments
    /// holding no shell metacharacter ([`SHELL_METACHARACTERS`]): `npm test` matches
    /// `npm test -- --watch` but never `npm test; rm -rf ~` nor `npm testing` (Remember a
    /// prefix, docs/answers.md).
    CommandPrefix(String),
    /// The field is a path that is this directory or under it, with no `..` segment.
    PathUnder(String),
    /// The field is an `http://` or `https://` URL whose host is this one (any port), without
    /// user info.
    UrlHost(String),
}

/// What may not follow a remembered command prefix: anything that could end the command and
/// start another (`;`, `&`, `|`, a line break), redirect it (`<`, `>`), or run a command inside
/// it (`$`, a backtick, parentheses), and the backslash that could escape into one of those.
pub const SHELL_METACHARACTERS: &[char] = &[
    ';', '&', '|', '<', '>', '(', ')', '$', '`', '\\', '\n', '\r',
];

impl FieldPath {
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        if text.is_empty() || text.len() > MAX_FIELD_BYTES {
            return Err(Error::invalid(
                field,
                format!("must be 1 to {MAX_FIELD_BYTES} bytes"),
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(Error::invalid(field, "must not contain control characters"));
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(Error::invalid(
                field,
                format!("`{text}` has an empty segment (use `key` or `outer.inner`)"),
            ));
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value at this path in `input`, if every segment names a key of an object.
    fn find<'v>(&self, input: &'v Value) -> Option<&'v Value> {
        self.segments
            .iter()
            .try_fold(input, |value, key| value.as_object()?.get(key))
    }
}

impl FieldTest {
    /// `equals`: any JSON value.
    pub fn equals(field: &str, value: &Value) -> Result<Self> {
        let canonical = json::canonical(value);
        check_value_size(field, &canonical)?;
        // Read back from canonical text, as inputs are: equal values, equal canonical text.
        let value = serde_json::from_str(&canonical).unwrap_or_else(|_| value.clone());
        Ok(FieldTest::Equals(value))
    }

    pub fn prefix(field: &str, prefix: &str) -> Result<Self> {
        if prefix.is_empty() {
            return Err(Error::invalid(
                field,
                "must not be empty (to match any string, use glob `*`)",
            ));
        }
        check_value_size(field, prefix)?;
        Ok(FieldTest::Prefix(prefix.to_owned()))
    }

    pub fn glob(field: &str, pattern: &str) -> Result<Self> {
        check_value_size(field, pattern)?;
        Ok(FieldTest::Glob(Glob::parse(field, pattern)?))
    }

    /// `command_prefix`: words a command starts with, themselves free of shell metacharacters.
    pub fn command_prefix(field: &str, prefix: &str) -> Result<Self> {
        let words = prefix.trim();
        if words.is_empty() {
            return Err(Error::invalid(field, "must name the command's first words"));
        }
        check_value_size(field, words)?;
        if let Some(c) = words.chars().find(|c| SHELL_METACHARACTERS.contains(c)) {
            return Err(Error::invalid(
                field,
                format!("must not hold the shell metacharacter {c:?}: name the command's words"),
            ));
        }
        Ok(FieldTest::CommandPrefix(words.to_owned()))
    }

    /// `path_under`: a directory, without a `..` segment (a trailing `/` is dropped).
    pub fn path_under(field: &str, dir: &str) -> Result<Self> {
        let trimmed = dir.trim_end_matches('/');
        let dir = if trimmed.is_empty() && dir.starts_with('/') {
            "/"
        } else {
            trimmed
        };
        if dir.is_empty() {
            return Err(Error::invalid(field, "must name a directory"));
        }
        check_value_size(field, dir)?;
        if has_parent_segment(dir) || dir.contains('\0') {
            return Err(Error::invalid(field, "must not hold a `..` segment"));
        }
        Ok(FieldTest::PathUnder(dir.to_owned()))
    }

    /// `url_host`: a host name or address, compared case-insensitively.
    pub fn url_host(field: &str, host: &str) -> Result<Self> {
        let host = host.trim().to_ascii_lowercase();
        let well_formed = !host.is_empty()
            && host.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
            });
        if !well_formed {
            return Err(Error::invalid(
                field,
                "must be a host name or address, e.g. `registry.npmjs.org`",
            ));
        }
        check_value_size(field, &host)?;
        Ok(FieldTest::UrlHost(host))
    }

    fn holds(&self, value: &Value) -> bool {
        match self {
            FieldTest::CommandPrefix(words) => value
                .as_str()
                .is_some_and(|command| command_starts_with(command, words)),
            FieldTest::PathUnder(dir) => {
                value.as_str().is_some_and(|path| path_is_under(path, dir))
            }
            FieldTest::UrlHost(host) => value
                .as_str()
                .and_then(url_host)
                .is_some_and(|found| found == *host),
            FieldTest::Equals(expected) => value == expected,
            FieldTest::Prefix(prefix) => value.as_str().is_some_and(|s| s.starts_with(prefix)),
            FieldTest::Glob(glob) => value.as_str().is_some_and(|s| glob.matches(s)),
        }
    }
}

/// Whether `command` is `words`, or `words` then a space and arguments free of
/// [`SHELL_METACHARACTERS`].
fn command_starts_with(command: &str, words: &str) -> bool {
    match command.strip_prefix(words) {
        Some("") => true,
        Some(rest) => rest.starts_with(' ') && !rest.contains(SHELL_METACHARACTERS),
        None => false,
    }
}

/// Whether `path` is `dir` or under it, with no `..` segment anywhere (`/` and `\` both
/// separate segments, so neither `/repo/../etc` nor `/repo\..\etc` is under `/repo`).
fn path_is_under(path: &str, dir: &str) -> bool {
    if has_parent_segment(path) || path.contains('\0') {
        return false;
    }
    if dir == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(dir) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

fn has_parent_segment(path: &str) -> bool {
    path.split(['/', '\\']).any(|segment| segment == "..")
}

/// The lower-cased host of an `http://` or `https://` URL; `None` for another scheme, a URL with
/// user info (`https://good.example@evil.example/`), or a backslash in its authority (which
/// browsers read as a `/`).
fn url_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains(['@', '\\']) || authority.is_empty() {
        return None;
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next()?),
        None => authority.split(':').next()?.to_owned(),
    };
    Some(host.to_ascii_lowercase())
}

fn check_value_size(field: &str, text: &str) -> Result<()> {
    if text.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid(
            field,
            format!(
                "must be at most {MAX_VALUE_BYTES} bytes, got {}",
                text.len()
            ),
        ));
    }
    Ok(())
}

impl FieldCondition {
    pub fn new(path: FieldPath, test: FieldTest) -> Self {
        Self { path, test }
    }

    pub fn path(&self) -> &FieldPath {
        &self.path
    }

    pub fn test(&self) -> &FieldTest {
        &self.test
    }

    fn holds(&self, input: &Value) -> bool {
        self.path.find(input).is_some_and(|v| self.test.holds(v))
    }
}

/// A tool input as matchers see it: its canonical text, parsed at most once however many
/// matchers look at its fields, and what was judged of it ahead of time.
pub struct InputView<'a> {
    input: &'a ToolInput,
    parsed: OnceCell<Value>,
    prejudged: Option<&'a Prejudged>,
}

/// Which field matchers match one input, judged before the call reaches the store's writer.
///
/// Matching conditions against a large input (a glob over 256 KiB, linear but not free) is the
/// costly part of deciding by policy; done inside the write transaction it would hold the one
/// SQLite writer, and every other write, while it runs. So the broker judges the matchers of
/// the rules and grants that may apply before queueing the submit (see `Broker::submit`), and
/// the transaction, which still reads the rules and grants that hold at commit, only looks the
/// results up. Results are keyed by the matcher itself (its stored text), so a result can never
/// be applied to another matcher: one created or changed since is simply judged then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prejudged {
    results: HashMap<String, bool>,
}

impl Prejudged {
    /// Judges `matcher` against `input` and remembers the result (cheap matchers, `any` and
    /// `exact`, are left to the transaction).
    pub fn judge(&mut self, matcher: &Matcher, input: &InputView<'_>) {
        if let Matcher::Fields(conditions) = matcher {
            self.results
                .entry(matcher.memo_key())
                .or_insert_with(|| conditions.iter().all(|c| c.holds(input.value())));
        }
    }

    /// How many matchers were judged.
    pub fn len(&self) -> usize {
        self.results.len()
    }

    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }
}

impl<'a> InputView<'a> {
    pub fn new(input: &'a ToolInput) -> Self {
        Self {
            input,
            parsed: OnceCell::new(),
            prejudged: None,
        }
    }

    /// The same view, answering the matchers `prejudged` holds from it.
    pub fn with_prejudged(mut self, prejudged: Option<&'a Prejudged>) -> Self {
        self.prejudged = prejudged;
        self
    }

    fn value(&self) -> &Value {
        self.parsed.get_or_init(|| {
            // Canonical JSON written by `ToolInput::parse`: it parses.
            serde_json::from_str(self.input.as_str()).unwrap_or(Value::Null)
        })
    }
}

impl Matcher {
    /// Conditions, validated: 1 to [`MAX_CONDITIONS`].
    pub fn fields(field: &str, conditions: Vec<FieldCondition>) -> Result<Self> {
        if conditions.is_empty() || conditions.len() > MAX_CONDITIONS {
            return Err(Error::invalid(
                field,
                format!(
                    "must hold 1 to {MAX_CONDITIONS} conditions, got {}",
                    conditions.len()
                ),
            ));
        }
        Ok(Matcher::Fields(conditions))
    }

    pub fn matches(&self, input: &InputView<'_>) -> bool {
        match self {
            Matcher::Any => true,
            Matcher::Exact(expected) => expected == input.input,
            Matcher::Fields(conditions) => {
                if let Some(&holds) = input
                    .prejudged
                    .and_then(|p| p.results.get(&self.memo_key()))
                {
                    return holds;
                }
                let value = input.value();
                conditions.iter().all(|c| c.holds(value))
            }
        }
    }

    /// What identifies this matcher's result for one input: its stored text.
    fn memo_key(&self) -> String {
        self.to_json().to_string()
    }

    /// The stored (and policy file) form.
    pub fn to_json(&self) -> Value {
        match self {
            Matcher::Any => json!({ "any": true }),
            Matcher::Exact(input) => {
                let value: Value = serde_json::from_str(input.as_str()).unwrap_or(Value::Null);
                json!({ "exact": value })
            }
            Matcher::Fields(conditions) => {
                let list: Vec<Value> = conditions
                    .iter()
                    .map(|c| {
                        let mut object = Map::new();
                        object.insert("field".into(), Value::String(c.path.text.clone()));
                        let (op, value) = match &c.test {
                            FieldTest::Equals(value) => ("equals", value.clone()),
                            FieldTest::Prefix(p) => ("prefix", Value::String(p.clone())),
                            FieldTest::Glob(g) => ("glob", Value::String(g.as_str().to_owned())),
                            FieldTest::CommandPrefix(w) => {
                                ("command_prefix", Value::String(w.clone()))
                            }
                            FieldTest::PathUnder(d) => ("path_under", Value::String(d.clone())),
                            FieldTest::UrlHost(h) => ("url_host", Value::String(h.clone())),
                        };
                        object.insert(op.into(), value);
                        Value::Object(object)
                    })
                    .collect();
                json!({ "fields": list })
            }
        }
    }

    /// Parses the stored (and policy file) form; errors name `field` and the part at fault.
    /// `max_input_bytes` bounds an exact input.
    pub fn from_json(field: &str, value: &Value, max_input_bytes: usize) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(field, "must be a JSON object"))?;
        let [(kind, body)] = object.iter().collect::<Vec<_>>()[..] else {
            return Err(Error::invalid(
                field,
                "must have exactly one of `any`, `exact` or `fields`",
            ));
        };
        let inner = format!("{field}.{kind}");
        match kind.as_str() {
            "any" if body == &Value::Bool(true) => Ok(Matcher::Any),
            "any" => Err(Error::invalid(inner, "must be true")),
            "exact" => {
                if !body.is_object() {
                    return Err(Error::invalid(inner, "must be a JSON object"));
                }
                Ok(Matcher::Exact(ToolInput::parse(
                    &inner,
                    &body.to_string(),
                    max_input_bytes,
                )?))
            }
            "fields" => {
                let list = body
                    .as_array()
                    .ok_or_else(|| Error::invalid(&inner, "must be a list of conditions"))?;
                let conditions = list
                    .iter()
                    .enumerate()
                    .map(|(i, c)| condition_from_json(&format!("{inner}[{i}]"), c))
                    .collect::<Result<Vec<_>>>()?;
                Matcher::fields(&inner, conditions)
            }
            other => Err(Error::invalid(
                field,
                format!("unknown matcher `{other}` (use `any`, `exact` or `fields`)"),
            )),
        }
    }
}

fn condition_from_json(field: &str, value: &Value) -> Result<FieldCondition> {
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid(field, "must be a JSON object"))?;
    let path = match object.get("field") {
        Some(Value::String(path)) => FieldPath::parse(&format!("{field}.field"), path)?,
        _ => return Err(Error::invalid(format!("{field}.field"), "must be a string")),
    };
    let tests: Vec<(&String, &Value)> = object.iter().filter(|(k, _)| *k != "field").collect();
    let [(op, operand)] = tests[..] else {
        return Err(Error::invalid(
            field,
            "must have `field` and exactly one of `equals`, `prefix`, `glob`, `command_prefix`, \
             `path_under` or `url_host`",
        ));
    };
    let at = format!("{field}.{op}");
    let string = || {
        operand
            .as_str()
            .ok_or_else(|| Error::invalid(&at, "must be a string"))
    };
    let test = match op.as_str() {
        "equals" => FieldTest::equals(&at, operand)?,
        "prefix" => FieldTest::prefix(&at, string()?)?,
        "glob" => FieldTest::glob(&at, string()?)?,
        "command_prefix" => FieldTest::command_prefix(&at, string()?)?,
        "path_under" => FieldTest::path_under(&at, string()?)?,
        "url_host" => FieldTest::url_host(&at, string()?)?,
        other => {
            return Err(Error::invalid(
                field,
                format!(
                    "unknown condition `{other}` (use `equals`, `prefix`, `glob`, \
                     `command_prefix`, `path_under` or `url_host`)"
                ),
            ));
        }
    };
    Ok(FieldCondition::new(path, test))
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::Any => f.write_str("any input"),
            Matcher::Exact(input) => write!(f, "exactly the input {}", input.as_str()),
            Matcher::Fields(conditions) => {
                for (i, c) in conditions.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" and ")?;
                    }
                    let path = c.path.as_str();
                    match &c.test {
                        FieldTest::Equals(v) => {
                            write!(f, "`{path}` equals {}", json::canonical(v))?
                        }
                        FieldTest::Prefix(p) => write!(f, "`{path}` starts with {p:?}")?,
                        FieldTest::Glob(g) => write!(f, "`{path}` matches glob {:?}", g.as_str())?,
                        FieldTest::CommandPrefix(w) => write!(
                            f,
                            "`{path}` is the command {w:?}, or {w:?} followed by a space and \
                             arguments with none of ; & | < > ( ) $ ` \\ or a line break"
                        )?,
                        FieldTest::PathUnder(d) => write!(
                            f,
                            "`{path}` is {d:?} or a path under it, with no `..` segment"
                        )?,
                        FieldTest::UrlHost(h) => write!(
                            f,
                            "`{path}` is an http or https URL on host {h:?} (any port, no user info)"
                        )?,
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(text: &str) -> ToolInput {
        ToolInput::parse("input", text, 4096).unwrap()
    }

    fn matcher(json: &str) -> Matcher {
        Matcher::from_json("match", &serde_json::from_str(json).unwrap(), 4096).unwrap()
    }

    fn matches(m: &Matcher, text: &str) -> bool {
        let input = input(text);
        m.matches(&InputView::new(&input))
    }

    /// The trap: a prefix `npm test` must not approve `npm test; rm -rf ~`.
    #[test]
    fn a_command_prefix_matches_its_words_and_safe_arguments_only() {
        let m = matcher(r#"{"fields": [{"field": "command", "command_prefix": "npm test"}]}"#);
        let command = |c: &str| matches(&m, &serde_json::json!({ "command": c }).to_string());
        for ok in [
            "npm test",
            "npm test -- --watch",
            "npm test src/a.test.js 'quoted words'",
        ] {
            assert!(command(ok), "{ok}");
        }
        for trap in [
            "npm test; rm -rf ~",
            "npm test && rm -rf ~",
            "npm test || curl evil.example",
            "npm test | sh",
            "npm test & rm -rf ~",
            "npm test > ~/.bashrc",
            "npm test < /etc/passwd",
            "npm test $(rm -rf ~)",
            "npm test `rm -rf ~`",
            "npm test\nrm -rf ~",
            "npm test\r\nrm -rf ~",
            "npm test \\\nrm",
            "npm testing",
            "npm test\t; rm",
            "npx npm test",
            " npm test",
        ] {
            assert!(!command(trap), "{trap:?} must not match");
        }
        assert!(!matches(&m, r#"{"command": ["npm", "test"]}"#));
        // Its own words may not hold a metacharacter, and its stored form reads back.
        let err = FieldTest::command_prefix("p", "npm test;").unwrap_err();
        assert!(err.to_string().contains("metacharacter"), "{err}");
        assert_eq!(Matcher::from_json("m", &m.to_json(), 4096).unwrap(), m);
        assert!(m.to_string().contains("none of ; & |"), "{m}");
    }

    #[test]
    fn a_path_under_a_directory_never_climbs_out_of_it() {
        let m = matcher(r#"{"fields": [{"field": "path", "path_under": "/repo/src/"}]}"#);
        let path = |p: &str| matches(&m, &serde_json::json!({ "path": p }).to_string());
        for ok in ["/repo/src", "/repo/src/a.rs", "/repo/src/deep/./b.rs"] {
            assert!(path(ok), "{ok}");
        }
        for out in [
            "/repo/srcs/a.rs",
            "/repo/src/../../etc/passwd",
            "/repo/src/..",
            "/repo",
            "/repo/src\\..\\x",
            "repo/src/a",
        ] {
            assert!(!path(out), "{out:?} must not match");
        }
        assert!(FieldTest::path_under("p", "/repo/../etc").is_err());
        assert_eq!(Matcher::from_json("m", &m.to_json(), 4096).unwrap(), m);
    }

    #[test]
    fn a_url_host_is_the_host_itself_never_user_info_or_a_lookalike() {
        let m = matcher(r#"{"fields": [{"field": "url", "url_host": "Registry.NPMjs.org"}]}"#);
        let url = |u: &str| matches(&m, &serde_json::json!({ "url": u }).to_string());
        for ok in [
            "https://registry.npmjs.org/react",
            "http://REGISTRY.npmjs.org:8080/x?y#z",
            "https://registry.npmjs.org",
        ] {
            assert!(url(ok), "{ok}");
        }
        for other in [
            "https://registry.npmjs.org@evil.example/",
            "https://evil.example/?u=https://registry.npmjs.org",
            "https://registry.npmjs.org.evil.example/",
            "https://evil.example\\@registry.npmjs.org/",
            "ftp://registry.npmjs.org/",
            "registry.npmjs.org/react",
        ] {
            assert!(!url(other), "{other:?} must not match");
        }
        assert!(FieldTest::url_host("h", "evil.example/path").is_err());
        assert_eq!(Matcher::from_json("m", &m.to_json(), 4096).unwrap(), m);
    }

    #[test]
    fn any_matches_every_input() {
        let m = matcher(r#"{"any": true}"#);
        assert!(matches(&m, "{}"));
        assert!(matches(&m, r#"{"command":"rm -rf /"}"#));
    }

    #[test]
    fn exact_compares_canonical_json() {
        let m = matcher(r#"{"exact": {"b": 1, "a": [1, 2]}}"#);
        assert!(matches(&m, r#"{ "a": [1,2], "b": 1 }"#));
        assert!(!matches(&m, r#"{"a":[1,2],"b":2}"#));
        assert!(!matches(&m, r#"{"a":[1,2],"b":1,"c":null}"#));
    }

    #[test]
    fn prefix_holds_for_strings_starting_with_it() {
        let m = matcher(r#"{"fields": [{"field": "command", "prefix": "git status"}]}"#);
        assert!(matches(&m, r#"{"command":"git status"}"#));
        assert!(matches(&m, r#"{"command":"git status --short"}"#));
        assert!(!matches(&m, r#"{"command":"git stash"}"#));
        assert!(!matches(&m, r#"{"command":" git status"}"#));
        assert!(!matches(&m, r#"{"cmd":"git status"}"#), "missing field");
        assert!(
            !matches(&m, r#"{"command":["git status"]}"#),
            "not a string"
        );
    }

    #[test]
    fn glob_holds_for_strings_matching_it() {
        let m = matcher(r#"{"fields": [{"field": "path", "glob": "src/**"}]}"#);
        assert!(matches(&m, r#"{"path":"src/main.rs"}"#));
        assert!(matches(&m, r#"{"path":"src/a/b.rs"}"#));
        assert!(!matches(&m, r#"{"path":"docs/src/a.rs"}"#));
        assert!(!matches(&m, r#"{"path":7}"#));
    }

    #[test]
    fn equals_compares_any_json_value_by_canonical_text() {
        let m = matcher(r#"{"fields": [{"field": "force", "equals": false}]}"#);
        assert!(matches(&m, r#"{"force":false}"#));
        assert!(!matches(&m, r#"{"force":"false"}"#));
        assert!(!matches(&m, r#"{}"#));
        let m = matcher(r#"{"fields": [{"field": "n", "equals": 3}]}"#);
        assert!(matches(&m, r#"{"n":3}"#));
        assert!(
            matches(&m, r#"{"n":3.0}"#),
            "numbers compare by value (RFC 8785)"
        );
        assert!(matches(&m, r#"{"n":3e0}"#));
        assert!(!matches(&m, r#"{"n":3.5}"#));
        let m = matcher(r#"{"fields": [{"field": "o", "equals": {"y": 1, "x": [true]}}]}"#);
        assert!(matches(&m, r#"{"o":{"x":[true],"y":1}}"#));
    }

    #[test]
    fn dotted_paths_reach_into_nested_objects_and_every_condition_must_hold() {
        let m = matcher(
            r#"{"fields": [{"field": "options.mode", "equals": "ro"},
                           {"field": "path", "prefix": "src/"}]}"#,
        );
        assert!(matches(&m, r#"{"options":{"mode":"ro"},"path":"src/x"}"#));
        assert!(!matches(&m, r#"{"options":{"mode":"rw"},"path":"src/x"}"#));
        assert!(!matches(&m, r#"{"options":{"mode":"ro"},"path":"lib/x"}"#));
        assert!(!matches(&m, r#"{"options":"ro","path":"src/x"}"#));
        assert!(!matches(&m, r#"{"options.mode":"ro","path":"src/x"}"#));
    }

    #[test]
    fn the_stored_form_round_trips() {
        for text in [
            r#"{"any":true}"#,
            r#"{"exact":{"a":1,"b":"x"}}"#,
            r#"{"fields":[{"equals":[1,"x"],"field":"a.b"},{"field":"c","prefix":"p"},{"field":"d","glob":"*.rs"}]}"#,
        ] {
            let m = matcher(text);
            assert_eq!(m.to_json().to_string(), text);
            assert_eq!(matcher(&m.to_json().to_string()), m);
        }
    }

    #[test]
    fn malformed_matchers_are_refused_naming_the_part_at_fault() {
        let bad = |json: &str| {
            Matcher::from_json("rules[0].match", &serde_json::from_str(json).unwrap(), 64)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(r#"{"fields": []}"#).starts_with("rules[0].match.fields: must hold 1"));
        assert!(bad(r#"{"fields": [{"field": "a..b", "equals": 1}]}"#).contains("fields[0].field"));
        assert!(bad(r#"{"fields": [{"field": "a", "prefix": 1}]}"#).contains("fields[0].prefix"));
        assert!(bad(r#"{"fields": [{"field": "a", "prefix": ""}]}"#).contains("fields[0].prefix"));
        assert!(bad(r#"{"fields": [{"field": "a", "regex": "x"}]}"#).contains("unknown condition"));
        assert!(bad(r#"{"fields": [{"field": "a"}]}"#).contains("exactly one of"));
        assert!(bad(r#"{"exact": [1]}"#).contains("match.exact"));
        assert!(bad(r#"{"exact": {"a": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#).contains("match.exact"));
        assert!(bad(r#"{"any": true, "exact": {}}"#).contains("exactly one"));
        assert!(bad(r#"{"regex": "x"}"#).contains("unknown matcher"));
        assert!(bad(r#""any""#).contains("JSON object"));
    }

    /// A result judged ahead is used for exactly that matcher; any other is judged as usual.
    #[test]
    fn a_prejudged_result_answers_for_its_own_matcher_only() {
        let input = input(r#"{"path":"src/a.rs"}"#);
        let src = matcher(r#"{"fields": [{"field": "path", "glob": "src/*"}]}"#);
        let docs = matcher(r#"{"fields": [{"field": "path", "glob": "docs/*"}]}"#);
        let mut prejudged = Prejudged::default();
        prejudged.judge(&src, &InputView::new(&input));
        prejudged.judge(&matcher(r#"{"any": true}"#), &InputView::new(&input));
        assert_eq!(
            prejudged.len(),
            1,
            "only field matchers are worth judging ahead"
        );
        let view = || InputView::new(&input).with_prejudged(Some(&prejudged));
        assert!(src.matches(&view()));
        assert!(!docs.matches(&view()));
        // The lookup is what answers: a forged result shows it is used, and used only for `src`.
        prejudged.results.insert(src.memo_key(), false);
        let view = InputView::new(&input).with_prejudged(Some(&prejudged));
        assert!(!src.matches(&view));
        assert!(!docs.matches(&view));
    }
}
