//! The approvers' JSON API: what a phone app would call.
//!
//! HTTPS only: TLS 1.3 with the control stub's certificate (`stub.pem`,
//! which names `control-stub`, `localhost` and 127.0.0.1), no client
//! certificate; HTTP/1.1. An approver authenticates with the bearer token
//! `approvers add NAME` printed (`Authorization: Bearer TOKEN`); the store
//! keeps only its SHA-256.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/approvals` | 200, the caller's pending cards (as `approvals list --approver NAME`) |
//! | `POST /v1/approvals/{id}/approve` | 200, the decision made and delivered (as `approvals approve ID --as NAME`) |
//! | `POST /v1/approvals/{id}/decline` | 200, likewise, declined |
//!
//! Errors are `{"error": CODE, "message": TEXT}` with the codes of
//! [`crate::error`]: 401 `approver_token_invalid` (no token, or one no
//! approver has), 403 `approver_not_listed`, 404 `approval_not_found` (and
//! `not_found` for another path), 405 `method_not_allowed`, 409
//! `approval_not_pending`, 413 `body_too_large`, 502 `gateway_unreachable`,
//! `gateway_refused` and `gateway_reply_invalid` (the decision was not
//! delivered; nothing changed), 500 `store_failed`, 400 for the rest.
//!
//! `serve` runs it on the people's listener (`server/people.rs`), which
//! owns the connections; the store calls under way, each on a blocking
//! thread, are this API's own ([`Api::finish`] waits for them).
//!
//! # Limits
//!
//! Request bodies of at most [`MAX_BODY`] bytes (a decision needs none:
//! what is decided is in the path); the listener's connection cap and
//! handshake bound are in `server/listener.rs`, and a request's headers
//! get as long as a handshake.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use talos_certs::{GatewayKey, Verdict};
use tokio_util::task::TaskTracker;

use crate::error::{Error, LinkError};
use crate::identity::Identity;
use crate::link::GatewayLink;
use crate::store::Store;
use talos_contract::sync::Locked;

/// The largest request body read: 16 KiB.
pub const MAX_BODY: usize = 16 * 1024;

/// What the API works with: the store (shared with the `ControlPlane`
/// service), the relay's key, and the link that delivers decisions.
#[derive(Clone)]
pub struct Api {
    store: Arc<Mutex<Store>>,
    key: Arc<GatewayKey>,
    link: Arc<dyn GatewayLink + Send + Sync>,
    /// The store calls under way, each on a blocking thread.
    tasks: TaskTracker,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Api {
    pub fn new(
        store: Arc<Mutex<Store>>,
        key: Arc<GatewayKey>,
        link: Arc<dyn GatewayLink + Send + Sync>,
    ) -> Api {
        Api {
            store,
            key,
            link,
            tasks: TaskTracker::new(),
        }
    }

    /// Take no more store calls, and wait for those under way (a
    /// decision holds the store while the gateway answers): each ends
    /// whether or not its connection is still there to hear the answer.
    /// Returns how many were under way.
    pub async fn finish(&self) -> usize {
        self.tasks.close();
        let under_way = self.tasks.len();
        self.tasks.wait().await;
        under_way
    }
}

/// TLS 1.3 with `identity`'s certificate, no client authentication, ALPN
/// `http/1.1`.
pub fn server_config(identity: &Identity) -> Result<rustls::ServerConfig, Error> {
    let tls_error = |e: rustls::Error| Error::Io {
        what: "TLS configuration".into(),
        reason: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(identity.chain.clone(), identity.key().clone_key())
        .map_err(tls_error)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// An answer of the API.
pub type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: &serde_json::Value) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

fn fail(status: StatusCode, code: &str, message: &str) -> Reply {
    reply(
        status,
        &serde_json::json!({"error": code, "message": message}),
    )
}

/// The HTTP status of an error.
fn status_of(e: &Error) -> StatusCode {
    match e {
        Error::ApproverTokenInvalid => StatusCode::UNAUTHORIZED,
        Error::ApproverNotListed { .. } => StatusCode::FORBIDDEN,
        Error::ApprovalNotFound { .. } | Error::SandboxNotFound { .. } => StatusCode::NOT_FOUND,
        Error::ApprovalNotPending { .. } => StatusCode::CONFLICT,
        Error::Link(LinkError::Unreachable(_))
        | Error::Link(LinkError::Refused { .. })
        | Error::Link(LinkError::Invalid { .. }) => StatusCode::BAD_GATEWAY,
        Error::Store(_) | Error::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn error_reply(e: &Error) -> Reply {
    fail(status_of(e), e.code(), &e.to_string())
}

/// Run `f` on the store on a blocking thread: the store is SQLite behind
/// a mutex, and a decision holds it while the gateway answers.
async fn with_store<T: Send + 'static>(
    api: &Api,
    f: impl FnOnce(&mut Store, &Api) -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let api = api.clone();
    let tasks = api.tasks.clone();
    tasks
        .spawn_blocking(move || {
            let mut store = api.store.locked();
            f(&mut store, &api)
        })
        .await
        .map_err(|e| Error::Store(format!("approvals task: {e}")))?
}

/// The approver the request's bearer token names.
async fn approver(api: &Api, req: &Request<Incoming>) -> Result<String, Error> {
    let token = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty())
        .ok_or(Error::ApproverTokenInvalid)?;
    let hash = crate::relay::token_hash(token);
    with_store(api, move |store, _| {
        store
            .read(|tx| tx.approver_by_token(&hash))?
            .ok_or(Error::ApproverTokenInvalid)
    })
    .await
}

/// Answer one request.
pub async fn handle(api: &Api, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let Some(rest) = path
        .strip_prefix("/v1/approvals")
        .filter(|r| r.is_empty() || r.starts_with('/'))
    else {
        return fail(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let route: Option<(&str, Verdict)> = match rest {
        "" | "/" => None,
        r => {
            let r = &r[1..];
            match r.rsplit_once('/') {
                Some((id, "approve")) if !id.is_empty() && !id.contains('/') => {
                    Some((id, Verdict::Approved))
                }
                Some((id, "decline")) if !id.is_empty() && !id.contains('/') => {
                    Some((id, Verdict::Declined))
                }
                _ => return fail(StatusCode::NOT_FOUND, "not_found", "no such route"),
            }
        }
    };
    let wanted = if route.is_some() {
        Method::POST
    } else {
        Method::GET
    };
    if req.method() != wanted {
        return fail(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &format!("this route takes {wanted}"),
        );
    }
    let name = match approver(api, &req).await {
        Ok(n) => n,
        Err(e) => return error_reply(&e),
    };
    match route {
        None => {
            match with_store(api, move |store, _| {
                crate::relay::cards(store, Some(&name), false)
            })
            .await
            {
                Ok(cards) => reply(
                    StatusCode::OK,
                    &serde_json::to_value(cards).unwrap_or_default(),
                ),
                Err(e) => error_reply(&e),
            }
        }
        Some((id, verdict)) => {
            let id = id.to_owned();
            // The body says nothing the path does not; it is read (bounded)
            // only so the connection stays usable.
            if Limited::new(req.into_body(), MAX_BODY)
                .collect()
                .await
                .is_err()
            {
                return fail(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    &format!("a request body is at most {MAX_BODY} bytes"),
                );
            }
            let (shown_id, shown_name) = (id.clone(), name.clone());
            let result = with_store(api, move |store, api| {
                crate::relay::decide(store, api.link.as_ref(), &api.key, &id, &name, verdict)
            })
            .await;
            // One line per decision asked for through the API, for the
            // operator: who, what, and how it ended (never a token).
            eprintln!(
                "{}",
                serde_json::json!({
                    "approval_api": shown_id.chars().take(200).collect::<String>(),
                    "approver": shown_name,
                    "decision": verdict.as_str(),
                    "error": result.as_ref().err().map(Error::code),
                    "outcome": result.as_ref().ok().map(|d| d.outcome.as_str()),
                })
            );
            match result {
                Ok(d) => reply(StatusCode::OK, &serde_json::to_value(d).unwrap_or_default()),
                Err(e) => error_reply(&e),
            }
        }
    }
}
