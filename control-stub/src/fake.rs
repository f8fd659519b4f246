//! The test doubles of the control channel, built only with the
//! `test-util` feature (and for this crate's own unit tests): [`FakeLink`],
//! a stand-in gateway pair, and [`FakeVerifier`], a drop report check that
//! accepts or refuses every report.
//!
//! The crate's tests enable the feature through their dev-dependency on
//! the crate itself; the `control-stub` binary is built without it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use base64::Engine as _;

use crate::error::LinkError;
use crate::link::{
    CloseAnswer, CloseSession, Described, DropReportView, Forwarding, GatewayLink, MemberRenewal,
    OpenSession, Opened, Renewed, Reply, ReportVerifier,
};
use talos_contract::sync::Locked;

/// A verifier for tests: accepts every report, or refuses every one.
#[derive(Clone, Copy, Debug)]
pub struct FakeVerifier {
    accept: bool,
}

impl FakeVerifier {
    /// Accepts every report without checking anything.
    pub const fn accepting() -> FakeVerifier {
        FakeVerifier { accept: true }
    }

    /// Refuses every report, as if every signature were bad.
    pub const fn refusing() -> FakeVerifier {
        FakeVerifier { accept: false }
    }
}

impl ReportVerifier for FakeVerifier {
    fn verify(&self, _report: &DropReportView, _gateway_key: Option<&str>) -> Result<(), String> {
        if self.accept {
            Ok(())
        } else {
            Err("the signature does not verify (test verifier refuses every report)".into())
        }
    }

    fn describe(&self) -> &'static str {
        if self.accept {
            "test verifier: accepts every report unchecked"
        } else {
            "test verifier: refuses every report"
        }
    }
}

/// One call [`FakeLink`] received.
#[derive(Clone, Debug)]
pub enum Call {
    Open(OpenSession),
    /// A close and the members it was sent to (`None`: every member).
    Close(CloseSession, Option<Vec<String>>),
    /// A renewal: what each member was told (leases, forwarding table).
    Renew(Vec<MemberRenewal>),
    /// A decision delivered to a gateway: its id and the signed envelope.
    Decide {
        gateway_id: String,
        decision: talos_certs::Signed,
    },
}

/// How [`FakeLink`] spoils the first report of its next close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// The report names another CA digest.
    WrongDigest,
    /// The report leaves this secret name out.
    OmitSecret(String),
    /// The report names another attempt.
    WrongAttempt,
}

/// A stand-in for a gateway pair, for tests.
///
/// Each gateway "makes" a CA per open: the certificate is made-up bytes in a
/// PEM wrapper, and its digest is the true SHA-384 of those bytes, so the
/// control stub's digest check runs for real. A close reports, per gateway,
/// the digest and secret names it opened, and the same report again for an
/// authority it already ended; a gateway that never held the attempt
/// answers "not held", as a real one does. A renewal replaces the
/// member's forwarding table with the entries it names that name a holder
/// of the pair other than the member (the ones it takes). Each member can
/// be taken down (every call to it fails unreachable), made to refuse
/// opens, restarted (a new instance: everything it held is gone, its
/// forwarding table too), or have an authority lapse.
#[derive(Debug)]
pub struct FakeLink {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    gateways: Vec<Member>,
    calls: Vec<Call>,
    failure: Option<LinkError>,
    tamper: Option<Tamper>,
    serial: u64,
}

#[derive(Debug, Default)]
struct Member {
    id: String,
    instance: String,
    down: bool,
    refuse_open: bool,
    restarts: u32,
    /// session → what this gateway holds for it.
    live: BTreeMap<String, Live>,
    /// (session, attempt) → the report of an authority it ended.
    ended: BTreeMap<(String, u32), DropReportView>,
    /// The forwarding table the last renewal that reached it gave (the
    /// entries it took).
    forwarding: Vec<Forwarding>,
}

#[derive(Debug, Clone)]
struct Live {
    attempt: u32,
    digest: String,
    secrets: Vec<String>,
}

impl Default for FakeLink {
    fn default() -> FakeLink {
        FakeLink::new(&["gw-a", "gw-b"])
    }
}

/// The fake lease every member gives.
pub const FAKE_LEASE_MS: u64 = 60_000;

impl FakeLink {
    /// A pair (or any number) of fake gateways with these ids.
    pub fn new(gateways: &[&str]) -> FakeLink {
        FakeLink {
            state: Mutex::new(FakeState {
                gateways: gateways
                    .iter()
                    .map(|g| Member {
                        id: (*g).to_owned(),
                        instance: instance_of(g, 0),
                        ..Member::default()
                    })
                    .collect(),
                ..FakeState::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.locked()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The last open call, if any.
    pub fn last_open(&self) -> Option<OpenSession> {
        self.state().calls.iter().rev().find_map(|c| match c {
            Call::Open(o) => Some(o.clone()),
            _ => None,
        })
    }

    /// Every decision delivered so far: (gateway id, signed envelope).
    pub fn decisions(&self) -> Vec<(String, talos_certs::Signed)> {
        self.state()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::Decide {
                    gateway_id,
                    decision,
                } => Some((gateway_id.clone(), decision.clone())),
                _ => None,
            })
            .collect()
    }

    /// Fail every call to every member with `error` from now on (`None`:
    /// answer again). A failing call changes nothing on the fake gateways.
    pub fn fail_with(&self, error: Option<LinkError>) {
        self.state().failure = error;
    }

    /// Take member `id` down (`true`: every call to it fails unreachable,
    /// and it changes nothing) or bring it back.
    pub fn set_down(&self, id: &str, down: bool) {
        if let Some(m) = self.state().gateways.iter_mut().find(|m| m.id == id) {
            m.down = down;
        }
    }

    /// Make member `id` refuse every open (or stop refusing).
    pub fn refuse_opens(&self, id: &str, refuse: bool) {
        if let Some(m) = self.state().gateways.iter_mut().find(|m| m.id == id) {
            m.refuse_open = refuse;
        }
    }

    /// Restart member `id`: a new instance, holding nothing. Returns the
    /// new instance id.
    pub fn restart(&self, id: &str) -> String {
        let mut st = self.state();
        let m = st
            .gateways
            .iter_mut()
            .find(|m| m.id == id)
            .expect("a member of the fake pair");
        m.restarts += 1;
        m.instance = instance_of(&m.id, m.restarts);
        m.live.clear();
        m.ended.clear();
        m.forwarding.clear();
        m.instance.clone()
    }

    /// The instance member `id` runs now.
    pub fn instance(&self, id: &str) -> String {
        self.state()
            .gateways
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.instance.clone())
            .unwrap_or_default()
    }

    /// Let member `id`'s authority for `session_id` lapse: it ends it as a
    /// real gateway does (reason `lease_expired`) and returns the report it
    /// would put in its batch chain.
    pub fn lapse(&self, id: &str, session_id: &str) -> Option<DropReportView> {
        let mut st = self.state();
        let m = st.gateways.iter_mut().find(|m| m.id == id)?;
        let live = m.live.remove(session_id)?;
        let report = fake_report(m, session_id, &live, "lease_expired");
        m.ended
            .insert((session_id.to_owned(), live.attempt), report.clone());
        Some(report)
    }

    /// Every report a member put in its batch chain so far (each authority
    /// it ended: closed, lapsed, replaced), in the order they ended, with
    /// the member: what the batch consumer would receive.
    pub fn chain_reports(&self) -> Vec<DropReportView> {
        let st = self.state();
        let mut out = Vec::new();
        for m in &st.gateways {
            out.extend(m.ended.values().cloned());
        }
        out
    }

    /// Spoil the first report of the next close.
    pub fn tamper_next_close(&self, tamper: Tamper) {
        self.state().tamper = Some(tamper);
    }

    /// Whether some fake gateway holds an authority for `session_id`.
    pub fn holds(&self, session_id: &str) -> bool {
        self.state()
            .gateways
            .iter()
            .any(|m| m.live.contains_key(session_id))
    }

    /// What the last renewal told member `id` (whether or not it reached
    /// the member), if any renewal named it.
    pub fn last_renewal(&self, id: &str) -> Option<MemberRenewal> {
        self.state().calls.iter().rev().find_map(|c| match c {
            Call::Renew(list) => list.iter().find(|r| r.gateway == id).cloned(),
            _ => None,
        })
    }

    /// The forwarding table member `id` holds: the entries it took from
    /// the last renewal that reached it (empty after a restart).
    pub fn forwarding_table(&self, id: &str) -> Vec<Forwarding> {
        self.state()
            .gateways
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.forwarding.clone())
            .unwrap_or_default()
    }

    /// Whether member `id` holds an authority for `session_id`.
    pub fn member_holds(&self, id: &str, session_id: &str) -> bool {
        self.state()
            .gateways
            .iter()
            .any(|m| m.id == id && m.live.contains_key(session_id))
    }
}

fn instance_of(id: &str, restarts: u32) -> String {
    // 16 hex digits, different per member and restart.
    let digest = talos_certs::sha384_hex(format!("{id}/{restarts}").as_bytes());
    digest[..16].to_owned()
}

fn fake_report(m: &Member, session_id: &str, live: &Live, reason: &str) -> DropReportView {
    let mut report = DropReportView {
        gateway_id: m.id.clone(),
        instance: m.instance.clone(),
        session_id: session_id.to_owned(),
        attempt: live.attempt,
        reason: reason.to_owned(),
        ca_digest: live.digest.clone(),
        secrets: live.secrets.clone(),
        signed: Vec::new(),
    };
    report.signed = signed_bytes(&report);
    report
}

fn signed_bytes(r: &DropReportView) -> Vec<u8> {
    format!(
        "fake drop report: gateway {} instance {} session {} attempt {} reason {} ca {} secrets {}",
        r.gateway_id,
        r.instance,
        r.session_id,
        r.attempt,
        r.reason,
        r.ca_digest,
        r.secrets.join(",")
    )
    .into_bytes()
}

fn unreachable(id: &str) -> LinkError {
    LinkError::Unreachable(format!("{id}: the fake gateway is down"))
}

impl GatewayLink for FakeLink {
    fn describe(&self) -> Vec<Reply<Described>> {
        let st = self.state();
        st.gateways
            .iter()
            .map(|m| Reply {
                member: m.id.clone(),
                result: match (&st.failure, m.down) {
                    (Some(e), _) => Err(e.clone()),
                    (None, true) => Err(unreachable(&m.id)),
                    (None, false) => Ok(Described {
                        gateway_id: m.id.clone(),
                        // A made-up key, the same for a member every time:
                        // FakeVerifier checks no signature.
                        public_key_hex: talos_certs::sha384_hex(m.id.as_bytes())[..64].to_owned(),
                        instance: m.instance.clone(),
                        lease_ms: FAKE_LEASE_MS,
                        key_binding: Vec::new(),
                    }),
                },
            })
            .collect()
    }

    fn open(&self, req: &OpenSession) -> Vec<Reply<Opened>> {
        let mut st = self.state();
        st.calls.push(Call::Open(req.clone()));
        let failure = st.failure.clone();
        let mut secrets: Vec<String> = req.attachments.iter().map(|a| a.secret.clone()).collect();
        secrets.sort();
        secrets.dedup();
        let mut out = Vec::new();
        let mut serial = st.serial;
        for m in st.gateways.iter_mut() {
            let result = if let Some(e) = &failure {
                Err(e.clone())
            } else if m.down {
                Err(unreachable(&m.id))
            } else if m.refuse_open {
                Err(LinkError::Refused {
                    gateway_id: m.id.clone(),
                    reason: "the fake gateway refuses every open".into(),
                })
            } else if m.ended.contains_key(&(req.session_id.clone(), req.attempt)) {
                Err(LinkError::Refused {
                    gateway_id: m.id.clone(),
                    reason: format!("attempt: attempt {} was ended here", req.attempt),
                })
            } else {
                serial += 1;
                let der = format!(
                    "fake session CA: gateway {}, session {}, attempt {}, serial {serial}",
                    m.id, req.session_id, req.attempt
                )
                .into_bytes();
                let digest = talos_certs::sha384_hex(&der);
                // A newer open replaces what the member held for the session.
                if let Some(old) = m.live.remove(&req.session_id) {
                    let report = fake_report(m, &req.session_id, &old, "replaced");
                    m.ended
                        .insert((req.session_id.clone(), old.attempt), report);
                }
                m.live.insert(
                    req.session_id.clone(),
                    Live {
                        attempt: req.attempt,
                        digest: digest.clone(),
                        secrets: secrets.clone(),
                    },
                );
                Ok(Opened {
                    gateway_id: m.id.clone(),
                    ca_cert_pem: pem(&der),
                    ca_digest: digest,
                    instance: m.instance.clone(),
                    lease_ms: FAKE_LEASE_MS,
                })
            };
            out.push(Reply {
                member: m.id.clone(),
                result,
            });
        }
        st.serial = serial;
        out
    }

    fn close(&self, req: &CloseSession, only: Option<&[String]>) -> Vec<Reply<CloseAnswer>> {
        let mut st = self.state();
        st.calls
            .push(Call::Close(req.clone(), only.map(<[String]>::to_vec)));
        let failure = st.failure.clone();
        let mut tamper = st.tamper.take();
        let mut out = Vec::new();
        for m in st.gateways.iter_mut() {
            if only.is_some_and(|o| !o.contains(&m.id)) {
                continue;
            }
            let result = if let Some(e) = &failure {
                Err(e.clone())
            } else if m.down {
                Err(unreachable(&m.id))
            } else if let Some(done) = m.ended.get(&(req.session_id.clone(), req.attempt)) {
                Ok(CloseAnswer::Report(done.clone()))
            } else {
                match m.live.get(&req.session_id) {
                    Some(live) if live.attempt == req.attempt => {
                        let live = m.live.remove(&req.session_id).expect("present");
                        let mut report =
                            fake_report(m, &req.session_id, &live, req.reason.as_str());
                        match tamper.take() {
                            None => {}
                            Some(Tamper::WrongDigest) => {
                                report.ca_digest = talos_certs::sha384_hex(b"other")
                            }
                            Some(Tamper::OmitSecret(name)) => report.secrets.retain(|s| *s != name),
                            Some(Tamper::WrongAttempt) => report.attempt += 1,
                        }
                        report.signed = signed_bytes(&report);
                        // Asked again, a gateway answers the report it
                        // signed: the same one.
                        m.ended
                            .insert((req.session_id.clone(), live.attempt), report.clone());
                        Ok(CloseAnswer::Report(report))
                    }
                    Some(live) => Err(LinkError::Refused {
                        gateway_id: m.id.clone(),
                        reason: format!("attempt: the session's open attempt is {}", live.attempt),
                    }),
                    None => Ok(CloseAnswer::NotHeld {
                        instance: Some(m.instance.clone()),
                        message: format!(
                            "session_id: no session with this id is open (instance {})",
                            m.instance
                        ),
                    }),
                }
            };
            out.push(Reply {
                member: m.id.clone(),
                result,
            });
        }
        out
    }

    fn renew(&self, renewals: &[MemberRenewal]) -> Vec<Reply<Renewed>> {
        let mut st = self.state();
        st.calls.push(Call::Renew(renewals.to_vec()));
        let failure = st.failure.clone();
        let ids: Vec<String> = st.gateways.iter().map(|m| m.id.clone()).collect();
        let mut out = Vec::new();
        for r in renewals {
            let Some(m) = st.gateways.iter_mut().find(|m| m.id == r.gateway) else {
                continue;
            };
            let result = if let Some(e) = &failure {
                Err(e.clone())
            } else if m.down {
                Err(unreachable(&m.id))
            } else {
                let (renewed, not_held) = r
                    .leases
                    .iter()
                    .cloned()
                    .partition(|(s, a)| m.live.get(s).is_some_and(|l| l.attempt == *a));
                // As a member does: an entry naming no peer it knows is
                // not taken.
                m.forwarding = r
                    .forwarding
                    .iter()
                    .filter(|f| f.holders.iter().any(|h| *h != m.id && ids.contains(h)))
                    .cloned()
                    .collect();
                Ok(Renewed {
                    renewed,
                    not_held,
                    instance: m.instance.clone(),
                    lease_ms: FAKE_LEASE_MS,
                    forwarding_taken: u32::try_from(m.forwarding.len()).unwrap_or(u32::MAX),
                })
            };
            out.push(Reply {
                member: r.gateway.clone(),
                result,
            });
        }
        out
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        self.take_decision(gateway_id, decision)
    }
}

impl FakeLink {
    /// A fake gateway takes a decision when it is one of the pair: it
    /// answers `released` for an approval and `refused` for a decline,
    /// reading the payload without checking the signature (the tests check
    /// it under the relay key).
    fn take_decision(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Decide {
            gateway_id: gateway_id.to_owned(),
            decision: decision.clone(),
        });
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        match st.gateways.iter().find(|m| m.id == gateway_id) {
            None => {
                return Err(LinkError::Unreachable(format!(
                    "gateway {gateway_id} is not one of the pair"
                )))
            }
            Some(m) if m.down => return Err(unreachable(gateway_id)),
            Some(_) => {}
        }
        let parsed: talos_certs::Decision =
            serde_json::from_slice(&decision.payload).map_err(|e| LinkError::Refused {
                gateway_id: gateway_id.to_owned(),
                reason: format!("the decision does not parse: {e}"),
            })?;
        Ok(match parsed.decision {
            talos_certs::Verdict::Approved => "released".into(),
            talos_certs::Verdict::Declined => "refused".into(),
        })
    }
}

/// `der` as a PEM certificate (64-character base64 lines).
fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use zeroize::Zeroizing;

    use super::*;
    use crate::link::Attachment;
    use crate::model::OpenCause;

    #[test]
    fn attachment_debug_hides_the_value() {
        let a = Attachment {
            secret: "K".into(),
            destination: "a.example".into(),
            header: "x-key".into(),
            scheme: None,
            value: Zeroizing::new(b"hunter2-distinctive".to_vec()),
        };
        let open = OpenSession {
            session_id: "s".into(),
            attempt: 1,
            tenant: "t".into(),
            sources: vec![],
            allowlist: vec![],
            attachments: vec![a],
            cause: OpenCause::Launch,
            lock: vec![],
            relay_public_key: None,
            passthrough: vec![],
            people: Default::default(),
        };
        let link = FakeLink::default();
        assert!(link.open(&open).iter().all(|r| r.result.is_ok()));
        let shown = format!("{open:?} {link:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted, 19 bytes>"));
    }
}
