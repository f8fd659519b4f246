//! One request, from the session to the destination and back.
//!
//! [`handle`] runs the per-request checks in order — host match, protocol
//! upgrade, upstream connection, gRPC over HTTP/1.1 — then forwards the
//! request with its body streaming, and streams the reply back. Hop-by-hop
//! headers are dropped both ways; hyper frames each side for its own
//! version, so an HTTP/1.1 session can reach an HTTP/2 destination and the
//! other way round, trailers included where the session's protocol carries
//! them.
//!
//! A refusal is an HTTP answer: the status, a `hangar-refusal` header with
//! the stable reason, and a small JSON body. A gRPC request gets the same
//! header plus `grpc-status` and `grpc-message`, so a gRPC client sees a
//! status rather than a framing error.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{self, Authority, PathAndQuery, Scheme};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};

use crate::gate::name::{self, Name};
use crate::records::record::RequestRecord;
use crate::refusal::Refusal;
use crate::secrets::reply::{self, ReplyBody};
use crate::session::sessions::Session;
use crate::session::upstream::{Proto, Sender, Want};

/// The response body: the destination's, streamed (and masked), or the
/// gateway's own.
pub type ProxyBody = Either<ReplyBody, Full<Bytes>>;

/// The response header that carries a refusal's stable reason.
pub const REFUSAL_HEADER: &str = "hangar-refusal";

/// Per-request entries kept in one connection's record. A connection may
/// carry any number of requests; past this many, only the count grows.
pub const MAX_REQUEST_RECORDS: usize = 256;

/// What the requests of one connection share.
#[derive(Debug)]
pub struct ConnCtx {
    pub gateway_id: Arc<str>,
    pub session: Arc<Session>,
    /// The connection's destination: the hello's name, checked.
    pub name: Name,
    /// `name` as requests to it carry it.
    pub target: Target,
    /// The addresses the gate checked for `name`.
    pub addrs: Vec<IpAddr>,
    pub stats: Mutex<ConnStats>,
    /// Masked occurrences per secret name, over all replies.
    pub masked: reply::Counts,
    /// Requests of this connection held for approval right now: when the
    /// authority ends, the connection lets them answer
    /// `approval_withdrawn` before it is cut.
    pub holding: std::sync::atomic::AtomicU32,
    /// Set when a hold of this connection ended withdrawn: its answer may
    /// still be on its way out when the connection learns the authority
    /// ended.
    pub withdrawn: std::sync::atomic::AtomicBool,
}

/// The destination as a request names it (`:authority` or `Host`), made
/// once per connection from its checked name.
#[derive(Debug, Clone)]
pub struct Target {
    authority: Authority,
    host: HeaderValue,
}

impl Target {
    /// For `name`, a canonical DNS name (always a valid authority and
    /// header value).
    pub fn new(name: &Name) -> Target {
        let bytes = Bytes::copy_from_slice(name.as_str().as_bytes());
        Target {
            authority: Authority::from_maybe_shared(bytes.clone())
                .unwrap_or_else(|_| Authority::from_static("invalid")),
            host: HeaderValue::from_maybe_shared(bytes)
                .unwrap_or_else(|_| HeaderValue::from_static("invalid")),
        }
    }
}

/// What the connection's record learns from its requests.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub request_count: u64,
    pub requests: Vec<RequestRecord>,
    /// Requests past [`MAX_REQUEST_RECORDS`], counted but not listed.
    pub requests_unlisted: u64,
    pub upstream_alpn: Option<&'static str>,
    pub upstream_addr: Option<SocketAddr>,
    /// Names of the attachments injected into this connection's requests.
    pub attachments_used: Vec<String>,
}

impl ConnCtx {
    pub(crate) fn note(&self, entry: RequestRecord) {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.request_count += 1;
        if stats.requests.len() < MAX_REQUEST_RECORDS {
            stats.requests.push(entry);
        } else {
            stats.requests_unlisted += 1;
        }
    }

    fn note_upstream(&self, proto: Proto, addr: SocketAddr) {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.upstream_alpn.get_or_insert(proto.alpn());
        stats.upstream_addr.get_or_insert(addr);
    }
}

/// Serve one request of the connection `ctx`.
pub async fn handle(
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let mut entry = RequestRecord::new(req.method(), req.uri().path());
    let grpc = is_grpc(req.headers());
    let response = match forward(&ctx, req, grpc, &mut entry).await {
        Ok(resp) => resp,
        Err((reason, cause)) => {
            tracing::info!(
                session = %ctx.session.id,
                destination = %ctx.name,
                method = %entry.method,
                reason = reason.as_str(),
                cause,
                "request refused"
            );
            entry.refusal = Some(reason);
            masked_refusal(&ctx, reason, grpc)
        }
    };
    entry.status = response.status().as_u16();
    ctx.note(entry);
    Ok(response)
}

type Refused = (Refusal, &'static str);

async fn forward(
    ctx: &ConnCtx,
    req: Request<Incoming>,
    grpc: bool,
    entry: &mut RequestRecord,
) -> Result<Response<ProxyBody>, Refused> {
    check_host(&req, &ctx.name)?;
    check_no_upgrade(&req)?;
    check_lock(ctx, &req, entry).await?;
    let pool = &ctx.session.pool;
    // A plain HTTP/1.1 request goes on as HTTP/1.1; HTTP/2 and gRPC as the
    // destination chooses (see `upstream`).
    let want = if req.version() == Version::HTTP_11 && !grpc {
        Want::Http1
    } else {
        Want::Any
    };
    let checkout = pool
        .checkout(&ctx.name, &ctx.addrs, want)
        .await
        .map_err(|f| (Refusal::UpstreamFailed, f.as_str()))?;
    let proto = checkout.proto();
    ctx.note_upstream(proto, checkout.addr);
    if grpc && proto == Proto::Http1 {
        if let Sender::H1(s) = checkout.sender {
            pool.give_back_h1(&ctx.name, s, checkout.addr);
        }
        return Err((Refusal::GrpcNeedsHttp2, "destination_speaks_http1"));
    }
    let mut upstream_req = rewrite_request(req, &ctx.target, proto);
    inject(ctx, upstream_req.headers_mut());
    let sent = match checkout.sender {
        Sender::H2(mut s) => {
            s.ready()
                .await
                .map_err(|_| (Refusal::UpstreamFailed, "upstream_closed"))?;
            s.send_request(upstream_req).await
        }
        Sender::H1(mut s) => {
            s.ready()
                .await
                .map_err(|_| (Refusal::UpstreamFailed, "upstream_closed"))?;
            let response = s.send_request(upstream_req);
            // Back in the pool now; it is picked again once it is ready,
            // that is once this response has been read to its end.
            pool.give_back_h1(&ctx.name, s, checkout.addr);
            response.await
        }
    };
    let resp = sent.map_err(|e| {
        tracing::debug!(destination = %ctx.name, error = %e, "upstream request failed");
        (Refusal::UpstreamFailed, "upstream_request_failed")
    })?;
    let attached = ctx.session.has_attachments(&ctx.name);
    rewrite_response(resp, ctx, attached).map_err(|r| (Refusal::UpstreamFailed, r.as_str()))
}

/// Hold the request if a Lock rule matches it, until a decision: goes on
/// when approved; `approval_declined` or `approval_withdrawn` otherwise.
async fn check_lock(
    ctx: &ConnCtx,
    req: &Request<Incoming>,
    entry: &mut RequestRecord,
) -> Result<(), Refused> {
    let approvals = &ctx.session.approvals;
    if approvals.rules().is_empty() {
        return Ok(());
    }
    let attachments: Vec<&str> = ctx
        .session
        .attachments_for(&ctx.name)
        .map(|a| a.secret.as_str())
        .collect();
    let ask = crate::session::approvals::Ask {
        gateway_id: ctx.gateway_id.as_ref(),
        session_id: &ctx.session.id,
        attempt: ctx.session.attempt,
        tenant: &ctx.session.tenant,
        kind: talos_certs::ProposalKind::Request,
        destination: &ctx.name,
        method: req.method().as_str(),
        path: &entry.path,
        attachments,
        tool: "",
        call_digest: "",
    };
    let Some(rule) = approvals.rule_for(&ask).cloned() else {
        return Ok(());
    };
    // On the heap, like a new upstream connection: rare, and large.
    let (outcome, record) = Box::pin(hold(ctx, &rule, &ask)).await;
    entry.approval = Some(record);
    match outcome {
        crate::session::approvals::Outcome::Approved { .. } => Ok(()),
        crate::session::approvals::Outcome::Withdrawn => {
            Err((Refusal::ApprovalWithdrawn, "session_ended"))
        }
        crate::session::approvals::Outcome::Declined { .. } => {
            Err((Refusal::ApprovalDeclined, "declined"))
        }
        crate::session::approvals::Outcome::TimedOut => {
            Err((Refusal::ApprovalDeclined, "no_decision"))
        }
        crate::session::approvals::Outcome::NoRelay => Err((Refusal::ApprovalDeclined, "no_relay")),
    }
}

/// Hold under `rule`, counted on the connection while it waits.
pub async fn hold(
    ctx: &ConnCtx,
    rule: &crate::session::approvals::LockRule,
    ask: &crate::session::approvals::Ask<'_>,
) -> (
    crate::session::approvals::Outcome,
    crate::session::approvals::ApprovalRecord,
) {
    use std::sync::atomic::Ordering;
    ctx.holding.fetch_add(1, Ordering::SeqCst);
    let held = ctx
        .session
        .approvals
        .hold(
            rule,
            ask,
            &ctx.session.ended,
            crate::session::approvals::DECISION_TIMEOUT,
        )
        .await;
    // Flag first, then count down: whoever sees the count at zero then
    // sees the flag (see `conn::terminate`).
    if held.0 == crate::session::approvals::Outcome::Withdrawn {
        ctx.withdrawn.store(true, Ordering::SeqCst);
    }
    ctx.holding.fetch_sub(1, Ordering::SeqCst);
    held
}

/// `host_mismatch` when the request names a host other than the
/// connection's: the `Host` header, the HTTP/2 `:authority` or an
/// absolute-form target. Port 443 or none; anything else is another host.
fn check_host(req: &Request<Incoming>, name: &Name) -> Result<(), Refused> {
    if let Some(authority) = req.uri().authority() {
        if !names_host(authority.as_str(), name) {
            return Err((Refusal::HostMismatch, "authority"));
        }
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    if let Some(host) = hosts.next() {
        let ok = host.to_str().is_ok_and(|h| names_host(h, name));
        if !ok || hosts.next().is_some() {
            return Err((Refusal::HostMismatch, "host_header"));
        }
    }
    Ok(())
}

/// Whether `authority` (`host[:port]`) names exactly `name` on port 443.
fn names_host(authority: &str, name: &Name) -> bool {
    if authority.contains('@') {
        return false;
    }
    let host = match authority.rsplit_once(':') {
        Some((host, "443")) => host,
        Some(_) => return false,
        None => authority,
    };
    name::canonicalize(host).is_ok_and(|h| &h == name)
}

/// `upgrade_refused` for anything that would turn the stream into bytes
/// the gateway cannot read: CONNECT (also HTTP/2 extended CONNECT, as used
/// by WebSockets over HTTP/2), `Upgrade` (WebSocket, h2c) and the h2c
/// `HTTP2-Settings` header.
fn check_no_upgrade(req: &Request<Incoming>) -> Result<(), Refused> {
    if req.method() == Method::CONNECT {
        let cause = if req.extensions().get::<hyper::ext::Protocol>().is_some() {
            "extended_connect"
        } else {
            "connect"
        };
        return Err((Refusal::UpgradeRefused, cause));
    }
    let headers = req.headers();
    if headers.contains_key(header::UPGRADE) {
        return Err((Refusal::UpgradeRefused, "upgrade_header"));
    }
    if headers.contains_key("http2-settings") {
        return Err((Refusal::UpgradeRefused, "h2c_settings"));
    }
    if connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return Err((Refusal::UpgradeRefused, "connection_upgrade"));
    }
    Ok(())
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            // application/grpc, application/grpc+proto, …; not grpc-web,
            // which is made for HTTP/1.1.
            let ct = ct.trim_start().as_bytes();
            ct.len() >= 16
                && ct[..16].eq_ignore_ascii_case(b"application/grpc")
                && matches!(ct.get(16), None | Some(b'+' | b';' | b' '))
        })
}

/// Tokens of every `Connection` header.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded either way.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
}

/// The request as the destination gets it: same method, path, query,
/// headers and streaming body, framed for the destination's protocol.
fn rewrite_request<B>(req: Request<B>, target: &Target, proto: Proto) -> Request<B> {
    let (mut parts, body) = req.into_parts();
    let te_trailers = parts.headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::TE);
    if te_trailers {
        // The one TE value HTTP/2 allows; gRPC needs it end to end.
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    // The path is reused as it was parsed (no copy, no second parse).
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut uri = uri::Parts::default();
    match proto {
        Proto::Http2 => {
            parts.version = Version::HTTP_2;
            parts.headers.remove(header::HOST);
            uri.scheme = Some(Scheme::HTTPS);
            uri.authority = Some(target.authority.clone());
        }
        Proto::Http1 => {
            parts.version = Version::HTTP_11;
            parts.headers.insert(header::HOST, target.host.clone());
        }
    }
    uri.path_and_query = Some(path);
    parts.uri = Uri::from_parts(uri).unwrap_or_else(|_| Uri::from_static("/"));
    Request::from_parts(parts, body)
}

/// Attach the session's credentials for this destination
/// ([`crate::secrets::secret::inject`]: every copy the session sent is replaced).
/// Destinations with
/// attachments are also asked for an uncompressed reply, so the masker sees
/// the bytes; a compressed reply is decoded all the same.
fn inject(ctx: &ConnCtx, headers: &mut HeaderMap) {
    let used = crate::secrets::secret::inject(ctx.session.attachments_for(&ctx.name), headers);
    if used.is_empty() {
        return;
    }
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    // A gRPC server compresses messages only for a client that said it can
    // decode them: say nothing, and a compressed reply is refused anyway.
    headers.remove("grpc-accept-encoding");
    let mut stats = ctx.stats.lock().unwrap_or_else(|p| p.into_inner());
    for name in used {
        if !stats.attachments_used.iter().any(|n| n == name) {
            stats.attachments_used.push(name.to_owned());
        }
    }
}

/// The destination's response as the session gets it: hop-by-hop headers
/// gone, and, for a session with attachments, masked (decoded first when a
/// destination holding an attachment compressed it).
fn rewrite_response(
    resp: Response<Incoming>,
    ctx: &ConnCtx,
    attached: bool,
) -> Result<Response<ProxyBody>, reply::ReplyRefusal> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::default();
    let body = reply::filter(
        &mut parts.headers,
        body,
        ctx.session.mask.as_ref(),
        attached,
        &ctx.masked,
    )?;
    Ok(Response::from_parts(parts, Either::Left(body)))
}

/// The HTTP status each refusal answers with.
pub fn status_of(reason: Refusal) -> StatusCode {
    match reason {
        Refusal::HostMismatch => StatusCode::MISDIRECTED_REQUEST,
        Refusal::UpgradeRefused | Refusal::ApprovalDeclined | Refusal::ApprovalWithdrawn => {
            StatusCode::FORBIDDEN
        }
        Refusal::GrpcNeedsHttp2 | Refusal::UpstreamFailed => StatusCode::BAD_GATEWAY,
        Refusal::SessionEnded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::FORBIDDEN,
    }
}

/// The gRPC status code each refusal maps to.
fn grpc_status_of(reason: Refusal) -> u16 {
    match reason {
        // UNIMPLEMENTED: the destination cannot carry gRPC.
        Refusal::GrpcNeedsHttp2 => 12,
        // UNAVAILABLE: a network or lifecycle failure, not a policy.
        Refusal::UpstreamFailed | Refusal::SessionEnded => 14,
        // PERMISSION_DENIED: a policy refusal.
        _ => 7,
    }
}

fn message_of(reason: Refusal) -> &'static str {
    match reason {
        Refusal::HostMismatch => "the request names a host other than the host of its connection",
        Refusal::UpgradeRefused => "the gateway passes on only requests that it can read; protocol upgrades and CONNECT are refused",
        Refusal::GrpcNeedsHttp2 => "a gRPC request went to a destination that answered over HTTP/1.1",
        Refusal::UpstreamFailed => "the gateway could not reach the destination",
        Refusal::ApprovalDeclined => "a named person declined, or no decision came within five minutes",
        Refusal::ApprovalWithdrawn => "the approval was withdrawn because the session paused or ended",
        Refusal::SessionEnded => "the session ended",
        _ => "refused by the gateway",
    }
}

/// The gateway's own answer, through the session's masker like every
/// reply: it is built from fixed text, so nothing should match, but no
/// path to the session skips the masker.
fn masked_refusal(ctx: &ConnCtx, reason: Refusal, grpc: bool) -> Response<ProxyBody> {
    let (mut parts, mut body) = refusal_parts(reason, grpc);
    if let Some(set) = &ctx.session.mask {
        let mut masker = crate::secrets::mask::Masker::new(Arc::clone(set));
        reply::mask_headers(&mut masker, &mut parts.headers);
        masker.mask_all(&mut body);
    }
    Response::from_parts(parts, Either::Right(Full::new(Bytes::from(body))))
}

/// The gateway's own answer for a refused request: its head and body.
fn refusal_parts(reason: Refusal, grpc: bool) -> (hyper::http::response::Parts, Vec<u8>) {
    let body = if grpc {
        Vec::new()
    } else {
        Vec::from(
            serde_json::json!({"refusal": reason.as_str(), "message": message_of(reason)})
                .to_string()
                + "\n",
        )
    };
    let mut resp = Response::new(());
    if !grpc {
        *resp.status_mut() = status_of(reason);
    }
    let headers = resp.headers_mut();
    headers.insert(REFUSAL_HEADER, HeaderValue::from_static(reason.as_str()));
    if grpc {
        // A trailers-only gRPC answer: HTTP 200 with the status in headers.
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from(grpc_status_of(reason)));
        let msg = format!("refused by the gateway: {}", reason.as_str());
        if let Ok(v) = HeaderValue::from_str(&msg) {
            headers.insert("grpc-message", v);
        }
    } else {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    (resp.into_parts().0, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_matching() {
        let name = name::canonicalize("api.example.com").unwrap();
        for (authority, ok) in [
            ("api.example.com", true),
            ("API.Example.com.", true),
            ("api.example.com:443", true),
            ("api.example.com:8443", false),
            ("api.example.com:", false),
            ("user@api.example.com", false),
            ("other.example.com", false),
            ("sub.api.example.com", false),
            ("127.0.0.1", false),
            ("[::1]:443", false),
            ("", false),
        ] {
            assert_eq!(names_host(authority, &name), ok, "{authority:?}");
        }
    }

    #[test]
    fn grpc_content_types() {
        let mut h = HeaderMap::new();
        for (ct, want) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC+json", true),
            ("application/grpc; charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
            ("application/grp", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&h), want, "{ct}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-end-to-end", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn requests_are_rewritten_for_the_destination() {
        let name = name::canonicalize("api.example.com").unwrap();
        let path = "/v1/items/%20x?q=a%2Fb&r=1";
        // An HTTP/1.1 session sends origin-form; an HTTP/2 session an
        // absolute URI: both reach the destination with the same path.
        for sent in [path.to_owned(), format!("https://api.example.com{path}")] {
            let req = || {
                Request::builder()
                    .uri(sent.as_str())
                    .header(header::HOST, "api.example.com")
                    .header(header::TE, "trailers, deflate")
                    .header(header::CONNECTION, "close")
                    .body(())
                    .unwrap()
            };
            let target = Target::new(&name);
            let h2 = rewrite_request(req(), &target, Proto::Http2);
            assert_eq!(h2.version(), Version::HTTP_2);
            assert_eq!(
                h2.uri().to_string(),
                format!("https://api.example.com{path}")
            );
            assert!(h2.headers().get(header::HOST).is_none());
            assert!(h2.headers().get(header::CONNECTION).is_none());
            assert_eq!(h2.headers()[header::TE], "trailers");
            let h1 = rewrite_request(req(), &target, Proto::Http1);
            assert_eq!(h1.version(), Version::HTTP_11);
            assert_eq!(h1.uri().to_string(), path);
            assert_eq!(h1.headers()[header::HOST], "api.example.com");
        }
        // OPTIONS * keeps its asterisk (RFC 9113 8.3.1).
        let star = Request::builder().uri("*").body(()).unwrap();
        let star = rewrite_request(star, &Target::new(&name), Proto::Http2);
        assert_eq!(star.uri().path_and_query().unwrap().as_str(), "*");
        assert_eq!(star.uri().authority().unwrap().as_str(), "api.example.com");
    }

    /// Every HTTP/2 stream spawns a task holding this future, and every
    /// request moves it: the rare, large parts (a new upstream connection,
    /// a hold for approval) are boxed so it stays small. It was 8.5 KiB
    /// with them inline; 2 KiB without.
    #[test]
    fn request_future_stays_small() {
        fn size_of_return<F, Fut>(_: F) -> usize
        where
            F: Fn(Arc<ConnCtx>, Request<Incoming>) -> Fut,
        {
            std::mem::size_of::<Fut>()
        }
        let size = size_of_return(handle);
        assert!(size <= 3 * 1024, "proxy::handle's future is {size} bytes");
    }
}
