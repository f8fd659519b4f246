//! Fuzzes the masker with random values: each input builds a mask set of its
//! own, so this target explores value shapes (forms that overlap, values
//! that encode alike) slowly; `masker` explores bodies and splits fast with
//! fixed value lists.
//!
//! Input: one byte for the number of values (1 to 4); per value, a length
//! byte (1 to 32 bytes) and the value; one byte that picks the cuts; the
//! rest is the body. Checks: the streamed output and counts equal the
//! reference's, cut in two and cut into small chunks, through both the
//! copying (`push`) and the uncopied (`push_bytes`) paths; the hold stays
//! below the longest pattern; whole-value masking agrees.

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use talos_gateway::secrets::mask::{mask_reference, MaskSet, Masker};

const NAMES: [&str; 4] = ["A", "B", "C", "A"];

fuzz_target!(|data: &[u8]| {
    let Some((&n, mut rest)) = data.split_first() else {
        return;
    };
    let mut values = Vec::new();
    for _ in 0..1 + n % 4 {
        let Some((&len, tail)) = rest.split_first() else {
            return;
        };
        let len = 1 + usize::from(len % 32);
        if tail.len() < len {
            return;
        }
        values.push(&tail[..len]);
        rest = &tail[len..];
    }
    let Some((&cuts, body)) = rest.split_first() else {
        return;
    };
    // Two values may share a name (the fourth is named like the first).
    let secrets: Vec<(&str, &[u8])> = NAMES.iter().copied().zip(values).collect();
    let set = Arc::new(MaskSet::new(&secrets).expect("values are not empty"));
    let (want, want_counts) = mask_reference(body, &secrets);

    let half = usize::from(cuts) * body.len() / 255;
    let chunk = 1 + usize::from(cuts % 17);
    let small: Vec<usize> = (chunk..body.len()).step_by(chunk).collect();
    for cut_at in [vec![half], small] {
        let mut masker = Masker::new(set.clone());
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cut_at.iter().chain([&body.len()]) {
            masker.push(&body[from..cut], &mut out);
            from = cut;
            assert!(masker.pending_len() < set.max_pattern_len().max(1));
            assert_eq!(out.len() + masker.pending_len(), cut);
        }
        masker.finish(&mut out);
        assert!(out == want, "streamed output differs from the reference");
        let counts: Vec<(String, u64)> = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
        assert_eq!(counts, want_counts);
    }

    // The uncopied path (`push_bytes`), every chunk eligible to pass
    // through: the pieces it emits, joined, equal the reference too.
    for step in [chunk, half.max(1)] {
        let mut masker = Masker::new(set.clone());
        let mut out = Vec::new();
        for piece in body.chunks(step) {
            masker.push_bytes_from(bytes::Bytes::copy_from_slice(piece), 1, |b| {
                out.extend_from_slice(&b)
            });
            assert!(masker.pending_len() < set.max_pattern_len().max(1));
        }
        masker.finish(&mut out);
        assert!(out == want, "uncopied streaming differs from the reference");
    }

    let mut whole = body.to_vec();
    Masker::new(set).mask_all(&mut whole);
    assert!(
        whole == want,
        "whole-value masking differs from the reference"
    );
});
