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
use crate::link::{CloseSession, DropReportView, GatewayLink, OpenSession, Opened, ReportVerifier};

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
    Close(CloseSession),
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
/// the digest and secret names it opened — a gateway that holds no
/// authority for the session refuses, as a real one would.
#[derive(Debug)]
pub struct FakeLink {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    gateways: Vec<String>,
    calls: Vec<Call>,
    failure: Option<LinkError>,
    tamper: Option<Tamper>,
    /// (session, gateway) → what that gateway holds for the session.
    live: BTreeMap<(String, String), Live>,
    serial: u64,
}

#[derive(Debug)]
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

impl FakeLink {
    /// A pair (or any number) of fake gateways with these ids.
    pub fn new(gateways: &[&str]) -> FakeLink {
        FakeLink {
            state: Mutex::new(FakeState {
                gateways: gateways.iter().map(|g| (*g).to_owned()).collect(),
                ..FakeState::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The last open call, if any.
    pub fn last_open(&self) -> Option<OpenSession> {
        self.state().calls.iter().rev().find_map(|c| match c {
            Call::Open(o) => Some(o.clone()),
            Call::Close(_) | Call::Decide { .. } => None,
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
                Call::Open(_) | Call::Close(_) => None,
            })
            .collect()
    }

    /// Fail every call with `error` from now on (`None`: answer again).
    /// A failing call changes nothing on the fake gateways.
    pub fn fail_with(&self, error: Option<LinkError>) {
        self.state().failure = error;
    }

    /// Spoil the first report of the next close.
    pub fn tamper_next_close(&self, tamper: Tamper) {
        self.state().tamper = Some(tamper);
    }

    /// Whether some fake gateway holds an authority for `session_id`.
    pub fn holds(&self, session_id: &str) -> bool {
        self.state().live.keys().any(|(s, _)| s == session_id)
    }
}

impl GatewayLink for FakeLink {
    fn open(&self, req: &OpenSession) -> Result<Vec<Opened>, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Open(req.clone()));
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        let mut secrets: Vec<String> = req.attachments.iter().map(|a| a.secret.clone()).collect();
        secrets.sort();
        secrets.dedup();
        let mut out = Vec::new();
        for gateway_id in st.gateways.clone() {
            st.serial += 1;
            let der = format!(
                "fake session CA: gateway {gateway_id}, session {}, attempt {}, serial {}",
                req.session_id, req.attempt, st.serial
            )
            .into_bytes();
            let digest = talos_certs::sha384_hex(&der);
            st.live.insert(
                (req.session_id.clone(), gateway_id.clone()),
                Live {
                    attempt: req.attempt,
                    digest: digest.clone(),
                    secrets: secrets.clone(),
                },
            );
            out.push(Opened {
                gateway_id,
                ca_cert_pem: pem(&der),
                ca_digest: digest,
            });
        }
        Ok(out)
    }

    fn decide(
        &self,
        gateway_id: &str,
        decision: &talos_certs::Signed,
    ) -> Result<String, LinkError> {
        self.take_decision(gateway_id, decision)
    }

    fn close(&self, req: &CloseSession) -> Result<Vec<DropReportView>, LinkError> {
        let mut st = self.state();
        st.calls.push(Call::Close(req.clone()));
        if let Some(e) = &st.failure {
            return Err(e.clone());
        }
        let gateways = st.gateways.clone();
        if let Some(g) = gateways.iter().find(|g| {
            !st.live
                .contains_key(&(req.session_id.clone(), (*g).clone()))
        }) {
            return Err(LinkError::Refused {
                gateway_id: g.clone(),
                reason: format!("no authority for session {}", req.session_id),
            });
        }
        let mut tamper = st.tamper.take();
        let mut out = Vec::new();
        for gateway_id in gateways {
            let Some(live) = st
                .live
                .remove(&(req.session_id.clone(), gateway_id.clone()))
            else {
                continue;
            };
            let mut report = DropReportView {
                gateway_id,
                session_id: req.session_id.clone(),
                attempt: live.attempt,
                ca_digest: live.digest,
                secrets: live.secrets,
                signed: Vec::new(),
            };
            match tamper.take() {
                None => {}
                Some(Tamper::WrongDigest) => report.ca_digest = talos_certs::sha384_hex(b"other"),
                Some(Tamper::OmitSecret(name)) => report.secrets.retain(|s| *s != name),
                Some(Tamper::WrongAttempt) => report.attempt += 1,
            }
            report.signed = format!(
                "fake drop report: gateway {} session {} attempt {} reason {} ca {} secrets {}",
                report.gateway_id,
                report.session_id,
                report.attempt,
                req.reason,
                report.ca_digest,
                report.secrets.join(",")
            )
            .into_bytes();
            out.push(report);
        }
        Ok(out)
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
        if !st.gateways.iter().any(|g| g == gateway_id) {
            return Err(LinkError::Unreachable(format!(
                "gateway {gateway_id} is not one of the pair"
            )));
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
        };
        let link = FakeLink::default();
        link.open(&open).unwrap();
        let shown = format!("{open:?} {link:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted, 19 bytes>"));
    }
}
