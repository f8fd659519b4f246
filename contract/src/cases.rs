//! Tables both sides of the contract are tested against, so that they
//! cannot drift apart:
//!
//! - [`CASES`]: session drafts, valid and invalid, that every entry point
//!   that builds a [`SessionSpec`](crate::spec::SessionSpec) runs — the
//!   spec itself, a static session in the gateway's config, the gateway's
//!   `OpenSession`. Each invalid draft names the field at fault.
//! - [`LOCK_CASES`]: requests under one Lock rule ([`lock_rule`]), each
//!   with the canonical path the destination gets and whether the rule
//!   holds it: the gateway judges the path as sent, the approval relay the
//!   canonical path its proposal carries, and both must agree.

use crate::attach::Part;
use crate::lock::{LockRule, RuleDraft};
use crate::spec::{AttachDraft, Field, ScopeDraft, SessionDraft};

/// One attachment: secret, destination, header, scheme (empty: none).
pub type Attach = (&'static str, &'static str, &'static str, &'static str);

/// One draft and what becomes of it.
#[derive(Debug)]
pub struct Case {
    pub name: &'static str,
    pub id: &'static str,
    pub tenant: &'static str,
    pub attempt: u32,
    pub sources: &'static [&'static str],
    pub allowlist: &'static [&'static str],
    pub attachments: &'static [Attach],
    /// `None`: valid.
    pub want: Option<Field>,
}

impl Case {
    /// The draft, attachments as parts.
    pub fn draft(&self) -> SessionDraft<'static> {
        SessionDraft {
            id: self.id,
            tenant: self.tenant,
            attempt: self.attempt,
            scope: ScopeDraft {
                sources: self.sources.iter().map(|s| (*s).to_owned()).collect(),
                allowlist: self.allowlist.to_vec(),
                attachments: self
                    .attachments
                    .iter()
                    .map(
                        |&(secret, destination, header, scheme)| AttachDraft::Parts {
                            secret,
                            destination,
                            header,
                            scheme,
                        },
                    )
                    .collect(),
            },
            ..SessionDraft::default()
        }
    }

    /// Attachment `j` in its text form, `SECRET=destination:header[:scheme]`.
    pub fn attach_text(&self, j: usize) -> String {
        let (secret, destination, header, scheme) = self.attachments[j];
        let mut text = format!("{secret}={destination}:{header}");
        if !scheme.is_empty() {
            text.push(':');
            text.push_str(scheme);
        }
        text
    }
}

const GOOD: Case = Case {
    name: "valid: one source, one name",
    id: "s1",
    tenant: "acme",
    attempt: 1,
    sources: &["10.0.0.5"],
    allowlist: &["api.example.com"],
    attachments: &[],
    want: None,
};

const ATTACH: &[Attach] = &[("GH", "api.example.com", "Authorization", "Bearer")];

/// The table.
pub const CASES: &[Case] = &[
    GOOD,
    Case {
        name: "valid: mapped source, names canonicalised, an attachment",
        attempt: 3,
        sources: &["::ffff:10.0.0.6", "fd00::7"],
        allowlist: &["API.Example.com.", "other.example"],
        attachments: ATTACH,
        ..GOOD
    },
    Case {
        name: "valid: two headers on one destination, one without a scheme",
        attachments: &[
            ("GH", "api.example.com", "authorization", "Bearer"),
            ("K", "api.example.com", "x-api-key", ""),
        ],
        ..GOOD
    },
    Case {
        name: "id with a space",
        id: "has space",
        want: Some(Field::Id),
        ..GOOD
    },
    Case {
        name: "attempt 0",
        attempt: 0,
        want: Some(Field::Attempt),
        ..GOOD
    },
    Case {
        name: "empty tenant",
        tenant: "",
        want: Some(Field::Tenant),
        ..GOOD
    },
    Case {
        name: "no source",
        sources: &[],
        want: Some(Field::Sources),
        ..GOOD
    },
    Case {
        name: "a source that is no address",
        sources: &["10.0.0.5", "10.0.0.300"],
        want: Some(Field::Source(1)),
        ..GOOD
    },
    Case {
        name: "an IP literal on the allowlist",
        allowlist: &["10.0.0.1"],
        want: Some(Field::Allowlist(0)),
        ..GOOD
    },
    Case {
        name: "a name listed twice",
        allowlist: &["api.example.com", "API.example.com."],
        want: Some(Field::Allowlist(1)),
        ..GOOD
    },
    Case {
        name: "an attachment off the allowlist",
        attachments: &[("GH", "other.example", "authorization", "")],
        want: Some(Field::Attachment(0, Part::Destination)),
        ..GOOD
    },
    Case {
        name: "an attachment to an IP literal",
        attachments: &[("GH", "10.0.0.1", "authorization", "")],
        want: Some(Field::Attachment(0, Part::Destination)),
        ..GOOD
    },
    Case {
        name: "a bad secret name",
        attachments: &[("G H", "api.example.com", "authorization", "")],
        want: Some(Field::Attachment(0, Part::Secret)),
        ..GOOD
    },
    Case {
        name: "a header that is no header name",
        attachments: &[("GH", "api.example.com", "bad header", "")],
        want: Some(Field::Attachment(0, Part::Header)),
        ..GOOD
    },
    Case {
        name: "a header the gateway decides",
        attachments: &[("GH", "api.example.com", "Host", "")],
        want: Some(Field::Attachment(0, Part::Whole)),
        ..GOOD
    },
    Case {
        name: "a scheme with a space",
        attachments: &[("GH", "api.example.com", "authorization", "two words")],
        want: Some(Field::Attachment(0, Part::Scheme)),
        ..GOOD
    },
    Case {
        name: "two attachments on one destination and header",
        attachments: &[
            ("GH", "api.example.com", "authorization", "Bearer"),
            ("K", "api.example.com", "Authorization", ""),
        ],
        want: Some(Field::Attachment(1, Part::Header)),
        ..GOOD
    },
];

/// The destination of [`lock_rule`].
pub const LOCK_DESTINATION: &str = "api.example.com";
/// The method of [`lock_rule`].
pub const LOCK_METHOD: &str = "POST";
/// The path prefix of [`lock_rule`].
pub const LOCK_PREFIX: &str = "/deploy";
/// The one approver of [`lock_rule`].
pub const LOCK_APPROVER: &str = "alice";

/// The rule [`LOCK_CASES`] are judged by: `lock-1`, every `POST` under
/// `/deploy` to [`LOCK_DESTINATION`], [`LOCK_APPROVER`] decides.
pub fn lock_rule() -> LockRule {
    LockRule::check(&RuleDraft {
        id: "lock-1",
        destination: LOCK_DESTINATION,
        attachment: "",
        method: LOCK_METHOD,
        path_prefix: LOCK_PREFIX,
        mode: "every_request",
        approvers: &[LOCK_APPROVER.to_owned()],
    })
    .expect("the table's rule is valid")
}

/// One request to [`LOCK_DESTINATION`] and what the Lock makes of it.
#[derive(Debug)]
pub struct LockCase {
    pub method: &'static str,
    /// As the session sent it (without its query).
    pub path: &'static str,
    /// What the destination gets, the record holds and the card shows.
    pub canonical: &'static str,
    /// Whether [`lock_rule`] holds it.
    pub held: bool,
}

const fn held(path: &'static str, canonical: &'static str) -> LockCase {
    LockCase {
        method: "POST",
        path,
        canonical,
        held: true,
    }
}

const fn passes(method: &'static str, path: &'static str, canonical: &'static str) -> LockCase {
    LockCase {
        method,
        path,
        canonical,
        held: false,
    }
}

/// The table: the plain path, then the spellings only the routing key
/// puts under the rule (the relay must judge them as the gateway does),
/// then the spellings the canonical path settles, then requests the rule
/// does not hold.
pub const LOCK_CASES: &[LockCase] = &[
    held("/deploy", "/deploy"),
    held("/deploy/x", "/deploy/x"),
    // Held by the routing key only: the canonical path is not under
    // `/deploy`.
    held("/%2Fdeploy/x", "/%2Fdeploy/x"),
    held("/%2fdeploy", "/%2Fdeploy"),
    held("/Deploy", "/Deploy"),
    held("/DEPLOY", "/DEPLOY"),
    held("/%44eploy", "/Deploy"),
    held("/\\deploy", "/\\deploy"),
    held("/x%5C..%5Cdeploy", "/x%5C..%5Cdeploy"),
    held("/x%2F..%2Fdeploy", "/x%2F..%2Fdeploy"),
    held("/x/..;/deploy", "/x/..;/deploy"),
    held("/x/..;jsessionid=1/deploy", "/x/..;jsessionid=1/deploy"),
    held("/deploy;v=1", "/deploy;v=1"),
    // Held by the canonical path.
    held("/%64eploy/x", "/deploy/x"),
    held("/x/../deploy", "/deploy"),
    held("/x/%2e%2e/deploy", "/deploy"),
    held("//deploy", "/deploy"),
    LockCase {
        method: "post",
        ..held("/deploy", "/deploy")
    },
    // Not held.
    passes("GET", "/deploy", "/deploy"),
    passes("POST", "/other", "/other"),
    passes("POST", "/x/deploy", "/x/deploy"),
    passes("POST", "/%252Fdeploy", "/%252Fdeploy"),
    passes("POST", "/de%2Fploy", "/de%2Fploy"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name;
    use crate::path::RoutedPath;

    /// The gateway's reading (the path as sent) and the relay's (the
    /// canonical path of the proposal) agree on every case.
    #[test]
    fn the_lock_cases_hold_on_the_path_as_sent_and_on_its_canonical_form() {
        let rule = lock_rule();
        let d = name::canonicalize(LOCK_DESTINATION).unwrap();
        for c in LOCK_CASES {
            let sent = RoutedPath::new(c.path);
            assert_eq!(sent.canonical(), c.canonical, "{c:?}");
            let relayed = RoutedPath::new(c.canonical);
            assert_eq!(relayed, sent, "{c:?}: the canonical path reads the same");
            assert_eq!(rule.matches(&d, c.method, &sent, &[]), c.held, "{c:?}");
            assert_eq!(rule.matches(&d, c.method, &relayed, &[]), c.held, "{c:?}");
        }
    }
}
