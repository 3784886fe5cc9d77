//! The subscribers of a feed of releases ([`Store::releases`](crate::Store::releases)),
//! shared by the stores that keep one: each subscriber has a bounded
//! channel, a release goes to every subscriber with room (a full channel
//! loses it: the feed is a hint), and a subscriber whose receiver is gone
//! is forgotten at the next release.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::store::Released;

/// How many released names a subscriber's channel holds; more are dropped
/// until it reads.
pub(crate) const CHANNEL_ROOM: usize = 1024;

#[derive(Default)]
pub(crate) struct Subscribers(Mutex<Vec<Sender<Released>>>);

impl Subscribers {
    /// A new subscriber's receiver.
    pub(crate) fn subscribe(&self) -> Receiver<Released> {
        let (tx, rx) = crossbeam_channel::bounded(CHANNEL_ROOM);
        self.0.lock().push(tx);
        rx
    }

    /// Sends the release of `name`'s term `fence` (if known) to every
    /// subscriber that has room.
    pub(crate) fn send(&self, name: &str, fence: Option<u64>) {
        let released = Released { name: name.to_owned(), fence };
        self.0.lock().retain(|tx| !matches!(tx.try_send(released.clone()), Err(TrySendError::Disconnected(_))));
    }

    /// Ends every subscription: the receivers see their channel closed.
    #[cfg(any(test, feature = "postgres", feature = "mysql"))]
    pub(crate) fn clear(&self) {
        self.0.lock().clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// FNV-1a, 64 bits: a short stable name for a long one, the same across
/// processes, builds and Rust versions (the notification channel of a
/// PostgreSQL table, the named locks of a MySQL one).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn fnv1a64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_goes_to_each_subscriber_with_room_and_the_gone_are_forgotten() {
        let subs = Subscribers::default();
        let (a, b) = (subs.subscribe(), subs.subscribe());
        for _ in 0..CHANNEL_ROOM {
            subs.send("x", Some(1));
        }
        let _ = a.try_recv();
        subs.send("y", None);
        assert_eq!(a.len(), CHANNEL_ROOM, "a had room for one more");
        assert_eq!(b.len(), CHANNEL_ROOM, "b was full: the name is lost, not waited for");
        drop(b);
        subs.send("z", Some(2));
        assert_eq!(subs.len(), 1, "a gone subscriber is forgotten");
        subs.clear();
        while a.try_recv().is_ok() {}
        assert!(a.try_recv().unwrap_err().is_disconnected());
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn the_postgres_and_mysql_feeds_hash_is_pinned() {
        // Processes of different builds must agree.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
