//! The control channel's messages and services, generated at build time
//! from `proto/control.proto`.

#![allow(missing_debug_implementations)]
tonic::include_proto!("talos.control.v1");
