//! A PostgreSQL server of a test's own, as `scripts/postgres.sh` makes
//! one: a temporary folder, 127.0.0.1 only, a password of its own. Stopped
//! (and its postmaster killed by PID if need be) when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The server: its folder and its URL (database `postgres`).
#[derive(Debug)]
pub struct Postgres {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pub url: String,
}

impl Postgres {
    /// Make and start a server.
    pub fn start() -> Postgres {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pg");
        let url = script("start", &dir);
        Postgres {
            _tmp: tmp,
            dir,
            url,
        }
    }

    /// Stop it (fast shutdown: every session of it is cut).
    pub fn stop(&self) {
        script("stop", &self.dir);
    }

    /// Start it again on the same port, with the same data.
    pub fn restart(&self) {
        script("start", &self.dir);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        script("stop", &self.dir);
    }
}

fn script(cmd: &str, dir: &Path) -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/postgres.sh"
    ))
    .arg(cmd)
    .arg(dir)
    .output()
    .expect("run scripts/postgres.sh");
    assert!(
        out.status.success(),
        "scripts/postgres.sh {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
