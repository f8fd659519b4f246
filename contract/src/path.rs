//! Request paths as destinations route them: what the Lock judges.
//!
//! A session can write one path in many spellings that a destination
//! routes to the same handler: `/%64eploy/x`, `/./deploy`, `/x/../deploy`,
//! `/%2e/deploy` and `//deploy` all reach `/deploy` on most origins. The
//! Lock must judge the path the destination will route, never the bytes
//! the session wrote, and the gateway and the destination must agree on it.
//! Two forms, both derived here and nowhere else (the gateway judges
//! requests with them; the control plane and the gateway keep rule prefixes
//! in the same forms):
//!
//! - [`canonical`]: the path the gateway **forwards**, records, and shows
//!   on the approval card. RFC 3986 §6.2.2 syntax-based normalisation:
//!   percent-encoded unreserved octets (`A-Z a-z 0-9 - . _ ~`) decoded,
//!   the hex digits of every other percent-encoding upper-cased, dot
//!   segments removed (after decoding, so `%2e%2E` is a dot segment too;
//!   RFC 3986 §5.2.4, `..` never climbs above the root), and repeated
//!   slashes merged (`//deploy` is `/deploy`; an empty segment survives
//!   only as the trailing slash). Every step but the last is an
//!   equivalence RFC 3986 guarantees, so no destination routes the
//!   canonical path differently from the path as sent. Merging slashes is
//!   not: it is decided so, because nginx, Apache, Go's `ServeMux` and
//!   most frameworks merge them (or redirect to the merged path), and a
//!   destination that keeps empty segments distinct (an object store,
//!   say) is rare next to the bypass they open. The canonical form is a
//!   fixed point: a destination that applies any of these steps again
//!   routes exactly what the gateway judged.
//! - [`routing_key`]: how **leniently** a destination may still read the
//!   canonical path, used only to match Lock rules, never forwarded. Some
//!   destinations go further than RFC 3986 allows, and the key reads the
//!   path as the most lenient of them would: every percent-encoded ASCII
//!   octet decoded once (so `%2F` and `%5C` are separators, as nginx and
//!   Go's `URL.Path` decode them), `\` read as `/` (IIS), each segment's
//!   `;` parameters cut off (servlet containers: `/deploy;x=1`, and
//!   `/..;/deploy` climbing), dot segments removed and slashes merged
//!   again, and ASCII letters lower-cased (IIS and case-insensitive
//!   routers). These readings are not forwarded because they are not
//!   equivalences: `%2F` inside a segment is meaningful to many APIs
//!   (GitLab's `projects/group%2Fname`), `;` to matrix-parameter routes,
//!   and case to most origins.
//!
//! A rule's path prefix matches when the canonical path starts with the
//! canonical prefix **or** the path's routing key starts with the prefix's
//! routing key ([`crate::lock::LockRule::matches`]): a request that any of
//! these readings routes under the prefix is held. Matching more than a
//! strict destination would route costs a card; matching less would let a
//! request through unheld.
//!
//! **Not covered**: a destination that decodes twice (`%252e` read as
//! `.`), overlong UTF-8 (`%c0%ae`), Unicode normalisation of path text,
//! trailing dots or spaces that Windows servers strip from segments, and
//! method overrides carried in a body (`_method=DELETE` in a form):
//! `docs/secrets.md` ("The Lock and the path") says what a rule should
//! name for those.

use std::borrow::Cow;

/// An RFC 3986 unreserved octet: decoding its percent-encoding changes no
/// URI's meaning.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The octet `%XY` at `bytes[i..]` stands for, if it is a percent-encoding.
fn escaped(bytes: &[u8], i: usize) -> Option<u8> {
    match bytes.get(i..i + 3) {
        Some([b'%', hi, lo]) => Some(hex_value(*hi)? << 4 | hex_value(*lo)?),
        _ => None,
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Whether `path` is already canonical as far as a quick look can tell: no
/// `%`, no empty segment before the last, no `.` or `..` segment. Most
/// requests' paths are, and then [`canonical`] borrows.
fn looks_canonical(path: &[u8]) -> bool {
    let mut segment_start = 1;
    for (i, &b) in path.iter().enumerate().skip(1) {
        match b {
            b'%' => return false,
            b'/' => {
                if !plain_segment(&path[segment_start..i]) {
                    return false;
                }
                segment_start = i + 1;
            }
            _ => {}
        }
    }
    // The last segment may be empty: a trailing slash.
    let last = &path[segment_start..];
    last.is_empty() || plain_segment(last)
}

fn plain_segment(segment: &[u8]) -> bool {
    !matches!(segment, b"" | b"." | b"..")
}

/// The canonical form of a request path (no query): see the
/// [module docs](self). A path that does not start with `/` (the `*` of
/// `OPTIONS *`) is returned as it is. Borrows when nothing changes.
pub fn canonical(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || looks_canonical(path.as_bytes()) {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match escaped(bytes, i) {
            Some(octet) if is_unreserved(octet) => {
                decoded.push(octet);
                i += 3;
            }
            Some(octet) => {
                decoded.extend_from_slice(&[
                    b'%',
                    HEX_UPPER[usize::from(octet >> 4)],
                    HEX_UPPER[usize::from(octet & 15)],
                ]);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    Cow::Owned(segments(&decoded, whole))
}

fn whole(segment: &[u8]) -> &[u8] {
    segment
}

/// `path` (starting with `/`) with dot segments removed and empty segments
/// merged, each segment first passed through `segment` (which may shorten
/// it). Only ASCII is ever removed or decoded, so UTF-8 stays whole.
fn segments(path: &[u8], segment: fn(&[u8]) -> &[u8]) -> String {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    let mut parts = path[1..].split(|&b| b == b'/').peekable();
    while let Some(part) = parts.next() {
        let last = parts.peek().is_none();
        match segment(part) {
            b"" | b"." => trailing = last,
            b".." => {
                kept.pop();
                trailing = last;
            }
            s => {
                kept.push(s);
                trailing = false;
            }
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for s in &kept {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if kept.is_empty() || trailing {
        out.push(b'/');
    }
    // Only ASCII bytes were removed, decoded or split on, at ASCII
    // positions: what is left of the input's UTF-8 is whole.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The routing key of a request path: the most lenient reading of it that
/// destinations apply (see the [module docs](self)). For matching only.
pub fn routing_key(path: &str) -> String {
    key_of_canonical(&canonical(path))
}

/// [`routing_key`] of a path already canonical.
fn key_of_canonical(canonical: &str) -> String {
    if !canonical.starts_with('/') {
        return canonical.to_ascii_lowercase();
    }
    let bytes = canonical.as_bytes();
    let mut read = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match escaped(bytes, i) {
            Some(octet) if octet.is_ascii() => {
                read.push(octet);
                i += 3;
            }
            // Not ASCII: left encoded (canonical, so upper-case hex).
            _ => {
                read.push(bytes[i]);
                i += 1;
            }
        }
    }
    for b in &mut read {
        if *b == b'\\' {
            *b = b'/';
        }
        b.make_ascii_lowercase();
    }
    segments(&read, without_parameters)
}

/// A segment without its `;` parameters.
fn without_parameters(segment: &[u8]) -> &[u8] {
    match segment.iter().position(|&b| b == b';') {
        Some(at) => &segment[..at],
        None => segment,
    }
}

/// A request's path as the Lock judges it: its canonical form (forwarded,
/// recorded, on the card) and its routing key (for matching).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedPath {
    canonical: String,
    key: String,
}

impl RoutedPath {
    /// Judge `path` (without its query).
    pub fn new(path: &str) -> RoutedPath {
        let canonical = canonical(path).into_owned();
        RoutedPath {
            key: key_of_canonical(&canonical),
            canonical,
        }
    }

    /// The canonical path.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// The routing key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! forms {
        ($($path:expr => $canonical:expr, $key:expr;)*) => {
            $(
                assert_eq!(canonical($path), $canonical, "canonical({:?})", $path);
                assert_eq!(routing_key($path), $key, "routing_key({:?})", $path);
            )*
        };
    }

    #[test]
    fn the_spellings_of_deploy() {
        forms! {
            "/deploy/x" => "/deploy/x", "/deploy/x";
            "/%64eploy/x" => "/deploy/x", "/deploy/x";
            "/%64%65%70%6C%6f%79" => "/deploy", "/deploy";
            "/./deploy" => "/deploy", "/deploy";
            "/x/../deploy" => "/deploy", "/deploy";
            "/%2e/deploy" => "/deploy", "/deploy";
            "/%2E%2e/deploy" => "/deploy", "/deploy";
            "/x/%2e%2e/deploy" => "/deploy", "/deploy";
            "//deploy" => "/deploy", "/deploy";
            "///deploy//x" => "/deploy/x", "/deploy/x";
            "/a/b/../../deploy" => "/deploy", "/deploy";
            "/../../deploy" => "/deploy", "/deploy";
            "/x/..%2Fdeploy" => "/x/..%2Fdeploy", "/deploy";
            "/x%2F..%2Fdeploy" => "/x%2F..%2Fdeploy", "/deploy";
            "/x%2f..%2fdeploy" => "/x%2F..%2Fdeploy", "/deploy";
            "/x/..;/deploy" => "/x/..;/deploy", "/deploy";
            "/deploy;jsessionid=1/x" => "/deploy;jsessionid=1/x", "/deploy/x";
            "/x/..%3B/deploy" => "/x/..%3B/deploy", "/deploy";
            "/DEPLOY" => "/DEPLOY", "/deploy";
            "/x\\..\\deploy" => "/x\\..\\deploy", "/deploy";
            "/x%5C..%5Cdeploy" => "/x%5C..%5Cdeploy", "/deploy";
        }
    }

    #[test]
    fn trailing_slashes_roots_and_other_forms() {
        forms! {
            "/" => "/", "/";
            "//" => "/", "/";
            "/a/" => "/a/", "/a/";
            "/a/." => "/a/", "/a/";
            "/a/b/.." => "/a/", "/a/";
            "/a/.." => "/", "/";
            "/.." => "/", "/";
            "/a//" => "/a/", "/a/";
            "/~user/%7Euser" => "/~user/~user", "/~user/~user";
            "/a%20b" => "/a%20b", "/a b";
            "/a%zzb%" => "/a%zzb%", "/a%zzb%";
            "/a%2" => "/a%2", "/a%2";
            "/caf%C3%A9/é" => "/caf%C3%A9/é", "/caf%c3%a9/é";
            "/..a/.b/a.." => "/..a/.b/a..", "/..a/.b/a..";
            "*" => "*", "*";
        }
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for p in ["/", "/a/b", "/a/b/", "/v1/items;x", "/a.b/c..d"] {
            assert!(matches!(canonical(p), Cow::Borrowed(_)), "{p}");
        }
        for p in ["//a", "/a//b", "/./a", "/a/..", "/%41"] {
            assert!(matches!(canonical(p), Cow::Owned(_)), "{p}");
        }
    }

    /// An independent reading of RFC 3986: percent-encoding normalised
    /// with `u8::from_str_radix`, slashes merged by repeated replacement,
    /// then §5.2.4's remove_dot_segments run literally, rule by rule, on
    /// an input and an output buffer.
    fn reference(path: &str) -> String {
        if !path.starts_with('/') {
            return path.to_owned();
        }
        let mut norm = Vec::new();
        let b = path.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                if let Ok(v) = u8::from_str_radix(hex, 16) {
                    if hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                        if v.is_ascii_alphanumeric() || b"-._~".contains(&v) {
                            norm.push(v);
                        } else {
                            norm.extend(format!("%{v:02X}").bytes());
                        }
                        i += 3;
                        continue;
                    }
                }
            }
            norm.push(b[i]);
            i += 1;
        }
        let mut input = String::from_utf8(norm).unwrap();
        while input.contains("//") {
            input = input.replace("//", "/");
        }
        let mut output = String::new();
        while !input.is_empty() {
            if let Some(rest) = input.strip_prefix("../") {
                input = rest.to_owned();
            } else if let Some(rest) = input.strip_prefix("./") {
                input = rest.to_owned();
            } else if input.starts_with("/./") {
                input = input[2..].to_owned();
            } else if input == "/." {
                input = "/".to_owned();
            } else if input.starts_with("/../") || input == "/.." {
                input = format!("/{}", &input[if input == "/.." { 3 } else { 4 }..]);
                match output.rfind('/') {
                    Some(at) => output.truncate(at),
                    None => output.clear(),
                }
            } else if input == "." || input == ".." {
                input.clear();
            } else {
                let start = usize::from(input.starts_with('/'));
                let end = input[start..].find('/').map_or(input.len(), |e| e + start);
                output.push_str(&input[..end]);
                input = input[end..].to_owned();
            }
        }
        if output.is_empty() {
            output.push('/');
        }
        output
    }

    #[test]
    fn the_reference_agrees_on_the_examples() {
        for p in [
            "/a/b/c/./../../g",
            "/mid/content=5/../6",
            "//a//b/../c/",
            "/%2e%2E/x",
            "/.",
        ] {
            assert_eq!(canonical(p), reference(p), "{p}");
        }
    }

    /// Paths made of the pieces that matter: dots in every spelling,
    /// slashes in every spelling, parameters, escapes valid and not,
    /// letters of both cases, non-ASCII.
    fn piece() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("/".to_owned()),
            Just("//".to_owned()),
            Just(".".to_owned()),
            Just("..".to_owned()),
            Just("%2e".to_owned()),
            Just("%2E".to_owned()),
            Just("%2f".to_owned()),
            Just("%2F".to_owned()),
            Just("%5c".to_owned()),
            Just("\\".to_owned()),
            Just(";".to_owned()),
            Just(";p=1".to_owned()),
            Just("%3B".to_owned()),
            Just("%".to_owned()),
            Just("%4".to_owned()),
            Just("%zz".to_owned()),
            Just("%7e".to_owned()),
            Just("é".to_owned()),
            Just("%C3%A9".to_owned()),
            "[a-zA-Z0-9_~-]{1,4}",
            "%[0-9a-fA-F]{2}",
        ]
    }

    fn paths() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec(piece(), 0..12).prop_map(|p| format!("/{}", p.concat())),
            "/[ -~]{0,24}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// The canonical path equals the reference normaliser's, is a fixed
        /// point, and has no dot segment and no empty segment but the last.
        #[test]
        fn canonical_matches_the_reference(path in paths()) {
            let c = canonical(&path);
            proptest::prop_assert_eq!(&*c, reference(&path));
            proptest::prop_assert_eq!(canonical(&c), c.clone());
            proptest::prop_assert!(c.starts_with('/'));
            let inner = c.strip_suffix('/').unwrap_or(&c);
            for s in inner.split('/').skip(1) {
                proptest::prop_assert!(!matches!(s, "" | "." | ".."), "{:?}", c);
            }
        }

        /// The routing key is the reference normaliser's result on the path
        /// read leniently, and reading a canonical path gives the same key
        /// as reading the path as sent.
        #[test]
        fn routing_key_matches_the_reference(path in paths()) {
            let key = routing_key(&path);
            proptest::prop_assert_eq!(&key, &routing_key(&canonical(&path)));
            proptest::prop_assert_eq!(&key, &routing_key(&key));
            // Read leniently by hand: decode ASCII escapes once, `\` as
            // `/`, lower case, parameters cut per segment; then the
            // reference normaliser.
            let c = reference(&path);
            let mut lenient = String::new();
            let b = c.as_bytes();
            let mut i = 0;
            while i < b.len() {
                let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.filter(|h| b[i] == b'%' && h.bytes().all(|c| c.is_ascii_hexdigit())) {
                    Some(h) if u8::from_str_radix(h, 16).unwrap() < 0x80 => {
                        lenient.push(char::from(u8::from_str_radix(h, 16).unwrap()));
                        i += 3;
                    }
                    _ => {
                        let ch = c[i..].chars().next().unwrap();
                        lenient.push(ch);
                        i += ch.len_utf8();
                    }
                }
            }
            let lenient = lenient.replace('\\', "/").to_ascii_lowercase();
            let cut: Vec<&str> = lenient.split('/').map(|s| s.split(';').next().unwrap_or("")).collect();
            // The cut and decoded text may now hold `%` sequences of its
            // own; escape them so the reference does not decode twice.
            let joined = cut.join("/").replace('%', "%25");
            let want = reference(&joined).replace("%25", "%");
            proptest::prop_assert_eq!(key, want);
        }
    }
}
