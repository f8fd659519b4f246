//! The naive reference the masker is tested against (tests, property
//! tests and fuzz targets; built only for tests and with the `test-util`
//! feature, never into the gateway binary).

use std::fmt;

use super::forms::forms;
use super::forms::Pattern;

/// The naive reference the masker is tested against: mask `haystack` whole,
/// with no automaton, no gram filter and no streaming, and return the
/// masked copy and the counts per name (sorted, zeros included), by the
/// rule in the [module docs](self#occurrences-and-counts): a secret counts
/// one occurrence at each position where any of its patterns starts.
/// O(length × patterns).
#[doc(hidden)]
pub fn mask_reference(haystack: &[u8], secrets: &[(&str, &[u8])]) -> (Vec<u8>, Vec<(String, u64)>) {
    MaskReference::new(secrets).mask(haystack)
}

/// [`mask_reference`] with the patterns made once, for tests and fuzz
/// targets that mask many haystacks with one list of values. Each
/// position is checked against the patterns that begin with its byte.
#[doc(hidden)]
pub struct MaskReference {
    /// Per secret name, sorted: its patterns, by first byte.
    names: Vec<(String, Vec<Vec<Pattern>>)>,
}

impl fmt::Debug for MaskReference {
    /// Names only: the patterns spell out the values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskReference")
            .field(
                "names",
                &self.names.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl MaskReference {
    pub fn new(secrets: &[(&str, &[u8])]) -> MaskReference {
        let mut names: Vec<&str> = secrets.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        let names = names
            .into_iter()
            .map(|name| {
                let mut by_first: Vec<Vec<Pattern>> = vec![Vec::new(); 256];
                for pattern in secrets
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .flat_map(|(_, value)| forms(value))
                {
                    by_first[usize::from(pattern[0])].push(pattern);
                }
                (name.to_owned(), by_first)
            })
            .collect();
        MaskReference { names }
    }

    /// Every form of every value, for a fuzz target to put in a body.
    pub fn patterns(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.names
            .iter()
            .flat_map(|(_, by_first)| by_first.iter().flatten().map(|p| p.as_slice()))
    }

    /// The masked copy of `haystack` and the counts per name.
    pub fn mask(&self, haystack: &[u8]) -> (Vec<u8>, Vec<(String, u64)>) {
        let mut out = haystack.to_vec();
        let mut counts = Vec::new();
        for (name, by_first) in &self.names {
            let mut count = 0;
            for (at, &first) in haystack.iter().enumerate() {
                let mut found = false;
                let rest = &haystack[at..];
                for pattern in &by_first[usize::from(first)] {
                    // Byte by byte, stopping at the first difference: a
                    // fuzzer hooks every memcmp, and most candidates differ
                    // in their first bytes.
                    let found_here = pattern.len() <= rest.len()
                        && pattern.iter().zip(rest).all(|(p, h)| p == h);
                    if found_here {
                        out[at..at + pattern.len()].fill(b'*');
                        found = true;
                    }
                }
                count += u64::from(found);
            }
            counts.push((name.clone(), count));
        }
        (out, counts)
    }
}
