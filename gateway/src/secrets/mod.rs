//! Secret values: attached to requests by name, masked in every reply.
//!
//! - [`secret`]: secret values (zeroized, never printed) and attachments.
//! - [`decode`]: decoding compressed replies before masking.
//! - [`mask`]: masking secret values (and their encodings) in replies.
//! - [`reply`]: a reply on its way to the session: decoded and masked.

pub mod secret;
pub mod decode;
pub mod mask;
pub mod reply;
