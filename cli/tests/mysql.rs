//! The real binary against MariaDB (`LE_MYSQL_URL`). Each test holds its
//! own election; they run in parallel.

mod common;
use common::*;

every_server_case!(Db::mysql());

#[test]
fn bad_credentials_are_fatal_and_not_echoed() {
    let db = Db::mysql();
    let dsn = db.dsn.replacen("root@", &format!("le_cli_nobody:{PASSWORD}@"), 1);
    fatal_login(&db, &dsn);
}
