//! One table of session drafts, valid and invalid, that every entry point
//! that builds a [`SessionSpec`](crate::spec::SessionSpec) is tested
//! against — the spec itself, a static session in the gateway's config, the
//! gateway's `OpenSession` — so that they cannot drift apart. Each invalid
//! draft names the field at fault.

use crate::attach::Part;
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
