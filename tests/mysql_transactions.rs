//! How many transactions the MySQL store's group calls cost the server,
//! by the server's own count (issue 35): InnoDB's transaction metrics
//! (read-write, read-only and autocommit reads committed, and rollbacks),
//! on the private MariaDB instance (nothing else runs there while this
//! suite does). A renewal batch and the heartbeat it carries are one
//! transaction on one server; the read after the `COMMIT` that tells
//! whether a write took (`sql::committed`) is sent only where a `COMMIT`
//! can be discarded unreported (a store told, or finding, that its server
//! is a multi-primary node); a heartbeat that fails, or cannot be sent,
//! does not fail the renewals it went with, nor renewals refused the
//! heartbeat. Run with `bash scripts/test.sh` (it starts the
//! private instance and exports LE_MYSQL_PAUSE_URL).

mod mysql_support;
mod support;

use std::sync::{Mutex, MutexGuard, PoisonError};

use leaderelection::mysql::MySqlStore;
use leaderelection::{BatchItem, Heartbeat, Store, StoreError};
use mysql::prelude::Queryable;
use mysql_support::{admin, exec, url, PRIVATE};
use support::{Scratch, STORE_TIMEOUT as T, STORE_TTL as LONG};

/// Calls measured per run; each run is measured [`TRIES`] times and the
/// least taken, since the server's own background work (statistics, purge)
/// can only add transactions.
const CALLS: i64 = 10;
const TRIES: usize = 3;
const TERMS: usize = 300;

/// The server's count of InnoDB transactions since its metrics were
/// enabled; reading it is no InnoDB transaction.
fn transactions(c: &mut mysql::Conn) -> i64 {
    c.query_first::<i64, _>(
        "SELECT CAST(SUM(COUNT) AS SIGNED) FROM information_schema.INNODB_METRICS \
         WHERE NAME IN ('trx_rw_commits', 'trx_ro_commits', 'trx_nl_ro_commits', 'trx_rollbacks')",
    )
    .expect("INNODB_METRICS")
    .expect("a count")
}

/// The count is the server's: one test of this suite counts at a time.
static COUNTING: Mutex<()> = Mutex::new(());

/// A table of its own on the private server, `TERMS` elections claimed in
/// it by `me`, and the server's transaction metrics on; this suite's
/// counting to itself while it lives.
struct Fixture {
    table: String,
    names: Vec<String>,
    fences: Vec<u64>,
    admin: mysql::Conn,
    _alone: MutexGuard<'static, ()>,
}

impl Fixture {
    fn new(prefix: &str) -> Fixture {
        let alone = COUNTING.lock().unwrap_or_else(PoisonError::into_inner);
        let mut admin = admin(PRIVATE);
        exec(&mut admin, "SET GLOBAL innodb_monitor_enable = 'module_trx'");
        let table = Scratch::new(prefix).table;
        let names: Vec<String> = (0..TERMS).map(|i| format!("e/{i:04}")).collect();
        let s = MySqlStore::builder(&url(PRIVATE)).table(&table).build().expect("store");
        s.ensure_schema().expect("ensure_schema");
        let claims: Vec<BatchItem<'_>> = names.iter().map(|name| BatchItem { name, fence: 0, payload: b"" }).collect();
        let fences = all_ok("claims", s.acquire_many("me", LONG, &claims, T)).iter().map(|l| l.fence).collect();
        Fixture { table, names, fences, admin, _alone: alone }
    }

    fn items<'a>(&'a self, payload: &'a [u8]) -> Vec<BatchItem<'a>> {
        self.names.iter().zip(&self.fences).map(|(name, &fence)| BatchItem { name, fence, payload }).collect()
    }

    fn store(&self, multi_primary: Option<bool>) -> MySqlStore {
        let b = MySqlStore::builder(&url(PRIVATE)).table(&self.table);
        match multi_primary {
            Some(m) => b.multi_primary(m),
            None => b,
        }
        .build()
        .expect("store")
    }

    /// What `calls` calls of `call` cost the server, on a store of its own
    /// that first re-claims the terms (so it has asked its server what it
    /// is, as a member that claimed has): the least of [`TRIES`] runs of
    /// `1 + calls` calls less the least of as many of one (which holds the
    /// store's own first costs).
    fn spend(&mut self, multi_primary: Option<bool>, call: &dyn Fn(&MySqlStore, &Fixture, i64)) -> i64 {
        let mut run = |calls: i64| -> i64 {
            (0..TRIES)
                .map(|_| {
                    let before = transactions(&mut self.admin);
                    let s = self.store(multi_primary);
                    let claims: Vec<BatchItem<'_>> =
                        self.names.iter().map(|name| BatchItem { name, fence: 0, payload: b"" }).collect();
                    let again = all_ok("re-claims", s.acquire_many("me", LONG, &claims, T));
                    assert!(again.iter().zip(&self.fences).all(|(l, &f)| l.fence == f), "a re-claim kept its fence");
                    for k in 0..calls {
                        call(&s, self, k);
                    }
                    drop(s);
                    transactions(&mut self.admin) - before
                })
                .min()
                .expect("a run")
        };
        run(1 + CALLS) - run(1)
    }
}

fn all_ok<T>(what: &str, out: Vec<Result<T, StoreError>>) -> Vec<T> {
    out.into_iter().enumerate().map(|(j, r)| r.unwrap_or_else(|e| panic!("{what}: item {j} failed: {e}"))).collect()
}

const BEAT: Heartbeat<'static> = Heartbeat { group: "g", leading: TERMS as u32, ttl: LONG };

fn renew_with_beat(s: &MySqlStore, f: &Fixture, k: i64) {
    let (out, members) = s.renew_many_with_heartbeat("me", LONG, &f.items(b"p"), BEAT, T);
    let renewed = all_ok("renew_many_with_heartbeat", out);
    assert!(renewed.iter().zip(&f.fences).all(|(l, &fence)| l.held_by("me") && l.fence == fence), "call {k}");
    let members = members.unwrap_or_else(|e| panic!("call {k}: the heartbeat failed: {e}"));
    assert_eq!((members.live, members.rank), (1, Some(0)), "call {k}: {members:?}");
}

/// Ten renewals of 300 terms with the member's heartbeat are ten
/// transactions on one server (before: thirty, the renewal, the read
/// after its `COMMIT` and the heartbeat each one). The control makes the
/// same calls apart, as the trait's default does, and is counted at two
/// transactions a call: the count sees each.
#[test]
fn a_renewal_and_its_heartbeat_are_one_transaction() {
    let mut f = Fixture::new("le_tx_beat");
    let together = f.spend(None, &renew_with_beat);
    let apart = f.spend(None, &|s, f, k| {
        all_ok("renew_many", s.renew_many("me", LONG, &f.items(b"p"), T));
        let m = s.heartbeat("g", "me", TERMS as u32, LONG, T).unwrap_or_else(|e| panic!("call {k}: {e}"));
        assert_eq!(m.live, 1);
    });
    eprintln!("mysql transactions: {CALLS} renewals of {TERMS} with the heartbeat: {together}; apart: {apart}");
    assert_eq!(apart, 2 * CALLS, "the control: a renewal batch and a heartbeat apart are two transactions each");
    assert_eq!(together, CALLS, "{CALLS} renewals with a heartbeat took {together} transactions on the server");
}

/// Where the store is told its server is a multi-primary node, each
/// renewal (batched or single) and each claim is read back after its
/// `COMMIT`, one read-only transaction more (a batch's reads in one); on a
/// server that answered it has one primary, none is.
#[test]
fn only_a_multi_primary_store_reads_its_writes_back() {
    let mut f = Fixture::new("le_tx_check");
    let batch = |s: &MySqlStore, f: &Fixture, k: i64| {
        let renewed = all_ok("renew_many", s.renew_many("me", LONG, &f.items(b"p"), T));
        assert!(renewed.iter().all(|l| l.held_by("me")), "call {k}");
    };
    let single = |s: &MySqlStore, f: &Fixture, k: i64| {
        let l = s.renew(&f.names[0], "me", f.fences[0], LONG, b"p", T).unwrap_or_else(|e| panic!("call {k}: {e}"));
        assert!(l.held_by("me") && l.fence == f.fences[0], "call {k}: {l:?}");
    };
    let figures = [
        ("renew_many, one primary (asked)", f.spend(None, &batch), CALLS),
        ("renew_many, one primary (said)", f.spend(Some(false), &batch), CALLS),
        ("renew_many, multi-primary (said)", f.spend(Some(true), &batch), 2 * CALLS),
        ("renew, one primary (asked)", f.spend(None, &single), CALLS),
        ("renew, multi-primary (said)", f.spend(Some(true), &single), 2 * CALLS),
    ];
    for (what, spent, expected) in figures {
        eprintln!("mysql transactions: {CALLS} × {what}: {spent}");
        assert_eq!(spent, expected, "{CALLS} × {what}");
    }
}

/// The heartbeat shares the renewals' transaction, so its failure rolls
/// them back too: the store then sends the two again on their own, and the
/// renewals are answered renewed (and are, in the table) while the
/// heartbeat fails as it does alone (its members table missing: fatal,
/// naming the fix).
#[test]
fn a_failing_heartbeat_does_not_fail_the_renewals_it_went_with() {
    let mut f = Fixture::new("le_tx_beat_fails");
    let s = f.store(None);
    exec(&mut f.admin, &format!("DROP TABLE `{}_members`", f.table));
    let (out, members) = s.renew_many_with_heartbeat("me", LONG, &f.items(b"q"), BEAT, T);
    let renewed = all_ok("renew_many_with_heartbeat", out);
    assert!(renewed.iter().zip(&f.fences).all(|(l, &fence)| l.held_by("me") && l.fence == fence && l.payload == b"q"));
    let e = members.expect_err("a heartbeat without its members table");
    assert!(e.is_fatal() && e.to_string().contains("ensure_schema"), "{e}");
    let row = s.inspect(&f.names[TERMS - 1], T).unwrap();
    assert!(row.held_by("me") && row.payload == b"q", "the renewal did not commit: {row:?}");
}

/// What the combined call answers where one part cannot be sent: a group
/// name too long for the members table leaves the renewals renewed (the
/// two go apart) and the heartbeat refused, naming the group name; items
/// all refused before anything is sent leave the heartbeat to go alone,
/// and it counts the member.
#[test]
fn a_heartbeat_or_renewals_that_cannot_be_sent_leave_the_other_answered() {
    let f = Fixture::new("le_tx_parts");
    let s = f.store(None);
    let long = "g".repeat(leaderelection::MAX_NAME_LEN + 1);
    let beat = Heartbeat { group: &long, leading: 1, ttl: LONG };
    let (out, members) = s.renew_many_with_heartbeat("me", LONG, &f.items(b"r"), beat, T);
    let renewed = all_ok("renew_many_with_heartbeat", out);
    assert!(renewed.iter().all(|l| l.held_by("me") && l.payload == b"r"), "the renewals went apart");
    let e = members.expect_err("a group name longer than the column");
    assert!(!e.is_retryable() && e.to_string().contains("group name"), "{e}");

    let too_long = "n".repeat(leaderelection::MAX_NAME_LEN + 1);
    let refused = [BatchItem { name: &too_long, fence: 1, payload: b"" }];
    let (out, members) = s.renew_many_with_heartbeat("me", LONG, &refused, BEAT, T);
    let e = out.into_iter().next().expect("one answer").expect_err("a name longer than the column");
    assert!(e.to_string().contains("election name"), "{e}");
    let members = members.expect("the heartbeat alone");
    assert_eq!((members.live, members.rank), (1, Some(0)), "{members:?}");
}
