//! The certificate bundle: an issued session certificate with every signed
//! thing it rests on, in one file a reviewer checks alone
//! (`control-stub certificate bundle ID --out FILE`; the checker is
//! `verifier/verify_bundle.py`, which shares no code with this crate).
//!
//! The certificate carries only digests of its evidence: each batch's
//! gateway, number and digest, each reset step's report by digest. The
//! bundle carries the evidence itself, exactly as it was signed, and the
//! keys that signed it, each bound to its role and id under the control
//! CA ([`talos_certs::KeyBinding`]), so a reviewer can recompute the
//! certificate from the members' own signatures instead of trusting the
//! control plane's.
//!
//! # The format (version 1)
//!
//! JSON lines: one JSON object per line, UTF-8, `\n` after each. The first
//! line is the header; every other line is one item, named by `item`.
//! Items may come in any order (this writer's order is the one below);
//! byte strings are standard base64 with padding; envelopes are talos-certs
//! `Signed` objects as `docs/records.md` ("What every signature covers")
//! gives them.
//!
//! | `item` | fields | what it is |
//! |---|---|---|
//! | (header) | `format` (`talos-certificate-bundle`), `version` (1), `session_id`, `made_at`, `made_by` | which session; the rest is the items' |
//! | `control_ca` | `pem` | the control CA's certificate (`ca.pem` of `init`): the one trust anchor |
//! | `key` | `role` (`plane`, `relay`, `gateway`), `id`, `public_key` (64 hex), `public_key_pem` (the same key as a PEM `PUBLIC KEY`, for `openssl`), `binding` (a `KeyBinding`, or null when none was kept) | a signing key and its binding under the control CA |
//! | `certificate` | `session_id`, `envelope` (kind `certificate`) | the certificate as issued |
//! | `proposal` | `proposal_id`, `fields` (talos-certs `Proposal`), `sentence`, `digest`, `decision` (envelope of kind `decision` exactly as the relay signed it, with the card and the person's WebAuthn assertion inside when a person decided with a passkey; or null) | a card the relay showed, and its signed decision |
//! | `approver_key` | `owner`, `credential_id` and `public_key_cose` (base64), `alg`, `rp_id`, `origin` (null when no web app's relying party is set) | a passkey of an approver a card of the session names, with the web app's relying party: what a session's open lists for the gateway to check a person's assertion with |
//! | `report` | `via` (`reply`), `gateway_id`, `envelope` (kind `drop_report`) | a drop report a member answered a close with: the ones in its batch chain are inside the batches |
//! | `batch` | `gateway_id`, `seq`, `envelope` (kind `batch`) | a member's batch as signed |
//!
//! # Which batches
//!
//! For each member, the contiguous run of its chain from the first batch
//! to the last that holds an entry of the session: a record of it (the
//! certificate's `batches`), its drop reports, and the start reports that
//! ended its authorities (reset step 4's and 5's `report_digest`). Every
//! batch in between comes too, whoever's records it holds, so the chain
//! can be checked across: nothing between the first and the last can have
//! been left out. Those records of other sessions are records (never a
//! secret, a body, a header value or a query: `docs/records.md`), but
//! they are other sessions': a bundle is shown to whoever may see what
//! the pair did in that window.
//!
//! # Which approvers' keys
//!
//! Every passkey the store holds now of every approver a card of the
//! session names, with the relying party (rp id and origin) the web app
//! is set to now: what an open lists (`people::open`), read when the
//! bundle is written. The store keeps no copy of what each open listed,
//! so these are the control stub's word; a person's decision checks out
//! only if its assertion verifies under one of them.
//!
//! Nothing secret is in a bundle: the certificate, records, reports,
//! decisions and proposals never hold a secret value, and the keys are
//! public halves. The writer never reads the secret store.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::error::Error;
use crate::identity;
use crate::store::{Store, StoredReport, Tx};

/// The header's `format`.
pub const FORMAT: &str = "talos-certificate-bundle";
/// The header's `version`: this writer's format.
pub const VERSION: u32 = 1;

/// What [`write`] put in a bundle.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub session_id: String,
    pub keys: usize,
    pub batches: usize,
    /// Per member, the first and last batch of its run.
    pub runs: BTreeMap<String, (u64, u64)>,
    pub reports: usize,
    pub proposals: usize,
    pub approver_keys: usize,
    pub bytes: u64,
}

/// Everything a bundle holds, read in one transaction.
struct Evidence {
    certificate: talos_certs::Signed,
    keys: Vec<(String, String, String, Option<Vec<u8>>)>,
    relay_keys: BTreeSet<String>,
    proposals: Vec<crate::store::ProposalRecord>,
    approver_keys: Vec<crate::store::Passkey>,
    /// The web app's rp id and origin; none when none is set (then no
    /// open lists one, and no assertion holds).
    relying_party: Option<(String, String)>,
    replies: Vec<StoredReport>,
    batches: Vec<(String, u64, talos_certs::Signed)>,
    runs: BTreeMap<String, (u64, u64)>,
}

/// Write session `id`'s bundle to `out`: the issued certificate, its
/// evidence from `store`, and the control CA and control-plane keys from
/// the `init` directory `control_dir` (its `ca.pem`, `stub.pem`,
/// `stub.key`, `plane.key`; the relay's and the plane's keys are bound by
/// `stub.key` here). Refuses (`bundle_incomplete`) when the certificate is
/// not issued, when a batch it needs was accepted before batches were
/// kept as signed, or when `plane.key` is not the key that signed it.
pub fn write(
    store: &Store,
    control_dir: &Path,
    id: &str,
    out: &mut dyn Write,
) -> Result<Summary, Error> {
    let evidence = store.read(|tx| gather(tx, id))?;
    let binder = Binder::load(control_dir, id, &evidence.certificate)?;
    let bind = |role: &str, key_hex: &str| binder.bind(id, role, key_hex);

    // A key item: the key in hex and as PEM (what `openssl` reads).
    let key_item = |role: &str, id: &str, key_hex: &str, binding: Value| -> Value {
        let pem = crate::store::ed25519_key(key_hex)
            .map(|k| Value::String(public_key_pem(&k)))
            .unwrap_or(Value::Null);
        json!({
            "item": "key", "role": role, "id": id, "public_key": key_hex,
            "public_key_pem": pem, "binding": binding,
        })
    };
    let mut counter = Counting { out, bytes: 0 };
    let mut line = |value: &Value| -> Result<(), Error> {
        serde_json::to_writer(&mut counter, value)?;
        counter.write_all(b"\n").map_err(io)?;
        Ok(())
    };
    line(&json!({
        "format": FORMAT,
        "version": VERSION,
        "session_id": id,
        "made_at": crate::store::now(),
        "made_by": concat!("control-stub ", env!("CARGO_PKG_VERSION")),
    }))?;
    line(&json!({"item": "control_ca", "pem": binder.ca_pem}))?;
    let plane_hex = binder.plane_hex.clone();
    line(&key_item(
        talos_certs::ROLE_PLANE,
        identity::STUB_NAME,
        &plane_hex,
        bind(talos_certs::ROLE_PLANE, &plane_hex)?,
    ))?;
    for relay in &evidence.relay_keys {
        line(&key_item(
            talos_certs::ROLE_RELAY,
            identity::STUB_NAME,
            relay,
            bind(talos_certs::ROLE_RELAY, relay)?,
        ))?;
    }
    for (role, gateway, key, binding) in &evidence.keys {
        let binding = match binding {
            Some(b) => serde_json::from_slice::<Value>(b).unwrap_or(Value::Null),
            None => Value::Null,
        };
        line(&key_item(role, gateway, key, binding))?;
    }
    line(&json!({
        "item": "certificate", "session_id": id,
        "envelope": serde_json::to_value(&evidence.certificate)?,
    }))?;
    for p in &evidence.proposals {
        line(&json!({
            "item": "proposal", "proposal_id": p.proposal_id, "fields": p.fields,
            "sentence": p.sentence, "digest": p.digest, "decision": p.decision,
        }))?;
    }
    let (rp_id, origin) = match &evidence.relying_party {
        Some((rp_id, origin)) => (Value::from(rp_id.as_str()), Value::from(origin.as_str())),
        None => (Value::Null, Value::Null),
    };
    for k in &evidence.approver_keys {
        use base64::Engine as _;
        let b64 = &base64::engine::general_purpose::STANDARD;
        line(&json!({
            "item": "approver_key", "owner": k.person,
            "credential_id": b64.encode(&k.credential_id),
            "public_key_cose": b64.encode(&k.public_key_cose), "alg": k.alg,
            "rp_id": rp_id, "origin": origin,
        }))?;
    }
    for r in &evidence.replies {
        let envelope: Value = serde_json::from_slice(&r.signed)?;
        line(&json!({
            "item": "report", "via": r.via, "gateway_id": r.gateway_id, "envelope": envelope,
        }))?;
    }
    for (gateway, seq, signed) in &evidence.batches {
        line(&json!({
            "item": "batch", "gateway_id": gateway, "seq": seq,
            "envelope": serde_json::to_value(signed)?,
        }))?;
    }
    counter.flush().map_err(io)?;
    Ok(Summary {
        session_id: id.to_owned(),
        keys: 1 + evidence.relay_keys.len() + evidence.keys.len(),
        batches: evidence.batches.len(),
        runs: evidence.runs,
        reports: evidence.replies.len(),
        proposals: evidence.proposals.len(),
        approver_keys: evidence.approver_keys.len(),
        bytes: counter.bytes,
    })
}

/// What the bundle's keys are bound with: the control CA (its PEM), the
/// stub's identity (`stub.key` and its certificate), and the plane's key,
/// checked to be the one that signed the certificate.
struct Binder {
    ca_pem: String,
    plane_hex: String,
    stub: identity::Identity,
    stub_cert: Vec<u8>,
}

impl Binder {
    fn load(
        control_dir: &Path,
        id: &str,
        certificate: &talos_certs::Signed,
    ) -> Result<Binder, Error> {
        let plane = identity::existing_plane_key(control_dir)?;
        if plane.key_id() != certificate.key_id {
            return Err(incomplete(
                id,
                format!(
                    "the certificate was signed by key {}, and {} holds key {}",
                    certificate.key_id,
                    control_dir.join(identity::PLANE_KEY).display(),
                    plane.key_id()
                ),
            ));
        }
        let stub = identity::Identity::load(control_dir, "stub")?;
        let stub_cert = stub
            .chain
            .first()
            .ok_or_else(|| incomplete(id, "stub.pem holds no certificate".into()))?
            .to_vec();
        let ca_pem = std::fs::read_to_string(control_dir.join(identity::CA_CERT)).map_err(|e| {
            Error::Io {
                what: control_dir.join(identity::CA_CERT).display().to_string(),
                reason: e.to_string(),
            }
        })?;
        Ok(Binder {
            ca_pem,
            plane_hex: hex::encode(plane.public_key()),
            stub,
            stub_cert,
        })
    }

    /// `key_hex` (Ed25519) bound to `role` by `stub.key`, as JSON.
    fn bind(&self, id: &str, role: &str, key_hex: &str) -> Result<Value, Error> {
        let key = crate::store::ed25519_key(key_hex)
            .ok_or_else(|| incomplete(id, format!("the {role} key {key_hex} is not Ed25519")))?;
        let binding = talos_certs::KeyBinding::sign(
            self.stub.key().secret_der(),
            self.stub_cert.clone(),
            role,
            identity::STUB_NAME,
            &key,
        )
        .map_err(|e| incomplete(id, format!("stub.key cannot bind the {role} key: {e}")))?;
        Ok(serde_json::to_value(&binding)?)
    }
}

/// Write session `id`'s bundle to the file `path`, whole or not at all:
/// written beside it under a temporary name, synced, then renamed.
pub fn write_file(
    store: &Store,
    control_dir: &Path,
    id: &str,
    path: &Path,
) -> Result<Summary, Error> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".partial");
    let temp = std::path::PathBuf::from(temp);
    let file_error = |p: &Path, e: std::io::Error| Error::Io {
        what: p.display().to_string(),
        reason: e.to_string(),
    };
    let file = std::fs::File::create(&temp).map_err(|e| file_error(&temp, e))?;
    let mut buffered = std::io::BufWriter::new(file);
    let written = write(store, control_dir, id, &mut buffered).and_then(|summary| {
        let file = buffered
            .into_inner()
            .map_err(|e| file_error(&temp, e.into_error()))?;
        file.sync_all().map_err(|e| file_error(&temp, e))?;
        Ok(summary)
    });
    match written {
        Ok(summary) => {
            std::fs::rename(&temp, path).map_err(|e| file_error(path, e))?;
            Ok(summary)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// The certificate and its evidence from the store (see the module docs
/// for which batches).
fn gather(tx: &Tx<'_>, id: &str) -> Result<Evidence, Error> {
    let issued = tx
        .issued_certificate(id)?
        .ok_or_else(|| Error::CertificateNotIssued {
            id: id.to_owned(),
            reason: "no certificate is issued yet: a bundle carries an issued one".into(),
        })?;
    let cert: Value = serde_json::from_slice(&issued.payload)?;
    let certificate = talos_certs::Signed {
        kind: talos_certs::Kind::Certificate,
        key_id: issued.key_id,
        payload: issued.payload,
        signature: issued.signature,
    };

    // Per member, the batches holding an entry of the session.
    let mut wanted: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for b in cert["batches"].as_array().into_iter().flatten() {
        if let (Some(g), Some(seq)) = (b["gateway_id"].as_str(), b["seq"].as_u64()) {
            wanted.entry(g.to_owned()).or_default().insert(seq);
        }
    }
    let mut replies = Vec::new();
    for r in tx.drop_report_envelopes(id)? {
        match (r.via.as_str(), r.batch_seq) {
            ("chain", Some(seq)) => {
                wanted.entry(r.gateway_id.clone()).or_default().insert(seq);
            }
            _ => replies.push(r),
        }
    }
    // The start reports the reset relies on, by digest, in their chains.
    let relied = relied_on(&cert);
    let members: BTreeSet<String> = cert["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["ca"].as_array().into_iter().flatten())
        .filter_map(|c| c["gateway_id"].as_str().map(str::to_owned))
        .chain(wanted.keys().cloned())
        .collect();
    for gateway in &members {
        for r in tx.start_report_envelopes(gateway)? {
            if relied.contains(&talos_certs::sha384_hex(&r.signed)) {
                if let Some(seq) = r.batch_seq {
                    wanted.entry(gateway.clone()).or_default().insert(seq);
                }
            }
        }
    }

    let mut batches = Vec::new();
    let mut runs = BTreeMap::new();
    for (gateway, seqs) in &wanted {
        let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
            continue;
        };
        for (seq, signed) in tx.signed_batches(gateway, first, last)? {
            let signed = signed.ok_or_else(|| {
                incomplete(
                    id,
                    format!(
                        "batch {seq} of gateway {gateway} is not kept as signed (accepted before \
                         schema version 9, or never accepted): the chain cannot be shown across it"
                    ),
                )
            })?;
            batches.push((gateway.clone(), seq, signed));
        }
        runs.insert(gateway.clone(), (first, last));
    }

    let mut keys = Vec::new();
    for gateway in &members {
        let Some(key) = tx.gateway_key(gateway)? else {
            return Err(incomplete(
                id,
                format!("gateway {gateway} has no registered key"),
            ));
        };
        let binding = tx.key_binding(gateway, &key)?;
        keys.push((
            talos_certs::ROLE_GATEWAY.to_owned(),
            gateway.clone(),
            key,
            binding,
        ));
    }
    let relay_keys = tx
        .attempts(id)?
        .into_iter()
        .filter_map(|a| a.relay_public_key)
        .map(|k| k.to_ascii_lowercase())
        .collect();
    // The passkeys of every approver a card names (see the module docs).
    let proposals = tx.proposals(Some(id), None)?;
    let named: BTreeSet<&String> = proposals.iter().flat_map(|p| &p.fields.approvers).collect();
    let mut approver_keys = Vec::new();
    for person in named {
        approver_keys.extend(tx.passkeys_of(person)?);
    }
    Ok(Evidence {
        certificate,
        keys,
        relay_keys,
        proposals,
        approver_keys,
        relying_party: tx.web_relying_party()?,
        replies,
        batches,
        runs,
    })
}

/// The digests of the reports reset steps 4 and 5 name (`report_digest`).
fn relied_on(cert: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for step in cert["reset"].as_array().into_iter().flatten() {
        let response = &step["response"];
        for item in ["cas", "detached"]
            .iter()
            .flat_map(|k| response[*k].as_array().into_iter().flatten())
        {
            if let Some(d) = item["report_digest"].as_str() {
                out.insert(d.to_owned());
            }
        }
    }
    out
}

/// An Ed25519 public key as a PEM `PUBLIC KEY` (SubjectPublicKeyInfo:
/// the 12 bytes that say "Ed25519", then the key), what `openssl pkeyutl
/// -verify -pubin` reads.
fn public_key_pem(public: &[u8; 32]) -> String {
    use base64::Engine as _;
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(public);
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(der)
    )
}

fn incomplete(id: &str, reason: String) -> Error {
    Error::BundleIncomplete {
        id: id.to_owned(),
        reason,
    }
}

fn io(e: std::io::Error) -> Error {
    Error::Io {
        what: "certificate bundle".into(),
        reason: e.to_string(),
    }
}

/// A writer that counts what goes through it.
struct Counting<'a> {
    out: &'a mut dyn Write,
    bytes: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
