//! Shared helpers for the MySQL/MariaDB suites: URLs, a plain admin
//! connection, and a TCP proxy that can swallow everything.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use mysql::prelude::Queryable;

/// The timings of every MySQL elector test (those of the PostgreSQL ones).
/// The invariant holds: 400 + 2*500 + 100 = 1500 ms <= 2500 - 250 = 2250 ms.
pub const TIMING: leaderelection::Timing = leaderelection::Timing {
    lease_duration: Duration::from_millis(2500),
    renew_interval: Duration::from_millis(400),
    retry_period: Duration::from_millis(300),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_millis(250),
};

pub const SHARED: &str = "LE_MYSQL_URL";
pub const PRIVATE: &str = "LE_MYSQL_PAUSE_URL";

/// An elector config with [`TIMING`].
pub fn config(store: MySqlStore, name: &str, id: &str) -> leaderelection::Config {
    leaderelection::Config::new(store, name).identity(id).timing(TIMING)
}

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

/// A TCP proxy in front of a server; when told to, it forwards nothing in
/// either direction (a path that drops every packet; the server is fine).
pub struct Proxy {
    pub port: u16,
    swallow: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    delay_ms: Arc<AtomicU64>,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let swallow = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (sw, op, dl) = (Arc::clone(&swallow), Arc::clone(&open), Arc::clone(&delay_ms));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let (sw, op) = (Arc::clone(&sw), Arc::clone(&op));
                let delay = Duration::from_millis(dl.load(Ordering::SeqCst));
                thread::spawn(move || {
                    // A slow path: the server hears of the connection (and
                    // so sends its greeting) only after the delay.
                    thread::sleep(delay);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target_port)) else { return };
                    op.fetch_add(1, Ordering::SeqCst);
                    let ends = Arc::new(AtomicUsize::new(2));
                    for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                        let (sw, op, ends) = (Arc::clone(&sw), Arc::clone(&op), Arc::clone(&ends));
                        thread::spawn(move || {
                            forward(from, to, &sw);
                            if ends.fetch_sub(1, Ordering::SeqCst) == 1 {
                                op.fetch_sub(1, Ordering::SeqCst);
                            }
                        });
                    }
                });
            }
        });
        Proxy { port, swallow, open, delay_ms }
    }

    /// Connections accepted from now on reach the server only after `d`.
    pub fn delay_connections(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn swallow(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }

    /// Proxied connections still open at either end.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

fn forward(mut from: TcpStream, mut to: TcpStream, swallow: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) if swallow.load(Ordering::SeqCst) => {
                let _ = n;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
