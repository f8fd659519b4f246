//! A real browser for the people-facing tests: Debian's Chromium, headless,
//! driven over the Chrome DevTools Protocol (CDP) on one WebSocket.
//!
//! # Using it
//!
//! ```no_run
//! # async fn demo() -> Result<(), talos_e2e::browser::Error> {
//! use talos_e2e::browser::{site::Site, Browser, Launch, Viewport};
//! use talos_e2e::origin::TestCa;
//!
//! let ca = TestCa::new("people test CA");
//! // HTTPS (TLS 1.3) on 127.0.0.1:0, a leaf for the name from `ca`.
//! let site = Site::start(&ca, "people.talos.test").await.with_demo_pages();
//! let launch = Launch::new().map("people.talos.test").trust(&ca.cert_pem);
//! let browser = Browser::launch(&launch).await?;
//! let mut page = browser.new_page().await?;
//! page.set_viewport(Viewport::PHONE).await?;
//! page.goto(&site.url("/")).await?;
//! page.type_text("#name", "Ada").await?;
//! page.click("#greet").await?; // a tap, on a phone
//! page.wait_until("document.getElementById('greeting').textContent !== ''", "the greeting")
//!     .await?;
//! assert_eq!(page.text("#greeting").await?, "Hello, Ada");
//! page.screenshot(std::path::Path::new("/tmp/greeted.png")).await?;
//! page.axe().await?.assert_no_serious();
//! page.assert_no_problems();
//! # Ok(()) }
//! ```
//!
//! - [`Browser::launch`] starts `/usr/bin/chromium --headless` with a
//!   fresh temporary profile and HOME, the DevTools port the kernel picks
//!   (`--remote-debugging-port=0`, read back from the profile's
//!   `DevToolsActivePort`), and the flags of a closed test network (below).
//!   [`Browser::shared`] hands every test of a test binary the same browser
//!   while any of them holds it.
//! - [`Browser::new_page`] opens a tab in a browser context of its own
//!   (its own cookies, storage and virtual authenticators), attached with
//!   a flat session: [`page::Page`] navigates, evaluates JavaScript, waits
//!   for conditions, clicks, taps and types by CSS selector, emulates a
//!   phone, takes screenshots, reads cookies, and keeps every console
//!   error, uncaught exception and CSP violation for the test to assert on.
//! - [`authenticator`]: a CTAP2.1 platform authenticator inside Chromium
//!   (`WebAuthn.addVirtualAuthenticator`) that verifies the user, whose
//!   credentials and sign counts the test reads, and whose user
//!   verification the test can turn off.
//! - [`axe`]: axe-core, run in the page over CDP; a test fails on any
//!   `serious` or `critical` violation.
//! - [`site`]: a small HTTPS server of the test's own (rustls, TLS 1.3, a
//!   leaf from the test's CA) serving the pages and taking what they post
//!   back.
//! - [`png`]: checks that a screenshot is a whole PNG and reads its size.
//! - [`shots`]: numbered screenshots of checked pages, for the docs; the
//!   entry point is `tests/src/bin/people-screenshots.rs`, run by
//!   `scripts/people-screenshots.sh OUT_DIR`.
//!
//! # What it guarantees
//!
//! - **Nothing left running.** Chromium is its own process group: its
//!   zygotes, renderers, GPU and network processes stay in it. Its crash
//!   handlers (Crashpad) start sessions of their own, outside the group,
//!   but their command lines name the browser's folder (their database is
//!   in its HOME), and that is how they are found. (Turning Crashpad off
//!   is no way out: with `--disable-crashpad-for-testing` Chromium 156's
//!   network service crashes on "FD ownership violation" at its first
//!   request.) Dropping the [`Browser`] asks it to close, SIGKILLs the
//!   group after a bounded grace, reaps it, SIGKILLs by PID any process
//!   still naming its folder, and waits (bounded) until none of them is
//!   alive; [`Browser::stop`] returns any it still found then. The
//!   folder's name carries a tag of this checkout, so that
//!   `scripts/check-leftovers.sh` finds any browser process a test left
//!   behind (and only this checkout's).
//! - **Only the test's names, only loopback.** `--host-resolver-rules`
//!   maps each name given to [`Launch::map`] to 127.0.0.1 and every other
//!   name (IP literals included) to "not found", so the browser reaches no
//!   other address; background networking, component updates, sync, QUIC
//!   and any system proxy are off.
//! - **Real trust.** The test's CA is added to an NSS database in the
//!   browser's own HOME (`certutil -A -t C,,`), as a person's browser
//!   trusts a CA: no `--ignore-certificate-errors`, so WebAuthn (which
//!   refuses an origin with a certificate error) runs as it would for
//!   people, and an origin whose certificate chains to another CA is
//!   refused ([`Error::Navigation`], `net::ERR_CERT_AUTHORITY_INVALID`).
//! - **Every wait is bounded** ([`LIMIT`] unless the call takes a limit)
//!   and waits on a DevTools event where there is one (the load event of
//!   the navigation's own loader, a WebAuthn credential added); a JS
//!   condition is polled inside the page. An error says what was awaited
//!   ([`Error`]).
//! - **No passkey material or cookie value in any output.** The virtual
//!   authenticator's private keys are removed from every `WebAuthn.*`
//!   reply and event as it is read, and a cookie's value is a
//!   [`page::CookieValue`] whose `Debug` prints only its length.
//!
//! # Needs
//!
//! Debian's `chromium` and `libnss3-tools` (`certutil`), installed by
//! `scripts/install-ops-tools.sh`; axe-core from the npm registry, pinned,
//! in `.tools/axe-core/` by the same script.

pub mod authenticator;
pub mod axe;
mod cdp;
pub mod page;
pub mod png;
pub mod shots;
pub mod site;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

pub use cdp::{Event, Events};
pub use page::{Page, Viewport};

/// How long any single wait of the driver lasts before it fails: a command's
/// reply, a page load, a condition, Chromium's start. Generous for a loaded
/// two-core machine; a wait that succeeds returns as soon as it can.
pub const LIMIT: Duration = crate::wait::DEADLINE;

/// How long a closing browser is given to exit on its own (`Browser.close`)
/// before its process group is killed.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// How long, after the kill, the group's processes are given to be gone
/// (the kernel tears a renderer down in milliseconds; this is the bound).
const GONE_LIMIT: Duration = Duration::from_secs(10);

/// How often a process table or a file with no event to wait on is read.
const POLL: Duration = Duration::from_millis(20);

/// Debian's Chromium launcher (it `exec`s `/usr/lib/chromium/chromium`, so
/// the PID the test holds is the browser's).
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Why a browser operation failed. Errors say what was awaited or asked.
#[derive(Debug)]
pub enum Error {
    /// Chromium could not be started or reached.
    Launch(String),
    /// A bounded wait ran out.
    Timeout { awaited: String, after: Duration },
    /// The DevTools socket closed (the browser is gone).
    Closed { awaited: String },
    /// Chromium answered a command with an error.
    Protocol {
        method: String,
        code: i64,
        message: String,
        data: Option<String>,
    },
    /// The page's JavaScript threw (or a promise it returned rejected).
    Script { what: String, exception: String },
    /// A navigation failed (`net::ERR_…`, as Chromium names it).
    Navigation { url: String, error: String },
    /// Anything else the page did not do as asked.
    Page(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Launch(m) => write!(f, "browser launch: {m}"),
            Error::Timeout { awaited, after } => {
                write!(f, "waited {} s for {awaited}", after.as_secs_f64())
            }
            Error::Closed { awaited } => {
                write!(
                    f,
                    "the browser's DevTools socket closed while waiting for {awaited}"
                )
            }
            Error::Protocol {
                method,
                code,
                message,
                data,
            } => {
                write!(f, "{method} failed: {message} ({code})")?;
                if let Some(d) = data {
                    write!(f, ": {d}")?;
                }
                Ok(())
            }
            Error::Script { what, exception } => write!(f, "{what} threw: {exception}"),
            Error::Navigation { url, error } => write!(f, "navigation to {url} failed: {error}"),
            Error::Page(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// What a page reported that a working page never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// `console.error(…)` or a failed `console.assert(…)`.
    ConsoleError,
    /// An exception (or rejected promise) nobody caught.
    Exception,
    /// Something the Content-Security-Policy refused.
    CspViolation,
    /// Another error the browser logged for the page (a resource that
    /// failed to load, a mixed-content block, …).
    LogError,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::ConsoleError => "console_error",
            ProblemKind::Exception => "exception",
            ProblemKind::CspViolation => "csp_violation",
            ProblemKind::LogError => "log_error",
        }
    }
}

/// One problem a page reported, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub text: String,
    /// The script or document it names (empty if none).
    pub url: String,
    /// 0-based line in `url`, when given.
    pub line: Option<u64>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.text)?;
        if !self.url.is_empty() {
            write!(f, " ({}", self.url)?;
            if let Some(l) = self.line {
                write!(f, ":{}", l + 1)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// How a browser is started: the names it may reach and the CAs it trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    names: Vec<String>,
    trusted: Vec<String>,
}

impl Launch {
    /// A browser that reaches no name and trusts no test CA.
    pub fn new() -> Launch {
        Launch::default()
    }

    /// Map `name` (a DNS name, e.g. the relying party's
    /// `people.talos.test`) to 127.0.0.1; any port.
    pub fn map(mut self, name: &str) -> Launch {
        self.names.push(name.to_ascii_lowercase());
        self
    }

    /// Trust the CA whose certificate is `pem` for TLS servers.
    pub fn trust(mut self, pem: &str) -> Launch {
        self.trusted.push(pem.to_owned());
        self
    }

    /// The `--host-resolver-rules` value: each mapped name to 127.0.0.1,
    /// then everything else to "not found" (the first rule that matches
    /// wins).
    fn resolver_rules(&self) -> String {
        let mut rules: Vec<String> = self
            .names
            .iter()
            .map(|n| format!("MAP {n} 127.0.0.1"))
            .collect();
        rules.push("MAP * ~NOTFOUND".into());
        rules.join(", ")
    }
}

/// A running headless Chromium; stopped (the whole process group) when
/// dropped.
#[derive(Debug)]
pub struct Browser {
    child: Option<Child>,
    pid: u32,
    conn: Arc<cdp::Connection>,
    /// Chromium's product and version, from `Browser.getVersion`.
    pub version: String,
    /// What it was launched with ([`Browser::shared`] reuses only a browser
    /// launched alike).
    launch: Launch,
    /// HOME (with the NSS database), the profile, Chromium's log. Removed
    /// after the processes are gone.
    dir: tempfile::TempDir,
}

/// The test binary's shared browser, alive while any test holds it.
static SHARED: tokio::sync::Mutex<std::sync::Weak<Browser>> =
    tokio::sync::Mutex::const_new(std::sync::Weak::new());

impl Browser {
    /// Start Chromium as [`Launch`] says, and connect to it.
    pub async fn launch(launch: &Launch) -> Result<Browser, Error> {
        if !Path::new(CHROMIUM).exists() {
            return Err(Error::Launch(format!(
                "{CHROMIUM} is missing: scripts/install-ops-tools.sh installs Debian's chromium"
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("talos-chromium-{}-", checkout_tag()))
            .tempdir()
            .map_err(|e| Error::Launch(format!("a temporary folder: {e}")))?;
        let home = dir.path().join("home");
        let profile = dir.path().join("profile");
        for d in [&home, &profile] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::Launch(format!("{}: {e}", d.display())))?;
        }
        trust_in_nss(&home, &launch.trusted)?;
        let log_path = dir.path().join("chromium.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error::Launch(format!("{}: {e}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(|e| Error::Launch(format!("{}: {e}", log_path.display())))?;
        let mut cmd = Command::new(CHROMIUM);
        cmd.args(chromium_args(&profile, launch))
            .arg("about:blank")
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        for proxy in [
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
        ] {
            cmd.env_remove(proxy);
        }
        // Its own process group: every process Chromium forks stays in it,
        // and the group is what `stop` kills.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .map_err(|e| Error::Launch(format!("spawn {CHROMIUM}: {e}")))?;
        let pid = child.id();
        let mut starting = Starting {
            child: Some(child),
            pid,
            dir: dir.path().to_owned(),
        };
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + LIMIT;
        let ws_path = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    if let Ok(port) = port.trim().parse::<u16>() {
                        break format!("ws://127.0.0.1:{port}{}", path.trim());
                    }
                }
            }
            if let Some(child) = starting.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(Error::Launch(format!(
                        "chromium exited ({status}) before it wrote DevToolsActivePort; its log:\n{}",
                        log_tail(&log_path)
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    awaited: format!(
                        "chromium to write {}; its log:\n{}",
                        port_file.display(),
                        log_tail(&log_path)
                    ),
                    after: LIMIT,
                });
            }
            tokio::time::sleep(POLL).await;
        };
        let conn = Arc::new(cdp::Connection::connect(&ws_path, LIMIT)?);
        let version = conn
            .call(None, "Browser.getVersion", json!({}), LIMIT)
            .await?;
        let version = version["product"].as_str().unwrap_or("").to_owned();
        Ok(Browser {
            child: starting.child.take(),
            pid,
            conn,
            version,
            launch: launch.clone(),
            dir,
        })
    }

    /// The browser every test of this test binary shares while any of them
    /// holds it: launched on first use (or when the last holder has let it
    /// go), reused while it lives and was launched with the same
    /// [`Launch`]. Each test still gets pages of its own
    /// ([`Browser::new_page`]: a browser context apiece). A test that needs
    /// a browser alone (its process tree, its stop) uses
    /// [`Browser::launch`].
    pub async fn shared(launch: &Launch) -> Result<Arc<Browser>, Error> {
        let mut slot = SHARED.lock().await;
        if let Some(b) = slot.upgrade() {
            if b.launch == *launch && b.conn.is_open() {
                return Ok(b);
            }
        }
        let b = Arc::new(Browser::launch(launch).await?);
        *slot = Arc::downgrade(&b);
        Ok(b)
    }

    /// The browser's process id (its process group's id too).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The folder holding the browser's HOME, profile and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Chromium's log so far (its standard output and error).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("chromium.log")).unwrap_or_default()
    }

    /// Live processes of this browser: its process group, and any process
    /// whose command line names its folder (one that left the group).
    pub fn processes(&self) -> Vec<Process> {
        processes_of(self.pid, self.dir.path())
    }

    /// A new tab in a browser context of its own; see [`page::Page`].
    pub async fn new_page(&self) -> Result<Page, Error> {
        Page::open(Arc::clone(&self.conn)).await
    }

    /// Send a command to the browser itself (not to a page).
    pub async fn call(
        &self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        self.conn.call(None, method, params, LIMIT).await
    }

    /// Stop the browser: `Browser.close`, then after at most
    /// [`CLOSE_GRACE`] SIGKILL to the process group, reap it, and wait
    /// (at most [`GONE_LIMIT`]) until none of its processes is alive. Any
    /// still alive then are SIGKILLed by PID and returned: a test asserts
    /// the list is empty.
    pub fn stop(&mut self) -> Vec<Process> {
        let Some(child) = self.child.take() else {
            return Vec::new();
        };
        if self.conn.is_open() {
            self.conn.send_and_forget(None, "Browser.close", json!({}));
        }
        let left = stop_group(child, self.pid, self.dir.path());
        self.conn.join(CLOSE_GRACE);
        left
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let left = self.stop();
        if !left.is_empty() {
            eprintln!(
                "browser {}: {} process(es) outlived the stop and were killed: {left:?}",
                self.pid,
                left.len()
            );
        }
    }
}

/// A browser still being started: its processes are stopped if the start
/// fails half-way.
struct Starting {
    child: Option<Child>,
    pid: u32,
    dir: PathBuf,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_group(child, self.pid, &self.dir);
        }
    }
}

/// Wait (bounded) for `child` to exit, SIGKILL its group, reap it, and wait
/// until no process of the group or naming `dir` is alive; returns those
/// still alive at the bound (killed by PID then).
fn stop_group(mut child: Child, pid: u32, dir: &Path) -> Vec<Process> {
    let deadline = Instant::now() + CLOSE_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(POLL);
    }
    // Whether it closed or not: the zygotes and helpers of a browser that
    // exited are killed with the group.
    if let Some(group) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    // What left the group (the crash handlers) is found by its command
    // line, which names the browser's folder: nobody else's does.
    kill_each(&processes_of(pid, dir));
    let deadline = Instant::now() + GONE_LIMIT;
    loop {
        let left = processes_of(pid, dir);
        if left.is_empty() {
            return left;
        }
        if Instant::now() > deadline {
            kill_each(&left);
            return left;
        }
        std::thread::sleep(POLL);
    }
}

/// SIGKILL each of `processes` by its PID.
fn kill_each(processes: &[Process]) {
    for p in processes {
        if let Some(pid) = rustix::process::Pid::from_raw(p.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A live process of a browser (zombies, already dead, are not counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub command: String,
}

/// Live processes in process group `group`, or whose command line names
/// `dir`.
pub fn processes_of(group: u32, dir: &Path) -> Vec<Process> {
    let dir = dir.display().to_string();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp …": comm may hold spaces and
        // parentheses, so the fields are read after the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let pgrp = fields.nth(1).and_then(|s| s.parse::<u32>().ok());
        if state == "Z" || state == "X" {
            continue;
        }
        let command = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default();
        if pgrp == Some(group) || command.contains(&dir) {
            found.push(Process { pid, command });
        }
    }
    found
}

/// The flags of a headless browser on a closed test network.
fn chromium_args(profile: &Path, launch: &Launch) -> Vec<String> {
    let mut args = vec![
        "--headless".to_owned(),
        "--remote-debugging-port=0".into(),
        format!("--user-data-dir={}", profile.display()),
        format!("--host-resolver-rules={}", launch.resolver_rules()),
        // No system proxy: the mapped names are reached directly.
        "--no-proxy-server".into(),
        "--disable-gpu".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--disable-default-apps".into(),
        "--disable-extensions".into(),
        "--disable-client-side-phishing-detection".into(),
        "--disable-domain-reliability".into(),
        "--no-pings".into(),
        "--password-store=basic".into(),
        // Screenshots that do not depend on the machine's settings.
        "--hide-scrollbars".into(),
        "--force-color-profile=srgb".into(),
        "--mute-audio".into(),
        "--lang=en-US".into(),
    ];
    // Chromium's sandbox refuses to run as root; as any other user it stays.
    if rustix::process::geteuid().is_root() {
        args.push("--no-sandbox".into());
    }
    args
}

/// Make the NSS database Chromium reads from `$HOME/.pki/nssdb` and add
/// each CA in `pems` as trusted for TLS servers (`C,,`), with `certutil`.
fn trust_in_nss(home: &Path, pems: &[String]) -> Result<(), Error> {
    let db_dir = home.join(".pki/nssdb");
    std::fs::create_dir_all(&db_dir)
        .map_err(|e| Error::Launch(format!("{}: {e}", db_dir.display())))?;
    let db = format!("sql:{}", db_dir.display());
    certutil(&["-N", "--empty-password", "-d", &db])?;
    for (i, pem) in pems.iter().enumerate() {
        let file = home.join(format!("test-ca-{i}.pem"));
        std::fs::write(&file, pem)
            .map_err(|e| Error::Launch(format!("{}: {e}", file.display())))?;
        let name = format!("test-ca-{i}");
        let file = file.display().to_string();
        certutil(&["-A", "-t", "C,,", "-n", &name, "-i", &file, "-d", &db])?;
    }
    Ok(())
}

fn certutil(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("certutil").args(args).output().map_err(|e| {
        Error::Launch(format!(
            "certutil: {e} (Debian's libnss3-tools; scripts/install-ops-tools.sh installs it)"
        ))
    })?;
    if !out.status.success() {
        return Err(Error::Launch(format!(
            "certutil {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The last 4 KiB of Chromium's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

/// A short tag of this checkout (the first 12 hex digits of the SHA-256 of
/// its canonical path) that every browser folder's name carries:
/// `scripts/check-leftovers.sh` computes the same tag (`pwd -P`) to find
/// browsers this checkout's tests left running, and no other checkout's.
pub fn checkout_tag() -> String {
    use sha2::Digest;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..6])
}
