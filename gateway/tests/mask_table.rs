//! Adversarial cases, one row each: secrets, body, the masked body and the
//! counts. Every row is checked against the naive reference, streamed at
//! every split point and in 1-byte chunks, and masked whole.
//!
//! Also here: the hold-back is as short as it can be, a byte is never
//! emitted before it is final, and nothing prints a value.

use std::sync::Arc;

use talos_gateway::secrets::mask::{mask_reference, MaskSet, MaskSetError, Masker};

/// `n` asterisks.
fn stars(n: usize) -> String {
    "*".repeat(n)
}

/// `before`, `n` asterisks, `after`.
fn between(before: &str, n: usize, after: &str) -> String {
    format!("{before}{}{after}", stars(n))
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Stream `body` in pieces that end at `cuts`; output and counts.
fn stream(set: &Arc<MaskSet>, body: &[u8], cuts: &[usize]) -> (Vec<u8>, Vec<(String, u64)>) {
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&body.len()]) {
        masker.push(&body[from..cut], &mut out);
        from = cut;
    }
    masker.finish(&mut out);
    let counts = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
    (out, counts)
}

fn check(secrets: &[(&str, &[u8])], body: &[u8], want: &[u8], want_counts: &[(&str, u64)]) {
    let set = Arc::new(MaskSet::new(secrets).unwrap());
    let want_counts: Vec<(String, u64)> = set
        .names()
        .map(|name| {
            let count = want_counts
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |c| c.1);
            (name.to_owned(), count)
        })
        .collect();

    let (reference, reference_counts) = mask_reference(body, secrets);
    assert_eq!(show(&reference), show(want), "reference");
    assert_eq!(reference_counts, want_counts, "reference counts");

    for split in 0..=body.len() {
        let (got, counts) = stream(&set, body, &[split]);
        assert_eq!(show(&got), show(want), "split at {split}");
        assert_eq!(counts, want_counts, "split at {split}");
    }
    let every_byte: Vec<usize> = (0..body.len()).collect();
    let (got, counts) = stream(&set, body, &every_byte);
    assert_eq!(show(&got), show(want), "1-byte chunks");
    assert_eq!(counts, want_counts, "1-byte chunks");

    let mut whole = body.to_vec();
    let mut masker = Masker::new(set);
    masker.mask_all(&mut whole);
    assert_eq!(show(&whole), show(want), "mask_all");
    let counts: Vec<(String, u64)> = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
    assert_eq!(counts, want_counts, "mask_all counts");
}

/// `name: [(secret, value), …] in body => masked, [(secret, count), …];`
/// Values, bodies and expectations are anything `AsRef<[u8]>`; counts not
/// listed are zero.
macro_rules! cases {
    ($($name:ident: [$(($secret:expr, $value:expr)),+ $(,)?] in $body:expr
        => $want:expr, [$(($counted:expr, $count:expr)),* $(,)?];)+) => {
        $(
            #[test]
            fn $name() {
                let values: Vec<Vec<u8>> =
                    vec![$(AsRef::<[u8]>::as_ref(&$value).to_vec()),+];
                let names = [$($secret),+];
                let secrets: Vec<(&str, &[u8])> =
                    names.iter().copied().zip(values.iter().map(Vec::as_slice)).collect();
                let body = $body;
                let want = $want;
                let counts = [$(($counted, $count)),*];
                check(&secrets, body.as_ref(), want.as_ref(), &counts);
            }
        )+
    };
}

/// 4 KiB of letters that never repeat a short run (so the only occurrence
/// is the planted one).
fn long_value() -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            b'a' + (x % 26) as u8
        })
        .collect()
}

cases! {
    // Overlapping occurrences are all masked, and all counted.
    overlapping: [("A", "abab")] in "ababab" => "******", [("A", 2)];
    overlapping_three: [("A", "aaa")] in "xaaaaax" => "x*****x", [("A", 3)];
    // `*` in a value is just a byte; masking never creates an occurrence.
    star_in_value: [("A", "a*b")] in "xa*by**a*" => "x***y**a*", [("A", 1)];
    star_value: [("A", "**")] in "a***b" => "a***b", [("A", 2)];
    // One value a prefix of another: both masked where the longer occurs.
    prefix_of_another: [("S", "abc"), ("L", "abcdef")] in "abcdef abc"
        => "****** ***", [("S", 2), ("L", 1)];
    suffix_of_another: [("S", "def"), ("L", "abcdef")] in "abcdef"
        => "******", [("S", 1), ("L", 1)];
    // A 1-byte value masks its byte, its hex form, and its 1-character
    // base64 runs (`q` is 0x71: `c` at alignment 0, `x` at 2, `E` when it
    // ends a text at alignment 1): short values mask a lot.
    one_byte_value: [("K", "q")] in "quick fox, EXIT 71" => "*ui*k fo*, *XIT **", [("K", 5)];
    // Long values, split anywhere.
    four_kib_value: [("L", long_value())]
        in [b"<".as_slice(), &long_value(), b">"].concat()
        => between("<", 4096, ">"), [("L", 1)];
    // UTF-8 values, as bytes and as JSON escapes.
    utf8_value: [("P", "pässwörd😀")] in "{\"pw\":\"pässwörd😀\"}"
        => between("{\"pw\":\"", 14, "\"}"), [("P", 1)];
    utf8_value_ascii_json: [("P", "pässwörd😀")]
        in r#"{"pw":"p\u00e4ssw\u00f6rd\ud83d\ude00"}"#
        => between("{\"pw\":\"", 30, "\"}"), [("P", 1)];
    // At the very start and the very end.
    start_and_end: [("T", "tok")] in "tok-x-tok" => "***-x-***", [("T", 2)];
    only_the_value: [("T", "tok")] in "tok" => "***", [("T", 1)];
    // The same value twice, adjacent.
    adjacent: [("T", "token")] in "tokentoken" => "**********", [("T", 2)];
    // Two names, one value: both count it.
    shared_value: [("A", "same"), ("B", "same")] in "a same b" => "a **** b", [("A", 1), ("B", 1)];
    // One name, two values.
    two_values_one_name: [("A", "first"), ("A", "second")] in "first, second"
        => "*****, ******", [("A", 2)];
    nothing_to_mask: [("T", "absent")] in "nothing here" => "nothing here", [];
    empty_body: [("T", "tok")] in "" => "", [];

    // base64 at each alignment inside a longer text: the characters made of
    // value bits only are masked; the one at each edge mixes in a
    // neighbour's bits and stays.
    base64_alignment_0: [("P", "hunter2!")] in "b64=aHVudGVyMiFa;"
        => "b64=**********Fa;", [("P", 1)];
    base64_alignment_1: [("P", "hunter2!")] in "b64=eGh1bnRlcjIhWg==;"
        => "b64=eG**********Wg==;", [("P", 1)];
    base64_alignment_2: [("P", "hunter2!")] in "b64=eHlodW50ZXIyIVo=;"
        => "b64=eHl**********Vo=;", [("P", 1)];
    // Ending the text: the last character and the padding go too.
    base64_alone: [("P", "hunter2!")] in "Basic aHVudGVyMiE=\r\n"
        => between("Basic ", 12, "\r\n"), [("P", 1)];
    base64_alone_unpadded: [("P", "hunter2!")] in "jwt.aHVudGVyMiE.sig"
        => between("jwt.", 11, ".sig"), [("P", 1)];
    base64_end_alignment_2: [("P", "hunter2!")] in "eHlodW50ZXIyIQ=="
        => between("eHl", 13, ""), [("P", 1)];
    // URL-safe: the same bits, `-_` for `+/`.
    base64_standard: [("K", [0xfb, 0xff, 0xbf, 0x3e])] in "k=+/+/Pg==" => "k=********", [("K", 1)];
    base64_url_safe: [("K", [0xfb, 0xff, 0xbf, 0x3e])] in "k=-_-_Pg&" => "k=******&", [("K", 1)];
    // Hex, either case.
    hex_lower: [("K", "K3y!")] in "id=4b337921." => "id=********.", [("K", 1)];
    hex_upper: [("K", "K3y!")] in "id=4B337921." => "id=********.", [("K", 1)];
    // Percent-encoding: every byte but unreserved, only reserved, `+` for
    // a space, lower-case hex.
    percent_strict: [("P", "p@ss w/rd")] in "?pw=p%40ss%20w%2Frd&x"
        => between("?pw=", 15, "&x"), [("P", 1)];
    percent_reserved_only: [("P", "p@ss w/rd")] in "?pw=p%40ss w%2Frd&x"
        => between("?pw=", 13, "&x"), [("P", 1)];
    percent_form: [("P", "p@ss w/rd")] in "pw=p%40ss+w%2Frd&x"
        => between("pw=", 13, "&x"), [("P", 1)];
    percent_lower: [("P", "p@ss w/rd")] in "pw=p%40ss+w%2frd&x"
        => between("pw=", 13, "&x"), [("P", 1)];
    // JSON: quotes and backslashes, `\/`, non-ASCII as `\u00e9` and as a
    // surrogate pair, control characters.
    json_quotes: [("P", "pa\"ss\\w")] in r#"{"pw":"pa\"ss\\w"}"#
        => between("{\"pw\":\"", 9, "\"}"), [("P", 1)];
    json_slash: [("P", "a/b")] in r#"{"pw":"a\/b"}"# => between("{\"pw\":\"", 4, "\"}"), [("P", 1)];
    json_e_acute: [("P", "café")] in r#"["caf\u00e9"]"# => between("[\"", 9, "\"]"), [("P", 1)];
    json_e_acute_upper: [("P", "café")] in r#"["caf\u00E9"]"#
        => between("[\"", 9, "\"]"), [("P", 1)];
    json_surrogate_pair: [("P", "key😀")] in r#"["key\ud83d\ude00"]"#
        => between("[\"", 15, "\"]"), [("P", 1)];
    json_control: [("P", "a\tb\u{1}")] in r#"["a\tb\u0001"]"#
        => between("[\"", 10, "\"]"), [("P", 1)];
    json_go_html: [("P", "a<b&c")] in r#"["a\u003cb\u0026c"]"#
        => between("[\"", 15, "\"]"), [("P", 1)];
}

fn set(secrets: &[(&str, &[u8])]) -> Arc<MaskSet> {
    Arc::new(MaskSet::new(secrets).unwrap())
}

/// A tail that cannot begin any pattern is not held.
#[test]
fn hold_back_is_minimal() {
    let set = set(&[("T", b"secret-token")]);
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::new();
    masker.push(b"no secret here, nothing pending: ", &mut out);
    assert_eq!(masker.pending_len(), 0);
    assert_eq!(out, b"no secret here, nothing pending: ");

    // A tail that could still become the value is held, exactly that tail.
    masker.push(b"xyz secret-to", &mut out);
    assert_eq!(masker.pending_len(), "secret-to".len());
    assert_eq!(out, b"no secret here, nothing pending: xyz ");
    // One more byte that ends the hope: everything goes.
    masker.push(b"!", &mut out);
    assert_eq!(masker.pending_len(), 0);
    assert!(out.ends_with(b"xyz secret-to!"));

    // A tail that is a prefix of an encoding (hex of "secret-token") is
    // held too, and only as far back as the prefix goes.
    masker.push(b"hex 7365637265", &mut out);
    assert_eq!(masker.pending_len(), "7365637265".len());
    masker.finish(&mut out);
    assert_eq!(masker.pending_len(), 0);
    assert!(out.ends_with(b"hex 7365637265"));
}

/// The hold never reaches the longest pattern, whatever the body.
#[test]
fn hold_back_is_below_the_longest_pattern() {
    let set = set(&[("A", b"aaaaaaab")]);
    let longest = set.max_pattern_len();
    let mut masker = Masker::new(set);
    let mut out = Vec::new();
    for _ in 0..100 {
        masker.push(b"aaaaaaaaaaa", &mut out);
        assert!(masker.pending_len() < longest);
        // "aaaaaaa" is still a prefix of the value.
        assert_eq!(masker.pending_len(), 7);
    }
}

/// An occurrence that straddles chunks: its first bytes are held, not
/// emitted, until the chunk that completes it masks them.
#[test]
fn straddling_occurrence_is_held_then_masked() {
    let set = set(&[("T", b"abcd")]);
    let mut masker = Masker::new(set);
    let mut out = Vec::new();
    masker.push(b"xxab", &mut out);
    assert_eq!(out, b"xx");
    masker.push(b"c", &mut out);
    assert_eq!(out, b"xx");
    masker.push(b"dyy", &mut out);
    assert_eq!(out, b"xx****yy");
    masker.finish(&mut out);
    assert_eq!(out, b"xx****yy");
    assert_eq!(masker.counts().collect::<Vec<_>>(), [("T", 1)]);
}

/// With no secrets, bytes pass straight through.
#[test]
fn empty_set_passes_everything() {
    let set = set(&[]);
    assert!(set.is_empty());
    assert_eq!(set.max_pattern_len(), 0);
    let mut masker = Masker::new(set);
    let mut out = Vec::new();
    masker.push(b"anything", &mut out);
    assert_eq!(masker.pending_len(), 0);
    masker.finish(&mut out);
    assert_eq!(out, b"anything");
    assert_eq!(masker.counts().count(), 0);
}

#[test]
fn empty_value_is_refused_by_name() {
    let err = MaskSet::new(&[("GOOD", b"value"), ("EMPTY_ONE", b"")]).unwrap_err();
    assert!(matches!(&err, MaskSetError::EmptyValue { name } if name == "EMPTY_ONE"));
    assert_eq!(
        err.to_string(),
        "secret EMPTY_ONE: the value is empty, so it cannot be masked"
    );
}

/// No value (nor its hex or base64) in any Debug or Display output, even
/// with part of an occurrence held.
#[test]
fn nothing_prints_a_value() {
    let value = b"hunter2-very-secret";
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let set = set(&[("PW", value)]);
    let mut masker = Masker::new(set.clone());
    let mut out = Vec::new();
    masker.push(b"echo: hunter2-very-sec", &mut out);
    assert!(masker.pending_len() > 0);
    let err = MaskSet::new(&[("PW", value), ("E", b"")]).unwrap_err();
    for shown in [
        format!("{set:?}"),
        format!("{set:#?}"),
        format!("{masker:?}"),
        format!("{masker:#?}"),
        format!("{err:?}"),
        err.to_string(),
    ] {
        for needle in ["hunter2", "very-sec", &hex[..12], "aHVudGVy", "dW50ZXIy"] {
            assert!(!shown.contains(needle), "{needle:?} in {shown}");
        }
    }
    assert!(format!("{set:?}").contains("PW"), "names are not secret");
}
