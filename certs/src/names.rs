//! Host names a session CA may vouch for, and how its certificate says so.

use rcgen::{CidrSubnet, GeneralSubtree, NameConstraints};

use crate::error::CertError;

/// The name the gateway answers itself (the approval relay's front door).
/// Every session CA permits it, whatever the session's allowlist.
pub const APPROVALS_NAME: &str = "approvals.hangar.internal";

/// Checks that `name` is a canonical DNS host name, by the one rule the
/// gateway and the control plane keep ([`talos_contract::name`]): letters,
/// digits, `-` and `_` in labels of 1 to 63 bytes that neither start nor
/// end with `-`, at most 253 bytes, lower case, no trailing dot, no
/// wildcard, not an IP literal in any form.
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
    match talos_contract::name::canonicalize(name) {
        Err(e) => refuse(e.rule()),
        Ok(canonical) if canonical.as_str() != name => {
            refuse("it is not in canonical form (lower case, without the root's dot)")
        }
        Ok(_) => Ok(()),
    }
}

/// Every proper suffix of `name` that starts at a label, longest first:
/// `a.b.c` gives `b.c`, then `c`. These are the names `name` lies under.
fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    let mut rest = name;
    std::iter::from_fn(move || {
        let (_, parent) = rest.split_once('.')?;
        rest = parent;
        Some(parent)
    })
}

/// Where `name` is in `names` (sorted, deduplicated).
fn position(names: &[String], name: &str) -> Option<usize> {
    names
        .binary_search_by(|listed| listed.as_str().cmp(name))
        .ok()
}

/// The nesting level of each of `names` (sorted, deduplicated host
/// names), in the same order.
///
/// A name with no listed ancestor (no listed name it lies under) is at
/// level 0; any other name is at 1 + the highest level of its listed
/// ancestors. So a name is always at a higher level than every listed name
/// it lies under, and no level holds two names of which one lies under the
/// other: each level can be given an intermediate whose constraints permit
/// exactly its names. Levels run from 0 to the highest without a gap (a
/// name at level k > 0 has a listed ancestor at level k - 1).
pub(crate) fn nesting_levels(names: &[String]) -> Vec<usize> {
    // Ancestors have fewer labels, so visiting names by label count visits
    // every name after all of its ancestors.
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&i| names[i].split('.').count());
    let mut levels = vec![0; names.len()];
    for i in order {
        levels[i] = ancestors(&names[i])
            .filter_map(|ancestor| position(names, ancestor))
            .map(|ancestor| levels[ancestor] + 1)
            .max()
            .unwrap_or(0);
    }
    levels
}

/// The Name Constraints of a CA (an intermediate) that permits exactly
/// `names`, none of which may lie under another.
///
/// For each name: a permitted dNSName subtree `name` (the name and, by RFC
/// 5280, everything under it) and an excluded dNSName subtree `.name`
/// (everything strictly under it, as OpenSSL and rustls-webpki read a
/// leading dot). Together they admit `name` alone. Every IPv4 and IPv6
/// address is excluded as well: a dNSName-only constraint leaves iPAddress
/// names unconstrained.
pub(crate) fn exact_name_constraints(names: &[&str]) -> NameConstraints {
    let permitted_subtrees = names
        .iter()
        .map(|name| GeneralSubtree::DnsName((*name).to_owned()))
        .collect();
    let mut excluded_subtrees: Vec<GeneralSubtree> = names
        .iter()
        .map(|name| GeneralSubtree::DnsName(format!(".{name}")))
        .collect();
    excluded_subtrees.extend(every_ip_address());
    NameConstraints {
        permitted_subtrees,
        excluded_subtrees,
    }
}

/// The Name Constraints of the session's root: every name of `names`
/// (sorted, deduplicated) permitted, and for each name under which no
/// other listed name lies, its subdomains excluded; every IP address
/// excluded.
///
/// The root cannot exclude `.name` for a name another listed name lies
/// under (that would exclude the inner name too), so on its own it permits
/// the subdomains of those names; the intermediates cut those off. For
/// every other name the root alone is already exact.
pub(crate) fn root_name_constraints(names: &[String]) -> NameConstraints {
    let mut has_descendant = vec![false; names.len()];
    for name in names {
        for ancestor in ancestors(name) {
            if let Some(i) = position(names, ancestor) {
                has_descendant[i] = true;
            }
        }
    }
    let permitted_subtrees = names
        .iter()
        .map(|name| GeneralSubtree::DnsName(name.clone()))
        .collect();
    let mut excluded_subtrees: Vec<GeneralSubtree> = names
        .iter()
        .zip(&has_descendant)
        .filter(|(_, has_descendant)| !**has_descendant)
        .map(|(name, _)| GeneralSubtree::DnsName(format!(".{name}")))
        .collect();
    excluded_subtrees.extend(every_ip_address());
    NameConstraints {
        permitted_subtrees,
        excluded_subtrees,
    }
}

/// `0.0.0.0/0` and `::/0`.
fn every_ip_address() -> [GeneralSubtree; 2] {
    [
        GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
        GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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

    fn sorted(names: &[&str]) -> Vec<String> {
        let set: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        set.into_iter().collect()
    }

    /// `names` with their levels, in sorted order.
    fn levels_of(names: &[&str]) -> Vec<(String, usize)> {
        let names = sorted(names);
        let levels = nesting_levels(&names);
        names.into_iter().zip(levels).collect()
    }

    #[test]
    fn ancestors_are_the_label_suffixes() {
        assert_eq!(ancestors("a.b.c").collect::<Vec<_>>(), ["b.c", "c"]);
        assert_eq!(ancestors("com").count(), 0);
    }

    #[test]
    fn names_not_under_each_other_are_all_level_0() {
        for names in [
            &["example.com", "api.example.org", "xexample.com"][..],
            &["com", "org"],
            &[APPROVALS_NAME],
            &[],
        ] {
            assert!(levels_of(names).iter().all(|(_, level)| *level == 0));
        }
    }

    #[test]
    fn nested_names_get_their_depth() {
        let level = |names: &[&str], name: &str| {
            levels_of(names)
                .into_iter()
                .find(|(listed, _)| listed == name)
                .unwrap()
                .1
        };
        let names = [
            "example.com",
            "api.example.com",
            "v2.api.example.com",
            "other.test",
            APPROVALS_NAME,
        ];
        assert_eq!(level(&names, "example.com"), 0);
        assert_eq!(level(&names, "api.example.com"), 1);
        assert_eq!(level(&names, "v2.api.example.com"), 2);
        assert_eq!(level(&names, "other.test"), 0);
        assert_eq!(level(&names, APPROVALS_NAME), 0);

        // A skipped label does not count: the level is the number of
        // listed ancestors on the way up, not of labels.
        assert_eq!(
            level(&["example.com", "a.b.c.example.com"], "a.b.c.example.com"),
            1
        );
        // "1 + the highest level of the listed ancestors".
        let deep = ["com", "example.com", "x.y.example.com", "y.example.com"];
        assert_eq!(level(&deep, "com"), 0);
        assert_eq!(level(&deep, "example.com"), 1);
        assert_eq!(level(&deep, "y.example.com"), 2);
        assert_eq!(level(&deep, "x.y.example.com"), 3);
        assert_eq!(
            level(&["hangar.internal", APPROVALS_NAME], APPROVALS_NAME),
            1
        );
    }

    proptest::proptest! {
        /// Whatever the names, no level holds a name and one of its
        /// ancestors, and the levels have no gap.
        #[test]
        fn no_level_holds_a_name_and_its_ancestor(
            names in proptest::collection::vec("(a|b|c)(\\.(a|b|c)){0,4}", 0..12)
        ) {
            let names = sorted(&names.iter().map(String::as_str).collect::<Vec<_>>());
            let levels = nesting_levels(&names);
            for (i, name) in names.iter().enumerate() {
                for ancestor in ancestors(name) {
                    if let Some(j) = position(&names, ancestor) {
                        proptest::prop_assert!(levels[i] > levels[j], "{} {}", name, ancestor);
                    }
                }
                if levels[i] > 0 {
                    proptest::prop_assert!(ancestors(name)
                        .filter_map(|a| position(&names, a))
                        .any(|j| levels[j] == levels[i] - 1));
                }
            }
        }
    }

    #[test]
    fn constraints_permit_the_name_and_exclude_below_it() {
        let nc = exact_name_constraints(&["api.example.com"]);
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

    #[test]
    fn root_excludes_below_names_with_no_listed_descendant() {
        let names = sorted(&["example.com", "api.example.com", "other.test"]);
        let nc = root_name_constraints(&names);
        let dns = |names: &[&str]| {
            names
                .iter()
                .map(|n| GeneralSubtree::DnsName((*n).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            nc.permitted_subtrees,
            dns(&["api.example.com", "example.com", "other.test"])
        );
        let mut excluded = dns(&[".api.example.com", ".other.test"]);
        excluded.extend(every_ip_address());
        assert_eq!(nc.excluded_subtrees, excluded);
    }
}
