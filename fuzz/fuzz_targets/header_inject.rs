//! Header injection: whatever headers a session sends, after injection
//! each attached header appears exactly once with exactly the attachment's
//! value, and every other header is as the session sent it.
//!
//! Input: the first byte picks how many of three attachments apply; the
//! rest is a list of `name:value` lines (invalid ones are skipped, as hyper
//! would have refused them before the gateway saw them).

#![no_main]

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use talos_gateway::secrets::secret::{inject, AttachSpec, Attachment, SecretBytes};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let specs = [
        ("A=x.example:authorization:Bearer", "v4lue-a"),
        ("B=x.example:x-api-key", "v4lue-b"),
        ("C=x.example:Cookie", "session=v4lue-c"),
    ];
    let attachments: Vec<Attachment> = specs
        .iter()
        .take(usize::from(pick % 4))
        .map(|(spec, value)| {
            let spec = AttachSpec::parse(spec).expect("valid spec");
            Attachment::new(&spec, SecretBytes::new(value.as_bytes().to_vec())).expect("valid")
        })
        .collect();

    let mut headers = HeaderMap::new();
    for line in rest.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let before = headers.clone();

    let used = inject(&attachments, &mut headers);
    assert_eq!(used.len(), attachments.len());
    for a in &attachments {
        let got: Vec<&HeaderValue> = headers.get_all(&a.header).iter().collect();
        assert_eq!(got, [a.header_value()], "exactly one {}", a.header);
    }
    for (name, value) in &before {
        if attachments.iter().any(|a| &a.header == name) {
            continue;
        }
        assert!(headers.get_all(name).iter().any(|v| v == value), "{name} kept");
    }
    let others = |h: &HeaderMap| {
        h.iter()
            .filter(|(n, _)| !attachments.iter().any(|a| &a.header == *n))
            .count()
    };
    assert_eq!(others(&headers), others(&before));
});
