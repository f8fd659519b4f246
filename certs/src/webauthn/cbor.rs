//! A strict, bounded reader for the subset of CBOR (RFC 8949) that WebAuthn
//! uses: unsigned and negative integers, byte and text strings, arrays,
//! maps and the two booleans, all of definite length.
//!
//! Everything else is refused, never skipped: indefinite lengths (which
//! CTAP2's canonical form forbids), tags, floats, `null`, `undefined` and
//! the other simple values, and the reserved additional-information values
//! 28–30. A text string must be UTF-8. Nesting is limited to
//! [`MAX_DEPTH`]. Integer heads longer than they need be are read for the
//! value they carry (an unambiguous encoding, which some authenticators
//! emit); duplicate map keys are refused by the readers of the maps this
//! module's callers interpret ([`Keys`]).
//!
//! The reader works on a borrowed slice and never allocates for what it
//! reads: a length is checked against the bytes that remain before
//! anything of that length is taken, so a head that announces 2^64 bytes
//! costs no more than one that announces 2. [`Reader::position`] tells the
//! caller where a value ended, which is how the authenticator data's COSE
//! key is told apart from the extensions after it.

/// The deepest nesting of arrays and maps read: the COSE keys and
/// attestation statements WebAuthn defines nest two deep, and the
/// extensions an authenticator reports a little more; sixteen leaves room
/// without letting a crafted input recurse far.
pub(crate) const MAX_DEPTH: usize = 16;

/// Why bytes are not a value of the subset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CborError {
    /// The input ends inside a value.
    Truncated,
    /// Something outside the subset, or a malformed head: what it is.
    Refused(&'static str),
    /// Arrays and maps nest deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl CborError {
    /// For people: what was wrong, in a fixed phrase.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            CborError::Truncated => "CBOR ends inside a value",
            CborError::Refused(what) => what,
            CborError::TooDeep => "CBOR nests too deep",
        }
    }
}

const MAJOR_UNSIGNED: u8 = 0;
const MAJOR_NEGATIVE: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const MAJOR_MAP: u8 = 5;
const MAJOR_TAG: u8 = 6;
const MAJOR_SIMPLE: u8 = 7;

const FALSE: u64 = 20;
const TRUE: u64 = 21;

/// A map key of the kinds WebAuthn uses: COSE labels are integers, the
/// attestation object's and statement's keys are text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key<'a> {
    Int(i64),
    Text(&'a str),
}

/// The keys of one map seen so far, to refuse a repeated key: a map with
/// two `alg`s, or a COSE key with two `x`s, has no one meaning.
#[derive(Debug, Default)]
pub(crate) struct Keys<'a> {
    seen: Vec<Key<'a>>,
}

impl<'a> Keys<'a> {
    /// Record `key`; refused if it was seen before.
    ///
    /// # Limits
    ///
    /// Quadratic in the number of keys, which a caller bounds (the maps
    /// read here have a handful; their byte limits bound the rest).
    pub(crate) fn insert(&mut self, key: Key<'a>) -> Result<(), CborError> {
        if self.seen.contains(&key) {
            return Err(CborError::Refused("a CBOR map repeats a key"));
        }
        self.seen.push(key);
        Ok(())
    }
}

/// Reads values one after another from a slice.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    // invariant: pos <= data.len()
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, pos: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Whether every byte has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.data.len()
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, CborError> {
        let b = *self.data.get(self.pos).ok_or(CborError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], CborError> {
        let len = usize::try_from(len).map_err(|_| CborError::Truncated)?;
        if len > self.remaining() {
            return Err(CborError::Truncated);
        }
        let out = &self.data[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    /// One head: the major type and its argument (a value, a length or a
    /// simple value's number).
    fn head(&mut self) -> Result<(u8, u64), CborError> {
        let initial = self.byte()?;
        let major = initial >> 5;
        let info = initial & 0x1f;
        let arg = match info {
            0..=23 => u64::from(info),
            24 => u64::from(self.byte()?),
            25 => u64::from(u16::from_be_bytes(self.array_of()?)),
            26 => u64::from(u32::from_be_bytes(self.array_of()?)),
            27 => u64::from_be_bytes(self.array_of()?),
            28..=30 => {
                return Err(CborError::Refused(
                    "CBOR head with reserved additional information",
                ))
            }
            _ => return Err(CborError::Refused("CBOR value of indefinite length")),
        };
        match major {
            MAJOR_TAG => Err(CborError::Refused("CBOR tag")),
            MAJOR_SIMPLE if info >= 25 => Err(CborError::Refused("CBOR float")),
            MAJOR_SIMPLE if arg != FALSE && arg != TRUE => Err(CborError::Refused(
                "CBOR simple value other than true or false",
            )),
            _ => Ok((major, arg)),
        }
    }

    fn array_of<const N: usize>(&mut self) -> Result<[u8; N], CborError> {
        let bytes = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// The major type of the next value, without reading it.
    pub(crate) fn peek_major(&self) -> Result<u8, CborError> {
        self.data
            .get(self.pos)
            .map(|b| b >> 5)
            .ok_or(CborError::Truncated)
    }

    fn expect(&mut self, major: u8, what: &'static str) -> Result<u64, CborError> {
        let (got, arg) = self.head()?;
        if got != major {
            return Err(CborError::Refused(what));
        }
        Ok(arg)
    }

    /// A map's head: its number of entries (each a key and a value).
    pub(crate) fn map(&mut self) -> Result<u64, CborError> {
        let len = self.expect(MAJOR_MAP, "expected a CBOR map")?;
        // Each entry takes at least two bytes: refuse at once a length the
        // input cannot hold, rather than reading until it ends.
        if len > (self.remaining() / 2) as u64 {
            return Err(CborError::Truncated);
        }
        Ok(len)
    }

    /// An array's head: its number of elements (only tests read arrays
    /// element by element; the callers skip them).
    #[cfg(test)]
    pub(crate) fn array(&mut self) -> Result<u64, CborError> {
        let len = self.expect(MAJOR_ARRAY, "expected a CBOR array")?;
        if len > self.remaining() as u64 {
            return Err(CborError::Truncated);
        }
        Ok(len)
    }

    /// A byte string.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CborError> {
        let len = self.expect(MAJOR_BYTES, "expected a CBOR byte string")?;
        self.take(len)
    }

    /// A text string (UTF-8).
    pub(crate) fn text(&mut self) -> Result<&'a str, CborError> {
        let len = self.expect(MAJOR_TEXT, "expected a CBOR text string")?;
        std::str::from_utf8(self.take(len)?)
            .map_err(|_| CborError::Refused("CBOR text string is not UTF-8"))
    }

    /// An integer, unsigned or negative, that fits an `i64`.
    pub(crate) fn int(&mut self) -> Result<i64, CborError> {
        let (major, arg) = self.head()?;
        let out_of_range = CborError::Refused("CBOR integer out of range");
        match major {
            MAJOR_UNSIGNED => i64::try_from(arg).map_err(|_| out_of_range),
            // -1 - arg, for arg up to i64::MAX
            MAJOR_NEGATIVE => i64::try_from(arg).map(|a| -1 - a).map_err(|_| out_of_range),
            _ => Err(CborError::Refused("expected a CBOR integer")),
        }
    }

    /// `true` or `false` (only tests read one; the callers skip them).
    #[cfg(test)]
    pub(crate) fn bool(&mut self) -> Result<bool, CborError> {
        match self.head()? {
            (MAJOR_SIMPLE, TRUE) => Ok(true),
            (MAJOR_SIMPLE, FALSE) => Ok(false),
            _ => Err(CborError::Refused("expected true or false")),
        }
    }

    /// A map key: an integer or a text string.
    pub(crate) fn key(&mut self) -> Result<Key<'a>, CborError> {
        match self.peek_major()? {
            MAJOR_UNSIGNED | MAJOR_NEGATIVE => self.int().map(Key::Int),
            MAJOR_TEXT => self.text().map(Key::Text),
            _ => Err(CborError::Refused(
                "CBOR map key is neither an integer nor text",
            )),
        }
    }

    /// Read past one whole value of the subset, however nested (within
    /// [`MAX_DEPTH`]), checking it as it goes.
    pub(crate) fn skip(&mut self) -> Result<(), CborError> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Result<(), CborError> {
        let (major, arg) = self.head()?;
        match major {
            MAJOR_UNSIGNED | MAJOR_NEGATIVE | MAJOR_SIMPLE => Ok(()),
            MAJOR_BYTES => self.take(arg).map(drop),
            MAJOR_TEXT => std::str::from_utf8(self.take(arg)?)
                .map(drop)
                .map_err(|_| CborError::Refused("CBOR text string is not UTF-8")),
            MAJOR_ARRAY | MAJOR_MAP => {
                if depth >= MAX_DEPTH {
                    return Err(CborError::TooDeep);
                }
                let items = if major == MAJOR_MAP {
                    arg.checked_mul(2).ok_or(CborError::Truncated)?
                } else {
                    arg
                };
                // Every item takes at least one byte.
                if items > self.remaining() as u64 {
                    return Err(CborError::Truncated);
                }
                for _ in 0..items {
                    self.skip_at(depth + 1)?;
                }
                Ok(())
            }
            _ => unreachable!("head() refuses tags"),
        }
    }

    /// One whole value, as the slice of input it spans.
    pub(crate) fn raw_value(&mut self) -> Result<&'a [u8], CborError> {
        let start = self.pos;
        self.skip()?;
        Ok(&self.data[start..self.pos])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        hex_decode(text)
    }

    pub(crate) fn hex_decode(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_the_subset() {
        // {1: 2, 3: -7, -1: 1, "k": h'0102', "t": [true, false]}
        let bytes = hex("a5010203262001616b420102617482f5f4");
        let mut r = Reader::new(&bytes);
        assert_eq!(r.map(), Ok(5));
        assert_eq!(r.key(), Ok(Key::Int(1)));
        assert_eq!(r.int(), Ok(2));
        assert_eq!(r.key(), Ok(Key::Int(3)));
        assert_eq!(r.int(), Ok(-7));
        assert_eq!(r.key(), Ok(Key::Int(-1)));
        assert_eq!(r.int(), Ok(1));
        assert_eq!(r.key(), Ok(Key::Text("k")));
        assert_eq!(r.bytes(), Ok(&[1u8, 2][..]));
        assert_eq!(r.key(), Ok(Key::Text("t")));
        assert_eq!(r.array(), Ok(2));
        assert_eq!(r.bool(), Ok(true));
        assert_eq!(r.bool(), Ok(false));
        assert!(r.is_empty());
        let mut r = Reader::new(&bytes);
        assert_eq!(r.raw_value(), Ok(&bytes[..]));
    }

    #[test]
    fn integers_at_their_bounds() {
        for (bytes, want) in [
            ("17", Ok(23)),
            ("1818", Ok(24)),
            ("190100", Ok(256)),
            ("1a00010000", Ok(65536)),
            // a longer head than needed reads the same value
            ("1b0000000000000001", Ok(1)),
            ("1b7fffffffffffffff", Ok(i64::MAX)),
            ("3b7fffffffffffffff", Ok(i64::MIN)),
            ("38ff", Ok(-256)),
            (
                "1b8000000000000000",
                Err(CborError::Refused("CBOR integer out of range")),
            ),
            (
                "3b8000000000000000",
                Err(CborError::Refused("CBOR integer out of range")),
            ),
        ] {
            assert_eq!(Reader::new(&hex(bytes)).int(), want, "{bytes}");
        }
    }

    #[test]
    fn refuses_what_is_outside_the_subset() {
        for (bytes, what) in [
            ("5f41ff", "CBOR value of indefinite length"),
            ("bf01ff", "CBOR value of indefinite length"),
            ("c240", "CBOR tag"),
            ("f97e00", "CBOR float"),
            ("fb3ff0000000000000", "CBOR float"),
            ("f6", "CBOR simple value other than true or false"),
            ("f7", "CBOR simple value other than true or false"),
            ("f820", "CBOR simple value other than true or false"),
            ("1c", "CBOR head with reserved additional information"),
            ("62c328", "CBOR text string is not UTF-8"),
        ] {
            assert_eq!(
                Reader::new(&hex(bytes)).skip(),
                Err(CborError::Refused(what)),
                "{bytes}"
            );
        }
    }

    #[test]
    fn lengths_past_the_end_are_truncated_without_looping() {
        for bytes in [
            "5b ffffffffffffffff",
            "9b ffffffffffffffff",
            "bb 7fffffffffffffff",
            "bb ffffffffffffffff",
            "5a ffffffff 00",
            "a2 01 02",
            "82 01",
            "",
        ] {
            let bytes = hex(&bytes.replace(' ', ""));
            assert_eq!(
                Reader::new(&bytes).skip(),
                Err(CborError::Truncated),
                "{bytes:02x?}"
            );
        }
        assert_eq!(
            Reader::new(&hex("bbffffffffffffffff")).map(),
            Err(CborError::Truncated)
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| {
            let mut v = vec![0x81; n];
            v.push(0x01);
            v
        };
        assert_eq!(Reader::new(&deep(MAX_DEPTH)).skip(), Ok(()));
        assert_eq!(
            Reader::new(&deep(MAX_DEPTH + 1)).skip(),
            Err(CborError::TooDeep)
        );
        // Far deeper than the stack could take, refused at the limit.
        assert_eq!(
            Reader::new(&deep(1_000_000)).skip(),
            Err(CborError::TooDeep)
        );
    }

    #[test]
    fn repeated_keys_are_refused() {
        let mut keys = Keys::default();
        assert_eq!(keys.insert(Key::Int(1)), Ok(()));
        assert_eq!(keys.insert(Key::Text("1")), Ok(()));
        assert!(keys.insert(Key::Int(1)).is_err());
        assert!(keys.insert(Key::Text("1")).is_err());
    }

    #[test]
    fn keys_are_integers_or_text() {
        assert!(Reader::new(&hex("4101")).key().is_err());
        assert!(Reader::new(&hex("f5")).key().is_err());
    }
}
