//! The ClientHello parser over real captured hellos and hostile variants.
//!
//! The captures in `testdata/hellos/` come from real clients on loopback
//! (`testdata/hellos/capture.sh`, which runs the ignored test
//! `capture_real_hellos` below); `crafted-*` files are real captures edited
//! by the functions here (re-split into records, ECH added).

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use talos_gateway::gate::hello::{
    parse, Cause, ClientHello, Field, HelloLimits, Parse, DEFAULT_MAX_HELLO_BYTES,
    EXT_ENCRYPTED_CLIENT_HELLO, MAX_HOST_NAME_LEN, MAX_RECORD_PAYLOAD,
};
use talos_gateway::refusal::Refusal;

const HELLOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/hellos");

/// What a capture must parse to.
struct Case {
    file: &'static str,
    verdict: Result<(), Cause>,
    sni: Option<&'static str>,
    alpn: &'static [&'static str],
    records: usize,
}

/// One row per capture: `file => verdict, sni, [alpn...], records`.
macro_rules! captures {
    ($($file:literal => $verdict:expr, $sni:expr, [$($alpn:literal),*], $records:literal;)*) => {
        const CAPTURES: &[Case] = &[$(Case {
            file: $file,
            verdict: $verdict,
            sni: $sni,
            alpn: &[$($alpn),*],
            records: $records,
        }),*];
    };
}

const OK: Result<(), Cause> = Ok(());
const NAME: Option<&str> = Some("example.test");

captures! {
    "curl-http1.1" => OK, NAME, ["http/1.1"], 1;
    "curl-http2" => OK, NAME, ["h2", "http/1.1"], 1;
    "curl-tls1.2" => OK, NAME, ["h2", "http/1.1"], 1;
    "openssl-alpn" => OK, NAME, ["h2", "http/1.1"], 1;
    "openssl-noservername" => Err(Cause::NoServerName), None, [], 1;
    "python-ssl" => OK, NAME, [], 1;
    "node-tls" => OK, NAME, ["h2", "http/1.1"], 1;
    "wget-gnutls" => OK, Some("localhost"), [], 1;
    "java-jsse" => OK, NAME, ["h2", "http/1.1"], 1;
    "rustls-x25519" => OK, NAME, ["h2", "http/1.1"], 1;
    "rustls-x25519mlkem768" => OK, NAME, ["h2", "http/1.1"], 1;
    "crafted-rustls-x25519mlkem768-100b-records" => OK, NAME, ["h2", "http/1.1"], 15;
    "crafted-curl-http2-ech" => Err(Cause::EncryptedClientHello), NAME, ["h2", "http/1.1"], 1;
}

fn limits() -> HelloLimits {
    HelloLimits::default()
}

fn scratch() -> Vec<u8> {
    limits().scratch()
}

fn load(name: &str) -> Vec<u8> {
    let path = Path::new(HELLOS).join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every capture, by file stem.
fn all_captures() -> Vec<(&'static str, Vec<u8>)> {
    CAPTURES.iter().map(|c| (c.file, load(c.file))).collect()
}

/// A comparable, owned view of a verdict, without the framing (records,
/// bytes consumed), which re-splitting changes.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    verdict: Option<Result<(), Cause>>,
    sni: Option<String>,
    alpn: Vec<String>,
    ech: bool,
    legacy_version: u16,
    versions: Vec<u16>,
}

fn summarize(p: &Parse<'_>) -> Summary {
    let verdict = match p {
        Parse::Incomplete => None,
        Parse::Accept { .. } => Some(Ok(())),
        Parse::Refuse { cause, .. } => Some(Err(*cause)),
    };
    let hello = p.hello();
    Summary {
        verdict,
        sni: hello.and_then(ClientHello::server_name).map(str::to_owned),
        alpn: hello
            .map(|h| {
                h.alpn()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default(),
        ech: hello.is_some_and(ClientHello::has_ech),
        legacy_version: hello.map_or(0, ClientHello::legacy_version),
        versions: hello
            .map(|h| h.supported_versions().collect())
            .unwrap_or_default(),
    }
}

fn judge(input: &[u8]) -> Summary {
    summarize(&parse(input, &mut scratch(), &limits()))
}

fn verdict(input: &[u8]) -> Option<Result<(), Cause>> {
    judge(input).verdict
}

/// The handshake message the records of a capture carry, and the record
/// version bytes of its first record.
fn message(capture: &[u8]) -> (Vec<u8>, [u8; 2]) {
    let mut msg = Vec::new();
    let mut rest = capture;
    while rest.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        msg.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "capture ends inside a record");
    (msg, [capture[1], capture[2]])
}

/// Re-splits a handshake message into handshake records of the given sizes
/// (the last size repeats).
fn refragment(msg: &[u8], version: [u8; 2], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = msg;
    let mut i = 0;
    while !rest.is_empty() {
        let size = sizes[i.min(sizes.len() - 1)].clamp(1, MAX_RECORD_PAYLOAD);
        let (frag, tail) = rest.split_at(size.min(rest.len()));
        out.extend_from_slice(&[22, version[0], version[1]]);
        out.extend_from_slice(&(frag.len() as u16).to_be_bytes());
        out.extend_from_slice(frag);
        rest = tail;
        i += 1;
    }
    out
}

/// Offsets of the length fields of a single-record hello, found by walking
/// it independently of the parser.
#[derive(Debug)]
struct Layout {
    /// (offset, width in bytes) of every length field the parser checks
    /// exactly: framing, fixed fields, and the extensions it reads.
    lengths: Vec<(usize, usize)>,
    /// Offset of the extension block's length.
    extensions: usize,
}

fn layout(hello: &[u8]) -> Layout {
    let be = |at: usize, width: usize| {
        hello[at..at + width]
            .iter()
            .fold(0usize, |n, &b| n << 8 | usize::from(b))
    };
    let mut lengths = vec![(3, 2), (6, 3)];
    let mut at = 9 + 2 + 32;
    lengths.push((at, 1));
    at += 1 + be(at, 1);
    lengths.push((at, 2));
    at += 2 + be(at, 2);
    lengths.push((at, 1));
    at += 1 + be(at, 1);
    let extensions = at;
    lengths.push((at, 2));
    let end = at + 2 + be(at, 2);
    at += 2;
    while at < end {
        let ext_type = be(at, 2);
        let len = be(at + 2, 2);
        let data = at + 4;
        // The lengths of other extensions are left out: a lie there can
        // turn the following bytes into another well-formed hello.
        match ext_type {
            0 if len > 0 => {
                lengths.push((at + 2, 2));
                lengths.push((data, 2));
                let mut e = data + 2;
                while e < data + len {
                    lengths.push((e + 1, 2));
                    e += 3 + be(e + 1, 2);
                }
            }
            16 => {
                lengths.push((at + 2, 2));
                lengths.push((data, 2));
                let mut e = data + 2;
                while e < data + len {
                    lengths.push((e, 1));
                    e += 1 + be(e, 1);
                }
            }
            43 => {
                lengths.push((at + 2, 2));
                lengths.push((data, 1));
            }
            _ => {}
        }
        at = data + len;
    }
    Layout {
        lengths,
        extensions,
    }
}

/// Adds `delta` to the big-endian length of `width` bytes at `at`.
fn bump(bytes: &mut [u8], at: usize, width: usize, delta: isize) {
    let field = &mut bytes[at..at + width];
    let n = field.iter().fold(0isize, |n, &b| n << 8 | isize::from(b)) + delta;
    for (i, b) in field.iter_mut().enumerate() {
        *b = (n >> (8 * (width - 1 - i))) as u8;
    }
}

/// Appends an extension to a single-record hello and fixes every length.
fn with_extension(hello: &[u8], ext_type: u16, data: &[u8]) -> Vec<u8> {
    let extensions = layout(hello).extensions;
    let mut out = hello.to_vec();
    out.extend_from_slice(&ext_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
    let added = 4 + data.len() as isize;
    bump(&mut out, 3, 2, added);
    bump(&mut out, 6, 3, added);
    bump(&mut out, extensions, 2, added);
    out
}

/// A GREASE-shaped ECH outer extension body (draft-ietf-tls-esni §5): outer type,
/// HPKE suite, config id, a 32-byte `enc` and a 144-byte payload.
fn ech_outer() -> Vec<u8> {
    let mut ech = vec![0, 0x00, 0x01, 0x00, 0x01, 0x2a, 0x00, 0x20];
    ech.extend((0..32u8).map(|i| i.wrapping_mul(37)));
    ech.extend_from_slice(&[0x00, 0x90]);
    ech.extend((0..144u8).map(|i| i.wrapping_mul(101)));
    ech
}

// ---------------------------------------------------------------------------
// Captures: the table, every prefix, every split.
// ---------------------------------------------------------------------------

#[test]
fn hello_every_capture_is_in_the_table() {
    let mut on_disk: Vec<String> = std::fs::read_dir(HELLOS)
        .unwrap()
        .filter_map(|e| {
            let path: PathBuf = e.unwrap().path();
            (path.extension()? == "bin").then(|| path.file_stem().unwrap().to_string_lossy().into())
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CAPTURES.iter().map(|c| c.file.to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn hello_captures_parse_to_their_verdicts() {
    for case in CAPTURES {
        let bytes = load(case.file);
        let mut scratch = scratch();
        let parsed = parse(&bytes, &mut scratch, &limits());
        let s = summarize(&parsed);
        assert_eq!(s.verdict, Some(case.verdict), "{}", case.file);
        assert_eq!(s.sni.as_deref(), case.sni, "{}", case.file);
        assert_eq!(s.alpn, case.alpn, "{}", case.file);
        assert_eq!(
            parsed.refusal(),
            case.verdict.err().map(Cause::refusal),
            "{}",
            case.file
        );
        let hello = parsed
            .hello()
            .expect("every capture is a well-formed hello");
        assert_eq!(hello.records(), case.records, "{}", case.file);
        assert_eq!(hello.consumed(), bytes.len(), "{}", case.file);
        assert_eq!(
            hello.has_ech(),
            case.file.ends_with("-ech"),
            "{}",
            case.file
        );
        if let Parse::Accept { sni, hello } = parsed {
            assert_eq!(Some(sni), hello.server_name());
        }
    }
}

#[test]
fn hello_captures_versions_are_as_sent() {
    let tls13 = |name: &str| {
        let s = judge(&load(name));
        assert_eq!(s.legacy_version, 0x0303, "{name}");
        assert!(s.versions.contains(&0x0304), "{name}: {:x?}", s.versions);
    };
    for name in [
        "curl-http2",
        "openssl-alpn",
        "rustls-x25519mlkem768",
        "java-jsse",
    ] {
        tls13(name);
    }
    // A client capped at TLS 1.2 sends no supported_versions.
    let s = judge(&load("curl-tls1.2"));
    assert_eq!((s.legacy_version, s.versions), (0x0303, vec![]));
}

#[test]
fn hello_post_quantum_hello_is_large() {
    assert!(load("rustls-x25519mlkem768").len() > 1_400);
}

#[test]
fn hello_every_strict_prefix_is_incomplete() {
    for (name, bytes) in all_captures() {
        let mut scratch = scratch();
        for end in 0..bytes.len() {
            assert_eq!(
                parse(&bytes[..end], &mut scratch, &limits()),
                Parse::Incomplete,
                "{name}: prefix of {end}"
            );
        }
    }
}

#[test]
fn hello_refragmented_captures_judge_alike() {
    for (name, bytes) in all_captures() {
        let expected = judge(&bytes);
        let (msg, version) = message(&bytes);
        for size in [1, 2, 3, 4, 5, 7, 64, 100, 255, 256, 512, 1000, msg.len()] {
            let split = refragment(&msg, version, &[size]);
            let mut scratch = scratch();
            let parsed = parse(&split, &mut scratch, &limits());
            assert_eq!(
                summarize(&parsed),
                expected,
                "{name} in {size}-byte records"
            );
            let hello = parsed.hello().unwrap();
            assert_eq!(hello.records(), msg.len().div_ceil(size), "{name}/{size}");
            assert_eq!(hello.consumed(), split.len(), "{name}/{size}");
        }
    }
}

#[test]
fn hello_every_prefix_of_every_split_is_incomplete() {
    for (name, bytes) in all_captures() {
        let (msg, version) = message(&bytes);
        for size in [1, 3, 100, 512] {
            let split = refragment(&msg, version, &[size]);
            let mut scratch = scratch();
            // Every prefix for the coarser splits; for 1-byte records (six
            // wire bytes per message byte) every cut inside the first and
            // last few records and a stride in between keeps it quick.
            let step = if size == 1 { 7 } else { 1 };
            let ends =
                (0..split.len()).filter(|&e| e % step == 0 || e < 64 || e + 64 > split.len());
            for end in ends {
                assert_eq!(
                    parse(&split[..end], &mut scratch, &limits()),
                    Parse::Incomplete,
                    "{name} in {size}-byte records, prefix of {end}"
                );
            }
        }
    }
}

#[test]
fn hello_bytes_after_the_hello_are_left_alone() {
    let mut bytes = load("curl-http2");
    let hello_len = bytes.len();
    // What a client sends next: early data, say.
    bytes.extend_from_slice(&[23, 3, 3, 0, 3, 1, 2, 3]);
    let mut scratch = scratch();
    match parse(&bytes, &mut scratch, &limits()) {
        Parse::Accept { hello, .. } => assert_eq!(hello.consumed(), hello_len),
        other => panic!("{other:?}"),
    }
}

#[test]
fn hello_in_one_record_needs_no_scratch() {
    let bytes = load("rustls-x25519mlkem768");
    let parsed = parse(&bytes, &mut [], &limits());
    assert!(matches!(parsed, Parse::Accept { .. }), "{parsed:?}");
}

#[test]
fn hello_split_hello_with_short_scratch_says_so() {
    let bytes = load("crafted-rustls-x25519mlkem768-100b-records");
    let (msg, _) = message(&bytes);
    let mut short = vec![0; msg.len() - 1];
    match parse(&bytes, &mut short, &limits()) {
        Parse::Refuse {
            cause: Cause::ScratchTooSmall { needed },
            hello: None,
        } => assert_eq!(needed, msg.len()),
        other => panic!("{other:?}"),
    }
    let mut enough = vec![0; msg.len()];
    assert!(matches!(
        parse(&bytes, &mut enough, &limits()),
        Parse::Accept { .. }
    ));
}

#[test]
fn hello_byte_limit_is_a_parameter() {
    let bytes = load("rustls-x25519mlkem768");
    let mut scratch = scratch();
    let exact = HelloLimits {
        max_bytes: bytes.len(),
        ..limits()
    };
    assert!(matches!(
        parse(&bytes, &mut scratch, &exact),
        Parse::Accept { .. }
    ));
    let short = HelloLimits {
        max_bytes: bytes.len() - 1,
        ..limits()
    };
    // Refused from the record header, before the body arrives.
    for end in [5, bytes.len()] {
        assert_eq!(
            parse(&bytes[..end], &mut scratch, &short),
            Parse::Refuse {
                cause: Cause::TooLarge {
                    limit: bytes.len() - 1
                },
                hello: None
            }
        );
    }
    assert_eq!(DEFAULT_MAX_HELLO_BYTES, limits().max_bytes);
}

// ---------------------------------------------------------------------------
// Hostile and odd inputs.
// ---------------------------------------------------------------------------

/// A hello built field by field, for inputs no client sends.
#[derive(Clone)]
struct Built {
    legacy_version: u16,
    session_id: Vec<u8>,
    suites: Vec<u8>,
    compression: Vec<u8>,
    extensions: Option<Vec<(u16, Vec<u8>)>>,
}

impl Built {
    fn new() -> Built {
        Built {
            legacy_version: 0x0303,
            session_id: vec![9; 32],
            suites: vec![0x13, 0x01, 0x13, 0x02],
            compression: vec![0],
            extensions: Some(vec![(0, sni(&[(0, b"example.test")]))]),
        }
    }

    fn ext(mut self, ext_type: u16, data: Vec<u8>) -> Built {
        self.extensions
            .get_or_insert_with(Vec::new)
            .push((ext_type, data));
        self
    }

    fn without_extensions(mut self) -> Built {
        self.extensions = None;
        self
    }

    fn sni(self, entries: &[(u8, &[u8])]) -> Built {
        let mut b = self;
        b.extensions.as_mut().unwrap().retain(|(t, _)| *t != 0);
        b.ext(0, sni(entries))
    }

    fn body(&self) -> Vec<u8> {
        let mut b = self.legacy_version.to_be_bytes().to_vec();
        b.extend_from_slice(&[0x5a; 32]);
        b.push(self.session_id.len() as u8);
        b.extend_from_slice(&self.session_id);
        b.extend_from_slice(&(self.suites.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.suites);
        b.push(self.compression.len() as u8);
        b.extend_from_slice(&self.compression);
        if let Some(exts) = &self.extensions {
            let mut block = Vec::new();
            for (t, data) in exts {
                block.extend_from_slice(&t.to_be_bytes());
                block.extend_from_slice(&(data.len() as u16).to_be_bytes());
                block.extend_from_slice(data);
            }
            b.extend_from_slice(&(block.len() as u16).to_be_bytes());
            b.extend_from_slice(&block);
        }
        b
    }

    fn message(&self) -> Vec<u8> {
        handshake(1, &self.body())
    }

    fn bytes(&self) -> Vec<u8> {
        refragment(&self.message(), [3, 1], &[MAX_RECORD_PAYLOAD])
    }
}

fn handshake(msg_type: u8, body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u32).to_be_bytes();
    let mut m = vec![msg_type, len[1], len[2], len[3]];
    m.extend_from_slice(body);
    m
}

fn sni(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (name_type, name) in entries {
        list.push(*name_type);
        list.extend_from_slice(&(name.len() as u16).to_be_bytes());
        list.extend_from_slice(name);
    }
    let mut data = (list.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    data
}

fn alpn(names: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for n in names {
        list.push(n.len() as u8);
        list.extend_from_slice(n);
    }
    let mut data = (list.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    data
}

fn refused(cause: Cause) -> Option<Result<(), Cause>> {
    Some(Err(cause))
}

#[test]
fn hello_built_hello_is_accepted() {
    let s = judge(&Built::new().ext(16, alpn(&[b"h2"])).bytes());
    assert_eq!(s.verdict, Some(Ok(())));
    assert_eq!(s.sni.as_deref(), Some("example.test"));
    assert_eq!(s.alpn, ["h2"]);
}

#[test]
fn hello_not_tls_first_bytes() {
    // Nothing yet: wait.
    assert_eq!(verdict(b""), None);
    // Plain HTTP is refused on its first byte.
    for input in [
        &b"GET / HTTP/1.1\r\nHost: example.test\r\n\r\n"[..],
        b"G",
        b"\x16\x03",
    ] {
        let v = verdict(input);
        assert!(v.is_none() || v.unwrap().is_err(), "{input:?}");
    }
    assert_eq!(
        verdict(b"GET / HTTP/1.1\r\n"),
        refused(Cause::NotHandshake { content_type: b'G' })
    );
    // An SSLv2-compatible hello: a two-byte length with the high bit set,
    // then msg_type 1 and version 3.1.
    assert_eq!(
        verdict(&[0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00]),
        refused(Cause::SslV2)
    );
    // Handshake content type, but record version 2.0 or 0x16 0x16.
    assert_eq!(
        verdict(&[22, 2, 0, 0, 1]),
        refused(Cause::RecordVersion { major: 2 })
    );
    assert_eq!(
        verdict(&[22, 22, 22]),
        refused(Cause::RecordVersion { major: 22 })
    );
    // A TLS alert or application data first.
    assert_eq!(
        verdict(&[21, 3, 3, 0, 2, 2, 40]),
        refused(Cause::NotHandshake { content_type: 21 })
    );
}

#[test]
fn hello_other_handshake_messages_are_not_tls() {
    let server_hello = handshake(2, &Built::new().body());
    let bytes = refragment(&server_hello, [3, 3], &[MAX_RECORD_PAYLOAD]);
    // Judged as soon as the handshake type arrives.
    assert_eq!(
        verdict(&bytes[..6]),
        refused(Cause::NotClientHello { handshake_type: 2 })
    );
    assert_eq!(
        verdict(&bytes),
        refused(Cause::NotClientHello { handshake_type: 2 })
    );
}

#[test]
fn hello_record_framing_refusals() {
    let msg = Built::new().message();
    // Zero-length record, first or in the middle.
    assert_eq!(verdict(&[22, 3, 1, 0, 0]), refused(Cause::EmptyRecord));
    let mut mid = refragment(&msg[..10], [3, 1], &[10]);
    mid.extend_from_slice(&[22, 3, 1, 0, 0]);
    assert_eq!(verdict(&mid), refused(Cause::EmptyRecord));
    // A record over 2^14 bytes.
    assert_eq!(
        verdict(&[22, 3, 1, 0x40, 0x01]),
        refused(Cause::RecordOverflow { len: 16_385 })
    );
    // A ChangeCipherSpec or alert interleaved before the hello is whole.
    for content_type in [20, 21, 23, 0x80] {
        let mut bytes = refragment(&msg[..50], [3, 1], &[50]);
        bytes.extend_from_slice(&[content_type, 3, 3, 0, 1, 1]);
        assert_eq!(
            verdict(&bytes),
            refused(Cause::InterleavedRecord { content_type })
        );
    }
    // Later records need major version 3 too.
    let mut bytes = refragment(&msg[..50], [3, 1], &[50]);
    bytes.extend_from_slice(&[22, 4, 1, 0, 1, 1]);
    assert_eq!(verdict(&bytes), refused(Cause::RecordVersion { major: 4 }));
}

#[test]
fn hello_lying_lengths_at_every_level() {
    let good = Built::new()
        .ext(16, alpn(&[b"h2", b"http/1.1"]))
        .ext(43, vec![2, 3, 4]);
    let bytes = good.bytes();
    let layout = layout(&bytes);
    let at = |i: usize| layout.lengths[i];
    let lie = |(offset, width): (usize, usize), delta: isize| {
        let mut b = bytes.clone();
        bump(&mut b, offset, width, delta);
        verdict(&b)
    };
    use Field::*;
    // Record length: longer than the message leaves bytes after the hello
    // in its record; shorter leaves the message incomplete, and its last
    // byte is then read as the next record's content type.
    assert_eq!(lie(at(0), 1), refused(Cause::TrailingData));
    assert!(matches!(lie(at(0), -1), Some(Err(_))));
    // Handshake length: longer than the record waits for another record;
    // shorter leaves bytes in the record after the message.
    assert_eq!(lie(at(1), 1), None);
    assert_eq!(lie(at(1), -1), refused(Cause::TrailingData));
    // A handshake length far beyond the limit is refused from its header.
    assert_eq!(
        lie(at(1), 0x10_0000),
        refused(Cause::TooLarge {
            limit: DEFAULT_MAX_HELLO_BYTES
        })
    );
    // Inside the body each lie is caught at its own level or the next.
    assert_eq!(lie(at(2), 1), refused(Cause::Malformed(SessionId)));
    assert_eq!(lie(at(2), 200), refused(Cause::Malformed(SessionId)));
    assert_eq!(lie(at(3), 1), refused(Cause::Malformed(CipherSuites)));
    assert!(matches!(lie(at(3), 2), Some(Err(Cause::Malformed(_)))));
    assert_eq!(lie(at(3), 0x7000), refused(Cause::Malformed(CipherSuites)));
    assert_eq!(
        lie(at(4), -1),
        refused(Cause::Malformed(CompressionMethods))
    );
    assert!(matches!(lie(at(4), 1), Some(Err(_))));
    assert_eq!(lie(at(5), 1), refused(Cause::Malformed(Extensions)));
    assert_eq!(lie(at(5), -1), refused(Cause::TrailingData));
    assert_eq!(lie(at(5), -4), refused(Cause::TrailingData));
    // server_name: the extension's length, its list's, its entry's.
    for (field, delta) in [(6, 1), (6, -1), (7, 1), (7, -1), (8, 1), (8, -1)] {
        assert_eq!(lie(at(field), delta), refused(Cause::Malformed(ServerName)));
    }
    // ALPN: the extension, its list, each name.
    for (field, delta) in [
        (9, 1),
        (9, -1),
        (10, 1),
        (10, -2),
        (11, 1),
        (12, 1),
        (12, -8),
    ] {
        assert_eq!(
            lie(at(field), delta),
            refused(Cause::Malformed(Alpn)),
            "{field}"
        );
    }
    // supported_versions, the last extension: a longer extension runs out
    // of the extension block.
    assert_eq!(lie(at(13), 1), refused(Cause::Malformed(Extensions)));
    for (field, delta) in [(13, -1), (14, 1), (14, -1)] {
        assert_eq!(
            lie(at(field), delta),
            refused(Cause::Malformed(SupportedVersions))
        );
    }
    assert_eq!(layout.lengths.len(), 15);
}

#[test]
fn hello_lying_lengths_in_real_captures_are_never_accepted() {
    for (name, bytes) in all_captures() {
        if name.contains("records") {
            continue;
        }
        for &(offset, width) in &layout(&bytes).lengths {
            let max = (1isize << (8 * width)) - 1;
            let now = bytes[offset..offset + width]
                .iter()
                .fold(0isize, |n, &b| n << 8 | isize::from(b));
            for target in [0, 1, now - 1, now + 1, max] {
                if target < 0 || target > max || target == now {
                    continue;
                }
                let mut lied = bytes.clone();
                bump(&mut lied, offset, width, target - now);
                let v = verdict(&lied);
                assert!(
                    !matches!(v, Some(Ok(()))),
                    "{name}: length at {offset} set to {target} was accepted"
                );
            }
        }
    }
}

#[test]
fn hello_malformed_fixed_fields() {
    use Field::*;
    let check = |b: Built, cause: Cause| assert_eq!(verdict(&b.bytes()), refused(cause));
    check(
        Built {
            legacy_version: 0x0203,
            ..Built::new()
        },
        Cause::Malformed(LegacyVersion),
    );
    check(
        Built {
            session_id: vec![0; 33],
            ..Built::new()
        },
        Cause::Malformed(SessionId),
    );
    check(
        Built {
            suites: vec![],
            ..Built::new()
        },
        Cause::Malformed(CipherSuites),
    );
    check(
        Built {
            suites: vec![0x13, 0x01, 0x13],
            ..Built::new()
        },
        Cause::Malformed(CipherSuites),
    );
    check(
        Built {
            compression: vec![],
            ..Built::new()
        },
        Cause::Malformed(CompressionMethods),
    );
    // A body cut anywhere inside the fixed fields.
    let body = Built::new().body();
    for end in 0..40 {
        let bytes = refragment(&handshake(1, &body[..end]), [3, 1], &[MAX_RECORD_PAYLOAD]);
        assert!(
            matches!(verdict(&bytes), Some(Err(Cause::Malformed(_)))),
            "body cut at {end}"
        );
    }
    // A hello without extensions is legal, and names no one.
    assert_eq!(
        verdict(&Built::new().without_extensions().bytes()),
        refused(Cause::NoServerName)
    );
}

#[test]
fn hello_malformed_extension_contents() {
    use Field::*;
    let check = |b: Built, cause: Cause| assert_eq!(verdict(&b.bytes()), refused(cause));
    check(Built::new().ext(16, vec![]), Cause::Malformed(Alpn));
    check(Built::new().ext(16, vec![0, 0]), Cause::Malformed(Alpn));
    check(
        Built::new().ext(16, alpn(&[b"h2", b""])),
        Cause::Malformed(Alpn),
    );
    check(
        Built::new().ext(43, vec![]),
        Cause::Malformed(SupportedVersions),
    );
    check(
        Built::new().ext(43, vec![0]),
        Cause::Malformed(SupportedVersions),
    );
    check(
        Built::new().ext(43, vec![3, 3, 4, 3]),
        Cause::Malformed(SupportedVersions),
    );
    let mut trailing = sni(&[(0, b"example.test")]);
    trailing.push(0);
    check(
        Built::new().without_extensions().ext(0, trailing),
        Cause::Malformed(ServerName),
    );
}

#[test]
fn hello_duplicate_extensions_are_not_tls() {
    for ext_type in [0u16, 16, 43, 0x0a0a, 0xff01] {
        let data = match ext_type {
            0 => sni(&[(0, b"example.test")]),
            16 => alpn(&[b"h2"]),
            43 => vec![2, 3, 4],
            _ => vec![],
        };
        // Built::new() already holds one server_name.
        let mut b = Built::new().ext(ext_type, data.clone());
        if ext_type != 0 {
            b = b.ext(ext_type, data);
        }
        assert_eq!(
            verdict(&b.bytes()),
            refused(Cause::DuplicateExtension { ext_type }),
            "{ext_type:#x}"
        );
    }
    // Also when one of them is ECH: malformed comes first.
    let b = Built::new()
        .ext(EXT_ENCRYPTED_CLIENT_HELLO, ech_outer())
        .ext(EXT_ENCRYPTED_CLIENT_HELLO, ech_outer());
    assert_eq!(
        verdict(&b.bytes()),
        refused(Cause::DuplicateExtension {
            ext_type: EXT_ENCRYPTED_CLIENT_HELLO
        })
    );
}

#[test]
fn hello_server_name_rules() {
    let name = |entries: &[(u8, &[u8])]| judge(&Built::new().sni(entries).bytes());
    // Two names, or one name twice: not one server.
    for entries in [
        &[(0, &b"a.test"[..]), (0, b"b.test")][..],
        &[(0, b"example.test"), (0, b"example.test")],
        &[(0, b""), (0, b"example.test")],
    ] {
        assert_eq!(name(entries).verdict, refused(Cause::SeveralServerNames));
    }
    // Empty host name, no host name entry: no name.
    assert_eq!(name(&[(0, b"")]).verdict, refused(Cause::NoServerName));
    assert_eq!(name(&[(1, b"x")]).verdict, refused(Cause::NoServerName));
    assert_eq!(name(&[]).verdict, refused(Cause::NoServerName));
    assert_eq!(
        verdict(
            &Built::new()
                .sni(&[])
                .without_extensions()
                .ext(0, vec![])
                .bytes()
        ),
        refused(Cause::NoServerName)
    );
    // Other name types are skipped.
    let s = name(&[(7, b"\xff\xfe"), (0, b"example.test"), (1, b"")]);
    assert_eq!(
        (s.verdict, s.sni.as_deref()),
        (Some(Ok(())), Some("example.test"))
    );
    // Returned as sent: upper case, trailing dot, underscore, IP literal.
    for sent in [
        "Example.TEST.",
        "_dmarc.example.test",
        "127.0.0.1",
        "xn--bcher-kva.test",
    ] {
        let s = name(&[(0, sent.as_bytes())]);
        assert_eq!(s.sni.as_deref(), Some(sent));
        assert_eq!(s.verdict, Some(Ok(())));
    }
    // Outside the host name alphabet, or too long: malformed.
    for bad in [
        &b"exa mple.test"[..],
        b"example.test\0",
        b"::1",
        b"[::1]",
        b"b\xc3\xbccher.test",
        b"a/b",
        b"a:443",
    ] {
        assert_eq!(
            name(&[(0, bad)]).verdict,
            refused(Cause::BadServerName),
            "{bad:?}"
        );
    }
    let longest = vec![b'a'; MAX_HOST_NAME_LEN];
    assert_eq!(name(&[(0, &longest)]).verdict, Some(Ok(())));
    let too_long = vec![b'a'; MAX_HOST_NAME_LEN + 1];
    assert_eq!(
        name(&[(0, &too_long)]).verdict,
        refused(Cause::BadServerName)
    );
}

#[test]
fn hello_ech_is_refused_whatever_else_the_hello_holds() {
    for entries in [
        &[(0, &b"example.test"[..])][..],
        &[],
        &[(0, b"")],
        &[(0, b"a.test"), (0, b"b.test")],
    ] {
        let mut b = Built::new().ext(EXT_ENCRYPTED_CLIENT_HELLO, ech_outer());
        if entries.is_empty() {
            b.extensions.as_mut().unwrap().retain(|(t, _)| *t != 0);
        } else {
            b = b.sni(entries);
        }
        let bytes = b.bytes();
        let mut scratch = scratch();
        let parsed = parse(&bytes, &mut scratch, &limits());
        assert_eq!(parsed.refusal(), Some(Refusal::EncryptedClientHello));
        assert!(parsed.hello().unwrap().has_ech());
    }
    // An empty ECH extension counts too: presence decides.
    let b = Built::new().ext(EXT_ENCRYPTED_CLIENT_HELLO, vec![]);
    assert_eq!(verdict(&b.bytes()), refused(Cause::EncryptedClientHello));
    // ECH added to every real capture.
    for (name, bytes) in all_captures() {
        if name.starts_with("crafted-") {
            continue;
        }
        let ech = with_extension(&bytes, EXT_ENCRYPTED_CLIENT_HELLO, &ech_outer());
        assert_eq!(
            verdict(&ech),
            refused(Cause::EncryptedClientHello),
            "{name}"
        );
    }
}

#[test]
fn hello_oversized_hello_is_bounded() {
    // A padding extension that pushes the message past the limit, in
    // full-size records.
    let big = Built::new().ext(21, vec![0; DEFAULT_MAX_HELLO_BYTES]);
    let bytes = refragment(&big.message(), [3, 1], &[MAX_RECORD_PAYLOAD]);
    let mut scratch = scratch();
    assert_eq!(
        parse(&bytes, &mut scratch, &limits()),
        Parse::Refuse {
            cause: Cause::TooLarge {
                limit: DEFAULT_MAX_HELLO_BYTES
            },
            hello: None
        }
    );
    // A hello just within 16 KiB in many small records runs into the
    // headers' share of the limit.
    let near = Built::new().ext(21, vec![0; 16 * 1024 - 200]);
    let small = refragment(&near.message(), [3, 1], &[64]);
    assert!(small.len() > DEFAULT_MAX_HELLO_BYTES);
    assert_eq!(
        verdict(&small),
        refused(Cause::TooLarge {
            limit: DEFAULT_MAX_HELLO_BYTES
        })
    );
    // The same hello in full records is fine.
    let whole = refragment(&near.message(), [3, 1], &[MAX_RECORD_PAYLOAD]);
    assert_eq!(verdict(&whole), Some(Ok(())));
}

#[test]
fn hello_refusal_names_are_the_stable_ones() {
    let name = |bytes: &[u8]| {
        let mut scratch = scratch();
        parse(bytes, &mut scratch, &limits())
            .refusal()
            .map(Refusal::as_str)
    };
    assert_eq!(name(b"GET /"), Some("not_tls"));
    assert_eq!(name(&load("openssl-noservername")), Some("no_server_name"));
    assert_eq!(
        name(&load("crafted-curl-http2-ech")),
        Some("encrypted_client_hello")
    );
    assert_eq!(name(&load("curl-http2")), None);
}

// ---------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------

fn any_capture() -> impl Strategy<Value = Vec<u8>> {
    (0..CAPTURES.len()).prop_map(|i| load(CAPTURES[i].file))
}

/// Parses `input` and checks what holds for any input; returns the verdict.
fn parse_checked(input: &[u8], limits: &HelloLimits) -> Summary {
    let mut scratch = limits.scratch();
    let parsed = parse(input, &mut scratch, limits);
    if let Some(hello) = parsed.hello() {
        assert!(hello.consumed() <= input.len());
        assert!(hello.consumed() <= limits.max_bytes);
        assert!(hello.records() >= 1);
        if let Some(sni) = hello.server_name() {
            assert!((1..=MAX_HOST_NAME_LEN).contains(&sni.len()));
            assert!(sni.len() < hello.consumed());
        }
        for p in hello.alpn() {
            assert!(!p.is_empty());
        }
    }
    if input.len() >= limits.max_bytes {
        assert_ne!(parsed, Parse::Incomplete);
    }
    let mut again = limits.scratch();
    assert_eq!(
        parse(input, &mut again, limits),
        parsed,
        "not deterministic"
    );
    summarize(&parsed)
}

/// Flips, overwrites or sets bytes at the given positions (mod length).
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, op, value) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at % bytes.len();
        match op % 3 {
            0 => bytes[i] ^= 1 << (value % 8),
            1 => bytes[i] = value,
            _ => bytes[i] = bytes[i].wrapping_add(value),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn hello_prop_arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..3000)) {
        parse_checked(&input, &limits());
    }

    #[test]
    fn hello_prop_record_shaped_bytes_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..3000),
        minor in 0u8..5,
        max_bytes in 6usize..4000,
    ) {
        // Pass the first checks so the fuzzing reaches the body.
        let mut input = vec![22, 3, minor];
        input.extend_from_slice(&body);
        let limits = HelloLimits { max_bytes, ..limits() };
        parse_checked(&input, &limits);
    }

    #[test]
    fn hello_prop_truncated_hellos_are_incomplete(
        capture in any_capture(),
        cut in any::<prop::sample::Index>(),
        size in 1usize..600,
    ) {
        let (msg, version) = message(&capture);
        let split = refragment(&msg, version, &[size]);
        let end = cut.index(split.len());
        let mut scratch = scratch();
        prop_assert_eq!(parse(&split[..end], &mut scratch, &limits()), Parse::Incomplete);
    }

    #[test]
    fn hello_prop_any_split_judges_alike(
        capture in any_capture(),
        sizes in proptest::collection::vec(1usize..400, 1..40),
    ) {
        let (msg, version) = message(&capture);
        let split = refragment(&msg, version, &sizes);
        prop_assert_eq!(judge(&split), judge(&capture));
    }

    #[test]
    fn hello_prop_mutated_hellos_never_panic_and_decide_once(
        capture in any_capture(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 8),
    ) {
        let input = mutate(capture, &edits);
        let mut scratch = scratch();
        let whole = parse(&input, &mut scratch, &limits());
        parse_checked(&input, &limits());
        // Once a prefix is judged, the longer input gets the same answer.
        for cut in cuts {
            let end = cut.index(input.len() + 1);
            let mut s = self::scratch();
            let part = parse(&input[..end], &mut s, &limits());
            prop_assert!(part == Parse::Incomplete || part == whole, "prefix {}: {:?} vs {:?}", end, part, whole);
        }
    }

    #[test]
    fn hello_prop_prefix_verdicts_are_monotonic(
        input in proptest::collection::vec(prop_oneof![Just(22u8), Just(3), Just(0), Just(1), any::<u8>()], 0..400),
    ) {
        let mut scratch = scratch();
        let whole = parse(&input, &mut scratch, &limits());
        for end in 0..=input.len() {
            let mut s = self::scratch();
            let part = parse(&input[..end], &mut s, &limits());
            prop_assert!(part == Parse::Incomplete || part == whole, "prefix {}: {:?} vs {:?}", end, part, whole);
        }
    }
}

// ---------------------------------------------------------------------------
// Capturing (run by testdata/hellos/capture.sh; rewrites the captures).
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "rewrites testdata/hellos from the TLS clients on this machine: run capture.sh"]
async fn capture_real_hellos() {
    use std::sync::Arc;
    use talos_gateway::gate::capture::capture_hellos;
    use tokio_rustls::rustls;

    let dir = Path::new(HELLOS);
    let script = dir.join("capture.sh");
    let listed = std::process::Command::new("bash")
        .arg(&script)
        .arg("names")
        .output()
        .unwrap();
    assert!(listed.status.success());
    let mut names: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let rustls_clients = [
        // The provider's default order without `prefer-post-quantum`
        // (as this workspace builds rustls): X25519 first.
        ("rustls-x25519", None),
        // The order rustls uses by default: X25519MLKEM768 first, which puts
        // a 1,216-byte key share in the hello.
        (
            "rustls-x25519mlkem768",
            Some(rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768),
        ),
    ];
    names.extend(rustls_clients.iter().map(|(n, _)| n.to_string()));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let capture = tokio::spawn({
        let names = names.clone();
        async move { capture_hellos(listener, Path::new(HELLOS), &names, HelloLimits::default()).await }
    });

    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .arg(&script)
            .arg("run")
            .arg(port.to_string())
            .status()
    });
    assert!(run.await.unwrap().unwrap().success());

    for (_, first) in rustls_clients {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if let Some(group) = first {
            provider.kx_groups.retain(|g| g.name() != group.name());
            provider.kx_groups.insert(0, group);
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("example.test").unwrap();
        // Fails once the listener closes: only the hello matters.
        let _ = connector.connect(name, tcp).await;
    }
    capture.await.unwrap().unwrap();

    // Crafted from the real ones.
    let pq = load("rustls-x25519mlkem768");
    let (msg, version) = message(&pq);
    std::fs::write(
        dir.join("crafted-rustls-x25519mlkem768-100b-records.bin"),
        refragment(&msg, version, &[100]),
    )
    .unwrap();
    std::fs::write(
        dir.join("crafted-curl-http2-ech.bin"),
        with_extension(
            &load("curl-http2"),
            EXT_ENCRYPTED_CLIENT_HELLO,
            &ech_outer(),
        ),
    )
    .unwrap();
    for name in &names {
        eprintln!("{name}: {} bytes", load(name).len());
    }
}
