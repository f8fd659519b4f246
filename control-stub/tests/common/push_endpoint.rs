//! The tests' own Web Push endpoint (`tests/peers/push_endpoint.py`: a
//! browser and its push service in one, in Python, sharing no code with
//! the control plane), started as a process with a CA of the test's own
//! and stopped by its PID when dropped.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

/// How long the endpoint may take to say it listens.
const READY: Duration = Duration::from_secs(30);

/// A subscription as the endpoint made it (`PushSubscription.toJSON()`).
#[derive(Clone, Debug)]
pub struct Device {
    pub endpoint: String,
    pub p256dh: String,
    pub auth: String,
}

/// The endpoint process, its certificate's CA and what it records.
pub struct PushEndpoint {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
    devices: serde_json::Value,
}

impl PushEndpoint {
    /// Start it with one subscription per `(name, statuses)`: each POST to
    /// that subscription is answered with the next status (the last one
    /// repeats).
    pub fn start(subscriptions: &[(&str, &[u16])]) -> PushEndpoint {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "push endpoint test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, &ca_key);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();

        let mut cmd = Command::new("python3");
        cmd.arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/peers/push_endpoint.py"
        ))
        .arg("--cert")
        .arg(dir.path().join("cert.pem"))
        .arg("--key")
        .arg(dir.path().join("key.pem"))
        .arg("--record")
        .arg(dir.path().join("received.jsonl"));
        for (name, statuses) in subscriptions {
            let statuses: Vec<String> = statuses.iter().map(u16::to_string).collect();
            cmd.arg("--subscription")
                .arg(format!("{name}={}", statuses.join(",")));
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .expect("python3 runs");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(READY).unwrap_or_default();
        let ready: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the push endpoint did not start: {}",
                    std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
                );
            }
        };
        PushEndpoint {
            child,
            port: u16::try_from(ready["port"].as_u64().unwrap()).unwrap(),
            devices: ready["subscriptions"].clone(),
            dir,
        }
    }

    /// The CA the endpoint's certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Subscription `name`.
    pub fn device(&self, name: &str) -> Device {
        let d = &self.devices[name];
        Device {
            endpoint: d["endpoint"].as_str().unwrap().to_owned(),
            p256dh: d["keys"]["p256dh"].as_str().unwrap().to_owned(),
            auth: d["keys"]["auth"].as_str().unwrap().to_owned(),
        }
    }

    /// Every POST it answered, in order: one JSON object each (see the
    /// script).
    pub fn received(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// What it received for subscription `name`.
    pub fn received_by(&self, name: &str) -> Vec<serde_json::Value> {
        self.received()
            .into_iter()
            .filter(|r| r["subscription"] == name)
            .collect()
    }
}

impl Drop for PushEndpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
