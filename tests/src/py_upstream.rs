//! A stand-in LLM API in Python ([`PyUpstream`], the script `py_upstream.py` next to this
//! file): it reads each request body with `json.loads` on its bytes, as FastAPI and vLLM
//! do, and records the bound on output it read. What weir charges for a body must cover
//! what such a server makes of the same bytes, and weir's own parser is not that server:
//! a UTF-8 BOM, UTF-16, `NaN`, a lone surrogate or a key given twice read one way in
//! Rust and another in Python. This is the differential witness of those tests.
//!
//! It answers an OpenAI chat completion whose usage is `x-llm-usage` (the prompt) plus
//! the least of `x-llm-output` and the body's bound; a body Python refuses gets 400.
//! `GET /__received` (asked directly, not through Envoy) lists what it received.

use std::time::Duration;

use serde::Deserialize;

use crate::http::get;
use crate::loopback::cluster_yaml;
use crate::ports::free_port;
use crate::prereq::python3_bin;
use crate::process::{wait_until, Process, TestDir};

const SCRIPT: &str = include_str!("py_upstream.py");

/// What the Python upstream received of one request.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct PyReceived {
    /// The request's `x-*` headers, names in lowercase.
    pub headers: std::collections::BTreeMap<String, String>,
    pub body_bytes: usize,
    /// The largest of `max_tokens`, `max_completion_tokens` and `max_output_tokens` as
    /// `json.loads` read them (`None`: none set, or the body was refused).
    pub bound: Option<u64>,
    /// Why Python refused the body (answered 400).
    pub error: Option<String>,
}

/// The running Python upstream; killed by PID when dropped.
pub struct PyUpstream {
    pub port: u16,
    // Field order: the process dies before the script's directory goes.
    process: Process,
    _dir: TestDir,
}

impl PyUpstream {
    /// Starts `python3 py_upstream.py PORT` on a free port and waits until it answers.
    pub fn start() -> PyUpstream {
        let dir = TestDir::new("py-upstream");
        let script = dir.write("py_upstream.py", SCRIPT);
        let port = free_port();
        let mut process = Process::spawn(
            python3_bin(),
            [script.to_string_lossy().into_owned(), port.to_string()],
            &[],
        );
        let up = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            get(port, "/__received", &[]).is_ok_and(|r| r.status == 200)
        });
        if !up {
            let running = process.is_running();
            panic!(
                "the Python upstream is not answering after 10 s (running: {running}); log:\n{}",
                process.log()
            );
        }
        PyUpstream {
            port,
            process,
            _dir: dir,
        }
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<PyReceived> {
        let r = get(self.port, "/__received", &[])
            .unwrap_or_else(|e| panic!("the Python upstream: {e}; log:\n{}", self.process.log()));
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("the Python upstream's record: {e}: {}", r.text()))
    }

    /// The Envoy cluster `llm` pointing here.
    pub fn cluster_yaml(&self) -> String {
        cluster_yaml("llm", self.port, "")
    }
}
