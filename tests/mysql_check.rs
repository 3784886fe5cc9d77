//! Lease checks in the program's own transactions on MariaDB (issue 17):
//! the check passes for the live term and fails otherwise; an open checked
//! transaction holds a successor's claim off while the holder keeps
//! renewing, under REPEATABLE READ and READ COMMITTED (negative control:
//! the same transaction unchecked holds nobody off); the written-in form
//! fails by itself; a table without the index the check locks refuses, and
//! `ensure_schema` adds it. Run with `bash scripts/test.sh` (it exports
//! the URLs).

mod mysql_support;
mod support;

use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{Elector, ErrorKind, LeaderGuard};
use mysql::prelude::Queryable;
use mysql::{IsolationLevel, TxOpts};
use mysql_support::{admin, exec, url, SHARED};
use support::{config, random_tag, wait_for, TIMING};

const TABLE: &str = "le_check";

fn store_on(table: &str) -> MySqlStore {
    MySqlStore::builder(&url(SHARED)).table(table).build().expect("store")
}

fn store() -> MySqlStore {
    let s = store_on(TABLE);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    s
}

/// A store on a table of its own that also holds a hundred other
/// elections' rows with 20 KB payloads (stored off the rows' pages), with
/// fresh statistics: as a table in use may. On a table of small rows the
/// optimizer takes the primary key for an `UPDATE … WHERE name = …`
/// anyway, so a renewal that took its row lock through the index checks
/// hold (a statement without `FORCE INDEX (PRIMARY)`) would pass the tests
/// below there; on this one MariaDB takes that index, which the test
/// makes sure of first, and such a renewal waits for every check.
fn store_on_a_busy_table() -> (MySqlStore, String) {
    let table = format!("le_check_busy_{}", random_tag());
    let s = store_on(&table);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    let mut c = admin(SHARED);
    exec(
        &mut c,
        &format!(
            "INSERT INTO `{table}` (name, holder, fence, acquired_at, renewed_at, expires_at, payload) \
             SELECT CONCAT('filler-', seq), 'nobody', seq, 0, 0, 0, REPEAT('p', 20000) FROM seq_1_to_100"
        ),
    );
    exec(&mut c, &format!("ANALYZE TABLE `{table}`"));
    let plan: Option<(String,)> = c
        .query_first(format!("EXPLAIN UPDATE `{table}` SET renewed_at = 0 WHERE name = 'filler-7' AND fence = 7"))
        .map(|row: Option<mysql::Row>| row.map(|r| (r.get::<Option<String>, _>("key").flatten().unwrap_or_default(),)))
        .unwrap();
    assert_eq!(
        plan.map(|p| p.0).as_deref(),
        Some("leaderelection_term"),
        "on this table the optimizer should take the checks' index for an update by name (the test's premise)"
    );
    (s, table)
}

fn leader(s: &MySqlStore, name: &str, id: &str) -> (Elector, LeaderGuard) {
    let e = Elector::start(config(s.clone(), name, id)).expect("start");
    let g = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    (e, g)
}

fn server_code(e: &mysql::Error) -> Option<u16> {
    match e {
        mysql::Error::MySqlError(e) => Some(e.code),
        _ => None,
    }
}

/// The check passes in a transaction of the live term's and says
/// `LeaseLost` once the term has ended; the statement for other drivers
/// returns no row for another fence; the written-in form returns its row
/// for the live term and fails with 1242 for an ended one.
#[test]
fn a_check_passes_for_the_term_and_fails_otherwise() {
    let s = store();
    let name = format!("check-{}", random_tag());
    let (e, guard) = leader(&s, &name, "a");
    let mut c = admin(SHARED);
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    s.check_lease(&mut tx, &guard).expect("the live term's check");
    tx.commit().unwrap();
    // The statement for other drivers, with the term's fence and another.
    let check = guard.lease_check().unwrap();
    let sql = s.lease_check_sql();
    let row: Option<i64> = c.exec_first(&sql, (check.name, check.identity, check.fence)).unwrap();
    assert_eq!(row, Some(1));
    let row: Option<i64> = c.exec_first(&sql, (check.name, check.identity, check.fence + 1)).unwrap();
    assert_eq!(row, None, "a check of another fence passed");
    let row: Option<i64> = c.exec_first(&sql, (check.name, "someone else", check.fence)).unwrap();
    assert_eq!(row, None, "a check of another identity passed");
    let literal = s.lease_check_literal(&check).unwrap();
    let held: Option<String> = c.query_first(&literal).expect("the written-in check of the live term");
    assert_eq!(held.as_deref(), Some("leaderelection: lease held"));
    e.shutdown().unwrap();
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    let lost = s.check_lease(&mut tx, &guard).unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::LeaseLost, "{lost}");
    // The guard is gone by the process's clock too; the database's answer,
    // through the statement: no row.
    let row: Option<i64> = tx.exec_first(&sql, (check.name, check.identity, check.fence)).unwrap();
    assert_eq!(row, None, "the check of a released term passed on the database");
    drop(tx);
    // (`query_drop` would not see the error: the mysql crate drops a result
    // set without reading its rows' errors.)
    let failed = c.query_first::<String, _>(&literal).expect_err("the written-in check of an ended term");
    assert_eq!(server_code(&failed), Some(1242), "{failed}");
}

/// While a checked transaction is open, the holder renews as before, and
/// once its lease has run out (it stopped renewing, as a leader frozen
/// past its deadline does) a successor's claim waits for the transaction:
/// nobody leads until it commits, and the successor leads soon after. The
/// negative control: the same transaction without the check holds nobody
/// off, and the successor leads while it is open.
fn holds_a_claim_off_and_lets_renewals_through(level: IsolationLevel, checked: bool) {
    let (s, table) = store_on_a_busy_table();
    let name = format!("hold-{}", random_tag());
    let (a, guard) = leader(&s, &name, "a");
    let mut c = admin(SHARED);
    let mut tx = c.start_transaction(TxOpts::default().set_isolation_level(Some(level))).unwrap();
    if checked {
        s.check_lease(&mut tx, &guard).expect("check");
    } else {
        tx.query_drop(format!("SELECT fence FROM `{table}` WHERE name = '{name}'")).unwrap();
    }
    // The holder keeps renewing while the transaction is open.
    let before = a.status().renewals_ok;
    assert!(
        wait_for(Duration::from_secs(5), || a.status().renewals_ok >= before + 3),
        "renewals stalled behind the check ({level:?}): {}",
        a.status()
    );
    let rtt = a.status().last_call_rtt.unwrap();
    // The holder stops renewing; its lease runs out on the database.
    a.shutdown_without_release();
    let b = Elector::start(config(s.clone(), &name, "b")).unwrap();
    let open_for = TIMING.lease_duration + Duration::from_secs(2);
    let held_off = !wait_for(open_for, || b.is_leader());
    let drop_table = || exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`, `{table}_slots`"));
    if !checked {
        assert!(!held_off, "without the check the successor should have led while the transaction was open");
        drop(tx);
        b.shutdown().unwrap();
        drop_table();
        return;
    }
    assert!(held_off, "a successor claimed while a checked transaction was open ({level:?}): {}", b.status());
    let committed = Instant::now();
    tx.commit().unwrap();
    assert!(wait_for(Duration::from_secs(5), || b.is_leader()), "no successor after the commit: {}", b.status());
    eprintln!(
        "mariadb {level:?}: successor led {:?} after the checked transaction ended; renewal rtt meanwhile {rtt:?}",
        committed.elapsed()
    );
    drop(guard);
    b.shutdown().unwrap();
    drop_table();
}

#[test]
fn an_open_checked_transaction_holds_a_claim_off_and_lets_renewals_through() {
    holds_a_claim_off_and_lets_renewals_through(IsolationLevel::RepeatableRead, true);
}

#[test]
fn an_open_checked_transaction_holds_a_claim_off_under_read_committed() {
    holds_a_claim_off_and_lets_renewals_through(IsolationLevel::ReadCommitted, true);
}

#[test]
fn without_the_check_an_open_transaction_holds_nobody_off() {
    holds_a_claim_off_and_lets_renewals_through(IsolationLevel::RepeatableRead, false);
}

/// A table made by an older version (no `terms` column, no index for
/// checks) and never `ensure_schema`d: a check would lock the row, so it
/// refuses, fatally, saying what to run; the written-in form fails with
/// 1176. `ensure_schema` then adds both, and the check passes.
#[test]
fn a_check_without_its_index_refuses_until_ensure_schema() {
    let table = format!("le_check_old_{}", random_tag());
    let mut c = admin(SHARED);
    let ddl = MySqlStore::schema(&table).unwrap();
    let create = ddl.split(";\n").next().unwrap();
    let old: String = create
        .lines()
        .filter(|l| !l.contains("terms ") && !l.contains("KEY leaderelection_term"))
        .map(|l| if l.contains("PRIMARY KEY") { l.trim_end_matches(',') } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    exec(&mut c, &old);
    let s = store_on(&table);
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    tx.query_drop(format!("INSERT INTO `{table}` (name, holder, fence, acquired_at, renewed_at, expires_at, payload) VALUES ('x', 'y', 1, 0, 0, 0, '')"))
        .unwrap();
    tx.commit().unwrap();
    s.ensure_schema().expect("upgrade");
    exec(&mut c, &format!("ALTER TABLE `{table}` DROP INDEX leaderelection_term"));
    let (e, guard) = leader(&s, "e", "a");
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    let err = s.check_lease(&mut tx, &guard).unwrap_err();
    assert!(err.is_fatal() && err.to_string().contains("ensure_schema"), "{err}");
    drop(tx);
    let literal = s.lease_check_literal(&guard.lease_check().unwrap()).unwrap();
    let failed = c.query_first::<String, _>(&literal).expect_err("no index");
    assert_eq!(server_code(&failed), Some(1176), "{failed}");
    s.ensure_schema().expect("ensure_schema adds the index");
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    s.check_lease(&mut tx, &guard).expect("after ensure_schema");
    drop(tx);
    let terms: Option<i64> = c.query_first(format!("SELECT terms FROM `{table}` WHERE name = 'x'")).unwrap();
    assert_eq!(terms, Some(0), "the old row kept, with the column added");
    e.shutdown().unwrap();
    exec(&mut c, &format!("DROP TABLE `{table}`, `{table}_slots`"));
}
