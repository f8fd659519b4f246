//! Bounds on secret names and values. The values themselves are each
//! side's own business (the gateway keeps them in zeroizing storage).

/// The longest secret value, in bytes. Credentials are tokens and keys, not
/// documents; the bound also bounds the gateway's masker (it holds back
/// less than the longest pattern).
pub const MAX_SECRET_LEN: usize = 8 * 1024;

/// The longest secret name, in bytes. Names appear in records and on the
/// certificate; a long name is a mistake, not a need.
pub const MAX_SECRET_NAME_LEN: usize = 128;

/// Whether `text` is a secret name: 1 to [`MAX_SECRET_NAME_LEN`] letters,
/// digits, `_`, `-` or `.`.
pub fn is_secret_name(text: &str) -> bool {
    (1..=MAX_SECRET_NAME_LEN).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Why a value cannot be a secret; never shows the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("the value is empty")]
    Empty,
    #[error("the value is {0} bytes, more than {MAX_SECRET_LEN}")]
    TooLong(usize),
    #[error("the value holds a byte that cannot be sent in a header (control character)")]
    NotHeaderSafe,
}

/// Check a value can go into a header and the masker: not empty, at most
/// [`MAX_SECRET_LEN`] bytes, no control character but tab (visible ASCII,
/// space, tab and obs-text: RFC 9110 field-value).
pub fn check_value(value: &[u8]) -> Result<(), ValueError> {
    if value.is_empty() {
        return Err(ValueError::Empty);
    }
    if value.len() > MAX_SECRET_LEN {
        return Err(ValueError::TooLong(value.len()));
    }
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ValueError::NotHeaderSafe);
    }
    Ok(())
}

/// Remove one trailing line ending (`\n` or `\r\n`): `echo value | …` and a
/// file an editor saved both end in one, and a header value cannot hold it.
pub fn trim_line_ending(value: &mut Vec<u8>) {
    if value.ends_with(b"\n") {
        value.pop();
        if value.ends_with(b"\r") {
            value.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert!(check_value(b"tok\tx").is_ok());
        for bad in [&b""[..], b"a\nb", b"a\rb", b"\0", b"\x7f"] {
            assert!(check_value(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            check_value(&vec![b'a'; MAX_SECRET_LEN + 1]),
            Err(ValueError::TooLong(MAX_SECRET_LEN + 1))
        );
        let mut v = b"tok\r\n".to_vec();
        trim_line_ending(&mut v);
        assert_eq!(v, b"tok");
        let mut v = b"tok\n\n".to_vec();
        trim_line_ending(&mut v);
        assert_eq!(v, b"tok\n");
    }

    #[test]
    fn names() {
        assert!(is_secret_name("GITHUB_TOKEN.v-2"));
        for bad in ["", "a b", "a=b", &"a".repeat(MAX_SECRET_NAME_LEN + 1)] {
            assert!(!is_secret_name(bad), "{bad}");
        }
    }
}
