//! Rows 2 and 3, from the same trials: a leader and two followers; the
//! leader crashes (`shutdown_without_release`), then the successor shuts down
//! cleanly while two followers wait.
//!
//! - Takeover delay (row 2), on the database clock: the successor's
//!   `acquired_at` minus the crashed lease's `expires_at`, both read from the
//!   row with `inspect`. Negative would be a safety violation.
//! - Failover after the crash (row 3), on the local clock: from the crash to
//!   a follower's `is_leader()`, as a ratio to the lease.
//! - Hand-over (row 3), on the local clock: from the start of the leader's
//!   `shutdown()` to a follower's `is_leader()`, as a ratio to the retry period.
//!
//! Several elections run their trials at once (one thread each), each with a
//! store of its own shared by its participants: a trial makes a few calls a
//! second, so the database is nowhere near busy, and no election waits for
//! another's pooled connection.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, Store, Timing};

use crate::common::{ms, pct, poll, random_below, sample, violation, Counting, Table, Verdict};

/// Lease 3 s. Invariant: 0.5 s + 2 × 0.5 s + 0.125 s = 1.625 s <= 3 s − 1 s.
pub const TIMING: Timing = Timing {
    lease_duration: Duration::from_secs(3),
    renew_interval: Duration::from_millis(500),
    retry_period: Duration::from_secs(1),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_secs(1),
};

const CALL: Duration = Duration::from_secs(2);

/// What one trial measured.
struct Trial {
    takeover_ms: f64,
    /// A renewal was in flight at the crash (its expiry is the one counted).
    renewal_in_flight: bool,
    failover: Duration,
    handovers: Vec<Duration>,
    /// Clean shutdowns whose release failed (their hand-over is left out).
    failed_releases: usize,
}

/// An elector with a counting wrapper of its own over the trial's store.
fn start(store: &Arc<dyn Store>, name: &str, id: &str) -> Result<(Elector, Arc<Counting>), String> {
    let counting = Counting::new(Arc::clone(store), true);
    let e = Elector::start(Config::new(Arc::clone(&counting), name).identity(id).timing(TIMING))
        .map_err(|e| e.to_string())?;
    Ok((e, counting))
}

/// Waits for the calls a stopped elector left in flight to return (each is
/// bounded by the operation timeout), so the row shows their effect; says
/// whether there was one.
fn drain(calls: &Counting) -> Result<bool, String> {
    let was = calls.in_flight() > 0;
    poll(Duration::from_secs(5), Duration::from_millis(1), || (calls.in_flight() == 0).then_some(()))
        .ok_or("a call of the stopped elector did not return within 5 s")?;
    Ok(was)
}

/// Waits until every elector has seen the lease (so each polls on its own
/// schedule), then a random part of `phase` so the fault lands at a random
/// point of the renewal and poll cycles.
fn settle(electors: &[&Elector], phase: Duration) -> Result<(), String> {
    poll(Duration::from_secs(10), Duration::from_millis(5), || {
        electors.iter().all(|e| e.status().leader.is_some()).then_some(())
    })
    .ok_or("followers never saw the lease")?;
    thread::sleep(random_below(phase));
    Ok(())
}

/// Polls `electors` every 200 µs until one leads; checks every look for two
/// leaders. Returns the index of the new leader and when it was seen.
fn first_leader(electors: &[&Elector], what: &str) -> Result<(usize, Instant), String> {
    poll(TIMING.lease_duration + Duration::from_secs(5), Duration::from_micros(200), || {
        let s = sample(electors);
        if s.overlap {
            violation(&format!("{what}: two followers led at once"));
        }
        s.fences.iter().position(Option::is_some).map(|i| (i, Instant::now()))
    })
    .ok_or_else(|| format!("{what}: nobody took over within the lease + 5 s"))
}

fn trial(store: Arc<dyn Store>, name: &str, handovers_per_trial: usize) -> Result<Trial, String> {
    let store = &store;
    let (a, a_calls) = start(store, name, "a")?;
    let guard = a.wait_leader_timeout(Duration::from_secs(10)).map_err(|e| format!("first leader: {e}"))?;
    let ((b, b_calls), (c, c_calls)) = (start(store, name, "b")?, start(store, name, "c")?);
    settle(&[&b, &c], TIMING.renew_interval)?;

    // The crash: the lease stays. A renewal in flight may still land, as it
    // would after a real crash: the row is final once it has returned.
    a.shutdown_without_release();
    let crashed = Instant::now();
    drop(guard);
    let renewal_in_flight = drain(&a_calls)?;
    let dead = store.inspect(name, CALL).map_err(|e| format!("inspect after the crash: {e}"))?;
    // The holder on the database is the identity with the elector's
    // instance tag (`a#` and 16 hex digits).
    let a_identity = a.status().identity;
    if dead.holder != a_identity {
        return Err(format!("the crashed lease is held by {:?}, not {a_identity:?}", dead.holder));
    }
    let followers = [&b, &c];
    let (won, seen) = first_leader(&followers, "crash failover")?;
    let failover = seen - crashed;
    let next = store.inspect(name, CALL).map_err(|e| format!("inspect after the takeover: {e}"))?;
    let takeover_us = next.acquired_at.as_unix_micros() - dead.expires_at.as_unix_micros();
    if takeover_us < 0 || next.fence <= dead.fence {
        violation(&format!(
            "{name}: successor acquired {takeover_us} µs after the crashed lease expired, fence {} after {}",
            next.fence, dead.fence
        ));
    }

    if takeover_us > 5_000 {
        let mut lat = [&b_calls, &c_calls].map(|c| c.take_latencies(crashed)).concat();
        lat.sort_unstable_by(|a, b| b.cmp(a));
        lat.truncate(4);
        eprintln!("bench: {name}: takeover {takeover_us} µs; followers' slowest calls since the crash (µs): {lat:?}");
    }

    // Clean hand-overs, each with two followers whose poll phases are
    // independent: the loser of the takeover is retired (after a crash every
    // follower polls at the lease's expiry, so their phases start aligned),
    // and each hand-over has one follower started a random part of a retry
    // period after the other's start.
    followers[1 - won].shutdown().map_err(|e| format!("follower shutdown: {e}"))?;
    let mut pool = vec![if won == 0 { (b, b_calls) } else { (c, c_calls) }, start(store, name, "f0")?];
    let (mut leader, mut follower) = (0, 1);
    let (mut handovers, mut failed_releases) = (Vec::new(), 0);
    for k in 1..=handovers_per_trial {
        thread::sleep(random_below(TIMING.retry_period));
        pool.push(start(store, name, &format!("f{k}"))?);
        let waiting = [follower, pool.len() - 1];
        let refs = waiting.map(|i| &pool[i].0);
        settle(&refs, TIMING.retry_period)?;
        thread::sleep(TIMING.retry_period);
        let fence = pool[leader].0.fence().ok_or("the leader stopped leading before its hand-over")?;
        let t = Instant::now();
        let released = pool[leader].0.shutdown();
        let late_call = pool[leader].1.in_flight() > 0;
        let (got, seen) = first_leader(&refs, "hand-over")?;
        if seen - t > TIMING.lease_duration / 2 {
            eprintln!(
                "bench: {name}: hand-over took {:?}; a call of the old leader was {}in flight when its shutdown returned",
                seen - t,
                if late_call { "" } else { "not " }
            );
        }
        if refs[got].fence().is_some_and(|f| f <= fence) {
            violation(&format!("{name}: hand-over fence did not increase past {fence}"));
        }
        match released {
            Ok(()) => handovers.push(seen - t),
            Err(e) => {
                eprintln!("bench: {name}: a clean shutdown's release failed ({e}); hand-over left out");
                failed_releases += 1;
            }
        }
        (leader, follower) = (waiting[got], waiting[1 - got]);
    }
    Ok(Trial { takeover_ms: takeover_us as f64 / 1000.0, renewal_in_flight, failover, handovers, failed_releases })
}

/// Runs `rounds` rounds of `parallel` trials on one path and adds its rows.
pub fn run(
    label: &str, make_store: &(dyn Fn() -> Result<Arc<dyn Store>, String> + Sync), parallel: usize, rounds: usize,
    handovers: usize, table: &mut Table,
) -> Result<(), String> {
    let tag = crate::common::random_tag();
    let mut trials = Vec::new();
    for round in 0..rounds {
        let results: Vec<Result<Trial, String>> = thread::scope(|s| {
            let hs: Vec<_> = (0..parallel)
                .map(|i| {
                    let name = format!("takeover-{tag}-{round}-{i}");
                    s.spawn(move || trial(make_store()?, &name, handovers))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a trial panicked".into()))).collect()
        });
        for r in results {
            trials.push(r.map_err(|e| format!("{label}: {e}"))?);
        }
        eprintln!("bench: {label}: {} trials done", trials.len());
    }
    let n = trials.len();
    let mut take: Vec<f64> = trials.iter().map(|t| t.takeover_ms).collect();
    let (p50, p99) = (pct(&mut take, 50.0), pct(&mut take, 99.0));
    table.add(
        format!("2. takeover delay after a crash, {label} (DB clock, lease 3 s, {n} trials)"),
        format!(
            "p50 {}, p99 {} (min {}, max {}; {} crashes with a renewal in flight)",
            ms(p50),
            ms(p99),
            ms(take[0]),
            ms(take[n - 1]),
            trials.iter().filter(|t| t.renewal_in_flight).count()
        ),
        "p50 ≤ 5 ms, p99 ≤ 20 ms",
        Verdict::of(p50 <= 5.0 && p99 <= 20.0),
    );
    let lease = TIMING.lease_duration.as_secs_f64();
    let mut fo: Vec<f64> = trials.iter().map(|t| t.failover.as_secs_f64() / lease).collect();
    let retry = TIMING.retry_period.as_secs_f64();
    let mut ho: Vec<f64> = trials.iter().flat_map(|t| &t.handovers).map(|h| h.as_secs_f64() / retry).collect();
    table.add(
        format!("3. failover after a crash ÷ lease, {label} (2 followers)"),
        format!("p50 {:.3}, p99 {:.3}, max {:.3}", pct(&mut fo, 50.0), pct(&mut fo, 99.0), fo[n - 1]),
        "—",
        Verdict::Info,
    );
    let h50 = pct(&mut ho, 50.0);
    table.add(
        format!("3. hand-over after a clean shutdown ÷ retry period (1 s), {label} (2 followers)"),
        format!(
            "p50 {h50:.3}, p99 {:.3}, max {:.3} ({} hand-overs; {} releases failed, left out)",
            pct(&mut ho, 99.0),
            ho[ho.len() - 1],
            ho.len(),
            trials.iter().map(|t| t.failed_releases).sum::<usize>()
        ),
        "p50 ≤ 0.3",
        Verdict::of(h50 <= 0.3),
    );
    Ok(())
}
