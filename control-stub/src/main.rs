//! `control-stub`: the command line of the TALOS control stub.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use talos_control_stub::cli::{report, run, Cli, EXIT_FAILURE};
use talos_control_stub::grpc_link::GrpcLink;
use talos_control_stub::SignatureVerifier;

fn main() -> ExitCode {
    not_dumpable();
    let cli = Cli::parse();
    // The link reads the control channel identity and connects only when a
    // command first needs the gateways.
    let link = match GrpcLink::new(&cli.gateways, cli.control_dir.clone()) {
        Ok(link) => link,
        Err(e) => {
            eprintln!("error: {}: {e}", e.code());
            return ExitCode::from(u8::try_from(EXIT_FAILURE).unwrap_or(2));
        }
    };
    let verifier = SignatureVerifier;
    let status = report(
        run(
            &cli,
            &link,
            &verifier,
            &mut std::io::stdin().lock(),
            &mut std::io::stdout().lock(),
        ),
        &mut std::io::stderr().lock(),
    );
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
