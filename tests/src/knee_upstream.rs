//! A service whose latency grows with its concurrency past a knee, for the tests and the
//! benchmark of concurrency limits: `workers` requests are served at once, each for the
//! service time; the others wait their turn in a first-come, first-served queue. Below
//! `workers` in flight every request takes the service time; above, a request also
//! waits for the ones ahead of it, so latency ≈ service × in-flight / workers.
//!
//! A request may set its own service time with `x-service-ms: N` (the fixed-limit tests
//! hold requests open for seconds). The upstream counts what it received, answered and
//! could not answer (the client went away), and the most requests it held at once.
//!
//! Plain blocking std code, a thread per connection, keep-alive.

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crate::loopback::{read_request, Loopback};

/// Workers busy and the tickets waiting, in arrival order.
#[derive(Default)]
struct Queue {
    busy: usize,
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

struct Shared {
    workers: usize,
    service_us: AtomicU64,
    queue: Mutex<Queue>,
    turn: Condvar,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    received: AtomicU64,
    answered: AtomicU64,
    cut_short: AtomicU64,
}

/// The running upstream; stops accepting when dropped.
pub struct KneeUpstream {
    pub port: u16,
    shared: Arc<Shared>,
    listening: Loopback,
}

impl KneeUpstream {
    /// `workers` at once, `service` each.
    pub fn start(workers: usize, service: Duration) -> KneeUpstream {
        let shared = Arc::new(Shared {
            workers: workers.max(1),
            service_us: AtomicU64::new(service.as_micros() as u64),
            queue: Mutex::new(Queue::default()),
            turn: Condvar::new(),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            received: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            cut_short: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let listening = Loopback::serve("knee upstream", move |conn| serve(conn, &serving));
        KneeUpstream {
            port: listening.port,
            shared,
            listening,
        }
    }

    /// Requests received and not answered yet.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests held at once since the start or the last reset.
    pub fn max_in_flight(&self) -> u64 {
        self.shared.max_in_flight.load(Ordering::Relaxed)
    }

    pub fn reset_max_in_flight(&self) {
        self.shared
            .max_in_flight
            .store(self.in_flight(), Ordering::Relaxed);
    }

    pub fn received(&self) -> u64 {
        self.shared.received.load(Ordering::Relaxed)
    }

    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// Responses whose client (Envoy) went away before they were written.
    pub fn cut_short(&self) -> u64 {
        self.shared.cut_short.load(Ordering::Relaxed)
    }

    /// The Envoy cluster `service` pointing here, with connection limits high enough
    /// that Envoy's circuit breakers never decide (the limiter under test must).
    pub fn cluster_yaml(&self) -> String {
        self.cluster_yaml_named("service")
    }

    /// The same cluster under another name (tests with two services).
    pub fn cluster_yaml_named(&self, name: &str) -> String {
        self.listening.cluster_yaml(
            name,
            "  circuit_breakers:
    thresholds:
    - { max_connections: 100000, max_pending_requests: 100000, max_requests: 100000 }
",
        )
    }

    /// Every path to the `service` cluster, with the route `timeout`.
    pub fn routes_yaml(timeout: &str) -> String {
        format!(
            "- match: {{ prefix: \"/\" }}\n  route: {{ cluster: service, timeout: {timeout} }}\n"
        )
    }
}

fn serve(conn: TcpStream, shared: &Shared) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Some(headers) = read_request(&mut reader) {
        let service_ms = headers
            .iter()
            .find(|(name, _)| name == "x-service-ms")
            .and_then(|(_, value)| value.parse::<u64>().ok());
        shared.received.fetch_add(1, Ordering::Relaxed);
        let now = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::Relaxed);
        let service = match service_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_micros(shared.service_us.load(Ordering::Relaxed)),
        };
        wait_for_a_worker(shared);
        thread::sleep(service);
        finish_work(shared);
        let body = "ok";
        let written = write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .and_then(|()| writer.flush());
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if written.is_err() {
            shared.cut_short.fetch_add(1, Ordering::Relaxed);
            return;
        }
        shared.answered.fetch_add(1, Ordering::Relaxed);
    }
}

fn wait_for_a_worker(shared: &Shared) {
    let mut queue = shared.queue.lock().expect("the queue");
    let ticket = queue.next_ticket;
    queue.next_ticket += 1;
    queue.waiting.push_back(ticket);
    while queue.busy >= shared.workers || queue.waiting.front() != Some(&ticket) {
        queue = shared.turn.wait(queue).expect("the queue");
    }
    queue.waiting.pop_front();
    queue.busy += 1;
    shared.turn.notify_all();
}

fn finish_work(shared: &Shared) {
    let mut queue = shared.queue.lock().expect("the queue");
    queue.busy -= 1;
    shared.turn.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Client, Request};
    use std::time::Instant;

    #[test]
    fn latency_grows_past_the_knee() {
        let up = KneeUpstream::start(2, Duration::from_millis(50));
        let time_of = |clients: usize| {
            let started = Instant::now();
            let handles: Vec<_> = (0..clients)
                .map(|_| {
                    let port = up.port;
                    thread::spawn(move || {
                        let mut c = Client::connect(port).unwrap();
                        assert_eq!(c.request(Request::get("/")).unwrap().status, 200);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            started.elapsed()
        };
        // Two at once take one service time; six take three.
        let two = time_of(2);
        let six = time_of(6);
        assert!(two < Duration::from_millis(100), "{two:?}");
        assert!(six >= Duration::from_millis(150), "{six:?}");
        assert_eq!(up.max_in_flight(), 6);
        // The upstream counts an answer once it has written it, which may be just after
        // the client read it (a CI run saw 7).
        let deadline = Instant::now() + Duration::from_secs(2);
        while up.answered() < 8 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(up.answered(), 8);
    }
}
