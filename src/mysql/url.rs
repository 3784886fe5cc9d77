//! Connection URLs: the parameters this store reads itself (TLS mode, CA
//! file), the ones it refuses, and the rest handed to the `mysql` crate.

use std::path::PathBuf;
use std::time::Duration;

use crate::ident::percent_decode;
use crate::store::StoreError;

/// What the URL asks of TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// No parameter, or `ssl-mode=DISABLED`: plaintext.
    Disabled,
    /// `REQUIRED`, `VERIFY_CA` or `VERIFY_IDENTITY`: TLS with the
    /// certificate chain and the host name verified, or no connection.
    Verify,
}

/// A URL split into what the crate parses and what this store keeps.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The URL without this store's parameters, for `mysql::Opts::from_url`.
    pub crate_url: String,
    pub tls: TlsMode,
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
}

fn bad(reason: impl std::fmt::Display) -> StoreError {
    StoreError::fatal(format!("invalid MySQL connection URL: {reason}"))
}

/// Splits `url`. Errors never repeat the URL, so they cannot leak its
/// password.
pub(crate) fn parse(url: &str) -> Result<Parsed, StoreError> {
    if !url.starts_with("mysql://") {
        return Err(bad("it must start with mysql://"));
    }
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut tls = None;
    let mut ca_file = None;
    let mut connect_timeout = None;
    let mut socket = false;
    let mut keep = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(v);
        match k {
            "ssl-mode" | "ssl_mode" | "sslmode" => {
                tls = Some(match value.to_ascii_uppercase().replace('-', "_").as_str() {
                    "DISABLED" | "DISABLE" => TlsMode::Disabled,
                    "REQUIRED" | "REQUIRE" | "VERIFY_CA" | "VERIFY_IDENTITY" => TlsMode::Verify,
                    "PREFERRED" | "PREFER" => {
                        return Err(bad("ssl-mode=PREFERRED would fall back to plaintext without a word; \
                             say REQUIRED (verified TLS) or DISABLED"))
                    }
                    other => return Err(bad(format!("unknown ssl-mode {other:?}"))),
                })
            }
            // Ours and the crate's spelling of the CA file: either asks for TLS.
            "ssl-ca" | "ssl_ca" | "sslrootcert" | "root_cert_path" => ca_file = Some(PathBuf::from(value)),
            "tcp_connect_timeout_ms" => {
                let ms: u64 = value.parse().map_err(|_| bad("tcp_connect_timeout_ms must be a number"))?;
                connect_timeout = Some(Duration::from_millis(ms));
            }
            "danger_accept_invalid_certs" | "danger_skip_domain_validation" => {
                return Err(bad(format!("{k} is refused: it turns certificate verification off")))
            }
            "prefer_socket" => {
                return Err(bad("prefer_socket is refused: a TCP URL always uses TCP (name a socket with socket=PATH)"))
            }
            "pool_min" | "pool_max" | "reset_connection" | "check_health" => {
                return Err(bad(format!(
                    "{k} configures the mysql crate's pool, which this store does not use; \
                     use MySqlStore::builder(url).pool_size(n)"
                )))
            }
            "socket" => {
                socket = true;
                keep.push(pair.to_owned());
            }
            _ => keep.push(pair.to_owned()),
        }
    }
    let tls = match (tls, &ca_file) {
        (Some(TlsMode::Disabled), Some(_)) => return Err(bad("ssl-mode=DISABLED with a CA file")),
        (Some(t), _) => t,
        (None, Some(_)) => TlsMode::Verify,
        (None, None) => TlsMode::Disabled,
    };
    if socket && tls == TlsMode::Verify {
        // The crate does not encrypt socket connections.
        return Err(bad("TLS was asked for on a unix socket, where the mysql crate does not use it"));
    }
    let crate_url = if keep.is_empty() { base.to_owned() } else { format!("{base}?{}", keep.join("&")) };
    Ok(Parsed { crate_url, tls, ca_file, connect_timeout })
}

/// Belt and braces for messages built from the crate's URL errors (which
/// may quote a parameter's value): drop anything after a `pass` mention.
pub(crate) fn redact(msg: &str) -> String {
    crate::error::cut_from(msg, "pass")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_modes_and_ca_file() {
        let p = parse("mysql://u:p@h:3306/db?ssl-mode=REQUIRED&ssl-ca=%2Ftmp%2Fca.pem&stmt_cache_size=0").unwrap();
        assert_eq!((p.tls, p.ca_file.as_deref()), (TlsMode::Verify, Some(std::path::Path::new("/tmp/ca.pem"))));
        assert_eq!(p.crate_url, "mysql://u:p@h:3306/db?stmt_cache_size=0");
        for mode in ["VERIFY_CA", "verify_identity", "VERIFY-IDENTITY", "required"] {
            assert_eq!(parse(&format!("mysql://h/db?ssl-mode={mode}")).unwrap().tls, TlsMode::Verify, "{mode}");
        }
        assert_eq!(parse("mysql://h/db?root_cert_path=/ca.pem").unwrap().tls, TlsMode::Verify);
        assert_eq!(parse("mysql://h/db").unwrap().tls, TlsMode::Disabled);
        assert_eq!(parse("mysql://h/db?ssl-mode=DISABLED").unwrap().tls, TlsMode::Disabled);
    }

    #[test]
    fn refuses_what_would_weaken_it_without_the_password() {
        for url in [
            "mysql://u:hunter2@h/db?ssl-mode=PREFERRED",
            "mysql://u:hunter2@h/db?ssl-mode=bogus",
            "mysql://u:hunter2@h/db?danger_accept_invalid_certs=true",
            "mysql://u:hunter2@h/db?prefer_socket=true",
            "mysql://u:hunter2@h/db?pool_max=3",
            "mysql://u:hunter2@h/db?ssl-mode=REQUIRED&socket=/run/mysqld/mysqld.sock",
            "mysql://u:hunter2@h/db?ssl-mode=DISABLED&ssl-ca=/ca.pem",
            "postgres://u:hunter2@h/db",
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.is_fatal(), "{url}: {e}");
            assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn connect_timeout_parameter_is_read_here() {
        let p = parse("mysql://h/db?tcp_connect_timeout_ms=250&stmt_cache_size=0").unwrap();
        assert_eq!(p.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(p.crate_url, "mysql://h/db?stmt_cache_size=0");
        let e = parse("mysql://u:hunter2@h/db?tcp_connect_timeout_ms=soon").unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("must be a number") && !e.to_string().contains("hunter2"));
    }

    #[test]
    fn redaction_cuts_at_any_password_mention() {
        assert_eq!(redact("invalid value for password=hunter2"), "invalid value for pass …");
        assert_eq!(redact("unknown parameter x"), "unknown parameter x");
    }
}
