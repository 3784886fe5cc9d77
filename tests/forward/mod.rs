//! `forward_calls!`: the calls a test's wrapper store hands to the store
//! inside, written once. A wrapper implements the calls its test is about
//! and forwards the rest with one line, naming exactly which: a call it
//! does not name keeps the `Store` trait's default, so a store of the four
//! required calls still has only those four (its defaults are what some
//! tests check).
//!
//! ```ignore
//! impl Store for Plain {
//!     forward_calls!(inner => acquire, renew, release, inspect);
//!     fn heartbeat(..) { .. } // the call the test is about
//! }
//! impl Store for Panicky {
//!     forward_calls!(inner via Self::checked => acquire, renew, release, inspect, acquire_many, ..);
//! }
//! ```
//!
//! `via HOOK` hooks each forwarded call: it becomes
//! `HOOK(self, "acquire", timeout, || self.inner.acquire(..))`, so the hook
//! (`fn<T>(&self, call: &'static str, timeout: Duration, f: impl FnOnce() -> T) -> T`,
//! or narrower where only calls answering a `Result` go through it) can
//! delay, count, fail or panic around any call it picks by name.
#![allow(unused_macros, unused_imports)]

/// Inside `impl Store for W`: `forward_calls!(FIELD => call, ..)` or
/// `forward_calls!(FIELD via HOOK => call, ..)`.
/// `FIELD` is the wrapper's field holding the inner store (`inner`, `0`).
macro_rules! forward_calls {
    // One call: its parameters (the last one its timeout) and its answer,
    // handed on as it is or through the hook in brackets.
    (@fn $f:tt []; $call:ident($($arg:ident: $ty:ty),*) $t:ident -> $ret:ty) => {
        fn $call(&self, $($arg: $ty),*) -> $ret {
            self.$f.$call($($arg),*)
        }
    };
    (@fn $f:tt [$hook:path]; $call:ident($($arg:ident: $ty:ty),*) $t:ident -> $ret:ty) => {
        fn $call(&self, $($arg: $ty),*) -> $ret {
            $hook(self, stringify!($call), $t, || self.$f.$call($($arg),*))
        }
    };
    (@sig $f:tt $h:tt; acquire) => { forward_calls!(@fn $f $h; acquire(name: &str, identity: &str, ttl: ::std::time::Duration, payload: &[u8], timeout: ::std::time::Duration) timeout -> Result<::leaderelection::Lease, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; renew) => { forward_calls!(@fn $f $h; renew(name: &str, identity: &str, fence: u64, ttl: ::std::time::Duration, payload: &[u8], timeout: ::std::time::Duration) timeout -> Result<::leaderelection::Lease, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; release) => { forward_calls!(@fn $f $h; release(name: &str, identity: &str, fence: u64, timeout: ::std::time::Duration) timeout -> Result<(), ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; inspect) => { forward_calls!(@fn $f $h; inspect(name: &str, timeout: ::std::time::Duration) timeout -> Result<::leaderelection::Lease, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; claim_slot) => { forward_calls!(@fn $f $h; claim_slot(name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: ::std::time::Duration) timeout -> Result<::leaderelection::SlotClaim, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; finish_slot) => { forward_calls!(@fn $f $h; finish_slot(name: &str, fence: u64, slot: &str, outcome: i32, timeout: ::std::time::Duration) timeout -> Result<bool, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; acquire_many) => { forward_calls!(@fn $f $h; acquire_many(identity: &str, ttl: ::std::time::Duration, items: &[::leaderelection::BatchItem<'_>], timeout: ::std::time::Duration) timeout -> Vec<Result<::leaderelection::Lease, ::leaderelection::StoreError>>); };
    (@sig $f:tt $h:tt; renew_many) => { forward_calls!(@fn $f $h; renew_many(identity: &str, ttl: ::std::time::Duration, items: &[::leaderelection::BatchItem<'_>], timeout: ::std::time::Duration) timeout -> Vec<Result<::leaderelection::Lease, ::leaderelection::StoreError>>); };
    (@sig $f:tt $h:tt; renew_many_with_heartbeat) => { forward_calls!(@fn $f $h; renew_many_with_heartbeat(identity: &str, ttl: ::std::time::Duration, items: &[::leaderelection::BatchItem<'_>], beat: ::leaderelection::Heartbeat<'_>, timeout: ::std::time::Duration) timeout -> (Vec<Result<::leaderelection::Lease, ::leaderelection::StoreError>>, Result<::leaderelection::Members, ::leaderelection::StoreError>)); };
    (@sig $f:tt $h:tt; release_many) => { forward_calls!(@fn $f $h; release_many(identity: &str, items: &[::leaderelection::BatchItem<'_>], timeout: ::std::time::Duration) timeout -> Vec<Result<(), ::leaderelection::StoreError>>); };
    (@sig $f:tt $h:tt; inspect_many) => { forward_calls!(@fn $f $h; inspect_many(names: &[&str], timeout: ::std::time::Duration) timeout -> Vec<Result<::leaderelection::Lease, ::leaderelection::StoreError>>); };
    (@sig $f:tt $h:tt; heartbeat) => { forward_calls!(@fn $f $h; heartbeat(group: &str, member: &str, leading: u32, ttl: ::std::time::Duration, timeout: ::std::time::Duration) timeout -> Result<::leaderelection::Members, ::leaderelection::StoreError>); };
    (@sig $f:tt $h:tt; leave_group) => { forward_calls!(@fn $f $h; leave_group(group: &str, member: &str, timeout: ::std::time::Duration) timeout -> Result<(), ::leaderelection::StoreError>); };
    // No timeout and nothing to hook: the feed is handed on as it is.
    (@sig $f:tt $h:tt; releases) => {
        fn releases(&self) -> Option<::crossbeam_channel::Receiver<::leaderelection::Released>> {
            self.$f.releases()
        }
    };
    (@each $f:tt $h:tt; $($call:ident),+) => { $(forward_calls!(@sig $f $h; $call);)+ };
    ($f:tt $(via $hook:path)? => $($call:ident),+ $(,)?) => { forward_calls!(@each $f [$($hook)?]; $($call),+); };
}
pub(crate) use forward_calls;
