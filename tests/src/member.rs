//! A member started as an operator starts it and followed across
//! handovers: `gateway run` with its standard output in a file (so the
//! ready line of every process a handover starts is there, and none writes
//! to a closed pipe), `gateway reload` and `gateway upgrade` as scripts
//! run them, and every process a ready line names stopped by its PID.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::clients::run_bounded;
use crate::gateway::workspace_bin;
use crate::wait;

/// A member started as an operator starts it, followed across handovers:
/// every process's ready line (they share standard output) and log.
#[derive(Debug)]
pub struct Member {
    pub dir: PathBuf,
    pub config_path: PathBuf,
    out_path: PathBuf,
    log_path: PathBuf,
    first: Option<Child>,
    /// Every process id a ready line named: each is stopped at the end.
    pub pids: Vec<u32>,
}

impl Member {
    /// Start `gateway run` with `config` (TOML text) written to
    /// `dir/gateway.toml`; returns once its ready line is out.
    pub fn start(dir: &Path, config: &str) -> Member {
        let config_path = dir.join("gateway.toml");
        std::fs::write(&config_path, config).expect("config");
        let out_path = dir.join("gateway.out");
        let log_path = dir.join("gateway.log");
        let child = Command::new(workspace_bin("gateway"))
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", "info,talos_gateway=debug")
            .stdout(std::fs::File::create(&out_path).expect("out"))
            .stderr(std::fs::File::create(&log_path).expect("log"))
            .spawn()
            .expect("spawn gateway");
        let mut m = Member {
            dir: dir.to_owned(),
            config_path,
            out_path,
            log_path,
            pids: vec![child.id()],
            first: Some(child),
        };
        m.wait_ready(1);
        m
    }

    /// The ready lines so far (one per process).
    pub fn ready_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Wait for the `n`th ready line; returns it.
    pub fn wait_ready(&mut self, n: usize) -> serde_json::Value {
        let log = self.log_path.clone();
        let lines = wait::until(&format!("ready line {n}"), || {
            let lines = self.ready_lines();
            if lines.len() >= n {
                Ok(lines)
            } else {
                Err(std::fs::read_to_string(&log).unwrap_or_default())
            }
        });
        let line = lines[n - 1].clone();
        if let Some(pid) = line["pid"].as_u64() {
            let pid = u32::try_from(pid).expect("pid");
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
        }
        line
    }

    /// The process serving now: the one the last ready line names.
    pub fn pid(&self) -> u32 {
        self.ready_lines()
            .last()
            .and_then(|l| l["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0)
    }

    /// The control listener (the member's config has a `[control]` table).
    pub fn control(&self) -> std::net::SocketAddr {
        self.ready_lines()[0]["control"]
            .as_str()
            .expect("control")
            .parse()
            .expect("addr")
    }

    /// The data listener (the same across handovers).
    pub fn data(&self) -> std::net::SocketAddr {
        self.ready_lines()[0]["data"]
            .as_str()
            .expect("data")
            .parse()
            .expect("addr")
    }

    /// The admin listener (the same across handovers).
    pub fn admin(&self) -> std::net::SocketAddr {
        self.ready_lines()[0]["admin"]
            .as_str()
            .expect("admin")
            .parse()
            .expect("addr")
    }

    /// Every process's log so far (they share standard error).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// `gateway reload` or `gateway upgrade`: (exit status, stdout, stderr).
    pub fn command(&self, what: &str) -> (bool, String, String) {
        self.command_with(what, &self.config_path)
    }

    /// `gateway reload` or `gateway upgrade` given `config` as its
    /// `--config`: (exit status, stdout, stderr).
    pub fn command_with(&self, what: &str, config: &Path) -> (bool, String, String) {
        let out = run_bounded(
            workspace_bin("gateway").to_str().expect("path"),
            &[what, "--config", config.to_str().expect("path")],
            None,
            120,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Replace the config file (atomically, as an editor's save does).
    pub fn rewrite(&self, config: &str) {
        let tmp = self.dir.join("gateway.toml.new");
        let mut f = std::fs::File::create(&tmp).expect("config");
        f.write_all(config.as_bytes()).expect("write");
        f.sync_all().expect("sync");
        std::fs::rename(&tmp, &self.config_path).expect("rename");
    }

    /// `/readyz`'s body.
    pub fn readyz(&self) -> String {
        let out = run_bounded(
            "curl",
            &[
                "-s",
                "--max-time",
                "10",
                &format!("http://{}/readyz", self.admin()),
            ],
            None,
            20,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `/metrics`' body.
    pub fn metrics(&self) -> String {
        let out = run_bounded(
            "curl",
            &[
                "-s",
                "--max-time",
                "10",
                &format!("http://{}/metrics", self.admin()),
            ],
            None,
            20,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The value of `series` (name and labels) in `/metrics`.
    pub fn metric(&self, series: &str) -> Option<f64> {
        crate::clients::metric_value(&self.metrics(), series)
    }
}

/// Whether process `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by its parent) is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// Every running process of the `gateway` binary started with `--config
/// config`: the processes a member's handovers spawned, whether or not
/// they got as far as a ready line (a successor refused, killed or still
/// starting names none).
pub fn processes_of(config: &Path) -> Vec<u32> {
    let bin = workspace_bin("gateway");
    let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        let exe = exe.to_string_lossy();
        if exe.trim_end_matches(" (deleted)") != bin.to_string_lossy() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let named = args.windows(2).any(|w| {
            w[0] == b"--config" && Path::new(std::str::from_utf8(w[1]).unwrap_or("")) == config
        });
        if named && alive(pid) {
            out.push(pid);
        }
    }
    out
}

impl Drop for Member {
    fn drop(&mut self) {
        // The processes the ready lines named, and any other this member's
        // handovers started (its config path is on their command line).
        for pid in processes_of(&self.config_path) {
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
        }
        for &pid in &self.pids {
            if alive(pid) {
                signal(pid, "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // One spawned while the others stopped is stopped too.
        for pid in processes_of(&self.config_path) {
            if !self.pids.contains(&pid) {
                self.pids.push(pid);
            }
        }
        for &pid in &self.pids {
            if alive(pid) {
                signal(pid, "KILL");
            }
        }
        if let Some(mut c) = self.first.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
