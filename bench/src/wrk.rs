//! wrk as the load generator of the cost scenarios.
//!
//! One wrk thread (wrk runs on the load core, Envoy on the other) with keep-alive
//! connections. Requests come from a Lua script written here: `GET /api/bench` with
//! `x-user` cycling over 1,000 users and `x-tenant` over 10 tenants, or, in the
//! half-limited mode, every other request from a user never seen before. The script's
//! `done` prints wrk's own figures as one JSON line, so nothing parses wrk's text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Users in the request mix (the `x-user` values `u0` … `u999`).
pub const USERS: u32 = 1000;
/// Tenants in the request mix (`x-tenant` `t0` … `t9`, user `i` belongs to `t(i mod 10)`).
pub const TENANTS: u32 = 10;
/// The path every scenario is asked for.
pub const PATH: &str = "/api/bench";

/// Which requests wrk sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Traffic {
    /// 1,000 users in turn.
    Users,
    /// Odd requests: the 1,000 users in turn; even requests: a user never seen before.
    HalfNew,
}

impl Traffic {
    fn arg(self) -> &'static str {
        match self {
            Traffic::Users => "users",
            Traffic::HalfNew => "half",
        }
    }
}

const SCRIPT: &str = r#"-- Written by weir-bench (bench/src/wrk.rs): the requests of one scenario.
-- args: mode ("users" | "half"), nonce (makes the new users of this run unique).
local mode, nonce = "users", "0"
local users, tenants = @USERS@, @TENANTS@
local fixed = {}
local k, fresh, n = 0, 0, 0

function init(args)
  mode = args[1] or mode
  nonce = args[2] or nonce
  for i = 0, users - 1 do
    fixed[i + 1] = wrk.format("GET", "@PATH@",
      { ["x-user"] = "u" .. i, ["x-tenant"] = "t" .. (i % tenants) })
  end
end

function request()
  n = n + 1
  if mode == "half" and n % 2 == 0 then
    fresh = fresh + 1
    return wrk.format("GET", "@PATH@",
      { ["x-user"] = "new-" .. nonce .. "-" .. fresh, ["x-tenant"] = "t" .. (fresh % tenants) })
  end
  k = k + 1
  return fixed[(k % users) + 1]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WEIR_BENCH {"requests":%.0f,"duration_us":%.0f,"status_errors":%.0f,' ..
    '"socket_errors":%.0f,"timeouts":%.0f,"p50_us":%.0f,"p90_us":%.0f,"p99_us":%.0f,"max_us":%.0f}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"#;

/// Writes the Lua script into `dir` and returns its path.
pub fn write_script(dir: &Path) -> PathBuf {
    let text = SCRIPT
        .replace("@USERS@", &USERS.to_string())
        .replace("@TENANTS@", &TENANTS.to_string())
        .replace("@PATH@", PATH);
    let path = dir.join("requests.lua");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// What wrk reports for one run.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct WrkReport {
    pub requests: u64,
    pub duration_us: u64,
    /// Responses that were not 2xx/3xx (429s in the half-limited scenario).
    pub status_errors: u64,
    pub socket_errors: u64,
    pub timeouts: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl WrkReport {
    pub fn rps(&self) -> f64 {
        if self.duration_us == 0 {
            0.0
        } else {
            self.requests as f64 * 1e6 / self.duration_us as f64
        }
    }
}

/// The wrk binary: `$WRK_BIN`, else `wrk` on `PATH`.
pub fn wrk_bin() -> PathBuf {
    std::env::var_os("WRK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("wrk"))
}

/// Runs wrk against `127.0.0.1:port` for `duration` (whole seconds, at least 1).
pub fn run(
    script: &Path,
    port: u16,
    connections: u32,
    duration: Duration,
    traffic: Traffic,
    nonce: &str,
) -> WrkReport {
    let secs = duration.as_secs().max(1);
    let out = Command::new(wrk_bin())
        .args(["-t1", "-c", &connections.to_string()])
        .args([
            "-d",
            &format!("{secs}s"),
            "--latency",
            "--timeout",
            "5s",
            "-s",
        ])
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}{PATH}"))
        .args(["--", traffic.arg(), nonce])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run wrk ({}): {e}; install it with `apt-get install -y wrk` or set WRK_BIN",
                wrk_bin().display()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WEIR_BENCH "))
        .unwrap_or_else(|| {
            panic!(
                "wrk ({}) printed no result line; stdout:\n{stdout}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(json).unwrap_or_else(|e| panic!("wrk result {json:?}: {e}"))
}
