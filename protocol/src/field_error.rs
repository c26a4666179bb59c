//! The one error type of everything weir parses from JSON — the plugin configuration and
//! the bridge's requests: where (a JSON path) and what.

use std::fmt;

/// A document weir refuses (a configuration, a bridge request), with the JSON path of
/// the offending field (`rules[0].limit.period`, `items[2].cost`; empty when the whole
/// document is at fault, e.g. invalid JSON) and a message that quotes the offending value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A serde error with the path `serde_path_to_error` tracked. Data errors (unknown
    /// field, wrong type, missing field) lose `serde_json`'s " at line L column C": the
    /// path already says where, and a message must not depend on the document's
    /// formatting. Syntax errors have no path, so they keep the position.
    pub fn from_serde(err: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = json_path(err.path());
        Self::from_json(path, &err.into_inner())
    }

    /// A `serde_json` error found at `path`.
    pub fn from_json(path: String, inner: &serde_json::Error) -> Self {
        let message = strip_position(inner);
        match inner.classify() {
            serde_json::error::Category::Data => FieldError::new(path, message),
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                FieldError::new(
                    "",
                    format!(
                        "invalid JSON at line {} column {}: {message}",
                        inner.line(),
                        inner.column()
                    ),
                )
            }
            serde_json::error::Category::Io => {
                FieldError::new("", format!("cannot read JSON: {message}"))
            }
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for FieldError {}

/// `rules[0].limit.period`; empty for the document itself (where the crate prints ".").
pub fn json_path(path: &serde_path_to_error::Path) -> String {
    if path.iter().len() == 0 {
        String::new()
    } else {
        path.to_string()
    }
}

pub fn strip_position(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    match full.strip_suffix(&suffix) {
        Some(message) => message.to_string(),
        None => full,
    }
}

/// Longest value (in characters) quoted in full; longer ones are cut with "…" so that a
/// huge value cannot flood the log line that reports it.
const QUOTE_MAX_CHARS: usize = 128;

/// `text` as a JSON string literal, as the user wrote it in the config.
pub fn quoted(text: &str) -> String {
    let cut = match text.char_indices().nth(QUOTE_MAX_CHARS) {
        Some((at, _)) => text.get(..at).unwrap_or(text),
        None => text,
    };
    let literal = serde_json::to_string(cut).unwrap_or_else(|_| format!("{cut:?}"));
    if cut.len() < text.len() {
        format!("{literal}…")
    } else {
        literal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn display_omits_an_empty_path() {
        assert_eq!(FieldError::new("", "m").to_string(), "m");
        assert_eq!(FieldError::new("rules[0]", "m").to_string(), "rules[0]: m");
    }

    #[test]
    fn quoting_is_json_and_bounded() {
        assert_eq!(quoted("a\"b\n"), r#""a\"b\n""#);
        let long = "x".repeat(200);
        assert_eq!(quoted(&long), format!("\"{}\"…", "x".repeat(128)));
    }
}
