//! Row 12 (issue 36), a probe of a feed not built yet: PostgreSQL
//! followers, each a process of its own, queued on a session advisory lock
//! that the leader holds, so that a release wakes one of them at a time
//! instead of all at once (`NOTIFY`, rows 9 and 10). The library's store
//! makes every claim and release; only the lock is the probe's.
//!
//! A trial: the leader claims and takes `pg_advisory_lock(k)` on a session
//! of its own; every follower blocks in `pg_advisory_lock(k)` on a session
//! of its own, and once `pg_locks` shows all of them waiting the leader
//! releases the lease, then the lock. The server grants the lock to one
//! waiter. `pass`: it unlocks at once (the next waiter wakes), then
//! claims, as the MariaDB feed's waiters do in one statement. `hold`: it
//! claims first, then unlocks, so the next waiter wakes after that claim
//! was answered. The figure runs from just before the release statement to
//! the winner's claim answered, on `CLOCK_MONOTONIC`. Every trial must
//! have at most one winner.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, ExitCode};
use std::time::{Duration, Instant};

use crate::clock::mono_ns;
use crate::common::{end_worker, pct, poll, violation, OwnTable, Table, Verdict};
use crate::cost::{Kind, WorkerEnv};

/// Set in a follower process's environment; its orders are in the other
/// `LE_BENCH_CHAIN_*` variables ([`WorkerEnv`] and `_MODE`).
pub const WORKER_ENV: &str = "LE_BENCH_CHAIN_WORKER";

/// The prefix of a follower's orders.
const ENV: &str = "LE_BENCH_CHAIN";

/// The probe's lock key (any key no one else uses).
const KEY: i64 = 0x004c_4563_6861_696e;
const NAME: &str = "chain";
const T: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);

fn lock_session(dsn: &str) -> Result<postgres::Client, String> {
    let mut c = postgres::Client::connect(dsn, postgres::NoTls).map_err(|e| e.to_string())?;
    c.batch_execute("SET lock_timeout = '60s'").map_err(|e| e.to_string())?;
    Ok(c)
}

/// A follower process: on each `go` line from the bench, says `waiting`,
/// waits for the lock, claims (`pass`: after giving the lock on; `hold`:
/// before), and answers `won FENCE ANSWERED_NS` or `lost`.
pub fn worker_main() -> ExitCode {
    crate::common::worker_exit("bench chain worker", worker())
}

fn worker() -> Result<(), String> {
    let WorkerEnv { kind, url, table, name, id: me } = WorkerEnv::read(ENV)?;
    let mode = std::env::var(format!("{ENV}_MODE")).map_err(|_| format!("{ENV}_MODE is not set"))?;
    // A pool of one and no feed of releases; the bench made the schema.
    let s = kind.build(&url, &table, false, Some(1), false)?;
    let mut lock = lock_session(&url)?;
    let _ = s.inspect(&name, T); // the pool's one session, connected
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        if line.map_err(|e| e.to_string())? != "go" {
            break;
        }
        writeln!(out, "waiting").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
        let q = |c: &mut postgres::Client, f: &str| c.batch_execute(&format!("SELECT {f}({KEY})"));
        q(&mut lock, "pg_advisory_lock").map_err(|e| e.to_string())?;
        if mode == "pass" {
            q(&mut lock, "pg_advisory_unlock").map_err(|e| e.to_string())?;
        }
        let claim = s.acquire(&name, &me, TTL, b"", T);
        let answered = mono_ns();
        if mode == "hold" {
            q(&mut lock, "pg_advisory_unlock").map_err(|e| e.to_string())?;
        }
        let said = match claim {
            Ok(l) if l.holder == me => format!("won {} {answered}", l.fence),
            _ => "lost".to_owned(),
        };
        writeln!(out, "{said}").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

struct Follower {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Follower {
    fn say(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}").map_err(|e| format!("a follower's stdin: {e}"))
    }

    fn hear(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("a follower ended".into()),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e) => Err(format!("a follower's stdout: {e}")),
        }
    }
}

impl Drop for Follower {
    /// Any line but `go` ends the follower; one still running 5 s later is
    /// killed.
    fn drop(&mut self) {
        let _ = self.say("quit");
        end_worker(&mut self.child, &mut None, Instant::now() + Duration::from_secs(5), Duration::from_millis(10));
    }
}

/// Measures `trials` hand-overs to `n` follower processes on `dsn`, the
/// lock passed on as `mode` says; one line in `table`.
pub fn run(label: &str, dsn: &str, n: usize, trials: usize, mode: &str, table: &mut Table) -> Result<(), String> {
    let own = OwnTable::new(dsn, "chain");
    let s = Kind::Postgres.build(dsn, &own.name, false, Some(1), true)?;
    let mut lock = lock_session(dsn)?;
    let mut admin = postgres::Client::connect(dsn, postgres::NoTls).map_err(|e| e.to_string())?;
    let mut followers = Vec::with_capacity(n);
    for i in 0..n {
        let orders = WorkerEnv {
            kind: Kind::Postgres,
            url: dsn.into(),
            table: own.name.clone(),
            name: NAME.into(),
            id: format!("f{i}"),
        };
        let (mut child, stdout) = orders.start(ENV, WORKER_ENV, &[(format!("{ENV}_MODE"), mode.into())])?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        followers.push(Follower { child, stdin, stdout: BufReader::new(stdout) });
    }
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND (classid::bigint << 32) | objid::bigint = {KEY}"
    );
    let mut took = Vec::new();
    for trial in 0..trials {
        let l = s.acquire(NAME, "leader", TTL, b"", T).map_err(|e| format!("the leader's claim: {e}"))?;
        if l.holder != "leader" {
            return Err(format!("trial {trial}: the leader could not claim: {l:?}"));
        }
        lock.batch_execute(&format!("SELECT pg_advisory_lock({KEY})")).map_err(|e| e.to_string())?;
        for f in &mut followers {
            f.say("go")?;
            if f.hear()? != "waiting" {
                return Err("a follower said something else than waiting".into());
            }
        }
        let all = poll(Duration::from_secs(30), Duration::from_millis(10), || {
            let c: i64 = admin.query_one(&waiting, &[]).ok()?.get(0);
            (c == n as i64).then_some(())
        });
        all.ok_or(format!("trial {trial}: not all {n} followers waited on the lock within 30 s"))?;
        // Every follower blocked in the server; let their processes settle.
        std::thread::sleep(Duration::from_millis(200));
        let start = mono_ns();
        s.release(NAME, "leader", l.fence, T).map_err(|e| format!("the release: {e}"))?;
        lock.batch_execute(&format!("SELECT pg_advisory_unlock({KEY})")).map_err(|e| e.to_string())?;
        let mut winners = Vec::new();
        for f in &mut followers {
            let said = f.hear()?;
            let mut w = said.split(' ');
            if w.next() == Some("won") {
                let fence: u64 = w.next().and_then(|x| x.parse().ok()).ok_or("a bad fence")?;
                let at: u64 = w.next().and_then(|x| x.parse().ok()).ok_or("a bad instant")?;
                winners.push((fence, at));
            }
        }
        if winners.len() > 1 {
            violation(&format!("row 12, {label}: {} followers won one release: {winners:?}", winners.len()));
        }
        if let Some(&(fence, at)) = winners.first() {
            if fence <= l.fence {
                violation(&format!("row 12, {label}: fence {fence} after {}", l.fence));
            }
            took.push(Duration::from_nanos(at.saturating_sub(start)));
        }
        // Free the row for the next trial's leader.
        admin
            .batch_execute(&format!("UPDATE public.\"{}\" SET expires_at = now(), renewed_at = now()", own.name))
            .map_err(|e| e.to_string())?;
    }
    drop(followers);
    if took.is_empty() {
        return Err(format!("row 12, {label}: no follower won any release"));
    }
    let won = took.len();
    let (p50, p99, max) = (pct(&mut took, 50.0), pct(&mut took, 99.0), pct(&mut took, 100.0));
    table.add(
        format!(
            "12. hand-over to followers queued on an advisory lock (probe), {label}, {n} follower processes, {mode}"
        ),
        format!("p50 {p50:.2?}, p99 {p99:.2?}, max {max:.2?} ({won} of {trials} releases won by a follower)"),
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
        Verdict::of(p50 <= Duration::from_millis(5) && p99 <= Duration::from_millis(20)),
    );
    Ok(())
}
