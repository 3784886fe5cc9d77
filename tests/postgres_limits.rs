//! PostgreSQL limits the other suites leave alone: an election table whose
//! name leaves no room for the tables beside it (`_slots`, `_members`: a
//! PostgreSQL name has at most 63 bytes) fails only the calls that need
//! them, fatally, saying to use a shorter name. Run with
//! `bash scripts/test.sh` (it exports the DSN).

mod pg_support;
mod support;

use leaderelection::postgres::PostgresStore;
use pg_support::{client, dsn, DIRECT};
use support::{elections_run_but_not_the_calls_beside, random_tag};

/// An election table of 58 bytes: elections run on it, but the slot calls
/// (`_slots`, 64 bytes) and the group calls (`_members`, 66) are refused.
#[test]
fn a_table_name_without_room_for_the_tables_beside_it_is_refused_where_they_are_needed() {
    let table = format!("le_long_{}_{}", random_tag(), "x".repeat(39));
    assert_eq!(table.len(), 58);
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", &table).build().unwrap();
    s.ensure_schema().expect("the election table itself fits");
    elections_run_but_not_the_calls_beside(
        &s,
        &table,
        "would be longer than 63 bytes; use a shorter election table name",
    );
    client(DIRECT).batch_execute(&format!("DROP TABLE IF EXISTS public.\"{table}\"")).unwrap();
}
