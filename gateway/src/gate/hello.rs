//! The ClientHello parser: the first bytes of a connection in, a verdict out.
//!
//! Sans-IO and zero-copy. [`parse`] reads the TLS records at the start of a
//! connection, finds the ClientHello handshake message in them and judges it.
//! It never touches a socket, never awaits and never allocates: the data path
//! calls it again on its growing buffer after every read until the answer is
//! not [`Parse::Incomplete`] (the async wrapper that does so is
//! [`crate::gate::capture::read_hello`]).
//!
//! A hello that lies within one TLS record is read in place, straight from the
//! input. A hello split over several records (legal, and what some stacks do
//! with post-quantum key shares that push a hello past 1,700 bytes) is put
//! back together in a scratch buffer the caller provides, and read from there.
//!
//! # Verdicts
//!
//! Judged in this order, first match wins:
//!
//! 1. **`not_tls`** — anything the gateway cannot read as one well-formed
//!    ClientHello: plain text, SSLv2-style first bytes, a record version other
//!    than 3.x, a record of another content type before the hello is whole, a
//!    zero-length record, a handshake message other than ClientHello, a hello
//!    larger than the byte limit, any length field that disagrees with what
//!    holds it, bytes left over, a repeated extension (RFC 8446 §4.2 forbids
//!    them), a malformed `server_name`, `application_layer_protocol_negotiation`
//!    or `supported_versions` extension, and a host name that is longer than
//!    255 bytes or holds a byte outside `A-Z a-z 0-9 - . _`. A malformed
//!    hello is `not_tls` rather than anything more specific because the
//!    gateway cannot name what it cannot parse: it does not guess which of
//!    two disagreeing lengths meant the truth.
//! 2. **`encrypted_client_hello`** — the hello carries extension 0xfe0d,
//!    whatever else it holds, a `server_name` included: that name is only the
//!    public name of an ECH provider, not the server the client means.
//! 3. **`no_server_name`** — no `server_name` extension, an empty one or
//!    one with an empty list (RFC 6066 forbids both; either way nothing is
//!    named), one that holds no `host_name` entry, or one whose single
//!    `host_name` is empty. A list with
//!    *more than one* `host_name` entry (two names, or one name twice) is
//!    refused the same way: it does not name *one* server, and RFC 6066 §3
//!    forbids it. Entries of another `name_type` are skipped, as RFC 6066
//!    asks.
//! 4. Otherwise the hello is accepted with its server name. The name is
//!    returned as sent: canonical form, the allowlist, and the refusal of IP
//!    literals (which pass the alphabet above) are the name check's business.
//!
//! Every refusal carries a [`Cause`] that says which rule fired, for logs;
//! [`Cause::refusal`] maps it to the stable [`Refusal`].
//!
//! # Limits
//!
//! - The hello may take at most [`HelloLimits::max_bytes`] bytes on the wire,
//!   TLS record headers included (default [`DEFAULT_MAX_HELLO_BYTES`]); a
//!   hello that would need more is refused `not_tls` as soon as a length field
//!   says so, without waiting for the bytes. Therefore a caller never needs
//!   to buffer more than `max_bytes` bytes: once that many have arrived the
//!   answer is never [`Parse::Incomplete`].
//! - A record may carry at most [`MAX_RECORD_PAYLOAD`] bytes (RFC 8446 §5.1).
//! - A hello may hold at most [`MAX_EXTENSIONS`] extensions, which bounds the
//!   duplicate check; a host name at most [`MAX_HOST_NAME_LEN`] bytes.
//! - Each call is linear in the input: it walks the records once, copies a
//!   multi-record hello into the scratch buffer once and reads it once (plus
//!   the duplicate check, at most `MAX_EXTENSIONS`² / 2 comparisons). The
//!   data path calls it once per read, so a hello costs at most
//!   `max_bytes` × reads, and reads are bounded by the deadline.
//!
//! # For operators: Chromium and ECH
//!
//! Chromium (Chrome, Edge, headless Chromium, Electron, Playwright's bundled
//! browsers) sends an `encrypted_client_hello` extension (0xfe0d) on *every*
//! TLS connection — a GREASE one when the server has published no ECH key.
//! The gateway refuses every such hello `encrypted_client_hello`. A sandbox
//! image that runs Chromium must therefore turn ECH off by browser policy:
//! `EncryptedClientHelloEnabled` set to `false` (for example in
//! `/etc/chromium/policies/managed/talos.json`:
//! `{"EncryptedClientHelloEnabled": false}`), or its connections are refused.

use std::fmt;
use std::time::Duration;

use crate::refusal::Refusal;

/// Bytes in a TLS record header: content type, version, length.
pub const RECORD_HEADER_LEN: usize = 5;

/// The most bytes one TLS record may carry (2^14, RFC 8446 §5.1); a longer
/// record is a protocol error, and bounding it bounds one step of the parser.
pub const MAX_RECORD_PAYLOAD: usize = 16_384;

/// Default bound on the bytes a hello may take on the wire, record headers
/// included: 16 KiB for the handshake message — a whole record's worth, and
/// about nine times the largest hello a current client sends (≈1.8 KB with an
/// X25519MLKEM768 key share) — plus 1 KiB for the headers of a hello cut into
/// many small records. A larger hello is refused `not_tls`.
pub const DEFAULT_MAX_HELLO_BYTES: usize = 16 * 1024 + 1024;

/// Default time allowed for the whole hello to arrive, from the first read.
/// A client sends its hello right after the TCP handshake, so even a slow
/// link delivers it well within this; a sender that dribbles bytes holds a
/// connection slot no longer than this.
pub const DEFAULT_HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// The most extensions one hello may hold. Current browsers send about 18
/// (GREASE included); the bound keeps the allocation-free duplicate check
/// (a linear scan of the types seen so far) cheap on hostile input.
pub const MAX_EXTENSIONS: usize = 128;

/// The longest host name accepted (RFC 1035 §2.3.4 bounds a name at 255
/// bytes); a longer one is malformed.
pub const MAX_HOST_NAME_LEN: usize = 255;

/// The extension type of an encrypted client hello (draft-ietf-tls-esni):
/// its presence alone decides the verdict.
pub const EXT_ENCRYPTED_CLIENT_HELLO: u16 = 0xfe0d;

const HANDSHAKE_HEADER_LEN: usize = 4;
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const NAME_TYPE_HOST_NAME: u8 = 0;
const RANDOM_LEN: usize = 32;
const MAX_SESSION_ID_LEN: usize = 32;

/// How much the gateway reads and how long it waits for a hello.
///
/// # Limits
///
/// `max_bytes` bounds the buffer a caller keeps per connection and the
/// scratch buffer [`parse`] needs; `deadline` bounds how long a connection
/// may sit in the hello stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloLimits {
    /// The most bytes the hello may take on the wire, TLS record headers
    /// included. Default [`DEFAULT_MAX_HELLO_BYTES`] (17 KiB).
    pub max_bytes: usize,
    /// How long the whole hello may take to arrive, counted from the start of
    /// the first read. Used by the async reader only; the parser has no
    /// clock. Default [`DEFAULT_HELLO_DEADLINE`] (10 s).
    pub deadline: Duration,
}

impl Default for HelloLimits {
    fn default() -> Self {
        HelloLimits {
            max_bytes: DEFAULT_MAX_HELLO_BYTES,
            deadline: DEFAULT_HELLO_DEADLINE,
        }
    }
}

impl HelloLimits {
    /// A scratch buffer big enough for any hello within these limits: pass
    /// it to every [`parse`] call of one connection (or reuse it across
    /// connections; its contents do not matter).
    pub fn scratch(&self) -> Vec<u8> {
        vec![0; self.max_bytes]
    }
}

/// What [`parse`] made of the bytes so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// Not enough bytes to judge yet: read more and call again with all the
    /// bytes, old and new.
    Incomplete,
    /// A well-formed hello that names one server and carries no ECH: go on.
    Accept {
        /// The server name, as sent (ASCII hostname bytes, 1 to 255 long);
        /// the same as `hello.server_name()`.
        sni: &'a str,
        /// Everything else the hello said.
        hello: ClientHello<'a>,
    },
    /// Refuse the connection.
    Refuse {
        /// Which rule fired; [`Cause::refusal`] gives the stable reason.
        cause: Cause,
        /// The hello, when it was well formed (refused for ECH or for its
        /// server name), so its fields can go into the connection record.
        hello: Option<ClientHello<'a>>,
    },
}

impl<'a> Parse<'a> {
    /// The refusal reason, or `None` while incomplete or when accepted.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Parse::Refuse { cause, .. } => Some(cause.refusal()),
            Parse::Incomplete | Parse::Accept { .. } => None,
        }
    }

    /// The hello, when the bytes held a well-formed one (accepted or not).
    pub fn hello(&self) -> Option<&ClientHello<'a>> {
        match self {
            Parse::Accept { hello, .. } => Some(hello),
            Parse::Refuse { hello, .. } => hello.as_ref(),
            Parse::Incomplete => None,
        }
    }
}

/// A well-formed ClientHello, borrowed from the input or the scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientHello<'a> {
    // invariant: `Some` only when the server_name extension held exactly one
    // host_name entry, and that name is 1..=MAX_HOST_NAME_LEN bytes of
    // [A-Za-z0-9._-].
    server_name: Option<&'a str>,
    // invariant: a checked ProtocolNameList body (each entry a u8 length of
    // 1..=255 and that many bytes, nothing left over); empty when the hello
    // offered no ALPN.
    alpn: &'a [u8],
    // invariant: even length (a list of u16); empty when the extension is absent.
    supported_versions: &'a [u8],
    legacy_version: u16,
    ech: bool,
    // invariant: >= 1.
    records: usize,
    // invariant: records * RECORD_HEADER_LEN + the handshake message length,
    // and no more than the input length or the byte limit.
    consumed: usize,
}

impl<'a> ClientHello<'a> {
    /// The one server the hello names, if it names exactly one.
    pub fn server_name(&self) -> Option<&'a str> {
        self.server_name
    }

    /// The protocols offered by ALPN, in the client's order of preference
    /// (empty when the hello has no ALPN extension).
    pub fn alpn(&self) -> Alpn<'a> {
        Alpn { rest: self.alpn }
    }

    /// The `legacy_version` field (0x0303 from every TLS 1.3 client).
    pub fn legacy_version(&self) -> u16 {
        self.legacy_version
    }

    /// The versions offered in the `supported_versions` extension, in the
    /// client's order, GREASE values included (empty when absent: a TLS 1.2
    /// or older client).
    pub fn supported_versions(&self) -> Versions<'a> {
        Versions {
            rest: self.supported_versions,
        }
    }

    /// Whether the hello carries an encrypted client hello extension.
    pub fn has_ech(&self) -> bool {
        self.ech
    }

    /// How many TLS records the hello took (1 unless the client split it).
    pub fn records(&self) -> usize {
        self.records
    }

    /// How many bytes of the input the hello took, record headers included.
    /// Bytes after these belong to whatever the client sent next.
    pub fn consumed(&self) -> usize {
        self.consumed
    }
}

/// The ALPN protocol names of a hello, borrowed; see [`ClientHello::alpn`].
#[derive(Clone, Debug)]
pub struct Alpn<'a> {
    // invariant: a suffix of a checked ProtocolNameList body.
    rest: &'a [u8],
}

impl<'a> Iterator for Alpn<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (&len, tail) = self.rest.split_first()?;
        let (name, rest) = tail.split_at_checked(usize::from(len))?;
        self.rest = rest;
        Some(name)
    }
}

/// The TLS versions of a `supported_versions` extension; see
/// [`ClientHello::supported_versions`].
#[derive(Clone, Debug)]
pub struct Versions<'a> {
    // invariant: even length.
    rest: &'a [u8],
}

impl Iterator for Versions<'_> {
    type Item = u16;

    fn next(&mut self) -> Option<u16> {
        let (pair, rest) = self.rest.split_first_chunk::<2>()?;
        self.rest = rest;
        Some(u16::from_be_bytes(*pair))
    }
}

/// A part of the hello that was malformed, for [`Cause::Malformed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// `legacy_version`: missing, or not 3.x.
    LegacyVersion,
    /// `random`: fewer than 32 bytes.
    Random,
    /// `legacy_session_id`: cut short, or longer than 32 bytes.
    SessionId,
    /// `cipher_suites`: cut short, empty or of odd length.
    CipherSuites,
    /// `legacy_compression_methods`: cut short or empty.
    CompressionMethods,
    /// The extension list: cut short, an extension cut short, or bytes after it.
    Extensions,
    /// The `server_name` extension's lengths.
    ServerName,
    /// The ALPN extension: lengths, an empty list or an empty name.
    Alpn,
    /// The `supported_versions` extension: lengths, empty or odd.
    SupportedVersions,
}

impl Field {
    /// A stable snake_case name for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Field::LegacyVersion => "legacy_version",
            Field::Random => "random",
            Field::SessionId => "session_id",
            Field::CipherSuites => "cipher_suites",
            Field::CompressionMethods => "compression_methods",
            Field::Extensions => "extensions",
            Field::ServerName => "server_name",
            Field::Alpn => "alpn",
            Field::SupportedVersions => "supported_versions",
        }
    }
}

/// Which rule refused a hello: finer than [`Refusal`], for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// `not_tls`: the first byte is not a handshake record (plain text, say).
    NotHandshake {
        /// The first byte.
        content_type: u8,
    },
    /// `not_tls`: the first byte has its high bit set: an SSLv2-style hello.
    SslV2,
    /// `not_tls`: a record version whose major is not 3.
    RecordVersion {
        /// The major version byte.
        major: u8,
    },
    /// `not_tls`: a record of another content type before the hello was whole.
    InterleavedRecord {
        /// That record's content type.
        content_type: u8,
    },
    /// `not_tls`: a zero-length handshake record (RFC 8446 §5.1 forbids them).
    EmptyRecord,
    /// `not_tls`: a record longer than [`MAX_RECORD_PAYLOAD`].
    RecordOverflow {
        /// The record's length field.
        len: usize,
    },
    /// `not_tls`: the first handshake message is not a ClientHello.
    NotClientHello {
        /// Its handshake type.
        handshake_type: u8,
    },
    /// `not_tls`: the hello would take more than the byte limit.
    TooLarge {
        /// The limit, in bytes on the wire.
        limit: usize,
    },
    /// `not_tls`: the scratch buffer passed to [`parse`] is shorter than the
    /// hello. A caller bug: pass one of [`HelloLimits::max_bytes`] bytes, or
    /// grow it to `needed` and parse again.
    ScratchTooSmall {
        /// The scratch length that would do.
        needed: usize,
    },
    /// `not_tls`: the hello's last record, or the hello itself, holds bytes
    /// after the hello's end.
    TrailingData,
    /// `not_tls`: a field's lengths or contents are inconsistent.
    Malformed(Field),
    /// `not_tls`: an extension type appears twice.
    DuplicateExtension {
        /// The repeated type.
        ext_type: u16,
    },
    /// `not_tls`: more than [`MAX_EXTENSIONS`] extensions.
    TooManyExtensions,
    /// `not_tls`: a host name longer than [`MAX_HOST_NAME_LEN`] or with a byte
    /// outside `A-Z a-z 0-9 - . _`.
    BadServerName,
    /// `not_tls`: the whole hello did not arrive within the deadline (the
    /// async reader only).
    HelloTimeout,
    /// `not_tls`: the client closed before the hello was whole (the async
    /// reader only).
    Eof,
    /// `not_tls`: reading the connection failed (the async reader only).
    ReadFailed(std::io::ErrorKind),
    /// `no_server_name`: no `server_name`, no `host_name` in it, or an empty one.
    NoServerName,
    /// `no_server_name`: more than one `host_name` entry.
    SeveralServerNames,
    /// `encrypted_client_hello`: the hello carries extension 0xfe0d.
    EncryptedClientHello,
}

impl Cause {
    /// The stable refusal reason this cause maps to.
    pub const fn refusal(self) -> Refusal {
        match self {
            Cause::NoServerName | Cause::SeveralServerNames => Refusal::NoServerName,
            Cause::EncryptedClientHello => Refusal::EncryptedClientHello,
            Cause::NotHandshake { .. }
            | Cause::SslV2
            | Cause::RecordVersion { .. }
            | Cause::InterleavedRecord { .. }
            | Cause::EmptyRecord
            | Cause::RecordOverflow { .. }
            | Cause::NotClientHello { .. }
            | Cause::TooLarge { .. }
            | Cause::ScratchTooSmall { .. }
            | Cause::TrailingData
            | Cause::Malformed(_)
            | Cause::DuplicateExtension { .. }
            | Cause::TooManyExtensions
            | Cause::BadServerName
            | Cause::HelloTimeout
            | Cause::Eof
            | Cause::ReadFailed(_) => Refusal::NotTls,
        }
    }

    /// One of each cause, for the lists that must name every one (the
    /// test `examples_name_every_cause` keeps it whole).
    pub const EXAMPLES: [Cause; 20] = [
        Cause::NotHandshake { content_type: 0 },
        Cause::SslV2,
        Cause::RecordVersion { major: 0 },
        Cause::InterleavedRecord { content_type: 0 },
        Cause::EmptyRecord,
        Cause::RecordOverflow { len: 0 },
        Cause::NotClientHello { handshake_type: 0 },
        Cause::TooLarge { limit: 0 },
        Cause::ScratchTooSmall { needed: 0 },
        Cause::TrailingData,
        Cause::Malformed(Field::Random),
        Cause::DuplicateExtension { ext_type: 0 },
        Cause::TooManyExtensions,
        Cause::BadServerName,
        Cause::HelloTimeout,
        Cause::Eof,
        Cause::ReadFailed(std::io::ErrorKind::Other),
        Cause::NoServerName,
        Cause::SeveralServerNames,
        Cause::EncryptedClientHello,
    ];

    /// A stable snake_case name for logs (values are in the `Display` form).
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::NotHandshake { .. } => "not_handshake",
            Cause::SslV2 => "sslv2",
            Cause::RecordVersion { .. } => "record_version",
            Cause::InterleavedRecord { .. } => "interleaved_record",
            Cause::EmptyRecord => "empty_record",
            Cause::RecordOverflow { .. } => "record_overflow",
            Cause::NotClientHello { .. } => "not_client_hello",
            Cause::TooLarge { .. } => "too_large",
            Cause::ScratchTooSmall { .. } => "scratch_too_small",
            Cause::TrailingData => "trailing_data",
            Cause::Malformed(_) => "malformed",
            Cause::DuplicateExtension { .. } => "duplicate_extension",
            Cause::TooManyExtensions => "too_many_extensions",
            Cause::BadServerName => "bad_server_name",
            Cause::HelloTimeout => "hello_timeout",
            Cause::Eof => "eof",
            Cause::ReadFailed(_) => "read_failed",
            Cause::NoServerName => "no_server_name",
            Cause::SeveralServerNames => "several_server_names",
            Cause::EncryptedClientHello => "encrypted_client_hello",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Cause::NotHandshake { content_type } => {
                write!(
                    f,
                    "first byte {content_type:#04x} is not a TLS handshake record"
                )
            }
            Cause::SslV2 => f.write_str("SSLv2-style record header"),
            Cause::RecordVersion { major } => write!(f, "record version major {major}, not 3"),
            Cause::InterleavedRecord { content_type } => {
                write!(f, "record of content type {content_type} inside the hello")
            }
            Cause::EmptyRecord => f.write_str("zero-length handshake record"),
            Cause::RecordOverflow { len } => {
                write!(f, "record of {len} bytes, over {MAX_RECORD_PAYLOAD}")
            }
            Cause::NotClientHello { handshake_type } => {
                write!(f, "handshake type {handshake_type}, not ClientHello")
            }
            Cause::TooLarge { limit } => write!(f, "hello larger than {limit} bytes"),
            Cause::ScratchTooSmall { needed } => {
                write!(f, "scratch buffer shorter than the {needed} bytes needed")
            }
            Cause::TrailingData => f.write_str("bytes after the hello's end"),
            Cause::Malformed(field) => write!(f, "malformed {}", field.as_str()),
            Cause::DuplicateExtension { ext_type } => {
                write!(f, "extension {ext_type:#06x} appears twice")
            }
            Cause::TooManyExtensions => write!(f, "more than {MAX_EXTENSIONS} extensions"),
            Cause::BadServerName => f.write_str("server name is not a host name"),
            Cause::HelloTimeout => f.write_str("hello did not arrive in time"),
            Cause::Eof => f.write_str("connection closed before the hello was whole"),
            Cause::ReadFailed(kind) => write!(f, "reading the hello failed: {kind}"),
            Cause::NoServerName => f.write_str("hello names no server"),
            Cause::SeveralServerNames => f.write_str("hello names more than one server"),
            Cause::EncryptedClientHello => f.write_str("hello carries an encrypted client hello"),
        }
    }
}

/// Judges the first bytes a client sent on a connection.
///
/// `input` is everything received so far, from the first byte. `scratch` is
/// where a hello split over several records is put back together; give it
/// `limits.max_bytes` bytes (see [`HelloLimits::scratch`]) — a hello within
/// one record never touches it. Call again with the longer input after each
/// read while the answer is [`Parse::Incomplete`]. Once the answer is
/// anything else, more input never changes it.
///
/// # Limits
///
/// Never reads past `input`, never allocates, and never answers
/// `Incomplete` once `input.len() >= limits.max_bytes`. Only
/// `limits.max_bytes` is used. See the [module docs](self) for the rest.
pub fn parse<'a>(input: &'a [u8], scratch: &'a mut [u8], limits: &HelloLimits) -> Parse<'a> {
    match gather(input, scratch, limits.max_bytes) {
        Gather::Incomplete => Parse::Incomplete,
        Gather::Refuse(cause) => Parse::Refuse { cause, hello: None },
        Gather::Message {
            body,
            records,
            consumed,
        } => judge(body, records, consumed),
    }
}

enum Gather<'a> {
    Incomplete,
    Refuse(Cause),
    Message {
        /// The ClientHello body, after the 4-byte handshake header.
        body: &'a [u8],
        records: usize,
        consumed: usize,
    },
}

/// Walks the records and returns the handshake message they carry.
///
/// Each decision uses only bytes already seen, in input order, so the answer
/// on a prefix is `Incomplete` or the answer on the whole.
fn gather<'a>(input: &'a [u8], scratch: &'a mut [u8], max_bytes: usize) -> Gather<'a> {
    // Start of the current record in `input`.
    let mut pos = 0;
    let mut records = 0;
    // Handshake bytes in the records before `pos`; when `records > 1` they
    // are in `scratch[..gathered]`.
    let mut gathered = 0;
    let mut header = [0u8; HANDSHAKE_HEADER_LEN];
    // The handshake message length, header included, once its header is seen.
    let mut total: Option<usize> = None;

    loop {
        // Room for a record header and at least one byte?
        if pos + RECORD_HEADER_LEN + 1 > max_bytes {
            return Gather::Refuse(Cause::TooLarge { limit: max_bytes });
        }
        let rest = &input[pos..];
        let Some(&content_type) = rest.first() else {
            return Gather::Incomplete;
        };
        if content_type != CONTENT_TYPE_HANDSHAKE {
            return Gather::Refuse(if records > 0 {
                Cause::InterleavedRecord { content_type }
            } else if content_type & 0x80 != 0 {
                Cause::SslV2
            } else {
                Cause::NotHandshake { content_type }
            });
        }
        let Some(&major) = rest.get(1) else {
            return Gather::Incomplete;
        };
        if major != 3 {
            return Gather::Refuse(Cause::RecordVersion { major });
        }
        let Some(&[_, _, _, hi, lo]) = rest.first_chunk::<RECORD_HEADER_LEN>() else {
            return Gather::Incomplete;
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len == 0 {
            return Gather::Refuse(Cause::EmptyRecord);
        }
        if len > MAX_RECORD_PAYLOAD {
            return Gather::Refuse(Cause::RecordOverflow { len });
        }
        let record_end = pos + RECORD_HEADER_LEN + len;
        if record_end > max_bytes {
            return Gather::Refuse(Cause::TooLarge { limit: max_bytes });
        }
        records += 1;

        // What has arrived of this record's fragment: enough, perhaps, to
        // complete the handshake header and judge it before the rest comes.
        let seen = &rest[RECORD_HEADER_LEN..rest.len().min(RECORD_HEADER_LEN + len)];
        if total.is_none() {
            for (i, &b) in seen.iter().enumerate() {
                match header.get_mut(gathered + i) {
                    Some(slot) => *slot = b,
                    None => break,
                }
            }
            let header_seen = gathered + seen.len();
            if header_seen >= 1 && header[0] != HANDSHAKE_CLIENT_HELLO {
                return Gather::Refuse(Cause::NotClientHello {
                    handshake_type: header[0],
                });
            }
            if header_seen >= HANDSHAKE_HEADER_LEN {
                let body_len = u32::from_be_bytes([0, header[1], header[2], header[3]]);
                let t = HANDSHAKE_HEADER_LEN + body_len as usize;
                // This record and the header it opens must carry the rest.
                if pos + RECORD_HEADER_LEN + (t - gathered) > max_bytes {
                    return Gather::Refuse(Cause::TooLarge { limit: max_bytes });
                }
                total = Some(t);
            }
        }
        let end = gathered + len;
        if let Some(t) = total {
            if end > t {
                return Gather::Refuse(Cause::TrailingData);
            }
        }

        let Some(fragment) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
            return Gather::Incomplete;
        };
        if total == Some(end) && records == 1 {
            // The common case: the whole hello in one record, read in place.
            return Gather::Message {
                body: &fragment[HANDSHAKE_HEADER_LEN..],
                records,
                consumed: record_end,
            };
        }
        // A hello over several records: put it together in `scratch`.
        let needed = total.unwrap_or(end);
        if scratch.len() < needed {
            return Gather::Refuse(Cause::ScratchTooSmall { needed });
        }
        // `end <= needed <= scratch.len()`, so the range is in bounds.
        scratch[gathered..end].copy_from_slice(fragment);
        if total == Some(end) {
            let scratch: &'a [u8] = scratch;
            return Gather::Message {
                body: &scratch[HANDSHAKE_HEADER_LEN..end],
                records,
                consumed: record_end,
            };
        }
        gathered = end;
        pos = record_end;
    }
}

/// What the `server_name` extension named.
#[derive(Clone, Copy)]
enum Names<'a> {
    None,
    One(&'a str),
    Several,
}

/// Reads a ClientHello body and gives the verdict.
fn judge(body: &[u8], records: usize, consumed: usize) -> Parse<'_> {
    match read_body(body) {
        Err(cause) => Parse::Refuse { cause, hello: None },
        Ok((names, mut hello)) => {
            hello.records = records;
            hello.consumed = consumed;
            if hello.ech {
                return Parse::Refuse {
                    cause: Cause::EncryptedClientHello,
                    hello: Some(hello),
                };
            }
            match names {
                Names::One(sni) => Parse::Accept { sni, hello },
                Names::None => Parse::Refuse {
                    cause: Cause::NoServerName,
                    hello: Some(hello),
                },
                Names::Several => Parse::Refuse {
                    cause: Cause::SeveralServerNames,
                    hello: Some(hello),
                },
            }
        }
    }
}

fn read_body(body: &[u8]) -> Result<(Names<'_>, ClientHello<'_>), Cause> {
    use Field::*;
    let mut r = Cursor(body);
    let legacy_version = r.u16().ok_or(Cause::Malformed(LegacyVersion))?;
    if legacy_version >> 8 != 3 {
        return Err(Cause::Malformed(LegacyVersion));
    }
    r.take(RANDOM_LEN).ok_or(Cause::Malformed(Random))?;
    let session_id = r.vec8().ok_or(Cause::Malformed(SessionId))?;
    if session_id.len() > MAX_SESSION_ID_LEN {
        return Err(Cause::Malformed(SessionId));
    }
    let suites = r.vec16().ok_or(Cause::Malformed(CipherSuites))?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(Cause::Malformed(CipherSuites));
    }
    let compression = r.vec8().ok_or(Cause::Malformed(CompressionMethods))?;
    if compression.is_empty() {
        return Err(Cause::Malformed(CompressionMethods));
    }

    let mut hello = ClientHello {
        server_name: None,
        alpn: &[],
        supported_versions: &[],
        legacy_version,
        ech: false,
        records: 0,
        consumed: 0,
    };
    let mut names = Names::None;
    if r.is_empty() {
        // A hello without extensions (TLS 1.0 style) is legal; it names no one.
        return Ok((names, hello));
    }
    let mut list = Cursor(r.vec16().ok_or(Cause::Malformed(Extensions))?);
    if !r.is_empty() {
        return Err(Cause::TrailingData);
    }
    let mut seen = [0u16; MAX_EXTENSIONS];
    let mut count = 0;
    while !list.is_empty() {
        let ext_type = list.u16().ok_or(Cause::Malformed(Extensions))?;
        let data = list.vec16().ok_or(Cause::Malformed(Extensions))?;
        if count == MAX_EXTENSIONS {
            return Err(Cause::TooManyExtensions);
        }
        if seen[..count].contains(&ext_type) {
            return Err(Cause::DuplicateExtension { ext_type });
        }
        // `count < MAX_EXTENSIONS` here.
        seen[count] = ext_type;
        count += 1;
        match ext_type {
            EXT_SERVER_NAME => names = read_server_name(data)?,
            EXT_ALPN => hello.alpn = read_alpn(data).ok_or(Cause::Malformed(Alpn))?,
            EXT_SUPPORTED_VERSIONS => {
                hello.supported_versions =
                    read_versions(data).ok_or(Cause::Malformed(SupportedVersions))?
            }
            EXT_ENCRYPTED_CLIENT_HELLO => hello.ech = true,
            _ => {}
        }
    }
    if let Names::One(sni) = names {
        hello.server_name = Some(sni);
    }
    Ok((names, hello))
}

/// Reads a `server_name` extension body (RFC 6066 §3).
fn read_server_name(data: &[u8]) -> Result<Names<'_>, Cause> {
    let malformed = Cause::Malformed(Field::ServerName);
    if data.is_empty() {
        // The form a server echoes; from a client it names no one.
        return Ok(Names::None);
    }
    let mut r = Cursor(data);
    let mut list = Cursor(r.vec16().ok_or(malformed)?);
    if !r.is_empty() {
        return Err(malformed);
    }
    let mut host_names = 0;
    let mut first: &[u8] = &[];
    while !list.is_empty() {
        let name_type = list.u8().ok_or(malformed)?;
        // Every name type's data starts with a u16 length (RFC 6066 §3).
        let name = list.vec16().ok_or(malformed)?;
        if name_type != NAME_TYPE_HOST_NAME {
            continue;
        }
        if name.len() > MAX_HOST_NAME_LEN || !name.iter().all(|&b| is_host_name_byte(b)) {
            return Err(Cause::BadServerName);
        }
        if host_names == 0 {
            first = name;
        }
        host_names += 1;
    }
    Ok(match host_names {
        0 => Names::None,
        1 if first.is_empty() => Names::None,
        1 => match std::str::from_utf8(first) {
            Ok(name) => Names::One(name),
            // Unreachable: the bytes are ASCII.
            Err(_) => return Err(Cause::BadServerName),
        },
        _ => Names::Several,
    })
}

/// The host name alphabet: letters, digits, '-', '.', and '_' (which some
/// real names hold although RFC 952 leaves it out).
fn is_host_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')
}

/// Reads an ALPN extension body (RFC 7301 §3.1): the checked list.
fn read_alpn(data: &[u8]) -> Option<&[u8]> {
    let mut r = Cursor(data);
    let list = r.vec16()?;
    if !r.is_empty() || list.is_empty() {
        return None;
    }
    let mut names = Cursor(list);
    while !names.is_empty() {
        if names.vec8()?.is_empty() {
            return None;
        }
    }
    Some(list)
}

/// Reads a `supported_versions` extension body (RFC 8446 §4.2.1).
fn read_versions(data: &[u8]) -> Option<&[u8]> {
    let mut r = Cursor(data);
    let list = r.vec8()?;
    if !r.is_empty() || list.is_empty() || list.len() % 2 != 0 {
        return None;
    }
    Some(list)
}

/// Reads big-endian TLS fields off the front of a slice; `None` when cut short.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        let (pair, rest) = self.0.split_first_chunk::<2>()?;
        self.0 = rest;
        Some(u16::from_be_bytes(*pair))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_name_every_cause() {
        // Exhaustive: a cause added to the enum fails to compile here until
        // it is given an index, and the assertion until it is in EXAMPLES.
        let index = |c: Cause| match c {
            Cause::NotHandshake { .. } => 0,
            Cause::SslV2 => 1,
            Cause::RecordVersion { .. } => 2,
            Cause::InterleavedRecord { .. } => 3,
            Cause::EmptyRecord => 4,
            Cause::RecordOverflow { .. } => 5,
            Cause::NotClientHello { .. } => 6,
            Cause::TooLarge { .. } => 7,
            Cause::ScratchTooSmall { .. } => 8,
            Cause::TrailingData => 9,
            Cause::Malformed(_) => 10,
            Cause::DuplicateExtension { .. } => 11,
            Cause::TooManyExtensions => 12,
            Cause::BadServerName => 13,
            Cause::HelloTimeout => 14,
            Cause::Eof => 15,
            Cause::ReadFailed(_) => 16,
            Cause::NoServerName => 17,
            Cause::SeveralServerNames => 18,
            Cause::EncryptedClientHello => 19,
        };
        let mut seen = [false; Cause::EXAMPLES.len()];
        for c in Cause::EXAMPLES {
            seen[index(c)] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
    }

    /// A minimal hello body with the given extensions block contents.
    fn hello_with_extensions(exts: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(exts);
        let mut msg = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        msg.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1, (msg.len() >> 8) as u8, msg.len() as u8];
        rec.extend_from_slice(&msg);
        rec
    }

    fn sni_ext(name: &[u8]) -> Vec<u8> {
        let mut e = vec![0, 0];
        let entry_len = 3 + name.len();
        e.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        e.extend_from_slice(&(entry_len as u16).to_be_bytes());
        e.push(0);
        e.extend_from_slice(&(name.len() as u16).to_be_bytes());
        e.extend_from_slice(name);
        e
    }

    fn run(input: &[u8]) -> Parse<'_> {
        // Leaked so the result can borrow it; tests only.
        let scratch = Box::leak(vec![0u8; DEFAULT_MAX_HELLO_BYTES].into_boxed_slice());
        parse(input, scratch, &HelloLimits::default())
    }

    #[test]
    fn hello_minimal_accepts_its_name() {
        let bytes = hello_with_extensions(&sni_ext(b"example.test"));
        match run(&bytes) {
            Parse::Accept { sni, hello } => {
                assert_eq!(sni, "example.test");
                assert_eq!(hello.records(), 1);
                assert_eq!(hello.consumed(), bytes.len());
                assert_eq!(hello.alpn().count(), 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hello_empty_input_is_incomplete() {
        assert_eq!(run(&[]), Parse::Incomplete);
    }

    #[test]
    fn hello_plain_text_is_refused_on_its_first_byte() {
        assert_eq!(run(b"G").refusal(), Some(Refusal::NotTls));
    }

    #[test]
    fn hello_causes_map_to_three_refusals() {
        assert_eq!(Cause::Eof.refusal(), Refusal::NotTls);
        assert_eq!(Cause::SeveralServerNames.refusal(), Refusal::NoServerName);
        assert_eq!(
            Cause::EncryptedClientHello.refusal(),
            Refusal::EncryptedClientHello
        );
    }

    #[test]
    fn hello_too_many_extensions_is_refused() {
        let mut exts = Vec::new();
        for t in 0..=MAX_EXTENSIONS as u16 {
            exts.extend_from_slice(&(1000 + t).to_be_bytes());
            exts.extend_from_slice(&[0, 0]);
        }
        let bytes = hello_with_extensions(&exts);
        assert!(matches!(
            run(&bytes),
            Parse::Refuse {
                cause: Cause::TooManyExtensions,
                ..
            }
        ));
    }
}
