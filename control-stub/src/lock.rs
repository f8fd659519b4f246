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

use crate::error::Error;
use crate::model::LockMode;
use crate::names;

/// Where a rule matches any destination.
pub const ANY_DESTINATION: &str = "*";

/// The longest path prefix a rule may hold, in bytes.
pub const MAX_PATH_PREFIX_LEN: usize = 1024;

/// The longest method a rule may name, in bytes (methods are short words).
pub const MAX_METHOD_LEN: usize = 32;

/// The longest approver name, in bytes.
pub const MAX_APPROVER_LEN: usize = 64;

/// At most this many approvers on one rule: a card goes to each.
pub const MAX_APPROVERS: usize = 32;

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
    /// Check and normalise a rule: the destination canonicalised (or `*`),
    /// the method upper-cased, the approvers sorted without repeats.
    pub fn check(
        destination: &str,
        attachment: Option<&str>,
        method: Option<&str>,
        path_prefix: Option<&str>,
        mode: LockMode,
        approvers: &[String],
    ) -> Result<NewRule, Error> {
        let destination = if destination == ANY_DESTINATION {
            ANY_DESTINATION.to_owned()
        } else {
            names::destination(destination).map_err(|e| invalid(format!("--destination: {e}")))?
        };
        let attachment = match attachment {
            None => String::new(),
            Some(a) => names::secret_name(a).map_err(|e| invalid(format!("--attachment: {e}")))?,
        };
        let method = match method {
            None => String::new(),
            Some(m) => http_method(m)?,
        };
        let path_prefix = match path_prefix {
            None => String::new(),
            Some(p) => path_prefix_checked(p)?,
        };
        if approvers.is_empty() {
            return Err(invalid("a rule needs at least one --approver"));
        }
        let mut list = Vec::new();
        for a in approvers {
            list.push(approver(a).map_err(|e| invalid(e.to_string()))?);
        }
        list.sort();
        list.dedup();
        if list.len() > MAX_APPROVERS {
            return Err(invalid(format!(
                "a rule names at most {MAX_APPROVERS} approvers"
            )));
        }
        Ok(NewRule {
            destination,
            attachment,
            method,
            path_prefix,
            mode,
            approvers: list,
        })
    }
}

/// An HTTP method as a rule holds it: an RFC 9110 token, upper-cased.
fn http_method(text: &str) -> Result<String, Error> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if text.is_empty() || text.len() > MAX_METHOD_LEN || !text.bytes().all(token) {
        return Err(invalid(format!(
            "--method {:?}: a method is an HTTP token of 1 to {MAX_METHOD_LEN} characters",
            text.chars().take(64).collect::<String>()
        )));
    }
    Ok(text.to_ascii_uppercase())
}

/// A path prefix: starts with `/`, printable ASCII without spaces, no
/// query or fragment (proposals carry the path without its query).
fn path_prefix_checked(text: &str) -> Result<String, Error> {
    let shown = || text.chars().take(64).collect::<String>();
    if !text.starts_with('/') {
        return Err(invalid(format!(
            "--path-prefix {:?}: a path prefix starts with '/'",
            shown()
        )));
    }
    if text.len() > MAX_PATH_PREFIX_LEN
        || !text.bytes().all(|b| b.is_ascii_graphic())
        || text.contains(['?', '#'])
    {
        return Err(invalid(format!(
            "--path-prefix {:?}: at most {MAX_PATH_PREFIX_LEN} printable characters, no spaces, no '?' or '#'",
            shown()
        )));
    }
    Ok(text.to_owned())
}

/// An approver's name: 1 to 64 of letters, digits, `.`, `_` and `-`.
pub fn approver(text: &str) -> Result<String, Error> {
    let ok = !text.is_empty()
        && text.len() <= MAX_APPROVER_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
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
    /// Whether a request with these fields is one this rule holds. The
    /// path prefix is a plain prefix of the path (without its query); the
    /// relay uses this only to check a gateway's claim that the rule
    /// matched, so the plain reading (the widest) is the safe one here.
    pub fn matches_request(
        &self,
        destination: &str,
        method: &str,
        path: &str,
        attachments: &[String],
    ) -> bool {
        (self.destination == ANY_DESTINATION || self.destination == destination)
            && (self.attachment.is_empty() || attachments.contains(&self.attachment))
            && (self.method.is_empty() || self.method.eq_ignore_ascii_case(method))
            && (self.path_prefix.is_empty() || path.starts_with(&self.path_prefix))
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
