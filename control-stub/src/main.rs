//! `control-stub`: the command line of the TALOS control stub.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use talos_control_stub::cli::{report, run, Cli};
use talos_control_stub::link::{RefuseReports, UnavailableLink};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // No control channel client exists yet: commands that must reach the
    // gateways fail `gateway_unreachable`; everything else works.
    let link = UnavailableLink::new(cli.gateways.clone());
    let verifier = RefuseReports;
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
