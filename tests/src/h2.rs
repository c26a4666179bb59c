//! A crowd of HTTP/2 streams on one connection: the least of an HTTP/2 client (cleartext,
//! prior knowledge) that sends every request at once and waits until each stream ends.
//!
//! Why not curl: `curl --http2-prior-knowledge --parallel --parallel-max 300` (curl
//! 7.88, Debian 12) against Envoy 1.40 completed 1 transfer of 300 on its one
//! connection and failed the other 299 (`%{http_code}` 000), and libcurl caps the
//! streams of a connection at 100 by default anyway (`CURLMOPT_MAX_CONCURRENT_STREAMS`).
//! It does not read what comes back beyond the frames' headers: HPACK-decoding
//! responses is more than a test needs, as Envoy's access log has every request's status
//! and the upstream's witness what reached it. It sends its HEADERS without HPACK's
//! dynamic table or Huffman coding, which every server must accept.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// What the client lets the server send before it says it read it: more than a test's
/// answers, so it never has to.
const WINDOW: u32 = 1 << 30;

/// How one stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The response ended (`END_STREAM`).
    Answered,
    /// The server reset the stream, with this error code.
    Reset(u32),
}

/// GETs `paths[i]` with `headers` on one connection to `127.0.0.1:port`, all at once
/// (every HEADERS frame in one write), and waits up to `timeout` for every stream to end;
/// how each ended, in order.
pub fn crowd(
    port: u16,
    requests: &[(String, Vec<(String, String)>)],
    timeout: Duration,
) -> io::Result<Vec<StreamEnd>> {
    let mut conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_nodelay(true)?;
    let mut out = PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE (4) for every stream, then the connection's window.
    frame(
        &mut out,
        SETTINGS,
        0,
        0,
        &[&[0, 4][..], &WINDOW.to_be_bytes()].concat(),
    );
    frame(
        &mut out,
        WINDOW_UPDATE,
        0,
        0,
        &(WINDOW - 65_535).to_be_bytes(),
    );
    let authority = format!("127.0.0.1:{port}");
    for (i, (path, headers)) in requests.iter().enumerate() {
        let mut block = vec![0x82, 0x86]; // :method GET, :scheme http (static table)
        literal_indexed_name(&mut block, 4, path); // :path
        literal_indexed_name(&mut block, 1, &authority); // :authority
        for (name, value) in headers {
            block.push(0x00); // a literal without indexing, its name a literal too
            string(&mut block, &name.to_ascii_lowercase());
            string(&mut block, value);
        }
        frame(
            &mut out,
            HEADERS,
            END_HEADERS | END_STREAM,
            stream_id(i),
            &block,
        );
    }
    conn.write_all(&out)?;

    let mut ends: Vec<Option<StreamEnd>> = vec![None; requests.len()];
    let deadline = Instant::now() + timeout;
    while ends.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} of {} streams still open after {timeout:?}",
                    ends.iter().filter(|e| e.is_none()).count(),
                    requests.len()
                ),
            ));
        }
        conn.set_read_timeout(Some(left))?;
        let mut head = [0u8; 9];
        conn.read_exact(&mut head)?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload)?;
        let index = (stream % 2 == 1).then(|| (stream as usize - 1) / 2);
        let end = match kind {
            HEADERS | DATA if flags & END_STREAM != 0 => Some(StreamEnd::Answered),
            RST_STREAM => Some(StreamEnd::Reset(code(&payload))),
            SETTINGS if flags & ACK == 0 => {
                let mut ack = Vec::new();
                frame(&mut ack, SETTINGS, ACK, 0, &[]);
                conn.write_all(&ack)?;
                None
            }
            PING if flags & ACK == 0 => {
                let mut pong = Vec::new();
                frame(&mut pong, PING, ACK, 0, &payload);
                conn.write_all(&pong)?;
                None
            }
            GOAWAY => {
                return Err(io::Error::other(format!(
                    "GOAWAY (error {}) with {} streams open",
                    code(payload.get(4..).unwrap_or_default()),
                    ends.iter().filter(|e| e.is_none()).count()
                )))
            }
            _ => None,
        };
        if let (Some(end), Some(slot)) = (end, index.and_then(|i| ends.get_mut(i))) {
            slot.get_or_insert(end);
        }
    }
    Ok(ends.into_iter().flatten().collect())
}

/// The client's `i`-th stream: odd ids from 1.
fn stream_id(i: usize) -> u32 {
    2 * i as u32 + 1
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A header whose name is entry `index` of HPACK's static table, its value a literal,
/// not indexed.
fn literal_indexed_name(block: &mut Vec<u8>, index: u8, value: &str) {
    integer(block, 0x00, 4, u64::from(index));
    string(block, value);
}

/// An HPACK string literal, not Huffman-coded.
fn string(block: &mut Vec<u8>, s: &str) {
    integer(block, 0x00, 7, s.len() as u64);
    block.extend_from_slice(s.as_bytes());
}

/// An HPACK integer with an `n`-bit prefix, the bits above it `first`.
fn integer(block: &mut Vec<u8>, first: u8, n: u32, mut value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        block.push(first | value as u8);
        return;
    }
    block.push(first | max as u8);
    value -= max;
    while value >= 128 {
        block.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    block.push(value as u8);
}

fn code(payload: &[u8]) -> u32 {
    payload
        .get(..4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_hpack_examples() {
        // RFC 7541 C.1: 10 and 1337 with a 5-bit prefix, 42 with 8 bits.
        let mut b = Vec::new();
        integer(&mut b, 0, 5, 10);
        integer(&mut b, 0, 5, 1337);
        integer(&mut b, 0, 8, 42);
        assert_eq!(b, [10, 31, 154, 10, 42]);
    }

    #[test]
    fn a_crowd_gets_every_stream_answered_by_envoy() {
        let envoy = crate::Envoy::start(&crate::Bootstrap::new(), 1);
        let requests: Vec<_> = (0..150)
            .map(|i| {
                (
                    "/".to_string(),
                    vec![("x-user".to_string(), format!("u{i}"))],
                )
            })
            .collect();
        let ends = crowd(envoy.http_port, &requests, Duration::from_secs(10)).unwrap();
        assert_eq!(ends, vec![StreamEnd::Answered; 150]);
        assert_eq!(
            envoy.stat("http.ingress.downstream_cx_http2_total"),
            Some(1)
        );
        assert_eq!(envoy.stat("http.ingress.downstream_rq_2xx"), Some(150));
    }
}
