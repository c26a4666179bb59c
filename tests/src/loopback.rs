//! What the test upstreams share: a listener on 127.0.0.1 that serves every connection
//! on its own thread until it is dropped, a reader of HTTP/1.1 requests whose headers
//! steer the answer, and the Envoy cluster that points at it.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

/// A listening upstream; stops accepting when dropped.
pub struct Loopback {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Loopback {
    /// Listens on a free port of 127.0.0.1 and runs `serve` for every connection, each on
    /// its own thread. `what` names the upstream in the panic if the port cannot be bound.
    pub fn serve(what: &str, serve: impl Fn(TcpStream) + Send + Sync + 'static) -> Loopback {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind the {what}: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the {what}'s address: {e}"))
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let serve = Arc::new(serve);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_nodelay(true);
                let serve = serve.clone();
                thread::spawn(move || serve(conn));
            }
        });
        Loopback { port, stop }
    }

    /// A STATIC Envoy cluster `name` pointing here; `extra` (YAML lines indented by two
    /// spaces, each ending in a newline) goes into the cluster, e.g. its circuit breakers.
    pub fn cluster_yaml(&self, name: &str, extra: &str) -> String {
        format!(
            "- name: {name}
  type: STATIC
  connect_timeout: 1s
{extra}  load_assignment:
    cluster_name: {name}
    endpoints:
    - lb_endpoints:
      - endpoint:
          address:
            socket_address: {{ address: 127.0.0.1, port_value: {} }}
",
            self.port
        )
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request of a keep-alive connection, body included (and dropped); its
/// headers, names in lowercase. `None` when the connection ends or the request is not
/// HTTP/1.1 these upstreams understand.
pub fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Vec<(String, String)>> {
    read_request_with_body(reader).map(|(headers, _)| headers)
}

/// A request's headers, names in lowercase.
pub type Headers = Vec<(String, String)>;

/// Reads one request of a keep-alive connection: its headers (names in lowercase) and
/// its body, sent with a `content-length` or chunked.
pub fn read_request_with_body(reader: &mut BufReader<TcpStream>) -> Option<(Headers, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let (mut headers, mut content_length, mut chunked) = (Vec::new(), 0usize, false);
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        let (name, value) = (name.to_ascii_lowercase(), value.trim().to_string());
        if name == "content-length" {
            content_length = value.parse().ok()?;
        }
        if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
        headers.push((name, value));
    }
    if !chunked {
        let mut body = vec![0; content_length];
        reader.read_exact(&mut body).ok()?;
        return Some((headers, body));
    }
    let mut body = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let size_text = line.trim_end();
        let size_text = size_text.split(';').next()?;
        let size = usize::from_str_radix(size_text.trim(), 16).ok()?;
        if size == 0 {
            // Trailers, if any, then the blank line.
            loop {
                line.clear();
                reader.read_line(&mut line).ok()?;
                if line.trim_end().is_empty() {
                    return Some((headers, body));
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).ok()?;
        line.clear();
        reader.read_line(&mut line).ok()?;
    }
}
