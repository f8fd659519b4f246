//! Web Push to an approver's devices when a card waits: RFC 8030
//! delivery, RFC 8291 message encryption (the RFC 8188 `aes128gcm`
//! content coding), RFC 8292 VAPID.
//!
//! # What a message carries
//!
//! `{"type":"card_waiting","card":"<card id>"}`, and nothing else: no
//! sentence, no session, tenant, destination or rule, no secret. The push
//! service (Google's, Mozilla's, Apple's, Microsoft's) and the device's
//! lock screen are outside the trust boundary: the push service sees each
//! message's size, time and destination device, and a notification is
//! read on a locked phone by whoever holds it. So a message says only that
//! a card waits and which; the device's page fetches the card itself, over
//! the web app's own TLS, after the person signed in with their passkey.
//! The encryption (RFC 8291) keeps even the card id from the push service.
//!
//! # How a message goes
//!
//! [`Push::notify_card_waiting`] (the card flow calls it when a card is
//! stored) reads the subscriptions of every approver the card names and
//! puts one message per device on a bounded queue ([`PushConfig::queue`]),
//! without waiting: a full queue drops the message, with a log line and
//! `stub_push_messages_total{result="dropped"}`. The card flow never waits
//! on a push service. A task of its own ([`Push::start`]) takes messages
//! off the queue, at most [`PushConfig::concurrency`] at a time, and for
//! each:
//!
//! 1. encrypts the payload to the device's `p256dh` key and `auth`
//!    secret: an ephemeral P-256 key and a random salt per message,
//!    HKDF-SHA-256 as RFC 8291 §3.4 says, one AES-128-GCM record of
//!    [`RECORD_SIZE`] with the last-record delimiter (`0x02`);
//! 2. signs a VAPID token (RFC 8292): an ES256 JWT whose `aud` is the
//!    endpoint's origin, `exp` [`TOKEN_LIFE`] from now (at most 24 hours
//!    by RFC 8292 §2), `sub` the operator's contact, sent as
//!    `Authorization: vapid t=<JWT>, k=<public key>`;
//! 3. POSTs it to the endpoint over HTTPS (HTTP/1.1, one connection per
//!    message: a card is rare, a pool would hold connections to a dozen
//!    hosts for nothing), certificates checked against the public roots
//!    (or [`PushConfig::roots`]), with `TTL` [`CARD_TTL`] (a card waits
//!    five minutes; a message delivered later is of no use), `Urgency:
//!    high` (a person must decide within those five minutes), and a
//!    `Topic` derived from the card id, so a newer message for the same
//!    card replaces an older one still held at the push service;
//! 4. reads the answer: 2xx sent; 404 or 410 the subscription is gone
//!    (RFC 8030 §7.3) and is removed from the store; 429 and 5xx, a
//!    connection that fails or an answer that takes longer than
//!    [`PushConfig::timeout`], tried again after a backoff (doubling from
//!    [`PushConfig::backoff`], or the push service's `Retry-After` if
//!    longer, at most [`MAX_BACKOFF`]) up to [`PushConfig::attempts`]
//!    times in all; any other answer (400, 401 and 403 among them: a
//!    VAPID key the subscription was not made under) fails at once. The
//!    store keeps each subscription's last success and last failure.
//!
//! # Whom it reaches
//!
//! An endpoint comes from a browser, and the control plane POSTs to it:
//! left open, a signed-in person could point the control plane at any
//! HTTPS host. So endpoints must be on a host of [`PushConfig::hosts`]:
//! by default the browsers' push services ([`DEFAULT_HOSTS`]). That list
//! is checked when a device subscribes ([`Push::subscribe`]) and again
//! before each message (a narrowed list stops messages to hosts no longer
//! on it).
//!
//! # Logs and metrics
//!
//! One JSON line on standard error per message sent, retried, failed,
//! dropped or found gone: the card id, the person, and the endpoint's
//! origin only. An endpoint URL is a capability (whoever holds it can send
//! to the device), so its path never reaches a log, an error or a metric.
//! `stub_push_messages_total{result}` counts messages by outcome
//! ([`Outcome`]: `sent`, `gone`, `failed`, `dropped`) and
//! `stub_push_retries_total` the tries after a first; both are at 0 from
//! [`Push::start`].
//!
//! # Limits
//!
//! The queue holds [`PushConfig::queue`] messages ([`QUEUE`] by default),
//! [`PushConfig::concurrency`] deliveries run at once ([`CONCURRENCY`]),
//! each at most [`PushConfig::attempts`] tries ([`ATTEMPTS`]) of at most
//! [`PushConfig::timeout`] ([`TIMEOUT`]) each, with at most
//! [`MAX_BACKOFF`] between two. A message is at most a few hundred bytes
//! (a card id is at most [`crate::relay::MAX_PROPOSAL_ID_LEN`] bytes).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::{aead, agreement, hkdf};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use talos_contract::sync::Locked;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use zeroize::Zeroizing;

use crate::error::Error;
use crate::identity::VapidKey;
use crate::store::{Endpoint, NewSubscription, PushSubscription, Store};

/// A message's `TTL` (RFC 8030 §5.2): a card waits five minutes for a
/// decision (the gateway's hold), so a message the push service could
/// only deliver later is of no use.
pub const CARD_TTL: Duration = Duration::from_secs(300);

/// How long a VAPID token is good for: RFC 8292 §2 allows at most 24
/// hours; half that leaves room for a push service whose clock is ahead.
pub const TOKEN_LIFE: Duration = Duration::from_secs(12 * 60 * 60);

/// The record size written in the `aes128gcm` header (RFC 8188 §2.1): the
/// 4,096 bytes a push service must accept (RFC 8030 §7.2); a message is
/// one record well under it.
pub const RECORD_SIZE: u32 = 4096;

/// Messages the queue holds by default: a thousand cards' devices waiting
/// for a push service is far more than a team of approvers makes, and
/// small in memory (a message is a few hundred bytes).
pub const QUEUE: usize = 1024;

/// Deliveries at once by default: enough that a push service that hangs
/// until [`TIMEOUT`] holds up no more than its own messages.
pub const CONCURRENCY: usize = 8;

/// Tries per message by default, the first included.
pub const ATTEMPTS: u32 = 4;

/// The first wait before a message is tried again by default; it doubles
/// at each try (1, 2, 4 s: all within a card's five minutes).
pub const BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between two tries, whatever a push service's
/// `Retry-After` asks: a card lives five minutes.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long one try may take by default, from the connection to the
/// answer's head.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The hosts of the browsers' push services: Chrome, Edge's older builds,
/// Opera and Samsung Internet (Firebase Cloud Messaging), Firefox
/// (Mozilla's autopush), Safari (Apple), Edge (Windows Push Notification
/// Services, one host per region).
pub const DEFAULT_HOSTS: &[&str] = &[
    "fcm.googleapis.com",
    "updates.push.services.mozilla.com",
    "web.push.apple.com",
    "*.notify.windows.com",
];

/// The longest VAPID contact, in bytes.
const MAX_CONTACT_LEN: usize = 256;

/// How a message ended, as `stub_push_messages_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The push service took it (2xx).
    Sent,
    /// The push service says the subscription is gone (404, 410): removed.
    Gone,
    /// Not delivered: another answer, every try failed, or the endpoint's
    /// host is not allowed.
    Failed,
    /// Never tried: the queue was full, or the sender stopping.
    Dropped,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Sent,
        Outcome::Gone,
        Outcome::Failed,
        Outcome::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Gone => "gone",
            Outcome::Failed => "failed",
            Outcome::Dropped => "dropped",
        }
    }
}

fn count(outcome: Outcome) {
    metrics::counter!("stub_push_messages_total", "result" => outcome.as_str()).increment(1);
}

/// Every push series at 0 (a series already counting keeps its value).
pub fn preregister() {
    for o in Outcome::ALL {
        metrics::counter!("stub_push_messages_total", "result" => o.as_str()).increment(0);
    }
    metrics::counter!("stub_push_retries_total").increment(0);
}

fn config_invalid(reason: impl Into<String>) -> Error {
    Error::PushConfigInvalid {
        reason: reason.into(),
    }
}

/// The operator's contact that push services are given (VAPID `sub`):
/// `mailto:ADDRESS` or an `https://` URL (RFC 8292 §2.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contact(String);

impl Contact {
    pub fn parse(text: &str) -> Result<Contact, Error> {
        let bad = |why: &str| {
            config_invalid(format!(
                "VAPID contact {:?}: {why}",
                text.chars().take(100).collect::<String>()
            ))
        };
        if text.len() > MAX_CONTACT_LEN || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(&format!(
                "at most {MAX_CONTACT_LEN} printable ASCII characters"
            )));
        }
        if let Some(address) = text.strip_prefix("mailto:") {
            let ok = address
                .split_once('@')
                .is_some_and(|(user, host)| !user.is_empty() && !host.is_empty());
            if !ok {
                return Err(bad("a mailto: contact names an address, user@host"));
            }
        } else if text.starts_with("https://") {
            let uri: hyper::Uri = text.parse().map_err(|_| bad("not a URL"))?;
            if uri.host().is_none_or(str::is_empty) {
                return Err(bad("an https contact names a host"));
            }
        } else {
            return Err(bad("a contact is mailto:ADDRESS or an https:// URL"));
        }
        Ok(Contact(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One entry of the hosts push may reach: a name or address, or `*.NAME`
/// for any name under NAME (not NAME itself).
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `.NAME`: what a host under NAME ends with.
    Under(String),
}

/// The hosts push endpoints may be on ([`PushConfig::hosts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts(Vec<HostPattern>);

impl Hosts {
    /// Check each pattern: a DNS name or an IP address, or `*.` and a DNS
    /// name with at least two labels. Compared in lower case.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Hosts, Error> {
        let mut out = Vec::new();
        for p in patterns {
            let p = p.as_ref().to_ascii_lowercase();
            let bad = |why: &str| {
                config_invalid(format!(
                    "push host {:?}: {why}",
                    p.chars().take(100).collect::<String>()
                ))
            };
            let name_ok = |n: &str| rustls::pki_types::ServerName::try_from(n).is_ok();
            match p.strip_prefix("*.") {
                Some(name) => {
                    if !name.contains('.')
                        || !name_ok(name)
                        || name.parse::<std::net::IpAddr>().is_ok()
                    {
                        return Err(bad("*. is followed by a DNS name of two labels or more"));
                    }
                    out.push(HostPattern::Under(format!(".{name}")));
                }
                None => {
                    let bare = p.trim_start_matches('[').trim_end_matches(']');
                    if bare.is_empty() || !name_ok(bare) {
                        return Err(bad("neither a DNS name, an IP address, nor *.NAME"));
                    }
                    out.push(HostPattern::Exact(bare.to_owned()));
                }
            }
        }
        if out.is_empty() {
            return Err(config_invalid("no push host: push could reach no device"));
        }
        Ok(Hosts(out))
    }

    /// Whether an endpoint on `host` (lower case, as [`Endpoint`] has it)
    /// may be reached.
    pub fn allows(&self, host: &str) -> bool {
        self.0.iter().any(|p| match p {
            HostPattern::Exact(h) => h == host,
            HostPattern::Under(suffix) => host.ends_with(suffix.as_str()),
        })
    }
}

/// How push runs.
#[derive(Clone)]
pub struct PushConfig {
    /// The VAPID `sub`.
    pub contact: Contact,
    /// The hosts endpoints may be on; default [`DEFAULT_HOSTS`].
    pub hosts: Hosts,
    /// The trust anchors endpoints' certificates are checked against;
    /// default the public roots (webpki-roots, compiled in).
    pub roots: Arc<rustls::RootCertStore>,
    /// Messages waiting at most; default [`QUEUE`].
    pub queue: usize,
    /// Deliveries at once; default [`CONCURRENCY`].
    pub concurrency: usize,
    /// Tries per message, the first included; default [`ATTEMPTS`].
    pub attempts: u32,
    /// The first wait before a try again; default [`BACKOFF`].
    pub backoff: Duration,
    /// One try's bound, from connecting to the answer's head; default
    /// [`TIMEOUT`].
    pub timeout: Duration,
}

impl std::fmt::Debug for PushConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushConfig")
            .field("contact", &self.contact)
            .field("hosts", &self.hosts)
            .field("roots", &self.roots.len())
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl PushConfig {
    /// The defaults, with `contact`.
    pub fn new(contact: Contact) -> PushConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        PushConfig {
            contact,
            hosts: Hosts::parse(DEFAULT_HOSTS).unwrap_or(Hosts(Vec::new())),
            roots: Arc::new(roots),
            queue: QUEUE,
            concurrency: CONCURRENCY,
            attempts: ATTEMPTS,
            backoff: BACKOFF,
            timeout: TIMEOUT,
        }
    }

    /// Trust, beside the roots already trusted, every CA certificate in the
    /// PEM file at `path` (a test's own push endpoint, a push service
    /// behind an inspecting proxy).
    pub fn with_ca_file(mut self, path: &Path) -> Result<PushConfig, Error> {
        let shown = path.display().to_string();
        let pem = std::fs::read(path).map_err(|e| Error::Io {
            what: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut roots = (*self.roots).clone();
        let mut found = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| config_invalid(format!("{shown}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| config_invalid(format!("{shown}: {e}")))?;
            found += 1;
        }
        if found == 0 {
            return Err(config_invalid(format!("{shown}: no certificate in it")));
        }
        self.roots = Arc::new(roots);
        Ok(self)
    }
}

/// Push's settings on the command line, for a command that serves people
/// (flattened into it with `#[command(flatten)]`). Push is on when
/// `--push-contact` is given.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PushArgs {
    /// Turn Web Push on, giving push services this contact for the
    /// operator (VAPID `sub`): mailto:ADDRESS or an https:// URL.
    #[arg(long = "push-contact", value_name = "URI")]
    pub contact: Option<String>,
    /// A host push endpoints may be on (repeat for more; `*.NAME` for any
    /// name under NAME). Replaces the default list: the browsers' push
    /// services.
    #[arg(long = "push-host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// A PEM file of CA certificates trusted for push endpoints beside the
    /// public roots.
    #[arg(long = "push-ca", value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
}

impl PushArgs {
    /// The config these settings give; `None` when push is off.
    pub fn config(&self) -> Result<Option<PushConfig>, Error> {
        let Some(contact) = &self.contact else {
            if !self.hosts.is_empty() || self.ca.is_some() {
                return Err(config_invalid(
                    "--push-host and --push-ca need --push-contact (push is off without it)",
                ));
            }
            return Ok(None);
        };
        let mut config = PushConfig::new(Contact::parse(contact)?);
        if !self.hosts.is_empty() {
            config.hosts = Hosts::parse(&self.hosts)?;
        }
        if let Some(ca) = &self.ca {
            config = config.with_ca_file(ca)?;
        }
        Ok(Some(config))
    }
}

// ---- RFC 8291 message encryption ----

/// The `aes128gcm` header before the key id: salt, record size, key id
/// length.
const SALT_LEN: usize = 16;
/// AES-128-GCM's tag.
const TAG_LEN: usize = 16;
/// An uncompressed P-256 point.
const POINT_LEN: usize = 65;
/// RFC 8291 §3.4's `key_info` prefix, RFC 8188 §2.2 and §2.3's infos.
const KEY_INFO: &[u8] = b"WebPush: info\0";
const CEK_INFO: &[u8] = b"Content-Encoding: aes128gcm\0";
const NONCE_INFO: &[u8] = b"Content-Encoding: nonce\0";
/// The delimiter after the last record's data (RFC 8188 §2).
const LAST_RECORD: u8 = 0x02;

/// An HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-SHA-256 (RFC 5869): extract with `salt` from `ikm`, expand with
/// `info` into `out`.
fn hkdf(salt: &[u8], ikm: &[u8], info: &[u8], out: &mut [u8]) -> Result<(), Error> {
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(ikm)
        .expand(&[info], Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| crypto_failed("HKDF"))
}

fn crypto_failed(what: &str) -> Error {
    Error::Io {
        what: "push encryption".into(),
        reason: format!("aws-lc failed at {what}"),
    }
}

/// `plaintext` encrypted to a device (its `p256dh` key `ua_public` and its
/// `auth` secret) as RFC 8291 says: a fresh P-256 key and a random salt,
/// one `aes128gcm` record.
pub fn encrypt(plaintext: &[u8], ua_public: &[u8], auth: &[u8]) -> Result<Vec<u8>, Error> {
    let mut salt = [0u8; SALT_LEN];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| crypto_failed("the random generator"))?;
    let key = agreement::PrivateKey::generate(&agreement::ECDH_P256)
        .map_err(|_| crypto_failed("making a P-256 key"))?;
    encrypt_with(plaintext, ua_public, auth, &salt, &key)
}

/// [`encrypt`] with a given salt and sender key: the test vector's entry.
fn encrypt_with(
    plaintext: &[u8],
    ua_public: &[u8],
    auth: &[u8],
    salt: &[u8; SALT_LEN],
    as_key: &agreement::PrivateKey,
) -> Result<Vec<u8>, Error> {
    if plaintext.len() + 1 + TAG_LEN > RECORD_SIZE as usize {
        return Err(Error::Io {
            what: "push encryption".into(),
            reason: format!("a message of {} bytes is over one record", plaintext.len()),
        });
    }
    let as_public = as_key
        .compute_public_key()
        .map_err(|_| crypto_failed("the sender's public key"))?;
    let as_public = as_public.as_ref();
    // RFC 8291 §3.4: IKM = HKDF(auth, ECDH, "WebPush: info" 0 ua as, 32).
    let ikm = agreement::agree(
        as_key,
        agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, ua_public),
        Error::PushSubscriptionInvalid {
            reason: "the device's key is not a P-256 point".into(),
        },
        |ecdh| {
            let mut info = Vec::with_capacity(KEY_INFO.len() + 2 * POINT_LEN);
            info.extend_from_slice(KEY_INFO);
            info.extend_from_slice(ua_public);
            info.extend_from_slice(as_public);
            let mut ikm = Zeroizing::new([0u8; 32]);
            hkdf(auth, ecdh, &info, &mut *ikm)?;
            Ok(ikm)
        },
    )?;
    // RFC 8188 §2.2, §2.3: the content key and the nonce from the salt.
    let mut cek = Zeroizing::new([0u8; 16]);
    hkdf(salt, &*ikm, CEK_INFO, &mut *cek)?;
    let mut nonce = [0u8; 12];
    hkdf(salt, &*ikm, NONCE_INFO, &mut nonce)?;

    let mut body = Vec::with_capacity(SALT_LEN + 5 + POINT_LEN + plaintext.len() + 1 + TAG_LEN);
    body.extend_from_slice(salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(u8::try_from(as_public.len()).map_err(|_| crypto_failed("the key id"))?);
    body.extend_from_slice(as_public);
    let mut record = Vec::with_capacity(plaintext.len() + 1 + TAG_LEN);
    record.extend_from_slice(plaintext);
    record.push(LAST_RECORD);
    let key = aead::UnboundKey::new(&aead::AES_128_GCM, &*cek)
        .map(aead::LessSafeKey::new)
        .map_err(|_| crypto_failed("the content key"))?;
    // One record: sequence number 0, so the nonce is used as derived.
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::empty(),
        &mut record,
    )
    .map_err(|_| crypto_failed("AES-128-GCM"))?;
    body.extend_from_slice(&record);
    Ok(body)
}

// ---- RFC 8292 VAPID ----

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The `Authorization` header for a message to an endpoint of `origin`:
/// `vapid t=<JWT>, k=<public key>` (RFC 8292 §3), the JWT signed ES256
/// with `aud` the origin, `exp` [`TOKEN_LIFE`] after `now`, `sub`
/// `contact`.
pub fn vapid_authorization(
    key: &VapidKey,
    origin: &str,
    contact: &Contact,
    now: SystemTime,
) -> Result<String, Error> {
    let exp = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(TOKEN_LIFE)
        .as_secs();
    let header = b64(br#"{"typ":"JWT","alg":"ES256"}"#);
    let claims = serde_json::json!({"aud": origin, "exp": exp, "sub": contact.as_str()});
    let claims = b64(claims.to_string().as_bytes());
    let signing_input = format!("{header}.{claims}");
    let signature = key.sign(signing_input.as_bytes())?;
    Ok(format!(
        "vapid t={signing_input}.{}, k={}",
        b64(&signature),
        b64(key.public_key())
    ))
}

// ---- the message ----

/// A card id as the relay takes proposal ids: 1 to
/// [`crate::relay::MAX_PROPOSAL_ID_LEN`] printable ASCII characters.
fn check_card(card: &str) -> Result<(), Error> {
    let max = crate::relay::MAX_PROPOSAL_ID_LEN;
    if card.is_empty() || card.len() > max || !card.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::ProposalInvalid {
            reason: format!(
                "card id {:?}: 1 to {max} printable characters",
                card.chars().take(100).collect::<String>()
            ),
        });
    }
    Ok(())
}

/// What a message says: that card `card` waits. Nothing else (see the
/// module docs).
pub fn payload(card: &str) -> String {
    format!(
        r#"{{"type":"card_waiting","card":{}}}"#,
        serde_json::Value::from(card)
    )
}

/// A card's `Topic` (RFC 8030 §5.4: at most 32 characters of base64url):
/// the first 24 bytes of the card id's SHA-256, so every message of one
/// card has the same topic and the push service keeps only the newest.
pub fn topic(card: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, card.as_bytes());
    b64(&digest.as_ref()[..24])
}

/// One message on the queue: one card, one device.
struct Message {
    card: String,
    /// Who holds the device, for logs.
    person: String,
    endpoint: String,
    p256dh: Vec<u8>,
    auth: Zeroizing<Vec<u8>>,
}

/// What [`Push::notify_card_waiting`] did with a card's devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notified {
    /// Messages put on the queue, one per device.
    pub queued: usize,
    /// Messages dropped: the queue was full, or push stopping.
    pub dropped: usize,
    /// Devices not sent to: their endpoint's host is not allowed.
    pub failed: usize,
}

// ---- the sender ----

/// What every delivery shares.
struct Shared {
    config: PushConfig,
    key: VapidKey,
    tls: Arc<rustls::ClientConfig>,
    store: Arc<Mutex<Store>>,
}

/// Push's handle: what the web app and the card flow call. Cheap to
/// clone; every clone puts messages on the same queue.
#[derive(Clone)]
pub struct Push {
    queue: mpsc::Sender<Message>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Push {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Push")
            .field("config", &self.shared.config)
            .field("key", &self.shared.key)
            .finish_non_exhaustive()
    }
}

/// The sender's task, stopped by [`PushTask::stop`].
#[derive(Debug)]
pub struct PushTask {
    stop: oneshot::Sender<()>,
    worker: JoinHandle<()>,
}

impl Push {
    /// Start the sender: the queue and the task that empties it. `store`
    /// is where deliveries record their outcome (the store the web app
    /// and the card flow use). Push's metrics are at 0 from here.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn start(
        config: PushConfig,
        key: VapidKey,
        store: Arc<Mutex<Store>>,
    ) -> Result<(Push, PushTask), Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_invalid(format!("TLS: {e}")))?
            .with_root_certificates(config.roots.clone())
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        preregister();
        let (queue, rx) = mpsc::channel(config.queue.max(1));
        let shared = Arc::new(Shared {
            config,
            key,
            tls: Arc::new(tls),
            store,
        });
        let (stop, stopped) = oneshot::channel();
        let worker = tokio::spawn(run(shared.clone(), rx, stopped));
        Ok((Push { queue, shared }, PushTask { stop, worker }))
    }

    /// The VAPID public key, base64url: a page's `applicationServerKey`
    /// for `pushManager.subscribe`.
    pub fn public_key(&self) -> String {
        b64(self.shared.key.public_key())
    }

    /// Subscribe `person`'s device to push, as its browser gave the
    /// subscription (`endpoint`, and `keys.p256dh` and `keys.auth` in
    /// base64url). Refused with `push_subscription_invalid` for a malformed
    /// one or an endpoint on a host push may not reach; see
    /// [`Store::push_subscribe`] for the rest.
    pub fn subscribe(
        &self,
        store: &mut Store,
        person: &str,
        endpoint: &str,
        p256dh: &str,
        auth: &str,
    ) -> Result<PushSubscription, Error> {
        let sub = NewSubscription::parse(endpoint, p256dh, auth)?;
        if !self.shared.config.hosts.allows(&sub.endpoint().host) {
            return Err(Error::PushSubscriptionInvalid {
                reason: format!(
                    "the endpoint's host {} is not one push may reach (--push-host)",
                    sub.endpoint().host
                ),
            });
        }
        store.push_subscribe(person, &sub)
    }

    /// Remove `person`'s subscription of `endpoint`; whether there was one.
    pub fn unsubscribe(
        &self,
        store: &mut Store,
        person: &str,
        endpoint: &str,
    ) -> Result<bool, Error> {
        store.push_unsubscribe(person, endpoint)
    }

    /// Card `card` waits for one of `approvers`: one message to each
    /// device they subscribed (a device two of them share, once). Reads
    /// the store once and never waits on the queue or a push service.
    pub fn notify_card_waiting(
        &self,
        store: &Store,
        card: &str,
        approvers: &[String],
    ) -> Result<Notified, Error> {
        check_card(card)?;
        let subs = store.read(|tx| tx.push_subscriptions_of(approvers))?;
        self.card_waiting(card, &subs)
    }

    /// [`Push::notify_card_waiting`] for a caller that read the
    /// subscriptions itself (inside its own transaction:
    /// `Tx::push_subscriptions_of`).
    pub fn card_waiting(&self, card: &str, subs: &[PushSubscription]) -> Result<Notified, Error> {
        check_card(card)?;
        let mut done = Notified::default();
        let mut seen = HashSet::new();
        for s in subs {
            if !seen.insert(s.endpoint.as_str()) {
                continue;
            }
            let allowed = Endpoint::parse(&s.endpoint)
                .is_ok_and(|e| self.shared.config.hosts.allows(&e.host));
            if !allowed {
                done.failed += 1;
                count(Outcome::Failed);
                log(
                    "failed",
                    card,
                    &s.person,
                    &s.origin(),
                    "host_not_allowed",
                    None,
                );
                continue;
            }
            let message = Message {
                card: card.to_owned(),
                person: s.person.clone(),
                endpoint: s.endpoint.clone(),
                p256dh: s.p256dh.clone(),
                auth: Zeroizing::new(s.auth.clone()),
            };
            match self.queue.try_send(message) {
                Ok(()) => done.queued += 1,
                Err(e) => {
                    let why = match e {
                        mpsc::error::TrySendError::Full(_) => "queue_full",
                        mpsc::error::TrySendError::Closed(_) => "stopping",
                    };
                    done.dropped += 1;
                    count(Outcome::Dropped);
                    log("dropped", card, &s.person, &s.origin(), why, None);
                }
            }
        }
        Ok(done)
    }
}

impl PushTask {
    /// Stop: take no more messages, deliver those queued and finish those
    /// under way, for at most `grace`; then cut what is left (logged).
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(());
        let mut worker = self.worker;
        if tokio::time::timeout(grace, &mut worker).await.is_err() {
            // Dropping the worker's set of deliveries aborts each.
            worker.abort();
            let _ = worker.await;
            eprintln!(
                "{}",
                serde_json::json!({"push": "stopped", "detail": "deliveries still under way were cut at the end of the grace"})
            );
        }
    }
}

/// The sender's loop: a delivery slot first, then a message, so that while
/// every slot is busy messages wait on the queue (where a full one drops)
/// and none waits here unseen.
async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Message>,
    mut stop: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(shared.config.concurrency.max(1)));
    let mut deliveries = JoinSet::new();
    let mut stopping = false;
    loop {
        while deliveries.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let message = tokio::select! {
            biased;
            _ = &mut stop, if !stopping => {
                // What is queued is still delivered; nothing more comes in.
                stopping = true;
                rx.close();
                continue;
            }
            m = rx.recv() => m,
        };
        let Some(message) = message else { break };
        deliveries.spawn(deliver(shared.clone(), message, slot));
    }
    while deliveries.join_next().await.is_some() {}
}

/// One line on standard error. `origin` is all of the endpoint a log shows.
fn log(event: &str, card: &str, person: &str, origin: &str, detail: &str, attempt: Option<u32>) {
    eprintln!(
        "{}",
        serde_json::json!({
            "push": event,
            "card": card,
            "person": person,
            "origin": origin,
            "detail": detail,
            "attempt": attempt,
        })
    );
}

/// What one try came to.
enum Answer {
    Sent,
    Gone(StatusCode),
    /// Worth another try, after at least this long if the push service
    /// said so.
    Again(String, Option<Duration>),
    Failed(String),
}

async fn deliver(shared: Arc<Shared>, m: Message, _slot: OwnedSemaphorePermit) {
    let endpoint = match Endpoint::parse(&m.endpoint) {
        Ok(e) => e,
        Err(_) => {
            count(Outcome::Failed);
            log(
                "failed",
                &m.card,
                &m.person,
                "(unreadable)",
                "endpoint_unreadable",
                None,
            );
            return;
        }
    };
    let origin = endpoint.origin();
    let body = match encrypt(payload(&m.card).as_bytes(), &m.p256dh, &m.auth) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            count(Outcome::Failed);
            log("failed", &m.card, &m.person, &origin, &e.to_string(), None);
            record(&shared, &m.endpoint, Record::Failed("encryption".into())).await;
            return;
        }
    };
    let topic = topic(&m.card);
    let attempts = shared.config.attempts.max(1);
    let mut wait = shared.config.backoff;
    for attempt in 1..=attempts {
        let answer = match tokio::time::timeout(
            shared.config.timeout,
            post(&shared, &endpoint, &origin, &body, &topic),
        )
        .await
        {
            Ok(answer) => answer,
            Err(_) => Answer::Again(
                format!("no answer within {} ms", shared.config.timeout.as_millis()),
                None,
            ),
        };
        match answer {
            Answer::Sent => {
                count(Outcome::Sent);
                log("sent", &m.card, &m.person, &origin, "", Some(attempt));
                record(&shared, &m.endpoint, Record::Delivered).await;
                return;
            }
            Answer::Gone(status) => {
                count(Outcome::Gone);
                log(
                    "gone",
                    &m.card,
                    &m.person,
                    &origin,
                    &format!("status {}: subscription removed", status.as_u16()),
                    Some(attempt),
                );
                record(&shared, &m.endpoint, Record::Gone).await;
                return;
            }
            Answer::Again(why, after) if attempt < attempts => {
                metrics::counter!("stub_push_retries_total").increment(1);
                log("retry", &m.card, &m.person, &origin, &why, Some(attempt));
                let pause = after.map_or(wait, |a| a.max(wait)).min(MAX_BACKOFF);
                tokio::time::sleep(pause).await;
                wait = wait.saturating_mul(2);
            }
            Answer::Again(why, _) | Answer::Failed(why) => {
                count(Outcome::Failed);
                log("failed", &m.card, &m.person, &origin, &why, Some(attempt));
                record(&shared, &m.endpoint, Record::Failed(why)).await;
                return;
            }
        }
    }
}

/// One try: connect, TLS, POST, read the answer's head.
async fn post(
    shared: &Shared,
    endpoint: &Endpoint,
    origin: &str,
    body: &Bytes,
    topic: &str,
) -> Answer {
    let authorization = match vapid_authorization(
        &shared.key,
        origin,
        &shared.config.contact,
        SystemTime::now(),
    ) {
        Ok(a) => a,
        Err(e) => return Answer::Failed(format!("vapid: {e}")),
    };
    let tcp = match tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await {
        Ok(t) => t,
        Err(e) => return Answer::Again(format!("connect: {e}"), None),
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(endpoint.host.clone()) else {
        return Answer::Failed("the endpoint's host is no TLS server name".into());
    };
    let tls = match tokio_rustls::TlsConnector::from(shared.tls.clone())
        .connect(name, tcp)
        .await
    {
        Ok(t) => t,
        Err(e) => return Answer::Again(format!("tls: {e}"), None),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
            Ok(pair) => pair,
            Err(e) => return Answer::Again(format!("http: {e}"), None),
        };
    let connection = AbortOnDrop(tokio::spawn(connection));
    let request = hyper::Request::post(endpoint.path.as_str())
        .header(HOST, endpoint.authority.as_str())
        .header("ttl", CARD_TTL.as_secs())
        .header("urgency", "high")
        .header("topic", topic)
        .header(CONTENT_ENCODING, "aes128gcm")
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(AUTHORIZATION, authorization)
        .body(Full::new(body.clone()));
    let request = match request {
        Ok(r) => r,
        Err(e) => return Answer::Failed(format!("request: {e}")),
    };
    let answer = match sender.send_request(request).await {
        Ok(response) => {
            let status = response.status();
            let after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            // The answer's body is never read: nothing in it is acted on.
            match status.as_u16() {
                200..=299 => Answer::Sent,
                404 | 410 => Answer::Gone(status),
                429 | 500..=599 => Answer::Again(format!("status {}", status.as_u16()), after),
                _ => Answer::Failed(format!("status {}", status.as_u16())),
            }
        }
        Err(e) => Answer::Again(format!("http: {e}"), None),
    };
    drop(connection);
    answer
}

/// A spawned connection task that ends with its owner.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a delivery writes of a subscription.
enum Record {
    Delivered,
    Failed(String),
    Gone,
}

/// Write a delivery's outcome (off the runtime's threads: the store is
/// synchronous); a store failure is logged, never retried.
async fn record(shared: &Arc<Shared>, endpoint: &str, what: Record) {
    let store = shared.store.clone();
    let endpoint = endpoint.to_owned();
    let written = tokio::task::spawn_blocking(move || {
        let mut store = store.locked();
        match what {
            Record::Delivered => store.push_delivered(&endpoint),
            Record::Failed(why) => store.push_failed(&endpoint, &why),
            Record::Gone => store.push_gone(&endpoint).map(|_| ()),
        }
    })
    .await;
    let error = match written {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    eprintln!(
        "{}",
        serde_json::json!({"push": "store_failed", "detail": error})
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64d(text: &str) -> Vec<u8> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .unwrap()
    }

    /// RFC 8291 Appendix A, exactly: the sender's fixed key and salt give
    /// the RFC's message byte for byte.
    #[test]
    fn the_rfc_8291_vector() {
        let as_private = b64d("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw");
        let as_key =
            agreement::PrivateKey::from_private_key(&agreement::ECDH_P256, &as_private).unwrap();
        assert_eq!(
            b64(as_key.compute_public_key().unwrap().as_ref()),
            "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8"
        );
        let ua_public = b64d(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        );
        let auth = b64d("BTBZMqHH6r4Tts7J_aSIgg");
        let salt: [u8; 16] = b64d("DGv6ra1nlYgDCS1FRnbzlw").try_into().unwrap();
        let body = encrypt_with(
            b"When I grow up, I want to be a watermelon",
            &ua_public,
            &auth,
            &salt,
            &as_key,
        )
        .unwrap();
        assert_eq!(
            b64(&body),
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
        );
        // The RFC's intermediate values, from the same inputs.
        let ecdh = agreement::agree(
            &as_key,
            agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, &ua_public),
            (),
            |s| Ok(s.to_vec()),
        )
        .unwrap();
        assert_eq!(b64(&ecdh), "kyrL1jIIOHEzg3sM2ZWRHDRB62YACZhhSlknJ672kSs");
        let mut info = KEY_INFO.to_vec();
        info.extend_from_slice(&ua_public);
        info.extend_from_slice(as_key.compute_public_key().unwrap().as_ref());
        let mut ikm = [0u8; 32];
        hkdf(&auth, &ecdh, &info, &mut ikm).unwrap();
        assert_eq!(b64(&ikm), "S4lYMb_L0FxCeq0WhDx813KgSYqU26kOyzWUdsXYyrg");
        let mut cek = [0u8; 16];
        hkdf(&salt, &ikm, CEK_INFO, &mut cek).unwrap();
        assert_eq!(b64(&cek), "oIhVW04MRdy2XN9CiKLxTg");
        let mut nonce = [0u8; 12];
        hkdf(&salt, &ikm, NONCE_INFO, &mut nonce).unwrap();
        assert_eq!(b64(&nonce), "4h_95klXJ5E_qnoN");
    }

    #[test]
    fn each_message_has_its_own_key_and_salt_and_opens_with_the_devices_key() {
        let ua = agreement::PrivateKey::generate(&agreement::ECDH_P256).unwrap();
        let ua_public = ua.compute_public_key().unwrap().as_ref().to_vec();
        let auth = [7u8; 16];
        let a = encrypt(b"{}", &ua_public, &auth).unwrap();
        let b = encrypt(b"{}", &ua_public, &auth).unwrap();
        assert_ne!(a[..16], b[..16], "the salt");
        assert_ne!(a[21..86], b[21..86], "the sender's key");
        assert_eq!(a.len(), 86 + 2 + 1 + 16);
        assert_eq!(a[16..20], 4096u32.to_be_bytes());
        assert_eq!(a[20], 65);
        // Opened as a device would (RFC 8291 §3.4 from the receiving side).
        let ecdh = agreement::agree(
            &ua,
            agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, &a[21..86]),
            (),
            |s| Ok(s.to_vec()),
        )
        .unwrap();
        let mut info = KEY_INFO.to_vec();
        info.extend_from_slice(&ua_public);
        info.extend_from_slice(&a[21..86]);
        let mut ikm = [0u8; 32];
        hkdf(&auth, &ecdh, &info, &mut ikm).unwrap();
        let (mut cek, mut nonce) = ([0u8; 16], [0u8; 12]);
        hkdf(&a[..16], &ikm, CEK_INFO, &mut cek).unwrap();
        hkdf(&a[..16], &ikm, NONCE_INFO, &mut nonce).unwrap();
        let key = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_128_GCM, &cek).unwrap());
        let mut record = a[86..].to_vec();
        let plain = key
            .open_in_place(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::empty(),
                &mut record,
            )
            .unwrap();
        assert_eq!(plain, b"{}\x02");
        // A message too large for one record is refused.
        assert!(encrypt(&[b'x'; 4080], &ua_public, &auth).is_err());
    }

    #[test]
    fn a_vapid_token_is_es256_over_the_origin_for_12_hours() {
        let key = VapidKey::generate().unwrap();
        let contact = Contact::parse("mailto:ops@example.org").unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let header = vapid_authorization(&key, "https://push.example:8443", &contact, now).unwrap();
        let rest = header.strip_prefix("vapid t=").unwrap();
        let (token, k) = rest.split_once(", k=").unwrap();
        assert_eq!(b64d(k), key.public_key());
        assert_eq!(key.public_key().len(), 65);
        assert_eq!(key.public_key()[0], 4);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let head: serde_json::Value = serde_json::from_slice(&b64d(parts[0])).unwrap();
        assert_eq!(head, serde_json::json!({"typ": "JWT", "alg": "ES256"}));
        let claims: serde_json::Value = serde_json::from_slice(&b64d(parts[1])).unwrap();
        assert_eq!(
            claims,
            serde_json::json!({"aud": "https://push.example:8443", "exp": 1_800_043_200u64, "sub": "mailto:ops@example.org"})
        );
        // JOSE's ES256: r || s, 64 bytes, verified under k.
        let sig = b64d(parts[2]);
        assert_eq!(sig.len(), 64);
        aws_lc_rs::signature::UnparsedPublicKey::new(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED,
            key.public_key(),
        )
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
        .unwrap();
    }

    #[test]
    fn a_message_says_a_card_waits_and_its_topic_is_the_cards() {
        assert_eq!(
            payload("gw-a-1-7f3a"),
            r#"{"type":"card_waiting","card":"gw-a-1-7f3a"}"#
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&payload(r#"a"b\c"#)).unwrap(),
            serde_json::json!({"type": "card_waiting", "card": r#"a"b\c"#})
        );
        let t = topic("gw-a-1-7f3a");
        assert_eq!(t.len(), 32);
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(t, topic("gw-a-1-7f3a"));
        assert_ne!(t, topic("gw-a-2-7f3a"));
        for bad in ["", "a b", &"x".repeat(201)] {
            assert_eq!(check_card(bad).unwrap_err().code(), "proposal_invalid");
        }
    }

    #[test]
    fn contacts_and_hosts_are_checked() {
        for ok in ["mailto:ops@example.org", "https://example.org/contact"] {
            Contact::parse(ok).unwrap();
        }
        for bad in [
            "ops@example.org",
            "mailto:",
            "mailto:ops",
            "http://example.org",
            "https://",
            "mailto:a b@c",
        ] {
            assert_eq!(
                Contact::parse(bad).unwrap_err().code(),
                "push_config_invalid",
                "{bad}"
            );
        }
        let hosts = Hosts::parse(DEFAULT_HOSTS).unwrap();
        assert!(hosts.allows("fcm.googleapis.com"));
        assert!(hosts.allows("wns2-par02p.notify.windows.com"));
        assert!(!hosts.allows("notify.windows.com"));
        assert!(!hosts.allows("evilnotify.windows.com.example"));
        assert!(!hosts.allows("fcm.googleapis.com.example"));
        assert!(!hosts.allows("169.254.169.254"));
        let local = Hosts::parse(&["127.0.0.1", "[::1]", "Push.Example"]).unwrap();
        assert!(local.allows("127.0.0.1") && local.allows("::1") && local.allows("push.example"));
        for bad in ["*.com", "*.", "", "a b", "*.127.0.0.1"] {
            assert_eq!(
                Hosts::parse(&[bad]).unwrap_err().code(),
                "push_config_invalid",
                "{bad}"
            );
        }
        assert_eq!(
            Hosts::parse::<&str>(&[]).unwrap_err().code(),
            "push_config_invalid"
        );
        // Push is off without a contact, and the other settings alone are
        // refused rather than ignored.
        assert!(PushArgs::default().config().unwrap().is_none());
        let args = PushArgs {
            hosts: vec!["127.0.0.1".into()],
            ..PushArgs::default()
        };
        assert_eq!(args.config().unwrap_err().code(), "push_config_invalid");
    }
}
