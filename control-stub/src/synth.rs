//! A synthetic session with a real signed record, for the certificate
//! bundle's tests and benchmark (only with the `test-util` feature): the
//! control channel's identities made by `init`, a two-member pair of
//! stand-ins ([`FakeLink`]) for the opens and closes, and each member's
//! batches of connection records and its drop report signed with a real
//! key of its own, bound under the control CA, and delivered through the
//! batch consumer as a member delivers them. The certificate is issued
//! with the control plane's key, so everything a bundle carries verifies.
//!
//! The records have the gateway's shape (docs/records.md): most allowed
//! with two request lines, the credential attached and an echo of it
//! masked; one in 50 refused `not_on_allowlist`; one in 97 with a request
//! refused `host_mismatch`; one DNS line per member. With `decision`, a
//! Lock rule holds one request of `gw-a`, and alice approves its card
//! with her passkey through the relay: her WebAuthn assertion over the
//! card's digest and the verdict (as a browser's `navigator.credentials.get`
//! gives it: authenticator data for the rp id [`RP_ID`] with UP and UV,
//! client data of type `webauthn.get` from [`ORIGIN`]) inside the decision
//! the relay signs. alice is an approver holding one passkey (an ES256 key
//! made here and kept by the [`Pair`]; a rule names only people who hold
//! one), and the account's web app is at [`RP_ID`] and [`ORIGIN`], which
//! each open carries with her key.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use crate::error::Error;
use crate::fake::{FakeLink, FakeVerifier};
use crate::lifecycle::{Lifecycle, StartRequest};
use crate::lock::NewRule;
use crate::model::{LockMode, Mode};
use crate::store::Store;

/// The members of the synthetic pair.
pub const MEMBERS: [&str; 2] = ["gw-a", "gw-b"];
/// The destination and the attached secret's name.
pub const DESTINATION: &str = "api.example.com";
pub const SECRET_NAME: &str = "API_TOKEN";
/// The people's web app's relying party: its rp id and exact origin.
pub const RP_ID: &str = "people.talos.test";
pub const ORIGIN: &str = "https://people.talos.test:8443";

/// What [`build`] makes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Connections of the session, shared between the members.
    pub connections: usize,
    /// Records per batch (the gateway's default `batch_max_records` is
    /// 1,000).
    pub per_batch: usize,
    /// One held request, approved by alice through the relay.
    pub decision: bool,
    /// The session's source address.
    pub source: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            connections: 10,
            per_batch: 1000,
            decision: true,
            source: "10.1.0.2".into(),
        }
    }
}

/// The synthetic pair: its identities in `control_dir` (made by `init` if
/// missing), its members' signing keys and batch writers.
pub struct Pair {
    link: FakeLink,
    writers: Vec<(
        String,
        talos_certs::BatchWriter,
        Arc<talos_certs::GatewayKey>,
    )>,
    /// alice's passkey, once enrolled.
    alice: Option<Passkey>,
}

/// A passkey of the pair's own: its ES256 key, credential id and sign
/// count.
struct Passkey {
    key: aws_lc_rs::signature::EcdsaKeyPair,
    credential_id: Vec<u8>,
    /// The public half as registration stores it (COSE_Key).
    cose: Vec<u8>,
    sign_count: u32,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("synth::Pair").finish_non_exhaustive()
    }
}

impl Pair {
    /// The pair: `init` in `control_dir`, each member's key registered in
    /// `store` with its binding, the account's egress list and tenant
    /// `acme`'s secret.
    pub fn new(store: &mut Store, control_dir: &Path) -> Result<Pair, Error> {
        let ids: Vec<String> = MEMBERS.iter().map(|s| (*s).to_owned()).collect();
        if !control_dir.join(crate::identity::CA_CERT).exists() {
            crate::identity::init(control_dir, &ids)?;
        }
        store.egress_add(DESTINATION)?;
        store.write(|tx| {
            tx.set_setting(crate::store::settings::WEB_RP_ID, RP_ID, "synth")?;
            tx.set_setting(crate::store::settings::WEB_ORIGIN, ORIGIN, "synth")
        })?;
        store.secret_set("acme", SECRET_NAME, b"synth-S3CRET-value-0123456789")?;
        let mut writers = Vec::new();
        for id in MEMBERS {
            let key = Arc::new(talos_certs::GatewayKey::generate().map_err(|e| Error::Io {
                what: "key".into(),
                reason: e.to_string(),
            })?);
            let public = hex::encode(key.public_key());
            store.register_gateway(id, &public)?;
            let identity = crate::identity::Identity::load(control_dir, id)?;
            let binding = talos_certs::KeyBinding::sign(
                identity.key().secret_der(),
                identity.chain[0].to_vec(),
                talos_certs::ROLE_GATEWAY,
                id,
                &key.public_key(),
            )
            .map_err(|e| Error::Io {
                what: "key binding".into(),
                reason: e.to_string(),
            })?;
            store.keep_key_binding(id, &public, binding.to_json().as_bytes())?;
            writers.push((
                id.to_owned(),
                talos_certs::BatchWriter::new(Arc::clone(&key), id),
                key,
            ));
        }
        Ok(Pair {
            link: FakeLink::new(&MEMBERS),
            writers,
            alice: None,
        })
    }

    /// One session as `options` says, ended, its certificate issued with
    /// `control_dir`'s plane key; its id.
    pub fn session(
        &mut self,
        store: &mut Store,
        control_dir: &Path,
        options: &Options,
    ) -> Result<String, Error> {
        const ACCEPT: FakeVerifier = FakeVerifier::accepting();
        let relay = crate::identity::relay_key(control_dir)?;
        let rule = if options.decision {
            if self.alice.is_none() {
                self.alice = Some(enrol_alice(store)?);
            }
            Some(store.lock_add(&NewRule::check(
                DESTINATION,
                Some(SECRET_NAME),
                Some("POST"),
                Some("/deploy"),
                LockMode::EveryRequest,
                &["alice".to_owned()],
            )?)?)
        } else {
            None
        };
        for id in MEMBERS {
            self.link.set_down(id, false);
        }
        let req = StartRequest::new(
            "acme",
            vec![options.source.clone()],
            vec![DESTINATION.into()],
            vec![format!("{SECRET_NAME}={DESTINATION}:authorization:Bearer")],
            Mode::Commands,
        );
        let started = Lifecycle::new(store, &self.link, &ACCEPT)
            .with_relay_key(Some(relay.public_key()))
            .start(&req)?;
        let id = started.session_id;

        let approval = match &rule {
            Some(rule) => Some(self.decide(store, &relay, &id, rule)?),
            None => None,
        };

        // The members go away before the stop: the closes are owed, and
        // the signed drop reports in the chains below confirm them.
        for id in MEMBERS {
            self.link.set_down(id, true);
        }
        Lifecycle::new(store, &self.link, &ACCEPT).stop(&id)?;

        let cas = store.read(|tx| tx.cas(&id))?;
        for (m, (gateway, writer, key)) in self.writers.iter_mut().enumerate() {
            // A process of the member's own per session, so two sessions'
            // connection numbers never name one connection.
            let instance =
                talos_certs::sha384_hex(format!("{id}/{gateway}").as_bytes())[..16].to_owned();
            let mut records: Vec<Vec<u8>> = (0..options.connections)
                .filter(|i| i % MEMBERS.len() == m)
                .map(|i| record(gateway, &instance, &id, &options.source, i))
                .collect();
            if m == 0 {
                if let Some(a) = &approval {
                    records.push(held(gateway, &instance, &id, &options.source, a));
                }
            }
            records.push(dns(gateway, &instance, &id, &options.source));
            let ca = cas
                .iter()
                .find(|c| c.gateway_id == *gateway)
                .ok_or_else(|| Error::Store(format!("no CA of {gateway}")))?;
            let report = talos_certs::DropReport {
                gateway_id: gateway.clone(),
                instance: instance.clone(),
                session_id: id.clone(),
                attempt: ca.attempt,
                ca_digest: ca.digest.clone(),
                secrets: vec![SECRET_NAME.into()],
                reason: talos_certs::DropReason::End,
                at: crate::store::now(),
            };
            records.push(
                serde_json::to_vec(&json!({"report": report.sign(key)}))
                    .map_err(|e| Error::Store(e.to_string()))?,
            );
            for chunk in records.chunks(options.per_batch.max(1)) {
                let signed = writer
                    .seal(&crate::store::now(), chunk)
                    .map_err(|e| Error::Store(e.to_string()))?;
                match crate::batches::accept(store, &signed)? {
                    crate::batches::BatchVerdict::Accepted { .. } => {}
                    other => return Err(Error::Store(format!("batch refused: {other:?}"))),
                }
            }
        }
        let plane = crate::identity::plane_key(control_dir)?;
        if !crate::certificate::issue(store, &id, &plane)? {
            let why = crate::certificate::certificate(store, &id)?;
            return Err(Error::Store(format!(
                "not issued: {}",
                why["not_issued_because"]
            )));
        }
        Ok(id)
    }

    /// alice's passkey assertion over the card whose digest is
    /// `card_digest` and `verdict`, as the relay forwards it; `None` before
    /// a session with a decision enrolled her. Each call counts one more
    /// signature.
    pub fn alice_signs(
        &mut self,
        card_digest: &str,
        verdict: talos_certs::Verdict,
    ) -> Option<talos_certs::PasskeyAssertion> {
        let alice = self.alice.as_mut()?;
        alice.sign_count += 1;
        Some(assert(alice, card_digest, verdict))
    }

    /// A request of `gw-a` held by `rule`, proposed to the relay and
    /// approved by alice with her passkey: the approval as the gateway's
    /// record holds it.
    fn decide(
        &mut self,
        store: &mut Store,
        relay: &talos_certs::GatewayKey,
        id: &str,
        rule: &crate::lock::LockRule,
    ) -> Result<serde_json::Value, Error> {
        let now = std::time::SystemTime::now();
        let at = |d: u64| {
            humantime::format_rfc3339_millis(now + std::time::Duration::from_secs(d)).to_string()
        };
        let p = talos_certs::Proposal {
            proposal_id: format!("gw-a-1-{}", &id[4..]),
            gateway_id: "gw-a".into(),
            session_id: id.to_owned(),
            attempt: 1,
            tenant: "acme".into(),
            kind: talos_certs::ProposalKind::Request,
            destination: DESTINATION.into(),
            method: "POST".into(),
            path: "/deploy/1".into(),
            attachments: vec![SECRET_NAME.into()],
            rule: rule.id.clone(),
            tool: String::new(),
            call_digest: String::new(),
            approvers: rule.approvers.clone(),
            created_at: at(0),
            expires_at: at(300),
        };
        let s = talos_certs::sentence(&p);
        let d = talos_certs::proposal_digest(&p, &s);
        let msg = talos_certs::proposal_msg(p.clone(), s, d.clone());
        crate::relay::receive(store, &msg)?;
        let verdict = talos_certs::Verdict::Approved;
        let signed = self
            .alice_signs(&d, verdict)
            .ok_or_else(|| Error::invalid("alice holds no passkey"))?;
        let sign_count = self.alice.as_ref().map_or(0, |a| a.sign_count);
        let alice_key = self.alice.as_ref().map_or_else(Default::default, |a| {
            use base64::Engine as _;
            (
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&a.cose),
                "ES256".to_owned(),
            )
        });
        let challenge = talos_certs::webauthn::decision_challenge(&d, verdict);
        let decided = crate::relay::decide_signed(
            store,
            &self.link,
            relay,
            &p.proposal_id,
            "alice",
            verdict,
            |_, _| {
                use base64::Engine as _;
                Ok(Some(crate::store::SignedByPasskey {
                    person: "alice".into(),
                    credential_id: signed.credential_id,
                    authenticator_data: signed.authenticator_data,
                    client_data_json: signed.client_data_json,
                    signature: signed.signature,
                    user_handle: None,
                    sign_count,
                    rp_id: RP_ID.into(),
                    origin: ORIGIN.into(),
                    challenge: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(challenge),
                    nonce: None,
                    verified_at: crate::store::now(),
                    public_key_cose: Some(alice_key.0.clone()),
                    alg: Some(alice_key.1.clone()),
                }))
            },
        )?;
        Ok(json!({
            "proposal_id": p.proposal_id, "digest": d, "rule": p.rule, "decision": "approved",
            "approver": "alice", "requested_at": p.created_at, "decided_at": decided.decided_at,
        }))
    }
}

/// Connection `i`'s record on `gateway`.
fn record(gateway: &str, instance: &str, id: &str, source: &str, i: usize) -> Vec<u8> {
    let opened = "2026-12-06T10:00:00.000Z";
    let closed = "2026-12-06T10:00:01.250Z";
    let port = 20_000 + (i % 40_000);
    let value = if i % 50 == 49 {
        json!({
            "gateway_id": gateway, "instance": instance, "conn": i, "session_id": id,
            "attempt": 1, "tenant": "acme", "source": format!("{source}:{port}"),
            "sni": "elsewhere.example.net", "alpn_offered": ["h2", "http/1.1"],
            "resolved": null, "request_count": 0, "verdict": "not_on_allowlist",
            "cause": "not_listed", "opened_at": opened, "closed_at": opened,
            "bytes_from_session": 517, "bytes_to_session": 7,
        })
    } else {
        let second = if i % 97 == 96 {
            json!({"method": "GET", "path": "/elsewhere", "status": 421, "refusal": "host_mismatch"})
        } else {
            json!({"method": "GET", "path": format!("/v1/items/{i}/echo"), "status": 200})
        };
        json!({
            "gateway_id": gateway, "instance": instance, "conn": i, "session_id": id,
            "attempt": 1, "tenant": "acme", "source": format!("{source}:{port}"),
            "sni": DESTINATION, "alpn_offered": ["h2", "http/1.1"],
            "resolved": "93.184.216.34:443", "tls_version": "TLSv1.3", "alpn_session": "h2",
            "alpn_upstream": "h2", "request_count": 2,
            "requests": [{"method": "GET", "path": format!("/v1/items/{i}"), "status": 200}, second],
            "attachments_used": [SECRET_NAME], "masked": {SECRET_NAME: 1},
            "verdict": "allowed", "opened_at": opened, "closed_at": closed,
            "bytes_from_session": 1_180 + i % 300, "bytes_to_session": 4_096 + i % 1_000,
        })
    };
    serde_json::to_vec(&value).expect("a record serialises")
}

/// The held request's connection on `gateway`.
fn held(
    gateway: &str,
    instance: &str,
    id: &str,
    source: &str,
    approval: &serde_json::Value,
) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "gateway_id": gateway, "instance": instance, "conn": 1_000_000_000u64, "session_id": id,
        "attempt": 1, "tenant": "acme", "source": format!("{source}:60000"), "sni": DESTINATION,
        "resolved": "93.184.216.34:443", "tls_version": "TLSv1.3", "alpn_session": "http/1.1",
        "alpn_upstream": "http/1.1", "request_count": 1,
        "requests": [{"method": "POST", "path": "/deploy/1", "status": 200, "approval": approval}],
        "attachments_used": [SECRET_NAME], "verdict": "allowed",
        "opened_at": "2026-12-06T10:00:02.000Z", "closed_at": "2026-12-06T10:00:09.000Z",
        "bytes_from_session": 900, "bytes_to_session": 300,
    }))
    .expect("a record serialises")
}

/// A DNS line of `gateway` for the session.
fn dns(gateway: &str, instance: &str, id: &str, source: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "kind": "dns", "gateway_id": gateway, "instance": instance, "session_id": id,
        "tenant": "acme", "attempt": 1, "source": format!("{source}:53000"),
        "opened_at": "2026-12-06T10:00:00.000Z", "closed_at": "2026-12-06T10:01:00.000Z",
        "queries": {"answered": 4, "unlisted": 1}, "answered": 4, "refused": 1,
        "refused_names": 1, "longest_refused_name": 23,
    }))
    .expect("a DNS line serialises")
}

/// alice's assertion with `alice`'s key over `verdict` on the card whose
/// digest is `card_digest`, as WebAuthn (Level 2, 7.2) has the browser and
/// the authenticator make it: client data `webauthn.get` from [`ORIGIN`]
/// with the challenge `decision_challenge(card digest, verdict)`,
/// authenticator data the SHA-256 of [`RP_ID`], flags UP and UV, the sign
/// count; the ECDSA (ASN.1) signature over authenticator data ||
/// SHA-256(client data). Each field base64url without padding.
fn assert(
    alice: &Passkey,
    card_digest: &str,
    verdict: talos_certs::Verdict,
) -> talos_certs::PasskeyAssertion {
    use aws_lc_rs::digest::{digest, SHA256};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let challenge = talos_certs::webauthn::decision_challenge(card_digest, verdict);
    let client = serde_json::to_vec(&json!({
        "type": "webauthn.get",
        "challenge": URL_SAFE_NO_PAD.encode(challenge),
        "origin": ORIGIN,
        "crossOrigin": false,
    }))
    .expect("client data serialises");
    let mut auth = digest(&SHA256, RP_ID.as_bytes()).as_ref().to_vec();
    // UP (0x01) and UV (0x04).
    auth.push(0x05);
    auth.extend_from_slice(&alice.sign_count.to_be_bytes());
    let mut signed = auth.clone();
    signed.extend_from_slice(digest(&SHA256, &client).as_ref());
    let signature = alice
        .key
        .sign(&aws_lc_rs::rand::SystemRandom::new(), &signed)
        .expect("a P-256 key signs");
    talos_certs::PasskeyAssertion {
        credential_id: URL_SAFE_NO_PAD.encode(&alice.credential_id),
        authenticator_data: URL_SAFE_NO_PAD.encode(&auth),
        client_data_json: URL_SAFE_NO_PAD.encode(&client),
        signature: URL_SAFE_NO_PAD.encode(signature.as_ref()),
        user_handle: None,
    }
}

/// alice, an approver, and a passkey of hers: an ES256 key made here, its
/// public half stored as COSE as registration stores it (a second one
/// when another pair enrolled her in this store before).
fn enrol_alice(store: &mut Store) -> Result<Passkey, Error> {
    use aws_lc_rs::rand::SecureRandom as _;
    use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_ASN1_SIGNING};
    let enrolled = !store
        .read(|tx| tx.enrolled(&["alice".to_owned()]))?
        .is_empty();
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let key = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING)
        .map_err(|e| Error::invalid(format!("a P-256 key: {e}")))?;
    // The uncompressed point: 0x04, x, y.
    let point = key.public_key().as_ref();
    let (x, y) = (&point[1..33], &point[33..65]);
    // COSE_Key {1: 2 (EC2), 3: -7 (ES256), -1: 1 (P-256), -2: x, -3: y}.
    let mut cose = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 0x20];
    cose.extend_from_slice(x);
    cose.extend_from_slice(&[0x22, 0x58, 0x20]);
    cose.extend_from_slice(y);
    let mut handle = [0u8; 32];
    let mut credential_id = [0u8; 16];
    for bytes in [&mut handle[..], &mut credential_id[..]] {
        rng.fill(bytes)
            .map_err(|_| Error::invalid("no random bytes"))?;
    }
    let now = crate::store::now();
    let passkey = crate::store::Passkey {
        credential_id: credential_id.to_vec(),
        person: "alice".into(),
        public_key_cose: cose.clone(),
        alg: "ES256".into(),
        sign_count: 0,
        aaguid: "00000000000000000000000000000000".into(),
        backup_eligible: false,
        backed_up: false,
        attestation: "none".into(),
        created_at: now.clone(),
        last_used_at: None,
    };
    store.write(|tx| {
        if !enrolled {
            tx.insert_person("alice", crate::model::Role::Approver, &handle, &now)?;
        }
        tx.insert_passkey(&passkey)
    })?;
    Ok(Passkey {
        key,
        credential_id: credential_id.to_vec(),
        cose,
        sign_count: 0,
    })
}
