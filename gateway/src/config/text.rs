//! Where in the file's text a field is: its line, the table a line is
//! in, and TOML's own errors as one line naming the file, the line and the
//! field. For what carries no span of its own (a table left out, a field
//! left to its default); values that are set carry theirs.

use std::collections::HashMap;
use std::path::Path;

use super::error::ConfigError;

/// 1-based line number of byte offset `at` in `text`.
pub(super) fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A table header line's name and whether it opens an element of an
/// array of tables (`[[session]]`); `None` for any other line.
pub(super) fn table_header(line: &str) -> Option<(&str, bool)> {
    let t = line.trim();
    let array = t.starts_with("[[");
    let name = t.strip_prefix('[')?.trim_start_matches('[');
    let name = name.split(']').next().unwrap_or(name);
    Some((name.trim(), array))
}

/// Span of the line that sets the dotted `field` (`control.listen`: key
/// `listen` under the `[control]` table; a bare key: before any table), or
/// of its table's header when the key is not set there; the start of the
/// file when neither is.
pub(super) fn find_field(text: &str, field: &str) -> std::ops::Range<usize> {
    if let Some(line) = find_set(text, field) {
        return line;
    }
    let table = field.rsplit_once('.').map_or("", |(t, _)| t);
    if table.is_empty() {
        return 0..0;
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if table_header(line).is_some_and(|(name, _)| name == table) {
            return offset..offset + line.len();
        }
        offset += line.len();
    }
    0..0
}

/// Span of the line that sets the dotted `field`, if one does.
pub(super) fn find_set(text: &str, field: &str) -> Option<std::ops::Range<usize>> {
    let (table, key) = field.rsplit_once('.').unwrap_or(("", field));
    let mut offset = 0;
    let mut current = "";
    for line in text.split_inclusive('\n') {
        if let Some((name, _)) = table_header(line) {
            current = name;
        } else if current == table {
            if let Some(rest) = line.trim().strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return Some(offset..offset + line.len());
                }
            }
        }
        offset += line.len();
    }
    None
}

/// The field the line holding byte `at` is about: `table.key` for a line
/// that sets a key (`session[1].sources`: elements of an array of tables
/// are numbered), the table for its header line or for another line in
/// it (a multi-line value's), none for such a line outside any table.
pub(super) fn field_at(text: &str, at: usize) -> Option<String> {
    let mut offset = 0;
    let mut table = String::new();
    let mut elements: HashMap<&str, usize> = HashMap::new();
    for line in text.split_inclusive('\n') {
        let header = table_header(line);
        if let Some((name, array)) = header {
            table = if array {
                let n = elements.entry(name).or_insert(0);
                *n += 1;
                format!("{name}[{}]", *n - 1)
            } else {
                name.to_owned()
            };
        }
        offset += line.len();
        if at >= offset {
            continue;
        }
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim())
            .filter(|k| header.is_none() && !k.is_empty() && !k.starts_with('#'));
        return match (key, table.is_empty()) {
            (Some(key), true) => Some(key.to_owned()),
            (Some(key), false) => Some(format!("{table}.{key}")),
            (None, true) => None,
            (None, false) => Some(table),
        };
    }
    None
}

/// A TOML error as one line: where it points, the field there, the
/// library's message.
pub(super) fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end().replace('\n', " ");
    let Some(span) = e.span() else {
        return ConfigError::Parse {
            path: path.to_owned(),
            line: None,
            column: 0,
            field: None,
            message,
        };
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    // An empty span at the very start is about the whole document (a
    // missing top-level field): no line of it is at fault.
    // (An error at the end of the file is about its last line.)
    let field = if span.start == 0 && span.is_empty() {
        None
    } else {
        field_at(text, at.min(text.len().saturating_sub(1)))
    };
    ConfigError::Parse {
        path: path.to_owned(),
        line: Some(line_of(text, at)),
        column: text[line_start..at].chars().count() + 1,
        field,
        message,
    }
}
