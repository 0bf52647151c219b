//! Text from elsewhere made safe to repeat: Incus' error messages end up in `STATUS=` (where a
//! newline would start another `KEY=VALUE` assignment, such as `READY=1`), in the journal and
//! in `status --json`, so no control character of theirs reaches any of them raw.

use std::borrow::Cow;

/// `text` with every control character (Unicode category Cc: `\n`, `\r`, `\t`, ESC, NUL,
/// DEL, the C1 range) replaced by a space, so that it stays one line and draws nothing on a
/// terminal; borrowed when there is none.
pub fn printable(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_control) {
        Cow::Owned(
            text.chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn every_control_character_becomes_a_space() {
        assert_eq!(
            printable("a\nb\r\tc\u{1b}[31md\0e\u{7f}f\u{85}g\u{9b}h"),
            "a b  c [31md e f g h"
        );
        assert!(matches!(
            printable("déjà vu: 3/3 ✓"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
