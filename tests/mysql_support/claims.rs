//! The claim's cases on a real server, run bare (without the settings a
//! call pins), and the claim as it was before issue 16: for the
//! assignment-order tests (`tests/storetest_mysql.rs`) and the hostile
//! server modes (`tests/chaos_maria_server.rs`).
#![allow(dead_code)]

use std::time::Duration;

use mysql::prelude::Queryable;

use super::exec;

/// Bytes as a hex literal.
fn hex(b: &[u8]) -> String {
    format!("X'{}'", b.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn random_tag() -> String {
    let mut r = [0u8; 5];
    getrandom::fill(&mut r).unwrap();
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// The server's clock as the store reads it, in microseconds.
pub const NOW_SQL: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// One claim case: the row before (holder, fence, renewed_at and
/// expires_at as seconds from the server's now; `None` for no row), and
/// what the claim by `me` must do to it.
struct ClaimCase {
    what: &'static str,
    before: Option<(&'static str, i64, i64, i64)>,
    claims: bool,
    extends: bool,
}

const CLAIM_CASES: &[ClaimCase] = &[
    ClaimCase { what: "absent", before: None, claims: true, extends: true },
    ClaimCase { what: "expired, another's", before: Some(("other", 5, -20, -1)), claims: true, extends: true },
    ClaimCase { what: "valid, another's", before: Some(("other", 5, -5, 30)), claims: false, extends: false },
    ClaimCase { what: "valid, mine", before: Some(("me", 5, -5, 30)), claims: false, extends: true },
    ClaimCase { what: "expired, mine", before: Some(("me", 5, -20, -1)), claims: true, extends: true },
    // The row was written (released, renewed) after this call read its
    // clock: a stale reading must not extend it.
    ClaimCase { what: "valid, mine, written later", before: Some(("me", 5, 2, 30)), claims: false, extends: false },
];

/// A claim case's row: holder, fence, renewed_at, expires_at, terms.
type ClaimRow = (String, i64, i64, i64, i64);

/// The row of `name` and the server's now.
fn claim_row(c: &mut mysql::Conn, table: &str, name: &str) -> Option<(ClaimRow, i64)> {
    let q = format!(
        "SELECT holder, fence, renewed_at, expires_at, terms, {NOW_SQL} FROM `{table}` WHERE name = {}",
        hex(name.as_bytes())
    );
    let row: Option<(Vec<u8>, i64, i64, i64, i64, i64)> = c.query_first(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
    row.map(|(h, f, r, e, t, now)| ((String::from_utf8(h).unwrap(), f, r, e, t), now))
}

/// Runs `claim(table, name)` for every case on a session in `mode`, and
/// returns the cases whose outcome was wrong, with what happened.
pub fn run_claim_cases(c: &mut mysql::Conn, table: &str, claim: &dyn Fn(&str, &str) -> String) -> Vec<String> {
    let ttl: i64 = 60_000_000;
    let mut wrong = Vec::new();
    for (k, case) in CLAIM_CASES.iter().enumerate() {
        let name = format!("order-{k}-{}", random_tag());
        if let Some((holder, fence, renewed, expires)) = case.before {
            exec(
                c,
                &format!(
                    "INSERT INTO `{table}` (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms) \
                     VALUES ({}, {}, {fence}, {NOW_SQL} - 100000000, {NOW_SQL} + {renewed}000000, \
                     {NOW_SQL} + {expires}000000, X'', 3)",
                    hex(name.as_bytes()),
                    hex(holder.as_bytes())
                ),
            );
        }
        let before = claim_row(c, table, &name);
        let q = claim(table, &name);
        let ran = c.query_iter(&q).and_then(|mut r| {
            while let Some(set) = r.iter() {
                for row in set {
                    row?;
                }
            }
            Ok(())
        });
        ran.unwrap_or_else(|e| panic!("{}: {q}: {e}", case.what));
        let Some((after, now)) = claim_row(c, table, &name) else {
            wrong.push(format!("{}: no row after the claim", case.what));
            continue;
        };
        let (holder, fence, renewed, expires, terms) = after.clone();
        let old = before.map(|(b, _)| b);
        let ok = match (&old, case.claims, case.extends) {
            (None, _, _) => holder == "me" && terms == 1 && expires - renewed == ttl,
            (Some(b), true, _) => {
                holder == "me" && fence > b.1 && terms == b.4 + 1 && expires - renewed == ttl && renewed <= now
            }
            (Some(b), false, true) => {
                holder == b.0 && fence == b.1 && terms == b.4 && renewed > b.2 && expires == renewed + ttl
            }
            (Some(b), false, false) => after == *b,
        };
        if !ok {
            wrong.push(format!("{}: {old:?} -> {after:?}", case.what));
        }
    }
    wrong
}

/// The claim as the store runs it, without the settings it pins.
pub fn current_claim(table: &str, name: &str) -> String {
    leaderelection::mysql::__claim_unpinned(table, name, "me", Duration::from_secs(60), b"").unwrap()
}

/// A batch's claim statement (`acquire_many`'s `INSERT … ON DUPLICATE KEY
/// UPDATE`) for one election, without the settings it pins.
pub fn current_batch_claim(table: &str, name: &str) -> String {
    leaderelection::mysql::__batch_claim_unpinned(table, name, "me", Duration::from_secs(60), b"").unwrap()
}

/// The claim as it was before issue 16: `holder` assigned first and read by
/// the assignments after it, the clock read by each statement. The negative
/// control of the assignment-order checks.
pub fn old_claim(table: &str, name: &str) -> String {
    let (n, i, p, t) = (hex(name.as_bytes()), hex(b"me"), "X''", 60_000_000);
    format!(
        "START TRANSACTION; \
         INSERT INTO `{table}` (name, holder, fence, acquired_at, renewed_at, expires_at, payload, terms) \
         VALUES ({n}, {i}, GREATEST(1, {NOW_SQL}), {NOW_SQL}, {NOW_SQL}, {NOW_SQL} + {t}, {p}, 1) \
         ON DUPLICATE KEY UPDATE \
           holder = IF(expires_at <= {NOW_SQL}, {i}, holder), \
           fence = IF(holder = {i} AND expires_at <= {NOW_SQL}, GREATEST(fence + 1, {NOW_SQL}), fence), \
           acquired_at = IF(holder = {i} AND expires_at <= {NOW_SQL}, {NOW_SQL}, acquired_at), \
           terms = IF(holder = {i} AND expires_at <= {NOW_SQL}, terms + 1, terms), \
           renewed_at = IF(holder = {i}, {NOW_SQL}, renewed_at), \
           payload = IF(holder = {i}, {p}, payload), \
           expires_at = IF(holder = {i}, GREATEST(expires_at, {NOW_SQL} + {t}), expires_at); \
         COMMIT;"
    )
}
