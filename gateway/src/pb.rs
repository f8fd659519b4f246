//! The control channel's generated messages and services: the contract
//! crate's ([`talos_contract::pb`]), compiled once from its
//! `proto/control.proto`.

pub use talos_contract::pb::*;
