//! Glob patterns over text, for tool names (`mcp__github__*`) and string fields of a tool's input
//! (`src/**`, `git status*`). Deliberately small and predictable: `*` (and `**`, the same) matches
//! any run of characters, `/` included; `?` matches exactly one character; `\` makes the next
//! character literal. Nothing else is special, and nothing is normalised: `src/../x` matches
//! `src/*`, so a rule meant to keep paths inside a folder should also deny `*..*`.

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
        Ok(Self {
            text: text.to_owned(),
            tokens,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern has no wildcard (it then matches only its own text).
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Literal(_)))
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let (mut t, mut p) = (0, 0);
        // Where the last `*` was, and the text position it is currently made to cover up to.
        let mut backtrack: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.tokens.get(p) {
                Some(Token::AnyRun) => {
                    backtrack = Some((p, t));
                    p += 1;
                }
                Some(Token::AnyOne) => {
                    p += 1;
                    t += 1;
                }
                Some(Token::Literal(c)) if *c == text[t] => {
                    p += 1;
                    t += 1;
                }
                _ => match backtrack {
                    // Let the last `*` swallow one more character and try again.
                    Some((star, covered)) => {
                        backtrack = Some((star, covered + 1));
                        p = star + 1;
                        t = covered + 1;
                    }
                    None => return false,
                },
            }
        }
        self.tokens[p..].iter().all(|t| *t == Token::AnyRun)
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
}
