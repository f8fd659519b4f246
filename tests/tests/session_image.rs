//! A session image's clients through the real gateway pair (under
//! `control-stub serve`, the shared rig's [`Pair`]), with the operator's
//! packet rules in front, as a session sees them:
//!
//! - the session's programs run in a network namespace of their own, at
//!   10.20.0.5, routed to the gateway host (10.20.0.1) over a veth pair;
//! - the gateway host applies `ops/nftables.conf` as shipped (only its
//!   ports set to the test gateway's), so every TCP 443 connection is
//!   redirected to a member's data listener, every DNS query (UDP and TCP
//!   53, to whatever nameserver) to its DNS answerer, and UDP 443, other
//!   ports and the admin listener are refused;
//! - the session finds the names it may reach through its own resolver
//!   (`/etc/resolv.conf` names some nameserver, then the one the script
//!   writes; the rules bring every query to the gateway), which gives it
//!   the destinations' real addresses: no `/etc/hosts` entry for them;
//! - `/etc/hangar/session-ca.pem` holds both members' CAs, as the worker
//!   writes it from `sandbox trust`, and `ops/session-image/trust-session-ca.sh install` then
//!   `apply` run as an image's build and entrypoint would;
//! - Java's HttpClient, wget (GnuTLS), NSS's tstclnt, headless Chromium,
//!   curl (with and without the variables), Python's urllib, Node's fetch,
//!   git and `openssl s_client` then reach an allowed name, and each shows what a
//!   refusal looks like in it: a name off the allowlist (a TLS alert before
//!   the handshake) and a per-request refusal (an HTTP 502 with a
//!   `hangar-refusal` header). Java, wget and Chromium are tried before
//!   the script too, and fail: the script is what makes them work; and
//!   every store the script builds holds the two session CAs, no more.
//!
//! A second test runs a session whose allowlist holds a passthrough name
//! (the model route's `api.anthropic.com`) beside a terminated one: the
//! CA file is what
//! `sandbox trust --public-roots` prints (the session CAs, then the
//! public roots, for which a test CA stands in), and every client the
//! script sets up reaches the passthrough name, shown the destination's own
//! certificate, while the terminated name is still shown a leaf of the
//! session CA.
//!
//! All of it runs in namespaces the test makes (`unshare --net --mount`),
//! with `/etc`, `/usr`, `/opt`, `/root` and `/home` under overlays whose
//! writes land in a temporary directory: the host's files, network and
//! ruleset are never touched. The outer test re-runs this test binary
//! inside them (the inner test does nothing when run any other way).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use talos_e2e::clients::run_bounded;
use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::gateway::{Gateway, TestConfig};
use talos_e2e::origin::{Origin, TestCa};
use talos_e2e::rig::{Pair, Process, SessionSpec};

/// Set for the inner run: the outer test's network namespace, which the
/// inner one must not be.
const INNER: &str = "TALOS_SESSION_IMAGE_OUTER_NETNS";
/// The name the origin serves (its certificate names only it).
const ALLOWED: &str = "allowed.test";
/// On the allowlist, resolved to the origin, whose certificate does not
/// name it: the gateway's TLS to it fails, so each request is refused
/// `upstream_failed` (502) after the session's handshake succeeded.
const BADCERT: &str = "badcert.test";
/// Not on the allowlist: refused before the handshake.
const OFFLIST: &str = "offlist.test";
/// The origin's address (on the gateway host's loopback; the session's
/// route to it is the gateway host), as the names resolve.
const ORIGIN_ADDR: &str = "198.51.100.7";
/// The nameserver the image's script writes in the session's
/// `/etc/resolv.conf` (`HANGAR_DNS`, as the worker gives the gateway's
/// address): nothing is there, the rules bring its queries to the gateway.
const NAMESERVER: &str = "192.0.2.53";
/// The gateway host's address on the session side, and the session's.
const GATEWAY_HOST: &str = "10.20.0.1";
const SESSION_ADDR: &str = "10.20.0.5";
/// The session CA file, as the worker writes it.
const SESSION_CA: &str = "/etc/hangar/session-ca.pem";

fn netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .expect("/proc/self/ns/net")
        .display()
        .to_string()
}

fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("uid")
}

#[test]
fn clients_in_a_session_image() {
    in_namespaces("session_image_inner");
}

#[test]
fn a_passthrough_name_and_a_terminated_one_in_a_session_image() {
    in_namespaces("passthrough_image_inner");
}

/// Run the inner test `inner` of this binary in network and mount
/// namespaces of its own.
fn in_namespaces(inner: &str) {
    let mut cmd = Command::new("unshare");
    // As another user than root, a user namespace gives the rights inside.
    if euid() != 0 {
        cmd.arg("--map-root-user");
    }
    let out = cmd
        .args(["--net", "--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().expect("current_exe"))
        .args([
            "--exact",
            inner,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(INNER, netns())
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the inner test failed (it needs unshare, nft, ip and overlayfs; see the output above)"
    );
}

/// Run `program args` with a time bound; `Output` whatever the exit.
fn run(program: &str, args: &[&str]) -> Output {
    run_bounded(program, args, None, 120)
}

/// Run and require success; returns standard output.
fn must(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The session's side: a process holding its own network namespace.
struct Session {
    holder: Child,
    home: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// What a client printed and how it ended.
#[derive(Debug)]
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Session {
    /// `program args` inside the session's network namespace with a clean
    /// environment: PATH, HOME and `vars` only, as a container's process.
    fn run(&self, vars: &[(String, String)], program: &str, args: &[&str]) -> Ran {
        let target = self.holder.id().to_string();
        let home = format!("HOME={}", self.home.display());
        let mut argv: Vec<String> = vec![
            "--target".into(),
            target,
            "--net".into(),
            "--".into(),
            "env".into(),
            "-i".into(),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            home,
        ];
        argv.extend(vars.iter().map(|(k, v)| format!("{k}={v}")));
        argv.push(program.into());
        argv.extend(args.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = run("nsenter", &argv);
        Ran {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// `/etc`, `/usr` and the rest under overlays: writes go to `dir`.
fn overlay_system(dir: &Path) {
    for d in ["/etc", "/usr", "/opt", "/root", "/home"] {
        if !Path::new(d).is_dir() {
            continue;
        }
        let name = d.trim_start_matches('/');
        let upper = dir.join(name).join("upper");
        let work = dir.join(name).join("work");
        std::fs::create_dir_all(&upper).expect("upper");
        std::fs::create_dir_all(&work).expect("work");
        let opts = format!(
            "lowerdir={d},upperdir={},workdir={}",
            upper.display(),
            work.display()
        );
        must("mount", &["-t", "overlay", "overlay", "-o", &opts, d]);
    }
}

/// The session's namespace at 10.20.0.5, its default route through the
/// gateway host at 10.20.0.1.
fn session_namespace(home: PathBuf) -> Session {
    let holder = Command::new("unshare")
        .args(["--net", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .spawn()
        .expect("unshare for the session");
    let pid = holder.id().to_string();
    let session = Session { holder, home };
    // The namespace exists once the holder has exec'd sleep.
    talos_e2e::wait::until("the session's namespace", || {
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
        if ns.display().to_string() != netns() && exe.ends_with("sleep") {
            Ok(())
        } else {
            Err(format!("{} {}", ns.display(), exe.display()))
        }
    });
    must(
        "ip",
        &[
            "link",
            "add",
            "talos-gw",
            "type",
            "veth",
            "peer",
            "name",
            "talos-sess",
            "netns",
            &pid,
        ],
    );
    must(
        "ip",
        &[
            "addr",
            "add",
            &format!("{GATEWAY_HOST}/24"),
            "dev",
            "talos-gw",
        ],
    );
    must("ip", &["link", "set", "talos-gw", "up"]);
    for args in [
        vec!["ip", "link", "set", "lo", "up"],
        vec![
            "ip",
            "addr",
            "add",
            &format!("{SESSION_ADDR}/24"),
            "dev",
            "talos-sess",
        ],
        vec!["ip", "link", "set", "talos-sess", "up"],
        vec!["ip", "route", "add", "default", "via", GATEWAY_HOST],
    ] {
        let mut full = vec!["--target", &pid, "--net", "--"];
        full.extend(args);
        must("nsenter", &full);
    }
    session
}

/// `ops/nftables.conf` as shipped, with the data, admin and DNS ports set
/// to the member's, loaded into this (the test's own) network namespace.
fn load_rules(dir: &Path, data_port: u16, admin_port: u16, dns_port: u16) {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/nftables.conf");
    let text = std::fs::read_to_string(&shipped).expect("ops/nftables.conf");
    let (data, admin, dns) = (
        "define DATA_PORT = 443",
        "define ADMIN_PORT = 9443",
        "define DNS_PORT = 53",
    );
    assert!(
        text.contains(data) && text.contains(admin) && text.contains(dns),
        "the shipped defines"
    );
    let text = text
        .replace(data, &format!("define DATA_PORT = {data_port}"))
        .replace(admin, &format!("define ADMIN_PORT = {admin_port}"))
        .replace(dns, &format!("define DNS_PORT = {dns_port}"));
    let file = dir.join("nftables.conf");
    std::fs::write(&file, text).expect("write rules");
    must("nft", &["-f", file.to_str().unwrap()]);
}

/// The `[dns]` lines of a member on the gateway host: it answers the
/// sessions' DNS on every address (the redirect delivers to the receiving
/// interface's), approvals.hangar.internal being the gateway host's
/// session-side address.
fn answerer_lines() -> String {
    format!("listen = \"0.0.0.0:0\"\napprovals = [\"{GATEWAY_HOST}\"]\n")
}

/// A member's config with its data and admin listeners on the
/// session-side address too: the redirect delivers to the receiving
/// interface's address.
fn session_side(toml: &str) -> String {
    let (data, admin) = ("data = \"127.0.0.1:0\"", "admin = \"127.0.0.1:0\"");
    assert!(toml.contains(data) && toml.contains(admin), "{toml}");
    toml.replace(data, "data = \"0.0.0.0:0\"")
        .replace(admin, "admin = \"0.0.0.0:0\"")
}

/// A member of the pair under the control stub ([`Pair`]), on the
/// gateway host as [`session_side`] and [`answerer_lines`] say.
#[derive(Debug)]
struct HostMember(Gateway);

impl Process for HostMember {
    fn toml(config: &TestConfig, dir: &Path) -> String {
        let config = TestConfig {
            answerer: answerer_lines(),
            ..config.clone()
        };
        session_side(&config.toml(dir))
    }

    fn start(dir: &Path, toml: &str) -> HostMember {
        HostMember(Gateway::start(dir, toml))
    }

    fn data(&self) -> SocketAddr {
        self.0.data
    }

    fn control(&self) -> SocketAddr {
        self.0.control.expect("control listener")
    }

    fn log(&self) -> String {
        self.0.log()
    }

    fn answerer(&self) -> Option<SocketAddr> {
        self.0.answerer
    }
}

/// What stands behind the pair: the names' DNS server and the origin.
#[derive(Debug)]
struct Peers {
    _dns: DnsServer,
    _origin: Origin,
}

/// `ops/session-image/trust-session-ca.sh install`, then `apply`, as an
/// image's build and entrypoint run them, with an NSS database for `home`.
fn image_script(home: &Path) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/session-image/trust-session-ca.sh");
    for step in ["install", "apply"] {
        let out = Command::new("sh")
            .arg(&script)
            .arg(step)
            .env("HOME", home)
            .env("HANGAR_NSS_HOMES", home)
            .env("HANGAR_DNS", NAMESERVER)
            .output()
            .expect("run the script");
        assert!(
            out.status.success(),
            "trust-session-ca.sh {step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// How many certificates each store `apply` builds from the CA file
/// holds: Java's truststore (listed with its password, so that its
/// integrity check is made too), the NSS database in `home`, Chromium's
/// policy and Firefox's.
fn stores(home: &Path) -> [usize; 4] {
    let java = must(
        "keytool",
        &[
            "-list",
            "-keystore",
            "/etc/hangar/trust/java-cacerts.jks",
            "-storepass",
            "changeit",
        ],
    );
    let java = java.matches("trustedCertEntry").count();
    let nss = must(
        "certutil",
        &["-L", "-d", &format!("sql:{}/.pki/nssdb", home.display())],
    );
    let nss = nss.lines().filter(|l| l.starts_with("hangar-")).count();
    let json = |path: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).expect(path)).expect(path)
    };
    let chromium = json("/etc/chromium/policies/managed/hangar-session.json")["CACertificates"]
        .as_array()
        .map_or(0, Vec::len);
    let firefox = json("/etc/firefox/policies/policies.json")["policies"]["Certificates"]
        ["Install"]
        .as_array()
        .map_or(0, Vec::len);
    [java, nss, chromium, firefox]
}

/// The variables the script wrote, `export NAME=VALUE` lines.
fn env_file() -> Vec<(String, String)> {
    std::fs::read_to_string("/etc/hangar/trust/env")
        .expect("/etc/hangar/trust/env")
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A Java client on java.net.http.HttpClient with the JVM's default
/// trust: for each URL, one line `URL status version refusal` or
/// `URL exception class: message`.
const JAVA_CLIENT: &str = r#"
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Client {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(20)).build();
        for (String url : args) {
            HttpRequest req = HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(30)).build();
            try {
                HttpResponse<String> r = client.send(req, HttpResponse.BodyHandlers.ofString());
                System.out.println(url + " " + r.statusCode() + " " + r.version() + " "
                    + r.headers().firstValue("hangar-refusal").orElse("-") + " " + r.body().trim().replace('\n', ' '));
            } catch (Exception e) {
                System.out.println(url + " exception " + e.getClass().getName() + ": " + e.getMessage());
            }
        }
    }
}
"#;

/// Python: one TCP and one UDP probe of the gateway host from the session,
/// printing what happened (`refused`, `unreachable`, `timeout`, `open`).
const PROBE: &str = r#"
import socket, sys
host, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
s.settimeout(5)
try:
    s.connect((host, port))
    if kind == "udp":
        s.send(b"\x00" * 32)
        s.recv(64)
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("timeout" if isinstance(e, TimeoutError) else "unreachable" if e.errno in (113, 101) else f"error {e.errno}")
"#;

fn url(name: &str) -> String {
    format!("https://{name}/hello")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in its own namespaces by clients_in_a_session_image"]
async fn session_image_inner() {
    let Ok(outer) = std::env::var(INNER) else {
        return;
    };
    // Only ever inside the namespaces the outer test made.
    assert_ne!(netns(), outer, "not in a network namespace of its own");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    must("ip", &["link", "set", "lo", "up"]);
    must(
        "ip",
        &["addr", "add", &format!("{ORIGIN_ADDR}/32"), "dev", "lo"],
    );
    overlay_system(&dir.join("overlay"));

    // The peers: DNS and a TLS origin on this namespace's loopback, the
    // origin at ORIGIN_ADDR, where the names resolve.
    let origin_ip: IpAddr = ORIGIN_ADDR.parse().unwrap();
    let dns = DnsServer::start(HashMap::from([
        (ALLOWED.to_owned(), Answer::Addrs(vec![origin_ip])),
        (BADCERT.to_owned(), Answer::Addrs(vec![origin_ip])),
    ]))
    .await;
    let ca = TestCa::new("origin test CA");
    let origin_ca = dir.join("origin-ca.pem");
    ca.write_pem(&origin_ca);
    let listener = tokio::net::TcpListener::bind((origin_ip, 0))
        .await
        .expect("bind the origin");
    let origin = Origin::serve(listener, &ca, &[ALLOWED]);

    // The pair under `control-stub serve` (the shared rig, its members on
    // the gateway host as [`HostMember`] says), and the session on both,
    // each member with its own CA for it.
    let base = TestConfig {
        dns: dns.addr,
        upstream_port: origin.addr.port(),
        anchors: vec![origin_ca],
        permit_internal: vec![format!("{ORIGIN_ADDR}/32")],
        ..Default::default()
    };
    let rig: Pair<HostMember, Peers> = Pair::builder()
        .renewing()
        .egress(&[ALLOWED, BADCERT])
        .start(
            tempfile::tempdir().expect("tempdir"),
            Peers {
                _dns: dns,
                _origin: origin,
            },
            base,
        );
    let id = rig.start_session(
        &SessionSpec::from(SESSION_ADDR)
            .allow(ALLOWED)
            .allow(BADCERT),
    );
    let (gw_a, gw_b) = (&rig.members[0].0, &rig.members[1].0);
    let answerer = gw_a.answerer.expect("gw-a's DNS answerer");
    let answerer_b = gw_b.answerer.expect("gw-b's DNS answerer");
    let (ports_a, ports_b) = (
        (gw_a.data.port(), gw_a.admin.port(), answerer.port()),
        (gw_b.data.port(), gw_b.admin.port(), answerer_b.port()),
    );

    // The worker's part: the pair's bundle as `sandbox trust` prints it
    // (the two session CAs), and the hosts the session's resolver would
    // answer (any address: the rules catch every TCP 443).
    let (bundle, cas) = rig.trust(&id, "trust.pem");
    assert_eq!(cas.len(), 2, "one CA from each member");
    std::fs::create_dir_all("/etc/hangar").expect("/etc/hangar");
    std::fs::copy(&bundle, SESSION_CA).expect("write the session CA");
    // The session's resolver names, until the image's script sets it,
    // some other nameserver: the rules bring its queries to the gateway
    // all the same. Only the name off the allowlist has an address in
    // /etc/hosts, as a program with an address of its own would: the
    // gateway gives it none.
    let _ = std::fs::remove_file("/etc/resolv.conf");
    std::fs::write("/etc/resolv.conf", "nameserver 203.0.113.99\n").expect("/etc/resolv.conf");
    let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts.push_str(&format!("\n{GATEWAY_HOST} {OFFLIST}\n"));
    std::fs::write("/etc/hosts", hosts).expect("/etc/hosts");

    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let session = session_namespace(home.clone());
    load_rules(&dir, ports_a.0, ports_a.1, ports_a.2);
    let java_file = dir.join("Client.java");
    std::fs::write(&java_file, JAVA_CLIENT).expect("Client.java");
    let java = java_file.to_str().unwrap().to_owned();
    let none: Vec<(String, String)> = Vec::new();

    tokio::task::spawn_blocking(move || {
        let (gw_a, gw_b) = (&rig.members[0].0, &rig.members[1].0);
        // --- The packet rules, as a session meets them.
        let probe = |host: &str, port: u16, kind: &str| {
            let r = session.run(
                &none,
                "python3",
                &["-c", PROBE, host, &port.to_string(), kind],
            );
            r.stdout.trim().to_owned()
        };
        assert_eq!(probe(GATEWAY_HOST, 443, "tcp"), "open", "TCP 443 is redirected to the gateway");
        assert_eq!(probe(GATEWAY_HOST, 443, "udp"), "refused", "UDP 443 (QUIC) is refused at once");
        assert_eq!(probe(GATEWAY_HOST, 80, "tcp"), "refused", "TCP 80 is refused");
        assert_eq!(probe(GATEWAY_HOST, 5353, "udp"), "unreachable", "any other UDP is refused");
        // DNS, to whatever nameserver, is the gateway's: the names the
        // session may reach, with their real addresses; no other name.
        let dig = |args: &[&str]| {
            let mut all = vec!["+tries=2", "+time=3"];
            all.extend_from_slice(args);
            session.run(&none, "dig", &all).stdout
        };
        for via in [&[][..], &["@203.0.113.9"][..], &["+tcp"][..]] {
            let mut args = via.to_vec();
            args.extend(["+short", ALLOWED]);
            assert_eq!(dig(&args).trim(), ORIGIN_ADDR, "the answer for {ALLOWED} via {via:?}");
        }
        let off = dig(&["offlist.test"]);
        assert!(off.contains("status: NXDOMAIN"), "a name off the allowlist does not exist: {off}");
        let approvals = dig(&["+short", "approvals.hangar.internal"]);
        assert_eq!(approvals.trim(), GATEWAY_HOST, "the approvals name is the gateway");
        assert_eq!(
            probe(GATEWAY_HOST, gw_a.admin.port(), "tcp"),
            "refused",
            "the admin listener is out of the session's reach"
        );
        assert_eq!(
            probe(GATEWAY_HOST, gw_b.data.port(), "tcp"),
            "refused",
            "only the data port is open to sessions"
        );
        let health = must(
            "curl",
            &["-sS", &format!("http://127.0.0.1:{}/healthz", gw_a.admin.port())],
        );
        assert_eq!(health.trim(), "ok", "the admin listener answers the host itself");

        // --- Before the script: the clients that ignore the variables fail.
        let vars = {
            let mut v: Vec<(String, String)> = [
                "SSL_CERT_FILE",
                "CURL_CA_BUNDLE",
                "REQUESTS_CA_BUNDLE",
                "NODE_EXTRA_CA_CERTS",
                "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
                "GIT_SSL_CAINFO",
            ]
            .iter()
            .map(|k| (k.to_string(), SESSION_CA.to_owned()))
            .collect();
            v.sort();
            v
        };
        let before = session.run(&vars, "java", &[&java, &url(ALLOWED)]);
        assert!(
            before.stdout.contains("exception javax.net.ssl.SSLHandshakeException")
                && before.stdout.contains("PKIX path building failed"),
            "Java ignores the six variables: {before:?}"
        );
        let before = session.run(&vars, "wget", &["-q", "-O", "-", &url(ALLOWED)]);
        assert!(!before.ok, "wget (GnuTLS) ignores SSL_CERT_FILE: {before:?}");
        let chromium = which("chromium")
            .expect("chromium is missing: scripts/install-ops-tools.sh installs it");
        let chrome = |profile: &str, home: &Path, name: &str| {
            let args = chromium_args(&dir, profile, name);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let home = vec![("HOME".to_owned(), home.display().to_string())];
            session.run(&home, &chromium, &args)
        };
        // Its hello carries ECH (GREASE), which the gateway refuses before
        // anything else: Chromium reports a version or cipher mismatch.
        let before = chrome("chrome-before", &home, ALLOWED);
        assert!(
            !before.stdout.contains("GET /hello")
                && before.stderr.contains("ERR_SSL_VERSION_OR_CIPHER_MISMATCH"),
            "Chromium before the policy: {before:?}"
        );

        // --- The image's part: install at build, apply at start.
        image_script(&home);
        let resolv = std::fs::read_to_string("/etc/resolv.conf").expect("resolv.conf");
        assert!(
            resolv.lines().any(|l| l == format!("nameserver {NAMESERVER}"))
                && resolv.matches("nameserver").count() == 1,
            "apply names the gateway's answerer alone: {resolv}"
        );
        let after = session.run(&none, "dig", &["+short", ALLOWED]).stdout;
        assert_eq!(after.trim(), ORIGIN_ADDR, "through the resolver apply set");
        let vars = env_file();
        assert!(vars.len() >= 6 && vars.iter().all(|(_, v)| v == SESSION_CA), "{vars:?}");
        // No passthrough name: every store holds the two session CAs and
        // nothing else, as the file does.
        assert_eq!(stores(&home), [2; 4], "Java, NSS, Chromium, Firefox");

        // --- After: every client reaches the allowed name and shows each
        // refusal in its own way.
        // Java: trust from the JVM's default truststore.
        let java_run = session.run(&none, "java", &[&java, &url(ALLOWED), &url(BADCERT), &url(OFFLIST)]);
        let lines: Vec<&str> = java_run.stdout.lines().collect();
        assert!(
            lines.len() == 3
                && lines[0].starts_with(&format!("{} 200 HTTP_2 - ", url(ALLOWED)))
                && lines[1].starts_with(&format!("{} 502 HTTP_2 upstream_failed ", url(BADCERT)))
                && lines[2].contains("exception javax.net.ssl.SSLHandshakeException")
                && lines[2].contains("unrecognized_name"),
            "java: {java_run:?}"
        );

        // wget (GnuTLS): trust from /etc/wgetrc.
        let ok = session.run(&none, "wget", &["-q", "-O", "-", &url(ALLOWED)]);
        assert!(ok.ok && ok.stdout.contains("GET /hello"), "wget: {ok:?}");
        let refused = session.run(&none, "wget", &["-S", "-O", "-", &url(BADCERT)]);
        assert!(
            !refused.ok
                && refused.stderr.contains("502")
                && refused.stderr.to_ascii_lowercase().contains("hangar-refusal: upstream_failed"),
            "wget, per-request refusal: {refused:?}"
        );
        let off = session.run(&none, "wget", &["-O", "-", &url(OFFLIST)]);
        assert!(
            !off.ok && off.stderr.contains("Unable to establish SSL connection"),
            "wget, off the allowlist: {off:?}"
        );

        // NSS (what Chromium and other NSS programs read): tstclnt with the
        // database the script made in $HOME/.pki/nssdb.
        let db = format!("sql:{}/.pki/nssdb", home.display());
        let request = format!("GET /hello HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: close\r\n\r\n");
        let req_file = home.join("request.txt");
        std::fs::write(&req_file, request).expect("request");
        let tst = session.run(
            &none,
            "sh",
            &["-c", &format!("tstclnt -h {ALLOWED} -p 443 -d {db} -V tls1.3:tls1.3 < {}", req_file.display())],
        );
        assert!(tst.stdout.contains("HTTP/1.1 200") && tst.stdout.contains("GET /hello"), "tstclnt: {tst:?}");
        let tst_off = session.run(
            &none,
            "sh",
            &["-c", &format!("tstclnt -h {OFFLIST} -p 443 -d {db} -V tls1.3:tls1.3 < {}", req_file.display())],
        );
        assert!(
            tst_off.stderr.contains("SSL_ERROR_UNRECOGNIZED_NAME_ALERT"),
            "tstclnt, off the allowlist: {tst_off:?}"
        );

        // curl: with the variables, and with none (the system bundle).
        for env in [&vars, &none] {
            let c = session.run(env, "curl", &["-sS", "-D", "-", &url(ALLOWED)]);
            assert!(c.ok && c.stdout.starts_with("HTTP/2 200"), "curl: {c:?}");
        }
        let c = session.run(&vars, "curl", &["-sS", "-D", "-", &url(BADCERT)]);
        assert!(
            c.stdout.starts_with("HTTP/2 502") && c.stdout.contains("hangar-refusal: upstream_failed"),
            "curl, per-request refusal: {c:?}"
        );
        let c = session.run(&vars, "curl", &["-sS", &url(OFFLIST)]);
        assert!(!c.ok && c.stderr.contains("unrecognized name"), "curl, off the allowlist: {c:?}");

        // Python's urllib: SSL_CERT_FILE.
        let py = session.run(
            &vars,
            "python3",
            &["-c", &format!("import urllib.request; print(urllib.request.urlopen('{}').status)", url(ALLOWED))],
        );
        assert_eq!(py.stdout.trim(), "200", "python: {py:?}");
        let fetch = |name: &str| {
            format!("import urllib.request\ntry:\n  urllib.request.urlopen('{}')\nexcept Exception as e:\n  print(type(e).__name__, e)", url(name))
        };
        let py = session.run(&vars, "python3", &["-c", &fetch(BADCERT)]);
        assert_eq!(py.stdout.trim(), "HTTPError HTTP Error 502: Bad Gateway", "python: {py:?}");
        let py = session.run(&vars, "python3", &["-c", &fetch(OFFLIST)]);
        assert!(
            py.stdout.starts_with("URLError <urlopen error [SSL: TLSV1_UNRECOGNIZED_NAME]"),
            "python, off the allowlist: {py:?}"
        );

        // Node's fetch: NODE_EXTRA_CA_CERTS.
        let node = |name: &str| {
            let script = format!(
                "fetch('{}').then(async r => console.log(r.status, r.headers.get('hangar-refusal'), await r.text())).catch(e => console.log('error', e.cause && e.cause.code))",
                url(name)
            );
            session.run(&vars, "node", &["-e", &script]).stdout
        };
        assert!(node(ALLOWED).starts_with("200 null origin says hello"), "node: {}", node(ALLOWED));
        assert!(node(BADCERT).starts_with("502 upstream_failed {"), "node: {}", node(BADCERT));
        assert_eq!(node(OFFLIST).trim(), "error ERR_SSL_TLSV1_UNRECOGNIZED_NAME", "node, off the allowlist");

        // git (Debian's: libcurl with GnuTLS): GIT_SSL_CAINFO. The origin
        // is no git server: getting that far means TLS was trusted.
        let git = session.run(&vars, "git", &["ls-remote", &format!("https://{ALLOWED}/repo")]);
        assert!(git.stderr.contains("is this a git repository?"), "git: {git:?}");
        let git = session.run(&vars, "git", &["ls-remote", &format!("https://{OFFLIST}/repo")]);
        assert!(
            git.stderr.contains("The server name sent was not recognized")
                || git.stderr.contains("unrecognized name"),
            "git, off the allowlist: {git:?}"
        );

        // openssl s_client with the CA file.
        let s = session.run(
            &none,
            "sh",
            &["-c", &format!("echo | openssl s_client -CAfile {SESSION_CA} -verify_return_error -servername {ALLOWED} -connect {ALLOWED}:443")],
        );
        assert!(s.stdout.contains("Verify return code: 0 (ok)"), "s_client: {s:?}");
        let s = session.run(
            &none,
            "sh",
            &["-c", &format!("echo | openssl s_client -CAfile {SESSION_CA} -servername {OFFLIST} -connect {OFFLIST}:443")],
        );
        assert!(s.stderr.contains("unrecognized name"), "s_client, off the allowlist: {s:?}");

        // Chromium: trust and ECH off from its policy alone (a profile and
        // a HOME without the NSS database).
        let bare = dir.join("bare-home");
        let after = chrome("chrome-after", &bare, ALLOWED);
        assert!(after.stdout.contains("GET /hello"), "Chromium with the policy: {after:?}");
        let refused = chrome("chrome-badcert", &bare, BADCERT);
        assert!(
            refused.stdout.contains("\"refusal\":\"upstream_failed\""),
            "Chromium, per-request refusal (the JSON body as the page): {refused:?}"
        );
        let off = chrome("chrome-offlist", &bare, OFFLIST);
        assert!(
            !off.stdout.contains("GET /hello") && off.stderr.contains("ERR_SSL_UNRECOGNIZED_NAME_ALERT"),
            "Chromium, off the allowlist: {off:?}"
        );

        // The other member: the bundle trusts both.
        load_rules(&dir, ports_b.0, ports_b.1, ports_b.2);
        let java_b = session.run(&none, "java", &[&java, &url(ALLOWED)]);
        assert!(java_b.stdout.starts_with(&format!("{} 200 ", url(ALLOWED))), "java via gw-b: {java_b:?}");
        let wget_b = session.run(&none, "wget", &["-q", "-O", "-", &url(ALLOWED)]);
        assert!(wget_b.ok, "wget via gw-b: {wget_b:?}");

        // The gateways saw it all from the session's address.
        for (gw, least) in [(gw_a, 6), (gw_b, 2)] {
            let records = gw.wait_records(least);
            let allowed = records
                .iter()
                .filter(|r| {
                    r["verdict"] == "allowed"
                        && r["source"]
                            .as_str()
                            .is_some_and(|s| s.starts_with(&format!("{SESSION_ADDR}:")))
                })
                .count();
            assert!(allowed >= least / 2, "records of {}: {records:?}", gw.log_path.display());
        }
        let refused: Vec<_> = gw_a
            .records()
            .into_iter()
            .filter(|r| r["verdict"] == "not_on_allowlist")
            .collect();
        assert!(refused.len() >= 4, "the off-allowlist tries are on the record: {refused:?}");
        drop((session, rig));
    })
    .await
    .expect("clients");
}

/// A name of the model route: passthrough from the control stub's start
/// (`policy passthrough list`).
const MODEL: &str = "api.anthropic.com";
/// The test CA standing in for the public roots (tests reach no real
/// destination): the origin's, which signs its certificate for each name
/// it serves.
const PUBLIC_ROOT: &str = "public roots stand-in";

/// Node's `https.get` of `url`: `STATUS ISSUER BODY`, the issuer being the
/// common name of the certificate that signed the one the client was
/// shown; or `error CODE`.
fn node_get(url: &str) -> String {
    format!(
        "require('https').get('{url}', r => {{ const issuer = r.socket.getPeerCertificate().issuer.CN; let b = ''; r.on('data', d => b += d); r.on('end', () => console.log(r.statusCode, issuer, b.trim())); }}).on('error', e => console.log('error', e.code))"
    )
}

/// A session whose allowlist holds a passthrough name, as the control
/// stub runs it: its bundle (`sandbox trust`) is the session CAs and the
/// public roots, and every client the image's script sets up reaches the
/// passthrough name, which shows the destination's own certificate, while
/// the name beside it still shows a leaf of the session CA. The pair runs
/// under `control-stub serve`, behind `ops/nftables.conf` as in
/// [`session_image_inner`]; the public roots are a test CA's certificate
/// ([`PUBLIC_ROOT`]), given to `sandbox trust --public-roots`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in its own namespaces by a_passthrough_name_and_a_terminated_one_in_a_session_image"]
async fn passthrough_image_inner() {
    let Ok(outer) = std::env::var(INNER) else {
        return;
    };
    assert_ne!(netns(), outer, "not in a network namespace of its own");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    must("ip", &["link", "set", "lo", "up"]);
    must(
        "ip",
        &["addr", "add", &format!("{ORIGIN_ADDR}/32"), "dev", "lo"],
    );
    overlay_system(&dir.join("overlay"));

    // One origin for both names, its certificates from the stand-in CA:
    // the passthrough name's is what the session must verify itself; the
    // terminated name's only the gateway sees.
    let origin_ip: IpAddr = ORIGIN_ADDR.parse().unwrap();
    let dns = DnsServer::start(HashMap::from([
        (ALLOWED.to_owned(), Answer::Addrs(vec![origin_ip])),
        (MODEL.to_owned(), Answer::Addrs(vec![origin_ip])),
    ]))
    .await;
    let ca = TestCa::new(PUBLIC_ROOT);
    let roots = dir.join("public-roots.pem");
    ca.write_pem(&roots);
    let listener = tokio::net::TcpListener::bind((origin_ip, 0))
        .await
        .expect("bind the origin");
    let origin = Origin::serve(listener, &ca, &[ALLOWED, MODEL]);
    let base = TestConfig {
        dns: dns.addr,
        upstream_port: origin.addr.port(),
        anchors: vec![roots.clone()],
        permit_internal: vec![format!("{ORIGIN_ADDR}/32")],
        ..Default::default()
    };
    let rig: Pair<HostMember, Peers> = Pair::builder().renewing().egress(&[ALLOWED, MODEL]).start(
        tempfile::tempdir().expect("tempdir"),
        Peers {
            _dns: dns,
            _origin: origin,
        },
        base,
    );
    let id = rig.start_session(&SessionSpec::from(SESSION_ADDR).allow(ALLOWED).allow(MODEL));
    let status = rig.status(&id);
    assert_eq!(
        status["attempts"][0]["passthrough"],
        serde_json::json!([MODEL]),
        "{status}"
    );

    // The worker's part: the bundle `sandbox trust` prints, in the CA
    // file. The session CAs first, then the public roots.
    let ran = rig.cli(&[
        "sandbox",
        "trust",
        &id,
        "--public-roots",
        roots.to_str().unwrap(),
    ]);
    assert_eq!(ran.status, 0, "sandbox trust: {}", ran.stderr);
    let listed: Vec<String> = rustls_pemfile::certs(&mut ran.stdout.as_bytes())
        .map(|c| talos_certs::sha384_hex(c.expect("PEM").as_ref()))
        .collect();
    let mut cas: Vec<String> = rig.digests(&id).into_values().collect();
    cas.sort();
    let mut first: Vec<String> = listed.iter().take(2).cloned().collect();
    first.sort();
    assert!(
        listed.len() == 3 && first == cas && listed[2] == talos_certs::sha384_hex(&ca.cert_der),
        "the session CAs, then the public roots: {listed:?}, CAs {cas:?}"
    );
    std::fs::create_dir_all("/etc/hangar").expect("/etc/hangar");
    std::fs::write(SESSION_CA, &ran.stdout).expect("write the session CA file");
    // The session CAs alone, as the bundle was before: what the roots add.
    let end = "-----END CERTIFICATE-----";
    let second = ran.stdout.match_indices(end).nth(1).expect("two CAs").0 + end.len();
    let alone = dir.join("session-cas-alone.pem");
    std::fs::write(&alone, format!("{}\n", &ran.stdout[..second])).expect("write");

    let _ = std::fs::remove_file("/etc/resolv.conf");
    std::fs::write("/etc/resolv.conf", "nameserver 203.0.113.99\n").expect("/etc/resolv.conf");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let session = session_namespace(home.clone());
    let gw_a = &rig.members[0].0;
    let answerer = gw_a.answerer.expect("gw-a's DNS answerer");
    let ports = (gw_a.data.port(), gw_a.admin.port(), answerer.port());
    load_rules(&dir, ports.0, ports.1, ports.2);
    let java_file = dir.join("Client.java");
    std::fs::write(&java_file, JAVA_CLIENT).expect("Client.java");
    let java = java_file.to_str().unwrap().to_owned();
    let none: Vec<(String, String)> = Vec::new();
    // The issuer of a terminated name's leaf: the session CA of gw-a
    // (through its intermediate), never the destination's CA.
    let session_ca = format!("TALOS session CA {id} attempt 1 (gw-a)");

    tokio::task::spawn_blocking(move || {
        image_script(&home);
        let vars = env_file();
        assert!(vars.len() >= 6 && vars.iter().all(|(_, v)| v == SESSION_CA), "{vars:?}");
        // Every store holds what the file holds: the two session CAs and
        // the public roots.
        assert_eq!(stores(&home), [3; 4], "Java, NSS, Chromium, Firefox");

        // curl, with the variables and with none (the system bundle): the
        // passthrough name shows the destination's certificate, the
        // terminated one a leaf of the session CA.
        for env in [&vars, &none] {
            let c = session.run(env, "curl", &["-sS", "-v", &url(MODEL)]);
            assert!(
                c.ok && c.stdout.starts_with("origin says hello")
                    && c.stderr.contains(&format!("issuer: CN={PUBLIC_ROOT}")),
                "curl, passthrough: {c:?}"
            );
            let c = session.run(env, "curl", &["-sS", "-v", &url(ALLOWED)]);
            assert!(
                c.ok && c.stdout.starts_with("origin says hello")
                    && c.stderr.contains(&format!("issuer: CN={session_ca}")),
                "curl, terminated: {c:?}"
            );
        }
        // The session CAs alone do not verify the destination (the bundle
        // before the public roots joined it); the public roots alone do
        // not verify a terminated name, though the origin has a
        // certificate for it: the gateway, not the origin, answers it.
        let alone_file = alone.to_str().unwrap();
        let c = session.run(&none, "curl", &["-sS", "--cacert", alone_file, &url(MODEL)]);
        assert!(!c.ok && c.stderr.contains("(60)"), "the session CAs alone: {c:?}");
        let c = session.run(&none, "curl", &["-sS", "--cacert", roots.to_str().unwrap(), &url(ALLOWED)]);
        assert!(!c.ok && c.stderr.contains("(60)"), "the public roots alone: {c:?}");

        // Node: NODE_EXTRA_CA_CERTS adds the file to Node's own roots.
        let node = |env: &[(String, String)], name: &str| {
            session.run(env, "node", &["-e", &node_get(&url(name))]).stdout.trim().to_owned()
        };
        assert_eq!(
            node(&vars, MODEL),
            format!("200 {PUBLIC_ROOT} origin says hello: HTTP/1.1 GET /hello"),
            "node, passthrough"
        );
        let terminated = node(&vars, ALLOWED);
        assert!(
            terminated.starts_with(&format!("200 {session_ca} level "))
                && terminated.ends_with(" origin says hello: HTTP/1.1 GET /hello"),
            "node, terminated: {terminated}"
        );
        let only_cas = vec![("NODE_EXTRA_CA_CERTS".to_owned(), alone_file.to_owned())];
        assert!(node(&only_cas, MODEL).starts_with("error "), "node, the session CAs alone");

        // Python's urllib: SSL_CERT_FILE.
        for name in [MODEL, ALLOWED] {
            let py = session.run(
                &vars,
                "python3",
                &["-c", &format!("import urllib.request; print(urllib.request.urlopen('{}').status)", url(name))],
            );
            assert_eq!(py.stdout.trim(), "200", "python, {name}: {py:?}");
        }

        // Java: the JVM's default truststore.
        let java_run = session.run(&none, "java", &[&java, &url(MODEL), &url(ALLOWED)]);
        let lines: Vec<&str> = java_run.stdout.lines().collect();
        assert!(
            lines.len() == 2
                && lines[0].starts_with(&format!("{} 200 HTTP_2 - origin says hello", url(MODEL)))
                && lines[1].starts_with(&format!("{} 200 HTTP_2 - origin says hello", url(ALLOWED))),
            "java: {java_run:?}"
        );

        // wget (GnuTLS): /etc/wgetrc.
        for name in [MODEL, ALLOWED] {
            let w = session.run(&none, "wget", &["-q", "-O", "-", &url(name)]);
            assert!(w.ok && w.stdout.contains("GET /hello"), "wget, {name}: {w:?}");
        }

        // NSS: tstclnt with the database apply made.
        let db = format!("sql:{}/.pki/nssdb", home.display());
        for name in [MODEL, ALLOWED] {
            let req = home.join(format!("request-{name}.txt"));
            std::fs::write(&req, format!("GET /hello HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"))
                .expect("request");
            let tst = session.run(
                &none,
                "sh",
                &["-c", &format!("tstclnt -h {name} -p 443 -d {db} -V tls1.3:tls1.3 < {}", req.display())],
            );
            assert!(tst.stdout.contains("HTTP/1.1 200") && tst.stdout.contains("GET /hello"), "tstclnt, {name}: {tst:?}");
        }

        // git: GIT_SSL_CAINFO. The origin is no git server: getting that
        // far means TLS was trusted.
        let git = session.run(&vars, "git", &["ls-remote", &format!("https://{MODEL}/repo")]);
        assert!(git.stderr.contains("is this a git repository?"), "git: {git:?}");

        // openssl s_client with the CA file.
        let s = session.run(
            &none,
            "sh",
            &["-c", &format!("echo | openssl s_client -CAfile {SESSION_CA} -verify_return_error -servername {MODEL} -connect {MODEL}:443")],
        );
        assert!(s.stdout.contains("Verify return code: 0 (ok)"), "s_client: {s:?}");

        // Chromium: the policy alone (a home without the NSS database).
        let bare = dir.join("bare-home");
        let args = chromium_args(&dir, "chrome-model", MODEL);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let chromium = which("chromium").expect("chromium is missing: scripts/install-ops-tools.sh installs it");
        let page = session.run(&[("HOME".to_owned(), bare.display().to_string())], &chromium, &args);
        assert!(page.stdout.contains("GET /hello"), "Chromium, passthrough: {page:?}");

        // The gateway passed the passthrough name's connections on unread,
        // and terminated the other's.
        // Twelve connections to it at least, each recorded as it closes.
        let records = talos_e2e::wait::until("the passthrough name's records", || {
            let records = rig.members[0].0.records();
            let n = records.iter().filter(|r| r["sni"] == MODEL).count();
            talos_e2e::wait::check(records, |_| n >= 12)
        });
        let model: Vec<_> = records.iter().filter(|r| r["sni"] == MODEL).collect();
        assert!(
            model.iter().all(|r| r["passthrough"] == true && r["verdict"] == "allowed"),
            "{records:?}"
        );
        let terminated: Vec<_> = records.iter().filter(|r| r["sni"] == ALLOWED && r["verdict"] == "allowed").collect();
        assert!(
            !terminated.is_empty() && terminated.iter().all(|r| r.get("passthrough").is_none()),
            "{records:?}"
        );
        drop((session, rig));
    })
    .await
    .expect("clients");
}

/// Headless Chromium, fetching `name` and printing its DOM, with
/// a new profile in `dir/profile` and the flags a closed network needs.
fn chromium_args(dir: &Path, profile: &str, name: &str) -> Vec<String> {
    vec![
        "--headless".to_owned(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        format!("--user-data-dir={}", dir.join(profile).display()),
        "--dump-dom".into(),
        url(name),
    ]
}

/// The path of `program` on PATH, if any.
fn which(program: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!path.is_empty()).then_some(path)
}
