//! rustls's buffers as the gateway's session side uses them:
//!
//! - the patched rustls (third_party/README.md) gives an idle connection's
//!   receive buffer back, and never a buffer holding part of a record;
//! - with the session side's send limit, a large reply chunk and its
//!   HTTP/1.1 framing are taken by one write, while a write larger than the
//!   limit is still cut at it;
//! - a connection receiving a stream reads several records per read, and
//!   shrinks its buffer again as soon as the stream pauses; records, and
//!   handshake messages after the handshake (tickets, key updates), arrive
//!   whole and in order however the reads cut them;
//! - plaintext is read out of the buffer it was decrypted in (no copy and
//!   allocation per record), a little at a time or all at once, in order,
//!   while more records are read in behind it.
//!
//! A connection pair in memory, TLS 1.3 with the gateway's provider;
//! `allocation-counter` replaces the global allocator in this test binary
//! only and counts what the measuring thread allocates and frees.

use std::io::{IoSlice, Read, Write};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConnection, RootCertStore, ServerConnection};

fn pair() -> (ClientConnection, ServerConnection) {
    pair_with(None, true)
}

/// A connected pair; the server's records carry at most `fragment` bytes of
/// plaintext when set, and its session tickets are left unsent unless
/// `deliver_tickets`.
fn pair_with(
    fragment: Option<usize>,
    deliver_tickets: bool,
) -> (ClientConnection, ServerConnection) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["origin.test".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let cert_der: CertificateDer<'static> = cert.der().clone();

    let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert_der.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    server.max_fragment_size = fragment;
    let mut roots = RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();

    let mut client = ClientConnection::new(
        Arc::new(client),
        ServerName::try_from("origin.test").unwrap(),
    )
    .unwrap();
    let mut server = ServerConnection::new(Arc::new(server)).unwrap();
    while client.is_handshaking() {
        flush(&mut client, &mut server);
        flush(&mut server, &mut client);
    }
    // The client's Finished reaches the server, which answers with tickets.
    flush(&mut client, &mut server);
    assert!(!server.is_handshaking());
    if deliver_tickets {
        // Nothing is left in flight.
        flush(&mut server, &mut client);
    }
    (client, server)
}

/// Everything `from` has to send, read and processed by `to`.
fn flush<A, B>(from: &mut rustls::ConnectionCommon<A>, to: &mut rustls::ConnectionCommon<B>) {
    feed(to, &output(from));
}

/// Everything `conn` has to send.
fn output<B>(conn: &mut rustls::ConnectionCommon<B>) -> Vec<u8> {
    let mut wire = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut wire).unwrap();
    }
    wire
}

/// 0, 1, … 250, 0, 1, …: `len` bytes that show where a piece went.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn feed<B>(to: &mut rustls::ConnectionCommon<B>, mut wire: &[u8]) {
    while !wire.is_empty() {
        to.read_tls(&mut wire).unwrap();
        to.process_new_packets().unwrap();
    }
}

fn read_all<B>(conn: &mut rustls::ConnectionCommon<B>) -> Vec<u8> {
    let mut out = vec![0u8; 256];
    let n = conn.reader().read(&mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn an_idle_connection_gives_its_receive_buffer_back() {
    let (mut client, mut server) = pair();
    // The counter does count on this thread.
    let probe = allocation_counter::measure(|| drop(std::hint::black_box(vec![1u8; 8])));
    assert_eq!(probe.count_total, 1);

    // The server has read the handshake: its record buffer (4 KiB) is
    // held, and with nothing in it, released.
    let released = allocation_counter::measure(|| assert!(server.release_receive_buffer()));
    assert!(released.bytes_current <= -4096, "{released:?}");
    // Released again, nothing more to free.
    let again = allocation_counter::measure(|| assert!(server.release_receive_buffer()));
    assert_eq!(again.bytes_current, 0, "{again:?}");

    // And the connection reads on as before.
    client
        .writer()
        .write_all(b"GET / HTTP/1.1\r\n\r\n")
        .unwrap();
    flush(&mut client, &mut server);
    assert_eq!(read_all(&mut server), b"GET / HTTP/1.1\r\n\r\n");
}

#[test]
fn part_of_a_record_is_never_released() {
    let (mut client, mut server) = pair();
    client.writer().write_all(b"the first request").unwrap();
    let mut wire = Vec::new();
    client.write_tls(&mut wire).unwrap();

    for split in [1, 5, wire.len() - 1] {
        let (mut client, mut server) = pair();
        client.writer().write_all(b"the first request").unwrap();
        let mut wire = Vec::new();
        client.write_tls(&mut wire).unwrap();
        let (head, tail) = wire.split_at(split);
        feed(&mut server, head);
        assert!(!server.release_receive_buffer(), "split at {split}");
        feed(&mut server, tail);
        assert_eq!(
            read_all(&mut server),
            b"the first request",
            "split at {split}"
        );
    }

    // Decrypted plaintext not yet read is kept where it was decrypted, so
    // the buffer holding it is not released until it has been read.
    feed(&mut server, &wire);
    assert!(!server.release_receive_buffer());
    assert_eq!(read_all(&mut server), b"the first request");
    assert!(server.release_receive_buffer());
}

/// The TLS records in `wire`: (content type, length) of each.
fn records(mut wire: &[u8]) -> Vec<(u8, usize)> {
    let mut out = Vec::new();
    while wire.len() >= 5 {
        let len = u16::from_be_bytes([wire[3], wire[4]]) as usize;
        out.push((wire[0], len));
        wire = &wire[5 + len..];
    }
    assert!(wire.is_empty(), "a partial record at the end");
    out
}

#[test]
fn a_large_reply_chunk_and_its_framing_are_taken_by_one_write() {
    // What hyper hands the session side for one 64 KiB chunk of a chunked
    // HTTP/1.1 reply, in one vectored write.
    let body = pattern(64 * 1024);
    let framed = [
        IoSlice::new(b"10000\r\n"),
        IoSlice::new(&body),
        IoSlice::new(b"\r\n"),
    ];
    let total = 7 + body.len() + 2;

    // rustls's own limit takes 64 KiB and leaves the last 9 bytes for a
    // second write (a record and a system call of their own).
    let (_client, mut server) = pair();
    assert_eq!(server.writer().write_vectored(&framed).unwrap(), 64 * 1024);

    // The gateway's takes it whole: one write, four full records and the
    // 9-byte rest, all of it in what one `write_tls` hands the socket.
    let (mut client2, mut server2) = pair();
    server2.set_buffer_limit(Some(talos_gateway::tls::SESSION_SEND_LIMIT));
    assert_eq!(server2.writer().write_vectored(&framed).unwrap(), total);
    let mut wire = Vec::new();
    let written = server2.write_tls(&mut wire).unwrap();
    assert_eq!(written, wire.len());
    assert!(!server2.wants_write(), "everything left in one write_tls");
    // 0x17: application data; 16 KiB of plaintext plus type byte and tag.
    let app: Vec<usize> = records(&wire)
        .into_iter()
        .filter(|(t, _)| *t == 0x17)
        .map(|(_, len)| len)
        .collect();
    assert_eq!(
        app,
        vec![16384 + 17, 16384 + 17, 16384 + 17, 16384 + 17, 9 + 17]
    );
    // The client reads as it goes (rustls holds 16 KiB of plaintext).
    let mut got = Vec::new();
    let mut rest = &wire[..];
    while !rest.is_empty() {
        client2.read_tls(&mut rest).unwrap();
        client2.process_new_packets().unwrap();
        let mut chunk = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = client2.reader().read(&mut chunk) {
            got.extend_from_slice(&chunk[..n]);
        }
    }
    let mut expected = b"10000\r\n".to_vec();
    expected.extend_from_slice(&body);
    expected.extend_from_slice(b"\r\n");
    assert_eq!(got, expected);
}

#[test]
fn the_send_limit_still_bounds_what_a_slow_client_leaves_buffered() {
    let (_client, mut server) = pair();
    server.set_buffer_limit(Some(talos_gateway::tls::SESSION_SEND_LIMIT));
    let big = vec![7u8; 1024 * 1024];
    // Nothing is written to the socket in between, as when the client does
    // not read: the writer takes up to the limit, then nothing more.
    let taken = server.writer().write(&big).unwrap();
    assert_eq!(taken, talos_gateway::tls::SESSION_SEND_LIMIT);
    assert_eq!(server.writer().write(&big).unwrap(), 0);
}

/// A peer's bytes as a socket hands them out: each read gets what `piece`
/// allows of what is left, and "would block" when `pause` says so or when
/// nothing is left. Records the room each read offered.
struct Wire<P: FnMut(usize) -> usize, Q: FnMut() -> bool> {
    bytes: Vec<u8>,
    at: usize,
    piece: P,
    pause: Q,
    rooms: Vec<usize>,
}

impl<P: FnMut(usize) -> usize, Q: FnMut() -> bool> Read for Wire<P, Q> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.rooms.push(buf.len());
        if self.at == self.bytes.len() || (self.pause)() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = (self.piece)(buf.len())
            .clamp(1, buf.len())
            .min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Reads `wire` into `conn` until it is all read, as the gateway's
/// connections do: each read, then the records it completed, then the
/// plaintext out. Returns the plaintext.
fn receive<B, P: FnMut(usize) -> usize, Q: FnMut() -> bool>(
    conn: &mut rustls::ConnectionCommon<B>,
    wire: &mut Wire<P, Q>,
) -> Vec<u8> {
    let mut got = Vec::new();
    receive_into(conn, wire, &mut got, &mut vec![0u8; 64 * 1024]);
    got
}

/// `receive`, with the buffers the caller's: the plaintext is appended to
/// `got`, read out `chunk` by `chunk`.
fn receive_into<B, P: FnMut(usize) -> usize, Q: FnMut() -> bool>(
    conn: &mut rustls::ConnectionCommon<B>,
    wire: &mut Wire<P, Q>,
    got: &mut Vec<u8>,
    chunk: &mut [u8],
) {
    while wire.at < wire.bytes.len() {
        match conn.read_tls(wire) {
            Ok(n) => assert!(n > 0),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("read_tls: {e}"),
        }
        conn.process_new_packets().unwrap();
        while let Ok(n @ 1..) = conn.reader().read(chunk) {
            got.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A wire that hands each read all the room it offers, and never pauses.
type OpenWire = Wire<fn(usize) -> usize, fn() -> bool>;

/// A connected pair with 1 MiB (`pattern`) sent by the server, all of it
/// readable at once by the client from the wire returned.
fn mib_stream() -> (ClientConnection, ServerConnection, OpenWire, Vec<u8>) {
    let (client, mut server) = pair();
    server.set_buffer_limit(None);
    let body = pattern(1 << 20);
    server.writer().write_all(&body).unwrap();
    let wire = Wire {
        bytes: output(&mut server),
        at: 0,
        piece: (|room| room) as fn(usize) -> usize,
        pause: (|| false) as fn() -> bool,
        rooms: Vec::new(),
    };
    (client, server, wire, body)
}

#[test]
fn a_stream_is_read_several_records_at_a_time_and_the_buffer_shrinks_after() {
    let (mut client, mut server, mut wire, body) = mib_stream();
    assert_eq!(receive(&mut client, &mut wire), body);

    // Released rustls offers each read 4 KiB, or what completes the record
    // it holds part of: 260 reads or more for this MiB. Once a read fills
    // its room, the next ones offer 64 KiB and more.
    let reads = wire.rooms.len();
    assert!(reads <= 24, "{reads} reads: {:?}", wire.rooms);
    assert_eq!(wire.rooms[0], 4096);
    assert!(
        wire.rooms[2..].iter().all(|&room| room >= 64 * 1024),
        "{:?}",
        wire.rooms
    );

    // The stream pauses: nothing waits to be read. The read that finds
    // that gives the stream's buffer back at once (a pooled connection may
    // not read again for a long time).
    let shrunk = allocation_counter::measure(|| {
        assert_eq!(
            client.read_tls(&mut wire).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    });
    assert!(shrunk.bytes_current <= -60 * 1024, "{shrunk:?}");
    // The next read offers 4 KiB again.
    server.writer().write_all(b"and the rest").unwrap();
    wire.bytes.extend_from_slice(&output(&mut server));
    let before = wire.rooms.len();
    client.read_tls(&mut wire).unwrap();
    assert_eq!(wire.rooms[before], 4096);
    client.process_new_packets().unwrap();
    assert_eq!(read_all(&mut client), b"and the rest");
    // Idle now: the buffer goes altogether.
    assert!(client.release_receive_buffer());
}

/// A small deterministic generator for the cuts below.
struct Cuts(u64);

impl Cuts {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }
}

#[test]
fn records_and_key_updates_arrive_whole_however_reads_cut_them() {
    // Records of up to 16 KiB and of at most 100 bytes (the tickets then
    // span several records each); reads cut anywhere, small and large,
    // with pauses in between; the server's tickets and three key updates
    // (each changes the keys of every record after it) among the data.
    for fragment in [None, Some(100)] {
        for seed in 1..=6u64 {
            let (mut client, mut server) = pair_with(fragment, false);
            server.set_buffer_limit(None);
            let mut cuts = Cuts(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut sent = Vec::new();
            for i in 0..40 {
                let len = 1 + cuts.next(if i % 3 == 0 { 40_000 } else { 600 });
                let data: Vec<u8> = (0..len).map(|_| cuts.next(256) as u8).collect();
                server.writer().write_all(&data).unwrap();
                sent.extend_from_slice(&data);
                if i % 13 == 12 {
                    server.refresh_traffic_keys().unwrap();
                }
            }
            let bytes = output(&mut server);
            let mut sizes = Cuts(seed);
            let mut pauses = Cuts(seed + 100);
            let mut wire = Wire {
                bytes,
                at: 0,
                piece: move |room| match sizes.next(3) {
                    0 => 1 + sizes.next(40),
                    1 => 1 + sizes.next(room),
                    _ => room,
                },
                pause: move || pauses.next(5) == 0,
                rooms: Vec::new(),
            };
            let got = receive(&mut client, &mut wire);
            assert!(
                got == sent,
                "fragment {fragment:?} seed {seed}: the plaintext differs"
            );
            // The client took the key updates: it sends with new keys of
            // its own (as asked), and the server reads them.
            client.writer().write_all(b"thanks").unwrap();
            flush(&mut client, &mut server);
            assert_eq!(
                read_all(&mut server),
                b"thanks",
                "fragment {fragment:?} seed {seed}"
            );
        }
    }
}

#[test]
fn a_stream_is_read_out_of_the_buffer_it_was_decrypted_in() {
    // Released rustls copies each record's plaintext into a buffer of its
    // own (16 KiB allocated per record: 64 for this MiB) before the reader
    // copies it out again; here the reader copies it from where it was
    // decrypted, and receiving the MiB allocates the read buffer and
    // little else.
    let (mut client, _server, mut wire, body) = mib_stream();
    let mut got = Vec::with_capacity(body.len());
    let mut chunk = vec![0u8; 64 * 1024];
    let counted = allocation_counter::measure(|| {
        receive_into(&mut client, &mut wire, &mut got, &mut chunk);
    });
    assert_eq!(got, body);
    assert!(counted.count_total <= 8, "{counted:?}");
    assert!(counted.bytes_total <= 256 * 1024, "{counted:?}");
}

#[test]
fn plaintext_read_a_little_at_a_time_between_reads_arrives_whole() {
    // The reader takes what it likes, through `read` or `fill_buf` and
    // `consume`, sometimes nothing; more records are read while plaintext
    // still waits (so the buffer moves it to the front with the partial
    // record after it) until rustls refuses to read more; a key update and
    // tickets among the data; the server's close at the end comes after
    // every byte.
    use std::io::BufRead;
    for fragment in [None, Some(100)] {
        // Reads made while plaintext waited, and reads rustls refused.
        let (mut read_while_waiting, mut refused) = (0, 0);
        for seed in 1..=6u64 {
            let (mut client, mut server) = pair_with(fragment, false);
            server.set_buffer_limit(None);
            let mut cuts = Cuts(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
            let mut sent = Vec::new();
            for i in 0..30 {
                let len = 1 + cuts.next(if i % 3 == 0 { 30_000 } else { 700 });
                let data: Vec<u8> = (0..len).map(|_| cuts.next(256) as u8).collect();
                server.writer().write_all(&data).unwrap();
                sent.extend_from_slice(&data);
                if i == 17 {
                    server.refresh_traffic_keys().unwrap();
                }
            }
            server.send_close_notify();
            let mut sizes = Cuts(seed + 7);
            let mut wire = Wire {
                bytes: output(&mut server),
                at: 0,
                piece: move |room| 1 + sizes.next(room),
                pause: || false,
                rooms: Vec::new(),
            };
            let mut got = Vec::new();
            // Plaintext left unread by the previous turn.
            let mut left = 0;
            loop {
                // Read more TLS unless everything is in, or rustls says
                // the plaintext waiting is enough.
                if wire.at < wire.bytes.len() {
                    match client.read_tls(&mut wire) {
                        Ok(n) => {
                            assert!(n > 0);
                            read_while_waiting += usize::from(left > 0);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Other => refused += 1,
                        Err(e) => panic!("read_tls: {e}"),
                    }
                }
                let waiting = client
                    .process_new_packets()
                    .unwrap()
                    .plaintext_bytes_to_read();
                let take = match cuts.next(4) {
                    0 => 0,
                    1 => 1 + cuts.next(50),
                    2 => 1 + cuts.next(20_000),
                    _ => usize::MAX,
                };
                if cuts.next(2) == 0 {
                    let mut buf = vec![0u8; take.min(40_000)];
                    match client.reader().read(&mut buf) {
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
                    }
                } else {
                    let mut reader = client.reader();
                    let first = reader.fill_buf().map(|b| b.to_vec()).unwrap_or_default();
                    let n = first.len().min(take);
                    got.extend_from_slice(&first[..n]);
                    reader.consume(n);
                }
                left = client
                    .process_new_packets()
                    .unwrap()
                    .plaintext_bytes_to_read();
                assert!(left <= waiting);
                if wire.at == wire.bytes.len() && left == 0 {
                    break;
                }
            }
            assert!(
                got == sent,
                "fragment {fragment:?} seed {seed}: the plaintext differs"
            );
            // The close comes after the last byte: a clean end of stream.
            assert!(client.process_new_packets().unwrap().peer_has_closed());
            assert_eq!(client.reader().read(&mut [0u8; 8]).unwrap(), 0);
            assert!(client.release_receive_buffer());
        }
        assert!(
            read_while_waiting > 20,
            "{fragment:?}: {read_while_waiting}"
        );
        assert!(
            refused > 0,
            "{fragment:?}: the plaintext limit was never met"
        );
    }
}
