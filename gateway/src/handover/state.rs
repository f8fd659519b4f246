//! What a gateway process hands its successor: every live authority, the
//! reports of the authorities it ended, the member link's forwarding
//! table, and how its listeners are set.
//!
//! The [`Offer`] is one JSON message with nothing secret in it: names,
//! certificates, Lock rules, lease deadlines, signed reports. The secrets
//! follow it as frames of their own, in the order [`Offer::secrets`] says:
//! for each session, each intermediate's key (PKCS#8), then each attached
//! value. They are read into wiped buffers ([`super::wire::read_secret`])
//! and go into the successor's CA and attachments without another copy
//! that outlives them.

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use talos_certs::{CaHandover, LeafCache, SessionCa, Signed};
use zeroize::Zeroizing;

use crate::pair::forwarding::{Forwarding, Given, Standing};
use crate::process::HandoverResult;
use crate::secrets::secret::{AttachSpec, Attachment, SecretBytes};
use crate::session::approvals::LockRule;
use crate::session::lease::{Clock, Lease, Millis};
use crate::session::sessions::{Session, SessionSpec};

/// The version of what is handed over; a successor that reads another
/// refuses the handover, and the running process goes on.
pub const VERSION: u32 = 1;

/// The running process's offer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Offer {
    pub version: u32,
    pub gateway_id: String,
    /// The process's instance: the successor goes on as the same one.
    pub instance: String,
    /// The successor's generation: its connections are numbered from
    /// `generation << 40`, its journal is its own.
    pub generation: u64,
    /// The running process's own generation: its journal is the one the
    /// successor reads once it has exited.
    pub from_generation: u64,
    /// The signing key's id: the successor must sign with the same key,
    /// so the batch chain goes on under one signer.
    pub key_id: Option<String>,
    /// How the running process's listeners are configured, in the order
    /// of the descriptors that follow.
    pub listeners: Vec<ListenerState>,
    /// The running config's fields that only a restart changes, with
    /// their values: the successor's config must have the same.
    pub restart_only: Vec<(String, String)>,
    /// The sessions from the running config's file, as it defined them:
    /// the successor keeps those its own config defines the same.
    pub statics: Vec<(String, crate::reload::StaticEntry)>,
    /// Every live authority.
    pub sessions: Vec<SessionState>,
    /// Authorities ended recently, with their reports (a repeated close
    /// gets the same report; an ended attempt never reopens).
    pub ended: Vec<EndedState>,
    /// How many secret frames follow.
    pub secrets: usize,
    /// The handovers counted so far by the processes this one goes on
    /// from: the successor counts on from them. (An older running process
    /// sends none: the successor counts from zero.)
    #[serde(default)]
    pub handovers: Handovers,
    /// The member link's forwarding table (`[pair]`): every entry standing,
    /// so the successor forwards from its first connection and its first
    /// DNS query what this process forwarded. `None` from an older running
    /// process, which sends none: the successor then asks its peers before
    /// it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<Vec<ForwardingState>>,
}

/// One entry of the forwarding table, as it stands at the handover.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardingState {
    /// The peer whose own word it is; none: the control plane's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub session_id: String,
    pub attempt: u32,
    pub tenant: String,
    pub sources: Vec<String>,
    pub holders: Vec<String>,
    /// When it lapses unless given again, on `CLOCK_BOOTTIME` (which both
    /// processes read the same on one machine), in milliseconds: the
    /// successor forwards on it no longer than this process would have.
    pub until: Millis,
}

impl ForwardingState {
    /// Every entry of `table` standing now, each with its end on `clock`.
    pub fn export(table: &Forwarding, clock: &dyn Clock) -> Vec<ForwardingState> {
        let now = clock.now();
        table
            .standing(std::time::Instant::now())
            .into_iter()
            .map(|s| ForwardingState {
                from: s.from.map(|f| f.to_string()),
                session_id: s.given.session_id,
                attempt: s.given.attempt,
                tenant: s.given.tenant,
                sources: s.given.sources,
                holders: s.given.holders,
                until: now.saturating_add(u64::try_from(s.left.as_millis()).unwrap_or(u64::MAX)),
            })
            .collect()
    }

    /// Put `entries` in `table`, each standing until its end on `clock`
    /// (an end already past: not taken). Returns how many were taken.
    pub fn import(entries: &[ForwardingState], table: &Forwarding, clock: &dyn Clock) -> usize {
        let now = clock.now();
        let standing: Vec<Standing> = entries
            .iter()
            .filter(|e| e.until > now)
            .map(|e| Standing {
                from: e.from.as_deref().map(Arc::from),
                given: Given {
                    session_id: e.session_id.clone(),
                    attempt: e.attempt,
                    tenant: e.tenant.clone(),
                    sources: e.sources.clone(),
                    holders: e.holders.clone(),
                },
                left: std::time::Duration::from_millis(e.until - now),
            })
            .collect();
        table.take_over(&standing, std::time::Instant::now())
    }
}

/// `gateway_handover_total` by result, carried from process to process:
/// each successor counts the handover that made it (`ok`), a running
/// process the ones that failed and left it serving (`failed`). Carried,
/// the counter rises by one at every handover as an operator scrapes it,
/// instead of starting again at 1 in every new process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handovers {
    pub ok: u64,
    pub failed: u64,
}

impl Handovers {
    /// The counts of a successor that took over from a process that had
    /// these: one more `ok`.
    pub fn taken_over(self) -> Handovers {
        Handovers {
            ok: self.ok + 1,
            ..self
        }
    }

    /// Set `gateway_handover_total{result}` to these counts.
    pub fn publish(self) {
        for (result, count) in [
            (HandoverResult::Ok, self.ok),
            (HandoverResult::Failed, self.failed),
        ] {
            metrics::counter!("gateway_handover_total", "result" => result.as_str())
                .absolute(count);
        }
    }
}

/// One listener handed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerState {
    /// `data`, `admin`, `control`, `pair`, `dns_udp`, `dns_tcp` or
    /// `process`, in the order the sockets are sent.
    pub role: String,
    /// The address (or path) the config names, as written there.
    pub configured: String,
}

/// One live authority, secrets aside.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionState {
    pub id: String,
    pub tenant: String,
    pub attempt: u32,
    pub sources: Vec<IpAddr>,
    pub allowlist: Vec<String>,
    /// The allowlist's passthrough names. Absent from an older process's
    /// state: none then.
    #[serde(default)]
    pub passthrough: Vec<String>,
    pub ca: CaState,
    /// Each attachment as `SECRET=destination:header[:scheme]`; its value
    /// is a secret frame.
    pub attachments: Vec<String>,
    pub lock: Vec<RuleState>,
    /// The relay's public key, base64.
    pub relay_key: Option<String>,
    /// The lease's end on `CLOCK_BOOTTIME` (which both processes read the
    /// same on one machine), in milliseconds; none for a session from the
    /// config file.
    pub lease_until: Option<Millis>,
    /// Rules whose first use was approved under this authority.
    pub first_uses: Vec<String>,
    /// The approvers' passkeys (their sign counts as this process saw
    /// them), rp id, origin and lab setting. Absent from an older
    /// process's state: none, and not lab.
    #[serde(default)]
    pub people: crate::session::person::People,
}

/// A session CA's public part; its intermediates' keys are secret frames.
#[derive(Debug, Serialize, Deserialize)]
pub struct CaState {
    pub root_name: String,
    pub names: Vec<String>,
    pub not_before: i64,
    pub not_after: i64,
    /// Base64 DER.
    pub root: String,
    /// Base64 DER, one per level.
    pub intermediates: Vec<String>,
}

/// A Lock rule as its draft reads.
#[derive(Debug, Serialize, Deserialize)]
pub struct RuleState {
    pub id: String,
    pub destination: String,
    pub attachment: String,
    pub method: String,
    pub path_prefix: String,
    pub mode: String,
    pub approvers: Vec<String>,
}

/// An authority ended, and its signed report.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndedState {
    pub session_id: String,
    pub attempt: u32,
    pub report: Signed,
}

/// Why what was handed over cannot be taken up.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("session {session}: {reason}")]
    Session { session: String, reason: String },
    #[error("the secrets that came do not match the offer")]
    Secrets,
}

/// Secret frames, each in a buffer wiped on drop.
pub type Secrets = Vec<Zeroizing<Vec<u8>>>;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl SessionState {
    /// The state of `session` (held under `sources`), and its secrets in
    /// the order they go: intermediate keys, then attached values.
    pub fn export(
        session: &Session,
        sources: Vec<IpAddr>,
    ) -> Result<(SessionState, Secrets), talos_certs::CertError> {
        let exported = session.leaves.ca().export_for_handover()?;
        let mut secrets = Vec::new();
        let mut intermediates = Vec::new();
        for (der, key) in exported.intermediates {
            intermediates.push(b64().encode(der));
            secrets.push(key);
        }
        let mut attachments = Vec::new();
        for a in &session.attachments {
            attachments.push(a.spec.to_string());
            secrets.push(Zeroizing::new(a.value.expose().to_vec()));
        }
        let state = SessionState {
            id: session.id.to_string(),
            tenant: session.tenant.to_string(),
            attempt: session.attempt,
            sources,
            allowlist: {
                let mut names: Vec<String> = session
                    .allowlist
                    .iter()
                    .map(|n| n.as_str().to_owned())
                    .collect();
                names.sort();
                names
            },
            passthrough: {
                let mut names: Vec<String> = session
                    .passthrough
                    .iter()
                    .map(|n| n.as_str().to_owned())
                    .collect();
                names.sort();
                names
            },
            ca: CaState {
                root_name: exported.root_name,
                names: exported.names,
                not_before: exported.not_before,
                not_after: exported.not_after,
                root: b64().encode(exported.root_der),
                intermediates,
            },
            attachments,
            lock: session
                .approvals
                .rules()
                .iter()
                .map(RuleState::from_rule)
                .collect(),
            relay_key: session.approvals.relay_key().map(|k| b64().encode(k)),
            lease_until: session.lease.until(),
            first_uses: session.approvals.first_uses(),
            people: session.approvals.people().clone(),
        };
        Ok((state, secrets))
    }

    /// How many secret frames follow this session's state.
    pub fn secret_count(&self) -> usize {
        self.ca.intermediates.len() + self.attachments.len()
    }

    /// The session again, from its state and its secrets (in the order
    /// [`SessionState::export`] gave them); `lease` is made from
    /// [`lease_until`](SessionState::lease_until) by the caller.
    pub fn import(
        self,
        secrets: &mut impl Iterator<Item = Zeroizing<Vec<u8>>>,
        upstream: &crate::session::sessions::UpstreamSettings,
        proposer: Option<&crate::session::approvals::Proposer>,
        lease: Lease,
    ) -> Result<(Session, Vec<IpAddr>), StateError> {
        let id = self.id.clone();
        let bad = |reason: String| StateError::Session {
            session: id.clone(),
            reason,
        };
        let der = |text: &str| {
            b64()
                .decode(text)
                .map_err(|_| bad("a certificate is not base64".into()))
        };
        let mut intermediates = Vec::new();
        for text in &self.ca.intermediates {
            let key = secrets.next().ok_or(StateError::Secrets)?;
            intermediates.push((der(text)?, key));
        }
        let ca = SessionCa::import_handover(CaHandover {
            session_id: self.id.clone(),
            attempt: self.attempt,
            root_name: self.ca.root_name,
            names: self.ca.names,
            not_before: self.ca.not_before,
            not_after: self.ca.not_after,
            root_der: der(&self.ca.root)?,
            intermediates,
        })
        .map_err(|e| bad(e.to_string()))?;
        let mut attachments = Vec::new();
        for text in &self.attachments {
            let mut value = secrets.next().ok_or(StateError::Secrets)?;
            let spec = AttachSpec::parse(text).map_err(|e| bad(e.to_string()))?;
            // Moved, not copied, into the value's own wiped allocation.
            let value = SecretBytes::new(std::mem::take(&mut *value));
            attachments.push(Attachment::new(&spec, value).map_err(|e| bad(e.to_string()))?);
        }
        let mut lock = Vec::new();
        for r in &self.lock {
            lock.push(
                r.to_rule()
                    .map_err(|e| bad(format!("Lock rule {}: {e}", r.id)))?,
            );
        }
        let relay_key = match &self.relay_key {
            Some(key) => Some(
                b64()
                    .decode(key)
                    .ok()
                    .and_then(|k| <[u8; 32]>::try_from(k).ok())
                    .ok_or_else(|| bad("the relay key is not 32 bytes of base64".into()))?,
            ),
            None => None,
        };
        let mut allowlist = Vec::new();
        for n in &self.allowlist {
            allowlist.push(
                crate::gate::name::canonicalize(n)
                    .map_err(|e| bad(format!("allowlist name {n:?}: {e}")))?,
            );
        }
        let mut passthrough = Vec::new();
        for n in &self.passthrough {
            passthrough.push(
                crate::gate::name::canonicalize(n)
                    .map_err(|e| bad(format!("passthrough name {n:?}: {e}")))?,
            );
        }
        let spec = SessionSpec {
            id: self.id.clone(),
            tenant: self.tenant,
            attempt: self.attempt,
            allowlist,
            attachments,
            lock,
            relay_key,
            passthrough,
            people: self.people,
        };
        let session = Session::with_ca(
            spec,
            Arc::new(LeafCache::new(ca)),
            upstream,
            proposer,
            lease,
        )
        .map_err(|e| bad(e.to_string()))?;
        for rule in &self.first_uses {
            session.approvals.mark_first_use(rule);
        }
        Ok((session, self.sources))
    }
}

impl RuleState {
    fn from_rule(r: &LockRule) -> RuleState {
        RuleState {
            id: r.id.clone(),
            destination: r.destination.as_ref().map_or_else(
                || talos_contract::lock::ANY_DESTINATION.to_owned(),
                |n| n.as_str().to_owned(),
            ),
            attachment: r.attachment.clone().unwrap_or_default(),
            method: r.method.clone().unwrap_or_default(),
            path_prefix: r.path_prefix.clone().unwrap_or_default(),
            mode: r.mode.as_str().to_owned(),
            approvers: r.approvers.clone(),
        }
    }

    fn to_rule(&self) -> Result<LockRule, talos_contract::lock::RuleError> {
        LockRule::check(&talos_contract::lock::RuleDraft {
            id: &self.id,
            destination: &self.destination,
            attachment: &self.attachment,
            method: &self.method,
            path_prefix: &self.path_prefix,
            mode: &self.mode,
            approvers: &self.approvers,
        })
    }
}
