//! Destination names: one canonical form, compared exactly — the
//! contract's rule ([`talos_contract::name`]), which the control plane
//! keeps too. Every name the gateway compares (a hello's SNI, an allowlist
//! entry, a `Host` header) goes through [`canonicalize`] first.

pub use talos_contract::name::{canonicalize, Name, NameError, MAX_LABEL_LEN, MAX_NAME_LEN};
