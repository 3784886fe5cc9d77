//! MySQL store settings and limits that the other suites leave alone:
//! `max_clock_skew` holds a takeover back by that much after the lease's
//! expiry, and an election table whose name leaves no room for the tables
//! beside it (`_slots`, `_members`, `_terms`, at most 64 characters) fails
//! only the calls that need those, saying to use a shorter name. Against
//! the shared MariaDB; run with `bash scripts/test.sh`.

mod mysql_support;
mod support;

use std::time::Duration;

use leaderelection::mysql::MySqlStore;
use leaderelection::Store;
use mysql_support::{admin, exec, url, SHARED};
use support::{elections_run_but_not_the_calls_beside, random_tag, refused_beside, wait_for};

const TABLE: &str = "le_limits";
const T: Duration = Duration::from_secs(5);

/// A lease that has expired by the server's clock is not taken over by a
/// store with a clock-skew bound until that bound has passed too; a store
/// without one takes it over at once (the control).
#[test]
fn max_clock_skew_holds_a_takeover_back_by_the_bound() {
    let plain = MySqlStore::builder(&url(SHARED)).table(TABLE).build().unwrap();
    plain.ensure_schema().unwrap();
    let skewed =
        MySqlStore::builder(&url(SHARED)).table(TABLE).max_clock_skew(Duration::from_secs(30)).build().unwrap();
    let name = format!("skew-{}", random_tag());
    let a = plain.acquire(&name, "a", Duration::from_millis(300), b"", T).unwrap();
    assert!(a.held_by("a"));
    assert!(wait_for(T, || plain.inspect(&name, T).unwrap().expired()), "the lease never expired");
    let seen = skewed.acquire(&name, "b", T, b"", T).unwrap();
    assert!(!seen.held_by("b") && seen.fence == a.fence, "taken within the skew bound: {seen:?}");
    let taken = plain.acquire(&name, "b", T, b"", T).unwrap();
    assert!(taken.held_by("b") && taken.fence > a.fence, "the control: {taken:?}");
}

/// An election table of 59 characters: elections run on it, but the
/// calls that need a table beside it (`_slots`, `_members`: 65 and more)
/// are refused, fatally, naming that table and saying to use a shorter
/// name; a multi-primary store, which needs `_terms` for every claim and
/// check, refuses those and `ensure_schema` the same way.
#[test]
fn a_table_name_without_room_for_the_tables_beside_it_is_refused_where_they_are_needed() {
    let table = format!("le_long_{}_{}", random_tag(), "x".repeat(40));
    assert_eq!(table.chars().count(), 59);
    const LIMIT: &str = "would be longer than 64 characters";
    let s = MySqlStore::builder(&url(SHARED)).table(&table).build().unwrap();
    s.ensure_schema().expect("the election table itself fits");
    elections_run_but_not_the_calls_beside(&s, &table, LIMIT);

    let refused = refused_beside(&table, LIMIT);
    let m = MySqlStore::builder(&url(SHARED)).table(&table).multi_primary(true).build().unwrap();
    refused("lease_check_sql_multi_primary", "terms", m.lease_check_sql_multi_primary().unwrap_err());
    refused("acquire", "terms", m.acquire("e2", "a", T, b"", T).unwrap_err());
    refused("ensure_schema", "terms", m.ensure_schema().unwrap_err());
    exec(&mut admin(SHARED), &format!("DROP TABLE IF EXISTS `{table}`"));
}
