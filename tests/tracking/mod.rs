//! An allocator for tests that ask what a kind of thread leaves behind
//! (`group_allocations.rs`, `mysql_memory.rs`): the system allocator,
//! recording the address of every allocation made on a thread of the given
//! name while [`start`] is in force, and forgetting it when it is freed (on
//! any thread). A binary declares its own:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: tracking::Tracking = tracking::Tracking { thread: "le-mysql-call" };
//! ```
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub struct Tracking {
    /// The name of the threads whose allocations are recorded.
    pub thread: &'static str,
}

static TRACKING: AtomicBool = AtomicBool::new(false);
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// One test at a time: the count is the process's.
pub static SERIAL: Mutex<()> = Mutex::new(());

thread_local! {
    /// Inside the allocator's own bookkeeping (its allocations are not
    /// recorded, and it must not take the lock again).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// 0 not known yet, 1 a thread of the name, 2 another thread.
    static NAMED: Cell<u8> = const { Cell::new(0) };
}

/// Records from now on.
pub fn start() {
    TRACKING.store(true, Ordering::SeqCst);
}

/// Records nothing more (what was recorded is still forgotten as it is
/// freed).
pub fn stop() {
    TRACKING.store(false, Ordering::SeqCst);
}

/// Allocations recorded and not freed since.
pub fn live() -> usize {
    LIVE.lock().unwrap().as_ref().map_or(0, HashSet::len)
}

impl Tracking {
    fn on_named_thread(&self) -> bool {
        match NAMED.with(Cell::get) {
            1 => true,
            2 => false,
            _ => {
                // The name's lookup may allocate: inside the hook, not recorded.
                let yes = std::thread::current().name() == Some(self.thread);
                NAMED.with(|c| c.set(if yes { 1 } else { 2 }));
                yes
            }
        }
    }
}

/// Runs `f` unless already inside the hook on this thread (or the thread is
/// being torn down): an allocator's bookkeeping, which may allocate itself.
/// `machine_allocations.rs`'s own allocator uses it too.
pub fn hook(f: impl FnOnce()) {
    if IN_HOOK.try_with(|h| h.replace(true)) == Ok(false) {
        f();
        IN_HOOK.with(|h| h.set(false));
    }
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && TRACKING.load(Ordering::Relaxed) {
            hook(|| {
                if self.on_named_thread() {
                    if let Ok(mut live) = LIVE.lock() {
                        live.get_or_insert_with(HashSet::new).insert(p as usize);
                    }
                }
            });
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        hook(|| {
            if let Ok(mut live) = LIVE.lock() {
                if let Some(set) = live.as_mut() {
                    set.remove(&(p as usize));
                }
            }
        });
        // SAFETY: as the caller promised for `p` and `layout`.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised; a new block is recorded like an
        // allocation, the old one forgotten like a free.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            hook(|| {
                if let Ok(mut live) = LIVE.lock() {
                    let set = live.get_or_insert_with(HashSet::new);
                    let was = set.remove(&(p as usize));
                    if was || (TRACKING.load(Ordering::Relaxed) && self.on_named_thread()) {
                        set.insert(q as usize);
                    }
                }
            });
        }
        q
    }
}

/// For a negative control: `n` strings made, while recording, on a thread
/// named `thread`, and handed back to the caller, who keeps them.
pub fn strings_made_on(thread: &str, n: usize) -> Vec<String> {
    start();
    let kept = std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || (0..n).map(|i| format!("left behind {i}")).collect())
        .unwrap()
        .join()
        .unwrap();
    stop();
    kept
}
