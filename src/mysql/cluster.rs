//! Multi-primary clusters: MariaDB Galera, MySQL Group Replication in
//! multi-primary mode (see `docs/design.md`, "Multi-primary clusters").
//!
//! Every node takes writes and no lock reaches another node: a transaction
//! runs on its own node and is certified at its `COMMIT` against the rows
//! other nodes' transactions wrote meanwhile; of two that wrote one row,
//! the later is rolled back. So the single server's lease check, a shared
//! lock that makes a claim wait, holds nothing off across nodes (measured
//! on Galera: a claim on node 2 committed at once while node 1's checked
//! transaction stayed open). On such a cluster a check has to *write* a
//! row that every claim of a new term writes too, and that renewals never
//! touch: the election's row in `{table}_terms`. A claim of a new term
//! replaces that row (its fence and holder); a check adds one to its
//! `checks`, guarded by this term's fence and holder. Certification then
//! orders the two: a checked transaction that commits after the next
//! term's claim is rolled back. Concurrent checks of one term write the
//! same row too, so they are ordered as well (on one node the second waits
//! for the first's `COMMIT`), which is why a single server keeps its
//! shared lock.
//!
//! Whether the server is such a node is asked once per store
//! ([`DETECT`]), unless the builder says.

use mysql::Value;

pub(crate) use super::sql::claim_terms;
use super::sql::{text, BY_KEY, NOW};
use crate::store::StoreError;
use crate::timing::{MAX_IDENTITY_LEN, MAX_NAME_LEN};

/// What a store knows of its server: not asked yet, one primary (a single
/// server, or a replication topology with one writable node), or several
/// (`Some(true)`). The first answer stands.
pub(crate) type Mode = crate::lockfeed::Known;

/// Asks whether the server is a node of a multi-primary cluster: Galera
/// (`wsrep_on`) or Group Replication not in single-primary mode. Works on
/// both servers (an unknown variable is simply absent).
pub(crate) const DETECT: &str = "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('wsrep_on', \
                                 'group_replication_single_primary_mode', 'group_replication_group_name')";

/// [`DETECT`]'s answer: a Galera node, or a Group Replication member (a
/// group name set) not in single-primary mode.
pub(crate) fn multi_primary(rows: &[Vec<Value>]) -> bool {
    let get = |name: &str| {
        rows.iter().find_map(|r| match (r.first(), r.get(1)) {
            (Some(Value::Bytes(n)), Some(Value::Bytes(v))) if n.eq_ignore_ascii_case(name.as_bytes()) => {
                Some(String::from_utf8_lossy(v).to_ascii_uppercase())
            }
            _ => None,
        })
    };
    let galera = get("wsrep_on").is_some_and(|v| v == "ON" || v == "1");
    let group = get("group_replication_group_name").is_some_and(|v| !v.is_empty())
        && get("group_replication_single_primary_mode").is_some_and(|v| v == "OFF" || v == "0");
    galera || group
}

/// The terms table: one row per election, the term a claim last started
/// (see the module's notes). Binary columns, as the election table's.
pub(crate) fn create_terms(terms: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {terms} (\n\
         \x20   name   VARBINARY({MAX_NAME_LEN}) NOT NULL,\n\
         \x20   fence  BIGINT      NOT NULL,\n\
         \x20   holder VARBINARY({MAX_IDENTITY_LEN}) NOT NULL,\n\
         \x20   checks BIGINT      NOT NULL DEFAULT 0 COMMENT 'lease checks of this term, for operators',\n\
         \x20   PRIMARY KEY (name)\n\
         ) ENGINE = InnoDB;\n"
    )
}

/// The check's write (see the module's notes), with parameters `?` the
/// election's name, the identity and the fence: one row changed while the
/// terms row names this term; none once a claim of another term committed
/// (or when no claim of this version's wrote the row).
pub(crate) fn check_write(terms: &str) -> String {
    check_write_with(terms, "?", "?", "?")
}

fn check_write_with(terms: &str, name: &str, identity: &str, fence: &str) -> String {
    format!(
        "UPDATE {terms} {BY_KEY} SET checks = checks + 1 \
         WHERE name = {name} AND CAST(holder AS BINARY) = {identity} AND fence = {fence}"
    )
}

/// The check's read, after its write: one row while the lease row still
/// names this term and has not expired on this node's clock. A plain read
/// (the lease row is not locked: renewals go through).
pub(crate) fn check_read(table: &str) -> String {
    check_read_with(table, "?", "?", "?", "1")
}

fn check_read_with(table: &str, name: &str, identity: &str, fence: &str, what: &str) -> String {
    format!(
        "SELECT {what} FROM {table} {BY_KEY} WHERE name = {name} AND CAST(holder AS BINARY) = {identity} \
         AND fence = {fence} AND expires_at > {NOW}"
    )
}

/// Both with the values written in, as a script that fails by itself
/// when the term no longer holds the lease (see
/// `MySqlStore::lease_check_literal`): the write, then one row, `lease
/// held`, or error 1242 when the write changed no row or the lease row is
/// another term's or expired.
pub(crate) fn check_literal(
    terms: &str, table: &str, name: &str, identity: &str, fence: u64,
) -> Result<String, StoreError> {
    let (n, i) = (text("election name", name, MAX_NAME_LEN)?, text("identity", identity, MAX_IDENTITY_LEN)?);
    let f = fence.to_string();
    let held = check_read_with(table, &n, &i, &f, "COUNT(*)");
    Ok(format!(
        "{}; SELECT IF(ROW_COUNT() = 1 AND ({held}) = 1, 'leaderelection: lease held', \
         (SELECT 'leaderelection: lease lost' UNION ALL SELECT 'leaderelection: lease lost')) \
         AS leaderelection_lease_check",
        check_write_with(terms, &n, &i, &f)
    ))
}

/// Brings the terms rows up to the lease rows where a claim did not write
/// them (by a version before them, or before the table existed): a row for
/// each election that has none, and a row naming an older term than the
/// lease's taken over by the lease's. Run by `ensure_schema`.
pub(crate) fn fill_terms(terms: &str, table: &str) -> String {
    format!(
        "INSERT INTO {terms} (name, fence, holder, checks) SELECT l.name, l.fence, l.holder, 0 FROM {table} AS l \
         LEFT JOIN {terms} AS t ON t.name = l.name WHERE t.name IS NULL; \
         UPDATE {terms} AS t JOIN {table} AS l ON l.name = t.name SET t.fence = l.fence, t.holder = l.holder \
         WHERE t.fence < l.fence;"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(n: &str, v: &str) -> Vec<Value> {
        vec![Value::Bytes(n.into()), Value::Bytes(v.into())]
    }

    #[test]
    fn galera_and_multi_primary_groups_are_told_from_single_servers() {
        assert!(multi_primary(&[var("wsrep_on", "ON")]));
        assert!(!multi_primary(&[var("wsrep_on", "OFF")]));
        assert!(!multi_primary(&[]), "a server without either");
        let group = |mode: &str, name: &str| {
            multi_primary(&[
                var("group_replication_single_primary_mode", mode),
                var("group_replication_group_name", name),
            ])
        };
        assert!(group("OFF", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"));
        assert!(!group("ON", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"), "single-primary mode");
        assert!(!group("OFF", ""), "the plugin loaded, no group");
        let m = Mode::default();
        assert_eq!(m.known(), None);
        m.learn(true);
        m.learn(false);
        assert_eq!(m.known(), Some(true), "the first answer stays");
        assert_eq!(Mode::fixed(false).known(), Some(false));
    }

    #[test]
    fn the_checks_write_read_and_fail_by_themselves() {
        let w = check_write("`t_terms`");
        assert!(w.starts_with("UPDATE `t_terms` FORCE INDEX (PRIMARY) SET checks = checks + 1 WHERE name = ?"), "{w}");
        assert!(!w.contains("`t`"), "the write reads no lease row (it would lock it under REPEATABLE READ): {w}");
        let r = check_read("`t`");
        assert!(r.contains("expires_at > TIMESTAMPDIFF") && !r.contains("LOCK") && !r.contains("FOR UPDATE"), "{r}");
        let lit = check_literal("`t_terms`", "`t`", "e", "a", 7).unwrap();
        assert!(lit.contains("fence = 7") && lit.contains("ROW_COUNT() = 1") && lit.contains("UNION ALL"), "{lit}");
        assert!(check_literal("`t_terms`", "`t`", &"e".repeat(MAX_NAME_LEN + 1), "a", 7).unwrap_err().is_fatal());
        let c = claim_terms("`t_terms`", "`t`", "name IN (X'65')", "X'61'");
        assert!(c.starts_with("REPLACE INTO `t_terms`") && c.contains("acquired_at = @leaderelection_now"), "{c}");
    }
}
