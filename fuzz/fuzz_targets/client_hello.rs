//! Fuzzes the ClientHello parser: any bytes, as one input and re-split
//! into other records.
//!
//! Checks, beyond "no panic": the verdict is deterministic; a well-formed
//! hello lies within the input and the byte limit; its server name is a
//! host name; a prefix is undecided or judged the same as the whole; the
//! same handshake message in other records is judged the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use talos_gateway::gate::hello::{parse, HelloLimits, Parse, MAX_HOST_NAME_LEN};

fuzz_target!(|data: &[u8]| {
    // A small limit now and then, so the bounds are reached too.
    let max_bytes = match data.last() {
        Some(&b) if b < 16 => 6 + usize::from(b) * 64,
        _ => HelloLimits::default().max_bytes,
    };
    let limits = HelloLimits {
        max_bytes,
        ..HelloLimits::default()
    };
    let mut scratch = limits.scratch();
    let whole = parse(data, &mut scratch, &limits);

    let mut again = limits.scratch();
    assert_eq!(parse(data, &mut again, &limits), whole, "not deterministic");
    if data.len() >= limits.max_bytes {
        assert_ne!(whole, Parse::Incomplete, "undecided past the limit");
    }

    let cut = data.len() / 2;
    let mut s = limits.scratch();
    let part = parse(&data[..cut], &mut s, &limits);
    assert!(
        part == Parse::Incomplete || part == whole,
        "prefix of {cut} judged {part:?}, whole {whole:?}"
    );

    let Some(hello) = whole.hello() else {
        return;
    };
    assert!(hello.records() >= 1);
    assert!(hello.consumed() <= data.len() && hello.consumed() <= limits.max_bytes);
    if let Some(sni) = hello.server_name() {
        assert!((1..=MAX_HOST_NAME_LEN).contains(&sni.len()));
        assert!(sni
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)));
    }
    assert!(hello.alpn().all(|p| !p.is_empty()));
    if let Parse::Accept { sni, hello } = whole {
        assert_eq!(hello.server_name(), Some(sni));
        assert!(!hello.has_ech());
    }

    // The same message in records of another size.
    let size = 1 + data.len() % 97;
    let split = refragment(&data[..hello.consumed()], size);
    let limits = HelloLimits {
        max_bytes: split.len().max(limits.max_bytes),
        ..limits
    };
    let mut s = limits.scratch();
    let resplit = parse(&split, &mut s, &limits);
    assert_eq!(resplit.refusal(), whole.refusal());
    let h = resplit.hello().expect("a re-split hello is a hello");
    assert_eq!(h.server_name(), hello.server_name());
    assert!(h.alpn().eq(hello.alpn()));
    assert!(h.supported_versions().eq(hello.supported_versions()));
    assert_eq!(h.has_ech(), hello.has_ech());
});

/// The handshake bytes of well-formed records, re-split into `size`-byte
/// records.
fn refragment(records: &[u8], size: usize) -> Vec<u8> {
    let mut msg = Vec::new();
    let mut rest = records;
    while let [_, _, _, hi, lo, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        msg.extend_from_slice(&tail[..len]);
        rest = &tail[len..];
    }
    let mut out = Vec::new();
    for frag in msg.chunks(size) {
        out.extend_from_slice(&[22, 3, 3]);
        out.extend_from_slice(&(frag.len() as u16).to_be_bytes());
        out.extend_from_slice(frag);
    }
    out
}
