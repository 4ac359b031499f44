//! Text from tenants on its way into logs and answers (guest log lines, guest error
//! messages): cut to a bounded length, with control characters escaped so that it cannot
//! begin a log line of its own or rewrite the terminal.

/// At most `max` bytes of `text`, cut at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` with control characters (line breaks, escape sequences) written as escapes.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// `text` cut to `max` bytes, saying how much was cut.
pub fn bounded(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    format!("{}… ({} more bytes cut)", cut(&text, max), text.len() - cut(&text, max).len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_character_boundaries_and_escapes_line_breaks() {
        assert_eq!(bounded("abcdef".into(), 4), "abcd… (2 more bytes cut)");
        assert_eq!(bounded("abc".into(), 4), "abc");
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("short", 100), "short");
        assert_eq!(escape_controls("a\nb\x1b[2K"), "a\\nb\\u{1b}[2K");
        assert_eq!(escape_controls("plain"), "plain");
    }
}
