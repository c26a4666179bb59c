//! `weir-bench features`: the figures of the features that are not about a request's
//! cost — token budgets (costs known after the response), delay instead of reject and
//! fair shares ([`crate::shares`]) — each next to what a user would otherwise run, on
//! real Envoys.
//!
//! **Token budgets.** A stand-in LLM API ([`weir_e2e::LlmUpstream`]) answers every request
//! with the usage it asks for, as a stream lasting 100–400 ms. `THREADS` clients send chat
//! requests whose body says `max_tokens` (200–1,000) and which really use 20–100 % of it,
//! for one tenant whose budget is `BUDGET` tokens for the run (a token bucket refilled
//! once an hour). Offered: about four budgets. Three limiters:
//! - `estimate-only`: the rule charges the estimate from the body (`cost.body`: max
//!   tokens + size / 4) and never corrects it — what a limiter that cannot see the
//!   response admits;
//! - `commit (local)`: the same estimate, settled with the response's usage;
//! - `commit (global)`: the same on two Envoys sharing the budget in Redis (weir-bridge,
//!   `/v3/commit`);
//! - `commit + clamp`, local and global: the same with `commit.clamp`, a request over
//!   what is left sent with its `max_tokens` lowered to fit. The stand-in honours the
//!   bound it receives (`x-llm-output`): a clamped answer stops there, and its usage is
//!   what its stream reports.
//!
//! Reported: tokens offered, tokens admitted (the usage of the requests let through),
//! overshoot over the budget (must be 0: the estimates are upper bounds) and the share of
//! the budget used. (Charging only after the fact, with no reservation, is what
//! overruns budgets — envoyproxy/ai-gateway#680; Envoy has no such filter to run here.)
//!
//! **Delay.** One key of GCRA 100/s (burst 10) offered 500 requests/s by a paced
//! generator, with `on_limit.delay` (`max` 500 ms) and without (Envoy's own
//! `local_ratelimit` rejects the same way): admitted, limited, the wait of released
//! requests (from `x-weir-delay-ms`), and the conformance check of every admission in the
//! access log.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::decisions::{with_decisions, Logs};
use weir_e2e::{
    wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Client, Envoy, LlmUpstream, RedisCluster,
    Request, TestDir,
};

/// The tenant's budget for a run, tokens.
pub const BUDGET: u64 = 50_000;
/// Client threads of a token run.
pub const THREADS: u64 = 24;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TokenRun {
    pub limiter: String,
    pub budget: u64,
    pub seconds: f64,
    pub requests: u64,
    pub admitted: u64,
    pub limited: u64,
    pub tokens_offered: u64,
    pub tokens_admitted: u64,
    /// Tokens admitted beyond the budget.
    pub overshoot: u64,
    /// Tokens admitted / budget, %.
    pub budget_used_pct: f64,
    /// Requests sent with their `max_tokens` lowered (`commit.clamp`).
    #[serde(default)]
    pub clamped: u64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DelayRun {
    pub limiter: String,
    pub offered_rps: f64,
    pub seconds: f64,
    pub requests: u64,
    pub admitted: u64,
    pub limited: u64,
    /// Admitted per second after the first second (the burst).
    pub admitted_per_s_after_1s: f64,
    pub waited: u64,
    pub wait_p50_ms: u64,
    pub wait_p99_ms: u64,
    pub wait_max_ms: u64,
    /// The conformance checker's verdict on the access log's admissions.
    pub conformance: String,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FeatureResults {
    pub tokens: Vec<TokenRun>,
    pub delay: Vec<DelayRun>,
    /// Fair shares ([`crate::shares`]).
    #[serde(default)]
    pub shares: Vec<crate::shares::ShareRow>,
}

/// A rule's `commit`, settled from the response body; with `commit.clamp`.
const COMMIT: &str = r#","commit":{"body":{}}"#;
const CLAMP: &str = r#","commit":{"body":{},"clamp":{}}"#;

/// The tenant's rule; `commit` is "" (estimate only), [`COMMIT`] or [`CLAMP`]. Its stats
/// are `detailed`: the run reads `commit_clamped`.
fn token_config(commit: &str, global: bool) -> String {
    let scope = if global { r#""scope":"global","# } else { "" };
    let bridge = if global {
        r#""bridge":{"cluster":"weir_bridge","timeout":"500ms"},"#
    } else {
        ""
    };
    format!(
        r#"{{{bridge}"rules":[{{"name":"tokens","stats":"detailed",{scope}"key":[{{"header":"x-tenant"}}],
        "limit":{{"algorithm":"token_bucket","capacity":{BUDGET},"refill":{BUDGET},"period":"1h"}},
        "cost":{{"body":{{}},"default":2000,"max":2000}}{commit}}}]}}"#
    )
}

/// `THREADS` clients over `ports` for `secs`: chat requests as the module says.
fn token_load(limiter: &str, ports: &[u16], secs: f64) -> TokenRun {
    let offered = AtomicU64::new(0);
    let admitted_tokens = AtomicU64::new(0);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(secs);
    let statuses: BTreeMap<u16, u64> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (offered, admitted_tokens) = (&offered, &admitted_tokens);
                let port = ports[t as usize % ports.len()];
                s.spawn(move || {
                    let mut client = Client::connect(port).expect("connect to Envoy");
                    let mut statuses = BTreeMap::new();
                    let mut i = 0u64;
                    while Instant::now() < end {
                        let x = t.wrapping_mul(7_919).wrapping_add(i.wrapping_mul(104_729));
                        let max_tokens = 200 + x % 801;
                        let usage = max_tokens * (20 + (x / 7) % 81) / 100;
                        let body = format!(
                            r#"{{"model":"m","max_tokens":{max_tokens},"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
                        );
                        // A model that would write `usage` tokens, within the body's bound.
                        let request = Request::post("/v1/chat/completions", body)
                            .header("x-tenant", "acme")
                            .header("x-llm-output", usage.to_string())
                            .header("x-llm-stream", "1")
                            .header("x-llm-duration-ms", (100 + x % 301).to_string());
                        offered.fetch_add(usage, Ordering::Relaxed);
                        let (status, used) = match client.request(request) {
                            Ok(r) => (r.status, stream_usage(&r.body).unwrap_or(usage)),
                            Err(_) => (0, 0),
                        };
                        if status == 200 {
                            admitted_tokens.fetch_add(used, Ordering::Relaxed);
                        } else if status == 429 {
                            // A denied client backs off a little, as a real one would.
                            thread::sleep(Duration::from_millis(20));
                        }
                        *statuses.entry(status).or_insert(0u64) += 1;
                        i += 1;
                    }
                    statuses
                })
            })
            .collect();
        let mut all = BTreeMap::new();
        for h in handles {
            for (status, n) in h.join().expect("a client thread") {
                *all.entry(status).or_insert(0) += n;
            }
        }
        all
    });
    let tokens_admitted = admitted_tokens.load(Ordering::Relaxed);
    TokenRun {
        limiter: limiter.to_string(),
        budget: BUDGET,
        seconds: started.elapsed().as_secs_f64(),
        requests: statuses.values().sum(),
        admitted: statuses.get(&200).copied().unwrap_or(0),
        limited: statuses.get(&429).copied().unwrap_or(0),
        tokens_offered: offered.load(Ordering::Relaxed),
        tokens_admitted,
        overshoot: tokens_admitted.saturating_sub(BUDGET),
        budget_used_pct: 100.0 * tokens_admitted as f64 / BUDGET as f64,
        clamped: 0,
    }
}

/// The last `total_tokens` an answer's stream reports.
fn stream_usage(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    let (_, after) = text.rsplit_once("\"total_tokens\":")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// What the Envoys counted as clamped; 0 for a rule without `commit`, which has no
/// `commit_clamped`.
fn clamped(envoys: &[&Envoy]) -> u64 {
    std::thread::sleep(weir_e2e::WEIR_STATS_LAG);
    envoys
        .iter()
        .flat_map(|e| e.stats_matching(r"^wasmcustom\.weir\.weir\.rule\.tokens\.commit_clamped$"))
        .map(|(_, n)| n)
        .sum()
}

fn local_token_run(limiter: &str, commit: &str, upstream: &LlmUpstream, secs: f64) -> TokenRun {
    let filter = wasm_filter_yaml(&token_config(commit, false), &weir_wasm());
    let envoy = Envoy::start(&upstream.bootstrap(filter, None), 2);
    let mut run = token_load(limiter, &[envoy.http_port], secs);
    run.clamped = clamped(&[&envoy]);
    envoy.assert_no_panic();
    run
}

fn global_token_run(limiter: &str, commit: &str, upstream: &LlmUpstream, secs: f64) -> TokenRun {
    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    let config = token_config(commit, true);
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| {
            let filter = wasm_filter_yaml(&config, &weir_wasm());
            Envoy::start(&upstream.bootstrap(filter, Some(bridge.port)), 2)
        })
        .collect();
    let ports: Vec<u16> = envoys.iter().map(|e| e.http_port).collect();
    let mut run = token_load(limiter, &ports, secs);
    run.clamped = clamped(&envoys.iter().collect::<Vec<_>>());
    for e in &envoys {
        e.assert_no_panic();
    }
    run
}

/// The delay runs: the same GCRA key with and without `on_limit.delay`.
fn delay_run(limiter: &str, delay: bool, secs: f64) -> DelayRun {
    const OFFERED: f64 = 500.0;
    let on_limit = if delay {
        r#","on_limit":{"delay":{"max":"500ms","queue":1000}}"#
    } else {
        ""
    };
    let config = with_decisions(&format!(
        r#"{{"rules":[{{"name":"api","key":[{{"header":"x-user"}}],
        "limit":{{"algorithm":"gcra","rate":100,"period":"1s","burst":10}}{on_limit}}}]}}"#
    ));
    let dir = TestDir::new("bench-delay");
    let logs = Logs::new(dir.path(), 1, "x-user");
    let bootstrap = logs.add_to(
        0,
        Bootstrap::new().http_filter(wasm_filter_yaml(&config, &weir_wasm())),
    );
    let envoy = Envoy::start(&bootstrap, 2);
    let total = (OFFERED * secs) as u64;
    let threads = 200u64;
    let started = Instant::now() + Duration::from_millis(50);
    // (status, answered at, waited ms)
    let seen: Vec<(u16, Duration, Option<u64>)> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let port = envoy.http_port;
                s.spawn(move || {
                    let mut client = Client::connect(port).expect("connect to Envoy");
                    let mut seen = Vec::new();
                    for i in (t..total).step_by(threads as usize) {
                        let due = started + Duration::from_secs_f64(i as f64 / OFFERED);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                        let r = client.request(Request::get("/api").header("x-user", "alice"));
                        let (status, waited) = match r {
                            Ok(r) => (
                                r.status,
                                r.header("x-weir-delay-ms").and_then(|v| v.parse().ok()),
                            ),
                            Err(_) => (0, None),
                        };
                        seen.push((status, started.elapsed(), waited));
                    }
                    seen
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a client thread"))
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let admitted = seen.iter().filter(|s| s.0 == 200).count() as u64;
    let after_1s = seen
        .iter()
        .filter(|s| s.0 == 200 && s.1 >= Duration::from_secs(1))
        .count() as f64;
    let mut waits: Vec<u64> = seen.iter().filter_map(|s| s.2).collect();
    waits.sort_unstable();
    let pct = |p: f64| -> u64 {
        if waits.is_empty() {
            return 0;
        }
        let at = ((waits.len() as f64 - 1.0) * p).round() as usize;
        waits[at.min(waits.len() - 1)]
    };
    let lines = logs.read(seen.len());
    let refs: Vec<&[weir_e2e::decisions::Logged]> = lines.iter().map(Vec::as_slice).collect();
    let judge = weir_e2e::decisions::Judge::configured(&config, "api");
    let conformance = match judge.check(&refs) {
        Ok(c) => format!("ok ({} admissions checked)", c.requests),
        Err(v) => format!("VIOLATED: {v}"),
    };
    envoy.assert_no_panic();
    DelayRun {
        limiter: limiter.to_string(),
        offered_rps: OFFERED,
        seconds,
        requests: seen.len() as u64,
        admitted,
        limited: seen.iter().filter(|s| s.0 == 429).count() as u64,
        admitted_per_s_after_1s: after_1s / (seconds - 1.0).max(0.001),
        waited: waits.len() as u64,
        wait_p50_ms: pct(0.5),
        wait_p99_ms: pct(0.99),
        wait_max_ms: waits.last().copied().unwrap_or(0),
        conformance,
    }
}

/// Every feature run; `secs` per run.
pub fn run_all(secs: f64) -> FeatureResults {
    let upstream = LlmUpstream::start();
    let tokens = vec![
        local_token_run("estimate only (local)", "", &upstream, secs),
        local_token_run("commit (local)", COMMIT, &upstream, secs),
        global_token_run("commit (global, 2 Envoys)", COMMIT, &upstream, secs),
        local_token_run("commit + clamp (local)", CLAMP, &upstream, secs),
        global_token_run("commit + clamp (global, 2 Envoys)", CLAMP, &upstream, secs),
    ];
    let delay = vec![
        delay_run("reject (429 at once)", false, secs),
        delay_run("delay (max 500 ms)", true, secs),
    ];
    let shares = crate::shares::run_all(secs);
    FeatureResults {
        tokens,
        delay,
        shares,
    }
}

/// The problems a run shows (a smoke run fails on any).
pub fn problems(r: &FeatureResults) -> Vec<String> {
    let mut out = Vec::new();
    for t in &r.tokens {
        if t.admitted == 0 || t.tokens_offered == 0 {
            out.push(format!("tokens {}: nothing admitted or offered", t.limiter));
        }
        if t.overshoot > 0 {
            out.push(format!(
                "tokens {}: {} tokens over the budget",
                t.limiter, t.overshoot
            ));
        }
    }
    for d in &r.delay {
        if d.admitted == 0 {
            out.push(format!("delay {}: nothing admitted", d.limiter));
        }
        if !d.conformance.starts_with("ok") {
            out.push(format!("delay {}: {}", d.limiter, d.conformance));
        }
    }
    out.extend(crate::shares::problems(&r.shares));
    out
}

fn num(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

/// The Markdown page of the feature runs, with the shares' picture when one was drawn.
pub fn markdown(
    r: &FeatureResults,
    generated: &str,
    command: &str,
    shares_png: Option<&str>,
) -> String {
    let mut o = format!(
        "# Benchmarks: token budgets, delay and fair shares\n\n\
         Generated by `{command}` ({generated}); the code is `bench/src/features.rs`. The \
         cost and accuracy benchmarks are in [benchmarks.md](benchmarks.md), concurrency \
         limits in [benchmarks-concurrency.md](benchmarks-concurrency.md).\n\n\
         ## Token budgets (costs known after the response)\n\n\
         One tenant, a budget of {} tokens for the run, {} clients sending streamed chat \
         requests whose body sets `max_tokens` (200–1,000) and that really use 20–100 % of \
         it. The estimate is the body's `max_tokens` + its size / 4 — an upper bound here — \
         so no limiter may let more than the budget through. Tokens offered are the usage of \
         every request sent, denied ones (retried after 20 ms) included.\n\n\
         | limiter | requests | admitted | limited | clamped | tokens offered | tokens admitted | over budget | budget used |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        BUDGET, THREADS
    );
    for t in &r.tokens {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} % |\n",
            t.limiter,
            t.requests,
            t.admitted,
            t.limited,
            t.clamped,
            t.tokens_offered,
            t.tokens_admitted,
            t.overshoot,
            num(t.budget_used_pct, 2)
        ));
    }
    o.push_str(
        "\nEstimate-only admits what the estimates allow and wastes the difference; the \
         commit gives it back when the response ends. A commit still denies a request while \
         less than its estimate is left; with `commit.clamp` it is sent with its `max_tokens` \
         lowered to what is left (the clamped column), and its answer stops there. Limiting on the usage alone, after the \
         fact, has no reservation and overruns the budget by what is in flight when it runs \
         out (envoyproxy/ai-gateway#680); Envoy has no such filter to run next to these.\n\n\
         ## Delay instead of reject\n\n\
         One key of GCRA 100/s, burst 10, offered 500 requests/s by a paced generator (200 \
         connections). Envoy's `local_ratelimit` would answer like the first row.\n\n\
         | limiter | seconds | requests | admitted | limited | admitted/s after 1 s | waited | wait p50 / p99 / max (ms) | conformance |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for d in &r.delay {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |\n",
            d.limiter,
            num(d.seconds, 1),
            d.requests,
            d.admitted,
            d.limited,
            num(d.admitted_per_s_after_1s, 1),
            d.waited,
            d.wait_p50_ms,
            d.wait_p99_ms,
            d.wait_max_ms,
            d.conformance
        ));
    }
    o.push_str(&crate::shares::markdown(&r.shares, shares_png));
    o
}
