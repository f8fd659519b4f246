//! What a reply's codings are, whether the gateway can read it, and
//! decoding it, so that no secret slips past the masker because a
//! destination coded it.
//!
//! Destinations with attachments are asked for `accept-encoding: identity`
//! and told nothing of gRPC compression; one that codes its reply anyway is
//! read here. [`plan`] decides, on the reply's head **as the destination
//! sent it** (before hop-by-hop headers are removed: a `Content-Encoding`
//! that the reply's own `Connection` header names still coded the body),
//! what the filter does with the body:
//!
//! - one content coding (gzip, deflate, br, zstd) or one transfer coding
//!   other than `chunked` (gzip, deflate; hyper removes only `chunked`) is
//!   decoded, chunk by chunk, before masking ([`Decoder`]);
//! - no coding: the body is masked as it comes;
//! - a gRPC or gRPC-Web reply has each message's flag byte read
//!   ([`GrpcFrames`]): a message compressed per message is refused whether
//!   or not `grpc-encoding` says so;
//! - refused ([`ReplyRefusal`], recorded as the cause of `upstream_failed`):
//!   a coding the gateway cannot decode, a stack of codings, a
//!   `grpc-encoding` other than `identity`, gRPC-Web's text form (base64
//!   of frames whose flags the gateway does not read), and a partial reply
//!   (`206`: the pieces of a representation, which the session must not
//!   choose; `Range` is removed from its requests, so a `206` is the
//!   destination's doing).
//!
//! Sans-IO: bytes in, bytes out.
//!
//! # Limits
//!
//! A reply's decoding is bounded per reply, not per chunk ([`Bounds`]): at
//! most `max_bytes` decoded bytes in all, and, once past [`RATIO_FLOOR`],
//! at most `max_ratio` decoded bytes per encoded byte read so far. Past
//! either the reply is cut (`decoded_too_large`, `decoded_ratio`): a few
//! MB of gzip that would decode to gigabytes costs at most `max_bytes` of
//! one core's time. Input is fed in [`FEED`]-byte slices, and no slice may
//! decode to more than [`SLICE_MAX`] bytes (the decoders write into a sink
//! that refuses past its room), so a reply being decoded holds at most
//! [`SLICE_MAX`] decoded bytes at once, plus the decoder's window (a few
//! hundred KiB at most for zstd or brotli).

use std::io::Write;

use hyper::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE, TRANSFER_ENCODING};

use crate::refusal::causes;

/// Compressed bytes fed to a decoder at once.
pub const FEED: usize = 4 * 1024;
/// The most decoded bytes one [`FEED`] slice may become: 2,048 times the
/// slice, past the 1,032:1 that deflate can reach at all, so only zstd and
/// brotli bombs meet it. It bounds the memory of a reply being decoded.
pub const SLICE_MAX: usize = 2048 * FEED;
/// Decoded bytes a reply may reach before its ratio is checked: a small
/// reply of repeated bytes compresses far beyond any ratio a large one
/// keeps, and costs nothing.
pub const RATIO_FLOOR: u64 = 1024 * 1024;

/// How far one reply may be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The most decoded bytes of one reply.
    pub max_bytes: u64,
    /// The most decoded bytes per encoded byte, once past [`RATIO_FLOOR`].
    pub max_ratio: u64,
}

impl Default for Bounds {
    /// 1 GiB and 100:1: text and JSON compress 3:1 to 20:1, and what
    /// compresses further (logs, sparse data) stays well under 100:1 over a
    /// whole reply; 1 GiB of gzip takes a core about two seconds.
    fn default() -> Bounds {
        Bounds {
            max_bytes: 1 << 30,
            max_ratio: 100,
        }
    }
}

/// A coding the gateway can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

causes! {
    /// Why a reply cannot be passed on: recorded as the cause of
    /// `upstream_failed`. Those found on the head refuse the request;
    /// those found in the body cut the reply where it stands.
    pub enum ReplyRefusal {
        /// A content coding the gateway cannot decode.
        UnsupportedCoding => "unsupported_content_encoding",
        /// A transfer coding other than `chunked` that the gateway cannot decode.
        UnsupportedTransferCoding => "unsupported_transfer_encoding",
        /// More than one coding (content and transfer codings together).
        StackedCodings => "stacked_codings",
        /// `grpc-encoding` other than `identity`: gRPC messages compressed.
        CompressedGrpc => "compressed_grpc_reply",
        /// A gRPC message with its compressed flag (or an unknown flag) set.
        CompressedGrpcMessage => "compressed_grpc_message",
        /// gRPC-Web's text form: base64 of frames.
        GrpcWebText => "grpc_web_text_reply",
        /// A `206` partial reply.
        PartialReply => "partial_reply",
        /// The reply decoded past `max_bytes`.
        DecodedTooLarge => "decoded_too_large",
        /// The reply decoded past `max_ratio` (or one slice past [`SLICE_MAX`]).
        DecodedRatio => "decoded_ratio",
        /// The coded data is corrupt.
        CorruptCoding => "corrupt_coding",
    }
}

/// How a reply's body is framed for gRPC, when it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcKind {
    /// `application/grpc[+…]`.
    Grpc,
    /// `application/grpc-web[+…]`: the same frames, and a trailer frame.
    GrpcWeb,
    /// `application/grpc-web-text[+…]`: base64 of gRPC-Web frames.
    GrpcWebText,
}

/// What a `content-type` value says of gRPC (letter case and parameters
/// ignored).
pub fn grpc_kind(content_type: &[u8]) -> Option<GrpcKind> {
    let ct = content_type.trim_ascii_start();
    let after = |prefix: &[u8]| {
        ct.len() >= prefix.len()
            && ct[..prefix.len()].eq_ignore_ascii_case(prefix)
            && matches!(
                ct.get(prefix.len()),
                None | Some(b'+' | b';' | b' ' | b'\t')
            )
    };
    if after(b"application/grpc-web-text") {
        Some(GrpcKind::GrpcWebText)
    } else if after(b"application/grpc-web") {
        Some(GrpcKind::GrpcWeb)
    } else if after(b"application/grpc") {
        Some(GrpcKind::Grpc)
    } else {
        None
    }
}

/// What the filter does with a reply's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The one coding to decode first, if any.
    pub decode: Option<Coding>,
    /// gRPC framing whose message flags are read, if any.
    pub grpc: Option<GrpcKind>,
}

/// The codings listed in every value of `name`, lower case, without
/// `identity` and (for transfer codings) `chunked`; `Err` if a value is not
/// text.
fn codings(headers: &HeaderMap, name: hyper::header::HeaderName) -> Result<Vec<String>, ()> {
    let mut out = Vec::new();
    for v in headers.get_all(&name) {
        let v = v.to_str().map_err(|_| ())?;
        for c in v.split(',') {
            let c = c.trim().to_ascii_lowercase();
            if !matches!(c.as_str(), "" | "identity" | "chunked") {
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// Decide, on a reply's head as the destination sent it, what is done with
/// its body (see the [module docs](self)). For replies from a destination
/// that received an attachment.
pub fn plan(status: u16, headers: &HeaderMap) -> Result<Plan, ReplyRefusal> {
    if status == 206 {
        return Err(ReplyRefusal::PartialReply);
    }
    let transfer = codings(headers, TRANSFER_ENCODING)
        .map_err(|()| ReplyRefusal::UnsupportedTransferCoding)?;
    let content =
        codings(headers, CONTENT_ENCODING).map_err(|()| ReplyRefusal::UnsupportedCoding)?;
    let decode = match (transfer.as_slice(), content.as_slice()) {
        ([], []) => None,
        ([one], []) => Some(match one.as_str() {
            "gzip" | "x-gzip" => Coding::Gzip,
            "deflate" => Coding::Deflate,
            _ => return Err(ReplyRefusal::UnsupportedTransferCoding),
        }),
        ([], [one]) => Some(match one.as_str() {
            "gzip" | "x-gzip" => Coding::Gzip,
            "deflate" => Coding::Deflate,
            "br" => Coding::Brotli,
            "zstd" => Coding::Zstd,
            _ => return Err(ReplyRefusal::UnsupportedCoding),
        }),
        _ => return Err(ReplyRefusal::StackedCodings),
    };
    if headers
        .get_all("grpc-encoding")
        .iter()
        .any(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"))
    {
        return Err(ReplyRefusal::CompressedGrpc);
    }
    // The strictest reading of several content types.
    let mut grpc = None;
    for v in headers.get_all(CONTENT_TYPE) {
        match grpc_kind(v.as_bytes()) {
            Some(GrpcKind::GrpcWebText) => return Err(ReplyRefusal::GrpcWebText),
            Some(kind) if grpc != Some(GrpcKind::GrpcWeb) => grpc = Some(kind),
            _ => {}
        }
    }
    Ok(Plan { decode, grpc })
}

/// Reads the flag byte of every gRPC (or gRPC-Web) message in a body as it
/// streams: 5-byte prefixes (flag, 32-bit length) and the message bytes
/// they announce, across chunks. Sans-IO, and it keeps 5 bytes at most.
#[derive(Clone, Debug)]
pub struct GrpcFrames {
    web: bool,
    /// Prefix bytes of the next message read so far (0 to 4).
    prefix: [u8; 5],
    have: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
}

impl GrpcFrames {
    pub fn new(kind: GrpcKind) -> GrpcFrames {
        GrpcFrames {
            web: kind == GrpcKind::GrpcWeb,
            prefix: [0; 5],
            have: 0,
            remaining: 0,
        }
    }

    /// Read the next body bytes: an error at the first message whose flag
    /// is not 0 (or, in gRPC-Web, `0x80`: an uncompressed trailer frame).
    pub fn read(&mut self, mut data: &[u8]) -> Result<(), ReplyRefusal> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let skip = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                data = &data[skip..];
                self.remaining -= skip as u64;
                continue;
            }
            let take = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data = &data[take..];
            if self.have == 5 {
                let flag = self.prefix[0];
                if !(flag == 0 || (self.web && flag == 0x80)) {
                    return Err(ReplyRefusal::CompressedGrpcMessage);
                }
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.remaining = u64::from(len);
                self.have = 0;
            }
        }
        Ok(())
    }
}

/// A decoding failure: corrupt data, or past a bound.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the reply's {coding:?} data is corrupt: {reason}")]
    Corrupt { coding: Coding, reason: String },
    #[error("the reply decoded to more than its bound of {0} bytes")]
    TooLarge(u64),
    #[error("the reply decoded past its bound of {0} bytes per encoded byte")]
    Ratio(u64),
}

impl DecodeError {
    /// The cause it is recorded under.
    pub fn refusal(&self) -> ReplyRefusal {
        match self {
            DecodeError::Corrupt { .. } => ReplyRefusal::CorruptCoding,
            DecodeError::TooLarge(_) => ReplyRefusal::DecodedTooLarge,
            DecodeError::Ratio(_) => ReplyRefusal::DecodedRatio,
        }
    }
}

/// Which bound a slice's room came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binding {
    Size,
    Ratio,
}

/// Where a decoder writes: refuses to grow past `room`, so a bomb is an
/// error at the bound, not an allocation.
struct Sink {
    buf: Vec<u8>,
    room: usize,
    /// Set when a write was refused.
    full: bool,
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if data.len() > self.room {
            self.full = true;
            return Err(std::io::Error::other("past the reply's decoding bound"));
        }
        self.room -= data.len();
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn new() -> Sink {
        Sink {
            buf: Vec::new(),
            room: 0,
            full: false,
        }
    }
}

enum Inner {
    Gzip(flate2::write::MultiGzDecoder<Sink>),
    /// HTTP's "deflate" is zlib-wrapped, but some servers send raw deflate:
    /// which one is decided on the first byte.
    DeflateUndecided,
    Zlib(flate2::write::ZlibDecoder<Sink>),
    RawDeflate(flate2::write::DeflateDecoder<Sink>),
    Brotli(Box<brotli::DecompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Decoder<'static, Sink>),
}

/// A streaming decoder for one reply body, bounded per reply.
pub struct Decoder {
    coding: Coding,
    inner: Inner,
    bounds: Bounds,
    /// Encoded bytes fed so far.
    read: u64,
    /// Decoded bytes given out so far.
    decoded: u64,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("coding", &self.coding)
            .field("read", &self.read)
            .field("decoded", &self.decoded)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for `coding`, within `bounds`.
    pub fn new(coding: Coding, bounds: Bounds) -> Result<Decoder, DecodeError> {
        let inner = match coding {
            Coding::Gzip => Inner::Gzip(flate2::write::MultiGzDecoder::new(Sink::new())),
            Coding::Deflate => Inner::DeflateUndecided,
            Coding::Brotli => {
                Inner::Brotli(Box::new(brotli::DecompressorWriter::new(Sink::new(), FEED)))
            }
            Coding::Zstd => {
                Inner::Zstd(zstd::stream::write::Decoder::new(Sink::new()).map_err(|e| {
                    DecodeError::Corrupt {
                        coding,
                        reason: e.to_string(),
                    }
                })?)
            }
        };
        Ok(Decoder {
            coding,
            inner,
            bounds,
            read: 0,
            decoded: 0,
        })
    }

    /// Decoded bytes given out so far.
    pub fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Decode `input`, appending the decoded bytes to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        for slice in input.chunks(FEED) {
            self.read += slice.len() as u64;
            let binding = self.open_room();
            let written = self.write(slice);
            self.drain(out);
            written.map_err(|e| self.error(e, binding))?;
        }
        Ok(())
    }

    /// End of the body: flush what the decoder still holds into `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let binding = self.open_room();
        let result = match &mut self.inner {
            Inner::Gzip(d) => d.try_finish(),
            Inner::DeflateUndecided => Ok(()),
            Inner::Zlib(d) => d.try_finish(),
            Inner::RawDeflate(d) => d.try_finish(),
            Inner::Brotli(d) => d.flush(),
            Inner::Zstd(d) => d.flush(),
        };
        self.drain(out);
        result.map_err(|e| self.error(e, binding))
    }

    /// Give the sink the room the bounds leave for the next step; says
    /// which bound set it.
    fn open_room(&mut self) -> Binding {
        let by_size = self.bounds.max_bytes.saturating_sub(self.decoded);
        let by_ratio = self
            .read
            .saturating_mul(self.bounds.max_ratio)
            .max(RATIO_FLOOR)
            .saturating_sub(self.decoded);
        let (room, binding) = if by_size <= by_ratio {
            (by_size, Binding::Size)
        } else {
            (by_ratio, Binding::Ratio)
        };
        let (room, binding) = if room > SLICE_MAX as u64 {
            (SLICE_MAX, Binding::Ratio)
        } else {
            (usize::try_from(room).unwrap_or(SLICE_MAX), binding)
        };
        if let Some(sink) = self.sink() {
            sink.room = room;
        }
        binding
    }

    fn error(&mut self, e: std::io::Error, binding: Binding) -> DecodeError {
        let full = self.sink().is_some_and(|s| s.full);
        match (full, binding) {
            (true, Binding::Size) => DecodeError::TooLarge(self.bounds.max_bytes),
            (true, Binding::Ratio) => DecodeError::Ratio(self.bounds.max_ratio),
            (false, _) => DecodeError::Corrupt {
                coding: self.coding,
                reason: e.to_string(),
            },
        }
    }

    fn write(&mut self, slice: &[u8]) -> std::io::Result<()> {
        if let Inner::DeflateUndecided = self.inner {
            let Some(&first) = slice.first() else {
                return Ok(());
            };
            // A zlib header: compression method 8 in the low nibble, window
            // at most 32 KiB, and a header checksum (checked by the decoder).
            self.inner = if first & 0x0f == 8 && first >> 4 <= 7 {
                Inner::Zlib(flate2::write::ZlibDecoder::new(Sink::new()))
            } else {
                Inner::RawDeflate(flate2::write::DeflateDecoder::new(Sink::new()))
            };
            self.open_room();
        }
        match &mut self.inner {
            Inner::Gzip(d) => d.write_all(slice),
            Inner::DeflateUndecided => Ok(()),
            Inner::Zlib(d) => d.write_all(slice),
            Inner::RawDeflate(d) => d.write_all(slice),
            Inner::Brotli(d) => d.write_all(slice),
            Inner::Zstd(d) => d.write_all(slice),
        }
    }

    fn sink(&mut self) -> Option<&mut Sink> {
        Some(match &mut self.inner {
            Inner::Gzip(d) => d.get_mut(),
            Inner::DeflateUndecided => return None,
            Inner::Zlib(d) => d.get_mut(),
            Inner::RawDeflate(d) => d.get_mut(),
            Inner::Brotli(d) => d.get_mut(),
            Inner::Zstd(d) => d.get_mut(),
        })
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        if let Some(sink) = self.sink() {
            let n = sink.buf.len() as u64;
            out.append(&mut sink.buf);
            self.decoded += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn text() -> Vec<u8> {
        (0..200_000u32)
            .map(|i| b"the quick brown fox jumps over the lazy dog "[(i % 44) as usize])
            .collect()
    }

    fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
        match coding {
            Coding::Gzip => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Deflate => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Coding::Brotli => {
                let mut out = Vec::new();
                {
                    let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                    e.write_all(data).unwrap();
                }
                out
            }
            Coding::Zstd => zstd::stream::encode_all(data, 3).unwrap(),
        }
    }

    const ALL: [Coding; 4] = [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd];

    fn decode_all(
        coding: Coding,
        bounds: Bounds,
        data: &[u8],
        chunk: usize,
    ) -> Result<Vec<u8>, DecodeError> {
        let mut d = Decoder::new(coding, bounds).unwrap();
        let mut out = Vec::new();
        for c in data.chunks(chunk.max(1)) {
            d.push(c, &mut out)?;
            assert!(out.len() as u64 <= bounds.max_bytes);
        }
        d.finish(&mut out)?;
        assert_eq!(d.decoded(), out.len() as u64);
        Ok(out)
    }

    #[test]
    fn every_coding_decodes_at_every_chunking() {
        let data = text();
        for coding in ALL {
            let encoded = encode(coding, &data);
            for chunk in [1, 7, 100, 4096, 65536, encoded.len()] {
                let out = decode_all(coding, Bounds::default(), &encoded, chunk).unwrap();
                assert_eq!(out, data, "{coding:?} in chunks of {chunk}");
            }
        }
    }

    #[test]
    fn raw_deflate_is_accepted_too() {
        let data = text();
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&data).unwrap();
        let encoded = e.finish().unwrap();
        let out = decode_all(Coding::Deflate, Bounds::default(), &encoded, encoded.len()).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn corrupt_data_is_an_error() {
        for coding in ALL {
            let got = decode_all(
                coding,
                Bounds::default(),
                b"definitely not coded data at all",
                5,
            );
            assert!(
                matches!(got, Err(DecodeError::Corrupt { .. })),
                "{coding:?}: {got:?}"
            );
        }
    }

    /// A bomb is cut at the bound of the whole reply, whatever the
    /// chunking: by ratio, or by size when the ratio allows it, and the
    /// decoded output never passes the bound on the way.
    #[test]
    fn bombs_are_cut_at_the_reply_bound() {
        let zeros = vec![0u8; 64 * 1024 * 1024];
        for coding in ALL {
            let bomb = encode(coding, &zeros);
            assert!(bomb.len() < 256 * 1024, "{coding:?}: {}", bomb.len());
            for chunk in [512, 16 * 1024, bomb.len()] {
                let by_ratio = decode_all(coding, Bounds::default(), &bomb, chunk);
                assert!(
                    matches!(by_ratio, Err(DecodeError::Ratio(100))),
                    "{coding:?} {chunk}: {by_ratio:?}"
                );
                let bounds = Bounds {
                    max_bytes: 8 * 1024 * 1024,
                    max_ratio: 1 << 20,
                };
                let by_size = decode_all(coding, bounds, &bomb, chunk);
                assert!(
                    matches!(by_size, Err(DecodeError::TooLarge(_))),
                    "{coding:?} {chunk}: {by_size:?}"
                );
            }
        }
        // The same reply, within a ratio that allows it, decodes whole.
        let bomb = encode(Coding::Gzip, &zeros[..16 * 1024 * 1024]);
        let bounds = Bounds {
            max_bytes: 1 << 30,
            max_ratio: 2000,
        };
        assert_eq!(
            decode_all(Coding::Gzip, bounds, &bomb, 16 * 1024)
                .unwrap()
                .len(),
            16 << 20
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn plans_read_the_head_as_sent() {
        use ReplyRefusal::*;
        let plain = Plan {
            decode: None,
            grpc: None,
        };
        let decode = |c| {
            Ok(Plan {
                decode: Some(c),
                grpc: None,
            })
        };
        for (status, pairs, want) in [
            (200, &[][..], Ok(plain)),
            (200, &[("content-encoding", "identity")], Ok(plain)),
            (200, &[("content-encoding", "gzip")], decode(Coding::Gzip)),
            (200, &[("content-encoding", "GZIP")], decode(Coding::Gzip)),
            (200, &[("content-encoding", "br")], decode(Coding::Brotli)),
            (200, &[("content-encoding", "zstd")], decode(Coding::Zstd)),
            (
                200,
                &[("content-encoding", "deflate")],
                decode(Coding::Deflate),
            ),
            (
                200,
                &[("content-encoding", "compress")],
                Err(UnsupportedCoding),
            ),
            (
                200,
                &[("content-encoding", "gzip, br")],
                Err(StackedCodings),
            ),
            (
                200,
                &[("content-encoding", "gzip"), ("content-encoding", "gzip")],
                Err(StackedCodings),
            ),
            // Named by Connection: still the body's coding.
            (
                200,
                &[
                    ("connection", "content-encoding"),
                    ("content-encoding", "gzip"),
                ],
                decode(Coding::Gzip),
            ),
            (200, &[("transfer-encoding", "chunked")], Ok(plain)),
            (
                200,
                &[("transfer-encoding", "gzip, chunked")],
                decode(Coding::Gzip),
            ),
            (200, &[("transfer-encoding", "gzip")], decode(Coding::Gzip)),
            (
                200,
                &[("transfer-encoding", "br, chunked")],
                Err(UnsupportedTransferCoding),
            ),
            (
                200,
                &[("transfer-encoding", "compress")],
                Err(UnsupportedTransferCoding),
            ),
            (
                200,
                &[
                    ("transfer-encoding", "gzip, chunked"),
                    ("content-encoding", "gzip"),
                ],
                Err(StackedCodings),
            ),
            (206, &[], Err(PartialReply)),
            (
                200,
                &[("content-type", "application/grpc")],
                Ok(Plan {
                    decode: None,
                    grpc: Some(GrpcKind::Grpc),
                }),
            ),
            (
                200,
                &[("content-type", "Application/GRPC+proto")],
                Ok(Plan {
                    decode: None,
                    grpc: Some(GrpcKind::Grpc),
                }),
            ),
            (
                200,
                &[("content-type", "application/grpc-web+proto")],
                Ok(Plan {
                    decode: None,
                    grpc: Some(GrpcKind::GrpcWeb),
                }),
            ),
            (
                200,
                &[("content-type", "application/grpc-web-text")],
                Err(GrpcWebText),
            ),
            (200, &[("content-type", "application/grpcx")], Ok(plain)),
            (
                200,
                &[
                    ("content-type", "application/grpc"),
                    ("grpc-encoding", "gzip"),
                ],
                Err(CompressedGrpc),
            ),
            (200, &[("grpc-encoding", "identity")], Ok(plain)),
            (
                200,
                &[("connection", "grpc-encoding"), ("grpc-encoding", "gzip")],
                Err(CompressedGrpc),
            ),
        ] {
            assert_eq!(plan(status, &headers(pairs)), want, "{status} {pairs:?}");
        }
    }

    #[test]
    fn grpc_flags_are_read_across_chunks() {
        let message = |flag: u8, body: &[u8]| {
            let mut m = vec![flag];
            m.extend_from_slice(&(body.len() as u32).to_be_bytes());
            m.extend_from_slice(body);
            m
        };
        let fine = [message(0, b"hello"), message(0, b""), message(0, &[1; 300])].concat();
        let bad = [fine.clone(), message(1, b"x\x1f\x8b")].concat();
        let web_trailer = [fine.clone(), message(0x80, b"grpc-status: 0\r\n")].concat();
        for step in [1, 2, 5, 6, 7, 300, 10_000] {
            let read = |kind, data: &[u8]| {
                let mut f = GrpcFrames::new(kind);
                data.chunks(step).try_for_each(|c| f.read(c))
            };
            assert_eq!(read(GrpcKind::Grpc, &fine), Ok(()));
            assert_eq!(
                read(GrpcKind::Grpc, &bad),
                Err(ReplyRefusal::CompressedGrpcMessage)
            );
            assert_eq!(
                read(GrpcKind::GrpcWeb, &bad),
                Err(ReplyRefusal::CompressedGrpcMessage)
            );
            assert_eq!(read(GrpcKind::GrpcWeb, &web_trailer), Ok(()));
            assert_eq!(
                read(GrpcKind::Grpc, &web_trailer),
                Err(ReplyRefusal::CompressedGrpcMessage)
            );
        }
    }
}
