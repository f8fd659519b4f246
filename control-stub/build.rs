//! Compiles the control channel's contract, `gateway/proto/control.proto`
//! (the one copy of it), with protox, a protobuf compiler written in Rust,
//! so no `protoc` is needed on the machine.
//!
//! The control stub compiles the file itself rather than importing the
//! gateway crate's generated code: the control plane is another trust
//! boundary and must not link the gateway's data plane to speak to it. One
//! `.proto` file, two compilations of it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../gateway/proto";
    let proto = "../gateway/proto/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], [dir])?;
    tonic_prost_build::configure()
        // Both ends make their own mutual-TLS connections over rustls, so
        // tonic's `connect` helpers are not wanted.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
