//! The real binary against PostgreSQL (`LE_PG_DSN`). Each test holds its
//! own election; they run in parallel.

mod common;
use common::*;

#[test]
fn a_slot_runs_once_across_staggered_runs() {
    slot_runs_once(&Db::pg());
}

#[test]
fn a_slot_killed_mid_run_stays_run_unless_retried() {
    slot_killed_mid_run(&Db::pg());
}

#[test]
fn a_failed_slot_is_retried_on_request_and_every_names_the_day() {
    slot_failed_and_every(&Db::pg());
}

#[test]
fn two_runs_with_one_identity_never_overlap() {
    one_identity(&Db::pg());
}

#[test]
fn two_tools_contend_and_children_never_overlap() {
    contention(&Db::pg());
}

#[test]
fn sigkill_of_the_leading_tool_kills_its_child_and_hands_over_after_the_lease() {
    sigkill_handover(&Db::pg());
}

#[test]
fn swallowed_database_stops_the_child_before_the_deadline_and_exits_79() {
    swallowed(&Db::pg(), false);
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_before_the_deadline() {
    swallowed(&Db::pg(), true);
}

#[test]
fn sigterm_is_forwarded_and_the_lease_released() {
    sigterm_forwarded(&Db::pg());
}

#[test]
fn child_environment_and_status() {
    env_and_status(&Db::pg());
}

#[test]
fn exit_codes_with_a_server() {
    exit_codes(&Db::pg());
}

#[test]
fn unknown_database_with_a_password_is_fatal_and_not_echoed() {
    let db = Db::pg();
    let (head, tail) = db.dsn.rsplit_once('/').unwrap();
    let dsn = format!("{}/le_cli_no_such_db", head.replacen("root@", &format!("root:{PASSWORD}@"), 1));
    assert!(!tail.is_empty());
    fatal_login(&db, &dsn);
}

#[test]
fn the_sentinel_stays_quiet_while_the_tool_lives() {
    sentinel_quiet(&Db::pg());
}

#[test]
fn loop_campaigns_again_after_losing_leadership() {
    loop_after_loss(&Db::pg());
}

#[test]
fn loop_leaves_no_zombies() {
    no_zombies_in_loop(&Db::pg());
}

#[test]
fn the_childs_lease_check_passes_in_the_term_and_fails_after_it() {
    checked_writes(&Db::pg());
}
