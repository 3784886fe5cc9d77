//! A TCP proxy in front of a server, for network faults without netem.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A TCP proxy to a server that, when told to, swallows everything in both
/// directions (a path that drops every packet; the server itself stays fine),
/// or lets new connections reach the server only after a delay (a slow path).
pub struct Proxy {
    pub port: u16,
    swallow: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    delay_ms: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `target`.
    pub fn start<A: ToSocketAddrs + Clone + Send + 'static>(target: A) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let swallow = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (sw, op, dl) = (Arc::clone(&swallow), Arc::clone(&open), Arc::clone(&delay_ms));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let (sw, op, target) = (Arc::clone(&sw), Arc::clone(&op), target.clone());
                let delay = Duration::from_millis(dl.load(Ordering::SeqCst));
                thread::spawn(move || {
                    // A slow path: the server hears of the connection (and
                    // so sends any greeting) only after the delay.
                    thread::sleep(delay);
                    let Ok(server) = TcpStream::connect(target) else { return };
                    op.fetch_add(1, Ordering::SeqCst);
                    let ends = Arc::new(AtomicUsize::new(2));
                    for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                        let (sw, op, ends) = (Arc::clone(&sw), Arc::clone(&op), Arc::clone(&ends));
                        thread::spawn(move || {
                            forward(from, to, &sw);
                            if ends.fetch_sub(1, Ordering::SeqCst) == 1 {
                                op.fetch_sub(1, Ordering::SeqCst);
                            }
                        });
                    }
                });
            }
        });
        Proxy { port, swallow, open, delay_ms }
    }

    /// Connections accepted from now on reach the server only after `d`.
    pub fn delay_connections(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Starts (`true`) or stops swallowing all traffic, on every connection.
    pub fn swallow(&self, on: bool) {
        self.swallow.store(on, Ordering::SeqCst);
    }

    /// Proxied connections still open at either end.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` (dropping what arrives while swallowing) until
/// either end closes, then closes both.
fn forward(mut from: TcpStream, mut to: TcpStream, swallow: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if swallow.load(Ordering::SeqCst) => {}
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
