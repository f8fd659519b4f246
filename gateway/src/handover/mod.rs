//! Handing every live authority and the listening sockets to a successor
//! process on the same machine.

pub mod link;
pub mod state;
