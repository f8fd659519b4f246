//! Test peers for the end-to-end suite: everything runs on loopback, on
//! ports the kernel picks.
//!
//! - [`browser`]: Debian's Chromium, headless, driven over the DevTools
//!   protocol, with a virtual authenticator, axe-core and screenshots:
//!   what the people-facing tests drive the web pages with.
//! - [`dns`]: a real DNS server (UDP) answering from a table.
//! - [`gateway`]: the `gateway` binary started as operators start it.
//! - [`member`]: a `gateway` followed across handovers, with `gateway
//!   reload` and `gateway upgrade`.
//! - [`clients`]: source addresses and real client binaries.
//! - [`origin`]: a real TLS origin with its own test CA.
//! - [`people`]: the people's web app's certificate, and a person's
//!   passkey (a software authenticator) enrolled and used over its HTTPS.
//! - [`ports`]: ports named before anything listens on them, outside the
//!   kernel's ephemeral range.
//! - [`postgres`]: a PostgreSQL server of a test's own (the replicated store).
//! - [`resolving`]: clients that find names through the C library's
//!   resolver, pointed at the gateway's DNS answerer.
//! - [`hostile`]: an origin that misbehaves on purpose, for the adversarial suite.
//! - [`control`]: the control plane's side of the control channel: a
//!   control CA, certificates, and a mutual-TLS `Gateway` client.
//! - [`grpc`]: a tonic origin (HTTP/2 or HTTP/1.1-only) and a tonic client
//!   that reaches it through the gateway.
//! - [`signals`]: signals to a process by its PID (SIGKILL, SIGSTOP,
//!   SIGCONT, SIGTERM, SIGHUP), and its scheduler state.
//! - [`rig`]: what the tests stand on: one gateway and what is behind it
//!   ([`rig::Single`]), or the members of a pair under the control stub
//!   ([`rig::Pair`]).
//! - [`wait`]: waiting, within a deadline, for what another process or
//!   task does.
//!
//! The binaries beside them (`src/bin/`) are what `scripts/` runs on the
//! same peers: `demo-peers` and `demo-check` (`scripts/demo.sh`: its DNS
//! server and origin, and the check of its certificate, tested over
//! `testdata/demo/`), and `people-screenshots`
//! (`scripts/people-screenshots.sh`). The benchmarks' tools stand on this
//! library too, from their own crate (`benches/harness`), which this one
//! never depends on.

pub mod browser;
pub mod clients;
pub mod control;
pub mod dns;
pub mod gateway;
pub mod grpc;
pub mod hostile;
pub mod member;
pub mod origin;
pub mod people;
pub mod ports;
pub mod postgres;
pub mod relay;
pub mod resolving;
pub mod rig;
pub mod signals;
pub mod stub;
pub mod wait;
