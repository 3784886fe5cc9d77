//! A MariaDB server owned by one chaos scenario, so that freezing, killing,
//! locking or making it read-only hurts no other test.
//!
//! Each [`MariaServer`] is a `mariadbd` of its own: a free port on
//! 127.0.0.1, and its data directory, socket, pid file and error log in a
//! temp directory under /tmp owned by user `mysql`. Several may run at once,
//! in one process or many.
//!
//! Starting is fast because `mariadb-install-db` runs once per machine, not
//! per server: it builds a template data directory (with database `test`
//! and user `le`) under a unique name, which is then renamed into place at
//! [`TEMPLATE`] atomically, so concurrent test processes never see half a
//! template. Each server starts from a (sparse) `cp -a` of it.
//!
//! Every server (and every template build) has a `--tmpdir` of its own:
//! mariadbd deletes the `#sql…` files it finds in its tmpdir when it starts,
//! so a shared /tmp lets one server destroy another's temporary tables
//! (concurrent `mariadb-install-db` runs fail that way).
//!
//! The server is a child of the test process and dies in [`MariaServer`]'s
//! `Drop`. A test process killed outright cannot run `Drop`; the first
//! [`MariaServer::start`] of a later test process then kills what it left
//! running (by pid, checked against its command line) and removes its
//! directory.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;

use super::random_tag;

/// The shared template data directory (`TEMPLATE/data`). Bump the version
/// when the users, the database or the InnoDB log settings change.
pub const TEMPLATE: &str = "/tmp/le-chaos-maria-template-v1";
/// Every server's directory is `PREFIX{test process id}-{random tag}`.
const PREFIX: &str = "/tmp/le-chaos-maria-";
const MARIADBD: &str = "/usr/sbin/mariadbd";
/// How long a start (crash recovery included) or a clean shutdown may take.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Small and fast: the servers hold a table of a few rows. Flushing the log
/// at each commit (`=2`) without fsync keeps commits across a SIGKILL of the
/// server, which is what [`MariaServer::crash`] does; the machine stays up.
const SPEED: &[&str] = &[
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=8M",
    "--innodb-log-file-size=8M",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--innodb-use-native-aio=0",
    "--innodb-buffer-pool-load-at-startup=0",
    "--innodb-buffer-pool-dump-at-shutdown=0",
    "--innodb-temp-data-file-path=ibtmp1:1M:autoextend",
    "--max-connections=200",
];

/// The template's users and database. `le` has no SUPER and no READ_ONLY
/// ADMIN, so `read_only` applies to it; root over TCP has no password
/// (`mariadb-install-db --auth-root-authentication-method=normal`).
const BOOTSTRAP_SQL: &str = "FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS test;
CREATE USER 'le'@'127.0.0.1' IDENTIFIED BY 'le';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP ON test.* TO 'le'@'127.0.0.1';
";

/// A private `mariadbd`. Dropping it kills the server (SIGKILL), waits for
/// it and removes its directory.
pub struct MariaServer {
    dir: PathBuf,
    port: u16,
    /// Server options beyond the usual ones, on every start.
    extra: Vec<String>,
    /// Environment of the server process, on every start.
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
    started_in: Duration,
}

/// A lock another session holds on a [`MariaServer`]; dropping it releases
/// the lock (rollback or `UNLOCK TABLES`) and closes the session.
pub struct Held {
    conn: Option<mysql::Conn>,
    release: &'static str,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = c.query_drop(self.release);
        }
    }
}

impl MariaServer {
    /// Starts a server on a free port from the template (building the
    /// template first if this machine has none). It accepts TCP connections
    /// on return, has database `test`, user `le` (see [`MariaServer::url`])
    /// and root without a password (see [`MariaServer::admin_url`]).
    ///
    /// # Panics
    ///
    /// When MariaDB is not installed, the process is not root, or the server
    /// does not come up (the error log's tail is in the message).
    pub fn start() -> MariaServer {
        MariaServer::start_with(&[])
    }

    /// [`MariaServer::start`] with more server options (`--sql-mode=ORACLE`
    /// and the like), kept for every later start.
    pub fn start_with(extra: &[&str]) -> MariaServer {
        MariaServer::start_env(extra, &[])
    }

    /// [`MariaServer::start_with`], the server process run with `env` too
    /// (on every start).
    pub fn start_env(extra: &[&str], env: &[(String, String)]) -> MariaServer {
        let began = Instant::now();
        let template = template();
        let dir = PathBuf::from(format!("{PREFIX}{}-{}", std::process::id(), random_tag()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        // From here on, Drop removes the directory, also if a step panics.
        let mut server = MariaServer {
            dir,
            port: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env.to_vec(),
            child: Mutex::new(None),
            started_in: Duration::ZERO,
        };
        run(Command::new("cp").args(["-a", "--sparse=always"]).arg(template.join("data")).arg(server.dir.join("data")));
        fs::create_dir(server.dir.join("tmp")).unwrap();
        run(Command::new("chown").arg("mysql:").arg(&server.dir).arg(server.dir.join("tmp")));
        // Another process may take the free port before mariadbd binds it.
        for attempt in 1..=3 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => break,
                Err(log) if attempt < 3 && (log.contains("Bind on TCP/IP port") || log.starts_with(PORT_TAKEN)) => {
                    continue
                }
                Err(log) => panic!("mariadbd in {} did not come up: {log}", server.dir.display()),
            }
        }
        server.started_in = began.elapsed();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// User `le` (password `le`), database `test`, over TCP.
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// [`MariaServer::url`] through a proxy listening on 127.0.0.1:`port`.
    pub fn url_via(&self, port: u16) -> String {
        format!("mysql://le:le@127.0.0.1:{port}/test")
    }

    /// Root without a password, database `test`, over TCP.
    pub fn admin_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// The running server's pid (it changes with [`MariaServer::start_again`]).
    pub fn pid(&self) -> u32 {
        self.child().as_ref().expect("the server is not running").id()
    }

    /// How long [`MariaServer::start`] took, template copy included.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The server's directory (`data/`, `error.log`, socket, pid file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The whole error log, across restarts.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    /// The error log's last lines.
    pub fn error_log_tail(&self) -> String {
        tail(&self.error_log())
    }

    /// Stops the server with SIGSTOP: connections stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("STOP");
        let pid = self.pid();
        assert!(super::wait_for(Duration::from_secs(2), || proc_state(pid) == Some('T')), "mariadbd did not stop");
    }

    /// Continues a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    /// Clean shutdown (SIGTERM, after a SIGCONT in case it is frozen);
    /// returns once the process is gone.
    pub fn stop(&self) {
        self.signal("CONT");
        self.signal("TERM");
        let mut child = self.child();
        let c = child.as_mut().expect("the server is not running");
        let deadline = Instant::now() + READY_WITHIN;
        while c.try_wait().expect("wait for mariadbd").is_none() {
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("mariadbd did not shut down within {READY_WITHIN:?}: {}", tail(&self.error_log()));
            }
            thread::sleep(Duration::from_millis(10));
        }
        *child = None;
    }

    /// Starts the server again after [`MariaServer::stop`] or
    /// [`MariaServer::crash`]: same port, same data. Ready on return.
    pub fn start_again(&self) {
        assert!(self.child().is_none(), "start_again on a running server");
        if let Err(log) = self.spawn() {
            panic!("mariadbd in {} did not come up again on port {}: {log}", self.dir.display(), self.port);
        }
    }

    /// Kills the server (SIGKILL) and waits for it; the next
    /// [`MariaServer::start_again`] runs InnoDB crash recovery.
    pub fn crash(&self) {
        let mut child = self.child();
        let mut c = child.take().expect("the server is not running");
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Ends (`KILL CONNECTION`) every session of `user`; returns how many.
    pub fn kill_sessions(&self, user: &str) -> usize {
        self.kill_session_ids(user).len()
    }

    /// The ids of the sessions of `user` this call killed.
    pub fn kill_session_ids(&self, user: &str) -> Vec<u64> {
        let mut c = self.admin();
        let ids: Vec<u64> = c
            .exec("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?", (user,))
            .unwrap_or_else(|e| panic!("processlist: {e}"));
        // A session that ended meanwhile is "unknown thread" (1094).
        ids.into_iter().filter(|id| c.query_drop(format!("KILL CONNECTION {id}")).is_ok()).collect()
    }

    /// Another session holds `LOCK TABLES table WRITE` (in database `test`)
    /// until the [`Held`] drops.
    pub fn lock_table(&self, table: &str) -> Held {
        let mut c = self.admin();
        exec(&mut c, &format!("LOCK TABLES {} WRITE", quote(table)));
        Held { conn: Some(c), release: "UNLOCK TABLES" }
    }

    /// Another session holds the row of election `name` in `table` with
    /// `SELECT … FOR UPDATE` in an open transaction until the [`Held`]
    /// drops. With no such row it holds the gap where the row would go,
    /// which blocks inserting it.
    pub fn lock_row(&self, table: &str, name: &str) -> Held {
        let mut c = self.admin();
        exec(&mut c, "START TRANSACTION");
        let q = format!("SELECT name FROM {} WHERE name = ? FOR UPDATE", quote(table));
        c.exec_drop(&q, (name,)).unwrap_or_else(|e| panic!("{q}: {e}"));
        Held { conn: Some(c), release: "ROLLBACK" }
    }

    /// `SET GLOBAL read_only`: while on, writes by `le` fail and reads work.
    pub fn set_read_only(&self, on: bool) {
        exec(&mut self.admin(), &format!("SET GLOBAL read_only = {}", if on { "ON" } else { "OFF" }));
    }

    /// Column `col` of each row `q` returns, as text, run as root; empty
    /// when the server cannot answer (down, starting, not yet synced).
    pub fn try_query(&self, q: &str, col: usize) -> Vec<String> {
        let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&self.admin_url()).unwrap())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(2)))
            .read_timeout(Some(Duration::from_secs(5)))
            .write_timeout(Some(Duration::from_secs(5)));
        let Ok(mut c) = mysql::Conn::new(opts) else { return Vec::new() };
        let rows: Vec<mysql::Row> = c.query(q).unwrap_or_default();
        rows.iter()
            .filter_map(|r| match r.as_ref(col) {
                Some(mysql::Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                Some(mysql::Value::NULL) => Some("NULL".to_owned()),
                Some(v) => Some(v.as_sql(true)),
                None => None,
            })
            .collect()
    }

    /// Runs `q` as root; the first column of each row, as text (`NULL` for
    /// NULL), none for a statement without a result.
    pub fn query(&self, q: &str) -> Vec<String> {
        let rows: Vec<mysql::Row> = self.admin().query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
        rows.iter()
            .map(|r| match r.as_ref(0) {
                Some(mysql::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(mysql::Value::NULL) | None => "NULL".to_owned(),
                Some(v) => v.as_sql(true),
            })
            .collect()
    }

    /// A root connection over TCP, with timeouts so a frozen server fails
    /// the test instead of hanging it.
    fn admin(&self) -> mysql::Conn {
        let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&self.admin_url()).unwrap())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(5)))
            .read_timeout(Some(Duration::from_secs(30)))
            .write_timeout(Some(Duration::from_secs(30)));
        mysql::Conn::new(opts).unwrap_or_else(|e| panic!("root connection to port {}: {e}", self.port))
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
    }

    /// Launches mariadbd on `self.port` and waits until root can log in
    /// over TCP. On failure the server is killed and the error is the log's
    /// tail (of this launch only).
    fn spawn(&self) -> Result<(), String> {
        let log = self.dir.join("error.log");
        let log_start = fs::metadata(&log).map(|m| m.len() as usize).unwrap_or(0);
        let d = |f: &str| self.dir.join(f).display().to_string();
        let child = Command::new(MARIADBD)
            .arg("--no-defaults")
            .arg("--user=mysql")
            .arg(format!("--datadir={}", d("data")))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", d("mariadbd.sock")))
            .arg(format!("--pid-file={}", d("mariadbd.pid")))
            .arg(format!("--log-error={}", d("error.log")))
            .arg(format!("--tmpdir={}", d("tmp")))
            .args(SPEED)
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {MARIADBD}: {e}"));
        *self.child() = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&self.admin_url()).unwrap())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(1)));
        let socket = d("mariadbd.sock");
        loop {
            if let Ok(mut c) = mysql::Conn::new(opts.clone()) {
                // The login must be this server's: another test's server may
                // have taken the port between free_port and our bind (ours
                // then exits), and would answer here (seen once in CI: a
                // replica then connected to it as to its primary).
                let theirs: Option<String> = c.query_first("SELECT @@socket").ok().flatten();
                if theirs.as_deref() == Some(socket.as_str()) {
                    return Ok(());
                }
                if let Some(mut c) = self.child().take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("{PORT_TAKEN} {} (its socket is {theirs:?})", self.port));
            }
            let exited = self.child().as_mut().unwrap().try_wait().expect("wait for mariadbd").is_some();
            if exited || Instant::now() >= deadline {
                if let Some(mut c) = self.child().take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let text = self.error_log();
                let why = if exited { "it exited" } else { "no login within the deadline" };
                return Err(format!("{why}; its log ends:\n{}", tail(text.get(log_start..).unwrap_or(&text))));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for MariaServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The template directory, built once per machine (and looked for once per
/// process); also sweeps what killed test processes left behind.
fn template() -> &'static Path {
    static TEMPLATE_DIR: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE_DIR.get_or_init(|| {
        for tool in [MARIADBD, "/usr/bin/mariadb-install-db"] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: install MariaDB (`bash scripts/test.sh` does, or \
                 `apt-get install mariadb-server`)"
            );
        }
        sweep_orphans();
        let done = PathBuf::from(TEMPLATE);
        if !done.exists() {
            build_template(&done);
        }
        done
    })
}

/// Builds the template under a unique name and renames it to `done`; when
/// another process got there first, its template is kept and this one removed.
fn build_template(done: &Path) {
    let build = PathBuf::from(format!("{TEMPLATE}.build-{}-{}", std::process::id(), random_tag()));
    fs::create_dir(&build).unwrap_or_else(|e| panic!("cannot create {}: {e}", build.display()));
    let fail = |what: &str, log: &Path| -> ! {
        let text = fs::read_to_string(log).unwrap_or_default();
        let _ = fs::remove_dir_all(&build);
        panic!("building the MariaDB template: {what} failed; its log ends:\n{}", tail(&text))
    };
    fs::create_dir(build.join("tmp")).unwrap();
    run(Command::new("chown").args(["-R", "mysql:"]).arg(&build));
    let data = format!("--datadir={}", build.join("data").display());
    let tmp = format!("--tmpdir={}", build.join("tmp").display());
    let install_log = build.join("install.log");
    let ok = Command::new("mariadb-install-db")
        .args([
            "--no-defaults",
            "--user=mysql",
            &data,
            "--skip-test-db",
            "--auth-root-authentication-method=normal",
            &tmp,
        ])
        .args(SPEED)
        .stdout(fs::File::create(&install_log).unwrap())
        .stderr(Stdio::from(fs::File::options().append(true).open(&install_log).unwrap()))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        fail("mariadb-install-db", &install_log);
    }
    // Bootstrap mode runs SQL from stdin with no network and exits cleanly.
    let boot_log = build.join("bootstrap.log");
    let mut boot = Command::new(MARIADBD)
        .args(["--no-defaults", "--user=mysql", &data, &tmp, "--bootstrap", "--skip-networking"])
        .arg(format!("--log-error={}", boot_log.display()))
        .args(SPEED)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {MARIADBD}: {e}"));
    let _ = boot.stdin.take().unwrap().write_all(BOOTSTRAP_SQL.as_bytes());
    if !boot.wait().is_ok_and(|s| s.success()) {
        fail("the bootstrap of users and database", &boot_log);
    }
    run(Command::new("chown").args(["-R", "mysql:"]).arg(&build));
    if fs::rename(&build, done).is_err() {
        assert!(done.exists(), "cannot rename {} to {}", build.display(), done.display());
        let _ = fs::remove_dir_all(&build);
    }
}

/// Kills the servers of test processes that no longer exist and removes
/// their directories (and their half-built templates).
fn sweep_orphans() {
    let Ok(entries) = fs::read_dir("/tmp") else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.display().to_string();
        let rest = match name.strip_prefix(&format!("{TEMPLATE}.build-")) {
            Some(rest) => rest,
            None if name.starts_with(TEMPLATE) => continue,
            None => match name.strip_prefix(PREFIX) {
                Some(rest) => rest,
                None => continue,
            },
        };
        let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let pid = fs::read_to_string(path.join("mariadbd.pid")).ok().and_then(|p| p.trim().parse::<u32>().ok());
        if let Some(pid) = pid {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&name) {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                super::wait_for(Duration::from_secs(5), || !Path::new(&format!("/proc/{pid}")).exists());
            }
        }
        let _ = fs::remove_dir_all(&path);
    }
}

/// How [`MariaServer::spawn`] says that another server answers on the
/// port it was given.
const PORT_TAKEN: &str = "another server answers on port";

pub use super::ports::free_port;

/// A process's state letter from /proc (`T` when stopped).
fn proc_state(pid: u32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed (the chaos servers need root, to hand their files to user mysql): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn exec(c: &mut mysql::Conn, q: &str) {
    c.query_drop(q).unwrap_or_else(|e| panic!("{q}: {e}"));
}

fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// The last 30 lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
