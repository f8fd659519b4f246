//! The `control-stub` command line.
//!
//! Every command prints JSON on standard output. A failure prints
//! `error: <code>: <message>` on standard error and exits with status 2
//! (the codes are in [`crate::error`]). No command prints a secret value,
//! and a secret value is never taken from the command line: `secret set`
//! reads it from standard input or from `--from-file`.
//!
//! Commands that change a session reach the gateways through the
//! [`GatewayLink`] given to [`run`]; the others need only the store.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use zeroize::Zeroizing;

use crate::certificate::certificate;
use crate::error::Error;
use crate::lifecycle::{Lifecycle, StartRequest};
use crate::link::{GatewayLink, ReportVerifier};
use crate::lock::NewRule;
use crate::model::{LockMode, Mode};
use crate::names;
use crate::store::{Db, Store, DEFAULT_PATH};

/// Exit status of a command that failed.
pub const EXIT_FAILURE: i32 = 2;

/// A slim, real stand-in for the TALOS control plane: sessions, secrets,
/// the account's egress list and the session certificate.
#[derive(Debug, Parser)]
#[command(name = "control-stub", version)]
pub struct Cli {
    /// The store: a SQLite file (created with mode 0600 on first use), or
    /// a PostgreSQL database that several `serve` replicas share,
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` (the password also from
    /// `PGPASSWORD`; its schema is made on first use).
    #[arg(long, global = true, value_name = "PATH|URL", default_value = DEFAULT_PATH)]
    pub db: Db,
    /// A gateway's control address, `ID=HOST:PORT` (its certificate must
    /// name ID) or `HOST:PORT` (its certificate must name `localhost`);
    /// repeat for each gateway of the pair.
    #[arg(long = "gateway", global = true, value_name = "[ID=]ADDR")]
    pub gateways: Vec<String>,
    /// The directory `init` wrote: the control CA and this stub's
    /// certificate and key, for the control channel.
    #[arg(long, global = true, value_name = "DIR")]
    pub control_dir: Option<PathBuf>,
    /// Who asks: recorded with every command that changes a session
    /// (`sandbox status`, the certificate), not verified. Default:
    /// `TALOS_OPERATOR`, else the login name. For `init`, repeatable: each
    /// operator gets a client certificate under the operator CA.
    #[arg(long = "operator", global = true, value_name = "NAME")]
    pub operators: Vec<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make the control channel's identities in DIR: the control CA, the
    /// control stub's certificate, and one per gateway id; the operator CA,
    /// and a client certificate per `--operator NAME`. Never overwrites.
    /// Each `--gateway ID` (or `ID=ADDR`: the id is used) gets a certificate.
    /// On a directory init wrote before, `--operator NAME` alone adds those
    /// operators (only their files; refused if they exist).
    Init {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Serve the ControlPlane service (the gateways' batches and
    /// proposals) over mutual TLS and run the upkeep loops until SIGTERM,
    /// SIGINT or SIGQUIT, then drain; the people's web app (--web-listen)
    /// and the metrics if asked. Prints one JSON line with the addresses
    /// once listening.
    Serve {
        /// The address to listen on (port 0: any free port).
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
        #[command(flatten)]
        web: crate::people::web::WebArgs,
        /// Serve Prometheus metrics (plain HTTP, GET /metrics) on this
        /// address.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
        /// How often leases are renewed on every gateway given, in
        /// milliseconds (default 10000; at most a third of the gateways'
        /// lease).
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        renew_ms: u64,
        /// How often closes owed are asked again, time-driven events run
        /// and certificates are issued, in milliseconds (default 1000).
        #[arg(long, value_name = "MS", default_value_t = 1_000)]
        tick_ms: u64,
        /// At SIGTERM, SIGINT or SIGQUIT: how long the connections under
        /// way get to finish, from the drain's start, before they are cut,
        /// in milliseconds (default 10000).
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        grace_ms: u64,
    },
    /// Print the control plane's public key, which signs certificates
    /// (`<control-dir>/plane.key`, made if missing): hex, PEM and key id.
    PlaneKey,
    /// Sessions: start, pause, resume, interrupt, recover, stop, revoke-all, status.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// The tenants' secret store. Values are never printed.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// The account policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The gateways whose reports and batches are trusted.
    #[command(subcommand)]
    Gateway(GatewayCommand),
    /// The approval relay's cards: list them, approve or decline one.
    #[command(subcommand)]
    Approvals(ApprovalsCommand),
    /// The people who decide cards and revoke sessions in the web app, and
    /// their passkeys.
    #[command(subcommand)]
    People(PeopleCommand),
    /// Print a session's certificate (JSON), issuing it first if it can be
    /// issued now (needs --control-dir for the signing key). Exits with
    /// certificate_not_issued while it cannot: the session has not ended
    /// with every reset step confirmed, or a gateway's batches through the
    /// end of its part are not all in (a holder's through the end of its
    /// authority, a forwarder's through its hand-off records). `certificate
    /// bundle ID --out FILE` writes the bundle a reviewer checks alone
    /// (docs/records.md, "Verifying a certificate yourself").
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Certificate {
        #[command(subcommand)]
        action: Option<CertificateCommand>,
        /// The session id.
        #[arg(required = true)]
        id: Option<String>,
        /// Print the issued certificate as its signed envelope (kind
        /// `certificate`: the exact payload bytes and the signature), for
        /// checking with openssl (docs/records.md).
        #[arg(long)]
        signed: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertificateCommand {
    /// Write session ID's certificate bundle to FILE (JSON lines, format
    /// `talos-certificate-bundle` version 1): the issued certificate, every
    /// signed batch, report and decision it rests on, and the keys that
    /// signed them bound under the control CA. Needs --control-dir. Issues
    /// the certificate first if it can be issued now.
    Bundle {
        /// The session id.
        id: String,
        /// Where to write it (replaced whole, never left half-written).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Start a session: check the names and attachments, then open it on
    /// the gateways.
    Start {
        /// The tenant the session serves; it attaches that tenant's secrets.
        #[arg(long)]
        tenant: String,
        /// An address the session's connections come from (repeatable).
        #[arg(long = "source", value_name = "ADDR", required = true)]
        sources: Vec<String>,
        /// A destination the session may reach; must be on the egress list
        /// (repeatable).
        #[arg(long = "allow", value_name = "NAME")]
        allow: Vec<String>,
        /// `SECRET=destination:header[:scheme]` (repeatable).
        #[arg(long = "attach", value_name = "SPEC")]
        attach: Vec<String>,
        /// `agent` (default) or `commands`; only `commands` can pause.
        #[arg(long, default_value = "agent", value_parser = parse_mode)]
        mode: Mode,
        /// Mode commands only: pause or end after this many idle seconds
        /// (60-86400, default 900).
        #[arg(long, value_name = "SECONDS")]
        idle_timeout_seconds: Option<u32>,
        /// Mode commands only: `end` (default) or `pause` at the idle timeout.
        #[arg(long, value_name = "ACTION")]
        idle_action: Option<String>,
        /// The hard stop: end the session (`stop_after`) once its attempts
        /// have run this many seconds in all (3600-604800; a pause does not
        /// count). Default: no hard stop.
        #[arg(long = "stop-after", value_name = "SECONDS")]
        stop_after: Option<u64>,
    },
    /// A client attaches: prints the session's status; idle time counts
    /// from now.
    Attach { id: String },
    /// Pause a running session in mode commands.
    Pause { id: String },
    /// Resume a paused session from the current policy and secrets.
    Resume { id: String },
    /// Record an interruption (the instance was lost without a pause).
    Interrupt { id: String },
    /// Recover an interrupted session in mode commands.
    Recover { id: String },
    /// Cancel a session and run the reset.
    Stop { id: String },
    /// Cancel a session as Revoke All and run the reset.
    RevokeAll { id: String },
    /// Show a session: state, attempts, CA digests, drop reports, reset steps.
    Status { id: String },
    /// Print the trust bundle the session's instance is given: the PEM
    /// certificates of the CAs its gateways made for the current attempt
    /// and, when that attempt lists a passthrough name, the public roots
    /// after them (docs/clients.md). A session that is not running has
    /// none (`sandbox_not_running`).
    Trust {
        id: String,
        /// The public roots, a PEM file of CA certificates, for a session
        /// that lists a passthrough name (default: the system's bundle,
        /// /etc/ssl/certs/ca-certificates.crt on Debian). Unread for a
        /// session that lists none.
        #[arg(long, value_name = "FILE")]
        public_roots: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Set a secret from standard input (or --from-file); one trailing
    /// newline is not part of the value.
    Set {
        name: String,
        #[arg(long)]
        tenant: String,
        /// Read the value from this file instead of standard input.
        #[arg(long, value_name = "PATH")]
        from_file: Option<PathBuf>,
    },
    /// Delete a secret. Running sessions keep it until their next resume.
    Delete {
        name: String,
        #[arg(long)]
        tenant: String,
    },
    /// List a tenant's secrets: names and times, never values.
    List {
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// The account's egress list: the names a session may --allow.
    #[command(subcommand)]
    Egress(EgressCommand),
    /// Destinations passed on without termination: the gateway checks
    /// their connections before the TLS handshake as any other's, then
    /// passes the bytes on unread and records the connection alone. The
    /// model route (claude.ai, console.anthropic.com, api.anthropic.com)
    /// is marked from the start. A passthrough destination can carry no
    /// attachment and no Lock rule. Changes reach each session at its next
    /// open.
    #[command(subcommand)]
    Passthrough(PassthroughCommand),
    /// The Lock: which uses need a named person to decide first. Rules
    /// travel to the gateways with each open (start, resume, recover).
    #[command(subcommand)]
    Lock(LockCommand),
    /// The account's lab setting for approvals: `on` lets `approvals
    /// approve|decline --as` decide with the relay's signature alone (no
    /// person's passkey), and the gateways take such decisions for
    /// sessions opened while it is on; `off` (the default) refuses both.
    /// Logged, stored with who set it, carried by every open. `show`
    /// prints it.
    LabApprovals {
        #[arg(value_parser = ["on", "off", "show"])]
        state: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Add a rule; prints it with its id.
    Add {
        /// A destination name, or '*' for any.
        #[arg(long, value_name = "NAME|*")]
        destination: String,
        /// Only requests that carry this attachment (secret name).
        #[arg(long, value_name = "SECRET")]
        attachment: Option<String>,
        /// Only requests with this HTTP method.
        #[arg(long, value_name = "METHOD")]
        method: Option<String>,
        /// Only requests whose path starts with this ('/'...).
        #[arg(long, value_name = "/PREFIX")]
        path_prefix: Option<String>,
        /// first_use (the first matching request under the session's
        /// current authority) or every_request.
        #[arg(long, value_parser = parse_lock_mode)]
        mode: LockMode,
        /// Who may decide (repeatable; at least one).
        #[arg(long = "approver", value_name = "NAME")]
        approvers: Vec<String>,
    },
    /// The rules, oldest first.
    List,
    /// Remove a rule by id.
    Remove { id: String },
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// Pending cards (expired ones are marked so first): id, session,
    /// sentence, digest, approvers, times.
    List {
        /// Only the cards this approver may decide.
        #[arg(long, value_name = "NAME")]
        approver: Option<String>,
        /// Every proposal, whatever its state.
        #[arg(long)]
        all: bool,
    },
    /// Approve a pending proposal: sign the decision with the relay key
    /// and deliver it to the gateway that holds the request.
    Approve {
        id: String,
        /// The approver deciding; must be listed by the proposal and its rule.
        #[arg(long = "as", value_name = "NAME")]
        approver: String,
    },
    /// Decline a pending proposal (signed and delivered as an approval is).
    Decline {
        id: String,
        #[arg(long = "as", value_name = "NAME")]
        approver: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PeopleCommand {
    /// Make a person (if new) and print a one-time enrolment link,
    /// <origin>/enrol#<token>, good for 15 minutes and one passkey.
    Enroll {
        name: String,
        /// approver (decides the cards a rule names them on) or operator
        /// (also sees every session and starts Revoke All).
        #[arg(long, value_parser = parse_role)]
        role: crate::model::Role,
        /// The web app's origin, as serve --web-origin gives it.
        #[arg(long = "web-origin", value_name = "URL")]
        web_origin: String,
    },
    /// The people, their passkeys, open enrolment links and web sessions.
    List,
    /// Remove a person: their passkeys, web sessions, links and push
    /// subscriptions go at once (a Lock rule naming them is kept, and
    /// named in a warning).
    Remove { name: String },
}

#[derive(Debug, Subcommand)]
pub enum PassthroughCommand {
    /// Mark a destination passthrough (refused while a Lock rule names it
    /// or a session not ended attaches a credential to it).
    Add { name: String },
    /// Terminate a destination again like any other.
    Remove { name: String },
    /// The passthrough destinations, sorted.
    List,
}

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    Add { name: String },
    Remove { name: String },
    List,
}

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Register a gateway's id and public key (hex).
    Register {
        id: String,
        #[arg(long, value_name = "HEX")]
        public_key: String,
    },
    /// Add a member of the pair with the address of its control listener
    /// (or move it there): every later CLI call and every `serve` reaches
    /// it there (`--gateway ID=ADDR` on a call still overrides).
    Add {
        id: String,
        #[arg(long, value_name = "HOST:PORT")]
        control: String,
    },
    /// Remove a member (refused while a live session needs it).
    Remove { id: String },
    /// The members and the registered gateways: each with its control
    /// address, key, last contact and chain position.
    List,
}

fn parse_lock_mode(text: &str) -> Result<LockMode, String> {
    LockMode::parse(text)
        .ok_or_else(|| format!("{text:?} is not a mode: first_use or every_request"))
}

fn parse_role(text: &str) -> Result<crate::model::Role, String> {
    crate::model::Role::parse(text)
        .ok_or_else(|| format!("{text:?} is not a role: approver or operator"))
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    Mode::parse(text).ok_or_else(|| format!("{text:?} is not a mode: agent or commands"))
}

/// Parse `args` (program name first) and run; returns the exit status.
/// Usage errors print clap's message and exit 2, as clap does.
pub fn main_with<I, T>(
    args: I,
    link: &dyn GatewayLink,
    verifier: &dyn ReportVerifier,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = write!(stderr, "{}", e.render());
            return if e.use_stderr() { EXIT_FAILURE } else { 0 };
        }
    };
    let result = run(&cli, link, verifier, stdin, stdout, stderr);
    report(result, stderr)
}

/// Who asks, as the command line names them (`--operator`, else
/// `TALOS_OPERATOR` or the login name): one name; several are `init`'s.
fn requester_name(cli: &Cli) -> Result<String, Error> {
    match cli.operators.as_slice() {
        [] => Ok(crate::lifecycle::local_operator()),
        [one] => Ok(one.clone()),
        [_, second, ..] => Err(Error::NameInvalid {
            what: "operator",
            got: second.chars().take(100).collect(),
            reason: "--operator names who asks once; only init takes several".into(),
        }),
    }
}

/// Print `result`'s error, if any, and return the exit status.
pub fn report(result: Result<(), Error>, stderr: &mut dyn Write) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(stderr, "error: {}", e.display_with_code());
            EXIT_FAILURE
        }
    }
}

/// Run one parsed command.
pub fn run(
    cli: &Cli,
    link: &dyn GatewayLink,
    verifier: &dyn ReportVerifier,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), Error> {
    match &cli.command {
        Command::Init { dir } => {
            let ids: Vec<String> = cli
                .gateways
                .iter()
                .map(|g| {
                    g.split_once('=')
                        .map_or(g.as_str(), |(id, _)| id)
                        .to_owned()
                })
                .collect();
            let existing = dir.join(crate::identity::CA_CERT).exists();
            let written = if existing && ids.is_empty() && !cli.operators.is_empty() {
                crate::identity::add_operators(dir, &cli.operators)?
            } else {
                crate::identity::init_with_operators(dir, &ids, &cli.operators)?
            };
            write_out(stdout, &json(&written)?)
        }
        Command::Serve {
            listen,
            web,
            metrics_listen,
            renew_ms,
            tick_ms,
            grace_ms,
        } => crate::server::run(
            crate::server::Settings {
                db: cli.db.clone(),
                control_dir: control_dir(cli, "serve")?.to_owned(),
                gateways: cli.gateways.clone(),
                listen: *listen,
                web: web.config()?,
                metrics: *metrics_listen,
                renew: std::time::Duration::from_millis(*renew_ms),
                tick: std::time::Duration::from_millis(*tick_ms),
                grace: std::time::Duration::from_millis(*grace_ms),
            },
            stdout,
        ),
        Command::PlaneKey => {
            let dir = control_dir(cli, "plane-key")?;
            let key = crate::identity::plane_key(dir)?;
            let public = key.public_key();
            write_out(
                stdout,
                &json(&serde_json::json!({
                    "key_id": key.key_id(),
                    "public_key_hex": hex::encode(public),
                    "public_key_pem": ed25519_pem(&public),
                }))?,
            )
        }
        Command::Sandbox(cmd) => {
            let out = sandbox(cli, cmd, link, verifier, stderr)?;
            write_out(stdout, &out)
        }
        Command::Secret(cmd) => {
            let out = secret(&mut Store::open(&cli.db)?, cmd, stdin)?;
            write_out(stdout, &out)
        }
        Command::Policy(cmd) => {
            let out = policy_command(cli, cmd, stderr)?;
            write_out(stdout, &out)
        }
        Command::Approvals(cmd) => {
            let out = approvals_command(cli, cmd, link)?;
            write_out(stdout, &out)
        }
        Command::People(cmd) => {
            let mut store = Store::open(&cli.db)?;
            // A new enrolment link is shown once, and zeroed after.
            let out = Zeroizing::new(people(&mut store, cmd)?);
            write_out(stdout, &out)
        }
        Command::Gateway(cmd) => {
            let out = gateway(&mut Store::open(&cli.db)?, cmd)?;
            write_out(stdout, &out)
        }
        Command::Certificate {
            action: Some(CertificateCommand::Bundle { id, out }),
            ..
        } => bundle_command(cli, &mut Store::open(&cli.db)?, id, out, stdout),
        Command::Certificate { id, signed, .. } => {
            let id = id.as_deref().unwrap_or_default();
            certificate_command(cli, &mut Store::open(&cli.db)?, id, *signed, stdout)
        }
    }
}

/// `policy …`, by `--operator` (or the local user); turning the
/// relay-only way of deciding on or off is logged on `stderr`.
fn policy_command(cli: &Cli, cmd: &PolicyCommand, stderr: &mut dyn Write) -> Result<String, Error> {
    let by = requester_name(cli)?;
    let out = policy(&mut Store::open(&cli.db)?, cmd, &by)?;
    if let PolicyCommand::LabApprovals { state } = cmd {
        if state != "show" {
            // Logged: who turned the relay-only way of deciding on or off.
            let _ = writeln!(
                stderr,
                "{}",
                serde_json::json!({"lab_approvals": state, "changed_by": by})
            );
        }
    }
    Ok(out)
}

/// `approvals …`: the cards, and deciding one with no person's passkey
/// (only with the account's lab setting on).
fn approvals_command(
    cli: &Cli,
    cmd: &ApprovalsCommand,
    link: &dyn GatewayLink,
) -> Result<String, Error> {
    let mut store = Store::open(&cli.db)?;
    match cmd {
        ApprovalsCommand::List { approver, all } => {
            json(&crate::relay::cards(&mut store, approver.as_deref(), *all)?)
        }
        ApprovalsCommand::Approve { id, approver } | ApprovalsCommand::Decline { id, approver } => {
            let verdict = if matches!(cmd, ApprovalsCommand::Approve { .. }) {
                talos_certs::Verdict::Approved
            } else {
                talos_certs::Verdict::Declined
            };
            // Deciding with no person's passkey is a lab's way only.
            if !store.read(|tx| tx.lab_approvals())? {
                return Err(Error::LabApprovalsOff);
            }
            let key = relay_key(cli)?;
            json(&crate::relay::decide(
                &mut store, link, &key, id, approver, verdict,
            )?)
        }
    }
}

/// `sandbox …`: the session commands, after first contact with the
/// gateways for those that may reach them.
fn sandbox(
    cli: &Cli,
    cmd: &SandboxCommand,
    link: &dyn GatewayLink,
    verifier: &dyn ReportVerifier,
    stderr: &mut dyn Write,
) -> Result<String, Error> {
    let mut store = Store::open(&cli.db)?;
    let (reaches, opens) = match cmd {
        SandboxCommand::Status { .. }
        | SandboxCommand::Trust { .. }
        | SandboxCommand::Attach { .. } => (false, false),
        SandboxCommand::Start { .. }
        | SandboxCommand::Resume { .. }
        | SandboxCommand::Recover { .. } => (true, true),
        SandboxCommand::Pause { .. }
        | SandboxCommand::Interrupt { .. }
        | SandboxCommand::Stop { .. }
        | SandboxCommand::RevokeAll { .. } => (true, false),
    };
    if reaches {
        register_gateways(&mut store, link, stderr)?;
    }
    // The relay's key travels with every open; other transitions do not
    // need it (and must not fail for want of it).
    let relay = match (&cli.control_dir, opens) {
        (Some(dir), true) => Some(crate::identity::relay_key(dir)?.public_key()),
        _ => None,
    };
    let operator = requester_name(cli)?;
    let mut life = Lifecycle::new(&mut store, link, verifier)
        .with_relay_key(relay)
        .with_requester(crate::store::Requester::operator(&operator));
    match cmd {
        SandboxCommand::Start {
            tenant,
            sources,
            allow,
            attach,
            mode,
            idle_timeout_seconds,
            idle_action,
            stop_after,
        } => json(&life.start(&StartRequest {
            tenant: tenant.clone(),
            sources: sources.clone(),
            allow: allow.clone(),
            attach: attach.clone(),
            mode: *mode,
            idle_timeout_seconds: *idle_timeout_seconds,
            idle_action: idle_action.clone(),
            stop_after_seconds: *stop_after,
        })?),
        SandboxCommand::Attach { id } => json(&life.attach(id)?),
        SandboxCommand::Pause { id } => json(&life.pause(id)?),
        SandboxCommand::Resume { id } => json(&life.resume(id)?),
        SandboxCommand::Interrupt { id } => json(&life.interrupt(id)?),
        SandboxCommand::Recover { id } => json(&life.recover(id)?),
        SandboxCommand::Stop { id } => json(&life.stop(id)?),
        SandboxCommand::RevokeAll { id } => {
            // A command-line call names its operator; nothing proves who
            // ran it (the web app's Revoke All is signed by a passkey).
            let mut out = serde_json::to_value(life.revoke_all(id)?)?;
            out["requester"] = serde_json::to_value(crate::store::Requester::operator(&operator))?;
            out["requester"]["note"] =
                "a command-line call: the requester is named, not verified (no passkey signed it)"
                    .into();
            json(&out)
        }
        SandboxCommand::Status { id } => json(&life.status(id)?),
        SandboxCommand::Trust { id, public_roots } => {
            life.trust(id)?.bundle(public_roots.as_deref())
        }
    }
}

/// `secret …`.
fn secret(store: &mut Store, cmd: &SecretCommand, stdin: &mut dyn Read) -> Result<String, Error> {
    match cmd {
        SecretCommand::Set {
            name,
            tenant,
            from_file,
        } => {
            // Check the names before reading a value we would refuse.
            names::tenant(tenant)?;
            names::secret_name(name)?;
            let mut value = Zeroizing::new(Vec::new());
            match from_file {
                Some(path) => {
                    let mut file = std::fs::File::open(path).map_err(|e| Error::Io {
                        what: format!("{}", path.display()),
                        reason: e.to_string(),
                    })?;
                    read_bounded(&mut file, &mut value, &path.display().to_string())?;
                }
                None => read_bounded(stdin, &mut value, "standard input")?,
            }
            names::trim_line_ending(&mut value);
            store.secret_set(tenant, name, &value)?;
            json(&serde_json::json!({"tenant": tenant, "secret": name, "set": true}))
        }
        SecretCommand::Delete { name, tenant } => {
            store.secret_delete(tenant, name)?;
            json(&serde_json::json!({"tenant": tenant, "secret": name, "deleted": true}))
        }
        SecretCommand::List { tenant } => json(&store.secret_list(tenant)?),
    }
}

/// `policy egress …` and `policy lock …`.
fn policy(store: &mut Store, cmd: &PolicyCommand, by: &str) -> Result<String, Error> {
    match cmd {
        PolicyCommand::Egress(EgressCommand::Add { name }) => {
            json(&serde_json::json!({"added": store.egress_add(name)?}))
        }
        PolicyCommand::Egress(EgressCommand::Remove { name }) => {
            json(&serde_json::json!({"removed": store.egress_remove(name)?}))
        }
        PolicyCommand::Egress(EgressCommand::List) => json(&store.egress_list()?),
        PolicyCommand::Passthrough(PassthroughCommand::Add { name }) => {
            json(&serde_json::json!({"passthrough": store.passthrough_add(name)?}))
        }
        PolicyCommand::Passthrough(PassthroughCommand::Remove { name }) => {
            json(&serde_json::json!({"removed": store.passthrough_remove(name)?}))
        }
        PolicyCommand::Passthrough(PassthroughCommand::List) => json(&store.passthrough_list()?),
        PolicyCommand::Lock(LockCommand::Add {
            destination,
            attachment,
            method,
            path_prefix,
            mode,
            approvers,
        }) => {
            let rule = NewRule::check(
                destination,
                attachment.as_deref(),
                method.as_deref(),
                path_prefix.as_deref(),
                *mode,
                approvers,
            )?;
            json(&store.lock_add(&rule)?)
        }
        PolicyCommand::Lock(LockCommand::List) => json(&store.lock_list()?),
        PolicyCommand::LabApprovals { state } if state == "show" => {
            json(&store.lab_approvals_show()?)
        }
        PolicyCommand::LabApprovals { state } => json(&store.set_lab_approvals(state == "on", by)?),
        PolicyCommand::Lock(LockCommand::Remove { id }) => {
            json(&serde_json::json!({"removed": store.lock_remove(id)?}))
        }
    }
}

/// `people …` (the logic is `people::accounts`).
fn people(store: &mut Store, cmd: &PeopleCommand) -> Result<String, Error> {
    use crate::people::accounts;
    let now = std::time::SystemTime::now();
    match cmd {
        PeopleCommand::Enroll {
            name,
            role,
            web_origin,
        } => json(&accounts::enroll(store, name, *role, web_origin, now)?),
        PeopleCommand::List => json(&accounts::list(store, now)?),
        PeopleCommand::Remove { name } => json(&accounts::remove(store, name)?),
    }
}

/// `gateway …`.
fn gateway(store: &mut Store, cmd: &GatewayCommand) -> Result<String, Error> {
    match cmd {
        GatewayCommand::Register { id, public_key } => {
            store.register_gateway(id, public_key)?;
            json(&serde_json::json!({"registered": id}))
        }
        GatewayCommand::Add { id, control } => json(&store.add_member(id, control)?),
        GatewayCommand::Remove { id } => {
            store.remove_member(id)?;
            json(&serde_json::json!({"removed": id}))
        }
        GatewayCommand::List => {
            let members = store.members()?;
            // Each key also as PEM, the form openssl verifies with.
            let mut list = serde_json::to_value(store.gateways()?)?;
            let mut items = list.as_array_mut().map(std::mem::take).unwrap_or_default();
            for g in &mut items {
                let key = g["public_key_hex"]
                    .as_str()
                    .and_then(crate::store::ed25519_key);
                if let Some(key) = key {
                    g["public_key_pem"] = ed25519_pem(&key).into();
                }
                let member = members.iter().find(|m| g["id"] == m.id.as_str());
                g["control"] = member.map(|m| m.control.clone()).into();
            }
            // Members not registered yet (never reached): their address.
            for m in &members {
                if !items.iter().any(|g| g["id"] == m.id.as_str()) {
                    items.push(serde_json::json!({
                        "id": m.id,
                        "control": m.control,
                        "added_at": m.added_at,
                        "public_key_hex": null,
                    }));
                }
            }
            json(&items)
        }
    }
}

/// `certificate ID [--signed]`: issued first when `--control-dir` gives the
/// signing key and it can be; printed, or why it is not issued.
fn certificate_command(
    cli: &Cli,
    store: &mut Store,
    id: &str,
    signed: bool,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    if let Some(dir) = &cli.control_dir {
        let key = crate::identity::plane_key(dir)?;
        store.write(|tx| crate::confirm::reevaluate(tx, id))?;
        crate::certificate::issue(store, id, &key)?;
    }
    if signed {
        return match crate::certificate::signed(store, id)? {
            Some(env) => write_out(stdout, &json(&env)?),
            None => Err(Error::CertificateNotIssued {
                id: id.to_owned(),
                reason: "no certificate is issued yet".into(),
            }),
        };
    }
    let cert = certificate(store, id)?;
    write_out(stdout, &json(&cert)?)?;
    if let Some(reason) = cert.get("not_issued_because").and_then(|r| r.as_str()) {
        return Err(Error::CertificateNotIssued {
            id: id.to_owned(),
            reason: reason.to_owned(),
        });
    }
    if cert.get("issued") != Some(&serde_json::Value::Bool(true)) {
        return Err(Error::CertificateNotIssued {
            id: id.to_owned(),
            reason: "it can be issued, but not without the signing key: give --control-dir DIR"
                .into(),
        });
    }
    Ok(())
}

/// `certificate bundle ID --out FILE`: issued first if it can be, then
/// written with its evidence ([`crate::bundle`]).
fn bundle_command(
    cli: &Cli,
    store: &mut Store,
    id: &str,
    out: &std::path::Path,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let dir = control_dir(cli, "certificate bundle")?;
    let key = crate::identity::existing_plane_key(dir)?;
    store.write(|tx| crate::confirm::reevaluate(tx, id))?;
    crate::certificate::issue(store, id, &key)?;
    let summary = crate::bundle::write_file(store, dir, id, out)?;
    write_out(
        stdout,
        &json(&serde_json::json!({"bundle": out, "written": summary}))?,
    )
}

/// The relay's signing key, from `--control-dir`.
fn relay_key(cli: &Cli) -> Result<talos_certs::GatewayKey, Error> {
    let dir = cli
        .control_dir
        .as_deref()
        .ok_or_else(|| Error::RelayKeyInvalid {
            reason: format!(
                "deciding signs with <control-dir>/{}: give --control-dir DIR",
                crate::identity::RELAY_KEY
            ),
        })?;
    crate::identity::relay_key(dir)
}

/// `--control-dir`, which `what` needs.
fn control_dir<'c>(cli: &'c Cli, what: &str) -> Result<&'c std::path::Path, Error> {
    cli.control_dir.as_deref().ok_or_else(|| Error::Io {
        what: what.to_owned(),
        reason: "--control-dir DIR is needed (the directory init wrote)".into(),
    })
}

/// An Ed25519 public key as a PEM `PUBLIC KEY` (SubjectPublicKeyInfo), the
/// form `openssl pkeyutl -verify -pubin` reads.
pub fn ed25519_pem(public: &[u8; 32]) -> String {
    use base64::Engine as _;
    // SEQUENCE { SEQUENCE { OID 1.3.101.112 } BIT STRING { key } }
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(public);
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(der)
    )
}

/// Ask each gateway who it is and register its key at first contact; a
/// known id with another key is `gateway_key_conflict`: logged, and no
/// authority is opened on it (its word cannot be trusted), but commands go
/// on — a stop or a Revoke All must reach the other members. A gateway
/// that cannot be reached is skipped here: the commands go on through the
/// others.
fn register_gateways(
    store: &mut Store,
    link: &dyn GatewayLink,
    stderr: &mut dyn Write,
) -> Result<(), Error> {
    for reply in link.describe() {
        let Ok(d) = reply.result else {
            continue;
        };
        match store.register_gateway(&d.gateway_id, &d.public_key_hex) {
            Ok(_) => store.keep_key_binding(&d.gateway_id, &d.public_key_hex, &d.key_binding)?,
            // Its word cannot be trusted, but it must not stop a stop or
            // a Revoke All from reaching the others: say so, open nothing
            // there, go on.
            Err(e @ Error::GatewayKeyConflict { .. }) => {
                let _ = writeln!(
                    stderr,
                    "{}",
                    serde_json::json!({"warning": e.code(), "gateway": d.gateway_id, "message": e.to_string(), "action": "no authority is opened on it; closes still reach it"})
                );
                link.distrust(&d.gateway_id);
                continue;
            }
            Err(e) => return Err(e),
        }
        let at = crate::store::now();
        store.write(|tx| tx.gateway_seen(&d.gateway_id, &d.instance, d.lease_ms, &at))?;
    }
    Ok(())
}

/// The members `cli` reaches: [`crate::grpc_link::merge_targets`] of the store's members
/// (when the store exists: a command that needs no store, as `init`,
/// makes none) and `--gateway`.
pub fn gateway_targets(cli: &Cli) -> Result<Vec<String>, Error> {
    let needs_no_store = matches!(cli.command, Command::Init { .. } | Command::PlaneKey);
    if needs_no_store || !cli.db.exists() {
        return Ok(cli.gateways.clone());
    }
    Ok(crate::grpc_link::merge_targets(
        &Store::open(&cli.db)?.members()?,
        &cli.gateways,
    ))
}

/// Read a secret value, at most one byte more than a value may hold (so a
/// value too long is refused by its length, not cut).
fn read_bounded(from: &mut dyn Read, into: &mut Vec<u8>, what: &str) -> Result<(), Error> {
    // + 3: room for the line ending that is trimmed (two bytes), and one more.
    let limit = u64::try_from(names::MAX_SECRET_LEN + 3).unwrap_or(u64::MAX);
    from.take(limit).read_to_end(into).map_err(|e| Error::Io {
        what: what.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(())
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Store(format!("output: {e}")))
}

fn write_out(stdout: &mut dyn Write, text: &str) -> Result<(), Error> {
    writeln!(stdout, "{text}").map_err(|e| Error::Io {
        what: "standard output".into(),
        reason: e.to_string(),
    })
}
