//! How `check_lease` refuses, on PostgreSQL and MariaDB: a test term's
//! guard (no store behind it) is a fatal error naming the store, a statement the
//! server refuses comes back classified and is never taken for a lost
//! lease, and (PostgreSQL) a table name too long for the index the check
//! needs is refused with what to do. The passing and failing checks of live
//! and ended terms are in `postgres_check.rs` and `mysql_check.rs`. Run
//! with `bash scripts/test.sh` (it exports the DSN and the URL).

mod mysql_support;
mod pg_support;
mod support;

use std::time::Duration;

use leaderelection::postgres::PostgresStore;
use leaderelection::testing::{follower_guard, TestTerm};
use leaderelection::{Config, Elector, ErrorKind, LeaderGuard, LeaseCheck, MySqlStore, StoreError, Timing};
use mysql::prelude::Queryable;
use mysql::TxOpts;
use mysql_support::{admin, url, SHARED};
use pg_support::{client, dsn, DIRECT};
use support::{config, random_tag};

const PG_TABLE: &str = "le_check";
const MY_TABLE: &str = "le_check";

fn pg() -> PostgresStore {
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", PG_TABLE).build().expect("store");
    s.ensure_schema().expect("ensure_schema");
    s
}

fn my() -> MySqlStore {
    let s = MySqlStore::builder(&url(SHARED)).table(MY_TABLE).build().expect("store");
    s.ensure_schema().expect("ensure_schema");
    s
}

/// `check` (a store's `check_lease` in a transaction of the test's) refuses
/// the guard of `term`, live, and an ended test term's guard, each with a
/// fatal error; the first names the store (`prefix`) and why.
fn refuses_test_terms(prefix: &str, term: &TestTerm, mut check: impl FnMut(&LeaderGuard) -> Result<(), StoreError>) {
    let e = check(&term.guard()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    assert!(e.message().starts_with(prefix), "{e}");
    assert!(e.message().contains("a test term has no store"), "{e}");
    let e = check(&follower_guard()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fatal, "an ended test term's guard: {e}");
}

/// A guard from `leaderelection::testing`, live or ended, has no election
/// behind it: the check is a fatal error naming the store, not a lost
/// lease (the code under test would take that for losing leadership), and
/// no statement is sent.
#[test]
fn a_test_terms_guard_is_refused_without_a_statement() {
    let term = TestTerm::new(7);
    let (s, m) = (pg(), my());
    let mut c = client(DIRECT);
    let mut tx = c.transaction().unwrap();
    refuses_test_terms("postgres check_lease: ", &term, |g| s.check_lease(&mut tx, g));
    // Nothing reached the server: the transaction is still usable.
    tx.batch_execute("SELECT 1").expect("the transaction is not aborted");
    drop(tx);

    let mut a = admin(SHARED);
    let mut tx = a.start_transaction(TxOpts::default()).unwrap();
    refuses_test_terms("mysql check_lease: ", &term, |g| m.check_lease(&mut tx, g));
}

/// A check in a PostgreSQL transaction that an earlier statement of the
/// program's aborted fails with the server's error (25P02), classified
/// and naming `check_lease`: on a store's first check (its catalog read)
/// and on a later one (the check itself). Neither is `LeaseLost`: the term
/// may well hold the lease.
#[test]
fn postgres_a_check_in_an_aborted_transaction_is_the_servers_error() {
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", PG_TABLE).build().unwrap();
    s.ensure_schema().unwrap();
    let name = format!("check-aborted-{}", random_tag());
    let e = Elector::start(config(s.clone(), &name, "a")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let mut c = client(DIRECT);
    for round in ["the first check (the catalog read)", "a later check"] {
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("SELECT 1/0").expect_err("division by zero");
        let err = s.check_lease(&mut tx, &guard).unwrap_err();
        assert!(!err.is_lease_lost(), "{round}: {err}");
        assert!(err.to_string().contains("check_lease"), "{round}: {err}");
        assert!(err.to_string().contains("25P02") || err.to_string().contains("aborted"), "{round}: {err}");
        drop(tx);
        // The same check in a healthy transaction passes (and marks the
        // index as seen, so the next round runs the check itself).
        let mut tx = c.transaction().unwrap();
        s.check_lease(&mut tx, &guard).unwrap_or_else(|e| panic!("{round}: the live term's check: {e}"));
    }
    drop(guard);
    e.shutdown().unwrap();
}

/// The same on MariaDB, where a failed statement does not abort the
/// transaction: the server's error comes from a connection killed under
/// the program. It is classified, names `check_lease`, and is not a lost
/// lease; the same check on a healthy connection passes.
#[test]
fn mysql_a_check_on_a_dead_connection_is_the_servers_error_not_a_lost_lease() {
    let m = my();
    let name = format!("check-dead-{}", random_tag());
    let e = Elector::start(config(m.clone(), &name, "a")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let mut victim = admin(SHARED);
    let id = victim.connection_id();
    let mut killer = admin(SHARED);
    killer.query_drop(format!("KILL {id}")).unwrap();
    let err = m.check_lease(&mut victim, &guard).unwrap_err();
    assert!(!err.is_lease_lost(), "{err}");
    assert!(err.to_string().contains("check_lease"), "{err}");
    let mut fresh = admin(SHARED);
    m.check_lease(&mut fresh, &guard).expect("the live term's check on a healthy connection");
    drop(guard);
    e.shutdown().unwrap();
}

/// A PostgreSQL table whose name leaves no room for the index the check
/// needs (`<table>_name_fence` over 63 bytes): elections run on it, but the
/// check and its written-in form are refused, saying to use a shorter name.
#[test]
fn postgres_a_table_name_too_long_for_the_checks_index_is_refused() {
    let table = format!("le_check_long_{}_{}", random_tag(), "x".repeat(30));
    assert!(table.len() + "_name_fence".len() > 63 && table.len() <= 55, "{}", table.len());
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", &table).build().unwrap();
    s.ensure_schema().expect("the election table itself fits");
    let name = format!("check-long-{}", random_tag());
    let e = Elector::start(config(s.clone(), &name, "a")).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("elections run on the table");
    let check = guard.lease_check().unwrap();
    let literal = s.lease_check_literal(&check).unwrap_err();
    let mut c = client(DIRECT);
    let mut tx = c.transaction().unwrap();
    let checked = s.check_lease(&mut tx, &guard).unwrap_err();
    for err in [&literal, &checked] {
        assert_eq!(err.kind(), ErrorKind::Fatal, "{err}");
        assert!(err.message().contains("longer than 63 bytes; use a shorter election table name"), "{err}");
        assert!(err.message().contains(&table), "{err}");
    }
    drop(tx);
    // The statement for other drivers is still given (it names no index).
    let fine = LeaseCheck { name: check.name, identity: check.identity, fence: check.fence };
    let rows = c.query(&s.lease_check_sql(), &[&fine.name, &fine.identity, &(fine.fence as i64)]).unwrap();
    assert_eq!(rows.len(), 1, "the live term's row");
    drop(guard);
    e.shutdown().unwrap();
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS public.\"{table}\", public.\"{table}_slots\", public.\"{table}_members\""
    ))
    .unwrap();
}

/// Timings with a renewal far away, so nothing but the check looks at the
/// row while a test has changed it under the term.
fn slow_renewals() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(30),
        renew_interval: Duration::from_secs(10),
        retry_period: Duration::from_secs(1),
        operation_timeout: Duration::from_secs(2),
        safety_margin: Duration::from_secs(3),
    }
}

/// A term still valid by this process's clock whose row the database no
/// longer gives it (another fence was written in, as a successor's claim
/// would): the check finds no row and says `LeaseLost`, on the database's
/// word, on both servers.
#[test]
fn a_row_taken_under_a_live_term_fails_the_check_on_the_databases_word() {
    let word = "the lease check found the lease expired or taken on the database";

    let s = pg();
    let name = format!("check-taken-{}", random_tag());
    let e = Elector::start(Config::new(s.clone(), &name).identity("a").timing(slow_renewals())).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let mut c = client(DIRECT);
    c.batch_execute(&format!("UPDATE public.{PG_TABLE} SET fence = fence + 1000 WHERE name = '{name}'")).unwrap();
    assert!(guard.is_valid(), "the term is live by this process's clock");
    let mut tx = c.transaction().unwrap();
    let err = s.check_lease(&mut tx, &guard).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(err.to_string().contains(word), "{err}");
    drop(tx);
    drop(guard);
    e.shutdown_without_release();

    let m = my();
    let e = Elector::start(Config::new(m.clone(), &name).identity("a").timing(slow_renewals())).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let mut a = admin(SHARED);
    a.query_drop(format!("UPDATE `{MY_TABLE}` SET fence = fence + 1000 WHERE name = '{name}'")).unwrap();
    assert!(guard.is_valid(), "the term is live by this process's clock");
    let err = m.check_lease(&mut a, &guard).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(err.to_string().contains(word), "{err}");
    drop(guard);
    e.shutdown_without_release();
}

/// A MySQL store told it is on a multi-primary cluster checks by writing
/// the term's row of `{table}_terms` and then reading the lease row; on
/// one server its refusals are the same: a terms row or a lease row taken
/// under a live term is `LeaseLost` on the database's word, a killed connection is the server's
/// error and not a lost lease. Its statement for other drivers changes one
/// row for the live term and none for another fence, and its written-in
/// form passes for the live term and fails once the row is taken.
#[test]
fn mysql_multi_primary_checks_refuse_the_same_way() {
    let word = "the lease check found the lease expired or taken on the database";
    my();
    let m = MySqlStore::builder(&url(SHARED)).table(MY_TABLE).multi_primary(true).build().unwrap();
    m.ensure_schema().unwrap();
    let name = format!("check-multi-{}", random_tag());
    let e = Elector::start(Config::new(m.clone(), &name).identity("a").timing(slow_renewals())).unwrap();
    let guard = e.wait_leader_timeout(Duration::from_secs(10)).expect("leads");
    let check = guard.lease_check().unwrap();
    let mut a = admin(SHARED);
    m.check_lease(&mut a, &guard).expect("the live term's check");

    let sql = m.lease_check_sql_multi_primary().unwrap();
    a.exec_drop(&sql, (check.name, check.identity, check.fence)).unwrap();
    assert_eq!(a.affected_rows(), 1, "the live term's write: {sql}");
    a.exec_drop(&sql, (check.name, check.identity, check.fence + 1)).unwrap();
    assert_eq!(a.affected_rows(), 0, "another fence's write: {sql}");
    let literal = m.lease_check_literal(&check).unwrap();
    assert_eq!(script(&mut a, &literal).expect("the live term's written-in check"), ["leaderelection: lease held"]);

    let mut victim = admin(SHARED);
    let id = victim.connection_id();
    admin(SHARED).query_drop(format!("KILL {id}")).unwrap();
    let err = m.check_lease(&mut victim, &guard).unwrap_err();
    assert!(!err.is_lease_lost() && err.to_string().contains("check_lease"), "{err}");

    // The terms row names another term (a claim through another node
    // wrote it): the check's write changes nothing.
    let terms = |d: &str| format!("UPDATE `{MY_TABLE}_terms` SET fence = fence {d} 1000 WHERE name = '{name}'");
    a.query_drop(terms("+")).unwrap();
    let err = m.check_lease(&mut a, &guard).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(err.to_string().contains(word), "{err}");
    a.query_drop(terms("-")).unwrap();
    m.check_lease(&mut a, &guard).expect("the terms row is the term's again");
    // The lease row is another term's: the write goes through, the read
    // finds no row.
    a.query_drop(format!("UPDATE `{MY_TABLE}` SET fence = fence + 1000 WHERE name = '{name}'")).unwrap();
    assert!(guard.is_valid(), "the term is live by this process's clock");
    let err = m.check_lease(&mut a, &guard).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(err.to_string().contains(word), "{err}");
    match script(&mut a, &literal) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1242, "{e}"),
        other => panic!("the written-in check of a taken row: {other:?}"),
    }
    drop(guard);
    e.shutdown_without_release();
}

/// Every row of every result set `script` returns (reading them all, so a
/// row's error is seen).
fn script(c: &mut mysql::Conn, script: &str) -> Result<Vec<String>, mysql::Error> {
    let mut result = c.query_iter(script)?;
    let mut rows = Vec::new();
    while let Some(set) = result.iter() {
        for row in set {
            rows.push(mysql::from_row::<String>(row?));
        }
    }
    Ok(rows)
}
