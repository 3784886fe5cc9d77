//! Quoting of SQL identifiers (schema and table names), shared by the
//! database stores. Identifiers are always quoted, never spliced raw.

use std::fmt;

/// Longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`), in bytes.
pub const MAX_POSTGRES_IDENT: usize = 63;
/// Longest identifier MySQL and MariaDB accept, in characters.
pub const MAX_MYSQL_IDENT: usize = 64;

/// An identifier that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentError {
    what: &'static str,
    reason: String,
}

impl fmt::Display for IdentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} name: {}", self.what, self.reason)
    }
}

impl std::error::Error for IdentError {}

fn check(what: &'static str, ident: &str, max: usize, len: usize) -> Result<(), IdentError> {
    if ident.is_empty() {
        return Err(IdentError { what, reason: "must not be empty".into() });
    }
    if len > max {
        return Err(IdentError { what, reason: format!("is {len} long, more than the limit of {max}") });
    }
    if ident.contains('\0') {
        return Err(IdentError { what, reason: "holds a NUL character".into() });
    }
    Ok(())
}

/// Quotes `ident` for PostgreSQL: wrapped in `"`, with `"` doubled. `what`
/// names it in errors (`"schema"`, `"table"`).
///
/// # Errors
///
/// Empty, longer than [`MAX_POSTGRES_IDENT`] bytes, or holding NUL.
///
/// # Examples
///
/// ```
/// use leaderelection::ident::quote_postgres;
/// assert_eq!(quote_postgres("table", "leader_election").unwrap(), r#""leader_election""#);
/// assert_eq!(quote_postgres("table", r#"a"; DROP TABLE x; --"#).unwrap(), r#""a""; DROP TABLE x; --""#);
/// assert!(quote_postgres("table", "").is_err());
/// ```
pub fn quote_postgres(what: &'static str, ident: &str) -> Result<String, IdentError> {
    check(what, ident, MAX_POSTGRES_IDENT, ident.len())?;
    Ok(format!("\"{}\"", ident.replace('"', "\"\"")))
}

/// Quotes `ident` for MySQL and MariaDB: wrapped in backticks, with backticks
/// doubled.
///
/// # Errors
///
/// Empty, longer than [`MAX_MYSQL_IDENT`] characters, holding NUL, ending
/// in a space (which MySQL refuses), or holding a character outside the
/// Basic Multilingual Plane (above U+FFFF, such as most emoji), which
/// MySQL and MariaDB identifiers cannot hold: the server would refuse the
/// name at the first statement, not here.
pub fn quote_mysql(what: &'static str, ident: &str) -> Result<String, IdentError> {
    check(what, ident, MAX_MYSQL_IDENT, ident.chars().count())?;
    if ident.ends_with(' ') {
        return Err(IdentError { what, reason: "must not end with a space".into() });
    }
    if let Some(c) = ident.chars().find(|&c| u32::from(c) > 0xFFFF) {
        return Err(IdentError {
            what,
            reason: format!(
                "holds {c:?} (U+{:X}), outside the Basic Multilingual Plane, which MySQL names cannot hold",
                u32::from(c)
            ),
        });
    }
    Ok(format!("`{}`", ident.replace('`', "``")))
}

/// Writes `value` as a PostgreSQL string literal, `E'…'` with `'` doubled
/// and `\` doubled, which the server reads back as `value` whatever
/// `standard_conforming_strings` says. For statements sent with the
/// simple-query protocol, which has no parameters. `what` names the value in
/// errors.
///
/// # Errors
///
/// `value` holds NUL, which PostgreSQL text cannot store.
///
/// # Examples
///
/// ```
/// use leaderelection::ident::quote_postgres_literal;
/// assert_eq!(quote_postgres_literal("identity", r"it's a\b").unwrap(), r"E'it''s a\\b'");
/// ```
pub fn quote_postgres_literal(what: &'static str, value: &str) -> Result<String, IdentError> {
    if value.contains('\0') {
        return Err(IdentError { what, reason: "holds a NUL character, which PostgreSQL text cannot store".into() });
    }
    let mut out = String::with_capacity(value.len() + 4);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    Ok(out)
}

/// Reads an `E'…'` literal the way the server does, for the escapes
/// [`quote_postgres_literal`] writes (`''`, `\\`, `\'`); any other escape,
/// or a quote that would end the literal before the end of the input, gives
/// `None`. Used by the fuzz targets to show no value can break out.
pub fn unquote_postgres_literal(quoted: &str) -> Option<String> {
    let inner = quoted.strip_prefix("E'")?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => match chars.next() {
                Some('\'') => out.push('\''),
                None => return Some(out), // the closing quote, at the very end
                Some(_) => return None,   // the literal ended early
            },
            '\\' => match chars.next() {
                Some(e @ ('\\' | '\'')) => out.push(e),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None // never closed
}

/// Reverses [`quote_postgres`] for a well-formed quoted identifier: what the
/// server would read back. Used by the fuzz targets to check round trips.
pub fn unquote_postgres(quoted: &str) -> Option<String> {
    unquote(quoted, '"')
}

/// Reverses [`quote_mysql`], as [`unquote_postgres`] does.
pub fn unquote_mysql(quoted: &str) -> Option<String> {
    unquote(quoted, '`')
}

/// Reads one quoted identifier that must span the whole input.
fn unquote(quoted: &str, q: char) -> Option<String> {
    let inner = quoted.strip_prefix(q)?.strip_suffix(q)?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == q && chars.next() != Some(q) {
            return None; // a lone quote would end the identifier early
        }
        out.push(c);
    }
    Some(out)
}

/// A URL part with its `%XX` escapes decoded, for both stores' URL
/// readers: total (a `%` not followed by two hex digits stays as it is;
/// bytes that are not UTF-8 become U+FFFD), so a malformed part is
/// refused by whoever reads it next, never by a panic here.
#[cfg(any(feature = "postgres", feature = "mysql", test))]
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_names_outside_the_basic_multilingual_plane_are_refused() {
        let e = quote_mysql("table", "jobs_\u{1F600}").unwrap_err();
        assert!(e.to_string().contains("U+1F600") && e.to_string().contains("Basic Multilingual Plane"), "{e}");
        assert!(quote_mysql("table", "\u{10000}").is_err());
        assert!(quote_mysql("table", "jobs_\u{FFFF}_\u{4E2D}").is_ok(), "the plane itself is fine");
        assert!(quote_postgres("table", "jobs_\u{1F600}").is_ok(), "PostgreSQL takes them");
    }

    #[test]
    fn round_trips_hostile_names() {
        for name in ["plain", "with space", "a\"b", "\"", "\"\"\"", "x`y", "Ünïcode", "semi;colon --"] {
            assert_eq!(unquote_postgres(&quote_postgres("t", name).unwrap()).as_deref(), Some(name));
            assert_eq!(unquote_mysql(&quote_mysql("t", name).unwrap()).as_deref(), Some(name));
        }
    }

    #[test]
    fn refuses_what_the_server_would() {
        assert!(quote_postgres("t", &"a".repeat(64)).is_err());
        assert!(quote_postgres("t", &"a".repeat(63)).is_ok());
        assert!(quote_postgres("t", "a\0").is_err());
        assert!(quote_mysql("t", "trailing ").is_err());
        assert!(quote_mysql("t", &"é".repeat(64)).is_ok());
        assert_eq!(quote_mysql("schema", "").unwrap_err().to_string(), "invalid schema name: must not be empty");
    }

    #[test]
    fn literals_round_trip_and_cannot_break_out() {
        for value in ["", "plain", "it's", "\\", "\\'", "'; DROP TABLE t; --", "a''b", "é✓"] {
            let q = quote_postgres_literal("v", value).unwrap();
            assert_eq!(unquote_postgres_literal(&q).as_deref(), Some(value), "{q}");
        }
        assert!(quote_postgres_literal("identity", "a\0b").unwrap_err().to_string().contains("NUL"));
        assert_eq!(unquote_postgres_literal("E'a'b'"), None, "a quote that ends the literal early");
        assert_eq!(unquote_postgres_literal("E'a\\n'"), None, "an escape the quoter never writes");
        assert_eq!(unquote_postgres_literal("E'open"), None);
    }

    #[test]
    fn unquote_rejects_unbalanced_input() {
        assert_eq!(unquote_postgres(r#""a"b""#), None);
        assert_eq!(unquote_postgres("a"), None);
        assert_eq!(unquote_postgres(r#""""#).as_deref(), Some(""));
    }

    #[test]
    fn percent_decoding_is_total() {
        assert_eq!(percent_decode("a%2Fb%"), "a/b%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%C3%A9"), "é");
        assert_eq!(percent_decode("%41"), "A", "an escape that ends the text");
    }
}
