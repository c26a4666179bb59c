//! Redis without cluster mode on 127.0.0.1 free ports: one `redis-server` ([`RedisServer`]),
//! or a master, its replicas and Redis Sentinels watching them ([`RedisSentinel`]).
//!
//! A sentinel is `redis-server <conf> --sentinel`: the same binary Debian's `redis-sentinel`
//! package ships (that package only adds a systemd service). The sentinels are made fast:
//! a master is down after 500 ms without an answer, a failover may take 2 s, so that a
//! test's failover completes in a few seconds.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ports::free_port;
use crate::prereq::redis_server_bin;
use crate::process::{wait_until, Child, TestDir};
use crate::redis::{redis_cli_at, THROWAWAY_ARGS};

/// Starting a server, syncing a replica, sentinels discovering each other.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// One `redis-server` in its own directory, killed by PID when dropped. Its port and
/// arguments are kept, so that it can be restarted in place (same port, same data dir).
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    bin: PathBuf,
    args: Vec<OsString>,
    // Field order matters: the process dies before the directory is removed.
    child: Option<Child>,
    restarts: u32,
    dir: TestDir,
}

impl RedisServer {
    /// `redis-server` with no persistence, plus `extra` arguments (`--appendonly yes`…:
    /// later ones win).
    pub fn start(extra: &[&str]) -> RedisServer {
        RedisServer::start_bin(&redis_server_bin(), extra)
    }

    /// The same with another binary of the same command line (`valkey-server`).
    pub fn start_bin(bin: &Path, extra: &[&str]) -> RedisServer {
        let dir = TestDir::new("redis-server");
        let port = free_port();
        let port_arg = port.to_string();
        let mut args: Vec<OsString> = ["--port", &port_arg]
            .iter()
            .chain(&THROWAWAY_ARGS)
            .map(OsString::from)
            .collect();
        args.extend(extra.iter().map(OsString::from));
        args.push("--dir".into());
        args.push(dir.path().as_os_str().to_owned());
        let mut server = RedisServer {
            port,
            bin: bin.to_path_buf(),
            args,
            child: None,
            restarts: 0,
            dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let name = format!("redis-{}", self.port);
        let log = self.dir.join(format!("{name}.{}.log", self.restarts));
        // SIGTERM first (a server with persistence saves on the way out), SIGKILL after 5 s.
        let child = Child::spawn(&name, &self.bin, &self.args, &[], &log);
        self.child = Some(child);
        let port = self.port;
        let up = wait_until(READY_TIMEOUT, Duration::from_millis(20), || {
            // With `requirepass`, an unauthenticated PING is refused: up all the same.
            redis_cli_at(port, ["PING"]).is_ok_and(|s| s == "PONG" || s.starts_with("NOAUTH"))
        });
        assert!(up, "{name} did not answer PING; log:\n{}", self.log());
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    pub fn dir(&self) -> &TestDir {
        &self.dir
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The current process's id (0 while it is stopped), for its CPU time.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::pid)
    }

    /// The current process's output.
    pub fn log(&self) -> String {
        self.child.as_ref().map(Child::log).unwrap_or_default()
    }

    /// `redis-cli` on this server; panics if it cannot connect.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli_at(self.port, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGKILL: a crash, nothing saved on the way out.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill_hard();
        }
    }

    /// SIGTERM and wait: a clean shutdown (an AOF is fsynced, `save` rules write the RDB).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Sends `sig` to the server (SIGSTOP freezes it: its socket accepts, nothing
    /// answers; SIGCONT thaws it).
    pub fn signal(&mut self, sig: libc::c_int) {
        if let Some(child) = self.child.as_mut() {
            child.signal(sig);
        }
    }

    /// Starts again on the same port with the same arguments and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the server first");
        self.restarts += 1;
        self.spawn();
    }
}

/// A master, its replicas and `sentinels` sentinels monitoring it as [`MASTER_NAME`].
#[derive(Debug)]
pub struct RedisSentinel {
    /// The first is the initial master.
    servers: Vec<RedisServer>,
    // Field order matters: the sentinels die before the directory is removed.
    sentinels: Vec<(u16, Child)>,
    auth: SentinelAuth,
    dir: TestDir,
}

/// Passwords (`requirepass`) of the Redis servers and of the sentinels; none by default.
#[derive(Debug, Clone, Default)]
pub struct SentinelAuth {
    pub master: Option<String>,
    pub sentinel: Option<String>,
}

/// `redis-cli` with `-a password` when there is one.
fn cli_as<const N: usize>(port: u16, password: &Option<String>, args: [&str; N]) -> Option<String> {
    let auth = password
        .iter()
        .flat_map(|pw| ["--no-auth-warning", "-a", pw.as_str()]);
    let all: Vec<&str> = auth.chain(args).collect();
    redis_cli_at(port, all).ok()
}

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "weir";

impl RedisSentinel {
    /// Starts the servers and the sentinels; returns once the replicas are in sync and
    /// every sentinel knows every replica and every other sentinel. Quorum: a majority.
    pub fn start(replicas: usize, sentinels: usize) -> RedisSentinel {
        RedisSentinel::start_with(replicas, sentinels, SentinelAuth::default())
    }

    /// The same, with passwords: the servers' (`requirepass`, `masterauth`, and the
    /// sentinels' `auth-pass`) and the sentinels' own (`requirepass`, `sentinel-pass`).
    pub fn start_with(replicas: usize, sentinels: usize, auth: SentinelAuth) -> RedisSentinel {
        assert!(sentinels >= 1);
        let server_auth: Vec<&str> = auth
            .master
            .iter()
            .flat_map(|pw| ["--requirepass", pw.as_str(), "--masterauth", pw.as_str()])
            .collect();
        let master = RedisServer::start(&server_auth);
        let master_port = master.port.to_string();
        let mut of = vec!["--replicaof", "127.0.0.1", &master_port];
        of.extend(&server_auth);
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start(&of));
        }
        let mut sentinel_auth = String::new();
        if let Some(pw) = &auth.master {
            sentinel_auth += &format!("sentinel auth-pass {MASTER_NAME} {pw}\n");
        }
        if let Some(pw) = &auth.sentinel {
            sentinel_auth += &format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n");
        }
        let dir = TestDir::new("redis-sentinel");
        let quorum = sentinels / 2 + 1;
        let mut children = Vec::with_capacity(sentinels);
        for _ in 0..sentinels {
            let port = free_port();
            let conf = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 2000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n{sentinel_auth}",
                dir = dir.path().display(),
                master = servers[0].port,
            );
            // Sentinel rewrites its file (what it learns): one writable file each.
            let path = dir.write(&format!("sentinel-{port}.conf"), conf);
            let child = Child::spawn(
                &format!("sentinel-{port}"),
                redis_server_bin(),
                [path.as_os_str(), "--sentinel".as_ref()],
                &[],
                &dir.join(format!("sentinel-{port}.log")),
            )
            .with_grace(Duration::ZERO);
            children.push((port, child));
        }
        let setup = RedisSentinel {
            servers,
            sentinels: children,
            auth,
            dir,
        };
        let ready = wait_until(READY_TIMEOUT, Duration::from_millis(50), || {
            setup.replicas_in_sync(replicas) && setup.sentinels_know_all(replicas, sentinels)
        });
        assert!(
            ready,
            "sentinel setup not ready after {READY_TIMEOUT:?}; logs in {}",
            setup.dir.path().display()
        );
        setup
    }

    fn replicas_in_sync(&self, replicas: usize) -> bool {
        let Some(info) = cli_as(
            self.servers[0].port,
            &self.auth.master,
            ["INFO", "replication"],
        ) else {
            return false;
        };
        let online = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .count();
        online == replicas
    }

    fn sentinels_know_all(&self, replicas: usize, sentinels: usize) -> bool {
        self.sentinels.iter().all(|(port, _)| {
            let Some(text) = cli_as(
                *port,
                &self.auth.sentinel,
                ["SENTINEL", "MASTER", MASTER_NAME],
            ) else {
                return false;
            };
            let fields: Vec<&str> = text.lines().collect();
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv.first() == Some(&name))
                    .and_then(|kv| kv.get(1).copied())
            };
            field("num-slaves") == Some(&replicas.to_string())
                && field("num-other-sentinels") == Some(&(sentinels - 1).to_string())
        })
    }

    /// `127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// The master the first sentinel that answers names.
    pub fn master_addr(&self) -> Option<String> {
        self.sentinels.iter().find_map(|(port, _)| {
            let text = cli_as(
                *port,
                &self.auth.sentinel,
                ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )?;
            let mut lines = text.lines();
            Some(format!("{}:{}", lines.next()?, lines.next()?))
        })
    }

    /// The server at `addr`.
    pub fn server(&mut self, addr: &str) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.addr() == addr)
            .unwrap_or_else(|| panic!("{addr} is not a server of this setup"))
    }

    /// Waits until the sentinels name a master other than `old` and that server says it
    /// is one (`ROLE`); returns its address.
    pub fn wait_for_new_master(&self, old: &str, timeout: Duration) -> String {
        let mut found = None;
        let done = wait_until(timeout, Duration::from_millis(20), || {
            found = self
                .master_addr()
                .filter(|addr| addr != old)
                .filter(|addr| {
                    let port = addr.rsplit(':').next().and_then(|p| p.parse().ok());
                    port.and_then(|p| cli_as(p, &self.auth.master, ["ROLE"]))
                        .is_some_and(|role| role.starts_with("master"))
                });
            found.is_some()
        });
        match found {
            Some(addr) if done => addr,
            _ => panic!(
                "no failover away from {old} within {timeout:?}; logs in {}",
                self.dir.path().display()
            ),
        }
    }
}
