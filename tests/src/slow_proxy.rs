//! A delaying TCP proxy: what a slow bridge looks like to Envoy, without touching the
//! bridge.
//!
//! [`SlowProxy::start`] listens on a free port of 127.0.0.1 and forwards every connection
//! to a target port, adding `delay` to every round trip: **half of it on each leg**
//! (client → target, then target → client; an odd µs goes to the answer's leg). The TCP
//! handshake is not delayed, only the bytes, so a pooled connection (Envoy keeps its
//! connections to the bridge) sees exactly `delay` more per request.
//!
//! It does not serialise. Each direction of a connection has a reader thread that stamps
//! every chunk it reads with its deadline (read instant + the leg's delay) and a writer
//! thread that writes each chunk once its deadline has passed. Deadlines of one direction
//! rise in reading order, so the writer keeps the bytes in order, and a chunk read while
//! an earlier one waits waits only its own delay: pipelined HTTP/1.1 requests and HTTP/2
//! streams multiplexed on one connection each get `delay`, not `delay` × chunks.
//! Connections run side by side, each on its own threads.
//!
//! Closing is forwarded as bytes are: when a reader sees end of stream (or an error), its
//! writer shuts down the write half of the other side once every earlier chunk has been
//! written, so a half-close reaches the far end after the same delay; a write that fails
//! (the far end is gone) shuts both sockets of the connection. Dropping the proxy stops
//! accepting, shuts every connection's sockets and joins every thread it started.
//!
//! Sleeping to a deadline overshoots by the scheduler's wake-up latency (tens of µs on an
//! idle machine, more on a busy one): the added latency is at least `delay`, never less.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Bytes read at once; a chunk is forwarded as one write.
const CHUNK: usize = 64 * 1024;

/// A listening delaying proxy; stops every thread it started when dropped.
pub struct SlowProxy {
    pub port: u16,
    pub delay: Duration,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<Connection>>>,
    acceptor: Option<JoinHandle<()>>,
}

/// One proxied connection: its two sockets (to shut them on drop) and its four threads.
struct Connection {
    sockets: [TcpStream; 2],
    threads: Vec<JoinHandle<()>>,
}

impl Connection {
    fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }
}

/// What a reader hands its writer: bytes due at an instant, or the end of the stream.
enum Due {
    Bytes(Instant, Vec<u8>),
    End(Instant),
}

impl SlowProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to
    /// `127.0.0.1:target`, adding `delay` to each round trip (half on each leg).
    pub fn start(target: u16, delay: Duration) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("bind the delaying proxy: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the delaying proxy's address: {e}"))
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<Connection>>> = Arc::default();
        let (to_target, to_client) = (delay / 2, delay - delay / 2);
        let acceptor = {
            let stop = stop.clone();
            let connections = connections.clone();
            thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    // The target refusing: the client sees its connection closed.
                    let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)) else {
                        continue;
                    };
                    let Some(conn) = proxy(client, upstream, to_target, to_client) else {
                        continue;
                    };
                    let mut all = connections.lock().unwrap_or_else(|e| e.into_inner());
                    all.retain(|c| !c.is_finished());
                    all.push(conn);
                }
            })
        };
        SlowProxy {
            port,
            delay,
            stop,
            connections,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor blocked in accept(); it sees `stop` and returns.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let all = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for c in &all {
            for s in &c.sockets {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for c in all {
            for t in c.threads {
                let _ = t.join();
            }
        }
    }
}

/// Starts the four threads that carry `client` ⇄ `upstream`; `None` when a socket cannot
/// be cloned (the connection is then dropped, which closes it).
fn proxy(
    client: TcpStream,
    upstream: TcpStream,
    to_target: Duration,
    to_client: Duration,
) -> Option<Connection> {
    // Small writes go out at once: the delay is ours to add, not Nagle's.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut threads = Vec::with_capacity(4);
    for (from, to, delay) in [
        (&client, &upstream, to_target),
        (&upstream, &client, to_client),
    ] {
        let (tx, rx) = mpsc::channel();
        let reader = from.try_clone().ok()?;
        let (writer, source) = (to.try_clone().ok()?, from.try_clone().ok()?);
        threads.push(thread::spawn(move || read_leg(reader, delay, tx)));
        threads.push(thread::spawn(move || write_leg(rx, writer, source)));
    }
    Some(Connection {
        sockets: [client, upstream],
        threads,
    })
}

/// Reads `from` until its end, handing each chunk on with its deadline.
fn read_leg(mut from: TcpStream, delay: Duration, tx: mpsc::Sender<Due>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = tx.send(Due::End(Instant::now() + delay));
                return;
            }
            Ok(n) => {
                if tx
                    .send(Due::Bytes(Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Writes each chunk to `to` at its deadline; at the end of the stream, shuts `to`'s
/// write half. A failed write shuts both `to` and `source` (the leg's other socket), so
/// the reader of this leg and both threads of the other leg stop too.
fn write_leg(rx: mpsc::Receiver<Due>, mut to: TcpStream, source: TcpStream) {
    let wait = |until: Instant| {
        let now = Instant::now();
        if until > now {
            thread::sleep(until - now);
        }
    };
    let broken = |to: &TcpStream| {
        let _ = to.shutdown(Shutdown::Both);
        let _ = source.shutdown(Shutdown::Both);
    };
    // The sender is gone without an end only if its reader panicked: treat it as an end.
    while let Ok(due) = rx.recv() {
        match due {
            Due::Bytes(at, bytes) => {
                wait(at);
                if write_all(&mut to, &bytes).is_err() {
                    broken(&to);
                    return;
                }
            }
            Due::End(at) => {
                wait(at);
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn write_all(to: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    to.write_all(bytes)?;
    to.flush()
}

#[cfg(test)]
mod tests {
    //! Real sockets and real time: the proxy's whole job is wall-clock latency. Margins are
    //! generous (a busy 2-core machine runs these next to a build).

    use super::*;

    /// An echo server on 127.0.0.1: every connection gets its bytes back as they come,
    /// and is closed after its client's end of stream.
    struct Echo {
        port: u16,
        stop: Arc<AtomicBool>,
        acceptor: Option<JoinHandle<()>>,
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect(("127.0.0.1", self.port));
            if let Some(a) = self.acceptor.take() {
                let _ = a.join();
            }
        }
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let stop = Arc::new(AtomicBool::new(false));
            let stopped = stop.clone();
            let acceptor = thread::spawn(move || {
                for conn in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut conn) = conn else { return };
                    conn.set_nodelay(true).unwrap();
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match conn.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if conn.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = conn.shutdown(Shutdown::Both);
                    });
                }
            });
            Echo {
                port,
                stop,
                acceptor: Some(acceptor),
            }
        }
    }

    const DELAY: Duration = Duration::from_millis(40);
    /// What a loaded machine may add to a round trip on loopback.
    const MARGIN: Duration = Duration::from_millis(35);

    fn connect(p: &SlowProxy) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Sends `msg` and reads as many bytes back; the round trip.
    fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Duration {
        let t0 = Instant::now();
        s.write_all(msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
        t0.elapsed()
    }

    #[test]
    fn a_round_trip_takes_the_delay_and_not_much_more() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, DELAY);
        let mut s = connect(&proxy);
        // The best of a few: a single one may meet a busy scheduler.
        let best = (0..3)
            .map(|i| round_trip(&mut s, format!("ping {i}").as_bytes()))
            .min()
            .unwrap();
        assert!(best >= DELAY, "{best:?} < {DELAY:?}");
        assert!(best < DELAY + MARGIN, "{best:?} ≥ {DELAY:?} + {MARGIN:?}");
    }

    #[test]
    fn chunks_on_one_connection_are_delayed_side_by_side() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, DELAY);
        let mut s = connect(&proxy);
        round_trip(&mut s, b"warm");
        let t0 = Instant::now();
        // Five pipelined chunks, 5 ms apart, without waiting for answers: a proxy that
        // serialised would take over 5 × 40 ms; this one about 20 + 40 ms.
        let mut writer = s.try_clone().unwrap();
        let sender = thread::spawn(move || {
            for i in 0..5u8 {
                writer.write_all(&[b'a' + i; 100]).unwrap();
                thread::sleep(Duration::from_millis(5));
            }
        });
        let mut back = vec![0u8; 500];
        let mut got = 0;
        let mut first = None;
        while got < back.len() {
            let n = s.read(&mut back[got..]).unwrap();
            assert!(n > 0, "closed early");
            first.get_or_insert_with(|| t0.elapsed());
            got += n;
        }
        let all = t0.elapsed();
        sender.join().unwrap();
        let first = first.unwrap();
        assert!(first >= DELAY, "first bytes after {first:?}");
        // Halfway between the two (a busy machine's wake-ups stretch the first, never
        // to the second).
        assert!(
            all < Duration::from_millis(20) + 3 * DELAY,
            "all five back after {all:?}: serialised"
        );
        let want: Vec<u8> = (0..5u8).flat_map(|i| [b'a' + i; 100]).collect();
        assert_eq!(back, want);
    }

    #[test]
    fn two_connections_are_not_serialised() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, DELAY);
        let mut conns = [connect(&proxy), connect(&proxy)];
        for c in &mut conns {
            round_trip(c, b"warm");
        }
        let t0 = Instant::now();
        let handles: Vec<_> = conns
            .into_iter()
            .map(|mut c| thread::spawn(move || round_trip(&mut c, b"both at once")))
            .collect();
        for h in handles {
            let rtt = h.join().unwrap();
            assert!(rtt >= DELAY, "{rtt:?}");
        }
        let both = t0.elapsed();
        assert!(
            both < DELAY + MARGIN,
            "two round trips side by side took {both:?}: serialised"
        );
    }

    #[test]
    fn bytes_arrive_intact_and_in_order() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, Duration::from_millis(2));
        let s = connect(&proxy);
        // 4 MiB of a pattern that repeats only every 251 bytes, written in odd sizes while
        // the answer is read: many chunks of many sizes on both legs.
        let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
        let mut writer = s.try_clone().unwrap();
        let sent = data.clone();
        let sender = thread::spawn(move || {
            for part in sent.chunks(7_777) {
                writer.write_all(part).unwrap();
            }
            writer.shutdown(Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        let mut reader = s;
        reader.read_to_end(&mut back).unwrap();
        sender.join().unwrap();
        assert_eq!(back.len(), data.len());
        assert!(back == data, "bytes changed or reordered");
    }

    #[test]
    fn a_half_close_is_forwarded_and_the_far_end_closes_back() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, DELAY);
        let mut s = connect(&proxy);
        s.write_all(b"last words").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let t0 = Instant::now();
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"last words");
        // The echo server closes after our end of stream reached it (half the delay) and
        // its close comes back (the other half).
        assert!(t0.elapsed() >= DELAY / 2, "{:?}", t0.elapsed());
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections_and_stops_listening() {
        let echo = Echo::start();
        let proxy = SlowProxy::start(echo.port, DELAY);
        let port = proxy.port;
        let mut s = connect(&proxy);
        round_trip(&mut s, b"alive");
        let t0 = Instant::now();
        drop(proxy);
        // Every thread joined: a writer waits at most one delay.
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        let mut buf = [0u8; 8];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "still open");
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "still listening"
        );
    }

    #[test]
    fn a_target_that_refuses_closes_the_client() {
        // A port nothing listens on: bound, then released.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let proxy = SlowProxy::start(port, DELAY);
        let mut s = connect(&proxy);
        let mut buf = [0u8; 8];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
}
