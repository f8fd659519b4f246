//! The `control-stub` binary, run as operators run it: `init` makes the
//! control channel's identities, `serve` consumes the gateways' batches
//! and serves the people's web app, and every other command is one
//! process that prints JSON.
//!
//! `serve` always runs the web app (`--web-listen`, on a port reserved
//! for it and kept across restarts, its origin
//! `https://people.talos.test:PORT`, a certificate from a CA of the
//! test's own): a Lock rule names only approvers holding a passkey, and
//! [`Stub::approver`] enrols one as a person would, through the web app
//! ([`crate::people`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gateway::{workspace_bin, TestControl};
use crate::people::{Passkey, WebCert, WebClient, RP_ID};

/// What one CLI command did.
#[derive(Debug)]
pub struct Ran {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The operator identity the end-to-end CLI calls record (`TALOS_OPERATOR`).
pub const E2E_OPERATOR: &str = "e2e-operator";

impl Ran {
    /// The command's JSON output; panics with its error if it failed.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.status, 0, "command failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// The error code of a failed command (`error: <code>: …`).
    pub fn code(&self) -> &str {
        assert_ne!(self.status, 0, "command succeeded: {}", self.stdout);
        self.stderr
            .strip_prefix("error: ")
            .and_then(|r| r.split(':').next())
            .unwrap_or("")
    }
}

/// A control stub: its store, its control directory, and its `serve`
/// process when running.
#[derive(Debug)]
pub struct Stub {
    /// `--db`: the SQLite file, or a PostgreSQL database's URL.
    pub db: std::ffi::OsString,
    pub control_dir: PathBuf,
    serve: Option<Child>,
    /// Where `serve` listens (kept across restarts).
    pub serve_addr: Option<SocketAddr>,
    pub serve_log: PathBuf,
    /// The gateways `serve` is given (`--gateway ID=ADDR`), so it can
    /// describe them, renew their leases and ask closes owed again; none
    /// by default. Kept across restarts.
    pub serve_gateways: Vec<(String, SocketAddr)>,
    /// More arguments after `serve --listen ADDR` (`--renew-ms`,
    /// `--tick-ms`…). Kept across restarts.
    pub serve_args: Vec<String>,
    /// The web app's certificate (its CA is the browsers' to trust).
    pub web_cert: Arc<WebCert>,
    /// Where `serve`'s web app listens (reserved; kept across restarts).
    pub web_addr: SocketAddr,
    /// Its origin, `https://people.talos.test:PORT`.
    pub web_origin: String,
    /// The people enrolled with [`Stub::approver`] (every replica's).
    people: Arc<Mutex<BTreeMap<String, Arc<Passkey>>>>,
}

impl Stub {
    /// `control-stub init` into `dir/control` with certificates for
    /// `gateway_ids`; the store at `dir/stub.db`.
    pub fn init(dir: &Path, gateway_ids: &[&str]) -> Stub {
        let control_dir = dir.join("control");
        let mut args = vec!["init".to_owned(), "--dir".into(), path(&control_dir)];
        for id in gateway_ids {
            args.push("--gateway".into());
            args.push((*id).to_owned());
        }
        let out = Command::new(workspace_bin("control-stub"))
            .args(&args)
            .output()
            .expect("run control-stub init");
        assert!(
            out.status.success(),
            "init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let web_addr = crate::ports::reserve();
        Stub {
            db: dir.join("stub.db").into_os_string(),
            control_dir,
            serve: None,
            serve_addr: None,
            serve_log: dir.join("stub-serve.log"),
            serve_gateways: Vec::new(),
            serve_args: Vec::new(),
            web_cert: Arc::new(WebCert::new(dir)),
            web_origin: format!("https://{RP_ID}:{}", web_addr.port()),
            web_addr,
            people: Arc::default(),
        }
    }

    /// A client of this `serve`'s web app, as the app's own pages reach
    /// it.
    pub fn web_client(&self) -> WebClient {
        WebClient::new(self.web_addr, &self.web_cert.ca_pem, &self.web_origin)
    }

    /// The one-time enrolment link `people enroll NAME --role ROLE`
    /// prints, for the web app's origin.
    pub fn enroll_link(&self, name: &str, role: &str) -> String {
        let printed = self
            .run(
                &[],
                &[
                    "people",
                    "enroll",
                    name,
                    "--role",
                    role,
                    "--web-origin",
                    &self.web_origin,
                ],
                b"",
            )
            .json();
        printed["link"]
            .as_str()
            .expect("an enrolment link")
            .to_owned()
    }

    /// Person `name`'s passkey, enrolling them first if they hold none
    /// here: `people enroll NAME --role ROLE` prints the link, and a
    /// software passkey is created with it on the web app, as a person's
    /// browser would (`serve` must be running).
    pub fn person(&self, name: &str, role: &str) -> Arc<Passkey> {
        if let Some(p) = self.people.lock().expect("people").get(name) {
            return p.clone();
        }
        let link = self.enroll_link(name, role);
        let mut client = self.web_client();
        let passkey = Arc::new(crate::rig::blocking(|| client.enrol(&link)));
        self.people
            .lock()
            .expect("people")
            .insert(name.to_owned(), passkey.clone());
        passkey
    }

    /// [`Stub::person`] as an approver.
    pub fn approver(&self, name: &str) -> Arc<Passkey> {
        self.person(name, "approver")
    }

    /// The `[control]` files of gateway `id`, its signing key in `dir`.
    pub fn gateway_files(&self, id: &str, dir: &Path) -> TestControl {
        TestControl {
            ca_file: self.control_dir.join("ca.pem"),
            cert_file: self.control_dir.join(format!("{id}.pem")),
            key_file: self.control_dir.join(format!("{id}.key")),
            signing_key_file: dir.join(format!("{id}-signing.key")),
            listen: String::new(),
            extra: String::new(),
        }
    }

    /// Run one command with `gateways` as `--gateway ID=ADDR` and `stdin`.
    pub fn run(&self, gateways: &[(String, SocketAddr)], args: &[&str], stdin: &[u8]) -> Ran {
        let mut cmd = Command::new("timeout");
        cmd.arg("-k")
            .arg("2")
            .arg("60")
            .arg(workspace_bin("control-stub"))
            .arg("--db")
            .arg(&self.db)
            .arg("--control-dir")
            .arg(&self.control_dir)
            // Who asks, as the commands record it.
            .env("TALOS_OPERATOR", E2E_OPERATOR);
        for (id, addr) in gateways {
            cmd.arg("--gateway").arg(format!("{id}={addr}"));
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run control-stub");
        {
            let mut pipe = child.stdin.take().expect("stdin");
            // A command that does not read its input closes the pipe early.
            let _ = pipe.write_all(stdin);
        }
        let out = child.wait_with_output().expect("wait control-stub");
        Ran {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Start `serve` (on the address it had before, or a free port).
    pub fn start_serve(&mut self) -> SocketAddr {
        assert!(self.serve.is_none(), "serve is running");
        let listen = self
            .serve_addr
            .map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.serve_log)
            .expect("serve log");
        let mut cmd = Command::new(workspace_bin("control-stub"));
        cmd.arg("--db")
            .arg(&self.db)
            .arg("--control-dir")
            .arg(&self.control_dir);
        for (id, addr) in &self.serve_gateways {
            cmd.arg("--gateway").arg(format!("{id}={addr}"));
        }
        let mut child = cmd
            .arg("serve")
            .arg("--listen")
            .arg(&listen)
            .arg("--web-listen")
            .arg(self.web_addr.to_string())
            .arg("--web-origin")
            .arg(&self.web_origin)
            .arg("--web-cert")
            .arg(&self.web_cert.cert)
            .arg("--web-key")
            .arg(&self.web_cert.key)
            .args(&self.serve_args)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn control-stub serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("serve ready line");
        let ready: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!(
                "serve did not start: {line:?}; log:\n{}",
                std::fs::read_to_string(&self.serve_log).unwrap_or_default()
            )
        });
        let addr: SocketAddr = ready["listening"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("listening address");
        self.serve_addr = Some(addr);
        self.serve = Some(child);
        addr
    }

    /// Another `serve` over the same store and control identity (a
    /// replica), with the same arguments, logging to `<name>-serve.log`
    /// beside this one's; not started.
    pub fn replica(&self, name: &str) -> Stub {
        let web_addr = crate::ports::reserve();
        Stub {
            db: self.db.clone(),
            control_dir: self.control_dir.clone(),
            serve: None,
            serve_addr: None,
            serve_log: self.serve_log.with_file_name(format!("{name}-serve.log")),
            serve_gateways: self.serve_gateways.clone(),
            serve_args: self.serve_args.clone(),
            web_cert: self.web_cert.clone(),
            web_origin: format!("https://{RP_ID}:{}", web_addr.port()),
            web_addr,
            people: self.people.clone(),
        }
    }

    /// Kill `serve` at once (SIGKILL): an outage, not a shutdown.
    pub fn kill_serve(&mut self) {
        if let Some(mut child) = self.serve.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop `serve` as an operator does (SIGTERM) and wait, at most 15 s,
    /// for it to exit; returns whether it exited with status 0.
    pub fn stop_serve(&mut self) -> bool {
        let Some(mut child) = self.serve.take() else {
            return false;
        };
        crate::signals::send(child.id(), crate::signals::Signal::Term);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Wait (at most [`crate::wait::DEADLINE`]) for `serve` to exit by
    /// itself — after a signal the test sent it — and reap it; its exit
    /// status. Panics, with its log, if it is still running then (it is
    /// killed first).
    pub fn wait_serve_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.serve.take().expect("serve was started");
        let deadline = Instant::now() + crate::wait::DEADLINE;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "serve did not exit within {} s; log:\n{}",
            crate::wait::DEADLINE.as_secs(),
            self.serve_log()
        );
    }

    /// The process id of `serve`, while it runs.
    pub fn serve_pid(&self) -> Option<u32> {
        self.serve.as_ref().map(Child::id)
    }

    /// The exit status of `serve`, if it has exited (reaped here); `None`
    /// while it runs or when it was not started.
    pub fn serve_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.serve
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The `serve` log so far.
    pub fn serve_log(&self) -> String {
        std::fs::read_to_string(&self.serve_log).unwrap_or_default()
    }

    /// Wait (at most `secs`) until `done` holds for the session's
    /// certificate JSON (printed even while it is not issued).
    pub fn wait_certificate(
        &self,
        id: &str,
        secs: u64,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let ran = self.run(&[], &["certificate", id], b"");
            let cert: serde_json::Value =
                serde_json::from_str(&ran.stdout).unwrap_or(serde_json::Value::Null);
            if done(&cert) || Instant::now() > deadline {
                return cert;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.kill_serve();
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The drop reports in a `sandbox status` from member `gateway` for
/// `attempt`.
pub fn reports_from<'s>(
    status: &'s serde_json::Value,
    gateway: &str,
    attempt: u64,
) -> Vec<&'s serde_json::Value> {
    status["drop_reports"]
        .as_array()
        .expect("drop reports")
        .iter()
        .filter(|r| r["gateway_id"] == gateway && r["attempt"] == attempt)
        .collect()
}

/// The closes in a `sandbox status` asked of member `gateway`.
pub fn closes_of<'s>(status: &'s serde_json::Value, gateway: &str) -> Vec<&'s serde_json::Value> {
    status["closes"]
        .as_array()
        .expect("closes")
        .iter()
        .filter(|c| c["gateway_id"] == gateway)
        .collect()
}

/// A certificate's records of session connections on member `gateway`.
pub fn cert_records<'c>(cert: &'c serde_json::Value, gateway: &str) -> Vec<&'c serde_json::Value> {
    cert["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| c["gateway_id"] == gateway)
        .collect()
}

/// SQLite's write lock on a `serve` store, taken by a writer of the test's
/// own (`BEGIN IMMEDIATE`, waiting at most [`crate::wait::DEADLINE`] for
/// it) and held until [`StoreWriteLock::release`]: meanwhile no other
/// process's write transaction is under way, and every write of `serve`
/// waits.
#[derive(Debug)]
pub struct StoreWriteLock(rusqlite::Connection);

impl StoreWriteLock {
    pub fn hold(db: &Path) -> StoreWriteLock {
        let conn = rusqlite::Connection::open(db).expect("open the store");
        conn.busy_timeout(crate::wait::DEADLINE)
            .expect("busy timeout");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        StoreWriteLock(conn)
    }

    /// Let go, writing nothing.
    pub fn release(self) {
        self.0
            .execute_batch("ROLLBACK")
            .expect("let go of the lock");
    }
}

/// The independent verifier (`verifier/verify_bundle.py`, Python 3 and its
/// `cryptography` package) run on `bundle`, at most two minutes: its exit
/// status and everything it printed.
pub fn verify_bundle(bundle: &Path) -> (i32, String) {
    let verifier = Path::new(env!("CARGO_MANIFEST_DIR")).join("../verifier/verify_bundle.py");
    let out = Command::new("timeout")
        .args(["-k", "2", "120", "python3"])
        .arg(verifier)
        .arg(bundle)
        .output()
        .expect("run the verifier");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}
