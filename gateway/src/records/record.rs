//! One record per connection, allowed or refused.
//!
//! A record holds what an auditor needs to see what the session reached and
//! what was refused — and nothing that could carry a secret: no body, no
//! header value, no query string. The journal ([`crate::records::journal`])
//! writes them, as JSON lines for operators and, when the gateway ships
//! signed batches to a control plane, to disk for the sealer.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use crate::refusal::{Refusal, Refused};
use serde::Serialize;

/// The outcome of a connection: allowed, or the refusal reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Refused(Refusal),
    /// Only in the record of a connection cut by a crash before the gate
    /// judged it ([`crate::records::journal`]).
    Undecided,
}

impl Verdict {
    /// Every verdict: `allowed`, each refusal reason, `undecided` (the
    /// `verdict` label values of `gateway_connections_total`).
    pub fn every() -> impl Iterator<Item = Verdict> {
        std::iter::once(Verdict::Allowed)
            .chain(Refusal::ALL.into_iter().map(Verdict::Refused))
            .chain(std::iter::once(Verdict::Undecided))
    }

    /// `allowed` or the refusal's stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Refused(r) => r.as_str(),
            Verdict::Undecided => "undecided",
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One connection's record.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// The gateway that served the connection.
    pub gateway_id: Arc<str>,
    /// The gateway process that served it, and the connection's number
    /// there: together they name the connection, so a record sealed twice
    /// after a crash is recognised.
    pub instance: Arc<str>,
    pub conn: u64,
    /// The session, when the source address named one.
    pub session_id: Option<Arc<str>>,
    pub attempt: Option<u32>,
    pub tenant: Option<Arc<str>>,
    /// The connection's source (the session's address).
    pub source: SocketAddr,
    /// The server name from the hello, canonical when it was a valid name,
    /// as sent otherwise (bounded; never includes bytes after the hello).
    pub sni: Option<String>,
    /// ALPN protocols the session offered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alpn_offered: Vec<String>,
    /// The checked address of the (first) destination connection used.
    pub resolved: Option<SocketAddr>,
    /// TLS toward the session: version and negotiated ALPN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_version: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpn_session: Option<&'static str>,
    /// The protocol the destination chose (ALPN).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alpn_upstream: Option<&'static str>,
    /// Requests the connection carried, refused ones included.
    pub request_count: u64,
    /// The first requests, in order (bounded; see `requests_unlisted`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RequestRecord>,
    /// Requests past the listed ones.
    #[serde(skip_serializing_if = "is_zero")]
    pub requests_unlisted: u64,
    /// Names of the attachments injected into the connection's requests.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attachments_used: Vec<String>,
    /// Masked occurrences per secret name, in replies.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub masked: std::collections::BTreeMap<String, u64>,
    /// Replies the gateway cut in their body, per cause (a reply decoded
    /// past its bound, a compressed gRPC message, …).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub replies_cut: std::collections::BTreeMap<&'static str, u64>,
    /// For `resolves_internal`: the internal answer that caused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_answer: Option<IpAddr>,
    /// `allowed` or a refusal reason.
    pub verdict: Verdict,
    /// A short, fixed cause inside the verdict, for people (`hello_timeout`,
    /// `nxdomain`, `internal:loopback`, `connect_refused`…). Never a value
    /// from the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// The connection was still open, both ways, when this member cut it
    /// on its own account, as `cause` says: the drain's grace ran out
    /// (`cut_at_grace`), or the process died with it (`cut_by_crash`,
    /// written at the next start). Whatever the connection carried — a
    /// terminated one's requests (each in flight marked `cut` too), a
    /// passthrough or forwarded one's bytes — may have stopped short.
    /// Omitted when false.
    #[serde(skip_serializing_if = "is_false")]
    pub cut: bool,
    /// RFC 3339, UTC, milliseconds.
    pub opened_at: String,
    pub closed_at: String,
    /// Bytes read from the session (hello included) and written to it.
    pub bytes_from_session: u64,
    pub bytes_to_session: u64,
    /// The member that forwarded the connection over the member link (the
    /// holder's record of it); `source` is the session's own address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<Arc<str>>,
    /// The member this one handed the connection to, untouched (the
    /// forwarder's record: no request lines, it saw none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded_to: Option<Arc<str>>,
    /// The destination is passthrough: the connection was checked before
    /// the handshake, then its bytes were passed on to `resolved` as they
    /// were, never decrypted; the record has no TLS, ALPN or request
    /// fields of the gateway's own (it saw none). Omitted when false.
    #[serde(skip_serializing_if = "is_false")]
    pub passthrough: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Record {
    /// A record for connection `conn` of process `instance`, just arrived
    /// from `source`.
    pub fn open(gateway_id: Arc<str>, instance: Arc<str>, conn: u64, source: SocketAddr) -> Record {
        Record {
            gateway_id,
            instance,
            conn,
            session_id: None,
            attempt: None,
            tenant: None,
            source,
            sni: None,
            alpn_offered: Vec::new(),
            resolved: None,
            tls_version: None,
            alpn_session: None,
            alpn_upstream: None,
            request_count: 0,
            requests: Vec::new(),
            requests_unlisted: 0,
            attachments_used: Vec::new(),
            masked: Default::default(),
            replies_cut: Default::default(),
            internal_answer: None,
            verdict: Verdict::Allowed,
            cause: None,
            cut: false,
            opened_at: now(),
            closed_at: String::new(),
            bytes_from_session: 0,
            bytes_to_session: 0,
            via: None,
            forwarded_to: None,
            passthrough: false,
        }
    }

    /// Mark the record refused with `reason` and a fixed cause.
    pub fn refuse(&mut self, refused: Refused) {
        self.verdict = Verdict::Refused(refused.reason);
        self.cause = Some(refused.cause);
    }

    /// Take in what the connection's requests and replies learned: once,
    /// when they are all done.
    pub fn absorb(&mut self, tally: Tally) {
        let Tally {
            request_count,
            requests,
            requests_unlisted,
            upstream_alpn,
            upstream_addr,
            attachments_used,
            masked,
            replies_cut,
        } = tally;
        self.request_count = request_count;
        self.requests = requests;
        self.requests_unlisted = requests_unlisted;
        self.alpn_upstream = upstream_alpn;
        self.resolved = upstream_addr;
        self.attachments_used = attachments_used;
        self.masked = masked;
        self.replies_cut = replies_cut;
    }
}

/// Per-request entries kept in one connection's record. A connection may
/// carry any number of requests; past this many, only the count grows.
pub const MAX_REQUEST_RECORDS: usize = 256;

/// What a connection's record learns from its requests and replies, while
/// they run; [`Record::absorb`] takes it whole when they are done.
#[derive(Debug, Default)]
pub struct Tally {
    pub request_count: u64,
    /// The first [`MAX_REQUEST_RECORDS`] requests, in order.
    pub requests: Vec<RequestRecord>,
    /// Requests past [`MAX_REQUEST_RECORDS`], counted but not listed.
    pub requests_unlisted: u64,
    /// The protocol and checked address of the first destination
    /// connection used.
    pub upstream_alpn: Option<&'static str>,
    pub upstream_addr: Option<SocketAddr>,
    /// Names of the attachments injected into the connection's requests.
    pub attachments_used: Vec<String>,
    /// Masked occurrences per secret name, over all replies.
    pub masked: std::collections::BTreeMap<String, u64>,
    /// Replies cut in their body, per cause.
    pub replies_cut: std::collections::BTreeMap<&'static str, u64>,
}

impl Tally {
    /// One request, answered; where its entry is listed (none past
    /// [`MAX_REQUEST_RECORDS`]).
    pub fn request(&mut self, entry: RequestRecord) -> Option<usize> {
        self.request_count += 1;
        if self.requests.len() < MAX_REQUEST_RECORDS {
            self.requests.push(entry);
            Some(self.requests.len() - 1)
        } else {
            self.requests_unlisted += 1;
            None
        }
    }

    /// The reply of the request listed at `entry` did not reach the
    /// session whole: its connection was cut under its body (the drain's
    /// grace, the end of the authority) or the client went away.
    pub fn reply_unfinished(&mut self, entry: usize) {
        if let Some(e) = self.requests.get_mut(entry) {
            e.cut = true;
        }
    }

    /// A destination connection used; the first one is recorded.
    pub fn upstream(&mut self, alpn: &'static str, addr: SocketAddr) {
        self.upstream_alpn.get_or_insert(alpn);
        self.upstream_addr.get_or_insert(addr);
    }

    /// Attachments injected into a request.
    pub fn attachments<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            if !self.attachments_used.iter().any(|n| n == name) {
                self.attachments_used.push(name.to_owned());
            }
        }
    }

    /// A reply cut in its body.
    pub fn reply_cut(&mut self, cause: &'static str) {
        *self.replies_cut.entry(cause).or_default() += 1;
    }

    /// Occurrences a reply masked, per secret name.
    pub fn masked<'a>(&mut self, counts: impl Iterator<Item = (&'a str, u64)>) {
        for (name, n) in counts {
            if n > 0 {
                *self.masked.entry(name.to_owned()).or_default() += n;
            }
        }
    }
}

/// One request inside a connection's record: never a header value, a query
/// string or a body.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    pub method: String,
    /// The path without its query, cut to [`MAX_PATH_LEN`] bytes.
    pub path: String,
    /// The status the session got.
    pub status: u16,
    /// The refusal reason, when the gateway refused the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    /// When a Lock rule held the request: the proposal, its digest, the
    /// decision, the approver and the times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::session::approvals::ApprovalRecord>,
    /// The request was cut before its answer was whole (its connection
    /// ended under it: the session's authority ended, the drain's grace
    /// ran out, the client went away). It may have reached the
    /// destination. `status` is 0 when it was cut before its answer's
    /// head was written, the status sent when it was cut in the reply's
    /// body (a download still streaming at the drain's grace).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

/// The longest path kept in a request record.
pub const MAX_PATH_LEN: usize = 256;

impl RequestRecord {
    /// A record for a request with this method and path (query excluded by
    /// the caller: `uri.path()` has none).
    pub fn new(method: &hyper::Method, path: &str) -> RequestRecord {
        RequestRecord {
            method: method.as_str().chars().take(32).collect(),
            path: cut_path(path).to_owned(),
            status: 0,
            refusal: None,
            approval: None,
            cut: false,
        }
    }

    /// The path as the Lock judged it (canonical), in place of the path as
    /// sent.
    pub fn judged_path(&mut self, path: &str) {
        self.path.clear();
        self.path.push_str(cut_path(path));
    }
}

/// `path` cut to [`MAX_PATH_LEN`] bytes, at a character boundary.
fn cut_path(path: &str) -> &str {
    let mut end = path.len().min(MAX_PATH_LEN);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The current time, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
