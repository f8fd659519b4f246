//! Session source addresses: the addresses a session's connections come
//! from, by which the gateway knows the session.

use std::net::IpAddr;

/// IPv4-mapped IPv6 sources (`::ffff:10.0.0.5`, as a dual-stack listener
/// reports IPv4 peers) are the same session source as the plain IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// A source address from text, canonical; `None` if it is not an address.
pub fn parse(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(canonical_ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_sources_are_ipv4() {
        assert_eq!(parse("::ffff:10.0.0.5"), parse("10.0.0.5"));
        assert_eq!(parse("::1").unwrap().to_string(), "::1");
        assert_eq!(parse("10.0.0.300"), None);
        assert_eq!(parse("not-an-ip"), None);
    }
}
