//! The machine: CPU pinning, CPU time from `/proc`, and what the report says about the host.

use std::fs;
use std::path::Path;
use std::process::Command;

/// The core Envoy runs on in the cost scenarios; everything else runs on [`LOAD_CORE`].
pub const ENVOY_CORE: usize = 0;
/// The core of the load generator, the bridge and Redis in the cost scenarios.
pub const LOAD_CORE: usize = 1;

/// Online CPUs of the machine (not of our affinity mask, which pinning narrows).
pub fn cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET only writes bit `c` of the set, and c < CPU_SETSIZE here.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// Pins one thread (or, with tid 0, the calling thread) to `cpus`.
fn set_affinity(tid: libc::pid_t, cpus: &[usize]) -> std::io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: the set is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Pins the calling thread; threads and processes it starts afterwards inherit the mask.
pub fn pin_self(cpus: &[usize]) {
    set_affinity(0, cpus).unwrap_or_else(|e| panic!("sched_setaffinity(self, {cpus:?}): {e}"));
}

/// Pins every thread of process `pid` to `cpus`. Threads the process starts later inherit
/// the mask of the thread that starts them, so pinning all existing threads pins the
/// process for good; it is done twice in case a thread was being born during the first pass.
pub fn pin_process(pid: u32, cpus: &[usize]) {
    for _ in 0..2 {
        let tasks = fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap_or_else(|e| panic!("cannot list the threads of pid {pid}: {e}"));
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            // A thread that exited in between is no error.
            if let Err(e) = set_affinity(tid, cpus) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    panic!("sched_setaffinity({tid} of pid {pid}, {cpus:?}): {e}");
                }
            }
        }
    }
}

/// The CPUs every thread of `pid` may run on, as `Cpus_allowed_list` says (e.g. `"0"`);
/// the distinct lists of all its threads, joined by `;` if they differ.
pub fn allowed_cpus(pid: u32) -> String {
    let mut lists: Vec<String> = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
            if let Some(l) = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            {
                let l = l.trim().to_string();
                if !lists.contains(&l) {
                    lists.push(l);
                }
            }
        }
    }
    lists.join(";")
}

/// Clock ticks per second of `/proc/<pid>/stat` times.
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// utime + stime of process `pid` (all its threads), in µs.
pub fn process_cpu_us(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/stat: {e}"));
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("unexpected /proc/{pid}/stat: {stat}"));
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12 here.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> u64 {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("no field {i} in /proc/{pid}/stat: {stat}"))
    };
    (ticks(11) + ticks(12)) * 1_000_000 / clock_ticks()
}

/// Time the threads of `pid` have spent on a CPU, in µs, from the scheduler's own
/// nanosecond clock (`/proc/PID/task/*/schedstat`, first field): a cross-check of the
/// tick-sampled utime + stime. Threads that have exited are not counted.
pub fn process_runtime_us(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns / 1000
}

/// Busy and total time of one CPU from `/proc/stat`, in µs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreTime {
    pub busy_us: u64,
    pub total_us: u64,
}

pub fn core_time(cpu: usize) -> CoreTime {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = format!("cpu{cpu}");
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
    else {
        return CoreTime::default();
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    let total = busy + get(3) + get(4);
    let us = 1_000_000 / clock_ticks();
    CoreTime {
        busy_us: busy * us,
        total_us: total * us,
    }
}

/// What the report says about the host.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_gib: f64,
    pub envoy: String,
    pub wrk: String,
    pub redis: String,
    pub rustc: String,
    pub commit: String,
}

impl Machine {
    pub fn probe(envoy: &Path) -> Machine {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let memory_gib = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
            .map(|kb| (kb / 1024.0 / 1024.0 * 10.0).round() / 10.0)
            .unwrap_or(0.0);
        // `envoy --version`: "<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL".
        let envoy_out = output(envoy.as_os_str(), &["--version"]);
        let envoy = envoy_out
            .split("version:")
            .nth(1)
            .map(|v| {
                let v = v.trim();
                let release = v.split('/').nth(1).unwrap_or(v);
                format!("{release} ({v})")
            })
            .unwrap_or(envoy_out);
        // wrk prints its version on an unknown flag; `-v` is the documented one.
        let wrk = output("wrk".as_ref(), &["-v"])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        let redis = output("redis-server".as_ref(), &["--version"]);
        let rustc = output("rustc".as_ref(), &["--version"]);
        let sha = output("git".as_ref(), &["rev-parse", "--short=12", "HEAD"]);
        let dirty = !output("git".as_ref(), &["status", "--porcelain"]).is_empty();
        let commit = if dirty {
            format!("{sha} (with uncommitted changes)")
        } else {
            sha
        };
        Machine {
            cores: cores(),
            cpu_model,
            kernel,
            memory_gib,
            envoy,
            wrk,
            redis,
            rustc,
            commit,
        }
    }
}

/// stdout + stderr of a command, trimmed; empty if it cannot run.
fn output(cmd: &std::ffi::OsStr, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.trim().to_string()
        })
        .unwrap_or_default()
}
