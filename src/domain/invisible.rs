//! Characters that change how text looks without showing themselves: bidirectional overrides,
//! embeddings, isolates and marks (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C),
//! zero-width characters (U+200B–U+200D, U+2060, U+FEFF) and the other invisible format
//! characters of Unicode (category Cf, the tag characters, the Hangul fillers, variation
//! selectors, line and paragraph separators).
//!
//! With them an agent can make one call look like another in an approver's UI (`rm -rf \u{202E}pmt/` renders
//! as `rm -rf /tmp`; `read_file` and `read\u{200B}_file` look the same). Ids and tool names, which
//! name things, refuse them; free text (title, message, input) may need them (Arabic and Hebrew
//! text uses marks), so it keeps them, and what approvers are shown lists them (see
//! `grpc::render`), so a UI can warn or show the text revealed.
//!
//! The inbox page badges them where they stand with this same list: `web/src/invisible.ts` is
//! written from [`listed`] by this file's test `the_inbox_page_uses_the_brokers_list`, which
//! fails when the two differ.

use std::fmt::Write;

/// Whether `c` changes how text looks without showing itself.
pub fn is_invisible(c: char) -> bool {
    // Below the first of them (all of ASCII, most Latin text): one comparison, not the list.
    c >= FIRST && listed(c)
}

/// The first character [`listed`]: nothing below it is, which the fast paths here rely on.
const FIRST: char = '\u{00AD}';

/// The list itself.
fn listed(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'                      // soft hyphen
            | '\u{034F}'                // combining grapheme joiner
            | '\u{061C}'                // Arabic letter mark
            | '\u{0600}'..='\u{0605}'   // Arabic number signs (format)
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{115F}'..='\u{1160}'   // Hangul fillers
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'   // Mongolian selectors and vowel separator
            | '\u{200B}'..='\u{200F}'   // zero-width space, joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}'   // line and paragraph separators, embeddings, overrides
            | '\u{2060}'..='\u{206F}'   // word joiner, invisible operators, isolates, deprecated
            | '\u{3164}'                // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'   // variation selectors
            | '\u{FEFF}'                // zero-width no-break space (BOM)
            | '\u{FFA0}'                // halfwidth Hangul filler
            | '\u{FFF9}'..='\u{FFFB}'   // interlinear annotation
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}' // tags and variation selectors supplement
    )
}

/// The first invisible character of `text`, if any.
pub fn first_invisible(text: &str) -> Option<char> {
    if text.is_ascii() {
        return None;
    }
    text.chars().find(|c| is_invisible(*c))
}

/// `c` as `U+202E`.
pub fn code_point(c: char) -> String {
    format!("U+{:04X}", c as u32)
}

/// What `text` holds of them: each distinct one in the order first found, and how many in all.
pub fn found_in(text: &str) -> (Vec<char>, usize) {
    // None of them is ASCII, and ASCII text (most inputs) is checked a word at a time: every
    // approver stream and every receipt looks at each call's whole input.
    if text.is_ascii() {
        return (Vec::new(), 0);
    }
    let mut distinct = Vec::new();
    let mut count = 0;
    for c in text.chars().filter(|c| is_invisible(*c)) {
        count += 1;
        if !distinct.contains(&c) {
            distinct.push(c);
        }
    }
    (distinct, count)
}

/// `text` with each invisible character written out as `\u{202E}` (and `\` itself as `\\`, so
/// the revealed text cannot be forged by typing `\u{202E}`).
pub fn reveal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if is_invisible(c) => write!(out, "\\u{{{:04X}}}", c as u32).expect("a String"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed character as inclusive ranges of code points, in order.
    fn listed_ranges() -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for c in (FIRST as u32..=char::MAX as u32).filter_map(char::from_u32) {
            if !listed(c) {
                continue;
            }
            let c = c as u32;
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == c => *end = c,
                _ => ranges.push((c, c)),
            }
        }
        ranges
    }

    /// The inbox page's copy of the list (`web/src/invisible.ts`), as the broker's list writes it.
    fn inbox_module() -> String {
        let mut class = String::new();
        for (start, end) in listed_ranges() {
            if start == end {
                write!(class, "\\u{{{start:X}}}").expect("a String");
            } else {
                write!(class, "\\u{{{start:X}}}-\\u{{{end:X}}}").expect("a String");
            }
        }
        format!(
            "// Generated from the broker's list (src/domain/invisible.rs): do not edit.\n\
         // Its test `the_inbox_page_uses_the_brokers_list` fails when this file differs; write it\n\
         // again with `UPDATE_INBOX_LIST=1 cargo test --lib the_inbox_page_uses_the_brokers_list`.\n\
         \n\
         /** One character the broker counts as hiding itself (astral ones too: the `u` flag). */\n\
         export const INVISIBLE = /[{class}]/u;\n"
        )
    }

    /// The page's list is this list: the file it imports is what [`inbox_module`] writes.
    #[test]
    fn the_inbox_page_uses_the_brokers_list() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/web/src/invisible.ts");
        let wanted = inbox_module();
        if std::env::var_os("UPDATE_INBOX_LIST").is_some() {
            std::fs::write(path, &wanted).expect("web/src/invisible.ts is writable");
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == wanted,
            "web/src/invisible.ts differs from the broker's list: run \
             `UPDATE_INBOX_LIST=1 cargo test --lib the_inbox_page_uses_the_brokers_list`, then \
             rebuild web/ (npm run build) and commit both"
        );
        let ranges = listed_ranges();
        assert!(ranges.contains(&(0xE0000, 0xE0FFF)), "tags: {ranges:x?}");
        assert!(
            ranges.contains(&(0x2028, 0x202E)),
            "separators: {ranges:x?}"
        );
    }

    #[test]
    fn bidi_zero_width_and_format_characters_are_invisible_letters_are_not() {
        for c in [
            '\u{202A}',
            '\u{202B}',
            '\u{202C}',
            '\u{202D}',
            '\u{202E}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200E}',
            '\u{200F}',
            '\u{061C}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{E0041}',
            '\u{2028}',
        ] {
            assert!(is_invisible(c), "{}", code_point(c));
        }
        for c in ['a', 'é', 'ש', 'ع', '中', ' ', '😀', '-', '_'] {
            assert!(!is_invisible(c), "{}", code_point(c));
        }
    }

    /// The fast paths (a character below the first listed, text that is all ASCII) answer as
    /// the list does, for every character there is.
    #[test]
    fn the_fast_paths_agree_with_the_list_for_every_character() {
        let mut listed_chars = Vec::new();
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            assert_eq!(is_invisible(c), listed(c), "{}", code_point(c));
            if listed(c) {
                listed_chars.push(c);
            }
        }
        assert!(listed_chars.iter().all(|c| !c.is_ascii() && *c >= FIRST));
        assert_eq!(listed_chars.first(), Some(&FIRST));
        let ascii: String = (0..128u8).map(char::from).collect();
        assert_eq!(found_in(&ascii), (Vec::new(), 0));
        assert_eq!(first_invisible(&ascii), None);
        let mixed = format!("{ascii}\u{00AD}é{ascii}\u{E0041}\u{00AD}");
        assert_eq!(found_in(&mixed), (vec!['\u{00AD}', '\u{E0041}'], 3));
        assert_eq!(first_invisible(&mixed), Some('\u{00AD}'));
    }

    #[test]
    fn revealing_writes_each_one_out_and_lists_them() {
        let text = "rm -rf \u{202E}pmt/\u{202C} \\ ok\u{202E}";
        assert_eq!(reveal(text), r"rm -rf \u{202E}pmt/\u{202C} \\ ok\u{202E}");
        assert_eq!(found_in(text), (vec!['\u{202E}', '\u{202C}'], 3));
        assert_eq!(first_invisible("read\u{200B}_file"), Some('\u{200B}'));
        assert_eq!(first_invisible("read_file"), None);
        assert_eq!(code_point('\u{200B}'), "U+200B");
    }
}
