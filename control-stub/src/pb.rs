//! The control channel's messages and the tonic client and server of both
//! services (`Gateway`, `ControlPlane`): the contract crate's
//! ([`talos_contract::pb`]), compiled once from its `proto/control.proto`.

pub use talos_contract::pb::*;
