//! A small HTTPS site of the test's own for the browser to load: rustls,
//! TLS 1.3 only, ALPN h2 and http/1.1, a leaf for the relying party's
//! name from the test's CA, on 127.0.0.1 at a port the kernel picks (the
//! browser reaches it by name through its `--host-resolver-rules`).
//!
//! It serves what the test puts at each path ([`Site::put`]) with a strict
//! Content-Security-Policy unless the asset brings its own, and keeps
//! every `POST /report/NAME` body for the test to read
//! ([`Site::wait_post`]): how a page hands back what it did (a WebAuthn
//! response, say). [`Site::with_demo_pages`] adds the driver's own small
//! pages (`tests/testdata/browser/`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::origin::TestCa;
use crate::wait::DEADLINE;

/// The Content-Security-Policy every page gets unless its asset sets
/// another: what the people pages will serve (no inline script or style,
/// nothing from anywhere else).
pub const STRICT_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Largest report body kept: a WebAuthn registration is about 1 KiB in
/// base64url.
const MAX_POST: usize = 1 << 20;

/// Reports kept: far more than any test posts; a page posting in a loop
/// fills it and then is answered 503.
const MAX_POSTS: usize = 1024;

/// What the site answers at one path.
#[derive(Debug, Clone)]
pub struct Asset {
    pub content_type: String,
    pub body: Bytes,
    /// A Content-Security-Policy of its own, instead of [`STRICT_CSP`].
    pub csp: Option<String>,
    /// More response headers (a `set-cookie`, say).
    pub headers: Vec<(String, String)>,
}

/// One `POST /report/NAME` the site received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    /// `NAME`.
    pub name: String,
    pub body: Bytes,
}

impl Post {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("the report {} is not JSON: {e}", self.name))
    }
}

/// The site's pages: (path, content type, body).
const DEMO_PAGES: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../../testdata/browser/index.html"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("../../testdata/browser/app.css"),
    ),
    (
        "/favicon.svg",
        "image/svg+xml",
        include_str!("../../testdata/browser/favicon.svg"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../testdata/browser/app.js"),
    ),
    (
        "/bad.html",
        "text/html; charset=utf-8",
        include_str!("../../testdata/browser/bad.html"),
    ),
    (
        "/problems.html",
        "text/html; charset=utf-8",
        include_str!("../../testdata/browser/problems.html"),
    ),
    (
        "/problems.js",
        "text/javascript; charset=utf-8",
        include_str!("../../testdata/browser/problems.js"),
    ),
    (
        "/webauthn.html",
        "text/html; charset=utf-8",
        include_str!("../../testdata/browser/webauthn.html"),
    ),
    (
        "/webauthn.js",
        "text/javascript; charset=utf-8",
        include_str!("../../testdata/browser/webauthn.js"),
    ),
];

/// A running site; stops when dropped.
#[derive(Debug)]
pub struct Site {
    pub addr: SocketAddr,
    name: String,
    assets: Arc<Mutex<HashMap<String, Asset>>>,
    posts: tokio::sync::watch::Sender<Vec<Post>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Site {
    /// Serve `name` (certificate from `ca`) on 127.0.0.1:0, with nothing at
    /// any path yet.
    pub async fn start(ca: &TestCa, name: &str) -> Site {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind site");
        let addr = listener.local_addr().expect("site addr");
        let (chain, key) = ca.leaf(&[name]);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = crate::origin::tls13_server(provider, chain, key, &[b"h2", b"http/1.1"]);
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let assets: Arc<Mutex<HashMap<String, Asset>>> = Arc::default();
        let posts = tokio::sync::watch::Sender::new(Vec::new());
        let (task_assets, task_posts) = (Arc::clone(&assets), posts.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (assets, posts) = (Arc::clone(&task_assets), task_posts.clone());
                tokio::spawn(async move {
                    // A browser that refuses the certificate ends here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        answer(req, Arc::clone(&assets), posts.clone())
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Site {
            addr,
            name: name.to_owned(),
            assets,
            posts,
            task,
        }
    }

    /// Add the driver's own small pages: `/` (a good page: labelled,
    /// contrasted, scripts from the site only), `/bad.html` (a planted
    /// serious accessibility violation), `/problems.html` (a planted
    /// console error, uncaught exception and CSP violation) and
    /// `/webauthn.html` (registers a passkey and signs an assertion with
    /// the options at `/options.json`, posting each response to
    /// `/report/registration` and `/report/assertion`).
    pub fn with_demo_pages(self) -> Site {
        for (path, kind, body) in DEMO_PAGES {
            self.put(path, kind, body.as_bytes().to_vec());
        }
        self
    }

    /// The site's origin: `https://NAME:PORT`.
    pub fn origin(&self) -> String {
        format!("https://{}:{}", self.name, self.addr.port())
    }

    /// `path` on this site.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin())
    }

    /// Serve `body` as `content_type` at `path` (replacing what was there).
    pub fn put(&self, path: &str, content_type: &str, body: impl Into<Bytes>) {
        self.put_asset(
            path,
            Asset {
                content_type: content_type.to_owned(),
                body: body.into(),
                csp: None,
                headers: Vec::new(),
            },
        );
    }

    /// Serve `asset` at `path`.
    pub fn put_asset(&self, path: &str, asset: Asset) {
        self.assets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_owned(), asset);
    }

    /// Every report received so far, in order.
    pub fn posts(&self) -> Vec<Post> {
        self.posts.borrow().clone()
    }

    /// Wait (at most [`DEADLINE`]) for the `n`-th (1-based) report named
    /// `name`; panics saying what came instead.
    pub async fn wait_post(&self, name: &str, n: usize) -> Post {
        let mut rx = self.posts.subscribe();
        let got = tokio::time::timeout(DEADLINE, async {
            let posts = rx
                .wait_for(|p| p.iter().filter(|p| p.name == name).count() >= n)
                .await
                .expect("the site holds the sender");
            posts.iter().filter(|p| p.name == name).nth(n - 1).cloned()
        })
        .await;
        match got {
            Ok(Some(p)) => p,
            _ => panic!(
                "the site got no report {name} #{n} within {} s; it got: {:?}",
                DEADLINE.as_secs(),
                self.posts().iter().map(|p| &p.name).collect::<Vec<_>>()
            ),
        }
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    assets: Arc<Mutex<HashMap<String, Asset>>>,
    posts: tokio::sync::watch::Sender<Vec<Post>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    if req.method() == hyper::Method::POST {
        let Some(name) = path.strip_prefix("/report/") else {
            return Ok(plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "POST only to /report/NAME",
            ));
        };
        let name = name.to_owned();
        let Ok(body) = Limited::new(req.into_body(), MAX_POST).collect().await else {
            return Ok(plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "report too large or cut",
            ));
        };
        let mut kept = true;
        posts.send_modify(|p| {
            if p.len() < MAX_POSTS {
                p.push(Post {
                    name,
                    body: body.to_bytes(),
                });
            } else {
                kept = false;
            }
        });
        if !kept {
            return Ok(plain(StatusCode::SERVICE_UNAVAILABLE, "too many reports"));
        }
        return Ok(
            with_headers(Response::builder().status(StatusCode::NO_CONTENT), None)
                .body(Full::new(Bytes::new()))
                .expect("a response"),
        );
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "GET, HEAD or POST"));
    }
    let asset = assets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&path)
        .cloned();
    let Some(asset) = asset else {
        return Ok(plain(StatusCode::NOT_FOUND, "not found"));
    };
    let mut b = with_headers(Response::builder(), asset.csp.as_deref())
        .header("content-type", asset.content_type);
    for (name, value) in &asset.headers {
        b = b.header(name, value);
    }
    Ok(b.body(Full::new(asset.body)).expect("a response"))
}

/// The headers every answer carries.
fn with_headers(
    b: hyper::http::response::Builder,
    csp: Option<&str>,
) -> hyper::http::response::Builder {
    b.header("content-security-policy", csp.unwrap_or(STRICT_CSP))
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    with_headers(Response::builder().status(status), None)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .expect("a response")
}
