//! What the state machine keeps of each lease it reads.
//!
//! A group runs thousands of machines on a few threads, and each reads its
//! lease about once a second. An allocation a machine makes while handling
//! a reading and keeps until the next one (a copy of the holder's identity,
//! say) is small and long-lived, made among the batch's large short-lived
//! buffers on the same thread: with glibc's allocator thousands of them a
//! second pinned the heap's pages, and a process running 10,000 elections
//! grew without bound (BENCHMARKS.md, row 8). So once a machine has read a
//! lease, reading it again with the same holder must keep nothing new.
//!
//! This binary counts, with an allocator of its own, the allocations made
//! on the test's thread inside the machine's methods that are still live
//! when the method returns. Pure: a fake clock and a MemStore.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::time::Duration;

use leaderelection::machine::{LocalTime, Machine, MachineConfig, Output};
use leaderelection::{DbTime, MemStore, Timing};

mod tracking;
use tracking::hook;

struct Counting;

#[global_allocator]
static ALLOC: Counting = Counting;

thread_local! {
    /// Recording: inside a machine method on this thread.
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Allocations made while recording and not freed since.
    static LIVE: RefCell<HashSet<usize>> = RefCell::new(HashSet::new());
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            hook(|| {
                if ON.with(Cell::get) {
                    LIVE.with(|l| l.borrow_mut().insert(p as usize));
                }
            });
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        hook(|| {
            let _ = LIVE.try_with(|l| l.borrow_mut().remove(&(p as usize)));
        });
        // SAFETY: as the caller promised for `p` and `layout`.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised; the new block is recorded like an
        // allocation (when recording), the old one forgotten like a free.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            hook(|| {
                let _ = LIVE.try_with(|l| {
                    let mut l = l.borrow_mut();
                    let was = l.remove(&(p as usize));
                    if was || ON.with(Cell::get) {
                        l.insert(q as usize);
                    }
                });
            });
        }
        q
    }
}

/// Runs `f` recording; how many of the allocations it made it kept.
fn kept_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.with(|l| l.borrow_mut().clear());
    ON.with(|o| o.set(true));
    let out = f();
    ON.with(|o| o.set(false));
    (out, LIVE.with(|l| l.borrow().len()))
}

const NAME: &str = "steady";
const TIMEOUT: Duration = Duration::from_secs(3);

/// One machine against a MemStore on a fake clock: every call it asks for
/// is answered after `RTT`, and `kept` sums the allocations the machine's
/// methods kept once `counting` is on.
struct Rig {
    m: Machine,
    store: MemStore,
    id: String,
    payload: Vec<u8>,
    now: LocalTime,
    counting: bool,
    kept: usize,
    readings: usize,
}

const RTT: Duration = Duration::from_millis(10);

impl Rig {
    fn new(id: &str, payload: &[u8], store: MemStore) -> Rig {
        let m = Machine::new(MachineConfig::new(id, Timing::default(), 7));
        Rig {
            m,
            store,
            id: id.into(),
            payload: payload.to_vec(),
            now: LocalTime::from_duration(Duration::from_secs(5)),
            counting: false,
            kept: 0,
            readings: 0,
        }
    }

    fn count<T>(&mut self, f: impl FnOnce(&mut Machine) -> T) -> T {
        let (out, kept) = kept_by(|| f(&mut self.m));
        if self.counting {
            self.kept += kept;
        }
        out
    }

    /// Runs the machine until `until` (local), answering its calls.
    fn run_until(&mut self, until: LocalTime) {
        loop {
            let now = self.now;
            self.count(|m| m.handle_timeout(now));
            let outputs: Vec<Output> = std::iter::from_fn(|| self.count(Machine::poll_output)).collect();
            let mut answered = false;
            for out in outputs {
                if let Output::Call(c) = out {
                    self.store.advance(RTT / 2);
                    let outcome = c.op.run(&self.store, NAME, &self.id, &self.payload, TIMEOUT);
                    self.store.advance(RTT / 2);
                    self.now = self.now + RTT;
                    let now = self.now;
                    self.count(|m| m.handle_reply(now, c.id, outcome));
                    self.readings += 1;
                    answered = true;
                }
            }
            if answered {
                continue;
            }
            let next = self.m.poll_timeout().unwrap_or(until).min(until);
            if next <= self.now {
                if self.now >= until {
                    return;
                }
                continue;
            }
            self.store.advance(next.saturating_since(self.now));
            self.now = next;
        }
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A leader renewing, and a follower reading the leader's lease: after the
/// first minute, a further ten minutes of readings keep nothing new.
fn steady_kept(payload: &[u8]) -> (usize, usize, usize, usize) {
    let store = MemStore::with_manual_clock(DbTime::from_unix_micros(1_700_000_000_000_000));
    let mut leader = Rig::new("leader", payload, store.clone());
    let mut follower = Rig::new("follower", b"", store);
    let mut t = secs(0);
    let mut step = |leader: &mut Rig, follower: &mut Rig, until: Duration| {
        while t < until {
            t += Duration::from_millis(100);
            leader.run_until(LocalTime::from_duration(secs(5) + t));
            follower.now = leader.now;
            follower.run_until(LocalTime::from_duration(secs(5) + t));
        }
    };
    step(&mut leader, &mut follower, secs(60));
    assert!(leader.m.term().is_some(), "the leader leads");
    assert!(follower.m.term().is_none(), "the follower follows");
    let observed = follower.m.observed().expect("the follower has read the lease");
    assert_eq!(observed.identity, "leader");
    assert_eq!(observed.payload, payload);
    leader.counting = true;
    follower.counting = true;
    let (r0, f0) = (leader.readings, follower.readings);
    step(&mut leader, &mut follower, secs(660));
    assert!(leader.m.term().is_some(), "still leading");
    (leader.kept, leader.readings - r0, follower.kept, follower.readings - f0)
}

#[test]
fn reading_the_same_lease_again_keeps_nothing_new() {
    for payload in [&b""[..], b"http://10.0.0.7:8080"] {
        let (lk, lr, fk, fr) = steady_kept(payload);
        eprintln!(
            "payload {} bytes: leader kept {lk} allocations over {lr} renewals, follower {fk} over {fr} looks",
            payload.len()
        );
        assert!(lr >= 100 && fr >= 100, "too few readings to judge: {lr} renewals, {fr} looks");
        assert_eq!(lk, 0, "the leader's machine kept {lk} new allocations over {lr} renewals of its own lease");
        assert_eq!(fk, 0, "the follower's machine kept {fk} new allocations over {fr} looks at an unchanged lease");
    }
}

/// The negative control: the count does see an allocation a method keeps.
#[test]
fn the_count_sees_what_is_kept() {
    let mut keep: Vec<String> = Vec::new();
    let ((), kept) = kept_by(|| keep.push(format!("{}#{}", "holder", 42)));
    assert!(kept >= 2, "a string and the vector that holds it: counted {kept}");
    let ((), kept) = kept_by(|| drop(format!("{}#{}", "holder", 43)));
    assert_eq!(kept, 0, "what is freed before the end is not counted");
}
