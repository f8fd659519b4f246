//! Reading a connection's ClientHello off the socket.
//!
//! The thin async wrapper around the sans-IO [`crate::gate::hello`] parser:
//! [`read_hello`] reads until the parser has a verdict, within the byte limit
//! and the deadline, and keeps every byte it read so the data path can replay
//! them into the TLS acceptor. [`capture_hellos`] uses the same reader to save
//! real clients' hellos as test data (`gateway capture-hello`).

use std::io;
use std::path::Path;

use bytes::BufMut;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpListener;

use crate::gate::hello::{self, Cause, ClientHello, HelloLimits, Parse};
use crate::refusal::Refusal;

/// What [`read_hello`] learned: an owned summary of the verdict and the hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadHello {
    /// `Ok(())` to go on with `sni`; otherwise why the connection is refused
    /// ([`Cause::refusal`] gives the stable reason).
    pub verdict: Result<(), Cause>,
    /// The one server name of the hello, as sent. Always `Some` when
    /// `verdict` is `Ok`; may be `Some` for an ECH refusal (the public name).
    pub sni: Option<String>,
    /// The ALPN protocols offered, in order (non-UTF-8 bytes replaced).
    pub alpn: Vec<String>,
    /// Whether the hello carried an encrypted client hello extension.
    pub ech: bool,
    /// The hello's `legacy_version`; 0 when no hello could be read.
    pub legacy_version: u16,
    /// The `supported_versions` offered, GREASE included.
    pub supported_versions: Vec<u16>,
    /// TLS records the hello took; 0 when no hello could be read.
    pub records: usize,
    /// Bytes the hello took at the front of the buffer; 0 when no hello could
    /// be read.
    pub consumed: usize,
}

impl ReadHello {
    /// The refusal reason, or `None` to go on.
    pub fn refusal(&self) -> Option<Refusal> {
        self.verdict.err().map(Cause::refusal)
    }

    fn refused(cause: Cause) -> ReadHello {
        ReadHello {
            verdict: Err(cause),
            sni: None,
            alpn: Vec::new(),
            ech: false,
            legacy_version: 0,
            supported_versions: Vec::new(),
            records: 0,
            consumed: 0,
        }
    }

    fn from_hello(verdict: Result<(), Cause>, hello: &ClientHello<'_>) -> ReadHello {
        ReadHello {
            verdict,
            sni: hello.server_name().map(str::to_owned),
            alpn: hello
                .alpn()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect(),
            ech: hello.has_ech(),
            legacy_version: hello.legacy_version(),
            supported_versions: hello.supported_versions().collect(),
            records: hello.records(),
            consumed: hello.consumed(),
        }
    }

    /// The summary of a verdict, or `None` for `Incomplete`.
    fn from_parse(parsed: Parse<'_>) -> Option<ReadHello> {
        match parsed {
            Parse::Incomplete => None,
            Parse::Accept { hello, .. } => Some(ReadHello::from_hello(Ok(()), &hello)),
            Parse::Refuse {
                cause,
                hello: Some(hello),
            } => Some(ReadHello::from_hello(Err(cause), &hello)),
            Parse::Refuse { cause, hello: None } => Some(ReadHello::refused(cause)),
        }
    }
}

/// Reads from `stream` into `buf` until the hello parser has a verdict.
///
/// `buf` keeps every byte read (the hello and anything the client sent
/// after it, such as early data) for the caller to replay; bytes already in
/// it count as the start of the connection. A client that closes first is
/// refused [`Cause::Eof`]; one that is too slow, [`Cause::HelloTimeout`].
///
/// # Limits
///
/// Reads at most `limits.max_bytes` bytes in all (`buf` is reserved to that
/// once) and returns within `limits.deadline`. A hello split over several
/// records costs one more buffer of `limits.max_bytes` bytes to put it back
/// together; a hello in one record costs nothing more.
pub async fn read_hello<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limits: HelloLimits,
) -> ReadHello {
    buf.reserve(limits.max_bytes.saturating_sub(buf.len()));
    match tokio::time::timeout(limits.deadline, read_until_judged(stream, buf, limits)).await {
        Ok(read) => read,
        Err(_elapsed) => ReadHello::refused(Cause::HelloTimeout),
    }
}

async fn read_until_judged<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limits: HelloLimits,
) -> ReadHello {
    // Grown to `limits.max_bytes` only for a hello split over several records.
    let mut scratch = Vec::new();
    loop {
        let can_grow = scratch.len() < limits.max_bytes;
        let grow = match hello::parse(buf, &mut scratch, &limits) {
            Parse::Refuse {
                cause: Cause::ScratchTooSmall { .. },
                ..
            } if can_grow => true,
            parsed => match ReadHello::from_parse(parsed) {
                Some(read) => return read,
                None => false,
            },
        };
        if grow {
            scratch = limits.scratch();
            continue;
        }

        let start = buf.len();
        if start >= limits.max_bytes {
            // The parser never answers Incomplete on this many bytes.
            return ReadHello::refused(Cause::TooLarge {
                limit: limits.max_bytes,
            });
        }
        // Into the reserved capacity, never past the limit; `buf` grows only
        // when a read completes, so a read cut off by the deadline leaves it
        // holding exactly the bytes received.
        let read = stream
            .read_buf(&mut (&mut *buf).limit(limits.max_bytes - start))
            .await;
        match read {
            Ok(0) => return ReadHello::refused(Cause::Eof),
            Ok(_) => {}
            Err(e) => return ReadHello::refused(Cause::ReadFailed(e.kind())),
        }
    }
}

/// Saves the first bytes of one connection per name as `out_dir/<name>.bin`.
///
/// Accepts connections on `listener` one at a time, in the order of `names`;
/// reads each one's hello with [`read_hello`], writes the hello's bytes (all
/// bytes read, when no hello could be read) and closes the connection. The
/// client's handshake then fails, which is fine: only its first bytes matter.
///
/// # Errors
///
/// A name that is not a plain file name (`[A-Za-z0-9._-]`, not starting with
/// a dot), a failed accept, or a failed write.
pub async fn capture_hellos(
    listener: TcpListener,
    out_dir: &Path,
    names: &[String],
    limits: HelloLimits,
) -> io::Result<()> {
    for name in names {
        if !is_capture_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("capture name {name:?} is not a plain file name"),
            ));
        }
    }
    tokio::fs::create_dir_all(out_dir).await?;
    for name in names {
        let (mut stream, peer) = listener.accept().await?;
        let mut buf = Vec::with_capacity(limits.max_bytes);
        let read = read_hello(&mut stream, &mut buf, limits).await;
        let keep = if read.consumed > 0 {
            read.consumed
        } else {
            buf.len()
        };
        let path = out_dir.join(format!("{name}.bin"));
        tokio::fs::write(&path, &buf[..keep]).await?;
        tracing::info!(
            name = name.as_str(),
            %peer,
            bytes = keep,
            records = read.records,
            verdict = read.refusal().map_or("allowed", Refusal::as_str),
            cause = read.verdict.err().map_or("", Cause::as_str),
            sni = read.sni.as_deref().unwrap_or(""),
            alpn = ?read.alpn,
            "captured hello"
        );
    }
    Ok(())
}

fn is_capture_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// A small well-formed hello naming `example.test`, as one record.
    fn tiny_hello() -> Vec<u8> {
        let name = b"example.test";
        let mut ext = vec![
            0,
            0,
            0,
            (name.len() + 5) as u8,
            0,
            (name.len() + 3) as u8,
            0,
            0,
        ];
        ext.push(name.len() as u8);
        ext.extend_from_slice(name);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut rec = vec![
            22,
            3,
            1,
            0,
            (body.len() + 4) as u8,
            1,
            0,
            0,
            body.len() as u8,
        ];
        rec.extend_from_slice(&body);
        rec
    }

    #[tokio::test]
    async fn capture_read_hello_over_dribbled_writes_keeps_the_bytes() {
        let hello = tiny_hello();
        let (mut client, mut server) = tokio::io::duplex(64);
        let sent = hello.clone();
        let writer = tokio::spawn(async move {
            for b in sent.chunks(7) {
                client.write_all(b).await.unwrap();
                tokio::task::yield_now().await;
            }
            client.write_all(b"early").await.unwrap();
            client
        });
        let mut buf = Vec::new();
        let read = read_hello(&mut server, &mut buf, HelloLimits::default()).await;
        assert_eq!(read.verdict, Ok(()));
        assert_eq!(read.sni.as_deref(), Some("example.test"));
        assert_eq!(read.consumed, hello.len());
        assert_eq!(&buf[..hello.len()], &hello[..]);
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn capture_read_hello_eof_is_not_tls() {
        let hello = tiny_hello();
        let mut input = &hello[..hello.len() - 1];
        let mut buf = Vec::new();
        let read = read_hello(&mut input, &mut buf, HelloLimits::default()).await;
        assert_eq!(read.verdict, Err(Cause::Eof));
        assert_eq!(read.refusal(), Some(Refusal::NotTls));
        assert_eq!(buf.len(), hello.len() - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn capture_read_hello_slow_sender_times_out() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(&tiny_hello()[..10]).await.unwrap();
        let limits = HelloLimits {
            deadline: Duration::from_secs(3),
            ..HelloLimits::default()
        };
        let mut buf = Vec::new();
        let read = read_hello(&mut server, &mut buf, limits).await;
        assert_eq!(read.verdict, Err(Cause::HelloTimeout));
        assert_eq!(read.refusal(), Some(Refusal::NotTls));
        assert_eq!(buf.len(), 10);
        drop(client);
    }

    #[tokio::test]
    async fn capture_read_hello_never_reads_past_the_limit() {
        // A record that claims more than the limit is refused from its header.
        let input = [22u8, 3, 1, 0x40, 0x00, 1, 0, 0x3f, 0xfc];
        let limits = HelloLimits {
            max_bytes: 1000,
            ..HelloLimits::default()
        };
        let mut buf = Vec::new();
        let read = read_hello(&mut &input[..], &mut buf, limits).await;
        assert_eq!(read.verdict, Err(Cause::TooLarge { limit: 1000 }));
        assert!(buf.len() <= 1000);
    }

    #[test]
    fn capture_names_are_plain_file_names() {
        assert!(is_capture_name("curl-http2"));
        assert!(is_capture_name("rustls_0.23.x25519"));
        assert!(!is_capture_name(""));
        assert!(!is_capture_name("../etc/passwd"));
        assert!(!is_capture_name(".hidden"));
        assert!(!is_capture_name("a/b"));
    }
}
