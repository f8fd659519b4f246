//! Operating one member: a reload that changes what it may live and refuses
//! what it may not (naming the line), and an upgrade that hands every live
//! authority to a new process — the session's CA unchanged, no connection
//! refused — or, if the new process refuses, leaves the old one serving.
//! Real `gateway` processes, real signals, real curl.

use talos_e2e::clients::{client_tls, connect_from};
use talos_e2e::member::{alive, signal, Member};
use talos_e2e::rig::Single;
use talos_e2e::wait;

const NAME: &str = "origin.test";

type Rig = Single<Member>;

/// A member (its process socket in the rig's folder) with one static
/// session, `sess-op` from 127.0.0.2, and `limits`.
async fn rig(limits: &str) -> Rig {
    Single::builder()
        .session(&[NAME])
        .session_id("sess-op")
        .limits(limits)
        .start_loopback(&[NAME])
        .await
}

/// The status of a GET of `/hello` through the member.
fn hello(rig: &Rig) -> u16 {
    rig.curl(NAME, "/hello", &[]).status
}

/// The `gateway_config_info` series a scrape shows.
fn config_info(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| l.starts_with("gateway_config_info{"))
        .collect()
}

/// The config digest `/readyz` names.
fn digest_of(readyz: &str) -> &str {
    readyz
        .lines()
        .find_map(|l| l.strip_prefix("config "))
        .expect("a config line")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_good_reload_changes_a_bound_live_and_a_bad_one_changes_nothing() {
    let mut rig = rig("session_connections = 1\nsession_handshakes = 1\n").await;
    let digest_before = rig.gateway.readyz();
    assert!(
        digest_before.starts_with("ready\nconfig "),
        "{digest_before}"
    );

    // One connection held open fills the session's share of one: the
    // next is refused `session_limit`.
    // A raw TCP connection from the session's source, held open.
    let held = connect_from("127.0.0.2", rig.data()).await;
    let refused = rig.curl(NAME, "/hello", &[]);
    assert_eq!(refused.status, 0, "a second connection past a share of one");
    wait::until_async("the refusal's record", || {
        let records = std::fs::read_to_string(rig.dir.join("records.jsonl")).unwrap_or_default();
        wait::check(records, |r| r.contains("\"session_limit\""))
    })
    .await;

    // Reload with a share of 4: the next connection goes through, while
    // the held one stays open.
    rig.gateway
        .rewrite(&rig.config("session_connections = 4\nsession_handshakes = 4\n"));
    let (ok, out, err) = rig.gateway.command("reload");
    assert!(ok, "reload: {out} {err}");
    assert!(out.contains("\"ok\":true"), "{out}");
    assert_eq!(hello(&rig), 200);
    let digest_after = rig.gateway.readyz();
    assert_ne!(digest_before, digest_after, "the digest follows the config");
    let metrics = rig.gateway.metrics();
    assert!(metrics.contains("gateway_reload_total{result=\"ok\"} 1"));
    // One config_info series: the config in force, not the one replaced.
    assert_eq!(
        config_info(&metrics),
        [format!(
            "gateway_config_info{{digest=\"{}\"}} 1",
            digest_of(&digest_after)
        )],
        "{metrics}"
    );

    // A bad config: refused, naming the line; everything stays.
    let bad = rig
        .config("session_connections = 4\nsession_handshakes = 4\n")
        .replace("session_handshakes = 4", "session_handshakes = 0");
    let line = bad
        .lines()
        .position(|l| l.starts_with("session_handshakes = 0"))
        .expect("the bad line")
        + 1;
    rig.gateway.rewrite(&bad);
    let (ok, out, err) = rig.gateway.command("reload");
    assert!(!ok, "a bad config reloaded: {out}");
    assert!(
        err.contains(&format!("gateway.toml:{line}: limits.session_handshakes")),
        "the error names the line: {err}"
    );
    assert_eq!(rig.gateway.readyz(), digest_after, "nothing changed");
    assert_eq!(hello(&rig), 200);

    // A field only a restart changes: refused, naming its line.
    let moved = rig
        .config("session_connections = 4\nsession_handshakes = 4\n")
        .replace("admin = \"127.0.0.1:0\"", "admin = \"127.0.0.1:1\"");
    let line = moved
        .lines()
        .position(|l| l.starts_with("admin = \"127.0.0.1:1\""))
        .expect("the moved line")
        + 1;
    rig.gateway.rewrite(&moved);
    let (ok, _, err) = rig.gateway.command("reload");
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "gateway.toml:{line}: listen.admin: changes only with a restart"
        )),
        "{err}"
    );

    // SIGHUP with a bad config says so in the log, and changes nothing.
    rig.gateway.rewrite(&bad);
    signal(rig.gateway.pids[0], "HUP");
    wait::until_async("the refused reload's log line", || {
        let log = rig.gateway.log();
        wait::check(log.clone(), |l| l.matches("reload refused").count() >= 3)
    })
    .await;
    assert!(alive(rig.gateway.pids[0]), "SIGHUP never ends the process");
    assert_eq!(rig.gateway.readyz(), digest_after);
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_reload_total{result=\"refused\"} 3"),
        "{metrics}"
    );
    drop(held);
    let _ = rig.gateway.wait_ready(1);
}

/// `gateway reload` of a file the gateway cannot even parse is a refused
/// reload like any other: the running gateway reads the file, counts the
/// refusal and logs it naming the file, the line and the field; the
/// command prints the gateway's answer and exits non-zero.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_of_a_file_with_a_syntax_error_is_refused_counted_and_logged() {
    let rig = rig("session_connections = 100\n").await;
    let digest = rig.gateway.readyz();
    let broken = rig.config("session_connections = = 100\n");
    let line = broken
        .lines()
        .position(|l| l.starts_with("session_connections = = 100"))
        .expect("the broken line")
        + 1;
    rig.gateway.rewrite(&broken);
    let (ok, out, err) = rig.gateway.command("reload");
    assert!(!ok, "a file with a syntax error reloaded: {out}");
    assert!(out.contains("\"ok\":false"), "the gateway's answer: {out}");
    let at = format!("gateway.toml:{line}: limits.session_connections: ");
    assert!(err.contains(&at), "the answer names the line: {err}");
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_reload_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    wait::until_async("the refusal's log line", || {
        let log = rig.gateway.log();
        wait::check(log, |l| {
            l.lines()
                .any(|l| l.contains("reload refused") && l.contains(&at))
        })
    })
    .await;
    assert_eq!(rig.gateway.readyz(), digest, "nothing changed");
    assert_eq!(hello(&rig), 200);
}

/// `gateway reload --config FILE` reloads the file the running process
/// was started with: another file is refused, naming both, and counted;
/// the same file by another path (a symlink) is that file.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_naming_another_file_is_refused_naming_both() {
    let rig = rig("").await;
    let digest = rig.gateway.readyz();
    let other = rig.dir.join("other.toml");
    std::fs::write(&other, rig.config("session_connections = 100\n")).expect("other");
    let (ok, out, err) = rig.gateway.command_with("reload", &other);
    assert!(!ok, "another file was reloaded: {out}");
    let canonical = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .expect("canonical")
            .display()
            .to_string()
    };
    assert!(
        err.contains(&canonical(&other)) && err.contains(&canonical(&rig.gateway.config_path)),
        "the refusal names both files: {err}"
    );
    assert_eq!(rig.gateway.readyz(), digest, "nothing changed");
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_reload_total{result=\"refused\"} 1"),
        "{metrics}"
    );

    let link = rig.dir.join("link.toml");
    std::os::unix::fs::symlink(&rig.gateway.config_path, &link).expect("symlink");
    rig.gateway
        .rewrite(&rig.config("session_connections = 100\n"));
    let (ok, out, err) = rig.gateway.command_with("reload", &link);
    assert!(ok, "the running file, by a symlink: {out} {err}");
    assert_ne!(rig.gateway.readyz(), digest, "reloaded");
}

/// The session's CA file as the member wrote it at start.
fn ca_bytes(rig: &Rig) -> Vec<u8> {
    std::fs::read(&rig.trust).expect("trust file")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_keeps_the_session_and_its_ca() {
    let mut rig = rig("").await;
    let old = rig.gateway.pids[0];
    let ca = ca_bytes(&rig);
    assert_eq!(hello(&rig), 200);

    let (ok, out, err) = rig.gateway.command("upgrade");
    assert!(ok, "upgrade: {out} {err}\n{}", rig.gateway.log());
    let second = rig.gateway.wait_ready(2);
    let new = u32::try_from(second["pid"].as_u64().expect("pid")).expect("pid");
    assert_ne!(new, old);
    assert_eq!(
        second["instance"],
        rig.gateway.ready_lines()[0]["instance"],
        "the same instance goes on"
    );
    assert_eq!(
        second["data"],
        rig.gateway.ready_lines()[0]["data"],
        "the same listener"
    );
    wait::until_async("the old process to exit", || {
        wait::check(alive(old), |a| !a)
    })
    .await;
    // The successor counts the handover it took; one config in force.
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_handover_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert_eq!(config_info(&metrics).len(), 1, "{metrics}");

    // The session trusts the same CA: its file is unchanged and a new
    // connection verifies against it.
    assert_eq!(ca_bytes(&rig), ca, "the trust bundle is unchanged");
    assert_eq!(hello(&rig), 200);
    // Both processes' records name one instance; the successor's
    // connections are numbered in its own generation.
    let records: Vec<serde_json::Value> = wait::until_async("two records", || {
        let r: Vec<serde_json::Value> = std::fs::read_to_string(rig.dir.join("records.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        wait::check(r, |r| r.len() >= 2)
    })
    .await;
    assert_eq!(records[0]["instance"], records[1]["instance"]);
    assert!(
        records[1]["conn"].as_u64().expect("conn") > 1 << 40,
        "{records:?}"
    );
    assert!(rig.gateway.log().contains("handed over; draining"));

    // A second upgrade, from the successor.
    let (ok, out, err) = rig.gateway.command("upgrade");
    assert!(ok, "second upgrade: {out} {err}");
    rig.gateway.wait_ready(3);
    wait::until_async("the second process to exit", || {
        wait::check(alive(new), |a| !a)
    })
    .await;
    // The count goes on across processes: a second handover shows.
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_handover_total{result=\"ok\"} 2"),
        "{metrics}"
    );
    assert_eq!(ca_bytes(&rig), ca);
    assert_eq!(hello(&rig), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_takeover_leaves_the_old_process_serving() {
    let mut rig = rig("").await;
    let old = rig.gateway.pids[0];
    assert_eq!(hello(&rig), 200);

    // The new process will find a config it refuses.
    let bad = rig.config("hello_max_bytes = 1\n");
    rig.gateway.rewrite(&bad);
    let (ok, out, err) = rig.gateway.command("upgrade");
    assert!(!ok, "an upgrade with a bad config: {out}");
    assert!(
        err.contains("refused") && err.contains("hello_max_bytes"),
        "{err}"
    );
    assert!(alive(old));
    assert_eq!(rig.gateway.ready_lines().len(), 1, "no successor got ready");
    assert_eq!(hello(&rig), 200, "the old process goes on serving");
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_handover_total{result=\"failed\"} 1"),
        "{metrics}"
    );

    // A config that changes a field only a restart changes: the successor
    // refuses it, naming the line.
    let moved = rig
        .config("")
        .replace("admin = \"127.0.0.1:0\"", "admin = \"127.0.0.1:1\"");
    rig.gateway.rewrite(&moved);
    let (ok, _, err) = rig.gateway.command("upgrade");
    assert!(!ok);
    assert!(err.contains("listen.admin"), "{err}");
    assert!(alive(old));
    assert_eq!(hello(&rig), 200);

    // Another gateway_id: refused as every other field, naming its line.
    let renamed = format!(
        "# renamed\n{}",
        rig.config("")
            .replace("gateway_id = \"gw-test\"", "gateway_id = \"gw-other\"")
    );
    rig.gateway.rewrite(&renamed);
    let (ok, _, err) = rig.gateway.command("upgrade");
    assert!(!ok);
    assert!(
        err.contains("gateway.toml:2: gateway_id: ") && err.contains("gw-other"),
        "{err}"
    );
    assert!(alive(old));
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_handover_total{result=\"failed\"} 3"),
        "{metrics}"
    );
    // And with a good config it goes through. The successor's ready line
    // names its pid, which the member stops when the test ends; its
    // counts go on from the old process's.
    rig.gateway.rewrite(&rig.config(""));
    let (ok, out, err) = rig.gateway.command("upgrade");
    assert!(ok, "{out} {err}");
    rig.gateway.wait_ready(2);
    wait::until_async("the old process to exit", || {
        wait::check(alive(old), |a| !a)
    })
    .await;
    let metrics = rig.gateway.metrics();
    assert!(
        metrics.contains("gateway_handover_total{result=\"ok\"} 1")
            && metrics.contains("gateway_handover_total{result=\"failed\"} 3"),
        "{metrics}"
    );
}

/// One GET from `source`, trusting `ca`: the status, or what failed.
async fn get_from(rig: &Rig, source: &str, ca: &std::path::Path) -> Result<u16, String> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().expect("addr"))
        .expect("bind");
    let tls = client_tls(ca);
    talos_e2e::clients::get_once(socket, rig.data(), tls, NAME, "/hello")
        .await
        .map(|(status, _)| status)
}

/// The config's sessions follow a reload: one added opens (its CA made,
/// its trust file written), an unchanged one keeps its CA, one removed
/// ends (its source is refused at once).
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_opens_keeps_and_ends_the_configs_sessions() {
    let rig = rig("").await;
    let first_ca = ca_bytes(&rig);
    let two_ca = rig.dir.join("two-ca.pem");
    let with_two = rig.config("").replacen(
        "[[session]]",
        &format!(
            "[[session]]\nid = \"sess-two\"\ntenant = \"acme\"\nsources = [\"127.0.0.3\"]\nallowlist = [\"{NAME}\"]\ntrust_file = {:?}\n[[session]]",
            two_ca.display().to_string()
        ),
        1,
    );
    rig.gateway.rewrite(&with_two);
    let (ok, out, err) = rig.gateway.command("reload");
    assert!(ok, "{out} {err}");
    assert!(
        out.contains("1 session(s) opened, 0 closed, 1 kept"),
        "{out}"
    );
    assert_eq!(get_from(&rig, "127.0.0.3", &two_ca).await, Ok(200));
    assert_eq!(
        ca_bytes(&rig),
        first_ca,
        "the unchanged session keeps its CA"
    );
    assert_eq!(hello(&rig), 200);

    rig.gateway.rewrite(&rig.config(""));
    let (ok, out, err) = rig.gateway.command("reload");
    assert!(ok, "{out} {err}");
    assert!(
        out.contains("0 session(s) opened, 1 closed, 1 kept"),
        "{out}"
    );
    assert!(
        get_from(&rig, "127.0.0.3", &two_ca).await.is_err(),
        "a session no longer in the config is refused"
    );
    assert_eq!(hello(&rig), 200);
}
