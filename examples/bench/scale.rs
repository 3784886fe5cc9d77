//! Row 5: 1,000 electors (100 elections of 10) in this process sharing ONE
//! store at the default timings and pool size, for a window that starts once
//! every election has a leader. A sampler thread looks at all 1,000 every
//! 10 ms (two `fence()` reads each, see [`sample`]); the counting wrapper
//! times every store call; threads and memory come from /proc/self/status,
//! and the sessions this process holds from the server's own session list.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, Store};

use crate::common::{
    ms, pct, poll, proc_status, sample, server_sessions, url_port, violation, Counting, Db, FenceOrder, Table, Verdict,
};

const ELECTIONS: usize = 100;
const PER_ELECTION: usize = 10;
const TICK: Duration = Duration::from_millis(10);

pub fn run(label: &str, url: &str, store: Arc<dyn Store>, window: Duration, table: &mut Table) -> Result<(), String> {
    let counting = Counting::new(store, true);
    let mut db = Db::connect(url)?;
    let (_, _, threads_before) = proc_status();
    let started = Instant::now();
    let tag = crate::common::random_tag();
    let electors: Vec<Vec<Elector>> = (0..ELECTIONS)
        .map(|e| {
            (0..PER_ELECTION)
                .map(|k| {
                    Elector::start(
                        Config::new(Arc::clone(&counting), format!("scale-{tag}-{e}")).identity(format!("e{k}")),
                    )
                    .map_err(|err| err.to_string())
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let refs: Vec<Vec<&Elector>> = electors.iter().map(|g| g.iter().collect()).collect();
    poll(Duration::from_secs(90), Duration::from_millis(20), || {
        refs.iter().all(|g| g.iter().any(|e| e.is_leader())).then_some(())
    })
    .ok_or_else(|| format!("{label}: not every election had a leader within 90 s"))?;
    let all_led = started.elapsed();
    eprintln!("bench: {label}: 1,000 electors started, every election led after {:.1} s", all_led.as_secs_f64());

    let window_start = Instant::now();
    let calls0 = counting.calls();
    let stop = AtomicBool::new(false);
    let (mut peak_threads, mut peak_sessions, mut rss_max) = (0u64, 0usize, 0f64);
    let (one, samples, overlaps, late) = thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut one = vec![0u64; ELECTIONS];
            let mut order: Vec<FenceOrder> = (0..ELECTIONS).map(|_| FenceOrder::default()).collect();
            let (mut samples, mut overlaps, mut late) = (0u64, 0u64, Duration::ZERO);
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                late = late.max(next.elapsed());
                for (e, group) in refs.iter().enumerate() {
                    let smp = sample(group);
                    if smp.leaders == 1 {
                        one[e] += 1;
                    }
                    if smp.overlap {
                        overlaps += 1;
                        violation(&format!("{label}: election {e} had two leaders at once"));
                    }
                    if let Some(v) = order[e].check(&smp.fences) {
                        overlaps += 1;
                        violation(&format!("{label}: election {e}: {v}"));
                    }
                }
                samples += 1;
                next += TICK;
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            (one, samples, overlaps, late)
        });
        let t0 = Instant::now();
        while t0.elapsed() < window {
            thread::sleep(Duration::from_millis(500).min(window.saturating_sub(t0.elapsed())));
            let (rss, _, th) = proc_status();
            peak_threads = peak_threads.max(th);
            rss_max = rss_max.max(rss);
            if let Ok(n) = server_sessions(&mut db, url_port(url)) {
                peak_sessions = peak_sessions.max(n);
            }
        }
        stop.store(true, Ordering::Relaxed);
        sampler.join().expect("the sampler panicked")
    });
    let calls = counting.calls().since(&calls0);
    let mut lat = counting.take_latencies(window_start);
    let (_, hwm, _) = proc_status();
    let t = Instant::now();
    thread::scope(|s| {
        for chunk in electors.chunks(ELECTIONS / 4) {
            s.spawn(move || chunk.iter().flatten().for_each(|e| drop(e.shutdown())));
        }
    });
    eprintln!("bench: {label}: 1,000 electors shut down in {:.1} s", t.elapsed().as_secs_f64());

    let shares: Vec<f64> = one.iter().map(|&n| n as f64 / samples.max(1) as f64).collect();
    let min_share = shares.iter().copied().fold(1.0, f64::min);
    let mean_share = shares.iter().sum::<f64>() / ELECTIONS as f64;
    let secs = window.as_secs_f64();
    let head = format!("5. scale, {label}, 1,000 electors / 100 elections, one store, {secs:.0} s");
    table.add(
        format!("{head}: safety violations"),
        format!(
            "{overlaps} in {samples} samples of all 1,000 (sampler late by at most {})",
            ms(late.as_secs_f64() * 1e3)
        ),
        "0",
        if overlaps == 0 { Verdict::Met } else { Verdict::Violation },
    );
    table.add(
        format!("{head}: share of samples with exactly one leader"),
        format!("lowest election {min_share:.5}, mean {mean_share:.5}"),
        "≥ 0.999 each",
        Verdict::of(min_share >= 0.999),
    );
    let (p50, p99) = (pct(&mut lat, 50.0) as f64 / 1e3, pct(&mut lat, 99.0) as f64 / 1e3);
    eprintln!(
        "bench: {label}: store-call latency p90 {} p95 {} p98 {} p99.9 {}; calls over 10 ms: {}, over 100 ms: {}",
        ms(pct(&mut lat, 90.0) as f64 / 1e3),
        ms(pct(&mut lat, 95.0) as f64 / 1e3),
        ms(pct(&mut lat, 98.0) as f64 / 1e3),
        ms(pct(&mut lat, 99.9) as f64 / 1e3),
        lat.iter().filter(|&&l| l > 10_000).count(),
        lat.iter().filter(|&&l| l > 100_000).count()
    );
    table.add(
        format!("{head}: store-call latency"),
        format!(
            "p50 {}, p99 {}, max {} ({} calls, {:.0}/s)",
            ms(p50),
            ms(p99),
            ms(*lat.last().unwrap() as f64 / 1e3),
            calls.total(),
            calls.total() as f64 / secs
        ),
        "p99 ≤ 50 ms",
        Verdict::of(p99 <= 50.0),
    );
    table.add(
        format!("{head}: threads, server sessions"),
        format!("{peak_threads} threads ({threads_before} before), {peak_sessions} sessions"),
        "—",
        Verdict::Info,
    );
    table.add(
        format!("{head}: resident memory"),
        format!("VmRSS {rss_max:.0} MiB, peak VmHWM {hwm:.0} MiB (process-wide)"),
        "≤ 200 MiB",
        Verdict::of(hwm <= 200.0),
    );
    Ok(())
}
