//! The control channel's messages and the tonic client and server of both
//! services (`Gateway`, `ControlPlane`), generated at build time from
//! `proto/control.proto`.

#![allow(missing_debug_implementations)]

tonic::include_proto!("talos.control.v1");
