//! Compiles the control channel's contract, `proto/control.proto` (the one
//! copy of it, compiled once for the gateway and the control plane), with
//! protox, a protobuf compiler written in Rust, so no `protoc` is needed on
//! the machine; tonic-prost-build turns the descriptors into Rust: servers
//! and clients of both services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Both ends make their own mutual-TLS connections over rustls, so
        // tonic's `connect` helpers are not wanted.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
