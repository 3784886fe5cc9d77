//! Row 9 with the followers in processes of their own (issue 36): the
//! layout of a real deployment, where every follower has a store of its own
//! (its own pool and its own listening connection on PostgreSQL, its own
//! lock waiter on MariaDB), beside row 9's followers sharing one store in
//! one process (`handover.rs`).
//!
//! Each trial starts a leader in this process on a store of its own and `n`
//! follower processes (this binary run again, see [`worker_main`]), waits
//! until every follower has seen the leader, then a retry period and a
//! random part of another (so the poll phases fall anywhere), asks each
//! follower for its claims so far, and shuts the leader down cleanly.
//! Measured from the start of the leader's `shutdown()` to the instant the
//! first follower's elector learnt that its claim had won
//! (`Status::term_started`), both on CLOCK_MONOTONIC, one clock for every
//! process of the host. A retry period after that first start the
//! followers are asked for their claims again: a release must cost each of
//! them at most one claim (and the leader's life none), and exactly one of
//! them must have started a term.
//!
//! A follower writes one line per fact on standard output, instants in
//! nanoseconds of CLOCK_MONOTONIC: `ready` (it has seen the leader),
//! `start FENCE T` (its term began at T), `end FENCE T` (it last saw that
//! term valid at T), `count N` (its acquire calls so far, answering `count`
//! on its standard input, after a `claim T MICROS` line for each claim since
//! the last `count`: sent at T, answered MICROS later) and `claims N` (its
//! acquire calls, at its end). It ends on `quit` or at the end of its input,
//! shutting its elector down.
//!
//! Beside the hand-over, the row reports when the first claim of any
//! follower left after the release and when the winner's did, and how long
//! the winner's took: whether a slow hand-over waited for the wake or for
//! the claim.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector};
use parking_lot::Mutex;

use crate::clock::mono_ns;
use crate::common::{
    end_worker, ms, pct, poll, random_below, random_tag, violation, Counting, Db, OwnTable, Table, Verdict,
};
use crate::cost::{Kind, WorkerEnv};
use crate::failover::TIMING;

/// Set in a follower's environment; its orders are in the other
/// `LE_BENCH_HANDOVER_*` variables ([`WorkerEnv`]).
pub const WORKER_ENV: &str = "LE_BENCH_HANDOVER_WORKER";

/// The prefix of a follower's orders.
const ENV: &str = "LE_BENCH_HANDOVER";

/// The most sessions the row needs on the server: two per follower (pool
/// and feed), the leader's and the controller's, with room to spare.
const SESSIONS_PER_FOLLOWER: usize = 2;

// ---- the follower -------------------------------------------------------

fn put(text: &str) {
    let out = std::io::stdout();
    let mut out = out.lock();
    // The controller gone, a follower has nobody to tell: it ends at the
    // end of its input.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// One follower process (`main` calls this when [`WORKER_ENV`] is set).
pub fn worker_main() -> ExitCode {
    crate::common::worker_exit("bench follower", worker())
}

/// The instant `t` on CLOCK_MONOTONIC, in nanoseconds.
fn to_mono(t: Instant) -> u64 {
    let (now, m) = (Instant::now(), mono_ns());
    m.saturating_sub(now.saturating_duration_since(t).as_nanos() as u64)
}

fn worker() -> Result<(), String> {
    let WorkerEnv { kind, url, table, name, id } = WorkerEnv::read(ENV)?;
    // A store of the follower's own: a pool of one connection and the feed
    // of releases; the controller made the schema.
    let counting = Counting::new(kind.build(&url, &table, true, Some(1), false)?, true);
    let elector = Elector::start(Config::new(Arc::clone(&counting), name.as_str()).identity(id).timing(TIMING))
        .map_err(|e| e.to_string())?;
    let (orders, rx) = mpsc::channel::<String>();
    thread::Builder::new()
        .name("bench-orders".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let quit = line.trim() == "quit";
                if orders.send(line.trim().to_owned()).is_err() || quit {
                    return;
                }
            }
            let _ = orders.send("quit".into());
        })
        .map_err(|e| e.to_string())?;
    poll(Duration::from_secs(30), Duration::from_millis(5), || elector.status().leader.is_some().then_some(()))
        .ok_or("never saw the leader within 30 s")?;
    put("ready\n");
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        // The watcher: reports the term this follower starts, and its end.
        let watcher = s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let Ok(guard) = elector.wait_leader_timeout(Duration::from_millis(100)) else { continue };
                let started = elector.status().term_started.map_or(0, to_mono);
                put(&format!("start {} {started}\n", guard.fence()));
                let mut last = started;
                loop {
                    let t = mono_ns();
                    if !guard.is_valid() {
                        break;
                    }
                    last = t;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let _ = guard.wait_lost_timeout(Duration::from_millis(20));
                }
                put(&format!("end {} {last}\n", guard.fence()));
            }
        });
        for order in rx.iter() {
            match order.as_str() {
                "count" => {
                    let claims = counting.take_timed().into_iter().filter(|c| c.claim);
                    let lines: String = claims.map(|c| format!("claim {} {}\n", to_mono(c.start), c.micros)).collect();
                    put(&format!("{lines}count {}\n", counting.calls().acquire));
                }
                "quit" => break,
                _ => {}
            }
        }
        stop.store(true, Ordering::SeqCst);
        let _ = watcher.join();
    });
    let _ = elector.shutdown();
    put(&format!("claims {}\n", counting.calls().acquire));
    Ok(())
}

// ---- the controller -----------------------------------------------------

/// What one follower said.
#[derive(Default)]
struct Heard {
    ready: bool,
    /// `(fence, T)` of each term it started.
    starts: Vec<(u64, u64)>,
    /// `(fence, T)`: the term was last seen valid at T.
    ends: Vec<(u64, u64)>,
    counts: Vec<u64>,
    /// `(sent at, took µs)` of each claim reported.
    claimed: Vec<(u64, u64)>,
    claims: Option<u64>,
    /// Its output closed (it exited).
    ended: bool,
    bad: Vec<String>,
}

impl Heard {
    fn line(&mut self, l: &str) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        match (f.first().copied(), num(1), num(2)) {
            (Some("ready"), None, None) => self.ready = true,
            (Some("start"), Some(fence), Some(t)) => self.starts.push((fence, t)),
            (Some("end"), Some(fence), Some(t)) => self.ends.push((fence, t)),
            (Some("count"), Some(n), None) => self.counts.push(n),
            (Some("claim"), Some(t), Some(micros)) => self.claimed.push((t, micros)),
            (Some("claims"), Some(n), None) => self.claims = Some(n),
            _ => self.bad.push(l.to_owned()),
        }
    }
}

struct Follower {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<thread::JoinHandle<()>>,
    heard: Arc<Mutex<Heard>>,
}

/// The followers of one trial: told to quit, given a few seconds, then
/// killed and reaped when dropped, on every path.
struct Followers(Vec<Follower>);

impl Followers {
    fn tell(&mut self, order: &str) {
        for f in &mut self.0 {
            if let Some(s) = &mut f.stdin {
                let _ = s.write_all(order.as_bytes());
            }
        }
    }
    fn all(&self, f: impl Fn(&Heard) -> bool) -> bool {
        self.0.iter().all(|w| f(&w.heard.lock()))
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        self.tell("quit\n");
        for f in &mut self.0 {
            f.stdin = None;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for f in &mut self.0 {
            end_worker(&mut f.child, &mut f.reader, deadline, Duration::from_millis(10));
        }
    }
}

fn spawn(kind: Kind, url: &str, table: &str, name: &str, i: usize) -> Result<Follower, String> {
    let orders = WorkerEnv { kind, url: url.into(), table: table.into(), name: name.into(), id: format!("f{i}") };
    let (mut child, stdout) = orders.start(ENV, WORKER_ENV, &[])?;
    let heard = Arc::new(Mutex::new(Heard::default()));
    let h = Arc::clone(&heard);
    let reader = thread::Builder::new()
        .name("bench-follower".into())
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                h.lock().line(&line);
            }
            h.lock().ended = true;
        })
        .map_err(|e| e.to_string())?;
    Ok(Follower { stdin: child.stdin.take(), child, reader: Some(reader), heard })
}

/// Asks every follower for its claims so far; the `k`-th answer of each.
fn counts(fs: &mut Followers, k: usize) -> Result<Vec<u64>, String> {
    fs.tell("count\n");
    poll(Duration::from_secs(10), Duration::from_micros(500), || {
        fs.all(|h| h.counts.len() > k || h.ended).then_some(())
    })
    .ok_or("followers did not answer `count` within 10 s")?;
    fs.0.iter()
        .enumerate()
        .map(|(i, f)| f.heard.lock().counts.get(k).copied().ok_or_else(|| format!("follower f{i} exited")))
        .collect()
}

/// A term a follower started: `(follower, fence, start, last seen valid)`.
type Term = (usize, u64, u64, u64);

/// The violations among `terms` (sorted here by start): a term started
/// before the one started just before it was last seen valid (both valid
/// at its start), or a fence that did not increase.
fn judge(terms: &mut [Term]) -> Vec<String> {
    terms.sort_by_key(|t| t.2);
    let mut bad = Vec::new();
    for w in terms.windows(2) {
        let ((a, fa, _, ea), (b, fb, sb, _)) = (w[0], w[1]);
        if sb < ea {
            bad.push(format!("f{a} (fence {fa}) and f{b} (fence {fb}) both led at {sb} ns"));
        }
        if fb <= fa {
            bad.push(format!("fence {fb} (f{b}) after fence {fa} (f{a})"));
        }
    }
    bad
}

/// The judge must convict an overlap and a fence that did not increase,
/// and acquit terms one after another.
fn judge_convicts() -> Result<(), String> {
    let mut overlap = [(1, 8, 400, 900), (0, 7, 100, 500)];
    let mut backwards = [(0, 7, 100, 200), (1, 7, 300, 400)];
    let mut fine = [(0, 7, 100, 200), (1, 8, 300, 400), (0, 9, 500, 600)];
    match (judge(&mut overlap).len(), judge(&mut backwards).len(), judge(&mut fine).len()) {
        (1, 1, 0) => Ok(()),
        got => Err(format!("row 9's judge is broken: (overlap, backwards, fine) convicted {got:?}, want (1, 1, 0)")),
    }
}

struct HandOver {
    took: Duration,
    /// From the release's start to the first claim sent by any follower,
    /// to the winner's claim sent, and how long the winner's claim took.
    first_claim: Duration,
    winner_claim: Duration,
    winner_claim_took: Duration,
    most_claims: u64,
    claims_while_live: u64,
}

fn trial(kind: Kind, url: &str, table: &str, name: &str, n: usize) -> Result<HandOver, String> {
    let leader = Elector::start(Config::new(kind.store(url, table)?, name).identity("leader").timing(TIMING))
        .map_err(|e| e.to_string())?;
    let guard = leader.wait_leader_timeout(Duration::from_secs(10)).map_err(|e| format!("first leader: {e}"))?;
    let mut fs = Followers(Vec::with_capacity(n));
    for i in 0..n {
        fs.0.push(spawn(kind, url, table, name, i)?);
    }
    poll(Duration::from_secs(60), Duration::from_millis(10), || fs.all(|h| h.ready || h.ended).then_some(()))
        .ok_or("the followers did not all see the leader within 60 s")?;
    if let Some(i) = fs.0.iter().position(|f| f.heard.lock().ended) {
        return Err(format!("follower f{i} exited at start (see its stderr above)"));
    }
    thread::sleep(TIMING.retry_period + random_below(TIMING.retry_period));
    let before = counts(&mut fs, 0)?;
    let t0 = mono_ns();
    leader.shutdown().map_err(|e| format!("the leader's release failed: {e}"))?;
    drop(guard);
    let first = poll(TIMING.lease_duration + Duration::from_secs(5), Duration::from_micros(200), || {
        fs.0.iter().filter_map(|f| f.heard.lock().starts.first().copied()).min_by_key(|&(_, t)| t)
    })
    .ok_or("nobody took over within the lease + 5 s")?;
    // Every claim the release prompted has landed well within a retry
    // period, and any second term started in it would be a violation.
    thread::sleep(TIMING.retry_period);
    let after = counts(&mut fs, 1)?;
    // The terms started, each with the instant it was last seen valid
    // (still running: now).
    let now = mono_ns();
    let mut terms: Vec<Term> = Vec::new();
    for (i, f) in fs.0.iter().enumerate() {
        let h = f.heard.lock();
        if let Some(l) = h.bad.first() {
            return Err(format!("follower f{i}: unreadable line {l:?}"));
        }
        for &(fence, t) in &h.starts {
            let end = h.ends.iter().find(|e| e.0 == fence).map_or(now, |e| e.1);
            terms.push((i, fence, t, end));
        }
    }
    for v in judge(&mut terms) {
        violation(&format!("{name}: {v}"));
    }
    if terms.len() != 1 {
        return Err(format!("{} terms started within a retry period of the release, not 1", terms.len()));
    }
    let most_claims = after.iter().zip(&before).map(|(a, b)| a.saturating_sub(*b)).max().unwrap_or(0);
    let claims_while_live = before.iter().sum();
    // The claims sent since the release; the winner's is its last before
    // its term started.
    let since = |i: usize| -> Vec<(u64, u64)> {
        fs.0[i].heard.lock().claimed.iter().copied().filter(|&(t, _)| t >= t0).collect()
    };
    let first_claim = (0..n).flat_map(since).map(|(t, _)| t).min().ok_or("no claim was sent after the release")?;
    let winner = terms[0];
    let (sent, micros) = since(winner.0)
        .into_iter()
        .filter(|&(t, _)| t <= winner.2)
        .max_by_key(|&(t, _)| t)
        .ok_or("the winner sent no claim after the release")?;
    drop(fs);
    let after_release = |t: u64| Duration::from_nanos(t.saturating_sub(t0));
    Ok(HandOver {
        took: after_release(first.1),
        first_claim: after_release(first_claim),
        winner_claim: after_release(sent),
        winner_claim_took: Duration::from_micros(micros),
        most_claims,
        claims_while_live,
    })
}

/// MariaDB's `max_connections`, raised for the row and put back after.
struct MaxConnections {
    url: String,
    old: Option<u64>,
}

impl MaxConnections {
    fn at_least(url: &str, want: u64) -> Result<MaxConnections, String> {
        use mysql::prelude::Queryable;
        let mut c = crate::common::my_client(url)?;
        let old: u64 =
            c.query_first("SELECT @@GLOBAL.max_connections").map_err(|e| e.to_string())?.ok_or("no max_connections")?;
        if old >= want {
            return Ok(MaxConnections { url: url.to_owned(), old: None });
        }
        c.query_drop(format!("SET GLOBAL max_connections = {want}"))
            .map_err(|e| format!("cannot raise max_connections to {want}: {e}"))?;
        Ok(MaxConnections { url: url.to_owned(), old: Some(old) })
    }
}

impl Drop for MaxConnections {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let sql = format!("SET GLOBAL max_connections = {old}");
            if let Err(e) = Db::connect(&self.url).and_then(|mut db| db.exec(&sql)) {
                eprintln!("bench: could not put max_connections back to {old}: {e}");
            }
        }
    }
}

/// `trials` hand-overs with `n` follower processes on `label`'s path (the
/// feed of releases on); adds a row.
pub fn run(label: &str, kind: Kind, url: &str, n: usize, trials: usize, table: &mut Table) -> Result<(), String> {
    judge_convicts()?;
    let _raised = match kind {
        Kind::MariaDb => Some(MaxConnections::at_least(url, (n * SESSIONS_PER_FOLLOWER + 100).max(400) as u64)?),
        Kind::Postgres => None,
    };
    let own = OwnTable::new(url, "hoprocs");
    kind.store(url, &own.name)?; // the schema, once, before the followers
    let tag = random_tag();
    let (mut took, mut most, mut live) = (Vec::new(), 0, 0);
    let (mut first, mut winner, mut winner_took) = (Vec::new(), Vec::new(), Vec::new());
    let msf = |d: Duration| d.as_secs_f64() * 1000.0;
    for i in 0..trials {
        let h = trial(kind, url, &own.name, &format!("hoprocs-{tag}-{i}"), n).map_err(|e| format!("{label}: {e}"))?;
        took.push(msf(h.took));
        first.push(msf(h.first_claim));
        winner.push(msf(h.winner_claim));
        winner_took.push(msf(h.winner_claim_took));
        most = most.max(h.most_claims);
        live += h.claims_while_live;
    }
    let (p50, p99) = (pct(&mut took, 50.0), pct(&mut took, 99.0));
    table.add(
        format!("9. clean hand-over, {label}, {n} followers in processes of their own (retry period 1 s)"),
        format!(
            "p50 {}, p99 {}, max {} ({trials} hand-overs; p50 after the release: first claim sent {}, the \
             winner's sent {}, answered in {}); claims per follower per release: at most {most}; claims while \
             the leader lived: {live}",
            ms(p50),
            ms(p99),
            ms(took[took.len() - 1]),
            ms(pct(&mut first, 50.0)),
            ms(pct(&mut winner, 50.0)),
            ms(pct(&mut winner_took, 50.0)),
        ),
        "p50 ≤ 5 ms, p99 ≤ 20 ms; ≤ 1 claim; 0",
        Verdict::of(p50 <= 5.0 && p99 <= 20.0 && most <= 1 && live == 0),
    );
    Ok(())
}
