//! What the elector tells an operator through the `log` crate: one `info`
//! line when a term starts and one when it ends, with the election, the
//! identity, the fence and the reason; a `warn` with the cause when a renewal
//! fails or a term ends early; nothing at `info` while all is well. Never the
//! payload.
//!
//! One logger serves the whole binary, so each test runs its own election
//! and reads only the lines that name it.

use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, Elector, ErrorKind, LeaderGuard, MemStore, Timing};

mod threaded;
use threaded::{lead, ms, term_ends, timing, until};

struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

fn capture() -> &'static Capture {
    static LOGGER: OnceLock<&'static Capture> = OnceLock::new();
    LOGGER.get_or_init(|| {
        let logger: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(logger).expect("the only logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        logger
    })
}

/// The lines so far that name election `name`, each `LEVEL message`.
fn lines(name: &str) -> Vec<String> {
    let needle = format!("leaderelection: {name:?}: ");
    capture().0.lock().unwrap().iter().filter(|l| l.contains(&needle)).cloned().collect()
}

/// Those of `lines(name)` at `level`.
fn at(level: &str, name: &str) -> Vec<String> {
    lines(name).into_iter().filter(|l| l.starts_with(&format!("{level} "))).collect()
}

/// Waits (5 s at most) for a line of `name` that satisfies `cond`.
fn wait_line(name: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(l) = lines(name).into_iter().find(|l| cond(l)) {
            return l;
        }
        assert!(Instant::now() < deadline, "no line {what}; lines: {:#?}", lines(name));
        thread::sleep(ms(2));
    }
}

/// An elector of `name` for `id` on `store`, the logger installed first
/// (a line logged before it would be lost).
fn start(store: &MemStore, name: &str, id: &str, retry_period: Duration) -> Elector {
    capture();
    let config = Config::new(store.clone(), name).identity(id).payload(&b"secret-address"[..]);
    Elector::start(config.timing(Timing { retry_period, ..timing() })).unwrap()
}

/// [`start`], then the guard of the elector's first term.
fn leading(store: &MemStore, name: &str, id: &str, retry_period: Duration) -> (Elector, LeaderGuard) {
    let e = start(store, name, id, retry_period);
    let guard = lead(&e);
    (e, guard)
}

#[test]
fn a_term_logs_one_line_at_its_start_and_one_at_its_end_and_nothing_while_it_renews() {
    // A 10 s retry period: after resigning, no second term for 20 s.
    let (e, guard) = leading(&MemStore::new(), "invoices", "web-1", Duration::from_secs(10));
    let f = guard.fence();
    // The identity as logged: the name given and the elector's instance tag.
    let id = format!("{:?}", e.identity());
    assert!(id.starts_with("\"web-1#"), "{id}");
    let started = format!("INFO leaderelection: \"invoices\": {id} leads with fence {f}");
    until(&e, "a steady stretch of five renewals", |s| s.renewals_ok >= 5);
    assert_eq!(at("INFO", "invoices"), std::slice::from_ref(&started), "only the start at info while it renews");
    guard.resign().expect("released");
    let ended = format!("INFO leaderelection: \"invoices\": {id} term with fence {f} ended: resigned");
    wait_line("invoices", "for the resignation", |l| l == ended);
    e.shutdown().unwrap(); // no term is live: nothing more to say
    assert_eq!(lines("invoices"), [started, ended], "exactly one line each, no warning");
    let all = capture().0.lock().unwrap().clone();
    assert!(all.iter().all(|l| !l.contains("secret")), "the payload leaked into the log: {all:?}");
}

#[test]
fn a_follower_logs_the_new_leader_once_and_a_shutdown_ends_the_term_at_info() {
    let store = MemStore::new();
    let (a, guard) = leading(&store, "ledger", "a", ms(100));
    let fa = guard.fence();
    let b = start(&store, "ledger", "b", ms(100));
    until(&b, "b follows a", |s| {
        s.leader.as_ref().is_some_and(|l| leaderelection::base_identity(&l.identity) == "a" && l.fence == fa)
    });
    // Several renewals by a, several polls by b (every 100 ms): nothing.
    let ok = a.status().renewals_ok;
    until(&a, "five more renewals", |s| s.renewals_ok >= ok + 5);
    a.shutdown().unwrap(); // ends the term with the guard still held, releases
    assert!(!guard.is_valid());
    let b_guard = b.wait_leader_timeout(Duration::from_secs(5)).expect("b takes over");
    let fb = b_guard.fence();
    b.shutdown().unwrap();
    drop((guard, b_guard));
    let l = |s: &str| format!("INFO leaderelection: \"ledger\": {s}");
    let (ia, ib) = (format!("{:?}", a.identity()), format!("{:?}", b.identity()));
    let a_lines = [l(&format!("{ia} leads with fence {fa}")), l(&format!("{ia} term with fence {fa} ended: shutdown"))];
    let b_lines = [
        l(&format!("leader is {ia} with fence {fa}")), // once, though b polled a dozen times
        l(&format!("{ib} leads with fence {fb}")),
        l(&format!("{ib} term with fence {fb} ended: shutdown")),
    ];
    // Two electors log from their own threads: each in its own order.
    let got = lines("ledger");
    assert_eq!(got.len(), 5, "{got:#?}");
    assert_eq!(got.iter().filter(|x| a_lines.contains(x)).collect::<Vec<_>>(), a_lines.iter().collect::<Vec<_>>());
    assert_eq!(got.iter().filter(|x| b_lines.contains(x)).collect::<Vec<_>>(), b_lines.iter().collect::<Vec<_>>());
}

/// `name` led by `id` on `store`, then `fault` breaks the store: a failed
/// renewal warns, its line ending in `cause` (after the time left), and the
/// term ends early with a warning naming `last` as its last failure. The
/// elector, the term's guard, the identity as logged and the fence.
fn renewals_fail_and_the_term_expires(
    store: &MemStore, name: &str, id: &str, fault: impl FnOnce(&MemStore), cause: &str, last: &str,
) -> (Elector, LeaderGuard, String, u64) {
    let (e, guard) = leading(store, name, id, ms(200));
    let f = guard.fence();
    fault(store);
    term_ends(&guard);
    let id = format!("{:?}", e.identity());
    let failed = format!("WARN leaderelection: \"{name}\": {id} renewal failed (fence {f}, ");
    wait_line(name, "for the failed renewal", |l| l.starts_with(&failed) && l.ends_with(&format!("left): {cause}")));
    let ended = format!(
        "WARN leaderelection: \"{name}\": {id} term with fence {f} ended: expired: no renewal confirmed the \
         lease before its deadline; last failure: {last}"
    );
    wait_line(name, "for the expiry", |l| l == ended);
    (e, guard, id, f)
}

#[test]
fn failing_renewals_warn_with_their_cause_and_the_early_end_says_why() {
    let store = MemStore::new();
    let (e, guard, id, f) = renewals_fail_and_the_term_expires(
        &store,
        "reports",
        "web-3",
        |s| s.set_failing(Some(ErrorKind::Retryable)),
        "memstore: failing on purpose (retryable)",
        "renew failed: memstore: failing on purpose (retryable)",
    );
    e.shutdown_without_release();
    drop(guard);
    assert_eq!(at("INFO", "reports"), [format!("INFO leaderelection: \"reports\": {id} leads with fence {f}")]);
}

#[test]
fn a_hung_store_ends_the_term_as_expired_with_the_timeout_as_cause() {
    let store = MemStore::new();
    // Renewals hang: only the deadline ends the term.
    let (e, guard, ..) = renewals_fail_and_the_term_expires(
        &store,
        "audits",
        "web-2",
        MemStore::pause,
        "renew gave no answer within 300ms",
        "renew gave no answer within 300ms",
    );
    store.resume();
    drop(guard);
    e.shutdown_without_release();
}

#[test]
fn a_lost_lease_and_a_fatal_error_end_their_terms_with_a_warning_that_says_why() {
    let store = MemStore::new();
    let (e, first) = leading(&store, "billing", "web-4", ms(200));
    let f = first.fence();
    assert!(store.delete_row("billing"));
    term_ends(&first);
    drop(first);
    let id = format!("{:?}", e.identity());
    let w = |s: &str| format!("WARN leaderelection: \"billing\": {id} {s}");
    let lost = w(&format!("term with fence {f} ended: lost: renew failed: lease lost"));
    wait_line("billing", "for the loss", |l| l == lost);
    let renewal = w(&format!("renewal failed (fence {f}, "));
    assert!(lines("billing").iter().any(|l| l.starts_with(&renewal) && l.ends_with("left): lease lost")));

    let second = lead(&e); // campaigns again at once
    let g = second.fence();
    store.set_failing(Some(ErrorKind::Fatal));
    term_ends(&second);
    let fatal = w(&format!("term with fence {g} ended: fatal: renew failed: memstore: failing on purpose (fatal)"));
    wait_line("billing", "for the fatal end", |l| l == fatal);
    drop(second);
    e.shutdown_without_release();
    let info = |s: &str| format!("INFO leaderelection: \"billing\": {id} {s}");
    assert_eq!(at("INFO", "billing"), [info(&format!("leads with fence {f}")), info(&format!("leads with fence {g}"))]);
}

/// A store the follower cannot use (a missing table, a setting it cannot
/// work under: a fatal error every poll) is reported once at `warn`, not
/// at every poll; once a call works and the error comes back, it is
/// reported again.
#[test]
fn a_fatal_error_that_repeats_is_reported_once() {
    capture();
    let store = MemStore::new();
    store.set_failing(Some(ErrorKind::Fatal));
    let counting = threaded::LeasesOnly::new(store.clone());
    let polls = std::sync::Arc::clone(&counting.1);
    let config = Config::new(counting, "exports").identity("web-5").timing(Timing { retry_period: ms(50), ..timing() });
    let e = Elector::start(config).unwrap();
    let seen = |n: usize| polls.load(std::sync::atomic::Ordering::SeqCst) >= n;
    assert!(threaded::eventually(Duration::from_secs(5), || seen(6)), "fewer than 6 polls");
    let warned = at("WARN", "exports");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].ends_with(": inspect failed: memstore: failing on purpose (fatal)"), "{warned:?}");
    // Someone else leads (written past the failing store), so this
    // participant only polls once calls work again.
    let now = store.now();
    store.restore_row(&leaderelection::Lease {
        name: "exports".into(),
        holder: "other".into(),
        fence: 1,
        acquired_at: now,
        renewed_at: now,
        expires_at: now.saturating_add(Duration::from_secs(60)),
        now,
        payload: Vec::new(),
    });
    store.set_failing(None);
    until(&e, "a call works", |s| s.last_error.is_none());
    store.set_failing(Some(ErrorKind::Fatal));
    let n = polls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(threaded::eventually(Duration::from_secs(5), || seen(n + 3)));
    e.shutdown_without_release();
    assert_eq!(at("WARN", "exports").len(), 2, "{:#?}", at("WARN", "exports"));
}
