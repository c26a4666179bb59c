//! `weir-bench concurrency`: concurrency limits in front of a service that slows down past
//! its knee, side by side with what users would run instead, on the same upstream and
//! the same load.
//!
//! **The service** ([`weir_e2e::KneeUpstream`]): `KNEE` requests served at once, `SERVICE_MS`
//! each, the rest queued first come, first served — at most `KNEE` × 1000 / `SERVICE_MS`
//! requests a second, and past the knee a latency of `SERVICE_MS` × in-flight / `KNEE`.
//!
//! **The load**: closed-loop clients, each sending its next request when the last one is
//! answered (a rejected one — 429 from weir, 503 from Envoy's filter — waits 10 ms
//! first), in three phases of equal length: `KNEE` clients, then twice, then four
//! times as many; the three phases run `rounds` times over (three in `just bench`) on the
//! same Envoy, so a limiter's start (its slow start, its first minRTT probe) is one
//! round of several, and the figures of each load are summed over the rounds.
//!
//! **The limiters**, each on a fresh Envoy (2 workers):
//! - `no limiter` — the router alone: every request queues at the service;
//! - `Envoy adaptive_concurrency` — Envoy's gradient controller with the same latency
//!   percentile (p90), update interval (500 ms) and tolerance (a 25 % buffer) as weir's,
//!   a minRTT measured over 50 requests at concurrency 3 every 10 s (jitter 10 %);
//! - `weir adaptive` — `algorithm: concurrency`, `max_in_flight` 200, `adaptive`
//!   (p90, 500 ms, the defaults otherwise);
//! - `weir fixed at the knee` — `max_in_flight` = `KNEE`: the best static limit, known
//!   here because the benchmark built the service; a user has to guess it.
//!
//! Every 250 ms a sampler reads the limiter's limit (an Envoy gauge) and the requests in
//! flight at the service. Reported per limiter and phase: goodput, P50/P99 latency of the
//! answered requests, the share rejected, and the time after the phase began until the
//! limit entered [knee, 2 × knee] for the rest of the phase (convergence).

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy, KneeUpstream, Request};

/// Requests the service serves at once.
pub const KNEE: u64 = 8;
/// How long the service takes for one request, ms.
pub const SERVICE_MS: u64 = 20;
/// Clients in each phase of a round, as multiples of the knee.
pub const PHASES: [u64; 3] = [1, 2, 4];
/// Rounds of the three phases in a full run.
pub const ROUNDS: usize = 3;
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// A rejected client's pause before its next request.
const BACKOFF: Duration = Duration::from_millis(10);

const ENVOY_ADAPTIVE: &str = r#"- name: envoy.filters.http.adaptive_concurrency
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency
    gradient_controller_config:
      sample_aggregate_percentile: { value: 90 }
      concurrency_limit_params:
        max_concurrency_limit: 200
        concurrency_update_interval: 0.5s
      min_rtt_calc_params:
        interval: 10s
        request_count: 50
        jitter: { value: 10 }
        buffer: { value: 25 }
        min_concurrency: 3
"#;
const ENVOY_LIMIT_STAT: &str =
    "http.ingress.adaptive_concurrency.gradient_controller.concurrency_limit";
const WEIR_LIMIT_STAT: &str = "wasmcustom.weir.weir.rule.route.concurrency_limit";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limiter {
    None,
    EnvoyAdaptive,
    WeirAdaptive,
    WeirFixed,
}

impl Limiter {
    const ALL: [Limiter; 4] = [
        Limiter::None,
        Limiter::EnvoyAdaptive,
        Limiter::WeirAdaptive,
        Limiter::WeirFixed,
    ];

    fn label(self) -> &'static str {
        match self {
            Limiter::None => "no limiter",
            Limiter::EnvoyAdaptive => "Envoy adaptive_concurrency",
            Limiter::WeirAdaptive => "weir adaptive",
            Limiter::WeirFixed => "weir fixed at the knee",
        }
    }

    /// The HTTP filter in front of the router, and the gauge of its limit (`None`: a
    /// fixed limit, `KNEE`).
    fn filter(self) -> Option<(String, Option<&'static str>)> {
        let weir = |limit: &str| {
            let config = format!(
                r#"{{"rules":[{{"name":"route","limit":{{"algorithm":"concurrency",{limit}}}}}]}}"#
            );
            wasm_filter_yaml(&config, &weir_wasm())
        };
        match self {
            Limiter::None => None,
            Limiter::EnvoyAdaptive => Some((ENVOY_ADAPTIVE.to_string(), Some(ENVOY_LIMIT_STAT))),
            Limiter::WeirAdaptive => Some((
                weir(r#""max_in_flight":200,"adaptive":{"latency":"p90","interval":"500ms"}"#),
                Some(WEIR_LIMIT_STAT),
            )),
            Limiter::WeirFixed => Some((weir(&format!(r#""max_in_flight":{KNEE}"#)), None)),
        }
    }
}

/// One sample of the sampler.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Seconds since the load began.
    pub t: f64,
    /// The limiter's limit then (the fixed one's `max_in_flight`; none without limiter).
    pub limit: Option<u64>,
    /// Requests at the service then, queued or served.
    pub upstream_in_flight: u64,
}

/// One window of the answered requests, for the picture.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Window {
    /// Seconds since the load began, at the window's end.
    pub t: f64,
    pub ok_per_s: f64,
    pub p99_ms: f64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PhaseResult {
    /// The round, from 1; 0 for a load's figures summed over every round.
    #[serde(default)]
    pub round: usize,
    pub clients: u64,
    pub seconds: f64,
    pub ok: u64,
    pub rejected: u64,
    pub errors: u64,
    pub goodput_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Rejected / (answered + rejected), %.
    pub rejected_pct: f64,
    /// Seconds after the phase began until the limit stayed in [knee, 2 × knee]; `None`
    /// for no limiter or the fixed one, a limit that never settled there, or the sum of
    /// several rounds.
    pub converged_after_s: Option<f64>,
    /// Lowest and highest limit sampled in the phase's second half.
    pub limit_range_late: Option<(u64, u64)>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LimiterRun {
    pub limiter: String,
    /// Every phase of every round, in the order they ran.
    pub phases: Vec<PhaseResult>,
    /// Each load (clients) over every round.
    #[serde(default)]
    pub totals: Vec<PhaseResult>,
    pub samples: Vec<Sample>,
    pub windows: Vec<Window>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ConcurrencyResults {
    pub knee: u64,
    pub service_ms: u64,
    pub capacity_per_s: f64,
    pub phase_seconds: f64,
    #[serde(default = "one_round")]
    pub rounds: usize,
    pub runs: Vec<LimiterRun>,
}

fn one_round() -> usize {
    1
}

/// The clients of phase `i` of a run (phases of every round, in order).
fn clients_of(i: usize) -> u64 {
    PHASES[i % PHASES.len()] * KNEE
}

/// One answered request: when it ended (s since the load began), its phase, latency
/// and status.
struct Answer {
    ended_s: f64,
    phase: usize,
    latency_us: u64,
    status: u16,
}

/// Every limiter, `rounds` rounds of `phase_secs` per phase.
pub fn run_all(phase_secs: f64, rounds: usize) -> ConcurrencyResults {
    let runs = Limiter::ALL
        .iter()
        .map(|&limiter| {
            let run = run_one(limiter, phase_secs, rounds);
            crate::log(format!(
                "concurrency: {}: {}",
                run.limiter,
                run.totals
                    .iter()
                    .map(|p| format!(
                        "{} clients {:.0} ok/s p99 {:.0} ms rejected {:.1} %",
                        p.clients, p.goodput_per_s, p.p99_ms, p.rejected_pct
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
            run
        })
        .collect();
    ConcurrencyResults {
        knee: KNEE,
        service_ms: SERVICE_MS,
        capacity_per_s: (KNEE * 1_000) as f64 / SERVICE_MS as f64,
        phase_seconds: phase_secs,
        rounds,
        runs,
    }
}

fn run_one(limiter: Limiter, phase_secs: f64, rounds: usize) -> LimiterRun {
    let upstream = KneeUpstream::start(KNEE as usize, Duration::from_millis(SERVICE_MS));
    let mut bootstrap = Bootstrap::new();
    let mut limit_stat = None;
    if let Some((filter, stat)) = limiter.filter() {
        bootstrap = bootstrap.http_filter(filter);
        limit_stat = Some(stat);
    }
    let bootstrap = bootstrap
        .cluster(upstream.cluster_yaml())
        .routes(KneeUpstream::routes_yaml("10s"));
    let envoy = Envoy::start(&bootstrap, 2);
    let port = envoy.http_port;
    let started = Instant::now();
    let phase_count = PHASES.len() * rounds.max(1);
    let total = Duration::from_secs_f64(phase_secs * phase_count as f64);
    let answers = Mutex::new(Vec::<Answer>::new());
    let samples = Mutex::new(Vec::<Sample>::new());
    thread::scope(|s| {
        let (answers, samples, upstream, envoy) = (&answers, &samples, &upstream, &envoy);
        s.spawn(move || {
            while started.elapsed() < total {
                let limit = match limit_stat {
                    None => None,
                    Some(None) => Some(KNEE),
                    Some(Some(stat)) => envoy.stat(stat),
                };
                samples.lock().expect("samples").push(Sample {
                    t: started.elapsed().as_secs_f64(),
                    limit,
                    upstream_in_flight: upstream.in_flight(),
                });
                thread::sleep(SAMPLE_EVERY);
            }
        });
        let most = PHASES.iter().max().copied().unwrap_or(1) * KNEE;
        for client in 0..most {
            s.spawn(move || {
                // A client takes part in the phases with enough clients to include it.
                let mut mine = Vec::new();
                let mut conn = None;
                while started.elapsed() < total {
                    let now_s = started.elapsed().as_secs_f64();
                    let phase = (now_s / phase_secs) as usize;
                    if client >= clients_of(phase) {
                        let next =
                            started + Duration::from_secs_f64(phase_secs * (phase + 1) as f64);
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                        continue;
                    }
                    let c = match conn.take() {
                        Some(c) => c,
                        None => match Client::connect(port) {
                            Ok(c) => c,
                            Err(_) => {
                                thread::sleep(BACKOFF);
                                continue;
                            }
                        },
                    };
                    let mut c: Client = c;
                    let sent = Instant::now();
                    let status = match c.request(Request::get("/work")) {
                        Ok(r) => {
                            conn = Some(c);
                            r.status
                        }
                        Err(_) => 0,
                    };
                    let ended_s = started.elapsed().as_secs_f64();
                    mine.push(Answer {
                        ended_s,
                        phase: ((ended_s / phase_secs) as usize).min(phase_count - 1),
                        latency_us: sent.elapsed().as_micros() as u64,
                        status,
                    });
                    if status != 200 {
                        thread::sleep(BACKOFF);
                    }
                }
                answers.lock().expect("answers").extend(mine);
            });
        }
    });
    envoy.assert_no_panic();
    let answers = answers.into_inner().expect("answers");
    let samples = samples.into_inner().expect("samples");
    let phases = (0..phase_count)
        .map(|i| phase_result(&[i], phase_secs, &answers, &samples, limiter))
        .collect();
    let totals = (0..PHASES.len())
        .map(|first| {
            let same_load: Vec<usize> = (first..phase_count).step_by(PHASES.len()).collect();
            phase_result(&same_load, phase_secs, &answers, &samples, limiter)
        })
        .collect();
    LimiterRun {
        limiter: limiter.label().to_string(),
        phases,
        totals,
        windows: windows(&answers, total.as_secs_f64()),
        samples,
    }
}

fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let at = ((sorted_us.len() - 1) as f64 * p).round() as usize;
    sorted_us[at.min(sorted_us.len() - 1)] as f64 / 1e3
}

/// The figures of the phases `which` (one, or one load's in every round) together.
fn phase_result(
    which: &[usize],
    phase_secs: f64,
    answers: &[Answer],
    samples: &[Sample],
    limiter: Limiter,
) -> PhaseResult {
    let i = which[0];
    let mine: Vec<&Answer> = answers
        .iter()
        .filter(|a| which.contains(&a.phase))
        .collect();
    let mut ok_us: Vec<u64> = mine
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| a.latency_us)
        .collect();
    ok_us.sort_unstable();
    let ok = ok_us.len() as u64;
    let rejected = mine
        .iter()
        .filter(|a| a.status == 429 || a.status == 503)
        .count() as u64;
    let errors = mine.len() as u64 - ok - rejected;
    let (from, to) = (phase_secs * i as f64, phase_secs * (i + 1) as f64);
    let in_phase: Vec<&Sample> = samples.iter().filter(|s| s.t >= from && s.t < to).collect();
    let adaptive = matches!(limiter, Limiter::EnvoyAdaptive | Limiter::WeirAdaptive);
    let settled = |l: u64| (KNEE..=2 * KNEE).contains(&l);
    let converged_after_s = if adaptive && !in_phase.is_empty() && which.len() == 1 {
        // The first sample from which every later one of the phase is settled.
        let unsettled = in_phase.iter().rposition(|s| !s.limit.is_some_and(settled));
        match unsettled {
            None => Some(0.0),
            Some(last) if last + 1 < in_phase.len() => Some(in_phase[last + 1].t - from),
            Some(_) => None,
        }
    } else {
        None
    };
    let late: Vec<u64> = samples
        .iter()
        .filter(|s| {
            let phase = (s.t / phase_secs) as usize;
            which.contains(&phase) && s.t >= phase_secs * (phase as f64 + 0.5)
        })
        .filter_map(|s| s.limit)
        .collect();
    let limit_range_late = late
        .iter()
        .min()
        .zip(late.iter().max())
        .map(|(lo, hi)| (*lo, *hi));
    let seconds = phase_secs * which.len() as f64;
    PhaseResult {
        round: if which.len() == 1 {
            i / PHASES.len() + 1
        } else {
            0
        },
        clients: clients_of(i),
        seconds,
        ok,
        rejected,
        errors,
        goodput_per_s: ok as f64 / seconds,
        p50_ms: percentile_ms(&ok_us, 0.5),
        p99_ms: percentile_ms(&ok_us, 0.99),
        rejected_pct: 100.0 * rejected as f64 / (ok + rejected).max(1) as f64,
        converged_after_s,
        limit_range_late,
    }
}

/// Answered requests and their P99 in 500 ms windows.
fn windows(answers: &[Answer], total_s: f64) -> Vec<Window> {
    const WIDTH: f64 = 0.5;
    let n = (total_s / WIDTH).ceil() as usize;
    (0..n)
        .map(|w| {
            let (from, to) = (w as f64 * WIDTH, (w + 1) as f64 * WIDTH);
            let mut us: Vec<u64> = answers
                .iter()
                .filter(|a| a.status == 200 && a.ended_s >= from && a.ended_s < to)
                .map(|a| a.latency_us)
                .collect();
            us.sort_unstable();
            Window {
                t: to,
                ok_per_s: us.len() as f64 / WIDTH,
                p99_ms: percentile_ms(&us, 0.99),
            }
        })
        .collect()
}

/// The problems a run shows (a smoke run fails on any): a limiter that let nothing
/// through, requests that failed outright, an adaptive limit never read.
pub fn problems(r: &ConcurrencyResults) -> Vec<String> {
    let mut out = Vec::new();
    for run in &r.runs {
        if run.phases.iter().any(|p| p.ok == 0) {
            out.push(format!("{}: a phase answered nothing", run.limiter));
        }
        let errors: u64 = run.phases.iter().map(|p| p.errors).sum();
        if errors > 0 {
            out.push(format!("{}: {errors} requests failed", run.limiter));
        }
        let adaptive = run.limiter.contains("adaptive");
        if adaptive && !run.samples.iter().any(|s| s.limit.is_some_and(|l| l > 0)) {
            out.push(format!("{}: its limit was never read", run.limiter));
        }
    }
    out
}

fn num(x: f64, digits: usize) -> String {
    format!("{x:.digits$}")
}

/// The Markdown page.
pub fn markdown(
    r: &ConcurrencyResults,
    generated: &str,
    command: &str,
    picture: Option<&str>,
) -> String {
    let mut o = format!(
        "# Benchmarks: concurrency limits\n\n\
         Generated by `{command}` ({generated}); the code is `bench/src/concurrency.rs`, the \
         raw numbers `docs/bench/concurrency.json`. Other benchmarks: \
         [benchmarks.md](benchmarks.md), [benchmarks-features.md](benchmarks-features.md).\n\n\
         **The service**: {knee} requests served at once, {ms} ms each, the rest queued — at \
         most {cap:.0} requests/s, and past the knee a latency of {ms} ms × in-flight / {knee}. \
         **The load**: closed-loop clients (a rejected one waits 10 ms), {secs} s each with \
         {c1}, {c2} and {c3} clients, {rounds} over on the same Envoy: the start of a limiter (a \
         slow start, a first minRTT probe) is in the first round only. Every limiter runs on a \
         fresh Envoy with 2 workers, on the same machine as the service and the clients.\n\n\
         - *no limiter*: the router alone.\n\
         - *Envoy adaptive_concurrency*: Envoy's gradient controller, p90 sampled every \
         500 ms, buffer 25 %, minRTT over 50 requests at concurrency 3 every 10 s (jitter \
         10 %), max 200; it rejects with 503.\n\
         - *weir adaptive*: `{{\"algorithm\": \"concurrency\", \"max_in_flight\": 200, \
         \"adaptive\": {{\"latency\": \"p90\", \"interval\": \"500ms\"}}}}` (tolerance 1.25 by \
         default); it rejects with 429.\n\
         - *weir fixed at the knee*: `max_in_flight` {knee}, the best static limit — known \
         here because the benchmark built the service.\n\n\
         Each row is one load over every round. Goodput counts answered (200) requests; \
         latency is the client's, of answered requests; rejected is the share of all \
         decisions, over every round and in each. Convergence, in each round: seconds after \
         the phase began until the limit entered [{knee}, {knee2}] for the rest of the phase \
         (— when it never did); the limit range is the lowest and highest sampled in the \
         phases' second halves.\n\n\
         | limiter | clients | goodput /s | P50 ms | P99 ms | rejected | rejected, each round | converged after, each round | limit (2nd half) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        knee = r.knee,
        knee2 = 2 * r.knee,
        ms = r.service_ms,
        cap = r.capacity_per_s,
        secs = r.phase_seconds,
        c1 = PHASES[0] * r.knee,
        c2 = PHASES[1] * r.knee,
        c3 = PHASES[2] * r.knee,
        rounds = match r.rounds {
            1 => "once".to_string(),
            2 => "twice".to_string(),
            n => format!("{n} times"),
        },
    );
    for run in &r.runs {
        let adaptive = run.limiter.contains("adaptive");
        for p in &run.totals {
            let rounds: Vec<&PhaseResult> = run
                .phases
                .iter()
                .filter(|r| r.clients == p.clients)
                .collect();
            let each = |f: &dyn Fn(&PhaseResult) -> String| {
                rounds.iter().map(|r| f(r)).collect::<Vec<_>>().join(" / ")
            };
            let rejected_each = each(&|r| num(r.rejected_pct, 1));
            let converged = if adaptive {
                each(&|r| r.converged_after_s.map_or("—".to_string(), |s| num(s, 1))) + " s"
            } else {
                String::new()
            };
            let range = match p.limit_range_late {
                Some((lo, hi)) if lo == hi => lo.to_string(),
                Some((lo, hi)) => format!("{lo}–{hi}"),
                None => "".to_string(),
            };
            o.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} % | {} % | {} | {} |\n",
                run.limiter,
                p.clients,
                num(p.goodput_per_s, 0),
                num(p.p50_ms, 1),
                num(p.p99_ms, 1),
                num(p.rejected_pct, 1),
                rejected_each,
                converged,
                range
            ));
        }
    }
    if let Some(png) = picture {
        o.push_str(&format!(
            "\n![limit, requests at the service and P99 latency over time]({png})\n"
        ));
    }
    o
}
