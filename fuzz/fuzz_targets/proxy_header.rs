//! Fuzzes the member link's PROXY protocol v2 header parser
//! (`talos_gateway::pair::proxy`): any bytes as the first bytes a peer
//! writes on the link.
//!
//! Checks: never a panic; a header is accepted only whole, within
//! `MAX_HEADER`, taking no byte past its announced end; what is accepted
//! encodes back to a header that reads the same; and a prefix of an
//! accepted header asks for more, never for a refusal.

#![no_main]

use libfuzzer_sys::fuzz_target;
use talos_gateway::pair::proxy::{parse_prefix, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((header, used))) = parse_prefix(data) else {
        return;
    };
    assert!(used <= MAX_HEADER && used <= data.len());
    for n in 0..used {
        assert_eq!(parse_prefix(&data[..n]), Ok(None), "prefix {n} of {used}");
    }
    let again = header.encode().expect("an accepted header encodes");
    let (back, len) = parse_prefix(&again)
        .expect("re-encoded reads")
        .expect("whole");
    assert_eq!(back, header);
    assert_eq!(len, again.len());
});
