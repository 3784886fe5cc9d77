//! Servers owned by one chaos scenario: a private PostgreSQL instance
//! ([`PgServer`]) and a PgBouncer in front of one ([`Bouncer`]). Each runs as
//! user `postgres` on a free port of 127.0.0.1 under its own directory in
//! /dev/shm (see [`base`]), so freezing, crashing, locking or pausing it hurts no other test,
//! and many can run at once. Dropping one stops it at once and removes its
//! directory.
//!
//! Every instance is a copy of one template cluster (initdb'd once, with the
//! database `test`, shared by every test process), so a start costs a `cp -a`
//! and a postmaster start, not an initdb. The template is built under a
//! unique name and renamed into place, so concurrent test processes never
//! see half of one.
//!
//! Signals go through `/usr/bin/kill` (no libc binding among the
//! dev-dependencies). Needs root (to run servers as `postgres`), PostgreSQL's
//! server binaries, PgBouncer and psql: `bash scripts/test.sh` installs them.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{NoTls, SimpleQueryMessage};

use super::{random_tag, wait_for};

/// Bumped whenever the template's contents or settings change, so an old
/// template left behind is never used.
const TEMPLATE_VERSION: u32 = 2;
/// Settings appended to the template's postgresql.conf. fsync and
/// full_page_writes are off (only processes crash here, never the kernel, so
/// nothing written is lost). synchronous_commit stays ON, unlike plain speed
/// tuning would have it: with it off a commit returns before its WAL leaves
/// shared memory, and a SIGKILL of the server ([`PgServer::crash`]) would
/// lose rows the store reported committed. With fsync off it costs one
/// write(2) per commit. Dynamic shared memory is files in the data
/// directory (`mmap`), so a crashed instance leaves nothing in /dev/shm.
const SETTINGS: &str = "
listen_addresses = '127.0.0.1'
max_connections = 100
shared_buffers = 16MB
fsync = off
synchronous_commit = on
full_page_writes = off
dynamic_shared_memory_type = mmap
logging_collector = off
log_destination = 'stderr'
log_line_prefix = '%m [%p] %q%a '
";
/// How long a start (including crash recovery) or a stop may take.
const SERVER_WAIT: Duration = Duration::from_secs(30);
/// Lines of a server's log quoted in a panic.
const LOG_TAIL: usize = 40;

/// A PostgreSQL server owned by one test: its own data directory (a copy of
/// the template), port and socket directory. Dropping it stops it at once
/// (SIGQUIT, then SIGKILL of the postmaster and every child if needed) and
/// removes its directory.
pub struct PgServer {
    dir: PathBuf,
    port: u16,
    /// The running postmaster; `None` while stopped or crashed.
    child: Mutex<Option<Child>>,
}

/// A transaction left open on its own connection, holding a lock. Dropping it
/// rolls back and closes the connection. (On a frozen server the rollback
/// waits for the thaw.)
pub struct Held {
    client: Option<postgres::Client>,
}

/// A PgBouncer owned by one test, in transaction mode in front of one
/// server, with trust auth and `postgres` as its admin. Dropping it kills it
/// and removes its directory.
pub struct Bouncer {
    dir: PathBuf,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl PgServer {
    /// Copies the template and starts a server on a free port. On return it
    /// accepts connections and has the database `test`.
    pub fn start() -> PgServer {
        let template = template();
        let dir = base().join(format!("le-chaos-pg-{}-{}", std::process::id(), random_tag()));
        run(Command::new("cp").arg("-a").arg(template).arg(&dir), "copy the template");
        let mut server = PgServer { dir, port: 0, child: Mutex::new(None) };
        if on_a_free_port(|port| {
            server.port = port;
            server.launch()
        }) {
            return server;
        }
        server.fail("no free port after 5 tries")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:{port}/test`.
    pub fn url(&self) -> String {
        local_url(self.port)
    }

    /// The same database through a proxy listening on `port`.
    pub fn url_via(&self, port: u16) -> String {
        local_url(port)
    }

    /// The data directory (also the socket directory; the log is
    /// `postgres.log` in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The running postmaster's pid.
    ///
    /// # Panics
    ///
    /// While the server is stopped or crashed.
    pub fn pid(&self) -> u32 {
        self.child().as_ref().map(Child::id).unwrap_or_else(|| self.fail("pid() of a server that is not running"))
    }

    /// SIGSTOPs the postmaster, then every child (backends, background
    /// workers), and returns once all of them are stopped. Connections stay
    /// open and hang; the postmaster cannot fork while stopped, so the set
    /// of children is final once the postmaster is stopped.
    pub fn freeze(&self) {
        let pm = self.pid();
        signal("STOP", &[pm]);
        let mut stopped = vec![pm];
        // A child forked just before the stop is found by a second pass.
        loop {
            let new: Vec<u32> = children(pm).into_iter().filter(|p| !stopped.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            signal("STOP", &new);
            stopped.extend(new);
        }
        let all_stopped = wait_for(Duration::from_secs(5), || {
            stopped.iter().all(|&p| proc_state(p).is_none_or(|s| s == 'T' || s == 'Z'))
        });
        if !all_stopped {
            self.fail("freeze: not every server process stopped within 5 s");
        }
    }

    /// SIGCONTs every child, then the postmaster.
    pub fn thaw(&self) {
        let pm = self.pid();
        signal("CONT", &children(pm));
        signal("CONT", &[pm]);
    }

    /// Fast shutdown (SIGINT: sessions are ended, a checkpoint written);
    /// returns once the postmaster has exited.
    pub fn stop(&self) {
        let mut child = self.child();
        let Some(c) = child.as_mut() else { self.fail("stop() of a server that is not running") };
        signal("INT", &[c.id()]);
        if !exited_within(c, SERVER_WAIT) {
            drop(child);
            self.fail("stop: the postmaster did not exit within 30 s (is it frozen?)");
        }
        *child = None;
    }

    /// Starts the stopped or crashed server again on the same port and data
    /// (after a crash this runs crash recovery); returns once it accepts
    /// connections.
    pub fn start_again(&self) {
        if self.child().is_some() {
            self.fail("start_again() of a server that is running");
        }
        if !self.launch() {
            self.fail(&format!("start_again: port {} is taken", self.port));
        }
    }

    /// SIGKILLs the postmaster and every child, as a machine losing power
    /// would, without losing what reached the kernel. Returns once all are
    /// gone; [`PgServer::start_again`] then runs crash recovery.
    pub fn crash(&self) {
        let mut child = self.child();
        let Some(c) = child.as_mut() else { self.fail("crash() of a server that is not running") };
        let pm = c.id();
        // Stopped first, the postmaster can neither fork nor notice the
        // children dying and start recovering by itself.
        signal("STOP", &[pm]);
        let kids = children(pm);
        signal("KILL", &kids);
        c.kill().ok();
        c.wait().ok();
        *child = None;
        drop(child);
        // The shared memory segment must be detached (every process gone)
        // before a new postmaster will start on this directory.
        if !wait_for(SERVER_WAIT, || kids.iter().all(|&p| proc_state(p).is_none_or(|s| s == 'Z'))) {
            self.fail("crash: server processes still alive 30 s after SIGKILL");
        }
    }

    /// A crash-consistent copy of the data directory, as a volume or file
    /// system snapshot takes one: every server process is stopped
    /// ([`PgServer::freeze`]) while the directory is copied, then continued.
    /// The copy lives beside the server's and goes with it.
    pub fn snapshot(&self) -> PathBuf {
        let snap = self.dir.with_extension(format!("snap-{}", random_tag()));
        self.freeze();
        let copied = Command::new("cp").arg("-a").arg(&self.dir).arg(&snap).status();
        self.thaw();
        if !copied.is_ok_and(|s| s.success()) {
            self.fail(&format!("snapshot: cp -a to {} failed", snap.display()));
        }
        snap
    }

    /// Restores `snap` (from [`PgServer::snapshot`]) in place of the
    /// running server, as an operator restores a volume: the server is
    /// killed, its directory replaced by the snapshot, and started again on
    /// the same port, which runs crash recovery (same system identifier,
    /// same timeline). Returns once it accepts connections.
    pub fn restore(&self, snap: &Path) {
        self.crash();
        let old = self.dir.with_extension(format!("old-{}", random_tag()));
        fs::rename(&self.dir, &old).unwrap_or_else(|e| self.fail(&format!("restore: move the old directory: {e}")));
        fs::rename(snap, &self.dir).unwrap_or_else(|e| self.fail(&format!("restore: move the snapshot in: {e}")));
        let _ = fs::remove_dir_all(&old);
        self.start_again();
    }

    /// `pg_terminate_backend()` of every client backend but this helper's
    /// own, waiting up to 5 s for each to exit. Returns how many it ended.
    pub fn terminate_backends(&self) -> usize {
        let n = self.sql(
            "WITH b AS MATERIALIZED (SELECT pid FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()) \
             SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM b",
        );
        n[0].parse().unwrap()
    }

    /// Takes an ACCESS EXCLUSIVE lock on `table` (`name` or `schema.name`,
    /// quoted here) in a transaction left open on its own connection.
    pub fn lock_table(&self, table: &str) -> Held {
        let mut client = self.client();
        let q = format!("BEGIN; LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", quote_table(table));
        client.batch_execute(&q).unwrap_or_else(|e| self.fail(&format!("{q}: {e}")));
        Held { client: Some(client) }
    }

    /// Locks the row of election `name` in `table` with `SELECT … FOR
    /// UPDATE` in a transaction left open on its own connection.
    ///
    /// # Panics
    ///
    /// When the election has no row (nothing would be locked).
    pub fn lock_row(&self, table: &str, name: &str) -> Held {
        let mut client = self.client();
        let q = format!(
            "BEGIN; SELECT name FROM {} WHERE name = '{}' FOR UPDATE",
            quote_table(table),
            name.replace('\'', "''")
        );
        let rows = client.simple_query(&q).unwrap_or_else(|e| self.fail(&format!("{q}: {e}")));
        if !rows.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))) {
            panic!("lock_row: election {name:?} has no row in {table}");
        }
        Held { client: Some(client) }
    }

    /// Makes the server read-only the way a demoted primary is, or back: a
    /// fast shutdown, then a start as a standby (`standby.signal`, with no
    /// primary to follow: hot standby, reads work, every write fails); off
    /// promotes it (`pg_promote()`, a new timeline). Returns once a fresh
    /// session sees the state. (`default_transaction_read_only` would not
    /// do: it is a default that the store's writes override, as any client
    /// may.)
    pub fn set_read_only(&self, on: bool) {
        if on {
            self.stop();
            let signal = self.dir.join("standby.signal");
            fs::write(&signal, "").unwrap_or_else(|e| self.fail(&format!("write {}: {e}", signal.display())));
            self.start_again();
        } else if self.sql("SELECT pg_promote(true, 30)::text") != ["true"] {
            self.fail("pg_promote() did not finish within 30 s");
        }
        let want = if on { "true" } else { "false" };
        if !wait_for(Duration::from_secs(10), || self.sql("SELECT pg_is_in_recovery()::text")[0] == want) {
            self.fail(&format!("pg_is_in_recovery() is not {want} 10 s after the change"));
        }
    }

    /// `default_transaction_read_only` for the whole server, or back to its
    /// default: `ALTER SYSTEM`, then a reload, which every session (pooled
    /// ones too) takes at its next statement. Returns once a fresh session
    /// sees it.
    pub fn set_default_read_only(&self, on: bool) {
        let set = if on { "SET default_transaction_read_only = on" } else { "RESET default_transaction_read_only" };
        self.sql(&format!("ALTER SYSTEM {set}"));
        self.sql("SELECT pg_reload_conf()");
        let want = if on { "on" } else { "off" };
        if !wait_for(Duration::from_secs(10), || self.sql("SHOW default_transaction_read_only")[0] == want) {
            self.fail(&format!("default_transaction_read_only is not {want} 10 s after the reload"));
        }
    }

    /// Runs `q` (simple query protocol; several statements allowed) on a new
    /// connection as `postgres` to `test`, and returns the first column of
    /// each row as text, `""` for NULL.
    pub fn sql(&self, q: &str) -> Vec<String> {
        let msgs = self.client().simple_query(q).unwrap_or_else(|e| self.fail(&format!("{q}: {}", chain(&e))));
        msgs.into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
                _ => None,
            })
            .collect()
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.join("postgres.log"))
    }

    fn client(&self) -> postgres::Client {
        let mut cfg = postgres::Config::from_str(&self.url()).unwrap();
        cfg.connect_timeout(Duration::from_secs(10)).application_name("le-chaos-helper");
        cfg.connect(NoTls).unwrap_or_else(|e| self.fail(&format!("connect to {}: {}", self.url(), chain(&e))))
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a postmaster on `self.port` and waits until it is ready.
    /// False when it exited because the port was taken.
    fn launch(&self) -> bool {
        let log = self.dir.join("postgres.log");
        let c = spawn_as_postgres(
            Command::new(pg_bin().join("postgres"))
                .arg("-D")
                .arg(&self.dir)
                .arg("-p")
                .arg(self.port.to_string())
                .arg("-k")
                .arg(&self.dir),
            &log,
        );
        let pid = c.id();
        let mut child = self.child();
        *child = Some(c);
        let deadline = Instant::now() + SERVER_WAIT;
        loop {
            // pg_ctl's test: postmaster.pid names this postmaster (a stale
            // file from a crash names the old one) and says "ready".
            let pidfile = fs::read_to_string(self.dir.join("postmaster.pid")).unwrap_or_default();
            let lines: Vec<&str> = pidfile.lines().collect();
            // A standby says "standby" once it takes read-only sessions.
            let status = lines.get(7).map(|s| s.trim());
            if lines.first() == Some(&pid.to_string().as_str()) && matches!(status, Some("ready" | "standby")) {
                return true;
            }
            if let Ok(Some(status)) = child.as_mut().unwrap().try_wait() {
                *child = None;
                drop(child);
                if self.log_tail().contains("could not bind") {
                    return false;
                }
                self.fail(&format!("the postmaster exited during start ({status})"));
            }
            if Instant::now() >= deadline {
                drop(child);
                self.fail("the postmaster was not ready within 30 s");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn fail(&self, what: &str) -> ! {
        let log = keep_log(&self.dir, "postgres.log");
        panic!("PgServer on port {}: {what}\n--- last lines of {} ---\n{}", self.port, log.display(), tail(&log))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child().take() {
            let pm = c.id();
            let kids = children(pm);
            // Continued first in case it was frozen, then an immediate
            // shutdown, which also removes the shared memory.
            signal("CONT", &kids);
            signal("CONT", &[pm]);
            signal("QUIT", &[pm]);
            if !exited_within(&mut c, Duration::from_secs(3)) {
                signal("KILL", &kids);
                c.kill().ok();
                c.wait().ok();
            }
            wait_for(Duration::from_secs(5), || kids.iter().all(|&p| proc_state(p).is_none_or(|s| s == 'Z')));
        }
        remove_stale_segment(&self.dir);
        fs::remove_dir_all(&self.dir).ok();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(mut c) = self.client.take() {
            c.batch_execute("ROLLBACK").ok();
        }
    }
}

impl Bouncer {
    /// Starts PgBouncer on a free port in front of the server on `pg_port`,
    /// in transaction mode with `pool_size` server connections per
    /// database and user. Accepts connections on return.
    pub fn start(pg_port: u16, pool_size: u32) -> Bouncer {
        let dir = base().join(format!("le-chaos-bouncer-{}-{}", std::process::id(), random_tag()));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n\"root\" \"\"\n").unwrap();
        run(Command::new("chown").arg("-R").arg("postgres:postgres").arg(&dir), "chown the bouncer's dir");
        let mut b = Bouncer { dir, port: 0, child: Mutex::new(None) };
        let launched = on_a_free_port(|port| {
            b.port = port;
            let ini = format!(
                "[databases]\n* = host=127.0.0.1 port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {d}/userlist.txt\nadmin_users = postgres\n\
                 pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 200\n\
                 server_login_retry = 1\nserver_connect_timeout = 5\n\
                 ignore_startup_parameters = extra_float_digits\n",
                port = b.port,
                d = b.dir.display()
            );
            fs::write(b.dir.join("pgbouncer.ini"), ini).unwrap();
            b.launch()
        });
        if launched {
            return b;
        }
        b.fail("no free port after 5 tries")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:{port}/test`.
    pub fn url(&self) -> String {
        local_url(self.port)
    }

    /// Admin console `PAUSE`: returns once every server connection is
    /// released; queries then wait in PgBouncer.
    pub fn pause(&self) {
        self.admin("PAUSE");
    }

    /// Admin console `RESUME`.
    pub fn resume(&self) {
        self.admin("RESUME");
    }

    /// Stops the process (SIGTERM, immediate shutdown) and starts it again
    /// on the same port; accepts connections on return.
    pub fn restart(&self) {
        let mut child = self.child();
        let Some(c) = child.as_mut() else { self.fail("restart() of a bouncer that is not running") };
        signal("TERM", &[c.id()]);
        if !exited_within(c, Duration::from_secs(10)) {
            c.kill().ok();
            c.wait().ok();
        }
        *child = None;
        drop(child);
        self.start_again();
    }

    /// SIGKILL; returns once the process is gone.
    pub fn kill(&self) {
        if let Some(mut c) = self.child().take() {
            c.kill().ok();
            c.wait().ok();
        }
    }

    /// Starts the killed bouncer again on the same port.
    pub fn start_again(&self) {
        if self.child().is_some() {
            self.fail("start_again() of a bouncer that is running");
        }
        if !self.launch() {
            self.fail(&format!("start_again: port {} is taken", self.port));
        }
    }

    /// The last lines of PgBouncer's log.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.join("pgbouncer.log"))
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts PgBouncer and waits until its port accepts connections. False
    /// when it exited because the port was taken.
    fn launch(&self) -> bool {
        let log = self.dir.join("pgbouncer.log");
        let mut c = spawn_as_postgres(Command::new("/usr/sbin/pgbouncer").arg(self.dir.join("pgbouncer.ini")), &log);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                if self.log_tail().contains("in use") {
                    return false;
                }
                self.fail(&format!("pgbouncer exited during start ({status})"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                *self.child() = Some(c);
                return true;
            }
            if Instant::now() >= deadline {
                c.kill().ok();
                c.wait().ok();
                self.fail("pgbouncer did not listen within 10 s");
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn admin(&self, command: &str) {
        let out = Command::new("psql")
            .args(["-X", "-Atq", "-h", "127.0.0.1", "-U", "postgres", "-d", "pgbouncer", "-p"])
            .arg(self.port.to_string())
            .args(["-c", command])
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .unwrap_or_else(|e| panic!("psql: {e}"));
        if !out.status.success() {
            self.fail(&format!("admin {command}: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }

    fn fail(&self, what: &str) -> ! {
        let log = keep_log(&self.dir, "pgbouncer.log");
        panic!("Bouncer on port {}: {what}\n--- last lines of {} ---\n{}", self.port, log.display(), tail(&log))
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        self.kill();
        fs::remove_dir_all(&self.dir).ok();
    }
}

/// Where templates and instances live: /dev/shm (tmpfs), else /tmp, or
/// `LE_CHAOS_TMP`. A tmpfs matters: copying the template to this machine's
/// disk took 1.5 to 4.5 s, to tmpfs 0.3 s.
fn base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| match std::env::var_os("LE_CHAOS_TMP") {
        Some(d) => PathBuf::from(d),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => PathBuf::from("/tmp"),
    })
}

/// The newest installed PostgreSQL's server binaries.
pub fn pg_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let versions = fs::read_dir("/usr/lib/postgresql").unwrap_or_else(|_| {
            panic!("no PostgreSQL server in /usr/lib/postgresql: run `bash scripts/test.sh`, which installs it")
        });
        let newest = versions.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).max();
        let bin = PathBuf::from(format!("/usr/lib/postgresql/{}/bin", newest.expect("a PostgreSQL version")));
        assert!(bin.join("initdb").exists(), "no initdb in {}: install postgresql", bin.display());
        bin
    })
}

/// The template cluster, built once and shared by every test process:
/// `initdb`, [`SETTINGS`], and the database `test` (created in single-user
/// mode, so no port is needed).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let major = pg_bin().parent().unwrap().file_name().unwrap().to_str().unwrap().to_owned();
        let path = base().join(format!("le-chaos-pg{major}-template-v{TEMPLATE_VERSION}"));
        if path.join("PG_VERSION").exists() {
            return path;
        }
        let started = Instant::now();
        let tmp = PathBuf::from(format!("{}.tmp-{}-{}", path.display(), std::process::id(), random_tag()));
        fs::create_dir(&tmp).unwrap();
        run(Command::new("chown").arg("postgres:postgres").arg(&tmp), "chown the template");
        run(Command::new("chmod").arg("700").arg(&tmp), "chmod the template");
        let init_log = PathBuf::from(format!("{}.log", tmp.display()));
        let mut initdb = spawn_as_postgres(
            Command::new(pg_bin().join("initdb")).arg("-D").arg(&tmp).args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--wal-segsize=1",
            ]),
            &init_log,
        );
        if !initdb.wait().unwrap().success() {
            panic!("initdb into {} failed:\n{}", tmp.display(), tail(&init_log));
        }
        OpenOptions::new()
            .append(true)
            .open(tmp.join("postgresql.conf"))
            .unwrap()
            .write_all(SETTINGS.as_bytes())
            .unwrap();
        if let Err(out) = create_test_db(&tmp) {
            panic!("single-user CREATE DATABASE test in {} failed:\n{out}", tmp.display());
        }
        fs::remove_file(&init_log).ok();
        // Another process may have won the race: keep its template.
        if fs::rename(&tmp, &path).is_err() {
            assert!(path.join("PG_VERSION").exists(), "cannot rename {} to {}", tmp.display(), path.display());
            fs::remove_dir_all(&tmp).ok();
        }
        eprintln!("pg_server: built the template {} in {:?}", path.display(), started.elapsed());
        path
    })
}

/// Creates the database `test` in the stopped cluster `dir` in single-user
/// mode; on failure, the server's output.
fn create_test_db(dir: &Path) -> Result<(), String> {
    let sql = "CREATE DATABASE test;\nDROP DATABASE postgres;\nALTER DATABASE template0 IS_TEMPLATE false;\n\
               DROP DATABASE template0;\nSELECT datname FROM pg_database WHERE datname = 'test';\n";
    let mut cmd = Command::new(pg_bin().join("postgres"));
    cmd.arg("--single").arg("-D").arg(dir).arg("template1");
    let mut c =
        as_postgres(&mut cmd).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    c.stdin.take().unwrap().write_all(sql.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("datname = \"test\"") {
        return Ok(());
    }
    Err(format!("{}{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)))
}

fn postgres_ids() -> (u32, u32) {
    static IDS: OnceLock<(u32, u32)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let passwd = fs::read_to_string("/etc/passwd").unwrap();
        let line = passwd
            .lines()
            .find(|l| l.starts_with("postgres:"))
            .unwrap_or_else(|| panic!("no user postgres: run `bash scripts/test.sh`, which installs PostgreSQL"));
        let f: Vec<&str> = line.split(':').collect();
        (f[2].parse().unwrap(), f[3].parse().unwrap())
    })
}

/// `cmd` to run as user `postgres` in a process group of its own.
fn as_postgres(cmd: &mut Command) -> &mut Command {
    let (uid, gid) = postgres_ids();
    cmd.uid(uid).gid(gid).process_group(0).current_dir("/tmp")
}

/// Spawns `cmd` as `postgres` with stdout and stderr appended to `log`.
pub fn spawn_as_postgres(cmd: &mut Command, log: &Path) -> Child {
    let out = OpenOptions::new().create(true).append(true).open(log).unwrap();
    let err = out.try_clone().unwrap();
    as_postgres(cmd).stdin(Stdio::null()).stdout(out).stderr(err).spawn().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} as postgres: {e}. This needs root, PostgreSQL and PgBouncer: run `bash scripts/test.sh`",
            cmd.get_program()
        )
    })
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Sends `SIG{sig}` to `pids`; a pid already gone is no error.
pub fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    Command::new("/usr/bin/kill")
        .arg("-s")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .expect("/usr/bin/kill");
}

fn exited_within(c: &mut Child, d: Duration) -> bool {
    wait_for(d, || c.try_wait().map(|s| s.is_some()).unwrap_or(true))
}

/// Runs `launch` on a free port, up to five times: a port another process
/// took between our probe and the bind makes the server exit, so another
/// is tried. Whether one launch succeeded.
fn on_a_free_port(mut launch: impl FnMut(u16) -> bool) -> bool {
    (0..5).any(|_| launch(free_port()))
}

/// `postgres://postgres@127.0.0.1:{port}/test`.
fn local_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/test")
}

pub use super::ports::free_port;

/// The state letter of a process (`R`, `S`, `T`, `Z`, …), from /proc.
fn proc_state(pid: u32) -> Option<char> {
    proc_stat(pid).map(|(s, _)| s)
}

/// `(state, ppid)` from /proc/PID/stat. The command name is in parentheses
/// and may hold anything: the fields are read after the last ')'.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = text[text.rfind(')')? + 1..].split_whitespace();
    Some((f.next()?.chars().next()?, f.next()?.parse().ok()?))
}

/// The live children of `parent`. Backends call setsid(), so they are not in
/// the postmaster's process group: they are found by parent pid.
pub fn children(parent: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(s, ppid)| ppid == parent && s != 'Z'))
        .collect()
}

/// Removes the SysV segment a postmaster that died without cleaning up
/// (crash, SIGKILL) left; postmaster.pid's line 7 holds its key and id. Only
/// a segment with that key and id that no process attaches: ids are reused.
fn remove_stale_segment(dir: &Path) {
    let Ok(pidfile) = fs::read_to_string(dir.join("postmaster.pid")) else { return };
    let Some((key, id)) = pidfile.lines().nth(6).and_then(|l| {
        let mut f = l.split_whitespace();
        Some((f.next()?.parse::<u64>().ok()?, f.next()?.to_owned()))
    }) else {
        return;
    };
    let Ok(out) = Command::new("ipcs").arg("-m").output() else { return };
    // Columns: key (hex), shmid, owner, perms, bytes, nattch.
    let stale = String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 6
            && u64::from_str_radix(f[0].trim_start_matches("0x"), 16).ok() == Some(key)
            && f[1] == id
            && f[5] == "0"
    });
    if stale {
        Command::new("ipcrm").args(["-m", &id]).stderr(Stdio::null()).status().ok();
    }
}

/// A copy of `dir/name` as /tmp/DIRNAME-NAME, which outlives the directory
/// that Drop removes while a panic unwinds.
fn keep_log(dir: &Path, name: &str) -> PathBuf {
    let kept = Path::new("/tmp").join(format!("{}-{name}", dir.file_name().unwrap().to_string_lossy()));
    fs::copy(dir.join(name), &kept).map_or_else(|_| dir.join(name), |_| kept)
}

pub fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
}

/// `quote` of each dot-separated part: `a.b` becomes `"a"."b"`.
fn quote_table(table: &str) -> String {
    table.split('.').map(|p| format!("\"{}\"", p.replace('"', "\"\""))).collect::<Vec<_>>().join(".")
}

/// An error and its sources, joined with ": ".
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}
