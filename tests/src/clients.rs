//! Clients: raw sockets from a chosen source address, and real client
//! binaries (curl, openssl, python3) run with bounded time.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A session source address used by the tests.
pub const SESSION_SOURCE: &str = "127.0.0.2";
/// An address that is no session's.
pub const UNKNOWN_SOURCE: &str = "127.0.0.9";

/// Connect to `to` from `source` (port chosen by the kernel).
pub async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let ip: IpAddr = source.parse().expect("source ip");
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(ip, 0)).expect("bind source");
    socket.connect(to).await.expect("connect")
}

/// Send `bytes` from `source`, then read what comes back until the gateway
/// closes (at most 10 s). Returns the bytes received.
pub async fn send_and_read(source: &str, to: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect_from(source, to).await;
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    got
}

/// Run a client binary with a time bound; its output, whatever the exit.
pub fn run_bounded(program: &str, args: &[&str], stdin: Option<&[u8]>, secs: u64) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("-k")
        .arg("2")
        .arg(secs.to_string())
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        let _ = pipe.write_all(input);
    }
    child.wait_with_output().expect("wait client")
}

/// `openssl s_client -tls1_3` to the gateway's data listener at `gateway`
/// from session source `source`, with `extra` options (a name, a CA, the
/// suites), its input closed at once; its output, bounded at 20 s.
pub fn s_client(gateway: SocketAddr, source: &str, extra: &[&str]) -> Output {
    let connect = gateway.to_string();
    let bind = format!("{source}:0");
    let mut args = vec!["s_client", "-connect", &connect, "-bind", &bind, "-tls1_3"];
    args.extend_from_slice(extra);
    run_bounded("openssl", &args, Some(b""), 20)
}

/// A session's TLS client: TLS 1.3, trusting only the PEM bundle at
/// `bundle` (the session CA, or both members' CAs), offering `alpn`.
pub fn session_tls(
    bundle: &std::path::Path,
    alpn: &[&[u8]],
) -> std::sync::Arc<rustls::ClientConfig> {
    let pem = std::fs::read(bundle).expect("the session's trust bundle");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(c.expect("pem")).expect("anchor");
    }
    assert!(!roots.is_empty(), "no certificate in {}", bundle.display());
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    std::sync::Arc::new(config)
}

/// One connection on `socket` (bound by the caller: the session's source,
/// a chosen port) through `gateway`, TLS with `tls` for `name`, one
/// HTTP/1.1 GET `path`: the status and the whole body, or what went wrong
/// (bounded by 20 s).
pub async fn get_once(
    socket: TcpSocket,
    gateway: SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
    name: &str,
    path: &str,
) -> Result<(u16, bytes::Bytes), String> {
    use http_body_util::BodyExt;
    let fut = async {
        let tcp = socket
            .connect(gateway)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let server =
            rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(tls)
            .connect(server, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut s, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", name)
            .body(http::empty())
            .map_err(|e| e.to_string())?;
        let resp = s.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        drop(s);
        let _ = driver.await;
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

pub mod http {
    use std::net::SocketAddr;
    use std::path::Path;

    use http_body_util::combinators::BoxBody;
    use hyper::client::conn::{http1, http2};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::ServerName;

    /// A request body the tests can build.
    pub type Body = BoxBody<bytes::Bytes, std::io::Error>;

    /// Either protocol's request sender.
    #[derive(Debug)]
    pub enum Sender {
        H1(http1::SendRequest<Body>),
        H2(http2::SendRequest<Body>),
    }

    impl Sender {
        /// Send one request.
        pub async fn send(
            &mut self,
            req: hyper::Request<Body>,
        ) -> hyper::Result<hyper::Response<hyper::body::Incoming>> {
            match self {
                Sender::H1(s) => {
                    s.ready().await?;
                    s.send_request(req).await
                }
                Sender::H2(s) => {
                    s.ready().await?;
                    s.send_request(req).await
                }
            }
        }
    }

    /// Connect through the gateway at `gateway` as session source `source`.
    pub async fn connect(
        source: &str,
        gateway: SocketAddr,
        name: &str,
        ca_pem: &Path,
        h2: bool,
    ) -> Sender {
        let io = TokioIo::new(tls(source, gateway, name, ca_pem, h2).await);
        if h2 {
            let (s, conn) = http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2");
            tokio::spawn(conn);
            Sender::H2(s)
        } else {
            let (s, conn) = http1::handshake(io).await.expect("h1");
            tokio::spawn(conn);
            Sender::H1(s)
        }
    }

    /// The TLS connection under [`connect`]'s sender, for a test that
    /// writes and reads the bytes itself (ALPN `h2` or `http/1.1`).
    pub async fn tls(
        source: &str,
        gateway: SocketAddr,
        name: &str,
        ca_pem: &Path,
        h2: bool,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let tcp = super::connect_from(source, gateway).await;
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let config = super::session_tls(ca_pem, &[alpn]);
        tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::try_from(name.to_owned()).expect("name"), tcp)
            .await
            .expect("TLS through the gateway")
    }

    /// An empty body.
    pub fn empty() -> Body {
        use http_body_util::BodyExt;
        http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed()
    }
}

/// A client TLS config for a session's HTTP/1.1 connections: TLS 1.3,
/// trusting only the PEM bundle at `bundle`.
pub fn client_tls(bundle: &std::path::Path) -> std::sync::Arc<rustls::ClientConfig> {
    session_tls(bundle, &[b"http/1.1"])
}

/// An HTTP/1.1 keep-alive connection through the gateway, kept open, with
/// the source port it came from.
#[derive(Debug)]
pub struct Kept {
    sender: hyper::client::conn::http1::SendRequest<http::Body>,
    name: String,
    pub port: u16,
}

impl Kept {
    /// Connect from `source` through `gateway` to `name`, trusting only
    /// `bundle`, and make a first request (`path`, answered 200).
    pub async fn open(
        source: &str,
        gateway: SocketAddr,
        name: &str,
        bundle: &std::path::Path,
        path: &str,
    ) -> Kept {
        let tls = http::tls(source, gateway, name, bundle, false).await;
        let port = tls.get_ref().0.local_addr().expect("local addr").port();
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("h1");
        tokio::spawn(conn);
        let mut kept = Kept {
            sender,
            name: name.to_owned(),
            port,
        };
        let (status, _) = kept.get(path).await.expect("first request");
        assert_eq!(status, 200);
        kept
    }

    /// One more request on the connection: its status and its
    /// `hangar-refusal` header, or why there was no answer (at most 15 s).
    pub async fn get(&mut self, path: &str) -> Result<(u16, Option<String>), String> {
        use http_body_util::BodyExt;
        let req = hyper::Request::get(path)
            .header("host", &self.name)
            .body(http::empty())
            .expect("request");
        let sent = tokio::time::timeout(Duration::from_secs(15), async {
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let refusal = resp
                .headers()
                .get("hangar-refusal")
                .map(|v| v.to_str().unwrap_or("").to_owned());
            resp.into_body().collect().await?;
            Ok::<_, hyper::Error>((status, refusal))
        })
        .await;
        match sent {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(format!("connection failed: {e}")),
            Err(_) => Err("no answer within 15 s".into()),
        }
    }
}

/// curl through the gateway as a session runs it: TCP to the gateway's
/// data listener (`--connect-to`) from a session source (`--interface`),
/// TLS trusting only the session's bundle, the URL naming the
/// destination. Built up, then [`Curl::run`] for each path.
#[derive(Debug, Clone)]
pub struct Curl<'a> {
    gateway: SocketAddr,
    ca: &'a std::path::Path,
    name: &'a str,
    source: &'a str,
    max_time: u64,
    args: Vec<&'a str>,
}

/// What curl got: the answer's status (0 when no HTTP answer came: the
/// connection refused before or during TLS), its head in lower case, the
/// body; and how curl itself ended.
#[derive(Debug)]
pub struct Curled {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
    /// curl's exit code (0: a whole answer; -1: killed by the bound).
    pub exit: i32,
    pub stderr: String,
}

impl Curled {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// (status, head, body as text), for a test that reads all three.
    pub fn into_text(self) -> (u16, String, String) {
        let body = self.text();
        (self.status, self.head, body)
    }
}

impl<'a> Curl<'a> {
    /// curl to `https://{name}…` through `gateway` from [`SESSION_SOURCE`],
    /// trusting only `ca`, giving up after 20 s.
    pub fn via(gateway: SocketAddr, ca: &'a std::path::Path, name: &'a str) -> Curl<'a> {
        Curl {
            gateway,
            ca,
            name,
            source: SESSION_SOURCE,
            max_time: 20,
            args: Vec::new(),
        }
    }

    /// From another source address.
    pub fn from(mut self, source: &'a str) -> Curl<'a> {
        self.source = source;
        self
    }

    /// Giving up after `secs` (curl's `--max-time`).
    pub fn max_time(mut self, secs: u64) -> Curl<'a> {
        self.max_time = secs;
        self
    }

    /// With more options (`-X POST`, `--http2`, `-H …`).
    pub fn args(mut self, extra: &[&'a str]) -> Curl<'a> {
        self.args.extend_from_slice(extra);
        self
    }

    /// Run it for `path` (and a query, if any).
    pub fn run(&self, path: &str) -> Curled {
        let connect_to = format!("{}:443:127.0.0.1:{}", self.name, self.gateway.port());
        let url = format!("https://{}{path}", self.name);
        let max_time = self.max_time.to_string();
        let mut args = vec![
            "-sS",
            "--max-time",
            &max_time,
            "--interface",
            self.source,
            "--cacert",
            self.ca.to_str().expect("utf-8 path"),
            "--connect-to",
            &connect_to,
            "-D",
            "-",
        ];
        args.extend_from_slice(&self.args);
        args.push(&url);
        let out = run_bounded("curl", &args, None, self.max_time + 10);
        let raw = out.stdout;
        // The head ends at the first blank line (curl prints each response's
        // head; the gateway never answers 1xx, so there is one).
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(raw.len(), |i| i + 4);
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Curled {
            status,
            head,
            body: raw[split..].to_vec(),
            exit: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Run curl through the gateway at `gateway` from the session source,
/// trusting only `session_ca`, to `https://{name}{path}` with `extra`
/// options (at most 20 s).
pub fn curl_via(
    gateway: SocketAddr,
    session_ca: &std::path::Path,
    name: &str,
    path: &str,
    extra: &[&str],
) -> Curled {
    Curl::via(gateway, session_ca, name).args(extra).run(path)
}

/// The status of a GET of `https://{name}{path}` through `gateway` from
/// `source`, trusting only `ca`, with curl: 0 when no HTTP answer came.
pub fn curl_status(
    source: &str,
    gateway: SocketAddr,
    ca: &std::path::Path,
    name: &str,
    path: &str,
) -> u16 {
    Curl::via(gateway, ca, name).from(source).run(path).status
}

/// The value of `series` (a metric name with its labels, as exported) in
/// a Prometheus text exposition; `None` when it is absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A GET of `path` on an admin listener (plain HTTP, at most 10 s): the
/// status (0 when no answer came) and the body.
pub fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    let url = format!("http://{admin}{path}");
    let out = run_bounded(
        "curl",
        &["-sS", "--max-time", "10", "-w", "\n%{http_code}", &url],
        None,
        20,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}
