//! SES message tag names and values: SES accepts only ASCII letters, digits, `_` and `-`,
//! at most 256 characters, not empty. Anything else makes `SendEmail` fail with
//! `BadRequestException` for the whole message, so tags are made valid here rather than
//! lose a notification over its bookkeeping.

const MAX_LEN: usize = 256;

/// `part` with every character outside `[A-Za-z0-9_-]` replaced by `_`, cut to 256
/// characters; an empty part becomes `_`.
pub(crate) fn sanitize(part: &str) -> String {
    let mut clean: String = part
        .chars()
        .take(MAX_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        clean.push('_');
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_tag_parts_are_kept() {
        assert_eq!(sanitize("intent_id"), "intent_id");
        assert_eq!(sanitize("9f86d081-884c"), "9f86d081-884c");
    }

    #[test]
    fn other_characters_become_underscores() {
        assert_eq!(sanitize("a b.c@d/é"), "a_b_c_d__");
    }

    #[test]
    fn empty_and_overlong_parts_are_made_valid() {
        assert_eq!(sanitize(""), "_");
        assert_eq!(sanitize(&"x".repeat(300)).len(), MAX_LEN);
    }
}
