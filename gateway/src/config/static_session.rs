//! Sessions defined in the file (`[[session]]`), for running without a
//! control plane: each checked by the contract's rules, as an
//! OpenSession's are.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use talos_contract::spec::{
    AttachDraft, Fault, Field, ScopeDraft, SessionDraft, SessionSpec, SpecError,
};

use crate::gate::name::Name;

/// A session defined in the file (`[[session]]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticSession {
    /// The session id. Required, unique.
    pub id: Spanned<String>,
    /// The tenant (customer) the session serves. Required.
    pub tenant: String,
    /// The attempt number (1 at start, +1 at each resume). Default 1.
    #[serde(default = "StaticSession::default_attempt")]
    pub attempt: u32,
    /// The session's source addresses: a connection from one of them belongs
    /// to this session. Required, at least one; no address in two sessions.
    pub sources: Spanned<Vec<Spanned<IpAddr>>>,
    /// The destination names the session may reach, exactly (no wildcards;
    /// canonicalised: lower case, no trailing dot). Default empty.
    #[serde(default)]
    pub allowlist: Vec<Spanned<Name>>,
    /// Where the gateway writes the session CA's certificate (PEM) at
    /// start-up: the file the session's instance installs as its only
    /// trust anchor. Optional; the digest is logged either way.
    #[serde(default)]
    pub trust_file: Option<PathBuf>,
    /// Credentials attached by name: `SECRET=destination:header[:scheme]`,
    /// as the CLI's `--attach`. The destination must be on the allowlist and
    /// the secret defined in a `[[secret]]` table. Default empty.
    #[serde(default)]
    pub attach: Vec<Spanned<String>>,
    /// Names of the allowlist passed on without termination: checked
    /// before the handshake as any other, then their bytes passed on to
    /// the checked address unread (no attachment may name one). Default
    /// empty.
    #[serde(default)]
    pub passthrough: Vec<Spanned<Name>>,
}

impl StaticSession {
    fn default_attempt() -> u32 {
        1
    }

    /// The session as a draft of the contract's spec (no Lock, no relay:
    /// static sessions have no control plane).
    pub fn draft(&self) -> SessionDraft<'_> {
        SessionDraft {
            id: self.id.get_ref(),
            tenant: &self.tenant,
            attempt: self.attempt,
            scope: ScopeDraft {
                sources: self
                    .sources
                    .get_ref()
                    .iter()
                    .map(|s| s.get_ref().to_string())
                    .collect(),
                allowlist: self
                    .allowlist
                    .iter()
                    .map(|n| n.get_ref().as_str())
                    .collect(),
                attachments: self
                    .attach
                    .iter()
                    .map(|a| AttachDraft::Text(a.get_ref()))
                    .collect(),
            },
            passthrough: self
                .passthrough
                .iter()
                .map(|n| n.get_ref().as_str())
                .collect(),
            ..SessionDraft::default()
        }
    }

    /// The session's spec, checked by the contract's rules.
    pub fn spec(&self) -> Result<SessionSpec, SpecError> {
        SessionSpec::new(&self.draft())
    }

    /// Where a refusal points in the file, the field under `session[i]`,
    /// and the message, as this file's errors say it.
    pub(super) fn refusal(&self, e: &SpecError) -> (std::ops::Range<usize>, String, String) {
        let sid = self.id.get_ref();
        let fault = e.fault.to_string();
        match e.field {
            Field::Id => (
                self.id.span(),
                "id".into(),
                format!("{sid:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ),
            Field::Attempt => (self.id.span(), "attempt".into(), fault),
            Field::Tenant => (self.id.span(), "tenant".into(), fault),
            Field::Sources => (
                self.sources.span(),
                "sources".into(),
                "a session needs at least one source address".into(),
            ),
            Field::Source(j) => (
                self.sources.get_ref()[j].span(),
                format!("sources[{j}]"),
                fault,
            ),
            Field::Allowlist(j) => {
                let name = &self.allowlist[j];
                let message = match &e.fault {
                    Fault::Repeated => format!("{} is listed twice", name.get_ref()),
                    Fault::Name(n) => n.to_string(),
                    _ => fault,
                };
                (name.span(), format!("allowlist[{j}]"), message)
            }
            Field::Attachment(j, _) => {
                let text = &self.attach[j];
                let message = match &e.fault {
                    Fault::Attach(a) => format!(
                        "attachment {:?}: {a}",
                        text.get_ref().chars().take(200).collect::<String>()
                    ),
                    Fault::NotAllowed { destination } => {
                        format!("{destination} is not on the session's allowlist")
                    }
                    Fault::TargetTaken {
                        destination,
                        header,
                        earlier,
                    } => format!(
                        "{destination} already carries secret {earlier} in {header}: one attachment per destination and header"
                    ),
                    Fault::Passthrough { destination } => format!(
                        "{destination} is passthrough: the gateway never sees its requests, so it cannot carry an attachment"
                    ),
                    _ => fault,
                };
                (text.span(), format!("attach[{j}]"), message)
            }
            Field::Passthrough(j) => {
                let name = &self.passthrough[j];
                let message = match &e.fault {
                    Fault::NotAllowed { .. } => {
                        format!("{} is not on the session's allowlist", name.get_ref())
                    }
                    Fault::Repeated => format!("{} is listed twice", name.get_ref()),
                    _ => fault,
                };
                (name.span(), format!("passthrough[{j}]"), message)
            }
            Field::Lock | Field::Rule(..) | Field::RelayKey => {
                (self.id.span(), e.field.to_string(), fault)
            }
        }
    }
}
