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
//! A refusal is the gateway's own answer ([`crate::http::answers`]), with a
//! cause from [`Cause`] (or the pool's and the reply filter's) in the log
//! and the record.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{self, PathAndQuery, Scheme};
use hyper::{Method, Request, Response, Uri, Version};

use crate::gate::name::{self, Name};
use crate::http::answers::{self, ProxyBody};
use crate::http::connection::{Connection, Target};
use crate::records::record::RequestRecord;
use crate::refusal::REFUSAL_HEADER;
use crate::refusal::{causes, Refusal, Refused};
use crate::secrets::{decode, reply};
use crate::session::approvals::{Outcome, RoutedPath};
use crate::session::share;
use crate::session::upstream::{Proto, Sender, Want};

causes! {
    /// Why a request was refused, beside the upstream pool's
    /// (`ConnectFailure`) and the reply filter's (`ReplyRefusal`) causes.
    pub enum Cause {
        /// `host_mismatch`: the `:authority` or absolute-form target.
        Authority => "authority",
        /// `host_mismatch`: the `Host` header (another host, or two).
        HostHeader => "host_header",
        /// `upgrade_refused`: CONNECT.
        Connect => "connect",
        /// `upgrade_refused`: HTTP/2 extended CONNECT (WebSockets over HTTP/2).
        ExtendedConnect => "extended_connect",
        /// `upgrade_refused`: an `Upgrade` header.
        UpgradeHeader => "upgrade_header",
        /// `upgrade_refused`: the h2c `HTTP2-Settings` header.
        H2cSettings => "h2c_settings",
        /// `upgrade_refused`: `Connection: upgrade`.
        ConnectionUpgrade => "connection_upgrade",
        /// `grpc_needs_http2`: the destination chose HTTP/1.1.
        DestinationSpeaksHttp1 => "destination_speaks_http1",
        /// `upstream_failed`: the destination connection closed before the request.
        UpstreamClosed => "upstream_closed",
        /// `upstream_failed`: the request or its reply head failed.
        UpstreamRequestFailed => "upstream_request_failed",
        /// `approval_withdrawn`: the authority ended during the hold.
        Withdrawn => "session_ended",
        /// `approval_declined`: a named person declined.
        Declined => "declined",
        /// `approval_declined`: no decision within the timeout.
        NoDecision => "no_decision",
        /// `approval_declined`: no approval relay to ask.
        NoRelay => "no_relay",
        /// `approval_declined`: the relay refused the proposal (no card).
        RelayRefused => "relay_refused",
        /// `approval_declined`: the relay did not take the proposal in
        /// time (`session::approvals::DELIVERY_TIMEOUT`).
        RelayUnreachable => "relay_unreachable",
        /// `session_ended`: the authority's lease had lapsed when the
        /// request came.
        LeaseExpired => "lease_expired",
        /// `session_ended`: the authority is suspended since this process
        /// was frozen, until the control plane renews it.
        SuspendedAfterFreeze => "suspended_after_freeze",
        /// `upstream_failed`: the canonical path would not form a request
        /// (never seen: it is made of the bytes of a path hyper accepted).
        PathNotForwardable => "path_not_forwardable",
    }
}

fn refused(reason: Refusal, cause: Cause) -> Refused {
    Refused::new(reason, cause.as_str())
}

/// Serve one request to the destination `target` of `conn`, at the
/// addresses the gate checked.
pub async fn handle(
    conn: &Arc<Connection>,
    target: &Target,
    addrs: &[std::net::IpAddr],
    req: Request<Incoming>,
    entry: &mut RequestRecord,
) -> Response<ProxyBody> {
    let grpc = is_grpc(req.headers());
    match forward(conn, target, addrs, req, grpc, entry).await {
        Ok(resp) => resp,
        Err(refusal) => {
            super::connection::refuse(conn, entry, &refusal);
            if refusal.reason == Refusal::SessionLimit {
                // A session pushing at a bound of its share is answered
                // after a pause, so that pushing costs the session time
                // rather than the gateway work. Boxed: rare, and a timer
                // would widen every request's future.
                Box::pin(tokio::time::sleep(share::REFUSAL_PAUSE)).await;
            }
            answers::refusal(conn, refusal, grpc)
        }
    }
}

async fn forward(
    conn: &Arc<Connection>,
    target: &Target,
    addrs: &[std::net::IpAddr],
    req: Request<Incoming>,
    grpc: bool,
    entry: &mut RequestRecord,
) -> Result<Response<ProxyBody>, Refused> {
    let mut req = req;
    check_host(&req, &conn.name)?;
    check_no_upgrade(&req)?;
    if let Some(routed) = judge(conn, &mut req, entry)? {
        check_lock(conn, &req, &routed, entry).await?;
    }
    let pool = &conn.session.pool;
    // A plain HTTP/1.1 request goes on as HTTP/1.1; HTTP/2 and gRPC as the
    // destination chooses (see `upstream`).
    let want = if req.version() == Version::HTTP_11 && !grpc {
        Want::Http1
    } else {
        Want::Any
    };
    let checkout = pool
        .checkout(&conn.name, addrs, want)
        .await
        .map_err(|f| Refused::new(Refusal::UpstreamFailed, f.as_str()))?;
    let proto = checkout.proto();
    conn.tally(|t| t.upstream(proto.alpn(), checkout.addr));
    if grpc && proto == Proto::Http1 {
        if let Sender::H1(s) = checkout.sender {
            pool.give_back_h1(&conn.name, s, checkout.addr);
        }
        return Err(refused(
            Refusal::GrpcNeedsHttp2,
            Cause::DestinationSpeaksHttp1,
        ));
    }
    let mut upstream_req = rewrite_request(req, target, proto);
    inject(conn, upstream_req.headers_mut());
    let closed = || refused(Refusal::UpstreamFailed, Cause::UpstreamClosed);
    let sent = match checkout.sender {
        Sender::H2(mut s) => {
            s.ready().await.map_err(|_| closed())?;
            s.send_request(upstream_req).await
        }
        Sender::H1(mut s) => {
            s.ready().await.map_err(|_| closed())?;
            let response = s.send_request(upstream_req);
            // Back in the pool now; it is picked again once it is ready,
            // that is once this response has been read to its end.
            pool.give_back_h1(&conn.name, s, checkout.addr);
            response.await
        }
    };
    let resp = sent.map_err(|e| {
        tracing::debug!(destination = %conn.name, error = %e, "upstream request failed");
        refused(Refusal::UpstreamFailed, Cause::UpstreamRequestFailed)
    })?;
    let attached = conn.session.has_attachments(&conn.name);
    rewrite_response(resp, conn, attached)
        .map_err(|r| Refused::new(Refusal::UpstreamFailed, r.as_str()))
}

/// Headers that ask a destination to act as if the request had another
/// method. Toward a destination the Lock governs they are removed, so the
/// method the Lock judged is the one the destination acts on.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The Lock judges the path the destination will route
/// ([`talos_contract::path`]): toward a destination a rule of the session
/// governs, the request goes on with its canonical path (query kept) and
/// without method-override headers, and its record carries the canonical
/// path. Returns the path as judged; `None` when no rule governs the
/// destination, and the request goes on as it came.
fn judge<B>(
    conn: &Connection,
    req: &mut Request<B>,
    entry: &mut RequestRecord,
) -> Result<Option<RoutedPath>, Refused> {
    let rules = conn.session.approvals.rules();
    if !rules.iter().any(|r| r.governs(&conn.name)) {
        return Ok(None);
    }
    let routed = RoutedPath::new(req.uri().path());
    if routed.canonical() != req.uri().path() {
        *req.uri_mut() = with_path(req.uri(), routed.canonical())
            .ok_or(refused(Refusal::UpstreamFailed, Cause::PathNotForwardable))?;
        entry.judged_path(routed.canonical());
    }
    let headers = req.headers_mut();
    for name in METHOD_OVERRIDES {
        headers.remove(name);
    }
    Ok(Some(routed))
}

/// `uri` with its path replaced by `path` (its query kept).
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let with_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::from_maybe_shared(with_query).ok()?);
    Uri::from_parts(parts).ok()
}

/// Hold the request if a Lock rule matches it, until a decision: goes on
/// when approved; `approval_declined` or `approval_withdrawn` otherwise.
async fn check_lock(
    conn: &Connection,
    req: &Request<Incoming>,
    routed: &RoutedPath,
    entry: &mut RequestRecord,
) -> Result<(), Refused> {
    let approvals = &conn.session.approvals;
    let mut ask = conn.ask(
        talos_certs::ProposalKind::Request,
        req.method().as_str(),
        routed,
    );
    ask.attachments = conn
        .session
        .attachments_for(&conn.name)
        .map(|a| a.secret.as_str())
        .collect();
    let Some(rule) = approvals.rule_for(&ask).cloned() else {
        return Ok(());
    };
    // On the heap, like a new upstream connection: rare, and large.
    let (outcome, record) = Box::pin(conn.hold(&rule, &ask))
        .await
        .map_err(|at| at.refused())?;
    entry.approval = Some(record);
    match outcome {
        Outcome::Approved { .. } => Ok(()),
        Outcome::Withdrawn => Err(refused(Refusal::ApprovalWithdrawn, Cause::Withdrawn)),
        Outcome::Declined { .. } => Err(refused(Refusal::ApprovalDeclined, Cause::Declined)),
        Outcome::TimedOut => Err(refused(Refusal::ApprovalDeclined, Cause::NoDecision)),
        Outcome::NoRelay => Err(refused(Refusal::ApprovalDeclined, Cause::NoRelay)),
        Outcome::RelayRefused => Err(refused(Refusal::ApprovalDeclined, Cause::RelayRefused)),
        Outcome::RelayUnreachable => {
            Err(refused(Refusal::ApprovalDeclined, Cause::RelayUnreachable))
        }
    }
}

/// `host_mismatch` when the request names a host other than the
/// connection's: the `Host` header, the HTTP/2 `:authority` or an
/// absolute-form target. Port 443 or none; anything else is another host.
fn check_host(req: &Request<Incoming>, name: &Name) -> Result<(), Refused> {
    if let Some(authority) = req.uri().authority() {
        if !names_host(authority.as_str(), name) {
            return Err(refused(Refusal::HostMismatch, Cause::Authority));
        }
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    if let Some(host) = hosts.next() {
        let ok = host.to_str().is_ok_and(|h| names_host(h, name));
        if !ok || hosts.next().is_some() {
            return Err(refused(Refusal::HostMismatch, Cause::HostHeader));
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
            Cause::ExtendedConnect
        } else {
            Cause::Connect
        };
        return Err(refused(Refusal::UpgradeRefused, cause));
    }
    let headers = req.headers();
    if headers.contains_key(header::UPGRADE) {
        return Err(refused(Refusal::UpgradeRefused, Cause::UpgradeHeader));
    }
    if headers.contains_key("http2-settings") {
        return Err(refused(Refusal::UpgradeRefused, Cause::H2cSettings));
    }
    if connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return Err(refused(Refusal::UpgradeRefused, Cause::ConnectionUpgrade));
    }
    Ok(())
}

pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    // application/grpc, application/grpc+proto, …; not grpc-web, which is
    // made for HTTP/1.1.
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| decode::grpc_kind(ct.as_bytes()) == Some(decode::GrpcKind::Grpc))
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

/// Request headers that choose a piece of the reply. The session may not
/// choose pieces of a reply that can hold an attached value: each piece
/// could be shorter than the value, so none would be masked, and together
/// they would spell it. `Request-Range` is the pre-standard spelling some
/// servers still honour.
const RANGE_HEADERS: [&str; 3] = ["range", "if-range", "request-range"];

/// Attach the session's credentials for this destination
/// ([`crate::secrets::secret::inject`]: every copy the session sent is replaced).
/// Destinations with
/// attachments are also asked for an uncompressed reply, so the masker sees
/// the bytes (a compressed reply is decoded all the same), and for the
/// whole reply, never a range of it (a `206` from them is refused).
fn inject(conn: &Connection, headers: &mut HeaderMap) {
    let used = crate::secrets::secret::inject(conn.session.attachments_for(&conn.name), headers);
    if used.is_empty() {
        return;
    }
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    for name in RANGE_HEADERS {
        headers.remove(name);
    }
    // A gRPC server compresses messages only for a client that said it can
    // decode them: say nothing, and a compressed reply is refused anyway.
    headers.remove("grpc-accept-encoding");
    conn.tally(|t| t.attachments(used));
}

/// The destination's response as the session gets it: hop-by-hop headers
/// and `hangar-refusal` gone, nothing of hyper's extensions but the
/// reason phrase, and, for a session with attachments, masked — head and
/// body — after [`decode::plan`] has read the head as the destination sent
/// it, when that destination holds an attachment.
fn rewrite_response(
    resp: Response<Incoming>,
    conn: &Arc<Connection>,
    attached: bool,
) -> Result<Response<ProxyBody>, reply::ReplyRefusal> {
    let (mut parts, body) = resp.into_parts();
    let mask = conn.session.mask.as_ref();
    // Decided before hop-by-hop headers go: a coding the reply's own
    // `Connection` header names still coded its body.
    let plan = match mask {
        Some(_) if attached => Some(decode::plan(parts.status.as_u16(), &parts.headers)?),
        _ => None,
    };
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(REFUSAL_HEADER);
    parts.version = Version::default();
    // hyper's HTTP/1.1 client keeps a reason phrase other than the
    // standard one, and its server writes it: masked like a header value,
    // or dropped. No other extension of the destination's goes on.
    let reason = parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    parts.extensions = hyper::http::Extensions::new();
    if let Some(reason) = reason {
        let phrase = match mask {
            None => Some(reason),
            Some(set) => {
                let mut bytes = reason.as_bytes().to_vec();
                crate::secrets::mask::Masker::new(Arc::clone(set)).mask_all(&mut bytes);
                hyper::ext::ReasonPhrase::try_from(bytes).ok()
            }
        };
        if let Some(phrase) = phrase {
            parts.extensions.insert(phrase);
        }
    }
    let body = reply::filter(
        &mut parts.headers,
        body,
        mask,
        plan,
        conn.session.share.decode(),
        Arc::clone(conn) as Arc<dyn reply::MaskedReport>,
    )?;
    Ok(Response::from_parts(
        parts,
        http_body_util::Either::Left(body),
    ))
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

    proptest::proptest! {
        /// Whatever path hyper accepts, its canonical form makes a request
        /// again, query kept: `path_not_forwardable` never happens.
        #[test]
        fn canonical_paths_always_form_a_request(
            path in "/[!$-;=@-_a-z|~%.]{0,40}",
            query in proptest::option::of("[a-z=&%/.]{0,10}"),
        ) {
            let target = match &query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let Ok(uri) = target.parse::<Uri>() else {
                return Ok(());
            };
            let routed = RoutedPath::new(uri.path());
            let again = with_path(&uri, routed.canonical());
            proptest::prop_assert!(again.is_some(), "{target}");
            let again = again.unwrap();
            proptest::prop_assert_eq!(again.path(), routed.canonical());
            proptest::prop_assert_eq!(again.query(), uri.query());
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
}
