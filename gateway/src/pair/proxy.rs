//! The PROXY protocol version 2 header (HAProxy's `proxy-protocol.txt`,
//! section 2.2) as the member-to-member link carries it: the first bytes a
//! forwarding member writes on the link, inside its mutually authenticated
//! TLS, before the session's connection bytes, untouched.
//!
//! What the link accepts is narrower than what the format allows, and
//! every other header is refused with a stable cause ([`HeaderError`]):
//!
//! - command `PROXY` (a forwarded connection); `LOCAL` carries no source
//!   and is refused;
//! - transport `STREAM` over `INET` or `INET6` (a session's TCP
//!   connection), with the address block exactly the family's length;
//! - TLVs, each whole inside the header: the link's own
//!   [`TLV_SESSION`] at most once (the session and attempt the forwarder
//!   forwards for, so a holder whose authority for the source is another
//!   attempt refuses instead of guessing); the standard types are skipped
//!   (the link's TLS already gives integrity, so `CRC32C` adds nothing);
//!   other types of the custom range `0xE0..=0xEF` are refused, so a
//!   later meaning is never silently ignored;
//! - at most [`MAX_HEADER`] bytes in all.
//!
//! [`read`] reads exactly the header's bytes and not one more: what
//! follows on the stream is the session's ClientHello, for the holder to
//! judge as a direct connection's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::refusal::causes;

/// The twelve bytes every version 2 header starts with.
pub const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// The fixed part: signature, version and command, family and transport,
/// and the length of what follows.
pub const FIXED: usize = 16;

/// The longest header the link reads: the fixed part, an IPv6 address
/// block and room for the session TLV with the longest session id and a
/// few standard TLVs. A longer one is refused before its body is read.
pub const MAX_HEADER: usize = 512;

/// The link's own TLV (of the format's custom range): the attempt (4
/// bytes, big-endian), then the session id (UTF-8, 1 to 128 bytes).
pub const TLV_SESSION: u8 = 0xE1;

/// The link's TLV for what a stream carries: one byte, 1 for DNS
/// queries ([`Service::Dns`]); absent for a TLS connection. A member that
/// does not know it refuses the stream (`unknown_custom_tlv`), so a query
/// is never taken for a ClientHello.
pub const TLV_SERVICE: u8 = 0xE2;

const SERVICE_DNS: u8 = 1;

/// The longest session id the session TLV carries.
pub const MAX_SESSION_ID: usize = 128;

const VERSION_2: u8 = 0x20;
const CMD_LOCAL: u8 = 0x00;
const CMD_PROXY: u8 = 0x01;
const AF_INET_STREAM: u8 = 0x11;
const AF_INET6_STREAM: u8 = 0x21;
const INET_BLOCK: usize = 12;
const INET6_BLOCK: usize = 36;

/// A forwarded connection's header: where the session's connection came
/// from and went to, and which authority the forwarder forwards it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The session's own address: the source the holder judges by.
    pub source: SocketAddr,
    /// The address the session connected to (port 443 of a destination).
    pub destination: SocketAddr,
    /// The session and attempt the forwarder's entry names, if it gave one.
    pub session: Option<(String, u32)>,
    /// What the stream carries: a session's TLS connection, or its DNS
    /// queries ([`TLV_SERVICE`]).
    pub service: Service,
}

/// What a forwarded stream carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Service {
    /// A session's TCP connection to port 443, its ClientHello first.
    #[default]
    Tls,
    /// A session's DNS queries, each as DNS over TCP frames it (a two-byte
    /// length first), answered in order ([`crate::dns`]).
    Dns,
}

causes! {
    /// Why the link refused a header: fixed words for logs and the
    /// `cause` label of `gateway_link_refused_total`.
    pub enum HeaderError {
        /// The stream ended inside the header.
        Truncated => "header_truncated",
        /// The header did not come within its time.
        Timeout => "header_timeout",
        /// The first twelve bytes are not the signature.
        BadSignature => "bad_signature",
        /// Not version 2.
        BadVersion => "bad_version",
        /// `LOCAL`: no source to judge by.
        LocalCommand => "local_command",
        /// A command other than `LOCAL` and `PROXY`.
        BadCommand => "bad_command",
        /// Not TCP over IPv4 or IPv6.
        BadFamily => "bad_family",
        /// Longer than [`MAX_HEADER`].
        TooLong => "header_too_long",
        /// Shorter than its family's address block.
        ShortAddresses => "short_addresses",
        /// A TLV runs past the header's end.
        BadTlv => "bad_tlv",
        /// The session TLV is malformed or given twice.
        BadSessionTlv => "bad_session_tlv",
        /// The service TLV twice, or with a value the link does not know.
        BadServiceTlv => "bad_service_tlv",
        /// A TLV of the custom range the link does not know.
        UnknownCustomTlv => "unknown_custom_tlv",
        /// Source and destination of different families.
        MixedFamilies => "mixed_families",
        /// Reading the stream failed.
        Io => "io_error",
    }
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for HeaderError {}

impl Header {
    /// The header's bytes, as the forwarder writes them.
    ///
    /// Errors (never on the forwarder's own path, whose entries are
    /// checked when they are taken): source and destination of different
    /// families, or a session id empty or longer than [`MAX_SESSION_ID`].
    pub fn encode(&self) -> Result<Vec<u8>, HeaderError> {
        let mut body = Vec::with_capacity(INET6_BLOCK + 8 + MAX_SESSION_ID);
        let family = match (self.source.ip(), self.destination.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                body.extend_from_slice(&s.octets());
                body.extend_from_slice(&d.octets());
                AF_INET_STREAM
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                body.extend_from_slice(&s.octets());
                body.extend_from_slice(&d.octets());
                AF_INET6_STREAM
            }
            _ => return Err(HeaderError::MixedFamilies),
        };
        body.extend_from_slice(&self.source.port().to_be_bytes());
        body.extend_from_slice(&self.destination.port().to_be_bytes());
        if let Some((id, attempt)) = &self.session {
            if id.is_empty() || id.len() > MAX_SESSION_ID {
                return Err(HeaderError::BadSessionTlv);
            }
            body.push(TLV_SESSION);
            body.extend_from_slice(&((4 + id.len()) as u16).to_be_bytes());
            body.extend_from_slice(&attempt.to_be_bytes());
            body.extend_from_slice(id.as_bytes());
        }
        if self.service == Service::Dns {
            body.extend_from_slice(&[TLV_SERVICE, 0, 1, SERVICE_DNS]);
        }
        let mut out = Vec::with_capacity(FIXED + body.len());
        out.extend_from_slice(&SIGNATURE);
        out.push(VERSION_2 | CMD_PROXY);
        out.push(family);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }
}

/// How long the body that follows the fixed part `fixed` is: checks
/// signature, version, command, family and the bound first, so nothing
/// more is read of a header that is refused anyway.
pub fn body_len(fixed: &[u8; FIXED]) -> Result<usize, HeaderError> {
    if fixed[..12] != SIGNATURE {
        return Err(HeaderError::BadSignature);
    }
    if fixed[12] & 0xF0 != VERSION_2 {
        return Err(HeaderError::BadVersion);
    }
    match fixed[12] & 0x0F {
        CMD_PROXY => {}
        CMD_LOCAL => return Err(HeaderError::LocalCommand),
        _ => return Err(HeaderError::BadCommand),
    }
    if !matches!(fixed[13], AF_INET_STREAM | AF_INET6_STREAM) {
        return Err(HeaderError::BadFamily);
    }
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if FIXED + len > MAX_HEADER {
        return Err(HeaderError::TooLong);
    }
    Ok(len)
}

/// Parse a whole header: `fixed` as [`body_len`] accepted it, and exactly
/// the body it announced.
pub fn parse(fixed: &[u8; FIXED], body: &[u8]) -> Result<Header, HeaderError> {
    if body_len(fixed)? != body.len() {
        return Err(HeaderError::Truncated);
    }
    let ip_len = if fixed[13] == AF_INET_STREAM { 4 } else { 16 };
    let block_len = if ip_len == 4 { INET_BLOCK } else { INET6_BLOCK };
    if body.len() < block_len {
        return Err(HeaderError::ShortAddresses);
    }
    let (block, rest) = body.split_at(block_len);
    let (source, destination) = addresses(block, ip_len);
    let (session, service) = tlvs(rest)?;
    Ok(Header {
        source,
        destination,
        session,
        service,
    })
}

/// The source and destination of an address block whose addresses are
/// `ip_len` bytes each (4 or 16), ports after them.
fn addresses(block: &[u8], ip_len: usize) -> (SocketAddr, SocketAddr) {
    let ip = |b: &[u8]| -> IpAddr {
        match <[u8; 4]>::try_from(b) {
            Ok(v4) => Ipv4Addr::from(v4).into(),
            Err(_) => Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes")).into(),
        }
    };
    let port = |at: usize| u16::from_be_bytes([block[at], block[at + 1]]);
    (
        SocketAddr::new(ip(&block[..ip_len]), port(2 * ip_len)),
        SocketAddr::new(ip(&block[ip_len..2 * ip_len]), port(2 * ip_len + 2)),
    )
}

/// Walk the TLVs: the session TLV, if any, and the service (see the
/// module docs for what else is skipped or refused).
fn tlvs(mut rest: &[u8]) -> Result<(Option<(String, u32)>, Service), HeaderError> {
    let mut session = None;
    let mut service = None;
    while !rest.is_empty() {
        let [kind, hi, lo, tail @ ..] = rest else {
            return Err(HeaderError::BadTlv);
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        if tail.len() < len {
            return Err(HeaderError::BadTlv);
        }
        let (value, next) = tail.split_at(len);
        match *kind {
            TLV_SESSION => {
                if session.is_some() {
                    return Err(HeaderError::BadSessionTlv);
                }
                session = Some(session_tlv(value)?);
            }
            TLV_SERVICE => {
                if service.is_some() || value != [SERVICE_DNS] {
                    return Err(HeaderError::BadServiceTlv);
                }
                service = Some(Service::Dns);
            }
            0xE0..=0xEF => return Err(HeaderError::UnknownCustomTlv),
            _ => {}
        }
        rest = next;
    }
    Ok((session, service.unwrap_or_default()))
}

fn session_tlv(value: &[u8]) -> Result<(String, u32), HeaderError> {
    let Some((attempt, id)) = value.split_first_chunk::<4>() else {
        return Err(HeaderError::BadSessionTlv);
    };
    if id.is_empty() || id.len() > MAX_SESSION_ID {
        return Err(HeaderError::BadSessionTlv);
    }
    let id = std::str::from_utf8(id).map_err(|_| HeaderError::BadSessionTlv)?;
    if id.chars().any(char::is_control) {
        return Err(HeaderError::BadSessionTlv);
    }
    Ok((id.to_owned(), u32::from_be_bytes(*attempt)))
}

/// Read one header from `stream` within `within`: exactly its bytes, so
/// what the stream yields next is the forwarded connection's own first
/// byte.
pub async fn read<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> Result<Header, HeaderError> {
    let reading = async {
        let mut fixed = [0u8; FIXED];
        stream.read_exact(&mut fixed).await.map_err(io_cause)?;
        let mut body = vec![0u8; body_len(&fixed)?];
        stream.read_exact(&mut body).await.map_err(io_cause)?;
        parse(&fixed, &body)
    };
    tokio::time::timeout(within, reading)
        .await
        .map_err(|_| HeaderError::Timeout)?
}

fn io_cause(e: std::io::Error) -> HeaderError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        HeaderError::Truncated
    } else {
        HeaderError::Io
    }
}

/// Parse a header from the start of `bytes` however it ends: the header
/// and how many bytes it took, `Ok(None)` when `bytes` ends before it
/// does. For the fuzz target and for tests; the link uses [`read`].
pub fn parse_prefix(bytes: &[u8]) -> Result<Option<(Header, usize)>, HeaderError> {
    let Some(fixed) = bytes.first_chunk::<FIXED>() else {
        // A prefix of the signature may still become a header.
        let n = bytes.len().min(SIGNATURE.len());
        return if bytes[..n] == SIGNATURE[..n] {
            Ok(None)
        } else {
            Err(HeaderError::BadSignature)
        };
    };
    let len = body_len(fixed)?;
    match bytes.get(FIXED..FIXED + len) {
        Some(body) => Ok(Some((parse(fixed, body)?, FIXED + len))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> Header {
        Header {
            source: "127.0.0.7:40000".parse().unwrap(),
            destination: "93.184.215.14:443".parse().unwrap(),
            session: Some(("sbx-0001".into(), 3)),
            service: Service::Tls,
        }
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let v6 = Header {
            source: "[2001:db8::7]:40000".parse().unwrap(),
            destination: "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"
                .parse()
                .unwrap(),
            session: None,
            service: Service::Tls,
        };
        let dns = Header {
            destination: "10.0.0.1:53".parse().unwrap(),
            service: Service::Dns,
            ..v4()
        };
        for h in [v4(), v6, dns] {
            let bytes = h.encode().unwrap();
            let (back, used) = parse_prefix(&bytes).unwrap().unwrap();
            assert_eq!(back, h);
            assert_eq!(used, bytes.len());
        }
    }

    #[test]
    fn the_service_tlv_is_known_once_with_its_one_value() {
        let mut h = v4();
        h.session = None;
        let plain = h.encode().unwrap();
        let with = |tlv: &[u8]| {
            let mut b = plain.clone();
            let len = u16::from_be_bytes([b[14], b[15]]) + tlv.len() as u16;
            b[14..16].copy_from_slice(&len.to_be_bytes());
            b.extend_from_slice(tlv);
            parse_prefix(&b).map(|h| h.map(|(h, _)| h.service))
        };
        assert_eq!(with(&[TLV_SERVICE, 0, 1, 1]), Ok(Some(Service::Dns)));
        for bad in [
            &[TLV_SERVICE, 0, 1, 2][..],
            &[TLV_SERVICE, 0, 0],
            &[TLV_SERVICE, 0, 2, 1, 1],
            &[TLV_SERVICE, 0, 1, 1, TLV_SERVICE, 0, 1, 1],
        ] {
            assert_eq!(with(bad), Err(HeaderError::BadServiceTlv), "{bad:?}");
        }
    }

    /// The example of HAProxy's specification, byte for byte: a TCP/IPv4
    /// header from 192.168.0.1:56324 to 192.168.0.11:443, no TLV.
    #[test]
    fn the_specifications_bytes_are_read_as_it_says() {
        let mut bytes = SIGNATURE.to_vec();
        bytes.extend_from_slice(&[0x21, 0x11, 0x00, 0x0C]);
        bytes.extend_from_slice(&[192, 168, 0, 1, 192, 168, 0, 11, 0xDC, 0x04, 0x01, 0xBB]);
        let (h, used) = parse_prefix(&bytes).unwrap().unwrap();
        assert_eq!(used, 28);
        assert_eq!(h.source, "192.168.0.1:56324".parse().unwrap());
        assert_eq!(h.destination, "192.168.0.11:443".parse().unwrap());
        assert_eq!(h.session, None);
        let written = Header { session: None, ..h }.encode().unwrap();
        assert_eq!(written, bytes);
    }

    #[test]
    fn every_prefix_waits_and_nothing_past_the_header_is_taken() {
        let mut bytes = v4().encode().unwrap();
        let len = bytes.len();
        for n in 0..len {
            assert_eq!(parse_prefix(&bytes[..n]), Ok(None), "prefix of {n}");
        }
        bytes.extend_from_slice(b"\x16\x03\x01 the hello");
        assert_eq!(parse_prefix(&bytes).unwrap().unwrap().1, len);
    }

    #[test]
    fn what_the_link_does_not_take_is_refused_with_its_cause() {
        let good = v4().encode().unwrap();
        let with = |i: usize, b: u8| {
            let mut v = good.clone();
            v[i] = b;
            parse_prefix(&v).map(|o| o.map(|(h, _)| h))
        };
        assert_eq!(with(0, 0x0E), Err(HeaderError::BadSignature));
        assert_eq!(with(12, 0x11), Err(HeaderError::BadVersion));
        assert_eq!(with(12, 0x20), Err(HeaderError::LocalCommand));
        assert_eq!(with(12, 0x22), Err(HeaderError::BadCommand));
        assert_eq!(with(13, 0x12), Err(HeaderError::BadFamily)); // UDP
        assert_eq!(with(13, 0x31), Err(HeaderError::BadFamily)); // unix
        assert_eq!(with(13, 0x00), Err(HeaderError::BadFamily)); // unspec
                                                                 // An INET6 family over a block an IPv4 header's length.
        let mut short = good.clone();
        short[13] = AF_INET6_STREAM;
        assert_eq!(
            parse_prefix(&short).map(|o| o.map(|(h, _)| h)),
            Err(HeaderError::ShortAddresses)
        );
        // Longer than the bound: refused from the fixed part alone.
        let mut long = good[..FIXED].to_vec();
        long[14..16].copy_from_slice(&(MAX_HEADER as u16).to_be_bytes());
        assert_eq!(
            parse_prefix(&long).map(|o| o.is_some()),
            Err(HeaderError::TooLong)
        );
        // A v1 (text) header is no v2 signature.
        assert_eq!(
            parse_prefix(b"PROXY TCP4 127.0.0.7 1.2.3.4 1 443\r\n").map(|o| o.is_some()),
            Err(HeaderError::BadSignature)
        );
    }

    /// A header with `tlvs` appended to an IPv4 block without a session.
    fn with_tlvs(tlvs: &[u8]) -> Result<Header, HeaderError> {
        let mut h = v4();
        h.session = None;
        let mut bytes = h.encode().unwrap();
        bytes.extend_from_slice(tlvs);
        let len = (bytes.len() - FIXED) as u16;
        bytes[14..16].copy_from_slice(&len.to_be_bytes());
        parse_prefix(&bytes).map(|o| o.expect("whole").0)
    }

    #[test]
    fn tlvs_standard_ones_are_skipped_custom_ones_refused() {
        // NOOP, CRC32C and ALPN: skipped.
        let skipped = with_tlvs(&[
            0x04, 0, 2, 0, 0, 0x03, 0, 4, 1, 2, 3, 4, 0x01, 0, 2, b'h', b'2',
        ]);
        assert_eq!(skipped.unwrap().session, None);
        let mut session = vec![TLV_SESSION, 0, 5, 0, 0, 0, 9, b's'];
        assert_eq!(with_tlvs(&session).unwrap().session, Some(("s".into(), 9)));
        session.extend_from_slice(&[TLV_SESSION, 0, 5, 0, 0, 0, 9, b's']);
        assert_eq!(with_tlvs(&session), Err(HeaderError::BadSessionTlv));
        assert_eq!(
            with_tlvs(&[TLV_SESSION, 0, 4, 0, 0, 0, 1]),
            Err(HeaderError::BadSessionTlv),
            "no id"
        );
        assert_eq!(
            with_tlvs(&[TLV_SESSION, 0, 6, 0, 0, 0, 1, b'a', 0x0A]),
            Err(HeaderError::BadSessionTlv),
            "a control character"
        );
        assert_eq!(
            with_tlvs(&[TLV_SESSION, 0, 6, 0, 0, 0, 1, 0xC3, 0x28]),
            Err(HeaderError::BadSessionTlv),
            "not UTF-8"
        );
        assert_eq!(with_tlvs(&[0xE0, 0, 0]), Err(HeaderError::UnknownCustomTlv));
        assert_eq!(with_tlvs(&[0x04, 0, 9, 0]), Err(HeaderError::BadTlv));
        assert_eq!(with_tlvs(&[0x04, 0]), Err(HeaderError::BadTlv));
    }

    #[test]
    fn encoding_refuses_what_no_header_can_say() {
        let mut h = v4();
        h.destination = "[::1]:443".parse().unwrap();
        assert_eq!(h.encode(), Err(HeaderError::MixedFamilies));
        let mut h = v4();
        h.session = Some(("x".repeat(MAX_SESSION_ID + 1), 1));
        assert_eq!(h.encode(), Err(HeaderError::BadSessionTlv));
        h.session = Some(("x".repeat(MAX_SESSION_ID), 1));
        let bytes = h.encode().unwrap();
        assert!(bytes.len() <= MAX_HEADER);
        assert_eq!(parse_prefix(&bytes).unwrap().unwrap().0, h);
    }

    #[tokio::test]
    async fn read_takes_the_header_and_leaves_the_rest_on_the_stream() {
        let mut bytes = v4().encode().unwrap();
        bytes.extend_from_slice(b"\x16\x03\x01rest");
        let mut stream: &[u8] = &bytes;
        let h = read(&mut stream, Duration::from_secs(5)).await.unwrap();
        assert_eq!(h, v4());
        assert_eq!(stream, b"\x16\x03\x01rest");
        let mut cut: &[u8] = &bytes[..20];
        assert_eq!(
            read(&mut cut, Duration::from_secs(5)).await,
            Err(HeaderError::Truncated)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_that_never_comes_times_out() {
        let (mut quiet, _keep) = tokio::io::duplex(64);
        assert_eq!(
            read(&mut quiet, Duration::from_secs(3)).await,
            Err(HeaderError::Timeout)
        );
    }
}
