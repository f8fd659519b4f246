//! Every answer the web app gives, written here: its security headers,
//! the JSON form of a success and of an error, and the HTTP status of
//! each error.
//!
//! Every answer carries:
//!
//! | header | value | why |
//! |---|---|---|
//! | `Content-Security-Policy` | [`CSP`] | only the app's own script, style, images, manifest and worker; no inline script or style, no framing, no form posts, no `<base>`; Trusted Types required, with one policy (`talos`) that lets through the service worker's URL and nothing else, so no script can write markup into the page at all |
//! | `Strict-Transport-Security` | `max-age=31536000` | the browser never tries the name over plain HTTP for a year |
//! | `X-Content-Type-Options` | `nosniff` | a JSON answer is never run as a script or style |
//! | `Referrer-Policy` | `no-referrer` | no URL of the app leaves it in a `Referer` |
//! | `Permissions-Policy` | [`PERMISSIONS`] | no camera, microphone, location, payment or USB; passkeys for the app's own pages only |
//! | `Cross-Origin-Opener-Policy` | `same-origin` | no other site's window keeps a handle on the app's |
//! | `Cross-Origin-Resource-Policy` | `same-origin` | no other site embeds the app's answers |
//! | `X-Frame-Options` | `DENY` | no framing, for browsers that predate `frame-ancestors` |
//! | `Cache-Control` | `no-store` on the pages and every API answer; `no-cache` (revalidated by `ETag`) on the assets | nothing personal is kept by a browser or a proxy |

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

use crate::error::{Error, LinkError};

/// The Content-Security-Policy of every answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; manifest-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types talos";

/// The Permissions-Policy of every answer.
pub const PERMISSIONS: &str = "camera=(), microphone=(), geolocation=(), payment=(), usb=(), \
publickey-credentials-get=(self), publickey-credentials-create=(self)";

/// An answer's body: whole, or streamed (the card stream).
pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// An answer.
pub type Reply = Response<Body>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// Put the headers every answer carries on `r` (see the module docs);
/// `personal` answers are never stored.
pub fn secure(mut r: Reply, personal: bool) -> Reply {
    let h = r.headers_mut();
    let set = |h: &mut hyper::HeaderMap, name: &'static str, value: &'static str| {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    };
    set(h, "content-security-policy", CSP);
    set(h, "strict-transport-security", "max-age=31536000");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "no-referrer");
    set(h, "permissions-policy", PERMISSIONS);
    set(h, "cross-origin-opener-policy", "same-origin");
    set(h, "cross-origin-resource-policy", "same-origin");
    set(h, "x-frame-options", "DENY");
    if personal || !h.contains_key(hyper::header::CACHE_CONTROL) {
        set(h, "cache-control", "no-store");
    }
    r
}

/// A JSON answer.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Reply {
    let mut r = Response::new(full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A refusal of the web app's own (not one of the store's errors): its
/// status, stable code and text.
pub fn refuse(status: StatusCode, code: &str, message: &str) -> Reply {
    json(
        status,
        &serde_json::json!({"error": code, "message": message}),
    )
}

/// The HTTP status of an error.
pub fn status_of(e: &Error) -> StatusCode {
    match e {
        Error::NotSignedIn => StatusCode::UNAUTHORIZED,
        Error::NotPermitted { .. } | Error::ApproverNotListed { .. } => StatusCode::FORBIDDEN,
        Error::PasskeyRefused { reason, .. } if *reason == "malformed" => StatusCode::BAD_REQUEST,
        Error::PasskeyRefused { .. } => StatusCode::FORBIDDEN,
        Error::SandboxNotFound { .. }
        | Error::ApprovalNotFound { .. }
        | Error::EnrolmentUnknown => StatusCode::NOT_FOUND,
        Error::EnrolmentExpired { .. } | Error::EnrolmentUsed { .. } => StatusCode::GONE,
        Error::ApprovalNotPending { .. }
        | Error::PasskeyExists
        | Error::PushSubscriptionsFull { .. }
        | Error::Ended { .. } => StatusCode::CONFLICT,
        Error::SignInLimited { .. } | Error::ChallengesFull { .. } => StatusCode::TOO_MANY_REQUESTS,
        Error::Link(LinkError::Unreachable(_))
        | Error::Link(LinkError::Refused { .. })
        | Error::Link(LinkError::Invalid { .. }) => StatusCode::BAD_GATEWAY,
        Error::Store(_) | Error::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// The answer to an error: `{"error": CODE, "message": TEXT}`, with
/// `reason` for a refused passkey (WebAuthn's stable name) and
/// `Retry-After` for a 429. A store failure's text stays in the log: the
/// page says only that the server failed.
pub fn error(e: &Error) -> Reply {
    let status = status_of(e);
    let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
        "the server failed; its log says why".to_owned()
    } else {
        e.to_string()
    };
    let mut body = serde_json::json!({"error": e.code(), "message": message});
    if let Error::PasskeyRefused { reason, .. } = e {
        body["reason"] = (*reason).into();
    }
    let mut r = json(status, &body);
    let retry = match e {
        Error::SignInLimited {
            retry_after_secs, ..
        } => Some(*retry_after_secs),
        Error::ChallengesFull { .. } => Some(60),
        _ => None,
    };
    if let Some(secs) = retry {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(hyper::header::RETRY_AFTER, v);
        }
    }
    r
}
