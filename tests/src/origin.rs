//! A real TLS origin on 127.0.0.1 with its own test CA: TLS 1.3, ALPN h2
//! and http/1.1, answering every request with a short text naming the
//! protocol and path.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::wait::DEADLINE;

/// A test CA that can sign origin certificates.
#[derive(Debug)]
pub struct TestCa {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    params: CertificateParams,
    key: KeyPair,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-signed");
        TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            params,
            key,
        }
    }

    /// A leaf for `names`, signed by this CA: (chain, key).
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.leaf_with(names, false)
    }

    /// A leaf for `names`; `expired` makes one whose validity ended a day ago.
    pub fn leaf_with(
        &self,
        names: &[&str],
        expired: bool,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        if expired {
            let now = time_now();
            params.not_before = now - std::time::Duration::from_secs(10 * 86_400);
            params.not_after = now - std::time::Duration::from_secs(86_400);
        }
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        (
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }

    /// A leaf for `names` as PEM text: (certificate, PKCS#8 key).
    pub fn leaf_pem(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let params = CertificateParams::new(names).expect("leaf params");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        (cert.pem(), key.serialize_pem())
    }

    /// Write the CA certificate as PEM to `path`.
    pub fn write_pem(&self, path: &Path) {
        std::fs::write(path, &self.cert_pem).expect("write ca pem");
    }
}

/// A running origin; stops when dropped.
#[derive(Debug)]
pub struct Origin {
    pub addr: SocketAddr,
    events: Arc<Events>,
    task: tokio::task::JoinHandle<()>,
}

/// TLS connections the origin has seen so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Completed TLS handshakes.
    pub accepted: usize,
    /// Of those, connections that have ended (either side closed).
    pub closed: usize,
    /// Of the accepted, handshakes that resumed a TLS session the origin
    /// had given a ticket for (its rustls cache, in memory).
    pub resumed: usize,
}

/// What the origin's tasks tell the test.
#[derive(Debug)]
struct Events {
    seen: tokio::sync::watch::Sender<Seen>,
    /// Names of `/hold/NAME/…` requests that have arrived.
    held: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
    /// Names the test has released.
    released: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
    /// The path of every request that arrived, in order.
    paths: std::sync::Mutex<Vec<String>>,
}

impl Events {
    fn new() -> Events {
        Events {
            seen: tokio::sync::watch::Sender::new(Seen::default()),
            held: tokio::sync::watch::Sender::new(Default::default()),
            released: tokio::sync::watch::Sender::new(Default::default()),
            paths: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// Wait (at most [`DEADLINE`]) until `done` holds for the value in `tx`;
/// panics naming `what` and the last value.
async fn wait_for<T: std::fmt::Debug + Clone>(
    tx: &tokio::sync::watch::Sender<T>,
    what: &str,
    done: impl FnMut(&T) -> bool,
) -> T {
    let mut rx = tx.subscribe();
    let got = tokio::time::timeout(DEADLINE, async {
        let v = rx.wait_for(done).await;
        v.expect("the origin holds the sender").clone()
    })
    .await;
    got.unwrap_or_else(|_| {
        panic!(
            "the origin did not see {what} within {} s: {:?}",
            DEADLINE.as_secs(),
            *tx.borrow()
        )
    })
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TLS 1.3 server config with `provider`, one certificate chain and
/// key, offering `alpn`: what every test origin serves with.
pub(crate) fn tls13_server(
    provider: Arc<rustls::crypto::CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("origin cert");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

impl Origin {
    /// Serve TLS 1.3 for `names` (certificate from `ca`) on 127.0.0.1:0.
    pub async fn start(ca: &TestCa, names: &[&str]) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        Origin::serve(listener, ca, names)
    }

    /// Serve on an already bound listener.
    pub fn serve(listener: TcpListener, ca: &TestCa, names: &[&str]) -> Origin {
        let (chain, key) = ca.leaf(names);
        Origin::serve_cert(listener, chain, key, &[b"h2", b"http/1.1"])
    }

    /// Serve with this certificate chain and key, offering `alpn`.
    pub fn serve_cert(
        listener: TcpListener,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        alpn: &[&[u8]],
    ) -> Origin {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        Origin::serve_config(listener, tls13_server(provider, chain, key, alpn))
    }

    /// Serve as [`Origin::serve`] does, but choosing the suite by the
    /// server's order, TLS_AES_128_GCM_SHA256 first, as the gateway and
    /// the benchmarks' nginx and HAProxy do: the benchmarks' origin, so
    /// that a client talking to it directly (the comparison's reference
    /// columns) pays for the same handshake and records as through a
    /// proxy, not for SHA-384 and AES-256 because OpenSSL's clients list
    /// them first.
    pub fn serve_by_server_order(listener: TcpListener, ca: &TestCa, names: &[&str]) -> Origin {
        use rustls::crypto::aws_lc_rs::{cipher_suite, default_provider};
        let (chain, key) = ca.leaf(names);
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![
                cipher_suite::TLS13_AES_128_GCM_SHA256,
                cipher_suite::TLS13_AES_256_GCM_SHA384,
                cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
            ],
            ..default_provider()
        });
        let mut config = tls13_server(provider, chain, key, &[b"h2", b"http/1.1"]);
        config.ignore_client_order = true;
        Origin::serve_config(listener, config)
    }

    /// Serve TLS with `config`.
    fn serve_config(listener: TcpListener, config: rustls::ServerConfig) -> Origin {
        let addr = listener.local_addr().expect("origin addr");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let events = Arc::new(Events::new());
        let shared = Arc::clone(&events);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let events = Arc::clone(&shared);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let resumed =
                        tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                    events.seen.send_modify(|s| {
                        s.accepted += 1;
                        s.resumed += usize::from(resumed);
                    });
                    let for_requests = Arc::clone(&events);
                    let service = hyper::service::service_fn(move |req: Request<_>| {
                        for_requests
                            .paths
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(req.uri().path().to_owned());
                        answer(req, Arc::clone(&for_requests))
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                    events.seen.send_modify(|s| s.closed += 1);
                });
            }
        });
        Origin { addr, events, task }
    }

    /// The path of every request that has reached the origin so far, in
    /// the order they arrived: what a test checks to know that a request
    /// was (or was never) served.
    pub fn paths(&self) -> Vec<String> {
        self.events
            .paths
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The paths that arrived that start with `prefix`, in order.
    pub fn paths_starting(&self, prefix: &str) -> Vec<String> {
        self.paths()
            .into_iter()
            .filter(|p| p.starts_with(prefix))
            .collect()
    }

    /// The connections seen so far.
    pub fn seen(&self) -> Seen {
        *self.events.seen.borrow()
    }

    /// Wait (at most [`DEADLINE`]) until at least `n` TLS connections have
    /// been accepted; returns what was seen then.
    pub async fn wait_accepted(&self, n: usize) -> Seen {
        wait_for(
            &self.events.seen,
            &format!("{n} connections accepted"),
            |s| s.accepted >= n,
        )
        .await
    }

    /// Wait (at most [`DEADLINE`]) until at least `n` connections have ended;
    /// returns what was seen then.
    pub async fn wait_closed(&self, n: usize) -> Seen {
        wait_for(&self.events.seen, &format!("{n} connections closed"), |s| {
            s.closed >= n
        })
        .await
    }

    /// The origin's held requests, as a handle a test can move elsewhere.
    pub fn holds(&self) -> Holds {
        Holds(Arc::clone(&self.events))
    }

    /// Wait (at most [`DEADLINE`]) until the request `/hold/NAME/…` has
    /// arrived (it waits there until [`Origin::release`]).
    pub async fn wait_held(&self, name: &str) {
        self.holds().wait_held(name).await;
    }

    /// Let the request `/hold/NAME/…` (arrived or still to come) go on.
    pub fn release(&self, name: &str) {
        self.holds().release(name);
    }
}

/// The `/hold/NAME/…` requests of one origin; see [`Origin::holds`].
#[derive(Debug, Clone)]
pub struct Holds(Arc<Events>);

impl Holds {
    /// See [`Origin::wait_held`].
    pub async fn wait_held(&self, name: &str) {
        wait_for(
            &self.0.held,
            &format!("the request /hold/{name}/…"),
            |h| h.contains(name),
        )
        .await;
    }

    /// See [`Origin::release`].
    pub fn release(&self, name: &str) {
        self.0.released.send_modify(|r| {
            r.insert(name.to_owned());
        });
    }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

type Body = http_body_util::Either<Full<Bytes>, http_body_util::StreamBody<DownloadStream>>;
type DownloadStream = futures_util::stream::BoxStream<
    'static,
    Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
>;

/// The origin's routes:
/// - `/echo`: JSON with the method, version, path and query, and every
///   request header (name and value) as the origin received them;
/// - `/upload`: reads the whole body, answers its length and SHA-256;
/// - `/download/N`: N bytes of a fixed pattern, streamed in 64 KiB frames;
/// - `/close`: `closing` with `Connection: close` (HTTP/1.1: the origin
///   closes the connection after it);
/// - `/none`: 204, no body;
/// - `/slow/MS`: `slow`, answered MS milliseconds (at most 10 s) after the
///   request came;
/// - `/bytes/N`: the first N bytes (at most 64 KiB) of the same pattern in
///   one body with a `Content-Length`, as a file server or an API answers a
///   small object: the benchmarks' small reply, cheap for the origin;
/// - `/hold/NAME/REST`: tells the test it arrived ([`Origin::wait_held`]),
///   waits until the test releases NAME ([`Origin::release`]), then
///   answers as `/REST` would: a request the test knows is in flight;
/// - anything else: `origin says hello: VERSION METHOD PATH`.
async fn answer(
    mut req: Request<hyper::body::Incoming>,
    events: Arc<Events>,
) -> Result<Response<Body>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    use sha2::Digest;
    let path = req.uri().path().to_owned();
    if let Some((name, rest)) = path.strip_prefix("/hold/").and_then(|r| r.split_once('/')) {
        let name = name.to_owned();
        let mut released = events.released.subscribe();
        events.held.send_modify(|h| {
            h.insert(name.clone());
        });
        let _ = released.wait_for(|r| r.contains(&name)).await;
        *req.uri_mut() = format!("/{rest}").parse().expect("a path");
        return Box::pin(answer(req, events)).await;
    }
    if path == "/reflect" {
        return Ok(reflect(&req));
    }
    if let Some(ms) = path
        .strip_prefix("/slow/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        tokio::time::sleep(std::time::Duration::from_millis(ms.min(10_000))).await;
        return Ok(whole(Bytes::from_static(b"slow")));
    }
    if path == "/close" {
        let mut res = whole(Bytes::from_static(b"closing"));
        res.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        return Ok(res);
    }
    if path == "/none" {
        let mut res = whole(Bytes::new());
        *res.status_mut() = hyper::StatusCode::NO_CONTENT;
        return Ok(res);
    }
    let text = if path == "/echo" {
        let headers: Vec<(String, String)> = req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        serde_json::json!({
            "method": req.method().as_str(),
            "version": format!("{:?}", req.version()),
            "path": path,
            "query": req.uri().query(),
            "headers": headers,
            // Digests let a test check a value the gateway masks in replies.
            "sha256": req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), hex::encode(sha2::Sha256::digest(v.as_bytes()))))
                .collect::<std::collections::BTreeMap<_, _>>(),
        })
        .to_string()
    } else if path == "/upload" {
        let mut body = req.into_body();
        let mut hash = sha2::Sha256::new();
        let mut len = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Some(data) = frame.data_ref() {
                len += data.len() as u64;
                hash.update(data);
            }
        }
        serde_json::json!({"len": len, "sha256": hex::encode(hash.finalize())}).to_string()
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        return Ok(match n.parse::<usize>() {
            Ok(n) if n <= FRAME as usize => whole(pattern_block().slice(..n)),
            _ => {
                let mut res = whole(Bytes::from_static(b"bytes: N is a number up to 65536\n"));
                *res.status_mut() = hyper::StatusCode::BAD_REQUEST;
                res
            }
        });
    } else if let Some(n) = path
        .strip_prefix("/download/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        return Ok(Response::new(http_body_util::Either::Right(
            http_body_util::StreamBody::new(download(n)),
        )));
    } else {
        format!(
            "origin says hello: {:?} {} {}\n",
            req.version(),
            req.method(),
            path
        )
    };
    Ok(whole(Bytes::from(text)))
}

/// A reply with `body`, whole, in one frame with a `Content-Length`.
fn whole(body: Bytes) -> Response<Body> {
    Response::new(http_body_util::Either::Left(Full::new(body)))
}

/// `/reflect?how=…&enc=…&header=…`: a destination that echoes the request
/// header `header` (default `authorization`) back, as a careless or hostile
/// API might:
/// - `how=header`: in a response header `x-reflected`;
/// - `how=body`: in the body, `your credential is <value>`;
/// - `how=trailer`: in a trailer `x-reflected` (HTTP/2 or chunked);
/// - `how=base64`: base64 of the value inside a JSON body;
/// - `how=chunks`: the body sent one byte per frame;
/// - `enc=gzip|deflate|br|zstd`: the body compressed with that coding,
///   whatever the request's `accept-encoding` said.
fn reflect(req: &Request<hyper::body::Incoming>) -> Response<Body> {
    use base64::Engine;
    let query = req.uri().query().unwrap_or("");
    let param = |k: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.to_owned())
    };
    let header = param("header").unwrap_or_else(|| "authorization".into());
    let value = req
        .headers()
        .get(header.as_str())
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let how = param("how").unwrap_or_else(|| "body".into());
    let mut body = match how.as_str() {
        "base64" => format!(
            "{{\"echo\": \"{}\"}}",
            base64::engine::general_purpose::STANDARD.encode(&value)
        )
        .into_bytes(),
        "header" | "trailer" => b"see the headers".to_vec(),
        _ => [b"your credential is ".as_slice(), &value, b"\n"].concat(),
    };
    let enc = param("enc");
    if let Some(enc) = &enc {
        body = compress(enc, &body);
    }
    let mut frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> =
        if how == "chunks" {
            body.iter()
                .map(|b| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(&[*b]))))
                .collect()
        } else {
            vec![Ok(hyper::body::Frame::data(Bytes::from(body)))]
        };
    if how == "trailer" {
        let mut trailers = hyper::HeaderMap::new();
        if let Ok(v) = hyper::header::HeaderValue::from_bytes(&value) {
            trailers.insert("x-reflected", v);
        }
        frames.push(Ok(hyper::body::Frame::trailers(trailers)));
    }
    let stream: DownloadStream = Box::pin(futures_util::stream::iter(frames));
    let mut resp = Response::new(http_body_util::Either::Right(
        http_body_util::StreamBody::new(stream),
    ));
    if how == "header" {
        if let Ok(v) = hyper::header::HeaderValue::from_bytes(&value) {
            resp.headers_mut().insert("x-reflected", v);
        }
    }
    if how == "trailer" {
        resp.headers_mut().insert(
            "trailer",
            hyper::header::HeaderValue::from_static("x-reflected"),
        );
    }
    if let Some(enc) = enc {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&enc) {
            resp.headers_mut()
                .insert(hyper::header::CONTENT_ENCODING, v);
        }
    }
    resp
}

/// `data` compressed with `coding` (gzip, deflate, br, zstd).
pub fn compress(coding: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).expect("gzip");
            e.finish().expect("gzip")
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).expect("deflate");
            e.finish().expect("deflate")
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                e.write_all(data).expect("br");
            }
            out
        }
        "zstd" => zstd::stream::encode_all(data, 3).expect("zstd"),
        other => panic!("unknown coding {other}"),
    }
}

/// The byte at offset `i` of every download: a pattern a reader can check.
pub fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// The largest frame of a download, and the largest `/bytes/N`.
const FRAME: u64 = 64 * 1024;

/// The pattern from offset 0, long enough that a frame starting at any
/// offset's residue mod 251 is a slice of it; built once per process.
fn pattern_block() -> Bytes {
    static BLOCK: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    BLOCK
        .get_or_init(|| {
            (0..FRAME + 251)
                .map(pattern_byte)
                .collect::<Vec<u8>>()
                .into()
        })
        .clone()
}

fn download(n: u64) -> DownloadStream {
    use futures_util::StreamExt;
    let block = pattern_block();
    futures_util::stream::unfold(0u64, move |sent| {
        let block = block.clone();
        async move {
            if sent >= n {
                return None;
            }
            let len = FRAME.min(n - sent);
            let start = (sent % 251) as usize;
            let chunk = block.slice(start..start + len as usize);
            Some((Ok(hyper::body::Frame::data(chunk)), sent + len))
        }
    })
    .boxed()
}

/// One TLS origin for `name` on 127.0.0.1 with its own test CA (written to
/// `DIR/origin-ca.pem`), and a DNS server naming it: what most end-to-end
/// rigs put behind the gateway.
#[derive(Debug)]
pub struct LoopbackOrigin {
    pub origin: Origin,
    pub dns: crate::dns::DnsServer,
    ca_file: std::path::PathBuf,
}

impl LoopbackOrigin {
    pub async fn start(dir: &Path, name: &str) -> LoopbackOrigin {
        LoopbackOrigin::serving(dir, &[name]).await
    }

    /// One origin for all of `names`, each of them named by the DNS server.
    pub async fn serving(dir: &Path, names: &[&str]) -> LoopbackOrigin {
        LoopbackOrigin::serving_with(dir, names, std::collections::HashMap::new()).await
    }

    /// [`LoopbackOrigin::serving`], the DNS server answering `more` too
    /// (names elsewhere, names it never answers).
    pub async fn serving_with(
        dir: &Path,
        names: &[&str],
        more: std::collections::HashMap<String, crate::dns::Answer>,
    ) -> LoopbackOrigin {
        let ca = TestCa::new("origin test CA");
        let ca_file = dir.join("origin-ca.pem");
        ca.write_pem(&ca_file);
        let origin = Origin::start(&ca, names).await;
        let loopback = "127.0.0.1".parse().expect("loopback");
        let mut table: std::collections::HashMap<String, crate::dns::Answer> = names
            .iter()
            .map(|n| ((*n).to_owned(), crate::dns::Answer::Addrs(vec![loopback])))
            .collect();
        table.extend(more);
        let dns = crate::dns::DnsServer::start(table).await;
        LoopbackOrigin {
            origin,
            dns,
            ca_file,
        }
    }

    /// A gateway config that reaches the origin: its DNS server and port,
    /// its CA as an extra anchor, 127.0.0.1 let through.
    pub fn config(&self) -> crate::gateway::TestConfig {
        crate::gateway::TestConfig {
            dns: self.dns.addr,
            upstream_port: self.origin.addr.port(),
            anchors: vec![self.ca_file.clone()],
            permit_internal: vec!["127.0.0.1/32".into()],
            ..Default::default()
        }
    }
}
