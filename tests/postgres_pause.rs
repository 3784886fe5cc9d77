//! The PostgreSQL server freezes (SIGSTOP on the postmaster and every child)
//! under a live elector: the operation timeout is real.
//!
//! Never the shared server: this freezes a private throwaway cluster that
//! `scripts/db.sh` starts and names in `LE_PG_PAUSE_DSN` (where to connect)
//! and `LE_PG_PAUSE_DATA` (its data directory, whose `postmaster.pid` names
//! the postmaster). Run with `bash scripts/test.sh`.
//!
//! One test only, so this binary's thread count is the electors' and the
//! stores' alone. Timings are those of tests/postgres_elector.rs (lease 2.5 s,
//! renew 400 ms, retry 300 ms, operation timeout 500 ms, margin 250 ms).

mod pg_support;
mod support;

use std::fs;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::postgres::{PostgresStore, DEFAULT_POOL_SIZE};
use leaderelection::{Elector, LeaderGuard, Store};
use pg_support::dsn;
use support::pause::{
    fails_in_time, hold_frozen, leads_again_after_the_thaw, threads, EXTRA_CALL_THREADS, HOLD, LEASE, MARGIN,
    OP_TIMEOUT, RENEW, SLACK,
};
use support::{config, random_tag, wait_for};

const PAUSE_DSN: &str = "LE_PG_PAUSE_DSN";
const PAUSE_DATA: &str = "LE_PG_PAUSE_DATA";

const TABLE: &str = "le_pause";
/// How long a store call on the frozen server may take to hand back control.
const GIVE_UP_WITHIN: Duration = Duration::from_millis(1500);

fn data_dir() -> String {
    std::env::var(PAUSE_DATA).unwrap_or_else(|_| {
        panic!(
            "{PAUSE_DATA} is not set. This suite freezes a private PostgreSQL cluster: run `bash scripts/test.sh` \
             (or `source scripts/db.sh` first), which starts it and exports {PAUSE_DSN} and {PAUSE_DATA}."
        )
    })
}

/// A store on the private cluster whose sessions carry `app` as their
/// application name, so pg_stat_activity tells them apart.
fn store(app: &str) -> PostgresStore {
    builder(app).build().expect("store")
}

fn builder(app: &str) -> leaderelection::postgres::PostgresBuilder {
    let d = format!("{}?application_name={app}", dsn(PAUSE_DSN));
    PostgresStore::builder(&d).table("public", TABLE)
}

/// Connections the store's pool holds, from its `Debug` (which shows them).
fn pooled(s: &PostgresStore) -> i64 {
    let text = format!("{s:?}");
    let at = text.find("connections: ").expect("the store's Debug shows its connections") + "connections: ".len();
    text[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// `(state, ppid)` of a process, from /proc/PID/stat.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything: split after
    // the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

fn children(parent: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    // Some may have exited meanwhile: the status does not matter.
    let _ = Command::new("kill").arg(format!("-{sig}")).args(pids.iter().map(u32::to_string)).status();
}

/// The private server frozen with SIGSTOP: the postmaster and all its
/// children. Dropping it (also when an assertion fails) sends SIGCONT to them
/// and to any child of the postmaster, so the server never stays frozen.
struct Frozen {
    postmaster: u32,
    pids: Vec<u32>,
}

impl Frozen {
    fn freeze(data: &str) -> Frozen {
        let file = format!("{data}/postmaster.pid");
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}; is the private cluster up?"));
        let postmaster: u32 = text.lines().next().and_then(|l| l.trim().parse().ok()).expect("postmaster PID");
        assert!(stat(postmaster).is_some(), "postmaster {postmaster} from {file} is not running");
        // The postmaster first, so it forks no new child; then its children,
        // again until no new one shows up.
        let mut frozen = Frozen { postmaster, pids: vec![postmaster] };
        signal("STOP", &[postmaster]);
        loop {
            let new: Vec<u32> = children(postmaster).into_iter().filter(|p| !frozen.pids.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            signal("STOP", &new);
            frozen.pids.extend(new);
        }
        let all_stopped = wait_for(Duration::from_secs(2), || {
            frozen.pids.iter().all(|&p| stat(p).is_none_or(|(state, _)| state == 'T'))
        });
        assert!(all_stopped, "not every server process stopped: {:?}", frozen.states());
        frozen
    }

    fn states(&self) -> Vec<(u32, Option<char>)> {
        self.pids.iter().map(|&p| (p, stat(p).map(|s| s.0))).collect()
    }

    fn thaw(self) {
        drop(self);
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let mut pids = self.pids.clone();
        pids.extend(children(self.postmaster).into_iter().filter(|p| !self.pids.contains(p)));
        signal("CONT", &pids);
    }
}

/// Follows a guard from another thread, polling every millisecond: when it
/// turned invalid, the last deadline seen while it was valid, and when the
/// watchdog woke its `lost()` channel.
struct Watch {
    invalid_at: Option<Instant>,
    deadline: Instant,
    woken_at: Option<Instant>,
}

fn watch(g: LeaderGuard, within: Duration) -> thread::JoinHandle<Watch> {
    thread::spawn(move || {
        let lost = g.lost();
        let until = Instant::now() + within;
        let mut w = Watch { invalid_at: None, deadline: g.valid_until(), woken_at: None };
        while Instant::now() < until && (w.invalid_at.is_none() || w.woken_at.is_none()) {
            if w.invalid_at.is_none() {
                let deadline = g.valid_until();
                if g.is_valid() {
                    w.deadline = deadline;
                } else {
                    w.invalid_at = Some(Instant::now());
                }
            }
            if w.woken_at.is_none() && lost.try_recv() == Err(crossbeam_channel::TryRecvError::Disconnected) {
                w.woken_at = Some(Instant::now());
            }
            thread::sleep(Duration::from_millis(1));
        }
        w
    })
}

fn late(at: Instant, deadline: Instant) -> String {
    match at.checked_duration_since(deadline) {
        Some(d) => format!("{d:?} after"),
        None => format!("{:?} before", deadline - at),
    }
}

/// pg_stat_activity on the private cluster: sessions per application name.
fn sessions(client: &mut postgres::Client) -> Vec<(String, i64)> {
    let rows = client
        .simple_query(
            "SELECT application_name, count(*) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() \
             GROUP BY 1 ORDER BY 1",
        )
        .expect("pg_stat_activity");
    rows.into_iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => {
                Some((r.get(0).unwrap_or("").to_owned(), r.get(1).unwrap_or("0").parse().unwrap_or(0)))
            }
            _ => None,
        })
        .collect()
}

fn count(s: &[(String, i64)], app: &str) -> i64 {
    s.iter().filter(|(a, _)| a == app).map(|(_, n)| n).sum()
}

#[test]
fn frozen_server_steps_the_leader_down_on_time_and_the_elector_recovers() {
    let data = data_dir();
    let tag = random_tag();
    let name = format!("pause-{tag}");
    let (app_leader, app_follower, app_warm, app_cold) = (
        format!("lep-leader-{tag}"),
        format!("lep-follower-{tag}"),
        format!("lep-warm-{tag}"),
        format!("lep-cold-{tag}"),
    );

    let leader_store = store(&app_leader);
    leader_store.ensure_schema().expect("ensure_schema on the private cluster");
    let leader = Elector::start(config(leader_store.clone(), &name, "leader")).expect("start");
    let g = leader.wait_leader_timeout(Duration::from_secs(10)).expect("the first elector leads");
    let fence = g.fence();
    // The leader's store opens connections with the default 5 s bound, longer
    // than the freeze: its connection attempts are still pending at the thaw.
    // The follower's gives up on a connection after 1 s, so several attempts
    // on the frozen server are abandoned and retried.
    let follower_store = builder(&app_follower).connect_timeout(Duration::from_secs(1)).build().expect("store");
    let follower = Elector::start(config(follower_store.clone(), &name, "follower")).expect("start");
    let sees = wait_for(Duration::from_secs(5), || {
        follower.status().leader.is_some_and(|l| leaderelection::base_identity(&l.identity) == "leader" && l.valid)
    });
    assert!(sees, "the follower does not see the leader: {:?}", follower.status());

    // A store with a pooled connection (its calls hit the query timeout) and
    // one with none yet (its calls need a new connection: the connect path).
    let warm = store(&app_warm);
    warm.inspect(&name, Duration::from_secs(2)).expect("inspect before the freeze");
    let cold = store(&app_cold);

    // Settle: a few renewals, then the baseline thread count.
    assert!(g.wait_lost_timeout(RENEW * 3).timed_out(), "lost the lease before any fault: {:?}", leader.status());
    let watcher = watch(g.clone(), LEASE + Duration::from_secs(2));
    let threads_before = threads();

    let frozen = Frozen::freeze(&data);
    let frozen_at = Instant::now();
    eprintln!("pause: froze {} server processes: {:?}", frozen.pids.len(), frozen.pids);

    // (b) Direct store calls on the frozen server hand control back at their
    // own timeout, with a retryable error.
    let warm_took = fails_in_time("inspect on a pooled connection", GIVE_UP_WITHIN, || warm.inspect(&name, OP_TIMEOUT));
    let cold_took =
        fails_in_time("inspect needing a new connection", GIVE_UP_WITHIN, || cold.inspect(&name, OP_TIMEOUT));
    let acquire_took =
        fails_in_time("acquire", GIVE_UP_WITHIN, || warm.acquire(&name, "prober", LEASE, b"", OP_TIMEOUT));

    // (a) The leader steps down by its deadline: a hung server never delays it.
    let w = watcher.join().expect("watcher");
    let invalid_at = w.invalid_at.expect("the guard stayed valid with the server frozen");
    let woken_at = w.woken_at.expect("the watchdog never woke the guard's lost() channel");
    let step_down = invalid_at - frozen_at;
    eprintln!(
        "pause: leader stepped down {step_down:?} after the freeze; is_valid() false {} its deadline, \
         lost() woken {} it (lease {LEASE:?}, margin {MARGIN:?})",
        late(invalid_at, w.deadline),
        late(woken_at, w.deadline),
    );
    assert!(invalid_at <= w.deadline + SLACK, "is_valid() stayed true {} the deadline", late(invalid_at, w.deadline));
    assert!(woken_at <= w.deadline + SLACK, "the watchdog woke holders {} the deadline", late(woken_at, w.deadline));
    assert!(step_down <= LEASE - MARGIN + SLACK, "stepped down {step_down:?} after the freeze");
    assert!(!g.is_valid() && !leader.is_leader());
    drop(g);

    // (c) Keep it frozen for many operation timeouts: nobody leads, calls keep
    // being abandoned at the timeout without piling up, threads stay bounded.
    let mut threads_max = threads();
    hold_frozen(frozen_at, [&leader, &follower], || threads_max = threads_max.max(threads()));
    let threads_frozen_end = threads();
    let (leader_err, follower_err) = (leader.status().last_error, follower.status().last_error);
    eprintln!(
        "pause: threads {threads_before} before the freeze, at most {threads_max} during {HOLD:?} frozen, \
         {threads_frozen_end} at its end; last errors: leader {:?}, follower {:?}",
        leader_err.as_ref().map(ToString::to_string),
        follower_err.as_ref().map(ToString::to_string),
    );
    assert!(leader_err.is_some() && follower_err.is_some(), "no error reported with the server frozen");
    // The watcher thread (in the baseline) has ended; each elector may add
    // store-call threads up to its cap while calls are abandoned. Store calls
    // themselves leave none behind.
    assert!(
        threads_max <= threads_before + 2 * EXTRA_CALL_THREADS,
        "threads grew from {threads_before} to {threads_max} with the server frozen"
    );
    eprintln!("pause: pools while frozen: leader {leader_store:?}, follower {follower_store:?}");

    // (d) Thaw: one of them leads again, on a new term.
    frozen.thaw();
    leads_again_after_the_thaw(&leader, &follower, fence);
    // The store calls work again on fresh connections.
    warm.inspect(&name, Duration::from_secs(2)).expect("inspect after the thaw (warm store)");
    cold.inspect(&name, Duration::from_secs(2)).expect("inspect after the thaw (cold store)");
    let threads_after = threads();

    // (e) The server side: the sessions abandoned at the timeout are gone.
    // Each store holds at most its pool; a probe store dropped takes all its
    // sessions with it.
    let mut client = postgres::Client::connect(&dsn(PAUSE_DSN), postgres::NoTls).expect("plain client");
    let pool = i64::from(DEFAULT_POOL_SIZE);
    let mut seen = sessions(&mut client);
    eprintln!("pause: sessions right after recovery: {seen:?}");
    let bounded = wait_for(Duration::from_secs(5), || {
        seen = sessions(&mut client);
        [&app_leader, &app_follower, &app_warm, &app_cold].iter().all(|a| count(&seen, a) <= pool)
    });
    eprintln!("pause: sessions after recovery (pool size {pool} each): {seen:?}");
    assert!(bounded, "a store holds more sessions than its pool after recovery: {seen:?}");
    // Every server session of an elector's store is one its pool holds: none
    // is left over from a call or a connection attempt abandoned in the freeze.
    let matched = wait_for(Duration::from_secs(5), || {
        seen = sessions(&mut client);
        count(&seen, &app_leader) == pooled(&leader_store) && count(&seen, &app_follower) == pooled(&follower_store)
    });
    assert!(
        matched,
        "server sessions {seen:?} are not the pools' connections: leader {}, follower {}",
        pooled(&leader_store),
        pooled(&follower_store)
    );
    drop((warm, cold));
    let gone = wait_for(Duration::from_secs(5), || {
        seen = sessions(&mut client);
        count(&seen, &app_warm) == 0 && count(&seen, &app_cold) == 0
    });
    assert!(gone, "dropped stores' sessions are still open: {seen:?}");
    let others: i64 = seen.iter().filter(|(a, _)| !a.ends_with(&tag)).map(|(_, n)| n).sum();
    eprintln!(
        "pause: after dropping the probes: {seen:?} ({others} other sessions); threads {threads_after} after the \
         thaw; store calls on the frozen server returned after {warm_took:?} (pooled), {cold_took:?} (new \
         connection), {acquire_took:?} (acquire)"
    );

    leader.shutdown().expect("shutdown");
    follower.shutdown().expect("shutdown");
}
