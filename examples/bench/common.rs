//! What every row shares: the result table, the safety-violation count, a
//! store wrapper that counts and times calls, percentiles, a leadership
//! sampler that can only report real overlaps, and plain database clients.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderelection::{Elector, Lease, Store, StoreError};
use parking_lot::Mutex;

/// Safety violations seen by any row: two valid leaders of one election at
/// one instant, or a fence that did not increase. Any makes the run fail.
pub static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// Records a safety violation and says what it was.
pub fn violation(what: &str) {
    VIOLATIONS.fetch_add(1, Relaxed);
    eprintln!("bench: SAFETY VIOLATION: {what}");
}

/// How a measured figure compares with its target.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// No target: a figure to read.
    Info,
    /// A safety violation (the run exits non-zero).
    Violation,
}

impl Verdict {
    pub fn of(met: bool) -> Verdict {
        if met {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }
    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::Info => "—",
            Verdict::Violation => "VIOLATION",
        }
    }
}

/// The one table the run prints: row, measured, target, verdict.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 4]>,
}

impl Table {
    pub fn add(&mut self, row: impl Into<String>, measured: impl Into<String>, target: &str, v: Verdict) {
        let r = [row.into(), measured.into(), target.to_owned(), v.text().to_owned()];
        eprintln!("bench: | {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        self.rows.push(r);
    }

    /// A Markdown table, header included.
    pub fn markdown(&self) -> String {
        let mut s = String::from("| row | measured | target | verdict |\n|---|---|---|---|\n");
        for r in &self.rows {
            let _ = writeln!(s, "| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
        s
    }
}

/// The `p`-th percentile (0–100) of `v` by nearest rank; `v` is sorted here.
pub fn pct<T: Copy + PartialOrd>(v: &mut [T], p: f64) -> T {
    assert!(!v.is_empty(), "percentile of no samples");
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Calls made through a [`Counting`] store, by operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Calls {
    pub acquire: u64,
    pub renew: u64,
    pub release: u64,
    pub inspect: u64,
}

impl Calls {
    pub fn total(&self) -> u64 {
        self.acquire + self.renew + self.release + self.inspect
    }
    /// Calls that may write: acquire, renew, release.
    pub fn writes(&self) -> u64 {
        self.acquire + self.renew + self.release
    }
    pub fn since(&self, before: &Calls) -> Calls {
        Calls {
            acquire: self.acquire - before.acquire,
            renew: self.renew - before.renew,
            release: self.release - before.release,
            inspect: self.inspect - before.inspect,
        }
    }
}

/// A [`Store`] that forwards every call to `inner` and counts it (each call
/// is one round trip, one query), and optionally keeps its latency.
pub struct Counting {
    inner: Arc<dyn Store>,
    acquire: AtomicU64,
    renew: AtomicU64,
    release: AtomicU64,
    inspect: AtomicU64,
    /// Calls started and not yet returned.
    in_flight: AtomicU64,
    /// Each call's timing, when kept.
    latencies: Option<Mutex<Vec<Timed>>>,
}

/// One call through a [`Counting`] store that keeps latencies.
#[derive(Clone, Copy)]
pub struct Timed {
    pub start: Instant,
    pub micros: u32,
    /// The call was a renewal.
    pub renewal: bool,
    /// The call was a claim.
    pub claim: bool,
}

impl Counting {
    pub fn new(inner: Arc<dyn Store>, keep_latency: bool) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            acquire: AtomicU64::new(0),
            renew: AtomicU64::new(0),
            release: AtomicU64::new(0),
            inspect: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            latencies: keep_latency.then(|| Mutex::new(Vec::with_capacity(1 << 16))),
        })
    }

    pub fn calls(&self) -> Calls {
        Calls {
            acquire: self.acquire.load(Relaxed),
            renew: self.renew.load(Relaxed),
            release: self.release.load(Relaxed),
            inspect: self.inspect.load(Relaxed),
        }
    }

    /// The latencies (microseconds) of the calls that started at `since` or
    /// later, emptying the record.
    pub fn take_latencies(&self, since: Instant) -> Vec<u32> {
        self.take_timed().into_iter().filter(|c| c.start >= since).map(|c| c.micros).collect()
    }

    /// Every kept call's timing, emptying the record.
    pub fn take_timed(&self) -> Vec<Timed> {
        self.latencies.as_ref().map(|l| std::mem::take(&mut *l.lock())).unwrap_or_default()
    }

    /// Calls started through this wrapper that have not returned yet (an
    /// elector leaves a call it abandoned, or one in flight when it shut
    /// down, to finish on its own thread).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    fn timed<T>(&self, counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        self.in_flight.fetch_add(1, Relaxed);
        let r = f();
        self.in_flight.fetch_sub(1, Relaxed);
        counter.fetch_add(1, Relaxed);
        if let Some(l) = &self.latencies {
            let micros = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
            let (renewal, claim) = (std::ptr::eq(counter, &self.renew), std::ptr::eq(counter, &self.acquire));
            l.lock().push(Timed { start: t, micros, renewal, claim });
        }
        r
    }
}

impl Store for Counting {
    fn acquire(&self, name: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.timed(&self.acquire, || self.inner.acquire(name, id, ttl, p, t))
    }
    fn renew(&self, name: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.timed(&self.renew, || self.inner.renew(name, id, f, ttl, p, t))
    }
    fn release(&self, name: &str, id: &str, fence: u64, t: Duration) -> Result<(), StoreError> {
        self.timed(&self.release, || self.inner.release(name, id, fence, t))
    }
    fn inspect(&self, name: &str, t: Duration) -> Result<Lease, StoreError> {
        self.timed(&self.inspect, || self.inner.inspect(name, t))
    }
    fn releases(&self) -> Option<crossbeam_channel::Receiver<leaderelection::Released>> {
        self.inner.releases()
    }
}

/// One look at the electors of one election.
pub struct Sample {
    /// Electors that led at their first read.
    pub leaders: usize,
    /// The fence each elector led under at its first read.
    pub fences: Vec<Option<u64>>,
    /// Proof of two valid guards at one instant.
    pub overlap: bool,
}

/// Reads every elector's fence twice, in order. An elector seen leading
/// under the same fence in both passes led throughout the time between its
/// two reads (a term's validity is one interval: once invalid it stays so),
/// so another elector read leading within that time is a second leader at
/// that very instant. Reads are not simultaneous, so a hand-over between
/// them is never mistaken for an overlap.
pub fn sample(electors: &[&Elector]) -> Sample {
    let first: Vec<Option<u64>> = electors.iter().map(|e| e.fence()).collect();
    let second: Vec<Option<u64>> = electors.iter().map(|e| e.fence()).collect();
    let n = electors.len();
    let overlap = (0..n).any(|i| {
        first[i].is_some()
            && first[i] == second[i]
            && ((i + 1..n).any(|j| first[j].is_some()) || (0..i).any(|j| second[j].is_some()))
    });
    Sample { leaders: first.iter().filter(|f| f.is_some()).count(), fences: first, overlap }
}

/// Per election: fences must strictly increase from term to term, and no
/// two electors may lead under one fence.
#[derive(Default)]
pub struct FenceOrder {
    last: Option<(u64, usize)>,
}

impl FenceOrder {
    /// Feeds the fences of one [`Sample`]; returns a description of a
    /// violation, if any.
    pub fn check(&mut self, fences: &[Option<u64>]) -> Option<String> {
        for (who, f) in fences.iter().enumerate() {
            let Some(f) = *f else { continue };
            match self.last {
                Some((max, holder)) if f < max => {
                    return Some(format!("elector {who} leads under fence {f} after fence {max} (elector {holder})"))
                }
                Some((max, holder)) if f == max && who != holder => {
                    return Some(format!("electors {holder} and {who} both led under fence {f}"))
                }
                _ => self.last = Some((f, who)),
            }
        }
        None
    }
}

/// `(prefix, host:port, rest)` of a `scheme://user@host:port/db` URL.
pub fn split_url(url: &str) -> (&str, &str, &str) {
    let start = url.find('@').map_or_else(|| url.find("://").map_or(0, |i| i + 3), |i| i + 1);
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

/// The URL with its host and port replaced by `127.0.0.1:port`.
pub fn via_port(url: &str, port: u16) -> String {
    let (pre, _, rest) = split_url(url);
    format!("{pre}127.0.0.1:{port}{rest}")
}

/// The server port of a URL.
pub fn url_port(url: &str) -> u16 {
    let hp = split_url(url).1;
    hp.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the URL names a port")
}

/// Local ports of this process's TCP connections to 127.0.0.1:`server_port`
/// (its socket inodes matched against /proc/self/net/tcp).
pub fn own_ports(server_port: u16) -> HashSet<u16> {
    let mut inodes = HashSet::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for e in dir.flatten() {
            if let Ok(l) = std::fs::read_link(e.path()) {
                let l = l.to_string_lossy();
                if let Some(i) = l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(i.to_owned());
                }
            }
        }
    }
    let want = format!("0100007F:{server_port:04X}");
    let tcp = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[2] == want && inodes.contains(f[9]))
                .then(|| u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect()
}

/// `(VmRSS, VmHWM)` in MiB and the thread count, from /proc/self/status.
pub fn proc_status() -> (f64, f64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:") as f64 / 1024.0, field("VmHWM:") as f64 / 1024.0, field("Threads:"))
}

/// A plain PostgreSQL client (not the library's) for setup and statistics.
pub fn pg_client(dsn: &str) -> Result<postgres::Client, String> {
    postgres::Client::connect(dsn, postgres::NoTls).map_err(|e| format!("cannot connect to PostgreSQL: {e}"))
}

/// A plain MySQL client (not the library's) for setup and statistics.
pub fn my_client(url: &str) -> Result<mysql::Conn, String> {
    mysql::Conn::new(mysql::Opts::from_url(url).map_err(|e| e.to_string())?)
        .map_err(|e| format!("cannot connect to MariaDB: {e}"))
}

/// Sessions on the server whose client port is one of this process's
/// sockets (the monitoring session itself left out).
pub fn server_sessions(db: &mut Db, server_port: u16) -> Result<usize, String> {
    let ports: Vec<u16> = match db {
        Db::Pg(c) => c
            .query("SELECT client_port FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND client_port > 0", &[])
            .map_err(|e| e.to_string())?
            .iter()
            .map(|r| r.get::<_, i32>(0) as u16)
            .collect(),
        Db::My(c) => {
            use mysql::prelude::Queryable;
            let hosts: Vec<String> = c
                .query("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()")
                .map_err(|e| e.to_string())?;
            hosts.iter().filter_map(|h| h.rsplit(':').next()?.parse().ok()).collect()
        }
    };
    let own = own_ports(server_port);
    Ok(ports.iter().filter(|p| own.contains(p)).count())
}

/// A plain client of either kind.
pub enum Db {
    Pg(Box<postgres::Client>),
    My(mysql::Conn),
}

impl Db {
    pub fn connect(url: &str) -> Result<Db, String> {
        if url.starts_with("mysql:") {
            my_client(url).map(Db::My)
        } else {
            pg_client(url).map(|c| Db::Pg(Box::new(c)))
        }
    }

    pub fn exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Db::Pg(c) => c.batch_execute(sql).map_err(|e| e.to_string()),
            Db::My(c) => {
                use mysql::prelude::Queryable;
                c.query_drop(sql).map_err(|e| e.to_string())
            }
        }
    }
}

/// A table of the run's own, dropped when this goes out of scope, with the
/// slots and members tables `ensure_schema` makes beside it
/// (`<name>_slots`, `<name>_members`).
pub struct OwnTable {
    pub name: String,
    url: String,
}

impl OwnTable {
    pub fn new(url: &str, purpose: &str) -> OwnTable {
        OwnTable { name: format!("le_bench_{purpose}_{}", random_tag()), url: url.to_owned() }
    }
}

impl Drop for OwnTable {
    fn drop(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {0}, {0}_slots, {0}_members", self.name);
        drop_quietly(&self.url, &sql, &format!("table {}", self.name));
    }
}

/// Runs `sql`, a `DROP` of `what`, on `url` from a `Drop` impl: a failure
/// is printed, not raised (the run's result is already decided).
pub fn drop_quietly(url: &str, sql: &str, what: &str) {
    if let Err(e) = Db::connect(url).and_then(|mut db| db.exec(sql)) {
        eprintln!("bench: could not drop {what}: {e}");
    }
}

/// Eight random hex digits.
pub fn random_tag() -> String {
    let mut r = [0u8; 4];
    getrandom::fill(&mut r).expect("randomness");
    r.iter().map(|b| format!("{b:02x}")).collect()
}

/// A uniformly random duration in `[0, d)`.
pub fn random_below(d: Duration) -> Duration {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).expect("randomness");
    d.mul_f64((u64::from_le_bytes(r) >> 11) as f64 / (1u64 << 53) as f64)
}

/// Polls `f` every `step` until it returns `Some` or `within` passes.
pub fn poll<T>(within: Duration, step: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(step);
    }
}

/// Milliseconds, with two decimals below 10 ms, one below 100 ms, else none.
pub fn ms(d: f64) -> String {
    if d >= 100.0 {
        format!("{d:.0} ms")
    } else if d >= 10.0 {
        format!("{d:.1} ms")
    } else {
        format!("{d:.2} ms")
    }
}

/// Waits until `deadline` for a worker process told to quit to exit,
/// looking every `step`; then kills it if it still runs, reaps it, and
/// joins the thread that read its output.
pub fn end_worker(
    child: &mut std::process::Child, reader: &mut Option<std::thread::JoinHandle<()>>, deadline: Instant,
    step: Duration,
) {
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(step);
    }
    let _ = child.kill();
    let _ = child.wait();
    if let Some(r) = reader.take() {
        let _ = r.join();
    }
}

/// A worker process's exit: success, or its error on stderr as `who: …`
/// and exit code 1.
pub fn worker_exit(who: &str, result: Result<(), String>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{who}: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
