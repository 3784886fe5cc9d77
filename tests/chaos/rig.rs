//! The ground a scenario stands on: which path (PostgreSQL direct, through
//! PgBouncer, MariaDB), which servers (the machine's shared ones, for faults
//! on the network only, or servers of the scenario's own, for faults that
//! break a server), and a fleet of participants each behind a fault proxy of
//! its own, all judged by one [`Oracle`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::Store;

use crate::support::faults::{Fault, FaultProxy};
use crate::support::maria_server::{self, MariaServer};
use crate::support::oracle::{Behaviour, Oracle, Participant, Report, Skewed};
use crate::support::pg_server::{self, Bouncer, PgServer};
use crate::support::{random_tag, TIMING};

pub const LEASE: Duration = TIMING.lease_duration;
pub const RETRY: Duration = TIMING.retry_period;
pub const RENEW: Duration = TIMING.renew_interval;
pub const OP: Duration = TIMING.operation_timeout;

/// The bound the suite states for someone to lead again once a fault
/// heals (or a leader is gone); see [`crate::support::RECOVERY`].
pub use crate::support::RECOVERY;

/// The way the participants reach the election's database, as the
/// multi-process chaos suites name it.
pub use crate::fleet_path::Path;

enum Servers {
    /// The machine's servers (`LE_PG_DSN`, `LE_PGBOUNCER_DSN`,
    /// `LE_MYSQL_URL`): faults on the proxies only, never on them.
    Shared,
    Pg(PgServer),
    Bouncer(PgServer, Bouncer),
    Maria(MariaServer),
}

/// A path, its servers and a table of the scenario's own.
pub struct Rig {
    pub path: Path,
    servers: Servers,
    pub table: String,
    /// Host and port the participants' proxies forward to.
    upstream: SocketAddr,
    /// Participants' stores connect as a user whom `read_only` does not
    /// stop by itself (MariaDB's root, with READ_ONLY ADMIN).
    privileged: bool,
    /// Participants' stores override every read-only setting (the
    /// negative control of the read-only fence, issue 37).
    overriding_read_only: bool,
}

/// A lock another session holds until this is dropped (held for its `Drop`).
#[allow(dead_code)]
pub enum Held {
    Pg(Box<pg_server::Held>),
    Maria(maria_server::Held),
}

fn shared_url(var: &str, how: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set. The chaos suite needs the machine's PostgreSQL, PgBouncer and MariaDB: run \
             `bash scripts/test.sh` (or `source scripts/db.sh; source scripts/mysql.sh` first, {how})."
        )
    })
}

fn port_of(url: &str) -> u16 {
    let after_at = url.rsplit('@').next().unwrap_or(url);
    let hostport = after_at.split('/').next().unwrap_or(after_at);
    hostport.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {url}"))
}

impl Rig {
    /// The machine's servers, for scenarios that break only the network.
    pub fn shared(path: Path) -> Rig {
        let var = match path {
            Path::Pg => "LE_PG_DSN",
            Path::Bouncer => "LE_PGBOUNCER_DSN",
            Path::Maria => "LE_MYSQL_URL",
        };
        let port = port_of(&shared_url(var, "which export it"));
        Rig::new(path, Servers::Shared, port)
    }

    /// Servers of the scenario's own, free to break.
    pub fn owned(path: Path) -> Rig {
        Rig::owned_with_pool(path, 20)
    }

    /// As [`Rig::owned`], with this many PgBouncer server connections.
    pub fn owned_with_pool(path: Path, bouncer_pool: u32) -> Rig {
        match path {
            Path::Pg => {
                let pg = PgServer::start();
                let port = pg.port();
                Rig::new(path, Servers::Pg(pg), port)
            }
            Path::Bouncer => {
                let pg = PgServer::start();
                let b = Bouncer::start(pg.port(), bouncer_pool);
                let port = b.port();
                Rig::new(path, Servers::Bouncer(pg, b), port)
            }
            Path::Maria => {
                let m = MariaServer::start();
                let port = m.port();
                Rig::new(path, Servers::Maria(m), port)
            }
        }
    }

    fn new(path: Path, servers: Servers, port: u16) -> Rig {
        let rig = Rig {
            path,
            servers,
            table: format!("chaos_{}", random_tag()),
            upstream: SocketAddr::from(([127, 0, 0, 1], port)),
            privileged: false,
            overriding_read_only: false,
        };
        rig.store_at(port, true);
        rig
    }

    /// Participants connect as a user with every privilege (MariaDB's
    /// root: `read_only` alone does not stop its writes).
    pub fn privileged(mut self) -> Rig {
        self.privileged = true;
        self
    }

    /// Participants' stores override every read-only setting, as writes
    /// did before issue 37: the negative control.
    pub fn overriding_read_only(mut self) -> Rig {
        self.overriding_read_only = true;
        self
    }

    /// The URL of the database through local port `port`.
    fn url_at(&self, port: u16) -> String {
        match (&self.servers, self.path) {
            (Servers::Maria(_), _) if self.privileged => format!("mysql://root@127.0.0.1:{port}/test"),
            (Servers::Shared, Path::Maria) => format!("mysql://root@127.0.0.1:{port}/test"),
            (Servers::Shared, _) => format!("postgres://root@127.0.0.1:{port}/test"),
            (Servers::Pg(pg), _) | (Servers::Bouncer(pg, _), _) => pg.url_via(port),
            (Servers::Maria(m), _) => m.url_via(port),
        }
    }

    /// A store of the scenario's table, reaching the database through
    /// local port `port` (a proxy's, or the server's own); with `schema`,
    /// it creates the table first.
    fn store_at(&self, port: u16, schema: bool) -> Arc<dyn Store> {
        let url = self.url_at(port);
        let built = match self.path {
            Path::Maria => MySqlStore::builder(&url).table(self.table.clone()).build().map(|s| {
                let done = if schema { s.ensure_schema() } else { Ok(()) };
                let s = if self.overriding_read_only { s.__overriding_read_only() } else { s };
                (Arc::new(s) as Arc<dyn Store>, done)
            }),
            _ => PostgresStore::builder(&url).table("public", self.table.clone()).build().map(|s| {
                let done = if schema { s.ensure_schema() } else { Ok(()) };
                let s = if self.overriding_read_only { s.__overriding_read_only() } else { s };
                (Arc::new(s) as Arc<dyn Store>, done)
            }),
        };
        let (store, done) = built.unwrap_or_else(|e| panic!("{e}"));
        done.unwrap_or_else(|e| panic!("ensure_schema: {e}"));
        store
    }

    fn pg(&self) -> &PgServer {
        match &self.servers {
            Servers::Pg(pg) | Servers::Bouncer(pg, _) => pg,
            _ => panic!("this scenario needs a PostgreSQL server of its own (Rig::owned)"),
        }
    }

    fn maria(&self) -> &MariaServer {
        match &self.servers {
            Servers::Maria(m) => m,
            _ => panic!("this scenario needs a MariaDB server of its own (Rig::owned)"),
        }
    }

    pub fn bouncer(&self) -> &Bouncer {
        match &self.servers {
            Servers::Bouncer(_, b) => b,
            _ => panic!("this scenario needs a PgBouncer of its own (Rig::owned(Path::Bouncer))"),
        }
    }

    /// `pg` on the scenario's own PostgreSQL server, or `maria` on its
    /// MariaDB, whichever the path has.
    fn on_server<T>(&self, pg: impl FnOnce(&PgServer) -> T, maria: impl FnOnce(&MariaServer) -> T) -> T {
        match self.path {
            Path::Maria => maria(self.maria()),
            _ => pg(self.pg()),
        }
    }

    pub fn freeze(&self) {
        self.on_server(PgServer::freeze, MariaServer::freeze)
    }

    pub fn thaw(&self) {
        self.on_server(PgServer::thaw, MariaServer::thaw)
    }

    pub fn stop(&self) {
        self.on_server(PgServer::stop, MariaServer::stop)
    }

    pub fn start_again(&self) {
        self.on_server(PgServer::start_again, MariaServer::start_again)
    }

    pub fn crash(&self) {
        self.on_server(PgServer::crash, MariaServer::crash)
    }

    /// Ends every client session on the server; how many.
    pub fn end_sessions(&self) -> usize {
        self.on_server(PgServer::terminate_backends, |m| m.kill_sessions("le"))
    }

    pub fn lock_table(&self) -> Held {
        self.on_server(|pg| Held::Pg(Box::new(pg.lock_table(&self.table))), |m| Held::Maria(m.lock_table(&self.table)))
    }

    pub fn lock_row(&self, name: &str) -> Held {
        self.on_server(
            |pg| Held::Pg(Box::new(pg.lock_row(&self.table, name))),
            |m| Held::Maria(m.lock_row(&self.table, name)),
        )
    }

    pub fn set_read_only(&self, on: bool) {
        self.on_server(|pg| pg.set_read_only(on), |m| m.set_read_only(on))
    }

    /// An operator's read-only fence on the running server, or its end:
    /// PostgreSQL's `default_transaction_read_only` set for the whole
    /// server (`ALTER SYSTEM`, then a reload: every session, pooled ones
    /// too, takes it at its next statement), MariaDB's `read_only`.
    /// Returns once a fresh session sees it.
    pub fn fence_read_only(&self, on: bool) {
        self.on_server(|pg| pg.set_default_read_only(on), |m| m.set_read_only(on))
    }
}

/// One participant and the proxy its store goes through.
struct Member {
    p: Participant,
    proxy: FaultProxy,
}

/// The participants of one election, each behind a proxy of its own.
pub struct Fleet<'r> {
    pub rig: &'r Rig,
    pub oracle: Arc<Oracle>,
    pub name: String,
    label: String,
    members: Vec<Option<Member>>,
    started: Instant,
}

impl<'r> Fleet<'r> {
    /// `n` honest participants in a new election on `rig`; `label` names
    /// the scenario in what it prints.
    pub fn start(rig: &'r Rig, label: &str, n: usize) -> Fleet<'r> {
        let mut f = Fleet {
            rig,
            oracle: Oracle::new(LEASE),
            name: format!("{label}-{}", random_tag()),
            label: format!("{}/{label}", rig.path),
            members: Vec::new(),
            started: Instant::now(),
        };
        for _ in 0..n {
            f.add(Behaviour::Honest, 0);
        }
        f
    }

    /// Adds a participant (`skew_us`: every database instant it reads moves
    /// by this much); returns its index.
    pub fn add(&mut self, behaviour: Behaviour, skew_us: i64) -> usize {
        let i = self.members.len();
        let proxy = FaultProxy::start(self.rig.upstream);
        let store = self.rig.store_at(proxy.port(), false);
        let id = format!("p{i}");
        let p = if skew_us == 0 {
            Participant::start_with(&self.oracle, &id, store, &self.name, TIMING, behaviour)
        } else {
            Participant::start_with(&self.oracle, &id, Skewed::new(store, skew_us), &self.name, TIMING, behaviour)
        };
        self.members.push(Some(Member { p, proxy }));
        i
    }

    fn member(&self, i: usize) -> &Member {
        self.members[i].as_ref().unwrap_or_else(|| panic!("participant p{i} is gone"))
    }

    pub fn proxy(&self, i: usize) -> &FaultProxy {
        &self.member(i).proxy
    }

    /// Indices of the participants still running.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.members.len()).filter(|&i| self.members[i].is_some()).collect()
    }

    /// The same fault on every running participant's path.
    pub fn set_all(&self, fault: Fault) {
        for i in self.alive() {
            self.proxy(i).set(fault.clone());
        }
    }

    /// Cuts every connection of every path now.
    pub fn reset_all(&self) {
        for i in self.alive() {
            self.proxy(i).reset_all();
        }
    }

    /// Waits for a leader; returns its index.
    pub fn leader(&self, within: Duration) -> usize {
        self.leader_other_than(None, within).0
    }

    /// Waits for a leader that is not `not`; returns its index and how long
    /// that took.
    pub fn leader_other_than(&self, not: Option<usize>, within: Duration) -> (usize, Duration) {
        let start = Instant::now();
        let deadline = start + within;
        loop {
            if let Some(id) = self.oracle.leader_now() {
                let i: usize = id[1..].parse().expect("participant ids are p<index>");
                if Some(i) != not {
                    return (i, start.elapsed());
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: no leader{} within {within:?}; oracle: {:?}",
                    self.label,
                    not.map(|n| format!(" other than p{n}")).unwrap_or_default(),
                    self.oracle.check()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Someone other than `old` leads within [`RECOVERY`]; says who took
    /// over how long after `what`, and returns who and how long.
    pub fn taken_over(&self, old: usize, what: &str) -> (usize, Duration) {
        let (n, took) = self.leader_other_than(Some(old), RECOVERY);
        self.say(&format!("p{n} took over from p{old} {} after {what}", ms(took)));
        (n, took)
    }

    /// Someone leads within [`RECOVERY`]; returns how long it took.
    pub fn recovers(&self, what: &str) -> Duration {
        let took = self.oracle.wait_leader(RECOVERY).unwrap_or_else(|| {
            panic!("{}: nobody leads within {RECOVERY:?} after {what}; oracle: {:?}", self.label, self.oracle.check())
        });
        self.say(&format!("leads again {} after {what}", ms(took)));
        took
    }

    /// Nobody holds a valid guard right now.
    pub fn nobody_leads(&self) -> bool {
        self.oracle.leader_now().is_none()
    }

    /// Like a SIGKILL of participant `i`: no release.
    pub fn crash(&mut self, i: usize) {
        let m = self.members[i].take().unwrap_or_else(|| panic!("p{i} is gone"));
        m.p.crash();
    }

    /// Graceful shutdown of participant `i` (releases the lease).
    pub fn stop(&mut self, i: usize) {
        let m = self.members[i].take().unwrap_or_else(|| panic!("p{i} is gone"));
        m.p.stop();
    }

    /// Terms the oracle has seen so far.
    pub fn terms(&self) -> usize {
        self.oracle.intervals().len()
    }

    /// One line of what the scenario measured.
    pub fn say(&self, what: &str) {
        eprintln!("chaos {} [{:>6.1} s]: {what}", self.label, self.started.elapsed().as_secs_f64());
    }

    /// Whether participant `i`'s elector says it leads.
    pub fn elector_leads(&self, i: usize) -> bool {
        self.members[i].as_ref().is_some_and(|m| m.p.is_leader())
    }

    /// The last error any running participant's elector reports, as text.
    pub fn status_of_any(&self) -> String {
        self.alive()
            .into_iter()
            .filter_map(|i| self.member(i).p.elector().status().last_error.map(|e| e.to_string()))
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Stops everyone and judges the run: panics with every violation, else
    /// prints and returns the figures. Followers go first, so the leader's
    /// release at the end hands over to nobody.
    pub fn finish(mut self) -> Report {
        let (leaders, followers): (Vec<usize>, Vec<usize>) =
            self.alive().into_iter().partition(|&i| self.elector_leads(i));
        for i in followers.into_iter().chain(leaders) {
            self.stop(i);
        }
        self.judge()
    }

    /// Stops everyone without judging (the negative control, whose run must
    /// fail the check).
    pub fn abandon(mut self) {
        for i in self.alive() {
            self.crash(i);
        }
    }

    /// Judges the run so far without stopping anyone.
    pub fn judge(&self) -> Report {
        match self.oracle.check() {
            Ok(r) => {
                eprintln!("chaos {} RESULT: {r}", self.label);
                r
            }
            Err(v) => panic!(
                "{}: the oracle found {} violation(s):\n  {}",
                self.label,
                v.len(),
                v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n  ")
            ),
        }
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Keeps `fault` on `proxy`s for `d`, then lets the path pass again.
pub fn for_a_while(fleet: &Fleet<'_>, who: &[usize], fault: Fault, d: Duration) {
    for &i in who {
        fleet.proxy(i).set(fault.clone());
    }
    std::thread::sleep(d);
    for &i in who {
        fleet.proxy(i).set(Fault::Pass);
    }
}
