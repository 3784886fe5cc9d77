//! Ports of 127.0.0.1 for what the tests listen on: proxies and servers of
//! their own, which they stop and start again on the same port.
//!
//! A port from the kernel's ephemeral range (what binding port 0 gives) can
//! be taken, while its listener is down, as the local port of any outgoing
//! connection, this suite's own connections included, and stay taken for
//! seconds. A CI run failed that way: a fault proxy leaving `Refuse` found
//! its port in use ("cannot bind port 46533 again"). So ports are picked at
//! random below that range, where only an explicit bind takes one, and a
//! port handed out in this process is not handed out again until it is
//! given back. Tests of different processes may still meet on a port; the
//! servers' own launch checks catch that and try another.

use std::net::TcpListener;

use parking_lot::Mutex;

/// The lowest port picked.
const LOWEST: u16 = 10_000;

/// Ports handed out in this process and not given back.
static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// The first port of the kernel's ephemeral range.
pub fn ephemeral_from() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A listener on a port of 127.0.0.1 below the ephemeral range, free when
/// picked and not handed out before in this process. Give the port back
/// ([`give_back`]) when it is no longer used, or keep it for the process.
pub fn listen() -> TcpListener {
    let Some(low) = ephemeral_from().filter(|&low| low > LOWEST + 2_000) else {
        return TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    };
    let mut taken = TAKEN.lock();
    for _ in 0..1_000 {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).unwrap();
        let port = LOWEST + u16::from_le_bytes(b) % (low - LOWEST);
        if taken.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            taken.push(port);
            return l;
        }
    }
    panic!("no free port of 127.0.0.1 between {LOWEST} and {low} in 1,000 tries")
}

/// A port picked as by [`listen`] and free a moment ago, for a server to
/// bind. It stays reserved in this process.
pub fn free_port() -> u16 {
    listen().local_addr().expect("a bound port").port()
}

/// Lets [`listen`] hand `port` out again.
pub fn give_back(port: u16) {
    TAKEN.lock().retain(|&p| p != port);
}
