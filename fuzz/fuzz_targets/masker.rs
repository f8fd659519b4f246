//! Fuzzes the masker: bodies and their splits, against the naive reference,
//! for lists of values whose maskers are built once.
//!
//! Building a mask set (an automaton over a hundred patterns or more) costs
//! far more than masking a body, so the value lists are fixed and built at
//! the first input; what the fuzzer varies is the body and how it is cut.
//! The lists cover the shapes that matter: a token, several long values,
//! 1- to 3-byte values (every position a candidate), overlapping values and
//! values that are prefixes of each other, bytes that percent-encoding and
//! JSON escape, non-UTF-8 bytes, one name given twice, and 32 tokens (the
//! gram filter's smallest stride). (`masker_values` fuzzes the values.)
//!
//! Input: one byte picks the list; one byte seeds the cuts; the rest is the
//! body, written in a small language so that occurrences are easy to reach:
//! `0xFF i n` puts the first `n` bytes (modulo its length + 1: a prefix, or
//! all of it) of the list's `i`-th pattern (modulo their number), and any
//! other byte stands for itself; bodies are cut at `MAX_BODY` bytes.
//!
//! Checks: the streamed output and counts equal the reference's — cut in
//! two or into chunks of pseudo-random lengths, through the copying
//! (`push`) or the uncopied (`push_bytes`) path, as the seed byte says: one
//! streamed pass per input, so that each input costs little —; the hold
//! stays below the longest pattern; whole-value masking agrees.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use talos_gateway::secrets::mask::{MaskReference, MaskSet, Masker};

struct List {
    set: Arc<MaskSet>,
    reference: MaskReference,
    patterns: Vec<Vec<u8>>,
}

fn lists() -> &'static [List] {
    static LISTS: OnceLock<Vec<List>> = OnceLock::new();
    LISTS.get_or_init(|| {
        let tokens: Vec<String> = (0..32)
            .map(|i| format!("tok_{i:02}_{}", "Zq9xW3kLmP0aB7cD".repeat(2)))
            .collect();
        let owned: Vec<Vec<(&str, Vec<u8>)>> = vec![
            vec![("A", b"ghp_0123456789abcdefABCDEF0123456789abcd".to_vec())],
            vec![
                (
                    "A",
                    b"sk_live_51HxyzABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh".to_vec(),
                ),
                (
                    "B",
                    b"xoxb-0123456789-0123456789012-ABCDEFabcdef0123".to_vec(),
                ),
                (
                    "C",
                    b"AKIAIOSFODNN7EXAMPLEwJalrXUtnFEMIK7MDENGbPxRf".to_vec(),
                ),
                (
                    "D",
                    b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-0123_".to_vec(),
                ),
            ],
            vec![
                ("A", b"a".to_vec()),
                ("B", b"ab".to_vec()),
                ("C", b"xyz".to_vec()),
            ],
            vec![
                ("A", b"abab".to_vec()),
                ("B", b"abc".to_vec()),
                ("C", b"abcdef".to_vec()),
                ("D", b"cdefab".to_vec()),
            ],
            vec![
                ("A", b"p@ss w/rd+%\"\\<&>".to_vec()),
                (
                    "B",
                    "p\u{e4}ssw\u{f6}rd\u{20ac}\u{1f600}".as_bytes().to_vec(),
                ),
                ("C", b"\x01\x7f\ttab\nline".to_vec()),
            ],
            vec![
                ("A", vec![0xff, 0x00, 0x80, 0x10, 0xfe]),
                ("B", vec![0xc3, 0x28, 0xa0]),
            ],
            vec![
                ("A", b"first-value-of-A".to_vec()),
                ("B", b"value-of-B".to_vec()),
                ("A", b"second-A-value".to_vec()),
            ],
            tokens
                .iter()
                .enumerate()
                .map(|(i, t)| (["A", "B", "C", "D"][i % 4], t.as_bytes().to_vec()))
                .collect(),
        ];
        owned
            .iter()
            .map(|values| {
                let secrets: Vec<(&str, &[u8])> =
                    values.iter().map(|(n, v)| (*n, v.as_slice())).collect();
                let reference = MaskReference::new(&secrets);
                let patterns = reference.patterns().map(<[u8]>::to_vec).collect();
                List {
                    set: Arc::new(MaskSet::new(&secrets).expect("values are not empty")),
                    reference,
                    patterns,
                }
            })
            .collect()
    })
}

/// The longest body made: inserted patterns can make a body far longer
/// than its input, and a longer body explores nothing a shorter one cannot
/// (occurrences are at most a few hundred bytes), only slower.
const MAX_BODY: usize = 1024;

/// The body the input describes (see the module docs), at most `MAX_BODY`
/// bytes.
fn body(list: &List, mut input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_BODY);
    while let Some((&b, rest)) = input.split_first() {
        if out.len() >= MAX_BODY {
            out.truncate(MAX_BODY);
            break;
        }
        input = rest;
        match (b, input) {
            (0xff, [i, n, rest @ ..]) => {
                let pattern = &list.patterns[usize::from(*i) % list.patterns.len()];
                let take = usize::from(*n) % (pattern.len() + 1);
                out.extend_from_slice(&pattern[..take]);
                input = rest;
            }
            _ => out.push(b),
        }
    }
    out
}

/// Pseudo-random chunk lengths from `seed` (xorshift), 1 to 64 bytes, or
/// every length 1 when the seed is 0.
fn cuts(seed: u8, len: usize) -> Vec<usize> {
    let mut state = u32::from(seed) | 0x9e37_0000;
    let mut at = 0;
    let mut out = Vec::new();
    while at < len {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        at += if seed == 0 {
            1
        } else {
            1 + (state % 64) as usize
        };
        out.push(at.min(len));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [pick, seed, rest @ ..] = data else {
        return;
    };
    let lists = lists();
    let list = &lists[usize::from(*pick) % lists.len()];
    let body = body(list, rest);
    let (want, want_counts) = list.reference.mask(&body);
    let set = &list.set;

    // One streamed pass per input, the seed choosing how: cut in two or
    // into pseudo-random chunks, through the copying or the uncopied path
    // (the fuzzer varies the seed as it varies the body).
    let cut_at = if seed & 1 == 0 {
        let half = usize::from(*seed) * body.len() / 255;
        vec![half, body.len()]
    } else {
        cuts(*seed >> 1, body.len())
    };
    let mut masker = Masker::new(Arc::clone(set));
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in &cut_at {
        if seed & 2 == 0 {
            masker.push(&body[from..cut], &mut out);
            assert_eq!(out.len() + masker.pending_len(), cut);
        } else {
            masker.push_bytes_from(bytes::Bytes::copy_from_slice(&body[from..cut]), 1, |b| {
                out.extend_from_slice(&b)
            });
        }
        from = cut;
        assert!(masker.pending_len() < set.max_pattern_len().max(1));
    }
    masker.finish(&mut out);
    assert!(out == want, "streamed output differs from the reference");
    let counts: Vec<(String, u64)> = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
    assert_eq!(counts, want_counts);

    let mut whole = body.clone();
    Masker::new(Arc::clone(set)).mask_all(&mut whole);
    assert!(
        whole == want,
        "whole-value masking differs from the reference"
    );
});
