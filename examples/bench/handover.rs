//! Row 9: a clean hand-over in milliseconds, with 2 and with 100 followers
//! waiting, with the feed of releases (`Store::releases`) and with the poll
//! alone, side by side in one run (issue 36).
//!
//! Each trial starts a leader on a store of its own and `n` followers on one
//! store they share (one listening connection, as a process's electors would
//! share it), waits until every follower has seen the leader, then a random
//! part of a retry period so the poll phases fall anywhere; then the leader
//! shuts down cleanly. Measured on the local clock from the start of the
//! leader's `shutdown()` to the instant the first follower's elector
//! learnt that its claim had won (`Status::term_started`: from then on its
//! `is_leader()` is true); the instant a poll of every follower every
//! 200 µs first saw it is reported beside it, since with 100 followers
//! that poll competes with their claims for the two cores. Every look
//! checks for two leaders. The followers' claims are counted from the
//! release on: a release must cost each follower at most one claim, and
//! while the leader lived none.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, Store};

use crate::common::{ms, pct, poll, random_below, sample, violation, Counting, Table, Verdict};
use crate::failover::TIMING;

/// One hand-over: how long it took, and the most claims one follower sent
/// after the release (and before it, while the leader lived).
struct HandOver {
    took: Duration,
    /// When the poll saw it.
    seen: Duration,
    most_claims: u64,
    claims_while_live: u64,
}

fn trial(leader_store: Arc<dyn Store>, shared: &Arc<dyn Store>, name: &str, n: usize) -> Result<HandOver, String> {
    let leader =
        Elector::start(Config::new(leader_store, name).identity("leader").timing(TIMING)).map_err(|e| e.to_string())?;
    let guard = leader.wait_leader_timeout(Duration::from_secs(10)).map_err(|e| format!("first leader: {e}"))?;
    let followers: Vec<(Elector, Arc<Counting>)> = (0..n)
        .map(|i| {
            let counting = Counting::new(Arc::clone(shared), false);
            let cfg = Config::new(Arc::clone(&counting), name).identity(format!("f{i}")).timing(TIMING);
            Elector::start(cfg).map(|e| (e, counting)).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let refs: Vec<&Elector> = followers.iter().map(|(e, _)| e).collect();
    poll(Duration::from_secs(20), Duration::from_millis(5), || {
        refs.iter().all(|e| e.status().leader.is_some()).then_some(())
    })
    .ok_or("followers never saw the leader")?;
    thread::sleep(TIMING.retry_period + random_below(TIMING.retry_period));
    let claims_while_live: u64 = followers.iter().map(|(_, c)| c.calls().acquire).sum();
    let before: Vec<u64> = followers.iter().map(|(_, c)| c.calls().acquire).collect();
    let t = Instant::now();
    leader.shutdown().map_err(|e| format!("the leader's release failed: {e}"))?;
    drop(guard);
    let seen = poll(TIMING.lease_duration + Duration::from_secs(5), Duration::from_micros(200), || {
        let s = sample(&refs);
        if s.overlap {
            violation(&format!("{name}: two followers led at once"));
        }
        s.fences.iter().position(Option::is_some).map(|i| (i, Instant::now()))
    })
    .ok_or("nobody took over within the lease + 5 s")?;
    let (winner, seen) = seen;
    let started = refs[winner].status().term_started.ok_or("the new leader's term has no start")?;
    // Claims prompted by the release have landed well within a retry
    // period; later ones would be polls.
    thread::sleep(TIMING.retry_period / 2);
    let most_claims = followers.iter().zip(&before).map(|((_, c), b)| c.calls().acquire - b).max().unwrap_or(0);
    thread::scope(|s| {
        for (e, _) in &followers {
            s.spawn(move || drop(e.shutdown()));
        }
    });
    Ok(HandOver { took: started.saturating_duration_since(t), seen: seen - t, most_claims, claims_while_live })
}

/// `trials` hand-overs with `n` followers on `label`'s path; adds a row.
pub fn run(
    label: &str, make_store: &dyn Fn() -> Result<Arc<dyn Store>, String>, n: usize, trials: usize, table: &mut Table,
) -> Result<(), String> {
    let tag = crate::common::random_tag();
    let shared = make_store()?;
    let (mut took, mut seen) = (Vec::new(), Vec::new());
    let (mut most, mut live) = (0, 0);
    for i in 0..trials {
        let h =
            trial(make_store()?, &shared, &format!("handover-{tag}-{i}"), n).map_err(|e| format!("{label}: {e}"))?;
        took.push(h.took.as_secs_f64() * 1000.0);
        seen.push(h.seen.as_secs_f64() * 1000.0);
        most = most.max(h.most_claims);
        live += h.claims_while_live;
    }
    let (p50, p99) = (pct(&mut took, 50.0), pct(&mut took, 99.0));
    table.add(
        format!("9. clean hand-over, {label}, {n} followers (retry period 1 s)"),
        format!(
            "p50 {}, p99 {}, max {} ({trials} hand-overs; seen by the poll: p50 {}, p99 {}); claims per \
             follower per release: at most {most}; claims while the leader lived: {live}",
            ms(p50),
            ms(p99),
            ms(took[took.len() - 1]),
            ms(pct(&mut seen, 50.0)),
            ms(pct(&mut seen, 99.0)),
        ),
        "p50 ≤ 5 ms, p99 ≤ 20 ms; ≤ 1 claim; 0",
        Verdict::of(p50 <= 5.0 && p99 <= 20.0 && most <= 1 && live == 0),
    );
    Ok(())
}
