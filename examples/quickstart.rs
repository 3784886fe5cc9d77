//! Three participants elect a leader on one in-memory store; the leader
//! crashes and a successor takes over once its lease runs out; then the new
//! leader shuts down cleanly and hands over at once.
//!
//! Needs no database: `cargo run --example quickstart`.

use std::error::Error;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, MemStore, Timing};

/// A term as one participant's work loop saw it begin.
struct Started {
    identity: String,
    fence: u64,
    at: Instant,
}

fn main() -> Result<(), Box<dyn Error>> {
    let t0 = Instant::now();
    let stamp = |at: Instant| format!("t+{:6.3}s", at.duration_since(t0).as_secs_f64());

    // Short timings so the demo is quick. They satisfy the invariant
    // renew + 2*operation_timeout + retry_delay <= lease - safety_margin:
    // 500 + 2*300 + 125 = 1225 ms <= 3000 - 1000 = 2000 ms.
    let timing = Timing {
        lease_duration: Duration::from_secs(3),
        renew_interval: Duration::from_millis(500),
        retry_period: Duration::from_millis(300),
        operation_timeout: Duration::from_millis(300),
        safety_margin: Duration::from_secs(1),
    };
    let store = MemStore::new();
    let (started_tx, started) = mpsc::channel::<Started>();

    println!("{}  start web-1, web-2, web-3 (lease 3 s, retry period 300 ms)", stamp(Instant::now()));
    let mut fleet = Vec::new();
    for id in ["web-1", "web-2", "web-3"] {
        let config = Config::new(store.clone(), "quickstart").identity(id).timing(timing);
        let elector = Arc::new(Elector::start(config)?);
        let (e, tx) = (Arc::clone(&elector), started_tx.clone());
        // The work loop: wait to lead, then work while the guard is valid.
        let worker = thread::spawn(move || {
            while let Ok(guard) = e.wait_leader() {
                let _ =
                    tx.send(Started { identity: e.identity().to_owned(), fence: guard.fence(), at: Instant::now() });
                while guard.is_valid() {
                    // A real program writes here, stamped with guard.fence().
                    let _ = guard.wait_lost_timeout(Duration::from_millis(100));
                }
            }
        });
        fleet.push((elector, worker));
    }

    // Waits for the next leader after the one that stopped at `stopped_at`
    // (`how`; `note` ends the line), and prints it with how long the
    // failover took.
    let next_leader = |stopped_at: Instant, how: &str, note: &str| -> Result<(Started, Duration), Box<dyn Error>> {
        let next = started.recv_timeout(Duration::from_secs(10))?;
        let failover = next.at.duration_since(stopped_at);
        println!(
            "{}  {} leads with fence {}  (failover after {how}: {:.3} s{note})",
            stamp(next.at),
            next.identity,
            next.fence,
            failover.as_secs_f64()
        );
        Ok((next, failover))
    };

    let first = started.recv_timeout(Duration::from_secs(5))?;
    println!("{}  {} leads with fence {}", stamp(first.at), first.identity, first.fence);
    thread::sleep(Duration::from_secs(1)); // let it lead (and renew) for a while

    let leader = fleet.iter().find(|(e, _)| e.identity() == first.identity).ok_or("leader not in fleet")?;
    let crashed_at = Instant::now();
    leader.0.shutdown_without_release(); // stops like a crash: the lease stays in the store
    println!("{}  {} crashes without releasing its lease", stamp(crashed_at), first.identity);

    let (second, crash_failover) = next_leader(crashed_at, "a crash", "; bounded by the 3 s lease")?;
    thread::sleep(Duration::from_millis(500));

    let successor = fleet.iter().find(|(e, _)| e.identity() == second.identity).ok_or("leader not in fleet")?;
    let stopped_at = Instant::now();
    successor.0.shutdown()?; // invalidates its guard, then releases the lease
    println!("{}  {} shuts down cleanly and releases", stamp(stopped_at), second.identity);

    let (third, clean_failover) = next_leader(stopped_at, "a clean shutdown", "")?;

    for (elector, _) in &fleet {
        elector.shutdown()?;
    }
    for (_, worker) in fleet {
        worker.join().map_err(|_| "a worker panicked")?;
    }

    let fences = [first.fence, second.fence, third.fence];
    if !fences.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("fences did not increase: {fences:?}").into());
    }
    if crash_failover > Duration::from_secs(4) || clean_failover > Duration::from_secs(1) {
        return Err("failover slower than the configuration allows".into());
    }
    println!("fences {fences:?} strictly increase; every participant shut down");
    Ok(())
}
