//! Glob patterns over text, for tool names (`mcp__github__*`) and string fields of a tool's input
//! (`src/**`, `git status*`). Deliberately small and predictable: `*` (and `**`, the same) matches
//! any run of characters, `/` included; `?` matches exactly one character; `\` makes the next
//! character literal. Nothing else is special, and nothing is normalised: `src/../x` matches
//! `src/*`, so a rule meant to keep paths inside a folder should also deny `*..*`.
//!
//! Matching takes time linear in the text, whatever the pattern: it runs on the store's writer,
//! against inputs of up to 256 KiB, so a backtracking matcher (quadratic on `*aaa…ab`) would let
//! one rule stall every write. The pattern is cut at its stars into segments of fixed length
//! (`?` is one character); the first must start the text, the last must end it, and each one
//! between is found at its leftmost place after the one before. Leftmost is always right: a
//! segment has a fixed length, so an earlier place leaves at least as much text for the rest.
//! The text is read once from left to right: a literal segment by `str::find` (linear), one
//! with `?` by a bit-parallel (shift-and) scan, O(len(text) * ceil(len(segment) / 64)).

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, Result};

/// At most this many bytes in a pattern.
pub const MAX_GLOB_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyOne,
    AnyRun,
}

/// A parsed glob pattern; keeps its text for display and storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    text: String,
    tokens: Vec<Token>,
    /// The runs of the pattern between its stars (at least one; empty where a star starts or
    /// ends the pattern).
    segments: Vec<Segment>,
}

/// Part of a pattern without `*`: characters, each a literal or `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    /// `None` is `?`.
    chars: Vec<Option<char>>,
    /// The segment's text when it has no `?`, for a plain substring search.
    literal: Option<String>,
    /// For the shift-and scan of a segment with `?`: the positions each character it names
    /// may stand at, and (`wild`) those any other character may (the `?`s).
    masks: HashMap<char, Vec<u64>>,
    wild: Vec<u64>,
}

impl Glob {
    /// Parses `text`; the error names `field`.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        if text.is_empty() {
            return Err(Error::invalid(field, "must not be empty"));
        }
        if text.len() > MAX_GLOB_BYTES {
            return Err(Error::invalid(
                field,
                format!("must be at most {MAX_GLOB_BYTES} bytes, got {}", text.len()),
            ));
        }
        let mut tokens = Vec::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            let token = match c {
                '*' => Token::AnyRun,
                '?' => Token::AnyOne,
                '\\' => match chars.next() {
                    Some(escaped) => Token::Literal(escaped),
                    None => return Err(Error::invalid(field, "ends with a lone `\\`")),
                },
                other => Token::Literal(other),
            };
            // `**` is `*`: consecutive runs match nothing more than one.
            if !(token == Token::AnyRun && tokens.last() == Some(&Token::AnyRun)) {
                tokens.push(token);
            }
        }
        let segments = tokens
            .split(|t| *t == Token::AnyRun)
            .map(Segment::new)
            .collect();
        Ok(Self {
            text: text.to_owned(),
            tokens,
            segments,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    #[cfg(test)]
    /// Whether the pattern has no wildcard (it then matches only its own text).
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Literal(_)))
    }

    /// Whether `text` matches the whole pattern, in time linear in `text` (see the module doc).
    pub fn matches(&self, text: &str) -> bool {
        let (first, rest) = self.segments.split_first().expect("at least one segment");
        let Some(rest) = rest.split_last() else {
            // No star: the one segment is the whole text.
            return first.starts(text) == Some(text.len());
        };
        let (last, middle) = rest;
        let Some(mut from) = first.starts(text) else {
            return false;
        };
        let Some(until) = last.ends(&text[from..]).map(|at| from + at) else {
            return false;
        };
        for segment in middle {
            match segment.find(&text[from..until]) {
                Some(end) => from += end,
                None => return false,
            }
        }
        true
    }
}

impl Segment {
    fn new(tokens: &[Token]) -> Self {
        let chars: Vec<Option<char>> = tokens
            .iter()
            .map(|t| match t {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect();
        let literal = chars.iter().copied().collect::<Option<String>>();
        let words = chars.len().div_ceil(64);
        let mut wild = vec![0u64; words];
        for (i, p) in chars.iter().enumerate() {
            if p.is_none() {
                wild[i / 64] |= 1 << (i % 64);
            }
        }
        let mut masks: HashMap<char, Vec<u64>> = HashMap::new();
        if literal.is_none() {
            for (i, p) in chars.iter().enumerate() {
                if let Some(c) = p {
                    masks.entry(*c).or_insert_with(|| wild.clone())[i / 64] |= 1 << (i % 64);
                }
            }
        }
        Self {
            chars,
            literal,
            masks,
            wild,
        }
    }

    fn fits(pattern: Option<char>, c: char) -> bool {
        pattern.is_none_or(|p| p == c)
    }

    /// If `text` starts with this segment, the byte offset just after it.
    fn starts(&self, text: &str) -> Option<usize> {
        let mut chars = text.char_indices();
        for &p in &self.chars {
            let (_, c) = chars.next()?;
            if !Self::fits(p, c) {
                return None;
            }
        }
        Some(chars.next().map_or(text.len(), |(at, _)| at))
    }

    /// If `text` ends with this segment, the byte offset where it starts.
    fn ends(&self, text: &str) -> Option<usize> {
        let mut chars = text.char_indices().rev();
        let mut at = text.len();
        for &p in self.chars.iter().rev() {
            let (i, c) = chars.next()?;
            if !Self::fits(p, c) {
                return None;
            }
            at = i;
        }
        Some(at)
    }

    /// The byte offset just after this segment's leftmost place in `text`.
    fn find(&self, text: &str) -> Option<usize> {
        if let Some(literal) = &self.literal {
            return text.find(literal.as_str()).map(|at| at + literal.len());
        }
        // Shift-and: bit i of `state` says the last i + 1 characters read match the segment's
        // first i + 1. One pass over the text, ceil(len / 64) words per character.
        let len = self.chars.len();
        let (last_word, last_bit) = ((len - 1) / 64, 1u64 << ((len - 1) % 64));
        let mut state = vec![0u64; self.wild.len()];
        for (at, c) in text.char_indices() {
            let mask = self.masks.get(&c).unwrap_or(&self.wild);
            let mut carry = 1;
            for (word, m) in state.iter_mut().zip(mask) {
                let next_carry = *word >> 63;
                *word = ((*word << 1) | carry) & m;
                carry = next_carry;
            }
            if state[last_word] & last_bit != 0 {
                return Some(at + c.len_utf8());
            }
        }
        None
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(p: &str) -> Glob {
        Glob::parse("glob", p).unwrap()
    }

    #[test]
    fn star_matches_any_run_slashes_included_and_question_mark_one_character() {
        assert!(glob("src/*").matches("src/main.rs"));
        assert!(glob("src/**").matches("src/a/b/c.rs"));
        assert!(glob("src/**").matches("src/"));
        assert!(!glob("src/**").matches("src"));
        assert!(!glob("src/**").matches("docs/src/a.rs"));
        assert!(glob("*.rs").matches("a/b.rs"));
        assert!(!glob("*.rs").matches("a/b.rsx"));
        assert!(glob("git status*").matches("git status --short"));
        assert!(glob("git status*").matches("git status"));
        assert!(!glob("git status*").matches("git stash"));
        assert!(glob("f?o").matches("fóo"), "one character, not one byte");
        assert!(!glob("f?o").matches("fo"));
        assert!(glob("*a*b*c*").matches("xxaxxbxxcxx"));
        assert!(!glob("*a*b*c*").matches("xxaxxcxxbxx"));
        assert!(glob("mcp__github__*").matches("mcp__github__create_issue"));
        assert!(glob("*").matches(""));
    }

    #[test]
    fn backslash_makes_a_wildcard_literal() {
        assert!(glob(r"what\?").matches("what?"));
        assert!(!glob(r"what\?").matches("whatx"));
        assert!(glob(r"a\*").matches("a*"));
        assert!(!glob(r"a\*").matches("ab"));
        assert!(Glob::parse("tool", "a\\").is_err());
        assert!(glob("read_file").is_literal());
        assert!(!glob("read_*").is_literal());
    }

    #[test]
    fn empty_and_oversized_patterns_are_refused_naming_the_field() {
        let err = Glob::parse("rule.tool", "").unwrap_err();
        assert_eq!(err.to_string(), "rule.tool: must not be empty");
        assert!(Glob::parse("g", &"a".repeat(MAX_GLOB_BYTES + 1)).is_err());
    }

    #[test]
    fn many_stars_do_not_take_exponential_time() {
        let pattern = glob(&"*a".repeat(30));
        let text = "a".repeat(29) + "b";
        assert!(!pattern.matches(&text));
    }

    /// Whole-text matching by dynamic programming over (pattern, text) positions: obviously
    /// right, quadratic, for small cases only.
    fn matches_by_table(glob: &Glob, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let tokens = &glob.tokens;
        // can[j]: the pattern's first i tokens match the text's first j characters.
        let mut can = vec![false; text.len() + 1];
        can[0] = true;
        for token in tokens {
            let mut next = vec![false; text.len() + 1];
            for j in 0..=text.len() {
                next[j] = match token {
                    Token::AnyRun => can[j] || (j > 0 && next[j - 1]),
                    Token::AnyOne => j > 0 && can[j - 1],
                    Token::Literal(c) => j > 0 && can[j - 1] && text[j - 1] == *c,
                };
            }
            can = next;
        }
        can[text.len()]
    }

    proptest::proptest! {
        #[test]
        fn matching_agrees_with_the_exhaustive_table(
            pattern in "[ab?*\\\\é]{1,12}",
            text in "[abé]{0,24}",
        ) {
            if let Ok(glob) = Glob::parse("glob", &pattern) {
                proptest::prop_assert_eq!(glob.matches(&text), matches_by_table(&glob, &text));
            }
        }
    }

    /// The issue's case (a 1,024-byte `*aaa…ab` against 256 KiB of `a`) and the same with `?`
    /// in the segments, which takes the shift-and scan. A backtracking matcher does about
    /// 256 Ki x 1 Ki steps for each (seconds); linear matching does a few million word steps.
    /// The bound is generous: it tells "linear" from "seconds", not fast from slow.
    #[test]
    fn adversarial_patterns_match_in_time_linear_in_the_text() {
        let text = "a".repeat(256 * 1024);
        let patterns = [
            format!("*{}b", "a".repeat(1022)),
            format!("*{}?b*", "a".repeat(1020)),
            format!("*a?{}*b", "a".repeat(1019)),
            format!("{}*{}", "a".repeat(511), "a?".repeat(256)),
        ];
        let started = std::time::Instant::now();
        let results: Vec<bool> = patterns.iter().map(|p| glob(p).matches(&text)).collect();
        let took = started.elapsed();
        assert_eq!(results, [false, false, false, true]);
        assert!(
            took < std::time::Duration::from_secs(1),
            "four adversarial matches took {took:?}"
        );
    }
}
