//! Ephemeral ports on 127.0.0.1.
//!
//! The kernel picks a free port, we release it and hand it to a child process. Another process
//! could grab it in between (rare, and it shows up as a clear "address in use" in the child's
//! log); inside one test run the set below guarantees two tests never get the same port.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A port on 127.0.0.1 that was free a moment ago and was never returned before in this process.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr of an ephemeral listener: {e}"))
            .port();
        let mut set = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if set.insert(port) {
            return port;
        }
    }
    panic!("no unused ephemeral port after 1000 tries")
}

/// `n` distinct free ports.
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}
