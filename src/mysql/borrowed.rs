//! Connections borrowed from a `mysql::Pool` the user built
//! ([`MySqlStore::builder_from_pool`](super::MySqlStore::builder_from_pool)).
//!
//! That pool cannot be told to forget a connection: dropping a
//! `PooledConn` puts it back unless the pool's reset round trip fails, and
//! that reset can succeed on a connection whose read timed out (the stale
//! reply is taken for the reset's), leaving a connection that answers the
//! next query with the previous one's result. `PooledConn::unwrap` keeps it
//! out, but never gives the pool its slot back.
//!
//! So a connection this store gives up on has its socket shut down first
//! (`shutdown(2)` on the connection's own descriptor, reached through
//! `AsRawFd`): the pool's reset then fails at once, and the pool closes the
//! connection and frees its slot. While the store holds a connection, its
//! socket's read and write timeouts are the store's; they are put back
//! before the connection goes home.
//!
//! A borrowed session is never trusted: whatever the application left on
//! it (session variables such as `timestamp` or `sql_mode`, an open
//! transaction, table locks, temporary tables that could shadow the
//! election table) would reach the store's statements, since a pool built
//! with `reset_connection = false` hands it over as it is. So the store
//! resets the session (`COM_RESET_CONNECTION`) when it takes it, under its
//! own timeouts, and its calls pin the settings their statements depend on
//! and put them back to the server's defaults before they end. A
//! connection goes home as clean as a reset would leave it, so the pool's
//! own reset on return (bounded only by the pool's settings) is skipped.

use std::io;
use std::mem::ManuallyDrop;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use mysql::{Conn, DriverError, PooledConn};

/// The longest single wait on the pool's condition variable.
const STEP: Duration = Duration::from_millis(50);

/// A connection of the user's pool, with the store's socket timeouts on.
pub(crate) struct Borrowed {
    conn: PooledConn,
    pool: mysql::Pool,
    /// The pool's read and write timeouts, to put back.
    saved: (Option<Duration>, Option<Duration>),
}

impl Borrowed {
    /// A connection from `pool` by `deadline` (`None` when all of the
    /// pool's connections stayed busy), its socket bounded by `timeout`.
    /// Warns once per store (`warned`) when the pool's own connections
    /// have no read timeout.
    pub(crate) fn take(
        pool: &mysql::Pool, deadline: Instant, timeout: Duration, warned: &AtomicBool,
    ) -> Result<Option<Borrowed>, mysql::Error> {
        // In short steps: the pool does not wake its waiters when it closes
        // a broken connection, so one long wait could sleep through a slot
        // freed that way.
        let conn = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match pool.try_get_conn(left.clamp(Duration::from_millis(1), STEP)) {
                Ok(c) => break c,
                Err(mysql::Error::DriverError(DriverError::Timeout)) if left > STEP => continue,
                Err(mysql::Error::DriverError(DriverError::Timeout)) => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        let mut b = Borrowed { conn, pool: pool.clone(), saved: (None, None) };
        let saved = with_socket(&b.conn, |s| {
            let saved = (s.read_timeout()?, s.write_timeout()?);
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            Ok(saved)
        });
        match saved {
            Ok(saved) => b.saved = saved,
            Err(e) => {
                b.discard();
                return Err(e.into());
            }
        }
        // What the application left on the session goes before any
        // statement of the store's runs on it.
        if let Err(e) = b.conn.as_mut().reset() {
            b.discard();
            return Err(e);
        }
        if b.saved.0.is_none() && !warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                "leaderelection: mysql: the mysql::Pool given to the store sets no read_timeout; the store bounds \
                 its own calls, but a checkout's health check on a dead path can wait until TCP gives up"
            );
        }
        Ok(Some(b))
    }

    pub(crate) fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut()
    }

    /// Gives a healthy connection back: puts the pool's timeouts back and
    /// returns it, without the pool's reset (the session was reset when
    /// taken, and every call puts its settings back before it ends). A
    /// socket that refuses the timeouts is discarded instead.
    pub(crate) fn give_back(mut self) {
        let saved = self.saved;
        let restored = with_socket(&self.conn, |s| {
            s.set_read_timeout(saved.0)?;
            s.set_write_timeout(saved.1)
        });
        if restored.is_err() {
            return self.discard();
        }
        self.conn.reset_connection(false);
    }

    /// Keeps the connection out of the pool for good and frees its slot:
    /// with the socket shut down, the pool's reset on return fails and the
    /// pool counts the connection gone.
    pub(crate) fn discard(mut self) {
        self.conn.reset_connection(true);
        let _ = with_socket(&self.conn, |s| s.shutdown(Shutdown::Both));
        let Borrowed { conn, pool, .. } = self;
        drop(conn);
        // The pool frees the slot without waking anyone waiting for one (the
        // application's `get_conn` with no timeout would wait on): taking a
        // connection and giving it back wakes one, on a thread of its own
        // since it may have to open that connection.
        let _ = thread::Builder::new().name("le-mysql-wake".into()).spawn(move || {
            if let Ok(c) = pool.try_get_conn(STEP) {
                drop(c);
            }
        });
    }
}

/// Runs `f` on the socket under `conn` (TCP or unix: only socket-level
/// calls are made, which work on either).
#[allow(unsafe_code)]
fn with_socket<R>(conn: &Conn, f: impl FnOnce(&TcpStream) -> io::Result<R>) -> io::Result<R> {
    let fd = conn.as_raw_fd();
    // SAFETY: `fd` is the open socket of `conn`, which the shared borrow
    // keeps alive (and unclosed) until this returns; `ManuallyDrop` keeps
    // the temporary `TcpStream` from closing it. Nothing else is done with
    // the descriptor than timeouts and `shutdown`, which change no state
    // the `mysql` crate keeps beside the socket.
    let socket = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
    f(&socket)
}
