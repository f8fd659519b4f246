//! The `gateway` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use talos_gateway::config::Config;

/// The TALOS egress gateway: the only way out of a sandbox session.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway with a config file until SIGTERM or SIGINT.
    ///
    /// Prints one JSON line {"event":"ready","data":ADDR,"admin":ADDR} on
    /// standard output once the listeners are bound (with "control":ADDR
    /// when the config has a [control] table); logs go to standard error
    /// (RUST_LOG sets the level, default info).
    Run {
        /// The TOML config file (see docs/configuration.md).
        #[arg(long, short)]
        config: PathBuf,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        json_logs: bool,
        /// Take over from the process on the config's process socket (the
        /// running gateway starts its successor with this; see
        /// `gateway upgrade`).
        #[arg(long, hide = true)]
        takeover: bool,
    },
    /// Reload the running gateway's config (as SIGHUP does) and say how it
    /// went: exit 0 with the new config's digest, or 1 with the file, line
    /// and field at fault (the running config then stays whole).
    ///
    /// Reaches the process on the config's `[process] socket` (found even
    /// in a file TOML cannot read); the gateway reads the file itself, and
    /// counts and logs a refusal as a SIGHUP's. FILE must be the file the
    /// gateway runs with (by any path to it): another is refused.
    Reload {
        /// The gateway's config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Hand the running gateway over to a new process (as SIGUSR2 does):
    /// it starts the binary installed at its own path with the same
    /// config, hands it every live authority and its listening sockets,
    /// drains and exits. Exit 0 with the new process's id, or 1 with why
    /// the old process goes on serving.
    ///
    /// Reaches the process on the config's `[process] socket`.
    Upgrade {
        /// The gateway's config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check a config file and exit: 0 if the gateway would start with it.
    ///
    /// Prints a summary, and any warning an operator must see; a bad config
    /// prints the file, line and field at fault and exits 1.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
    },
    /// Judge captured ClientHellos with the data path's own parser.
    ///
    /// Each FILE holds the first bytes a client sent on a connection. Prints
    /// one JSON object per file: {"file", "verdict" ("ok" or a refusal
    /// name), "sni", "alpn", "ech", "records"}.
    InspectHello {
        /// Capture files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Classify IP addresses with the data path's own classifier.
    ///
    /// Prints "ADDRESS public" or "ADDRESS internal CLASS" per address.
    /// Accepts IPv4 (also the inet_aton forms 127.1, 0x7f.1, 2130706433),
    /// IPv6 (also bracketed and with a zone id). Exits 2 if any address
    /// could not be read.
    Classify {
        /// Addresses to classify.
        #[arg(required = true)]
        addresses: Vec<String>,
    },
    /// Mask standard input to standard output with the data path's masker.
    ///
    /// For reviewers: feed it any reply and see what a session would see.
    /// Every occurrence of each value, and of its encodings (base64 in every
    /// alignment, hex, percent-encoding, JSON escapes), becomes asterisks of
    /// the same length. Counts per secret name go to standard error, never
    /// the values.
    Mask {
        /// A secret as NAME=VALUE (repeatable). Prefer --secret-file: a value
        /// on a command line can end up in shell history and process lists.
        #[arg(long = "secret", value_name = "NAME=VALUE")]
        secrets: Vec<String>,
        /// A secret as NAME=PATH, the value read from the file (one trailing
        /// newline is not part of it). Repeatable.
        #[arg(long = "secret-file", value_name = "NAME=PATH")]
        secret_files: Vec<String>,
        /// Feed the masker this many bytes at a time (as a reply arriving in
        /// chunks would); default 65536.
        #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..))]
        chunk: u32,
    },
    /// The spool of signed batches: check it, set a bad batch aside.
    ///
    /// Both take the spool's lock: stop the gateway first (a running one
    /// holds it). See docs/runbook.md, "A spool blocked by a bad batch".
    #[command(subcommand)]
    Spool(SpoolCommand),
    /// Capture the first bytes of real clients' connections, for tests.
    ///
    /// Listens on ADDR, and for each NAME accepts one connection, reads its
    /// ClientHello (as the data path does) and writes the bytes to
    /// DIR/NAME.bin. Prints the bound address first, as a JSON line.
    CaptureHello {
        /// Where to listen (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// The directory to write captures into.
        #[arg(long)]
        out: PathBuf,
        /// One name per connection to capture, in order.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum SpoolCommand {
    /// Check every batch waiting: present, readable, signed with this
    /// gateway's key, numbered as its file, linked to its predecessor.
    /// Prints one JSON object; exits 1 if a batch is bad.
    Verify {
        /// The gateway's config (its [control] spool_dir and signing key).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Set the first bad batch aside: the file is moved to
    /// <spool_dir>/set-aside/ (never deleted), a signed gap takes its
    /// number, and the batches after it are sealed again to follow. The
    /// control plane shows the gap on every certificate it touches.
    SetAside {
        #[arg(long, short)]
        config: PathBuf,
        /// The sequence number `verify` reported.
        #[arg(long)]
        seq: u64,
        /// Why, in the operator's words (it goes on the certificates).
        #[arg(long)]
        reason: String,
        /// The digest of batch SEQ-1 as the control plane holds it
        /// (`control-stub gateway list`: chain_last_digest), for a spool
        /// that does not know it; set-aside says when it is needed.
        #[arg(long, value_name = "HEX")]
        prev_digest: Option<String>,
    },
}

fn main() -> ExitCode {
    not_dumpable();
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            config,
            json_logs,
            takeover,
        } => run(&config, json_logs, takeover),
        Command::Reload { config } => reload(&config),
        Command::Upgrade { config } => ask(&config, talos_gateway::handover::Request::Upgrade),
        Command::CheckConfig { file } => check_config(&file),
        Command::InspectHello { files } => inspect_hello(&files),
        Command::Classify { addresses } => classify(&addresses),
        Command::CaptureHello { listen, out, names } => capture(listen, &out, &names),
        Command::Spool(cmd) => spool(cmd),
        Command::Mask {
            secrets,
            secret_files,
            chunk,
        } => mask(&secrets, &secret_files, chunk as usize),
    }
}

/// Core dumps off for this process, and with them every other process of
/// the same user shut out of `/proc/PID/mem`, `/proc/PID/environ` and
/// ptrace: the session CAs' keys and the attached values it holds must
/// never reach a dump file or another process. Done first, before any key
/// or value exists; an `exec` (an upgrade's new binary) turns it back on,
/// so every start does it again. A failure is logged and the process goes
/// on (logging is not set up yet, so the line goes to standard error
/// directly); the systemd unit's `LimitCORE=0` still stops dump files.
fn not_dumpable() {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        eprintln!("gateway: warning: cannot turn core dumps off (prctl PR_SET_DUMPABLE): {e}");
    }
}

fn init_logs(json: bool) {
    talos_gateway::logging::init(json, "info");
}

/// The runtime that serves connections: with one worker, tokio's
/// single-threaded scheduler on this thread (no run queue shared between
/// threads, no hand-off to a worker: the cheapest per request); with more,
/// its work-stealing pool of that many threads.
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.enable_all().build()
}

fn run(path: &std::path::Path, json_logs: bool, takeover: bool) -> ExitCode {
    // The config's path as reloads and a successor read it again: made
    // absolute, symlinks kept (a reload follows a symlink swapped since).
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gateway: bad config: {e}");
            if takeover {
                // Say why to the process that started this one.
                if let Ok(rt) = runtime(1) {
                    rt.block_on(talos_gateway::handover::refuse_early(&format!(
                        "bad config: {e}"
                    )));
                }
            }
            return ExitCode::from(1);
        }
    };
    let log = talos_gateway::logging::init(json_logs, config.log.directives());
    let rt = match runtime(config.runtime.workers()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let options = talos_gateway::server::Options {
        config_path: path,
        json_logs,
        takeover,
        log: Some(log),
    };
    // The server (its accept loop above all) runs as a task. With a pool,
    // that puts it on a worker, not on this thread: `block_on`'s future is
    // polled here, so every accepted connection would cost a wake-up of
    // this thread by the worker that saw the socket ready, and another of a
    // worker to run the connection's task. With one worker this thread is
    // the worker and runs both.
    let served = rt.block_on(async {
        tokio::spawn(talos_gateway::server::run(config, options))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("gateway: {e}");
            ExitCode::from(1)
        }
    }
}

/// `gateway reload`: ask the running process to reload `path`, which it
/// reads, judges and counts itself (this reads only the socket's path):
/// a file with a syntax error is the gateway's refusal, as any other.
fn reload(path: &std::path::Path) -> ExitCode {
    // Absolute, for a process with another working directory; the
    // gateway compares it with its own file, symlinks resolved.
    let config = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gateway: cannot read {}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    ask(path, talos_gateway::handover::Request::Reload { config })
}

/// `gateway reload` and `gateway upgrade`: ask the running process on the
/// config's process socket, print its answer.
fn ask(path: &std::path::Path, request: talos_gateway::handover::Request) -> ExitCode {
    // Only the socket is read here: the running process judges the rest.
    let socket = match Config::process_socket(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(socket) = socket else {
        eprintln!(
            "gateway: {}: no [process] socket: the running gateway cannot be reached (SIGHUP reloads it)",
            path.display()
        );
        return ExitCode::from(1);
    };
    // An upgrade waits for the successor to take over; a reload for the
    // reload.
    let wait = talos_gateway::handover::TAKEOVER_TIMEOUT + std::time::Duration::from_secs(30);
    let answer = runtime(1)
        .and_then(|rt| rt.block_on(talos_gateway::handover::ask(&socket, &request, wait)));
    match answer {
        Ok(a) => {
            println!("{}", serde_json::to_string(&a).unwrap_or_default());
            if a.ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("gateway: {}", a.message);
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!(
                "gateway: cannot reach the gateway at {}: {e}",
                socket.display()
            );
            ExitCode::from(1)
        }
    }
}

fn spool(cmd: SpoolCommand) -> ExitCode {
    let path = match &cmd {
        SpoolCommand::Verify { config } | SpoolCommand::SetAside { config, .. } => config,
    };
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gateway: bad config: {e}");
            return ExitCode::from(1);
        }
    };
    let Some((dir, key_file)) = config.control.as_ref().and_then(|c| {
        c.spool_dir
            .as_ref()
            .map(|d| (d.get_ref().clone(), c.signing_key_file.get_ref().clone()))
    }) else {
        eprintln!(
            "gateway: {}: no [control] spool_dir: this gateway keeps no spool",
            path.display()
        );
        return ExitCode::from(1);
    };
    let key = match talos_certs::GatewayKey::load_or_create(&key_file) {
        Ok(k) => std::sync::Arc::new(k),
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::from(1);
        }
    };
    match cmd {
        SpoolCommand::Verify { .. } => {
            match talos_gateway::records::repair::verify(&dir, &key.public_key()) {
                Ok(report) => {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                    if report.findings.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => {
                    eprintln!("gateway: {e}");
                    ExitCode::from(1)
                }
            }
        }
        SpoolCommand::SetAside {
            seq,
            reason,
            prev_digest,
            ..
        } => {
            let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
            match talos_gateway::records::repair::set_aside(
                &dir,
                key,
                config.gateway_id.get_ref(),
                seq,
                &reason,
                prev_digest.as_deref(),
                &now,
            ) {
                Ok(done) => {
                    println!("{}", serde_json::to_string(&done).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gateway: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match Config::load(path) {
        Ok(c) => {
            println!(
                "{}: ok: gateway {}, data {}, admin {}, {} session(s)",
                path.display(),
                c.gateway_id.get_ref(),
                c.listen.data,
                c.listen.admin,
                c.sessions.len()
            );
            if let Some(control) = &c.control {
                println!("  control channel on {}", control.listen.get_ref());
            }
            for s in &c.sessions {
                let names: Vec<&str> = s.allowlist.iter().map(|n| n.get_ref().as_str()).collect();
                println!(
                    "  session {} (tenant {}, attempt {}): {} source(s), allowlist [{}]",
                    s.id.get_ref(),
                    s.tenant,
                    s.attempt,
                    s.sources.get_ref().len(),
                    names.join(", ")
                );
            }
            for w in c.warnings() {
                println!("warning: {}", w.0);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gateway: bad config: {e}");
            ExitCode::from(1)
        }
    }
}

fn inspect_hello(files: &[PathBuf]) -> ExitCode {
    let mut status = ExitCode::SUCCESS;
    for file in files {
        match std::fs::read(file) {
            Ok(bytes) => {
                println!("{}", inspect(&file.display().to_string(), &bytes));
            }
            Err(e) => {
                eprintln!("gateway: cannot read {}: {e}", file.display());
                status = ExitCode::from(2);
            }
        }
    }
    status
}

/// One capture judged exactly as the data path judges a connection whose
/// client sent these bytes and then stopped.
fn inspect(file: &str, bytes: &[u8]) -> serde_json::Value {
    use talos_gateway::gate::hello::{parse, Cause, HelloLimits, Parse};
    let limits = HelloLimits::default();
    let mut scratch = limits.scratch();
    let parsed = parse(bytes, &mut scratch, &limits);
    let (verdict, cause) = match &parsed {
        Parse::Accept { .. } => ("ok", None),
        Parse::Refuse { cause, .. } => (cause.refusal().as_str(), Some(cause.as_str())),
        // The data path would wait for more, then refuse at end of stream.
        Parse::Incomplete => (Cause::Eof.refusal().as_str(), Some(Cause::Eof.as_str())),
    };
    let hello = parsed.hello();
    serde_json::json!({
        "file": file,
        "verdict": verdict,
        "cause": cause,
        "sni": hello.and_then(|h| h.server_name()),
        "alpn": hello.map(|h| h.alpn().map(|p| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>()).unwrap_or_default(),
        "versions": hello.map(|h| h.supported_versions().map(|v| format!("{v:#06x}")).collect::<Vec<_>>()).unwrap_or_default(),
        "ech": hello.is_some_and(|h| h.has_ech()),
        "records": hello.map_or(0, |h| h.records()),
        "bytes": bytes.len(),
    })
}

fn classify(addresses: &[String]) -> ExitCode {
    use talos_gateway::gate::classify::{classify, parse_address};
    let mut status = ExitCode::SUCCESS;
    for text in addresses {
        match parse_address(text) {
            Ok(ip) => println!("{text} {}", classify(ip)),
            Err(e) => {
                eprintln!("gateway: {e}");
                status = ExitCode::from(2);
            }
        }
    }
    status
}

fn mask(secrets: &[String], files: &[String], chunk: usize) -> ExitCode {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use talos_gateway::secrets::mask::{MaskSet, Masker};
    use talos_gateway::secrets::secret::{self, SecretBytes};

    let mut values: Vec<(String, SecretBytes)> = Vec::new();
    for s in secrets {
        let Some((name, value)) = s.split_once('=') else {
            eprintln!("gateway mask: --secret takes NAME=VALUE");
            return ExitCode::from(2);
        };
        values.push((name.to_owned(), SecretBytes::new(value.as_bytes().to_vec())));
    }
    for f in files {
        let Some((name, path)) = f.split_once('=') else {
            eprintln!("gateway mask: --secret-file takes NAME=PATH");
            return ExitCode::from(2);
        };
        match secret::from_file(name, std::path::Path::new(path)) {
            Ok(v) => values.push((name.to_owned(), v)),
            Err(e) => {
                eprintln!("gateway mask: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if values.is_empty() {
        eprintln!("gateway mask: give at least one --secret or --secret-file");
        return ExitCode::from(2);
    }
    let pairs: Vec<(&str, &[u8])> = values
        .iter()
        .map(|(n, v)| (n.as_str(), v.expose()))
        .collect();
    let set = match MaskSet::new(&pairs) {
        Ok(set) => Arc::new(set),
        Err(e) => {
            eprintln!("gateway mask: {e}");
            return ExitCode::from(2);
        }
    };
    let mut masker = Masker::new(set);
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; chunk];
    let mut out = Vec::with_capacity(chunk * 2);
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("gateway mask: cannot read standard input: {e}");
                return ExitCode::from(1);
            }
        };
        out.clear();
        masker.push(&buf[..n], &mut out);
        if stdout.write_all(&out).is_err() {
            return ExitCode::from(1);
        }
    }
    out.clear();
    masker.finish(&mut out);
    if stdout
        .write_all(&out)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::from(1);
    }
    for (name, n) in masker.counts() {
        eprintln!("masked {name}: {n}");
    }
    ExitCode::SUCCESS
}

fn capture(listen: std::net::SocketAddr, out: &std::path::Path, names: &[String]) -> ExitCode {
    init_logs(false);
    let result = runtime(1).and_then(|rt| {
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind(listen).await?;
            println!(
                "{}",
                serde_json::json!({"event": "ready", "listen": listener.local_addr()?})
            );
            talos_gateway::gate::capture::capture_hellos(
                listener,
                out,
                names,
                talos_gateway::gate::hello::HelloLimits::default(),
            )
            .await
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: capture failed: {e}");
            ExitCode::from(1)
        }
    }
}
