//! The process itself, as operators, the service manager and its own
//! successor see it: the frames of the process socket, readiness
//! notifications, and the link between a process and the one it took over
//! from.

pub mod link;
pub mod notify;
pub mod wire;

crate::refusal::causes! {
    /// How an upgrade's handover ended (the `result` of
    /// `gateway_handover_total`).
    pub enum HandoverResult {
        /// A successor took over.
        Ok => "ok",
        /// The upgrade failed before `go`; the old process goes on serving.
        Failed => "failed",
    }
}
