//! The members of a pair under the control stub, as operators run them:
//! `control-stub init` makes the control channel's identities, each member
//! is a `gateway` process shipping its batches to `control-stub serve`,
//! and the test drives sessions with the `control-stub` CLI given every
//! member's control address.
//!
//! [`PairBuilder`] holds what the tests vary: the members' ids (two by
//! default; one for the single-member tests), their lease, more
//! `[control]` and `[limits]` lines, whether `serve` is given the members
//! (to renew their leases and ask owed closes again), the account's egress
//! list and the tenant's secrets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{blocking, Process};
use crate::gateway::{Gateway, TestConfig};
use crate::origin::LoopbackOrigin;
use crate::stub::{Ran, Stub};
use crate::wait;

/// The members of a pair.
pub const IDS: [&str; 2] = ["gw-a", "gw-b"];
/// `serve --renew-ms` when it is given the members: a sixth of a 3 s
/// lease, as the defaults are (10 s of 60 s).
pub const RENEW_MS: u64 = 500;
/// `serve --tick-ms` when it is given the members: closes owed asked
/// again, certificates issued.
pub const TICK_MS: u64 = 100;

/// A port for a listener whose address its peers must know before it
/// starts (the member link, a stored member's control listener).
fn reserve_port() -> SocketAddr {
    crate::ports::reserve()
}

/// One line of the fault matrix, printed so a run shows what was tried,
/// what was seen and how long the command took.
pub fn matrix(fault: &str, command: &str, seen: &str, took: Duration) {
    eprintln!(
        "fault-matrix | {fault} | {command} | {seen} | {} ms",
        took.as_millis()
    );
}

/// What a [`Pair`] is started with.
#[derive(Debug, Clone)]
pub struct PairBuilder {
    ids: Vec<String>,
    lease: Option<Duration>,
    control: String,
    limits: String,
    renewing: bool,
    linked: bool,
    /// More lines for every member's `[pair]` table, when linked.
    pair: String,
    /// The members stored (`gateway add`) before anything starts.
    stored: bool,
    /// More `serve` replicas over the same store.
    replicas: usize,
    /// The store: a PostgreSQL database's URL, or the stub's SQLite file.
    store: Option<String>,
    /// Gateway identities `init` issues beside the members' (no member
    /// runs with them: another pair's, say).
    identities: Vec<String>,
    egress: Vec<String>,
    secrets: Vec<(String, String)>,
    /// Each member answers the sessions' DNS (`[dns]`).
    dns: bool,
    /// More lines for every member's `[dns]` table.
    dns_lines: String,
}

/// The members (each `gateway` process in `dir/<id>`, its spool in
/// `dir/<id>/spool`), the control stub, and what is behind the members.
/// Every process is stopped when it drops.
#[derive(Debug)]
pub struct Pair<G: Process = Gateway, P = LoopbackOrigin> {
    // Fields drop in this order: the members stop before `serve`, the
    // peers and the folder go.
    pub members: Vec<G>,
    pub stub: Stub,
    /// More `serve` replicas over the stub's store, when asked.
    pub replicas: Vec<Stub>,
    /// What is behind the members: the origin and the DNS server.
    pub peers: P,
    pub dir: PathBuf,
    /// Each member's control address, kept across its restarts so `serve`
    /// and the CLI reach the new process where they reached the old one.
    pub controls: Vec<SocketAddr>,
    /// Each member's member-link address (`[pair] listen`), when the pair
    /// is linked; kept across restarts, as its peers' configs name it.
    pub pair_links: Vec<SocketAddr>,
    /// Each member's DNS answerer (`[dns] listen`), when asked; kept
    /// across restarts, as a session's resolver configuration names it.
    pub answerers: Vec<SocketAddr>,
    ids: Vec<String>,
    /// Every member's config but its id and `[control]` table.
    config: TestConfig,
    /// The `[control]` lines after `plane` and `spool_dir`.
    control: String,
    /// The `[pair]` lines after `listen` and `peers`.
    pair: String,
    /// The `[dns]` lines after `listen` and `record_interval_ms`.
    dns_lines: String,
    _tmp: tempfile::TempDir,
}

impl Pair {
    /// Two members, `gw-a` and `gw-b`, `shutdown_grace_ms = 3000`.
    pub fn builder() -> PairBuilder {
        PairBuilder {
            ids: IDS.iter().map(|s| (*s).to_owned()).collect(),
            lease: None,
            control: String::new(),
            limits: "shutdown_grace_ms = 3000".into(),
            renewing: false,
            linked: false,
            pair: String::new(),
            stored: false,
            replicas: 0,
            store: None,
            identities: Vec::new(),
            egress: Vec::new(),
            dns: false,
            dns_lines: String::new(),
            secrets: Vec::new(),
        }
    }
}

impl PairBuilder {
    /// Other members (one, for the tests of a single member).
    pub fn ids(mut self, ids: &[&str]) -> Self {
        self.ids = ids.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Every authority's lease on the members (`[control] lease_ms`).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// More lines for every member's `[control]` table.
    pub fn control(mut self, lines: &str) -> Self {
        self.control = lines.to_owned();
        self
    }

    /// The members' `[limits]` lines, in place of the grace of 3 s.
    pub fn limits(mut self, limits: &str) -> Self {
        self.limits = limits.to_owned();
        self
    }

    /// `serve` given the members: it renews their leases (every
    /// [`RENEW_MS`]), asks owed closes again and issues certificates
    /// (every [`TICK_MS`]).
    pub fn renewing(mut self) -> Self {
        self.renewing = true;
        self
    }

    /// The members linked (`[pair]`): each forwards the connections of
    /// sessions only its peers hold to them.
    pub fn linked(mut self) -> Self {
        self.linked = true;
        self
    }

    /// The members linked, with `lines` more in their `[pair]` table (its
    /// bounds, say).
    pub fn linked_with(mut self, lines: &str) -> Self {
        self.linked = true;
        self.pair = lines.to_owned();
        self
    }

    /// Each member answers the sessions' DNS (`[dns]`), on a port of
    /// 127.0.0.1 reserved for it and kept across its restarts
    /// ([`Pair::answerers`]).
    pub fn dns(mut self) -> Self {
        self.dns = true;
        self
    }

    /// [`dns`](PairBuilder::dns), with more lines for every member's
    /// `[dns]` table (`queries_per_second = 5000`, say).
    pub fn dns_with(mut self, lines: &str) -> Self {
        self.dns = true;
        self.dns_lines = lines.to_owned();
        self
    }

    /// As an operator deploys: each member's control address reserved and
    /// stored (`gateway add ID --control ADDR`) before anything starts,
    /// then `serve` (renewing, given no `--gateway`: it reads the store),
    /// then the members, whose first batches are their first contact.
    pub fn stored(mut self) -> Self {
        self.stored = true;
        self.renewing = true;
        self
    }

    /// `n` more `serve` replicas over the same store (with [`stored`]:
    /// each reads the members from it), started after the first; every
    /// member's `control.plane` names them all, the first first.
    ///
    /// [`stored`]: PairBuilder::stored
    pub fn replicas(mut self, n: usize) -> Self {
        assert!(self.stored, "replicas read the members from the store");
        self.replicas = n;
        self
    }

    /// The store in the PostgreSQL database at `url` (a
    /// [`crate::postgres::Postgres`]'s), as replicas on several hosts
    /// share it, instead of a SQLite file.
    pub fn store(mut self, url: &str) -> Self {
        self.store = Some(url.to_owned());
        self
    }

    /// Gateway identities issued by `init` beside the members', for no
    /// member (a gateway of another pair under the same CA).
    pub fn identities(mut self, ids: &[&str]) -> Self {
        self.identities = ids.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// The account's egress list.
    pub fn egress(mut self, names: &[&str]) -> Self {
        self.egress = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// A secret of tenant `acme`.
    pub fn secret(mut self, name: &str, value: &str) -> Self {
        self.secrets.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Start it behind one origin serving `names` (see
    /// [`LoopbackOrigin::serving`]).
    pub async fn start_loopback<G: Process>(self, names: &[&str]) -> Pair<G> {
        let (tmp, peers, base) = super::loopback(names).await;
        self.start(tmp, peers, base)
    }

    /// Start it in `tmp`, behind `peers`, every member's config from
    /// `base` (what reaches the peers).
    pub fn start<G: Process, P>(
        self,
        tmp: tempfile::TempDir,
        peers: P,
        base: TestConfig,
    ) -> Pair<G, P> {
        let dir = tmp.path().to_owned();
        let ids: Vec<&str> = self
            .ids
            .iter()
            .chain(&self.identities)
            .map(String::as_str)
            .collect();
        let mut stub = Stub::init(&dir, &ids);
        if let Some(url) = &self.store {
            stub.db = url.into();
        }
        // Stored members: their addresses first, then serve reads them.
        let mut controls = Vec::new();
        if self.stored {
            for id in &self.ids {
                let addr = reserve_port();
                stub.run(
                    &[],
                    &["gateway", "add", id, "--control", &addr.to_string()],
                    b"",
                )
                .json();
                controls.push(addr);
            }
            stub.serve_args = serve_args();
        }
        // The members need serve's address, and serve the members': serve
        // first, for its address; then the members; then, if it is to be
        // given them on the command line, serve again on the same address.
        stub.start_serve();
        let mut replicas = Vec::new();
        for i in 0..self.replicas {
            let mut r = stub.replica(&format!("replica-{}", i + 1));
            r.start_serve();
            replicas.push(r);
        }
        let lease = self
            .lease
            .map_or(String::new(), |l| format!("lease_ms = {}\n", l.as_millis()));
        let mut pair: Pair<G, P> = Pair {
            members: Vec::new(),
            stub,
            replicas,
            peers,
            dir,
            controls,
            pair_links: if self.linked {
                self.ids.iter().map(|_| reserve_port()).collect()
            } else {
                Vec::new()
            },
            answerers: if self.dns {
                self.ids
                    .iter()
                    .map(|_| crate::ports::reserve_both())
                    .collect()
            } else {
                Vec::new()
            },
            ids: self.ids,
            dns_lines: self.dns_lines,
            config: TestConfig {
                limits: self.limits,
                ..base
            },
            // Batches every 50 ms, so that tests see them soon, unless the
            // builder's lines say otherwise.
            control: if self.control.contains("batch_interval_ms") {
                format!("{lease}{}", self.control)
            } else {
                format!("batch_interval_ms = 50\n{lease}{}", self.control)
            },
            pair: self.pair,
            _tmp: tmp,
        };
        // Every member's control address is fixed before it starts (a
        // reserved port, outside the ephemeral range), so that a member
        // started again finds its port free, whoever dialled it meanwhile.
        if !self.stored {
            pair.controls = pair.ids.iter().map(|_| reserve_port()).collect();
        }
        for i in 0..pair.ids.len() {
            let g = pair.start_member(i);
            if !self.stored {
                assert_eq!(
                    g.control(),
                    pair.controls[i],
                    "the member listens where told"
                );
                // In the store too, as an operator adds a member: a serve
                // started again later (with live sessions on the members)
                // must know where they are.
                let addr = g.control().to_string();
                pair.stub
                    .run(
                        &[],
                        &["gateway", "add", &pair.ids[i], "--control", &addr],
                        b"",
                    )
                    .json();
            }
            pair.members.push(g);
        }
        if self.renewing && !self.stored {
            assert!(pair.stub.stop_serve(), "serve drains and exits 0");
            pair.stub.serve_gateways = pair.links();
            pair.stub.serve_args = serve_args();
            pair.stub.start_serve();
        }
        for name in &self.egress {
            pair.cli(&["policy", "egress", "add", name]).json();
        }
        for (name, value) in &self.secrets {
            pair.set_secret(name, value);
        }
        pair
    }
}

/// `serve`'s arguments in a renewing pair.
fn serve_args() -> Vec<String> {
    vec![
        "--renew-ms".into(),
        RENEW_MS.to_string(),
        "--tick-ms".into(),
        TICK_MS.to_string(),
    ]
}

impl<G: Process, P> Pair<G, P> {
    /// Start member `i` in `dir/<id>`, on its reserved control address.
    fn start_member(&self, i: usize) -> G {
        let id = &self.ids[i];
        let dir = self.dir.join(id);
        std::fs::create_dir_all(&dir).expect("member dir");
        let mut files = self.stub.gateway_files(id, &dir);
        if let Some(addr) = self.controls.get(i) {
            files.listen = addr.to_string();
        }
        let planes: Vec<String> = std::iter::once(&self.stub)
            .chain(&self.replicas)
            .map(|s| format!("\"{}\"", s.serve_addr.expect("serve started")))
            .collect();
        files.extra = format!(
            "plane = [{}]\nspool_dir = {:?}\n{}",
            planes.join(", "),
            dir.join("spool").display().to_string(),
            self.control,
        );
        let pair = match self.pair_links.get(i) {
            Some(listen) => {
                let peers = self
                    .ids
                    .iter()
                    .zip(&self.pair_links)
                    .filter(|(peer, _)| *peer != id)
                    .map(|(peer, link)| format!("{{ id = {peer:?}, link = \"{link}\" }}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("listen = \"{listen}\"\npeers = [{peers}]\n{}", self.pair)
            }
            None => String::new(),
        };
        let answerer = self.answerers.get(i).map_or(String::new(), |a| {
            format!(
                "listen = \"{a}\"\nrecord_interval_ms = 1000\n{}",
                self.dns_lines
            )
        });
        let config = TestConfig {
            gateway_id: id.clone(),
            control: Some(files),
            pair,
            answerer,
            ..self.config.clone()
        };
        G::start(&dir, &G::toml(&config, &dir))
    }

    /// Wait until every member is registered in the store (its key taken
    /// at its first batch): what a stored pair's tests begin with.
    pub fn wait_registered(&self) {
        crate::wait::until("every member registered", || {
            let list = self.stub.run(&[], &["gateway", "list"], b"").json();
            crate::wait::check(list, |l| {
                self.ids.iter().all(|g| {
                    l.as_array()
                        .into_iter()
                        .flatten()
                        .any(|m| m["id"] == g.as_str() && m["public_key_hex"].is_string())
                })
            })
        });
    }

    /// Start member `i` again where it was (same control address, spool
    /// and journal) after it stopped or was killed.
    pub fn restart(&mut self, i: usize) {
        // The old one goes first: a `Member`'s drop stops every process
        // started with its config, which the new one is.
        drop(self.members.remove(i));
        let g = self.start_member(i);
        self.members.insert(i, g);
    }

    /// Every member as `--gateway ID=ADDR` gives it.
    pub fn links(&self) -> Vec<(String, SocketAddr)> {
        self.ids
            .iter()
            .cloned()
            .zip(self.controls.clone())
            .collect()
    }

    /// One CLI command given every member.
    pub fn cli(&self, args: &[&str]) -> Ran {
        blocking(|| self.stub.run(&self.links(), args, b""))
    }

    /// A CLI command, timed.
    pub fn timed(&self, args: &[&str]) -> (Ran, Duration) {
        let t = Instant::now();
        let ran = self.cli(args);
        (ran, t.elapsed())
    }

    /// Set secret `name` of tenant `acme` to `value`.
    pub fn set_secret(&self, name: &str, value: &str) {
        blocking(|| {
            self.stub.run(
                &[],
                &["secret", "set", name, "--tenant", "acme"],
                value.as_bytes(),
            )
        })
        .json();
    }

    /// `sandbox start` as `spec` says; it must be running. Its id and what
    /// the command printed.
    pub fn start(&self, spec: &SessionSpec) -> (String, Value) {
        let args = spec.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let t = self.cli(&args).json();
        assert_eq!(t["state"], "running", "{t}");
        let id = t["session_id"].as_str().expect("session id").to_owned();
        (id, t)
    }

    /// [`Pair::start`], and every member must have opened it (one CA
    /// each); its id.
    pub fn start_session(&self, spec: &SessionSpec) -> String {
        let (id, t) = self.start(spec);
        assert_eq!(
            t["ca"].as_array().map(Vec::len),
            Some(self.members.len()),
            "{t}"
        );
        id
    }

    /// `policy lock add`: a Lock rule holding every `method` under `prefix`
    /// at `destination`, each request on its own card, `approver`
    /// deciding (enrolled first, with a passkey, through the web app: a
    /// rule names only approvers who hold one); what the command printed
    /// (the rule). The account is put in lab mode (`policy lab-approvals
    /// on`), so that `approvals approve --as` decides as these tests do;
    /// [`Pair::lock_for_people`] leaves it off.
    pub fn lock(&self, destination: &str, method: &str, prefix: &str, approver: &str) -> Value {
        let lab = self.cli(&["policy", "lab-approvals", "on"]);
        assert_eq!(lab.status, 0, "{}", lab.stderr);
        self.lock_for_people(destination, method, prefix, approver)
    }

    /// [`Pair::lock`] without the lab setting: only the approver's own
    /// passkey decides.
    pub fn lock_for_people(
        &self,
        destination: &str,
        method: &str,
        prefix: &str,
        approver: &str,
    ) -> Value {
        self.lock_mode(destination, method, prefix, approver, "every_request")
    }

    /// [`Pair::lock_for_people`] with the rule's `mode`: `every_request`
    /// or `first_use`.
    pub fn lock_mode(
        &self,
        destination: &str,
        method: &str,
        prefix: &str,
        approver: &str,
        mode: &str,
    ) -> Value {
        self.stub.approver(approver);
        self.lock_rule(destination, method, prefix, &[approver], mode)
    }

    /// `policy lock add` with nobody enrolled first (a rule names only
    /// approvers who hold a passkey, enrolled already or refused): what
    /// the command printed.
    pub fn lock_rule(
        &self,
        destination: &str,
        method: &str,
        prefix: &str,
        approvers: &[&str],
        mode: &str,
    ) -> Value {
        let mut args = vec![
            "policy",
            "lock",
            "add",
            "--destination",
            destination,
            "--method",
            method,
            "--path-prefix",
            prefix,
            "--mode",
            mode,
        ];
        for a in approvers {
            args.extend(["--approver", a]);
        }
        self.cli(&args).json()
    }

    /// `sandbox status`.
    pub fn status(&self, id: &str) -> Value {
        self.cli(&["sandbox", "status", id]).json()
    }

    /// The session's trust bundle as `sandbox trust` gives it, written to
    /// `dir/<file>`; with the SHA-384 digest of each CA in it, in order.
    pub fn trust(&self, id: &str, file: &str) -> (PathBuf, Vec<String>) {
        let ran = self.cli(&["sandbox", "trust", id]);
        assert_eq!(ran.status, 0, "{}", ran.stderr);
        let path = self.dir.join(file);
        std::fs::write(&path, &ran.stdout).expect("write bundle");
        let digests = rustls_pemfile::certs(&mut ran.stdout.as_bytes())
            .map(|c| talos_certs::sha384_hex(c.expect("PEM").as_ref()))
            .collect();
        (path, digests)
    }

    /// The digests of the CAs the current attempt made, by member.
    pub fn digests(&self, id: &str) -> BTreeMap<String, String> {
        let status = self.status(id);
        let last = status["attempts"]
            .as_array()
            .and_then(|a| a.last())
            .expect("an attempt")
            .clone();
        last["ca"]
            .as_array()
            .expect("cas")
            .iter()
            .map(|c| {
                (
                    c["gateway_id"].as_str().expect("gateway id").to_owned(),
                    c["digest"].as_str().expect("digest").to_owned(),
                )
            })
            .collect()
    }

    /// Wait until `sandbox trust` lists exactly `want` (digests, any order).
    pub fn wait_trust(&self, id: &str, file: &str, want: &[&str]) -> PathBuf {
        let mut want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        wait::until(&format!("sandbox trust to list exactly {want:?}"), || {
            let (path, mut got) = self.trust(id, file);
            got.sort();
            if got == want {
                Ok(path)
            } else {
                Err(got)
            }
        })
    }

    /// Wait until the session's certificate is issued; returns it.
    pub fn wait_issued(&self, id: &str) -> Value {
        let cert = blocking(|| {
            self.stub
                .wait_certificate(id, wait::DEADLINE.as_secs(), |c| c["issued"] == true)
        });
        assert_eq!(cert["issued"], true, "certificate not issued: {cert}");
        cert
    }

    /// `control-stub certificate bundle ID --out FILE` into the rig's
    /// folder: the bundle's path.
    pub fn bundle(&self, id: &str, file: &str) -> PathBuf {
        let path = self.dir.join(file);
        let out = self
            .cli(&[
                "certificate",
                "bundle",
                id,
                "--out",
                path.to_str().expect("utf-8"),
            ])
            .json();
        assert_eq!(out["written"]["session_id"], id, "{out}");
        path
    }

    /// The signed envelope of the issued certificate, as text.
    pub fn signed_certificate(&self, id: &str) -> String {
        let ran = self.cli(&["certificate", id, "--signed"]);
        assert_eq!(ran.status, 0, "{}", ran.stderr);
        ran.stdout
    }
}

impl<P> Pair<Gateway, P> {
    /// Every record of every member so far.
    pub fn records(&self) -> Vec<Value> {
        self.members.iter().flat_map(Gateway::records).collect()
    }
}

impl<G: Process, P> Drop for Pair<G, P> {
    /// A failing test shows what the members and `serve` logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (id, g) in self.ids.iter().zip(&self.members) {
                eprintln!("{id}'s log:\n{}", g.log());
            }
            eprintln!("serve's log:\n{}", self.stub.serve_log());
        }
    }
}

/// A `sandbox start`: tenant `acme`, a source, the names it may reach, the
/// secrets attached, its mode (`commands` unless said).
#[derive(Debug, Clone)]
pub struct SessionSpec {
    source: String,
    allow: Vec<String>,
    attach: Vec<String>,
    mode: String,
}

impl SessionSpec {
    /// A session in mode `commands` from `source`, allowed nothing yet.
    pub fn from(source: &str) -> SessionSpec {
        SessionSpec {
            source: source.to_owned(),
            allow: Vec::new(),
            attach: Vec::new(),
            mode: "commands".into(),
        }
    }

    /// Allowed `name` too.
    pub fn allow(mut self, name: &str) -> SessionSpec {
        self.allow.push(name.to_owned());
        self
    }

    /// With `SECRET=destination:header[:scheme]` attached too.
    pub fn attach(mut self, attachment: &str) -> SessionSpec {
        self.attach.push(attachment.to_owned());
        self
    }

    /// In another mode (`agent`).
    pub fn mode(mut self, mode: &str) -> SessionSpec {
        self.mode = mode.to_owned();
        self
    }

    /// The CLI's arguments.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["sandbox", "start", "--tenant", "acme", "--source"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.push(self.source.clone());
        for name in &self.allow {
            args.push("--allow".into());
            args.push(name.clone());
        }
        for a in &self.attach {
            args.push("--attach".into());
            args.push(a.clone());
        }
        args.push("--mode".into());
        args.push(self.mode.clone());
        args
    }
}
