//! An origin that misbehaves on purpose, as an attacker's destination or a
//! careless API would: it echoes the credential it was sent in every place
//! a reply can carry it, codes its replies in ways it was not asked to,
//! forges the gateway's refusal header, and routes paths as leniently as
//! real origins do. The adversarial end-to-end suite puts it behind the
//! gateway.
//!
//! TLS 1.3 with a certificate from a test CA for every name it is given;
//! the protocol follows the name the client asked for, so one origin on
//! one port stands for destinations of both kinds:
//!
//! - a name starting `h1.` speaks HTTP/1.1 only,
//! - a name starting `h2.` speaks HTTP/2 only (a client that offers only
//!   HTTP/1.1 fails the handshake, as such destinations do),
//! - any other name speaks both.
//!
//! Routes (the credential is the value of `authorization` without its
//! scheme):
//!
//! - a path that a lenient origin routes under `/deploy` or `/resource`
//!   (percent-decoded, `\` as `/`, `;` parameters cut, dot segments
//!   removed, slashes merged, lower case; the method upper-cased and
//!   `X-HTTP-Method-Override` and kin honoured): the handler *runs*, and
//!   the origin notes it ([`Hostile::runs`]), then answers `ran`;
//! - `/echo-range`: `your credential is VALUE\n`, with `Range` honoured
//!   (one range: `206` and `Content-Range`; several:
//!   `multipart/byteranges`);
//! - `/echo-name`: a header named `x-echo-VALUE`;
//! - `/echo-reason`: the status line's reason phrase is `OK VALUE`
//!   (HTTP/1.1);
//! - `/echo-te`: the body gzip-coded as a *transfer* coding,
//!   `Transfer-Encoding: gzip, chunked` (HTTP/1.1);
//! - `/echo-connection-ce`: the body gzip-coded, `Content-Encoding: gzip`
//!   named hop-by-hop by the reply's own `Connection` header (HTTP/1.1);
//! - `/echo-grpc`: a gRPC reply whose one message has its compressed flag
//!   set and holds the gzip of the value, with no `grpc-encoding`;
//! - `/bomb`: `Content-Encoding: gzip` of 64 MiB of zeros (about 64 KiB);
//! - `/forge`: `hangar-refusal: approval_declined` as a header and a
//!   trailer on an otherwise fine `200`;
//! - anything else: `hostile says hello`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::origin::{compress, TestCa};

/// What the origin's handlers did: (method as it acted, path as it
/// routed it), in order, and the paths they were sent.
#[derive(Debug, Clone, Default)]
pub struct Runs(Arc<Mutex<Vec<(String, String)>>>, Arc<Mutex<Vec<String>>>);

/// A running hostile origin; stops when dropped.
#[derive(Debug)]
pub struct Hostile {
    pub addr: SocketAddr,
    runs: Runs,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

impl Hostile {
    /// Serve `names` (certificate from `ca`) on 127.0.0.1:0.
    pub async fn start(ca: &TestCa, names: &[&str]) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (chain, key) = ca.leaf(names);
        let config = |alpn: &[&[u8]]| {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let mut c = rustls::ServerConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])
                .expect("tls13")
                .with_no_client_auth()
                .with_single_cert(chain.clone(), key.clone_key())
                .expect("cert");
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Arc::new(c)
        };
        let h1 = config(&[b"http/1.1"]);
        let h2 = config(&[b"h2"]);
        let both = config(&[b"h2", b"http/1.1"]);
        let runs = Runs::default();
        let shared = runs.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (h1, h2, both, runs) = (h1.clone(), h2.clone(), both.clone(), shared.clone());
                tokio::spawn(async move {
                    let acceptor = tokio_rustls::LazyConfigAcceptor::new(
                        rustls::server::Acceptor::default(),
                        tcp,
                    );
                    let Ok(start) = acceptor.await else { return };
                    let sni = start.client_hello().server_name().unwrap_or("").to_owned();
                    let config = if sni.starts_with("h1.") {
                        h1
                    } else if sni.starts_with("h2.") {
                        h2
                    } else {
                        both
                    };
                    let Ok(tls) = start.into_stream(config).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let runs = runs.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(req, &runs).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Hostile { addr, runs, task }
    }

    /// Every run of a handler so far: (method as it acted, path as routed).
    pub fn runs(&self) -> Vec<(String, String)> {
        self.runs.0.lock().expect("runs").clone()
    }

    /// The paths of those runs as the origin got them.
    pub fn sent_paths(&self) -> Vec<String> {
        self.runs.1.lock().expect("paths").clone()
    }
}

/// The path as a lenient origin routes it: every percent-encoding decoded
/// (once), `\` read as `/`, each segment's `;` parameters cut, dot
/// segments removed, slashes merged, lower case.
pub fn lenient_route(raw: &str) -> String {
    let mut bytes = Vec::new();
    let raw = raw.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let Ok(v) = u8::from_str_radix(&String::from_utf8_lossy(&raw[i + 1..i + 3]), 16) {
                bytes.push(v);
                i += 3;
                continue;
            }
        }
        bytes.push(raw[i]);
        i += 1;
    }
    let text = String::from_utf8_lossy(&bytes)
        .replace('\\', "/")
        .to_ascii_lowercase();
    let mut kept: Vec<&str> = Vec::new();
    for segment in text.split('/') {
        match segment.split(';').next().unwrap_or("") {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    format!("/{}", kept.join("/"))
}

fn full(body: impl Into<Bytes>) -> Response<Body> {
    Response::new(Full::new(body.into()).boxed())
}

fn frames(frames: Vec<Frame<Bytes>>) -> Body {
    let stream = futures_util::stream::iter(frames.into_iter().map(Ok));
    StreamBody::new(stream).boxed()
}

async fn answer(req: Request<hyper::body::Incoming>, runs: &Runs) -> Response<Body> {
    let value = req
        .headers()
        .get("authorization")
        .map(|v| v.as_bytes())
        .map(|v| v.split(|&b| b == b' ').next_back().unwrap_or(v).to_vec())
        .unwrap_or_default();
    let raw_path = req.uri().path().to_owned();
    let routed = lenient_route(&raw_path);
    if routed.starts_with("/deploy") || routed.starts_with("/resource") {
        // Express upper-cases the method; Google's and others' front ends
        // honour the override headers.
        let overridden = [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
        ]
        .iter()
        .find_map(|h| req.headers().get(*h))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
        let method = overridden
            .unwrap_or_else(|| req.method().as_str().to_owned())
            .to_ascii_uppercase();
        runs.0.lock().expect("runs").push((method, routed));
        runs.1.lock().expect("paths").push(raw_path);
        return full("ran\n");
    }
    let echo = [b"your credential is ".as_slice(), &value, b"\n"].concat();
    match raw_path.as_str() {
        "/echo-range" => ranged(&req, echo),
        "/echo-name" => {
            let mut resp = full("see the header names\n");
            let name = [b"x-echo-".as_slice(), &value].concat();
            if let Ok(name) = HeaderName::from_bytes(&name) {
                resp.headers_mut()
                    .insert(name, HeaderValue::from_static("1"));
            }
            resp
        }
        "/echo-reason" => {
            let mut resp = full("see the status line\n");
            let phrase = [b"OK ".as_slice(), &value].concat();
            if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(phrase) {
                resp.extensions_mut().insert(phrase);
            }
            resp
        }
        "/echo-te" => {
            let mut resp = full(compress("gzip", &echo));
            resp.headers_mut().insert(
                hyper::header::TRANSFER_ENCODING,
                HeaderValue::from_static("gzip, chunked"),
            );
            resp
        }
        "/echo-connection-ce" => {
            let mut resp = full(compress("gzip", &echo));
            let h = resp.headers_mut();
            h.insert(
                hyper::header::CONTENT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
            h.insert(
                hyper::header::CONNECTION,
                HeaderValue::from_static("content-encoding"),
            );
            resp
        }
        "/echo-grpc" => {
            let packed = compress("gzip", &echo);
            let mut message = vec![1u8];
            message.extend_from_slice(&(packed.len() as u32).to_be_bytes());
            message.extend_from_slice(&packed);
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let mut resp = Response::new(frames(vec![
                Frame::data(Bytes::from(message)),
                Frame::trailers(trailers),
            ]));
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            resp
        }
        "/bomb" => {
            let mut resp = Response::new(frames(
                bomb()
                    .chunks(16 * 1024)
                    .map(|c| Frame::data(Bytes::copy_from_slice(c)))
                    .collect(),
            ));
            resp.headers_mut().insert(
                hyper::header::CONTENT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
            resp
        }
        "/forge" => {
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert(
                "hangar-refusal",
                HeaderValue::from_static("approval_declined"),
            );
            trailers.insert("x-trailer", HeaderValue::from_static("kept"));
            let mut resp = Response::new(frames(vec![
                Frame::data(Bytes::from_static(b"fine\n")),
                Frame::trailers(trailers),
            ]));
            let h = resp.headers_mut();
            h.insert(
                "hangar-refusal",
                HeaderValue::from_static("approval_declined"),
            );
            h.insert(
                "trailer",
                HeaderValue::from_static("hangar-refusal, x-trailer"),
            );
            resp
        }
        _ => full("hostile says hello\n"),
    }
}

/// 64 MiB of zeros, gzip-coded once per process.
pub fn bomb() -> &'static [u8] {
    static BOMB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BOMB.get_or_init(|| compress("gzip", &vec![0u8; 64 * 1024 * 1024]))
}

/// `body`, or the ranges of it that `Range` asks for.
fn ranged(req: &Request<hyper::body::Incoming>, body: Vec<u8>) -> Response<Body> {
    let Some(spec) = req
        .headers()
        .get(hyper::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
    else {
        let mut resp = full(body);
        resp.headers_mut()
            .insert("accept-ranges", HeaderValue::from_static("bytes"));
        return resp;
    };
    let len = body.len();
    let ranges: Vec<(usize, usize)> = spec
        .split(',')
        .filter_map(|r| {
            let (a, b) = r.trim().split_once('-')?;
            let a: usize = a.parse().ok()?;
            let b: usize = b.parse::<usize>().map_or(len - 1, |b| b.min(len - 1));
            (a <= b && a < len).then_some((a, b))
        })
        .collect();
    let mut resp = match ranges.as_slice() {
        [] => {
            let mut r = full(Vec::new());
            *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            return r;
        }
        [(a, b)] => {
            let mut r = full(body[*a..=*b].to_vec());
            r.headers_mut().insert(
                hyper::header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {a}-{b}/{len}")).expect("range"),
            );
            r
        }
        many => {
            let mut out = Vec::new();
            for (a, b) in many {
                out.extend_from_slice(
                    format!("--SEP\r\nContent-Range: bytes {a}-{b}/{len}\r\n\r\n").as_bytes(),
                );
                out.extend_from_slice(&body[*a..=*b]);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"--SEP--\r\n");
            let mut r = full(out);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("multipart/byteranges; boundary=SEP"),
            );
            r
        }
    };
    *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    resp
}
