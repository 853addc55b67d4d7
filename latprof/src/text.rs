//! Text from outside latprof (task names, names in a recording, user function and file names,
//! perf-map names, cgroup paths) made safe to print: any user can name a thread `\x1b[2J...`
//! or a function `safe\u{202e}lmth.exe`, and root's terminal must receive neither the escape
//! nor the reordering.
use std::{borrow::Cow, fmt::Write as _};

/// Characters that change how the text around them shows without being seen themselves:
/// controls (C0, DEL, C1), bidirectional overrides and isolates, zero-width and other format
/// characters (Unicode category Cf), line and paragraph separators, and noncharacters'
/// neighbours that terminals treat as controls.
#[must_use]
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            u32::from(c),
            0xad | 0x600..=0x605
                | 0x61c
                | 0x6dd
                | 0x70f
                | 0x890..=0x891
                | 0x8e2
                | 0x180e
                | 0x200b..=0x200f
                | 0x2028..=0x202e
                | 0x2060..=0x2064
                | 0x2066..=0x206f
                | 0xfeff
                | 0xfff9..=0xfffb
                | 0x110bd
                | 0x110cd
                | 0x13430..=0x1343f
                | 0x1bca0..=0x1bca3
                | 0x1d173..=0x1d17a
                | 0xe0001
                | 0xe0020..=0xe007f
        )
}

/// `s` with every hidden character (`is_hidden`) written as an escape (`\x1b`, `\x7f`,
/// `\u{9b}`, `\u{202e}`), as text. Borrowed when there is nothing to escape, which is nearly
/// always.
#[must_use]
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_hidden(c) {
            out.push(c);
        } else if let Ok(b) = u8::try_from(c) {
            let _ = write!(out, "\\x{b:02x}");
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(out)
}

/// Bytes from outside (a perf map's line, a symbol's name) as printable text: invalid UTF-8
/// replaced, hidden characters escaped.
#[must_use]
pub fn printable_bytes(b: &[u8]) -> String {
    printable(&String::from_utf8_lossy(b)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(printable("kworker/0:1 ü"), Cow::Borrowed(_)));
        assert_eq!(printable("\x1b[2J\x1b[31mPWN"), "\\x1b[2J\\x1b[31mPWN");
        assert_eq!(printable("a\tb\nc\x7f\u{9b}"), "a\\x09b\\x0ac\\x7f\\x9b");
        assert_eq!(printable("\u{85}"), "\\x85");
    }

    #[test]
    fn bidi_and_format_characters_are_escaped() {
        assert_eq!(printable("safe\u{202e}lmth.exe"), "safe\\u{202e}lmth.exe");
        assert_eq!(printable("a\u{2066}b\u{2069}"), "a\\u{2066}b\\u{2069}");
        assert_eq!(
            printable("zero\u{200b}width\u{feff}"),
            "zero\\u{200b}width\\u{feff}"
        );
        assert_eq!(printable("line\u{2028}sep"), "line\\u{2028}sep");
        assert_eq!(printable("tag\u{e0041}"), "tag\\u{e0041}");
        // Letters of other scripts stay as they are.
        assert!(matches!(printable("שלום мир 世界 é"), Cow::Borrowed(_)));
        assert_eq!(printable_bytes(b"ok\xff\x1b"), "ok\u{fffd}\\x1b");
    }
}
