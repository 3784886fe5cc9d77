//! Worker threads that run blocking store calls, so a driver thread never
//! blocks on the database: an elector's calls, a group's batches.
//!
//! A worker is spawned when a job finds none idle, up to a bound. When all
//! are busy, a job waits for the first to come free, unless every one has
//! been busy longer than the operation timeout (`hung_after`): a call the
//! driver gave up on keeps its worker until the store returns, and once
//! every worker is stuck like that new jobs are refused at once rather than
//! piling up. A job that waited past `hung_after` is not run (its caller
//! has given up on it): it gets `expired`'s answer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crossbeam_channel::{Receiver, Sender};

/// Why a job was not started.
pub(crate) enum NotStarted {
    /// Every worker is busy with a call still hung; this many exist.
    Hung(usize),
    /// A worker thread could not be spawned.
    Spawn(std::io::Error),
    /// The workers are shutting down.
    Stopped,
}

/// At most `max` threads named `name` that run jobs with `run` and send
/// back what it returns on [`Workers::replies`].
pub(crate) struct Workers<J, R> {
    name: &'static str,
    max: usize,
    hung_after: Duration,
    run: Arc<dyn Fn(J) -> R + Send + Sync>,
    expired: Arc<dyn Fn(J) -> R + Send + Sync>,
    job_tx: Sender<(Instant, J)>,
    job_rx: Receiver<(Instant, J)>,
    reply_tx: Sender<R>,
    /// Each job's result, in the order they finish.
    pub(crate) replies: Receiver<R>,
    idle: Arc<AtomicUsize>,
    alive: Arc<AtomicUsize>,
    /// When each busy worker took its job, by worker.
    busy_since: Arc<Mutex<Vec<Option<Instant>>>>,
}

impl<J: Send + 'static, R: Send + 'static> Workers<J, R> {
    pub(crate) fn new(
        name: &'static str, max: usize, hung_after: Duration, run: impl Fn(J) -> R + Send + Sync + 'static,
        expired: impl Fn(J) -> R + Send + Sync + 'static,
    ) -> Workers<J, R> {
        let (job_tx, job_rx) = crossbeam_channel::unbounded();
        let (reply_tx, replies) = crossbeam_channel::unbounded();
        Workers {
            name,
            max,
            hung_after,
            run: Arc::new(run),
            expired: Arc::new(expired),
            job_tx,
            job_rx,
            reply_tx,
            replies,
            idle: Arc::new(AtomicUsize::new(0)),
            alive: Arc::new(AtomicUsize::new(0)),
            busy_since: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// How many worker threads exist (idle, busy or stuck).
    pub(crate) fn alive(&self) -> usize {
        self.alive.load(Ordering::Acquire)
    }

    /// Hands `job` to an idle worker, spawning one if none is idle and the
    /// bound allows; when every worker is busy, queues it for the first to
    /// come free, unless every one has been busy past `hung_after`. A `run`
    /// that panics is the caller's to catch: the worker survives it only if
    /// `run` does (see [`catching`]).
    pub(crate) fn start(&self, job: J) -> Result<(), (J, NotStarted)> {
        if self.idle.load(Ordering::Acquire) == 0 {
            let alive = self.alive.load(Ordering::Acquire);
            if alive >= self.max {
                let now = Instant::now();
                let stuck = self
                    .busy_since
                    .lock()
                    .iter()
                    .flatten()
                    .all(|t| now.saturating_duration_since(*t) >= self.hung_after);
                if stuck {
                    return Err((job, NotStarted::Hung(alive)));
                }
            } else if let Err(e) = self.spawn() {
                return Err((job, NotStarted::Spawn(e)));
            }
        }
        self.job_tx.send((Instant::now(), job)).map_err(|e| (e.into_inner().1, NotStarted::Stopped))
    }

    fn spawn(&self) -> std::io::Result<()> {
        let (jobs, replies, idle, count, run, expired, busy) = (
            self.job_rx.clone(),
            self.reply_tx.clone(),
            Arc::clone(&self.idle),
            Arc::clone(&self.alive),
            Arc::clone(&self.run),
            Arc::clone(&self.expired),
            Arc::clone(&self.busy_since),
        );
        let hung_after = self.hung_after;
        let slot = {
            let mut b = busy.lock();
            b.push(None);
            b.len() - 1
        };
        count.fetch_add(1, Ordering::AcqRel);
        idle.fetch_add(1, Ordering::AcqRel);
        let spawned = thread::Builder::new().name(self.name.to_owned()).spawn(move || {
            for (queued, job) in jobs {
                idle.fetch_sub(1, Ordering::AcqRel);
                let started = Instant::now();
                let reply = if started.saturating_duration_since(queued) >= hung_after {
                    expired(job)
                } else {
                    busy.lock()[slot] = Some(started);
                    let r = run(job);
                    busy.lock()[slot] = None;
                    r
                };
                idle.fetch_add(1, Ordering::AcqRel);
                if replies.send(reply).is_err() {
                    break;
                }
            }
            idle.fetch_sub(1, Ordering::AcqRel);
            count.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            self.alive.fetch_sub(1, Ordering::AcqRel);
            self.idle.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(())
    }
}

/// Runs `f`, turning a panic into `on_panic()`: a store call that panics
/// fails like any other instead of taking its worker down.
pub(crate) fn catching<T>(f: impl FnOnce() -> T, on_panic: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| on_panic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Workers that block until released; each reports when it has taken
    /// a job, and answers its number (an expired job answers 1000 + n).
    fn blocking(max: usize, hung_after: Duration) -> (Workers<u32, u32>, Sender<()>, Receiver<()>) {
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let (running_tx, running) = crossbeam_channel::unbounded::<()>();
        let w = Workers::new(
            "test-worker",
            max,
            hung_after,
            move |n: u32| {
                if n == 0 {
                    running_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                }
                n
            },
            |n| 1000 + n,
        );
        (w, release_tx, running)
    }

    /// Two [`blocking`] workers, each busy with a job.
    fn both_busy(hung_after: Duration) -> (Workers<u32, u32>, Sender<()>) {
        let (w, release, running) = blocking(2, hung_after);
        for _ in 0..2 {
            assert!(w.start(0).is_ok());
            // Taken by a worker (no longer idle) before the next one.
            running.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        (w, release)
    }

    #[test]
    fn jobs_run_on_at_most_max_threads_and_stuck_ones_refuse_more() {
        let (w, release) = both_busy(Duration::from_millis(20));
        // Both busy past hung_after: refused, with the count. (The sleep
        // ages them; it waits for no outcome.)
        std::thread::sleep(Duration::from_millis(30));
        match w.start(7) {
            Err((7, NotStarted::Hung(n))) => assert_eq!(n, 2),
            Err(_) => panic!("refused for another reason"),
            Ok(()) => panic!("queued behind hung workers"),
        }
        assert_eq!(w.alive(), 2);
        release.send(()).unwrap();
        release.send(()).unwrap();
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        assert!(w.start(5).is_ok(), "an idle worker takes it");
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 5);
        assert_eq!(w.alive(), 2);
    }

    // Busy is not hung: a job finding every worker busy for less than
    // hung_after waits for the first to come free instead of failing.
    #[test]
    fn a_job_waits_for_busy_workers_that_are_not_hung() {
        let (w, release) = both_busy(Duration::from_secs(60));
        assert!(w.start(7).is_ok(), "refused while no worker was hung");
        assert_eq!(w.alive(), 2, "no third thread");
        release.send(()).unwrap();
        let mut got = vec![w.replies.recv_timeout(Duration::from_secs(5)).unwrap()];
        got.push(w.replies.recv_timeout(Duration::from_secs(5)).unwrap());
        got.sort();
        assert_eq!(got, [0, 7], "the queued job ran on the freed worker");
        release.send(()).unwrap();
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
    }

    // A job that waited past hung_after is not run: its caller gave up.
    #[test]
    fn a_job_that_waited_too_long_is_answered_without_running() {
        let (w, release, running) = blocking(1, Duration::from_millis(50));
        assert!(w.start(0).is_ok());
        running.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(w.start(7).is_ok(), "queued: the one worker was busy for less than 50 ms");
        std::thread::sleep(Duration::from_millis(80)); // the queued job ages past hung_after
        release.send(()).unwrap();
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        assert_eq!(w.replies.recv_timeout(Duration::from_secs(5)).unwrap(), 1007, "the stale job ran");
    }

    #[test]
    fn a_panic_becomes_a_value() {
        assert_eq!(catching(|| -> u8 { panic!("store bug") }, || 9), 9);
        assert_eq!(catching(|| 3, || 9), 3);
    }
}
