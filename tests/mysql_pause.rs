//! The MariaDB server freezes (SIGSTOP) under a live elector: the operation
//! timeout is real.
//!
//! Never the shared server: this freezes the private `mariadbd` that
//! `scripts/mysql.sh` starts (its own data directory, port and socket) and
//! names in `LE_MYSQL_PAUSE_URL` and `LE_MYSQL_PAUSE_PID_FILE`. Run with
//! `bash scripts/test.sh`. One test only, so this binary's thread count is
//! the electors' and the stores' alone.

mod mysql_support;
mod support;

use std::fs;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::mysql::{MySqlStore, DEFAULT_POOL_SIZE};
use leaderelection::{Elector, Store};
use mysql::prelude::Queryable;
use mysql_support::{admin, exec, port, url_via, PRIVATE};
use support::pause::{
    fails_in_time, hold_frozen, leads_again_after_the_thaw, threads, EXTRA_CALL_THREADS, HOLD, LEASE, MARGIN,
    OP_TIMEOUT, RENEW, SLACK,
};
use support::{config, random_tag, wait_for};

const PID_FILE: &str = "LE_MYSQL_PAUSE_PID_FILE";
const TABLE: &str = "le_pause";
/// How long a store call on the frozen server may take to hand back control.
const GIVE_UP_WITHIN: Duration = OP_TIMEOUT.saturating_add(Duration::from_millis(200));

fn server_pid() -> u32 {
    let file = std::env::var(PID_FILE).unwrap_or_else(|_| {
        panic!(
            "{PID_FILE} is not set. This suite freezes a private mariadbd: run `bash scripts/test.sh` \
             (or `source scripts/mysql.sh` first), which starts it and exports LE_MYSQL_PAUSE_URL and {PID_FILE}."
        )
    });
    let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}; is the private mariadbd up?"));
    text.trim().parse().unwrap_or_else(|_| panic!("{file} does not hold a pid"))
}

fn state(pid: u32) -> Option<char> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

/// The MySQL store's own threads (`le-mysql-call`, `le-mysql-kill`): a call
/// in flight or given up on, and a request to end an abandoned session.
fn store_threads() -> usize {
    let tasks = fs::read_dir("/proc/self/task").expect("/proc/self/task");
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("le-mysql-"))
        .count()
}

/// The private server stopped with SIGSTOP; dropping it (also when an
/// assertion fails) sends SIGCONT, so the server never stays frozen.
struct Frozen(u32);

impl Frozen {
    fn freeze(pid: u32) -> Frozen {
        assert!(state(pid).is_some(), "mariadbd {pid} is not running");
        let _ = Command::new("kill").args(["-STOP", &pid.to_string()]).status();
        let frozen = Frozen(pid);
        assert!(wait_for(Duration::from_secs(2), || state(pid) == Some('T')), "mariadbd {pid} did not stop");
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

fn user_url(user: &str) -> String {
    url_via(PRIVATE, user, "127.0.0.1", port(PRIVATE), "")
}

/// Sessions per user on the private server.
fn sessions(c: &mut mysql::Conn, user: &str) -> usize {
    let n: Option<u64> = c
        .exec_first("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?", (user,))
        .expect("processlist");
    n.unwrap_or(0) as usize
}

#[test]
fn frozen_server_steps_the_leader_down_on_time_and_the_elector_recovers() {
    let pid = server_pid();
    let tag = random_tag();
    let name = format!("pause-{tag}");
    let users = ["le_p_leader", "le_p_follower", "le_p_warm", "le_p_cold"];
    let mut c = admin(PRIVATE);
    for u in users {
        exec(&mut c, &format!("CREATE USER IF NOT EXISTS '{u}'@'127.0.0.1'"));
        exec(&mut c, &format!("GRANT ALL ON test.* TO '{u}'@'127.0.0.1'"));
    }
    let leader_store = MySqlStore::builder(&user_url(users[0])).table(TABLE).build().unwrap();
    leader_store.ensure_schema().expect("ensure_schema on the private server");
    let leader = Elector::start(config(leader_store.clone(), &name, "leader")).expect("start");
    let g = leader.wait_leader_timeout(Duration::from_secs(10)).expect("the first elector leads");
    let fence = g.fence();
    let follower_store = MySqlStore::builder(&user_url(users[1]))
        .table(TABLE)
        .connect_timeout(Duration::from_secs(1))
        .socket_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let follower = Elector::start(config(follower_store.clone(), &name, "follower")).expect("start");
    let sees = wait_for(Duration::from_secs(5), || {
        follower.status().leader.is_some_and(|l| leaderelection::base_identity(&l.identity) == "leader" && l.valid)
    });
    assert!(sees, "the follower does not see the leader: {:?}", follower.status());
    // A store with a pooled connection and one that must open one.
    let warm = MySqlStore::builder(&user_url(users[2])).table(TABLE).build().unwrap();
    warm.inspect(&name, Duration::from_secs(2)).expect("inspect before the freeze");
    let cold = MySqlStore::builder(&user_url(users[3])).table(TABLE).build().unwrap();

    assert!(g.wait_lost_timeout(RENEW * 3).timed_out(), "lost the lease before any fault: {:?}", leader.status());
    // Follow the guard from another thread, every millisecond: the last
    // deadline seen while it was valid, and when it turned invalid.
    let watcher = {
        let g = g.clone();
        thread::spawn(move || {
            let until = Instant::now() + LEASE + Duration::from_secs(2);
            let mut deadline = g.valid_until();
            while Instant::now() < until {
                let d = g.valid_until();
                if !g.is_valid() {
                    return (deadline, Some(Instant::now()));
                }
                deadline = d;
                thread::sleep(Duration::from_millis(1));
            }
            (deadline, None)
        })
    };
    let threads_before = threads() - 1;
    let store_threads_before = store_threads();

    let frozen = Frozen::freeze(pid);
    let frozen_at = Instant::now();
    let warm_took = fails_in_time("inspect on a pooled connection", GIVE_UP_WITHIN, || warm.inspect(&name, OP_TIMEOUT));
    let cold_took =
        fails_in_time("inspect needing a new connection", GIVE_UP_WITHIN, || cold.inspect(&name, OP_TIMEOUT));
    // On an election of its own: an abandoned claim may still land after the
    // thaw (its outcome is unknown), and must not hold up the electors.
    let probe = format!("pause-probe-{tag}");
    let acquire_took =
        fails_in_time("acquire", GIVE_UP_WITHIN, || warm.acquire(&probe, "prober", LEASE, b"", OP_TIMEOUT));

    // The leader steps down by its deadline: a hung server never delays it.
    let (deadline, invalid_at) = watcher.join().expect("watcher");
    let invalid_at = invalid_at.expect("the guard stayed valid with the server frozen");
    let step_down = invalid_at - frozen_at;
    let late = invalid_at.saturating_duration_since(deadline);
    eprintln!("pause: leader stepped down {step_down:?} after the freeze, {late:?} after its deadline");
    assert!(!g.is_valid() && !leader.is_leader());
    assert!(late <= SLACK, "is_valid() stayed true {late:?} after the deadline");
    assert!(step_down <= LEASE - MARGIN + SLACK, "stepped down {step_down:?} after the freeze");
    drop(g);

    let mut threads_max = threads();
    let mut store_threads_max = store_threads();
    hold_frozen(frozen_at, [&leader, &follower], || {
        threads_max = threads_max.max(threads());
        store_threads_max = store_threads_max.max(store_threads());
    });
    let (le, fe) = (leader.status().last_error, follower.status().last_error);
    eprintln!(
        "pause: threads {threads_before} before, at most {threads_max} during {HOLD:?} frozen; last errors: \
         leader {:?}, follower {:?}; stores {leader_store:?} {follower_store:?}",
        le.as_ref().map(ToString::to_string),
        fe.as_ref().map(ToString::to_string)
    );
    assert!(le.is_some() && fe.is_some(), "no error reported with the server frozen");
    // Each elector may add call threads up to its cap; each store keeps at
    // most a pool's worth of abandoned calls running, and as many threads
    // asking the server to end their sessions; the three probe calls add a
    // call thread and a kill thread each.
    let bound = threads_before + 2 * (EXTRA_CALL_THREADS + 2 * DEFAULT_POOL_SIZE) + 3 * 2;
    assert!(threads_max <= bound, "threads grew from {threads_before} to {threads_max} (bound {bound})");
    // The stores' own share of that: a call thread per elector call thread
    // and per probe, plus a kill thread per pool slot of each store.
    let store_bound = 2 * (EXTRA_CALL_THREADS + 1) + 3 + 4 * DEFAULT_POOL_SIZE;
    eprintln!("pause: store threads {store_threads_before} before, at most {store_threads_max} during");
    assert!(store_threads_max <= store_bound, "store threads reached {store_threads_max} (bound {store_bound})");

    drop(frozen);
    leads_again_after_the_thaw(&leader, &follower, fence);
    warm.inspect(&name, Duration::from_secs(2)).expect("inspect after the thaw (warm)");
    cold.inspect(&name, Duration::from_secs(2)).expect("inspect after the thaw (cold)");

    // Server side: abandoned sessions are closed; each store holds at most
    // its pool, and dropped stores hold none.
    let mut c = admin(PRIVATE);
    let bounded = wait_for(Duration::from_secs(8), || users.iter().all(|u| sessions(&mut c, u) <= DEFAULT_POOL_SIZE));
    let seen: Vec<usize> = users.iter().map(|u| sessions(&mut c, u)).collect();
    eprintln!("pause: sessions per store after recovery (leader, follower, warm, cold): {seen:?}");
    assert!(bounded, "a store holds more sessions than its pool: {seen:?}");
    drop((warm, cold));
    let gone = wait_for(Duration::from_secs(8), || sessions(&mut c, users[2]) == 0 && sessions(&mut c, users[3]) == 0);
    assert!(gone, "dropped stores' sessions are still open");
    // And the threads come back: every call given up on, and every request
    // to end its session, has finished. What may remain is a call in flight
    // per elector, and the electors' own idle call threads.
    let settled = wait_for(Duration::from_secs(10), || {
        store_threads() <= 2 && threads() <= threads_before - 1 + 2 * EXTRA_CALL_THREADS + 2
    });
    let (threads_after, store_threads_after) = (threads(), store_threads());
    eprintln!(
        "pause: threads {threads_before} before, at most {threads_max} during, {threads_after} after \
         (store threads {store_threads_before}, {store_threads_max}, {store_threads_after})"
    );
    assert!(settled, "threads did not come back after the thaw: {threads_after} (store threads {store_threads_after})");
    eprintln!(
        "pause: calls on the frozen server returned after {warm_took:?} (pooled), {cold_took:?} (new connection), \
         {acquire_took:?} (acquire)"
    );
    leader.shutdown().expect("shutdown");
    follower.shutdown().expect("shutdown");
}
