//! Shared helpers for the PostgreSQL suites: DSNs, a plain client, and a TCP
//! proxy that can swallow packets.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The timings of every PostgreSQL elector test. The invariant holds:
/// 400 + 2*500 + 100 = 1500 ms <= 2500 - 250 = 2250 ms.
pub const TIMING: leaderelection::Timing = leaderelection::Timing {
    lease_duration: Duration::from_millis(2500),
    renew_interval: Duration::from_millis(400),
    retry_period: Duration::from_millis(300),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_millis(250),
};

/// An elector config with [`TIMING`].
pub fn config(store: leaderelection::postgres::PostgresStore, name: &str, id: &str) -> leaderelection::Config {
    leaderelection::Config::new(store, name).identity(id).timing(TIMING)
}

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

pub fn random_tag() -> String {
    let mut r = [0u8; 5];
    getrandom::fill(&mut r).unwrap();
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// Polls `f` every 20 ms until it returns true or `within` passes.
pub fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP proxy to a server that, when told to, swallows everything in both
/// directions (a path that drops packets; the server itself stays fine).
pub struct Proxy {
    pub port: u16,
    swallow: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
}

impl Proxy {
    pub fn start(target: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let swallow = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let (sw, op) = (Arc::clone(&swallow), Arc::clone(&open));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect((target.0.as_str(), target.1)) else { continue };
                op.fetch_add(1, Ordering::SeqCst);
                let live = Arc::new(AtomicUsize::new(2));
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let (sw, op, live) = (Arc::clone(&sw), Arc::clone(&op), Arc::clone(&live));
                    thread::spawn(move || {
                        pump(from, to, &sw);
                        if live.fetch_sub(1, Ordering::SeqCst) == 1 {
                            op.fetch_sub(1, Ordering::SeqCst);
                        }
                    });
                }
            }
        });
        Proxy { port, swallow, open }
    }

    pub fn swallow(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }

    /// Proxied connections still open at either end.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, swallow: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if swallow.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
