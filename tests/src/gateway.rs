//! The `gateway` binary, started as operators start it: a config file,
//! `gateway run --config FILE`, the ready line on standard output.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of a binary built from this workspace (`gateway`, later others).
///
/// Tests run from `target/<profile>/deps/`; the binaries sit one folder
/// up. `scripts/test.sh` builds them before the tests run.
pub fn workspace_bin(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!(
        "TALOS_{}_BIN",
        name.to_ascii_uppercase().replace('-', "_")
    )) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins), as scripts/test.sh does",
        bin.display()
    );
    bin
}

/// A running gateway; sent SIGTERM and reaped when dropped.
#[derive(Debug)]
pub struct Gateway {
    child: Option<Child>,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    /// The control listener, when the config has a `[control]` table.
    pub control: Option<SocketAddr>,
    /// The sessions' DNS answerer (UDP and TCP), with a `[dns]` table.
    pub answerer: Option<SocketAddr>,
    /// The runtime workers the ready line reports.
    pub workers: usize,
    pub records_path: PathBuf,
    pub log_path: PathBuf,
}

impl Gateway {
    /// Start `gateway run` with `config` (TOML text) written into `dir`.
    /// The config's `[records] path` must be `dir/records.jsonl`; use
    /// [`records_path`] to build it.
    pub fn start(dir: &Path, config: &str) -> Gateway {
        let config_path = dir.join("gateway.toml");
        std::fs::write(&config_path, config).expect("write config");
        let log_path = dir.join("gateway.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut child = Command::new(workspace_bin("gateway"))
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            // Benchmarks over the rig (`pair-bench`, in benches/harness) log less: a debug log
            // of every frame would be most of what they measure.
            .env(
                "RUST_LOG",
                std::env::var("TALOS_GATEWAY_LOG")
                    .unwrap_or_else(|_| "debug,hickory_proto=info,hickory_resolver=info".into()),
            )
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn gateway");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ready line");
        let ready: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("gateway did not start; stdout {line:?}; log:\n{log}")
        });
        let addr = |k: &str| {
            ready[k]
                .as_str()
                .expect("addr")
                .parse()
                .expect("socket addr")
        };
        Gateway {
            data: addr("data"),
            admin: addr("admin"),
            control: ready["control"]
                .as_str()
                .map(|a| a.parse().expect("socket addr")),
            answerer: ready["dns"]
                .as_str()
                .map(|a| a.parse().expect("socket addr")),
            workers: ready["workers"]
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .expect("workers in the ready line"),
            child: Some(child),
            records_path: records_path(dir),
            log_path,
        }
    }

    /// Every record written so far.
    pub fn records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.records_path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("record is JSON"))
            .collect()
    }

    /// The records written so far of session `id`.
    pub fn session_records(&self, id: &str) -> Vec<serde_json::Value> {
        self.records()
            .into_iter()
            .filter(|r| r["session_id"] == id)
            .collect()
    }

    /// Wait (up to [`crate::wait::DEADLINE`]) until at least `n` records
    /// are written; returns what there is then, for the caller to check.
    pub fn wait_records(&self, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + crate::wait::DEADLINE;
        loop {
            let r = self.records();
            if r.len() >= n || Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The gateway's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Send SIGTERM and wait (up to 15 s) for a clean exit; returns whether
    /// it exited with status 0. A stopped process (SIGSTOP) is woken
    /// after the SIGTERM, so it drains rather than waits out the bound.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        for sig in ["-TERM", "-CONT"] {
            let _ = Command::new("kill")
                .arg(sig)
                .arg(child.id().to_string())
                .status();
        }
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
}

impl Gateway {
    /// Send `signal` to the gateway process.
    pub fn signal(&self, signal: crate::signals::Signal) {
        crate::signals::send(self.pid(), signal);
    }

    /// SIGKILL, and reap the process: a crash, nothing drained.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::signals::send(child.id(), crate::signals::Signal::Kill);
            let _ = child.wait();
        }
    }

    /// The exit status, if the process has exited (reaped here); `None`
    /// while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where [`Gateway::start`] expects the record file for `dir`.
pub fn records_path(dir: &Path) -> PathBuf {
    dir.join("records.jsonl")
}

/// A gateway config for tests, written as TOML.
#[derive(Debug, Clone)]
pub struct TestConfig {
    /// `gateway_id` (default `gw-test`).
    pub gateway_id: String,
    pub dns: SocketAddr,
    pub upstream_port: u16,
    /// Extra trust anchors (the test origins' CAs).
    pub anchors: Vec<PathBuf>,
    /// Internal blocks let through (the test origins' loopback addresses).
    pub permit_internal: Vec<String>,
    pub sessions: Vec<TestSession>,
    /// More TOML appended to the `[limits]` table.
    pub limits: String,
    /// Secrets by name, each read from a file.
    pub secrets: Vec<(String, PathBuf)>,
    /// The `[control]` table, if any (listening on 127.0.0.1:0).
    pub control: Option<TestControl>,
    /// `runtime.workers`; by default `TALOS_TEST_WORKERS` if set, else
    /// unset (one per CPU). `scripts/test.sh` runs the end-to-end tests a
    /// second time with `TALOS_TEST_WORKERS=1`: the single-threaded
    /// scheduler the benchmarks use.
    pub workers: Option<usize>,
    /// `resolver.timeout_ms` (default 2000).
    pub resolver_timeout_ms: u64,
    /// `upstream.connect_timeout_ms` and `limits.hello_timeout_ms`: short
    /// in tests (5000, 2000); `None` leaves the gateway's defaults (the
    /// benchmarks' configs, `benches/harness/src/bin/bench-figures.rs`).
    pub connect_timeout_ms: Option<u64>,
    pub hello_timeout_ms: Option<u64>,
    /// Every session's tenant (default `acme`).
    pub tenant: String,
    /// The `[process] socket` (`gateway reload` and `gateway upgrade` reach
    /// the running process through it); none by default.
    pub process_socket: Option<PathBuf>,
    /// The `[pair]` table's lines (the member link), if any.
    pub pair: String,
    /// The `[dns]` table's lines (the sessions' DNS answerer), if any.
    pub answerer: String,
}

/// `TALOS_TEST_WORKERS`, if set.
///
/// # Panics
/// If it is set and not a number: a test run must not quietly test
/// something else than asked.
pub fn test_workers() -> Option<usize> {
    let v = std::env::var("TALOS_TEST_WORKERS").ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("TALOS_TEST_WORKERS={v:?} is not a number")),
    )
}

/// The files of a `[control]` table.
#[derive(Debug, Clone)]
pub struct TestControl {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub signing_key_file: PathBuf,
    /// The control listener's address (`127.0.0.1:0` when empty).
    pub listen: String,
    /// More TOML lines for the `[control]` table (`plane`, `spool_dir`…).
    pub extra: String,
}

impl Default for TestConfig {
    fn default() -> Self {
        TestConfig {
            gateway_id: "gw-test".into(),
            dns: SocketAddr::from(([127, 0, 0, 1], 53)),
            upstream_port: 443,
            anchors: Vec::new(),
            permit_internal: Vec::new(),
            sessions: Vec::new(),
            limits: String::new(),
            secrets: Vec::new(),
            control: None,
            workers: test_workers(),
            // Room for a loaded machine: a slow but healthy peer must not
            // miss a deadline (the tests that hit one on purpose still do).
            resolver_timeout_ms: 2000,
            connect_timeout_ms: Some(5000),
            hello_timeout_ms: Some(2000),
            tenant: "acme".into(),
            process_socket: None,
            pair: String::new(),
            answerer: String::new(),
        }
    }
}

/// One static session of a [`TestConfig`].
#[derive(Debug, Clone, Default)]
pub struct TestSession {
    pub id: String,
    pub sources: Vec<String>,
    pub allowlist: Vec<String>,
    /// Where the gateway writes the session CA (PEM).
    pub trust_file: PathBuf,
    /// `SECRET=destination:header[:scheme]` attachments.
    pub attach: Vec<String>,
    /// Names of the allowlist passed on without termination.
    pub passthrough: Vec<String>,
}

impl TestConfig {
    /// The TOML text, records in `dir` (see [`records_path`]).
    pub fn toml(&self, dir: &Path) -> String {
        self.toml_with_records(&records_path(dir))
    }

    /// The TOML text with records written to `records`: the one writer of
    /// the gateway's config for the tests and the bench scripts.
    pub fn toml_with_records(&self, records: &Path) -> String {
        let quoted = |v: &[String]| {
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let paths = |v: &[PathBuf]| {
            v.iter()
                .map(|p| format!("{:?}", p.display().to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = format!(
            r#"gateway_id = {id:?}
[listen]
data = "127.0.0.1:0"
admin = "127.0.0.1:0"
[records]
path = {records:?}
[resolver]
nameservers = ["{dns}"]
timeout_ms = {resolver_timeout}
attempts = 1
permit_internal = [{permit}]
[upstream]
port = {port}
{connect_timeout}extra_trust_anchors = [{anchors}]
[limits]
{hello_timeout}{limits}
"#,
            id = self.gateway_id,
            records = records.display().to_string(),
            dns = self.dns,
            resolver_timeout = self.resolver_timeout_ms,
            connect_timeout = self
                .connect_timeout_ms
                .map_or(String::new(), |ms| format!("connect_timeout_ms = {ms}\n")),
            hello_timeout = self
                .hello_timeout_ms
                .map_or(String::new(), |ms| format!("hello_timeout_ms = {ms}\n")),
            permit = quoted(&self.permit_internal),
            port = self.upstream_port,
            anchors = paths(&self.anchors),
            limits = self.limits,
        );
        if let Some(n) = self.workers {
            out.push_str(&format!("[runtime]\nworkers = {n}\n"));
        }
        for s in &self.sessions {
            out.push_str(&format!(
                "[[session]]\nid = {:?}\ntenant = {:?}\nsources = [{}]\nallowlist = [{}]\ntrust_file = {:?}\nattach = [{}]\n",
                s.id,
                self.tenant,
                quoted(&s.sources),
                quoted(&s.allowlist),
                s.trust_file.display().to_string(),
                quoted(&s.attach),
            ));
            if !s.passthrough.is_empty() {
                out.push_str(&format!("passthrough = [{}]\n", quoted(&s.passthrough)));
            }
        }
        for (name, file) in &self.secrets {
            out.push_str(&format!(
                "[[secret]]\nname = {name:?}\nfile = {:?}\n",
                file.display().to_string()
            ));
        }
        if let Some(c) = &self.control {
            let p = |p: &PathBuf| format!("{:?}", p.display().to_string());
            let listen = if c.listen.is_empty() {
                "127.0.0.1:0"
            } else {
                &c.listen
            };
            out.push_str(&format!(
                "[control]\nlisten = {listen:?}\nca_file = {}\ncert_file = {}\nkey_file = {}\nsigning_key_file = {}\n{}\n",
                p(&c.ca_file),
                p(&c.cert_file),
                p(&c.key_file),
                p(&c.signing_key_file),
                c.extra,
            ));
        }
        if let Some(socket) = &self.process_socket {
            out.push_str(&format!(
                "[process]\nsocket = {:?}\n",
                socket.display().to_string()
            ));
        }
        if !self.pair.is_empty() {
            out.push_str(&format!("[pair]\n{}\n", self.pair));
        }
        if !self.answerer.is_empty() {
            out.push_str(&format!("[dns]\n{}\n", self.answerer));
        }
        out
    }
}

impl Gateway {
    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The gateway's peak resident memory so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// The value of `series` (a metric name, with its labels as the
    /// gateway renders them: `name{label="value"}`) on the admin
    /// listener's `/metrics`; none if it is not there. Every series the
    /// gateway can export is there from the start, counters at 0: check a
    /// value, not a name.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = crate::clients::admin_get(self.admin, "/metrics");
        crate::clients::metric_value(&text, series)
    }
}
