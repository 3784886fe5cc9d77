//! Helpers for the MySQL/MariaDB suites: URLs and a plain admin
//! connection. The helpers every database suite shares (timings, `wait_for`,
//! the proxy) are in `tests/support`; a suite declares both modules.
#![allow(dead_code)]

pub mod claims;

use mysql::prelude::Queryable;

pub const SHARED: &str = "LE_MYSQL_URL";
pub const PRIVATE: &str = "LE_MYSQL_PAUSE_URL";

/// The URL in `var`, or a failure that says how to run the suite.
pub fn url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set. The MySQL suites need MariaDB on 127.0.0.1:3306 and a private instance: run \
             `bash scripts/test.sh` (or `source scripts/mysql.sh` first), which installs and starts them and \
             exports LE_MYSQL_URL, LE_MYSQL_PAUSE_URL and LE_MYSQL_PAUSE_PID_FILE."
        )
    })
}

/// `var`'s URL for another user (and password), host, port and parameters.
pub fn url_via(var: &str, user: &str, host: &str, port: u16, params: &str) -> String {
    let opts = mysql::Opts::from_url(&url(var)).expect("test URL parses");
    let db = opts.get_db_name().unwrap_or("test");
    format!("mysql://{user}@{host}:{port}/{db}{params}")
}

/// The URL of `user`, a user of its own on the shared server allowed only
/// to read and write `table` (created if need be): a test tells its
/// store's sessions apart in the process list by it.
pub fn own_user_url(c: &mut mysql::Conn, user: &str, table: &str) -> String {
    exec(c, &format!("CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1'"));
    exec(c, &format!("GRANT SELECT, INSERT, UPDATE ON test.{table} TO '{user}'@'127.0.0.1'"));
    url_via(SHARED, user, "127.0.0.1", port(SHARED), "")
}

/// A store on `table` through `var`'s URL, with its schema ensured.
pub fn store_on(var: &str, table: &str) -> leaderelection::mysql::MySqlStore {
    let s = leaderelection::mysql::MySqlStore::builder(&url(var)).table(table).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema via {var}: {e}"));
    s
}

pub fn port(var: &str) -> u16 {
    mysql::Opts::from_url(&url(var)).expect("test URL parses").get_tcp_port()
}

/// A plain connection over TCP, for setting up and breaking things.
pub fn admin(var: &str) -> mysql::Conn {
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&url(var)).unwrap()).prefer_socket(false);
    mysql::Conn::new(opts).unwrap_or_else(|e| panic!("admin connection on {var}: {e}"))
}

pub fn exec(c: &mut mysql::Conn, q: &str) {
    c.query_drop(q).unwrap_or_else(|e| panic!("{q}: {e}"));
}
