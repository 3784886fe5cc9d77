//! The atomics a term's state is built from, swapped for loom's under
//! `cfg(loom)` so the model tests in `guard.rs` explore every interleaving
//! of the code the elector runs (`RUSTFLAGS="--cfg loom" cargo test --release
//! --lib loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
