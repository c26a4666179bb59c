//! `weir-bench features`' fair shares (issue 36): an organisation's 100 a second, one
//! user offering 1,000 a second and nine offering 5 each, on real Envoys (the run of
//! `weir_e2e::shares`): one fixed window per organisation with no share, the same
//! shared locally (one Envoy, two workers), and shared globally (two Envoys, weir-bridge
//! and a Redis Cluster). Halfway through the heavy user stops and one of the nine turns
//! heavy. Reported: what the heavy user, the light users and the new heavy user were
//! admitted per second, and the checker's verdicts on every admission (the parent's
//! bound) and every user's floor (`share::check_floor`), with the series the picture draws.

use weir_e2e::decisions::{with_decisions, Logs};
use weir_e2e::global::GlobalStack;
use weir_e2e::shares::{
    config, jwt_authn, offer_heavy_and_light, Phases, ShareRun, LIMIT, WHO_HEADER,
};
use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Envoy, TestDir};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ShareRow {
    pub limiter: String,
    pub seconds: u64,
    /// The second the heavy user stops and `u1` turns heavy.
    pub switch: u64,
    /// Admitted per second, over the seconds after the first and before the switch: the
    /// heavy user, and each light user (the mean and the least of any in any second).
    pub heavy_per_s: f64,
    pub light_per_s: f64,
    pub light_min: u64,
    /// What `u1` was admitted the second after the switch.
    pub new_heavy_after_switch: u64,
    /// The checker's verdicts: the parent's bound over every admission, every user's floor.
    pub parent_bound: String,
    pub floor: String,
    /// Per second of the run: heavy1, u1, and the mean of u2…u9.
    pub series: Vec<(u64, u64, u64, f64)>,
}

fn row(limiter: &str, run: &ShareRun) -> ShareRow {
    let Phases { seconds, switch } = run.phases;
    let settled = 1..switch.max(2);
    let n = settled.clone().count().max(1) as f64;
    let heavy: u64 = settled.clone().map(|s| run.admitted(s, "heavy1")).sum();
    let lights: Vec<u64> = settled
        .clone()
        .flat_map(|s| (1..=9).map(move |u| (s, u)))
        .map(|(s, u)| run.admitted(s, &format!("u{u}")))
        .collect();
    let series = (0..seconds)
        .map(|s| {
            let mean = run.light(s) as f64 / 8.0;
            (s, run.admitted(s, "heavy1"), run.admitted(s, "u1"), mean)
        })
        .collect();
    ShareRow {
        limiter: limiter.to_string(),
        seconds,
        switch,
        heavy_per_s: heavy as f64 / n,
        light_per_s: lights.iter().sum::<u64>() as f64 / (n * 9.0),
        light_min: lights.iter().copied().min().unwrap_or(0),
        new_heavy_after_switch: run.admitted(switch + 1, "u1"),
        parent_bound: match run.parent_bound() {
            Ok(n) => format!("ok ({n} admissions)"),
            Err(v) => format!("VIOLATED: {v}"),
        },
        floor: match run.floor() {
            Ok(()) => "ok".to_string(),
            Err(s) => format!("short: {s}"),
        },
        series,
    }
}

fn local_run(limiter: &str, shared: bool, phases: Phases) -> ShareRow {
    let config = with_decisions(&config(shared, false));
    let dir = TestDir::new("bench-shares");
    let logs = Logs::new(dir.path(), 1, WHO_HEADER);
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 2);
    let start = offer_heavy_and_light(&[envoy.http_port], phases);
    let run = ShareRun::read(&logs, start, phases);
    envoy.assert_no_panic();
    row(limiter, &run)
}

fn global_run(limiter: &str, phases: Phases) -> ShareRow {
    let config = with_decisions(&config(true, true));
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], WHO_HEADER);
    let start = offer_heavy_and_light(&stack.ports(), phases);
    let run = ShareRun::read(&stack.logs, start, phases);
    stack.assert_no_panic();
    row(limiter, &run)
}

/// The three runs, about `secs` each (at least 4 seconds: a window to start, two of
/// shares, the switch).
pub fn run_all(secs: f64) -> Vec<ShareRow> {
    let seconds = (secs.round() as u64).max(4);
    let phases = Phases {
        seconds,
        switch: (seconds * 4 / 7).max(2),
    };
    vec![
        local_run("one fixed window per organisation (local)", false, phases),
        local_run("share (local)", true, phases),
        global_run("share (global, 2 Envoys)", phases),
    ]
}

/// The problems a run shows: a shared run that breaks the parent's bound or a floor, or
/// any run that breaks the bound.
pub fn problems(rows: &[ShareRow]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        if !r.parent_bound.starts_with("ok") {
            out.push(format!("shares {}: {}", r.limiter, r.parent_bound));
        }
        if r.limiter.starts_with("share") && r.floor != "ok" {
            out.push(format!("shares {}: {}", r.limiter, r.floor));
        }
    }
    out
}

/// The page's section.
pub fn markdown(rows: &[ShareRow], png: Option<&str>) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut o = format!(
        "\n## Fair shares\n\n\
         An organisation's {LIMIT} requests a second (a fixed window of 1 s), one user \
         offering 1,000 a second and nine offering 5 each, for {} seconds; at second {} the \
         heavy user stops and one of the nine offers 1,000 a second. Users are named by a \
         token's `sub` claim that `jwt_authn` verified. Admitted per second over seconds 1 \
         to {} (the first second has no active user yet), and the new heavy user's the \
         second after the switch. The checker judged every admission by the parent's bound \
         and every user by its floor (`share::check_floor`).\n\n\
         | limiter | heavy user /s | each light user /s (least) | new heavy user, the second after | parent's bound | floor |\n\
         |---|---|---|---|---|---|\n",
        first.seconds,
        first.switch,
        first.switch.saturating_sub(1),
    );
    for r in rows {
        let floor = if r.floor == "ok" {
            "ok".to_string()
        } else {
            r.floor.chars().take(120).collect::<String>() + "…"
        };
        o.push_str(&format!(
            "| {} | {:.1} | {:.2} ({}) | {} | {} | {} |\n",
            r.limiter,
            r.heavy_per_s,
            r.light_per_s,
            r.light_min,
            r.new_heavy_after_switch,
            r.parent_bound,
            floor
        ));
    }
    o.push_str(
        "\nWithout a share the heavy user takes the organisation's limit as the window \
         opens and the light users get what is left when they ask, often nothing; with one, \
         each light user is entitled to what it asked in the second before and the heavy \
         user to the rest (docs/configuration.md, \"Shared limits\").\n",
    );
    if let Some(png) = png {
        o.push_str(&format!(
            "\n![Admitted per second: the heavy user, the new heavy user and each light user, per limiter]({png})\n"
        ));
    }
    o
}
