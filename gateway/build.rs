//! Compiles `proto/control.proto` (the control channel) with protox, a
//! protobuf compiler written in Rust, so no `protoc` is needed on the
//! machine; tonic-prost-build turns the descriptors into Rust: servers and
//! clients of both services, since the control plane imports them from
//! here too.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Both ends make their own TLS connections (mutual TLS over
        // rustls), so tonic's `connect` helpers are not wanted.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
