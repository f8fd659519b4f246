//! Decoding compressed replies, so that no secret slips past the masker
//! because a destination compressed it.
//!
//! Destinations with attachments are asked for `accept-encoding: identity`;
//! one that compresses anyway (gzip, deflate, br or zstd) has its reply
//! decoded here, chunk by chunk, before masking. An encoding the gateway
//! cannot decode is refused rather than passed on: a reply the masker cannot
//! read might carry a secret.
//!
//! Sans-IO: bytes in, bytes out.
//!
//! # Limits
//!
//! Input is fed in [`FEED`]-byte slices; the output of one input chunk may
//! not exceed [`MAX_EXPANSION`] bytes (a decompression bomb is an error,
//! not an allocation). Decoder state is a few hundred KiB at most (a zstd
//! or brotli window).

use std::io::Write;

use hyper::header::{HeaderMap, CONTENT_ENCODING};

/// Compressed bytes fed to a decoder at once.
pub const FEED: usize = 4 * 1024;
/// The most decoded bytes one reply chunk may become: a ~1000:1 ratio on a
/// 16 KiB chunk, past anything real text or JSON compresses to.
pub const MAX_EXPANSION: usize = 16 * 1024 * 1024;

/// A content coding the gateway can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Deflate,
    Brotli,
    Zstd,
}

/// What a reply's `content-encoding` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyCoding {
    /// No coding (absent or `identity`).
    Identity,
    /// One coding the gateway decodes.
    Coded(Coding),
    /// A coding, or a stack of codings, the gateway cannot decode.
    Unsupported(String),
}

/// Read the reply's `content-encoding`.
pub fn reply_coding(headers: &HeaderMap) -> ReplyCoding {
    let mut codings = Vec::new();
    for v in headers.get_all(CONTENT_ENCODING) {
        let Ok(v) = v.to_str() else {
            return ReplyCoding::Unsupported("non-ASCII".into());
        };
        codings.extend(
            v.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .filter(|c| !c.is_empty() && c != "identity"),
        );
    }
    match codings.as_slice() {
        [] => ReplyCoding::Identity,
        [one] => match one.as_str() {
            "gzip" | "x-gzip" => ReplyCoding::Coded(Coding::Gzip),
            "deflate" => ReplyCoding::Coded(Coding::Deflate),
            "br" => ReplyCoding::Coded(Coding::Brotli),
            "zstd" => ReplyCoding::Coded(Coding::Zstd),
            other => ReplyCoding::Unsupported(other.chars().take(32).collect()),
        },
        _ => ReplyCoding::Unsupported(codings.join(",").chars().take(64).collect()),
    }
}

/// A decoding failure (corrupt data, or a bomb).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the reply's {coding:?} data is corrupt: {reason}")]
    Corrupt { coding: Coding, reason: String },
    #[error("one reply chunk decoded to more than {MAX_EXPANSION} bytes")]
    Bomb,
}

enum Inner {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    /// HTTP's "deflate" is zlib-wrapped, but some servers send raw deflate:
    /// which one is decided on the first byte.
    DeflateUndecided,
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
    RawDeflate(flate2::write::DeflateDecoder<Vec<u8>>),
    Brotli(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

/// A streaming decoder for one reply body.
pub struct Decoder {
    coding: Coding,
    inner: Inner,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Decoder({:?})", self.coding)
    }
}

impl Decoder {
    /// A decoder for `coding`.
    pub fn new(coding: Coding) -> Result<Decoder, DecodeError> {
        let inner = match coding {
            Coding::Gzip => Inner::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
            Coding::Deflate => Inner::DeflateUndecided,
            Coding::Brotli => {
                Inner::Brotli(Box::new(brotli::DecompressorWriter::new(Vec::new(), FEED)))
            }
            Coding::Zstd => {
                Inner::Zstd(zstd::stream::write::Decoder::new(Vec::new()).map_err(|e| {
                    DecodeError::Corrupt {
                        coding,
                        reason: e.to_string(),
                    }
                })?)
            }
        };
        Ok(Decoder { coding, inner })
    }

    /// Decode `input`, appending the decoded bytes to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let start = out.len();
        for slice in input.chunks(FEED) {
            self.write(slice)?;
            self.drain(out);
            if out.len() - start > MAX_EXPANSION {
                return Err(DecodeError::Bomb);
            }
        }
        Ok(())
    }

    /// End of the body: flush what the decoder still holds into `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let coding = self.coding;
        let corrupt = |e: std::io::Error| DecodeError::Corrupt {
            coding,
            reason: e.to_string(),
        };
        match &mut self.inner {
            Inner::Gzip(d) => d.try_finish().map_err(corrupt)?,
            Inner::DeflateUndecided => {}
            Inner::Zlib(d) => d.try_finish().map_err(corrupt)?,
            Inner::RawDeflate(d) => d.try_finish().map_err(corrupt)?,
            Inner::Brotli(d) => d.flush().map_err(corrupt)?,
            Inner::Zstd(d) => d.flush().map_err(corrupt)?,
        }
        self.drain(out);
        Ok(())
    }

    fn write(&mut self, slice: &[u8]) -> Result<(), DecodeError> {
        let coding = self.coding;
        if let Inner::DeflateUndecided = self.inner {
            let Some(&first) = slice.first() else {
                return Ok(());
            };
            // A zlib header: compression method 8 in the low nibble, window
            // at most 32 KiB, and a header checksum (checked by the decoder).
            self.inner = if first & 0x0f == 8 && first >> 4 <= 7 {
                Inner::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))
            } else {
                Inner::RawDeflate(flate2::write::DeflateDecoder::new(Vec::new()))
            };
        }
        let result = match &mut self.inner {
            Inner::Gzip(d) => d.write_all(slice),
            Inner::DeflateUndecided => Ok(()),
            Inner::Zlib(d) => d.write_all(slice),
            Inner::RawDeflate(d) => d.write_all(slice),
            Inner::Brotli(d) => d.write_all(slice),
            Inner::Zstd(d) => d.write_all(slice),
        };
        result.map_err(|e| DecodeError::Corrupt {
            coding,
            reason: e.to_string(),
        })
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        let buf = match &mut self.inner {
            Inner::Gzip(d) => d.get_mut(),
            Inner::DeflateUndecided => return,
            Inner::Zlib(d) => d.get_mut(),
            Inner::RawDeflate(d) => d.get_mut(),
            Inner::Brotli(d) => d.get_mut(),
            Inner::Zstd(d) => d.get_mut(),
        };
        out.append(buf);
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

    #[test]
    fn every_coding_decodes_at_every_chunking() {
        let data = text();
        for coding in [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd] {
            let encoded = encode(coding, &data);
            for chunk in [1, 7, 100, 4096, 65536, encoded.len()] {
                let mut d = Decoder::new(coding).unwrap();
                let mut out = Vec::new();
                for c in encoded.chunks(chunk) {
                    d.push(c, &mut out).unwrap();
                }
                d.finish(&mut out).unwrap();
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
        let mut d = Decoder::new(Coding::Deflate).unwrap();
        let mut out = Vec::new();
        d.push(&encoded, &mut out).unwrap();
        d.finish(&mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn corrupt_data_and_bombs_are_errors() {
        let mut d = Decoder::new(Coding::Gzip).unwrap();
        assert!(d
            .push(b"definitely not gzip data", &mut Vec::new())
            .is_err());
        let zeros = vec![0u8; 64 * 1024 * 1024];
        let bomb = encode(Coding::Gzip, &zeros);
        assert!(bomb.len() < 128 * 1024, "{}", bomb.len());
        let mut d = Decoder::new(Coding::Gzip).unwrap();
        assert!(matches!(
            d.push(&bomb, &mut Vec::new()),
            Err(DecodeError::Bomb)
        ));
    }

    #[test]
    fn content_encoding_is_read_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(reply_coding(&h), ReplyCoding::Identity);
        for (v, want) in [
            ("gzip", ReplyCoding::Coded(Coding::Gzip)),
            ("GZIP", ReplyCoding::Coded(Coding::Gzip)),
            ("identity", ReplyCoding::Identity),
            ("br", ReplyCoding::Coded(Coding::Brotli)),
            ("zstd", ReplyCoding::Coded(Coding::Zstd)),
            ("deflate", ReplyCoding::Coded(Coding::Deflate)),
            ("compress", ReplyCoding::Unsupported("compress".into())),
            ("gzip, br", ReplyCoding::Unsupported("gzip,br".into())),
        ] {
            h.insert(CONTENT_ENCODING, HeaderValue::from_static(v));
            assert_eq!(reply_coding(&h), want, "{v}");
        }
    }
}
