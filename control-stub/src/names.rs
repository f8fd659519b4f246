//! What a well-formed name, source, attachment and secret value is: the
//! contract's rules ([`talos_contract`]), the same ones the gateway keeps,
//! turned into the control stub's errors, so that the control stub refuses
//! at the start of a session what the gateway would refuse when the
//! session opens — not halfway through.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use talos_contract::{attach, id, name, secret};

use crate::error::Error;

pub use talos_contract::attach::MAX_HEADER_LEN;
pub use talos_contract::name::{MAX_LABEL_LEN, MAX_NAME_LEN};
pub use talos_contract::secret::{trim_line_ending, MAX_SECRET_LEN, MAX_SECRET_NAME_LEN};

/// The longest gateway id, in bytes.
pub const MAX_GATEWAY_ID_LEN: usize = 128;

fn name_invalid(what: &'static str, got: &str, reason: impl Into<String>) -> Error {
    Error::NameInvalid {
        what,
        got: got.chars().take(300).collect(),
        reason: reason.into(),
    }
}

/// A tenant name as the spec defines it ([`id::is_tenant_name`]).
pub fn tenant(text: &str) -> Result<String, Error> {
    if !id::is_tenant_name(text) {
        return Err(name_invalid(
            "tenant",
            text,
            "a tenant is a lower-case letter or digit, then up to 62 lower-case letters, digits, '.', '-' or '_'",
        ));
    }
    Ok(text.to_owned())
}

/// A secret's name ([`secret::is_secret_name`]).
pub fn secret_name(text: &str) -> Result<String, Error> {
    if !secret::is_secret_name(text) {
        return Err(name_invalid(
            "secret",
            text,
            format!("a secret name is 1 to {MAX_SECRET_NAME_LEN} letters, digits, '_', '-' or '.'"),
        ));
    }
    Ok(text.to_owned())
}
/// A gateway's id: visible ASCII, at most [`MAX_GATEWAY_ID_LEN`] bytes.
pub fn gateway_id(text: &str) -> Result<String, Error> {
    if text.is_empty()
        || text.len() > MAX_GATEWAY_ID_LEN
        || !text.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(name_invalid(
            "gateway",
            text,
            format!("a gateway id is 1 to {MAX_GATEWAY_ID_LEN} visible ASCII characters"),
        ));
    }
    Ok(text.to_owned())
}

/// A destination name in canonical form ([`name::canonicalize`]).
pub fn destination(text: &str) -> Result<String, Error> {
    name::canonicalize(text)
        .map(|n| n.as_str().to_owned())
        .map_err(|e| destination_invalid(text, &e))
}

fn destination_invalid(text: &str, e: &name::NameError) -> Error {
    let reason = match e {
        name::NameError::Empty => "the name is empty".to_owned(),
        other => other.brief().to_owned(),
    };
    name_invalid("destination", text, reason)
}

/// A session's source address: the address its connections come from, by
/// which the gateway names the session (canonical: IPv4-mapped IPv6 as
/// IPv4).
pub fn source(text: &str) -> Result<IpAddr, Error> {
    talos_contract::source::parse(text).ok_or_else(|| source_invalid(text))
}

fn source_invalid(text: &str) -> Error {
    Error::invalid(format!(
        "source {:?} is not an IP address",
        text.chars().take(100).collect::<String>()
    ))
}

/// Check a secret value can go into a header and the gateway's masker
/// ([`secret::check_value`]). The error names the secret, never the value.
pub fn secret_value(name: &str, value: &[u8]) -> Result<(), Error> {
    secret::check_value(value).map_err(|e| Error::SecretValueInvalid {
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

/// `SECRET=destination:header[:scheme]`: which secret the gateway adds to
/// which destination's requests, in which header, as the store keeps it.
/// Never holds a value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachSpec {
    /// The secret's name in the tenant's secret store.
    pub secret: String,
    /// The destination (canonical name) whose requests carry it.
    pub destination: String,
    /// The header (lower case) the gateway sets.
    pub header: String,
    /// Written before the value with one space (`Bearer`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
}

impl From<&attach::AttachSpec> for AttachSpec {
    fn from(a: &attach::AttachSpec) -> AttachSpec {
        AttachSpec {
            secret: a.secret().to_owned(),
            destination: a.destination().as_str().to_owned(),
            header: a.header().to_owned(),
            scheme: a.scheme().map(str::to_owned),
        }
    }
}

impl AttachSpec {
    /// Parse `SECRET=destination:header[:scheme]` as the gateway does
    /// ([`attach::AttachSpec::parse`]).
    pub fn parse(spec: &str) -> Result<AttachSpec, Error> {
        attach::AttachSpec::parse(spec)
            .map(|a| AttachSpec::from(&a))
            .map_err(|e| attachment_invalid(spec, &e))
    }
}

fn attachment_invalid(spec: &str, e: &attach::AttachError) -> Error {
    let shown: String = spec.chars().take(200).collect();
    Error::invalid(format!("attachment {shown:?}: {e}"))
}

/// A session's sources, destination names and attachments, checked.
pub type Scope = (Vec<IpAddr>, Vec<String>, Vec<AttachSpec>);

/// The sources, names and attachments of a session being started, checked
/// by the contract's rules ([`talos_contract::spec::Scope`]) after repeats
/// of a source or a name are dropped (naming one twice on the command line
/// asks for it once).
pub fn scope(sources: &[String], allow: &[String], attach: &[String]) -> Result<Scope, Error> {
    use talos_contract::spec::{AttachDraft, Fault, Field, ScopeDraft};
    let mut once_sources: Vec<String> = Vec::new();
    for s in sources {
        let key = talos_contract::source::parse(s).map(|ip| ip.to_string());
        if !once_sources.iter().any(|o| {
            key.is_some() && talos_contract::source::parse(o).map(|ip| ip.to_string()) == key
        }) {
            once_sources.push(s.clone());
        }
    }
    let mut once_allow: Vec<&str> = Vec::new();
    for a in allow {
        let key = name::canonicalize(a).ok();
        if !once_allow
            .iter()
            .any(|o| key.is_some() && name::canonicalize(o).ok() == key)
        {
            once_allow.push(a);
        }
    }
    let draft = ScopeDraft {
        sources: once_sources.clone(),
        allowlist: once_allow.clone(),
        attachments: attach.iter().map(|a| AttachDraft::Text(a)).collect(),
    };
    let scope = talos_contract::spec::Scope::new(&draft).map_err(|e| match (e.field, e.fault) {
        (Field::Sources, _) => Error::invalid("a session needs at least one --source"),
        (Field::Source(i), _) => source_invalid(&once_sources[i]),
        (Field::Allowlist(i), Fault::Name(n)) => {
            let name = destination_invalid(once_allow[i], &n);
            Error::invalid(name.to_string())
        }
        (Field::Attachment(j, _), Fault::Attach(a)) => attachment_invalid(&attach[j], &a),
        (Field::Attachment(j, _), Fault::NotAllowed { destination }) => Error::invalid(format!(
            "attachment {}: destination {destination} is not among the session's --allow names",
            secret_of(&attach[j])
        )),
        (
            Field::Attachment(_, _),
            Fault::TargetTaken {
                destination,
                header,
                ..
            },
        ) => Error::invalid(format!(
            "two attachments set header {header} on {destination}"
        )),
        (field, fault) => Error::invalid(format!("{field}: {fault}")),
    })?;
    Ok((
        scope.sources().to_vec(),
        scope
            .allowlist()
            .iter()
            .map(|n| n.as_str().to_owned())
            .collect(),
        scope.attachments().iter().map(AttachSpec::from).collect(),
    ))
}

fn secret_of(text: &str) -> &str {
    text.split_once('=').map_or(text, |(s, _)| s)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_the_stubs_errors() {
        assert_eq!(tenant("Acme").unwrap_err().code(), "name_invalid");
        assert_eq!(secret_name("a b").unwrap_err().code(), "name_invalid");
        assert_eq!(destination("API.GitHub.com.").unwrap(), "api.github.com");
        assert_eq!(destination("10.0.0.1").unwrap_err().code(), "name_invalid");
        assert_eq!(source("::ffff:10.0.0.1").unwrap().to_string(), "10.0.0.1");
        assert_eq!(
            secret_value("K", b"a\nb").unwrap_err().code(),
            "secret_value_invalid"
        );
        let a = AttachSpec::parse("GITHUB_TOKEN=API.github.com:Authorization:Bearer").unwrap();
        assert_eq!(
            a,
            AttachSpec {
                secret: "GITHUB_TOKEN".into(),
                destination: "api.github.com".into(),
                header: "authorization".into(),
                scheme: Some("Bearer".into()),
            }
        );
        assert_eq!(
            AttachSpec::parse("K=a.com:host").unwrap_err().code(),
            "sandbox_request_invalid"
        );
    }

    #[test]
    fn scopes_drop_repeats_and_keep_the_rules() {
        let v = |xs: &[&str]| xs.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let (sources, allow, attach) = scope(
            &v(&["10.0.0.1", "::ffff:10.0.0.1"]),
            &v(&["api.example.com", "API.example.com."]),
            &v(&["K=api.example.com:x-key"]),
        )
        .unwrap();
        assert_eq!(sources.len(), 1);
        assert_eq!(allow, ["api.example.com"]);
        assert_eq!(attach.len(), 1);
        for (s, a, t) in [
            (v(&[]), v(&["a.example"]), v(&[])),
            (v(&["nope"]), v(&["a.example"]), v(&[])),
            (v(&["10.0.0.1"]), v(&["10.0.0.2"]), v(&[])),
            (v(&["10.0.0.1"]), v(&["a.example"]), v(&["K=b.example:h"])),
            (
                v(&["10.0.0.1"]),
                v(&["a.example"]),
                v(&["K=a.example:h", "L=a.example:H"]),
            ),
        ] {
            assert_eq!(
                scope(&s, &a, &t).unwrap_err().code(),
                "sandbox_request_invalid",
                "{s:?} {a:?} {t:?}"
            );
        }
    }
}
