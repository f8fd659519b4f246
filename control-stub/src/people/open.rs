//! What an open tells the gateways of the people who decide (issue 42):
//! every passkey of every approver the Lock rules name (public keys and
//! the highest sign count seen), the web app's rp id and origin as `serve`
//! last started it, and the account's lab setting. The gateway verifies a
//! person's assertion in a decision under these keys itself; an approver
//! with no passkey (a rule cannot be added naming one, but a passkey can be
//! removed since) has no key here, and no decision of theirs counts.

use std::collections::BTreeSet;

use crate::error::Error;
use crate::link::{ApproverKey, OpenPeople};
use crate::store::Tx;

/// The people of an open, read in its transaction.
pub fn people(tx: &Tx<'_>) -> Result<OpenPeople, Error> {
    let named: BTreeSet<String> = tx
        .lock_rules()?
        .into_iter()
        .flat_map(|r| r.approvers)
        .collect();
    let mut keys = Vec::new();
    for person in &named {
        for p in tx.passkeys_of(person)? {
            keys.push(ApproverKey {
                owner: p.person,
                credential_id: p.credential_id,
                public_key_cose: p.public_key_cose,
                sign_count: p.sign_count,
            });
        }
    }
    let (rp_id, origin) = tx.web_relying_party()?.unwrap_or_default();
    Ok(OpenPeople {
        keys,
        rp_id,
        origin,
        lab_approvals: tx.lab_approvals()?,
    })
}
