//! The `control-stub` binary: bad inputs give their documented code and
//! change nothing; no output ever holds a secret value.

mod common;

use common::{bin, dump, Env};
use talos_control_stub::cli::main_with;
use talos_control_stub::store::{Db, Value};
use talos_control_stub::{EndReason, FakeLink, FakeVerifier, Mode, State};

/// A value no command may print.
const SECRET: &str = "s3cr3t-Zq9-UNMISTAKABLE-7731";

/// An empty store in a temp dir, with `api.github.com` on the egress list
/// and tenant `acme`'s secret `GH`, set through the binary.
fn setup() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = common::test_db(dir.path());
    let out = bin(&db, &["policy", "egress", "add", "api.github.com"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let out = bin(
        &db,
        &["secret", "set", "GH", "--tenant", "acme"],
        format!("{SECRET}\n").as_bytes(),
    );
    assert_eq!(out.status, 0, "{out:?}");
    (dir, db)
}

/// Run `args`, expect exit status 2 with `code`, and no change to the store.
fn refused(db: impl Into<Db>, args: &[&str], code: &str) {
    let db: Db = db.into();
    let before = dump(&db);
    let out = bin(&db, args, b"");
    assert_eq!(out.status, 2, "{args:?}: {out:?}");
    assert_eq!(out.code(), Some(code), "{args:?}: {out:?}");
    assert!(out.stderr.starts_with(&format!("error: {code}: ")));
    assert_eq!(dump(&db), before, "{args:?} changed the store");
}

#[test]
fn a_name_not_on_the_egress_list() {
    let (_dir, db) = setup();
    refused(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--allow",
            "evil.example.net",
        ],
        "sandbox_destination_not_allowed",
    );
    let out = bin(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "evil.example.net",
        ],
        b"",
    );
    assert!(out.stderr.contains("evil.example.net"), "names the name");
}

#[test]
fn an_unknown_session() {
    let (_dir, db) = setup();
    for cmd in [
        "status",
        "pause",
        "resume",
        "interrupt",
        "recover",
        "stop",
        "revoke-all",
    ] {
        refused(
            &db,
            &["sandbox", cmd, "sbx-000000000000"],
            "sandbox_not_found",
        );
    }
    refused(
        &db,
        &["certificate", "sbx-000000000000"],
        "sandbox_not_found",
    );
}

#[test]
fn a_resume_of_an_ended_session() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().stop(&id).unwrap();
    let db = env.db();
    drop(env.store);
    refused(&db, &["sandbox", "resume", &id], "sandbox_ended");
    refused(&db, &["sandbox", "stop", &id], "sandbox_ended");
    refused(&db, &["sandbox", "pause", &id], "sandbox_not_running");
}

#[test]
fn a_secret_that_does_not_exist() {
    let (_dir, db) = setup();
    refused(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--attach",
            "NOPE=api.github.com:authorization:Bearer",
        ],
        "secret_not_found",
    );
    refused(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "globex",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--attach",
            "GH=api.github.com:authorization:Bearer",
        ],
        "secret_not_found",
    );
    refused(
        &db,
        &["secret", "delete", "NOPE", "--tenant", "acme"],
        "secret_not_found",
    );
}

#[test]
fn other_bad_inputs() {
    let (_dir, db) = setup();
    refused(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--attach",
            "GH=pypi.org:authorization",
        ],
        "sandbox_request_invalid",
    );
    refused(
        &db,
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "not-an-address",
        ],
        "sandbox_request_invalid",
    );
    refused(
        &db,
        &["policy", "egress", "add", "10.0.0.1"],
        "name_invalid",
    );
    refused(
        &db,
        &["policy", "egress", "remove", "pypi.org"],
        "egress_not_found",
    );
    refused(
        &db,
        &["secret", "list", "--tenant", "Bad Tenant"],
        "name_invalid",
    );
    let before = dump(&db);
    let out = bin(&db, &["secret", "set", "E", "--tenant", "acme"], b"\n");
    assert_eq!(out.code(), Some("secret_value_invalid"));
    let out = bin(&db, &["secret", "set", "E", "--tenant", "acme"], b"a\x00b");
    assert_eq!(out.code(), Some("secret_value_invalid"));
    assert!(!out.stderr.contains("a\u{0}b"));
    assert_eq!(dump(&db), before);
}

#[test]
fn commands_that_need_the_gateways_fail_unreachable_without_a_link() {
    let (_dir, db) = setup();
    let start = [
        "sandbox",
        "start",
        "--tenant",
        "acme",
        "--source",
        "10.1.0.2",
        "--allow",
        "api.github.com",
        "--attach",
        "GH=api.github.com:authorization:Bearer",
    ];
    let mut with_gateway = vec!["--gateway", "127.0.0.1:7443"];
    with_gateway.extend(start);
    for (args, ended) in [(&start[..], 1), (&with_gateway[..], 2)] {
        let out = bin(&db, args, b"");
        assert_eq!(out.status, 2, "{args:?}: {out:?}");
        assert_eq!(out.code(), Some("gateway_unreachable"), "{out:?}");
        // The start was recorded before any gateway was asked: it ended
        // `start_failed`, having opened nothing (no CA). A close is owed
        // to the address given, in case the open reached it unseen; none
        // when no gateway was given.
        let store = talos_control_stub::Store::open(&db).unwrap();
        let sessions = store.read(|tx| tx.sessions_in(State::ALL)).unwrap();
        assert_eq!(sessions.len(), ended, "{sessions:?}");
        let mut owed = Vec::new();
        for s in &sessions {
            // It never ran: `failed`, its reset complete.
            assert_eq!(s.state, State::Failed);
            assert_eq!(s.end_reason, Some(EndReason::StartFailed));
            let status = talos_control_stub::lifecycle::status(&store, &s.id).unwrap();
            assert!(status.attempts.iter().all(|a| a.ca.is_empty()));
            owed.extend(status.closes.into_iter().map(|c| c.gateway_id));
        }
        let want: &[&str] = if ended == 1 { &[] } else { &["127.0.0.1:7443"] };
        assert_eq!(owed, want);
    }
    let out = bin(&db, &with_gateway, b"");
    assert!(out.stderr.contains("127.0.0.1:7443"), "{out:?}");
}

/// `sandbox start --stop-after SECONDS`: the range is checked before
/// anything is recorded; a hard stop within it is kept and shown by
/// `sandbox status` (here on a start no gateway opened, which ended
/// before it ran: `failed`).
#[test]
fn the_hard_stop_is_checked_at_start_and_shown_by_status() {
    let (_dir, db) = setup();
    let start = |stop_after: &str| {
        vec![
            "sandbox".to_owned(),
            "start".into(),
            "--tenant".into(),
            "acme".into(),
            "--source".into(),
            "10.1.0.2".into(),
            "--allow".into(),
            "api.github.com".into(),
            "--stop-after".into(),
            stop_after.into(),
        ]
    };
    for bad in ["0", "3599", "604801", "99999999999"] {
        let args = start(bad);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&db, &args, "sandbox_request_invalid");
        let out = bin(&db, &args, b"");
        assert!(out.stderr.contains("outside 3600-604800"), "{bad}: {out:?}");
    }
    let args = start("7200");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bin(&db, &args, b"");
    assert_eq!(out.code(), Some("gateway_unreachable"), "{out:?}");
    let store = talos_control_stub::Store::open(&db).unwrap();
    let id = store.read(|tx| tx.sessions_in(State::ALL)).unwrap()[0]
        .id
        .clone();
    drop(store);
    let out = bin(&db, &["sandbox", "status", &id], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(status["stop_after_seconds"], 7200, "{status}");
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["end_reason"], "start_failed", "{status}");
    assert_eq!(status["compute_seconds"], 0, "{status}");
}

#[test]
fn stopping_a_paused_session_needs_no_gateway() {
    let mut env = Env::new().with_policy();
    let id = env.start(Mode::Commands).session_id;
    env.life().pause(&id).unwrap();
    let db = env.db();
    drop(env.store);
    let out = bin(&db, &["certificate", &id], b"");
    assert_eq!(out.code(), Some("certificate_not_issued"));
    let cert: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cert["issued"], false);

    let out = bin(&db, &["sandbox", "stop", &id], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let t: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(t["state"], "ended");
    // Ended; the certificate waits for the gateways' batches through the
    // end of the authority (their drop reports, in their chains).
    let out = bin(&db, &["certificate", &id], b"");
    assert_eq!(out.code(), Some("certificate_not_issued"));
    assert!(out.stderr.contains("batches through the end"), "{out:?}");
    let mut store = talos_control_stub::Store::open(&db).unwrap();
    store
        .write(|tx| {
            for (i, view) in env.link.chain_reports().iter().enumerate() {
                talos_control_stub::confirm::chain_drop_report(
                    tx,
                    &common::ACCEPT,
                    view,
                    i as u64 + 1,
                )?;
            }
            Ok(())
        })
        .unwrap();
    drop(store);
    // Without the signing key it can be issued but is not.
    let out = bin(&db, &["certificate", &id], b"");
    assert_eq!(out.code(), Some("certificate_not_issued"));
    assert!(out.stderr.contains("--control-dir"), "{out:?}");
    let keys = env.dir.path().join("control");
    std::fs::create_dir_all(&keys).unwrap();
    let keys = keys.to_str().unwrap();
    let out = bin(&db, &["--control-dir", keys, "certificate", &id], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let cert: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cert["issued"], true);
    assert_eq!(cert["kind"], "sandbox session");
    assert!(cert["signature"]["key_id"].as_str().is_some());
    // As a signed envelope, it verifies under the key plane-key prints.
    let out = bin(
        &db,
        &["--control-dir", keys, "certificate", &id, "--signed"],
        b"",
    );
    let env_json: talos_certs::Signed = serde_json::from_str(&out.stdout).unwrap();
    let out = bin(&db, &["--control-dir", keys, "plane-key"], b"");
    let key: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let public: [u8; 32] = hex::decode(key["public_key_hex"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    talos_certs::verify(&public, &env_json).unwrap();
    assert!(key["public_key_pem"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));
}

#[test]
fn secret_set_list_and_delete() {
    let (dir, db) = setup();
    let file = dir.path().join("value");
    std::fs::write(&file, format!("{SECRET}-2\r\n")).unwrap();
    let out = bin(
        &db,
        &["secret", "set", "FILE", "--tenant", "acme", "--from-file"],
        b"",
    );
    assert_eq!(out.status, 2, "clap wants the path: {out:?}");
    let out = bin(
        &db,
        &[
            "secret",
            "set",
            "FILE",
            "--tenant",
            "acme",
            "--from-file",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    let out = bin(&db, &["secret", "list", "--tenant", "acme"], b"");
    let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["FILE", "GH"]);
    assert!(list[0]["updated_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(list[0].as_object().unwrap().len(), 2, "name and time only");
    let out = bin(&db, &["secret", "list", "--tenant", "globex"], b"");
    assert_eq!(out.stdout.trim(), "[]");

    // Stored exactly as given, less the one line ending.
    let stored = talos_control_stub::Store::open(&db)
        .unwrap()
        .test_query(
            "SELECT value FROM secrets WHERE tenant = 'acme' AND name = 'FILE'",
            &[],
        )
        .unwrap();
    assert_eq!(
        stored,
        vec![vec![Value::Blob(format!("{SECRET}-2").into_bytes())]]
    );

    let out = bin(&db, &["secret", "delete", "FILE", "--tenant", "acme"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let out = bin(&db, &["secret", "list", "--tenant", "acme"], b"");
    assert!(!out.stdout.contains("FILE"));
}

/// Every command, through the binary where it needs no gateway and in
/// process with a fake pair where it does: no output holds the value.
#[test]
fn no_output_ever_holds_a_secret_value() {
    let (_dir, db) = setup();
    let mut seen = String::new();
    let mut run_bin = |args: &[&str], stdin: &[u8]| {
        let out = bin(&db, args, stdin);
        seen.push_str(&out.stdout);
        seen.push_str(&out.stderr);
        out
    };
    run_bin(&["secret", "list", "--tenant", "acme"], b"");
    run_bin(&["policy", "egress", "list"], b"");
    run_bin(
        &["secret", "set", "GH", "--tenant", "acme"],
        SECRET.as_bytes(),
    );
    run_bin(
        &["secret", "set", "BAD", "--tenant", "acme"],
        format!("{SECRET}\n\n").as_bytes(),
    );
    run_bin(
        &["secret", "set", "bad name", "--tenant", "acme"],
        SECRET.as_bytes(),
    );
    run_bin(
        &[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "10.1.0.2",
            "--allow",
            "api.github.com",
            "--attach",
            "GH=api.github.com:authorization:Bearer",
        ],
        b"",
    );

    let link = FakeLink::default();
    let verifier = FakeVerifier::accepting();
    let in_process = |args: &[&str]| -> String {
        let db_arg = db.as_arg();
        let mut argv = vec!["control-stub", "--db", db_arg.to_str().unwrap()];
        argv.extend_from_slice(args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = main_with(argv, &link, &verifier, &mut &b""[..], &mut out, &mut err);
        let text = format!(
            "{}{}",
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap()
        );
        assert!(status == 0 || text.contains("error: "), "{text}");
        text
    };
    let started = in_process(&[
        "sandbox",
        "start",
        "--tenant",
        "acme",
        "--source",
        "10.1.0.2",
        "--allow",
        "api.github.com",
        "--attach",
        "GH=api.github.com:authorization:Bearer",
        "--mode",
        "commands",
    ]);
    let t: serde_json::Value = serde_json::from_str(&started).unwrap();
    let id = t["session_id"].as_str().unwrap().to_owned();
    seen.push_str(&started);
    for args in [
        vec!["sandbox", "status", &id],
        vec!["sandbox", "pause", &id],
        vec!["sandbox", "resume", &id],
        vec!["sandbox", "interrupt", &id],
        vec!["sandbox", "recover", &id],
        vec!["certificate", &id],
        vec!["sandbox", "stop", &id],
        vec!["sandbox", "status", &id],
        vec!["certificate", &id],
        vec!["gateway", "list"],
    ] {
        seen.push_str(&in_process(&args));
    }
    assert!(
        link.calls().len() >= 5,
        "the fake pair saw the values: the test reached them"
    );
    assert!(seen.contains(&id));
    assert!(!seen.contains(SECRET), "a command printed the value");
    assert!(!seen.contains("UNMISTAKABLE"));
}

#[test]
fn the_store_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let out = bin(&db, &["policy", "egress", "list"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let mode = std::fs::metadata(&db).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = bin(&db, &["policy", "egress", "list"], b"");
    assert_eq!(out.code(), Some("store_failed"), "{out:?}");
    assert!(out.stderr.contains("chmod 600"));
}

#[test]
fn the_store_is_versioned_and_refuses_a_newer_version() {
    let mut env = Env::new();
    let Db::File(path) = env.db() else {
        assert_eq!(
            env.store
                .test_i64("SELECT version FROM schema_version")
                .unwrap(),
            talos_control_stub::store::SCHEMA_VERSION
        );
        env.store
            .test_execute("UPDATE schema_version SET version = 99", &[])
            .unwrap();
        drop(env.store);
        let err = talos_control_stub::Store::open(&env.db).unwrap_err();
        assert_eq!(err.code(), "store_failed");
        assert!(err.to_string().contains("schema version 99"), "{err}");
        return;
    };
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, talos_control_stub::store::SCHEMA_VERSION);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    drop(env.store);
    let err = talos_control_stub::Store::open(&path).unwrap_err();
    assert_eq!(err.code(), "store_failed");
    assert!(err.to_string().contains("schema version 99"));
}

/// `gateway add`, `list` and `remove`: one list of members with their
/// control addresses; a bad address or id changes nothing; a member a
/// live session needs cannot be removed until the session no longer does.
#[test]
fn members_are_added_listed_and_removed() {
    let mut env = Env::new().with_policy();
    let db = env.db();
    let id = env.start(Mode::Commands).session_id;
    let out = bin(
        &db,
        &["gateway", "add", "gw-a", "--control", "127.0.0.1:9443"],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    let added: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(added["control"], "127.0.0.1:9443", "{added}");
    // Moved: the same member, another address.
    let out = bin(
        &db,
        &[
            "gateway",
            "add",
            "gw-a",
            "--control",
            "gw-a.example.net:8443",
        ],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    let out = bin(
        &db,
        &["gateway", "add", "gw-b", "--control", "[::1]:8443"],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    for bad in [
        "gw-a.example.net",
        "127.0.0.1:0",
        "gw a:1",
        "x-.example:1",
        ":443",
        "h:99999",
    ] {
        refused(
            &db,
            &["gateway", "add", "gw-c", "--control", bad],
            "name_invalid",
        );
    }
    refused(
        &db,
        &["gateway", "add", "", "--control", "127.0.0.1:1"],
        "name_invalid",
    );
    let out = bin(&db, &["gateway", "list"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let shown: Vec<(&str, &str)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["id"].as_str().unwrap(),
                g["control"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [("gw-a", "gw-a.example.net:8443"), ("gw-b", "[::1]:8443")],
        "{list}"
    );
    // Both hold the session's authority: neither can go.
    refused(&db, &["gateway", "remove", "gw-a"], "gateway_in_use");
    refused(&db, &["gateway", "remove", "gw-c"], "gateway_not_found");
    // Stopped, both closes confirmed: nothing needs them any more.
    let t = env.life().stop(&id).unwrap();
    assert_eq!(t.state, State::Ended, "{t:?}");
    let out = bin(&db, &["gateway", "remove", "gw-a"], b"");
    assert_eq!(out.status, 0, "{out:?}");
    let out = bin(&db, &["gateway", "list"], b"");
    let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let gw_a = list.as_array().unwrap().iter().find(|g| g["id"] == "gw-a");
    assert!(
        gw_a.is_none_or(|g| g["control"].is_null()),
        "gw-a has no address any more: {list}"
    );
}

/// `serve` with a live session on a member it has no control address for
/// refuses to start, naming the member and the session; with the address
/// stored, the same check passes.
#[test]
fn serve_refuses_to_start_with_live_sessions_on_unaddressed_members() {
    let mut env = Env::new().with_policy();
    let db = env.db();
    let id = env.start(Mode::Agent).session_id;
    let control = env.dir.path().join("control");
    let out = bin(
        &db,
        &[
            "init",
            "--dir",
            control.to_str().unwrap(),
            "--gateway",
            "gw-a",
            "--gateway",
            "gw-b",
        ],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    // gw-a is given on the command line, gw-b nowhere.
    let db_arg = db.as_arg();
    let args = |control: &std::path::Path| -> Vec<String> {
        [
            "--db",
            db_arg.to_str().unwrap(),
            "--control-dir",
            control.to_str().unwrap(),
            "--gateway",
            "gw-a=127.0.0.1:1",
            "serve",
            "--listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(env!("CARGO_BIN_EXE_control-stub"))
        .args(args(&control))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: gateway_unaddressed: "),
        "{stderr}"
    );
    assert!(stderr.contains("gw-b (1 live sessions: "), "{stderr}");
    assert!(stderr.contains(&id), "{stderr}");
    assert!(!stderr.contains("gw-a ("), "gw-a has an address: {stderr}");
    // With gw-b's address stored, it starts: its ready line comes, and it
    // is stopped by its PID.
    let out = bin(
        &db,
        &["gateway", "add", "gw-b", "--control", "127.0.0.1:2"],
        b"",
    );
    assert_eq!(out.status, 0, "{out:?}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .args(args(&control))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    );
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    assert!(line.contains("\"listening\""), "{line:?}");
}
