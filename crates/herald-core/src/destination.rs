//! How a destination (an e-mail address, a phone number) is shown where people read it:
//! `herald intent show`, the admin API, log lines carrying a provider's error text. The
//! ledger keeps it whole in the frozen payload; everything else shows it masked.

/// `s19@example.com` -> `s***@example.com`, `+15555550100` -> `+1555*****00`.
pub fn mask(d: &str) -> String {
    if let Some((local, domain)) = d.split_once('@') {
        let first: String = local.chars().take(1).collect();
        return format!("{first}***@{domain}");
    }
    let chars: Vec<char> = d.chars().collect();
    // Short numbers would show most of themselves: mask them whole.
    if chars.len() < 11 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..5].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 7))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_masked() {
        assert_eq!(mask("s19@example.com"), "s***@example.com");
        assert_eq!(mask("+15555550100"), "+1555*****00");
        assert_eq!(mask("+1234"), "*****");
        assert_eq!(mask("+123456789"), "**********");
    }
}
