//! The demo's last check (`scripts/demo.sh`): prints the session
//! certificate the control stub issued and verifies it against what the
//! session and the gateway saw: it is issued, every CA the session trusted
//! (in the PEM files given) is on it and confirmed destroyed, its
//! connections are exactly the gateway's records of the session (by source
//! and opening time), and all five reset steps are confirmed. Exits 1 with
//! "VERIFICATION FAILED:" and the problems otherwise.
//!
//! Usage: demo-check CERTIFICATE.json RECORDS.jsonl SESSION_ID CA.pem...
//!
//! Also `demo-check digest PEM`: the SHA-384 of each certificate in a PEM
//! bundle, one a line, as the session can compute it.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::Value;
use sha2::{Digest, Sha384};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [cmd, pem] if cmd == "digest" => digests(pem).map(|d| {
            for x in d {
                println!("{x}");
            }
            true
        }),
        [cert, records, sid, cas @ ..] if !cas.is_empty() => {
            check(cert, records, sid, cas).map(|(out, ok)| {
                print!("{out}");
                ok
            })
        }
        _ => Err("usage: demo-check CERTIFICATE.json RECORDS.jsonl SESSION_ID CA.pem... | demo-check digest PEM".into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

/// The SHA-384 (hex) of each certificate in a PEM file.
fn digests(path: &str) -> Result<Vec<String>, String> {
    let text = read(path)?;
    let mut reader = text.as_bytes();
    rustls_pemfile::certs(&mut reader)
        .map(|c| {
            c.map(|der| hex::encode(Sha384::digest(der.as_ref())))
                .map_err(|e| format!("{path}: {e}"))
        })
        .collect()
}

/// A value as Python's `str` prints it (strings bare, null as None,
/// booleans as True/False).
fn py(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        other => other.to_string(),
    }
}

/// The first 16 characters of a string value.
fn short(v: &Value) -> String {
    py(v).chars().take(16).collect()
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// Whether a value counts as true in Python (`if not x`).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// What the demo prints of the certificate and its verification, and
/// whether it holds.
fn check(
    cert_path: &str,
    records: &str,
    sid: &str,
    cas: &[String],
) -> Result<(String, bool), String> {
    let cert: Value =
        serde_json::from_str(&read(cert_path)?).map_err(|e| format!("{cert_path}: {e}"))?;
    let mut o = String::new();
    // Lines of the report (the demo's output).
    macro_rules! say {
        () => { o.push('\n') };
        ($($t:tt)*) => {{ let _ = writeln!(o, $($t)*); }};
    }
    say!("{}", py(&cert["isolation_statement"]));
    say!();
    for a in list(&cert["attempts"]) {
        say!(
            "attempt {}: cause {}, ended {}",
            py(&a["attempt"]),
            py(&a["cause"]),
            py(&a["end_cause"])
        );
        for ca in list(&a["ca"]) {
            say!(
                "  CA {}... made {}, destroyed {} ({})",
                short(&ca["digest"]),
                py(&ca["made_at"]),
                py(&ca["destroyed_at"]),
                py(&ca["destroy_reason"])
            );
        }
    }
    say!(
        "connections: {}, refusals: {}, batches: {}",
        list(&cert["connections"]).len(),
        list(&cert["refusals"]).len(),
        list(&cert["batches"]).len()
    );
    for p in list(&cert["proposals"]) {
        say!(
            "proposal {}: {} by {} (digest {}...)",
            py(&p["id"]),
            py(&p["decision"]),
            py(&p["approver"]),
            short(&p["digest"])
        );
    }
    for s in list(&cert["secrets"]) {
        say!(
            "secret {}: used on {} connections, {} echoes masked",
            py(&s["name"]),
            py(&s["connections_used"]),
            py(&s["masked"])
        );
    }
    let reset = list(&cert["reset"]);
    for step in reset {
        say!(
            "reset step {} {}: confirmed={}",
            py(&step["step"]),
            py(&step["name"]),
            py(&step["confirmed"])
        );
    }
    say!("issued: {}", py(&cert["issued"]));

    // Verify it against what the session and the gateway saw.
    let mut problems = Vec::new();
    if !truthy(&cert["issued"]) {
        problems.push(format!("not issued: {}", py(&cert["not_issued_because"])));
    }
    let mut trusted = Vec::new();
    for path in cas {
        trusted.extend(digests(path)?);
    }
    let on_cert: Vec<&Value> = list(&cert["attempts"])
        .iter()
        .flat_map(|a| list(&a["ca"]))
        .collect();
    for d in &trusted {
        let short_d: String = d.chars().take(16).collect();
        match on_cert
            .iter()
            .rev()
            .find(|ca| ca["digest"].as_str() == Some(d))
        {
            None => problems.push(format!(
                "CA {short_d} the session trusted is not on the certificate"
            )),
            Some(ca) if !truthy(&ca["destroyed_at"]) => {
                problems.push(format!("CA {short_d} is not confirmed destroyed"));
            }
            Some(_) => {}
        }
    }
    let mut local = Vec::new();
    let mut dns = Vec::new();
    for l in read(records)?.lines() {
        let r: Value = serde_json::from_str(l).map_err(|e| format!("{records}: {e}"))?;
        if r.get("session_id").and_then(Value::as_str) == Some(sid) {
            // A session's DNS counts are no connection: the certificate
            // lists them apart.
            if r.get("kind").and_then(Value::as_str) == Some("dns") {
                dns.push(r);
            } else {
                local.push(r);
            }
        }
    }
    if list(&cert["dns"]).len() != dns.len() {
        problems.push(format!(
            "the gateway recorded {} DNS counts of the session, the certificate holds {}",
            dns.len(),
            list(&cert["dns"]).len()
        ));
    }
    let key = |r: &Value| (r["source"].to_string(), r["opened_at"].to_string());
    let mut mine: Vec<_> = local.iter().map(key).collect();
    let mut theirs: Vec<_> = list(&cert["connections"]).iter().map(key).collect();
    mine.sort();
    theirs.sort();
    if mine != theirs {
        problems.push(format!(
            "the gateway recorded {} connections of the session, the certificate holds {}",
            local.len(),
            theirs.len()
        ));
    }
    if !reset.iter().all(|s| truthy(&s["confirmed"])) || reset.len() != 5 {
        problems.push("a reset step is not confirmed".into());
    }
    if !problems.is_empty() {
        say!("VERIFICATION FAILED:");
        for p in &problems {
            say!("  {p}");
        }
        return Ok((o, false));
    }
    say!(
        "verified: both CAs the session trusted are on it and destroyed, all five reset steps confirmed, and its {} connection records are exactly the gateway's",
        local.len()
    );
    Ok((o, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SID: &str = "sbx-2a04a3fc6a2e";

    fn testdata(p: &str) -> String {
        format!("{}/testdata/demo/{p}", env!("CARGO_MANIFEST_DIR"))
    }

    fn cas() -> Vec<String> {
        vec![
            testdata("session-ca-attempt-1.pem"),
            testdata("session-ca.pem"),
        ]
    }

    /// A demo run's certificate: printed and verified as the demo's
    /// Python check did.
    #[test]
    fn a_demo_certificate_verifies() {
        let (out, ok) = check(
            &testdata("certificate.json"),
            &testdata("records.jsonl"),
            SID,
            &cas(),
        )
        .unwrap();
        assert!(ok);
        assert_eq!(out, std::fs::read_to_string(testdata("check.txt")).unwrap());
    }

    /// Not issued, a CA not destroyed, a connection missing, a reset step
    /// not confirmed: each is named, and the check fails.
    #[test]
    fn a_tampered_certificate_fails() {
        let mut cert: Value =
            serde_json::from_str(&read(&testdata("certificate.json")).unwrap()).unwrap();
        cert["issued"] = Value::Bool(false);
        cert["connections"].as_array_mut().unwrap().pop();
        cert["reset"][0]["confirmed"] = Value::Bool(false);
        cert["attempts"][0]["ca"][0]["destroyed_at"] = Value::String(String::new());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("certificate.json");
        std::fs::write(&path, cert.to_string()).unwrap();
        let (out, ok) = check(
            path.to_str().unwrap(),
            &testdata("records.jsonl"),
            SID,
            &cas(),
        )
        .unwrap();
        assert!(!ok);
        let tail = out.split_once("VERIFICATION FAILED:\n").unwrap().1;
        assert_eq!(
            tail,
            "  not issued: None\n  CA 1e7faf08dc8581eb is not confirmed destroyed\n  \
             the gateway recorded 23 connections of the session, the certificate holds 22\n  \
             a reset step is not confirmed\n"
        );
        // A CA the session trusted that is not on the certificate (the
        // origin's).
        let (out, ok) = check(
            &testdata("certificate.json"),
            &testdata("records.jsonl"),
            SID,
            &[testdata("origin-ca.pem"), testdata("session-ca.pem")],
        )
        .unwrap();
        assert!(!ok);
        assert!(out.ends_with(&format!(
            "VERIFICATION FAILED:\n  CA {} the session trusted is not on the certificate\n",
            &digests(&testdata("origin-ca.pem")).unwrap()[0][..16]
        )));
    }

    #[test]
    fn digests_of_a_bundle() {
        let d = digests(&testdata("session-ca.pem")).unwrap();
        assert_eq!(d.len(), 1);
        assert!(d[0].starts_with("8d745f564e471ce4"));
    }
}
