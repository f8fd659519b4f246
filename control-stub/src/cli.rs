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
use crate::store::{Store, DEFAULT_PATH};

/// Exit status of a command that failed.
pub const EXIT_FAILURE: i32 = 2;

/// A slim, real stand-in for the TALOS control plane: sessions, secrets,
/// the account's egress list and the session certificate.
#[derive(Debug, Parser)]
#[command(name = "control-stub", version)]
pub struct Cli {
    /// The store (SQLite). Created with mode 0600 on first use.
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_PATH)]
    pub db: PathBuf,
    /// A gateway's control address, `ID=HOST:PORT` (its certificate must
    /// name ID) or `HOST:PORT` (its certificate must name `localhost`);
    /// repeat for each gateway of the pair.
    #[arg(long = "gateway", global = true, value_name = "[ID=]ADDR")]
    pub gateways: Vec<String>,
    /// The directory `init` wrote: the control CA and this stub's
    /// certificate and key, for the control channel.
    #[arg(long, global = true, value_name = "DIR")]
    pub control_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make the control channel's identities in DIR: the control CA, the
    /// control stub's certificate, and one per gateway id. Never overwrites.
    /// Each `--gateway ID` (or `ID=ADDR`: the id is used) gets a certificate.
    Init {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Serve the ControlPlane service (the gateways' batches and
    /// proposals) over mutual TLS until SIGTERM or SIGINT, and the
    /// approvals API if asked. Prints one JSON line with the addresses once
    /// listening.
    Serve {
        /// The address to listen on (port 0: any free port).
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Also serve the approvers' JSON API over HTTPS (TLS 1.3, the
        /// stub's certificate) on this address; decisions made there go to
        /// the gateways given with --gateway ID=ADDR.
        #[arg(long, value_name = "ADDR")]
        approvals_listen: Option<std::net::SocketAddr>,
    },
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
    /// Who may use the approvals API: each approver has a bearer token.
    #[command(subcommand)]
    Approvers(ApproversCommand),
    /// Print a session's certificate (JSON). Exits with certificate_not_issued
    /// while the session has not ended with every reset step confirmed.
    Certificate {
        /// The session id.
        id: String,
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
    },
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
    /// certificates of the CAs its gateways made for the current attempt.
    /// A session that is not running has none (`sandbox_not_running`).
    Trust { id: String },
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
    /// The Lock: which uses need a named person to decide first. Rules
    /// travel to the gateways with each open (start, resume, recover).
    #[command(subcommand)]
    Lock(LockCommand),
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
pub enum ApproversCommand {
    /// Give an approver a bearer token for the approvals API; the token is
    /// printed once and only its SHA-256 is kept.
    Add { name: String },
    /// The approvers with a token (names and times).
    List,
    /// Take an approver's token away.
    Remove { name: String },
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
    List,
}

fn parse_lock_mode(text: &str) -> Result<LockMode, String> {
    LockMode::parse(text)
        .ok_or_else(|| format!("{text:?} is not a mode: first_use or every_request"))
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
    report(run(&cli, link, verifier, stdin, stdout), stderr)
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
            let written = crate::identity::init(dir, &ids)?;
            return write_out(stdout, &json(&written)?);
        }
        Command::Serve {
            listen,
            approvals_listen,
        } => return serve(cli, *listen, *approvals_listen, stdout),
        _ => {}
    }
    let mut store = Store::open(&cli.db)?;
    if needs_gateways(&cli.command) {
        register_gateways(&mut store, link)?;
    }
    let out = match &cli.command {
        Command::Init { .. } | Command::Serve { .. } => unreachable!("handled above"),
        Command::Sandbox(cmd) => {
            // The relay's key travels with every open; other transitions
            // do not need it (and must not fail for want of it).
            let opens = matches!(
                cmd,
                SandboxCommand::Start { .. }
                    | SandboxCommand::Resume { .. }
                    | SandboxCommand::Recover { .. }
            );
            let relay = match (&cli.control_dir, opens) {
                (Some(dir), true) => Some(crate::identity::relay_key(dir)?.public_key()),
                _ => None,
            };
            let mut life = Lifecycle::new(&mut store, link, verifier).with_relay_key(relay);
            match cmd {
                SandboxCommand::Start {
                    tenant,
                    sources,
                    allow,
                    attach,
                    mode,
                } => json(&life.start(&StartRequest {
                    tenant: tenant.clone(),
                    sources: sources.clone(),
                    allow: allow.clone(),
                    attach: attach.clone(),
                    mode: *mode,
                })?)?,
                SandboxCommand::Pause { id } => json(&life.pause(id)?)?,
                SandboxCommand::Resume { id } => json(&life.resume(id)?)?,
                SandboxCommand::Interrupt { id } => json(&life.interrupt(id)?)?,
                SandboxCommand::Recover { id } => json(&life.recover(id)?)?,
                SandboxCommand::Stop { id } => json(&life.stop(id)?)?,
                SandboxCommand::RevokeAll { id } => json(&life.revoke_all(id)?)?,
                SandboxCommand::Status { id } => json(&life.status(id)?)?,
                SandboxCommand::Trust { id } => {
                    let status = life.status(id)?;
                    if status.session.state != crate::model::State::Running {
                        return Err(Error::NotRunning {
                            id: id.clone(),
                            state: status.session.state.as_str(),
                        });
                    }
                    let mut bundle = String::new();
                    if let Some(current) = status.attempts.last() {
                        for ca in current.ca.iter().filter(|c| c.destroyed_at.is_none()) {
                            bundle.push_str(&ca.cert_pem);
                        }
                    }
                    bundle.trim_end().to_owned()
                }
            }
        }
        Command::Secret(cmd) => match cmd {
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
                json(&serde_json::json!({"tenant": tenant, "secret": name, "set": true}))?
            }
            SecretCommand::Delete { name, tenant } => {
                store.secret_delete(tenant, name)?;
                json(&serde_json::json!({"tenant": tenant, "secret": name, "deleted": true}))?
            }
            SecretCommand::List { tenant } => json(&store.secret_list(tenant)?)?,
        },
        Command::Policy(PolicyCommand::Egress(cmd)) => match cmd {
            EgressCommand::Add { name } => {
                json(&serde_json::json!({"added": store.egress_add(name)?}))?
            }
            EgressCommand::Remove { name } => {
                json(&serde_json::json!({"removed": store.egress_remove(name)?}))?
            }
            EgressCommand::List => json(&store.egress_list()?)?,
        },
        Command::Policy(PolicyCommand::Lock(cmd)) => match cmd {
            LockCommand::Add {
                destination,
                attachment,
                method,
                path_prefix,
                mode,
                approvers,
            } => {
                let rule = NewRule::check(
                    destination,
                    attachment.as_deref(),
                    method.as_deref(),
                    path_prefix.as_deref(),
                    *mode,
                    approvers,
                )?;
                json(&store.lock_add(&rule)?)?
            }
            LockCommand::List => json(&store.lock_list()?)?,
            LockCommand::Remove { id } => {
                json(&serde_json::json!({"removed": store.lock_remove(id)?}))?
            }
        },
        Command::Approvals(cmd) => match cmd {
            ApprovalsCommand::List { approver, all } => {
                json(&crate::relay::cards(&mut store, approver.as_deref(), *all)?)?
            }
            ApprovalsCommand::Approve { id, approver }
            | ApprovalsCommand::Decline { id, approver } => {
                let verdict = if matches!(cmd, ApprovalsCommand::Approve { .. }) {
                    talos_certs::Verdict::Approved
                } else {
                    talos_certs::Verdict::Declined
                };
                let key = relay_key(cli)?;
                json(&crate::relay::decide(
                    &mut store, link, &key, id, approver, verdict,
                )?)?
            }
        },
        Command::Approvers(cmd) => match cmd {
            ApproversCommand::Add { name } => {
                let token = crate::relay::new_token()?;
                store.approver_add(name, &crate::relay::token_hash(&token))?;
                let out = Zeroizing::new(json(&serde_json::json!({
                    "approver": name,
                    "token": token.as_str(),
                    "note": "shown once: the store keeps only its SHA-256; send it as Authorization: Bearer TOKEN",
                }))?);
                return write_out(stdout, &out);
            }
            ApproversCommand::List => json(&store.approver_list()?)?,
            ApproversCommand::Remove { name } => {
                store.approver_remove(name)?;
                json(&serde_json::json!({"removed": name}))?
            }
        },
        Command::Gateway(cmd) => match cmd {
            GatewayCommand::Register { id, public_key } => {
                store.register_gateway(id, public_key)?;
                json(&serde_json::json!({"registered": id}))?
            }
            GatewayCommand::List => json(&store.gateways()?)?,
        },
        Command::Certificate { id } => {
            let cert = certificate(&store, id)?;
            write_out(stdout, &json(&cert)?)?;
            if let Some(reason) = cert.not_issued_because {
                return Err(Error::CertificateNotIssued {
                    id: id.clone(),
                    reason,
                });
            }
            return Ok(());
        }
    };
    write_out(stdout, &out)
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

/// Whether `command` may reach the gateways.
fn needs_gateways(command: &Command) -> bool {
    matches!(command, Command::Sandbox(cmd) if !matches!(cmd, SandboxCommand::Status { .. } | SandboxCommand::Trust { .. }))
}

/// Ask each gateway who it is and register its key at first contact; a
/// known id with another key is `gateway_key_conflict`. A gateway that
/// cannot be reached is skipped here: the command fails
/// `gateway_unreachable` if it needs it, and works if it does not (a stop
/// of a paused session).
fn register_gateways(store: &mut Store, link: &dyn GatewayLink) -> Result<(), Error> {
    let Ok(described) = link.describe() else {
        return Ok(());
    };
    for d in described {
        store.register_gateway(&d.gateway_id, &d.public_key_hex)?;
    }
    Ok(())
}

/// `serve`: the ControlPlane service on `listen`, and the approvals API on
/// `approvals`, until SIGTERM/SIGINT.
fn serve(
    cli: &Cli,
    listen: std::net::SocketAddr,
    approvals: Option<std::net::SocketAddr>,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let dir = cli.control_dir.as_deref().ok_or_else(|| Error::Io {
        what: "serve".into(),
        reason: "--control-dir DIR is needed (the directory init wrote)".into(),
    })?;
    let identity = crate::identity::Identity::load(dir, "stub")?;
    let tls = identity.server_config()?;
    let store = std::sync::Arc::new(std::sync::Mutex::new(Store::open(&cli.db)?));
    // The API's link and key exist only with the API. The link owns a
    // runtime of its own, which must be dropped outside the serving
    // runtime: declared first, it is dropped last.
    let api = match approvals {
        Some(_) => Some(crate::approvals_api::Api::new(
            store.clone(),
            std::sync::Arc::new(crate::identity::relay_key(dir)?),
            std::sync::Arc::new(
                crate::grpc_link::GrpcLink::new(&cli.gateways, cli.control_dir.clone())
                    .map_err(Error::Link)?,
            ),
        )),
        None => None,
    };
    let api_tls = match approvals {
        Some(_) => Some(crate::approvals_api::server_config(&identity)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Io {
            what: "runtime".into(),
            reason: e.to_string(),
        })?;
    let bind = |addr: std::net::SocketAddr| async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Io {
                what: addr.to_string(),
                reason: e.to_string(),
            })?;
        let bound = listener.local_addr().map_err(|e| Error::Io {
            what: addr.to_string(),
            reason: e.to_string(),
        })?;
        Ok::<_, Error>((listener, bound))
    };
    let result = runtime.block_on(async {
        let (listener, addr) = bind(listen).await?;
        let approvals = match approvals {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let mut ready = serde_json::json!({"listening": addr.to_string(), "service": "talos.control.v1.ControlPlane"});
        if let Some((_, a)) = &approvals {
            ready["approvals"] = serde_json::Value::String(a.to_string());
        }
        write_out(stdout, &ready.to_string())?;
        let _ = stdout.flush();
        let grpc = crate::serve::serve(
            listener,
            tls,
            crate::serve::Consumer::shared(store.clone()),
            crate::serve::shutdown_signal(),
        );
        match (approvals, api.clone(), api_tls) {
            (Some((listener, _)), Some(api), Some(api_tls)) => {
                let http = crate::approvals_api::serve(
                    listener,
                    api_tls,
                    api,
                    crate::serve::shutdown_signal(),
                );
                tokio::join!(grpc, http);
            }
            _ => grpc.await,
        }
        Ok(())
    });
    drop(runtime);
    drop(api);
    result
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
