//! Identities: the readable name a participant is configured with
//! (`hostname-pid` by default) and the instance tag each elector adds to it.

use std::fmt;

/// Builds a name unique to this call: hostname, process id and 64 random
/// bits, joined by hyphens (`web-7f9c-4121-9f86d081884c7d65`).
///
/// An elector no longer needs one: whatever it is configured with, it adds
/// an instance tag of its own (see [`Config::identity`](crate::Config::identity)),
/// so every incarnation is a participant of its own.
///
/// # Errors
///
/// The system's randomness source failed. There is no predictable fallback.
///
/// # Examples
///
/// ```
/// let a = leaderelection::generate_identity()?;
/// let b = leaderelection::generate_identity()?;
/// assert_ne!(a, b);
/// assert!(a.contains(&format!("-{}-", std::process::id())));
/// # Ok::<(), leaderelection::IdentityError>(())
/// ```
pub fn generate_identity() -> Result<String, IdentityError> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(IdentityError::from_getrandom)?;
    Ok(format_identity(&hostname(), std::process::id(), u64::from_be_bytes(random)))
}

/// Joins the parts; the host part is cleaned to `[A-Za-z0-9._-]` and cut to
/// 64 bytes so the identity stays well under the 255-byte limit.
pub(crate) fn format_identity(host: &str, pid: u32, random: u64) -> String {
    let mut clean: String = host
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(64)
        .collect();
    if clean.is_empty() {
        clean.push_str("host");
    }
    format!("{clean}-{pid}-{random:016x}")
}

/// The identity an elector is configured with when none is given:
/// `hostname-pid`.
pub(crate) fn default_identity() -> String {
    let host = format_identity(&hostname(), std::process::id(), 0);
    host.rsplit_once('-').map_or(host.clone(), |(h, _)| h.to_owned())
}

/// The identity of one elector: `configured#` and 16 hex digits of
/// `instance`.
pub(crate) fn with_instance(configured: &str, instance: u64) -> String {
    format!("{configured}#{instance:016x}")
}

/// The configured part of an elector's identity: `identity` without the
/// instance tag (`#` and 16 hex digits) the elector added, or all of it
/// when it has none.
///
/// # Examples
///
/// ```
/// use leaderelection::base_identity;
/// assert_eq!(base_identity("web#3f9c2b4e8a1d7c05"), "web");
/// assert_eq!(base_identity("a#b#0123456789abcdef"), "a#b");
/// assert_eq!(base_identity("web"), "web");
/// assert_eq!(base_identity("web#not-a-tag"), "web#not-a-tag");
/// ```
pub fn base_identity(identity: &str) -> &str {
    match identity.rsplit_once('#') {
        Some((base, tag)) if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) => base,
        _ => identity,
    }
}

fn hostname() -> String {
    pick_hostname(std::fs::read_to_string("/proc/sys/kernel/hostname").ok(), |var| std::env::var(var).ok())
}

/// The first of the kernel's hostname, `$HOSTNAME` and `$COMPUTERNAME` that
/// is not blank (`env` is only asked when the ones before are), else `host`.
fn pick_hostname(kernel: Option<String>, env: impl Fn(&str) -> Option<String>) -> String {
    kernel
        .into_iter()
        .chain(["HOSTNAME", "COMPUTERNAME"].into_iter().filter_map(env))
        .find(|h| !h.trim().is_empty())
        .unwrap_or_else(|| String::from("host"))
}

/// The system's randomness source failed, so no identity could be made.
#[derive(Debug)]
pub struct IdentityError {
    code: String,
}

impl IdentityError {
    pub(crate) fn from_getrandom(e: getrandom::Error) -> IdentityError {
        IdentityError { code: e.to_string() }
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot generate an identity: system randomness failed: {}", self.code)
    }
}

impl std::error::Error for IdentityError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_cleaned_and_bounded() {
        assert_eq!(format_identity("web 1\n", 42, 0xab), "web_1-42-00000000000000ab");
        assert_eq!(format_identity("  ", 1, 1), "host-1-0000000000000001");
        let long = "h".repeat(300);
        let id = format_identity(&long, u32::MAX, u64::MAX);
        assert!(id.len() <= 64 + 1 + 10 + 1 + 16, "{}", id.len());
        assert!(crate::config::check_text("identity", &id, crate::config::MAX_IDENTITY_LEN).is_ok());
    }

    #[test]
    fn hostname_falls_back_to_the_environment_then_to_host() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |var: &str| vars.iter().find(|(k, _)| *k == var).map(|(_, v)| v.to_string())
        };
        let both = env(&[("HOSTNAME", "env-host"), ("COMPUTERNAME", "win-host")]);
        assert_eq!(pick_hostname(Some("kernel-host\n".into()), both), "kernel-host\n");
        // A blank kernel hostname (containers without a UTS name) is skipped.
        assert_eq!(pick_hostname(Some(" \n".into()), both), "env-host");
        assert_eq!(pick_hostname(None, env(&[("HOSTNAME", ""), ("COMPUTERNAME", "win-host")])), "win-host");
        assert_eq!(pick_hostname(None, env(&[("HOSTNAME", "  ")])), "host");
        assert_eq!(format_identity(&pick_hostname(None, env(&[])), 7, 1), "host-7-0000000000000001");
    }

    #[test]
    fn randomness_failure_says_what_failed() {
        let e = IdentityError::from_getrandom(getrandom::Error::UNSUPPORTED);
        let text = e.to_string();
        assert!(text.starts_with("cannot generate an identity: system randomness failed: "), "{text}");
        assert!(text.ends_with(&getrandom::Error::UNSUPPORTED.to_string()), "{text}");
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn the_default_identity_is_host_and_pid_and_an_instance_tag_round_trips() {
        let id = default_identity();
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
        let full = with_instance(&id, 0x3f9c_2b4e_8a1d_7c05);
        assert_eq!(full, format!("{id}#3f9c2b4e8a1d7c05"));
        assert_eq!(base_identity(&full), id);
        assert_eq!(with_instance("x", 1), "x#0000000000000001");
        assert_eq!(with_instance("x", 1).len(), 1 + crate::config::INSTANCE_TAG_LEN);
    }

    #[test]
    fn generated_identities_differ() {
        let ids: std::collections::HashSet<_> = (0..100).map(|_| generate_identity().unwrap()).collect();
        assert_eq!(ids.len(), 100);
    }
}
