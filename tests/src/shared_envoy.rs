//! One running Envoy per worker count for a whole test binary, serving each test's bootstrap
//! as a listener of its own, added and removed through file-based LDS and CDS.
//!
//! Starting an Envoy with weir costs about 1.7 CPU-seconds, nearly all of it V8 compiling
//! `weir.wasm` (an Envoy without Wasm starts in 0.07); a listener added to a running Envoy
//! reuses its compiled VM and costs about 0.04 (measured 2026-11-29). A test that needs
//! nothing of the process itself (its PID, memory, signals, a bootstrap-level setting, a
//! configuration Envoy must refuse) takes a [`Lease`] through `Envoy::shared`.
//!
//! Isolation: each lease renames what tests name alike, so concurrent tests never share
//! state or stats. Its listener and HCM stat prefix are `t<id>`; each weir plugin `NAME`
//! becomes `NAME_t<id>` (weir keys its shared data and its stats by plugin name); each
//! cluster `NAME` becomes `NAME_t<id>`, and every `cluster:` that names it (routes, the
//! plugin's `bridge.cluster`) with it. [`Lease::served_stat`] and [`Lease::test_stat`]
//! translate stat names both ways, so a test reads the names its bootstrap implies.
//!
//! The process is stopped and reaped when the test binary exits (an `atexit` handler: SIGTERM,
//! then SIGKILL), so its CPU time counts in the binary's, as an own Envoy's does; if the binary
//! dies without exiting, `PR_SET_PDEATHSIG` kills it (it is spawned from a thread that lives
//! as long as the binary). Its directory,
//! `target/e2e-envoys/<binary pid>-<workers>-<n>/`, keeps the log until the next run removes
//! it. A test that holds Envoy to instants leases a process alone ([`Sharing::Alone`]): one
//! that no other lease holds meanwhile, reused by the next such test.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::envoy::stats_filter;
use crate::http;
use crate::ports::free_port;
use crate::prereq::{envoy_bin, repo_root};
use crate::process::{read_lossy, wait_for};

/// How long an added listener or cluster gets to appear in the admin interface.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(20);

/// A test's listener (and clusters) on a shared Envoy; removed when dropped.
#[derive(Debug)]
pub struct Lease {
    process: Arc<SharedProcess>,
    /// `t<id>`: the listener's name and its HCM stat prefix.
    pub name: String,
    /// The HCM stat prefix the test's bootstrap gave (`ingress`).
    test_prefix: String,
    /// Each weir plugin's name in the test's bootstrap, and the name it is served under.
    pub plugins: BTreeMap<String, String>,
    /// Each cluster's name in the test's bootstrap, and the name it is served under.
    pub clusters: BTreeMap<String, String>,
    /// `listener.ADDRESS_PORT.`: the listener's own stats, named alike in both.
    listener_stats: String,
    /// Where the shared log was when the lease began: [`Lease::log`] starts there.
    log_offset: u64,
    pub admin_port: u16,
    /// The process serves this lease alone, and goes back to the idle ones when it ends.
    alone: bool,
}

/// Whether a lease shares its Envoy's workers with other tests' listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Beside every other shared lease of the same worker count.
    Shared,
    /// Alone while it lasts, on a process that other such leases used before (or a new one
    /// when all are busy): for tests that hold Envoy to instants, which another test's
    /// traffic on the same workers would shift.
    Alone,
}

#[derive(Debug)]
struct SharedProcess {
    concurrency: u32,
    admin_port: u16,
    dir: PathBuf,
    log_path: PathBuf,
    /// The listeners and clusters being served, by name; written whole on every change
    /// (state of the world).
    served: Mutex<Served>,
    /// Set by the thread that waits on the process, if it ever exits.
    exited: Arc<Mutex<Option<String>>>,
}

#[derive(Debug, Default)]
struct Served {
    listeners: BTreeMap<String, Value>,
    clusters: BTreeMap<String, Value>,
    version: u64,
}

static NEXT_LEASE: AtomicU64 = AtomicU64::new(1);

/// Each shared Envoy's PID and what its waiting thread sets once it has reaped it.
type Running = (u32, Arc<Mutex<Option<String>>>);

/// The shared Envoys of this binary, for [`stop_shared_envoys`].
static RUNNING: Mutex<Vec<Running>> = Mutex::new(Vec::new());

/// At the binary's exit: SIGTERM to every shared Envoy, SIGKILL to any still up 5 s later,
/// and wait until each one's thread has reaped it.
extern "C" fn stop_shared_envoys() {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let reaped = |exited: &Arc<Mutex<Option<String>>>| {
        exited.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    };
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        for (pid, exited) in running.iter() {
            if !reaped(exited) {
                // SAFETY: kill(2) has no memory-safety preconditions; the PID is our child,
                // not reaped yet (its thread sets `exited` when it is).
                unsafe { libc::kill(*pid as libc::pid_t, signal) };
            }
        }
        let all_reaped = || running.iter().all(|(_, exited)| reaped(exited));
        if wait_for(Duration::from_secs(5), Duration::from_millis(10), || {
            all_reaped().then_some(())
        })
        .is_some()
        {
            return;
        }
    }
}

fn pool() -> &'static Mutex<HashMap<u32, Arc<SharedProcess>>> {
    static POOL: OnceLock<Mutex<HashMap<u32, Arc<SharedProcess>>>> = OnceLock::new();
    POOL.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The processes for [`Sharing::Alone`] leases that no lease holds now, by worker count.
fn idle() -> &'static Mutex<HashMap<u32, Vec<Arc<SharedProcess>>>> {
    static IDLE: OnceLock<Mutex<HashMap<u32, Vec<Arc<SharedProcess>>>>> = OnceLock::new();
    IDLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Serves `listener` (a `static_resources` listener of the test's bootstrap) and `clusters`
/// on a shared Envoy with `concurrency` workers, started on first use.
pub fn lease(listener: Value, clusters: Vec<Value>, concurrency: u32, sharing: Sharing) -> Lease {
    let process = match sharing {
        Sharing::Shared => {
            let mut pool = pool().lock().unwrap_or_else(|e| e.into_inner());
            pool.entry(concurrency)
                .or_insert_with(|| Arc::new(SharedProcess::start(concurrency)))
                .clone()
        }
        Sharing::Alone => {
            let reused = idle()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(concurrency)
                .or_default()
                .pop();
            reused.unwrap_or_else(|| Arc::new(SharedProcess::start(concurrency)))
        }
    };
    process.assert_running();
    let id = NEXT_LEASE.fetch_add(1, Ordering::Relaxed);
    let name = format!("t{id}");
    let suffix = format!("_{name}");

    let mut cluster_names = BTreeMap::new();
    let mut served_clusters = Vec::new();
    for mut cluster in clusters {
        let old = cluster["name"]
            .as_str()
            .unwrap_or_else(|| panic!("a cluster without a name: {cluster}"))
            .to_string();
        let new = format!("{old}{suffix}");
        cluster["name"] = Value::from(new.clone());
        if cluster["load_assignment"]["cluster_name"].as_str() == Some(&old) {
            cluster["load_assignment"]["cluster_name"] = Value::from(new.clone());
        }
        cluster_names.insert(old, new);
        served_clusters.push(cluster);
    }

    let mut listener = listener;
    listener["name"] = Value::from(name.clone());
    let socket = &listener["address"]["socket_address"];
    let listener_stats = format!(
        "listener.{}_{}.",
        socket["address"].as_str().unwrap_or_default(),
        socket["port_value"]
    );
    let mut plugins = BTreeMap::new();
    let mut test_prefix = String::new();
    for chain in array_mut(&mut listener["filter_chains"]) {
        for filter in array_mut(&mut chain["filters"]) {
            if filter["name"] != "envoy.filters.network.http_connection_manager" {
                continue;
            }
            let hcm = &mut filter["typed_config"];
            test_prefix = hcm["stat_prefix"].as_str().unwrap_or_default().to_string();
            hcm["stat_prefix"] = Value::from(name.clone());
            for http_filter in array_mut(&mut hcm["http_filters"]) {
                if http_filter["name"] != "envoy.filters.http.wasm" {
                    continue;
                }
                let config = &mut http_filter["typed_config"]["config"];
                let old = config["name"].as_str().unwrap_or_default().to_string();
                let new = format!("{old}{suffix}");
                config["name"] = Value::from(new.clone());
                plugins.insert(old, new);
                let value = &mut config["configuration"]["value"];
                if let Some(json) = value.as_str() {
                    if let Ok(mut plugin_config) = serde_json::from_str::<Value>(json) {
                        rename_clusters(&mut plugin_config, &cluster_names);
                        *value = Value::from(plugin_config.to_string());
                    }
                }
            }
        }
    }
    rename_clusters(&mut listener, &cluster_names);

    listener["@type"] = Value::from("type.googleapis.com/envoy.config.listener.v3.Listener");
    let log_offset = fs::metadata(&process.log_path)
        .map(|m| m.len())
        .unwrap_or(0);
    let added = process.serve(|served| {
        for mut cluster in served_clusters {
            cluster["@type"] = Value::from("type.googleapis.com/envoy.config.cluster.v3.Cluster");
            let key = cluster["name"].as_str().unwrap_or_default().to_string();
            served.clusters.insert(key, cluster);
        }
        served.listeners.insert(name.clone(), listener);
    });
    if let Err(why) = added {
        // What Envoy refused must not stay in the files, or every later update fails too.
        let _ = process.serve(|served| {
            served.listeners.remove(&name);
            for cluster in cluster_names.values() {
                served.clusters.remove(cluster);
            }
        });
        panic!("{why}");
    }
    Lease {
        admin_port: process.admin_port,
        process,
        name,
        test_prefix,
        plugins,
        clusters: cluster_names,
        listener_stats,
        log_offset,
        alone: sharing == Sharing::Alone,
    }
}

fn array_mut(value: &mut Value) -> impl Iterator<Item = &mut Value> {
    value.as_array_mut().into_iter().flatten()
}

/// Every `"cluster": NAME` (any depth) naming one of `names` takes its served name.
fn rename_clusters(value: &mut Value, names: &BTreeMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "cluster" {
                    if let Some(new) = v.as_str().and_then(|old| names.get(old)) {
                        *v = Value::from(new.clone());
                        continue;
                    }
                }
                rename_clusters(v, names);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_clusters(v, names)),
        _ => {}
    }
}

impl Lease {
    /// The served name of a stat the test's bootstrap implies: its plugins', HCM's
    /// (`http.ingress.`) and clusters' stats; other names are the process's, unchanged.
    pub fn served_stat(&self, name: &str) -> String {
        let test_http = format!("{}http.{}.", self.listener_stats, self.test_prefix);
        if let Some(stat) = name.strip_prefix(test_http.as_str()) {
            return format!("{}http.{}.{stat}", self.listener_stats, self.name);
        }
        if let Some(rest) = name.strip_prefix("wasmcustom.weir.") {
            if let Some((plugin, stat)) = rest.split_once('.') {
                if let Some(served) = self.plugins.get(plugin) {
                    return format!("wasmcustom.weir.{served}.{stat}");
                }
            }
        }
        if let Some(rest) = name
            .strip_prefix("http.")
            .and_then(|r| r.strip_prefix(self.test_prefix.as_str()))
            .and_then(|r| r.strip_prefix('.'))
        {
            return format!("http.{}.{rest}", self.name);
        }
        if let Some(rest) = name.strip_prefix("cluster.") {
            for (old, new) in &self.clusters {
                if let Some(stat) = rest
                    .strip_prefix(old.as_str())
                    .and_then(|r| r.strip_prefix('.'))
                {
                    return format!("cluster.{new}.{stat}");
                }
            }
        }
        name.to_string()
    }

    /// The name a test knows a served stat by, `None` for another lease's.
    pub fn test_stat(&self, served: &str) -> Option<String> {
        if let Some(rest) = served.strip_prefix(self.listener_stats.as_str()) {
            let served_http = format!("http.{}.", self.name);
            return Some(match rest.strip_prefix(served_http.as_str()) {
                Some(stat) => format!("{}http.{}.{stat}", self.listener_stats, self.test_prefix),
                None => served.to_string(),
            });
        }
        if let Some(rest) = served.strip_prefix("wasmcustom.weir.") {
            let (plugin, stat) = rest.split_once('.')?;
            let (old, _) = self.plugins.iter().find(|(_, new)| *new == plugin)?;
            return Some(format!("wasmcustom.weir.{old}.{stat}"));
        }
        if let Some(rest) = served.strip_prefix("http.") {
            let (prefix, stat) = rest.split_once('.')?;
            return (prefix == self.name).then(|| format!("http.{}.{stat}", self.test_prefix));
        }
        if let Some(rest) = served.strip_prefix("cluster.") {
            for (old, new) in &self.clusters {
                if let Some(stat) = rest
                    .strip_prefix(new.as_str())
                    .and_then(|r| r.strip_prefix('.'))
                {
                    return Some(format!("cluster.{old}.{stat}"));
                }
            }
            return None;
        }
        None
    }

    /// The shared Envoy's log since this lease began (every lease's lines, interleaved).
    pub fn log(&self) -> String {
        let text = read_lossy(&self.process.log_path);
        let start = usize::try_from(self.log_offset).unwrap_or(usize::MAX);
        text.get(start..).unwrap_or(&text).to_string()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let name = self.name.clone();
        let clusters: Vec<String> = self.clusters.values().cloned().collect();
        // Never panic in drop: a failing test is already unwinding.
        let removed = self.process.serve(|served| {
            served.listeners.remove(&name);
            for cluster in &clusters {
                served.clusters.remove(cluster);
            }
        });
        match removed {
            Err(why) => {
                eprintln!("weir-e2e: could not remove listener {name} from the shared Envoy: {why}")
            }
            Ok(()) if self.alone && self.process.exit_status().is_none() => {
                let concurrency = self.process.concurrency;
                idle()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(concurrency)
                    .or_default()
                    .push(self.process.clone());
            }
            Ok(()) => {}
        }
    }
}

impl SharedProcess {
    fn start(concurrency: u32) -> SharedProcess {
        let bin = envoy_bin();
        let root = repo_root().join("target/e2e-envoys");
        remove_stale(&root);
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("{}-{concurrency}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let admin_port = free_port();
        write_atomically(&dir, "lds.yaml", &resources(0, &[]));
        write_atomically(&dir, "cds.yaml", &resources(0, &[]));
        let bootstrap = format!(
            r#"# The shared Envoy of weir-e2e (tests/src/shared_envoy.rs): listeners and clusters come from the files beside this one.
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}
node: {{ id: weir-e2e, cluster: weir-e2e }}
dynamic_resources:
  cds_config:
    resource_api_version: V3
    path_config_source: {{ path: {cds}, watched_directory: {{ path: {dir} }} }}
  lds_config:
    resource_api_version: V3
    path_config_source: {{ path: {lds}, watched_directory: {{ path: {dir} }} }}
"#,
            cds = dir.join("cds.yaml").display(),
            lds = dir.join("lds.yaml").display(),
            dir = dir.display(),
        );
        let config = dir.join("envoy.yaml");
        fs::write(&config, bootstrap)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
        let log_path = dir.join("envoy.log");
        let log = fs::File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let mut command = Command::new(&bin);
        command
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", &concurrency.to_string()])
            .args([
                "--disable-hot-restart",
                "--base-id",
                &admin_port.to_string(),
            ])
            .args(["-l", "info", "--file-flush-interval-msec", "100"])
            // A removed listener stops at once: its test's clients are gone.
            .args(["--drain-time-s", "1", "--drain-strategy", "immediate"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("dup the log")))
            .stderr(Stdio::from(log));
        // SAFETY: prctl(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // PR_SET_PDEATHSIG fires when the thread that forked exits: spawn from one that
        // waits on Envoy, so for as long as the test binary lives.
        let exited = Arc::new(Mutex::new(None));
        let (started, spawned) = mpsc::channel();
        let exited_by_waiter = exited.clone();
        std::thread::Builder::new()
            .name(format!("shared-envoy-{concurrency}"))
            .spawn(move || match command.spawn() {
                Err(e) => {
                    let _ = started.send(Err(e.to_string()));
                }
                Ok(mut child) => {
                    let _ = started.send(Ok(child.id()));
                    let status = child.wait();
                    *exited_by_waiter.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(format!("{status:?}"));
                }
            })
            .expect("spawn the shared Envoy's thread");
        let pid = match spawned.recv().expect("the shared Envoy's thread answers") {
            Ok(pid) => pid,
            Err(e) => panic!("cannot start the shared Envoy ({}): {e}", bin.display()),
        };
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pid, exited.clone()));
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function that takes no arguments and never unwinds out.
            if unsafe { libc::atexit(stop_shared_envoys) } != 0 {
                eprintln!("weir-e2e: atexit failed: the shared Envoys die with the binary");
            }
        });
        let process = SharedProcess {
            concurrency,
            admin_port,
            dir,
            log_path,
            served: Mutex::new(Served::default()),
            exited,
        };
        let live = wait_for(
            crate::envoy::START_TIMEOUT,
            Duration::from_millis(50),
            || {
                if process.exit_status().is_some() {
                    return Some(false);
                }
                match http::get(admin_port, "/ready", &[]) {
                    Ok(r) if r.status == 200 && r.text().trim() == "LIVE" => Some(true),
                    _ => None,
                }
            },
        );
        if live != Some(true) {
            panic!(
                "the shared Envoy ({concurrency} workers) did not become LIVE; log:\n{}",
                crate::process::tail(&process.log_path, 40)
            );
        }
        process
    }

    fn exit_status(&self) -> Option<String> {
        self.exited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn assert_running(&self) {
        if let Some(status) = self.exit_status() {
            panic!(
                "the shared Envoy exited ({status}); its log: {}\n{}",
                self.log_path.display(),
                crate::process::tail(&self.log_path, 40)
            );
        }
    }

    /// Applies `change` to what is served, writes both files (clusters first, so a new
    /// listener finds its clusters; removed ones go after the listeners that used them) and
    /// waits until the admin interface lists what it adds. `Err` (with the log) when Envoy
    /// rejects the update or has exited.
    fn serve(&self, change: impl FnOnce(&mut Served)) -> Result<(), String> {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        let before_clusters: Vec<String> = served.clusters.keys().cloned().collect();
        change(&mut served);
        served.version += 1;
        let version = served.version;
        let clusters: Vec<Value> = served.clusters.values().cloned().collect();
        let listeners: Vec<Value> = served.listeners.values().cloned().collect();
        let adds_clusters = served.clusters.keys().any(|c| !before_clusters.contains(c));
        let rejected_before = self.rejections();
        let log_offset = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0);
        if adds_clusters {
            write_atomically(&self.dir, "cds.yaml", &resources(version, &clusters));
            let names = served.clusters.keys();
            self.await_listed("/clusters", names, rejected_before, log_offset)?;
        }
        write_atomically(&self.dir, "lds.yaml", &resources(version, &listeners));
        let names = served.listeners.keys();
        self.await_listed("/listeners", names, rejected_before, log_offset)?;
        if !adds_clusters {
            write_atomically(&self.dir, "cds.yaml", &resources(version, &clusters));
        }
        Ok(())
    }

    /// Waits until every one of `names` is in the admin `path`'s text listing.
    fn await_listed<'a>(
        &self,
        path: &str,
        names: impl Iterator<Item = &'a String> + Clone,
        rejected_before: u64,
        log_offset: u64,
    ) -> Result<(), String> {
        let started = Instant::now();
        let done = wait_for(UPDATE_TIMEOUT, Duration::from_millis(10), || {
            if self.exit_status().is_some() {
                return Some(false);
            }
            if self.rejections() > rejected_before {
                return Some(false);
            }
            let listing = http::get(self.admin_port, path, &[]).ok()?.text();
            let listed = |name: &String| {
                listing
                    .lines()
                    .any(|line| line.starts_with(&format!("{name}::")))
            };
            names.clone().all(listed).then_some(true)
        });
        if done == Some(true) {
            return Ok(());
        }
        let log = read_lossy(&self.log_path);
        let start = usize::try_from(log_offset).unwrap_or(usize::MAX);
        Err(format!(
            "the shared Envoy {} the update of {path} (after {:?}); its log since:\n{}",
            match (done, self.exit_status()) {
                (_, Some(status)) => format!("exited ({status}) during"),
                (Some(false), None) => "rejected".to_string(),
                _ => "did not apply".to_string(),
            },
            started.elapsed(),
            log.get(start..).unwrap_or(&log)
        ))
    }

    /// The listener and cluster updates Envoy has refused so far.
    fn rejections(&self) -> u64 {
        self.counter("listener_manager.lds.update_rejected")
            + self.counter("cluster_manager.cds.update_rejected")
    }

    fn counter(&self, name: &str) -> u64 {
        http::get(
            self.admin_port,
            &format!("/stats?filter={}", stats_filter(name)),
            &[],
        )
        .ok()
        .and_then(|r| crate::envoy::parse_stats(&r.text()).get(name).copied())
        .unwrap_or(0)
    }
}

/// A discovery response holding `items`, as the file-based xDS subscriptions read it.
fn resources(version: u64, items: &[Value]) -> String {
    serde_json::json!({ "version_info": version.to_string(), "resources": items }).to_string()
}

/// Writes `name` in `dir` by renaming a temporary file over it: Envoy watches the directory
/// for files moved into it, and never reads half a file.
fn write_atomically(dir: &Path, name: &str, contents: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    let path = dir.join(name);
    fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("cannot rename to {}: {e}", path.display()));
}

/// Removes the directories of shared Envoys whose test binary has exited.
fn remove_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !crate::process::pid_exists(pid)) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
