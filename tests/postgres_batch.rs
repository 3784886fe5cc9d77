//! Batched calls and group members on PostgreSQL, directly and through
//! PgBouncer in transaction mode (issue 20), beyond the storetest cases:
//! a claim batch does not wait behind a lease check and a renew batch goes
//! through one; batches that share rows in opposite orders never deadlock;
//! batched renewals stay HOT and batched reads write nothing; a missing
//! members table says how to make it; a renewal batch and the heartbeat
//! it carries are one transaction on the server, and a heartbeat that
//! fails does not fail the renewals. And, ignored by default, the
//! latencies of the group's batch sizes (`-- --ignored --nocapture`).
//! Run with `bash scripts/test.sh` (it exports the DSNs).

mod pg_support;
mod support;

use std::time::{Duration, Instant};

use leaderelection::postgres::PostgresStore;
use leaderelection::{BatchItem, Heartbeat, Lease, Store, StoreError};
use pg_support::{client, direct_and_pgbouncer, dsn, BOUNCER, DIRECT};
use postgres::types::Type;
use support::{
    at_once, batches_skip_a_row_another_writer_locked, claims, four_held_by_a,
    heartbeats_count_leads_once_the_schema_is_ensured, items, random_tag, wait_for, Scratch, STORE_TIMEOUT as T,
    STORE_TTL as LONG,
};

const TABLE: &str = "le_batch";

fn store(var: &str) -> PostgresStore {
    pg_support::store_on(var, TABLE)
}

/// Every answer, or a panic naming the item that failed.
fn all_ok<T>(what: &str, out: Vec<Result<T, StoreError>>) -> Vec<T> {
    out.into_iter().enumerate().map(|(j, r)| r.unwrap_or_else(|e| panic!("{what}: item {j} failed: {e}"))).collect()
}

/// Runs `call` and logs how long it took to answer, as `what`: its answer
/// and that time.
fn timed<R>(what: &str, call: impl FnOnce() -> R) -> (R, Duration) {
    let start = Instant::now();
    let out = call();
    let took = start.elapsed();
    eprintln!("{what} answered in {took:?}");
    (out, took)
}

/// Polls until the database says every one of `names` has expired.
fn wait_all_expired(s: &PostgresStore, names: &[String]) {
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let expired = wait_for(Duration::from_secs(10), || {
        s.inspect_many(&refs, T).iter().all(|r| r.as_ref().is_ok_and(Lease::expired))
    });
    assert!(expired, "the leases did not expire within 10 s");
}

/// Opens a lease check of `lease` (held by `identity`) in `tx`, as a
/// program does before it commits its own writes: `FOR KEY SHARE` on the
/// row until the transaction ends.
fn check(s: &PostgresStore, tx: &mut postgres::Transaction<'_>, lease: &Lease, identity: &str) {
    let fence = i64::try_from(lease.fence).unwrap();
    let rows = tx
        .query_typed(&s.lease_check_sql(), &[(&lease.name, Type::TEXT), (&identity, Type::TEXT), (&fence, Type::INT8)])
        .expect("the lease check");
    assert_eq!(rows.len(), 1, "the check of the live term found no row");
}

/// Locks election `name`'s row in `tx` as another writer would (an
/// operator's `SELECT … FOR UPDATE`), until `tx` ends.
fn lock_row(tx: &mut postgres::Transaction<'_>, name: &str) {
    tx.batch_execute(&format!("SELECT 1 FROM {TABLE} WHERE name = '{name}' FOR UPDATE")).unwrap();
}

/// A claim batch over expired elections, one of which a program holds a
/// lease check on (its leader paused after checking, its lease ran out):
/// the batch claims the others at once and answers the checked one with a
/// retryable "locked" error, leaving its row alone; once the check's
/// transaction ends, a claim of it works. A claim that waited for the
/// check (the whole batch locking `FOR UPDATE` without `SKIP LOCKED`)
/// would sit until the server's lock timeout (3/4 of the call's) and fail
/// every item.
fn a_claim_batch_skips_a_checked_row(var: &str) {
    let s = store(var);
    let base = format!("check-claim-{}", random_tag());
    let names: Vec<String> = (0..6).map(|i| format!("{base}/{i}")).collect();
    let held: Vec<Lease> =
        names.iter().map(|n| s.acquire(n, "a", Duration::from_millis(700), b"a", T).unwrap()).collect();
    const CHECKED: usize = 3;
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    check(&s, &mut tx, &held[CHECKED], "a");
    wait_all_expired(&s, &names);

    let timeout = Duration::from_secs(5);
    let what = format!("{var}: a claim batch with one checked row");
    let (out, took) = timed(&what, || s.acquire_many("b", LONG, &claims(&names), timeout));
    assert!(took < timeout / 2, "the claim batch waited {took:?} behind the check");
    assert_eq!(out.len(), names.len());
    for (j, r) in out.iter().enumerate() {
        if j == CHECKED {
            let e = r.as_ref().expect_err("the checked row was claimed while the check's transaction was open");
            assert!(e.is_retryable() && e.to_string().contains("locked"), "{e:?}");
        } else {
            let l = r.as_ref().unwrap_or_else(|e| panic!("item {j}: {e}"));
            assert!(l.held_by("b") && l.fence > held[j].fence && l.ttl() == LONG, "item {j}: {l:?}");
        }
    }
    let row = s.inspect(&names[CHECKED], T).unwrap();
    assert!(row.holder == "a" && row.fence == held[CHECKED].fence, "the checked row was written: {row:?}");

    tx.commit().unwrap();
    let again = all_ok("acquire_many after the check", s.acquire_many("b", LONG, &claims(&names), T));
    assert!(again.iter().all(|l| l.held_by("b")), "{again:?}");
    assert!(again[CHECKED].fence > held[CHECKED].fence, "{:?}", again[CHECKED]);
    let others: Vec<u64> = out.iter().flatten().map(|l| l.fence).collect();
    let kept: Vec<u64> = again.iter().enumerate().filter(|(j, _)| *j != CHECKED).map(|(_, l)| l.fence).collect();
    assert_eq!(kept, others, "the holder's own re-claim is the same term");
}

direct_and_pgbouncer!(a_claim_batch_skips_a_checked_row: a_claim_batch_skips_a_checked_row_direct, a_claim_batch_skips_a_checked_row_pgbouncer);

/// Another writer holds one of several expired rows (an operator's `SELECT
/// … FOR UPDATE` left open): a claim batch never waits for a row lock, so
/// it claims the others and runs the locked one again for half a second at
/// most, then answers it with a retryable error, well inside its 5 s
/// timeout; once the lock goes, a claim of it works. A batch that waited
/// for the lock, or kept running the item again until its timeout, would
/// hold every answer back for seconds.
fn a_claim_batch_does_not_wait_for_a_writer(var: &str) {
    let s = store(var);
    let base = format!("writer-{}", random_tag());
    let names: Vec<String> = (0..4).map(|i| format!("{base}/{i}")).collect();
    for n in &names {
        s.acquire(n, "a", Duration::from_millis(300), b"", T).unwrap();
    }
    wait_all_expired(&s, &names);
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    lock_row(&mut tx, &names[0]);
    let what = format!("{var}: a claim batch with one row under a writer's lock");
    let (out, took) = timed(&what, || s.acquire_many("b", LONG, &claims(&names), Duration::from_secs(5)));
    assert!(took < Duration::from_millis(1500), "the claim batch took {took:?}");
    let e = out[0].as_ref().expect_err("a row under another writer's lock was claimed");
    assert!(e.is_retryable() && e.to_string().contains("stayed locked"), "{e}");
    for r in &out[1..] {
        assert!(r.as_ref().is_ok_and(|l| l.held_by("b")), "{r:?}");
    }
    tx.rollback().unwrap();
    let again = all_ok("acquire_many after the lock", s.acquire_many("b", LONG, &claims(&names[..1]), T));
    assert!(again[0].held_by("b"), "{:?}", again[0]);
}

direct_and_pgbouncer!(a_claim_batch_does_not_wait_for_a_writer: a_claim_batch_does_not_wait_for_a_writer_direct, a_claim_batch_does_not_wait_for_a_writer_pgbouncer);

/// A renew batch goes through an open lease check of one of its terms, as
/// a single renewal does (it changes no key column): at once, every term
/// renewed. A batch that locked its rows `FOR UPDATE` would wait for the
/// check's transaction and fail at the lock timeout.
fn a_renew_batch_goes_through_a_check(var: &str) {
    let s = store(var);
    let (names, held, fences) = four_held_by_a(&s, "check-renew");
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    check(&s, &mut tx, &held[1], "a");
    let timeout = Duration::from_secs(5);
    let what = format!("{var}: a renew batch with one checked term");
    let (out, took) = timed(&what, || s.renew_many("a", LONG, &items(&names, &fences, b"renewed"), timeout));
    assert!(took < timeout / 2, "the renew batch waited {took:?} behind the check");
    let renewed = all_ok("renew_many under a check", out);
    for (l, f) in renewed.iter().zip(&fences) {
        assert!(l.held_by("a") && l.fence == *f && l.payload == b"renewed", "{l:?}");
    }
    // The check still holds a claim off: the term it checked is valid, so
    // a claim loses, and the checked transaction commits.
    tx.commit().unwrap();
}

direct_and_pgbouncer!(a_renew_batch_goes_through_a_check: a_renew_batch_goes_through_a_check_direct, a_renew_batch_goes_through_a_check_pgbouncer);

/// Another writer holds one term's row locked (an operator's `SELECT …
/// FOR UPDATE` left open, issue 33): a renew batch renews every other term
/// at once and answers the locked one alone with a retryable error, its
/// lease untouched, and a release batch the same. Before, the batch waited
/// for the lock and every term of the batch failed at its timeout.
fn a_renew_or_release_batch_does_not_wait_for_a_writer(var: &str) {
    let s = store(var);
    let (names, _, fences) = four_held_by_a(&s, "writer-renew");
    let mut c = client(var);
    let mut tx = c.transaction().unwrap();
    lock_row(&mut tx, &names[2]);
    let unlock = || tx.rollback().unwrap();
    batches_skip_a_row_another_writer_locked(&format!("{var}: "), &s, &names, &fences, Duration::from_secs(3), unlock);
    all_ok("release_many after the lock", s.release_many("a", &items(&names[2..3], &fences[2..3], b""), T));
    assert!(s.inspect(&names[2], T).unwrap().expired());
}

direct_and_pgbouncer!(a_renew_or_release_batch_does_not_wait_for_a_writer: a_renew_or_release_batch_does_not_wait_for_a_writer_direct, a_renew_or_release_batch_does_not_wait_for_a_writer_pgbouncer);

/// `n` elections, their rows inserted in reverse name order (so the
/// table's physical order is the opposite of the name order the batches
/// lock in), all held by "a" for `ttl`.
fn reversed_rows(s: &PostgresStore, tag: &str, n: usize, ttl: Duration) -> (Vec<String>, Vec<u64>) {
    let names: Vec<String> = (0..n).map(|i| format!("{tag}/{i:03}")).collect();
    let fences = names.iter().rev().map(|n| s.acquire(n, "a", ttl, b"", T).unwrap().fence).collect::<Vec<_>>();
    (names, fences.into_iter().rev().collect())
}

/// Batches that share rows, sent at once with their items in opposite
/// orders, round after round: the holder's renew batch (items in reverse
/// name order) against claim batches of others (in name order and
/// shuffled), which lose every row; then claim batches against each other
/// on absent rows and on expired rows, one winner each. No item ever fails, as it would with
/// a deadlock (40P01, after the server's one-second deadlock timeout).
/// Caught: one `INSERT … SELECT … ON CONFLICT DO UPDATE` per claim batch
/// (rows locked in item order), and inserts of absent rows not sorted by
/// name.
fn opposite_orders_never_deadlock(var: &str) {
    const N: usize = 60;
    const ROUNDS: usize = 6;
    let s = store(var);
    let (names, fences) = reversed_rows(&s, &format!("order-{}", random_tag()), N, LONG);
    for round in 0..ROUNDS {
        let results = at_once(
            3,
            |_| (),
            |(), t| match t {
                0 => {
                    let mut batch = items(&names, &fences, b"r");
                    batch.reverse();
                    s.renew_many("a", LONG, &batch, T).into_iter().map(|r| r.map(|l| l.held_by("a"))).collect()
                }
                _ => {
                    let mut batch = claims(&names);
                    if t == 2 {
                        batch.rotate_left(N / 3);
                        batch.reverse();
                    }
                    s.acquire_many(&format!("b{t}"), LONG, &batch, T)
                        .into_iter()
                        .map(|r| r.map(|l| l.held_by("a")))
                        .collect::<Vec<_>>()
                }
            },
        );
        for (t, out) in results.iter().enumerate() {
            for (j, r) in out.iter().enumerate() {
                assert!(matches!(r, Ok(true)), "round {round}, batch {t}, item {j}: {r:?}");
            }
        }
    }

    // Claims against claims, on rows nobody has yet: the inserts of each
    // batch wait for those of the others (the same names), in one order.
    for round in 0..ROUNDS {
        let tag = format!("absent-{}", random_tag());
        let names: Vec<String> = (0..4 * N).map(|i| format!("{tag}/{i:03}")).collect();
        let results = at_once(
            4,
            |_| (),
            |(), t| {
                let mut batch = claims(&names);
                batch.rotate_left(t * N);
                if t % 2 == 1 {
                    batch.reverse();
                }
                let id = format!("c{t}");
                let out =
                    all_ok(&format!("round {round}, claimer {t} of absent rows"), s.acquire_many(&id, LONG, &batch, T));
                (id, out.into_iter().filter(|l| l.held_by(&format!("c{t}"))).count())
            },
        );
        let won: usize = results.iter().map(|(_, n)| n).sum();
        assert_eq!(won, names.len(), "round {round}: every absent row has one winner: {results:?}");
    }

    // Claims against claims, on rows that expired or were released.
    let (names, _) = reversed_rows(&s, &format!("claims-{}", random_tag()), N, Duration::from_millis(300));
    wait_all_expired(&s, &names);
    for round in 0..ROUNDS {
        let results = at_once(
            4,
            |_| (),
            |(), t| {
                let mut batch = claims(&names);
                batch.rotate_left(t * N / 4);
                if t % 2 == 1 {
                    batch.reverse();
                }
                let id = format!("c{t}");
                let out = all_ok(&format!("round {round}, claimer {t}"), s.acquire_many(&id, LONG, &batch, T));
                let mut by_name: Vec<Lease> = out;
                by_name.sort_by(|a, b| a.name.cmp(&b.name));
                (id, by_name)
            },
        );
        for j in 0..N {
            let winners: Vec<&str> =
                results.iter().filter(|(id, ls)| ls[j].held_by(id)).map(|(id, _)| id.as_str()).collect();
            assert_eq!(winners.len(), 1, "round {round}, {}: {winners:?}", names[j]);
        }
        // The winners release, so the next round claims again.
        for (id, ls) in &results {
            let mine: Vec<BatchItem<'_>> = ls
                .iter()
                .filter(|l| l.held_by(id))
                .map(|l| BatchItem { name: &l.name, fence: l.fence, payload: b"" })
                .collect();
            all_ok("release_many", s.release_many(id, &mine, T));
        }
    }
}

direct_and_pgbouncer!(opposite_orders_never_deadlock: opposite_orders_never_deadlock_direct, opposite_orders_never_deadlock_pgbouncer);

/// [`Scratch`] in this suite: a table dropped (with the tables beside it)
/// when it goes.
impl Scratch {
    fn store(&self) -> PostgresStore {
        let s = PostgresStore::builder(&dsn(DIRECT)).table("public", self.table.clone()).build().unwrap();
        s.ensure_schema().unwrap();
        s
    }
    /// The first column of the first row of `q`, with `{t}` the table.
    fn one(&self, q: &str) -> String {
        let q = q.replace("{t}", &self.table);
        let rows = client(DIRECT).simple_query(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        rows.iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{q}: no row"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let t = &self.table;
        let _ = client(DIRECT).batch_execute(&format!(
            "DROP TABLE IF EXISTS public.\"{t}\", public.\"{t}_slots\", public.\"{t}_members\""
        ));
    }
}

/// Batched renewals stay HOT updates, as single ones do: the ordered lock
/// writes no new row version and no indexed column changes
/// ([`pg_support::assert_renewals_are_hot`]).
#[test]
fn batched_renewals_are_hot_updates() {
    let t = Scratch::new("le_batch_hot");
    pg_support::assert_renewals_are_hot(t.store(), &t.table, |s, names, fences| {
        all_ok("renew_many", s.renew_many("a", LONG, &items(names, fences, b"q"), T));
    });
}

/// A batched read, and a claim batch that loses every row, leave the rows'
/// versions alone (same `xmin`); a renew batch writes (control).
fn batched_reads_do_not_write(var: &str) {
    let s = store(var);
    let base = format!("xmin-{}", random_tag());
    let names: Vec<String> = (0..5).map(|i| format!("{base}/{i}")).collect();
    let fences: Vec<u64> = names.iter().map(|n| s.acquire(n, "a", LONG, b"", T).unwrap().fence).collect();
    let xmins = || {
        let q = format!("SELECT string_agg(xmin::text, ',' ORDER BY name) FROM {TABLE} WHERE name LIKE '{base}/%'");
        let rows = client(var).simple_query(&q).unwrap();
        rows.iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap()
    };
    let before = xmins();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for _ in 0..3 {
        all_ok("inspect_many", s.inspect_many(&refs, T));
        let lost = all_ok("acquire_many", s.acquire_many("b", LONG, &claims(&names), T));
        assert!(lost.iter().all(|l| l.held_by("a")), "{lost:?}");
    }
    assert_eq!(xmins(), before, "inspect_many or a losing acquire_many wrote a new row version");
    all_ok("renew_many", s.renew_many("a", LONG, &items(&names, &fences, b""), T));
    assert_ne!(xmins(), before, "control: a renew batch does write");
}

direct_and_pgbouncer!(batched_reads_do_not_write: batched_reads_do_not_write_direct, batched_reads_do_not_write_pgbouncer);

/// A name PostgreSQL text cannot hold (it has a NUL) fails on its own,
/// fatally, in every batched call, and the other items of the batch go
/// ahead: claimed, renewed, read and released as if it were not there.
#[test]
fn a_name_with_nul_fails_alone_in_every_batch() {
    let s = store(DIRECT);
    let base = format!("nul-{}", random_tag());
    let names = [format!("{base}/a"), format!("{base}/b\0c"), format!("{base}/d")];
    fn fatal<T: std::fmt::Debug>(what: &str, r: &Result<T, StoreError>) {
        let e = r.as_ref().expect_err(&format!("{what}: the NUL name was accepted"));
        assert!(e.is_fatal() && e.to_string().contains("the election name holds a NUL character"), "{what}: {e}");
    }
    let claimed = s.acquire_many("a", LONG, &claims(&names), T);
    fatal("acquire_many", &claimed[1]);
    let leases: Vec<Lease> = [0, 2].iter().map(|&j| claimed[j].clone().expect("a good name's claim")).collect();
    assert!(leases.iter().all(|l| l.held_by("a")), "{leases:?}");
    let fences = [leases[0].fence, 7, leases[1].fence];
    let renewed = s.renew_many("a", LONG, &items(&names, &fences, b"r"), T);
    fatal("renew_many", &renewed[1]);
    for j in [0, 2] {
        let l = renewed[j].as_ref().unwrap_or_else(|e| panic!("renew_many item {j}: {e}"));
        assert!(l.held_by("a") && l.payload == b"r", "{l:?}");
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let read = s.inspect_many(&refs, T);
    fatal("inspect_many", &read[1]);
    assert!(read[0].is_ok() && read[2].is_ok(), "{read:?}");
    let released = s.release_many("a", &items(&names, &fences, b""), T);
    fatal("release_many", &released[1]);
    assert!(released[0].is_ok() && released[2].is_ok(), "{released:?}");
    for n in [&names[0], &names[2]] {
        assert!(s.inspect(n, T).unwrap().expired(), "{n} was not released");
    }
}

/// The members table comes with the schema (`schema()` and
/// `ensure_schema`); without it, heartbeats and leaving fail fatally,
/// saying to run `ensure_schema`, which brings it back.
#[test]
fn a_missing_members_table_is_fatal_and_names_the_fix() {
    let t = Scratch::new("le_members");
    let s = t.store();
    let ddl = PostgresStore::schema("public", &t.table).unwrap();
    assert!(ddl.contains(&format!("CREATE TABLE IF NOT EXISTS \"public\".\"{}_members\"", t.table)), "{ddl}");
    assert_eq!(s.heartbeat("g", "m", 0, LONG, T).unwrap().live, 1);
    client(DIRECT).batch_execute(&format!("DROP TABLE public.\"{}_members\"", t.table)).unwrap();
    let e = s.heartbeat("g", "m", 0, LONG, T).unwrap_err();
    let text = e.to_string();
    assert!(e.is_fatal() && text.contains("42P01") && text.contains("ensure_schema"), "{text}");
    assert!(text.contains(&format!("{}_members", t.table)), "{text}");
    let e = s.leave_group("g", "m", T).unwrap_err();
    assert!(e.is_fatal() && e.to_string().contains("ensure_schema"), "{e}");
    s.ensure_schema().unwrap();
    assert_eq!(s.heartbeat("g", "m", 0, LONG, T).unwrap().live, 1);
    s.leave_group("g", "m", T).unwrap();
    // A tombstone stays (a late heartbeat does not revive it): expired.
    assert_eq!(t.one("SELECT count(*) FROM public.\"{t}_members\" WHERE expires_at > now() OR leads >= 0"), "0");
}

/// A members table made before members reported what they lead lacks the
/// `leads` column: a heartbeat fails fatally (42703), naming the statement
/// that adds it, and `ensure_schema` adds it; the reports then add up.
#[test]
fn a_members_table_without_leads_is_fatal_until_ensure_schema_adds_it() {
    let t = Scratch::new("le_members_leads");
    let s = t.store();
    client(DIRECT).batch_execute(&format!("ALTER TABLE public.\"{}_members\" DROP COLUMN leads", t.table)).unwrap();
    let e = s.heartbeat("g", "m", 4, LONG, T).unwrap_err();
    let text = e.to_string();
    assert!(e.is_fatal() && text.contains("42703") && text.contains("ADD COLUMN IF NOT EXISTS leads"), "{text}");
    heartbeats_count_leads_once_the_schema_is_ensured(&s, PostgresStore::ensure_schema, ["m", "n"]);
}

/// A heartbeat deletes the group's rows that expired over an hour ago
/// (members that crashed), and no other: not a row expired for less, nor
/// another group's.
#[test]
fn a_heartbeat_forgets_members_gone_for_an_hour() {
    let t = Scratch::new("le_members_gc");
    let s = t.store();
    for m in ["old", "recent", "me"] {
        s.heartbeat("g", m, 0, LONG, T).unwrap();
    }
    s.heartbeat("other", "old", 0, LONG, T).unwrap();
    client(DIRECT)
        .batch_execute(&format!(
            "UPDATE public.\"{t}_members\" SET expires_at = now() - interval '61 minutes' WHERE member = 'old'; \
             UPDATE public.\"{t}_members\" SET expires_at = now() - interval '59 minutes' WHERE member = 'recent'",
            t = t.table
        ))
        .unwrap();
    assert_eq!(s.heartbeat("g", "me", 0, LONG, T).unwrap().live, 1, "expired members are not counted");
    let left = t.one(
        "SELECT string_agg(group_name || ':' || member, ',' ORDER BY group_name, member) FROM public.\"{t}_members\"",
    );
    assert_eq!(left, "g:me,g:recent,other:old");
}

// ---- latency of the group's batch sizes (not a timed assertion) ----

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    eprintln!(
        "{what:<44} n={:>2}  p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms",
        v.len(),
        percentile(&v, 0.5).as_secs_f64() * 1e3,
        percentile(&v, 0.99).as_secs_f64() * 1e3,
        v.last().unwrap().as_secs_f64() * 1e3
    );
}

/// The sizes a group of 10,000 elections over three processes sends: a
/// renew batch of 3,334 terms, an inspect batch of 6,667 rows, a claim
/// batch of 3,334 expired rows; 30 of each, direct and through PgBouncer,
/// on a table of 10,002 elections. Prints p50/p99.
fn measure(var: &str) {
    const REPS: usize = 30;
    const SHARE: usize = 3334;
    let t = Scratch::new("le_batch_bench");
    let s = PostgresStore::builder(&dsn(var)).table("public", t.table.clone()).build().unwrap();
    s.ensure_schema().unwrap();
    let names: Vec<String> = (0..3 * SHARE).map(|i| format!("group/election-{i:05}")).collect();
    let payload = b"host-a:8080";
    // Three members: "a" leads the first third, "b" the second, the last is expired.
    let (a, rest) = names.split_at(SHARE);
    let (b, free) = rest.split_at(SHARE);
    let mine = all_ok("setup a", s.acquire_many("a", LONG, &claims(a), Duration::from_secs(60)));
    all_ok("setup b", s.acquire_many("b", LONG, &claims(b), Duration::from_secs(60)));
    let held = all_ok("setup c", s.acquire_many("c", LONG, &claims(free), Duration::from_secs(60)));
    let c_items: Vec<BatchItem<'_>> =
        held.iter().map(|l| BatchItem { name: &l.name, fence: l.fence, payload: b"" }).collect();
    all_ok("setup release", s.release_many("c", &c_items, Duration::from_secs(60)));
    client(DIRECT).batch_execute(&format!("VACUUM ANALYZE public.\"{}\"", t.table)).unwrap();

    let fences: Vec<u64> = mine.iter().map(|l| l.fence).collect();
    let renew = items(a, &fences, payload);
    let mut took = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        all_ok("renew_many", s.renew_many("a", LONG, &renew, T));
        took.push(start.elapsed());
    }
    report(&format!("{var}: renew_many x{}", renew.len()), took);

    let follow: Vec<&str> = rest.iter().take(6667).map(String::as_str).collect();
    let mut took = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        all_ok("inspect_many", s.inspect_many(&follow, T));
        took.push(start.elapsed());
    }
    report(&format!("{var}: inspect_many x{}", follow.len()), took);

    let claim = claims(free);
    let mut took = Vec::new();
    for _ in 0..REPS {
        let start = Instant::now();
        let won = all_ok("acquire_many", s.acquire_many("a", LONG, &claim, T));
        took.push(start.elapsed());
        assert!(won.iter().all(|l| l.held_by("a")));
        let back: Vec<BatchItem<'_>> =
            won.iter().map(|l| BatchItem { name: &l.name, fence: l.fence, payload: b"" }).collect();
        all_ok("release_many", s.release_many("a", &back, T));
    }
    report(&format!("{var}: acquire_many x{} (expired)", claim.len()), took);
}

/// Three members of a group at once, as three processes would be: each
/// renews its third of 10,002 elections and inspects the other two thirds,
/// back to back, 20 times, on stores of their own (their own
/// connections). Every call contends with the other two members' calls,
/// which is the worst case of a group whose members' ticks coincide.
/// Prints p50/p99 over all members.
fn measure_three_members(var: &str) {
    const REPS: usize = 20;
    const SHARE: usize = 3334;
    let t = Scratch::new("le_batch_bench3");
    let build = || PostgresStore::builder(&dsn(var)).table("public", t.table.clone()).build().unwrap();
    let setup = build();
    setup.ensure_schema().unwrap();
    let names: Vec<String> = (0..3 * SHARE).map(|i| format!("group/election-{i:05}")).collect();
    let ids = ["a", "b", "c"];
    let fences: Vec<Vec<u64>> = ids
        .iter()
        .zip(names.chunks(SHARE))
        .map(|(id, part)| {
            let won = all_ok("setup", setup.acquire_many(id, LONG, &claims(part), Duration::from_secs(60)));
            won.iter().map(|l| l.fence).collect()
        })
        .collect();
    client(DIRECT).batch_execute(&format!("VACUUM ANALYZE public.\"{}\"", t.table)).unwrap();
    let results = at_once(
        3,
        |_| build(),
        |s, m| {
            let own = &names[m * SHARE..(m + 1) * SHARE];
            let others: Vec<&str> =
                names.iter().enumerate().filter(|(i, _)| i / SHARE != m).map(|(_, n)| n.as_str()).collect();
            let renew = items(own, &fences[m], b"host:8080");
            let (mut renews, mut inspects) = (Vec::new(), Vec::new());
            for _ in 0..REPS {
                let start = Instant::now();
                all_ok("renew_many", s.renew_many(ids[m], LONG, &renew, T));
                renews.push(start.elapsed());
                let start = Instant::now();
                all_ok("inspect_many", s.inspect_many(&others, T));
                inspects.push(start.elapsed());
            }
            (renews, inspects)
        },
    );
    let (renews, inspects): (Vec<_>, Vec<_>) = results.into_iter().unzip();
    report(&format!("{var}: 3 members, renew_many x{SHARE}"), renews.concat());
    report(&format!("{var}: 3 members, inspect_many x{}", 2 * SHARE), inspects.concat());
}

#[test]
#[ignore = "prints latencies; run with -- --ignored --nocapture"]
fn measure_three_members_direct() {
    measure_three_members(DIRECT);
}

#[test]
#[ignore = "prints latencies; run with -- --ignored --nocapture"]
fn measure_three_members_pgbouncer() {
    measure_three_members(BOUNCER);
}

#[test]
#[ignore = "prints latencies; run with -- --ignored --nocapture"]
fn measure_batch_latency_direct() {
    measure(DIRECT);
}

#[test]
#[ignore = "prints latencies; run with -- --ignored --nocapture"]
fn measure_batch_latency_pgbouncer() {
    measure(BOUNCER);
}

/// A database of its own on the test server, dropped at the end, so that
/// the server's count of its transactions (`pg_stat_database`) is this
/// test's alone.
struct OwnDatabase {
    name: String,
}

impl OwnDatabase {
    fn new() -> OwnDatabase {
        let name = format!("le_stmt_{}", random_tag());
        client(DIRECT).batch_execute(&format!("CREATE DATABASE \"{name}\"")).expect("CREATE DATABASE");
        OwnDatabase { name }
    }

    fn dsn(&self) -> String {
        let cfg: tokio_postgres::Config = dsn(DIRECT).parse().expect("test DSN parses");
        let (host, port) = pg_support::host_port(DIRECT);
        let user = cfg.get_user().unwrap_or("root");
        format!("postgres://{user}@{host}:{port}/{}", self.name)
    }

    fn store(&self) -> PostgresStore {
        PostgresStore::builder(&self.dsn()).table("public", "le_stmt").build().expect("store")
    }

    /// Runs `sql` in this database, on a session of its own.
    fn execute(&self, sql: &str) {
        let mut c = postgres::Client::connect(&self.dsn(), postgres::NoTls).expect("a client on the own database");
        c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Transactions committed and rolled back in the database, as the
    /// server counts them, once every session of it has ended and its
    /// count has stopped changing (a backend adds its last transactions to
    /// the count as it exits, just after it leaves `pg_stat_activity`).
    fn transactions(&self) -> i64 {
        let mut c = client(DIRECT);
        let mut one = |q: &str| -> i64 {
            let rows = c.simple_query(&q.replace("{db}", &self.name)).unwrap_or_else(|e| panic!("{q}: {e}"));
            rows.iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{q}: no row"))
        };
        let gone = wait_for(Duration::from_secs(20), || {
            one("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'") == 0
        });
        assert!(gone, "the sessions of {} did not end within 20 s", self.name);
        let count = "SELECT COALESCE((SELECT xact_commit + xact_rollback FROM pg_stat_database \
                     WHERE datname = '{db}'), 0)";
        let (mut last, mut since) = (one(count), Instant::now());
        let settled = wait_for(Duration::from_secs(20), || {
            let now = one(count);
            if now != last {
                (last, since) = (now, Instant::now());
            }
            since.elapsed() >= Duration::from_millis(500)
        });
        assert!(settled, "the transaction count of {} kept changing for 20 s", self.name);
        last
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let _ = client(DIRECT).batch_execute(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name));
    }
}

/// A group member renews its terms in two batches per renew interval and
/// sends its heartbeat with one of them (issue 35): on the server that
/// renewal is one transaction, heartbeat included, not two. Counted by the
/// server's own statistics on a database of its own: ten renewals of 300
/// terms, each with the heartbeat, are ten transactions. (Before the
/// heartbeat went in the renewal's query, twenty.) Each part still answers
/// as its own call would: every term renewed, the member counted.
#[test]
fn a_renewal_and_its_heartbeat_are_one_transaction() {
    const CALLS: i64 = 10;
    let db = OwnDatabase::new();
    let names: Vec<String> = (0..300).map(|i| format!("e/{i}")).collect();
    let fences: Vec<u64> = {
        let s = db.store();
        s.ensure_schema().expect("ensure_schema");
        // The server counts an autovacuum worker's transactions in the
        // database's too, and these tables see enough writes to call one
        // in: it must not land between the two counts.
        db.execute(
            "ALTER TABLE public.le_stmt SET (autovacuum_enabled = off); \
             ALTER TABLE public.le_stmt_members SET (autovacuum_enabled = off)",
        );
        let held = all_ok("claims", s.acquire_many("me", LONG, &claims(&names), T));
        held.iter().map(|l| l.fence).collect()
    };
    // A store's first call also reads what the table holds, once: two
    // stores, one making one call and one making 1 + CALLS, differ by
    // what CALLS calls cost.
    let spend = |calls: i64| -> i64 {
        let before = db.transactions();
        let s = db.store();
        let beat = Heartbeat { group: "g", leading: 300, ttl: LONG };
        for k in 0..calls {
            let (out, members) = s.renew_many_with_heartbeat("me", LONG, &items(&names, &fences, b"p"), beat, T);
            let renewed = all_ok("renew_many_with_heartbeat", out);
            assert!(renewed.iter().zip(&fences).all(|(l, &f)| l.held_by("me") && l.fence == f), "call {k}");
            let members = members.unwrap_or_else(|e| panic!("call {k}: the heartbeat failed: {e}"));
            assert_eq!((members.live, members.rank, members.led), (1, Some(0), Some(300)), "call {k}: {members:?}");
        }
        drop(s);
        db.transactions() - before
    };
    let spent = spend(1 + CALLS) - spend(1);
    assert_eq!(spent, CALLS, "{CALLS} renewals with a heartbeat took {spent} transactions on the server");
}

/// The heartbeat shares the renewal's transaction, so its failure rolls
/// the renewal back too: the store then runs the two again on their own,
/// and the renewals are answered as renewed while the heartbeat fails as
/// it does alone (its members table missing: fatal, naming the fix).
#[test]
fn a_failing_heartbeat_does_not_fail_the_renewal_it_went_with() {
    let t = Scratch::new("le_beat_fails");
    let s = t.store();
    let names: Vec<String> = (0..50).map(|i| format!("beat-fails/{i}")).collect();
    let held = all_ok("claims", s.acquire_many("me", LONG, &claims(&names), T));
    let fences: Vec<u64> = held.iter().map(|l| l.fence).collect();
    client(DIRECT).batch_execute(&format!("DROP TABLE public.\"{}_members\"", t.table)).unwrap();
    let beat = Heartbeat { group: "g", leading: 50, ttl: LONG };
    let (out, members) = s.renew_many_with_heartbeat("me", LONG, &items(&names, &fences, b"q"), beat, T);
    let renewed = all_ok("renew_many_with_heartbeat", out);
    assert!(renewed.iter().zip(&fences).all(|(l, &f)| l.held_by("me") && l.fence == f && l.payload == b"q"));
    let e = members.expect_err("a heartbeat without its members table");
    assert!(e.is_fatal() && e.to_string().contains("ensure_schema"), "{e}");
    let row = s.inspect(&names[0], T).unwrap();
    assert!(row.held_by("me") && row.payload == b"q", "the renewal did not commit: {row:?}");
}
