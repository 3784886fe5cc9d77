//! The real binary against PostgreSQL (`LE_PG_DSN`). Each test holds its
//! own election; they run in parallel.

mod common;
use common::*;

every_server_case!(Db::pg());

#[test]
fn a_child_that_ignores_sigterm_is_killed_before_the_deadline() {
    swallowed(&Db::pg(), true);
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
fn a_child_reading_the_terminal_gets_it() {
    terminal_child(&Db::pg());
}
