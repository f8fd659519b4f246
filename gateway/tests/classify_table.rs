//! The address classifier and its text parser, table-driven.
//!
//! The long lists live in `testdata/addresses/*.txt`, one `ADDRESS EXPECTED`
//! line each, so a reviewer can add a form without touching Rust. The cases
//! that need whitespace inside the text, and the properties, are here.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use talos_gateway::gate::classify::{classify, parse_address, Class, Internal};

/// What a row expects: `public`, `internal <class>` or `invalid`.
fn verdict(text: &str) -> String {
    match parse_address(text) {
        Ok(ip) => classify(ip).label().to_owned(),
        Err(_) => "invalid".to_owned(),
    }
}

fn address_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/addresses");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    files.sort();
    files
}

/// Every line of every list, with every failure reported at once.
#[test]
fn address_lists() {
    let files = address_files();
    assert!(files.len() >= 5, "address lists missing: {files:?}");
    let mut failures = Vec::new();
    let mut rows = 0;
    let mut verdicts_seen = BTreeSet::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap().trim();
            if line.is_empty() {
                continue;
            }
            let (address, expected) = line
                .split_once(char::is_whitespace)
                .unwrap_or_else(|| panic!("{name}:{}: no expected verdict", n + 1));
            let expected = expected.trim();
            let got = verdict(address);
            if got != expected {
                failures.push(format!(
                    "{name}:{}: {address}: expected {expected}, got {got}",
                    n + 1
                ));
            }
            verdicts_seen.insert(expected.to_owned());
            rows += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {rows} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The lists cover every class, public, and refusals.
    for class in Internal::ALL {
        let label = Class::Internal(class).label();
        assert!(verdicts_seen.contains(label), "no row expects {label}");
    }
    assert!(verdicts_seen.contains("public"));
    assert!(verdicts_seen.contains("invalid"));
    assert!(rows > 400, "only {rows} rows");
}

/// `text => expected` rows that a whitespace-separated list cannot hold.
macro_rules! table {
    ($($text:expr => $expected:expr),* $(,)?) => {{
        let mut failures = Vec::new();
        $(
            let got = verdict($text);
            if got != $expected {
                failures.push(format!("{:?}: expected {}, got {got}", $text, $expected));
            }
        )*
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }};
}

#[test]
fn surrounding_whitespace_is_trimmed() {
    table! {
        " 127.0.0.1" => "internal loopback",
        "127.0.0.1 " => "internal loopback",
        "\t10.0.0.1\n" => "internal private",
        "\r\n::1\r\n" => "internal loopback",
        "  [::ffff:169.254.169.254]  " => "internal cloud_metadata",
        " fe80::1%eth0 " => "internal link_local",
        "\u{a0}8.8.8.8\u{2003}" => "public",
        " 0x7f.1 " => "internal loopback",
    }
}

#[test]
fn whitespace_inside_is_refused() {
    table! {
        "" => "invalid",
        "   " => "invalid",
        "127.0.0.1 garbage" => "invalid",
        "127 .0.0.1" => "invalid",
        "127.0.0. 1" => "invalid",
        ":: 1" => "invalid",
        "[ ::1 ]" => "invalid",
        "fe80::1%eth 0" => "invalid",
        "fe80::1 %eth0" => "invalid",
        "127.0.0.1\0" => "invalid",
        "\u{0}1.2.3.4" => "invalid",
    }
}

#[test]
fn errors_name_the_offending_text() {
    let cases = [
        (
            "300.1.1.1",
            r#""300.1.1.1" is not an IP address: part "300" is over 255"#,
        ),
        ("", r#""" is not an IP address: it is empty"#),
        (
            "08.0.0.1",
            r#""08.0.0.1" is not an IP address: part "08" is not an octal number"#,
        ),
        (
            "4294967296",
            r#""4294967296" is not an IP address: part "4294967296" does not fit in 32 bits"#,
        ),
        (
            "1.2.3.4.5",
            r#""1.2.3.4.5" is not an IP address: it has more than four parts"#,
        ),
        (
            "1..2",
            r#""1..2" is not an IP address: it has an empty part"#,
        ),
        (
            "0x",
            r#""0x" is not an IP address: part "0x" has no digits after its prefix"#,
        ),
        (
            "::1::",
            r#""::1::" is not an IP address: it is not a valid IPv6 address"#,
        ),
        (
            "[::1",
            r#""[::1" is not an IP address: the '[' is not closed by a final ']'"#,
        ),
        (
            "fe80::1%",
            r#""fe80::1%" is not an IP address: the zone id after '%' is empty"#,
        ),
        (
            "a\u{7}b",
            r#""a\u{7}b" is not an IP address: part "a\u{7}b" is not a decimal number"#,
        ),
    ];
    let mut failures = Vec::new();
    for (text, message) in cases {
        match parse_address(text) {
            Ok(ip) => failures.push(format!("{text:?} parsed as {ip}")),
            Err(e) => {
                assert_eq!(e.text(), text);
                if e.to_string() != message {
                    failures.push(format!("{text:?}: got {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn zone_is_dropped() {
    let plain = parse_address("fe80::1").unwrap();
    for text in [
        "fe80::1%eth0",
        "fe80::1%25eth0",
        "[fe80::1%lo]",
        "fe80::1%3",
        "fe80::1%en0.100",
    ] {
        assert_eq!(parse_address(text).unwrap(), plain, "{text}");
    }
}

#[test]
fn class_api() {
    let loopback = classify(IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(loopback, Class::Internal(Internal::Loopback));
    assert!(loopback.is_internal());
    assert_eq!(loopback.internal(), Some(Internal::Loopback));
    assert_eq!(loopback.label(), "internal loopback");
    assert_eq!(loopback.to_string(), "internal loopback");
    let public = classify(IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)));
    assert_eq!(public, Class::Public);
    assert!(!public.is_internal());
    assert_eq!(public.internal(), None);
    assert_eq!(public.to_string(), "public");
    assert_eq!(Internal::CloudMetadata.as_str(), "cloud_metadata");
    assert_eq!(Internal::Nat64Local.to_string(), "nat64_local");
}

/// A mixed list, the same shape as the benchmark's.
fn mixed_addresses() -> Vec<IpAddr> {
    [
        "8.8.8.8",
        "10.0.0.1",
        "169.254.169.254",
        "192.0.2.1",
        "255.255.255.255",
        "2606:4700:4700::1111",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
        "2002:808:808::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "fd00:ec2::254",
        "ff02::1",
        "4000::1",
    ]
    .iter()
    .map(|t| parse_address(t).unwrap())
    .collect()
}

#[test]
fn classify_does_not_allocate() {
    let addresses = mixed_addresses();
    let info = allocation_counter::measure(|| {
        for ip in &addresses {
            std::hint::black_box(classify(std::hint::black_box(*ip)));
        }
    });
    assert_eq!(info.count_total, 0, "classify allocated: {info:?}");
}

fn mapped(v: Ipv4Addr) -> Ipv6Addr {
    v.to_ipv6_mapped()
}

fn translated(v: Ipv4Addr) -> Ipv6Addr {
    let [a, b] = halves(v);
    Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, a, b)
}

fn compatible(v: Ipv4Addr) -> Ipv6Addr {
    let [a, b] = halves(v);
    Ipv6Addr::new(0, 0, 0, 0, 0, 0, a, b)
}

fn nat64(v: Ipv4Addr) -> Ipv6Addr {
    let [a, b] = halves(v);
    Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, a, b)
}

fn six_to_four(v: Ipv4Addr, rest: [u16; 5]) -> Ipv6Addr {
    let [a, b] = halves(v);
    let [c, d, e, f, g] = rest;
    Ipv6Addr::new(0x2002, a, b, c, d, e, f, g)
}

fn teredo(server: Ipv4Addr, client: Ipv4Addr, flags: u16, port: u16) -> Ipv6Addr {
    let [s0, s1] = halves(server);
    let [c0, c1] = halves(client);
    Ipv6Addr::new(0x2001, 0, s0, s1, flags, port, !c0, !c1)
}

fn halves(v: Ipv4Addr) -> [u16; 2] {
    let n = u32::from(v);
    [(n >> 16) as u16, n as u16]
}

fn c4(v: Ipv4Addr) -> Class {
    classify(IpAddr::V4(v))
}

fn c6(v: Ipv6Addr) -> Class {
    classify(IpAddr::V6(v))
}

/// Blocks inside 2000::/3 that are not plain global unicast.
const SPECIAL_IN_GLOBAL: [(u128, u8); 4] = [
    (0x2001_0000 << 96, 23),
    (0x2001_0db8 << 96, 32),
    (0x2002 << 112, 16),
    (0x3fff << 112, 20),
];

fn inside(addr: u128, (net, len): (u128, u8)) -> bool {
    len == 0 || (addr ^ net) >> (128 - u32::from(len)) == 0
}

/// Any u32 written the way `inet_aton` reads it: `parts` parts, each in
/// the radix `radices` picks.
fn inet_aton_text(v: u32, parts: usize, radices: [u8; 4]) -> String {
    let bytes = v.to_be_bytes();
    let mut values: Vec<u32> = bytes[..parts - 1].iter().map(|&b| u32::from(b)).collect();
    let shift = 8 * (parts - 1);
    let last = if shift == 0 {
        v
    } else {
        v & (u32::MAX >> shift)
    };
    values.push(last);
    values
        .iter()
        .zip(radices)
        .map(|(&n, radix)| match radix % 3 {
            0 => format!("{n}"),
            1 => format!("0{n:o}"),
            _ => format!("0x{n:x}"),
        })
        .collect::<Vec<_>>()
        .join(".")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Every IPv4-embedding form has exactly the embedded address's class.
    #[test]
    fn embedded_forms_agree_with_ipv4(v in any::<Ipv4Addr>(), rest in any::<[u16; 5]>()) {
        let class = c4(v);
        prop_assert_eq!(c6(mapped(v)), class);
        prop_assert_eq!(c6(translated(v)), class);
        prop_assert_eq!(c6(nat64(v)), class);
        prop_assert_eq!(c6(six_to_four(v, rest)), class);
        // :: and ::1 keep their own class; internal-ness still agrees.
        if u32::from(v) > 1 {
            prop_assert_eq!(c6(compatible(v)), class);
        } else {
            prop_assert!(c6(compatible(v)).is_internal() && class.is_internal());
        }
    }

    /// Teredo is internal if server or client is, and public only if both are.
    #[test]
    fn teredo_is_internal_if_either_end_is(
        server in any::<Ipv4Addr>(),
        client in any::<Ipv4Addr>(),
        flags in any::<u16>(),
        port in any::<u16>(),
    ) {
        let got = c6(teredo(server, client, flags, port));
        let (s, c) = (c4(server), c4(client));
        let want = if s.is_internal() { s } else { c };
        prop_assert_eq!(got, want);
    }

    /// Local-use NAT64 is internal whatever it embeds.
    #[test]
    fn nat64_local_is_always_internal(rest in any::<u128>()) {
        let addr = (0x0064_ff9b_0001_u128 << 80) | (rest & ((1 << 80) - 1));
        prop_assert_eq!(c6(Ipv6Addr::from(addr)), Class::Internal(Internal::Nat64Local));
    }

    /// Global unicast outside the special blocks is public.
    #[test]
    fn global_unicast_is_public(bits in any::<u128>()) {
        let addr = (bits >> 3) | (1 << 125); // 001x...: inside 2000::/3
        prop_assume!(!SPECIAL_IN_GLOBAL.iter().any(|&block| inside(addr, block)));
        prop_assert_eq!(c6(Ipv6Addr::from(addr)), Class::Public);
    }

    /// Outside 2000::/3 everything is internal, except the IPv4-embedding
    /// forms, which carry their IPv4 address's verdict.
    #[test]
    fn outside_global_unicast_is_internal(bits in any::<u128>(), top in 0u128..8) {
        prop_assume!(top != 1);
        let addr = (bits >> 3) | (top << 125);
        let ip = Ipv6Addr::from(addr);
        let low = Ipv4Addr::from(addr as u32);
        let embeds = [
            (0xffff_u128 << 32, 96),           // ::ffff:0:0/96
            (0xffff_u128 << 48, 96),           // ::ffff:0:0:0/96
            (0, 96),                           // ::/96
            (0x0064_ff9b_u128 << 96, 96),      // 64:ff9b::/96
        ];
        if embeds.iter().any(|&block| inside(addr, block)) {
            prop_assert_eq!(c6(ip).is_internal(), c4(low).is_internal() || addr <= 1);
        } else {
            prop_assert!(c6(ip).is_internal(), "{} is public", ip);
        }
    }

    /// Loopback and private ranges are internal, plain or embedded.
    #[test]
    fn loopback_and_private_are_internal(host in any::<u32>(), which in 0usize..4) {
        let (base, len, class) = [
            (0x7f00_0000_u32, 8, Internal::Loopback),
            (0x0a00_0000, 8, Internal::Private),
            (0xac10_0000, 12, Internal::Private),
            (0xc0a8_0000, 16, Internal::Private),
        ][which];
        let v = Ipv4Addr::from(base | (host >> len));
        prop_assert_eq!(c4(v), Class::Internal(class));
        prop_assert_eq!(c6(mapped(v)), Class::Internal(class));
        prop_assert_eq!(c6(nat64(v)), Class::Internal(class));
        prop_assert_eq!(c6(six_to_four(v, [0; 5])), Class::Internal(class));
        prop_assert_eq!(c6(teredo(Ipv4Addr::new(8, 8, 8, 8), v, 0, 0)), Class::Internal(class));
    }

    /// IPv6 unique-local and link-local are internal.
    #[test]
    fn ipv6_local_ranges_are_internal(host in any::<u128>()) {
        let ula = Ipv6Addr::from((0xfc_u128 << 120) | (host >> 7));
        prop_assert!(c6(ula).is_internal());
        let link = Ipv6Addr::from((0xfe80_u128 << 112) | (host >> 10));
        prop_assert_eq!(c6(link), Class::Internal(Internal::LinkLocal));
    }

    /// std's rendering of any address parses back to it.
    #[test]
    fn display_round_trips(v4 in any::<Ipv4Addr>(), v6 in any::<Ipv6Addr>()) {
        prop_assert_eq!(parse_address(&v4.to_string()), Ok(IpAddr::V4(v4)));
        prop_assert_eq!(parse_address(&v6.to_string()), Ok(IpAddr::V6(v6)));
        prop_assert_eq!(parse_address(&format!("[{v6}]")), Ok(IpAddr::V6(v6)));
        prop_assert_eq!(parse_address(&format!(" {v6}%eth0 ")), Ok(IpAddr::V6(v6)));
    }

    /// Every `inet_aton` rendering of an address parses back to it.
    #[test]
    fn inet_aton_forms_round_trip(v in any::<u32>(), parts in 1usize..=4, radices in any::<[u8; 4]>()) {
        let text = inet_aton_text(v, parts, radices);
        prop_assert_eq!(parse_address(&text), Ok(IpAddr::V4(Ipv4Addr::from(v))), "{}", text);
    }

    /// Arbitrary text never panics; a refusal always names the text.
    #[test]
    fn arbitrary_text_is_parsed_or_named(text in r"[0-9a-fA-FxX.:%\[\] \t]{0,48}|\PC{0,24}") {
        match parse_address(&text) {
            Ok(ip) => { classify(ip); }
            Err(e) => {
                prop_assert_eq!(e.text(), text.as_str());
                let quoted = format!("{text:?}");
                prop_assert!(e.to_string().starts_with(&quoted));
            }
        }
    }
}
