//! Real electors over PostgreSQL, directly and through PgBouncer in
//! transaction mode. Run with `bash scripts/test.sh` (it exports the DSNs).
//!
//! Timings are short (lease 2.5 s) and satisfy the invariant
//! `renew 400 ms + 2*timeout 500 ms + retry delay 100 ms <= lease 2.5 s - margin 250 ms`.
//!
//! The scenarios are those of tests/mysql_elector.rs, written once in
//! tests/support/elector.rs; this file runs each on both paths and adds what
//! is PostgreSQL's own (the role, the row lock, SQLSTATEs).

mod pg_support;
mod support;

use std::sync::Once;
use std::time::Duration;

use leaderelection::postgres::PostgresStore;
use pg_support::{client, direct_and_pgbouncer, dsn, dsn_via, host_port, BOUNCER, DIRECT};
use support::elector as scenario;

const TABLE: &str = "le_elector";

fn store_on(d: &str, table: &str) -> PostgresStore {
    PostgresStore::builder(d).table("public", table).build().expect("store")
}

fn store(var: &str) -> PostgresStore {
    let s = store_on(&dsn(var), TABLE);
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema via {var}: {e}"));
    s
}

fn fleet_elects_exactly_one(var: &str) {
    let (f, leader) = scenario::fleet_elects_exactly_one(|| store(var));
    assert_eq!(f[leader].status().fence, f[leader].fence());
}

direct_and_pgbouncer!(fleet_elects_exactly_one: fleet_of_three_elects_exactly_one_direct, fleet_of_three_elects_exactly_one_pgbouncer);

fn crashed_leader_is_replaced(var: &str) {
    scenario::crashed_leader_is_replaced(var, || store(var));
}

direct_and_pgbouncer!(crashed_leader_is_replaced: crashed_leader_is_replaced_after_the_lease_direct, crashed_leader_is_replaced_after_the_lease_pgbouncer);

fn clean_shutdown_hands_over(var: &str) {
    scenario::clean_shutdown_hands_over(var, || store(var));
}

direct_and_pgbouncer!(clean_shutdown_hands_over: clean_shutdown_hands_over_within_a_retry_period_direct, clean_shutdown_hands_over_within_a_retry_period_pgbouncer);

static LIMITED_ROLE: Once = Once::new();

/// A role with only SELECT, INSERT and UPDATE on the table can elect.
fn limited_role_works(var: &str) {
    store(DIRECT);
    LIMITED_ROLE.call_once(|| {
        client(DIRECT)
            .batch_execute(&format!(
                "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'le_limited') \
                 THEN CREATE ROLE le_limited LOGIN; END IF; END$$; \
                 REVOKE ALL ON public.{TABLE} FROM le_limited; \
                 GRANT SELECT, INSERT, UPDATE ON public.{TABLE} TO le_limited;"
            ))
            .expect("create the limited role");
    });
    let (host, port) = host_port(var);
    let d = dsn_via(var, &host, port, Some("le_limited"), "");
    scenario::limited_login_works("role", TABLE, |t| store_on(&d, t), |t| store_on(&d, t).ensure_schema());
}

direct_and_pgbouncer!(limited_role_works: role_with_select_insert_update_only_works_direct, role_with_select_insert_update_only_works_pgbouncer);

/// A missing table is fatal (SQLSTATE 42P01); the table is created and
/// dropped again on the direct path.
fn missing_table_is_fatal(var: &str) {
    scenario::missing_table_is_fatal(
        var,
        |t| store_on(&dsn(var), t),
        &["does not exist", "42P01"],
        |t| store_on(&dsn(DIRECT), t).ensure_schema().expect("create the table"),
        |t| client(DIRECT).batch_execute(&format!("DROP TABLE public.\"{t}\"")).unwrap(),
    );
}

direct_and_pgbouncer!(missing_table_is_fatal: missing_table_is_fatal_and_reported_direct, missing_table_is_fatal_and_reported_pgbouncer);

/// The row is locked by `SELECT ... FOR UPDATE` in another session's open
/// transaction; the elector is shut down with its guard still held.
fn locked_row(var: &str) {
    let mut locker = client(var);
    let locker = &mut locker;
    let (e, _g) = scenario::locked_row(
        var,
        || store(var),
        move |name| {
            let mut tx = locker.transaction().unwrap();
            tx.batch_execute(&format!("SELECT * FROM {TABLE} WHERE name = '{name}' FOR UPDATE")).unwrap();
            tx
        },
        |tx| tx.rollback().unwrap(),
    );
    e.shutdown().unwrap();
}

direct_and_pgbouncer!(locked_row: locked_election_row_times_out_and_recovers_direct, locked_election_row_times_out_and_recovers_pgbouncer);

fn swallowing_path(var: &str) {
    store(var);
    let make = |port| {
        let d = dsn_via(var, "127.0.0.1", port, None, "");
        PostgresStore::builder(&d).table("public", TABLE).connect_timeout(Duration::from_millis(500)).build().unwrap()
    };
    scenario::swallowing_path(var, make, host_port(var));
}

direct_and_pgbouncer!(swallowing_path: swallowing_path_steps_down_and_recovers_direct, swallowing_path_steps_down_and_recovers_pgbouncer);

/// A store picked from the DSN by `leaderelection::connect`, boxed as a
/// `Box<dyn Store>`, elects as the concrete store does.
#[test]
fn a_store_from_connect_in_a_box_elects() {
    let store = leaderelection::connect_table(&dsn(DIRECT), Some(&format!("public.{TABLE}"))).expect("connect");
    store.ensure_schema().expect("ensure_schema");
    let boxed: Box<dyn leaderelection::Store> = Box::new(store);
    let name = format!("connect-{}", support::random_tag());
    let e = leaderelection::Elector::start(support::config(boxed, &name, "a")).expect("start");
    assert!(e.wait_leader_timeout(Duration::from_secs(10)).is_ok(), "{}", e.status());
    e.shutdown().unwrap();
}
