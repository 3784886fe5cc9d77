//! What the multi-process chaos suites (`group_support`, `ledger_support`)
//! share, each including this file as a module of its own: the way a
//! fleet's workers reach the election's database, and how a fleet reads,
//! stops, continues and ends its worker processes.

use std::collections::VecDeque;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::mysql_support::{self, SHARED};
use crate::pg_support::{self, BOUNCER, DIRECT};
use crate::support::wait_for;

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

// Linux's numbers for the signals (x86-64 and arm64 agree).
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGSTOPs worker `who` and returns once every thread of it is stopped.
pub fn sigstop(child: &Child, who: &str) {
    let pid = child.id() as i32;
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { kill(pid, SIGSTOP) }, 0, "SIGSTOP {who}");
    assert!(wait_for(Duration::from_secs(2), || proc_state(pid) == Some('T')), "{who} did not stop");
}

/// SIGCONTs worker `who`.
pub fn sigcont(child: &Child, who: &str) {
    // SAFETY: as in sigstop.
    assert_eq!(unsafe { kill(child.id() as i32, SIGCONT) }, 0, "SIGCONT {who}");
}

/// Ends a fleet's workers still alive (a fleet's `Drop`). A worker exits at
/// the end of its input. One that is exiting may be writing its coverage
/// profile: killed then, it leaves a truncated file that fails the whole
/// coverage report (a group fleet did so once in CI). So every worker is
/// continued and its input closed first, and one still there 10 s later is
/// killed.
pub fn end_all(mut alive: Vec<(&mut Child, &mut Option<ChildStdin>)>) {
    for (child, stdin) in &mut alive {
        // SAFETY: as in sigstop; a stopped child is continued so that it
        // can go on.
        unsafe { kill(child.id() as i32, SIGCONT) };
        **stdin = None;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (child, _) in &mut alive {
        while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
            thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A fleet's `Drop`: when the test is failing, prints `kept` (what the
/// fleet saw, and which tables it keeps for a look: see [`failing`]); ends
/// the workers still alive ([`end_all`]), marking each `ended`; and
/// otherwise drops the fleet's tables with `drop_tables`.
pub fn end_fleet<'a>(
    kept: Option<String>, workers: impl Iterator<Item = (&'a mut Child, &'a mut Option<ChildStdin>, &'a mut bool)>,
    drop_tables: impl FnOnce(),
) {
    let failing = kept.is_some();
    if let Some(kept) = kept {
        eprintln!("{kept}");
    }
    let mut alive = Vec::new();
    for (child, stdin, ended) in workers {
        if !*ended {
            *ended = true;
            alive.push((child, stdin));
        }
    }
    end_all(alive);
    if !failing {
        drop_tables();
    }
}

/// `what` (made only then) when the test is failing, for [`end_fleet`].
pub fn failing(what: impl FnOnce() -> String) -> Option<String> {
    thread::panicking().then(what)
}

/// Starts worker `w<i>`: this test binary again, running only the test
/// `test` (the worker's entry), with `env` in its environment and its
/// standard streams piped.
pub fn spawn_worker(test: &str, env: Vec<(&'static str, String)>, i: usize) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    Command::new(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting worker w{i} ({}): {e}", exe.display()))
}

/// What a fleet's workers reported (a book, a list of events), and a
/// signal at each change, for the scenario to wait on.
#[derive(Default)]
pub struct Reported<T> {
    data: Mutex<T>,
    changed: Condvar,
}

impl<T> Reported<T> {
    /// What was reported so far.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.data.lock().unwrap()
    }

    /// Runs `f` on what was reported; wakes the waiters if it says it
    /// changed something. Returns what it says.
    pub fn update(&self, f: impl FnOnce(&mut T) -> bool) -> bool {
        let changed = f(&mut self.lock());
        if changed {
            self.changed.notify_all();
        }
        changed
    }

    /// Waits up to `within` until `f` finds something in what was
    /// reported, looking again at each change and at least every `slice`
    /// (for conditions on time alone).
    pub fn wait<R>(&self, within: Duration, slice: Duration, f: impl Fn(&T) -> Option<R>) -> Option<R> {
        let deadline = Instant::now() + within;
        let mut data = self.lock();
        loop {
            if let Some(r) = f(&data) {
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            data = self.changed.wait_timeout(data, (deadline - now).min(slice)).unwrap().0;
        }
    }
}

/// The state letter of /proc/PID/stat (read after the command's ')').
fn proc_state(pid: i32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

/// A worker's last lines that were not reports (its harness's lines,
/// panics, its standard error), for a failing scenario's message.
#[derive(Clone, Default)]
pub struct WorkerLog(Arc<Mutex<VecDeque<String>>>);

impl WorkerLog {
    const LINES: usize = 40;

    /// Reads `child`'s output on two threads of its own: each line of its
    /// standard output goes to `report`, and is kept when `report` says it
    /// was none; each line of its standard error is kept.
    pub fn read(child: &mut Child, mut report: impl FnMut(&str) -> bool + Send + 'static) -> WorkerLog {
        let log = WorkerLog::default();
        let (out, err) = (child.stdout.take().expect("piped stdout"), child.stderr.take().expect("piped stderr"));
        let out_log = log.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if !report(&line) {
                    out_log.keep(line);
                }
            }
        });
        let err_log = log.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                err_log.keep(format!("stderr: {line}"));
            }
        });
        log
    }

    fn keep(&self, line: String) {
        let mut l = self.0.lock().unwrap();
        if l.len() == Self::LINES {
            l.pop_front();
        }
        l.push_back(line);
    }

    /// The lines kept, under a heading naming worker `i`; empty if none.
    pub fn text(&self, i: usize) -> String {
        let l = self.0.lock().unwrap();
        if l.is_empty() {
            return String::new();
        }
        let mut s = format!("w{i} log:\n");
        for line in l.iter() {
            s += &format!("  {line}\n");
        }
        s
    }
}
