//! Stream adapters under the connection: no policy, no parsing.
//!
//! - [`replay`]: the bytes the gate already read put back in front of the socket.
//! - [`counted`]: the bytes that cross a connection, counted for its record.
//! - [`gathered`]: an HTTP/2 connection's writes gathered into one flush.
//! - [`woken`]: a future polled only when its own waker fired.
//! - [`relay`]: a forwarded connection's bytes, both ways, as they are.
//! - [`splice`]: a passthrough connection's bytes moved between two TCP
//!   sockets inside the kernel (`splice(2)`).

pub mod replay;
pub mod counted;
pub mod gathered;
pub mod woken;
pub mod relay;
pub mod splice;
