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

/// Checks that renewals stay HOT updates: they write no index, so each new
/// version stays on its page while the page has room, and the server
/// counts every one HOT. `renew` renews every one of `names` (held by
/// "a" with `fences`) once; the check claims 10 terms on `table` through
/// `store`, renews them 3 times, then changes an indexed column once
/// itself, which the server must count as not HOT (the control: the count
/// tells the two apart).
///
/// Whether a page has room after many renewals depends on the whole
/// server: it prunes old versions only behind its oldest open transaction,
/// in any database (measured: 102 of 300 renewals HOT with one held open;
/// CI once counted 264 of 300 with the other suites running beside it).
/// So the check holds such a transaction open throughout, leaving nothing
/// to prune, and renews within the room a page has without pruning: 40
/// versions where about 60 fit (measured: 10 terms renewed 6 times spill
/// 9 of 60 onto another page).
pub fn assert_renewals_are_hot(
    store: leaderelection::postgres::PostgresStore, table: &str,
    renew: impl Fn(&leaderelection::postgres::PostgresStore, &[String], &[u64]),
) {
    use leaderelection::Store;
    use std::time::{Duration, Instant};
    const TERMS: usize = 10;
    const ROUNDS: usize = 3;
    let (ttl, timeout) = (Duration::from_secs(60), Duration::from_secs(5));
    let mut neighbour = client(DIRECT);
    let mut open = neighbour.transaction().expect("BEGIN");
    open.batch_execute("SELECT txid_current()").expect("an open transaction that holds an xid");
    let names: Vec<String> = (0..TERMS).map(|i| format!("hot-{i}")).collect();
    let fences: Vec<u64> =
        names.iter().map(|n| store.acquire(n, "a", ttl, b"p", timeout).expect("claim").fence).collect();
    for _ in 0..ROUNDS {
        renew(&store, &names, &fences);
    }
    drop(store); // closing its sessions makes their backends flush statistics
    let mut c = client(DIRECT);
    c.batch_execute(&format!("UPDATE public.\"{table}\" SET name = name || '/moved' WHERE name = 'hot-0'"))
        .expect("the control update");
    drop(c);
    drop(open);
    let renewals = i64::try_from(TERMS * ROUNDS).expect("small");
    let count = format!(
        "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'public.\"{table}\"'::regclass"
    );
    let mut c = client(DIRECT);
    let deadline = Instant::now() + Duration::from_secs(15);
    let counts = loop {
        let rows = c.simple_query(&count).unwrap_or_else(|e| panic!("{count}: {e}"));
        let counts = rows
            .iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .map(|row| {
                let mut it = row.split(' ').map(|x| x.parse::<i64>().expect("a count"));
                (it.next().unwrap_or(0), it.next().unwrap_or(0))
            })
            .unwrap_or((0, 0));
        if counts.0 > renewals || Instant::now() >= deadline {
            break counts;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(counts.0 > renewals, "statistics never showed the {renewals} renewals and the control: {counts:?}");
    assert_eq!(counts, (renewals + 1, renewals), "(updates, HOT): every renewal HOT, the control not");
}
