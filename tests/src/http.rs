//! A minimal blocking HTTP/1.1 client over `std::net::TcpStream`.
//!
//! Why not an HTTP crate: tests must send what a real client would never build — header values
//! that are not UTF-8, 60 KB values, odd names — and see exactly what Envoy answers. Header values
//! are bytes both ways. Keep-alive is on; a connection the server closed while idle is replaced
//! transparently (only when nothing of the response was read, so a request is never counted twice
//! by a rate limiter). Every socket operation times out after 5 s so a test cannot hang.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Connect, read and write timeout.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// An HTTP/1.1 request. `Host` and `Content-Length` are added unless given in `headers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            ..Request::default()
        }
    }

    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    pub fn post(path: &str, body: impl Into<Vec<u8>>) -> Request {
        Request::new("POST", path).body(body)
    }

    /// Appends a header; the value is sent byte for byte.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
        self.headers
            .push((name.to_string(), value.as_ref().to_vec()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// The bytes on the wire.
    pub fn encode(&self, port: u16) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.path).as_bytes());
        if !self.has_header("host") {
            out.extend_from_slice(format!("host: 127.0.0.1:{port}\r\n").as_bytes());
        }
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        let needs_length =
            !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH");
        if needs_length
            && !self.has_header("content-length")
            && !self.has_header("transfer-encoding")
        {
            out.extend_from_slice(format!("content-length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// A parsed response. Header names are lowercase; repeated headers are kept in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of `name` (case-insensitive), if present and UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_bytes(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of `name`, as bytes.
    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<&[u8]> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A keep-alive connection to `127.0.0.1:port`, opened lazily and reopened when needed.
#[derive(Debug)]
pub struct Client {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
    /// How many TCP connections this client has opened (tests can assert keep-alive worked).
    pub connects: usize,
}

impl Client {
    /// Connects now, so a refused connection fails here rather than at the first request.
    pub fn connect(port: u16) -> io::Result<Client> {
        let mut c = Client {
            port,
            conn: None,
            connects: 0,
        };
        c.conn = Some(c.open()?);
        Ok(c)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn open(&mut self) -> io::Result<BufReader<TcpStream>> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        stream.set_nodelay(true)?;
        self.connects += 1;
        Ok(BufReader::with_capacity(64 * 1024, stream))
    }

    /// Sends one request and reads its response.
    pub fn request(&mut self, req: Request) -> io::Result<Response> {
        let wire = req.encode(self.port);
        let head_only = req.method.eq_ignore_ascii_case("HEAD");
        // A reused connection may have been closed by the server while idle: check before
        // sending, and if the server still closes it before answering a byte, resend once.
        let reused = match self.conn.take() {
            Some(c) if still_open(c.get_ref()) => {
                self.conn = Some(c);
                true
            }
            _ => false,
        };
        match self.round_trip(&wire, head_only) {
            Err(RoundTripError::ClosedBeforeResponse(_)) if reused => {
                self.conn = None;
                self.round_trip(&wire, head_only)
                    .map_err(RoundTripError::into_io)
            }
            r => r.map_err(RoundTripError::into_io),
        }
    }

    fn round_trip(&mut self, wire: &[u8], head_only: bool) -> Result<Response, RoundTripError> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.open().map_err(RoundTripError::Other)?,
        };
        if let Err(e) = conn.get_mut().write_all(wire) {
            return Err(match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    RoundTripError::ClosedBeforeResponse(e)
                }
                _ => RoundTripError::Other(e),
            });
        }
        let (resp, keep_alive) = read_response(&mut conn, head_only)?;
        if keep_alive {
            self.conn = Some(conn);
        }
        Ok(resp)
    }
}

enum RoundTripError {
    /// The connection ended before any byte of a response: the request can be resent.
    ClosedBeforeResponse(io::Error),
    Other(io::Error),
}

impl RoundTripError {
    fn into_io(self) -> io::Error {
        match self {
            RoundTripError::ClosedBeforeResponse(e) | RoundTripError::Other(e) => e,
        }
    }
}

impl From<io::Error> for RoundTripError {
    fn from(e: io::Error) -> Self {
        RoundTripError::Other(e)
    }
}

/// True unless the peer has closed (or sent unsolicited bytes on) an idle connection.
fn still_open(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let open = matches!(stream.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).is_ok() && open
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads a CRLF- (or LF-) terminated line without the terminator. `Ok(None)` on clean EOF.
fn read_line(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed in the middle of a line",
        ));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(line))
}

fn read_response(
    r: &mut BufReader<TcpStream>,
    head_only: bool,
) -> Result<(Response, bool), RoundTripError> {
    let mut first = true;
    loop {
        let status_line = match read_line(r) {
            Ok(Some(l)) => l,
            Ok(None) if first => {
                return Err(RoundTripError::ClosedBeforeResponse(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection without a response",
                )))
            }
            Ok(None) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Err(e) if first && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(RoundTripError::ClosedBeforeResponse(e))
            }
            Err(e) => return Err(e.into()),
        };
        first = false;
        let (resp, keep_alive) = parse_rest(r, &status_line, head_only)?;
        // 1xx are interim: the real response follows on the same connection.
        if (100..200).contains(&resp.status) && resp.status != 101 {
            continue;
        }
        return Ok((resp, keep_alive));
    }
}

fn parse_rest(
    r: &mut BufReader<TcpStream>,
    status_line: &[u8],
    head_only: bool,
) -> io::Result<(Response, bool)> {
    let line = String::from_utf8_lossy(status_line);
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default().to_string();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let reason = parts.next().unwrap_or_default().to_string();
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("bad status line {line:?}")));
    }

    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?.ok_or_else(|| bad("EOF in response headers"))?;
        if line.is_empty() {
            break;
        }
        let colon = line.iter().position(|&b| b == b':').ok_or_else(|| {
            bad(format!(
                "bad header line {:?}",
                String::from_utf8_lossy(&line)
            ))
        })?;
        let (name, value) = line.split_at(colon);
        let name = String::from_utf8_lossy(name).trim().to_ascii_lowercase();
        let value = value.get(1..).unwrap_or_default().trim_ascii().to_vec();
        headers.push((name, value));
    }
    let mut resp = Response {
        status,
        reason,
        headers,
        body: Vec::new(),
    };

    let has_token = |name: &str, token: &str| {
        resp.header_all(name).iter().any(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    };
    let mut keep_alive = if version == "HTTP/1.0" {
        has_token("connection", "keep-alive")
    } else {
        !has_token("connection", "close")
    };
    let chunked = has_token("transfer-encoding", "chunked");
    let no_body = head_only || (100..200).contains(&status) || status == 204 || status == 304;

    if no_body {
    } else if chunked {
        resp.body = read_chunked(r)?;
    } else if let Some(len) = resp.header("content-length") {
        let len: usize = len
            .trim()
            .parse()
            .map_err(|_| bad(format!("bad content-length {len:?}")))?;
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        resp.body = body;
    } else {
        // Delimited by close.
        r.read_to_end(&mut resp.body)?;
        keep_alive = false;
    }
    Ok((resp, keep_alive))
}

fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?.ok_or_else(|| bad("EOF in chunk size"))?;
        let line = String::from_utf8_lossy(&line);
        let size = line.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(size, 16).map_err(|_| bad(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailers, then the empty line.
            while !read_line(r)?
                .ok_or_else(|| bad("EOF in trailers"))?
                .is_empty()
            {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        if !read_line(r)?
            .ok_or_else(|| bad("EOF after chunk"))?
            .is_empty()
        {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

/// One request on a fresh connection.
pub fn send(port: u16, req: Request) -> io::Result<Response> {
    let mut c = Client {
        port,
        conn: None,
        connects: 0,
    };
    c.request(req)
}

/// `GET path` with string headers on a fresh connection. For byte values use [`Request::header`]
/// and [`send`].
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> io::Result<Response> {
    let req = headers
        .iter()
        .fold(Request::get(path), |req, (n, v)| req.header(n, v));
    send(port, req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// Serves `conns` connections, one request each, with a chunked response, then closes the
    /// connection without announcing it (no `connection: close`).
    fn one_shot_server(conns: usize) -> u16 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for (n, stream) in listener.incoming().take(conns).enumerate() {
                let mut stream = stream.unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let k = stream.read(&mut buf).unwrap();
                    assert!(k > 0);
                    req.extend_from_slice(&buf[..k]);
                }
                let high = req.iter().filter(|&&b| b >= 0x80).count();
                let body = format!("conn {n} saw {high} high bytes");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nX-Multi: a\r\nx-multi: b\r\ntransfer-encoding: chunked\r\n\r\n\
                     {:x}\r\n{body}\r\n0\r\n\r\n",
                    body.len()
                );
                stream.write_all(resp.as_bytes()).unwrap();
            }
        });
        port
    }

    #[test]
    fn parses_chunked_bodies_and_repeated_headers_and_reconnects_after_a_silent_close() {
        let port = one_shot_server(2);
        let mut c = Client::connect(port).unwrap();
        let high: Vec<u8> = (0x80..=0xFF).collect();
        let r = c
            .request(Request::get("/").header("x-high", &high))
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "conn 0 saw 128 high bytes");
        assert_eq!(r.header_all("X-MULTI"), vec![&b"a"[..], &b"b"[..]]);
        assert_eq!(r.header("x-multi"), Some("a"));

        let r = c.request(Request::get("/")).unwrap();
        assert_eq!(r.text(), "conn 1 saw 0 high bytes");
        assert_eq!(c.connects, 2);
    }

    #[test]
    fn encodes_host_and_content_length_unless_given() {
        let wire = Request::post("/p", "abc").encode(8080);
        assert_eq!(
            wire,
            b"POST /p HTTP/1.1\r\nhost: 127.0.0.1:8080\r\ncontent-length: 3\r\n\r\nabc"
        );
        let wire = Request::get("/").header("Host", "x").encode(1);
        assert_eq!(wire, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }
}
