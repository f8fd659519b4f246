//! The gram filter: a small table of the grams that open every pattern,
//! which lets the masker jump over text where no occurrence can start
//! (see the [masker's docs](super#streaming-and-why-no-byte-escapes)).

use super::forms::Pattern;

const MAX_GRAM: usize = 4;
/// The gram table has 2^TABLE_BITS bits: 8 KiB, small enough to stay in a
/// core's L1 cache, sparse enough that the few thousand grams of 32 secrets
/// leave more than nine bits in ten clear.
const TABLE_BITS: u32 = 16;
/// Positions one check covers. Larger skips faster over text with no
/// occurrence, but puts more grams in the table (`stride` per pattern), so
/// more text looks like a candidate. The stride is the largest that keeps
/// the table's grams within `GRAM_BUDGET` (a few secrets give a few dozen
/// patterns, which allows `MAX_STRIDE`), but never below `MIN_STRIDE` (32
/// secrets, ~360 patterns: about 3,000 grams, still nine bits in ten
/// clear), and never more than the shortest pattern allows.
const MIN_STRIDE: usize = 8;
const MAX_STRIDE: usize = 64;
/// About 1 bit in 16 of the table set (before hash collisions).
const GRAM_BUDGET: usize = 1 << (TABLE_BITS - 4);

/// Finds where an occurrence may start, checking one position in `stride`.
///
/// A gram is the `len` bytes at a position (4, or the shortest pattern's
/// length if that is shorter). Every pattern is at least `len + stride - 1`
/// bytes long, and the table holds the grams at offsets `0..stride` of every
/// pattern. An occurrence starting at s therefore puts a table gram at
/// every position in `s..s + stride`, and one of any `stride` consecutive
/// positions is checked: a position whose gram is not in the table rules
/// out every start in the `stride` positions up to it.
pub(super) struct GramFilter {
    /// Bit `slot(g)` is set for every gram g at offsets `0..stride` of a
    /// pattern (other grams may share a bit: then they are candidates too).
    table: Box<[u64; 1 << (TABLE_BITS - 6)]>,
    /// Keeps a gram's `len` bytes of a 4-byte little-endian load.
    gram_mask: u32,
    stride: usize,
}

impl GramFilter {
    /// `None` when there are no patterns.
    pub(super) fn new(patterns: &[Pattern]) -> Option<GramFilter> {
        let shortest = patterns.iter().map(|p| p.len()).min()?;
        let len = shortest.min(MAX_GRAM);
        let gram_mask = u32::MAX >> (8 * (MAX_GRAM - len));
        let budget = (GRAM_BUDGET / patterns.len()).clamp(MIN_STRIDE, MAX_STRIDE);
        let stride = (shortest - len + 1).min(budget);
        let mut table = Box::new([0u64; 1 << (TABLE_BITS - 6)]);
        for pattern in patterns {
            for offset in 0..stride {
                let mut gram = [0; MAX_GRAM];
                gram[..len].copy_from_slice(&pattern[offset..offset + len]);
                let slot = slot(u32::from_le_bytes(gram));
                table[slot / 64] |= 1 << (slot % 64);
            }
        }
        Some(GramFilter {
            table,
            gram_mask,
            stride,
        })
    }

    /// The table's bytes.
    pub(super) fn memory_usage(&self) -> usize {
        std::mem::size_of_val(&*self.table)
    }

    /// The first position p in `from..=limit` such that no occurrence starts
    /// in `from..p`, as far as the table can tell (`limit` if none before
    /// it). A position too close to the end of `w` to read 4 bytes is a
    /// candidate.
    pub(super) fn skip(&self, w: &[u8], from: usize, limit: usize) -> usize {
        // The check at j covers the starts j + 1 - stride ..= j, so the
        // checks before `end` cover every start before `limit`.
        let end = limit + self.stride - 1;
        // Positions from which MAX_GRAM bytes can be read.
        let readable = w.len().saturating_sub(MAX_GRAM - 1);
        let stop = end.min(readable);
        let mut j = from + self.stride - 1;
        while j < stop {
            let bytes = w[j..j + MAX_GRAM].try_into().expect("MAX_GRAM bytes");
            let slot = slot(u32::from_le_bytes(bytes) & self.gram_mask);
            if self.table[slot / 64] & (1 << (slot % 64)) != 0 {
                return j + 1 - self.stride;
            }
            j += self.stride;
        }
        if j < end {
            // Too close to the end to read a gram: a candidate. (Not
            // reached while the longest pattern has 4 bytes or more, as
            // every value's padded base64 has; the bound does not rest on
            // that.)
            j + 1 - self.stride
        } else {
            limit
        }
    }
}

/// The table bit of a gram: Fibonacci hashing, the top bits of the product.
fn slot(gram: u32) -> usize {
    (gram.wrapping_mul(0x9E37_79B1) >> (32 - TABLE_BITS)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeroize::Zeroizing;

    proptest::proptest! {
        /// The filter's contract: it skips no position where a pattern
        /// starts and ends inside the text, and never past the limit.
        #[test]
        fn gram_filter_never_skips_an_occurrence(
            patterns in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(b"abc".to_vec()), 1..12),
                1..6,
            ),
            text in proptest::collection::vec(proptest::sample::select(b"abcx".to_vec()), 0..120),
        ) {
            let patterns: Vec<Pattern> = patterns.into_iter().map(Zeroizing::new).collect();
            let filter = GramFilter::new(&patterns).unwrap();
            let longest = patterns.iter().map(|p| p.len()).max().unwrap();
            let limit = text.len().saturating_sub(longest - 1);
            for from in 0..=limit {
                let p = filter.skip(&text, from, limit);
                proptest::prop_assert!(from <= p && p <= limit);
                for start in from..p {
                    for pattern in &patterns {
                        proptest::prop_assert!(!text[start..].starts_with(pattern));
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// The same with patterns long enough for strides up to
        /// `MAX_STRIDE`.
        #[test]
        fn gram_filter_never_skips_an_occurrence_at_long_strides(
            patterns in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(b"abcd".to_vec()), 20..80),
                1..4,
            ),
            text in proptest::collection::vec(proptest::sample::select(b"abcdx".to_vec()), 0..400),
            plant in proptest::prelude::any::<(usize, usize)>(),
        ) {
            let patterns: Vec<Pattern> = patterns.into_iter().map(Zeroizing::new).collect();
            let mut text = text;
            // Make sure an occurrence is there now and then.
            let at = plant.0 % (text.len() + 1);
            text.splice(at..at, patterns[plant.1 % patterns.len()].iter().copied());
            let filter = GramFilter::new(&patterns).unwrap();
            let shortest = patterns.iter().map(|p| p.len()).min().unwrap();
            proptest::prop_assert_eq!(filter.stride, (shortest - 3).min(MAX_STRIDE));
            let longest = patterns.iter().map(|p| p.len()).max().unwrap();
            let limit = text.len().saturating_sub(longest - 1);
            for from in 0..=limit {
                let p = filter.skip(&text, from, limit);
                proptest::prop_assert!(from <= p && p <= limit);
                for start in from..p {
                    for pattern in &patterns {
                        proptest::prop_assert!(!text[start..].starts_with(pattern));
                    }
                }
            }
        }
    }
}
