//! A real Envoy on 127.0.0.1: started from a [`Bootstrap`] (or a test's listener on the
//! binary's shared Envoy), ready, stats, logs, validation.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bootstrap::Bootstrap;
use crate::http::{self, Request, Response};
use crate::prereq::envoy_bin;
use crate::process::{wait_for, Child, TestDir};
use crate::shared_envoy::{Lease, Sharing};

/// How long Envoy gets to become LIVE (or, in `start_expect_failure`, to exit).
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long weir's stats may lag the requests they count (its flush interval, plus margin).
pub const WEIR_STATS_LAG: std::time::Duration = std::time::Duration::from_millis(250);

/// Why a weir stat a test reads may be missing.
fn not_defined(name: &str) -> String {
    format!(
        "weir did not define the stat {name}: its level is above the rule's (or the \
         plugin's) `stats` (set \"stats\": \"detailed\" in the test's config), or the rule \
         does not have what it counts (core/src/stats.rs)"
    )
}

/// A running Envoy, killed by PID when dropped: a process of the test's own
/// ([`Envoy::start`]), or the test's listener on the binary's shared Envoy
/// ([`Envoy::shared`]).
#[derive(Debug)]
pub struct Envoy {
    pub http_port: u16,
    pub admin_port: u16,
    runs: Runs,
    /// Time from spawn to admin `/ready` = LIVE (a shared Envoy: until the listener is served).
    pub startup: Duration,
}

#[derive(Debug)]
enum Runs {
    // Field order matters: the process dies before its directory is removed.
    Own { child: Child, dir: TestDir },
    Shared(Lease),
}

fn args(config: &Path, concurrency: u32, base_id: u16, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-c".into(),
        config.to_string_lossy().into_owned(),
        "--concurrency".into(),
        concurrency.to_string(),
        "--disable-hot-restart".into(),
        // Unique while this Envoy runs: the admin port is bound by it.
        "--base-id".into(),
        base_id.to_string(),
        "-l".into(),
        "info".into(),
        // Access logs reach their files within 100 ms (Envoy's default is 10 s).
        "--file-flush-interval-msec".into(),
        "100".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

impl Envoy {
    /// Renders `bootstrap`, starts Envoy with `concurrency` workers and waits until admin
    /// `/ready` answers LIVE. Panics with the log tail if Envoy exits or is not LIVE in 20 s.
    pub fn start(bootstrap: &Bootstrap, concurrency: u32) -> Envoy {
        Envoy::start_yaml(
            &bootstrap.render(),
            bootstrap.admin_port,
            bootstrap.http_port,
            concurrency,
        )
    }

    /// Like [`start`](Self::start) with a bootstrap written elsewhere (e.g. `envoy/*.yaml` with
    /// its ports substituted); the caller says which ports it uses.
    pub fn start_yaml(yaml: &str, admin_port: u16, http_port: u16, concurrency: u32) -> Envoy {
        Envoy::start_yaml_with_env(yaml, admin_port, http_port, concurrency, &[])
    }

    /// [`Envoy::start_yaml`] with extra environment variables (what a Wasm VM's
    /// `host_env_keys` read).
    pub fn start_yaml_with_env(
        yaml: &str,
        admin_port: u16,
        http_port: u16,
        concurrency: u32,
        env: &[(&str, &str)],
    ) -> Envoy {
        let bin = envoy_bin(); // before the dir: a missing Envoy leaves nothing behind
        let dir = TestDir::new("envoy");
        let config = dir.write("envoy.yaml", yaml);
        let started = Instant::now();
        let mut child = Child::spawn(
            "envoy",
            bin,
            args(&config, concurrency, admin_port, &[]),
            env,
            &dir.join("envoy.log"),
        );
        let live = wait_for(START_TIMEOUT, Duration::from_millis(50), || {
            if let Some(status) = child.try_wait() {
                return Some(Err(status));
            }
            match http::get(admin_port, "/ready", &[]) {
                Ok(r) if r.status == 200 && r.text().trim() == "LIVE" => Some(Ok(())),
                _ => None,
            }
        });
        match live {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "Envoy exited with {status} before becoming ready; config {}; log tail:\n{}",
                config.display(),
                child.log_tail(40)
            ),
            None => panic!(
                "Envoy not LIVE on admin port {admin_port} after {START_TIMEOUT:?}; log tail:\n{}",
                child.log_tail(40)
            ),
        }
        Envoy {
            http_port,
            admin_port,
            startup: started.elapsed(),
            runs: Runs::Own { child, dir },
        }
    }

    /// `bootstrap`'s listener and clusters served by the test binary's shared Envoy with
    /// `concurrency` workers (tests/src/shared_envoy.rs), started on first use: ~0.04
    /// CPU-seconds where a process of its own takes ~1.7, compiling weir.wasm. Its plugins
    /// and clusters are renamed apart from other tests'; stats read through this handle
    /// (`weir_stat`, `plugin_stat`, `stat`, `stats`, `stats_matching`) use the bootstrap's
    /// names, and `log` is the shared log since the listener was added. What belongs to a
    /// process (`pid`, `kill`, `memory_rss`, `is_running`, `dir`) panics: a test that needs
    /// it, a bootstrap-level setting or a config Envoy must refuse, starts its own.
    pub fn shared(bootstrap: &Bootstrap, concurrency: u32) -> Envoy {
        Envoy::leased(bootstrap, concurrency, Sharing::Shared)
    }

    /// [`Envoy::shared`], on a process that serves this test's listener alone while it
    /// lasts (reused by the next such test): for tests that hold Envoy to instants, which
    /// another test's traffic on the same workers would shift.
    pub fn alone(bootstrap: &Bootstrap, concurrency: u32) -> Envoy {
        Envoy::leased(bootstrap, concurrency, Sharing::Alone)
    }

    fn leased(bootstrap: &Bootstrap, concurrency: u32, sharing: Sharing) -> Envoy {
        assert!(
            bootstrap.top_level.is_empty() && bootstrap.listeners.is_empty(),
            "top-level blocks (stats_config, cluster_manager) and more listeners are the \
             bootstrap's, not a listener's: use Envoy::start"
        );
        let started = Instant::now();
        let rendered: serde_json::Value = serde_yaml::from_str(&bootstrap.render())
            .unwrap_or_else(|e| panic!("the rendered bootstrap is not YAML: {e}"));
        let resources = &rendered["static_resources"];
        let listener = resources["listeners"][0].clone();
        let clusters = resources["clusters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let lease = crate::shared_envoy::lease(listener, clusters, concurrency, sharing);
        Envoy {
            http_port: bootstrap.http_port,
            admin_port: lease.admin_port,
            startup: started.elapsed(),
            runs: Runs::Shared(lease),
        }
    }

    fn own(&self, what: &str) -> (&Child, &TestDir) {
        match &self.runs {
            Runs::Own { child, dir } => (child, dir),
            Runs::Shared(lease) => panic!(
                "{what} is a process's, and this test's listener {} is on the shared Envoy: \
                 start an Envoy of its own (Envoy::start)",
                lease.name
            ),
        }
    }

    fn own_mut(&mut self, what: &str) -> &mut Child {
        match &mut self.runs {
            Runs::Own { child, .. } => child,
            Runs::Shared(lease) => panic!(
                "{what} is a process's, and this test's listener {} is on the shared Envoy: \
                 start an Envoy of its own (Envoy::start)",
                lease.name
            ),
        }
    }

    /// Starts Envoy on a bootstrap that must be rejected: returns the log once Envoy exits
    /// non-zero. Panics if it exits 0, becomes LIVE, or is still up after 20 s.
    pub fn start_expect_failure(bootstrap: &Bootstrap) -> String {
        let bin = envoy_bin();
        let dir = TestDir::new("envoy-fail");
        let config = dir.write("envoy.yaml", bootstrap.render());
        let mut child = Child::spawn(
            "envoy",
            bin,
            args(&config, 1, bootstrap.admin_port, &[]),
            &[],
            &dir.join("envoy.log"),
        );
        let exit = wait_for(START_TIMEOUT, Duration::from_millis(50), || {
            if let Some(status) = child.try_wait() {
                return Some(Ok(status));
            }
            match http::get(bootstrap.admin_port, "/ready", &[]) {
                Ok(r) if r.status == 200 => Some(Err(())),
                _ => None,
            }
        });
        match exit {
            Some(Ok(status)) if !status.success() => child.log(),
            Some(Ok(status)) => panic!(
                "Envoy exited with {status}, expected a failure; log tail:\n{}",
                child.log_tail(40)
            ),
            Some(Err(())) => panic!(
                "Envoy became LIVE, expected it to reject the config; log tail:\n{}",
                child.log_tail(40)
            ),
            None => panic!(
                "Envoy still running after {START_TIMEOUT:?}, expected it to fail; log tail:\n{}",
                child.log_tail(40)
            ),
        }
    }

    /// `envoy --mode validate -c FILE`: `Err(output)` if Envoy rejects it.
    pub fn validate(bootstrap_path: &Path) -> Result<(), String> {
        Envoy::validate_with_env(bootstrap_path, &[])
    }

    /// [`Envoy::validate`] with extra environment variables (what a Wasm VM's
    /// `host_env_keys` read).
    pub fn validate_with_env(bootstrap_path: &Path, env: &[(&str, &str)]) -> Result<(), String> {
        let out = Command::new(envoy_bin())
            .envs(env.iter().copied())
            .args([
                "--mode",
                "validate",
                "-l",
                "warning",
                "--disable-hot-restart",
                "-c",
            ])
            .arg(bootstrap_path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run envoy --mode validate: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{}: {text}", out.status))
        }
    }

    pub fn pid(&self) -> u32 {
        self.own("pid").0.pid()
    }

    /// The per-run directory (config and log).
    pub fn dir(&self) -> &TestDir {
        self.own("dir").1
    }

    /// The whole log (stdout + stderr) so far; on the shared Envoy, since this test's
    /// listener was added (other tests' lines among it).
    pub fn log(&self) -> String {
        match &self.runs {
            Runs::Own { child, .. } => child.log(),
            Runs::Shared(lease) => lease.log(),
        }
    }

    pub fn log_tail(&self, n: usize) -> String {
        match &self.runs {
            Runs::Own { child, .. } => child.log_tail(n),
            Runs::Shared(lease) => {
                let log = lease.log();
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(n)..].join("\n")
            }
        }
    }

    /// A request to the admin interface (panics on I/O errors).
    pub fn admin(&self, method: &str, path: &str) -> Response {
        http::send(self.admin_port, Request::new(method, path))
            .unwrap_or_else(|e| panic!("admin {method} {path}: {e}"))
    }

    /// Every counter and gauge from admin `/stats` (histograms are skipped); on the shared
    /// Envoy, this test's plugins', HCM's and clusters' under the bootstrap's names.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        let all = self.served_stats("");
        match &self.runs {
            Runs::Own { .. } => all,
            Runs::Shared(lease) => all
                .into_iter()
                .filter_map(|(name, value)| Some((lease.test_stat(&name)?, value)))
                .collect(),
        }
    }

    /// One counter or gauge, `None` if Envoy does not have it (yet).
    pub fn stat(&self, name: &str) -> Option<u64> {
        let served = match &self.runs {
            Runs::Own { .. } => name.to_string(),
            Runs::Shared(lease) => lease.served_stat(name),
        };
        self.served_stats(&format!("^{}$", regex_escape(&served)))
            .get(&served)
            .copied()
    }

    /// The counters and gauges whose names match `pattern` (admin `/stats?filter=`); on
    /// the shared Envoy, matched against this test's stats under the bootstrap's names.
    pub fn stats_matching(&self, pattern: &str) -> BTreeMap<String, u64> {
        match &self.runs {
            Runs::Own { .. } => self.served_stats(pattern),
            Runs::Shared(_) => {
                let re = regex::Regex::new(pattern)
                    .unwrap_or_else(|e| panic!("not a regex: {pattern}: {e}"));
                self.stats()
                    .into_iter()
                    .filter(|(name, _)| re.is_match(name))
                    .collect()
            }
        }
    }

    /// Admin `/stats?filter=pattern` as Envoy names them.
    fn served_stats(&self, pattern: &str) -> BTreeMap<String, u64> {
        let path = if pattern.is_empty() {
            "/stats".to_string()
        } else {
            format!("/stats?filter={}", pct_encode(pattern))
        };
        let r = self.admin("GET", &path);
        assert_eq!(
            r.status,
            200,
            "admin {path} answered {}: {}",
            r.status,
            r.text()
        );
        parse_stats(&r.text())
    }

    /// A weir stat (`wasmcustom.weir.<plugin>.<name>`) added up over every plugin of
    /// this Envoy. weir keeps increments in each worker's VM and sends them every 100 ms,
    /// so this first waits for them to land. Panics when no plugin defined it: a stat
    /// outside its rule's `stats` level, or of a feature the rule does not have, is not
    /// defined, and reading it as 0 would pass any `== 0`.
    pub fn weir_stat(&self, name: &str) -> u64 {
        std::thread::sleep(WEIR_STATS_LAG);
        let plugins = match &self.runs {
            Runs::Own { .. } => "[^.]+".to_string(),
            Runs::Shared(lease) => {
                let served: Vec<String> = lease.plugins.values().map(|p| regex_escape(p)).collect();
                format!("({})", served.join("|"))
            }
        };
        let pattern = format!(r"^wasmcustom\.weir\.{plugins}\.{}$", regex_escape(name));
        let found = self.served_stats(&pattern);
        assert!(!found.is_empty(), "{}", not_defined(name));
        found.values().sum()
    }

    /// A weir stat of one plugin (`wasmcustom.weir.<plugin>.<name>`); panics when it is not
    /// defined, as [`Envoy::weir_stat`] does.
    pub fn plugin_stat(&self, plugin: &str, name: &str) -> u64 {
        std::thread::sleep(WEIR_STATS_LAG);
        self.stat(&format!("wasmcustom.weir.{plugin}.{name}"))
            .unwrap_or_else(|| panic!("{}", not_defined(&format!("{plugin}.{name}"))))
    }

    /// Panics with the log tail if weir panicked or a Wasm VM failed, as far as the log so far
    /// tells.
    pub fn assert_no_panic(&self) {
        let log = self.log();
        assert!(
            !log.contains("panic"),
            "weir panicked:\n{}",
            self.log_tail(40)
        );
        assert!(
            !log.contains("Wasm VM failed"),
            "a VM failed:\n{}",
            self.log_tail(40)
        );
    }

    /// Resident set size from `/proc/<pid>/status` (bytes).
    pub fn memory_rss(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or_else(|| panic!("no VmRSS in {path}"))
    }

    pub fn is_running(&mut self) -> bool {
        self.own_mut("is_running").is_running()
    }

    /// SIGTERM (then SIGKILL after 5 s) and reap. The log stays readable until drop.
    pub fn kill(&mut self) {
        self.own_mut("kill").kill();
    }
}

/// Parses admin text stats: `name: value` lines with integer values.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Admin `/stats?filter=` matching exactly the stat `name`, percent-encoded.
pub(crate) fn stats_filter(name: &str) -> String {
    pct_encode(&format!("^{}$", regex_escape(name)))
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn pct_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stats_keeps_integers_and_skips_histograms() {
        let s = parse_stats(
            "http.ingress.downstream_rq_2xx: 3\nserver.live: 1\n\
             http.ingress.downstream_rq_time: P0(nan,0) P25(nan,0)\n",
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s["http.ingress.downstream_rq_2xx"], 3);
    }
}
