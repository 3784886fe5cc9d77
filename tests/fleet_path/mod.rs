//! The way a fleet's workers reach the election's database, shared by the
//! multi-process chaos suites (`group_support`, `ledger_support`), which
//! include this file as a module of their own.

use std::fmt;
use std::net::SocketAddr;

use crate::mysql_support::{self, SHARED};
use crate::pg_support::{self, BOUNCER, DIRECT};

/// The way the workers reach the election's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// PostgreSQL, directly.
    Pg,
    /// PostgreSQL through PgBouncer in transaction mode.
    Bouncer,
    /// MariaDB.
    Maria,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Pg => "postgres",
            Path::Bouncer => "pgbouncer",
            Path::Maria => "mariadb",
        }
    }

    pub fn parse(s: &str) -> Path {
        match s {
            "postgres" => Path::Pg,
            "pgbouncer" => Path::Bouncer,
            "mariadb" => Path::Maria,
            _ => panic!("unknown path {s:?}"),
        }
    }

    /// The variable holding the URL of this path (it fails with how to set
    /// it when missing).
    fn var(self) -> &'static str {
        match self {
            Path::Pg => DIRECT,
            Path::Bouncer => BOUNCER,
            Path::Maria => SHARED,
        }
    }

    /// Where the workers' fault proxies forward to.
    pub fn upstream(self) -> SocketAddr {
        if self == Path::Maria {
            return SocketAddr::from(([127, 0, 0, 1], mysql_support::port(SHARED)));
        }
        let (host, port) = pg_support::host_port(self.var());
        let ip = if host == "localhost" { "127.0.0.1".to_owned() } else { host };
        SocketAddr::new(ip.parse().expect("the test server's host is an IP address"), port)
    }

    /// The URL a worker uses, through local port `port` (its proxy's).
    pub fn url_via(self, port: u16) -> String {
        match self {
            Path::Maria => mysql_support::url_via(SHARED, "root", "127.0.0.1", port, ""),
            _ => pg_support::dsn_via(self.var(), "127.0.0.1", port, None, ""),
        }
    }
}
