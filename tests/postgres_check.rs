//! Lease checks in the program's own transactions on PostgreSQL, directly
//! and through PgBouncer in transaction mode (issue 17): the check passes
//! for the live term and fails otherwise; an open checked transaction holds
//! a successor's claim off while the holder keeps renewing; the form with
//! its values written in fails by itself. Run with `bash scripts/test.sh`
//! (it exports the DSNs).

mod pg_support;
mod support;

use std::time::Duration;

use leaderelection::postgres::PostgresStore;
use leaderelection::ErrorKind;
use pg_support::{client, dsn, BOUNCER, DIRECT};
use support::{leader, random_tag, successor_waits_for_a_checked_transaction};

const TABLE: &str = "le_check";

fn store(var: &str) -> PostgresStore {
    pg_support::store_on(var, TABLE)
}

/// The check passes in a transaction of the live term's, and says
/// `LeaseLost` once the term has ended; the statement for other drivers
/// returns no row for another fence; the written-in form raises LE001.
fn passes_for_the_term_and_fails_otherwise(var: &str) {
    let s = store(var);
    let name = format!("check-{}", random_tag());
    let (e, guard) = leader(&s, &name, "a");
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    s.check_lease(&mut tx, &guard).expect("the live term's check");
    tx.commit().unwrap();
    // The statement for other drivers, with another fence: no row.
    let check = guard.lease_check().unwrap();
    let sql = s.lease_check_sql();
    let other = (check.fence + 1) as i64;
    let rows = c.query(&sql, &[&check.name, &check.identity, &other]).unwrap();
    assert!(rows.is_empty(), "a check of another fence passed");
    let rows = c.query(&sql, &[&check.name, &check.identity, &(check.fence as i64)]).unwrap();
    assert_eq!(rows.len(), 1);
    let literal = s.lease_check_literal(&check).unwrap();
    c.batch_execute(&format!("BEGIN; {literal} COMMIT;")).expect("the written-in check of the live term");
    e.shutdown().unwrap();
    let mut tx = c.transaction().unwrap();
    let lost = s.check_lease(&mut tx, &guard).unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::LeaseLost, "{lost}");
    drop(tx);
    let e = c.batch_execute(&format!("BEGIN; {literal} COMMIT;")).expect_err("the written-in check of an ended term");
    assert_eq!(e.code().map(|c| c.code()), Some("LE001"), "{e}");
    assert!(e.as_db_error().unwrap().message().contains("no longer holds the lease"), "{e}");
}

#[test]
fn a_check_passes_for_the_term_and_fails_otherwise_direct() {
    passes_for_the_term_and_fails_otherwise(DIRECT);
}

#[test]
fn a_check_passes_for_the_term_and_fails_otherwise_pgbouncer() {
    passes_for_the_term_and_fails_otherwise(BOUNCER);
}

/// While a checked transaction is open, the holder renews as before, and
/// once its lease has run out (it stopped renewing, as a leader frozen
/// past its deadline does) a successor's claim waits for the transaction:
/// nobody leads until it commits, and the successor leads at once after.
/// The negative control: the same transaction without the check holds
/// nobody off, and the successor leads while it is open.
fn holds_a_claim_off_and_lets_renewals_through(var: &str, checked: bool) -> Duration {
    let s = store(var);
    let name = format!("hold-{}", random_tag());
    let (a, guard) = leader(&s, &name, "a");
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    if checked {
        s.check_lease(&mut tx, &guard).expect("check");
    } else {
        tx.batch_execute(&format!("SELECT 1 FROM {TABLE} WHERE name = '{name}'")).unwrap();
    }
    // The holder keeps renewing while the transaction is open.
    let (rtt, _b) = successor_waits_for_a_checked_transaction(a, &s, &name, checked, var, || tx.commit().unwrap());
    drop(guard);
    rtt
}

#[test]
fn an_open_checked_transaction_holds_a_claim_off_and_lets_renewals_through_direct() {
    holds_a_claim_off_and_lets_renewals_through(DIRECT, true);
}

#[test]
fn an_open_checked_transaction_holds_a_claim_off_and_lets_renewals_through_pgbouncer() {
    holds_a_claim_off_and_lets_renewals_through(BOUNCER, true);
}

#[test]
fn without_the_check_an_open_transaction_holds_nobody_off() {
    holds_a_claim_off_and_lets_renewals_through(DIRECT, false);
}

/// A table without the unique index (made by an older version's DDL and
/// never `ensure_schema`d): a check would hold no claim off, so it refuses,
/// fatally, saying what to run; the written-in form raises LE002.
#[test]
fn a_check_without_its_index_refuses() {
    let table = format!("le_check_old_{}", random_tag());
    let mut admin = client(DIRECT);
    let ddl = PostgresStore::schema("public", &table).unwrap();
    let without_index: String = ddl.lines().filter(|l| !l.contains("UNIQUE INDEX")).collect::<Vec<_>>().join("\n");
    admin.batch_execute(&without_index).unwrap();
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", &table).build().unwrap();
    let (e, guard) = leader(&s, "e", "a");
    let mut c = client(DIRECT);
    let mut tx = c.transaction().unwrap();
    let err = s.check_lease(&mut tx, &guard).unwrap_err();
    assert!(err.is_fatal() && err.to_string().contains("ensure_schema"), "{err}");
    drop(tx);
    let literal = s.lease_check_literal(&guard.lease_check().unwrap()).unwrap();
    let raised = c.batch_execute(&format!("BEGIN; {literal} COMMIT;")).expect_err("no index");
    assert_eq!(raised.code().map(|c| c.code()), Some("LE002"), "{raised}");
    c.batch_execute("ROLLBACK").unwrap();
    s.ensure_schema().unwrap();
    let mut tx = c.transaction().unwrap();
    s.check_lease(&mut tx, &guard).expect("after ensure_schema");
    drop(tx);
    e.shutdown().unwrap();
    admin.batch_execute(&format!("DROP TABLE \"{table}\", \"{table}_slots\"")).unwrap();
}
