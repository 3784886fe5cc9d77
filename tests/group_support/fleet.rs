//! The fleet: worker processes (this test binary run again as
//! [`worker`](super::worker)s), each reaching the database through a fault
//! proxy of its own that this process owns, and the book of what they
//! reported: every term of every election with its interval, the grants
//! not yet seen to start a term, each worker's latest status. Dropping
//! the fleet closes every worker's input (a stopped one is continued
//! first), kills any still there 10 s later, and prints each one's log
//! when the test panicked.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, ChildStdin};
use std::sync::{Arc, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::fleet_path::{self, Reported, WorkerLog};
use super::oracle::{Term, TermEnd};
use super::worker::{election_name, Mode, Spec};
use super::{mono_ns, Path, Tables};
use crate::support::faults::FaultProxy;
use crate::support::random_tag;

/// A worker's latest `status` line.
#[derive(Clone, Debug, Default)]
pub struct WStatus {
    pub at: u64,
    pub leading: usize,
    pub live: Option<u32>,
    pub share: Option<usize>,
    pub claiming: usize,
    pub shed: u64,
    pub failed: u64,
    pub pending: usize,
}

/// Everything the workers reported, as this process read it.
#[derive(Default)]
pub struct Book {
    pub terms: Vec<Term>,
    /// Terms still open, by worker, election and fence.
    open: HashMap<(usize, usize, u64), usize>,
    /// Grants not yet seen to start a term (or to be abandoned).
    grants: HashMap<(usize, usize, u64), u64>,
    pub status: HashMap<usize, WStatus>,
    /// Each worker's latest `ext` line: when a sweep saw deadlines move.
    pub ext: HashMap<usize, u64>,
    pub ready: HashMap<usize, u64>,
    pub done: HashMap<usize, u64>,
    pub cpu: HashMap<usize, String>,
    pub pending_at_end: HashMap<usize, u64>,
    /// Rules the workers saw broken, and reports that make no sense.
    pub violations: Vec<String>,
    pub abandoned: usize,
}

impl Book {
    fn take(&mut self, w: usize, line: &str) -> bool {
        // (The first line follows the harness's "test group_worker ... ".)
        let Some(at) = line.find("@g ") else { return false };
        let rest = &line[at + "@g ".len()..];
        let mut words = rest.split_whitespace();
        let what = words.next().unwrap_or("");
        let mut num = || -> u64 { words.next().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX) };
        match what {
            "ready" => {
                let t = num();
                self.ready.insert(w, t);
            }
            "grant" => {
                let (e, fence, t) = (num() as usize, num(), num());
                self.grants.insert((w, e, fence), t);
            }
            "abandoned" => {
                let (e, fence) = (num() as usize, num());
                self.grants.remove(&(w, e, fence));
                self.abandoned += 1;
            }
            "start" => {
                let (e, fence, t) = (num() as usize, num(), num());
                let how = rest.split_whitespace().nth(4).unwrap_or("").to_owned();
                self.grants.remove(&(w, e, fence));
                self.open.insert((w, e, fence), self.terms.len());
                self.terms.push(Term { worker: w, election: e, fence, start: t, end: None, start_how: how });
            }
            "end" => {
                let (e, fence, t) = (num() as usize, num(), num());
                let mut it = rest.split_whitespace().skip(4);
                let how = it.next().unwrap_or("").to_owned();
                let seen = it.next().and_then(|v| v.parse().ok()).unwrap_or(t);
                match self.open.remove(&(w, e, fence)) {
                    Some(k) => self.terms[k].end = Some(TermEnd { at: t, how, seen }),
                    None => self.violations.push(format!("w{w}: {line}: the end of a term never reported started")),
                }
            }
            "unseen" => {
                let (e, fence, start, end) = (num() as usize, num(), num(), num());
                self.grants.remove(&(w, e, fence));
                let how = "unseen".to_owned();
                self.terms.push(Term {
                    worker: w,
                    election: e,
                    fence,
                    start,
                    end: Some(TermEnd { at: end, how: how.clone(), seen: end }),
                    start_how: how,
                });
            }
            "ext" => {
                let t = num();
                self.ext.insert(w, t);
            }
            "status" => {
                let at = num();
                let mut s = WStatus { at, ..WStatus::default() };
                for kv in rest.split_whitespace().skip(2) {
                    let Some((k, v)) = kv.split_once('=') else { continue };
                    match k {
                        "leading" => s.leading = v.parse().unwrap_or(0),
                        "live" => s.live = v.parse().ok(),
                        "share" => s.share = v.parse().ok(),
                        "claiming" => s.claiming = v.parse().unwrap_or(0),
                        "shed" => s.shed = v.parse().unwrap_or(0),
                        "failed" => s.failed = v.parse().unwrap_or(0),
                        "pending" => s.pending = v.parse().unwrap_or(0),
                        _ => {}
                    }
                }
                self.status.insert(w, s);
            }
            "violation" => self.violations.push(format!("w{w}: {}", &rest["violation ".len()..])),
            "cpu" => {
                self.cpu.insert(w, rest["cpu ".len()..].to_owned());
            }
            "pending_at_end" => {
                let n = num();
                self.pending_at_end.insert(w, n);
            }
            "done" => {
                self.done.insert(w, mono_ns());
            }
            _ => return false,
        }
        true
    }

    /// Closes worker `w`'s open terms at `at` (it died then), and places
    /// its grants not yet seen to start a term from the grant to `at`.
    fn close_dead(&mut self, w: usize, at: u64) {
        let keys: Vec<(usize, usize, u64)> = self.open.keys().filter(|k| k.0 == w).copied().collect();
        for k in keys {
            let i = self.open.remove(&k).unwrap();
            self.terms[i].end = Some(TermEnd { at, how: "killed".to_owned(), seen: at });
        }
        let grants: Vec<((usize, usize, u64), u64)> =
            self.grants.iter().filter(|(k, _)| k.0 == w).map(|(k, t)| (*k, *t)).collect();
        for ((_, e, fence), t) in grants {
            self.grants.remove(&(w, e, fence));
            let end = Some(TermEnd { at, how: "killed".to_owned(), seen: at });
            self.terms.push(Term { worker: w, election: e, fence, start: t, end, start_how: "granted".to_owned() });
        }
    }

    /// Worker `w`'s open terms: election and fence.
    pub fn open_of(&self, w: usize) -> Vec<(usize, u64)> {
        self.open.keys().filter(|k| k.0 == w).map(|k| (k.1, k.2)).collect()
    }

    fn grants_of(&self, w: usize) -> usize {
        self.grants.keys().filter(|k| k.0 == w).count()
    }
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    proxy: FaultProxy,
    log: WorkerLog,
    dead: bool,
    stopped: bool,
    /// Its path is broken (a partition).
    cut: bool,
}

/// A fleet of worker processes running one group's elections, with its
/// table.
pub struct Fleet {
    pub label: String,
    pub path: Path,
    pub tables: Tables,
    pub group: String,
    pub elections: usize,
    workers: Vec<Worker>,
    reports: Arc<Reported<Book>>,
    started: Instant,
}

impl Fleet {
    /// A fleet on `path` with a new table, one worker per mode in `modes`;
    /// `scenario` (when not empty) names it after the path in what it
    /// prints.
    pub fn start(path: Path, scenario: &str, elections: usize, modes: &[Mode]) -> Fleet {
        let tables = Tables::create(path);
        let mut f = Fleet {
            label: if scenario.is_empty() { path.to_string() } else { format!("{path}/{scenario}") },
            path,
            group: format!("chaos-{}", random_tag()),
            tables,
            elections,
            workers: Vec::new(),
            reports: Arc::default(),
            started: Instant::now(),
        };
        for &m in modes {
            f.spawn(m);
        }
        f
    }

    /// Starts one more worker, `w<n>`; its index.
    pub fn spawn(&mut self, mode: Mode) -> usize {
        let i = self.workers.len();
        let proxy = FaultProxy::start(self.path.upstream());
        let spec = Spec {
            path: self.path,
            url: self.path.url_via(proxy.port()),
            table: self.tables.table.clone(),
            group: self.group.clone(),
            id: format!("w{i}"),
            elections: self.elections,
            mode,
        };
        let mut child = fleet_path::spawn_worker("group_worker", spec.env(), i);
        let reports = Arc::clone(&self.reports);
        let log = WorkerLog::read(&mut child, move |line| reports.update(|book| book.take(i, line)));
        let stdin = child.stdin.take();
        self.workers.push(Worker { child, stdin, proxy, log, dead: false, stopped: false, cut: false });
        i
    }

    /// One line of what the scenario measured about `step` (a fault, the
    /// start, the result): `chaos-group <path>/<step> [time] …`.
    pub fn say(&self, step: &str, what: &str) {
        let t = self.started.elapsed().as_secs_f64();
        eprintln!("chaos-group {}/{step} [{t:>5.1} s]: {what}", self.label);
    }

    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.reports.lock()
    }

    pub fn proxy(&self, w: usize) -> &FaultProxy {
        &self.workers[w].proxy
    }

    pub fn set_cut(&mut self, w: usize, cut: bool) {
        self.workers[w].cut = cut;
    }

    /// Workers alive (not killed).
    pub fn live(&self) -> Vec<usize> {
        (0..self.workers.len()).filter(|&w| !self.workers[w].dead).collect()
    }

    /// Waits up to `within` until `f` finds something in the book.
    pub fn wait_book<T>(&self, within: Duration, f: impl Fn(&Book) -> Option<T>) -> Option<T> {
        // The book changes with every report; also look every 50 ms, for
        // conditions on time alone.
        self.reports.wait(within, Duration::from_millis(50), f)
    }

    /// Whether the fleet has converged, as of reports after `since`: every
    /// election led by a live worker that runs and reaches the database,
    /// every such worker counting them all as members, with the share that
    /// gives, and leading no more than it.
    fn converged(&self, book: &Book, since: u64) -> Result<(), String> {
        let members: Vec<usize> = (0..self.workers.len()).filter(|&w| !self.workers[w].dead).collect();
        let share = self.elections.div_ceil(members.len());
        let mut led = vec![false; self.elections];
        let mut leads = vec![0usize; self.workers.len()];
        for &(w, e, _) in book.open.keys() {
            let wk = &self.workers[w];
            if !wk.dead && !wk.stopped && !wk.cut {
                led[e] = true;
                leads[w] += 1;
            }
        }
        if let Some(e) = led.iter().position(|l| !l) {
            let n = led.iter().filter(|l| !**l).count();
            return Err(format!("{n} elections not led ({} first)", election_name(e)));
        }
        for &w in &members {
            let st = book.status.get(&w).filter(|s| s.at > since).ok_or(format!("no status from w{w} yet"))?;
            if st.live != Some(members.len() as u32) || st.share != Some(share) {
                return Err(format!("w{w} counts {:?} members, share {:?}", st.live, st.share));
            }
            if leads[w] > share {
                return Err(format!("w{w} leads {} > share {share}", leads[w]));
            }
        }
        Ok(())
    }

    /// Waits up to `within` for the fleet to converge (see
    /// [`Fleet::converged`]) on reports after `since`; the instant it was
    /// first seen converged, or why it was not.
    pub fn wait_converged(&self, since: u64, within: Duration) -> Result<u64, String> {
        if let Some(t) = self.wait_book(within, |b| self.converged(b, since).ok().map(|()| mono_ns())) {
            return Ok(t);
        }
        Err(self.converged(&self.book(), since).err().unwrap_or_default())
    }

    /// The shares now: terms each live worker leads.
    pub fn shares(&self) -> Vec<(usize, usize)> {
        let book = self.book();
        self.live().into_iter().map(|w| (w, book.open.keys().filter(|k| k.0 == w).count())).collect()
    }

    /// Waits for worker `w` to report a sweep that saw deadlines move
    /// after `since` (a renewal batch was applied); its instant.
    pub fn wait_ext(&self, w: usize, since: u64, within: Duration) -> Option<u64> {
        self.wait_book(within, |b| b.ext.get(&w).copied().filter(|t| *t > since))
    }

    /// SIGSTOPs worker `w` and returns once every thread of it is stopped;
    /// the instant then.
    pub fn sigstop(&mut self, w: usize) -> u64 {
        fleet_path::sigstop(&self.workers[w].child, &format!("w{w}"));
        self.workers[w].stopped = true;
        mono_ns()
    }

    pub fn sigcont(&mut self, w: usize) -> u64 {
        let t = mono_ns();
        fleet_path::sigcont(&self.workers[w].child, &format!("w{w}"));
        self.workers[w].stopped = false;
        t
    }

    /// SIGKILLs worker `w` and reaps it; the instant after (its terms end
    /// there at the latest). First it is stopped, and killed only once
    /// everything it wrote has been read and every claim the database
    /// granted it has been seen to start a term or to come to nothing, so
    /// the book holds every term it could have had; otherwise it is
    /// continued and tried again a little later.
    pub fn sigkill(&mut self, w: usize) -> u64 {
        for _ in 0..30 {
            self.sigstop(w);
            // Its reader drains the pipe.
            thread::sleep(Duration::from_millis(100));
            if self.book().grants_of(w) == 0 {
                let wk = &mut self.workers[w];
                wk.child.kill().unwrap_or_else(|e| panic!("SIGKILL w{w}: {e}"));
                wk.child.wait().unwrap_or_else(|e| panic!("reaping w{w}: {e}"));
                let at = mono_ns();
                wk.dead = true;
                wk.stopped = false;
                wk.stdin = None;
                self.book().close_dead(w, at);
                return at;
            }
            self.sigcont(w);
            thread::sleep(Duration::from_millis(200));
        }
        panic!("{}: w{w} always had claims granted and not yet seen to start a term\n{}", self.label, self.tail())
    }

    /// Asks every live worker to shut its group down and report its last
    /// terms, and waits until each has.
    pub fn quit_all(&mut self, within: Duration) {
        let live = self.live();
        for &w in &live {
            let stdin = self.workers[w].stdin.as_mut().expect("a live worker's input");
            let _ = writeln!(stdin, "quit").and_then(|()| stdin.flush());
        }
        let done = self.wait_book(within, |b| live.iter().all(|w| b.done.contains_key(w)).then_some(()));
        done.unwrap_or_else(|| panic!("{}: the workers did not all finish\n{}", self.label, self.tail()));
    }

    /// The last terms and every worker's log, for a failure message.
    pub fn tail(&self) -> String {
        let b = self.reports.lock();
        let mut s = format!("{} terms reported, {} open; last ones:\n", b.terms.len(), b.open.len());
        for t in b.terms.iter().rev().take(15).collect::<Vec<_>>().into_iter().rev() {
            s += &format!("  {t}\n");
        }
        for (w, st) in &b.status {
            s += &format!("  w{w} status: {st:?}\n");
        }
        for v in b.violations.iter().take(10) {
            s += &format!("  violation: {v}\n");
        }
        drop(b);
        for (i, w) in self.workers.iter().enumerate() {
            s += &w.log.text(i);
        }
        s
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let kept = fleet_path::failing(|| {
            format!("chaos-group {}: table {} (kept)\n{}", self.label, self.tables.table, self.tail())
        });
        let workers = self.workers.iter_mut().map(|w| (&mut w.child, &mut w.stdin, &mut w.dead));
        fleet_path::end_fleet(kept, workers, || self.tables.drop_all());
    }
}
