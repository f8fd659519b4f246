//! The streaming masker against the naive reference, on random secrets and
//! bodies with occurrences planted in them (overlapping ones too): the same
//! bytes and the same counts whatever way the body is cut into chunks —
//! at every single split point, and in random multi-way splits down to
//! 1-byte chunks.

use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use proptest::prelude::*;
use talos_gateway::secrets::mask::{mask_reference, MaskSet, Masker};

/// Masks `body` pushed in pieces cut at `cuts` (sorted offsets), checking on
/// the way that output never runs ahead of input by more than the hold
/// allows. Returns the output and the counts.
fn stream(set: &Arc<MaskSet>, body: &[u8], cuts: &[usize]) -> (Vec<u8>, Vec<(String, u64)>) {
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&body.len()]) {
        masker.push(&body[from..cut], &mut out);
        from = cut;
        assert!(masker.pending_len() < set.max_pattern_len().max(1));
        assert_eq!(
            out.len() + masker.pending_len(),
            cut,
            "bytes lost or invented"
        );
    }
    masker.finish(&mut out);
    assert_eq!(masker.pending_len(), 0);
    let counts = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
    (out, counts)
}

fn secrets_of(values: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    // Now and then two values share a name.
    values
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("S{}", i % 3), v.clone()))
        .collect()
}

fn borrowed(secrets: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    secrets
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect()
}

/// Values: arbitrary bytes (`*` included), or from a tiny alphabet so that
/// occurrences overlap and values are prefixes of one another, or
/// token-like text.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..=64),
        prop::collection::vec(prop::sample::select(b"ab*".to_vec()), 1..=6),
        "[A-Za-z0-9+/=_-]{1,40}".prop_map(String::into_bytes),
    ]
}

/// What to plant where: (value index, form, position, overwrite or insert).
type Plant = (usize, u8, usize, bool);

/// One form of `value` to plant, encoded by other code than the masker's.
fn planted(value: &[u8], form: u8) -> Vec<u8> {
    match form % 6 {
        0 | 1 => value.to_vec(),
        2 => value
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect(),
        3 => STANDARD.encode(value).into_bytes(),
        // Inside a longer base64 text, at alignment 1 or 2.
        4 => STANDARD
            .encode([&[7u8][..], value, b"xy"].concat())
            .into_bytes(),
        _ => URL_SAFE_NO_PAD
            .encode([&b"ab"[..], value].concat())
            .into_bytes(),
    }
}

fn case() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>)> {
    let values = prop::collection::vec(value(), 1..=4);
    let filler = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..120),
        prop::collection::vec(prop::sample::select(b"ab*= ".to_vec()), 0..120),
    ];
    let plants = prop::collection::vec(
        (any::<usize>(), any::<u8>(), any::<usize>(), any::<bool>()),
        0..6,
    );
    (values, filler, plants).prop_map(|(values, mut body, plants): (_, _, Vec<Plant>)| {
        for (v, form, at, overwrite) in plants {
            let bytes = planted(&values[v % values.len()], form);
            let at = at % (body.len() + 1);
            if overwrite {
                let end = (at + bytes.len()).min(body.len());
                body.splice(at..end, bytes);
            } else {
                body.splice(at..at, bytes);
            }
        }
        (values, body)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// push(a), push(b), finish, for every split point of the body.
    #[test]
    fn every_split_point_matches_the_reference((values, body) in case()) {
        let secrets = secrets_of(&values);
        let secrets = borrowed(&secrets);
        let set = Arc::new(MaskSet::new(&secrets).unwrap());
        let (want, want_counts) = mask_reference(&body, &secrets);
        for split in 0..=body.len() {
            let (got, counts) = stream(&set, &body, &[split]);
            prop_assert!(got == want, "split at {}", split);
            prop_assert_eq!(&counts, &want_counts, "split at {}", split);
        }
        let mut whole = body.clone();
        let mut masker = Masker::new(set.clone());
        let found = masker.mask_all(&mut whole);
        prop_assert!(whole == want);
        prop_assert_eq!(found, want_counts.iter().map(|(_, c)| c).sum::<u64>());
    }

    /// Random cuts into many chunks, 1-byte chunks included.
    #[test]
    fn multi_way_splits_match_the_reference(
        (values, body) in case(),
        sizes in prop::collection::vec(prop_oneof![Just(1usize), 0usize..4, 1usize..80], 1..200),
    ) {
        let secrets = secrets_of(&values);
        let secrets = borrowed(&secrets);
        let set = Arc::new(MaskSet::new(&secrets).unwrap());
        let (want, want_counts) = mask_reference(&body, &secrets);
        let mut cuts = Vec::new();
        let mut at = 0;
        for size in sizes.iter().cycle().take(body.len() + 1) {
            at = (at + size).min(body.len());
            cuts.push(at);
        }
        let (got, counts) = stream(&set, &body, &cuts);
        prop_assert!(got == want);
        prop_assert_eq!(&counts, &want_counts);
        let every_byte: Vec<usize> = (0..body.len()).collect();
        let (got, counts) = stream(&set, &body, &every_byte);
        prop_assert!(got == want);
        prop_assert_eq!(&counts, &want_counts);
    }

    /// One masker, several bodies: `finish` resets the stream, the counts
    /// add up.
    #[test]
    fn a_masker_is_reusable_after_finish((values, body) in case(), split in any::<usize>()) {
        let secrets = secrets_of(&values);
        let secrets = borrowed(&secrets);
        let set = Arc::new(MaskSet::new(&secrets).unwrap());
        let (want, want_counts) = mask_reference(&body, &secrets);
        let split = split % (body.len() + 1);
        let mut masker = Masker::new(set);
        for _ in 0..2 {
            let mut out = Vec::new();
            masker.push(&body[..split], &mut out);
            masker.push(&body[split..], &mut out);
            masker.finish(&mut out);
            prop_assert!(out == want);
        }
        let doubled: Vec<(String, u64)> =
            want_counts.iter().map(|(n, c)| (n.clone(), 2 * c)).collect();
        let counts: Vec<(String, u64)> = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
        prop_assert_eq!(counts, doubled);
    }
}
