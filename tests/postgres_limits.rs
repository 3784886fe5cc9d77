//! PostgreSQL limits the other suites leave alone: an election table whose
//! name leaves no room for the tables beside it (`_slots`, `_members`: a
//! PostgreSQL name has at most 63 bytes) fails only the calls that need
//! them, fatally, saying to use a shorter name. Run with
//! `bash scripts/test.sh` (it exports the DSN).

mod pg_support;
mod support;

use std::time::Duration;

use leaderelection::postgres::PostgresStore;
use leaderelection::{ErrorKind, Store, StoreError};
use pg_support::{client, dsn, DIRECT};
use support::random_tag;

const T: Duration = Duration::from_secs(5);

/// An election table of 58 bytes: elections run on it, but the slot calls
/// (`_slots`, 64 bytes) and the group calls (`_members`, 66) are refused.
#[test]
fn a_table_name_without_room_for_the_tables_beside_it_is_refused_where_they_are_needed() {
    let table = format!("le_long_{}_{}", random_tag(), "x".repeat(39));
    assert_eq!(table.len(), 58);
    let refused = |call: &str, beside: &str, e: StoreError| {
        assert_eq!(e.kind(), ErrorKind::Fatal, "{call}: {e}");
        assert!(e.message().contains(&format!("{table}_{beside}")), "{call}: {e}");
        assert!(
            e.message().contains("would be longer than 63 bytes; use a shorter election table name"),
            "{call}: {e}"
        );
    };
    let s = PostgresStore::builder(&dsn(DIRECT)).table("public", &table).build().unwrap();
    s.ensure_schema().expect("the election table itself fits");
    let lease = s.acquire("e", "a", T, b"", T).expect("elections run on it");
    assert!(lease.held_by("a"));
    refused("claim_slot", "slots", s.claim_slot("e", "a", lease.fence, "s", false, T).unwrap_err());
    refused("finish_slot", "slots", s.finish_slot("e", lease.fence, "s", 0, T).unwrap_err());
    refused("heartbeat", "members", s.heartbeat("g", "m", 0, T, T).unwrap_err());
    refused("leave_group", "members", s.leave_group("g", "m", T).unwrap_err());
    client(DIRECT).batch_execute(&format!("DROP TABLE IF EXISTS public.\"{table}\"")).unwrap();
}
