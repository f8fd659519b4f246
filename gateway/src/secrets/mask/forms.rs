//! The forms of a value the masker looks for: the value itself, hex,
//! base64 runs at each alignment, percent-encodings and JSON string
//! escapes (the [masker's docs](super#coverage) say which and why).

use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use base64::engine::GeneralPurpose;
use base64::Engine;
use zeroize::Zeroizing;

/// A pattern's bytes: derived from a secret, so wiped when dropped.
pub(super) type Pattern = Zeroizing<Vec<u8>>;

/// its encodings, without duplicates and without empty ones.
pub(super) fn forms(value: &[u8]) -> Vec<Pattern> {
    fn add(forms: &mut Vec<Pattern>, form: Pattern) {
        if !form.is_empty() && !forms.contains(&form) {
            forms.push(form);
        }
    }
    let mut forms = Vec::new();
    add(&mut forms, Zeroizing::new(value.to_vec()));
    for case in [Case::Lower, Case::Upper] {
        add(&mut forms, hex(value, case));
    }
    for alphabet in BASE64_ALPHABETS {
        for align in 0..3 {
            for form in base64_runs(value, align, alphabet) {
                add(&mut forms, form);
            }
        }
    }
    for style in &PERCENT_STYLES {
        for case in [Case::Upper, Case::Lower] {
            add(&mut forms, percent(value, style, case));
        }
    }
    if let Ok(text) = std::str::from_utf8(value) {
        for style in &JSON_STYLES {
            add(&mut forms, json(text, style));
        }
    }
    forms
}

/// The case of hex digits.
#[derive(Clone, Copy)]
enum Case {
    Lower,
    Upper,
}

impl Case {
    fn digits(self) -> &'static [u8; 16] {
        match self {
            Case::Lower => b"0123456789abcdef",
            Case::Upper => b"0123456789ABCDEF",
        }
    }
}

/// Two hex digits per byte.
fn hex(value: &[u8], case: Case) -> Pattern {
    let digits = case.digits();
    let mut out = Zeroizing::new(Vec::with_capacity(2 * value.len()));
    for &b in value {
        out.extend_from_slice(&[digits[usize::from(b >> 4)], digits[usize::from(b & 15)]]);
    }
    out
}

/// The standard (RFC 4648 §4) and URL-safe (§5) alphabets, padded.
const BASE64_ALPHABETS: [&GeneralPurpose; 2] = [&STANDARD, &URL_SAFE];

/// The base64 forms of `value` at alignment `align` (it starts `align` bytes
/// past a 3-byte group boundary): the run of characters made of value bits
/// only, then that run continued to the end of the text without and with
/// padding, for a value that ends the text.
fn base64_runs(value: &[u8], align: usize, alphabet: &GeneralPurpose) -> [Pattern; 3] {
    // `align` placeholder bytes, then the value. The characters from
    // `first` on hold no placeholder bit; those before `whole` hold no bit
    // past the value (the one after may hold the next byte's bits).
    let mut data = Zeroizing::new(Vec::with_capacity(align + value.len()));
    data.resize(align, 0);
    data.extend_from_slice(value);
    let first = (4 * align).div_ceil(3); // ⌈8·align / 6⌉
    let whole = 4 * data.len() / 3; // ⌊8·(align + n) / 6⌋
    let len = base64::encoded_len(data.len(), true).expect("a value's encoding fits in memory");
    let mut text = Zeroizing::new(vec![0; len]);
    let written = alphabet
        .encode_slice(&*data, &mut text)
        .expect("the buffer has the encoded length");
    debug_assert_eq!(written, len);
    let unpadded = len - text.iter().rev().take_while(|&&c| c == b'=').count();
    [
        Zeroizing::new(text[first..whole].to_vec()),
        Zeroizing::new(text[first..unpadded].to_vec()),
        Zeroizing::new(text[first..].to_vec()),
    ]
}

/// How one family of encoders percent-encodes: the bytes it leaves as they
/// are, and whether a space becomes `+`.
struct PercentStyle {
    keeps: fn(u8) -> bool,
    space_as_plus: bool,
}

/// RFC 3986 §2.3 unreserved: `A-Z a-z 0-9 - . _ ~`.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Left as they are by the WHATWG `application/x-www-form-urlencoded`
/// serializer: `A-Z a-z 0-9 * - . _`.
fn whatwg_form_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'*' | b'-' | b'.' | b'_')
}

/// Left as they are by JavaScript's `encodeURIComponent`: unreserved and
/// `! ' ( ) *`.
fn uri_component_safe(b: u8) -> bool {
    unreserved(b) || matches!(b, b'!' | b'\'' | b'(' | b')' | b'*')
}

/// Left as they are when only RFC 3986 §2.2 reserved bytes (gen-delims and
/// sub-delims) are encoded, and `%` (which any encoder must encode).
fn not_reserved(b: u8) -> bool {
    !b":/?#[]@!$&'()*+,;=%".contains(&b)
}

/// The percent-encoding forms looked for, each with upper-case and with
/// lower-case hex digits (RFC 3986 §2.1 asks for upper case; .NET's
/// `HttpUtility.UrlEncode` writes lower case).
const PERCENT_STYLES: [PercentStyle; 6] = [
    // RFC 3986: Python `quote(s, safe="")`, PHP `rawurlencode`.
    PercentStyle {
        keeps: unreserved,
        space_as_plus: false,
    },
    // The same with `+` for a space: Python `quote_plus`, Go `url.QueryEscape`.
    PercentStyle {
        keeps: unreserved,
        space_as_plus: true,
    },
    // WHATWG form encoding: `URLSearchParams`, HTML forms.
    PercentStyle {
        keeps: whatwg_form_safe,
        space_as_plus: true,
    },
    // JavaScript `encodeURIComponent`.
    PercentStyle {
        keeps: uri_component_safe,
        space_as_plus: false,
    },
    // Everything but letters and digits: Rust `percent_encoding::NON_ALPHANUMERIC`.
    PercentStyle {
        keeps: |b| b.is_ascii_alphanumeric(),
        space_as_plus: false,
    },
    // Only reserved bytes encoded; spaces and non-ASCII bytes left as they are.
    PercentStyle {
        keeps: not_reserved,
        space_as_plus: false,
    },
];

fn percent(value: &[u8], style: &PercentStyle, case: Case) -> Pattern {
    let digits = case.digits();
    let mut out = Zeroizing::new(Vec::with_capacity(3 * value.len()));
    for &b in value {
        if (style.keeps)(b) {
            out.push(b);
        } else if b == b' ' && style.space_as_plus {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(b >> 4)],
                digits[usize::from(b & 15)],
            ]);
        }
    }
    out
}

/// How one family of JSON serializers escapes a string. All escape `"` and
/// `\`, write `\b \f \n \r \t`, and other control characters as `\u00xx`.
struct JsonStyle {
    /// `/` as `\/`.
    slash: bool,
    /// Non-ASCII characters as `\uxxxx`, UTF-16 surrogate pairs beyond
    /// U+FFFF (rather than as UTF-8).
    non_ascii: bool,
    /// `<`, `>`, `&`, U+2028 and U+2029 as `\uxxxx`.
    html: bool,
    /// The hex digits of `\u` escapes.
    case: Case,
}

/// The JSON string forms looked for.
const JSON_STYLES: [JsonStyle; 6] = [
    // serde_json, JavaScript `JSON.stringify`, Python with `ensure_ascii=False`.
    JsonStyle {
        slash: false,
        non_ascii: false,
        html: false,
        case: Case::Lower,
    },
    // Go `encoding/json` (HTML-safe by default).
    JsonStyle {
        slash: false,
        non_ascii: false,
        html: true,
        case: Case::Lower,
    },
    // PHP `json_encode` with `JSON_UNESCAPED_UNICODE`.
    JsonStyle {
        slash: true,
        non_ascii: false,
        html: false,
        case: Case::Lower,
    },
    // Python `json.dumps` (`ensure_ascii=True`, its default).
    JsonStyle {
        slash: false,
        non_ascii: true,
        html: false,
        case: Case::Lower,
    },
    // PHP `json_encode` by default.
    JsonStyle {
        slash: true,
        non_ascii: true,
        html: false,
        case: Case::Lower,
    },
    // Java Jackson with `ESCAPE_NON_ASCII`.
    JsonStyle {
        slash: false,
        non_ascii: true,
        html: false,
        case: Case::Upper,
    },
];

fn json(text: &str, style: &JsonStyle) -> Pattern {
    let digits = style.case.digits();
    // At most 6 bytes per byte (`\u00xx`), so the buffer never grows and
    // leaves no copy behind.
    let mut out = Zeroizing::new(Vec::with_capacity(6 * text.len()));
    for c in text.chars() {
        let short: &[u8] = match c {
            '"' => b"\\\"",
            '\\' => b"\\\\",
            '\u{8}' => b"\\b",
            '\u{c}' => b"\\f",
            '\n' => b"\\n",
            '\r' => b"\\r",
            '\t' => b"\\t",
            '/' if style.slash => b"\\/",
            _ => b"",
        };
        let escaped = c < ' '
            || (style.non_ascii && !c.is_ascii())
            || (style.html && matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}'));
        if !short.is_empty() {
            out.extend_from_slice(short);
        } else if escaped {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.extend_from_slice(b"\\u");
                for shift in [12, 8, 4, 0] {
                    out.push(digits[usize::from((*unit >> shift) & 15)]);
                }
            }
        } else {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(value: &[u8]) -> Vec<String> {
        forms(value)
            .iter()
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect()
    }

    #[test]
    fn forms_of_a_token_are_literal_hex_and_base64_only() {
        // Letters, digits, `-` and `_` need no JSON escaping; only the
        // letters-and-digits percent form differs (for `-`).
        let got = strings(b"ab-1");
        let want = [
            "ab-1", "61622d31", "61622D31",
            // standard and URL-safe agree here: "YWItMQ==" encodes the value
            // alone; alignments 1 and 2 are "AGFiLTE=" and "AABhYi0x".
            "YWItM", "YWItMQ", "YWItMQ==", "FiLT", "FiLTE", "FiLTE=", "hYi0x", "ab%2D1", "ab%2d1",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn base64_runs_follow_the_alignment_arithmetic() {
        // Run lengths ⌊4(n+a)/3⌋ − ⌈4a/3⌉ for n = 1, 2, 3.
        for (n, lens) in [(1, [1, 0, 1]), (2, [2, 2, 2]), (3, [4, 3, 3])] {
            let value = vec![0xffu8; n];
            for (align, len) in lens.into_iter().enumerate() {
                let [run, _, _] = base64_runs(&value, align, &STANDARD);
                assert_eq!(run.len(), len, "n={n} a={align}");
            }
        }
        // A value at every alignment inside real base64: the run is there.
        let value = b"s3cr3t!";
        for align in 0..3 {
            let mut text = vec![b'x'; align];
            text.extend_from_slice(value);
            text.extend_from_slice(b"yz");
            let encoded = STANDARD.encode(&text);
            let [run, _, _] = base64_runs(value, align, &STANDARD);
            assert!(
                encoded.as_bytes().windows(run.len()).any(|w| w == &run[..]),
                "a={align}"
            );
        }
    }

    #[test]
    fn percent_forms_follow_their_encoders() {
        let value = "p@ss w/rd!*~é".as_bytes();
        let got = |style: usize, case| {
            String::from_utf8(percent(value, &PERCENT_STYLES[style], case).to_vec()).unwrap()
        };
        assert_eq!(got(0, Case::Upper), "p%40ss%20w%2Frd%21%2A~%C3%A9");
        assert_eq!(got(1, Case::Upper), "p%40ss+w%2Frd%21%2A~%C3%A9");
        assert_eq!(got(2, Case::Upper), "p%40ss+w%2Frd%21*%7E%C3%A9");
        assert_eq!(got(3, Case::Upper), "p%40ss%20w%2Frd!*~%C3%A9");
        assert_eq!(got(4, Case::Upper), "p%40ss%20w%2Frd%21%2A%7E%C3%A9");
        assert_eq!(got(5, Case::Upper), "p%40ss w%2Frd%21%2A~é");
        assert_eq!(got(0, Case::Lower), "p%40ss%20w%2frd%21%2a~%c3%a9");
    }

    #[test]
    fn json_forms_follow_their_serializers() {
        let text = "a\"b\\c/d<\u{1}\n\té😀";
        let got =
            |style: usize| String::from_utf8(json(text, &JSON_STYLES[style]).to_vec()).unwrap();
        assert_eq!(
            got(0),
            serde_json::to_string(text).unwrap().trim_matches('"')
        );
        assert_eq!(got(0), r#"a\"b\\c/d<\u0001\n\té😀"#);
        assert_eq!(got(1), r#"a\"b\\c/d\u003c\u0001\n\té😀"#);
        assert_eq!(got(2), r#"a\"b\\c\/d<\u0001\n\té😀"#);
        assert_eq!(got(3), r#"a\"b\\c/d<\u0001\n\t\u00e9\ud83d\ude00"#);
        assert_eq!(got(4), r#"a\"b\\c\/d<\u0001\n\t\u00e9\ud83d\ude00"#);
        assert_eq!(got(5), r#"a\"b\\c/d<\u0001\n\t\u00E9\uD83D\uDE00"#);
    }
}
