//! A config that failed to load, and how it reads: the file, the line and
//! the field, then why.

use std::path::{Path, PathBuf};

/// A config that failed to load, naming where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syntax or type errors, on one line: the line (and column) the TOML
    /// library points at, the field that line sets (or the table it
    /// opens) when it sets one, and the library's message.
    #[error("{}", parse_text(path, *line, *column, field.as_deref(), message))]
    Parse {
        path: PathBuf,
        /// 1-based; none when the library points nowhere.
        line: Option<usize>,
        column: usize,
        field: Option<String>,
        message: String,
    },
    /// A value that parsed but breaks a rule of its own.
    #[error("{path}:{line}: {field}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        field: String,
        message: String,
    },
}

/// [`ConfigError::Parse`]'s text: `FILE:LINE: FIELD: MESSAGE (column C)`.
pub(super) fn parse_text(
    path: &Path,
    line: Option<usize>,
    column: usize,
    field: Option<&str>,
    message: &str,
) -> String {
    let field = field.map(|f| format!("{f}: ")).unwrap_or_default();
    match line {
        Some(line) => format!(
            "{}:{line}: {field}{message} (column {column})",
            path.display()
        ),
        None => format!("{}: {field}{message}", path.display()),
    }
}
