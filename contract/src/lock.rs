//! Lock rules: which uses of a session need a named person to decide
//! first. A rule matches on the destination (a canonical name, or `*`),
//! optionally an attachment (secret) name the request carries, a method and
//! a path prefix; its mode is `first_use` or `every_request`; it names the
//! approvers who may decide. Empty attachment, method and path prefix
//! match anything (the control channel's convention).

use std::fmt;

use crate::attach::is_tchar;
use crate::id::is_id;
use crate::name::{self, Name};
use crate::path::{self, RoutedPath};
use crate::secret::is_secret_name;

/// The longest Lock rule list a session may carry.
pub const MAX_RULES: usize = 256;
/// Where a rule matches any destination.
pub const ANY_DESTINATION: &str = "*";
/// The longest path prefix a rule may hold, in bytes.
pub const MAX_PATH_PREFIX_LEN: usize = 1024;
/// The longest method a rule may name, in bytes (methods are short words).
pub const MAX_METHOD_LEN: usize = 32;
/// At most this many approvers on one rule: a card goes to each.
pub const MAX_APPROVERS: usize = 32;

/// `first_use` or `every_request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    FirstUse,
    EveryRequest,
}

impl Mode {
    /// The mode a word names.
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "first_use" => Some(Mode::FirstUse),
            "every_request" => Some(Mode::EveryRequest),
            _ => None,
        }
    }

    /// The word.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::FirstUse => "first_use",
            Mode::EveryRequest => "every_request",
        }
    }
}

/// A rule's field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleField {
    Id,
    Destination,
    Attachment,
    Method,
    PathPrefix,
    Mode,
    Approvers,
}

impl RuleField {
    /// Its name on the control channel.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleField::Id => "id",
            RuleField::Destination => "destination",
            RuleField::Attachment => "attachment",
            RuleField::Method => "method",
            RuleField::PathPrefix => "path_prefix",
            RuleField::Mode => "mode",
            RuleField::Approvers => "approvers",
        }
    }
}

impl fmt::Display for RuleField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a rule is refused: the field and the rule it breaks, never its text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RuleError {
    pub field: RuleField,
    pub reason: String,
}

fn bad(field: RuleField, reason: impl Into<String>) -> RuleError {
    RuleError {
        field,
        reason: reason.into(),
    }
}

/// `*` (any: `None`) or a canonical destination name.
pub fn destination(text: &str) -> Result<Option<Name>, RuleError> {
    match text {
        ANY_DESTINATION => Ok(None),
        d => name::canonicalize(d)
            .map(Some)
            .map_err(|_| bad(RuleField::Destination, "not a host name or *")),
    }
}

/// Empty (any) or a secret name.
pub fn attachment(text: &str) -> Result<Option<String>, RuleError> {
    match text {
        "" => Ok(None),
        a if is_secret_name(a) => Ok(Some(a.to_owned())),
        _ => Err(bad(RuleField::Attachment, "not a secret name")),
    }
}

/// Empty (any) or an HTTP method: an RFC 9110 token of at most
/// [`MAX_METHOD_LEN`] bytes, upper-cased. Requests' methods are compared
/// without regard to ASCII case: a rule for `POST` also holds `post` and
/// `Post`, which some destinations route as `POST` (Express lower-cases
/// methods before routing).
pub fn method(text: &str) -> Result<Option<String>, RuleError> {
    match text {
        "" => Ok(None),
        m if m.len() <= MAX_METHOD_LEN && m.bytes().all(is_tchar) => {
            Ok(Some(m.to_ascii_uppercase()))
        }
        _ => Err(bad(
            RuleField::Method,
            format!("not an HTTP method (a token of 1 to {MAX_METHOD_LEN} characters)"),
        )),
    }
}

/// Empty (any) or a path prefix: starts with `/`, at most
/// [`MAX_PATH_PREFIX_LEN`] printable ASCII characters without spaces, no
/// query or fragment (proposals carry the path without its query); kept in
/// its canonical form ([`path::canonical`]), the form requests are judged in.
pub fn path_prefix(text: &str) -> Result<Option<String>, RuleError> {
    match text {
        "" => Ok(None),
        p if p.starts_with('/')
            && p.len() <= MAX_PATH_PREFIX_LEN
            && p.bytes().all(|b| b.is_ascii_graphic())
            && !p.contains(['?', '#']) =>
        {
            Ok(Some(path::canonical(p).into_owned()))
        }
        _ => Err(bad(
            RuleField::PathPrefix,
            format!("must start with '/' and hold at most {MAX_PATH_PREFIX_LEN} printable characters, no spaces, no query"),
        )),
    }
}

/// `first_use` or `every_request`.
pub fn mode(text: &str) -> Result<Mode, RuleError> {
    Mode::parse(text).ok_or_else(|| bad(RuleField::Mode, "must be first_use or every_request"))
}

/// Whether `text` is an approver's name (an id: 1-64 letters, digits, `-`,
/// `_` or `.`).
pub fn is_approver(text: &str) -> bool {
    is_id(text)
}

/// Approvers sorted, without repeats: at least one, at most
/// [`MAX_APPROVERS`], each an approver's name.
pub fn approvers(list: &[String]) -> Result<Vec<String>, RuleError> {
    if list.iter().any(|a| !is_approver(a)) {
        return Err(bad(
            RuleField::Approvers,
            "each must be 1-64 letters, digits, '-', '_' or '.'",
        ));
    }
    let mut list = list.to_vec();
    list.sort();
    list.dedup();
    if list.is_empty() {
        return Err(bad(
            RuleField::Approvers,
            "a rule needs at least one approver",
        ));
    }
    if list.len() > MAX_APPROVERS {
        return Err(bad(
            RuleField::Approvers,
            format!("a rule names at most {MAX_APPROVERS} approvers"),
        ));
    }
    Ok(list)
}

/// A rule as the control channel sends it.
#[derive(Clone, Copy, Debug)]
pub struct RuleDraft<'a> {
    pub id: &'a str,
    pub destination: &'a str,
    pub attachment: &'a str,
    pub method: &'a str,
    pub path_prefix: &'a str,
    pub mode: &'a str,
    pub approvers: &'a [String],
}

/// One checked Lock rule. `None` fields match anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRule {
    pub id: String,
    pub destination: Option<Name>,
    pub attachment: Option<String>,
    /// Upper case.
    pub method: Option<String>,
    /// Canonical ([`path::canonical`]).
    pub path_prefix: Option<String>,
    /// The prefix's routing key ([`path::routing_key`]).
    pub path_key: Option<String>,
    pub mode: Mode,
    /// Sorted, without repeats, at least one.
    pub approvers: Vec<String>,
}

impl LockRule {
    /// Check a rule; the error names the field.
    pub fn check(d: &RuleDraft<'_>) -> Result<LockRule, RuleError> {
        if !is_id(d.id) {
            return Err(bad(RuleField::Id, crate::id::ID_RULE));
        }
        let path_prefix = path_prefix(d.path_prefix)?;
        Ok(LockRule {
            id: d.id.to_owned(),
            destination: destination(d.destination)?,
            attachment: attachment(d.attachment)?,
            method: method(d.method)?,
            path_key: path_prefix.as_deref().map(path::routing_key),
            path_prefix,
            mode: mode(d.mode)?,
            approvers: approvers(d.approvers)?,
        })
    }

    /// Whether the rule can hold requests to `destination` at all.
    pub fn governs(&self, destination: &Name) -> bool {
        self.destination.as_ref().is_none_or(|d| d == destination)
    }

    /// Whether a request with these traits matches the rule: the method
    /// in any ASCII case, the path under the prefix in its canonical form
    /// or in its routing key (see [`crate::path`]).
    pub fn matches(
        &self,
        destination: &Name,
        method: &str,
        path: &RoutedPath,
        attachments: &[&str],
    ) -> bool {
        self.governs(destination)
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.path_prefix.as_deref().is_none_or(|p| {
                path.canonical().starts_with(p)
                    || self
                        .path_key
                        .as_deref()
                        .is_some_and(|k| path.key().starts_with(k))
            })
            && self
                .attachment
                .as_deref()
                .is_none_or(|a| attachments.contains(&a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft<'a>(approvers: &'a [String]) -> RuleDraft<'a> {
        RuleDraft {
            id: "lock-1",
            destination: "API.example.com.",
            attachment: "",
            method: "post",
            path_prefix: "/merge",
            mode: "every_request",
            approvers,
        }
    }

    #[test]
    fn rules_are_normalised_and_match_on_every_field() {
        let who = ["bob".to_owned(), "alice".to_owned(), "bob".to_owned()];
        let r = LockRule::check(&draft(&who)).unwrap();
        assert_eq!(r.method.as_deref(), Some("POST"));
        assert_eq!(r.approvers, ["alice", "bob"]);
        let d = name::canonicalize("api.example.com").unwrap();
        let other = name::canonicalize("other.example.com").unwrap();
        let p = RoutedPath::new;
        assert!(r.matches(&d, "POST", &p("/merge/1"), &[]));
        assert!(!r.matches(&other, "POST", &p("/merge/1"), &[]));
        assert!(!r.matches(&d, "GET", &p("/merge/1"), &[]));
        assert!(!r.matches(&d, "POST", &p("/other"), &[]));
        // Every spelling a destination may route as POST /merge.
        for method in ["POST", "post", "Post", "pOsT"] {
            assert!(r.matches(&d, method, &p("/merge"), &[]), "{method}");
        }
        for path in [
            "/%6Derge/1",
            "/./merge",
            "/x/../merge",
            "/%2e/merge",
            "//merge",
            "/MERGE",
            "/x%2F..%2Fmerge",
            "/x/..;/merge",
            "/merge;v=1",
            "/x\\..\\merge",
        ] {
            assert!(r.matches(&d, "POST", &p(path), &[]), "{path}");
        }
        for path in ["/mer", "/x/merge", "/%2Fmerge%2F..", "/me%72ge%2F../x"] {
            let held = r.matches(&d, "POST", &p(path), &[]);
            assert_eq!(held, path.starts_with("/me%72ge"), "{path}");
        }
        let any = LockRule::check(&RuleDraft {
            destination: "*",
            attachment: "GH",
            method: "",
            path_prefix: "",
            ..draft(&who)
        })
        .unwrap();
        assert!(any.matches(&other, "GET", &p("/"), &["GH"]));
        assert!(!any.matches(&other, "GET", &p("/"), &["OTHER"]));
        // Prefixes are kept canonical.
        let odd = LockRule::check(&RuleDraft {
            path_prefix: "/x/../%64eploy/./",
            ..draft(&who)
        })
        .unwrap();
        assert_eq!(odd.path_prefix.as_deref(), Some("/deploy/"));
        assert_eq!(odd.path_key.as_deref(), Some("/deploy/"));
    }

    #[test]
    fn bad_rules_name_the_field() {
        let a = ["a".to_owned()];
        let none: [String; 0] = [];
        let many: Vec<String> = (0..=MAX_APPROVERS).map(|i| format!("a{i}")).collect();
        let spaced = ["al ice".to_owned()];
        let base = draft(&a);
        for (bad, field) in [
            (
                RuleDraft {
                    id: "has space",
                    ..base
                },
                RuleField::Id,
            ),
            (
                RuleDraft {
                    mode: "sometimes",
                    ..base
                },
                RuleField::Mode,
            ),
            (
                RuleDraft {
                    approvers: &none,
                    ..base
                },
                RuleField::Approvers,
            ),
            (
                RuleDraft {
                    approvers: &spaced,
                    ..base
                },
                RuleField::Approvers,
            ),
            (
                RuleDraft {
                    approvers: &many,
                    ..base
                },
                RuleField::Approvers,
            ),
            (
                RuleDraft {
                    path_prefix: "nope",
                    ..base
                },
                RuleField::PathPrefix,
            ),
            (
                RuleDraft {
                    path_prefix: "/a?b",
                    ..base
                },
                RuleField::PathPrefix,
            ),
            (
                RuleDraft {
                    path_prefix: "/a b",
                    ..base
                },
                RuleField::PathPrefix,
            ),
            (
                RuleDraft {
                    destination: "1.2.3.4",
                    ..base
                },
                RuleField::Destination,
            ),
            (
                RuleDraft {
                    destination: "**",
                    ..base
                },
                RuleField::Destination,
            ),
            (
                RuleDraft {
                    method: "GE T",
                    ..base
                },
                RuleField::Method,
            ),
            (
                RuleDraft {
                    attachment: "bad name",
                    ..base
                },
                RuleField::Attachment,
            ),
        ] {
            assert_eq!(LockRule::check(&bad).unwrap_err().field, field, "{bad:?}");
        }
    }
}
