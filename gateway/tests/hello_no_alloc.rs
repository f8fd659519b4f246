//! The hello parser allocates nothing: not for a hello in one record, not
//! for one put back together from many, not for a prefix.
//!
//! `allocation-counter` replaces the global allocator in this test binary
//! only and counts the allocations made on the measuring thread.

use std::path::Path;

use talos_gateway::gate::hello::{parse, HelloLimits, Parse};

const HELLOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/hellos");

fn captures() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(HELLOS)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(Path::new(&p)).unwrap())
        })
        .collect();
    out.sort();
    assert!(out.len() >= 10, "captures missing from {HELLOS}");
    out
}

/// The same hello re-split into records of `size` bytes.
fn refragment(capture: &[u8], size: usize) -> Vec<u8> {
    let mut msg = Vec::new();
    let mut rest = capture;
    while rest.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        msg.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
    let mut out = Vec::new();
    for frag in msg.chunks(size) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(frag.len() as u16).to_be_bytes());
        out.extend_from_slice(frag);
    }
    out
}

#[test]
fn hello_parse_allocates_nothing() {
    // The counter does count on this thread.
    let probe = allocation_counter::measure(|| drop(std::hint::black_box(vec![1u8; 8])));
    assert_eq!(probe.count_total, 1);

    let limits = HelloLimits::default();
    let mut scratch = limits.scratch();
    for (name, bytes) in captures() {
        for input in [
            bytes.clone(),
            refragment(&bytes, 100),
            refragment(&bytes, 1),
        ] {
            let mut verdicts = 0;
            let info = allocation_counter::measure(|| {
                // Every prefix, as the data path sees it after each read,
                // then the whole, read out as the data path would.
                for end in 0..input.len() {
                    if parse(&input[..end], &mut scratch, &limits) != Parse::Incomplete {
                        verdicts += 1;
                    }
                }
                let parsed = parse(&input, &mut scratch, &limits);
                if let Some(hello) = parsed.hello() {
                    verdicts += usize::from(hello.server_name().is_some());
                    verdicts += hello.alpn().count() + hello.supported_versions().count();
                }
            });
            assert_eq!(
                info.count_total, 0,
                "{name}: {} allocations",
                info.count_total
            );
            assert!(verdicts > 0, "{name}: nothing was read");
        }
    }
}
