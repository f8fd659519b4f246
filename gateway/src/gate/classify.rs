//! Which addresses are internal, and of which class.
//!
//! Every answer the gateway's resolver returns goes through [`classify`]
//! before the gateway connects anywhere; one internal answer refuses the
//! name `resolves_internal`. [`parse_address`] reads the textual forms an
//! operator or a reviewer types at `gateway classify ADDRESS...`; the data
//! path never parses text.
//!
//! # Rule
//!
//! An address is **public** only if it may be reached beyond the network the
//! gateway runs in. Everything else is **internal**, with a class that says
//! why ([`Internal::as_str`] gives the stable word used in records, metric
//! labels and the CLI).
//!
//! - Every block of the IANA IPv4 and IPv6 Special-Purpose Address
//!   Registries whose "Globally Reachable" is False is internal.
//! - IPv6 is public only inside `2000::/3` (global unicast) and outside every
//!   special block; everything outside `2000::/3` that no row names is
//!   `reserved`. The only ways out of that rule are the IPv4-embedding forms
//!   below, whose verdict is the embedded IPv4 address's.
//! - Well-known cloud metadata and credential endpoints get their own class,
//!   `cloud_metadata`, more specific than the block around them, so an
//!   operator reading a refusal sees at once what was attempted.
//!
//! # Sources
//!
//! - IANA IPv4 Special-Purpose Address Registry (RFC 6890, RFC 8190),
//!   <https://www.iana.org/assignments/iana-ipv4-special-registry/>.
//! - IANA IPv6 Special-Purpose Address Registry, as updated on 2025-10-09
//!   (adds `100:0:0:1::/64`, RFC 9780),
//!   <https://www.iana.org/assignments/iana-ipv6-special-registry/>.
//! - IANA IPv6 Address Space (`2000::/3` is the only block handed out as
//!   global unicast; multicast `ff00::/8`; deprecated site-local `fec0::/10`).
//! - IANA IPv4 Address Space (multicast `224.0.0.0/4`, reserved
//!   `240.0.0.0/4`).
//! - Cloud provider documentation for the metadata endpoints.
//!
//! # The table
//!
//! The two row lists in this file (`V4_ROWS`, `V6_ROWS`) are the whole
//! policy, written as text and parsed at compile time (a malformed row fails
//! the build). Rows are ordered most specific first and the first row that
//! contains the address decides; a unit test checks that no row is shadowed
//! by an earlier one, so first match is longest-prefix match.
//!
//! IPv4:
//!
//! | block | verdict | registry name / reason |
//! |---|---|---|
//! | `0.0.0.0/32` | `unspecified` | "This host on this network" (RFC 1122) |
//! | `255.255.255.255/32` | `broadcast` | Limited Broadcast (RFC 8190, RFC 919) |
//! | `169.254.169.254/32` | `cloud_metadata` | instance metadata: AWS, Azure, GCP, Oracle, DigitalOcean, … |
//! | `169.254.170.2/32` | `cloud_metadata` | AWS ECS task metadata and credentials |
//! | `169.254.170.23/32` | `cloud_metadata` | AWS EKS Pod Identity credentials |
//! | `100.100.100.200/32` | `cloud_metadata` | Alibaba Cloud instance metadata (inside CGNAT space) |
//! | `168.63.129.16/32` | `cloud_metadata` | Azure WireServer / host endpoint (public space, answered by the host) |
//! | `192.0.0.0/24` | `ietf_protocol_assignments` | IETF Protocol Assignments (RFC 6890), **including** `.9` and `.10`, see decisions |
//! | `192.0.2.0/24` | `documentation` | TEST-NET-1 (RFC 5737) |
//! | `192.31.196.0/24` | public | AS112-v4 (RFC 7535), Globally Reachable True |
//! | `192.52.193.0/24` | public | AMT (RFC 7450), Globally Reachable True |
//! | `192.88.99.0/24` | `reserved` | Deprecated 6to4 Relay Anycast (RFC 7526), incl. 6a44 relay `192.88.99.2` |
//! | `192.175.48.0/24` | public | Direct Delegation AS112 Service (RFC 7534), Globally Reachable True |
//! | `198.51.100.0/24` | `documentation` | TEST-NET-2 (RFC 5737) |
//! | `203.0.113.0/24` | `documentation` | TEST-NET-3 (RFC 5737) |
//! | `169.254.0.0/16` | `link_local` | Link Local (RFC 3927) |
//! | `192.168.0.0/16` | `private` | Private-Use (RFC 1918) |
//! | `198.18.0.0/15` | `benchmarking` | Benchmarking (RFC 2544) |
//! | `172.16.0.0/12` | `private` | Private-Use (RFC 1918) |
//! | `100.64.0.0/10` | `cgnat` | Shared Address Space (RFC 6598) |
//! | `0.0.0.0/8` | `this_network` | "This network" (RFC 791, RFC 1122) |
//! | `10.0.0.0/8` | `private` | Private-Use (RFC 1918) |
//! | `127.0.0.0/8` | `loopback` | Loopback (RFC 1122) |
//! | `224.0.0.0/4` | `multicast` | Multicast (RFC 5771) |
//! | `240.0.0.0/4` | `reserved` | Reserved (RFC 1112) |
//! | `0.0.0.0/0` | public | everything else |
//!
//! IPv6:
//!
//! | block | verdict | registry name / reason |
//! |---|---|---|
//! | `::/128` | `unspecified` | Unspecified Address (RFC 4291) |
//! | `::1/128` | `loopback` | Loopback Address (RFC 4291) |
//! | `fd00:ec2::254/128` | `cloud_metadata` | AWS instance metadata over IPv6 (inside ULA) |
//! | `fd00:ec2::23/128` | `cloud_metadata` | AWS EKS Pod Identity credentials over IPv6 |
//! | `2001:1::1/128` | `ietf_protocol_assignments` | PCP Anycast (RFC 7723), registry True, see decisions |
//! | `2001:1::2/128` | `ietf_protocol_assignments` | TURN Anycast (RFC 8155), registry True, see decisions |
//! | `2001:1::3/128` | `ietf_protocol_assignments` | DNS-SD SRP Anycast (RFC 9665), registry True, see decisions |
//! | `::ffff:0:0/96` | embedded IPv4 | IPv4-mapped (RFC 4291) |
//! | `::ffff:0:0:0/96` | embedded IPv4 | IPv4-translated (RFC 2765; not in the registry) |
//! | `::/96` | embedded IPv4 | IPv4-compatible, deprecated (RFC 4291); `::` and `::1` are caught above |
//! | `64:ff9b::/96` | embedded IPv4 | NAT64 well-known prefix (RFC 6052), registry True |
//! | `100::/64` | `reserved` | Discard-Only (RFC 6666) |
//! | `100:0:0:1::/64` | `reserved` | Dummy IPv6 Prefix (RFC 9780) |
//! | `64:ff9b:1::/48` | `nat64_local` | Local-use IPv4/IPv6 translation (RFC 8215) |
//! | `2001:2::/48` | `benchmarking` | Benchmarking (RFC 5180 with errata 1752) |
//! | `2001:4:112::/48` | public | AS112-v6 (RFC 7535), Globally Reachable True |
//! | `2620:4f:8000::/48` | public | Direct Delegation AS112 Service (RFC 7534), Globally Reachable True |
//! | `2001::/32` | embedded IPv4 (both) | Teredo (RFC 4380), Globally Reachable N/A |
//! | `2001:3::/32` | public | AMT (RFC 7450), Globally Reachable True |
//! | `2001:db8::/32` | `documentation` | Documentation (RFC 3849) |
//! | `2001:10::/28` | `reserved` | Deprecated, previously ORCHID (RFC 4843) |
//! | `2001:20::/28` | public | ORCHIDv2 (RFC 7343), Globally Reachable True |
//! | `2001:30::/28` | public | Drone Remote ID Protocol Entity Tags (RFC 9374), Globally Reachable True |
//! | `2001::/23` | `ietf_protocol_assignments` | IETF Protocol Assignments (RFC 2928), the rest of it |
//! | `3fff::/20` | `documentation` | Documentation (RFC 9637) |
//! | `2002::/16` | embedded IPv4 | 6to4 (RFC 3056), Globally Reachable N/A |
//! | `5f00::/16` | `reserved` | Segment Routing (SRv6) SIDs (RFC 9602) |
//! | `fe80::/10` | `link_local` | Link-Local Unicast (RFC 4291) |
//! | `fec0::/10` | `site_local` | Site-local, deprecated (RFC 3879) |
//! | `ff00::/8` | `multicast` | Multicast (RFC 4291) |
//! | `fc00::/7` | `unique_local` | Unique-Local (RFC 4193) |
//! | `2000::/3` | public | Global Unicast |
//! | `::/0` | `reserved` | everything outside `2000::/3` that no row names |
//!
//! # Embedded IPv4 addresses
//!
//! Several IPv6 forms carry an IPv4 address. The embedded address is
//! classified with the IPv4 table: if it is internal, the IPv6 address is
//! internal with the embedded address's class (`::ffff:169.254.169.254` is
//! `cloud_metadata`, not `reserved`); if it is public, so is the IPv6
//! address.
//!
//! - IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`,
//!   IPv4-compatible `::a.b.c.d` and NAT64 `64:ff9b::a.b.c.d`: the last 32
//!   bits.
//! - 6to4 `2002:AABB:CCDD::/48`: bits 16..48.
//! - Teredo `2001:0:SSSS:SSSS:flags:port:CCCC:CCCC`: the server in bits
//!   32..64 and the client in the last 32 bits, inverted. Internal if either
//!   is; the server's class is reported when both are.
//!
//! # Decisions
//!
//! - **`192.0.0.9`, `192.0.0.10`, `2001:1::1`, `2001:1::2`, `2001:1::3` are
//!   internal** although the registry marks them globally reachable. They are
//!   anycast addresses for PCP servers, TURN relays and SRP registrars:
//!   whichever instance is nearest answers, and in practice that is a device
//!   of the network the gateway runs in (its router or carrier NAT), not a
//!   destination on the internet. No HTTPS name has a reason to resolve
//!   there. They are reported as `ietf_protocol_assignments`, the block
//!   they sit in.
//! - **AS112 (`192.31.196.0/24`, `192.175.48.0/24`, `2001:4:112::/48`,
//!   `2620:4f:8000::/48`), AMT (`192.52.193.0/24`, `2001:3::/32`), ORCHIDv2
//!   (`2001:20::/28`) and DETs (`2001:30::/28`) are public**, as the registry
//!   says. They are listed as explicit public rows so that a reviewer sees
//!   the choice was made, not missed.
//! - **`64:ff9b:1::/48` is `nat64_local` regardless of what it embeds.**
//!   RFC 8215 makes it a prefix for translators the local network runs
//!   itself, with none of RFC 6052's rule against embedding non-global IPv4
//!   addresses, and with a prefix length (/48 to /96) this gateway cannot
//!   know, so the IPv4 address cannot be located reliably. Whatever it
//!   reaches is reached through local infrastructure: internal.
//! - **The well-known NAT64 prefix `64:ff9b::/96`, 6to4 and Teredo follow
//!   their embedded address.** They are how IPv6-only networks reach the
//!   IPv4 internet, so a public embedded address stays public.
//! - **Deprecated forms (`::/96`, `::ffff:0:0:0/96`) still follow their
//!   embedded address**, so that no form smuggles an internal IPv4 address
//!   past the check; with a public embedded address they are public, as
//!   the same IPv4 destination would be.
//! - **Cloud metadata endpoints** are the ones whose answers hold
//!   credentials or instance secrets: `169.254.169.254` and
//!   `fd00:ec2::254` (AWS, and the IPv4 one for Azure, GCP, Oracle and
//!   others), AWS's container and pod credential endpoints
//!   (`169.254.170.2`, `169.254.170.23`, `fd00:ec2::23`), Alibaba Cloud's
//!   `100.100.100.200` and Azure's host endpoint `168.63.129.16`. The last
//!   one sits in public space but is only ever answered by the Azure host a
//!   machine runs on; nothing on the internet is reached there.
//! - **`2001::/23` leftovers are `ietf_protocol_assignments`**, the
//!   registry's name for the block, like `192.0.0.0/24`.
//! - **`::/0` fallback is `reserved`**: IPv6 space outside `2000::/3` that
//!   the IANA IPv6 Address Space does not hand out (for example `4000::/3`,
//!   `fe00::/9`, `200::/7`).
//!
//! # Limits
//!
//! [`classify`] is pure: no allocation, no I/O, no lock. It scans one
//! fixed table of a few dozen rows, plus at most two IPv4 lookups for
//! embedded forms (Teredo has two ends).
//! Prefixes that embed IPv4 addresses but cannot be recognised from the
//! address alone (network-specific NAT64 prefixes, 6rd, ISATAP interface
//! identifiers) are classified by their IPv6 prefix only.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// Where an address may be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Reachable beyond the gateway's own network: a destination.
    Public,
    /// Inside some network, or not a destination at all.
    Internal(Internal),
}

impl Class {
    /// True for every class but [`Class::Public`].
    pub const fn is_internal(self) -> bool {
        matches!(self, Class::Internal(_))
    }

    /// The internal class, if any.
    pub const fn internal(self) -> Option<Internal> {
        match self {
            Class::Public => None,
            Class::Internal(class) => Some(class),
        }
    }

    /// `"public"` or `"internal <class>"`, as the CLI prints it.
    pub const fn label(self) -> &'static str {
        match self {
            Class::Public => "public",
            Class::Internal(class) => class.label(),
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why an address is internal. Each class has one stable name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Internal {
    /// `0.0.0.0`, `::`: no address at all.
    Unspecified,
    /// `0.0.0.0/8`: this host on this network.
    ThisNetwork,
    /// `127.0.0.0/8`, `::1`: the gateway itself.
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16` (RFC 1918).
    Private,
    /// `100.64.0.0/10`: shared address space behind carrier-grade NAT.
    Cgnat,
    /// `169.254.0.0/16`, `fe80::/10`: the local link.
    LinkLocal,
    /// Instance metadata and credential endpoints (`169.254.169.254`,
    /// `fd00:ec2::254`, …): the most specific class wins over link-local
    /// and unique-local.
    CloudMetadata,
    /// `192.0.0.0/24`, `2001::/23`: IETF protocol assignments.
    IetfProtocolAssignments,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`,
    /// `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// Reserved, deprecated or unallocated space.
    Reserved,
    /// `255.255.255.255`.
    Broadcast,
    /// `fc00::/7` (RFC 4193).
    UniqueLocal,
    /// `fec0::/10`, deprecated site-local.
    SiteLocal,
    /// `64:ff9b:1::/48`, local-use NAT64 (RFC 8215).
    Nat64Local,
}

impl Internal {
    /// Every class, in declaration order.
    pub const ALL: [Internal; 16] = [
        Internal::Unspecified,
        Internal::ThisNetwork,
        Internal::Loopback,
        Internal::Private,
        Internal::Cgnat,
        Internal::LinkLocal,
        Internal::CloudMetadata,
        Internal::IetfProtocolAssignments,
        Internal::Documentation,
        Internal::Benchmarking,
        Internal::Multicast,
        Internal::Reserved,
        Internal::Broadcast,
        Internal::UniqueLocal,
        Internal::SiteLocal,
        Internal::Nat64Local,
    ];

    /// The stable name: never change one, only add.
    pub const fn as_str(self) -> &'static str {
        match self {
            Internal::Unspecified => "unspecified",
            Internal::ThisNetwork => "this_network",
            Internal::Loopback => "loopback",
            Internal::Private => "private",
            Internal::Cgnat => "cgnat",
            Internal::LinkLocal => "link_local",
            Internal::CloudMetadata => "cloud_metadata",
            Internal::IetfProtocolAssignments => "ietf_protocol_assignments",
            Internal::Documentation => "documentation",
            Internal::Benchmarking => "benchmarking",
            Internal::Multicast => "multicast",
            Internal::Reserved => "reserved",
            Internal::Broadcast => "broadcast",
            Internal::UniqueLocal => "unique_local",
            Internal::SiteLocal => "site_local",
            Internal::Nat64Local => "nat64_local",
        }
    }

    /// `"internal <class>"`, spelled out so that it needs no allocation.
    const fn label(self) -> &'static str {
        match self {
            Internal::Unspecified => "internal unspecified",
            Internal::ThisNetwork => "internal this_network",
            Internal::Loopback => "internal loopback",
            Internal::Private => "internal private",
            Internal::Cgnat => "internal cgnat",
            Internal::LinkLocal => "internal link_local",
            Internal::CloudMetadata => "internal cloud_metadata",
            Internal::IetfProtocolAssignments => "internal ietf_protocol_assignments",
            Internal::Documentation => "internal documentation",
            Internal::Benchmarking => "internal benchmarking",
            Internal::Multicast => "internal multicast",
            Internal::Reserved => "internal reserved",
            Internal::Broadcast => "internal broadcast",
            Internal::UniqueLocal => "internal unique_local",
            Internal::SiteLocal => "internal site_local",
            Internal::Nat64Local => "internal nat64_local",
        }
    }

    /// The cause recorded with `resolves_internal`: `"internal:<class>"`,
    /// spelled out so that it needs no allocation.
    pub const fn cause(self) -> &'static str {
        match self {
            Internal::Unspecified => "internal:unspecified",
            Internal::ThisNetwork => "internal:this_network",
            Internal::Loopback => "internal:loopback",
            Internal::Private => "internal:private",
            Internal::Cgnat => "internal:cgnat",
            Internal::LinkLocal => "internal:link_local",
            Internal::CloudMetadata => "internal:cloud_metadata",
            Internal::IetfProtocolAssignments => "internal:ietf_protocol_assignments",
            Internal::Documentation => "internal:documentation",
            Internal::Benchmarking => "internal:benchmarking",
            Internal::Multicast => "internal:multicast",
            Internal::Reserved => "internal:reserved",
            Internal::Broadcast => "internal:broadcast",
            Internal::UniqueLocal => "internal:unique_local",
            Internal::SiteLocal => "internal:site_local",
            Internal::Nat64Local => "internal:nat64_local",
        }
    }
}

impl fmt::Display for Internal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classify one address. Pure, allocation-free; runs on every DNS answer.
pub fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    let bits = ip.to_bits();
    for row in &V4_TABLE {
        if bits & row.mask == row.network {
            return row.class;
        }
    }
    // The table ends with 0.0.0.0/0, so this is never reached; if it were,
    // failing closed is the safe answer.
    Class::Internal(Internal::Reserved)
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let bits = ip.to_bits();
    for row in &V6_TABLE {
        if bits & row.mask == row.network {
            return match row.rule {
                V6Rule::Is(class) => class,
                V6Rule::Low32 => classify_v4(low32(ip)),
                V6Rule::SixToFour => {
                    let s = ip.segments();
                    classify_v4(v4_of(s[1], s[2]))
                }
                V6Rule::Teredo => {
                    let s = ip.segments();
                    let server = classify_v4(v4_of(s[2], s[3]));
                    if server.is_internal() {
                        return server;
                    }
                    classify_v4(v4_of(!s[6], !s[7]))
                }
            };
        }
    }
    // The table ends with ::/0, so this is never reached; if it were,
    // failing closed is the safe answer.
    Class::Internal(Internal::Reserved)
}

fn low32(ip: Ipv6Addr) -> Ipv4Addr {
    let s = ip.segments();
    v4_of(s[6], s[7])
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from(((hi as u32) << 16) | lo as u32)
}

/// What an IPv6 row says about the addresses it contains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum V6Rule {
    /// This verdict, whatever the rest of the address.
    Is(Class),
    /// The last 32 bits are an IPv4 address: its verdict.
    Low32,
    /// 6to4: bits 16..48 are an IPv4 address: its verdict.
    SixToFour,
    /// Teredo: server in bits 32..64, client inverted in the last 32 bits;
    /// internal if either is.
    Teredo,
}

const PUBLIC: Class = Class::Public;

const fn int(class: Internal) -> Class {
    Class::Internal(class)
}

/// The IPv4 policy. Most specific first; the first row that contains the
/// address decides. See the module docs for the sources of each row.
// invariant: no row contains a later row (checked by `no_row_is_shadowed`),
// so first match is longest-prefix match.
#[rustfmt::skip]
const V4_ROWS: &[(&str, Class)] = {
    use Internal::*;
    &[
        ("0.0.0.0/32",         int(Unspecified)),
        ("255.255.255.255/32", int(Broadcast)),
        ("169.254.169.254/32", int(CloudMetadata)),   // AWS, Azure, GCP, Oracle, ...
        ("169.254.170.2/32",   int(CloudMetadata)),   // AWS ECS task credentials
        ("169.254.170.23/32",  int(CloudMetadata)),   // AWS EKS Pod Identity
        ("100.100.100.200/32", int(CloudMetadata)),   // Alibaba Cloud
        ("168.63.129.16/32",   int(CloudMetadata)),   // Azure host endpoint
        ("192.0.0.0/24",       int(IetfProtocolAssignments)), // incl. .9 and .10
        ("192.0.2.0/24",       int(Documentation)),
        ("192.31.196.0/24",    PUBLIC),               // AS112-v4
        ("192.52.193.0/24",    PUBLIC),               // AMT
        ("192.88.99.0/24",     int(Reserved)),        // deprecated 6to4 relay anycast
        ("192.175.48.0/24",    PUBLIC),               // Direct Delegation AS112
        ("198.51.100.0/24",    int(Documentation)),
        ("203.0.113.0/24",     int(Documentation)),
        ("169.254.0.0/16",     int(LinkLocal)),
        ("192.168.0.0/16",     int(Private)),
        ("198.18.0.0/15",      int(Benchmarking)),
        ("172.16.0.0/12",      int(Private)),
        ("100.64.0.0/10",      int(Cgnat)),
        ("0.0.0.0/8",          int(ThisNetwork)),
        ("10.0.0.0/8",         int(Private)),
        ("127.0.0.0/8",        int(Loopback)),
        ("224.0.0.0/4",        int(Multicast)),
        ("240.0.0.0/4",        int(Reserved)),
        ("0.0.0.0/0",          PUBLIC),
    ]
};

/// The IPv6 policy. Most specific first; the first row that contains the
/// address decides. See the module docs for the sources of each row.
// invariant: no row contains a later row (checked by `no_row_is_shadowed`),
// so first match is longest-prefix match.
#[rustfmt::skip]
const V6_ROWS: &[(&str, V6Rule)] = {
    use Internal::*;
    use V6Rule::*;
    &[
        ("::/128",             Is(int(Unspecified))),
        ("::1/128",            Is(int(Loopback))),
        ("fd00:ec2::254/128",  Is(int(CloudMetadata))),  // AWS instance metadata
        ("fd00:ec2::23/128",   Is(int(CloudMetadata))),  // AWS EKS Pod Identity
        ("2001:1::1/128",      Is(int(IetfProtocolAssignments))), // PCP anycast
        ("2001:1::2/128",      Is(int(IetfProtocolAssignments))), // TURN anycast
        ("2001:1::3/128",      Is(int(IetfProtocolAssignments))), // DNS-SD SRP anycast
        ("::ffff:0:0/96",      Low32),                   // IPv4-mapped
        ("::ffff:0:0:0/96",    Low32),                   // IPv4-translated
        ("::/96",              Low32),                   // IPv4-compatible
        ("64:ff9b::/96",       Low32),                   // NAT64 well-known prefix
        ("100::/64",           Is(int(Reserved))),       // discard-only
        ("100:0:0:1::/64",     Is(int(Reserved))),       // dummy prefix
        ("64:ff9b:1::/48",     Is(int(Nat64Local))),
        ("2001:2::/48",        Is(int(Benchmarking))),
        ("2001:4:112::/48",    Is(PUBLIC)),              // AS112-v6
        ("2620:4f:8000::/48",  Is(PUBLIC)),              // Direct Delegation AS112
        ("2001::/32",          Teredo),
        ("2001:3::/32",        Is(PUBLIC)),              // AMT
        ("2001:db8::/32",      Is(int(Documentation))),
        ("2001:10::/28",       Is(int(Reserved))),       // deprecated ORCHID
        ("2001:20::/28",       Is(PUBLIC)),              // ORCHIDv2
        ("2001:30::/28",       Is(PUBLIC)),              // drone entity tags
        ("2001::/23",          Is(int(IetfProtocolAssignments))),
        ("3fff::/20",          Is(int(Documentation))),
        ("2002::/16",          SixToFour),
        ("5f00::/16",          Is(int(Reserved))),       // SRv6 SIDs
        ("fe80::/10",          Is(int(LinkLocal))),
        ("fec0::/10",          Is(int(SiteLocal))),
        ("ff00::/8",           Is(int(Multicast))),
        ("fc00::/7",           Is(int(UniqueLocal))),
        ("2000::/3",           Is(PUBLIC)),              // global unicast
        ("::/0",               Is(int(Reserved))),
    ]
};

/// One IPv4 row, compiled: an address is in it if `address & mask ==
/// network`. Two integer operations per row keep [`classify`] at a few
/// nanoseconds (ipnet's `contains` recomputes the mask on every call).
#[derive(Clone, Copy, Debug)]
struct V4Row {
    network: u32,
    mask: u32,
    class: Class,
}

/// One IPv6 row, compiled like [`V4Row`].
#[derive(Clone, Copy, Debug)]
struct V6Row {
    network: u128,
    mask: u128,
    rule: V6Rule,
}

/// [`V4_ROWS`], parsed at compile time.
static V4_TABLE: [V4Row; V4_ROWS.len()] = compile_v4(V4_ROWS);

/// [`V6_ROWS`], parsed at compile time.
static V6_TABLE: [V6Row; V6_ROWS.len()] = compile_v6(V6_ROWS);

const fn compile_v4<const N: usize>(rows: &[(&str, Class)]) -> [V4Row; N] {
    assert!(rows.len() == N);
    let empty = V4Row {
        network: 0,
        mask: 0,
        class: Class::Internal(Internal::Reserved),
    };
    let mut table = [empty; N];
    let mut i = 0;
    while i < N {
        let net = const_net_v4(rows[i].0);
        let len = net.prefix_len() as u32;
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        let network = net.addr().to_bits();
        assert!(network & !mask == 0, "host bits set in a row");
        table[i] = V4Row {
            network,
            mask,
            class: rows[i].1,
        };
        i += 1;
    }
    table
}

const fn compile_v6<const N: usize>(rows: &[(&str, V6Rule)]) -> [V6Row; N] {
    assert!(rows.len() == N);
    let empty = V6Row {
        network: 0,
        mask: 0,
        rule: V6Rule::Is(Class::Internal(Internal::Reserved)),
    };
    let mut table = [empty; N];
    let mut i = 0;
    while i < N {
        let net = const_net_v6(rows[i].0);
        let len = net.prefix_len() as u32;
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len)
        };
        let network = net.addr().to_bits();
        assert!(network & !mask == 0, "host bits set in a row");
        table[i] = V6Row {
            network,
            mask,
            rule: rows[i].1,
        };
        i += 1;
    }
    table
}

/// Parse `a.b.c.d/len` at compile time: a malformed row fails the build.
const fn const_net_v4(text: &str) -> Ipv4Net {
    let b = text.as_bytes();
    let mut octets = [0u8; 4];
    let mut i = 0;
    let mut k = 0;
    while k < 4 {
        let (value, next) = const_number(b, i, 10);
        assert!(value <= 255, "octet over 255");
        octets[k] = value as u8;
        k += 1;
        let want = if k == 4 { b'/' } else { b'.' };
        assert!(next < b.len() && b[next] == want, "expected a.b.c.d/len");
        i = next + 1;
    }
    let (len, end) = const_number(b, i, 10);
    assert!(end == b.len() && len <= 32, "bad prefix length");
    let [a, bb, c, d] = octets;
    Ipv4Net::new_assert(Ipv4Addr::new(a, bb, c, d), len as u8)
}

/// Parse `x:x::x/len` (hex groups, at most one `::`) at compile time.
const fn const_net_v6(text: &str) -> Ipv6Net {
    let b = text.as_bytes();
    let mut slash = 0;
    while b[slash] != b'/' {
        slash += 1;
    }
    let mut head = [0u16; 8];
    let mut heads = 0;
    let mut tail = [0u16; 8];
    let mut tails = 0;
    let mut gap = false;
    let mut i = 0;
    if b[0] == b':' {
        assert!(b[1] == b':', "a leading ':' must be '::'");
        gap = true;
        i = 2;
    }
    while i < slash {
        let (value, next) = const_number(b, i, 16);
        assert!(next - i <= 4 && value <= 0xffff, "group over four digits");
        if gap {
            tail[tails] = value as u16;
            tails += 1;
        } else {
            head[heads] = value as u16;
            heads += 1;
        }
        i = next;
        if i == slash {
            break;
        }
        assert!(b[i] == b':', "expected ':'");
        i += 1;
        if b[i] == b':' {
            assert!(!gap, "two '::'");
            gap = true;
            i += 1;
        }
    }
    assert!(
        if gap { heads + tails < 8 } else { heads == 8 },
        "wrong number of groups"
    );
    let mut segments = head;
    let mut t = 0;
    while t < tails {
        segments[8 - tails + t] = tail[t];
        t += 1;
    }
    let (len, end) = const_number(b, slash + 1, 10);
    assert!(end == b.len() && len <= 128, "bad prefix length");
    let [s0, s1, s2, s3, s4, s5, s6, s7] = segments;
    Ipv6Net::new_assert(Ipv6Addr::new(s0, s1, s2, s3, s4, s5, s6, s7), len as u8)
}

/// Digits of `radix` from `b[i..]`: the value and the index after them.
const fn const_number(b: &[u8], mut i: usize, radix: u32) -> (u32, usize) {
    let start = i;
    let mut value: u32 = 0;
    while i < b.len() {
        let digit = match b[i] {
            c @ b'0'..=b'9' => (c - b'0') as u32,
            c @ b'a'..=b'f' if radix == 16 => (c - b'a' + 10) as u32,
            _ => break,
        };
        value = value * radix + digit;
        assert!(value <= 0xffff_ffff / 16, "number too long");
        i += 1;
    }
    assert!(i > start, "expected a number");
    (value, i)
}

/// Why a piece of text is not an address [`parse_address`] accepts.
///
/// The message names the text as given (quoted and escaped), then the
/// reason: `"300.1.1.1" is not an IP address: part "300" is over 255`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an IP address: {reason}")]
pub struct AddressParseError {
    text: String,
    reason: String,
}

impl AddressParseError {
    fn new(text: &str, reason: impl Into<String>) -> AddressParseError {
        AddressParseError {
            text: text.to_owned(),
            reason: reason.into(),
        }
    }

    /// The text that was refused, as given.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Why it was refused, for people.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// Parse an address as typed on the command line.
///
/// Accepted, after trimming surrounding whitespace:
///
/// - IPv4 in every form `inet_aton(3)` accepts, since resolvers, libc and
///   URL parsers accept them too and they are the usual way to smuggle an
///   internal address past a filter: one to four parts separated by dots;
///   every part but the last is one byte, the last fills the remaining
///   bytes (`127.1`, `127.0.1`, `2130706433`); each part is decimal, octal
///   with a leading `0` (`0177.0.0.1`, `017700000001`) or hexadecimal with
///   `0x`/`0X` (`0x7f000001`, `0x7f.0.0.1`), freely mixed. A leading zero
///   always means octal, so `010.0.0.1` is `8.0.0.1`, as libc reads it.
///   A part too large for its bytes is an error, never wrapped.
/// - IPv6 in every form `std` accepts, including an embedded dotted quad
///   (`::ffff:127.0.0.1`, strict decimal there), optionally in brackets
///   (`[::1]`), optionally with a zone id (`fe80::1%eth0`, or the URL form
///   `fe80::1%25eth0`). The zone is checked and dropped: it does not change
///   the verdict. A zone is one or more ASCII letters, digits, `-`, `.`,
///   `_` or `~`.
///
/// Everything else is refused, including ports, CIDR suffixes, host names,
/// bracketed IPv4, zone ids on IPv4, and text after the address (glibc's
/// `inet_aton` ignores anything after a space; this parser does not).
pub fn parse_address(text: &str) -> Result<IpAddr, AddressParseError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(AddressParseError::new(text, "it is empty"));
    }
    if let Some(inner) = s.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(AddressParseError::new(
                text,
                "the '[' is not closed by a final ']'",
            ));
        };
        return parse_v6(text, inner).map(IpAddr::V6);
    }
    if s.contains(':') {
        return parse_v6(text, s).map(IpAddr::V6);
    }
    parse_inet_aton(s)
        .map(IpAddr::V4)
        .map_err(|reason| AddressParseError::new(text, reason))
}

fn parse_v6(text: &str, s: &str) -> Result<Ipv6Addr, AddressParseError> {
    let addr = match s.split_once('%') {
        None => s,
        Some((addr, zone)) => {
            if zone.is_empty() {
                return Err(AddressParseError::new(
                    text,
                    "the zone id after '%' is empty",
                ));
            }
            if !zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
            {
                return Err(AddressParseError::new(
                    text,
                    format!(
                        "zone id {zone:?} may hold only letters, digits, '-', '.', '_' and '~'"
                    ),
                ));
            }
            addr
        }
    };
    addr.parse::<Ipv6Addr>()
        .map_err(|_| AddressParseError::new(text, "it is not a valid IPv6 address"))
}

/// The most parts an `inet_aton` address has.
const MAX_PARTS: usize = 4;

/// `inet_aton(3)`: 1 to 4 parts, the last filling the remaining bytes.
fn parse_inet_aton(s: &str) -> Result<Ipv4Addr, String> {
    let mut values = [0u32; MAX_PARTS];
    let mut count = 0;
    for part in s.split('.') {
        if count == MAX_PARTS {
            return Err("it has more than four parts".to_owned());
        }
        values[count] = parse_part(part)?;
        count += 1;
    }
    let (last, leading) = values[..count].split_last().expect("split yields a part");
    let mut addr: u32 = 0;
    for (i, &byte) in leading.iter().enumerate() {
        if byte > 0xff {
            return Err(format!("part {:?} is over 255", nth_part(s, i)));
        }
        addr |= byte << (24 - 8 * i);
    }
    // The last part fills the bytes the leading parts left: 4, 3, 2 or 1.
    let room_bits = 32 - 8 * leading.len() as u32;
    let max = (u64::from(u32::MAX)) >> (32 - room_bits);
    if u64::from(*last) > max {
        let part = nth_part(s, count - 1);
        return Err(match room_bits / 8 {
            1 => format!("part {part:?} is over 255"),
            bytes => format!("part {part:?} is over {max}, the most the last {bytes} bytes hold"),
        });
    }
    Ok(Ipv4Addr::from(addr | *last))
}

fn nth_part(s: &str, n: usize) -> &str {
    s.split('.').nth(n).unwrap_or(s)
}

/// One `inet_aton` part: decimal, `0` octal or `0x` hexadecimal, at most
/// 32 bits.
fn parse_part(part: &str) -> Result<u32, String> {
    if part.is_empty() {
        return Err("it has an empty part".to_owned());
    }
    let (digits, radix, what) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16, "a hexadecimal")
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8, "an octal")
        } else {
            (part, 10, "a decimal")
        };
    if digits.is_empty() {
        return Err(format!("part {part:?} has no digits after its prefix"));
    }
    let mut value: u32 = 0;
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else {
            return Err(format!("part {part:?} is not {what} number"));
        };
        value = value
            .checked_mul(radix)
            .and_then(|v| v.checked_add(d))
            .ok_or_else(|| format!("part {part:?} does not fit in 32 bits"))?;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets_v4() -> Vec<Ipv4Net> {
        V4_ROWS
            .iter()
            .map(|(text, _)| text.parse().unwrap())
            .collect()
    }

    fn nets_v6() -> Vec<Ipv6Net> {
        V6_ROWS
            .iter()
            .map(|(text, _)| text.parse().unwrap())
            .collect()
    }

    /// First match is longest match only if no row contains a later one.
    #[test]
    fn no_row_is_shadowed() {
        let v4 = nets_v4();
        for (i, a) in v4.iter().enumerate() {
            for b in &v4[i + 1..] {
                assert!(!a.contains(b), "{a} comes before {b}, which it contains");
            }
        }
        let v6 = nets_v6();
        for (i, a) in v6.iter().enumerate() {
            for b in &v6[i + 1..] {
                assert!(!a.contains(b), "{a} comes before {b}, which it contains");
            }
        }
    }

    /// The compile-time parser and masks agree with ipnet on every row.
    #[test]
    fn compiled_rows_match_ipnet() {
        for (net, row) in nets_v4().iter().zip(&V4_TABLE) {
            assert_eq!(net.trunc(), *net, "{net} has host bits set");
            assert_eq!(row.network, net.network().to_bits(), "{net}");
            assert_eq!(row.mask, net.netmask().to_bits(), "{net}");
        }
        for (net, row) in nets_v6().iter().zip(&V6_TABLE) {
            assert_eq!(net.trunc(), *net, "{net} has host bits set");
            assert_eq!(row.network, net.network().to_bits(), "{net}");
            assert_eq!(row.mask, net.netmask().to_bits(), "{net}");
        }
        assert_eq!(V4_TABLE.len(), V4_ROWS.len());
        assert_eq!(V6_TABLE.len(), V6_ROWS.len());
    }

    #[test]
    fn tables_end_with_a_catch_all() {
        assert_eq!(V4_TABLE.last().map(|r| r.mask), Some(0));
        assert_eq!(V6_TABLE.last().map(|r| r.mask), Some(0));
    }

    #[test]
    fn every_class_has_a_row() {
        for class in Internal::ALL {
            let v4 = V4_ROWS.iter().any(|r| r.1 == Class::Internal(class));
            let v6 = V6_ROWS
                .iter()
                .any(|r| r.1 == V6Rule::Is(Class::Internal(class)));
            assert!(v4 || v6, "no row gives {class}");
        }
    }

    #[test]
    fn names_are_unique_snake_case_and_labels_agree() {
        let mut seen = std::collections::HashSet::new();
        for class in Internal::ALL {
            let name = class.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            assert_eq!(class.label(), format!("internal {name}"));
            assert_eq!(
                Class::Internal(class).to_string(),
                format!("internal {name}")
            );
        }
        assert_eq!(Class::Public.to_string(), "public");
    }

    #[test]
    fn inet_aton_reports_the_offending_part() {
        let e = parse_address("300.1.1.1").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#""300.1.1.1" is not an IP address: part "300" is over 255"#
        );
        let e = parse_address("1.2.3.256").unwrap_err();
        assert_eq!(e.reason(), r#"part "256" is over 255"#);
        let e = parse_address("1.0x1000000").unwrap_err();
        assert_eq!(
            e.reason(),
            r#"part "0x1000000" is over 16777215, the most the last 3 bytes hold"#
        );
        let e = parse_address("1.2.65536").unwrap_err();
        assert_eq!(
            e.reason(),
            r#"part "65536" is over 65535, the most the last 2 bytes hold"#
        );
    }

    #[test]
    fn internal_causes_are_the_class_names() {
        for class in Internal::ALL {
            assert_eq!(class.cause(), format!("internal:{}", class.as_str()));
            assert_eq!(class.label(), format!("internal {}", class.as_str()));
        }
    }
}
