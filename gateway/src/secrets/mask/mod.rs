//! Masking secret values in replies: every byte of every occurrence of an
//! attached value, or of one of its common encodings, becomes `*`.
//!
//! Lengths are kept, so `content-length`, HTTP/2 frame sizes and anything
//! else that counts bytes stays right. Sans-IO: bytes in, masked bytes out.
//! The body layer calls it on decoded bytes ([`crate::secrets::decode`] removes
//! content codings first).
//!
//! - [`MaskSet`]: built once per session from its secrets; every pattern
//!   (each value and each of its encodings) in one Aho-Corasick automaton.
//! - [`Masker`]: one per reply. [`Masker::push`] takes body chunks as they
//!   come and emits every byte that can no longer be part of an occurrence,
//!   masked where it is; [`Masker::finish`] emits the rest at the end of
//!   the body. [`Masker::mask_all`] masks a whole header value or trailer in
//!   place. The masker keeps the counts for the connection record.
//!
//! # Coverage
//!
//! For a value of n bytes the masker looks for these forms ("patterns"),
//! each wherever it appears, whatever surrounds it:
//!
//! - **the value itself**, byte for byte;
//! - **hex**, lower case and upper case (`3a7f`, `3A7F`);
//! - **base64**, in the standard (`+/`) and the URL-safe (`-_`) alphabet.
//!   Inside a longer base64 text a value starts at a byte offset that is 0,
//!   1 or 2 modulo 3 (its *alignment* a), and its characters differ with
//!   the alignment, so all three are looked for. At each alignment the
//!   pattern is the run of characters whose six bits all come from the
//!   value: the characters before and after it mix value bits with bits of
//!   unknown neighbouring bytes, so they are not part of the pattern and are
//!   **not masked** (they carry at most 4 bits of the value's first byte and
//!   4 bits of its last). The run is ⌊4(n+a)/3⌋ − ⌈4a/3⌉ characters long,
//!   so alignment 0 and 2 yield a pattern for n ≥ 1 and alignment 1 for
//!   n ≥ 2. When the value *ends* the base64 text, its last character and
//!   padding are known too: at each alignment the run continued to the end
//!   of the text, with and without `=` padding, is a pattern as well (at
//!   alignment 0 these are the value encoded alone: Basic credentials, JWT
//!   segments, most tokens);
//! - **percent-encoding**, with upper-case and with lower-case hex digits,
//!   in the forms common encoders produce (`PERCENT_STYLES` names them):
//!   every byte but the RFC 3986 unreserved ones encoded, with `%20` or `+`
//!   for a space; the WHATWG form encoding (`URLSearchParams`); JavaScript's
//!   `encodeURIComponent`; everything but letters and digits; and only the
//!   reserved bytes (and `%`) encoded, everything else left as it is;
//! - **JSON string escaping**, for values that are UTF-8 (`JSON_STYLES`
//!   names the producers): `\"`, `\\`, `\b \f \n \r \t`, other control
//!   characters as `\u00xx`; with and without `\/`; with non-ASCII
//!   characters as `\uxxxx` (surrogate pairs beyond U+FFFF) in lower or
//!   upper case, or left as UTF-8; and Go's escaping of `< > &` and
//!   U+2028/U+2029.
//!
//! An encoding identical to the value (a token of letters and digits needs
//! no percent-encoding or JSON escaping) or to another form is one pattern.
//!
//! **Not covered**, and so passed on as it is:
//!
//! - other encodings: base32, base58, UTF-16, HTML and XML character
//!   references (`&#x41;`), quoted-printable, `\x` escapes, hex with mixed
//!   case or separators (`3A:7f`), percent-encoding forms other than the
//!   ones above (PHP's `urlencode`, .NET's `HttpUtility.UrlEncode` differ in
//!   a few bytes such as `~ * ! ( )`), JSON escapers other than the ones
//!   above (e.g. .NET's, which escapes `+` and `'`);
//! - encodings of encodings: percent-encoded base64, base64 of hex, JSON
//!   escaping of a base64 form written with `\/`, and so on;
//! - a value split by other bytes: **base64 wrapped into lines (PEM, MIME
//!   at 64 or 76 columns) is not masked across a line break**, nor is a
//!   value split by whitespace, quoting or markup;
//! - part of a value (a prefix, a truncated or re-cased token) — but not
//!   pieces the session chooses: toward destinations with attachments the
//!   gateway removes `Range` and refuses partial replies
//!   (`docs/secrets.md`, "Ranges"); and header names, which arrive
//!   lower-cased, are matched without regard to ASCII case
//!   ([`Masker::mask_name`]);
//! - compressed or encrypted data inside a body (a zip file, gzip inside
//!   base64, a PDF stream). Content codings of the reply itself are decoded
//!   before the masker sees the body, by [`crate::secrets::decode`].
//!
//! Patterns are matched as bytes wherever they appear, so a very short value
//! (or the short base64 runs of a 1- or 2-byte value) masks every
//! occurrence of those few bytes, secret or not.
//!
//! # Occurrences and counts
//!
//! All occurrences are masked, overlapping ones too: with the value `abab`,
//! `ababab` is masked whole; with the values `abc` and `abcdef`, both are
//! masked in `abcdef`.
//!
//! The counts name secrets, never values. An occurrence of a secret is a
//! position where one of its patterns starts; patterns of the same secret
//! that start at the same position (the padded and unpadded base64 forms,
//! say) are one occurrence. A pattern found inside a longer pattern of the
//! same secret at another position counts again (this needs a very short
//! value, such as `4`, whose hex form is `34`). Two names with the same
//! value each count it. A name given more than once has all its values
//! masked and counted under the one name.
//!
//! # Streaming, and why no byte escapes
//!
//! The masker runs the automaton over the body one byte at a time, carrying
//! its state from chunk to chunk, so it reads every byte exactly once and
//! reports every occurrence exactly once, when its last byte arrives, as if
//! the body were one piece. An occurrence that ends in this chunk may have
//! started in an earlier one; its first bytes are then still held: after
//! each chunk the masker keeps back the longest tail of what it has read
//! that is a *proper prefix* of some pattern (the "pending tail") and emits
//! everything before it. A byte before the pending tail is final: an
//! occurrence still to come would have to start in a tail that is a proper
//! prefix of a pattern, and no such tail starts earlier. A tail that cannot
//! begin any pattern is emitted at once; the hold is never longer than it
//! must be.
//!
//! Most text cannot begin an occurrence at all. A small table of the grams
//! (4 bytes, fewer if a pattern is shorter) that open every pattern, the
//! `GramFilter`, lets the masker jump over such text without walking the
//! automaton. It only ever skips positions where no occurrence can start,
//! and never into the last `max_pattern_len - 1` bytes of a chunk, which the
//! automaton walks byte by byte, so an occurrence that the next chunk
//! completes is never missed. (That walk is cheap where nothing is pending:
//! the start state's moves are a 256-entry table, and most bytes open no
//! pattern.)
//!
//! Most chunks then need no writing either: [`Masker::push_bytes`] reads a
//! chunk first, and when no occurrence ends in it passes it on as it is, a
//! slice of the caller's buffer, copying only the pending tail.
//!
//! # Speed
//!
//! On text with no occurrence the gram filter checks one position in
//! `stride`: as many as the shortest pattern allows (its length less 3),
//! at most 64, and fewer as patterns add up, so that the table stays
//! sparse (37 for one 40-character token, 43 for four 46-byte values, 11
//! for 32 tokens; never fewer than 8). The masker then reads 16 KiB chunks at about 25 GiB/s on one
//! core with four 46-byte values, passing them on uncopied, and copies and
//! scans 64 KiB chunks at about 19 GiB/s with one 40-character token and
//! 7.5 GiB/s with 32 (`benches/benches/mask.rs` has the figures). Text
//! that looks like the secrets' patterns is walked byte by byte, at about
//! 0.25–0.3 GiB/s. A value of 1 to 3 bytes has patterns that short, so the
//! filter checks every position and finds many candidates: about 1 GiB/s.
//!
//! # Memory usage
//!
//! A [`MaskSet`] takes memory in proportion to the total length of its
//! patterns (the automaton, a table of states, an 8 KiB gram table, and a
//! second, case-insensitive automaton of the same patterns for header
//! names):
//! about 19 KiB per 40-character token (8 KiB of it the case-insensitive
//! automaton), plus the gram table ([`MaskSet::memory_usage`] says how
//! much). A [`Masker`] holds at most [`MaskSet::max_pattern_len`] − 1 body
//! bytes, allocated once when it is made, plus one `u64` counter per secret
//! name; the size of the body never matters. The longest pattern of a value of n bytes is at most 6n
//! bytes (JSON's `\u00xx` for a control character; a non-ASCII character
//! becomes at most 3 bytes per byte), so with values up to
//! [`crate::secrets::secret::MAX_SECRET_LEN`] a masker holds at most 48 KiB.
//!
//! What is wiped: the held bytes (on drop), the held tail's copy left in
//! the caller's output buffer by [`Masker::push`], and every pattern built
//! while making the set. [`Masker::push_bytes`] neither writes nor wipes the
//! chunk it is given: that buffer is the caller's. The automaton encodes the patterns in its transition
//! tables, which the aho-corasick crate frees without zeroing them.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous;
use aho_corasick::{Anchored, MatchKind};
use bytes::Bytes;
use zeroize::{Zeroize, Zeroizing};

mod forms;
mod gram;
#[cfg(any(test, feature = "test-util"))]
mod reference;

use forms::{forms, Pattern};
use gram::GramFilter;
#[cfg(any(test, feature = "test-util"))]
pub use reference::{mask_reference, MaskReference};

/// Why a mask set could not be built. Names a secret, never a value.
#[derive(Debug, thiserror::Error)]
pub enum MaskSetError {
    /// An empty value would match everywhere and mask nothing.
    #[error("secret {name}: the value is empty, so it cannot be masked")]
    EmptyValue { name: String },
    /// More pattern bytes than one automaton can index (far beyond what
    /// [`crate::secrets::secret::MAX_SECRET_LEN`] allows per value).
    #[error("the secrets' {patterns} patterns are too large for one automaton")]
    TooLarge {
        patterns: usize,
        #[source]
        source: aho_corasick::BuildError,
    },
}

/// Every pattern of a session's secrets, in one automaton. Build it once per
/// session (and again when the session's secrets change); share it between
/// the session's streams through an [`Arc`].
///
/// # Memory usage
///
/// In proportion to the total length of the patterns: see the
/// [module docs](self#memory-usage).
pub struct MaskSet {
    /// Secret names, sorted and distinct. A secret's id is its index here.
    names: Box<[String]>,
    /// Every pattern; a pattern's id in the automaton is its index in
    /// `counted_by`. Standard match semantics: every pattern that ends at a
    /// position is reported there, so overlapping occurrences are all seen.
    nfa: contiguous::NFA,
    /// The automaton's unanchored start state: nothing pending.
    start: StateID,
    /// The start state's move on each byte (`start` itself for a byte that
    /// opens no pattern).
    from_start: Box<[StateID; 256]>,
    /// For each pattern, the secrets for which a match of it is a new
    /// occurrence (see [`counts_as_occurrence`]).
    counted_by: Box<[Box<[u32]>]>,
    /// For every state of the automaton, how many of the bytes last read
    /// must be held back in that state. Sorted by state.
    // invariant: every state the automaton can reach is listed.
    holds: Box<[(StateID, u32)]>,
    /// Skips text where no occurrence can start; `None` without patterns.
    filter: Option<GramFilter>,
    /// The same patterns, matched without regard to ASCII case, in the
    /// same order (so pattern ids agree with `counted_by`): for header
    /// names, which arrive lower-cased whatever the destination wrote.
    anycase: aho_corasick::AhoCorasick,
    /// The longest pattern, in bytes (0 without patterns).
    max_len: usize,
}

impl MaskSet {
    /// Build the set for `secrets`, pairs of secret name and value. A name
    /// may appear more than once (an attachment per destination, say); its
    /// values are all masked and counted under it.
    ///
    /// Refuses an empty value, naming its secret.
    pub fn new(secrets: &[(&str, &[u8])]) -> Result<MaskSet, MaskSetError> {
        if let Some((name, _)) = secrets.iter().find(|(_, value)| value.is_empty()) {
            return Err(MaskSetError::EmptyValue {
                name: (*name).to_owned(),
            });
        }
        let mut names: Vec<&str> = secrets.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();

        // Each secret's forms, and whether a match of each starts an
        // occurrence of that secret.
        struct Entry {
            form: Pattern,
            secret: u32,
            counted: bool,
        }
        let mut entries = Vec::new();
        for (id, name) in names.iter().enumerate() {
            let mut own: Vec<Pattern> = Vec::new();
            for (_, value) in secrets.iter().filter(|(n, _)| n == name) {
                for form in forms(value) {
                    if !own.contains(&form) {
                        own.push(form);
                    }
                }
            }
            let counted: Vec<bool> = own
                .iter()
                .map(|form| counts_as_occurrence(form, &own))
                .collect();
            for (form, counted) in own.into_iter().zip(counted) {
                entries.push(Entry {
                    form,
                    secret: u32::try_from(id).expect("fewer than 2^32 secrets"),
                    counted,
                });
            }
        }

        // One pattern per distinct form, whoever it belongs to.
        entries.sort_unstable_by(|a, b| a.form[..].cmp(&b.form[..]).then(a.secret.cmp(&b.secret)));
        let mut patterns: Vec<Pattern> = Vec::new();
        let mut counted_by: Vec<Vec<u32>> = Vec::new();
        for entry in entries {
            if patterns.last() != Some(&entry.form) {
                patterns.push(entry.form);
                counted_by.push(Vec::new());
            }
            if entry.counted {
                counted_by
                    .last_mut()
                    .expect("a pattern was just pushed")
                    .push(entry.secret);
            }
        }

        // The gram filter replaces aho-corasick's prefilters, which stop
        // applying past about a hundred patterns (a few secrets' worth).
        let nfa = contiguous::NFA::builder()
            .match_kind(MatchKind::Standard)
            .prefilter(false)
            .build(patterns.iter().map(|p| p.as_slice()))
            .map_err(|source| MaskSetError::TooLarge {
                patterns: patterns.len(),
                source,
            })?;
        let start = nfa
            .start_state(Anchored::No)
            .expect("a contiguous NFA supports unanchored searches by default");
        let holds = hold_table(&nfa, start, &patterns);
        let from_start = Box::new(std::array::from_fn(|b| {
            let byte = u8::try_from(b).expect("256 entries");
            nfa.next_state(Anchored::No, start, byte)
        }));
        let filter = GramFilter::new(&patterns);
        let anycase = aho_corasick::AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
            .prefilter(false)
            .build(patterns.iter().map(|p| p.as_slice()))
            .map_err(|source| MaskSetError::TooLarge {
                patterns: patterns.len(),
                source,
            })?;
        Ok(MaskSet {
            anycase,
            names: names.into_iter().map(str::to_owned).collect(),
            max_len: patterns.iter().map(|p| p.len()).max().unwrap_or(0),
            nfa,
            start,
            from_start,
            counted_by: counted_by.into_iter().map(Vec::into_boxed_slice).collect(),
            holds,
            filter,
        })
    }

    /// The secret names, sorted; the order of [`Masker::counts`].
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.names.iter().map(String::as_str)
    }

    /// Whether there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.counted_by.is_empty()
    }

    /// How many distinct patterns the secrets gave.
    pub fn pattern_count(&self) -> usize {
        self.counted_by.len()
    }

    /// The longest pattern, in bytes: a [`Masker`] holds back fewer bytes
    /// than this.
    pub fn max_pattern_len(&self) -> usize {
        self.max_len
    }

    /// Heap bytes the set takes: the automaton, the hold table, the
    /// counting lists and the gram table.
    pub fn memory_usage(&self) -> usize {
        self.nfa.memory_usage()
            + self.anycase.memory_usage()
            + std::mem::size_of_val(&*self.holds)
            + self
                .counted_by
                .iter()
                .map(|c| std::mem::size_of_val(&**c) + std::mem::size_of::<Box<[u32]>>())
                .sum::<usize>()
            + self.filter.as_ref().map_or(0, GramFilter::memory_usage)
            + self.names.iter().map(String::capacity).sum::<usize>()
    }

    /// How many bytes to hold back in state `sid`.
    fn hold(&self, sid: StateID) -> usize {
        let at = self
            .holds
            .binary_search_by_key(&sid, |&(state, _)| state)
            .expect("invariant: the hold table lists every state");
        self.holds[at].1 as usize
    }

    /// Run the automaton over `w[from..]` from state `sid` (the state after
    /// `w[..from]`), write `*` over every occurrence that ends there, add
    /// each new occurrence to `counts` (indexed by secret id) and return the
    /// state after the last byte.
    ///
    /// Positions are read in order and once; `*` is only ever written over
    /// bytes already read, so what the automaton sees is the original text.
    fn scan(&self, w: &mut [u8], from: usize, mut sid: StateID, counts: &mut [u64]) -> StateID {
        // The span most recently overwritten, all `*` (see `mask`).
        let mut masked = 0..0;
        let mut i = from;
        while self.run_to_match(w, &mut i, &mut sid) {
            for k in 0..self.nfa.match_len(sid) {
                let pattern = self.nfa.match_pattern(sid, k);
                let start = i
                    .checked_sub(self.nfa.pattern_len(pattern))
                    .expect("invariant: a pending occurrence's bytes are held");
                mask(w, start..i, &mut masked);
                for &secret in &self.counted_by[pattern.as_usize()] {
                    counts[secret as usize] += 1;
                }
            }
        }
        sid
    }

    /// Run the automaton over `w[*i..]` from state `*sid` (the state after
    /// `w[..*i]`) until an occurrence ends: then `true`, with `*i` just past
    /// its last byte and `*sid` the match state, which lists every pattern
    /// that ends there. At the end of `w`: `false`, with `*sid` the state
    /// after the last byte. Reads only; [`MaskSet::scan`] masks what it
    /// reports, and the zero-copy check in [`Masker::push_bytes`] stops at
    /// the first report.
    #[inline]
    fn run_to_match(&self, w: &[u8], i: &mut usize, sid: &mut StateID) -> bool {
        // Skipping ahead is only allowed up to here: an occurrence that
        // starts later may end in the next chunk, so its first bytes must
        // be read for the state to carry them over.
        let skip_limit = w.len().saturating_sub(self.max_len.saturating_sub(1));
        let mut at = *i;
        let mut state = *sid;
        while at < w.len() {
            if state == self.start {
                if at < skip_limit {
                    // Nothing pending: no occurrence still to be reported
                    // started before `at`. The filter finds a position p at
                    // or after it before which none starts either (every
                    // occurrence starting before `skip_limit` ends inside
                    // `w`, which the filter sees), and the automaton
                    // restarts there in the start state: from p on it
                    // reports what reading the skipped bytes would have.
                    // The skipped bytes lie more than `max_len - 1` bytes
                    // before the end of `w`, so they are never part of the
                    // pending tail either.
                    if let Some(filter) = &self.filter {
                        at = filter.skip(w, at, skip_limit);
                    }
                    if at == w.len() {
                        break;
                    }
                }
                // The start state's moves are a table lookup: most bytes
                // open no pattern and leave it where it is, which keeps the
                // walk over the end of a chunk (where the filter cannot
                // look) cheap.
                state = self.from_start[usize::from(w[at])];
                at += 1;
                if state == self.start {
                    continue;
                }
            } else {
                state = self.nfa.next_state(Anchored::No, state, w[at]);
                at += 1;
            }
            if self.nfa.is_match(state) {
                *i = at;
                *sid = state;
                return true;
            }
        }
        *i = w.len();
        *sid = state;
        false
    }
}

impl fmt::Debug for MaskSet {
    /// Names and sizes only: the automaton's tables spell out the patterns.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaskSet")
            .field("names", &self.names)
            .field("patterns", &self.pattern_count())
            .field("max_pattern_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

/// Write `*` over `w[span]`. Matches arrive in order of their end, so when
/// `span` starts inside `masked` (the span last written, all `*`) only its
/// part past `masked` needs writing: a value like `aaaa…a` repeated costs
/// one write per byte, not one per byte per occurrence.
fn mask(w: &mut [u8], span: Range<usize>, masked: &mut Range<usize>) {
    if masked.start <= span.start && span.start <= masked.end {
        if span.end > masked.end {
            w[masked.end..span.end].fill(b'*');
            masked.end = span.end;
        }
    } else {
        w[span.clone()].fill(b'*');
        *masked = span;
    }
}

/// [`Masker::push_bytes`] copies chunks shorter than this, in one piece, as
/// [`Masker::push`] does, rather than passing them on as they are: copying
/// a few hundred bytes costs less than the extra piece (an extra HTTP/1.1
/// chunk or HTTP/2 frame) that held bytes in front of them would need.
const PASS_THROUGH_MIN: usize = 1024;

/// Masks one reply: its body chunk by chunk, its header values and trailers
/// whole, and counts what it masked per secret name.
///
/// # Memory usage
///
/// At most [`MaskSet::max_pattern_len`] − 1 held body bytes (reserved when
/// the masker is made, never grown) and one counter per secret name,
/// whatever the size of the body.
pub struct Masker {
    set: Arc<MaskSet>,
    /// The automaton's state after the bytes read so far (or after the part
    /// of them that occurrences still to come can reach, when the gram
    /// filter skipped ahead: the same thing for everything to come).
    state: StateID,
    /// Bytes read but not yet emitted, with every occurrence that has ended
    /// so far already masked in them.
    // invariant: `held` is the pending tail for `state`: exactly
    // `set.hold(state)` bytes, so fewer than `set.max_len`.
    held: Zeroizing<Vec<u8>>,
    /// Occurrences per secret id.
    counts: Box<[u64]>,
}

impl Masker {
    /// A masker for one reply of a session.
    pub fn new(set: Arc<MaskSet>) -> Masker {
        Masker {
            state: set.start,
            held: Zeroizing::new(Vec::with_capacity(set.max_len.saturating_sub(1))),
            counts: vec![0; set.names.len()].into_boxed_slice(),
            set,
        }
    }

    /// Take the next body chunk. Appends to `out` every byte that can no
    /// longer be part of an occurrence, masked as needed, and holds the
    /// rest (the longest tail that could still begin one) for the next
    /// call.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let base = out.len();
        let resume = self.held.len();
        out.reserve(resume + chunk.len());
        out.extend_from_slice(&self.held);
        self.held.clear();
        out.extend_from_slice(chunk);

        let window = &mut out[base..];
        self.state = self.set.scan(window, resume, self.state, &mut self.counts);
        let cut = window
            .len()
            .checked_sub(self.set.hold(self.state))
            .expect("invariant: the pending tail lies within the held bytes and the chunk");
        self.held.extend_from_slice(&window[cut..]);
        // The caller's buffer keeps its capacity: leave no unmasked prefix
        // of an occurrence in it.
        window[cut..].zeroize();
        out.truncate(base + cut);
    }

    /// Take the next body chunk, as [`Masker::push`] does, without copying
    /// it when it can be passed on as it is. Calls `emit` with the bytes that
    /// can no longer be part of an occurrence, in order, in at most two
    /// non-empty pieces, and holds the rest for the next call.
    ///
    /// Most chunks hold no occurrence. Such a chunk is read once without
    /// being written, and then passed on as slices of `chunk` itself: the
    /// bytes held from before (if any) go first as a piece of their own,
    /// then the chunk up to its pending tail, which alone is copied into
    /// the held bytes. A chunk in which an occurrence ends, or one shorter
    /// than `PASS_THROUGH_MIN`, is copied and masked as [`Masker::push`]
    /// does, in one piece; the read that found the occurrence is then
    /// repeated on the copy, which costs only on chunks that hold one.
    ///
    /// The bytes of `chunk` itself are never written to or wiped: its
    /// buffer belongs to whoever made it (the part of it held back may be
    /// the start of an occurrence; the copy held here is wiped as usual).
    pub fn push_bytes(&mut self, chunk: Bytes, emit: impl FnMut(Bytes)) {
        self.push_bytes_from(chunk, PASS_THROUGH_MIN, emit);
    }

    /// [`Masker::push_bytes`], passing chunks of `min` bytes or more on as
    /// they are. For tests and the fuzz target, which pass small chunks
    /// through too; the data path uses [`Masker::push_bytes`].
    #[doc(hidden)]
    pub fn push_bytes_from(&mut self, mut chunk: Bytes, min: usize, mut emit: impl FnMut(Bytes)) {
        let mut end = 0;
        let mut state = self.state;
        if chunk.len() < min.max(1) || self.set.run_to_match(&chunk, &mut end, &mut state) {
            let mut out = Vec::new();
            self.push(&chunk, &mut out);
            if !out.is_empty() {
                emit(Bytes::from(out));
            }
            return;
        }
        // No occurrence ends in the chunk, so nothing is masked and the
        // counts stay as they are: what `push` would emit is the held bytes
        // and the chunk, less the new pending tail, unchanged.
        self.state = state;
        let hold = self.set.hold(state);
        if let Some(pass) = chunk.len().checked_sub(hold) {
            if !self.held.is_empty() {
                emit(Bytes::copy_from_slice(&self.held));
                self.held.clear();
            }
            self.held.extend_from_slice(&chunk[pass..]);
            chunk.truncate(pass);
            if !chunk.is_empty() {
                emit(chunk);
            }
        } else {
            // The pending tail reaches back into the held bytes (a chunk
            // shorter than the longest pattern): emit what it leaves of
            // them, keep the rest with the whole chunk.
            let keep_from = (self.held.len() + chunk.len())
                .checked_sub(hold)
                .expect("invariant: the pending tail lies within the held bytes and the chunk");
            if keep_from > 0 {
                emit(Bytes::copy_from_slice(&self.held[..keep_from]));
                self.held.copy_within(keep_from.., 0);
                let kept = self.held.len() - keep_from;
                self.held.truncate(kept);
            }
            self.held.extend_from_slice(&chunk);
        }
    }

    /// The body has ended: append the held bytes to `out`. No occurrence can
    /// still complete, so they are final (masked where an occurrence that
    /// ended covered them). The masker is then ready for another body; the
    /// counts carry on.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.held);
        self.held.zeroize();
        self.state = self.set.start;
    }

    /// Mask a whole value in place (a header value, a trailer): every
    /// occurrence in `bytes` is masked and counted. Independent of the body
    /// stream. Returns the number of occurrences found, summed over names.
    pub fn mask_all(&mut self, bytes: &mut [u8]) -> u64 {
        let before: u64 = self.counts.iter().sum();
        self.set.scan(bytes, 0, self.set.start, &mut self.counts);
        self.counts.iter().sum::<u64>() - before
    }

    /// Whether a header name holds an occurrence, in any ASCII case.
    pub fn name_matches(&self, name: &[u8]) -> bool {
        self.set.anycase.is_match(name)
    }

    /// Mask a header name in place: every occurrence, in any ASCII case
    /// (names arrive lower-cased), is masked and counted. Returns the
    /// number of pattern matches found.
    pub fn mask_name(&mut self, name: &mut [u8]) -> u64 {
        let mut spans = Vec::new();
        for m in self.set.anycase.find_overlapping_iter(&*name) {
            spans.push(m.range());
            for &secret in &self.set.counted_by[m.pattern().as_usize()] {
                self.counts[secret as usize] += 1;
            }
        }
        for span in &spans {
            name[span.clone()].fill(b'*');
        }
        spans.len() as u64
    }

    /// Occurrences masked so far (body, header values and trailers), per
    /// secret name, every name of the set in name order, zeros included.
    pub fn counts(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.set.names().zip(self.counts.iter().copied())
    }

    /// How many body bytes are held back, waiting for the next chunk.
    pub fn pending_len(&self) -> usize {
        self.held.len()
    }
}

impl fmt::Debug for Masker {
    /// Sizes and counts only: the held bytes may be a secret's beginning.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masker")
            .field("pending_len", &self.held.len())
            .field("counts", &self.counts().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Whether a match of `form` starts a new occurrence of its secret, whose
/// patterns are `own`: unless another of them is a proper prefix of it.
/// When patterns of one secret match at the same position they are prefixes
/// of one another, and exactly the shortest one has no other as its prefix,
/// so each position counts once, whichever forms start there.
fn counts_as_occurrence(form: &[u8], own: &[Pattern]) -> bool {
    !own.iter()
        .any(|other| other.len() < form.len() && form.starts_with(other))
}

/// The hold for every state of `nfa`: the length of the longest suffix of
/// the bytes read that is a proper prefix of some pattern.
///
/// Each state of an Aho-Corasick automaton stands for one prefix of a
/// pattern (the start state for the empty one): after reading any text it
/// is in the state of the longest suffix of the text that is a pattern
/// prefix. Reading a prefix of length d from the start state therefore
/// lands in that prefix's own state, which is how each state's depth d is
/// found here. If the prefix is a proper prefix of some pattern, the hold is
/// d. Otherwise the state is a whole pattern that is no prefix of a longer
/// one (a leaf), and its hold is that of its longest proper suffix that is
/// a pattern prefix: the state reached by reading the pattern without its
/// first byte. That state is shallower, so leaves are settled shortest
/// first.
fn hold_table(
    nfa: &contiguous::NFA,
    start: StateID,
    patterns: &[Pattern],
) -> Box<[(StateID, u32)]> {
    struct Node {
        depth: usize,
        /// A proper prefix of some pattern.
        proper: bool,
        hold: Option<usize>,
    }
    let walk = |bytes: &[u8]| {
        bytes
            .iter()
            .fold(start, |sid, &b| nfa.next_state(Anchored::No, sid, b))
    };
    let mut nodes = std::collections::BTreeMap::new();
    nodes.insert(
        start,
        Node {
            depth: 0,
            proper: true,
            hold: Some(0),
        },
    );
    let mut ends = Vec::with_capacity(patterns.len());
    for pattern in patterns {
        let mut sid = start;
        for (k, &b) in pattern.iter().enumerate() {
            sid = nfa.next_state(Anchored::No, sid, b);
            let depth = k + 1;
            let node = nodes.entry(sid).or_insert(Node {
                depth,
                proper: false,
                hold: None,
            });
            assert_eq!(node.depth, depth, "a pattern prefix has a state of its own");
            node.proper |= depth < pattern.len();
        }
        ends.push(sid);
    }
    for node in nodes.values_mut() {
        if node.proper {
            node.hold = Some(node.depth);
        }
    }
    let mut leaves: Vec<usize> = (0..patterns.len())
        .filter(|&p| !nodes[&ends[p]].proper)
        .collect();
    leaves.sort_unstable_by_key(|&p| patterns[p].len());
    for p in leaves {
        let fail = walk(&patterns[p][1..]);
        let hold = nodes[&fail]
            .hold
            .expect("a shorter suffix is settled before its leaf");
        nodes.get_mut(&ends[p]).expect("walked above").hold = Some(hold);
    }
    nodes
        .into_iter()
        .map(|(sid, node)| {
            let hold = node.hold.expect("every state is settled");
            (
                sid,
                u32::try_from(hold).expect("patterns are shorter than 4 GiB"),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `body` cut at `cuts` (sorted offsets) through
    /// [`Masker::push_bytes_from`] with pass-through from `min` bytes, each
    /// chunk through [`Masker::push`] instead where `copy` says so; checks
    /// on the way that no bytes are lost or invented, that the hold stays
    /// bounded, that a chunk comes out in at most two pieces, and that a
    /// chunk with no occurrence is passed on uncopied.
    fn stream_bytes(
        set: &Arc<MaskSet>,
        body: &[u8],
        cuts: &[usize],
        min: usize,
        copy: &[bool],
    ) -> (Vec<u8>, Vec<(String, u64)>) {
        let mut masker = Masker::new(set.clone());
        let mut out = Vec::new();
        let mut from = 0;
        for (n, &cut) in cuts.iter().chain([&body.len()]).enumerate() {
            let chunk = Bytes::copy_from_slice(&body[from..cut]);
            if copy.get(n).copied().unwrap_or(false) {
                masker.push(&chunk, &mut out);
            } else {
                let held = masker.held.len();
                let (mut end, mut state) = (0, masker.state);
                let clean = !set.run_to_match(&chunk, &mut end, &mut state);
                let mut pieces = Vec::new();
                masker.push_bytes_from(chunk.clone(), min, |p| pieces.push(p));
                assert!(pieces.len() <= 2 && pieces.iter().all(|p| !p.is_empty()));
                if clean && chunk.len() >= min.max(1) && chunk.len() > masker.held.len() {
                    // The last piece is the chunk's own memory.
                    let last = pieces.last().expect("a clean chunk longer than its hold");
                    assert_eq!(last.as_ptr(), chunk.as_ptr(), "a clean chunk was copied");
                    assert_eq!(pieces.len(), 1 + usize::from(held > 0));
                }
                for piece in pieces {
                    out.extend_from_slice(&piece);
                }
            }
            from = cut;
            assert!(masker.pending_len() < set.max_pattern_len().max(1));
            assert_eq!(
                out.len() + masker.pending_len(),
                cut,
                "bytes lost or invented"
            );
        }
        masker.finish(&mut out);
        let counts = masker.counts().map(|(n, c)| (n.to_owned(), c)).collect();
        (out, counts)
    }

    /// Values from a tiny alphabet (so occurrences overlap, and values are
    /// prefixes of one another) or token-like text; a body of filler with
    /// some of the values' forms planted in it.
    fn pass_through_case() -> impl proptest::strategy::Strategy<Value = (Vec<Vec<u8>>, Vec<u8>)> {
        use proptest::prelude::*;
        let value = prop_oneof![
            prop::collection::vec(prop::sample::select(b"ab*".to_vec()), 1..=6),
            "[A-Za-z0-9+/=_-]{1,24}".prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 1..=16),
        ];
        let filler = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..160),
            prop::collection::vec(prop::sample::select(b"ab*= %".to_vec()), 0..160),
        ];
        let plants = prop::collection::vec((any::<usize>(), any::<usize>(), any::<usize>()), 0..5);
        (prop::collection::vec(value, 1..=3), filler, plants).prop_map(
            |(values, mut body, plants)| {
                for (v, form, at) in plants {
                    let forms = forms(&values[v % values.len()]);
                    let form = &forms[form % forms.len()];
                    let at = at % (body.len() + 1);
                    body.splice(at..at, form.iter().copied());
                }
                (values, body)
            },
        )
    }

    fn named(values: &[Vec<u8>]) -> Vec<(&'static str, &[u8])> {
        // The third value shares the first one's name.
        values
            .iter()
            .zip(["A", "B", "A"])
            .map(|(v, n)| (n, v.as_slice()))
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// The pass-through path against the reference, cut in two at every
        /// split point, small chunks passed through too.
        #[test]
        fn pass_through_matches_the_reference_at_every_split(
            (values, body) in pass_through_case(),
        ) {
            let secrets = named(&values);
            let set = Arc::new(MaskSet::new(&secrets).unwrap());
            let (want, want_counts) = mask_reference(&body, &secrets);
            for split in 0..=body.len() {
                let (got, counts) = stream_bytes(&set, &body, &[split], 0, &[]);
                proptest::prop_assert!(got == want, "split at {}", split);
                proptest::prop_assert_eq!(&counts, &want_counts, "split at {}", split);
            }
        }

        /// Many chunks, 1-byte ones included, some copied by `push` between
        /// passed ones, some below the pass-through minimum.
        #[test]
        fn pass_through_matches_the_reference_in_many_chunks(
            (values, body) in pass_through_case(),
            sizes in proptest::collection::vec(0usize..40, 1..50),
            copy in proptest::collection::vec(proptest::prelude::any::<bool>(), 0..50),
            min in 0usize..8,
        ) {
            let secrets = named(&values);
            let set = Arc::new(MaskSet::new(&secrets).unwrap());
            let (want, want_counts) = mask_reference(&body, &secrets);
            let mut cuts = Vec::new();
            let mut at = 0;
            for size in sizes.iter().cycle().take(body.len() + 1) {
                at = (at + size).min(body.len());
                cuts.push(at);
            }
            let (got, counts) = stream_bytes(&set, &body, &cuts, min, &copy);
            proptest::prop_assert!(got == want);
            proptest::prop_assert_eq!(&counts, &want_counts);
            let every_byte: Vec<usize> = (0..body.len()).collect();
            let (got, counts) = stream_bytes(&set, &body, &every_byte, 0, &[]);
            proptest::prop_assert!(got == want);
            proptest::prop_assert_eq!(&counts, &want_counts);
        }
    }

    #[test]
    fn clean_chunks_pass_uncopied_and_held_bytes_go_first() {
        let set = Arc::new(MaskSet::new(&[("K", b"secret-value")]).unwrap());
        let mut masker = Masker::new(set);
        let mut pieces = Vec::new();
        // Ends with "sec": held back, the rest passed on as it is.
        let first = Bytes::from(vec![b'x'; 2000]).slice(..);
        let first = [&first[..], b"sec"].concat();
        let first = Bytes::from(first);
        masker.push_bytes(first.clone(), |p| pieces.push(p));
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].as_ptr(), first.as_ptr());
        assert_eq!(pieces[0].len(), 2000);
        assert_eq!(masker.pending_len(), 3);
        // Not the value after all: "sec" goes first, then the new chunk.
        let second = Bytes::from(vec![b'y'; 2000]);
        pieces.clear();
        masker.push_bytes(second.clone(), |p| pieces.push(p));
        assert_eq!(pieces.len(), 2);
        assert_eq!(&pieces[0][..], b"sec");
        assert_eq!(pieces[1].as_ptr(), second.as_ptr());
        assert_eq!(masker.pending_len(), 0);
        // The value, across a cut: masked in one copied piece.
        pieces.clear();
        let mut third = vec![b'z'; 1500];
        third.extend_from_slice(b"secret-");
        masker.push_bytes(Bytes::from(third), |p| pieces.push(p));
        let mut fourth = b"value".to_vec();
        fourth.extend_from_slice(&[b'z'; 1500]);
        masker.push_bytes(Bytes::from(fourth), |p| pieces.push(p));
        let mut out: Vec<u8> = pieces.concat();
        masker.finish(&mut out);
        let mut want = vec![b'z'; 1500];
        want.extend_from_slice(b"************");
        want.extend_from_slice(&[b'z'; 1500]);
        assert_eq!(out, want);
        assert_eq!(masker.counts().collect::<Vec<_>>(), [("K", 1)]);
    }

    #[test]
    fn sets_are_shared_and_maskers_move_between_threads() {
        fn shared<T: Send + Sync>() {}
        fn sent<T: Send>() {}
        shared::<MaskSet>();
        sent::<Masker>();
    }

    #[test]
    fn holds_are_the_longest_pending_proper_prefix() {
        let patterns: Vec<Pattern> = ["abcd", "bcx", "cd", "xab"]
            .iter()
            .map(|p| Zeroizing::new(p.as_bytes().to_vec()))
            .collect();
        let nfa = contiguous::NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(patterns.iter().map(|p| p.as_slice()))
            .unwrap();
        let start = nfa.start_state(Anchored::No).unwrap();
        let holds = hold_table(&nfa, start, &patterns);
        let hold = |text: &[u8]| {
            let sid = text
                .iter()
                .fold(start, |s, &b| nfa.next_state(Anchored::No, s, b));
            holds[holds.binary_search_by_key(&sid, |&(s, _)| s).unwrap()].1
        };
        assert_eq!(hold(b""), 0);
        assert_eq!(hold(b"zz"), 0);
        assert_eq!(hold(b"zab"), 2); // "ab" may become "abcd"
        assert_eq!(hold(b"abc"), 3);
        assert_eq!(hold(b"abcd"), 0); // a leaf; "bcd", "cd", "d" begin nothing longer
        assert_eq!(hold(b"zbcx"), 1); // a leaf, but "x" may become "xab"
    }
}
