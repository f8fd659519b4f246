//! Compiles `proto/echo.proto` (the gRPC test service) with protox, a
//! protobuf compiler written in Rust, so the build needs no `protoc` on
//! the machine; tonic-prost-build turns the descriptors into Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // The tests make their own channels (custom connector), so the
        // generated `connect` helpers are not wanted.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
