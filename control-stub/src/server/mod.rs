//! `control-stub serve`'s process.

pub mod intake;
