//! Host names a session CA may vouch for, and how its certificate says so.

use std::collections::BTreeSet;
use std::net::IpAddr;

use rcgen::{CidrSubnet, GeneralSubtree, NameConstraints};

use crate::error::CertError;

/// The name the gateway answers itself (the approval relay's front door).
/// Every session CA permits it, whatever the session's allowlist.
pub const APPROVALS_NAME: &str = "approvals.hangar.internal";

/// RFC 1035: a name of at most 253 characters in text form.
const MAX_NAME_LEN: usize = 253;

/// RFC 1035: a label of at most 63 octets.
const MAX_LABEL_LEN: usize = 63;

/// Checks that `name` is a canonical DNS host name: lower-case ASCII
/// letters, digits, `-` and `_` in non-empty labels, no trailing dot, no
/// wildcard, not an IP literal.
///
/// The control plane canonicalises names before they reach the gateway;
/// this is the last check before a name goes into a certificate, where a
/// wrong byte would widen or break what the CA vouches for.
pub(crate) fn check_host_name(name: &str) -> Result<(), CertError> {
    let refuse = |reason| {
        Err(CertError::NotAHostName {
            name: name.to_owned(),
            reason,
        })
    };

    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.contains('*') {
        return refuse("a wildcard is not a host name");
    }
    if name.parse::<IpAddr>().is_ok() || name.starts_with('[') {
        return refuse("an IP literal is not a host name");
    }
    if name.len() > MAX_NAME_LEN {
        return refuse("it is longer than 253 characters");
    }
    if name.ends_with('.') {
        return refuse("it ends with a dot (names are given without the root's)");
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return refuse("it is not in lower case");
    }

    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return refuse("it has an empty label");
        }
        if label.len() > MAX_LABEL_LEN {
            return refuse("it has a label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return refuse("it has a character other than a-z, 0-9, '-' and '_'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return refuse("it has a label that starts or ends with '-'");
        }
        last = label;
    }
    // "127.1" and "1.2.3.4.5" are not IP literals to Rust's parser, but
    // inet_aton reads the first as 127.0.0.1; no top-level domain is
    // all digits, so neither is any host name.
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return refuse("its last label is all digits, as an IP address's is");
    }
    Ok(())
}

/// Refuses a set of names in which one lies under another.
///
/// The CA excludes `.name` for every permitted name, and every verifier
/// applies an excluded subtree over a permitted one, so `api.example.com`
/// next to `example.com` would be refused by every client: better to say
/// so when the session opens than to fail each handshake.
pub(crate) fn check_not_nested(names: &BTreeSet<String>) -> Result<(), CertError> {
    for child in names {
        let mut rest = child.as_str();
        while let Some((_, parent)) = rest.split_once('.') {
            if names.contains(parent) {
                return Err(CertError::NestedNames {
                    parent: parent.to_owned(),
                    child: child.clone(),
                });
            }
            rest = parent;
        }
    }
    Ok(())
}

/// The Name Constraints of a CA that permits exactly `names`.
///
/// For each name: a permitted dNSName subtree `name` (the name and, by RFC
/// 5280, everything under it) and an excluded dNSName subtree `.name`
/// (everything strictly under it, as OpenSSL and rustls-webpki read a
/// leading dot). Together they admit `name` alone. Every IPv4 and IPv6
/// address is excluded as well: a dNSName-only constraint leaves iPAddress
/// names unconstrained.
pub(crate) fn exact_name_constraints(names: &[String]) -> NameConstraints {
    let permitted_subtrees = names
        .iter()
        .map(|name| GeneralSubtree::DnsName(name.clone()))
        .collect();
    let mut excluded_subtrees: Vec<GeneralSubtree> = names
        .iter()
        .map(|name| GeneralSubtree::DnsName(format!(".{name}")))
        .collect();
    excluded_subtrees.push(GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])));
    excluded_subtrees.push(GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])));
    NameConstraints {
        permitted_subtrees,
        excluded_subtrees,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! host_names {
        ($($name:expr => $ok:expr,)*) => {
            $(
                let result = check_host_name($name);
                assert_eq!(result.is_ok(), $ok, "{:?}: {:?}", $name, result);
                if let Err(error) = result {
                    // The message names the offending value.
                    assert!(error.to_string().contains(&format!("{:?}", $name)), "{error}");
                }
            )*
        };
    }

    #[test]
    fn host_names() {
        host_names! {
            "api.example.com" => true,
            "github.com" => true,
            "localhost" => true,
            "_acme.example.com" => true,
            "xn--bcher-kva.example" => true,
            "a-b.c-d.example" => true,
            APPROVALS_NAME => true,
            "" => false,
            "*.example.com" => false,
            "*" => false,
            "api.*.com" => false,
            "127.0.0.1" => false,
            "::1" => false,
            "[::1]" => false,
            "127.1" => false,
            "1.2.3.4.5" => false,
            "example.123" => false,
            "Example.com" => false,
            "example.com." => false,
            ".example.com" => false,
            "a..example.com" => false,
            "-a.example.com" => false,
            "a-.example.com" => false,
            "ex ample.com" => false,
            "exämple.com" => false,
            "example.com/path" => false,
            "user@example.com" => false,
            "example.com:443" => false,
        }
        assert!(check_host_name(&format!("{}.com", "a".repeat(63))).is_ok());
        assert!(check_host_name(&format!("{}.com", "a".repeat(64))).is_err());
        assert!(check_host_name(&["a"; 127].join(".")).is_ok());
        assert!(check_host_name(&format!("{}.ab", ["a"; 126].join("."))).is_err());
    }

    #[test]
    fn nested_names_are_refused() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert!(
            check_not_nested(&set(&["example.com", "api.example.org", "xexample.com"])).is_ok()
        );
        assert!(check_not_nested(&set(&["com", "org"])).is_ok());
        for names in [
            &["example.com", "api.example.com"][..],
            &["a.b.c.example.com", "example.com"],
            &["com", "github.com"],
            &["hangar.internal", APPROVALS_NAME],
        ] {
            let error = check_not_nested(&set(names)).unwrap_err();
            let CertError::NestedNames { parent, child } = &error else {
                panic!("{error}");
            };
            assert!(child.ends_with(&format!(".{parent}")), "{error}");
        }
    }

    #[test]
    fn constraints_permit_the_name_and_exclude_below_it() {
        let nc = exact_name_constraints(&["api.example.com".to_owned()]);
        assert_eq!(
            nc.permitted_subtrees,
            [GeneralSubtree::DnsName("api.example.com".into())]
        );
        assert_eq!(nc.excluded_subtrees.len(), 3);
        assert_eq!(
            nc.excluded_subtrees[0],
            GeneralSubtree::DnsName(".api.example.com".into())
        );
    }
}
