//! Text from outside latprof (task names, names in a recording) made safe to print: any user
//! can name a thread `\x1b[2J...`, and root's terminal must not receive the escape.
use std::{borrow::Cow, fmt::Write as _};

/// `s` with every control character written as an escape (`\x1b`, `\x7f`, `\u{9b}`), as text.
/// Borrowed when there is nothing to escape, which is nearly always.
#[must_use]
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !c.is_control() {
            out.push(c);
        } else if let Ok(b) = u8::try_from(c) {
            let _ = write!(out, "\\x{b:02x}");
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(out)
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
}
