//! Properties of the name and attachment rules.

use proptest::prelude::*;
use talos_control_stub::names::{destination, AttachSpec};

proptest! {
    /// A canonical name is its own canonical form, and never an address.
    #[test]
    fn canonical_names_are_fixed_points(text in "[a-zA-Z0-9._-]{1,80}\\.?") {
        if let Ok(name) = destination(&text) {
            prop_assert_eq!(destination(&name).unwrap(), name.clone());
            prop_assert!(name.parse::<std::net::IpAddr>().is_err());
            prop_assert_eq!(name.to_ascii_lowercase(), name);
        }
    }

    /// Parsing never panics, and a parsed attachment written back parses to
    /// itself.
    #[test]
    fn attachments_round_trip(text in "[A-Za-z0-9_=:.\\- ]{0,60}") {
        if let Ok(spec) = AttachSpec::parse(&text) {
            let mut back = format!("{}={}:{}", spec.secret, spec.destination, spec.header);
            if let Some(scheme) = &spec.scheme {
                back.push(':');
                back.push_str(scheme);
            }
            prop_assert_eq!(AttachSpec::parse(&back).unwrap(), spec);
        }
    }
}
