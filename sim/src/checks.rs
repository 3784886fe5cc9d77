//! The logic of each fuzz target, as library functions over `&[u8]`.
//!
//! `fuzz/fuzz_targets/*.rs` call these and panic on `Err`;
//! `sim/tests/fuzz_corpus.rs` replays every committed corpus file
//! (`fuzz/corpus/TARGET/*`) through them, so plain `cargo test` at the
//! repository root checks the corpus with no fuzzer installed. Every input
//! is acceptable: missing bytes read as zero.
//!
//! Fuzzing runs on stable with `cargo install cargo-fuzz`, then, from `fuzz/`,
//! `cargo fuzz run --sanitizer none TARGET` (add a scratch directory before
//! `corpus/TARGET` to keep the committed corpus small, and
//! `-- -max_total_time=60` to bound the run). Measured on the 2-core
//! development machine, 45 to 180 s per target, no failures after the first
//! fix to the timing check:
//!
//! | target | executions per second |
//! |---|---|
//! | `timing_invariant` | 185,000 |
//! | `lease_maths` | 175,000 |
//! | `ident_quoting` | 160,000 |
//! | `delays` | 79,000 |
//! | `memstore_model` | 5,000 to 10,000 |
//! | `simulation` | 160 to 520 |

use std::collections::BTreeMap;
use std::time::Duration;

use super::rng::{scale, Bytes};
use super::schedule::{Schedule, Variant};
use super::world::{run, DB_BASE_MICROS};
use leaderelection::ident::{
    quote_mysql, quote_postgres, quote_postgres_literal, unquote_mysql, unquote_postgres, unquote_postgres_literal,
    MAX_MYSQL_IDENT, MAX_POSTGRES_IDENT,
};
use leaderelection::machine::{jitter, spread, Call, LocalTime, Machine, MachineConfig, Op, Outcome, Output};
use leaderelection::{DbTime, Lease};
use leaderelection::{ErrorKind, Store, StoreError};
use leaderelection::{MemStats, MemStore};
use leaderelection::{Timing, MAX_DURATION};

/// The logic of one fuzz target: `Err` describes a failure.
pub type Check = fn(&[u8]) -> Result<(), String>;

/// The fuzz targets, by name: `(name, logic)`.
pub const TARGETS: [(&str, Check); 6] = [
    ("timing_invariant", timing_invariant),
    ("lease_maths", lease_maths),
    ("delays", delays),
    ("ident_quoting", ident_quoting),
    ("memstore_model", memstore_model),
    ("simulation", simulation),
];

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// A duration from the bytes: sometimes zero, sometimes huge, usually
/// between nothing and about 18 minutes.
fn duration(r: &mut Bytes<'_>) -> Duration {
    match r.u8() {
        0 => Duration::ZERO,
        1 => Duration::MAX,
        2 => Duration::from_secs(u64::MAX / 2),
        _ => Duration::from_nanos(r.u64() & ((1 << 40) - 1)),
    }
}

/// A duration from the bytes that a machine can run with: 1 ms to about a
/// minute, in whole microseconds.
fn small_duration(r: &mut Bytes<'_>) -> Duration {
    Duration::from_micros(1_000 + u64::from(r.u16()) * 1_000 + u64::from(r.u8()))
}

fn drain(m: &mut Machine) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

/// A machine's outputs after it saw a lease: a claim if the lease had
/// expired (`seen`: what it saw), no call at all if not.
fn claims_if_expired(outs: &[Output], expired: bool, seen: &str) -> Result<(), String> {
    if expired {
        let call = only_call(outs).ok_or(format!("no call after seeing {seen}"))?;
        ensure!(matches!(call.op, Op::Acquire { .. }), "expected an acquire, got {:?}", call.op);
    } else {
        ensure!(only_call(outs).is_none(), "a call while a valid lease is held elsewhere: {outs:?}");
    }
    Ok(())
}

fn only_call(outs: &[Output]) -> Option<Call> {
    let calls: Vec<Call> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Call(c) => Some(*c),
            _ => None,
        })
        .collect();
    match calls.as_slice() {
        [c] => Some(*c),
        _ => None,
    }
}

fn lease(holder: &str, fence: u64, now_micros: i64, ttl: Duration) -> Lease {
    Lease::granted("fuzz", holder, fence, DbTime::from_unix_micros(now_micros), ttl, &[])
}

/// A machine for `timing` that has just started a term with fence 1 at local
/// instant `t0` (inspect and acquire answered instantly), and that term's
/// deadline.
fn leader(timing: Timing, seed: u64, t0: LocalTime) -> Result<(Machine, LocalTime), String> {
    let mut m = Machine::new(MachineConfig::new("me", timing, seed));
    m.handle_timeout(t0);
    let call = only_call(&drain(&mut m)).ok_or("no first call")?;
    ensure!(call.op == Op::Inspect, "first call is {:?}, not an inspect", call.op);
    m.handle_reply(t0, call.id, Outcome::Lease(Err(StoreError::no_lease("fuzz"))));
    let call = only_call(&drain(&mut m)).ok_or("no acquire after an empty record")?;
    ensure!(matches!(call.op, Op::Acquire { .. }), "expected an acquire, got {:?}", call.op);
    m.handle_reply(t0, call.id, Outcome::Lease(Ok(lease("me", 1, DB_BASE_MICROS, timing.lease_duration))));
    let deadline = drain(&mut m)
        .iter()
        .find_map(|o| match o {
            Output::TermStarted { deadline, .. } => Some(*deadline),
            _ => None,
        })
        .ok_or("no term after a granted lease")?;
    Ok((m, deadline))
}

/// The timing invariant: [`Timing::validate`] agrees with a direct reading
/// of DESIGN.md in 128-bit arithmetic (every duration nonzero and at most
/// [`MAX_DURATION`], margin below lease, the invariant), names the right
/// field, and — when it
/// accepts — a leader really can lose one renewal outright and still renew
/// before its deadline, shown by driving a [`Machine`] through exactly that.
pub fn timing_invariant(data: &[u8]) -> Result<(), String> {
    let mut r = Bytes::new(data);
    let t = Timing {
        lease_duration: duration(&mut r),
        renew_interval: duration(&mut r),
        retry_period: duration(&mut r),
        operation_timeout: duration(&mut r),
        safety_margin: duration(&mut r),
    };
    let seed = r.u64();
    let n = |d: Duration| d.as_nanos();
    let retry_delay = n(t.renew_interval / 4).max(50_000_000);
    ensure!(n(t.retry_delay()) == retry_delay, "retry_delay {:?} for {t:?}", t.retry_delay());
    let fields = [
        ("lease_duration", t.lease_duration),
        ("renew_interval", t.renew_interval),
        ("retry_period", t.retry_period),
        ("operation_timeout", t.operation_timeout),
        ("safety_margin", t.safety_margin),
    ];
    let expected = if let Some((f, _)) = fields.iter().find(|(_, d)| d.is_zero() || *d > MAX_DURATION) {
        Some(*f)
    } else if t.safety_margin >= t.lease_duration {
        Some("safety_margin")
    } else if n(t.renew_interval) + 2 * n(t.operation_timeout) + retry_delay > n(t.lease_duration) - n(t.safety_margin)
    {
        Some("renew_interval")
    } else {
        None
    };
    match (t.validate(), expected) {
        (Ok(()), None) => {}
        (Err(e), Some(f)) => {
            ensure!(e.field() == f, "{t:?}: validate names {}, expected {f}", e.field());
            let text = e.to_string();
            ensure!(text.starts_with("invalid config: ") && text.contains(f), "bad message {text:?}");
            return Ok(());
        }
        (got, want) => return Err(format!("{t:?}: validate says {got:?}, expected error on {want:?}")),
    }
    // Lose the first renewal outright, retry after retry_delay, and have the
    // second answered a microsecond inside the operation timeout (the
    // database's resolution).
    let t0 = LocalTime::from_duration(Duration::from_secs(3 * 86_400));
    let (mut m, deadline) = leader(t, seed, t0)?;
    // The database keeps microseconds: the ttl it reports is the one asked
    // for, truncated.
    let reported = Duration::from_micros(t.lease_duration.as_micros() as u64);
    let want = t0 + (reported.min(t.lease_duration).saturating_sub(t.safety_margin));
    ensure!(deadline == want, "deadline {deadline:?}, expected {want:?}");
    let first = m.poll_timeout().ok_or("no renewal scheduled")?;
    ensure!(first == t0 + t.renew_interval, "renewal at {first:?}, expected {:?}", t0 + t.renew_interval);
    m.handle_timeout(first);
    let call = only_call(&drain(&mut m)).ok_or("no renewal")?;
    ensure!(matches!(call.op, Op::Renew { fence: 1, .. }), "expected a renewal, got {:?}", call.op);
    let timeout = m.poll_timeout().ok_or("no timeout armed")?;
    ensure!(timeout == first + t.operation_timeout, "timeout at {timeout:?}");
    m.handle_timeout(timeout);
    let outs = drain(&mut m);
    ensure!(outs.iter().any(|o| matches!(o, Output::CallAbandoned(id) if *id == call.id)), "not abandoned: {outs:?}");
    ensure!(m.term().is_some(), "the term ended after one lost renewal: {outs:?}");
    let retry = m.poll_timeout().ok_or("no retry")?;
    ensure!(retry == timeout + t.retry_delay(), "retry at {retry:?}, expected {:?}", timeout + t.retry_delay());
    m.handle_timeout(retry);
    let call = only_call(&drain(&mut m)).ok_or("no second renewal")?;
    let answer = retry + t.operation_timeout.saturating_sub(Duration::from_micros(1));
    ensure!(answer < deadline, "invariant accepted but the retry answers at {answer:?}, deadline {deadline:?}");
    m.handle_reply(answer, call.id, Outcome::Lease(Ok(lease("me", 1, DB_BASE_MICROS + 1, t.lease_duration))));
    let outs = drain(&mut m);
    ensure!(
        outs.iter().any(|o| matches!(o, Output::DeadlineExtended { .. })),
        "second renewal did not extend the term: {outs:?}"
    );
    Ok(())
}

/// Lease maths: [`Lease::ttl`], [`Lease::expired`], [`Lease::held_by`] and
/// [`DbTime`] arithmetic against 128-bit references, and the machine's
/// deadline `sent_at + min(ttl reported, ttl asked) - safety_margin` (no term
/// when that is not after the reply).
pub fn lease_maths(data: &[u8]) -> Result<(), String> {
    let mut r = Bytes::new(data);
    let now = r.u64() as i64;
    let expires = if r.u8() & 1 == 0 { r.u64() as i64 } else { now.wrapping_add(i64::from(r.u16() as i16)) };
    let l = Lease {
        name: "n".into(),
        holder: "h".into(),
        fence: 1,
        acquired_at: DbTime::from_unix_micros(now),
        renewed_at: DbTime::from_unix_micros(now),
        expires_at: DbTime::from_unix_micros(expires),
        now: DbTime::from_unix_micros(now),
        payload: Vec::new(),
    };
    let diff = i128::from(expires) - i128::from(now);
    // Saturates at the largest span a DbTime can hold.
    let ttl = diff.clamp(0, i128::from(i64::MAX)) as u128;
    ensure!(l.ttl().as_micros() == ttl, "ttl {:?} for now {now} expires {expires}", l.ttl());
    ensure!(l.expired() == (expires <= now), "expired {} for now {now} expires {expires}", l.expired());
    ensure!(l.held_by("h") != l.expired() && !l.held_by("x"), "held_by");
    let d = duration(&mut r);
    // Any instant, before 1970 too: this target once found `saturating_add`
    // landing short of the end of the range from a negative instant.
    let sum = DbTime::from_unix_micros(now).saturating_add(d).as_unix_micros();
    let want = (i128::from(now) + i128::try_from(d.as_micros()).unwrap_or(i128::MAX)).min(i128::from(i64::MAX));
    ensure!(i128::from(sum) == want, "{now} + {d:?} = {sum}, expected {want}");

    // The machine's deadline.
    let asked = small_duration(&mut r);
    let reported = Duration::from_micros(u64::from(r.u16()) * 1_000 + u64::from(r.u8()));
    let margin = Duration::from_micros(u64::from(r.u16()) * 500);
    let sent = LocalTime::from_duration(Duration::from_nanos(r.u64() >> 2));
    let travel = Duration::from_micros(u64::from(r.u16()) * 1_000);
    let anchor_at_reply = r.u8() & 1 == 1;
    let timing = Timing {
        lease_duration: asked,
        renew_interval: asked,
        retry_period: Duration::from_secs(1),
        operation_timeout: Duration::from_secs(86_400),
        safety_margin: margin,
    };
    let mut cfg = MachineConfig::new("me", timing, 1);
    cfg.unsafe_anchor_at_reply = anchor_at_reply;
    let mut m = Machine::new(cfg);
    m.handle_timeout(sent);
    let call = only_call(&drain(&mut m)).ok_or("no first call")?;
    m.handle_reply(sent, call.id, Outcome::Lease(Err(StoreError::no_lease("fuzz"))));
    let call = only_call(&drain(&mut m)).ok_or("no acquire")?;
    ensure!(call.op == Op::Acquire { ttl: asked }, "expected acquire of {asked:?}, got {:?}", call.op);
    let reply_at = sent + travel;
    m.handle_reply(reply_at, call.id, Outcome::Lease(Ok(lease("me", 1, DB_BASE_MICROS, reported))));
    let started = drain(&mut m).iter().find_map(|o| match o {
        Output::TermStarted { deadline, fence, .. } => Some((*deadline, *fence)),
        _ => None,
    });
    let valid_for = reported.min(asked).saturating_sub(margin);
    let anchor = if anchor_at_reply { reply_at } else { sent };
    let expected = if valid_for.is_zero() || anchor + valid_for <= reply_at { None } else { Some(anchor + valid_for) };
    ensure!(
        started.map(|(d, _)| d) == expected,
        "sent {sent:?} reply {reply_at:?} asked {asked:?} reported {reported:?} margin {margin:?} \
         anchor_at_reply {anchor_at_reply}: term {started:?}, expected deadline {expected:?}"
    );
    if let Some((deadline, fence)) = started {
        ensure!(fence == 1, "fence {fence}");
        if !anchor_at_reply {
            ensure!(deadline.saturating_since(sent) <= asked, "deadline beyond the ttl asked for");
        }
        ensure!(m.is_leader(reply_at) && !m.is_leader(deadline), "is_leader disagrees with the deadline");
    }
    Ok(())
}

/// Follower and retry delays: [`jitter`] stays in `[0.8 d, 1.2 d)` and
/// [`spread`] in `[0.2 d, 1.2 d)`, both monotonic in both arguments; a
/// machine polls a retry period (jittered) after a failure, spreads its first
/// poll after a new leader, and polls when an observed lease runs out if
/// that is sooner. That poll inspects after one look at the lease; it claims
/// directly only after a second look found the same row unwritten for longer
/// than a renewing holder leaves it (`max(renew_interval, operation_timeout)
/// + operation_timeout`), and a look that finds the lease expired claims at
/// once. A leader retries a failed renewal after exactly `retry_delay`.
pub fn delays(data: &[u8]) -> Result<(), String> {
    let mut r = Bytes::new(data);
    let d = Duration::from_nanos(r.u64() >> (r.u8() % 64));
    let (r1, r2) = (r.u64(), r.u64());
    let n = d.as_nanos();
    for x in [r1, r2] {
        let j = jitter(d, x).as_nanos();
        ensure!(j >= n * 4 / 5 && j <= n * 4 / 5 + n * 2 / 5, "jitter({d:?}, {x}) = {j}ns");
        if n >= 10 {
            ensure!(j < n * 6 / 5 + 1, "jitter({d:?}, {x}) = {j}ns reaches 1.2 d");
        }
    }
    let (lo, hi) = (r1.min(r2), r1.max(r2));
    ensure!(jitter(d, lo) <= jitter(d, hi), "jitter not monotonic in r");
    let d2 = d + Duration::from_nanos(u64::from(r.u16()));
    ensure!(jitter(d, r1) <= jitter(d2, r1), "jitter not monotonic in d");
    for x in [r1, r2] {
        let j = spread(d, x).as_nanos();
        ensure!(j >= n / 5 && j <= n / 5 + n, "spread({d:?}, {x}) = {j}ns");
        if n >= 10 {
            ensure!(j < n * 6 / 5 + 1, "spread({d:?}, {x}) = {j}ns reaches 1.2 d");
        }
    }
    ensure!(spread(d, lo) <= spread(d, hi), "spread not monotonic in r");
    ensure!(spread(d, r1) <= spread(d2, r1), "spread not monotonic in d");

    // A follower's polls.
    let lease_d = small_duration(&mut r) * 4;
    let timing = Timing {
        lease_duration: lease_d,
        renew_interval: lease_d / 4,
        retry_period: small_duration(&mut r),
        operation_timeout: lease_d / 8,
        safety_margin: lease_d / 10,
    };
    let p = timing.retry_period;
    let seed = r.u64();
    let t0 = LocalTime::from_duration(Duration::from_secs(86_400) + small_duration(&mut r));
    let mut m = Machine::new(MachineConfig::new("me", timing, seed));
    m.handle_timeout(t0);
    let call = only_call(&drain(&mut m)).ok_or("no first call")?;
    m.handle_reply(t0, call.id, Outcome::Lease(Err(StoreError::retryable("down"))));
    drain(&mut m);
    let next = m.poll_timeout().ok_or("no poll after a failure")?.saturating_since(t0);
    ensure!(next >= scale(p, 4, 5) && next <= scale(p, 6, 5), "poll {next:?} after a failure, retry period {p:?}");
    let now = t0 + next;
    m.handle_timeout(now);
    let call = only_call(&drain(&mut m)).ok_or("no poll")?;
    let left = Duration::from_micros(u64::from(r.u16()) * 100);
    // The row was written `age` before this look.
    let age = Duration::from_micros(u64::from(r.u16()) * 100);
    let mut row = lease("other", 3, DB_BASE_MICROS, left);
    row.renewed_at = DbTime::from_unix_micros(DB_BASE_MICROS - age.as_micros() as i64);
    row.acquired_at = row.renewed_at;
    m.handle_reply(now, call.id, Outcome::Lease(Ok(row.clone())));
    // An expired lease is claimable: campaign at once.
    claims_if_expired(&drain(&mut m), left.is_zero(), "an expired lease")?;
    if !left.is_zero() {
        // The first poll after a new leader spreads over 0.2 to 1.2 periods,
        // or comes at the lease's expiry if that is sooner. After one look
        // it inspects, at the expiry too: the holder may have renewed.
        let wait = m.poll_timeout().ok_or("no poll after seeing a leader")?.saturating_since(now);
        let (min, max) = (scale(p, 1, 5).min(left), scale(p, 6, 5).min(left));
        ensure!(wait >= min && wait <= max, "poll {wait:?} after a lease with {left:?} left, period {p:?}");
        let now = now + wait;
        m.handle_timeout(now);
        let call = only_call(&drain(&mut m)).ok_or("no call when the poll fired")?;
        ensure!(call.op == Op::Inspect, "a follower's poll after one look sent {:?}", call.op);
        // The second look finds the same row, unwritten since.
        row.now = DbTime::from_unix_micros(DB_BASE_MICROS + wait.as_micros() as i64);
        m.handle_reply(now, call.id, Outcome::Lease(Ok(row.clone())));
        claims_if_expired(&drain(&mut m), row.expired(), "the lease expire")?;
        if !row.expired() {
            let left = row.ttl();
            let unwritten = row.now.saturating_duration_since(row.renewed_at);
            let stalled = unwritten > timing.renew_interval.max(timing.operation_timeout) + timing.operation_timeout;
            let wait = m.poll_timeout().ok_or("no poll after a second look")?.saturating_since(now);
            let (min, max) = (scale(p, 4, 5).min(left), scale(p, 6, 5).min(left));
            ensure!(wait >= min && wait <= max, "poll {wait:?} after a lease with {left:?} left, period {p:?}");
            m.handle_timeout(now + wait);
            let call = only_call(&drain(&mut m)).ok_or("no call when the poll fired")?;
            let claims = matches!(call.op, Op::Acquire { .. });
            // (A drawn delay exactly equal to what is left may do either.)
            ensure!(
                !claims || (wait == left && stalled),
                "{:?} by a poll {wait:?} after a lease with {left:?} left, unwritten for {unwritten:?}",
                call.op
            );
            ensure!(
                claims || wait < left || left >= scale(p, 4, 5) || !stalled,
                "{:?} at the expiry ({left:?} left) of a row unwritten for {unwritten:?}, not a claim",
                call.op
            );
            ensure!(claims || call.op == Op::Inspect, "a follower's poll sent {:?}", call.op);
        }
    }

    // A leader's retry after a failed renewal.
    let (mut m, deadline) = leader(timing, seed, t0)?;
    let at = m.poll_timeout().ok_or("no renewal")?;
    m.handle_timeout(at);
    let call = only_call(&drain(&mut m)).ok_or("no renewal call")?;
    m.handle_reply(at, call.id, Outcome::Lease(Err(StoreError::retryable("blip"))));
    drain(&mut m);
    let retry = m.poll_timeout().ok_or("no retry")?;
    let want = (at + timing.retry_delay()).min(deadline);
    ensure!(retry == want, "retry at {retry:?}, expected {want:?}");
    Ok(())
}

/// Identifier quoting: each quoter accepts exactly the names its server
/// would, the quoted form round-trips, and the only quoted forms `unquote_*`
/// accepts are the ones the quoter produces.
pub fn ident_quoting(data: &[u8]) -> Result<(), String> {
    let (kind, rest) = data.split_first().unwrap_or((&0, &[]));
    let name = String::from_utf8_lossy(rest).into_owned();
    let pg_ok = !name.is_empty() && name.len() <= MAX_POSTGRES_IDENT && !name.contains('\0');
    match quote_postgres("table", &name) {
        Ok(q) => {
            ensure!(pg_ok, "postgres accepted {name:?}");
            ensure!(q.starts_with('"') && q.ends_with('"') && q.len() >= 2, "postgres quoted {name:?} as {q:?}");
            ensure!(
                unquote_postgres(&q).as_deref() == Some(name.as_str()),
                "postgres round trip of {name:?} via {q:?}"
            );
            ensure!(q[1..q.len() - 1].replace("\"\"", "").find('"').is_none(), "lone quote in {q:?}");
        }
        Err(e) => {
            ensure!(!pg_ok, "postgres refused {name:?}: {e}");
            ensure!(e.to_string().starts_with("invalid table name: "), "message {e}");
        }
    }
    let my_ok = !name.is_empty()
        && name.chars().count() <= MAX_MYSQL_IDENT
        && !name.contains('\0')
        && !name.ends_with(' ')
        && name.chars().all(|c| u32::from(c) <= 0xFFFF);
    match quote_mysql("schema", &name) {
        Ok(q) => {
            ensure!(my_ok, "mysql accepted {name:?}");
            ensure!(unquote_mysql(&q).as_deref() == Some(name.as_str()), "mysql round trip of {name:?} via {q:?}");
        }
        Err(e) => ensure!(!my_ok, "mysql refused {name:?}: {e}"),
    }
    // The same text as a string literal (how the PostgreSQL store writes
    // names and identities): it reads back as itself and cannot end early.
    match quote_postgres_literal("value", &name) {
        Ok(q) => ensure!(
            unquote_postgres_literal(&q).as_deref() == Some(name.as_str()),
            "literal round trip of {name:?} via {q:?}"
        ),
        Err(e) => ensure!(name.contains('\0'), "literal refused {name:?}: {e}"),
    }
    // Arbitrary text handed to the unquoters: whatever they accept must be
    // what quoting gives back.
    type Text = fn(&str) -> Option<String>;
    let (unquote, quote): (Text, Text) = if kind & 1 == 0 {
        (unquote_postgres, |s| quote_postgres("t", s).ok())
    } else {
        (unquote_mysql, |s| quote_mysql("t", s).ok())
    };
    if let Some(inner) = unquote(&name) {
        if let Some(again) = quote(&inner) {
            ensure!(again == name, "{name:?} unquotes to {inner:?}, which quotes to {again:?}");
        }
    }
    Ok(())
}

/// The store contract, from DESIGN.md section 3, as a small model.
#[derive(Clone, Debug)]
struct ModelRow {
    holder: String,
    fence: u64,
    acquired_at: i64,
    renewed_at: i64,
    expires_at: i64,
    payload: Vec<u8>,
}

#[derive(Default)]
struct Model {
    rows: BTreeMap<String, ModelRow>,
    now: i64,
    failing: Option<ErrorKind>,
    stats: MemStats,
}

impl Model {
    fn lease(&self, name: &str) -> Option<Lease> {
        self.rows.get(name).map(|r| Lease {
            name: name.into(),
            holder: r.holder.clone(),
            fence: r.fence,
            acquired_at: DbTime::from_unix_micros(r.acquired_at),
            renewed_at: DbTime::from_unix_micros(r.renewed_at),
            expires_at: DbTime::from_unix_micros(r.expires_at),
            now: DbTime::from_unix_micros(self.now),
            payload: r.payload.clone(),
        })
    }

    fn failure(&self) -> Option<StoreError> {
        self.failing.map(|k| if k == ErrorKind::Fatal { StoreError::fatal("f") } else { StoreError::retryable("r") })
    }

    fn acquire(&mut self, name: &str, id: &str, ttl: i64, payload: &[u8]) -> Result<Lease, StoreError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.stats.acquires += 1;
        let now = self.now;
        // A new term: above the previous fence and at least the clock in µs.
        let clock = u64::try_from(now).unwrap_or(0).max(1);
        let fresh = |fence| ModelRow {
            holder: id.into(),
            fence,
            acquired_at: now,
            renewed_at: now,
            expires_at: now.saturating_add(ttl),
            payload: payload.to_vec(),
        };
        match self.rows.get_mut(name) {
            None => {
                self.rows.insert(name.into(), fresh(clock));
                self.stats.writes += 1;
            }
            Some(r) if r.expires_at <= now => {
                *r = fresh((r.fence + 1).max(clock));
                self.stats.writes += 1;
            }
            Some(r) if r.holder == id && r.renewed_at <= now => {
                r.renewed_at = now;
                r.expires_at = r.expires_at.max(now.saturating_add(ttl));
                r.payload = payload.to_vec();
                self.stats.writes += 1;
            }
            Some(_) => {}
        }
        Ok(self.lease(name).expect("row exists"))
    }

    fn renew(&mut self, name: &str, id: &str, fence: u64, ttl: i64, payload: &[u8]) -> Result<Lease, StoreError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.stats.renews += 1;
        let now = self.now;
        match self.rows.get_mut(name) {
            Some(r) if r.holder == id && r.fence == fence && r.expires_at > now && r.renewed_at <= now => {
                r.renewed_at = now;
                r.expires_at = r.expires_at.max(now.saturating_add(ttl));
                r.payload = payload.to_vec();
                self.stats.writes += 1;
                Ok(self.lease(name).expect("row exists"))
            }
            _ => Err(StoreError::lease_lost()),
        }
    }

    fn release(&mut self, name: &str, id: &str, fence: u64) -> Result<(), StoreError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.stats.releases += 1;
        let now = self.now;
        if let Some(r) = self.rows.get_mut(name) {
            if r.holder == id && r.fence == fence && r.expires_at > now {
                r.expires_at = now;
                r.renewed_at = r.renewed_at.max(now);
                self.stats.writes += 1;
            }
        }
        Ok(())
    }

    fn inspect(&mut self, name: &str) -> Result<Lease, StoreError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.stats.inspects += 1;
        self.lease(name).ok_or_else(|| StoreError::no_lease(name))
    }
}

fn same<T: PartialEq + std::fmt::Debug>(
    what: &str, got: &Result<T, StoreError>, want: &Result<T, StoreError>,
) -> Result<(), String> {
    let ok = match (got, want) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.kind() == b.kind(),
        _ => false,
    };
    ensure!(ok, "{what}: memstore gave {got:?}, the model {want:?}");
    Ok(())
}

/// Random operation sequences against [`MemStore`] (on a manual clock),
/// checked call by call against a reference model of the store contract:
/// every returned lease, every error kind, the stored rows and the counters.
pub fn memstore_model(data: &[u8]) -> Result<(), String> {
    let mut r = Bytes::new(data);
    let store = MemStore::with_manual_clock(DbTime::from_unix_micros(DB_BASE_MICROS));
    let mut model = Model { now: DB_BASE_MICROS, ..Model::default() };
    let names = ["jobs", "billing"];
    let ids = ["a", "b", "c"];
    let t = Duration::from_secs(1);
    let mut fences: BTreeMap<&str, u64> = BTreeMap::new();
    let mut steps = 0;
    while r.remaining() > 0 && steps < 512 {
        steps += 1;
        let op = r.u8();
        let name = names[usize::from(op >> 4) % 2];
        let id = ids[usize::from(op >> 5) % 3];
        let ttl_us = i64::from(r.u16()) * 1_000 + i64::from(r.u8() % 4);
        let ttl = Duration::from_micros(ttl_us as u64);
        let payload = [op, steps as u8];
        match op % 8 {
            0 => {
                let d = i64::from(r.u16()) * 100;
                store.advance(Duration::from_micros(d as u64));
                model.now += d;
            }
            1 | 2 => {
                let got = store.acquire(name, id, ttl, &payload, t);
                let want = model.acquire(name, id, ttl_us, &payload);
                same("acquire", &got, &want)?;
            }
            3 => {
                let current = model.rows.get(name).map_or(1, |r| r.fence);
                let fence = current.saturating_add(u64::from(r.u8() % 3)).saturating_sub(1);
                let got = store.renew(name, id, fence, ttl, &payload, t);
                let want = model.renew(name, id, fence, ttl_us, &payload);
                same("renew", &got, &want)?;
            }
            4 => {
                let current = model.rows.get(name).map_or(1, |r| r.fence);
                let fence = current.saturating_add(u64::from(r.u8() % 3)).saturating_sub(1);
                let got = store.release(name, id, fence, t);
                let want = model.release(name, id, fence);
                same("release", &got, &want)?;
            }
            5 | 6 => {
                let got = store.inspect(name, t);
                let want = model.inspect(name);
                same("inspect", &got, &want)?;
            }
            _ => {
                let kind = match r.u8() % 4 {
                    0 => Some(ErrorKind::Fatal),
                    1 => Some(ErrorKind::Retryable),
                    _ => None,
                };
                store.set_failing(kind);
                model.failing = kind;
            }
        }
        for n in names {
            let got = store.peek(n);
            let want = model.lease(n);
            ensure!(got == want, "row {n}: memstore {got:?}, model {want:?}");
            if let Some(l) = got {
                let last = fences.entry(n).or_insert(0);
                ensure!(l.fence >= *last, "fence of {n} went from {last} to {}", l.fence);
                *last = l.fence;
            }
        }
        ensure!(store.now() == DbTime::from_unix_micros(model.now), "clock {:?} vs {}", store.now(), model.now);
        ensure!(store.stats() == model.stats, "stats {:?}, model {:?}", store.stats(), model.stats);
    }
    Ok(())
}

/// The simulation: the schedule these bytes decode to must satisfy every
/// property of the oracle.
pub fn simulation(data: &[u8]) -> Result<(), String> {
    let schedule = Schedule::from_bytes(data, Variant::Normal);
    let report = run(&schedule, false);
    match report.violation {
        None => Ok(()),
        Some(_) => Err(super::describe_failure(None, &schedule)),
    }
}
