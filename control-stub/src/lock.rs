//! The Lock: the account's rules that say which uses of a session need a
//! named person to decide first.
//!
//! A rule matches on the destination (a canonical name, or `*` for any),
//! optionally an attachment (secret) name the request carries, a method
//! and a path prefix; its mode is `first_use` (the first matching request
//! under the session's current authority, counted again after each resume
//! or recovery) or `every_request`; and it names the approvers who may
//! decide. The rules travel to the gateways with every open
//! (`OpenSessionRequest.lock`), as they stand at that open.
//!
//! Rule ids are `lock-N`, never reused after a removal: proposals,
//! records and certificates name rules by id, and an old id must not come
//! to mean another rule.

use serde::{Deserialize, Serialize};
use talos_contract::lock as rules;
use talos_contract::name;
use talos_contract::path::RoutedPath;

use crate::error::Error;
use crate::model::LockMode;

pub use talos_contract::lock::{
    ANY_DESTINATION, MAX_APPROVERS, MAX_METHOD_LEN, MAX_PATH_PREFIX_LEN,
};
/// The longest approver name, in bytes.
pub const MAX_APPROVER_LEN: usize = talos_contract::id::MAX_ID_LEN;

/// A Lock rule as stored and as sent to the gateways. Empty `attachment`,
/// `method` and `path_prefix` match anything (the control channel's
/// convention).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRule {
    pub id: String,
    /// A canonical destination name, or `*`.
    pub destination: String,
    pub attachment: String,
    /// Upper case.
    pub method: String,
    pub path_prefix: String,
    pub mode: LockMode,
    /// Sorted, without repeats, at least one.
    pub approvers: Vec<String>,
    pub created_at: String,
}

/// A rule as `policy lock add` asks for it, before it has an id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRule {
    pub destination: String,
    pub attachment: String,
    pub method: String,
    pub path_prefix: String,
    pub mode: LockMode,
    pub approvers: Vec<String>,
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::LockRuleInvalid {
        reason: reason.into(),
    }
}

impl NewRule {
    /// Check and normalise a rule by the contract's rules
    /// ([`talos_contract::lock`], the gateway's own): the destination
    /// canonicalised (or `*`), the method upper-cased, the approvers sorted
    /// without repeats. A flag given empty is refused (leave it out to
    /// match anything).
    pub fn check(
        destination: &str,
        attachment: Option<&str>,
        method: Option<&str>,
        path_prefix: Option<&str>,
        mode: LockMode,
        approvers: &[String],
    ) -> Result<NewRule, Error> {
        let flag = |name: &str, e: rules::RuleError| invalid(format!("--{name}: {}", e.reason));
        let given = |name: &str, text: Option<&str>| match text {
            Some("") => Err(invalid(format!(
                "--{name}: empty (leave it out to match any)"
            ))),
            t => Ok(t.unwrap_or_default().to_owned()),
        };
        let destination = rules::destination(destination)
            .map_err(|e| flag("destination", e))?
            .map_or_else(|| ANY_DESTINATION.to_owned(), |n| n.as_str().to_owned());
        let attachment = given("attachment", attachment)?;
        let attachment = rules::attachment(&attachment)
            .map_err(|e| flag("attachment", e))?
            .unwrap_or_default();
        let method = given("method", method)?;
        let method = rules::method(&method)
            .map_err(|e| flag("method", e))?
            .unwrap_or_default();
        let path_prefix = given("path-prefix", path_prefix)?;
        let path_prefix = rules::path_prefix(&path_prefix)
            .map_err(|e| flag("path-prefix", e))?
            .unwrap_or_default();
        let approvers = rules::approvers(approvers).map_err(|e| flag("approver", e))?;
        Ok(NewRule {
            destination,
            attachment,
            method,
            path_prefix,
            mode,
            approvers,
        })
    }
}

/// An approver's name: an id (1 to 64 letters, digits, `.`, `_` and `-`).
pub fn approver(text: &str) -> Result<String, Error> {
    if !rules::is_approver(text) {
        return Err(Error::NameInvalid {
            what: "approver",
            got: text.chars().take(100).collect(),
            reason: format!(
                "an approver's name is 1 to {MAX_APPROVER_LEN} letters, digits, '.', '_' or '-'"
            ),
        });
    }
    Ok(text.to_owned())
}

impl LockRule {
    /// The rule as the gateways hold it: the stored fields through the
    /// contract's constructor, as `OpenSession` passes them on.
    pub fn judged(&self) -> Result<rules::LockRule, rules::RuleError> {
        rules::LockRule::check(&rules::RuleDraft {
            id: &self.id,
            destination: &self.destination,
            attachment: &self.attachment,
            method: &self.method,
            path_prefix: &self.path_prefix,
            mode: self.mode.as_str(),
            approvers: &self.approvers,
        })
    }

    /// Whether this rule holds a request with these fields, judged as the
    /// gateway judges it ([`rules::LockRule::matches`]: the method in any
    /// case, the path under the prefix in its canonical form or its
    /// routing key). A proposal carries the canonical path, whose routing
    /// key is the one the gateway read from the path as sent
    /// ([`talos_contract::path::routing_key`] is a function of the
    /// canonical path). A destination that is no name, or a stored rule
    /// the contract would refuse, matches nothing.
    pub fn matches_request(
        &self,
        destination: &str,
        method: &str,
        path: &str,
        attachments: &[String],
    ) -> bool {
        let (Ok(rule), Ok(destination)) = (self.judged(), name::canonicalize(destination)) else {
            return false;
        };
        let attachments: Vec<&str> = attachments.iter().map(String::as_str).collect();
        rule.matches(&destination, method, &RoutedPath::new(path), &attachments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_normalised() {
        let r = NewRule::check(
            "API.GitHub.com.",
            Some("GH"),
            Some("post"),
            Some("/repos/"),
            LockMode::FirstUse,
            &["bob".into(), "alice".into(), "bob".into()],
        )
        .unwrap();
        assert_eq!(r.destination, "api.github.com");
        assert_eq!(r.method, "POST");
        assert_eq!(r.approvers, ["alice", "bob"]);
        let any =
            NewRule::check("*", None, None, None, LockMode::EveryRequest, &["a".into()]).unwrap();
        assert_eq!(any.destination, "*");
        assert_eq!(any.method, "");
    }

    #[test]
    fn bad_rules_are_refused() {
        let a = ["alice".to_owned()];
        let m = LockMode::FirstUse;
        for (dest, att, meth, path, appr) in [
            ("*", None, Some("GE T"), None, &a[..]),
            ("*", None, Some(""), None, &a[..]),
            ("*", None, None, Some("repos"), &a[..]),
            ("*", None, None, Some("/a?b"), &a[..]),
            ("*", None, None, None, &[][..]),
            ("*", None, None, None, &["al ice".to_owned()][..]),
            ("*", Some("bad name"), None, None, &a[..]),
            ("no_such..name", None, None, None, &a[..]),
            ("**", None, None, None, &a[..]),
        ] {
            let e = NewRule::check(dest, att, meth, path, m, appr).unwrap_err();
            assert_eq!(
                e.code(),
                "lock_rule_invalid",
                "{dest} {att:?} {meth:?} {path:?}"
            );
        }
    }
}
