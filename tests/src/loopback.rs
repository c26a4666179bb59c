//! What the test upstreams share: a listener on 127.0.0.1 that serves every connection
//! on its own thread until it is dropped, a reader of HTTP/1.1 requests whose headers
//! steer the answer, the Envoy cluster that points at it, and a [`Witness`]: what the
//! upstream received of each request, body bytes counted as they came.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
        cluster_yaml(name, self.port, extra)
    }
}

/// A STATIC Envoy cluster `name` pointing at `127.0.0.1:port`, with `extra` as in
/// [`Loopback::cluster_yaml`].
pub fn cluster_yaml(name: &str, port: u16, extra: &str) -> String {
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
            socket_address: {{ address: 127.0.0.1, port_value: {port} }}
"
    )
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

/// What an upstream received of one request: its head, and how much of its body came
/// before the request or its connection ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Headers,
    /// Body bytes received.
    pub body_bytes: usize,
    /// Whether the whole body came, as its `content-length` or chunked framing says (a
    /// request without a body is complete once its headers are).
    pub complete: bool,
}

impl Received {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every request an upstream received, in the order their headers came: the upstream as a
/// witness of what Envoy let through, whatever the client was answered. A request is
/// recorded as soon as its headers are read, and its body bytes are counted as they
/// arrive, so a request Envoy started and then reset shows as received with an
/// incomplete body. Clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Witness {
    received: Arc<Mutex<Vec<Received>>>,
}

/// A request's place in its [`Witness`].
#[derive(Debug, Clone, Copy)]
struct ReceivedId(usize);

impl Witness {
    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().clone()
    }

    /// The requests whose header `name` (lowercase) was `value`.
    pub fn with_header(&self, name: &str, value: &str) -> Vec<Received> {
        self.lock()
            .iter()
            .filter(|r| r.header(name) == Some(value))
            .cloned()
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, received: Received) -> ReceivedId {
        let mut all = self.lock();
        all.push(received);
        ReceivedId(all.len() - 1)
    }

    fn update(&self, id: ReceivedId, body_bytes: usize, complete: bool) {
        if let Some(r) = self.lock().get_mut(id.0) {
            r.body_bytes = body_bytes;
            r.complete = complete;
        }
    }
}

/// Reads one request of a keep-alive connection: its headers (names in lowercase) and
/// its body, sent with a `content-length` or chunked.
pub fn read_request_with_body(reader: &mut BufReader<TcpStream>) -> Option<(Headers, Vec<u8>)> {
    read_request_seen(reader, None)
}

/// [`read_request_with_body`], recording what came in `witness`, even when the
/// connection ends before the body does.
pub fn read_witnessed(
    reader: &mut BufReader<TcpStream>,
    witness: &Witness,
) -> Option<(Headers, Vec<u8>)> {
    read_request_seen(reader, Some(witness))
}

fn read_request_seen(
    reader: &mut BufReader<TcpStream>,
    witness: Option<&Witness>,
) -> Option<(Headers, Vec<u8>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut request_line = line.split_whitespace();
    let (method, path) = (
        request_line.next().unwrap_or_default().to_string(),
        request_line.next().unwrap_or_default().to_string(),
    );
    let (mut headers, mut content_length, mut chunked) = (Vec::new(), 0usize, false);
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
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
    let id = witness.map(|w| {
        w.record(Received {
            method,
            path,
            headers: headers.clone(),
            body_bytes: 0,
            complete: false,
        })
    });
    let seen = |body: &Vec<u8>, complete: bool| {
        if let (Some(w), Some(id)) = (witness, id) {
            w.update(id, body.len(), complete);
        }
    };
    let mut body = Vec::new();
    let complete = if chunked {
        read_chunked(reader, &mut body, &seen)
    } else {
        read_counted(reader, content_length, &mut body, &seen)
    };
    seen(&body, complete.is_some());
    complete.map(|()| (headers, body))
}

/// Appends exactly `n` bytes of `reader` to `body`, telling `seen` after every read;
/// `None` if the connection ends first.
fn read_counted(
    reader: &mut BufReader<TcpStream>,
    n: usize,
    body: &mut Vec<u8>,
    seen: &impl Fn(&Vec<u8>, bool),
) -> Option<()> {
    let end = body.len() + n;
    let mut buf = [0u8; 64 * 1024];
    while body.len() < end {
        let want = (end - body.len()).min(buf.len());
        let got = reader.read(&mut buf[..want]).ok()?;
        if got == 0 {
            return None;
        }
        body.extend_from_slice(&buf[..got]);
        seen(body, false);
    }
    Some(())
}

/// Reads a chunked body (and its trailers) into `body`.
fn read_chunked(
    reader: &mut BufReader<TcpStream>,
    body: &mut Vec<u8>,
    seen: &impl Fn(&Vec<u8>, bool),
) -> Option<()> {
    let mut line = String::new();
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
                    return Some(());
                }
            }
        }
        read_counted(reader, size, body, seen)?;
        line.clear();
        reader.read_line(&mut line).ok()?;
    }
}
