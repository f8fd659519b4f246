//! The process itself, as operators, the service manager and its own
//! successor see it: the frames of the process socket, readiness
//! notifications, and the link between a process and the one it took over
//! from.

pub mod link;
pub mod notify;
pub mod wire;
