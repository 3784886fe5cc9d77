//! The real binary against MariaDB (`LE_MYSQL_URL`). Each test holds its
//! own election; they run in parallel.

mod common;
use common::*;

#[test]
fn a_slot_runs_once_across_staggered_runs() {
    slot_runs_once(&Db::mysql());
}

#[test]
fn a_slot_killed_mid_run_stays_run_unless_retried() {
    slot_killed_mid_run(&Db::mysql());
}

#[test]
fn a_failed_slot_is_retried_on_request_and_every_names_the_day() {
    slot_failed_and_every(&Db::mysql());
}

#[test]
fn two_runs_with_one_identity_never_overlap() {
    one_identity(&Db::mysql());
}

#[test]
fn two_tools_contend_and_children_never_overlap() {
    contention(&Db::mysql());
}

#[test]
fn sigkill_of_the_leading_tool_kills_its_child_and_hands_over_after_the_lease() {
    sigkill_handover(&Db::mysql());
}

#[test]
fn swallowed_database_stops_the_child_before_the_deadline_and_exits_79() {
    swallowed(&Db::mysql(), false);
}

#[test]
fn sigterm_is_forwarded_and_the_lease_released() {
    sigterm_forwarded(&Db::mysql());
}

#[test]
fn child_environment_and_status() {
    env_and_status(&Db::mysql());
}

#[test]
fn exit_codes_with_a_server() {
    exit_codes(&Db::mysql());
}

#[test]
fn bad_credentials_are_fatal_and_not_echoed() {
    let db = Db::mysql();
    let dsn = db.dsn.replacen("root@", &format!("le_cli_nobody:{PASSWORD}@"), 1);
    fatal_login(&db, &dsn);
}

#[test]
fn the_sentinel_stays_quiet_while_the_tool_lives() {
    sentinel_quiet(&Db::mysql());
}

#[test]
fn loop_campaigns_again_after_losing_leadership() {
    loop_after_loss(&Db::mysql());
}

#[test]
fn loop_leaves_no_zombies() {
    no_zombies_in_loop(&Db::mysql());
}

#[test]
fn the_childs_lease_check_passes_in_the_term_and_fails_after_it() {
    checked_writes(&Db::mysql());
}
