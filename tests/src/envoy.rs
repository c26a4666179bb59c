//! A real Envoy on 127.0.0.1: bootstrap rendering, start/ready, stats, validation.
//!
//! The bootstrap is rendered by plain Rust string building: one listener with an HTTP connection
//! manager, caller-supplied HTTP filters (raw YAML) before the router, a catch-all
//! `direct_response` route unless the caller supplies routes, and optional extra clusters (the
//! bridge, later). Raw snippets are written at column 0 and indented here.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::http::{self, Request, Response};
use crate::ports::free_port;
use crate::prereq::envoy_bin;
use crate::process::{wait_for, Child, TestDir};
use crate::shared_envoy::Lease;

/// How long Envoy gets to become LIVE (or, in `start_expect_failure`, to exit).
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Body of the default catch-all route.
pub const DEFAULT_BODY: &str = "weir-e2e ok\n";

/// How long weir's stats may lag the requests they count (its flush interval, plus margin).
pub const WEIR_STATS_LAG: std::time::Duration = std::time::Duration::from_millis(250);

/// A bootstrap to render. Ports default to fresh free ports.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub admin_port: u16,
    pub http_port: u16,
    /// HTTP filter list items (each starting with `- name: ...` at column 0), before the router.
    pub http_filters: Vec<String>,
    /// Route list items for the single virtual host (`domains: ["*"]`); `None` = catch-all
    /// `direct_response` 200 with [`DEFAULT_BODY`].
    pub routes: Option<String>,
    /// Cluster list items (`- name: ...` at column 0) for `static_resources.clusters`.
    pub clusters: Vec<String>,
    /// HCM `max_request_headers_kb`. Envoy's default is 60 (KiB for the whole header block), so a
    /// single 60 KB value gets 431; we default to 96 so tests can send 60 KB values.
    pub max_request_headers_kb: u32,
    /// An access log (file path, format): one line per request, written by
    /// Envoy when the request ends.
    pub access_log: Option<(std::path::PathBuf, AccessLogFormat)>,
    /// A top-level `stats_config:` block (raw YAML at column 0), e.g. the tags of
    /// [`shipped_stats_config`].
    pub stats_config: Option<String>,
    /// Clients whose requests Envoy counts as internal (`internal_address_config`), as
    /// `(prefix, length)`: Envoy keeps their `x-envoy-*` headers and strips them from
    /// every other request. None by default, as in Envoy.
    pub internal_cidrs: Vec<(String, u32)>,
}

/// How an access log writes its lines.
#[derive(Debug, Clone)]
pub enum AccessLogFormat {
    /// Envoy's `text_format`, a newline appended.
    Text(String),
    /// Envoy's `json_format`: this object, one per line.
    Json(serde_json::Value),
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap::new()
    }
}

impl Bootstrap {
    pub fn new() -> Bootstrap {
        Bootstrap {
            admin_port: free_port(),
            http_port: free_port(),
            http_filters: Vec::new(),
            routes: None,
            clusters: Vec::new(),
            max_request_headers_kb: 96,
            access_log: None,
            stats_config: None,
            internal_cidrs: Vec::new(),
        }
    }

    /// Counts requests from `prefix/len` as internal: an Envoy in front of this one.
    pub fn internal_cidr(mut self, prefix: &str, len: u32) -> Bootstrap {
        self.internal_cidrs.push((prefix.to_string(), len));
        self
    }

    /// Adds an HTTP filter (raw YAML list item) before the router.
    pub fn http_filter(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.http_filters.push(yaml.into());
        self
    }

    /// Adds a cluster (raw YAML list item).
    pub fn cluster(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.clusters.push(yaml.into());
        self
    }

    /// Replaces the catch-all route with these route list items (raw YAML).
    pub fn routes(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.routes = Some(yaml.into());
        self
    }

    pub fn max_request_headers_kb(mut self, kb: u32) -> Bootstrap {
        self.max_request_headers_kb = kb;
        self
    }

    /// Writes one access-log line per request to `path` (Envoy's `text_format`, `\n`
    /// appended).
    pub fn access_log(mut self, path: &Path, format: &str) -> Bootstrap {
        let format = AccessLogFormat::Text(format.to_string());
        self.access_log = Some((path.to_path_buf(), format));
        self
    }

    /// Writes one JSON object per request to `path`: Envoy's `json_format`, the object
    /// `format` (e.g. what `weir-check log-format` prints).
    pub fn access_log_json(mut self, path: &Path, format: &serde_json::Value) -> Bootstrap {
        let format = AccessLogFormat::Json(format.clone());
        self.access_log = Some((path.to_path_buf(), format));
        self
    }

    /// Adds a top-level `stats_config:` block (raw YAML at column 0).
    pub fn stats_config(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.stats_config = Some(yaml.into());
        self
    }

    /// The bootstrap YAML.
    pub fn render(&self) -> String {
        let default_routes = format!(
            "- match: {{ prefix: \"/\" }}\n  direct_response:\n    status: 200\n    body: {{ inline_string: {} }}\n",
            yaml_quote(DEFAULT_BODY)
        );
        let routes = indent(self.routes.as_deref().unwrap_or(&default_routes), 14);
        let mut filters = String::new();
        for f in &self.http_filters {
            filters.push_str(&indent(f, 10));
        }
        let access_log = match &self.access_log {
            None => String::new(),
            Some((path, format)) => format!(
                "          access_log:\n          - name: envoy.access_loggers.file\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n              path: {}\n              log_format:\n{}",
                yaml_quote(&path.to_string_lossy()),
                match format {
                    AccessLogFormat::Text(line) => format!(
                        "                text_format_source:\n                  inline_string: {}\n",
                        yaml_quote(&format!("{line}\n"))
                    ),
                    // JSON is YAML: the object goes in as it is.
                    AccessLogFormat::Json(object) => {
                        format!("                json_format: {object}\n")
                    }
                },
            ),
        };
        let internal = if self.internal_cidrs.is_empty() {
            String::new()
        } else {
            let mut c =
                "          internal_address_config:\n            cidr_ranges:\n".to_string();
            for (prefix, len) in &self.internal_cidrs {
                c.push_str(&format!(
                    "            - {{ address_prefix: {prefix}, prefix_len: {len} }}\n"
                ));
            }
            c
        };
        let clusters = if self.clusters.is_empty() {
            "  clusters: []\n".to_string()
        } else {
            let mut c = "  clusters:\n".to_string();
            for cl in &self.clusters {
                c.push_str(&indent(cl, 2));
            }
            c
        };
        format!(
            r#"# Rendered by weir-e2e (tests/src/envoy.rs).
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}
{stats_config}static_resources:
  listeners:
  - name: ingress
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {http} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          # The client address is the TCP peer, never X-Forwarded-For.
          use_remote_address: true
{internal}          max_request_headers_kb: {kb}
{access_log}          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
{routes}          http_filters:
{filters}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{clusters}"#,
            admin = self.admin_port,
            http = self.http_port,
            stats_config = self.stats_config.as_deref().unwrap_or(""),
            kb = self.max_request_headers_kb,
        )
    }
}

/// The `stats_config:` block of the shipped `envoy/envoy.yaml` (from its line to the next
/// top-level key), so tests run with exactly the tags users get.
pub fn shipped_stats_config() -> String {
    let path = crate::prereq::repo_root().join("envoy/envoy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut block = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("stats_config:") {
            inside = true;
        } else if inside && !line.is_empty() && !line.starts_with([' ', '#']) {
            break;
        }
        if inside {
            block.push_str(line);
            block.push('\n');
        }
    }
    assert!(!block.is_empty(), "{} has no stats_config", path.display());
    block
}

/// The plugin configuration (JSON) of the weir filter in the shipped `envoy/envoy.yaml`:
/// the README's config.
pub fn shipped_plugin_config() -> String {
    let path = crate::prereq::repo_root().join("envoy/envoy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bootstrap: serde_yaml::Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    let filters = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    filters
        .as_sequence()
        .and_then(|f| f.iter().find(|f| f["name"] == "envoy.filters.http.wasm"))
        .and_then(|f| f["typed_config"]["config"]["configuration"]["value"].as_str())
        .unwrap_or_else(|| panic!("no weir filter configuration in {}", path.display()))
        .to_string()
}

/// The weir filter as an HTTP filter list item, per docs ENVOY_NOTES: name/root_id/vm_id `weir`,
/// V8, `FAIL_RELOAD`, the plugin JSON as a `google.protobuf.StringValue`.
pub fn wasm_filter_yaml(plugin_config_json: &str, wasm_path: &Path) -> String {
    format!(
        r#"- name: envoy.filters.http.wasm
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: weir
      root_id: weir
      failure_policy: FAIL_RELOAD
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: {json}
      vm_config:
        vm_id: weir
        runtime: envoy.wasm.runtime.v8
        code:
          local:
            filename: {path}
"#,
        json = yaml_quote(plugin_config_json),
        path = yaml_quote(&wasm_path.to_string_lossy()),
    )
}

/// Why a weir stat a test reads may be missing.
fn not_defined(name: &str) -> String {
    format!(
        "weir did not define the stat {name}: its level is above the rule's (or the \
         plugin's) `stats` (set \"stats\": \"detailed\" in the test's config), or the rule \
         does not have what it counts (core/src/stats.rs)"
    )
}

/// The plugin configuration `json` with its `stats` level set to `level` (a test that reads
/// detailed stats asks for them: the default level does not define them).
pub fn with_stats(json: &str, level: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("not a JSON plugin configuration ({e}): {json}"));
    let object = config
        .as_object_mut()
        .unwrap_or_else(|| panic!("not a JSON object: {json}"));
    object.insert("stats".to_string(), level.into());
    config.to_string()
}

/// A YAML double-quoted scalar holding exactly `s` (JSON string escaping, which YAML accepts).
pub fn yaml_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Indents every non-empty line of `yaml` by `n` spaces; ensures a trailing newline.
pub fn indent(yaml: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        if !line.trim().is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
        out.push('\n');
    }
    out
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
        assert!(
            bootstrap.stats_config.is_none(),
            "a stats_config is the bootstrap's, not a listener's: use Envoy::start"
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
        let lease = crate::shared_envoy::lease(listener, clusters, concurrency);
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
    fn yaml_quote_round_trips_through_json_escapes() {
        assert_eq!(yaml_quote("it's \"x\"\n\\"), r#""it's \"x\"\n\\""#);
    }

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
