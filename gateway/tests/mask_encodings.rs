//! Encoded values are masked where real encoders put them: random values,
//! encoded by other code than the masker's (the base64 crate, serde_json,
//! a hex formatter), inside longer text.

use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use proptest::prelude::*;
use talos_gateway::secrets::mask::{MaskSet, Masker};

/// Mask `text` as a body (in two chunks) and as a whole value; both must
/// agree. Returns the masked text and the count for the one secret.
fn masked(value: &[u8], text: &[u8], split: usize) -> (Vec<u8>, u64) {
    let set = Arc::new(MaskSet::new(&[("S", value)]).unwrap());
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::new();
    let split = split % (text.len() + 1);
    masker.push(&text[..split], &mut out);
    masker.push(&text[split..], &mut out);
    masker.finish(&mut out);
    let mut whole = text.to_vec();
    Masker::new(set).mask_all(&mut whole);
    assert_eq!(out, whole);
    let count = masker.counts().next().unwrap().1;
    (out, count)
}

proptest! {
    /// A value anywhere inside a base64 text, at any alignment, in either
    /// alphabet, padded or not: every character made of value bits only is
    /// masked; when the value ends the text, everything from the first such
    /// character to the end is.
    #[test]
    fn base64_at_every_alignment(
        value in prop::collection::vec(any::<u8>(), 1..=48),
        before in prop::collection::vec(any::<u8>(), 0..=7),
        after in prop::collection::vec(any::<u8>(), 0..=7),
        engine in 0..4usize,
        split in any::<usize>(),
    ) {
        let engines = [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD];
        let data = [&before[..], &value, &after].concat();
        let encoded = engines[engine].encode(&data);
        let text = format!("x={encoded};");
        let (out, count) = masked(&value, text.as_bytes(), split);
        let out = &out[2..out.len() - 1];

        let first = (8 * before.len()).div_ceil(6);
        let whole = 8 * (before.len() + value.len()) / 6;
        let end = if after.is_empty() { encoded.len() } else { whole };
        prop_assert!(
            out[first..end].iter().all(|&c| c == b'*'),
            "{} -> {}", encoded, String::from_utf8_lossy(out)
        );
        if first < end {
            prop_assert!(count >= 1);
        }
        if value.len() >= 6 {
            // Nothing before the value's characters (only a 1-in-2^36
            // coincidence could match there).
            let before_edge = first.saturating_sub(1);
            prop_assert_eq!(&out[..before_edge], &encoded.as_bytes()[..before_edge]);
        }
    }

    /// Hex in either case, inside text.
    #[test]
    fn hex_either_case(
        value in prop::collection::vec(any::<u8>(), 1..=48),
        upper in any::<bool>(),
        split in any::<usize>(),
    ) {
        let hex: String = value
            .iter()
            .map(|b| if upper { format!("{b:02X}") } else { format!("{b:02x}") })
            .collect();
        let text = format!("id=0x{hex} ok");
        let (out, count) = masked(&value, text.as_bytes(), split);
        prop_assert!(out[5..5 + hex.len()].iter().all(|&c| c == b'*'));
        if value.len() >= 6 {
            // (A shorter value's short forms may match the text around.)
            prop_assert_eq!(&out[..5], b"id=0x");
            prop_assert_eq!(&out[5 + hex.len()..], b" ok");
        }
        prop_assert!(count >= 1);
    }

    /// Any UTF-8 value as serde_json writes it, in a JSON document.
    #[test]
    fn json_as_serde_json_writes_it(
        value in "\\PC{1,24}|[\"\\\\/\u{0}-\u{1f}a-z]{1,12}",
        split in any::<usize>(),
    ) {
        let doc = serde_json::json!({ "token": value, "n": 1 }).to_string();
        let escaped = serde_json::to_string(&value).unwrap();
        let inner = &escaped[1..escaped.len() - 1];
        let at = doc.find(inner).unwrap();
        let (out, count) = masked(value.as_bytes(), doc.as_bytes(), split);
        prop_assert!(out[at..at + inner.len()].iter().all(|&c| c == b'*'), "{}", doc);
        prop_assert!(count >= 1);
        prop_assert_eq!(out.len(), doc.len());
    }
}

/// The padded and unpadded base64 of a value, and the value itself, are
/// each one occurrence, though several patterns match at the same place.
#[test]
fn one_occurrence_per_place_whatever_the_form() {
    let value = b"correct horse";
    let text = format!(
        "{} {} {} {}",
        STANDARD.encode(value),
        STANDARD_NO_PAD.encode(value),
        URL_SAFE.encode(value),
        String::from_utf8_lossy(value),
    );
    let (out, count) = masked(value, text.as_bytes(), 7);
    assert!(
        out.iter().all(|&c| c == b'*' || c == b' '),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(count, 4);
}
