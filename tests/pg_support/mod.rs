//! Helpers for the PostgreSQL suites: DSNs and a plain client. The helpers
//! every database suite shares (timings, `wait_for`, the proxy) are in
//! `tests/support`; a suite declares both modules.
#![allow(dead_code)]

use std::str::FromStr;

pub const DIRECT: &str = "LE_PG_DSN";
pub const BOUNCER: &str = "LE_PGBOUNCER_DSN";

/// The DSN in `var`, or a failure that says how to run the suite.
pub fn dsn(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set. The PostgreSQL suites need a server and PgBouncer: run `bash scripts/test.sh` \
             (or `source scripts/db.sh` first), which starts both and exports LE_PG_DSN and LE_PGBOUNCER_DSN."
        )
    })
}

/// A plain client on the same database (simple queries only, so it works
/// through PgBouncer too).
pub fn client(var: &str) -> postgres::Client {
    postgres::Client::connect(&dsn(var), postgres::NoTls).unwrap_or_else(|e| panic!("plain client on {var}: {e}"))
}

/// Host and port of the DSN in `var`.
pub fn host_port(var: &str) -> (String, u16) {
    let cfg = tokio_postgres::Config::from_str(&dsn(var)).expect("test DSN parses");
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => panic!("test DSN must use TCP"),
    };
    (host, cfg.get_ports().first().copied().unwrap_or(5432))
}

/// `var`'s DSN pointed at another port and user, with extra parameters.
pub fn dsn_via(var: &str, host: &str, port: u16, user: Option<&str>, params: &str) -> String {
    let cfg = tokio_postgres::Config::from_str(&dsn(var)).expect("test DSN parses");
    let user = user.or(cfg.get_user()).unwrap_or("root");
    let db = cfg.get_dbname().unwrap_or("test");
    format!("postgres://{user}@{host}:{port}/{db}{params}")
}

/// A store on `public.{table}` through `var`'s DSN, with its schema ensured.
pub fn store_on(var: &str, table: &str) -> leaderelection::postgres::PostgresStore {
    let s = leaderelection::postgres::PostgresStore::builder(&dsn(var)).table("public", table).build().expect("store");
    s.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema via {var}: {e}"));
    s
}

/// Declares the tests `$direct` and `$bouncer`: `$flow(var)` run on the
/// server directly and through PgBouncer (with `store`: `$flow(var,
/// &store(var))`, the suite's own `store`).
#[allow(unused_macros)]
macro_rules! direct_and_pgbouncer {
    ($flow:ident with store: $direct:ident, $bouncer:ident) => {
        #[test]
        fn $direct() {
            $flow(DIRECT, &store(DIRECT));
        }

        #[test]
        fn $bouncer() {
            $flow(BOUNCER, &store(BOUNCER));
        }
    };
    ($flow:ident: $direct:ident, $bouncer:ident) => {
        #[test]
        fn $direct() {
            $flow(DIRECT);
        }

        #[test]
        fn $bouncer() {
            $flow(BOUNCER);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use direct_and_pgbouncer;
