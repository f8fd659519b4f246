//! Frames on the process socket: length-prefixed messages, secrets read
//! into buffers that are wiped on drop, and file descriptors.
//!
//! A frame is a 4-byte big-endian length and that many bytes. A message is
//! one frame of JSON; a secret is one frame of raw bytes, read straight
//! into a [`Zeroizing`] buffer of its exact length (no copy is made on the
//! way, and nothing of it is ever in a JSON value). File descriptors go as
//! `SCM_RIGHTS` on a one-byte message of their own.
//!
//! Nothing here buffers: every read asks the kernel for exactly what the
//! frame needs, so a frame and the descriptors after it can be read in
//! turn from one stream.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use zeroize::Zeroizing;

/// The largest message: a handover of many thousands of sessions is a few
/// megabytes of JSON; anything past this is not a peer of ours.
pub const MAX_MESSAGE: usize = 256 << 20;

/// The largest secret frame: a secret value or a PKCS#8 key.
pub const MAX_SECRET: usize = 64 << 10;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// The byte that carries descriptors.
const FDS_MARK: u8 = b'F';

/// Write one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    stream: &mut W,
    bytes: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| std::io::Error::other("a frame longer than 4 GiB"))?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(bytes).await
}

/// Read one frame's length, refusing one longer than `max`.
async fn read_len<R: AsyncRead + Unpin>(stream: &mut R, max: usize) -> std::io::Result<usize> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes, more than {max}"),
        ));
    }
    Ok(len)
}

/// Read one frame of at most `max` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(
    stream: &mut R,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    let len = read_len(stream, max).await?;
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Read one secret frame into a buffer wiped on drop.
pub async fn read_secret<R: AsyncRead + Unpin>(
    stream: &mut R,
) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let len = read_len(stream, MAX_SECRET).await?;
    // Allocated at its final size inside the wiping wrapper: the bytes
    // are never in a buffer that is not wiped.
    let mut buf = Zeroizing::new(vec![0u8; len]);
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Write `message` as one JSON frame.
pub async fn write_json<T: Serialize, W: AsyncWrite + Unpin>(
    stream: &mut W,
    message: &T,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    write_frame(stream, &bytes).await
}

/// Read one JSON frame as a `T`.
pub async fn read_json<T: DeserializeOwned, R: AsyncRead + Unpin>(
    stream: &mut R,
) -> std::io::Result<T> {
    let bytes = read_frame(stream, MAX_MESSAGE).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Send `fds` in one message.
pub async fn send_fds(stream: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(std::io::Error::other(
            "between 1 and 8 descriptors go at once",
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("the descriptors do not fit"));
    }
    let mark = [FDS_MARK];
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            sendmsg(
                stream,
                &[IoSlice::new(&mark)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(std::io::Error::other("the descriptors' message was cut")),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Receive exactly `n` descriptors sent by [`send_fds`]; each is
/// close-on-exec.
pub async fn recv_fds(stream: &UnixStream, n: usize) -> std::io::Result<Vec<OwnedFd>> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    if n == 0 || n > MAX_FDS {
        return Err(std::io::Error::other(
            "between 1 and 8 descriptors come at once",
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut mark = [0u8; 1];
    let got = loop {
        stream.readable().await?;
        let received = stream.try_io(Interest::READABLE, || {
            recvmsg(
                stream,
                &mut [IoSliceMut::new(&mut mark)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)
        });
        match received {
            Ok(r) => break r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    if got.bytes != 1 || mark[0] != FDS_MARK {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "expected the descriptors' message",
        ));
    }
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(std::io::Error::other("descriptors were cut off"));
    }
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if fds.len() != n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} descriptors came, {n} were expected", fds.len()),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn frames_secrets_and_descriptors_go_through_in_order() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = tokio::spawn(async move {
            write_json(&mut a, &serde_json::json!({"hello": 1}))
                .await
                .unwrap();
            send_fds(&a, &[listener.as_fd()]).await.unwrap();
            write_frame(&mut a, b"key bytes").await.unwrap();
            a
        });
        let hello: serde_json::Value = read_json(&mut b).await.unwrap();
        assert_eq!(hello["hello"], 1);
        let fds = recv_fds(&b, 1).await.unwrap();
        let secret = read_secret(&mut b).await.unwrap();
        assert_eq!(&secret[..], b"key bytes");
        let _a = sender.await.unwrap();
        // The descriptor is the same listening socket.
        let got = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(got.local_addr().unwrap(), addr);
        let flags = rustix::io::fcntl_getfd(&got).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }

    #[tokio::test]
    async fn oversized_frames_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_SECRET as u32 + 1).to_be_bytes())
            .await
            .unwrap();
        let e = read_secret(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }
}
