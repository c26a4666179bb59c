//! Child processes that die with the test, and the directory their logs go to.
//!
//! A [`Child`] is killed by the PID it was started with: SIGTERM, a grace period, then SIGKILL,
//! then reaped. We never kill by name (`pkill envoy` would take down other tests' Envoys, or a
//! developer's). Until it is reaped the process stays a zombie, so its PID cannot be reused by an
//! unrelated process while the guard is alive.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Polls `cond` every `poll` until it returns true or `timeout` has passed; returns the last result.
pub fn wait_until(timeout: Duration, poll: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for(timeout, poll, || cond().then_some(())).is_some()
}

/// Polls `f` every `poll` until it returns `Some` or `timeout` has passed.
pub fn wait_for<T>(
    timeout: Duration,
    poll: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(poll);
    }
}

/// A per-test scratch directory (logs, rendered configs, Redis data).
///
/// Removed when dropped normally; kept, and its path printed, when dropped while the thread is
/// panicking (a failing test) or when `WEIR_E2E_KEEP=1`.
#[derive(Debug)]
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    /// A fresh directory `weir-e2e-<label>-XXXXXX` under the system temp dir.
    pub fn new(label: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("weir-e2e-{label}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for {label}: {e}"));
        let path = dir.path().to_path_buf();
        TestDir {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<dir>/<name>`.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `contents` to `<dir>/<name>` and returns the path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.join(name);
        fs::write(&p, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
        p
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let keep =
            thread::panicking() || std::env::var_os("WEIR_E2E_KEEP").is_some_and(|v| v == "1");
        if let Some(dir) = self.dir.take() {
            if keep {
                let p = dir.keep();
                eprintln!("weir-e2e: kept {}", p.display());
            }
        }
    }
}

/// A process we started, killed by PID when dropped. Its stdout and stderr go to one log file.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: std::process::Child,
    log_path: PathBuf,
    grace: Duration,
    exit: Option<ExitStatus>,
}

impl Child {
    /// Starts `program args...` with extra `env` vars, stdin closed, stdout+stderr appended to
    /// `log_path`. `name` is used in messages only.
    pub fn spawn<I, S>(
        name: &str,
        program: impl AsRef<OsStr>,
        args: I,
        env: &[(&str, &str)],
        log_path: &Path,
    ) -> Child
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let program = program.as_ref();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", log_path.display()));
        let log2 = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot dup {}: {e}", log_path.display()));
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {name} ({}): {e}",
                Path::new(program).display()
            )
        });
        Child {
            name: name.to_string(),
            child,
            log_path: log_path.to_path_buf(),
            grace: Duration::from_secs(5),
            exit: None,
        }
    }

    /// How long [`kill`](Self::kill) waits after SIGTERM before SIGKILL (default 5 s; zero means
    /// SIGKILL straight away).
    pub fn with_grace(mut self, grace: Duration) -> Child {
        self.grace = grace;
        self
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole log so far (lossy UTF-8).
    pub fn log(&self) -> String {
        read_lossy(&self.log_path)
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log_path, n)
    }

    /// The exit status if the process has exited (reaps it), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("waitpid({}) for {}: {e}", self.pid(), self.name));
        }
        self.exit
    }

    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_for(timeout, Duration::from_millis(20), || self.try_wait())
    }

    /// SIGTERM, up to the grace period, then SIGKILL; always reaps. Idempotent.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        if !self.grace.is_zero() {
            self.signal(libc::SIGTERM);
            if let Some(status) = self.wait_exit(self.grace) {
                return status;
            }
            eprintln!(
                "weir-e2e: {} (pid {}) ignored SIGTERM for {:?}; sending SIGKILL",
                self.name,
                self.pid(),
                self.grace
            );
        }
        self.kill_hard()
    }

    /// SIGKILL now (a crash, no shutdown handlers), then reap. Idempotent.
    pub fn kill_hard(&mut self) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        self.signal(libc::SIGKILL);
        let status = self
            .child
            .wait()
            .unwrap_or_else(|e| panic!("waitpid({}) for {}: {e}", self.pid(), self.name));
        self.exit = Some(status);
        status
    }

    /// Sends `sig` to exactly this PID (only while it has not been reaped).
    pub fn signal(&mut self, sig: libc::c_int) {
        if self.try_wait().is_some() {
            return;
        }
        let pid = libc::pid_t::try_from(self.pid())
            .unwrap_or_else(|_| panic!("pid {} does not fit pid_t", self.pid()));
        // SAFETY: kill(2) has no memory-safety preconditions; the PID is our unreaped child.
        let rc = unsafe { libc::kill(pid, sig) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            panic!("kill({pid}, {sig}) for {}: {err}", self.name);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Never panic in drop: we may already be unwinding.
        if self.exit.is_none() {
            if let Ok(None) = self.child.try_wait() {
                if !self.grace.is_zero() {
                    let pid = self.child.id() as libc::pid_t;
                    // SAFETY: as in `signal`; our unreaped child.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    let deadline = Instant::now() + self.grace;
                    while Instant::now() < deadline {
                        if let Ok(Some(_)) = self.child.try_wait() {
                            break;
                        }
                        thread::sleep(Duration::from_millis(20));
                    }
                }
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!(
                "weir-e2e: {} (pid {}) log {}; last lines:\n{}",
                self.name,
                self.child.id(),
                self.log_path.display(),
                tail(&self.log_path, 30)
            );
        }
    }
}

/// A generic process (e.g. the bridge binary) with its own [`TestDir`] holding `process.log`.
#[derive(Debug)]
pub struct Process {
    // Field order matters: the child dies before its directory is removed.
    child: Child,
    dir: TestDir,
}

impl Process {
    /// Starts `cmd args...` with extra environment `env`; output goes to `<dir>/process.log`.
    pub fn spawn<I, S>(cmd: impl AsRef<OsStr>, args: I, env: &[(&str, &str)]) -> Process
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let cmd = cmd.as_ref();
        let name = Path::new(cmd)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "process".to_string());
        let dir = TestDir::new(&name);
        let child = Child::spawn(&name, cmd, args, env, &dir.join("process.log"));
        Process { child, dir }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn dir(&self) -> &TestDir {
        &self.dir
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    pub fn log(&self) -> String {
        self.child.log()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// SIGTERM, grace, SIGKILL; see [`Child::kill`].
    pub fn kill(&mut self) -> ExitStatus {
        self.child.kill()
    }
}

/// Whether a process with this PID exists (zombies count as existing).
pub fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

pub(crate) fn read_lossy(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// The last `n` lines of a file, reading at most the last 256 KiB.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    const MAX: u64 = 256 * 1024;
    let Ok(mut f) = File::open(path) else {
        return format!("<cannot open {}>", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
