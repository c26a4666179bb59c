//! Parallel clients for counting admitted vs limited requests.
//!
//! Each thread owns one keep-alive [`Client`], so requests land on Envoy's workers the way a few
//! real clients would. This is for correctness under concurrency (never over-admit), not for
//! throughput numbers: `just bench` with wrk measures speed.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::http::{Client, Request, Response};

/// One request of a run.
#[derive(Debug)]
pub struct Outcome {
    pub thread: usize,
    /// The global request index `i` given to `make_request`.
    pub index: usize,
    pub response: Result<Response, String>,
}

impl Outcome {
    /// The status, or `None` for an I/O error.
    pub fn status(&self) -> Option<u16> {
        self.response.as_ref().ok().map(|r| r.status)
    }
}

/// All outcomes of a run, ordered by `index`.
#[derive(Debug)]
pub struct LoadReport {
    pub outcomes: Vec<Outcome>,
    pub elapsed: Duration,
}

impl LoadReport {
    /// How many responses had `status`.
    pub fn count(&self, status: u16) -> usize {
        self.outcomes
            .iter()
            .filter(|o| o.status() == Some(status))
            .count()
    }

    /// Status → count (I/O errors are not counted here; see [`errors`](Self::errors)).
    pub fn status_counts(&self) -> BTreeMap<u16, usize> {
        let mut m = BTreeMap::new();
        for s in self.outcomes.iter().filter_map(Outcome::status) {
            *m.entry(s).or_insert(0) += 1;
        }
        m
    }

    /// `(index, message)` of every request that got no response.
    pub fn errors(&self) -> Vec<(usize, &str)> {
        self.outcomes
            .iter()
            .filter_map(|o| o.response.as_ref().err().map(|e| (o.index, e.as_str())))
            .collect()
    }

    /// Panics with the first few errors if any request failed at the I/O level.
    pub fn assert_no_errors(&self) {
        let errors = self.errors();
        assert!(
            errors.is_empty(),
            "{} of {} requests failed: {:?}",
            errors.len(),
            self.outcomes.len(),
            &errors[..errors.len().min(5)]
        );
    }
}

/// Sends `total` requests to `127.0.0.1:port` from `threads` threads. Thread `t` sends the
/// requests with index `i ≡ t (mod threads)`, in increasing order, each built by
/// `make_request(t, i)`. An I/O error is recorded and the thread carries on (with a new
/// connection).
pub fn run_clients<F>(threads: usize, total: usize, port: u16, make_request: F) -> LoadReport
where
    F: Fn(usize, usize) -> Request + Sync,
{
    assert!(threads > 0, "run_clients needs at least one thread");
    let started = Instant::now();
    let make_request = &make_request;
    let mut outcomes: Vec<Outcome> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut client: Option<Client> = None;
                    let mut out = Vec::with_capacity(total / threads + 1);
                    for i in (t..total).step_by(threads) {
                        let req = make_request(t, i);
                        let response = match client.as_mut() {
                            Some(c) => c.request(req),
                            None => Client::connect(port).and_then(|mut c| {
                                let r = c.request(req);
                                client = Some(c);
                                r
                            }),
                        }
                        .map_err(|e| {
                            client = None;
                            e.to_string()
                        });
                        out.push(Outcome {
                            thread: t,
                            index: i,
                            response,
                        });
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a load thread panicked"))
            })
            .collect()
    });
    outcomes.sort_by_key(|o| o.index);
    LoadReport {
        outcomes,
        elapsed: started.elapsed(),
    }
}
