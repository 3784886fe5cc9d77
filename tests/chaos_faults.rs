//! Self-test of the chaos suite's fault-injecting proxy
//! (tests/support/faults.rs) against scripted TCP servers in this process: no
//! database needed. One test per fault at least, each measuring what the
//! fault's definition promises. The tests run one at a time (`serial`) so
//! that the timing ones are not measured on a machine busy with the others.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use support::faults::{Fault, FaultProxy, HOLD_CAP};
use support::wait_for;

const GREETING: &[u8] = b"HELLO\n";
/// Scheduling slack allowed on top of a fault's own timing.
const SLACK: Duration = Duration::from_millis(50);

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A scripted server on a free port of 127.0.0.1: each accepted connection
/// runs `script` on a thread of its own. Drop stops accepting; the
/// connections' threads end when their connections close.
struct Server {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(script: impl Fn(TcpStream) + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, live, stop) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (a, l, st, script) = (Arc::clone(&accepted), Arc::clone(&live), Arc::clone(&stop), Arc::new(script));
        let thread = thread::spawn(move || {
            for s in listener.incoming() {
                if st.load(SeqCst) {
                    return;
                }
                let Ok(s) = s else { continue };
                a.fetch_add(1, SeqCst);
                l.fetch_add(1, SeqCst);
                let (l, script) = (Arc::clone(&l), Arc::clone(&script));
                thread::spawn(move || {
                    s.set_nodelay(true).unwrap();
                    script(s);
                    l.fetch_sub(1, SeqCst);
                });
            }
        });
        Server { addr, accepted, live, stop, thread: Some(thread) }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        let _ = self.thread.take().unwrap().join();
    }
}

/// What a server heard: each read, when it returned.
type Log = Arc<Mutex<Vec<(Instant, Vec<u8>)>>>;

fn heard(log: &Log) -> Vec<u8> {
    log.lock().unwrap().iter().flat_map(|(_, b)| b.clone()).collect()
}

/// Echoes every byte back until the client closes.
fn echo(s: TcpStream) {
    logged_echo(Log::default())(s)
}

/// Echoes, logging what arrived and when.
fn logged_echo(log: Log) -> impl Fn(TcpStream) + Send + Sync {
    move |mut s| {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            log.lock().unwrap().push((Instant::now(), buf[..n].to_vec()));
            if s.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }
}

/// Sends [`GREETING`] first, as database servers do, then echoes, logging.
fn greet_then_echo(log: Log) -> impl Fn(TcpStream) + Send + Sync {
    let echo = logged_echo(log);
    move |mut s| {
        if s.write_all(GREETING).is_ok() {
            echo(s)
        }
    }
}

fn connect(p: &FaultProxy) -> TcpStream {
    let s = TcpStream::connect(p.addr()).expect("connect to the proxy");
    s.set_nodelay(true).unwrap();
    s
}

/// A connection through `p` that has round-tripped `first`: the path works
/// before the test sets a fault.
fn connected(p: &FaultProxy, first: &[u8]) -> TcpStream {
    let mut s = connect(p);
    round_trip(&mut s, first);
    s
}

/// The start of most tests: this test's turn ([`serial`]), a server running
/// `script` and a proxy in front of it. Bound in this order
/// (`let (_s, server, proxy) = …`), they drop proxy first and the turn last.
fn proxied(script: impl Fn(TcpStream) + Send + Sync + 'static) -> (MutexGuard<'static, ()>, Server, FaultProxy) {
    let turn = serial();
    let server = Server::start(script);
    let proxy = FaultProxy::start(server.addr);
    (turn, server, proxy)
}

/// Exactly `n` bytes within `within`, or a panic saying what came.
fn read_n(s: &mut TcpStream, n: usize, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut got = vec![0; n];
    let mut have = 0;
    while have < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out with {have} of {n} bytes: {:?}", String::from_utf8_lossy(&got[..have]));
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut got[have..]) {
            Ok(0) => panic!("closed after {have} of {n} bytes"),
            Ok(k) => have += k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read failed after {have} of {n} bytes: {e}"),
        }
    }
    got
}

/// Whatever arrives within `within` (a connection that closes or breaks
/// meanwhile is a failure: these tests expect it to stay open).
fn read_for(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return got;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => panic!("connection closed (after {got:?})"),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("connection broke: {e}"),
        }
    }
}

/// The error the next read fails with, within 2 s (bytes, a clean close or
/// silence are failures).
fn read_error(s: &mut TcpStream) -> ErrorKind {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    match s.read(&mut [0; 64]) {
        Ok(0) => panic!("closed cleanly, expected an error"),
        Ok(n) => panic!("read {n} bytes, expected an error"),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => panic!("still open after 2 s"),
        Err(e) => e.kind(),
    }
}

/// Writes `msg` and expects it echoed within 2 s.
fn round_trip(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).unwrap();
    assert_eq!(read_n(s, msg.len(), Duration::from_secs(2)), msg);
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    getrandom::fill(&mut v).unwrap();
    v
}

#[test]
fn pass_round_trips_large_random_payloads_byte_exact() {
    let (_s, _server, proxy) = proxied(echo);
    const LEN: usize = 4 << 20;
    // Two connections at once, each writing while it reads.
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (payload, mut c) = (random_bytes(LEN), connect(&proxy));
            thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let sent = payload.clone();
                let writer = thread::spawn(move || {
                    w.write_all(&sent).unwrap();
                    w.shutdown(Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                c.read_to_end(&mut back).expect("read the echo to its end");
                writer.join().unwrap();
                assert!(back == payload, "echo differs: {} bytes back of {LEN}", back.len());
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let st = proxy.stats();
    assert_eq!((st.accepted, st.bytes_up, st.bytes_down, st.bytes_discarded), (2, 2 * LEN as u64, 2 * LEN as u64, 0));
    assert!(
        wait_for(Duration::from_secs(2), || proxy.open_connections() == 0),
        "connections closed at both ends stay open"
    );
}

#[test]
fn latency_delays_each_direction_within_base_and_jitter() {
    let log = Log::default();
    let (_s, _server, proxy) = proxied(logged_echo(Arc::clone(&log)));
    let (base, jitter) = (Duration::from_millis(100), Duration::from_millis(50));
    proxy.set(Fault::Latency { base, jitter });
    assert_eq!(proxy.fault(), Fault::Latency { base, jitter });
    let mut c = connect(&proxy);
    // Ten one-byte messages 30 ms apart: each its own chunk, with its own delay.
    const N: u8 = 10;
    let mut w = c.try_clone().unwrap();
    let sender = thread::spawn(move || {
        (0..N)
            .map(|i| {
                let at = Instant::now();
                w.write_all(&[i]).unwrap();
                thread::sleep(Duration::from_millis(30));
                at
            })
            .collect::<Vec<_>>()
    });
    let mut echoed = Vec::new();
    for _ in 0..N {
        let b = read_n(&mut c, 1, Duration::from_secs(3));
        echoed.push((Instant::now(), b[0]));
    }
    let sent = sender.join().unwrap();
    assert_eq!(echoed.iter().map(|e| e.1).collect::<Vec<_>>(), (0..N).collect::<Vec<_>>(), "echo out of order");
    let arrived: Vec<Instant> = log.lock().unwrap().iter().flat_map(|(t, b)| b.iter().map(|_| *t)).collect();
    assert_eq!(arrived.len(), N as usize);
    let one_way: Vec<Duration> = (0..N as usize).map(|i| arrived[i] - sent[i]).collect();
    let rtt: Vec<Duration> = (0..N as usize).map(|i| echoed[i].0 - sent[i]).collect();
    println!("one-way {one_way:?}\nround trip {rtt:?}");
    for (i, (ow, rt)) in one_way.iter().zip(&rtt).enumerate() {
        assert!(*ow >= base && *ow <= base + jitter + SLACK, "message {i}: one-way {ow:?}");
        assert!(*rt >= 2 * base && *rt <= 2 * (base + jitter) + SLACK, "message {i}: round trip {rt:?}");
    }
    let spread = *one_way.iter().max().unwrap() - *one_way.iter().min().unwrap();
    assert!(spread >= Duration::from_millis(10), "no jitter seen: one-way delays within {spread:?}");
}

#[test]
fn latency_keeps_order_under_jitter() {
    let (_s, _server, proxy) = proxied(echo);
    proxy.set(Fault::Latency { base: Duration::ZERO, jitter: Duration::from_millis(40) });
    let mut c = connect(&proxy);
    // 200 small writes 1 ms apart: chunks with jitter far above their spacing.
    let payload = random_bytes(200 * 64);
    let (mut w, sent) = (c.try_clone().unwrap(), payload.clone());
    let sender = thread::spawn(move || {
        for msg in sent.chunks(64) {
            w.write_all(msg).unwrap();
            thread::sleep(Duration::from_millis(1));
        }
    });
    let back = read_n(&mut c, payload.len(), Duration::from_secs(5));
    sender.join().unwrap();
    assert!(back == payload, "bytes reordered or changed under jitter");
}

#[test]
fn bandwidth_limits_each_direction() {
    let _s = serial();
    const RATE: u64 = 200_000;
    // Up: the client writes as fast as it can to a server that counts.
    let received = Arc::new(AtomicU64::new(0));
    let r = Arc::clone(&received);
    let sink = Server::start(move |mut s| {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            r.fetch_add(n as u64, SeqCst);
        }
    });
    // Down: a server writes as fast as it can to a client that counts.
    let source = Server::start(|mut s| {
        let block = vec![7; 64 * 1024];
        while s.write_all(&block).is_ok() {}
    });
    let (up, down) = (FaultProxy::start(sink.addr), FaultProxy::start(source.addr));
    up.set(Fault::Bandwidth { bytes_per_sec: RATE });
    down.set(Fault::Bandwidth { bytes_per_sec: RATE });
    let mut w = connect(&up);
    let writer = thread::spawn(move || {
        let block = vec![9; 64 * 1024];
        while w.write_all(&block).is_ok() {}
    });
    let got = Arc::new(AtomicU64::new(0));
    let (mut rd, g) = (connect(&down), Arc::clone(&got));
    let reader = thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = rd.read(&mut buf) {
            g.fetch_add(n as u64, SeqCst);
        }
    });
    assert!(wait_for(Duration::from_secs(2), || received.load(SeqCst) > 0 && got.load(SeqCst) > 0), "nothing flows");
    let (t0, up0, down0) = (Instant::now(), received.load(SeqCst), got.load(SeqCst));
    // The measurement window: about one second.
    wait_for(Duration::from_secs(2), || t0.elapsed() >= Duration::from_secs(1));
    let secs = t0.elapsed().as_secs_f64();
    let up_rate = (received.load(SeqCst) - up0) as f64 / secs;
    let down_rate = (got.load(SeqCst) - down0) as f64 / secs;
    println!("limit {RATE} B/s: up {up_rate:.0} B/s, down {down_rate:.0} B/s over {secs:.2} s");
    for (dir, rate) in [("up", up_rate), ("down", down_rate)] {
        assert!((rate - RATE as f64).abs() <= 0.25 * RATE as f64, "{dir}: {rate:.0} B/s for a limit of {RATE}");
    }
    drop((up, down)); // resets both connections: the pumping threads end
    writer.join().unwrap();
    reader.join().unwrap();
}

#[test]
fn blackhole_holds_bytes_in_order_and_defers_new_connections() {
    let log = Log::default();
    let (_s, server, proxy) = proxied(greet_then_echo(Arc::clone(&log)));
    let mut a = connect(&proxy);
    assert_eq!(read_n(&mut a, GREETING.len(), Duration::from_secs(2)), GREETING);
    round_trip(&mut a, b"one ");

    proxy.set(Fault::Blackhole);
    for part in [&b"held-1 "[..], b"held-2 ", b"held-3"] {
        a.write_all(part).unwrap();
    }
    let mut b = connect(&proxy); // the proxy accepts ...
    b.write_all(b"from-b").unwrap();
    assert_eq!(read_for(&mut a, Duration::from_millis(400)), b"", "bytes came back through a blackhole");
    assert_eq!(read_for(&mut b, Duration::from_millis(100)), b"", "a greeting came through a blackhole");
    assert_eq!(server.accepted(), 1, "... but the server must not hear of the new connection");
    assert_eq!(heard(&log), b"one ", "the server heard bytes sent into a blackhole");
    assert_eq!(proxy.open_connections(), 2);

    proxy.set(Fault::Pass);
    assert_eq!(read_n(&mut a, 20, Duration::from_secs(2)), b"held-1 held-2 held-3");
    let mut want = GREETING.to_vec();
    want.extend_from_slice(b"from-b");
    assert_eq!(read_n(&mut b, want.len(), Duration::from_secs(2)), want);
    assert_eq!(server.accepted(), 2);
    // Each connection's bytes in order. The server reads the two
    // connections on threads of their own, which race each other into the
    // log, so b's bytes may come anywhere among a's reads.
    let all = String::from_utf8(heard(&log)).unwrap();
    assert_eq!(all.matches("from-b").count(), 1, "{all:?}");
    assert_eq!(all.replacen("from-b", "", 1), "one held-1 held-2 held-3", "{all:?}");
}

#[test]
fn blackhole_during_latency_holds_what_is_not_yet_delivered() {
    let log = Log::default();
    let (_s, _server, proxy) = proxied(logged_echo(Arc::clone(&log)));
    let mut c = connected(&proxy, b"warm");
    proxy.set(Fault::Latency { base: Duration::from_millis(300), jitter: Duration::ZERO });
    c.write_all(b"late").unwrap();
    proxy.set(Fault::Blackhole);
    assert_eq!(read_for(&mut c, Duration::from_millis(500)), b"");
    assert_eq!(heard(&log), b"warm", "a delayed chunk went out after the blackhole began");
    proxy.set(Fault::Pass);
    assert_eq!(read_n(&mut c, 4, Duration::from_secs(2)), b"late");
}

/// The byte at `offset` of an endless, checkable stream.
fn stream_byte(block: &[u8], offset: usize) -> u8 {
    block[offset % block.len()] ^ (offset / block.len()) as u8
}

#[test]
fn blackhole_bounds_what_it_holds_then_delivers_it_all_in_order() {
    let _s = serial();
    let received = Arc::new(Mutex::new(Vec::new()));
    let r = Arc::clone(&received);
    let sink = Server::start(move |mut s| {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = s.read(&mut buf) {
            r.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let proxy = FaultProxy::start(sink.addr);
    let mut c = connect(&proxy);
    proxy.set(Fault::Blackhole);
    // Write until the path stops taking bytes (no progress for 300 ms).
    let block = random_bytes(1 << 20);
    c.set_nonblocking(true).unwrap();
    let (mut written, mut last_progress) = (0usize, Instant::now());
    let started = Instant::now();
    let mut out = vec![0; 64 * 1024];
    while last_progress.elapsed() < Duration::from_millis(300) {
        assert!(started.elapsed() < Duration::from_secs(5), "still taking bytes after {written} (unbounded hold)");
        for (i, b) in out.iter_mut().enumerate() {
            *b = stream_byte(&block, written + i);
        }
        match c.write(&out) {
            Ok(n) => (written, last_progress) = (written + n, Instant::now()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("write failed: {e}"),
        }
    }
    println!("held {written} bytes before the sender blocked (proxy cap {HOLD_CAP})");
    assert!(written >= HOLD_CAP, "blocked after {written} bytes: the proxy held less than its cap");
    assert!(written <= 32 << 20, "{written} bytes taken while blackholed");
    assert!(received.lock().unwrap().is_empty(), "bytes went through the blackhole");
    proxy.set(Fault::Pass);
    assert!(
        wait_for(Duration::from_secs(5), || received.lock().unwrap().len() >= written),
        "only {} of {written} held bytes delivered",
        received.lock().unwrap().len()
    );
    let got = received.lock().unwrap();
    assert_eq!(got.len(), written);
    let bad = (0..written).find(|&i| got[i] != stream_byte(&block, i));
    assert_eq!(bad, None, "held bytes delivered out of order or changed");
}

#[test]
fn drop_replies_runs_requests_but_returns_nothing() {
    let log = Log::default();
    let (_s, _server, proxy) = proxied(logged_echo(Arc::clone(&log)));
    let mut c = connected(&proxy, b"hi ");
    proxy.set(Fault::DropReplies);
    c.write_all(b"ping").unwrap();
    assert!(wait_for(Duration::from_secs(2), || heard(&log) == b"hi ping"), "the request did not reach the server");
    assert_eq!(read_for(&mut c, Duration::from_millis(300)), b"", "a reply came back");
    assert!(wait_for(Duration::from_secs(1), || proxy.stats().bytes_discarded == 4), "{:?}", proxy.stats());
    proxy.set(Fault::Pass);
    round_trip(&mut c, b"pong"); // the dropped reply never arrives
    assert_eq!(proxy.open_connections(), 1);
}

#[test]
fn reset_on_use_resets_on_the_next_byte_from_either_side() {
    let (_s, _server, proxy) = proxied(greet_then_echo(Log::default()));
    let (mut a, mut idle) = (connect(&proxy), connect(&proxy));
    for c in [&mut a, &mut idle] {
        assert_eq!(read_n(c, GREETING.len(), Duration::from_secs(2)), GREETING);
    }
    proxy.set(Fault::ResetOnUse);
    // Client side speaks first.
    let _ = a.write_all(b"boom");
    assert_eq!(read_error(&mut a), ErrorKind::ConnectionReset);
    // Server side speaks first: its greeting resets a new connection.
    let mut b = connect(&proxy);
    assert_eq!(read_error(&mut b), ErrorKind::ConnectionReset);
    assert_eq!(proxy.stats().resets, 2);
    // A connection that says nothing is left alone.
    assert!(wait_for(Duration::from_secs(1), || proxy.open_connections() == 1), "{}", proxy.open_connections());
    proxy.set(Fault::Pass);
    round_trip(&mut idle, b"still here");
}

#[test]
fn refuse_refuses_new_connections_only_then_accepts_on_the_same_port() {
    let (_s, server, proxy) = proxied(echo);
    let mut a = connected(&proxy, b"before");
    proxy.set(Fault::Refuse);
    let e = TcpStream::connect(proxy.addr()).expect_err("connected while refusing");
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    round_trip(&mut a, b"existing works");
    proxy.set(Fault::Pass);
    let mut b = connect(&proxy);
    round_trip(&mut b, b"after");
    round_trip(&mut a, b"and still");
    assert_eq!((proxy.stats().accepted, server.accepted()), (2, 2));
}

/// While refusing, the proxy's port is unbound; a port from the kernel's
/// ephemeral range could meanwhile become the local port of an outgoing
/// connection and make `set(Pass)` fail to bind it again (seen in CI). So
/// each proxy listens below that range, and two proxies never share a port.
#[test]
fn proxies_listen_below_the_ephemeral_range_each_on_its_own_port() {
    let _s = serial();
    let low = support::ports::ephemeral_from().expect("/proc/sys/net/ipv4/ip_local_port_range");
    assert!(low > 12_000, "this test assumes the usual ephemeral range, not one from {low}");
    let upstream = Server::start(echo);
    let proxies: Vec<FaultProxy> = (0..50).map(|_| FaultProxy::start(upstream.addr)).collect();
    let mut ports: Vec<u16> = proxies.iter().map(FaultProxy::port).collect();
    assert!(ports.iter().all(|&p| (10_000..low).contains(&p)), "ports {ports:?}, ephemeral from {low}");
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 50, "two proxies share a port");
    for p in &proxies {
        p.set(Fault::Refuse);
    }
    let more: Vec<FaultProxy> = (0..50).map(|_| FaultProxy::start(upstream.addr)).collect();
    assert!(more.iter().all(|m| !ports.contains(&m.port())), "a new proxy took the port of one that refuses");
    for p in &proxies {
        p.set(Fault::Pass);
        round_trip(&mut connect(p), b"back");
    }
}

#[test]
fn flap_lets_bytes_through_only_in_up_windows() {
    let log = Log::default();
    let (_s, _server, proxy) = proxied(logged_echo(Arc::clone(&log)));
    let mut c = connected(&proxy, &[200]);
    log.lock().unwrap().clear();
    let (up, down) = (Duration::from_millis(200), Duration::from_millis(200));
    let t0 = Instant::now();
    proxy.set(Fault::Flap { up, down });
    // One byte every 20 ms for 1.2 s: three down windows, three up windows.
    const N: u8 = 60;
    for i in 0..N {
        c.write_all(&[i]).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        wait_for(Duration::from_secs(2), || heard(&log).len() == N as usize),
        "{} of {N} arrived",
        heard(&log).len()
    );
    assert_eq!(heard(&log), (0..N).collect::<Vec<_>>(), "order lost");
    let period = (up + down).as_millis();
    let mut windows = Vec::new();
    for (t, bytes) in log.lock().unwrap().iter() {
        let ms = (*t - t0).as_millis();
        let phase = ms % period;
        // Up is [down, period); a delivery at the very end of an up window is
        // logged a moment later.
        let in_up = phase >= down.as_millis() || (phase < SLACK.as_millis() / 2 && ms >= period);
        assert!(in_up, "{bytes:?} arrived {ms} ms after set, in a down window");
        windows.push(ms / period);
    }
    windows.dedup();
    assert!(windows.len() >= 3, "bytes arrived in up windows {windows:?} only");
    assert_eq!(read_n(&mut c, N as usize, Duration::from_secs(2)), (0..N).collect::<Vec<_>>());
}

#[test]
fn reset_all_resets_open_connections_and_keeps_the_fault() {
    let (_s, _server, proxy) = proxied(echo);
    let (mut a, mut b) = (connect(&proxy), connect(&proxy));
    round_trip(&mut a, b"a");
    round_trip(&mut b, b"b");
    let slow = Fault::Latency { base: Duration::from_millis(1), jitter: Duration::ZERO };
    proxy.set(slow.clone());
    proxy.reset_all();
    assert_eq!(proxy.open_connections(), 0);
    assert_eq!(read_error(&mut a), ErrorKind::ConnectionReset);
    assert_eq!(read_error(&mut b), ErrorKind::ConnectionReset);
    assert_eq!(proxy.stats().resets, 2);
    assert_eq!(proxy.fault(), slow);
    round_trip(&mut connect(&proxy), b"new ones work");
}

#[test]
fn drop_closes_every_connection_and_the_port() {
    let (_s, server, proxy) = proxied(echo);
    let addr = proxy.addr();
    let mut conns = [connect(&proxy), connect(&proxy)];
    for c in &mut conns {
        round_trip(c, b"up");
    }
    proxy.set(Fault::Blackhole);
    drop(proxy);
    for c in &mut conns {
        assert_eq!(read_error(c), ErrorKind::ConnectionReset);
    }
    let e = TcpStream::connect(addr).expect_err("the port still accepts");
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    assert!(wait_for(Duration::from_secs(2), || server.live.load(SeqCst) == 0), "the server's side stays open");
}

/// This process's user + system CPU time (Linux: /proc/self/stat, in ticks
/// of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[test]
fn idle_and_held_connections_cost_no_cpu() {
    let _s = serial();
    let server = Server::start(echo);
    let proxies: Vec<FaultProxy> = [
        Fault::Pass,
        Fault::Latency { base: Duration::from_millis(5), jitter: Duration::from_millis(5) },
        Fault::Blackhole,
        Fault::Flap { up: Duration::from_millis(100), down: Duration::from_millis(100) },
    ]
    .into_iter()
    .map(|f| {
        let p = FaultProxy::start(server.addr);
        p.set(f);
        p
    })
    .collect();
    let mut conns: Vec<TcpStream> = proxies.iter().flat_map(|p| [connect(p), connect(p)]).collect();
    conns[4].write_all(b"held in the blackhole").unwrap();
    assert!(wait_for(Duration::from_secs(2), || proxies.iter().all(|p| p.open_connections() == 2)));
    let (t0, cpu0) = (Instant::now(), cpu_time());
    wait_for(Duration::from_secs(2), || t0.elapsed() >= Duration::from_secs(1));
    let used = cpu_time() - cpu0;
    println!("8 proxied connections, 1 s: {used:?} of CPU");
    assert!(used <= Duration::from_millis(60), "{used:?} of CPU in 1 s for idle connections: a busy loop");
}
