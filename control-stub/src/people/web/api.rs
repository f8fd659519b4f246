//! The routes: the pages and assets, and the JSON API the script calls.
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /api/me` | anyone | `{"signed_in": false}`, or the person, role, CSRF token and session times |
//! | `POST /api/sign-in/begin` | anyone (counted) | a sign-in challenge |
//! | `POST /api/sign-in/finish` | anyone | the assertion checked, a session opened (cookie) |
//! | `POST /api/sign-out` | signed in | the session ended, the cookie removed |
//! | `POST /api/enrol/begin` | a link's holder | the creation options |
//! | `POST /api/enrol/finish` | a link's holder | the passkey stored, the link used |
//! | `GET /api/cards` | signed in | the person's waiting cards |
//! | `GET /api/events` | signed in | the same, live (server-sent events) |
//! | `POST /api/cards/{id}/decision` | a named approver | `{"verdict", "credential"}`: decided |
//! | `GET /api/history` | signed in | the person's past decisions |
//! | `GET /api/sessions` | signed in | the sessions they may see |
//! | `GET /api/sessions/{id}` | who may see it | the session's page |
//! | `POST /api/sessions/{id}/revoke-all/begin` | operators | a nonce and the challenge to sign |
//! | `POST /api/sessions/{id}/revoke-all` | operators | `{"nonce", "credential"}`: Revoke All |
//! | `GET /api/push` | signed in | the VAPID public key, or null when push is off |
//! | `POST /api/push/subscribe`, `/api/push/unsubscribe` | signed in | a device's subscription |
//! | `POST /v1/sandboxes/{id}/revoke-all` | an operator: client certificate, or signed in | Revoke All for an API caller (below) |
//! | `POST /v1/sandboxes/{id}/revoke-all/begin` | operators, signed in | the same as `/api/sessions/{id}/revoke-all/begin` |
//!
//! **The API (`/v1/`).** `POST /v1/sandboxes/{id}/revoke-all` takes an
//! operator either way, through the one function every Revoke All runs
//! through (`signed::revoke_all`):
//!
//! - **A client certificate** (`control-stub init --operator NAME`): when
//!   the TLS connection presented one, it alone decides who asks. It must
//!   chain to the operator CA, say clientAuth, be valid now and name one
//!   operator (`talos:operator:NAME`); else 403 `certificate_refused`
//!   (its reason in the message: `not_operator_ca` for a gateway's or the
//!   control plane's certificate). The store must not hold that name as
//!   a person of another role (403 `not_permitted`). The body is empty or
//!   `{}`. A browser that holds such a certificate sends it by itself, as
//!   it sends a cookie, so a request from another site's page is refused:
//!   its `Origin`, when sent, must be the app's and its `Sec-Fetch-Site`,
//!   when sent, `same-origin` or `none` (403 `origin_refused`); curl sends
//!   neither. Recorded `verified_by: client_certificate`, with the
//!   certificate's SHA-256 fingerprint, serial and DER.
//! - **A signed-in operator's session**: the cookie, `Origin`, JSON body
//!   and CSRF token as every `/api/` POST; the body `{"nonce",
//!   "credential"}` as `/api/sessions/{id}/revoke-all` takes it, the nonce
//!   from `.../revoke-all/begin` (either prefix). An approver's session:
//!   403 `not_permitted`. Recorded `verified_by: passkey`.
//! - **Neither**: 401 `no_identity`.
//!
//! An unknown session is 404 `sandbox_not_found`, one that has ended 409
//! `sandbox_ended`. The answer: `{"session_id", "state", "attempt",
//! "closes_owed", "requested_by", "verified": true, "verified_by"}`.
//!
//! **Every request that changes something** (every `POST`) must come
//! from the app's own pages: its `Origin` header is the app's origin,
//! byte for byte, and `Sec-Fetch-Site`, when the browser sends it, is
//! `same-origin` (else 403 `origin_refused`); its body is JSON
//! (`Content-Type: application/json`, else 415 `json_only`) of at most
//! [`MAX_BODY`] bytes (413 `body_too_large`). A signed-in one also carries
//! the session's CSRF token in `X-CSRF-Token`, compared in constant time
//! (403 `csrf_refused`). Another site's page can neither read the token
//! nor set the header without a CORS preflight, which the app never
//! answers; `SameSite=Strict` keeps its requests from carrying the cookie
//! at all.
//!
//! **Logs.** One JSON line on standard error per request that changes
//! something and per refusal (so one per `/v1/` call): the route, the
//! person when known, the status and error code, the source address, and
//! on `/v1/` how the caller was identified (`via`: `client_certificate`
//! or `passkey`) with a certificate's SHA-256 fingerprint. Never a cookie,
//! a token, a CSRF token, a challenge, an assertion or anything of a
//! certificate's key (the server never has it).

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, COOKIE, SET_COOKIE};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use talos_certs::Verdict;
use zeroize::Zeroizing;

use super::super::ceremony::{self, AssertionJson, Presented, RegistrationJson};
use super::super::push::Push;
use super::super::signed::RevokeBy;
use super::super::{sessions, signed};
use super::answer::{self, refuse, secure, Body, Reply};
use super::app::{App, MAX_BODY};
use super::{assets, live, views, watch};
use crate::error::Error;
use crate::model::{ProposalState, Role};
use crate::store::{ClientCertificate, WebSession};

/// The certificates a client presented on its TLS connection (leaf
/// first), as the TLS layer verified them.
pub type PeerCerts = Arc<Vec<rustls::pki_types::CertificateDer<'static>>>;

/// Why a request is refused before it reaches the store.
enum Fail {
    /// One of the store's or the people module's errors.
    Error(Error),
    /// The web app's own refusal: status, code, text.
    Refused(StatusCode, &'static str, String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Error(e)
    }
}

impl Fail {
    fn reply(&self) -> Reply {
        match self {
            Fail::Error(e) => answer::error(e),
            Fail::Refused(status, code, text) => refuse(*status, code, text),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Fail::Error(e) => e.code(),
            Fail::Refused(_, code, _) => code,
        }
    }
}

type Outcome = Result<Reply, Fail>;

/// What a request came with.
struct Ctx<'a> {
    app: &'a Arc<App>,
    headers: HeaderMap,
    source: String,
    /// Who, once known (for the log line).
    person: Option<String>,
    /// A new cookie for the answer (a sign-in, a rotation, a sign-out).
    set_cookie: Option<Zeroizing<String>>,
    /// The client's certificates, if its connection presented any.
    certs: Option<PeerCerts>,
    /// How a `/v1/` caller was identified (for the log line).
    via: Option<&'static str>,
    /// The SHA-256 of the client certificate it presented (for the log).
    certificate: Option<String>,
}

/// Serve one request; `certs`: the client certificates its connection
/// presented.
pub async fn handle(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
    certs: Option<&PeerCerts>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let prefix = if path.starts_with("/api/") {
        "/api"
    } else if path.starts_with("/v1/") {
        "/v1"
    } else {
        return secure(assets::serve(&method, &path, req.headers()), false);
    };
    let (parts, body) = req.into_parts();
    let mut ctx = Ctx {
        app,
        headers: parts.headers,
        source: peer.ip().to_string(),
        person: None,
        set_cookie: None,
        certs: certs.cloned(),
        via: None,
        certificate: None,
    };
    let route = path[prefix.len()..].to_owned();
    let result = if prefix == "/v1" {
        route_v1(&mut ctx, &method, &route, body).await
    } else {
        route_api(&mut ctx, &method, &route, body).await
    };
    let (mut reply, failure) = match result {
        Ok(r) => (r, None),
        Err(f) => (f.reply(), Some(f.code())),
    };
    if method != Method::GET || failure.is_some() {
        log(&ctx, &method, prefix, &route, reply.status(), failure);
    }
    if let Some(cookie) = &ctx.set_cookie {
        if let Ok(v) = HeaderValue::from_str(cookie) {
            reply.headers_mut().append(SET_COOKIE, v);
        }
    }
    secure(reply, true)
}

/// The log line of a request (see the module docs).
fn log(
    ctx: &Ctx<'_>,
    method: &Method,
    prefix: &str,
    route: &str,
    status: StatusCode,
    error: Option<&str>,
) {
    let shown: String = route
        .chars()
        .take(120)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    let mut line = serde_json::json!({
        "web": format!("{method} {prefix}{shown}"),
        "status": status.as_u16(),
        "person": ctx.person,
        "error": error,
        "source": ctx.source,
    });
    if prefix == "/v1" {
        line["via"] = ctx.via.into();
        line["certificate_sha256"] = ctx.certificate.clone().into();
    }
    eprintln!("{line}");
}

/// The route's name and the rest: `/cards/ID/decision` → ("cards", ["ID", "decision"]).
fn segments(route: &str) -> Vec<&str> {
    route.trim_start_matches('/').split('/').collect()
}

async fn route_api(ctx: &mut Ctx<'_>, method: &Method, route: &str, body: Incoming) -> Outcome {
    let seg = segments(route);
    match (method, seg.as_slice()) {
        (&Method::GET, ["me"]) => me(ctx).await,
        (&Method::POST, ["sign-in", "begin"]) => {
            post_checks(ctx)?;
            let _: serde_json::Value = read_json(body).await?;
            sign_in_begin(ctx).await
        }
        (&Method::POST, ["sign-in", "finish"]) => {
            post_checks(ctx)?;
            sign_in_finish(ctx, read_json(body).await?).await
        }
        (&Method::POST, ["sign-out"]) => sign_out(ctx, body).await,
        (&Method::POST, ["enrol", "begin"]) => {
            post_checks(ctx)?;
            enrol_begin(ctx, read_json(body).await?).await
        }
        (&Method::POST, ["enrol", "finish"]) => {
            post_checks(ctx)?;
            enrol_finish(ctx, read_json(body).await?).await
        }
        (&Method::GET, ["cards"]) => cards(ctx).await,
        (&Method::GET, ["events"]) => events(ctx).await,
        (&Method::POST, ["cards", id, "decision"]) => {
            let s = signed_in_post(ctx).await?;
            let id = (*id).to_owned();
            decide(ctx, s, id, read_json(body).await?).await
        }
        (&Method::GET, ["history"]) => history(ctx).await,
        (&Method::GET, ["sessions"]) => sessions_list(ctx).await,
        (&Method::GET, ["sessions", id]) => session_page(ctx, id).await,
        (&Method::POST, ["sessions", id, "revoke-all", "begin"]) => {
            revoke_all_begin(ctx, id, body).await
        }
        (&Method::POST, ["sessions", id, "revoke-all"]) => {
            let s = signed_in_post(ctx).await?;
            let id = (*id).to_owned();
            revoke_all(ctx, s, id, read_json(body).await?).await
        }
        (&Method::GET, ["push"]) => push_key(ctx).await,
        (&Method::POST, ["push", "subscribe"]) => push_subscribe(ctx, body).await,
        (&Method::POST, ["push", "unsubscribe"]) => push_unsubscribe(ctx, body).await,
        (
            _,
            ["me"]
            | ["sign-in", "begin" | "finish"]
            | ["sign-out"]
            | ["enrol", "begin" | "finish"]
            | ["cards"]
            | ["events"]
            | ["cards", _, "decision"]
            | ["history"]
            | ["sessions"]
            | ["sessions", _]
            | ["sessions", _, "revoke-all"]
            | ["sessions", _, "revoke-all", "begin"]
            | ["push"]
            | ["push", "subscribe" | "unsubscribe"],
        ) => Err(Fail::Refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not what this route takes"),
        )),
        _ => Err(Fail::Refused(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route".into(),
        )),
    }
}

/// Sign the person out: the web session closed, the cookie cleared.
async fn sign_out(ctx: &mut Ctx<'_>, body: Incoming) -> Outcome {
    let s = signed_in_post(ctx).await?;
    let _: serde_json::Value = read_json(body).await?;
    let id = s.id.clone();
    ctx.app
        .pool
        .run(move |store| sessions::close(store, &id))
        .await?;
    ctx.set_cookie = Some(Zeroizing::new(sessions::clear_cookie()));
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({"signed_out": true}),
    ))
}

/// The signed-in person's waiting cards.
async fn cards(ctx: &mut Ctx<'_>) -> Outcome {
    let s = signed_in(ctx, true).await?;
    let cards = live::cards_of(ctx.app, &s.person).await?;
    Ok(answer::json(StatusCode::OK, &cards))
}

/// The sessions the person may see.
async fn sessions_list(ctx: &mut Ctx<'_>) -> Outcome {
    let s = signed_in(ctx, true).await?;
    let out = ctx
        .app
        .pool
        .run(move |store| store.read(|tx| views::sessions(tx, &s.person, s.role)))
        .await?;
    Ok(answer::json(StatusCode::OK, &out))
}

/// One session's page, if the person may see it.
async fn session_page(ctx: &mut Ctx<'_>, id: &str) -> Outcome {
    let s = signed_in(ctx, true).await?;
    let id = id.to_owned();
    let now = ctx.app.now();
    let out = ctx
        .app
        .pool
        .run(move |store| {
            store.read(|tx| {
                // A session the person may not see is one that is
                // not there, as far as they can tell.
                if !views::may_see(tx, &s.person, s.role, &id)? {
                    return Err(Error::SandboxNotFound {
                        id: id.chars().take(100).collect(),
                    });
                }
                views::session(tx, &id, &s.person, s.role, now)
            })
        })
        .await?;
    Ok(answer::json(StatusCode::OK, &out))
}

/// A Revoke All's challenge, for the person's passkey to sign.
async fn revoke_all_begin(ctx: &mut Ctx<'_>, id: &str, body: Incoming) -> Outcome {
    let s = signed_in_post(ctx).await?;
    let _: serde_json::Value = read_json(body).await?;
    let (id, source, now) = (id.to_owned(), ctx.source.clone(), ctx.app.now());
    let app = Arc::clone(ctx.app);
    let out = ctx
        .app
        .pool
        .run(move |store| {
            signed::revoke_all_begin(store, &app.rp, &s.person, s.role, &id, &source, now)
        })
        .await?;
    Ok(answer::json(StatusCode::OK, &out))
}

/// Push's public key (VAPID), or null when push is off.
async fn push_key(ctx: &mut Ctx<'_>) -> Outcome {
    signed_in(ctx, true).await?;
    let key = ctx.app.push.as_ref().map(|p| p.public_key());
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({"public_key": key}),
    ))
}

/// The app's Web Push, or 404 `push_off` when `serve` runs without it.
fn push_on(ctx: &Ctx<'_>) -> Result<Push, Fail> {
    ctx.app.push.clone().ok_or_else(|| {
        Fail::Refused(
            StatusCode::NOT_FOUND,
            "push_off",
            "Web Push is off on this server (serve --push-contact)".into(),
        )
    })
}

/// A device's push subscription, kept for the person.
async fn push_subscribe(ctx: &mut Ctx<'_>, body: Incoming) -> Outcome {
    let s = signed_in_post(ctx).await?;
    let body: SubscribeBody = read_json(body).await?;
    let push = push_on(ctx)?;
    let sub = ctx
        .app
        .pool
        .run(move |store| {
            push.subscribe(
                store,
                &s.person,
                &body.endpoint,
                &body.keys.p256dh,
                &body.keys.auth,
            )
        })
        .await?;
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({"subscribed": true, "origin": sub.origin(), "created_at": sub.created_at}),
    ))
}

/// A device's push subscription, removed.
async fn push_unsubscribe(ctx: &mut Ctx<'_>, body: Incoming) -> Outcome {
    let s = signed_in_post(ctx).await?;
    let body: UnsubscribeBody = read_json(body).await?;
    let push = push_on(ctx)?;
    let removed = ctx
        .app
        .pool
        .run(move |store| push.unsubscribe(store, &s.person, &body.endpoint))
        .await?;
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({"removed": removed}),
    ))
}

// ---- the checks every request goes through -----------------------------

/// The session cookie's token, from any `Cookie` header (HTTP/2 may send
/// several).
fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| sessions::token_in(v).map(str::to_owned))
}

/// The request's session (see [`sessions::authenticate`]): `touch` counts
/// it as the person's activity and lets the token rotate.
async fn signed_in(ctx: &mut Ctx<'_>, touch: bool) -> Result<WebSession, Fail> {
    let token = Zeroizing::new(cookie_token(&ctx.headers).ok_or(Error::NotSignedIn)?);
    let now = ctx.app.now();
    let (session, rotated) = ctx
        .app
        .pool
        .run(move |store| sessions::authenticate(store, &token, touch, touch, now))
        .await?;
    ctx.person = Some(session.person.clone());
    if let Some(new) = rotated {
        ctx.set_cookie = Some(sessions::set_cookie(&new, &session, now));
    }
    Ok(session)
}

/// A signed-in request that changes something: the origin and body checks,
/// the session, and its CSRF token.
async fn signed_in_post(ctx: &mut Ctx<'_>) -> Result<WebSession, Fail> {
    post_checks(ctx)?;
    let session = signed_in(ctx, true).await?;
    let sent = ctx
        .headers
        .get("x-csrf-token")
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    if aws_lc_rs::constant_time::verify_slices_are_equal(sent, session.csrf.as_bytes()).is_err() {
        return Err(Fail::Refused(
            StatusCode::FORBIDDEN,
            "csrf_refused",
            "this request lacks the page's CSRF token: reload the page".into(),
        ));
    }
    Ok(session)
}

/// The checks of every request that changes something (see the module
/// docs), before its body is read.
fn post_checks(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let origin = ctx.headers.get("origin").map(HeaderValue::as_bytes);
    if origin != Some(ctx.app.rp.origin().as_bytes()) {
        return Err(Fail::Refused(
            StatusCode::FORBIDDEN,
            "origin_refused",
            "a request that changes something must come from the app's own pages (Origin)".into(),
        ));
    }
    if let Some(site) = ctx.headers.get("sec-fetch-site") {
        if site.as_bytes() != b"same-origin" {
            return Err(Fail::Refused(
                StatusCode::FORBIDDEN,
                "origin_refused",
                "a request that changes something must come from the app's own pages (Sec-Fetch-Site)".into(),
            ));
        }
    }
    let json = ctx
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Fail::Refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "json_only",
            "the body must be JSON (Content-Type: application/json)".into(),
        ));
    }
    Ok(())
}

/// The body's bytes, at most [`MAX_BODY`] (413 `body_too_large`).
async fn read_bounded(body: Incoming) -> Result<hyper::body::Bytes, Fail> {
    Ok(Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            Fail::Refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("a request body is at most {MAX_BODY} bytes"),
            )
        })?
        .to_bytes())
}

/// The body, at most [`MAX_BODY`] bytes, as JSON of type `T`. A body that
/// does not parse is refused with serde's category, never its content.
async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, Fail> {
    let bytes = read_bounded(body).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "wrong or missing fields",
            serde_json::error::Category::Eof => "truncated",
        };
        Fail::Refused(
            StatusCode::BAD_REQUEST,
            "body_invalid",
            format!("the body is {what}"),
        )
    })
}

// ---- handlers ---------------------------------------------------------

async fn me(ctx: &mut Ctx<'_>) -> Outcome {
    match signed_in(ctx, true).await {
        Ok(s) => Ok(answer::json(
            StatusCode::OK,
            &serde_json::json!({
                "signed_in": true,
                "person": s.person,
                "role": s.role,
                "csrf": s.csrf,
                "signed_in_at": s.created_at,
                "expires_at": s.expires_at,
                "idle_expires_at": s.idle_expires_at,
            }),
        )),
        // Not an error for the page: it shows the sign-in button.
        Err(Fail::Error(Error::NotSignedIn)) => Ok(answer::json(
            StatusCode::OK,
            &serde_json::json!({"signed_in": false}),
        )),
        Err(f) => Err(f),
    }
}

async fn sign_in_begin(ctx: &mut Ctx<'_>) -> Outcome {
    let (app, source, now) = (Arc::clone(ctx.app), ctx.source.clone(), ctx.app.now());
    let out = ctx
        .app
        .pool
        .run(move |store| ceremony::sign_in_begin(store, &app.rp, &source, now))
        .await?;
    Ok(answer::json(StatusCode::OK, &out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignInBody {
    challenge_id: String,
    credential: AssertionJson,
}

async fn sign_in_finish(ctx: &mut Ctx<'_>, body: SignInBody) -> Outcome {
    let (app, source, now) = (Arc::clone(ctx.app), ctx.source.clone(), ctx.app.now());
    // A cookie of an earlier session on this browser: that session ends
    // (a sign-in never continues an earlier session's token).
    let earlier = cookie_token(&ctx.headers).map(Zeroizing::new);
    let opened = ctx
        .app
        .pool
        .run(move |store| {
            if let Some(token) = earlier {
                if let Ok((old, _)) = sessions::authenticate(store, &token, false, false, now) {
                    sessions::close(store, &old.id)?;
                }
            }
            ceremony::sign_in_finish(
                store,
                &app.rp,
                &body.challenge_id,
                &body.credential,
                &source,
                now,
            )
        })
        .await?;
    ctx.person = Some(opened.session.person.clone());
    ctx.set_cookie = Some(sessions::set_cookie(&opened.token, &opened.session, now));
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({
            "person": opened.session.person,
            "role": opened.session.role,
            "csrf": opened.session.csrf,
            "expires_at": opened.session.expires_at,
        }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnrolBeginBody {
    token: String,
}

impl std::fmt::Debug for EnrolBeginBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnrolBeginBody { .. }")
    }
}

async fn enrol_begin(ctx: &mut Ctx<'_>, body: EnrolBeginBody) -> Outcome {
    let token = Zeroizing::new(body.token);
    let (app, source, now) = (Arc::clone(ctx.app), ctx.source.clone(), ctx.app.now());
    let out = ctx
        .app
        .pool
        .run(move |store| ceremony::enrol_begin(store, &app.rp, &token, &source, now))
        .await?;
    ctx.person = out["person"].as_str().map(str::to_owned);
    Ok(answer::json(StatusCode::OK, &out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnrolFinishBody {
    token: String,
    challenge_id: String,
    credential: RegistrationJson,
}

async fn enrol_finish(ctx: &mut Ctx<'_>, body: EnrolFinishBody) -> Outcome {
    let token = Zeroizing::new(body.token);
    let (app, now) = (Arc::clone(ctx.app), ctx.app.now());
    let (challenge_id, credential) = (body.challenge_id, body.credential);
    let done = ctx
        .app
        .pool
        .run(move |store| {
            ceremony::enrol_finish(store, &app.rp, &token, &challenge_id, &credential, now)
        })
        .await?;
    ctx.person = Some(done.person.clone());
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({
            "person": done.person,
            "role": done.role,
            "passkey": done.passkey,
        }),
    ))
}

async fn events(ctx: &mut Ctx<'_>) -> Outcome {
    // The stream is not the person's activity, and never rotates the
    // token (its answer's head was sent long before any rotation due).
    let s = signed_in(ctx, false).await?;
    let Some(body) = live::open(ctx.app, &s.person, &s.id) else {
        return Err(Fail::Refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_streams",
            format!(
                "at most {} live card streams per person and {} in all",
                watch::MAX_STREAMS_PER_PERSON,
                watch::MAX_STREAMS
            ),
        ));
    };
    let mut r = Response::new(body.boxed());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    Ok(r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    verdict: String,
    credential: AssertionJson,
}

async fn decide(ctx: &mut Ctx<'_>, s: WebSession, id: String, body: DecisionBody) -> Outcome {
    let verdict = match body.verdict.as_str() {
        "approved" => Verdict::Approved,
        "declined" => Verdict::Declined,
        _ => {
            return Err(Fail::Refused(
                StatusCode::BAD_REQUEST,
                "body_invalid",
                "verdict is approved or declined".into(),
            ))
        }
    };
    let presented = Presented::from_json(&body.credential)?;
    let (app, now) = (Arc::clone(ctx.app), ctx.app.now());
    let person = s.person.clone();
    let decided = ctx
        .app
        .pool
        .run(move |store| {
            let link = (app.deps.links)(store)?;
            signed::decide(
                store,
                link.as_ref(),
                &app.deps.relay_key,
                &app.rp,
                &person,
                &id,
                verdict,
                &presented,
                now,
            )
        })
        .await;
    ctx.app.watch.wake();
    let decided = decided?;
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({
            "card": decided.proposal_id,
            "decision": decided.decision,
            "approver": decided.approver,
            "decided_at": decided.decided_at,
            "outcome": decided.outcome,
            // The same first use held on other members (or again), answered
            // with this decision.
            "also_answered": decided.also_answered,
        }),
    ))
}

async fn history(ctx: &mut Ctx<'_>) -> Outcome {
    let s = signed_in(ctx, true).await?;
    let out = ctx
        .app
        .pool
        .run(move |store| {
            store.read(|tx| {
                let mut mine: Vec<_> = tx
                    .proposals(None, None)?
                    .into_iter()
                    .filter(|p| {
                        // A proposal joined to a card was decided with it:
                        // one decision, shown once.
                        p.approver.as_deref() == Some(s.person.as_str())
                            && p.answered_by.is_none()
                            && matches!(p.state, ProposalState::Approved | ProposalState::Declined)
                    })
                    .collect();
                mine.reverse();
                mine.truncate(views::MAX_HISTORY);
                Ok(mine.iter().map(views::decided).collect::<Vec<_>>())
            })
        })
        .await?;
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({"decisions": out}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeBody {
    nonce: String,
    credential: AssertionJson,
}

async fn revoke_all(ctx: &mut Ctx<'_>, s: WebSession, id: String, body: RevokeBody) -> Outcome {
    let presented = Presented::from_json(&body.credential)?;
    revoke(
        ctx,
        id,
        Asker::Passkey {
            person: s.person,
            role: s.role,
            nonce: body.nonce,
            presented,
        },
    )
    .await
}

/// Who asks for a Revoke All, owned (for the store's thread).
enum Asker {
    Passkey {
        person: String,
        role: Role,
        nonce: String,
        presented: Presented,
    },
    Certificate(ClientCertificate),
}

/// Revoke All on session `id` as `asker` (every route's way in).
async fn revoke(ctx: &mut Ctx<'_>, id: String, asker: Asker) -> Outcome {
    let (app, now) = (Arc::clone(ctx.app), ctx.app.now());
    let verified_by = match &asker {
        Asker::Passkey { .. } => "passkey",
        Asker::Certificate(_) => "client_certificate",
    };
    let t = ctx
        .app
        .pool
        .run(move |store| {
            let link = (app.deps.links)(store)?;
            let by = match &asker {
                Asker::Passkey {
                    person,
                    role,
                    nonce,
                    presented,
                } => RevokeBy::Passkey {
                    person,
                    role: *role,
                    nonce,
                    presented,
                },
                Asker::Certificate(c) => RevokeBy::ClientCertificate(c.clone()),
            };
            signed::revoke_all(
                store,
                link.as_ref(),
                app.deps.verifier.as_ref(),
                &app.rp,
                &id,
                by,
                now,
            )
        })
        .await?;
    ctx.app.watch.wake();
    Ok(answer::json(
        StatusCode::OK,
        &serde_json::json!({
            "session_id": t.session_id,
            "state": t.state,
            "attempt": t.attempt,
            "closes_owed": t.closes_owed.len(),
            "requested_by": ctx.person,
            "verified": true,
            "verified_by": verified_by,
        }),
    ))
}

// ---- the API (`/v1/`) ---------------------------------------------------

async fn route_v1(ctx: &mut Ctx<'_>, method: &Method, route: &str, body: Incoming) -> Outcome {
    let seg = segments(route);
    match (method, seg.as_slice()) {
        (&Method::POST, ["sandboxes", id, "revoke-all"]) => {
            let id = (*id).to_owned();
            v1_revoke_all(ctx, id, body).await
        }
        (&Method::POST, ["sandboxes", id, "revoke-all", "begin"]) => {
            ctx.via = Some("passkey");
            revoke_all_begin(ctx, id, body).await
        }
        (_, ["sandboxes", _, "revoke-all"] | ["sandboxes", _, "revoke-all", "begin"]) => {
            Err(Fail::Refused(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not what this route takes"),
            ))
        }
        _ => Err(Fail::Refused(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route".into(),
        )),
    }
}

/// `POST /v1/sandboxes/{id}/revoke-all` (see the module docs).
async fn v1_revoke_all(ctx: &mut Ctx<'_>, id: String, body: Incoming) -> Outcome {
    if let Some(chain) = ctx.certs.clone() {
        ctx.via = Some("client_certificate");
        ctx.certificate = chain.first().map(|c| {
            hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, c.as_ref()).as_ref())
        });
        not_cross_site(ctx)?;
        let trust = ctx.app.operators.clone().ok_or_else(|| {
            Fail::Refused(
                StatusCode::FORBIDDEN,
                "certificate_refused",
                "this server takes no operator's client certificate (no operator CA)".into(),
            )
        })?;
        let cert = trust.operator(&chain, ctx.app.now()).map_err(|e| {
            Fail::Refused(
                StatusCode::FORBIDDEN,
                "certificate_refused",
                format!(
                    "this client certificate is not an operator's ({}): {}",
                    e.reason(),
                    e.detail()
                ),
            )
        })?;
        ctx.person = Some(cert.operator.clone());
        read_empty(body).await?;
        return revoke(ctx, id, Asker::Certificate(cert)).await;
    }
    if cookie_token(&ctx.headers).is_some() {
        ctx.via = Some("passkey");
        let s = signed_in_post(ctx).await?;
        if s.role != Role::Operator {
            return Err(Fail::Error(Error::NotPermitted {
                what: "Revoke All",
                needs: Role::Operator.as_str(),
            }));
        }
        let body: RevokeBody = read_json(body).await?;
        return revoke_all(ctx, s, id, body).await;
    }
    Err(Fail::Refused(
        StatusCode::UNAUTHORIZED,
        "no_identity",
        "an operator's identity is needed: a client certificate (control-stub init --operator NAME), or a signed-in operator's session with a passkey assertion".into(),
    ))
}

/// A request carrying a client certificate is not another site's page's
/// (see the module docs): its `Origin`, when sent, is the app's, and its
/// `Sec-Fetch-Site`, when sent, `same-origin` or `none`.
fn not_cross_site(ctx: &Ctx<'_>) -> Result<(), Fail> {
    let origin_ok = ctx
        .headers
        .get("origin")
        .is_none_or(|o| o.as_bytes() == ctx.app.rp.origin().as_bytes());
    let site_ok = ctx
        .headers
        .get("sec-fetch-site")
        .is_none_or(|s| matches!(s.as_bytes(), b"same-origin" | b"none"));
    if origin_ok && site_ok {
        return Ok(());
    }
    Err(Fail::Refused(
        StatusCode::FORBIDDEN,
        "origin_refused",
        "a request with a client certificate must not come from another site's page".into(),
    ))
}

/// A body that must say nothing: empty, or `{}`.
async fn read_empty(body: Incoming) -> Result<(), Fail> {
    let bytes = read_bounded(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
        Ok(m) if m.is_empty() => Ok(()),
        _ => Err(Fail::Refused(
            StatusCode::BAD_REQUEST,
            "body_invalid",
            "the body is empty or {} with a client certificate".into(),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeBody {
    endpoint: String,
    keys: SubscribeKeys,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeKeys {
    p256dh: String,
    auth: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeBody {
    endpoint: String,
}
