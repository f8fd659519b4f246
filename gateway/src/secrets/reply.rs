//! The destination's reply on its way to the session: masked.
//!
//! For a session with attachments, every reply — from any destination —
//! has each header name and value, each body chunk (HTTP/1.1 chunked or
//! sized, HTTP/2 DATA) and each trailer run through the session's
//! [`Masker`]. A reply from a destination that received an attachment is
//! first read as [`decode::plan`] decides on its head as sent: decoded when
//! it came coded (the request asked for `identity`), its gRPC message flags
//! read, or refused; and its framing headers fixed. A session without
//! attachments has its replies passed as they are.
//!
//! Whatever the session, `hangar-refusal` never passes from a destination,
//! in headers or trailers: only the gateway's own answers carry it.
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
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::refusal::REFUSAL_HEADER;
pub use crate::secrets::decode::ReplyRefusal;
use crate::secrets::decode::{Bounds, Decoder, GrpcFrames, Plan};
use crate::secrets::mask::{MaskSet, Masker};

/// Where a masked reply reports what it masked: once, when its body ends
/// or is dropped, whichever comes first; and a reply cut in its body, when
/// that happens. The connection holds the other end (see
/// `http::connection`), so the handle is also how it learns that every
/// reply of it has reported.
pub trait MaskedReport: Send + Sync + 'static {
    /// Occurrences masked, per secret name (zeros included).
    fn masked(&self, counts: &mut dyn Iterator<Item = (&str, u64)>);
    /// The reply was cut in its body, for this cause.
    fn cut(&self, cause: ReplyRefusal);
}

/// Mask every header name and value of `headers` in place; returns how
/// many names and values changed. Names are matched without regard to
/// ASCII case: hyper and HTTP/2 give them in lower case whatever the
/// destination wrote, so a value echoed in a name arrives lower-cased.
pub fn mask_headers(masker: &mut Masker, headers: &mut HeaderMap) -> usize {
    let mut changed = 0;
    if headers
        .keys()
        .any(|n| masker.name_matches(n.as_str().as_bytes()))
    {
        let mut last: Option<HeaderName> = None;
        for (name, value) in std::mem::take(headers) {
            let name = match name {
                Some(name) => {
                    let mut bytes = name.as_str().as_bytes().to_vec();
                    if masker.mask_name(&mut bytes) > 0 {
                        changed += 1;
                    }
                    // Asterisks are token characters; the rest was a name.
                    let masked = HeaderName::from_bytes(&bytes).unwrap_or(name);
                    zeroize::Zeroize::zeroize(&mut bytes);
                    last = Some(masked.clone());
                    masked
                }
                None => match &last {
                    Some(name) => name.clone(),
                    None => continue,
                },
            };
            headers.append(name, value);
        }
    }
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

/// Prepare a reply for the session: apply `plan` to its headers (decided
/// on them as the destination sent them; `None` for a destination that
/// received no attachment), mask its header names and values, and wrap
/// the body. The caller has removed hop-by-hop headers and
/// `hangar-refusal`.
///
/// `set` is the session's mask set (none: the reply passes untouched);
/// `bounds` bound its decoding.
pub fn filter(
    headers: &mut HeaderMap,
    body: Incoming,
    set: Option<&Arc<MaskSet>>,
    plan: Option<Plan>,
    bounds: Bounds,
    report: Arc<dyn MaskedReport>,
) -> Result<ReplyBody, ReplyRefusal> {
    let Some(set) = set else {
        return Ok(ReplyBody::plain(body));
    };
    let mut decoder = None;
    let mut grpc = None;
    if let Some(plan) = plan {
        if let Some(coding) = plan.decode {
            decoder = Some(Decoder::new(coding, bounds).map_err(|e| e.refusal())?);
            headers.remove(header::CONTENT_ENCODING);
            headers.remove(header::CONTENT_LENGTH);
            // Validators and digests were of the encoded bytes.
            headers.remove(header::ETAG);
            headers.remove("content-md5");
            headers.remove("content-digest");
            headers.remove("repr-digest");
        }
        grpc = plan.grpc.map(GrpcFrames::new);
        // The session may not choose pieces of this destination's replies
        // (its `Range` headers are removed): say so.
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("none"));
    }
    let mut masker = Masker::new(Arc::clone(set));
    mask_headers(&mut masker, headers);
    Ok(ReplyBody {
        inner: body,
        filter: Some(Box::new(Filter {
            masker,
            decoder,
            grpc,
            ready: VecDeque::new(),
            trailers: None,
            done: false,
            report,
        })),
    })
}

/// The trailers as the session gets them: never a destination's
/// `hangar-refusal`.
fn own_trailers(frame: Frame<Bytes>) -> Frame<Bytes> {
    if !frame.is_trailers() {
        return frame;
    }
    match frame.into_trailers() {
        Ok(mut trailers) => {
            trailers.remove(REFUSAL_HEADER);
            Frame::trailers(trailers)
        }
        Err(frame) => frame,
    }
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
    /// gRPC message flags read, for a gRPC reply from a destination that
    /// received an attachment.
    grpc: Option<GrpcFrames>,
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
            .field("grpc", &self.grpc.is_some())
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
    #[error("the reply was cut by the gateway: {}", .0.as_str())]
    Cut(ReplyRefusal),
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
                .map_ok(own_trailers)
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
                    f.cut_on(Filter::flush)?;
                    continue;
                }
            };
            match frame.into_data() {
                Ok(data) => f.cut_on(|f| f.data(data))?,
                Err(frame) => {
                    if let Ok(mut trailers) = frame.into_trailers() {
                        trailers.remove(REFUSAL_HEADER);
                        mask_headers(&mut f.masker, &mut trailers);
                        f.trailers = Some(trailers);
                        f.cut_on(Filter::flush)?;
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
    /// Run `step`; when it refuses the reply, report the cut once, drop
    /// what was ready (none of it may be whole, and the reply ends here
    /// anyway), and fail the body.
    fn cut_on(
        &mut self,
        step: impl FnOnce(&mut Filter) -> Result<(), ReplyRefusal>,
    ) -> Result<(), ReplyError> {
        step(self).map_err(|cause| {
            self.report.cut(cause);
            self.ready.clear();
            self.trailers = None;
            self.done = true;
            ReplyError::Cut(cause)
        })
    }

    /// One body chunk: decoded if needed, its gRPC flags read, then masked;
    /// what is ready goes to `ready`.
    fn data(&mut self, data: Bytes) -> Result<(), ReplyRefusal> {
        match &mut self.decoder {
            Some(d) => {
                // Decoded text is the gateway's own buffer, unmasked: copied
                // and masked, then wiped.
                let mut plain = Vec::new();
                let decoded = d.push(&data, &mut plain);
                let read = self.grpc.as_mut().map_or(Ok(()), |g| g.read(&plain));
                let mut out = Vec::new();
                if decoded.is_ok() && read.is_ok() {
                    self.masker.push(&plain, &mut out);
                }
                zeroize::Zeroize::zeroize(&mut plain);
                decoded.map_err(|e| e.refusal())?;
                read?;
                self.ready_vec(out);
            }
            // Passed on uncopied when it holds no occurrence: masking is
            // then a read of each byte, not a copy and an allocation too.
            None => {
                if let Some(g) = &mut self.grpc {
                    g.read(&data)?;
                }
                let ready = &mut self.ready;
                self.masker.push_bytes(data, |piece| ready.push_back(piece));
            }
        }
        Ok(())
    }

    /// End of the body: what the decoder and the masker still hold goes to
    /// `ready`.
    fn flush(&mut self) -> Result<(), ReplyRefusal> {
        let mut out = Vec::new();
        if let Some(d) = &mut self.decoder {
            let mut plain = Vec::new();
            let decoded = d.finish(&mut plain);
            let read = self.grpc.as_mut().map_or(Ok(()), |g| g.read(&plain));
            if decoded.is_ok() && read.is_ok() {
                self.masker.push(&plain, &mut out);
            }
            zeroize::Zeroize::zeroize(&mut plain);
            decoded.map_err(|e| e.refusal())?;
            read?;
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
