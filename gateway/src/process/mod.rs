//! The process itself, as operators and the service manager see it: the
//! frames of the process socket, and readiness notifications.

pub mod notify;
pub mod wire;
