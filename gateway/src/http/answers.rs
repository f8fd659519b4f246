//! Every answer the gateway writes itself, in one place, and through the
//! session's masker like every reply: the answers are built from fixed
//! text and the session's own fields, so nothing should match, but no path
//! to the session skips the masker.
//!
//! - [`refusal`]: a refused request. Its status ([`Refusal::http_status`]),
//!   a `hangar-refusal` header with the stable reason, and a small JSON
//!   body `{"refusal", "message"}`. A gRPC request gets a trailers-only
//!   answer instead: HTTP 200 with `grpc-status` ([`Refusal::grpc_code`])
//!   and `grpc-message`, and the same header, so a gRPC client sees a
//!   status rather than a framing error.
//! - [`json`]: the answers of approvals.hangar.internal.

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use crate::http::connection::Connection;
use crate::refusal::{Refusal, Refused, REFUSAL_HEADER};
use crate::secrets::mask::Masker;
use crate::secrets::reply::{self, ReplyBody};

/// The response body: the destination's, streamed (and masked), or the
/// gateway's own.
pub type ProxyBody = Either<ReplyBody, Full<Bytes>>;

/// The gateway's answer to a refused request. A refusal at a bound of the
/// session's share (`session_limit`) also names the bound (`"bound"` in
/// the JSON body) and, when known, when to try again (`retry-after`).
pub fn refusal(conn: &Connection, refused: Refused, grpc: bool) -> Response<ProxyBody> {
    let reason = refused.reason;
    let mut resp = Response::new(Vec::new());
    let headers = resp.headers_mut();
    headers.insert(REFUSAL_HEADER, HeaderValue::from_static(reason.as_str()));
    if let Some(after) = refused.retry_after {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(after.as_secs().max(1)),
        );
    }
    if grpc {
        // A trailers-only gRPC answer: HTTP 200 with the status in headers.
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from(reason.grpc_code()));
        let msg = format!("refused by the gateway: {}", reason.as_str());
        if let Ok(v) = HeaderValue::from_str(&msg) {
            headers.insert("grpc-message", v);
        }
    } else {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        *resp.status_mut() =
            StatusCode::from_u16(reason.http_status()).unwrap_or(StatusCode::FORBIDDEN);
        let mut body = serde_json::json!({"refusal": reason.as_str(), "message": reason.message()});
        if reason == Refusal::SessionLimit {
            body["bound"] = refused.cause.into();
        }
        *resp.body_mut() = json_bytes(&body);
        set_json(&mut resp);
    }
    masked(conn, resp)
}

/// A JSON answer of the gateway's own, with `hangar-refusal` (and
/// `retry-after`, when known) when it is a refusal.
pub fn json(
    conn: &Connection,
    status: StatusCode,
    refusal: Option<Refused>,
    body: serde_json::Value,
) -> Response<ProxyBody> {
    let mut resp = Response::new(json_bytes(&body));
    *resp.status_mut() = status;
    set_json(&mut resp);
    if let Some(refused) = refusal {
        let headers = resp.headers_mut();
        headers.insert(
            REFUSAL_HEADER,
            HeaderValue::from_static(refused.reason.as_str()),
        );
        if let Some(after) = refused.retry_after {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(after.as_secs().max(1)),
            );
        }
    }
    masked(conn, resp)
}

fn json_bytes(body: &serde_json::Value) -> Vec<u8> {
    let mut bytes = body.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

fn set_json(resp: &mut Response<Vec<u8>>) {
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
}

/// The answer through the session's masker, head and body.
fn masked(conn: &Connection, resp: Response<Vec<u8>>) -> Response<ProxyBody> {
    let (mut parts, mut body) = resp.into_parts();
    if let Some(set) = &conn.session.mask {
        let mut masker = Masker::new(std::sync::Arc::clone(set));
        reply::mask_headers(&mut masker, &mut parts.headers);
        masker.mask_all(&mut body);
    }
    Response::from_parts(parts, Either::Right(Full::new(Bytes::from(body))))
}
