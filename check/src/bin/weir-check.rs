//! `weir-check check-config FILE`: the filter's own configuration compiler, offline.
//!
//! Runs the parser and compiler that `on_configure` runs, so a file that fails here
//! prints the same error the filter would log, and the filter refuses it. A file that
//! passes can still be refused by the filter for what only the running Envoy knows:
//! the environment variable named by `bridge.secret_env` (checked in the Wasm VM's
//! environment, not here: the checker prints a reminder), or shared data that cannot be
//! allocated.
//!
//! Warnings (on stderr, `warning: FIELD: …`) name what loads but is likely wrong: a
//! `bridge.timeout` shorter than what weir-bridge needs with its default Redis timeout.
//!
//! Exit status: 0 valid (with or without warnings), 1 invalid (or unreadable), 2 bad usage.
//!
//! `weir-check log-format FILE` prints the Envoy access-log `json_format` that records
//! what FILE's rules read, `weir-check log-hash` hashes such a log's values
//! (`weir_check::log_hash`), and `weir-check replay --config CANDIDATE --log LOG...
//! [--served SERVED] [--bucket DURATION] [--json]` replays recorded logs through a
//! candidate config (`weir_check::replay`; docs/operations.md, "Before you roll out a
//! limit").

use std::io::{Read, Write};
use std::process::ExitCode;
use weir_check::log_hash::{LogPlan, Plan, Salt};
use weir_check::replay::{self, AgainstServed, Report};
use weir_core::config::{self, Config};
use weir_core::key::Seed;

const USAGE: &str = "\
usage: weir-check check-config FILE
       weir-check log-format FILE
       weir-check replay --config CANDIDATE --log LOG [--log LOG ...] [--served SERVED]
                         [--bucket DURATION] [--json]
       weir-check log-hash --config CONFIG --salt-file SALT [--log LOG] [--out OUT]
       weir-check --help
       weir-check --version

Checks a weir plugin configuration (the JSON given to the filter as its
`configuration`) and prints a summary of its rules. FILE may be - for stdin.

Warnings go to stderr and do not change the exit status.

log-format prints the access-log json_format (JSON) that records the facts
FILE's rules read, weir's decisions, the status, the start time and the
duration (for concurrency rules).

replay runs CANDIDATE over LOG (lines of that format) in time order, as one
single-worker Envoy, and prints per rule: requests matched, allowed, limited,
the keys limited most and the 429s over time (per --bucket, e.g. 100ms, 1s,
1m; default 1s); against the decisions LOG
recorded (--served names the config that served it, to list what the
candidate dropped or added). Lines that are not records are counted and named.
--log may be given once per Envoy of a fleet: the logs are merged by time
(equal times: in the order given) and replayed as one stream.

log-hash rewrites a log recorded with log-format (LOG, or stdin; to OUT, or
stdout): every value under headers and attributes becomes its HMAC-SHA256
keyed with SALT (a file of at least 16 bytes), except the facts CONFIG's
rules match on (or read a cost, a deadline or a query parameter from): those
stay in clear, and are named on stderr. Lines that are not records are left
out, named and counted on stderr.

exit status: 0 valid, 1 invalid or unreadable, 2 bad usage
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--help" | "-h" | "help"] => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        // The workspace version (Cargo.toml's [workspace.package]), as `weir-bridge --version`
        // prints it: a release's parts must agree on it (tests/tests/release.rs).
        ["--version" | "-V"] => {
            println!("weir-check {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["check-config", file] => check_config(file),
        ["log-format", file] => log_format(file),
        ["log-hash", rest @ ..] => match HashArgs::parse(rest) {
            Some(args) => log_hash(&args),
            None => {
                eprint!("{USAGE}");
                ExitCode::from(2)
            }
        },
        ["replay", rest @ ..] => match ReplayArgs::parse(rest) {
            Some(args) => replay(&args),
            None => {
                eprint!("{USAGE}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check_config(file: &str) -> ExitCode {
    let json = match read(file) {
        Ok(json) => json,
        Err(err) => {
            eprintln!("error: cannot read {file}: {err}");
            return ExitCode::from(1);
        }
    };
    match config::parse(&json) {
        Ok(config) => {
            // A closed stdout (`| head`) is not a reason to panic.
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{}", summary(&config));
            if let Some(warning) = config.bridge.as_ref().and_then(|b| b.timeout_warning()) {
                eprintln!("warning: {warning}");
            }
            if let Some(name) = config.bridge.as_ref().and_then(|b| b.secret_env.as_ref()) {
                let _ = writeln!(
                    out,
                    "note: bridge.secret_env: the filter reads {name:?} from the Wasm VM's \
                     environment (vm_config.environment_variables) and refuses the \
                     configuration if it is not set there; that is not checked here"
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(1)
        }
    }
}

fn read(file: &str) -> std::io::Result<Vec<u8>> {
    if file == "-" {
        let mut json = Vec::new();
        std::io::stdin().read_to_end(&mut json)?;
        Ok(json)
    } else {
        std::fs::read(file)
    }
}

/// `ok: 2 rules: per-user (gcra, local), login (fixed_window, local, shadow)`; a rule whose
/// limit each request gives says so (`per-tenant (gcra, local, limit from the request)`),
/// and so does one whose keys share its limit (`per-org (fixed_window, local, shared by up
/// to 100 keys)`).
fn summary(config: &Config) -> String {
    let rules: Vec<String> = config
        .rules
        .iter()
        .map(|rule| {
            let scope = if rule.is_global() { "global" } else { "local" };
            let shadow = if rule.shadow { ", shadow" } else { "" };
            let own = if rule.limit_from.is_empty() {
                ""
            } else {
                ", limit from the request"
            };
            let shared = rule.share.as_ref().map_or(String::new(), |s| {
                format!(", shared by up to {} keys", s.limit.max_keys)
            });
            format!(
                "{} ({}, {scope}{shadow}{own}{shared})",
                rule.name,
                rule.algorithm_name()
            )
        })
        .collect();
    let noun = if rules.len() == 1 { "rule" } else { "rules" };
    format!("ok: {} {noun}: {}", rules.len(), rules.join(", "))
}

fn log_format(file: &str) -> ExitCode {
    let config = match read(file)
        .map_err(|e| format!("cannot read {file}: {e}"))
        .and_then(|json| config::parse(&json).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(1);
        }
    };
    let (format, unrecorded) = replay::log_format(&config);
    let text = serde_json::to_string_pretty(&format).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "{text}");
    for fact in unrecorded {
        eprintln!("warning: {fact}: no access-log command records it; a replay sees it absent");
    }
    ExitCode::SUCCESS
}

struct HashArgs<'a> {
    config: &'a str,
    salt: &'a str,
    log: Option<&'a str>,
    out: Option<&'a str>,
}

impl<'a> HashArgs<'a> {
    fn parse(args: &[&'a str]) -> Option<HashArgs<'a>> {
        let (mut config, mut salt, mut log, mut out) = (None, None, None, None);
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let value = Some(*args.next()?);
            match *arg {
                "--config" => config = value,
                "--salt-file" => salt = value,
                "--log" => log = value,
                "--out" => out = value,
                _ => return None,
            }
        }
        Some(HashArgs {
            config: config?,
            salt: salt?,
            log,
            out,
        })
    }
}

fn log_hash(args: &HashArgs) -> ExitCode {
    let inputs = read(args.config)
        .map_err(|e| format!("cannot read {}: {e}", args.config))
        .and_then(|json| config::parse(&json).map_err(|e| format!("{}: {e}", args.config)))
        .and_then(|config| {
            let salt = std::fs::read(args.salt)
                .map_err(|e| format!("--salt-file {}: cannot read: {e}", args.salt))
                .and_then(|bytes| {
                    Salt::new(bytes).map_err(|e| format!("--salt-file {}: {e}", args.salt))
                })?;
            let log = read(args.log.unwrap_or("-"))
                .map_err(|e| format!("cannot read {}: {e}", args.log.unwrap_or("stdin")))?;
            Ok((config, salt, String::from_utf8_lossy(&log).into_owned()))
        });
    let (config, salt, log) = match inputs {
        Ok(inputs) => inputs,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(1);
        }
    };
    let plan = LogPlan::new(&config);
    for (section, field, plan) in &plan.fields {
        match plan {
            Plan::Hash(form) => eprintln!("hashed: {section}.{field} ({})", form.describe()),
            Plan::Clear(why) => eprintln!("in clear: {section}.{field}: {why}"),
        }
    }
    eprintln!("hashed: every other field of headers and attributes (whole)");
    let mut out = String::with_capacity(log.len());
    let mut left_out = 0;
    for (at, line) in log.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match plan.hash_line(&salt, line) {
            Ok(hashed) => {
                out += &hashed;
                out.push('\n');
            }
            Err(err) => {
                left_out += 1;
                eprintln!("line {}: left out: {err}", at + 1);
            }
        }
    }
    if left_out > 0 {
        eprintln!("{left_out} lines left out (not records; never written in clear)");
    }
    let written = match args.out {
        Some(file) => std::fs::write(file, out).map_err(|e| format!("cannot write {file}: {e}")),
        None => std::io::stdout()
            .write_all(out.as_bytes())
            .map_err(|e| format!("cannot write to stdout: {e}")),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(1)
        }
    }
}

struct ReplayArgs<'a> {
    config: &'a str,
    /// One log per Envoy of the fleet, at least one.
    logs: Vec<&'a str>,
    served: Option<&'a str>,
    /// As given (`--bucket`, default `1s`); checked by [`replay::parse_bucket`].
    bucket: &'a str,
    json: bool,
}

impl<'a> ReplayArgs<'a> {
    fn parse(args: &[&'a str]) -> Option<ReplayArgs<'a>> {
        let (mut config, mut logs, mut served, mut json) = (None, Vec::new(), None, false);
        let mut bucket = "1s";
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match *arg {
                "--config" => config = Some(*args.next()?),
                "--log" => logs.push(*args.next()?),
                "--served" => served = Some(*args.next()?),
                "--bucket" => bucket = args.next()?,
                "--json" => json = true,
                _ => return None,
            }
        }
        if logs.is_empty() {
            return None;
        }
        Some(ReplayArgs {
            config: config?,
            logs,
            served,
            bucket,
            json,
        })
    }
}

fn replay(args: &ReplayArgs) -> ExitCode {
    let bucket_us = match replay::parse_bucket("--bucket", args.bucket) {
        Ok(us) => us,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let inputs = read(args.config)
        .map_err(|e| format!("cannot read {}: {e}", args.config))
        .and_then(|config| {
            let logs = args
                .logs
                .iter()
                .map(|file| {
                    let text = read(file).map_err(|e| format!("cannot read {file}: {e}"))?;
                    Ok(replay::parse_log(&String::from_utf8_lossy(&text)))
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok((config, replay::Log::merge(logs)))
        });
    let (candidate, log) = match inputs {
        Ok(inputs) => inputs,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(1);
        }
    };
    let served = match args.served.map(|served| {
        read(served)
            .map_err(|e| format!("cannot read {served}: {e}"))
            .and_then(|json| config::parse(&json).map_err(|e| format!("{served}: {e}")))
    }) {
        None => None,
        Some(Ok(served)) => Some(served),
        Some(Err(err)) => {
            eprintln!("error: {err}");
            return ExitCode::from(1);
        }
    };
    let options = replay::Options {
        // Any seed: slots collide only in a table far smaller than its keys.
        seed: Seed([0; 16]),
        bucket_us,
    };
    let report = match replay::replay_with(&candidate, &log, &options) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("error: {}: {err}", args.config);
            return ExitCode::from(1);
        }
    };
    let against = served
        .as_ref()
        .map(|served| replay::against_served(served, &report, &log));
    let text = if args.json {
        serde_json::to_string_pretty(&report_json(&report, against.as_ref(), &args.logs))
            .unwrap_or_default()
    } else {
        report_text(&report, against.as_ref(), &args.logs, args.bucket)
    };
    let _ = writeln!(std::io::stdout(), "{text}");
    ExitCode::SUCCESS
}

/// The file a bad line was read from, by its log's position.
fn log_name<'a>(logs: &[&'a str], log: usize) -> &'a str {
    logs.get(log).copied().unwrap_or("?")
}

fn report_json(
    report: &Report,
    against: Option<&AgainstServed>,
    logs: &[&str],
) -> serde_json::Value {
    use serde_json::json;
    let rules: Vec<serde_json::Value> = report
        .rules
        .iter()
        .map(|r| {
            let mut rule = json!({
                "rule": r.rule,
                "matched": r.matched,
                "allowed": r.allowed,
                "limited": r.limited,
                "shadow_limited": r.shadow_limited,
                "delayed": r.delayed,
                "delayed_us": r.delayed_us,
                "top_keys": r.top_keys.iter().map(|(k, n)| json!({"key": k, "limited": n})).collect::<Vec<_>>(),
                "limited_over_time": r.limited_over_time.iter().map(|(start, n)| json!({"start_us": start, "limited": n})).collect::<Vec<_>>(),
            });
            if let (Some(_), Some(rule)) = (against, rule.as_object_mut()) {
                let against = json!({
                    "decided": r.served_decided,
                    "agreed": r.agreed,
                    "newly_limited": r.newly_limited,
                    "newly_allowed": r.newly_allowed,
                });
                rule.insert("served".into(), against);
            }
            rule
        })
        .collect();
    let mut out = json!({
        "requests": report.requests,
        "logs": logs,
        "bucket_us": report.bucket_us,
        "without_duration": report.without_duration,
        "bad_lines": report.bad_lines.iter().map(|b| json!({"log": log_name(logs, b.log), "line": b.line, "error": b.error})).collect::<Vec<_>>(),
        "not_replayed": report.not_replayed.iter().map(|(r, why)| json!({"rule": r, "why": why})).collect::<Vec<_>>(),
        "central": report.central,
        "rules": rules,
    });
    if let (Some(against), Some(object)) = (against, out.as_object_mut()) {
        let dropped: Vec<serde_json::Value> = against
            .dropped
            .iter()
            .map(|(r, n)| json!({"rule": r, "limited_in_log": n}))
            .collect();
        let served = json!({
            "dropped": dropped,
            "added": against.added,
            "unknown": against.unknown,
        });
        object.insert("served".into(), served);
    }
    out
}

/// A bucket's start in unix seconds, with as many decimals as the bucket's width needs.
fn unix_seconds(us: u64, bucket_us: u64) -> String {
    let (seconds, fraction) = (us / 1_000_000, us % 1_000_000);
    if bucket_us.is_multiple_of(1_000_000) {
        seconds.to_string()
    } else if bucket_us.is_multiple_of(1_000) {
        format!("{seconds}.{:03}", fraction / 1_000)
    } else {
        format!("{seconds}.{fraction:06}")
    }
}

fn report_text(
    report: &Report,
    against: Option<&AgainstServed>,
    logs: &[&str],
    bucket: &str,
) -> String {
    let mut out = format!("{} requests replayed", report.requests);
    if logs.len() > 1 {
        out += &format!(" from {} logs, merged by time", logs.len());
    }
    out += "\n";
    if !report.bad_lines.is_empty() {
        out += &format!("{} lines skipped:\n", report.bad_lines.len());
        for bad in report.bad_lines.iter().take(20) {
            // One log: its lines are named as before; several: with their file.
            let file = if logs.len() > 1 {
                format!("{}: ", log_name(logs, bad.log))
            } else {
                String::new()
            };
            out += &format!("  {file}line {}: {}\n", bad.line, bad.error);
        }
    }
    for (rule, why) in &report.not_replayed {
        out += &format!("rule {rule}: {why}\n");
    }
    if report.without_duration > 0 {
        out += &format!(
            "{} requests have no duration_us: they held no place of a concurrency rule\n",
            report.without_duration
        );
    }
    if let Some(against) = against {
        for (rule, limited) in &against.dropped {
            out += &format!(
                "rule {rule}: served, not in the candidate: it limited {limited} logged \
                 requests, which the candidate lets through unless another rule limits them\n"
            );
        }
        for rule in &against.added {
            out += &format!("rule {rule}: not in the served config: nothing to compare\n");
        }
        for rule in &against.unknown {
            out += &format!(
                "warning: the log has decisions of rule {rule}, which the served config \
                 does not have: was the log served by it?\n"
            );
        }
    }
    for rule in &report.central {
        out += &format!(
            "rule {rule}: global, replayed as one central limiter (what the fleet converges \
             to; not the served decisions of leases and reservations)\n"
        );
    }
    for r in &report.rules {
        out += &format!(
            "\nrule {}: {} matched, {} allowed, {} limited",
            r.rule, r.matched, r.allowed, r.limited
        );
        if r.shadow_limited > 0 {
            out += &format!(", {} shadow-limited", r.shadow_limited);
        }
        if r.delayed > 0 {
            out += &format!(
                " ({} of the allowed delayed, {} ms on average)",
                r.delayed,
                r.delayed_us / r.delayed / 1_000
            );
        }
        out += "\n";
        if against.is_some() {
            out += &format!(
                "  against the served decisions ({} logged): {} agree, {} newly limited, {} newly allowed\n",
                r.served_decided, r.agreed, r.newly_limited, r.newly_allowed
            );
        }
        if !r.top_keys.is_empty() {
            out += "  keys limited most:\n";
            for (key, n) in &r.top_keys {
                out += &format!("    {n:>8}  {key}\n");
            }
        }
        if !r.limited_over_time.is_empty() {
            if report.bucket_us == 1_000_000 {
                out += "  limited per second (unix second: requests):\n";
            } else {
                out += &format!("  limited per {bucket} (bucket start, unix seconds: requests):\n");
            }
            for (start, n) in &r.limited_over_time {
                out += &format!("    {}: {n}\n", unix_seconds(*start, report.bucket_us));
            }
        }
    }
    out
}
