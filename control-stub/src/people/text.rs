//! A card is an attacker's text: what a session sends (a path, a method,
//! an agent's tool name) and what a gateway relays reach a person's phone,
//! and a person decides on what they read. So every field a page shows
//! goes through [`show`] first, and the page renders the result as text
//! (`textContent`, elements it makes itself), never as markup.
//!
//! [`show`] splits a text into pieces: runs of plain printable ASCII,
//! shown as they are, and **marks**, one per character a reader could not
//! see, or could mistake for another:
//!
//! | class | characters | shown as |
//! |---|---|---|
//! | `control` | C0 and C1 controls, DEL | a badge `[U+001B]` instead of the character |
//! | `bidi` | LRM, RLM, ALM, the embeddings, overrides and isolates (U+202A–202E, U+2066–2069) | a badge instead of the character: it would reorder what follows |
//! | `invisible` | zero-width and other format characters (U+200B–200D, U+2060–2064, U+FEFF, soft hyphen, variation selectors, tags, …), every space but U+0020, Hangul fillers, private-use characters | a badge instead of the character |
//! | `combining` | combining marks (U+0300–036F, …) | a badge instead of the character: it would change the one before it |
//! | `non_ascii` | every other character beyond ASCII: a letter that may look like an ASCII one (Cyrillic `а`, Greek `ο`, mathematical `𝐚`, …), a symbol | the character, then its badge |
//!
//! The text a page shows is then [`Shown::escaped`]: the pieces joined,
//! each mark as its badge (`deploy[U+202E]exe`, `p[U+0430]ypal`), which
//! the browser tests compare with the DOM's text. And each field carries
//! [`Warning`]s the card lists above its buttons: a direction-changing
//! character, an invisible one, a control, a non-ASCII character, letters
//! of several scripts in one field (`mixed_scripts`, e.g. Latin and
//! Cyrillic).
//!
//! The tables are ranges of code points, not the Unicode database: the
//! classes above need only these, and anything beyond ASCII is marked
//! whatever it is, so a character the tables miss is still never shown
//! unmarked.

use serde::Serialize;

/// What a marked character is (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkClass {
    Control,
    Bidi,
    Invisible,
    Combining,
    NonAscii,
}

/// One piece of a shown text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Piece {
    /// Printable ASCII, shown as is.
    Text { s: String },
    /// One character made visible: its code point as `U+XXXX`, its class,
    /// and the character itself when it is shown beside its badge
    /// (`non_ascii` only).
    Mark {
        cp: String,
        class: MarkClass,
        #[serde(skip_serializing_if = "Option::is_none")]
        ch: Option<String>,
    },
}

/// Why a field deserves a second look.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "w", rename_all = "snake_case")]
pub enum Warning {
    /// A direction-changing character: what follows it may be shown in
    /// another order than it is.
    Bidi { cp: String },
    /// A character that shows as nothing (or as a space).
    Invisible { cp: String },
    /// A control character.
    Control { cp: String },
    /// A combining mark.
    Combining { cp: String },
    /// A character beyond ASCII: it may look like an ASCII one.
    NonAscii { cp: String },
    /// Letters of several scripts in one field.
    MixedScripts { scripts: Vec<&'static str> },
}

impl Warning {
    /// A sentence for people.
    pub fn describe(&self) -> String {
        match self {
            Warning::Bidi { cp } => format!(
                "a direction-changing character ({cp}): text after it may be shown in another order than it is"
            ),
            Warning::Invisible { cp } => format!("an invisible character ({cp})"),
            Warning::Control { cp } => format!("a control character ({cp})"),
            Warning::Combining { cp } => format!("a combining mark ({cp}) that changes the character before it"),
            Warning::NonAscii { cp } => format!(
                "a character beyond ASCII ({cp}) that may look like another"
            ),
            Warning::MixedScripts { scripts } => {
                format!("letters of several scripts ({})", scripts.join(", "))
            }
        }
    }
}

/// A text made safe to show.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shown {
    pub pieces: Vec<Piece>,
    /// The pieces as one string, each mark as its badge: what the page's
    /// element holds as text.
    pub escaped: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
}

impl Shown {
    /// Whether anything was marked.
    pub fn is_plain(&self) -> bool {
        self.warnings.is_empty()
    }
}

/// `U+XXXX` (at least four hex digits).
pub fn code_point(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// The badge a page shows for a mark.
pub fn badge(c: char) -> String {
    format!("[{}]", code_point(c))
}

/// Split `text` into pieces and warnings (see the module docs).
pub fn show(text: &str) -> Shown {
    let mut pieces = Vec::new();
    let mut escaped = String::with_capacity(text.len());
    let mut warnings = Vec::new();
    let mut run = String::new();
    let mut scripts: Vec<&'static str> = Vec::new();
    for c in text.chars() {
        let class = classify(c);
        // Letters only: a format or combining character has no script.
        if matches!(class, None | Some(MarkClass::NonAscii)) {
            if let Some(s) = script(c) {
                if !scripts.contains(&s) {
                    scripts.push(s);
                }
            }
        }
        let Some(class) = class else {
            run.push(c);
            escaped.push(c);
            continue;
        };
        if !run.is_empty() {
            pieces.push(Piece::Text {
                s: std::mem::take(&mut run),
            });
        }
        let cp = code_point(c);
        let shown_char = (class == MarkClass::NonAscii).then(|| c.to_string());
        if let Some(ch) = &shown_char {
            escaped.push_str(ch);
        }
        escaped.push_str(&badge(c));
        let warning = match class {
            MarkClass::Control => Warning::Control { cp: cp.clone() },
            MarkClass::Bidi => Warning::Bidi { cp: cp.clone() },
            MarkClass::Invisible => Warning::Invisible { cp: cp.clone() },
            MarkClass::Combining => Warning::Combining { cp: cp.clone() },
            MarkClass::NonAscii => Warning::NonAscii { cp: cp.clone() },
        };
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
        pieces.push(Piece::Mark {
            cp,
            class,
            ch: shown_char,
        });
    }
    if !run.is_empty() {
        pieces.push(Piece::Text { s: run });
    }
    if scripts.len() > 1 {
        warnings.push(Warning::MixedScripts { scripts });
    }
    Shown {
        pieces,
        escaped,
        warnings,
    }
}

/// The class of a character that must be marked; `None` for printable
/// ASCII (U+0020-U+007E).
pub fn classify(c: char) -> Option<MarkClass> {
    let n = u32::from(c);
    Some(match n {
        0x20..=0x7e => return None,
        0x00..=0x1f | 0x7f..=0x9f => MarkClass::Control,
        0x061c | 0x200e | 0x200f | 0x202a..=0x202e | 0x2066..=0x2069 => MarkClass::Bidi,
        0x00a0
        | 0x00ad
        | 0x034f
        | 0x115f
        | 0x1160
        | 0x1680
        | 0x17b4
        | 0x17b5
        | 0x180b..=0x180f
        | 0x2000..=0x200d
        | 0x2028
        | 0x2029
        | 0x202f
        | 0x205f..=0x2065
        | 0x206a..=0x206f
        | 0x2800
        | 0x3000
        | 0x3164
        | 0xfe00..=0xfe0f
        | 0xfeff
        | 0xffa0
        | 0xfff0..=0xfffb
        | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a
        | 0xe0000..=0xe0fff
        | 0xe000..=0xf8ff
        | 0xf0000..=0x10ffff => MarkClass::Invisible,
        0x0300..=0x036f
        | 0x0483..=0x0489
        | 0x0591..=0x05bd
        | 0x0610..=0x061a
        | 0x064b..=0x065f
        | 0x1ab0..=0x1aff
        | 0x1dc0..=0x1dff
        | 0x20d0..=0x20ff
        | 0xfe20..=0xfe2f => MarkClass::Combining,
        _ => MarkClass::NonAscii,
    })
}

/// The script of a letter, for the mixed-script warning; `None` for
/// what belongs to no script (digits, punctuation, symbols, marks).
fn script(c: char) -> Option<&'static str> {
    let n = u32::from(c);
    Some(match n {
        0x41..=0x5a | 0x61..=0x7a => "Latin",
        0x00c0..=0x00d6
        | 0x00d8..=0x00f6
        | 0x00f8..=0x024f
        | 0x1e00..=0x1eff
        | 0x2c60..=0x2c7f
        | 0xa720..=0xa7ff
        | 0xff21..=0xff3a
        | 0xff41..=0xff5a => "Latin",
        0x0370..=0x03ff | 0x1f00..=0x1fff => "Greek",
        0x0400..=0x052f | 0x1c80..=0x1c8f | 0x2de0..=0x2dff | 0xa640..=0xa69f => "Cyrillic",
        0x0530..=0x058f => "Armenian",
        0x0590..=0x05ff => "Hebrew",
        0x0600..=0x06ff | 0x0750..=0x077f | 0x08a0..=0x08ff | 0xfb50..=0xfdff | 0xfe70..=0xfefe => {
            "Arabic"
        }
        0x0900..=0x097f => "Devanagari",
        0x0e00..=0x0e7f => "Thai",
        0x10a0..=0x10ff => "Georgian",
        0x13a0..=0x13ff | 0xab70..=0xabbf => "Cherokee",
        0x1100..=0x11ff | 0xac00..=0xd7af => "Hangul",
        0x3040..=0x30ff => "Kana",
        0x3400..=0x4dbf | 0x4e00..=0x9fff => "Han",
        0x1d400..=0x1d7ff => "Mathematical",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! shown {
        ($($name:ident: $text:expr => $escaped:expr, [$($w:expr),*];)*) => {$(
            #[test]
            fn $name() {
                let s = show($text);
                assert_eq!(s.escaped, $escaped);
                let warnings: Vec<String> = s.warnings.iter().map(|w| format!("{w:?}")).collect();
                let want: Vec<&str> = vec![$($w),*];
                assert_eq!(warnings, want);
                // Joining the pieces back (the character itself for a
                // mark) gives the text: nothing is dropped or invented.
                let back: String = s.pieces.iter().map(|p| match p {
                    Piece::Text { s } => s.clone(),
                    Piece::Mark { cp, .. } => char::from_u32(u32::from_str_radix(&cp[2..], 16).unwrap()).unwrap().to_string(),
                }).collect();
                assert_eq!(back, $text);
            }
        )*};
    }

    shown! {
        plain_ascii_is_itself: "POST /deploy/prod" => "POST /deploy/prod", [];
        markup_is_text_not_a_mark: "<img src=x onerror=alert(1)>" => "<img src=x onerror=alert(1)>", [];
        an_override_is_a_badge: "deploy\u{202E}exe.sh" => "deploy[U+202E]exe.sh", [r#"Bidi { cp: "U+202E" }"#];
        isolates_and_marks_too: "a\u{2066}b\u{200F}c\u{061C}" => "a[U+2066]b[U+200F]c[U+061C]",
            [r#"Bidi { cp: "U+2066" }"#, r#"Bidi { cp: "U+200F" }"#, r#"Bidi { cp: "U+061C" }"#];
        zero_width_is_a_badge: "de\u{200B}ploy" => "de[U+200B]ploy", [r#"Invisible { cp: "U+200B" }"#];
        a_bom_and_a_tag: "\u{FEFF}x\u{E0041}" => "[U+FEFF]x[U+E0041]",
            [r#"Invisible { cp: "U+FEFF" }"#, r#"Invisible { cp: "U+E0041" }"#];
        other_spaces_are_invisible: "a\u{00A0}b\u{3000}c" => "a[U+00A0]b[U+3000]c",
            [r#"Invisible { cp: "U+00A0" }"#, r#"Invisible { cp: "U+3000" }"#];
        controls: "a\u{1b}[31mb\u{7f}\u{85}" => "a[U+001B][31mb[U+007F][U+0085]",
            [r#"Control { cp: "U+001B" }"#, r#"Control { cp: "U+007F" }"#, r#"Control { cp: "U+0085" }"#];
        a_cyrillic_look_alike_shows_with_its_badge: "p\u{0430}ypal.com" => "p\u{0430}[U+0430]ypal.com",
            [r#"NonAscii { cp: "U+0430" }"#, r#"MixedScripts { scripts: ["Latin", "Cyrillic"] }"#];
        all_cyrillic_is_not_mixed: "\u{0430}\u{0440}\u{0435}" => "\u{0430}[U+0430]\u{0440}[U+0440]\u{0435}[U+0435]",
            [r#"NonAscii { cp: "U+0430" }"#, r#"NonAscii { cp: "U+0440" }"#, r#"NonAscii { cp: "U+0435" }"#];
        mathematical_letters: "\u{1D41A}pi" => "\u{1D41A}[U+1D41A]pi",
            [r#"NonAscii { cp: "U+1D41A" }"#, r#"MixedScripts { scripts: ["Mathematical", "Latin"] }"#];
        a_combining_mark_is_a_badge_alone: "e\u{0301}" => "e[U+0301]", [r#"Combining { cp: "U+0301" }"#];
        a_warning_once_per_character: "\u{202E}\u{202E}" => "[U+202E][U+202E]", [r#"Bidi { cp: "U+202E" }"#];
    }

    #[test]
    fn every_character_beyond_ascii_is_marked() {
        for n in (0u32..0x11_0000).step_by(7) {
            let Some(c) = char::from_u32(n) else { continue };
            let marked = classify(c).is_some();
            assert_eq!(marked, !(0x20..=0x7e).contains(&n), "{}", code_point(c));
        }
    }
}
