//! A replicated MariaDB owned by one scenario: a primary and a replica
//! ([`MariaPair`]), and one address that follows the primary
//! ([`MovingProxy`]), for the database failing over underneath a fleet
//! (issue 18).
//!
//! Both nodes are [`MariaServer`]s (a copy of the chaos template each, run
//! with `--user=mysql` on a free port of 127.0.0.1, gone when dropped), with
//! the binary log on (row format, `log_slave_updates`, GTID strict mode) and
//! server ids 1 and 2. Both start from the same template, so they hold the
//! same data before the first binlogged write: the replica needs no copy,
//! only `CHANGE MASTER TO … MASTER_USE_GTID = slave_pos` and `START SLAVE`,
//! and replays the primary's binlog from its first event. The replica runs
//! with `read_only = 1`: user `le` (no SUPER, no READ_ONLY ADMIN) cannot
//! write there, replication can.
//!
//! [`MariaMode::SemiSync`] uses the semi-synchronous replication built into
//! the server since 10.3 (no plugin to load), waiting AFTER_SYNC: a commit
//! is acknowledged to the client once the replica has the transaction in
//! its relay log. The primary falls back to asynchronous replication, by
//! itself, when no ack comes within `rpl_semi_sync_master_timeout` (here
//! [`SEMI_SYNC_TIMEOUT`]); [`MariaPair::semi_sync_active`] tells whether it
//! did.
//!
//! A primary killed here stays down; one demoted by
//! [`MariaPair::switchover`] stays up, read-only and replicating from
//! nobody. Making either writable again beside the promoted replica would
//! give two writable primaries: that is what an operator must never let
//! happen, and nothing in an election on top can make it safe.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;

use super::maria_server::MariaServer;
use super::replicated::Nodes;
use super::wait_for;

/// How long replication may take to start, catch up or drain.
const REPLICA_WAIT: Duration = Duration::from_secs(30);
/// `rpl_semi_sync_master_timeout` of a [`MariaMode::SemiSync`] primary.
pub const SEMI_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// How the primary acknowledges commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MariaMode {
    /// Commits return once in the primary's binlog; the replica follows.
    Async,
    /// Semi-synchronous, AFTER_SYNC: a commit returns once the replica has
    /// it in its relay log (or after [`SEMI_SYNC_TIMEOUT`] without an ack,
    /// when the primary falls back to async).
    SemiSync,
    /// Asynchronous, with statement-based binary logging: the replica runs
    /// the primary's statements again (what MySQL's statement-based
    /// replication does, and where a statement's `@@server_id` is the
    /// replica's own).
    Statement,
}

/// A MariaDB primary (node 0 at first) and a GTID replica of it (node 1),
/// and a [`MovingProxy`] in front of the primary. Dropping it kills both
/// servers, removes their directories and closes the proxy.
pub struct MariaPair {
    nodes: Nodes<MariaServer, MariaMode>,
    proxy: MovingProxy,
}

impl Deref for MariaPair {
    type Target = Nodes<MariaServer, MariaMode>;

    fn deref(&self) -> &Nodes<MariaServer, MariaMode> {
        &self.nodes
    }
}

impl MariaPair {
    /// Starts both servers and replication in `mode`; on return the replica
    /// replicates (in [`MariaMode::SemiSync`], semi-synchronously) and has
    /// applied everything, and the proxy leads to the primary.
    ///
    /// # Panics
    ///
    /// Without root or MariaDB (run `bash scripts/test.sh`), or when a step
    /// does not finish within 30 s.
    pub fn start(mode: MariaMode) -> MariaPair {
        preflight();
        let began = Instant::now();
        let opts = |id: u32| {
            let mut o: Vec<String> = [
                "--log-bin=mariadb-bin",
                "--relay-log=relay-bin",
                if mode == MariaMode::Statement { "--binlog-format=STATEMENT" } else { "--binlog-format=ROW" },
                "--log-slave-updates=ON",
                "--gtid-strict-mode=ON",
            ]
            .map(String::from)
            .to_vec();
            o.push(format!("--server-id={id}"));
            match (id, mode) {
                (1, MariaMode::SemiSync) => o.extend([
                    "--rpl-semi-sync-master-enabled=ON".into(),
                    "--rpl-semi-sync-master-wait-point=AFTER_SYNC".into(),
                    format!("--rpl-semi-sync-master-timeout={}", SEMI_SYNC_TIMEOUT.as_millis()),
                ]),
                (2, MariaMode::SemiSync) => o.push("--rpl-semi-sync-slave-enabled=ON".into()),
                _ => {}
            }
            if id == 2 {
                o.push("--read-only=ON".into());
            }
            o
        };
        let start = |id: u32| {
            let o = opts(id);
            MariaServer::start_with(&o.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let (primary, replica) = thread::scope(|s| {
            let other = s.spawn(|| start(2));
            (start(1), other.join().unwrap())
        });
        let proxy = MovingProxy::start(addr(&primary));
        let pair = MariaPair { nodes: Nodes::new(primary, replica, mode), proxy };
        pair.replica().query(&format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root', \
             MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1, \
             MASTER_HEARTBEAT_PERIOD = 1",
            pair.primary().port()
        ));
        pair.replica().query("START SLAVE");
        let running = wait_for(REPLICA_WAIT, || {
            let st = slave_status(pair.replica());
            st.get("Slave_IO_Running").map(String::as_str) == Some("Yes")
                && st.get("Slave_SQL_Running").map(String::as_str) == Some("Yes")
        });
        if !running {
            pair.fail(&format!(
                "replication is not running within {REPLICA_WAIT:?}: {:?}",
                slave_status(pair.replica())
            ));
        }
        if mode == MariaMode::SemiSync && !wait_for(REPLICA_WAIT, || pair.semi_sync_active()) {
            pair.fail("semi-sync replication did not become active within 30 s");
        }
        if !pair.wait_caught_up(REPLICA_WAIT) {
            pair.fail("the replica did not catch up within 30 s");
        }
        MariaPair { nodes: pair.nodes.started(began), ..pair }
    }

    /// The other node: the replica (after a promotion, the old primary).
    pub fn replica(&self) -> &MariaServer {
        self.other()
    }

    /// User `le` through the moving address: `mysql://le:le@127.0.0.1:{proxy}/test`.
    pub fn url(&self) -> String {
        self.node(0).url_via(self.proxy.port())
    }

    /// The address that follows the primary.
    pub fn proxy(&self) -> &MovingProxy {
        &self.proxy
    }

    /// Whether the primary waits for the replica's acks right now
    /// (`Rpl_semi_sync_master_status` ON with one semi-sync client).
    pub fn semi_sync_active(&self) -> bool {
        let status = |v: &str| {
            self.primary().query(&format!(
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = '{v}'"
            ))
        };
        status("RPL_SEMI_SYNC_MASTER_STATUS") == ["ON"] && status("RPL_SEMI_SYNC_MASTER_CLIENTS") == ["1"]
    }

    /// SIGKILLs the primary; returns once it is gone. It stays down, and the
    /// moving address still leads to it until [`MariaPair::move_address`].
    pub fn kill_primary(&self) {
        self.primary().crash();
    }

    /// Promotes the replica: waits until its SQL thread has applied every
    /// event it received, then `STOP SLAVE`, `RESET SLAVE ALL`, `SET GLOBAL
    /// read_only = 0`; from then on it is [`MariaPair::primary`]. Returns
    /// how long that took. The moving address does not move by itself:
    /// call [`MariaPair::move_address`] (a separate step, as a VIP or a
    /// proxy's configuration is in real failovers).
    pub fn promote_replica(&self) -> Duration {
        let began = Instant::now();
        let r = self.replica();
        if r.query("SELECT @@read_only") != ["1"] {
            self.fail("promote_replica: the replica is not read-only (already promoted?)");
        }
        let drained = wait_for(REPLICA_WAIT, || {
            let st = slave_status(r);
            let get = |k: &str| st.get(k).cloned().unwrap_or_default();
            (get("Master_Log_File") == get("Relay_Master_Log_File")
                && get("Read_Master_Log_Pos") == get("Exec_Master_Log_Pos"))
                || get("Slave_SQL_Running_State").contains("read all relay log")
        });
        if !drained {
            self.fail(&format!("promote_replica: relay log not applied within 30 s: {:?}", slave_status(r)));
        }
        r.query("STOP SLAVE");
        r.query("RESET SLAVE ALL");
        r.set_read_only(false);
        self.promoted();
        began.elapsed()
    }

    /// Points the moving address at the current primary; connections open
    /// through it are closed (see [`MovingProxy::switch_to`]).
    pub fn move_address(&self) {
        self.proxy.switch_to(addr(self.primary()));
    }

    /// `STOP SLAVE IO_THREAD` on the replica: it receives nothing more while
    /// both servers stay up (what it has still gets applied). On a
    /// [`MariaMode::SemiSync`] pair commits then wait up to
    /// [`SEMI_SYNC_TIMEOUT`] each until the primary falls back to async.
    pub fn cut_replication(&self) {
        self.replica().query("STOP SLAVE IO_THREAD");
    }

    /// `START SLAVE IO_THREAD`.
    pub fn restore_replication(&self) {
        self.replica().query("START SLAVE IO_THREAD");
    }

    /// Transactions (GTID sequence numbers of domain 0) in the primary's
    /// binlog that the replica has not applied (0: caught up).
    pub fn lag(&self) -> u64 {
        let written = gtid_seq(&self.primary().query("SELECT @@gtid_binlog_pos"));
        let applied = gtid_seq(&self.replica().query("SELECT @@gtid_slave_pos"));
        written.saturating_sub(applied)
    }

    /// Waits until the replica has applied everything in the primary's
    /// binlog when asked; false after `within`.
    pub fn wait_caught_up(&self, within: Duration) -> bool {
        wait_for(within, || self.lag() == 0)
    }

    /// A planned switchover: the primary goes read-only (writes by `le`
    /// fail from then on, in-flight ones end first), the replica applies
    /// everything up to the primary's last GTID (`MASTER_GTID_WAIT`), is
    /// promoted, and the address moves. The old primary stays up,
    /// read-only, replicating from nobody. Returns how long the writes were
    /// refused.
    pub fn switchover(&self) -> Duration {
        let began = Instant::now();
        let old = self.primary();
        old.set_read_only(true);
        let pos = old.query("SELECT @@gtid_binlog_pos");
        let waited = self.replica().query(&format!("SELECT MASTER_GTID_WAIT('{}', 30)", pos[0]));
        if waited != ["0"] {
            self.fail(&format!("switchover: the replica did not reach {pos:?} within 30 s ({waited:?})"));
        }
        self.promote_replica();
        self.move_address();
        began.elapsed()
    }

    fn fail(&self, what: &str) -> ! {
        self.nodes.fail("MariaPair", what, |n| (n.port(), n.error_log_tail()))
    }
}

fn addr(s: &MariaServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.port()))
}

/// The sequence number of domain 0 in a GTID position (`0-1-57,1-2-3`),
/// 0 for an empty one.
fn gtid_seq(pos: &[String]) -> u64 {
    let pos = pos.first().map(String::as_str).unwrap_or("");
    pos.split(',')
        .filter_map(|g| g.trim().strip_prefix("0-"))
        .filter_map(|rest| rest.rsplit('-').next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// `SHOW SLAVE STATUS` as column name to text; empty when not a replica.
fn slave_status(s: &MariaServer) -> HashMap<String, String> {
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&s.admin_url()).unwrap())
        .prefer_socket(false)
        .tcp_connect_timeout(Some(Duration::from_secs(5)))
        .read_timeout(Some(Duration::from_secs(30)));
    let mut c = mysql::Conn::new(opts).unwrap_or_else(|e| panic!("root connection to port {}: {e}", s.port()));
    let row: Option<mysql::Row> =
        c.query_first("SHOW SLAVE STATUS").unwrap_or_else(|e| panic!("SHOW SLAVE STATUS: {e}"));
    let Some(row) = row else { return HashMap::new() };
    let names: Vec<String> = row.columns_ref().iter().map(|c| c.name_str().into_owned()).collect();
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let v = match row.as_ref(i) {
                Some(mysql::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(mysql::Value::NULL) | None => String::new(),
                Some(v) => v.as_sql(true),
            };
            (n, v)
        })
        .collect()
}

/// Fails at once, saying what to run, when this machine cannot run a pair.
fn preflight() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().next());
    assert!(
        uid == Some("0"),
        "MariaPair needs root (to run mariadbd --user=mysql): run `bash scripts/test.sh` as root"
    );
    assert!(
        std::path::Path::new("/usr/sbin/mariadbd").exists(),
        "/usr/sbin/mariadbd is missing: run `bash scripts/test.sh`, which installs MariaDB"
    );
}

/// One address (127.0.0.1:[`MovingProxy::port`]) in front of whichever
/// server is the primary, as a virtual IP or a proxy that an operator or a
/// failover tool re-points. Each connection is forwarded to the upstream
/// of the moment it was accepted. Dropping it stops listening and closes
/// every connection.
pub struct MovingProxy {
    port: u16,
    shared: Arc<Moving>,
    acceptor: Option<JoinHandle<()>>,
}

struct Moving {
    /// Held while a new connection is opened and registered, and while the
    /// upstream changes, so a move is a barrier (see `switch_to`).
    upstream: Mutex<SocketAddr>,
    conns: Mutex<Vec<Link>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    stopping: AtomicBool,
}

/// Both sockets of one proxied connection (clones of the forwarders' own).
struct Link {
    id: u64,
    client: TcpStream,
    server: TcpStream,
}

impl Link {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MovingProxy {
    /// Listens on a free port of 127.0.0.1, forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> MovingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("moving proxy: bind");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Moving {
            upstream: Mutex::new(upstream),
            conns: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let sh = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name(format!("moving-proxy-{port}"))
            .spawn(move || accept(&listener, &sh))
            .expect("spawn the moving proxy");
        MovingProxy { port, shared, acceptor: Some(acceptor) }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where new connections go.
    pub fn upstream(&self) -> SocketAddr {
        *lock(&self.shared.upstream)
    }

    /// New connections go to `upstream` from now on, and every open one is
    /// closed (both ends shut down: its client reads EOF), as when an
    /// address moves to another machine. On return no connection to the
    /// old upstream is left open.
    pub fn switch_to(&self, upstream: SocketAddr) {
        let mut up = lock(&self.shared.upstream);
        *up = upstream;
        for link in lock(&self.shared.conns).drain(..) {
            link.close();
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Proxied connections open now.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }
}

impl Drop for MovingProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes the blocking accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for link in lock(&self.shared.conns).drain(..) {
            link.close();
        }
    }
}

fn accept(listener: &TcpListener, sh: &Arc<Moving>) {
    for client in listener.incoming() {
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        sh.accepted.fetch_add(1, Ordering::SeqCst);
        let up = lock(&sh.upstream);
        // A dead upstream refuses at once on 127.0.0.1; the client then
        // sees its connection closed before any greeting.
        let Ok(server) = TcpStream::connect_timeout(&up, Duration::from_secs(2)) else { continue };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let id = sh.next_id.fetch_add(1, Ordering::SeqCst);
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) =
            (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone())
        else {
            continue;
        };
        lock(&sh.conns).push(Link { id, client: c3, server: s3 });
        drop(up);
        let ends = Arc::new(AtomicUsize::new(2));
        for (from, to) in [(client, s2), (server, c2)] {
            let (sh, ends) = (Arc::clone(sh), Arc::clone(&ends));
            thread::spawn(move || {
                forward(from, to);
                if ends.fetch_sub(1, Ordering::SeqCst) == 1 {
                    lock(&sh.conns).retain(|l| l.id != id);
                }
            });
        }
    }
}

/// Copies `from` to `to` until either end closes, then shuts both down.
fn forward(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
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
