//! A session's spec: what one authority is opened with. A [`SessionSpec`]
//! is only ever built from a [`SessionDraft`] that keeps every rule; the
//! error names the field ([`Field`]) and what is wrong with it ([`Fault`])
//! — a static session in the gateway's config turns it into a line number,
//! the control channel into `INVALID_ARGUMENT`, the control plane into its
//! own refusal.

use std::fmt;
use std::net::IpAddr;

use crate::attach::{AttachError, AttachSpec, Part};
use crate::lock::{LockRule, RuleDraft, RuleError, RuleField, MAX_RULES};
use crate::name::{self, Name, NameError};

/// One attachment as written: the text form or the four parts.
#[derive(Clone, Copy, Debug)]
pub enum AttachDraft<'a> {
    /// `SECRET=destination:header[:scheme]`.
    Text(&'a str),
    /// The control channel's parts; an empty scheme is none.
    Parts {
        secret: &'a str,
        destination: &'a str,
        header: &'a str,
        scheme: &'a str,
    },
}

impl AttachDraft<'_> {
    fn check(&self) -> Result<AttachSpec, AttachError> {
        match *self {
            AttachDraft::Text(text) => AttachSpec::parse(text),
            AttachDraft::Parts {
                secret,
                destination,
                header,
                scheme,
            } => AttachSpec::from_parts(
                secret,
                destination,
                header,
                Some(scheme).filter(|s| !s.is_empty()),
            ),
        }
    }
}

/// Where a session reaches, as written.
#[derive(Clone, Debug, Default)]
pub struct ScopeDraft<'a> {
    /// Source addresses, as text.
    pub sources: Vec<String>,
    /// Destination names.
    pub allowlist: Vec<&'a str>,
    pub attachments: Vec<AttachDraft<'a>>,
}

/// A session as written.
#[derive(Clone, Debug, Default)]
pub struct SessionDraft<'a> {
    pub id: &'a str,
    pub tenant: &'a str,
    pub attempt: u32,
    pub scope: ScopeDraft<'a>,
    pub lock: Vec<RuleDraft<'a>>,
    /// The approval relay's Ed25519 public key: empty (none) or 32 bytes.
    pub relay_key: &'a [u8],
    /// Names of the allowlist the account marks passthrough: checked
    /// before the handshake as every connection is, then passed on
    /// without termination.
    pub passthrough: Vec<&'a str>,
}

/// The field at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Id,
    Attempt,
    Tenant,
    Sources,
    Source(usize),
    Allowlist(usize),
    Attachment(usize, Part),
    Lock,
    Rule(usize, RuleField),
    RelayKey,
    Passthrough(usize),
}

/// The control channel's names (`session_id`, `sources[0]`,
/// `attachments[1].header`, `lock[2].id`, …).
impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Field::Id => f.write_str("session_id"),
            Field::Attempt => f.write_str("attempt"),
            Field::Tenant => f.write_str("tenant"),
            Field::Sources => f.write_str("sources"),
            Field::Source(i) => write!(f, "sources[{i}]"),
            Field::Allowlist(i) => write!(f, "allowlist[{i}]"),
            Field::Attachment(j, part) => match part.field() {
                Some(p) => write!(f, "attachments[{j}].{p}"),
                None => write!(f, "attachments[{j}]"),
            },
            Field::Lock => f.write_str("lock"),
            Field::Rule(k, field) => write!(f, "lock[{k}].{field}"),
            Field::RelayKey => f.write_str("relay_public_key"),
            Field::Passthrough(i) => write!(f, "passthrough[{i}]"),
        }
    }
}

/// What is wrong with the field. Displayed, it shows no text of the draft;
/// the names it carries are for entry points that may show them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Id,
    Attempt,
    Tenant,
    NoSources,
    NotAnAddress,
    Name(NameError),
    Repeated,
    Attach(AttachError),
    /// The attachment's destination is not on the allowlist.
    NotAllowed {
        destination: Name,
    },
    /// An earlier attachment already sets this header on this destination.
    TargetTaken {
        destination: Name,
        header: String,
        earlier: String,
    },
    TooManyRules,
    Rule(String),
    RelayKey,
    /// An attachment, or a Lock rule, names a passthrough destination:
    /// the gateway never sees its requests, so it could honour neither.
    Passthrough {
        destination: Name,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Id => f.write_str(crate::id::ID_RULE),
            Fault::Attempt => f.write_str("must be at least 1"),
            Fault::Tenant => f.write_str("must not be empty"),
            Fault::NoSources => f.write_str("a session needs at least one source"),
            Fault::NotAnAddress => f.write_str("not an IP address"),
            Fault::Name(e) => f.write_str(e.brief()),
            Fault::Repeated => f.write_str("listed twice"),
            Fault::Attach(e) => f.write_str(&e.brief()),
            Fault::NotAllowed { .. } => f.write_str("not on the allowlist"),
            Fault::TargetTaken { .. } => f.write_str("one attachment per destination and header"),
            Fault::TooManyRules => write!(f, "too many rules (at most {MAX_RULES})"),
            Fault::Rule(reason) => f.write_str(reason),
            Fault::RelayKey => f.write_str("must be 32 bytes (Ed25519)"),
            Fault::Passthrough { .. } => f.write_str(
                "names a passthrough destination, whose requests the gateway never sees",
            ),
        }
    }
}

/// A draft refused: `field: fault`, without the draft's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {fault}")]
pub struct SpecError {
    pub field: Field,
    pub fault: Fault,
}

fn refuse<T>(field: Field, fault: Fault) -> Result<T, SpecError> {
    Err(SpecError { field, fault })
}

/// Where a session reaches, checked.
///
/// invariant: at least one source, each canonical ([`crate::source::canonical_ip`]);
/// allowlist names canonical and distinct; each attachment's destination on
/// the allowlist, at most one attachment per destination and header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    sources: Vec<IpAddr>,
    allowlist: Vec<Name>,
    attachments: Vec<AttachSpec>,
}

impl Scope {
    /// Check a scope; the error names the first field at fault.
    pub fn new(d: &ScopeDraft<'_>) -> Result<Scope, SpecError> {
        if d.sources.is_empty() {
            return refuse(Field::Sources, Fault::NoSources);
        }
        let mut sources = Vec::with_capacity(d.sources.len());
        for (i, s) in d.sources.iter().enumerate() {
            match crate::source::parse(s) {
                Some(ip) => sources.push(ip),
                None => return refuse(Field::Source(i), Fault::NotAnAddress),
            }
        }
        let mut allowlist = Vec::with_capacity(d.allowlist.len());
        for (i, n) in d.allowlist.iter().enumerate() {
            let name =
                name::canonicalize(n).or_else(|e| refuse(Field::Allowlist(i), Fault::Name(e)))?;
            if allowlist.contains(&name) {
                return refuse(Field::Allowlist(i), Fault::Repeated);
            }
            allowlist.push(name);
        }
        let mut attachments: Vec<AttachSpec> = Vec::with_capacity(d.attachments.len());
        for (j, a) in d.attachments.iter().enumerate() {
            let spec = a
                .check()
                .or_else(|e| refuse(Field::Attachment(j, e.part()), Fault::Attach(e)))?;
            if !allowlist.contains(spec.destination()) {
                return refuse(
                    Field::Attachment(j, Part::Destination),
                    Fault::NotAllowed {
                        destination: spec.destination().clone(),
                    },
                );
            }
            if let Some(earlier) = attachments
                .iter()
                .find(|b| b.destination() == spec.destination() && b.header() == spec.header())
            {
                return refuse(
                    Field::Attachment(j, Part::Header),
                    Fault::TargetTaken {
                        destination: spec.destination().clone(),
                        header: spec.header().to_owned(),
                        earlier: earlier.secret().to_owned(),
                    },
                );
            }
            attachments.push(spec);
        }
        Ok(Scope {
            sources,
            allowlist,
            attachments,
        })
    }

    /// The source addresses, canonical, in the draft's order.
    pub fn sources(&self) -> &[IpAddr] {
        &self.sources
    }

    /// The destination names, canonical, in the draft's order.
    pub fn allowlist(&self) -> &[Name] {
        &self.allowlist
    }

    /// The attachments, in the draft's order.
    pub fn attachments(&self) -> &[AttachSpec] {
        &self.attachments
    }
}

/// A session's spec, checked.
///
/// invariant: the id is an id ([`crate::id::is_id`]), the attempt at least
/// 1, the tenant not empty, the scope a [`Scope`], at most [`MAX_RULES`]
/// Lock rules with distinct ids, the relay key absent or 32 bytes; the
/// passthrough names canonical, distinct and on the allowlist, and none of
/// them named by an attachment or a Lock rule (a rule for any destination,
/// `*`, reaches only the destinations the gateway terminates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSpec {
    id: String,
    tenant: String,
    attempt: u32,
    scope: Scope,
    lock: Vec<LockRule>,
    relay_key: Option<[u8; 32]>,
    passthrough: Vec<Name>,
}

impl SessionSpec {
    /// Check a draft; the error names the first field at fault.
    pub fn new(d: &SessionDraft<'_>) -> Result<SessionSpec, SpecError> {
        if !crate::id::is_id(d.id) {
            return refuse(Field::Id, Fault::Id);
        }
        if d.attempt == 0 {
            return refuse(Field::Attempt, Fault::Attempt);
        }
        if d.tenant.is_empty() {
            return refuse(Field::Tenant, Fault::Tenant);
        }
        let scope = Scope::new(&d.scope)?;
        if d.lock.len() > MAX_RULES {
            return refuse(Field::Lock, Fault::TooManyRules);
        }
        let mut lock: Vec<LockRule> = Vec::with_capacity(d.lock.len());
        for (k, r) in d.lock.iter().enumerate() {
            let rule = LockRule::check(r).or_else(|RuleError { field, reason }| {
                refuse(Field::Rule(k, field), Fault::Rule(reason))
            })?;
            if lock.iter().any(|l| l.id == rule.id) {
                return refuse(Field::Rule(k, RuleField::Id), Fault::Repeated);
            }
            lock.push(rule);
        }
        let relay_key = match d.relay_key.len() {
            0 => None,
            _ => Some(
                <[u8; 32]>::try_from(d.relay_key)
                    .or_else(|_| refuse(Field::RelayKey, Fault::RelayKey))?,
            ),
        };
        let passthrough = passthrough(&d.passthrough, &scope, &lock)?;
        Ok(SessionSpec {
            id: d.id.to_owned(),
            tenant: d.tenant.to_owned(),
            attempt: d.attempt,
            scope,
            lock,
            relay_key,
            passthrough,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Sources, allowlist and attachments.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The Lock rules, in the draft's order.
    pub fn lock(&self) -> &[LockRule] {
        &self.lock
    }

    /// The approval relay's public key, if any.
    pub fn relay_key(&self) -> Option<[u8; 32]> {
        self.relay_key
    }

    /// The allowlist's passthrough names, in the draft's order.
    pub fn passthrough(&self) -> &[Name] {
        &self.passthrough
    }
}

/// The passthrough names, checked against the scope and the Lock: each a
/// name on the allowlist, once; no attachment and no rule naming one.
fn passthrough(drafts: &[&str], scope: &Scope, lock: &[LockRule]) -> Result<Vec<Name>, SpecError> {
    let mut names: Vec<Name> = Vec::with_capacity(drafts.len());
    for (i, n) in drafts.iter().enumerate() {
        let name =
            name::canonicalize(n).or_else(|e| refuse(Field::Passthrough(i), Fault::Name(e)))?;
        if names.contains(&name) {
            return refuse(Field::Passthrough(i), Fault::Repeated);
        }
        if !scope.allowlist().contains(&name) {
            return refuse(
                Field::Passthrough(i),
                Fault::NotAllowed { destination: name },
            );
        }
        names.push(name);
    }
    if let Some((j, a)) = scope
        .attachments()
        .iter()
        .enumerate()
        .find(|(_, a)| names.contains(a.destination()))
    {
        return refuse(
            Field::Attachment(j, Part::Destination),
            Fault::Passthrough {
                destination: a.destination().clone(),
            },
        );
    }
    for (k, rule) in lock.iter().enumerate() {
        if let Some(destination) = rule.destination.as_ref().filter(|d| names.contains(d)) {
            return refuse(
                Field::Rule(k, RuleField::Destination),
                Fault::Passthrough {
                    destination: destination.clone(),
                },
            );
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_cases_hold_here() {
        for case in crate::cases::CASES {
            let got = SessionSpec::new(&case.draft())
                .map(|_| ())
                .map_err(|e| e.field);
            assert_eq!(got, case.want.map_or(Ok(()), Err), "{}", case.name);
        }
    }

    #[test]
    fn lock_rules_and_relay_keys() {
        let who = ["alice".to_owned()];
        let rule = RuleDraft {
            id: "lock-1",
            destination: "*",
            attachment: "",
            method: "",
            path_prefix: "",
            mode: "first_use",
            approvers: &who,
        };
        let mut d = crate::cases::CASES[0].draft();
        d.lock = vec![rule, rule];
        let e = SessionSpec::new(&d).unwrap_err();
        assert_eq!(e.to_string(), "lock[1].id: listed twice");
        d.lock = vec![RuleDraft {
            mode: "sometimes",
            ..rule
        }];
        let e = SessionSpec::new(&d).unwrap_err();
        assert_eq!(e.field, Field::Rule(0, RuleField::Mode));
        d.lock = vec![rule; MAX_RULES + 1];
        assert_eq!(SessionSpec::new(&d).unwrap_err().field, Field::Lock);
        d.lock = vec![rule];
        d.relay_key = &[7; 31];
        assert_eq!(SessionSpec::new(&d).unwrap_err().field, Field::RelayKey);
        d.relay_key = &[7; 32];
        let spec = SessionSpec::new(&d).unwrap();
        assert_eq!(spec.relay_key(), Some([7; 32]));
        assert_eq!(spec.lock().len(), 1);
    }

    #[test]
    fn passthrough_names_carry_no_attachment_and_no_rule() {
        let who = ["alice".to_owned()];
        let rule = |destination| RuleDraft {
            id: "lock-1",
            destination,
            attachment: "",
            method: "",
            path_prefix: "",
            mode: "first_use",
            approvers: &who,
        };
        let mut d = crate::cases::CASES[0].draft();
        d.scope.allowlist = vec!["api.example.com", "claude.ai"];
        d.passthrough = vec!["Claude.AI."];
        let spec = SessionSpec::new(&d).unwrap();
        assert_eq!(spec.passthrough()[0].as_str(), "claude.ai");
        // A rule for any destination reaches the terminated ones only.
        d.lock = vec![rule("*")];
        assert!(SessionSpec::new(&d).is_ok());
        d.lock = vec![rule("api.example.com"), rule("claude.ai")];
        d.lock[1].id = "lock-2";
        let e = SessionSpec::new(&d).unwrap_err();
        assert_eq!(e.field, Field::Rule(1, RuleField::Destination));
        assert!(
            matches!(&e.fault, Fault::Passthrough { destination } if destination.as_str() == "claude.ai")
        );
        d.lock.clear();
        d.scope.attachments = vec![AttachDraft::Text("K=claude.ai:authorization:Bearer")];
        let e = SessionSpec::new(&d).unwrap_err();
        assert_eq!(e.field, Field::Attachment(0, Part::Destination));
        assert_eq!(
            e.to_string(),
            "attachments[0].destination: names a passthrough destination, whose requests the gateway never sees"
        );
        d.scope.attachments.clear();
        d.passthrough = vec!["console.anthropic.com"];
        let e = SessionSpec::new(&d).unwrap_err();
        assert_eq!(e.field, Field::Passthrough(0));
        assert!(matches!(e.fault, Fault::NotAllowed { .. }));
        d.passthrough = vec!["claude.ai", "claude.ai"];
        assert_eq!(
            SessionSpec::new(&d).unwrap_err().field,
            Field::Passthrough(1)
        );
        d.passthrough = vec!["10.0.0.1"];
        assert!(matches!(
            SessionSpec::new(&d).unwrap_err().fault,
            Fault::Name(_)
        ));
    }

    #[test]
    fn errors_show_no_text_of_the_draft() {
        let mut d = crate::cases::CASES[0].draft();
        d.scope.attachments = vec![AttachDraft::Parts {
            secret: "K",
            destination: "10.9.8.7",
            header: "h",
            scheme: "",
        }];
        let e = SessionSpec::new(&d).unwrap_err().to_string();
        assert_eq!(e, "attachments[0].destination: an IP literal is not a name");
    }
}
