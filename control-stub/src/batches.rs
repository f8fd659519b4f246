//! The batch consumer's check: a signed batch verified (signature under the
//! gateway's registered key, sequence, chain: talos-certs'
//! `ChainVerifier`) against each gateway's chain position, and the verdict
//! recorded by the store, in the one transaction that read the positions.
//!
//! - A new batch: its records and the gateway's new chain position.
//! - A re-delivery of a recorded batch: nothing changes.
//! - Anything else: the rejection with its stable reason (the gateway id
//!   and sequence number the batch claimed).

use crate::error::Error;
use crate::names;
use crate::store::{ed25519_key, Store};

/// What [`accept`] made of a signed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Verified, new, recorded.
    Accepted { gateway_id: String, seq: u64 },
    /// Verified, and recorded before (a re-delivery).
    Duplicate { gateway_id: String, seq: u64 },
    /// Refused, and the refusal recorded. `gateway_id` and `seq` are what
    /// the batch claimed (empty and 0 when it does not parse); `reason` is
    /// the stable name ([`talos_certs::Rejection::as_str`]).
    Rejected {
        gateway_id: String,
        seq: u64,
        reason: &'static str,
        detail: String,
    },
}

/// Verify a signed batch (signature, sequence, chain) against the
/// registered keys and each gateway's chain position, and have the store
/// record the outcome, all in one transaction: a new batch with its records
/// and the gateway's new chain position; a rejection with its reason; a
/// duplicate changes nothing.
pub fn accept(store: &mut Store, signed: &talos_certs::Signed) -> Result<BatchVerdict, Error> {
    store.write(|tx| {
        let mut verifier = talos_certs::ChainVerifier::new();
        for position in tx.chain_positions()? {
            // A registered key that is not an Ed25519 key verifies
            // nothing: its gateway's batches are refused unknown_gateway.
            let Some(key) = ed25519_key(&position.public_key_hex) else {
                continue;
            };
            let state = position
                .state
                .unwrap_or_else(talos_certs::ChainState::genesis);
            verifier.register(position.gateway_id, key, state);
        }
        match verifier.accept(signed) {
            Ok(talos_certs::Accepted::New {
                header,
                records,
                digest,
            }) => {
                let values = records
                    .iter()
                    .map(|r| serde_json::from_str(r))
                    .collect::<Result<Vec<serde_json::Value>, _>>()?;
                tx.insert_batch(&header.gateway_id, header.seq, &digest, &values)?;
                let state = verifier
                    .state(&header.gateway_id)
                    .ok_or_else(|| Error::Store("chain state lost".into()))?;
                tx.set_chain_state(&header.gateway_id, state)?;
                Ok(BatchVerdict::Accepted {
                    gateway_id: header.gateway_id,
                    seq: header.seq,
                })
            }
            Ok(talos_certs::Accepted::Duplicate { gateway_id, seq }) => {
                Ok(BatchVerdict::Duplicate { gateway_id, seq })
            }
            Err(rejection) => {
                let (gateway_id, seq) = talos_certs::claimed_header(&signed.payload);
                let reason = rejection.as_str();
                let gateway_id: String =
                    gateway_id.chars().take(names::MAX_GATEWAY_ID_LEN).collect();
                tx.insert_rejection(&gateway_id, seq, reason)?;
                Ok(BatchVerdict::Rejected {
                    gateway_id,
                    seq,
                    reason,
                    detail: rejection.to_string(),
                })
            }
        }
    })
}
