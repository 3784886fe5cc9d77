//! A store used before `ensure_schema` made its tables, on PostgreSQL and
//! MariaDB: every call, single or batched, fails fatally (a person must
//! act: retrying cannot help), names the call and the missing table, and
//! a batch fails each of its items; the group calls say what to run.
//! Run with `bash scripts/test.sh` (it exports the DSN and the URL).

mod mysql_support;
mod pg_support;
mod support;

use std::time::Duration;

use leaderelection::postgres::PostgresStore;
use leaderelection::{BatchItem, ErrorKind, Heartbeat, MySqlStore, Store, StoreError};
use mysql_support::{url, SHARED};
use pg_support::{dsn, DIRECT};
use support::random_tag;

const T: Duration = Duration::from_secs(5);

/// `e` is fatal, from `call` of `store`, and names `missing` (the table).
fn refused(store: &str, call: &str, missing: &str, e: &StoreError) {
    assert_eq!(e.kind(), ErrorKind::Fatal, "{call}: {e}");
    assert!(e.message().starts_with(&format!("{store} {call}: ")), "{call}: {e}");
    assert!(format!("{e}").contains(missing), "{call}: {e} does not name {missing}");
}

/// Every call of `s` on `table` (never made) is refused; the group calls
/// also say what to run (`members_hint`).
fn every_call_is_refused(s: &dyn Store, store: &str, table: &str, members_hint: &str) {
    let items = [BatchItem { name: "e1", fence: 1, payload: b"" }, BatchItem { name: "e2", fence: 1, payload: b"" }];
    let slots = format!("{table}_slots");
    let members = format!("{table}_members");
    refused(store, "acquire", table, &s.acquire("e", "a", T, b"", T).unwrap_err());
    refused(store, "renew", table, &s.renew("e", "a", 1, T, b"", T).unwrap_err());
    refused(store, "release", table, &s.release("e", "a", 1, T).unwrap_err());
    refused(store, "inspect", table, &s.inspect("e", T).unwrap_err());
    refused(store, "claim_slot", table, &s.claim_slot("e", "a", 1, "s", false, T).unwrap_err());
    refused(store, "finish_slot", &slots, &s.finish_slot("e", 1, "s", 0, T).unwrap_err());
    for (call, out) in [
        ("acquire_many", s.acquire_many("a", T, &items, T)),
        ("renew_many", s.renew_many("a", T, &items, T)),
        ("inspect_many", s.inspect_many(&["e1", "e2"], T)),
    ] {
        assert_eq!(out.len(), 2, "{call}: one answer per item");
        for r in out {
            refused(store, call, table, &r.unwrap_err());
        }
    }
    let out = s.release_many("a", &items, T);
    assert_eq!(out.len(), 2, "release_many: one answer per item");
    for r in out {
        refused(store, "release_many", table, &r.unwrap_err());
    }
    for (call, e) in [
        ("heartbeat", s.heartbeat("g", "m", 0, T, T).unwrap_err()),
        ("leave_group", s.leave_group("g", "m", T).unwrap_err()),
    ] {
        refused(store, call, &members, &e);
        assert!(e.message().contains(members_hint), "{call}: {e}");
    }
    let (renewed, beat) = s.renew_many_with_heartbeat("a", T, &items, Heartbeat { group: "g", leading: 0, ttl: T }, T);
    assert_eq!(renewed.len(), 2);
    for r in renewed {
        refused(store, "renew_many", table, &r.unwrap_err());
    }
    refused(store, "heartbeat", &members, &beat.unwrap_err());
}

#[test]
fn postgres_every_call_before_ensure_schema_is_refused() {
    let table = format!("le_never_made_{}", random_tag());
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", &table).build().unwrap();
    every_call_is_refused(&s, "postgres", &table, "run PostgresStore::ensure_schema");
}

#[test]
fn mysql_every_call_before_ensure_schema_is_refused() {
    let table = format!("le_never_made_{}", random_tag());
    let s = MySqlStore::builder(&url(SHARED)).table(&table).build().unwrap();
    every_call_is_refused(&s, "mysql", &table, "run MySqlStore::ensure_schema");
}
