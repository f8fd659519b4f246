//! Ids and tenants.

/// The longest id, in bytes.
pub const MAX_ID_LEN: usize = 64;

/// What an id is, as errors say it.
pub const ID_RULE: &str = "must be 1-64 letters, digits, '-', '_' or '.'";

/// Whether `text` is an id: 1-64 letters, digits, `-`, `_` or `.`
/// (session ids, the gateway's own id, Lock rule ids, approvers).
pub fn is_id(text: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The longest tenant name the control plane gives, in bytes.
pub const MAX_TENANT_LEN: usize = 63;

/// Whether `text` is a tenant name as the control plane gives one: a
/// lower-case letter or digit, then up to 62 lower-case letters, digits,
/// `.`, `-` or `_`. (A session spec needs only a non-empty tenant: the
/// gateway serves whatever tenant the control plane names.)
pub fn is_tenant_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes
        .iter()
        .skip(1)
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    first_ok && rest_ok && bytes.len() <= MAX_TENANT_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["s1", "a.b-c_d", &"a".repeat(64)] {
            assert!(is_id(ok), "{ok}");
        }
        for bad in ["", "has space", "a/b", "é", &"a".repeat(65)] {
            assert!(!is_id(bad), "{bad}");
        }
    }

    #[test]
    fn tenants() {
        for ok in ["a", "acme", "0", "acme.prod-1_x", &"a".repeat(63)] {
            assert!(is_tenant_name(ok), "{ok}");
        }
        for bad in ["", "Acme", "-a", ".a", "a b", "a/b", &"a".repeat(64)] {
            assert!(!is_tenant_name(bad), "{bad}");
        }
    }
}
