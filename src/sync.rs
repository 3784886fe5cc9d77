//! The atomics and the lock a term's hand-off is built from, swapped for
//! loom's under `cfg(loom)` so the model tests in `guard.rs` and
//! `handoff_loom.rs` explore every interleaving of the code the elector runs
//! (`RUSTFLAGS="--cfg loom" cargo test --release --lib loom`).
//!
//! Normally [`Mutex`] and [`Condvar`] are parking_lot's. Under loom they are
//! thin wrappers over loom's with the same few methods the elector calls
//! (`lock`, `wait`, `wait_until`, `notify_all`), so no caller changes.
//!
//! A [`Link`] is the sending end of the elector's command channel: normally
//! crossbeam's `Sender` itself. Loom cannot see the ordering crossbeam's
//! channel gives (a send happens before the receive that takes it), so under
//! loom a `Link` also counts its sends on a loom atomic; a model's receiver
//! reads the count first and takes no more messages than it saw counted.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex};

#[cfg(loom)]
pub(crate) use self::model::{Condvar, Mutex, MutexGuard};

/// The sending end of the command channel (see the module docs).
#[cfg(not(loom))]
pub(crate) type Link<T> = crossbeam_channel::Sender<T>;

/// A command channel's sender as a [`Link`].
#[cfg(not(loom))]
pub(crate) fn link<T>(tx: crossbeam_channel::Sender<T>) -> Link<T> {
    tx
}

#[cfg(loom)]
pub(crate) use self::model::{link, Link};

#[cfg(loom)]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::sync::Arc;
    use std::time::Instant;

    use loom::sync::atomic::{AtomicUsize, Ordering};

    /// crossbeam's `Sender`, counting its sends where loom can see them.
    pub(crate) struct Link<T> {
        tx: crossbeam_channel::Sender<T>,
        pub(crate) sent: Arc<AtomicUsize>,
    }

    pub(crate) fn link<T>(tx: crossbeam_channel::Sender<T>) -> Link<T> {
        Link { tx, sent: Arc::new(AtomicUsize::new(0)) }
    }

    impl<T> Link<T> {
        /// Counts, then sends: nothing else of loom's runs in between, so a
        /// count read with `Acquire` covers messages already in the channel.
        pub(crate) fn send(&self, msg: T) -> Result<(), crossbeam_channel::SendError<T>> {
            self.sent.fetch_add(1, Ordering::Release);
            self.tx.send(msg)
        }
    }

    impl<T> Clone for Link<T> {
        fn clone(&self) -> Link<T> {
            Link { tx: self.tx.clone(), sent: Arc::clone(&self.sent) }
        }
    }

    /// parking_lot's `Mutex` API over loom's: no poisoning.
    #[derive(Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard keeps loom's in an `Option` so [`Condvar::wait`] can hand it
    /// to loom by value and put it back.
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard is held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard is held")
        }
    }

    /// parking_lot's `WaitTimeoutResult`: loom never times out.
    pub(crate) struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub(crate) fn timed_out(&self) -> bool {
            self.0
        }
    }

    /// parking_lot's `Condvar` API over loom's. Loom has no time: a timed
    /// wait is a wait, woken only by a notification.
    #[derive(Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Condvar {
            Condvar(loom::sync::Condvar::new())
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard.0.take().expect("guard is held");
            guard.0 = Some(self.0.wait(held).unwrap_or_else(|e| e.into_inner()));
        }

        pub(crate) fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _deadline: Instant) -> WaitTimeoutResult {
            self.wait(guard);
            WaitTimeoutResult(false)
        }
    }
}
