//! gRPC peers: a tonic origin serving the test `Echo` service
//! (`proto/echo.proto`) over TLS 1.3, and a tonic client that reaches it
//! through the gateway as a session would.
//!
//! The origin comes in two flavours: [`Flavour::H2`] offers ALPN `h2`, as
//! any gRPC server does; [`Flavour::Http1Only`] offers only `http/1.1` and
//! answers with hyper's HTTP/1.1 server, so the gateway finds a destination
//! that cannot carry gRPC.
//!
//! The client uses its own connector rather than tonic's TLS support: that
//! is what sets the source address (a session's) and the SNI (a listed
//! name) while the TCP connection goes to the gateway's listener.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpSocket};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::{Stream, StreamExt};
use tonic::metadata::{BinaryMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::origin::TestCa;

/// Code generated from `proto/echo.proto`.
pub mod echo {
    #![allow(missing_debug_implementations)]
    tonic::include_proto!("talos.test.echo");
}

use echo::echo_client::EchoClient;
use echo::echo_server::{Echo, EchoServer};
use echo::{EchoReply, EchoRequest};

/// Largest message either side accepts: room for the tests' 3 MiB payloads
/// (tonic's default is 4 MiB for decoding; this makes the limit explicit on
/// both ends and leaves headroom for the message envelope).
pub const MAX_MESSAGE: usize = 8 * 1024 * 1024;

/// Metadata the origin attaches to the error statuses it returns, so a test
/// can check that trailers cross the gateway whole.
pub const ERROR_DETAIL_KEY: &str = "x-echo-detail";
/// The ASCII value under [`ERROR_DETAIL_KEY`].
pub const ERROR_DETAIL: &str = "kept-through-the-gateway";
/// A binary metadata key (`-bin`: base64 on the wire) on error statuses.
pub const ERROR_BIN_KEY: &str = "x-echo-blob-bin";
/// The bytes under [`ERROR_BIN_KEY`].
pub const ERROR_BIN: &[u8] = &[0, 1, 2, 0xfe, 0xff];

/// Most replies a server stream will send, whatever a request asks: keeps
/// every stream bounded.
const MAX_STREAM_REPLIES: u32 = 10_000;

/// The test implementation of `Echo`.
#[derive(Debug, Default, Clone)]
pub struct EchoService;

type ReplyStream = Pin<Box<dyn Stream<Item = Result<EchoReply, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn unary(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        // `reflect:NAME` echoes the request's metadata NAME back, as a
        // careless server might (in the reply or in the error message).
        let reflected = request
            .get_ref()
            .message
            .strip_prefix("reflect:")
            .and_then(|key| request.metadata().get(key))
            .and_then(|v| v.to_str().ok())
            .map(|v| format!("you sent {v}"));
        let mut req = request.into_inner();
        if let Some(text) = reflected {
            req.message = text;
        }
        if req.fail_with != 0 {
            let mut status = Status::new(Code::from(req.fail_with as i32), req.message);
            let md = status.metadata_mut();
            md.insert(ERROR_DETAIL_KEY, MetadataValue::from_static(ERROR_DETAIL));
            md.insert_bin(ERROR_BIN_KEY, BinaryMetadataValue::from_bytes(ERROR_BIN));
            return Err(status);
        }
        Ok(Response::new(EchoReply {
            message: req.message,
            index: 0,
            payload: req.payload,
        }))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let req = request.into_inner();
        let count = req.count.min(MAX_STREAM_REPLIES);
        let replies = tokio_stream::iter(0..count).map(move |index| {
            Ok(EchoReply {
                message: format!("{} #{index}", req.message),
                index,
                payload: Vec::new(),
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn client_stream(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<EchoReply>, Status> {
        let mut stream = request.into_inner();
        let mut parts = Vec::new();
        let mut payload = 0usize;
        while let Some(req) = stream.message().await? {
            payload += req.payload.len();
            parts.push(req.message);
        }
        Ok(Response::new(EchoReply {
            message: parts.join(","),
            index: u32::try_from(parts.len()).unwrap_or(u32::MAX),
            payload: payload.to_string().into_bytes(),
        }))
    }

    type BidiStreamStream = ReplyStream;

    async fn bidi_stream(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let stream = request.into_inner();
        let mut index = 0u32;
        let replies = stream.map(move |req| {
            let reply = req.map(|req| EchoReply {
                message: format!("re: {}", req.message),
                index,
                payload: req.payload,
            });
            index = index.saturating_add(1);
            reply
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// Which HTTP version a [`GrpcOrigin`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// ALPN `h2`, HTTP/2: a normal gRPC server.
    H2,
    /// ALPN `http/1.1` only, hyper's HTTP/1.1 server: gRPC cannot work.
    Http1Only,
}

/// A running gRPC origin on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct GrpcOrigin {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GrpcOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GrpcOrigin {
    /// Serve `Echo` over TLS 1.3 for `names` (certificate from `ca`) on
    /// 127.0.0.1:0.
    pub async fn start(ca: &TestCa, names: &[&str], flavour: Flavour) -> GrpcOrigin {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind grpc origin");
        GrpcOrigin::serve(listener, ca, names, flavour)
    }

    /// Serve `Echo` on an already bound listener.
    pub fn serve(
        listener: TcpListener,
        ca: &TestCa,
        names: &[&str],
        flavour: Flavour,
    ) -> GrpcOrigin {
        let addr = listener.local_addr().expect("grpc origin addr");
        let (chain, key) = ca.leaf(names);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let alpn: &[&[u8]] = match flavour {
            Flavour::H2 => &[b"h2"],
            Flavour::Http1Only => &[b"http/1.1"],
        };
        let config = crate::origin::tls13_server(provider, chain, key, alpn);
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let routes = tonic::service::Routes::new(
            EchoServer::new(EchoService)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        );
        let task = tokio::spawn(serve_routes(listener, acceptor, routes, flavour));
        GrpcOrigin { addr, task }
    }
}

/// Serves `routes` (tonic services) on every TLS connection `listener`
/// accepts, over HTTP/2 or, for [`Flavour::Http1Only`], HTTP/1.1; runs
/// until its task is aborted.
pub(crate) async fn serve_routes(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    routes: tonic::service::Routes,
    flavour: Flavour,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let routes = routes.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    tower::ServiceExt::oneshot(routes.clone(), req)
                });
            let io = TokioIo::new(tls);
            let _ = match flavour {
                Flavour::H2 => {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                }
                Flavour::Http1Only => {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                }
            };
        });
    }
}

/// Longest a test RPC may take, end to end: every call is bounded.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// A tonic client for `Echo` whose every connection goes from `source` to
/// `gateway` with SNI `name` and ALPN `h2`, trusting only the certificates
/// in `trust_pem` (the session CA the gateway wrote at start-up).
///
/// Connects before returning, so a refused handshake is an error here.
pub async fn client_via_gateway(
    gateway: SocketAddr,
    source: &str,
    name: &str,
    trust_pem: &Path,
) -> Result<EchoClient<Channel>, tonic::transport::Error> {
    let connector = gateway_connector(gateway, source, name, trust_pem);
    let channel = Endpoint::from_shared(format!("https://{name}"))
        .expect("endpoint uri")
        .connect_timeout(Duration::from_secs(10))
        .timeout(RPC_TIMEOUT)
        .connect_with_connector(connector)
        .await?;
    Ok(EchoClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// The connector behind [`client_via_gateway`]: a tower service from the
/// channel's URI (ignored) to a TLS stream over a socket bound to `source`.
fn gateway_connector(
    gateway: SocketAddr,
    source: &str,
    name: &str,
    trust_pem: &Path,
) -> impl tower::Service<
    hyper::Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let source: IpAddr = source.parse().expect("source ip");
    let server_name = ServerName::try_from(name.to_owned()).expect("server name");
    let connector = TlsConnector::from(crate::clients::session_tls(trust_pem, &[b"h2"]));
    tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        async move {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            let tcp = socket.connect(gateway).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    })
}
