//! Fuzzes the reply-coding decision (`talos_gateway::secrets::decode`):
//! whatever head a destination sends, a reply the gateway passes to the
//! masker carries no coding it did not decode.
//!
//! Input: one byte for the status (206 when it is 0, else 200), then
//! `name:value` lines (invalid ones skipped, as hyper would have refused
//! them), then, after a line `--`, bytes that go through the planned
//! decoder and a gRPC flag reader, in chunks cut by the first byte.
//!
//! Checks, against an independent reading of the same headers: a plan
//! that decodes nothing means no content coding, no transfer coding but
//! `chunked` and no `grpc-encoding` other than `identity`; a plan that
//! decodes means exactly one coding, the one the headers name; a 206 and
//! gRPC-Web's text form are refused; the plan is the same with and
//! without the reply's `Connection` header (decided on the head as sent);
//! decoding stays within its bounds however the body is cut; the gRPC flag
//! reader's verdict does not depend on how the body is cut.

#![no_main]

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use talos_gateway::secrets::decode::{
    plan, Bounds, Coding, Decoder, GrpcFrames, GrpcKind, ReplyRefusal,
};

/// Every listed token of `name`, lower case, trimmed, without empties.
fn tokens(headers: &HeaderMap, name: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for v in headers.get_all(name) {
        let v = std::str::from_utf8(v.as_bytes()).ok()?;
        out.extend(
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty()),
        );
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&status, rest)) = data.split_first() else {
        return;
    };
    let status = if status == 0 { 206 } else { 200 };
    let (head, body) = match rest.windows(3).position(|w| w == b"\n--") {
        Some(at) => (&rest[..at], rest.get(at + 4..).unwrap_or(&[])),
        None => (rest, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
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
    let planned = plan(status, &headers);
    assert_eq!(planned, plan(status, &headers), "deterministic");
    let mut without = headers.clone();
    without.remove("connection");
    assert_eq!(
        planned,
        plan(status, &without),
        "decided on the head as sent"
    );

    let content = tokens(&headers, "content-encoding");
    let transfer = tokens(&headers, "transfer-encoding");
    let codings: Option<Vec<String>> = content.zip(transfer).map(|(c, t)| {
        c.into_iter()
            .chain(t)
            .filter(|t| t != "identity" && t != "chunked")
            .collect()
    });
    let grpc_coded = headers
        .get_all("grpc-encoding")
        .iter()
        .any(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"));
    let web_text = headers.get_all("content-type").iter().any(|v| {
        let v = v.as_bytes().trim_ascii_start().to_ascii_lowercase();
        v.starts_with(b"application/grpc-web-text")
            && matches!(v.get(25), None | Some(b'+' | b';' | b' ' | b'\t'))
    });
    match &planned {
        Ok(p) => {
            assert_ne!(status, 206);
            assert!(!grpc_coded && !web_text, "{headers:?}");
            let codings = codings.expect("text headers when passed");
            match p.decode {
                None => assert!(codings.is_empty(), "passed coded: {headers:?}"),
                Some(c) => {
                    assert_eq!(codings.len(), 1, "{headers:?}");
                    let named = match codings[0].as_str() {
                        "gzip" | "x-gzip" => Coding::Gzip,
                        "deflate" => Coding::Deflate,
                        "br" => Coding::Brotli,
                        "zstd" => Coding::Zstd,
                        other => panic!("decoding {other:?} as {c:?}"),
                    };
                    assert_eq!(named, c);
                }
            }
        }
        Err(ReplyRefusal::PartialReply) => assert_eq!(status, 206),
        Err(_) => assert_ne!(status, 206),
    }

    let Some((&cut, body)) = body.split_first() else {
        return;
    };
    let step = 1 + usize::from(cut % 64);
    if let Ok(p) = planned {
        if let Some(coding) = p.decode {
            let bounds = Bounds {
                max_bytes: 1 << 20,
                max_ratio: 4,
            };
            let mut d = Decoder::new(coding, bounds).expect("decoder");
            let mut out = Vec::new();
            let mut ok = true;
            for chunk in body.chunks(step) {
                if d.push(chunk, &mut out).is_err() {
                    ok = false;
                    break;
                }
                assert!(out.len() as u64 <= bounds.max_bytes);
            }
            if ok {
                let _ = d.finish(&mut out);
            }
            assert!(out.len() as u64 <= bounds.max_bytes);
            assert_eq!(d.decoded(), out.len() as u64);
        }
    }
    for kind in [GrpcKind::Grpc, GrpcKind::GrpcWeb] {
        let mut whole = GrpcFrames::new(kind);
        let mut split = GrpcFrames::new(kind);
        let a = whole.read(body);
        let b = body.chunks(step).try_for_each(|c| split.read(c));
        assert_eq!(a, b);
    }
});
