//! A fault-injecting TCP proxy for the chaos suite: one per participant, in
//! front of a database server, so that one participant's network path can be
//! broken alone while the server stays fine.
//!
//! The model is a real network under TCP, which is reliable: a broken path
//! holds bytes rather than losing them. They pile up (up to [`HOLD_CAP`] per
//! direction, after which the proxy stops reading and the sender's kernel
//! window closes) and flow again, in order, when the path heals, unless the
//! connection was closed meanwhile. Only [`Fault::DropReplies`] discards bytes.
//!
//! Each connection is driven by one thread that owns both of its sockets
//! (non-blocking, multiplexed with poll(2), woken through a socket pair when
//! the fault changes). Owning the only descriptor of each socket is what makes
//! a reset a real RST (SO_LINGER 0, then close), and non-blocking writes done
//! under a read lock of the fault are what make [`FaultProxy::set`] a barrier:
//! once it returns, no byte moves under the old fault.

use std::collections::VecDeque;
use std::ffi::{c_int, c_short, c_ulong, c_void};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

/// Bytes held per direction of a connection before the proxy stops reading
/// from the sender.
pub const HOLD_CAP: usize = 1 << 20;
/// The largest read or write the proxy does at once.
const CHUNK: usize = 64 * 1024;
/// The granularity of [`Fault::Bandwidth`]: one write carries at most this
/// much time's worth of bytes.
const SLICE: Duration = Duration::from_millis(20);
/// How long the proxy waits for the server to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy does to the traffic it carries. A fault applies to every
/// connection, open or new, from the moment [`FaultProxy::set`] returns.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Bytes flow unchanged.
    Pass,
    /// Each chunk is delivered `base + uniform(0..=jitter)` after it arrived,
    /// per direction, order kept (a chunk never overtakes an earlier one).
    Latency { base: Duration, jitter: Duration },
    /// At most this many bytes per second per direction per connection
    /// (0: nothing flows, as under `Blackhole`).
    Bandwidth { bytes_per_sec: u64 },
    /// Connections stay open, nothing flows either way (held, in order, and
    /// delivered after the fault is lifted if the connection is still open).
    /// New connections are accepted by the proxy but the server hears nothing
    /// (connect to upstream is deferred until the fault lifts — a greeting
    /// from the server must not reach the client while blackholed).
    Blackhole,
    /// Client→server bytes flow; server→client bytes are discarded
    /// (requests arrive and run, replies never come back). Reply bytes held
    /// from an earlier fault are discarded too; the server's FIN is held.
    DropReplies,
    /// Every connection, existing or new, is reset (RST: SO_LINGER 0 then
    /// close) the moment bytes next arrive from either side (or bytes held
    /// from an earlier fault are due to move).
    ResetOnUse,
    /// New connections are refused (ECONNREFUSED: the listener is closed and
    /// re-bound on the same port when the fault changes). Existing ones keep
    /// working.
    Refuse,
    /// Alternates Pass for `up` and Blackhole for `down`, starting with down
    /// when set.
    Flap { up: Duration, down: Duration },
}

/// Counters over a proxy's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Connections the proxy accepted from clients.
    pub accepted: u64,
    /// Bytes forwarded client→server.
    pub bytes_up: u64,
    /// Bytes forwarded server→client.
    pub bytes_down: u64,
    /// Server→client bytes discarded under [`Fault::DropReplies`].
    pub bytes_discarded: u64,
    /// Connections reset by [`Fault::ResetOnUse`] or [`FaultProxy::reset_all`].
    pub resets: u64,
}

/// A TCP proxy on 127.0.0.1 in front of one upstream server, with a
/// switchable [`Fault`]. Dropping it stops listening and resets every
/// connection it carries.
pub struct FaultProxy {
    shared: Arc<Shared>,
    port: u16,
    /// The accept thread; `None` while refusing.
    acceptor: Mutex<Option<Acceptor>>,
}

/// What the proxy's threads share.
struct Shared {
    upstream: SocketAddr,
    ctl: RwLock<Ctl>,
    /// The wake-up end of each live connection's socket pair, by id.
    conns: Mutex<Vec<(u64, UnixStream)>>,
    /// Notified when a connection thread ends.
    ended: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    seed: AtomicU64,
    open: AtomicUsize,
    accepted: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    discarded: AtomicU64,
    resets: AtomicU64,
}

/// The fault and the commands every connection obeys. Connections hold a
/// read lock while they decide and write, so changing it is a barrier.
struct Ctl {
    fault: Fault,
    /// When `fault` was set (the phase origin of `Flap`).
    since: Instant,
    /// Bumped by `reset_all`; a connection older than the bump resets.
    epoch: u64,
    stopping: bool,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `upstream`, with [`Fault::Pass`].
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = super::ports::listen();
        let port = listener.local_addr().unwrap().port();
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).unwrap();
        let shared = Arc::new(Shared {
            upstream,
            ctl: RwLock::new(Ctl { fault: Fault::Pass, since: Instant::now(), epoch: 0, stopping: false }),
            conns: Mutex::new(Vec::new()),
            ended: Condvar::new(),
            threads: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            seed: AtomicU64::new(u64::from_le_bytes(seed)),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        });
        let acceptor = Acceptor::start(&shared, listener);
        FaultProxy { shared, port, acceptor: Mutex::new(Some(acceptor)) }
    }

    /// The port the proxy listens on (the same for its whole life).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port()`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Switches every connection to `fault`. When this returns, no byte moves
    /// under the previous fault, and (for `Refuse`) connects are refused, or
    /// (leaving `Refuse`) accepted again. Setting `Flap` restarts its phases.
    ///
    /// # Panics
    /// Leaving `Refuse`, if the port cannot be bound again within 2 s.
    pub fn set(&self, fault: Fault) {
        let mut acceptor = self.acceptor.lock();
        let refuse = fault == Fault::Refuse;
        {
            let mut ctl = self.shared.ctl.write();
            ctl.fault = fault;
            ctl.since = Instant::now();
        }
        if refuse {
            if let Some(a) = acceptor.take() {
                a.stop();
            }
        } else if acceptor.is_none() {
            *acceptor = Some(Acceptor::start(&self.shared, rebind(self.port)));
        }
        self.shared.wake_all();
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.shared.ctl.read().fault.clone()
    }

    /// Resets (RST) every open connection now, leaving the fault as it is;
    /// returns once they are closed (or after 2 s). Later connections are
    /// not affected.
    pub fn reset_all(&self) {
        let ids: Vec<u64> = self.shared.conns.lock().iter().map(|(id, _)| *id).collect();
        self.shared.ctl.write().epoch += 1;
        self.shared.wake_all();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut conns = self.shared.conns.lock();
        while conns.iter().any(|(id, _)| ids.contains(id)) {
            if self.shared.ended.wait_until(&mut conns, deadline).timed_out() {
                break;
            }
        }
    }

    /// Connections accepted and not yet closed at both ends.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(SeqCst)
    }

    /// The proxy's counters so far.
    pub fn stats(&self) -> FaultStats {
        let s = &self.shared;
        FaultStats {
            accepted: s.accepted.load(SeqCst),
            bytes_up: s.up.load(SeqCst),
            bytes_down: s.down.load(SeqCst),
            bytes_discarded: s.discarded.load(SeqCst),
            resets: s.resets.load(SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(a) = self.acceptor.get_mut().take() {
            a.stop();
        }
        self.shared.ctl.write().stopping = true;
        self.shared.wake_all();
        let threads = std::mem::take(&mut *self.shared.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        super::ports::give_back(self.port);
    }
}

/// Binds 127.0.0.1:`port` again after `Refuse`, retrying briefly.
fn rebind(port: u16) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => return l,
            Err(e) if Instant::now() >= deadline => panic!("fault proxy: cannot bind port {port} again: {e}"),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Shared {
    /// Makes every connection thread re-read the fault.
    fn wake_all(&self) {
        for (_, w) in self.conns.lock().iter() {
            let _ = (&*w).write(&[1]); // a full pair is already a pending wake-up
        }
    }
}

/// The accept thread of one listener; stopped by closing `stop`'s peer.
struct Acceptor {
    stop: UnixStream,
    thread: JoinHandle<()>,
}

impl Acceptor {
    fn start(shared: &Arc<Shared>, listener: TcpListener) -> Acceptor {
        let (stop, stopped) = UnixStream::pair().unwrap();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::clone(shared);
        let thread = thread::spawn(move || loop {
            let mut fds = [pollfd(stopped.as_raw_fd(), POLLIN), pollfd(listener.as_raw_fd(), POLLIN)];
            poll_until(&mut fds, None);
            if fds[0].revents != 0 {
                return; // `stop` closed: the listener closes with this thread
            }
            loop {
                match listener.accept() {
                    Ok((client, _)) => spawn_conn(&shared, client),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        thread::sleep(Duration::from_millis(10)); // out of descriptors: no spin
                        break;
                    }
                }
            }
        });
        Acceptor { stop, thread }
    }

    /// Closes the listener; returns once it is closed.
    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// Registers a connection and starts the thread that drives it.
fn spawn_conn(shared: &Arc<Shared>, client: TcpStream) {
    shared.accepted.fetch_add(1, SeqCst);
    let (waker, wake) = UnixStream::pair().unwrap();
    if client.set_nonblocking(true).is_err()
        || waker.set_nonblocking(true).is_err()
        || wake.set_nonblocking(true).is_err()
    {
        return;
    }
    let _ = client.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, SeqCst);
    // splitmix64's increment: each connection its own jitter stream.
    let seed = shared.seed.fetch_add(0x9e37_79b9_7f4a_7c15, SeqCst);
    shared.open.fetch_add(1, SeqCst);
    shared.conns.lock().push((id, waker));
    let epoch = shared.ctl.read().epoch;
    let conn =
        Conn { client, server: None, up: Pipe::new(), down: Pipe::new(), wake, epoch, rng: seed, buf: vec![0; CHUNK] };
    let sh = Arc::clone(shared);
    let handle = thread::spawn(move || run_conn(sh, conn, id));
    let mut threads = shared.threads.lock();
    threads.retain(|t| !t.is_finished());
    threads.push(handle);
}

/// How a connection ended: both ends closed in order, reset on command, or
/// broken (an error, or the proxy dropped).
#[derive(Clone, Copy, PartialEq)]
enum End {
    Closed,
    Reset,
    Abort,
}

fn run_conn(shared: Arc<Shared>, mut conn: Conn, id: u64) {
    let end = conn.drive(&shared).unwrap_or(End::Abort);
    if end == End::Reset {
        shared.resets.fetch_add(1, SeqCst);
    }
    if end != End::Closed {
        set_linger_zero(&conn.client);
        if let Some(s) = &conn.server {
            set_linger_zero(s);
        }
    }
    drop(conn); // closes both sockets (RST if lingering 0) before the count drops
                // The count drops under the same lock `reset_all` waits on, so that it
                // can never see the connection gone and the count not yet down.
    let mut conns = shared.conns.lock();
    conns.retain(|(i, _)| *i != id);
    shared.open.fetch_sub(1, SeqCst);
    drop(conns);
    shared.ended.notify_all();
}

/// One proxied connection: the client's socket, the server's once connected
/// (deferred while blackholed), and a pipe per direction.
struct Conn {
    client: TcpStream,
    server: Option<TcpStream>,
    /// Client→server.
    up: Pipe,
    /// Server→client.
    down: Pipe,
    wake: UnixStream,
    epoch: u64,
    rng: u64,
    buf: Vec<u8>,
}

impl Conn {
    /// Moves bytes until the connection ends; an error breaks it.
    fn drive(&mut self, sh: &Shared) -> io::Result<End> {
        loop {
            let now = Instant::now();
            let mut until;
            let connect;
            {
                let ctl = sh.ctl.read();
                if ctl.stopping {
                    return Ok(End::Abort);
                }
                if ctl.epoch != self.epoch {
                    return Ok(End::Reset);
                }
                let (flow, change) = flow_at(&ctl, now);
                until = change;
                if flow == Flow::Reset && self.up.held + self.down.held > 0 {
                    return Ok(End::Reset);
                }
                connect = self.server.is_none() && flow != Flow::Hold;
                if let Some(server) = &mut self.server {
                    let t = self.up.deliver(server, flow, false, now, &sh.up, &sh.discarded)?;
                    until = earliest(until, t);
                    let t = self.down.deliver(&mut self.client, flow, true, now, &sh.down, &sh.discarded)?;
                    until = earliest(until, t);
                }
            }
            if connect {
                let server = TcpStream::connect_timeout(&sh.upstream, CONNECT_TIMEOUT)?;
                server.set_nonblocking(true)?;
                let _ = server.set_nodelay(true);
                self.server = Some(server);
                continue;
            }
            if self.up.fin_sent && self.down.fin_sent {
                return Ok(End::Closed);
            }

            let server_fd = self.server.as_ref().map_or(-1, |s| s.as_raw_fd());
            let mut fds = [
                pollfd(self.wake.as_raw_fd(), POLLIN),
                pollfd(self.client.as_raw_fd(), self.up.read_events() | self.down.write_events()),
                pollfd(server_fd, self.down.read_events() | self.up.write_events()),
            ];
            poll_until(&mut fds, until);
            if fds[0].revents != 0 {
                loop {
                    match (&self.wake).read(&mut self.buf) {
                        Ok(0) => return Ok(End::Abort),
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            }
            let now = Instant::now();
            let [_, c, s] = fds.map(|f| f.revents);
            if c & (POLLOUT | POLLERR | POLLHUP) != 0 {
                self.down.blocked = false;
            }
            if s & (POLLOUT | POLLERR | POLLHUP) != 0 {
                self.up.blocked = false;
            }
            if c & (POLLIN | POLLERR | POLLHUP) != 0 && self.up.read_events() != 0 {
                self.up.fill(&mut self.client, &mut self.buf, now, &mut self.rng)?;
            }
            if let Some(server) = &mut self.server {
                if s & (POLLIN | POLLERR | POLLHUP) != 0 && self.down.read_events() != 0 {
                    self.down.fill(server, &mut self.buf, now, &mut self.rng)?;
                }
            }
        }
    }
}

/// The fault reduced to what one moment's delivery needs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flow {
    Pass,
    Hold,
    Latency(Duration, Duration),
    Rate(u64),
    DropReplies,
    Reset,
}

/// The flow under `ctl` at `now`, and when it changes by itself (`Flap`).
fn flow_at(ctl: &Ctl, now: Instant) -> (Flow, Option<Instant>) {
    match ctl.fault {
        Fault::Pass | Fault::Refuse => (Flow::Pass, None),
        Fault::Latency { base, jitter } => (Flow::Latency(base, jitter), None),
        Fault::Bandwidth { bytes_per_sec: 0 } | Fault::Blackhole => (Flow::Hold, None),
        Fault::Bandwidth { bytes_per_sec } => (Flow::Rate(bytes_per_sec), None),
        Fault::DropReplies => (Flow::DropReplies, None),
        Fault::ResetOnUse => (Flow::Reset, None),
        Fault::Flap { up, down } => {
            let period = (up + down).as_nanos();
            if period == 0 {
                return (Flow::Pass, None);
            }
            let into = (now - ctl.since).as_nanos() % period;
            let start = now - Duration::from_nanos(into as u64);
            if into < down.as_nanos() {
                (Flow::Hold, Some(start + down))
            } else {
                (Flow::Pass, Some(start + up + down))
            }
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        _ => a.or(b),
    }
}

/// Bytes read from one end and not yet written to the other, in order.
struct Pipe {
    /// (arrival, jitter fraction in [0, 1], bytes); `off` bytes of the front
    /// one are already delivered.
    queue: VecDeque<(Instant, f64, Vec<u8>)>,
    off: usize,
    held: usize,
    /// The sender closed its side (the FIN goes after the held bytes).
    eof: bool,
    fin_sent: bool,
    /// The destination's send buffer is full: wait for POLLOUT.
    blocked: bool,
    /// `Bandwidth`: when the next slice may go.
    next_send: Instant,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            queue: VecDeque::new(),
            off: 0,
            held: 0,
            eof: false,
            fin_sent: false,
            blocked: false,
            next_send: Instant::now(),
        }
    }

    /// POLLIN while the sender is open and the hold is not full.
    fn read_events(&self) -> c_short {
        if !self.eof && self.held < HOLD_CAP {
            POLLIN
        } else {
            0
        }
    }

    fn write_events(&self) -> c_short {
        if self.blocked {
            POLLOUT
        } else {
            0
        }
    }

    /// Reads once from `src` into the queue, stamping the chunk with its
    /// arrival and a jitter draw.
    fn fill(&mut self, src: &mut TcpStream, buf: &mut [u8], now: Instant, rng: &mut u64) -> io::Result<()> {
        match src.read(buf) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                let u = (splitmix(rng) >> 11) as f64 / ((1u64 << 53) - 1) as f64;
                self.queue.push_back((now, u, buf[..n].to_vec()));
                self.held += n;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Writes to `dst` what `flow` lets go now (`replies`: this is the
    /// server→client pipe); returns when more becomes due, if at a known time.
    fn deliver(
        &mut self, dst: &mut TcpStream, flow: Flow, replies: bool, now: Instant, sent: &AtomicU64,
        discarded: &AtomicU64,
    ) -> io::Result<Option<Instant>> {
        loop {
            if self.blocked || flow == Flow::Hold {
                return Ok(None);
            }
            if replies && flow == Flow::DropReplies {
                discarded.fetch_add(self.held as u64, SeqCst);
                self.queue.clear();
                (self.off, self.held) = (0, 0);
                return Ok(None); // and the FIN, if any, stays held
            }
            let Some((at, u, data)) = self.queue.front() else {
                if self.eof && !self.fin_sent {
                    dst.shutdown(Shutdown::Write)?;
                    self.fin_sent = true;
                }
                return Ok(None);
            };
            let rest = &data[self.off..];
            let len = match flow {
                Flow::Latency(base, jitter) => {
                    let due = *at + base + jitter.mul_f64(*u);
                    if due > now {
                        return Ok(Some(due));
                    }
                    rest.len()
                }
                Flow::Rate(rate) => {
                    if self.next_send + SLICE < now {
                        self.next_send = now; // idle: no credit beyond one slice
                    }
                    if self.next_send > now {
                        return Ok(Some(self.next_send));
                    }
                    rest.len().min((rate as f64 * SLICE.as_secs_f64()).clamp(1.0, CHUNK as f64) as usize)
                }
                _ => rest.len(),
            };
            match dst.write(&rest[..len]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    sent.fetch_add(n as u64, SeqCst);
                    self.held -= n;
                    self.off += n;
                    if self.off == data.len() {
                        self.queue.pop_front();
                        self.off = 0;
                    }
                    if let Flow::Rate(rate) = flow {
                        self.next_send += Duration::from_secs_f64(n as f64 / rate as f64);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.blocked = true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// poll(2) and setsockopt(2) from the C library std already links (Linux
// values; std has no stable poll, and `set_linger` is unstable).
#[repr(C)]
struct PollFd {
    fd: c_int,
    events: c_short,
    revents: c_short,
}

const POLLIN: c_short = 0x1;
const POLLOUT: c_short = 0x4;
const POLLERR: c_short = 0x8;
const POLLHUP: c_short = 0x10;
const SOL_SOCKET: c_int = 1;
const SO_LINGER: c_int = 13;

#[repr(C)]
struct Linger {
    l_onoff: c_int,
    l_linger: c_int,
}

extern "C" {
    fn poll(fds: *mut PollFd, nfds: c_ulong, timeout: c_int) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, value: *const c_void, len: u32) -> c_int;
}

/// A poll entry; one that asks for nothing is left out (fd -1).
fn pollfd(fd: RawFd, events: c_short) -> PollFd {
    PollFd { fd: if events == 0 { -1 } else { fd }, events, revents: 0 }
}

/// Waits for `fds` until `until` (None: no deadline); an interrupt just returns.
fn poll_until(fds: &mut [PollFd], until: Option<Instant>) {
    let ms = until.map_or(-1, |t| {
        let us = t.saturating_duration_since(Instant::now()).as_micros();
        us.div_ceil(1000).min(c_int::MAX as u128) as c_int
    });
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
    unsafe { poll(fds.as_mut_ptr(), fds.len() as c_ulong, ms) };
}

/// Makes the socket's close send RST instead of FIN.
fn set_linger_zero(s: &TcpStream) {
    let l = Linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `l` is a live `struct linger` of the size passed, and the fd is open.
    unsafe {
        setsockopt(
            s.as_raw_fd(),
            SOL_SOCKET,
            SO_LINGER,
            &l as *const Linger as *const c_void,
            size_of::<Linger>() as u32,
        )
    };
}
