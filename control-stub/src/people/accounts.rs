//! Who the people are: `people enroll`, `people list`, `people remove`.
//!
//! A person is a name (the Lock's approver names: 1-64 letters, digits,
//! `.`, `_`, `-`) and a role ([`Role`]). `people enroll NAME --role R`
//! makes the person if they are new and a **one-time enrolment link**,
//! `<origin>/enrol#<token>`: 32 random bytes in the URL's fragment, which a
//! browser never sends to a server, so the token reaches no access log,
//! proxy or `Referer` on the way; the page reads it and posts it to the web
//! app once the person asks to create their passkey. The store keeps only
//! its SHA-256. A link is good for [`ENROLMENT_LIFE`] and for one passkey;
//! a person enrolls another device with another link.
//!
//! `people remove NAME` removes the person and everything that lets them
//! act at once: their passkeys, web sessions, enrolment links, challenges
//! and push subscriptions. Their past decisions and commands stay on the
//! record. A Lock rule that names them is **kept, and the removal says
//! which**: the rule then names someone with no passkey, so its other
//! approvers still decide, and a card only they could decide waits and is
//! declined at the end of its time — the Lock fails closed. Refusing the
//! removal instead would leave a lost or compromised passkey able to
//! decide until every rule was edited, and removing the rule would release
//! what it holds.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use zeroize::Zeroizing;

use super::rp::{at, new_token, origin_host, random, token_hash};
use crate::error::Error;
use crate::model::Role;
use crate::store::{Enrolment, PersonInfo, PersonRemoved, Store};

/// How long an enrolment link is good for: long enough to send it and
/// open it on the phone, short enough that a link found later in a chat
/// history is dead.
pub const ENROLMENT_LIFE: Duration = Duration::from_secs(15 * 60);

/// The length of a person's WebAuthn user handle (`user.id`), random:
/// WebAuthn allows at most 64 bytes and asks that it carry nothing that
/// identifies the person.
pub const USER_HANDLE_LEN: usize = 32;

/// A new enrolment link, shown once.
#[derive(Serialize)]
pub struct Enrolled {
    pub person: String,
    pub role: Role,
    /// `<origin>/enrol#<token>`: the only place the token ever appears.
    #[serde(serialize_with = "exposed")]
    pub link: Zeroizing<String>,
    pub expires_at: String,
}

/// The link, for the one place it is printed.
fn exposed<S: serde::Serializer>(link: &Zeroizing<String>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(link.as_str())
}

impl std::fmt::Debug for Enrolled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrolled")
            .field("person", &self.person)
            .field("role", &self.role)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Make person `name` with `role` if new (refused if they hold another
/// role) and a one-time enrolment link for them, good until
/// [`ENROLMENT_LIFE`] after `now`, under `origin` (the web app's,
/// `https://NAME[:PORT]`).
pub fn enroll(
    store: &mut Store,
    name: &str,
    role: Role,
    origin: &str,
    now: SystemTime,
) -> Result<Enrolled, Error> {
    let name = crate::lock::approver(name)?;
    origin_host(origin)?;
    let token = new_token()?;
    let handle = random(USER_HANDLE_LEN)?;
    let created_at = at(now);
    let expires_at = at(now + ENROLMENT_LIFE);
    store.write(|tx| {
        match tx.person(&name)? {
            Some(p) if p.role != role => {
                return Err(Error::PersonRoleConflict {
                    name: name.clone(),
                    role: p.role.as_str(),
                    asked: role.as_str(),
                })
            }
            Some(p) if p.user_handle.is_none() => tx.set_user_handle(&name, &handle)?,
            Some(_) => {}
            None => tx.insert_person(&name, role, &handle, &created_at)?,
        }
        tx.insert_enrolment(&Enrolment {
            token_sha256: token_hash(&token),
            person: name.clone(),
            role,
            created_at: created_at.clone(),
            expires_at: expires_at.clone(),
            used_at: None,
        })
    })?;
    Ok(Enrolled {
        person: name,
        role,
        link: Zeroizing::new(format!("{origin}/enrol#{}", token.as_str())),
        expires_at,
    })
}

/// Every person with their passkeys, open links and live web sessions.
pub fn list(store: &Store, now: SystemTime) -> Result<Vec<PersonInfo>, Error> {
    store.people_list(&at(now))
}

/// What `people remove` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub removed: String,
    #[serde(flatten)]
    pub what: PersonRemoved,
    /// The Lock rules that still name the person (see the module docs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules_naming: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Remove person `name` (see the module docs).
pub fn remove(store: &mut Store, name: &str) -> Result<Removed, Error> {
    store.write(|tx| {
        if tx.person(name)?.is_none() {
            return Err(Error::PersonNotFound {
                name: name.chars().take(100).collect(),
            });
        }
        let what = tx.delete_person(name)?;
        let rules_naming: Vec<String> = tx
            .lock_rules()?
            .into_iter()
            .filter(|r| r.approvers.iter().any(|a| a == name))
            .map(|r| r.id)
            .collect();
        let warning = (!rules_naming.is_empty()).then(|| {
            format!(
                "{name} is still named by {}: with no passkey they decide nothing, so a card only they could decide waits and is declined at the end of its time; edit those rules",
                rules_naming.join(", ")
            )
        });
        Ok(Removed {
            removed: name.to_owned(),
            what,
            rules_naming,
            warning,
        })
    })
}
