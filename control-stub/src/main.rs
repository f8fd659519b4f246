//! `control-stub`: the command line of the TALOS control stub.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use talos_control_stub::cli::{gateway_targets, report, run, Cli, EXIT_FAILURE};
use talos_control_stub::grpc_link::GrpcLink;
use talos_control_stub::SignatureVerifier;

fn main() -> ExitCode {
    not_dumpable();
    let cli = Cli::parse();
    // The link reads the control channel identity and connects only when a
    // command first needs the gateways.
    // The members: the store's (`gateway add`), and `--gateway`.
    let targets = match gateway_targets(&cli) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", e.code());
            return ExitCode::from(u8::try_from(EXIT_FAILURE).unwrap_or(2));
        }
    };
    let link = match GrpcLink::new(&targets, cli.control_dir.clone()) {
        Ok(link) => link,
        Err(e) => {
            eprintln!("error: {}: {e}", e.code());
            return ExitCode::from(u8::try_from(EXIT_FAILURE).unwrap_or(2));
        }
    };
    let verifier = SignatureVerifier;
    // Not locked for the run: `serve`'s threads write their own lines to
    // standard error while the command runs.
    let mut stderr = std::io::stderr();
    let result = run(
        &cli,
        &link,
        &verifier,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut stderr,
    );
    let status = report(result, &mut stderr);
    ExitCode::from(u8::try_from(status).unwrap_or(2))
}

/// Core dumps off for this process, and with them other processes of the
/// same user shut out of `/proc/PID/mem`, `/proc/PID/environ` and ptrace:
/// the stub holds the tenants' secret values, its signing key and the
/// control channel's keys in memory. A failure is logged on standard
/// error and the process goes on (the systemd unit's `LimitCORE=0` still
/// stops dump files).
fn not_dumpable() {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        eprintln!("control-stub: warning: cannot turn core dumps off (prctl PR_SET_DUMPABLE): {e}");
    }
}
