//! Properties of the name and attachment rules.

use proptest::prelude::*;
use talos_contract::attach::AttachSpec;
use talos_contract::name::canonicalize;

proptest! {
    /// A canonical name is its own canonical form, and never an address.
    #[test]
    fn canonical_names_are_fixed_points(text in "[a-zA-Z0-9._-]{1,80}\\.?") {
        if let Ok(name) = canonicalize(&text) {
            prop_assert_eq!(canonicalize(name.as_str()).unwrap(), name.clone());
            prop_assert!(name.as_str().parse::<std::net::IpAddr>().is_err());
            prop_assert_eq!(name.as_str().to_ascii_lowercase(), name.as_str());
        }
    }

    /// Parsing never panics, and a parsed attachment written back parses to
    /// itself.
    #[test]
    fn attachments_round_trip(text in "[A-Za-z0-9_=:.\\- ]{0,60}") {
        if let Ok(spec) = AttachSpec::parse(&text) {
            prop_assert_eq!(AttachSpec::parse(&spec.to_string()).unwrap(), spec);
        }
    }
}
