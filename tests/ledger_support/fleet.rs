//! The fleet: worker processes (this test binary run again as
//! [`worker`](super::worker)s), each reaching the database through a fault
//! proxy of its own that this process owns, and what they report, in the
//! order this process read it. Dropping the fleet kills every worker (a
//! stopped one is continued first, so nothing is left behind after a
//! failed assertion) and prints each one's log when the test panicked.

use std::io::Write;
use std::process::{Child, ChildStdin};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fleet_path::{self, Reported, WorkerLog};
use super::oracle::{self, Report, Violation};
use super::worker::Spec;
use super::{Mode, Path, Tables, IDLE};
use crate::support::faults::FaultProxy;
use crate::support::random_tag;

/// What a worker reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Lead,
    Lost,
    Held,
    Committed,
    Failed,
    CheckLost,
    Quiet,
}

/// One reported event, with the instant this process read it.
#[derive(Clone, Debug)]
pub struct Ev {
    /// Its place in the fleet's list.
    pub idx: usize,
    pub at: Instant,
    pub worker: usize,
    pub kind: Kind,
    pub fence: i64,
    pub seq: i64,
    pub stamp: i64,
    pub stage: String,
    pub err: String,
}

impl Ev {
    fn parse(worker: usize, line: &str) -> Option<Ev> {
        let rest = &line[line.find("@ledger ")? + "@ledger ".len()..];
        let (head, err) = match rest.find(" err=") {
            Some(i) => (&rest[..i], rest[i + " err=".len()..].to_owned()),
            None => (rest, String::new()),
        };
        let mut words = head.split_whitespace();
        let kind = match words.next()? {
            "lead" => Kind::Lead,
            "lost" => Kind::Lost,
            "held" => Kind::Held,
            "committed" => Kind::Committed,
            "failed" => Kind::Failed,
            "check_lost" => Kind::CheckLost,
            "quiet" => Kind::Quiet,
            _ => return None,
        };
        let mut ev =
            Ev { idx: 0, at: Instant::now(), worker, kind, fence: 0, seq: 0, stamp: 0, stage: String::new(), err };
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "fence" => ev.fence = v.parse().ok()?,
                "seq" => ev.seq = v.parse().ok()?,
                "stamp" => ev.stamp = v.parse().ok()?,
                "stage" => ev.stage = v.to_owned(),
                _ => {}
            }
        }
        Some(ev)
    }
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    log: WorkerLog,
    killed: bool,
}

/// A fleet of worker processes in one election, with its tables.
pub struct Fleet {
    pub label: String,
    pub path: Path,
    pub mode: Mode,
    pub tables: Tables,
    proxies: Vec<FaultProxy>,
    workers: Vec<Worker>,
    events: Arc<Reported<Vec<Ev>>>,
    started: Instant,
}

impl Fleet {
    /// `n` workers in a new election with new tables; `scenario` names it
    /// in what it prints.
    pub fn start(path: Path, mode: Mode, scenario: &str, n: usize) -> Fleet {
        let tables = Tables::create(path);
        let name = format!("ledger-{}", random_tag());
        let mut f = Fleet {
            label: format!("{path}/{scenario}"),
            path,
            mode,
            tables,
            proxies: Vec::new(),
            workers: Vec::new(),
            events: Arc::default(),
            started: Instant::now(),
        };
        for i in 0..n {
            let proxy = FaultProxy::start(path.upstream());
            let spec = Spec {
                path,
                url: path.url_via(proxy.port()),
                election_table: f.tables.election.clone(),
                name: name.clone(),
                ledger: f.tables.ledger.clone(),
                clock: f.tables.clock.clone(),
                id: format!("w{i}"),
                mode,
                idle: IDLE,
            };
            let mut child = fleet_path::spawn_worker("ledger_worker", spec.env(), i);
            let events = f.events.clone();
            let log = WorkerLog::read(&mut child, move |line| {
                let Some(mut ev) = Ev::parse(i, line) else { return false };
                events.update(|l| {
                    ev.idx = l.len();
                    l.push(ev);
                    true
                })
            });
            let stdin = child.stdin.take();
            f.workers.push(Worker { child, stdin, log, killed: false });
            f.proxies.push(proxy);
        }
        f
    }

    /// One line of what the scenario measured.
    pub fn say(&self, what: &str) {
        eprintln!("chaos-ledger {} [{:>5.1} s]: {what}", self.label, self.started.elapsed().as_secs_f64());
    }

    pub fn proxy(&self, i: usize) -> &FaultProxy {
        &self.proxies[i]
    }

    /// How many events have been reported so far (a mark to wait from).
    pub fn mark(&self) -> usize {
        self.events.lock().len()
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Ev> {
        self.events.lock().clone()
    }

    /// Waits up to `within` for an event at or after `from` that `pred`
    /// accepts; the first one.
    pub fn wait_event(&self, from: usize, within: Duration, pred: impl Fn(&Ev) -> bool) -> Option<Ev> {
        self.wait_events(within, |l| l[from.min(l.len())..].iter().find(|e| pred(e)).cloned())
    }

    /// Waits up to `within` until `f` finds something in the events.
    pub fn wait_events<T>(&self, within: Duration, f: impl Fn(&[Ev]) -> Option<T>) -> Option<T> {
        self.events.wait(within, within, |l| f(l))
    }

    /// Waits for a steady leader after `from`: three commits in a row of
    /// one live worker under one fence. Its index and fence.
    pub fn steady(&self, from: usize, within: Duration) -> (usize, i64) {
        let alive: Vec<bool> = self.workers.iter().map(|w| !w.killed).collect();
        self.wait_events(within, |l| {
            let last: Vec<&Ev> =
                l[from.min(l.len())..].iter().filter(|e| e.kind == Kind::Committed).rev().take(3).collect();
            match &last[..] {
                [a, b, c]
                    if (a.worker, a.fence) == (b.worker, b.fence)
                        && (b.worker, b.fence) == (c.worker, c.fence)
                        && alive[a.worker] =>
                {
                    Some((a.worker, a.fence))
                }
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("{}: no steady leader within {within:?}\n{}", self.label, self.tail()))
    }

    /// Asks worker `i` to stop in its next transaction after the check and
    /// the insert, and waits for it to say it has; the `held` event.
    pub fn hold(&mut self, i: usize) -> Ev {
        let from = self.mark();
        self.send(i, "hold");
        self.wait_event(from, Duration::from_secs(5), |e| e.worker == i && e.kind == Kind::Held)
            .unwrap_or_else(|| panic!("{}: w{i} did not reach its hold point\n{}", self.label, self.tail()))
    }

    /// Lets worker `i` carry on from its hold point.
    pub fn go(&mut self, i: usize) {
        self.send(i, "go");
    }

    fn send(&mut self, i: usize, line: &str) {
        let w = &mut self.workers[i];
        let stdin = w.stdin.as_mut().unwrap_or_else(|| panic!("w{i} has no input"));
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).unwrap_or_else(|e| panic!("to w{i}: {e}"));
    }

    /// SIGSTOPs worker `i` and returns once every thread of it is stopped.
    pub fn sigstop(&self, i: usize) {
        fleet_path::sigstop(&self.workers[i].child, &format!("w{i}"));
    }

    pub fn sigcont(&self, i: usize) {
        fleet_path::sigcont(&self.workers[i].child, &format!("w{i}"));
    }

    /// SIGKILLs worker `i` and reaps it.
    pub fn sigkill(&mut self, i: usize) {
        let w = &mut self.workers[i];
        w.child.kill().unwrap_or_else(|e| panic!("SIGKILL w{i}: {e}"));
        w.child.wait().unwrap_or_else(|e| panic!("reaping w{i}: {e}"));
        w.killed = true;
        w.stdin = None;
    }

    /// The outcome worker `i` reports for its transaction `seq`
    /// (`committed` or `failed`), waited for up to `within`.
    pub fn outcome(&self, i: usize, seq: i64, from: usize, within: Duration) -> Ev {
        self.wait_event(from, within, |e| {
            e.worker == i && e.seq == seq && matches!(e.kind, Kind::Committed | Kind::Failed)
        })
        .unwrap_or_else(|| panic!("{}: w{i} reported no outcome of transaction {seq}\n{}", self.label, self.tail()))
    }

    /// Asks every live worker to write no more and waits until each says
    /// it has no transaction under way: from then on the ledger and the
    /// reported events are final.
    pub fn quiesce(&mut self) {
        let from = self.mark();
        let alive: Vec<usize> = (0..self.workers.len()).filter(|&i| !self.workers[i].killed).collect();
        for &i in &alive {
            self.send(i, "quit");
        }
        let quiet = self.wait_events(Duration::from_secs(15), |l| {
            let q: Vec<usize> = l[from..].iter().filter(|e| e.kind == Kind::Quiet).map(|e| e.worker).collect();
            alive.iter().all(|i| q.contains(i)).then_some(())
        });
        quiet.unwrap_or_else(|| panic!("{}: the workers did not all go quiet\n{}", self.label, self.tail()));
    }

    /// Judges the ledger as it is now.
    pub fn judge(&self) -> Result<Report, Vec<Violation>> {
        oracle::judge(&self.tables.rows())
    }

    /// The last events and every worker's log, for a failure message.
    pub fn tail(&self) -> String {
        let l = self.events.lock();
        let mut s = String::from("last events:\n");
        for e in l.iter().rev().take(25).collect::<Vec<_>>().into_iter().rev() {
            s += &format!(
                "  +{:.3}s w{} {:?} fence={} seq={} stamp={} {} {}\n",
                (e.at - self.started).as_secs_f64(),
                e.worker,
                e.kind,
                e.fence,
                e.seq,
                e.stamp,
                e.stage,
                e.err
            );
        }
        drop(l);
        for (i, w) in self.workers.iter().enumerate() {
            s += &w.log.text(i);
        }
        s
    }

    /// The instant this fleet started (figures are printed relative to it).
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let kept = fleet_path::failing(|| {
            format!("chaos-ledger {}: tables {} (kept)\n{}", self.label, self.tables.ledger, self.tail())
        });
        let workers = self.workers.iter_mut().map(|w| (&mut w.child, &mut w.stdin, &mut w.killed));
        fleet_path::end_fleet(kept, workers, || self.tables.drop_all());
    }
}
