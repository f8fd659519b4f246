//! The store on either database: one schema for both, a PostgreSQL
//! password never shown, a database that goes away and comes back, and
//! writers from several processes taking turns.
//!
//! The rest of this crate's tests run on PostgreSQL too when
//! `TALOS_TEST_STORE=postgres` (`scripts/test.sh` runs them so); these are
//! the ones about the databases themselves.

use std::sync::Arc;

use talos_control_stub::store::{Db, Value};
use talos_control_stub::Store;

mod common;

/// A server for the tests that need one but do not stop it: the test
/// command's (`TALOS_TEST_POSTGRES`), or one of their own.
fn server() -> (Option<common::OwnPostgres>, Db) {
    if std::env::var("TALOS_TEST_POSTGRES").is_ok() {
        (None, common::fresh_postgres_db())
    } else {
        let own = common::OwnPostgres::start();
        let db = own.db();
        (Some(own), db)
    }
}

#[test]
fn both_databases_have_the_same_tables_and_columns() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open(dir.path().join("stub.db")).unwrap();
    let (_own, db) = server();
    let pg = Store::open(&db).unwrap();
    let (a, b) = (sqlite.test_columns().unwrap(), pg.test_columns().unwrap());
    assert!(a.len() > 100, "{a:?}");
    assert_eq!(a, b, "the schemas differ");
    // Opening again changes nothing (the schema is made once).
    let before = pg.test_dump().unwrap();
    drop(pg);
    let pg = Store::open(&db).unwrap();
    assert_eq!(pg.test_dump().unwrap(), before);
}

#[test]
fn a_postgres_password_is_never_shown() {
    let db = Db::parse("postgres://talos:hunter2-Zq9@127.0.0.1:1/stub");
    assert_eq!(db.to_string(), "postgres://talos:***@127.0.0.1:1/stub");
    assert_eq!(format!("{db:?}"), "postgres://talos:***@127.0.0.1:1/stub");
    // Nothing listens on port 1: the error names the database, not the
    // password.
    let err = Store::open(&db).unwrap_err();
    assert_eq!(err.code(), "store_failed");
    let text = format!("{err} {err:?}");
    assert!(text.contains("PostgreSQL unreachable"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");

    // A wrong password is refused, and not repeated either.
    let (_own, good) = server();
    let Db::Postgres(url) = &good else { panic!() };
    let (head, tail) = url.split_once('@').unwrap();
    let user = head.rsplit_once(':').unwrap().0;
    let bad = Db::Postgres(format!("{user}:wrong-Zq9-secret@{tail}"));
    let err = Store::open(&bad).unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("password"), "{text}");
    assert!(!text.contains("wrong-Zq9-secret"), "{text}");
}

#[test]
fn while_postgres_is_down_commands_fail_clearly_and_change_nothing_then_it_reconnects() {
    let pg = common::OwnPostgres::start();
    let db = pg.db();
    let mut store = Store::open(&db).unwrap();
    store.add_member("gw-a", "127.0.0.1:9001").unwrap();
    let before = store.test_dump().unwrap();

    pg.stop();
    let err = store.add_member("gw-b", "127.0.0.1:9002").unwrap_err();
    assert_eq!(err.code(), "store_failed", "{err}");
    let err = store.members().unwrap_err();
    assert_eq!(err.code(), "store_failed", "{err}");
    // The CLI says so and exits 2.
    let out = common::bin(
        &db,
        &["gateway", "add", "gw-c", "--control", "127.0.0.1:9003"],
        b"",
    );
    assert_eq!(out.status, 2, "{out:?}");
    assert_eq!(out.code(), Some("store_failed"), "{out:?}");
    assert!(out.stderr.contains("PostgreSQL"), "{out:?}");
    assert!(!out.stderr.contains(&pg.url), "the password shown: {out:?}");

    // Back: the same store reconnects, and nothing changed meanwhile.
    pg.restart();
    assert_eq!(store.test_dump().unwrap(), before);
    store.add_member("gw-b", "127.0.0.1:9002").unwrap();
    let ids: Vec<String> = store.members().unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(ids, ["gw-a", "gw-b"]);
}

/// Writers in several threads, each with its own connection (as replicas
/// have), each reading then writing in one transaction: every write is
/// made on what the one before it left, so none is lost and no number is
/// handed out twice.
#[test]
fn writers_with_their_own_connections_take_turns() {
    const WRITERS: usize = 4;
    const EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let (_own, pg) = server();
    for db in [Db::File(dir.path().join("stub.db")), pg] {
        let mut store = Store::open(&db).unwrap();
        store
            .test_execute(
                "INSERT INTO members (id, control, added_at) VALUES ('counter', '0', 'x')",
                &[],
            )
            .unwrap();
        let db = Arc::new(db);
        let threads: Vec<_> = (0..WRITERS)
            .map(|_| {
                let db = Arc::clone(&db);
                std::thread::spawn(move || {
                    let mut store = Store::open(&*db).unwrap();
                    for _ in 0..EACH {
                        // Read the count, then write it plus one: a lost
                        // update shows as a count short.
                        store
                            .test_read_modify_write(
                                "SELECT control FROM members WHERE id = 'counter'",
                                "UPDATE members SET control = ?1 WHERE id = 'counter'",
                                |v| match v {
                                    Value::Text(t) => {
                                        Value::Text((t.parse::<u64>().unwrap() + 1).to_string())
                                    }
                                    other => panic!("{other:?}"),
                                },
                            )
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let rows = store
            .test_query("SELECT control FROM members WHERE id = 'counter'", &[])
            .unwrap();
        assert_eq!(
            rows,
            vec![vec![Value::Text((WRITERS * EACH).to_string())]],
            "{db:?}"
        );
    }
}

/// A replica frozen inside a write transaction (it holds the write lock)
/// stops nobody for long: the database ends its session once it has sat
/// idle in the transaction for 5 s, the others' writes go through, and
/// what the frozen one wrote is never committed (its commit fails): it
/// cannot act on a decision it made before the freeze.
#[test]
fn a_replica_frozen_in_a_write_transaction_is_cut_off_and_commits_nothing() {
    let (_own, db) = server();
    let mut store = Store::open(&db).unwrap();
    store.add_member("gw-a", "127.0.0.1:9001").unwrap();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let frozen = {
        let db = db.clone();
        std::thread::spawn(move || {
            let mut store = Store::open(&db).unwrap();
            store.test_write_during(
                "UPDATE members SET control = '127.0.0.1:7777' WHERE id = 'gw-a'",
                || {
                    locked_tx.send(()).unwrap();
                    // Frozen well past the database's 5 s.
                    std::thread::sleep(std::time::Duration::from_secs(9));
                },
            )
        })
    };
    locked_rx.recv().unwrap();
    // Another replica's write waits for the lock, then goes through.
    let mut other = Store::open(&db).unwrap();
    other.add_member("gw-b", "127.0.0.1:9002").unwrap();
    let err = frozen.join().unwrap().unwrap_err();
    assert_eq!(err.code(), "store_failed", "{err}");
    let members: Vec<(String, String)> = store
        .members()
        .unwrap()
        .into_iter()
        .map(|m| (m.id, m.control))
        .collect();
    assert_eq!(
        members,
        [
            ("gw-a".to_owned(), "127.0.0.1:9001".to_owned()),
            ("gw-b".to_owned(), "127.0.0.1:9002".to_owned())
        ]
    );
}

/// The store holds the tenants' secrets: a database on another host is
/// reached over TLS only, its certificate checked (against `sslrootcert`,
/// for the host the URL names); one on this host in clear unless asked.
#[test]
fn a_database_elsewhere_is_reached_over_checked_tls_only() {
    // Refused before any connection is tried (no name is looked up).
    for mode in ["disable", "prefer"] {
        let db = Db::parse(&format!(
            "postgres://talos:pw-Zq9@db.example.invalid:5432/stub?sslmode={mode}"
        ));
        let err = Store::open(&db).unwrap_err();
        assert_eq!(err.code(), "store_failed");
        let text = err.to_string();
        assert!(text.contains("over TLS only"), "{text}");
        assert!(!text.contains("pw-Zq9"), "{text}");
    }

    let pg = common::OwnPostgres::start_tls();
    let ca = pg.ca_file();
    let tls = Db::Postgres(format!(
        "{}?sslmode=require&sslrootcert={}",
        pg.url,
        ca.display()
    ));
    let mut store = Store::open(&tls).unwrap();
    store.add_member("gw-a", "127.0.0.1:9001").unwrap();
    let on_tls = store
        .test_i64("SELECT count(*) FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl")
        .unwrap();
    assert_eq!(on_tls, 1, "the store's connection is TLS");

    // Another CA: the server's certificate is refused.
    let other = tempfile::tempdir().unwrap();
    let other_ca = other.path().join("other-ca.pem");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&other_ca, params.self_signed(&key).unwrap().pem()).unwrap();
    let wrong = Db::Postgres(format!(
        "{}?sslmode=require&sslrootcert={}",
        pg.url,
        other_ca.display()
    ));
    let err = Store::open(&wrong).unwrap_err();
    assert_eq!(err.code(), "store_failed", "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
}

/// A PostgreSQL store made at version 6 is upgraded in place, its rows
/// kept and the sessions' source index filled from them.
#[test]
fn a_postgres_store_of_version_6_is_upgraded_in_place() {
    let (_own, db) = server();
    let Db::Postgres(url) = &db else { panic!() };
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&talos_control_stub::store::postgres_ddl())
        .unwrap();
    client
        .batch_execute(
            "CREATE TABLE schema_version (version BIGINT NOT NULL);
             INSERT INTO schema_version VALUES (6);
             INSERT INTO sessions (id, tenant, mode, state, created_at, allow, attach, sources)
             VALUES ('sbx-000000000001', 'acme', 'commands', 'paused',
                     '2026-11-29T10:00:00.000Z', '[\"api.github.com\"]', '[]',
                     '[\"10.1.0.2\",\"fd00::2\"]');",
        )
        .unwrap();
    drop(client);
    let store = Store::open(&db).unwrap();
    assert_eq!(
        store
            .test_i64("SELECT version FROM schema_version")
            .unwrap(),
        talos_control_stub::store::SCHEMA_VERSION
    );
    for source in ["10.1.0.2", "fd00::2"] {
        let holder = store
            .read(|tx| tx.live_session_with_source(&[source.parse().unwrap()]))
            .unwrap();
        assert_eq!(
            holder.map(|(_, id)| id).as_deref(),
            Some("sbx-000000000001"),
            "{source}"
        );
    }
    // Version 9: the state `failed` is one a session can be in, and no
    // other word is; a hard stop out of its range is refused.
    let mut store = store;
    assert_failed_is_a_state(&mut store);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Store::open(dir.path().join("stub.db")).unwrap();
    assert_eq!(
        sqlite.test_columns().unwrap(),
        store.test_columns().unwrap()
    );
}

/// After an upgrade to version 10, session `sbx-000000000001` can be
/// `failed` and not `bogus`, and its hard stop is checked by the store.
fn assert_failed_is_a_state(store: &mut Store) {
    let id = Value::Text("sbx-000000000001".into());
    let set = |store: &mut Store, sql: &str, v: Value| store.test_execute(sql, &[id.clone(), v]);
    let state = "UPDATE sessions SET state = ?2 WHERE id = ?1";
    set(store, state, Value::Text("failed".into())).unwrap();
    assert!(set(store, state, Value::Text("bogus".into())).is_err());
    let limit = "UPDATE sessions SET stop_after_seconds = ?2 WHERE id = ?1";
    set(store, limit, Value::Int(3_600)).unwrap();
    assert!(set(store, limit, Value::Int(60)).is_err());
}

/// Leases are renewed while another replica holds the write lock (a
/// replica frozen in a write transaction, or several of its connections
/// taking the lock in turn as it is released to them, each held until the
/// database ends it): a renewal round waits for no writer. What it would
/// have written of the members (when each was last seen) waits for the
/// next round; nothing else is skipped.
#[test]
fn renewals_go_on_while_another_replica_holds_the_write_lock() {
    let (_own, db) = server();
    let dir = tempfile::tempdir().unwrap();
    let mut env = common::Env {
        store: Store::open(&db).unwrap(),
        db: db.clone(),
        dir,
        link: talos_control_stub::fake::FakeLink::default(),
    }
    .with_policy();
    let id = env.start(talos_control_stub::Mode::Commands).session_id;
    let key = talos_certs::GatewayKey::generate().unwrap();
    let round = |env: &mut common::Env| {
        talos_control_stub::upkeep::Upkeep {
            store: &mut env.store,
            link: &env.link,
            verifier: &common::ACCEPT,
            plane_key: Some(&key),
            relay_key: None,
        }
        .keep_members()
    };
    // A first round registers both members (their first contact writes).
    round(&mut env).unwrap();

    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let db = db.clone();
        std::thread::spawn(move || {
            let mut store = Store::open(&db).unwrap();
            store.test_write_during("SELECT 1", || {
                locked_tx.send(()).unwrap();
                // Held until the round below has ended.
                let _ = release_rx.recv();
            })
        })
    };
    locked_rx.recv().unwrap();
    let before = env.link.calls().len();
    let r = round(&mut env).expect("a renewal round while the lock is held");
    assert_eq!(r.members_up, ["gw-a", "gw-b"]);
    assert_eq!(r.renewed, 2, "the running session on both members");
    let renewed: Vec<_> = env.link.calls()[before..]
        .iter()
        .filter(|c| matches!(c, talos_control_stub::fake::Call::Renew(_)))
        .cloned()
        .collect();
    assert_eq!(
        renewed.len(),
        1,
        "one renewal call for the pair: {renewed:?}"
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap().unwrap();
    // The lock free again: the round writes as before.
    let r = round(&mut env).unwrap();
    assert_eq!(r.renewed, 2);
    assert!(env.life().status(&id).is_ok());
}

/// Version 12 retires the approvals API's bearer tokens: each approver
/// with a token, and each name a Lock rule names, becomes a person with
/// the role approver and no passkey (so they enrol before deciding), and
/// the tokens are gone. On SQLite from version 11, on PostgreSQL from 6.
#[test]
fn approvers_and_the_names_rules_give_become_people_at_version_12() {
    let rows = "
        INSERT INTO approvers (name, token_sha256, created_at)
        VALUES ('alice', '00ab', '2026-11-29T10:00:00.000Z');
        INSERT INTO lock_rules (id, destination, attachment, method, path_prefix, mode,
                                approvers, created_at)
        VALUES ('lock-1', 'api.github.com', '', 'POST', '/', 'every_request',
                '[\"alice\",\"bob\"]', '2026-11-29T10:00:00.000Z');";
    let check = |store: &Store| {
        let people = store.people_list("2026-11-29T10:00:00.000Z").unwrap();
        let names: Vec<(&str, &str)> = people
            .iter()
            .map(|p| (p.person.name.as_str(), p.person.role.as_str()))
            .collect();
        assert_eq!(names, [("alice", "approver"), ("bob", "approver")]);
        assert!(people.iter().all(|p| p.passkeys.is_empty()));
        assert_eq!(people[0].person.created_at, "2026-11-29T10:00:00.000Z");
        // Their rule stays; a new one naming them waits for their passkey.
        assert_eq!(store.lock_list().unwrap()[0].approvers, ["alice", "bob"]);
        let tables = store.test_columns().unwrap();
        assert!(
            !tables.iter().any(|c| c.starts_with("approvers.")),
            "{tables:?}"
        );
    };

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stub.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(&talos_control_stub::store::ddl_through(11))
        .unwrap();
    conn.execute_batch(rows).unwrap();
    conn.pragma_update(None, "user_version", 11).unwrap();
    drop(conn);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    check(&Store::open(&path).unwrap());

    let (_own, db) = server();
    let Db::Postgres(url) = &db else { panic!() };
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client
        .batch_execute(&talos_control_stub::store::postgres_ddl())
        .unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE schema_version (version BIGINT NOT NULL);
             INSERT INTO schema_version VALUES (6); {rows}"
        ))
        .unwrap();
    drop(client);
    check(&Store::open(&db).unwrap());
}
