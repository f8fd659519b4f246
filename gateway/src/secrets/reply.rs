//! The destination's reply on its way to the session: masked.
//!
//! For a session with attachments, every reply — from any destination —
//! has each header value, each body chunk (HTTP/1.1 chunked or sized,
//! HTTP/2 DATA) and each trailer run through the session's [`Masker`]; a
//! reply from a destination that received an attachment is also decoded
//! first when it came compressed (the request asked for `identity`), and
//! its framing headers fixed. A session without attachments has its replies
//! passed as they are.
//!
//! Masked bytes keep their length, so `content-length` stays true unless
//! the body was decoded, in which case it is removed and each side frames
//! the body for itself.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};

use crate::secrets::decode::{self, Decoder, ReplyCoding};
use crate::secrets::mask::{MaskSet, Masker};

/// Where a masked reply reports what it masked: once, when its body ends
/// or is dropped, whichever comes first. The connection holds the other
/// end (see `http::connection`), so the handle is also how it learns that
/// every reply of it has reported.
pub trait MaskedReport: Send + Sync + 'static {
    /// Occurrences masked, per secret name (zeros included).
    fn masked(&self, counts: &mut dyn Iterator<Item = (&str, u64)>);
}

/// Why a reply cannot be passed on: a fixed cause word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyRefusal {
    /// A content coding the gateway cannot decode, from a destination
    /// holding an attachment.
    UnsupportedCoding,
    /// A gRPC reply compressed per message (`grpc-encoding`), from a
    /// destination holding an attachment: the gateway cannot read inside.
    CompressedGrpc,
}

impl ReplyRefusal {
    /// Every refusal of a reply.
    pub const ALL: &'static [ReplyRefusal] = &[
        ReplyRefusal::UnsupportedCoding,
        ReplyRefusal::CompressedGrpc,
    ];

    /// The cause recorded with `upstream_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyRefusal::UnsupportedCoding => "unsupported_content_encoding",
            ReplyRefusal::CompressedGrpc => "compressed_grpc_reply",
        }
    }
}

/// Mask every header value of `headers` in place; returns how many values
/// changed.
pub fn mask_headers(masker: &mut Masker, headers: &mut HeaderMap) -> usize {
    let mut changed = 0;
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        if masker.mask_all(&mut bytes) > 0 {
            // Asterisks are valid header bytes; the rest were already valid.
            if let Ok(mut masked) = HeaderValue::from_bytes(&bytes) {
                masked.set_sensitive(value.is_sensitive());
                *value = masked;
                changed += 1;
            }
        }
        zeroize::Zeroize::zeroize(&mut bytes);
    }
    changed
}

/// Prepare a reply for the session: mask its headers, decide whether its
/// body is decoded, and wrap the body.
///
/// `set` is the session's mask set (none: the reply passes untouched);
/// `attached` says whether this destination received an attachment.
pub fn filter(
    headers: &mut HeaderMap,
    body: Incoming,
    set: Option<&Arc<MaskSet>>,
    attached: bool,
    report: Arc<dyn MaskedReport>,
) -> Result<ReplyBody, ReplyRefusal> {
    let Some(set) = set else {
        return Ok(ReplyBody::plain(body));
    };
    let mut decoder = None;
    if attached {
        if headers
            .get("grpc-encoding")
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Err(ReplyRefusal::CompressedGrpc);
        }
        match decode::reply_coding(headers) {
            ReplyCoding::Identity => {}
            ReplyCoding::Coded(coding) => {
                decoder = Some(Decoder::new(coding).map_err(|_| ReplyRefusal::UnsupportedCoding)?);
                headers.remove(header::CONTENT_ENCODING);
                headers.remove(header::CONTENT_LENGTH);
                // Validators and digests were of the encoded bytes.
                headers.remove(header::ETAG);
                headers.remove("content-md5");
                headers.remove("content-digest");
                headers.remove("repr-digest");
            }
            ReplyCoding::Unsupported(_) => return Err(ReplyRefusal::UnsupportedCoding),
        }
    }
    let mut masker = Masker::new(Arc::clone(set));
    mask_headers(&mut masker, headers);
    Ok(ReplyBody {
        inner: body,
        filter: Some(Box::new(Filter {
            masker,
            decoder,
            ready: VecDeque::new(),
            trailers: None,
            done: false,
            report,
        })),
    })
}

/// A reply body on its way to the session.
#[derive(Debug)]
pub struct ReplyBody {
    inner: Incoming,
    /// None: passed as it is.
    filter: Option<Box<Filter>>,
}

struct Filter {
    masker: Masker,
    decoder: Option<Decoder>,
    /// Masked body pieces not yet passed on: a chunk may come out as two
    /// (the bytes held from before it, then the chunk itself, uncopied).
    ready: VecDeque<Bytes>,
    /// Trailers that wait until the held body bytes are out.
    trailers: Option<HeaderMap>,
    done: bool,
    report: Arc<dyn MaskedReport>,
}

impl fmt::Debug for Filter {
    /// Sizes only: no body bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filter")
            .field("masker", &self.masker)
            .field("decoder", &self.decoder)
            .field("ready_pieces", &self.ready.len())
            .field("trailers", &self.trailers.is_some())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl ReplyBody {
    fn plain(inner: Incoming) -> ReplyBody {
        ReplyBody {
            inner,
            filter: None,
        }
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // Counted when the reply ends, whether it ended well or not.
        self.report.masked(&mut self.masker.counts());
    }
}

/// A reply body failure, for hyper (it resets the stream).
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("the destination's reply failed: {0}")]
    Upstream(#[from] hyper::Error),
    #[error("the reply cannot be decoded: {0}")]
    Decode(#[from] decode::DecodeError),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = ReplyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReplyError>>> {
        let this = &mut *self;
        let Some(f) = this.filter.as_deref_mut() else {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map_err(ReplyError::Upstream);
        };
        loop {
            if let Some(out) = f.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            if let Some(t) = f.trailers.take() {
                f.done = true;
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            if f.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    f.done = true;
                    f.flush()?;
                    continue;
                }
            };
            match frame.into_data() {
                Ok(data) => f.data(data)?,
                Err(frame) => {
                    if let Ok(mut trailers) = frame.into_trailers() {
                        mask_headers(&mut f.masker, &mut trailers);
                        f.trailers = Some(trailers);
                        f.flush()?;
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.filter {
            None => self.inner.is_end_stream(),
            Some(f) => f.done && f.ready.is_empty() && f.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.filter {
            // Masking keeps lengths; decoding does not.
            Some(f) if f.decoder.is_some() => SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
}

impl Filter {
    /// One body chunk: decoded if needed, then masked; what is ready goes
    /// to `ready`.
    fn data(&mut self, data: Bytes) -> Result<(), ReplyError> {
        match &mut self.decoder {
            Some(d) => {
                // Decoded text is the gateway's own buffer, unmasked: copied
                // and masked, then wiped.
                let mut plain = Vec::new();
                d.push(&data, &mut plain)?;
                let mut out = Vec::new();
                self.masker.push(&plain, &mut out);
                zeroize::Zeroize::zeroize(&mut plain);
                self.ready_vec(out);
            }
            // Passed on uncopied when it holds no occurrence: masking is
            // then a read of each byte, not a copy and an allocation too.
            None => {
                let ready = &mut self.ready;
                self.masker.push_bytes(data, |piece| ready.push_back(piece));
            }
        }
        Ok(())
    }

    /// End of the body: what the decoder and the masker still hold goes to
    /// `ready`.
    fn flush(&mut self) -> Result<(), ReplyError> {
        let mut out = Vec::new();
        if let Some(d) = &mut self.decoder {
            let mut plain = Vec::new();
            d.finish(&mut plain)?;
            self.masker.push(&plain, &mut out);
            zeroize::Zeroize::zeroize(&mut plain);
        }
        self.masker.finish(&mut out);
        self.ready_vec(out);
        Ok(())
    }

    fn ready_vec(&mut self, out: Vec<u8>) {
        if !out.is_empty() {
            self.ready.push_back(Bytes::from(out));
        }
    }
}
