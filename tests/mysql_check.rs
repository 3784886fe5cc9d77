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
use leaderelection::{BatchItem, ErrorKind, Store};
use mysql::prelude::Queryable;
use mysql::{IsolationLevel, TxOpts};
use mysql_support::{admin, exec, url, SHARED};
use support::{leader, random_tag, successor_waits_for_a_checked_transaction, wait_for, TIMING};

const LONG: Duration = Duration::from_secs(60);

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
    holds_a_claim_off(level, checked, false)
}

/// [`holds_a_claim_off_and_lets_renewals_through`], and with `multi` a
/// store told it is on a multi-primary cluster, whose check writes the
/// term's row in `{table}_terms` (issue 34): on one server that row's lock
/// holds the claim off the same way, and renewals still go through.
fn holds_a_claim_off(level: IsolationLevel, checked: bool, multi: bool) {
    let (s, table) = store_on_a_busy_table();
    let s = if multi { multi_primary_store(&table) } else { s };
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
    let who = format!("mariadb {level:?}");
    // (The transaction ends inside, unchecked or not, before the tables go.)
    let (_, b) = successor_waits_for_a_checked_transaction(a, &s, &name, checked, &who, || tx.commit().unwrap());
    drop(guard);
    b.shutdown().unwrap();
    exec(&mut admin(SHARED), &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
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
fn a_multi_primary_check_holds_a_claim_off_on_one_server_too() {
    holds_a_claim_off(IsolationLevel::RepeatableRead, true, true);
}

/// A store of `table` told it is on a multi-primary cluster.
fn multi_primary_store(table: &str) -> MySqlStore {
    MySqlStore::builder(&url(SHARED)).table(table).multi_primary(true).build().expect("store")
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
    exec(&mut c, &format!("DROP TABLE `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"));
}

/// A store on a table of its own (dropped by the caller).
fn fresh_store(prefix: &str) -> (MySqlStore, String) {
    let table = format!("{prefix}_{}", random_tag());
    let s = store_on(&table);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    (s, table)
}

fn drop_tables(table: &str) {
    exec(
        &mut admin(SHARED),
        &format!("DROP TABLE IF EXISTS `{table}`, `{table}_slots`, `{table}_members`, `{table}_terms`"),
    );
}

fn item(name: &str) -> BatchItem<'_> {
    BatchItem { name, fence: 0, payload: b"b" }
}

/// Waits until every row of `names` has expired on the database's clock.
fn all_expired(s: &MySqlStore, names: &[&str]) {
    let expired = wait_for(Duration::from_secs(10), || {
        s.inspect_many(names, Duration::from_secs(2)).iter().all(|r| r.as_ref().is_ok_and(|l| l.expired()))
    });
    assert!(expired, "the rows did not expire: {:?}", s.inspect_many(names, Duration::from_secs(2)));
}

/// A lease check held open on one of several expired elections does not
/// stall a batched claim (issue 20): the batch claims the others at once,
/// and answers retryable, unclaimed, the checked election and the ones
/// whose claim would have to wait for the check's locks: the election
/// right before it in the index (its claim inserts its new index entry in
/// the gap the check holds) and a new election right after it (its row
/// goes into the other gap). A claim that looked only at its own row, or
/// at the primary key, waits for the check here, and with it the whole
/// batch until the server's lock wait gives up (every item failed). Once
/// the checked transaction ends, a batch claims those too.
#[test]
fn a_batched_claim_skips_what_an_open_check_holds_and_claims_the_rest_at_once() {
    let (s, table) = fresh_store("le_check_batch");
    let base = format!("batch-{}", random_tag());
    let names: Vec<String> = (0..5).map(|k| format!("{base}/{k}")).collect();
    for k in [0, 1, 3, 4] {
        s.acquire(&names[k], "x", Duration::from_millis(300), b"x", Duration::from_secs(2)).unwrap();
    }
    let (a, guard) = leader(&s, &names[2], "a");
    let checked = s.inspect(&names[2], Duration::from_secs(2)).unwrap();
    let mut c = admin(SHARED);
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    s.check_lease(&mut tx, &guard).expect("check");
    // The checked term's leader stops renewing: its lease runs out on the
    // database while the check stays open (a leader frozen past its
    // deadline with its transaction open).
    a.shutdown_without_release();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    all_expired(&s, &refs);
    // New elections: one right after the checked row, one after the last.
    let (next_new, far_new) = (format!("{base}/2+"), format!("{base}/9"));
    let order = [&names[3], &far_new, &names[1], &names[2], &names[0], &next_new, &names[4]];
    let items: Vec<BatchItem<'_>> = order.iter().map(|n| item(n)).collect();
    let start = Instant::now();
    let out = s.acquire_many("b", LONG, &items, Duration::from_secs(4));
    let took = start.elapsed();
    eprintln!("acquire_many with an open check: {took:?}: {out:#?}");
    for (n, r) in order.iter().zip(&out) {
        let held_off = [&names[1], &names[2], &next_new].contains(n);
        match r {
            Ok(l) if !held_off => assert!(l.held_by("b") && &l.name == *n, "{n}: {l:?}"),
            Err(e) if held_off => {
                assert!(e.is_retryable() && e.to_string().contains("locked"), "{n}: {e}");
            }
            other => panic!("{n}: {} expected, got {other:?}", if held_off { "held off" } else { "claimed" }),
        }
    }
    assert!(took < Duration::from_secs(2), "the batch waited {took:?}");
    let still = s.inspect(&names[2], Duration::from_secs(2)).unwrap();
    assert_eq!(
        (&still.holder, still.fence),
        (&checked.holder, checked.fence),
        "the checked row was written: {still:?}"
    );
    assert!(s.inspect(&next_new, Duration::from_secs(2)).is_err_and(|e| e.is_no_lease()));
    tx.commit().unwrap();
    let rest = [item(&names[1]), item(&names[2]), item(&next_new)];
    for (r, it) in s.acquire_many("b", LONG, &rest, Duration::from_secs(4)).iter().zip(&rest) {
        let l = r.as_ref().unwrap_or_else(|e| panic!("{} after the check ended: {e}", it.name));
        assert!(l.held_by("b"), "{l:?}");
    }
    let taken = s.inspect(&names[2], Duration::from_secs(2)).unwrap();
    assert!(taken.fence > checked.fence, "{checked:?} -> {taken:?}");
    drop(guard);
    drop_tables(&table);
}

/// A batched renewal goes through an open lease check of one of its terms,
/// as single renewals do (they change no column of the index the check
/// locks, and reach their rows through the primary key): on a table where
/// the optimizer, left to itself, takes the check's index for an update by
/// name and fence, so a renewal without `FORCE INDEX (PRIMARY)` would wait
/// for the check until the server gave up.
#[test]
fn a_batched_renewal_goes_through_an_open_check() {
    let (s, table) = store_on_a_busy_table();
    let name = format!("renew-batch-{}", random_tag());
    let other = format!("renew-batch-other-{}", random_tag());
    let (a, guard) = leader(&s, &name, "a");
    let check = guard.lease_check().unwrap();
    let mine = s.acquire(&other, check.identity, LONG, b"", Duration::from_secs(2)).unwrap();
    let mut c = admin(SHARED);
    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
    s.check_lease(&mut tx, &guard).expect("check");
    let items = [
        BatchItem { name: check.name, fence: check.fence, payload: b"r" },
        BatchItem { name: &other, fence: mine.fence, payload: b"r" },
    ];
    let start = Instant::now();
    let out = s.renew_many(check.identity, TIMING.lease_duration, &items, Duration::from_secs(3));
    let took = start.elapsed();
    eprintln!("renew_many through an open check: {took:?}: {out:?}");
    for (r, it) in out.iter().zip(&items) {
        let l = r.as_ref().unwrap_or_else(|e| panic!("{}: {e}", it.name));
        assert!(l.fence == it.fence && l.payload == b"r", "{l:?}");
    }
    assert!(took < Duration::from_secs(1), "the renewals waited {took:?}");
    // Payloads of their own: the statement that renews from a table of
    // values (its rows locked first) goes through the check as well.
    let each = [
        BatchItem { name: check.name, fence: check.fence, payload: b"r1" },
        BatchItem { name: &other, fence: mine.fence, payload: b"r2" },
    ];
    let out = s.renew_many(check.identity, TIMING.lease_duration, &each, Duration::from_secs(3));
    for (r, it) in out.iter().zip(&each) {
        let l = r.as_ref().unwrap_or_else(|e| panic!("{}, a payload each: {e}", it.name));
        assert!(l.fence == it.fence && l.payload == it.payload, "{l:?}");
    }
    tx.commit().unwrap();
    drop(guard);
    a.shutdown().unwrap();
    drop_tables(&table);
}
