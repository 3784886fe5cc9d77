//! Row 1: the cost of asking "do I still lead?", next to the clock read it
//! is built on, on a `MemStore` elector (no database involved).

use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, MemStore};

use crate::common::{Table, Verdict};

/// Nanoseconds per call of `f`: `rounds` rounds of `chunks` timed chunks of
/// `per_chunk` calls; each round's figure is its median chunk, and the
/// figure reported is the lowest round (the one least disturbed by the
/// rest of the machine).
fn ns_per_call(rounds: usize, chunks: usize, per_chunk: u64, f: &(impl Fn() + Sync)) -> f64 {
    (0..rounds)
        .map(|_| {
            let mut v: Vec<f64> = (0..chunks)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..per_chunk {
                        f();
                    }
                    t.elapsed().as_nanos() as f64 / per_chunk as f64
                })
                .collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        })
        .fold(f64::INFINITY, f64::min)
}

/// The same, on `threads` threads at once (started together); the mean of
/// their figures.
fn on_threads(threads: usize, rounds: usize, chunks: usize, per_chunk: u64, f: &(impl Fn() + Sync)) -> f64 {
    if threads == 1 {
        return ns_per_call(rounds, chunks, per_chunk, f);
    }
    let start = Barrier::new(threads);
    thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    ns_per_call(rounds, chunks, per_chunk, f)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum::<f64>() / threads as f64
    })
}

pub fn run(quick: bool, table: &mut Table) -> Result<(), String> {
    let elector =
        Elector::start(Config::new(MemStore::new(), "bench-micro").identity("micro")).map_err(|e| e.to_string())?;
    let guard = elector.wait_leader_timeout(Duration::from_secs(5)).map_err(|e| e.to_string())?;
    // 5 rounds of 20 chunks of 500,000 calls: 50 M calls per figure.
    let (rounds, chunks, per_chunk) = if quick { (3, 10, 200_000) } else { (5, 20, 500_000) };
    let calls = rounds as u64 * chunks as u64 * per_chunk;
    let now = || {
        black_box(Instant::now());
    };
    // What `is_valid()` does besides reading the clock: `origin.elapsed()`.
    let origin = Instant::now();
    let elapsed = || {
        black_box(black_box(origin).elapsed());
    };
    let valid = || {
        black_box(black_box(&guard).is_valid());
    };
    let leader = || {
        black_box(black_box(&elector).is_leader());
    };
    for threads in [1, 2] {
        // Rounds of the four interleaved, so that each sees the same machine.
        let (mut t_now, mut t_valid, mut t_leader, mut t_elapsed) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..rounds {
            t_now = t_now.min(on_threads(threads, 1, chunks, per_chunk, &now));
            t_valid = t_valid.min(on_threads(threads, 1, chunks, per_chunk, &valid));
            t_leader = t_leader.min(on_threads(threads, 1, chunks, per_chunk, &leader));
            t_elapsed = t_elapsed.min(on_threads(threads, 1, chunks, per_chunk, &elapsed));
        }
        let ratio = t_valid / t_now;
        let what = if threads == 1 { "1 thread" } else { "2 threads on one guard/elector" };
        table.add(
            format!("1. `Instant::now()` / `is_valid()` / `is_leader()` (/ `Instant::elapsed()`), {what}"),
            format!(
                "{t_now:.1} / {t_valid:.1} / {t_leader:.1} ({t_elapsed:.1}) ns per call, {} M calls each",
                calls / 1_000_000
            ),
            "—",
            Verdict::Info,
        );
        table.add(
            format!("1. `is_valid()` ÷ `Instant::now()`, {what}"),
            format!("{ratio:.2}×"),
            "≤ 1.3×",
            Verdict::of(ratio <= 1.3),
        );
    }
    if !guard.is_valid() {
        return Err("row 1: the MemStore elector lost its term during the measurement".into());
    }
    drop(guard);
    elector.shutdown().map_err(|e| e.to_string())
}
