//! Fuzzes the sessions' DNS answerer (`talos_gateway::dns::query::step`):
//! any bytes as one query from a session.
//!
//! Checks: never a panic; every reply is a DNS response (QR set) with the
//! query's id, at most `MAX_UDP_PAYLOAD` bytes, carrying no address for a
//! name not on the allowlist; a query settled by resolution is answered
//! too, for every kind of resolution.

#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use talos_gateway::dns::query::{
    question_name, step, Outcome, Resolved, Scope, Step, MAX_UDP_PAYLOAD,
};

fn check(input: &[u8], bytes: &[u8], outcome: Outcome) {
    assert!(bytes.len() <= usize::from(MAX_UDP_PAYLOAD), "{}", bytes.len());
    assert!(bytes.len() >= 12);
    assert_eq!(bytes[..2], input[..2], "the id");
    assert_ne!(bytes[2] & 0x80, 0, "a response");
    if outcome != Outcome::Answered {
        // ANCOUNT, bytes 6 and 7 of the header.
        assert_eq!(bytes[6..8], [0, 0], "{outcome:?} with answers");
    }
}

fuzz_target!(|data: &[u8]| {
    // The refused name's length and distinctness are read from it.
    if let Some(name) = question_name(data) {
        assert!(name.len() <= 255 * 4, "{}", name.len());
    }
    let listed = |n: &talos_gateway::gate::name::Name| n.as_str().ends_with("example.com");
    let approvals: [IpAddr; 2] = ["192.0.2.53".parse().unwrap(), "2001:db8::53".parse().unwrap()];
    let addrs: [IpAddr; 3] = [
        "93.184.216.34".parse().unwrap(),
        "2606:2800:220:1::1".parse().unwrap(),
        "93.184.216.35".parse().unwrap(),
    ];
    for scope in [Scope::Unknown, Scope::Elsewhere, Scope::Session(&listed)] {
        match step(data, scope, &approvals, 30) {
            Step::Drop => {}
            Step::Reply(bytes, outcome) => check(data, &bytes, outcome),
            Step::Resolve(p) => {
                assert!(p.name.as_str().ends_with("example.com"));
                let resolved = match data.len() % 3 {
                    0 => Resolved::Addresses(&addrs),
                    1 => Resolved::Internal,
                    _ => Resolved::Failed,
                };
                let (bytes, outcome) = p.answer(resolved, 30);
                check(data, &bytes, outcome);
            }
        }
    }
});
