//! Core dumps off: the `gateway` and `control-stub serve` processes turn
//! `PR_SET_DUMPABLE` off at start, so no dump can hold a session CA's key
//! or a secret value, and no other process of the same user can read their
//! memory or environment through `/proc`.
//!
//! The check is what a same-user attacker would do: open `/proc/PID/mem`
//! and read `/proc/PID/environ`. An ordinary process of that user is
//! started beside them and must stay readable (so the test fails if the
//! reads are refused for some other reason). Root bypasses these checks
//! (`CAP_SYS_PTRACE`), so a test run as root starts every process as an
//! unprivileged uid with `setpriv`; run as any other user, the processes
//! run as that user and no uid change is needed.
//!
//! So the test starts its processes by hand, not on the shared rig
//! (`talos_e2e::rig`): each must run as the user the probes run as
//! (through `setpriv` when the test is root), from a copy of its binary
//! that user may execute, with the marker in its environment. The rig
//! starts the workspace's own binaries as the test's user, which as root
//! would pass every probe (`CAP_SYS_PTRACE`) and prove nothing.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use talos_e2e::gateway::{workspace_bin, TestConfig, TestSession};

/// The uid and gid the processes run as when the test runs as root: one
/// no account uses, so nothing else on the machine shares its processes.
const TEST_UID: u32 = 61_873;

/// A marker in each process's environment: readable in the ordinary
/// process's `/proc/PID/environ`, never in the non-dumpable ones'.
const MARKER: &str = "TALOS_DUMPABLE_MARKER=visible-only-if-dumpable";

/// The effective uid of this test, from `/proc/self/status`.
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("effective uid in /proc/self/status")
}

/// Runs commands as the unprivileged user of the test.
struct User {
    /// `Some(uid)` when the test runs as root and drops to `uid`.
    drop_to: Option<u32>,
}

impl User {
    fn new() -> User {
        User {
            drop_to: (euid() == 0).then_some(TEST_UID),
        }
    }

    /// `program args` as the user, with [`MARKER`] in its environment.
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let (name, value) = MARKER.split_once('=').expect("marker");
        let mut cmd = match self.drop_to {
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args).env(name, value);
        cmd
    }

    /// Give `path` to the user (the test made it as root).
    fn own(&self, path: &Path) {
        if let Some(uid) = self.drop_to {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
        }
    }

    /// Whether the user can open `/proc/{pid}/{file}` for reading, and
    /// what it read: `cat` for `environ`; `dd … count=0` for `mem`, which
    /// only opens it (reading at offset 0 fails for any process).
    fn probe(&self, pid: u32, file: &str) -> Result<String, String> {
        let path = format!("/proc/{pid}/{file}");
        let out = if file == "mem" {
            let input = format!("if={path}");
            self.command(Path::new("dd"), &[&input, "of=/dev/null", "count=0"])
                .output()
        } else {
            self.command(Path::new("cat"), &[&path]).output()
        }
        .expect("run the probe");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).replace('\0', "\n"))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// A process stopped by its PID when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

/// Start `cmd` and read its JSON ready line (the first line on standard
/// output); the log is `log`.
fn start(mut cmd: Command, log: &Path) -> (Proc, serde_json::Value) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    let proc = Proc(child);
    let ready = serde_json::from_str(&line).unwrap_or_else(|_| {
        panic!(
            "did not start: {line:?}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    });
    (proc, ready)
}

/// A copy of a workspace binary in `dir`, so that an unprivileged user
/// can run it whatever the modes of the folders above the build.
fn copy_bin(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(workspace_bin(name), &to).expect("copy binary");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    to
}

/// The user's reads of an ordinary process succeed and of `pid` fail.
fn assert_not_dumpable(user: &User, what: &str, pid: u32, ordinary: u32) {
    let environ = user
        .probe(ordinary, "environ")
        .expect("an ordinary process's environ is readable by its user");
    assert!(
        environ.lines().any(|l| l == MARKER),
        "the ordinary process's environ lacks the marker: {environ:?}"
    );
    user.probe(ordinary, "mem")
        .expect("an ordinary process's mem opens for its user");
    // What was read is not printed: it is the process's environment.
    let got = user.probe(pid, "environ");
    assert!(
        got.as_ref().is_err_and(|e| e.contains("Permission denied")),
        "{what}'s environ was readable ({:?})",
        got.map(|env| format!("{} bytes", env.len()))
    );
    let got = user.probe(pid, "mem");
    assert!(
        got.as_ref().is_err_and(|e| e.contains("Permission denied")),
        "{what}'s mem opened: {got:?}"
    );
}

#[test]
fn gateway_and_control_stub_are_not_dumpable() {
    let user = User::new();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    user.own(dir);
    let gateway = copy_bin("gateway", dir);
    let stub = copy_bin("control-stub", dir);

    // An ordinary process of the same user: the control.
    let sleeper = Proc(
        user.command(Path::new("sleep"), &["120"])
            .spawn()
            .expect("spawn sleep"),
    );
    let ordinary = sleeper.0.id();

    // The gateway with one static session: a CA key in its memory.
    let config = TestConfig {
        sessions: vec![TestSession {
            id: "sess-1".into(),
            sources: vec!["127.0.0.2".into()],
            allowlist: vec!["allowed.test".into()],
            trust_file: dir.join("session-ca.pem"),
            ..Default::default()
        }],
        ..Default::default()
    }
    .toml(dir);
    let config_path = dir.join("gateway.toml");
    std::fs::write(&config_path, config).expect("write config");
    user.own(&config_path);
    let (gw, _) = start(
        user.command(
            &gateway,
            &["run", "--config", config_path.to_str().unwrap()],
        ),
        &dir.join("gateway.log"),
    );
    assert!(
        std::fs::read_to_string(dir.join("session-ca.pem")).is_ok_and(|p| p.contains("BEGIN")),
        "the gateway made the session's CA"
    );
    assert_not_dumpable(&user, "gateway", gw.0.id(), ordinary);

    // control-stub serve with its identities (made by `init`).
    let control = dir.join("control");
    let init = user
        .command(
            &stub,
            &[
                "init",
                "--dir",
                control.to_str().unwrap(),
                "--gateway",
                "gw-a",
            ],
        )
        .output()
        .expect("control-stub init");
    assert!(
        init.status.success(),
        "init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let db = dir.join("stub.db");
    let (serve, ready) = start(
        user.command(
            &stub,
            &[
                "--db",
                db.to_str().unwrap(),
                "--control-dir",
                control.to_str().unwrap(),
                "serve",
                "--listen",
                "127.0.0.1:0",
            ],
        ),
        &dir.join("serve.log"),
    );
    assert!(
        ready["listening"].is_string(),
        "serve's ready line: {ready}"
    );
    assert_not_dumpable(&user, "control-stub serve", serve.0.id(), ordinary);

    // Neither logged a failure to turn dumps off.
    drop((gw, serve));
    for log in ["gateway.log", "serve.log"] {
        let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        assert!(
            !text.contains("cannot turn core dumps off"),
            "{log}: {text}"
        );
    }
}
