//! Every scenario, one function each, named after what breaks; the macro at
//! the end makes one test per scenario and path.

use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::rig::{for_a_while, ms, Fleet, Path, Rig, LEASE, OP, RECOVERY, RENEW, RETRY};
use crate::support::faults::Fault;
use crate::support::oracle::{Behaviour, Violation};
use crate::support::TIMING;

const FIRST: Duration = Duration::from_secs(15);
const MARGIN: Duration = TIMING.safety_margin;
/// Long enough for any lease, renewed or not, to run out on the database.
const PAST_A_LEASE: Duration = Duration::from_millis(TIMING.lease_duration.as_millis() as u64 + 1000);

/// Holds `d`, checking every 5 ms that `leader` still leads; panics if not.
fn keeps_leading(f: &Fleet<'_>, leader: usize, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        let now = f.oracle.leader_now();
        assert!(
            now.as_deref() == Some(&format!("p{leader}")) || f.elector_leads(leader),
            "{}: p{leader} stopped leading ({now:?} leads)",
            f.name
        );
        sleep(Duration::from_millis(5));
    }
}

/// No participant holds a valid guard at the end of a fault that lasted
/// more than a lease: the cut-off leader stepped down and nobody could
/// take over.
fn nobody_led_at_the_end(f: &Fleet<'_>, what: &str) {
    assert!(f.nobody_leads(), "{}: {:?} leads at the end of {what}", f.name, f.oracle.leader_now());
}

/// `n` participants on `rig` with no fault: the first leader leads for
/// `d`, one term in all.
fn one_steady_term(rig: &Rig, label: &str, n: usize, d: Duration) {
    let f = Fleet::start(rig, label, n);
    let l = f.leader(FIRST);
    keeps_leading(&f, l, d);
    let r = f.finish();
    assert_eq!(r.terms, 1, "{label}: a steady fleet changed leaders: {r}");
}

pub fn steady_state(path: Path) {
    one_steady_term(&Rig::shared(path), "steady_state", 3, 3 * LEASE);
}

/// The leader's path refuses connections and loses the ones it had.
pub fn leader_partitioned(path: Path) {
    leader_cut_off(path, "leader_partitioned", Fault::Refuse, true);
}

/// The leader's connections stay up, but no byte gets through.
pub fn leader_blackholed(path: Path) {
    leader_cut_off(path, "leader_blackholed", Fault::Blackhole, false);
}

fn leader_cut_off(path: Path, label: &str, fault: Fault, reset: bool) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, label, 3);
    let l = f.leader(FIRST);
    f.proxy(l).set(fault);
    if reset {
        f.proxy(l).reset_all();
    }
    let (n, took) = f.taken_over(l, "the cut");
    assert!(took >= LEASE - MARGIN - RENEW, "taken over before the lease could run out: {took:?}");
    assert!(!f.elector_leads(l), "the cut-off leader still says it leads");
    f.proxy(l).set(Fault::Pass);
    keeps_leading(&f, n, LEASE);
    let r = f.finish();
    assert!(r.terms >= 2, "{r}");
}

/// The negative control: the same cut, with a leader that ignores its
/// deadline, must be caught by the oracle.
pub fn a_leader_ignoring_its_deadline_is_caught(path: Path) {
    let rig = Rig::shared(path);
    let mut f = Fleet::start(&rig, "negative_control", 0);
    let cheat = f.add(Behaviour::IgnoresDeadline(2 * LEASE), 0);
    assert_eq!(f.leader(FIRST), cheat);
    f.add(Behaviour::Honest, 0);
    f.add(Behaviour::Honest, 0);
    f.proxy(cheat).set(Fault::Refuse);
    f.proxy(cheat).reset_all();
    f.taken_over(cheat, "the cut");
    sleep(Duration::from_millis(300));
    let v = f.oracle.check().expect_err("the oracle let a participant that ignores its deadline pass");
    f.say(&format!("caught: {}", v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; ")));
    assert!(v.iter().any(|v| matches!(v, Violation::Overlap { .. })), "{v:?}");
    assert!(v.iter().any(|v| matches!(v, Violation::LateValidity { .. })), "{v:?}");
    f.abandon();
}

pub fn database_paused(path: Path) {
    let rig = Rig::owned(path);
    let f = Fleet::start(&rig, "database_paused", 3);
    f.leader(FIRST);
    rig.freeze();
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "the pause");
    rig.thaw();
    f.recovers("the thaw");
    f.finish();
}

pub fn database_restarts(path: Path) {
    let rig = Rig::owned(path);
    let f = Fleet::start(&rig, "database_restarts", 3);
    f.leader(FIRST);
    let t = Instant::now();
    rig.stop();
    sleep(Duration::from_millis(500));
    rig.start_again();
    f.say(&format!("server down and up again in {}", ms(t.elapsed())));
    f.recovers("the restart");
    finish_saying_kept(f);
}

/// Finishes the run and says whether the first leader kept its term
/// through the fault.
fn finish_saying_kept(f: Fleet<'_>) {
    let terms = f.terms();
    let r = f.finish();
    eprintln!("  the first leader {} its term through the fault", if terms == 1 { "kept" } else { "lost" });
    assert!(r.terms >= 1);
}

pub fn database_killed(path: Path) {
    let rig = Rig::owned(path);
    let mut f = Fleet::start(&rig, "database_killed", 3);
    f.leader(FIRST);
    let t = Instant::now();
    rig.crash();
    sleep(Duration::from_millis(500));
    rig.start_again();
    f.say(&format!("server killed and recovered in {}", ms(t.elapsed())));
    f.recovers("crash recovery");
    // A fence from before the crash must still bound the next ones: make
    // sure a new term starts after recovery, then let the oracle check.
    let l = f.leader(FIRST);
    f.stop(l);
    f.taken_over(l, "its shutdown");
    let r = f.finish();
    assert!(r.terms >= 2, "{r}");
}

pub fn pooler_restarts() {
    let rig = Rig::owned(Path::Bouncer);
    let f = Fleet::start(&rig, "pooler_restarts", 3);
    f.leader(FIRST);
    let t = Instant::now();
    rig.bouncer().restart();
    f.say(&format!("PgBouncer restarted in {}", ms(t.elapsed())));
    f.recovers("the pooler's restart");
    finish_saying_kept(f);
}

pub fn pooler_paused() {
    let rig = Rig::owned(Path::Bouncer);
    let f = Fleet::start(&rig, "pooler_paused", 3);
    f.leader(FIRST);
    rig.bouncer().pause();
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "the pooler's pause");
    rig.bouncer().resume();
    f.recovers("RESUME");
    f.finish();
}

/// The first leader goes (`go`: crashed or stopped) and another takes over
/// (said as after `what`); the run passes the oracle. How long the takeover
/// took.
fn leader_goes(path: Path, label: &str, go: impl FnOnce(&mut Fleet<'_>, usize), what: &str) -> Duration {
    let rig = Rig::shared(path);
    let mut f = Fleet::start(&rig, label, 3);
    let l = f.leader(FIRST);
    go(&mut f, l);
    let (_, took) = f.taken_over(l, what);
    f.finish();
    took
}

pub fn leader_crashes(path: Path) {
    let took = leader_goes(path, "leader_crashes", |f, l| f.crash(l), &format!("the crash (lease {})", ms(LEASE)));
    assert!(took >= LEASE - MARGIN - RENEW, "a crash released the lease? {took:?}");
}

pub fn graceful_hand_over_is_fast(path: Path) {
    let what = format!("the shutdown (retry period {})", ms(RETRY));
    let took = leader_goes(path, "graceful_hand_over", |f, l| f.stop(l), &what);
    assert!(took <= RETRY + OP + Duration::from_millis(300), "hand-over took {took:?}");
}

pub fn high_latency_is_survivable(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "high_latency", 3);
    let l = f.leader(FIRST);
    let lag = Fault::Latency { base: Duration::from_millis(70), jitter: Duration::from_millis(30) };
    f.set_all(lag);
    keeps_leading(&f, l, 3 * LEASE);
    f.set_all(Fault::Pass);
    let r = f.finish();
    assert_eq!(r.terms, 1, "70-100 ms each way cost the leader its term: {r}");
}

/// The leader's requests still arrive (and land), its replies never come.
pub fn replies_lost_while_requests_arrive(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "replies_lost", 3);
    let l = f.leader(FIRST);
    f.proxy(l).set(Fault::DropReplies);
    // Its renewals keep landing unanswered; once it has stepped down, it
    // finds its own lease, releases it (that lands too), and a follower
    // takes over.
    let (n, took) = f.leader_other_than(Some(l), RECOVERY + LEASE);
    f.say(&format!("p{n} took over from p{l}, whose replies are lost, {} after the fault", ms(took)));
    assert!(!f.elector_leads(l), "p{l} leads with no replies");
    f.proxy(l).set(Fault::Pass);
    keeps_leading(&f, n, LEASE);
    f.finish();
}

pub fn connections_reset_mid_query(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "connections_reset", 3);
    f.leader(FIRST);
    for_a_while(&f, &f.alive(), Fault::ResetOnUse, Duration::from_millis(1200));
    f.recovers("the resets stopped");
    finish_saying_kept(f);
}

pub fn bandwidth_collapse(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "bandwidth_collapse", 3);
    f.leader(FIRST);
    for_a_while(&f, &f.alive(), Fault::Bandwidth { bytes_per_sec: 64 }, PAST_A_LEASE);
    nobody_led_at_the_end(&f, "64 bytes/s");
    f.recovers("the bandwidth came back");
    f.finish();
}

pub fn flapping_path(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "flapping_path", 3);
    let l = f.leader(FIRST);
    let flap = Fault::Flap { up: Duration::from_millis(300), down: Duration::from_millis(700) };
    for_a_while(&f, &[l], flap, 3 * LEASE);
    f.recovers("the path settled");
    let r = f.finish();
    eprintln!("  terms while the leader's path flapped: {}", r.terms);
}

pub fn everyone_partitioned(path: Path) {
    let rig = Rig::shared(path);
    let f = Fleet::start(&rig, "everyone_partitioned", 3);
    f.leader(FIRST);
    f.set_all(Fault::Refuse);
    f.reset_all();
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "the partition");
    f.set_all(Fault::Pass);
    f.recovers("the partition healed");
    f.finish();
}

/// Each participant reads the database clock days away from the others'
/// (a store wrapper shifts every instant it reads); election, failover and
/// hand-over work the same.
pub fn database_clock_days_away(path: Path) {
    const DAY_US: i64 = 86_400_000_000;
    let rig = Rig::shared(path);
    let mut f = Fleet::start(&rig, "clock_days_away", 0);
    for skew in [3 * DAY_US, -2 * DAY_US, 7 * DAY_US + 1] {
        f.add(Behaviour::Honest, skew);
    }
    let l = f.leader(FIRST);
    f.crash(l);
    let (n, took) = f.taken_over(l, "the crash");
    assert!(took >= LEASE - MARGIN - RENEW, "{took:?}");
    f.stop(n);
    let (_, took) = f.taken_over(n, "the hand-over");
    assert!(took <= RETRY + OP + Duration::from_millis(300), "{took:?}");
    f.finish();
}

pub fn table_locked(path: Path) {
    lock_held(path, "table_locked", |rig, _| rig.lock_table());
}

pub fn election_row_locked(path: Path) {
    lock_held(path, "election_row_locked", |rig, name| rig.lock_row(name));
}

fn lock_held(path: Path, label: &str, lock: impl Fn(&Rig, &str) -> crate::rig::Held) {
    let rig = Rig::owned(path);
    let f = Fleet::start(&rig, label, 3);
    f.leader(FIRST);
    let held = lock(&rig, &f.name);
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "the lock");
    drop(held);
    f.recovers("the lock went");
    f.finish();
}

pub fn backends_terminated(path: Path) {
    let rig = Rig::owned(path);
    let f = Fleet::start(&rig, "backends_terminated", 3);
    f.leader(FIRST);
    let mut ended = 0;
    for _ in 0..5 {
        ended += rig.end_sessions();
        sleep(Duration::from_millis(500));
    }
    assert!(ended >= 3, "only {ended} sessions were there to end");
    f.say(&format!("{ended} sessions ended in 5 rounds"));
    f.recovers("the last round");
    finish_saying_kept(f);
}

pub fn database_goes_read_only(path: Path) {
    let rig = Rig::owned(path);
    let f = Fleet::start(&rig, "read_only", 3);
    f.leader(FIRST);
    rig.set_read_only(true);
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "read-only");
    // Reads still work: the followers' inspections answer.
    let st = f.status_of_any();
    assert!(st.contains("25006") || st.contains("1290") || st.contains("read"), "{st}");
    rig.set_read_only(false);
    f.recovers("writes came back");
    f.finish();
}

/// An operator fences the server read-only under a live leader, for longer
/// than a lease (issue 37): PostgreSQL's `default_transaction_read_only`
/// for the whole server, MariaDB's `read_only` with the participants
/// connected as root, whose READ_ONLY ADMIN lets it write through
/// `read_only` unless its transaction is read-only. No guard may stay valid
/// past the lease once the renewals stop landing, and someone leads again
/// once the fence is lifted.
pub fn operator_fences_read_only(path: Path) {
    let rig = Rig::owned(path).privileged();
    let f = Fleet::start(&rig, "read_only_fence", 3);
    f.leader(FIRST);
    rig.fence_read_only(true);
    sleep(PAST_A_LEASE);
    nobody_led_at_the_end(&f, "the read-only fence");
    let st = f.status_of_any();
    assert!(st.contains("read_only") && st.contains("25006"), "the errors do not name the setting: {st}");
    f.say(&format!("nobody leads {} into the fence; the errors: {}", ms(PAST_A_LEASE), first_line(&st)));
    rig.fence_read_only(false);
    f.recovers("the fence was lifted");
    f.finish();
}

/// [`operator_fences_read_only`]'s negative control: stores whose writes
/// override the read-only setting (as every write did before issue 37)
/// keep their leader through the fence, and the check catches it.
pub fn overriding_a_read_only_fence_is_caught(path: Path) {
    let rig = Rig::owned(path).privileged().overriding_read_only();
    let f = Fleet::start(&rig, "read_only_fence_control", 3);
    let l = f.leader(FIRST);
    rig.fence_read_only(true);
    sleep(PAST_A_LEASE);
    assert!(!f.nobody_leads(), "{}: the override was not caught: nobody leads through the fence", f.name);
    f.say(&format!(
        "caught, as it must be: {:?} still leads {} into the fence (p{l} led at its start)",
        f.oracle.leader_now(),
        ms(PAST_A_LEASE)
    ));
    rig.fence_read_only(false);
    f.abandon();
}

fn first_line(s: &str) -> &str {
    s.split(" | ").next().unwrap_or(s)
}

/// A small deterministic generator, seeded from the OS or `LE_CHAOS_SEED`.
struct Rng(u64);

impl Rng {
    fn new(label: &str) -> Rng {
        let seed = std::env::var("LE_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).unwrap();
            u64::from_le_bytes(b)
        });
        eprintln!("chaos {label}: seed {seed} (replay with LE_CHAOS_SEED={seed})");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

/// Random faults for `length`, on paths and the server, with participants
/// crashed, stopped and replaced mid-flight.
pub fn mixed_faults(path: Path, label: &str, length: Duration) {
    let rig = Rig::owned(path);
    let mut f = Fleet::start(&rig, label, 4);
    f.leader(FIRST);
    let mut rng = Rng::new(&format!("{path}/{label}"));
    let end = Instant::now() + length;
    let mut done = Vec::new();
    while Instant::now() < end {
        let alive = f.alive();
        let who = alive[rng.below(alive.len() as u64) as usize];
        let hold = rng.millis(300, 3500);
        let what = match rng.below(9) {
            0 => {
                let fault = match rng.below(6) {
                    0 => Fault::Blackhole,
                    1 => Fault::DropReplies,
                    2 => Fault::Refuse,
                    3 => Fault::Latency { base: Duration::from_millis(40), jitter: Duration::from_millis(60) },
                    4 => Fault::Bandwidth { bytes_per_sec: 256 },
                    _ => Fault::Flap { up: Duration::from_millis(200), down: Duration::from_millis(400) },
                };
                if fault == Fault::Refuse {
                    f.proxy(who).reset_all();
                }
                let what = format!("p{who}: {fault:?}");
                for_a_while(&f, &[who], fault, hold);
                what
            }
            1 => {
                f.crash(who);
                f.add(Behaviour::Honest, 0);
                format!("p{who} crashed and replaced")
            }
            2 => {
                f.stop(who);
                f.add(Behaviour::Honest, 0);
                format!("p{who} stopped and replaced")
            }
            3 => {
                rig.freeze();
                sleep(hold);
                rig.thaw();
                "server frozen".into()
            }
            4 => format!("{} sessions ended", rig.end_sessions()),
            5 => {
                for_a_while(&f, &alive, Fault::Blackhole, hold);
                "everyone blackholed".into()
            }
            6 => {
                let held = rig.lock_row(&f.name);
                sleep(hold);
                drop(held);
                "row locked".into()
            }
            7 => {
                f.reset_all();
                "every connection reset".into()
            }
            _ => {
                sleep(hold);
                "quiet".into()
            }
        };
        done.push(format!("{what} ({})", ms(hold)));
    }
    f.set_all(Fault::Pass);
    f.say(&format!("{} faults: {}", done.len(), done.join(", ")));
    f.recovers("the last fault");
    f.finish();
}

pub fn a_randomised_minute(path: Path) {
    mixed_faults(path, "randomised_minute", Duration::from_secs(60));
}

/// Every participant replaced one by one, the leader last, each waiting for
/// a leader before the next goes.
pub fn rolling_restart_of_the_whole_fleet(path: Path) {
    let rig = Rig::shared(path);
    let mut f = Fleet::start(&rig, "rolling_restart", 3);
    let first = f.leader(FIRST);
    let mut order: Vec<usize> = f.alive().into_iter().filter(|&i| i != first).collect();
    order.push(first);
    for i in order {
        f.stop(i);
        f.add(Behaviour::Honest, 0);
        let (l, took) = f.leader_other_than(Some(i), RECOVERY);
        f.say(&format!("p{i} replaced; p{l} leads ({} later)", ms(took)));
        // The newcomer has polled a few times before the next one goes.
        sleep(3 * RETRY);
    }
    assert!(f.alive().iter().all(|&i| i >= 3), "not every participant was replaced");
    f.finish();
}

/// Eight participants through a PgBouncer with two server connections.
pub fn more_participants_than_pooler_connections() {
    one_steady_term(&Rig::owned_with_pool(Path::Bouncer, 2), "pooler_oversubscribed", 8, 2 * LEASE);
}

/// Two elections in one table; the row of one is locked for longer than a
/// lease. The other keeps its leader throughout; the broken one recovers.
pub fn two_elections_one_broken(path: Path) {
    let rig = Rig::owned(path);
    let broken = Fleet::start(&rig, "two_elections_broken", 3);
    let fine = Fleet::start(&rig, "two_elections_fine", 3);
    broken.leader(FIRST);
    let l = fine.leader(FIRST);
    let held = rig.lock_row(&broken.name);
    keeps_leading(&fine, l, PAST_A_LEASE);
    nobody_led_at_the_end(&broken, "the lock");
    drop(held);
    broken.recovers("the lock went");
    let r = fine.finish();
    assert_eq!(r.terms, 1, "the healthy election changed leaders: {r}");
    broken.finish();
}

/// Ten minutes of random faults (`LE_CHAOS_SOAK_SECS` to change), for the
/// opt-in soak (`bash scripts/chaos-soak.sh`).
pub fn soak(path: Path) {
    let secs = std::env::var("LE_CHAOS_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    mixed_faults(path, "soak", Duration::from_secs(secs));
}

macro_rules! per_path {
    ($($path:ident: $p:expr;)*) => {$(
        mod $path {
            use super::*;
            #[test] fn steady_state() { super::steady_state($p) }
            #[test] fn leader_partitioned() { super::leader_partitioned($p) }
            #[test] fn leader_blackholed() { super::leader_blackholed($p) }
            #[test] fn a_leader_ignoring_its_deadline_is_caught() { super::a_leader_ignoring_its_deadline_is_caught($p) }
            #[test] fn database_paused() { super::database_paused($p) }
            #[test] fn database_restarts() { super::database_restarts($p) }
            #[test] fn database_killed() { super::database_killed($p) }
            #[test] fn leader_crashes() { super::leader_crashes($p) }
            #[test] fn graceful_hand_over_is_fast() { super::graceful_hand_over_is_fast($p) }
            #[test] fn high_latency_is_survivable() { super::high_latency_is_survivable($p) }
            #[test] fn replies_lost_while_requests_arrive() { super::replies_lost_while_requests_arrive($p) }
            #[test] fn connections_reset_mid_query() { super::connections_reset_mid_query($p) }
            #[test] fn bandwidth_collapse() { super::bandwidth_collapse($p) }
            #[test] fn flapping_path() { super::flapping_path($p) }
            #[test] fn everyone_partitioned() { super::everyone_partitioned($p) }
            #[test] fn database_clock_days_away() { super::database_clock_days_away($p) }
            #[test] fn table_locked() { super::table_locked($p) }
            #[test] fn election_row_locked() { super::election_row_locked($p) }
            #[test] fn backends_terminated() { super::backends_terminated($p) }
            #[test] fn database_goes_read_only() { super::database_goes_read_only($p) }
            #[test] fn operator_fences_read_only() { super::operator_fences_read_only($p) }
            #[test] fn overriding_a_read_only_fence_is_caught() { super::overriding_a_read_only_fence_is_caught($p) }
            #[test] fn a_randomised_minute() { super::a_randomised_minute($p) }
            #[test] fn rolling_restart_of_the_whole_fleet() { super::rolling_restart_of_the_whole_fleet($p) }
            #[test] fn two_elections_one_broken() { super::two_elections_one_broken($p) }
            #[test] #[ignore = "the soak: bash scripts/chaos-soak.sh"] fn soak() { super::soak($p) }
        }
    )*};
}

per_path! {
    postgres: Path::Pg;
    pgbouncer: Path::Bouncer;
    mariadb: Path::Maria;
}

mod pgbouncer_only {
    #[test]
    fn pooler_restarts() {
        super::pooler_restarts()
    }
    #[test]
    fn pooler_paused() {
        super::pooler_paused()
    }
    #[test]
    fn more_participants_than_pooler_connections() {
        super::more_participants_than_pooler_connections()
    }
}
