//! A throwaway Redis Cluster on 127.0.0.1 free ports.
//!
//! Each node is a `redis-server` child with its own directory; the cluster is formed with
//! `redis-cli --cluster create` and is only handed out once every node reports
//! `cluster_state:ok` and every replica's link to its master is up. `cluster-node-timeout 1000`
//! keeps failover at ~2–3 s, and `cluster-require-full-coverage no` keeps the other masters
//! serving while one shard fails over. Both ports of a node, the client port and the
//! cluster bus (`cluster-port`), come from [`free_port`].

use std::collections::HashSet;
use std::ffi::OsStr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ports::free_port;
use crate::prereq::{redis_cli_bin, redis_server_bin};
use crate::process::{wait_for, wait_until, Child, TestDir};

/// Forming the cluster and syncing replicas (normally ~3 s here).
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// What every test server runs with: loopback, nothing persisted, in the foreground.
pub(crate) const THROWAWAY_ARGS: [&str; 10] = [
    "--bind",
    "127.0.0.1",
    "--save",
    "",
    "--appendonly",
    "no",
    "--daemonize",
    "no",
    "--protected-mode",
    "no",
];

/// The number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// One `redis-server` of the cluster.
#[derive(Debug)]
pub struct RedisNode {
    pub port: u16,
    child: Child,
    killed: bool,
}

impl RedisNode {
    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn is_killed(&self) -> bool {
        self.killed
    }

    pub fn log(&self) -> String {
        self.child.log()
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    /// `127.0.0.1:<port>` (the `@cport` part stripped).
    pub addr: String,
    pub flags: Vec<String>,
    /// The master's id for a replica, `-` for a master.
    pub master_id: String,
    pub link_connected: bool,
    /// Inclusive slot ranges served by this node.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    /// Flagged `fail` or `fail?` by the node we asked.
    pub fn is_failing(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// Parses `CLUSTER NODES` output.
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next().unwrap_or_default().to_string();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('[')) // slots being migrated
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let n = s.parse().ok()?;
                        Some((n, n))
                    }
                })
                .collect();
            Some(NodeInfo {
                id: f[0].to_string(),
                addr,
                flags: f[2].split(',').map(str::to_string).collect(),
                master_id: f[3].to_string(),
                link_connected: f[7] == "connected",
                slots,
            })
        })
        .collect()
}

/// `field:value` from `INFO`/`CLUSTER INFO` output.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(field)?.strip_prefix(':'))
}

/// CRC16/XMODEM as Redis Cluster uses it.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`, honouring `{hash tags}` (same rule as `CLUSTER KEYSLOT`).
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> args...`; `Err` if redis-cli exits non-zero (cannot
/// connect). Error *replies* (`ERR ...`, `MOVED ...`) come back as `Ok` text, as redis-cli prints
/// them on stdout with exit code 0.
pub fn redis_cli_at<I, S>(port: u16, args: I) -> Result<String, String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(redis_cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run redis-cli: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "redis-cli -p {port} {}: {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))
    }
}

/// A Redis Cluster of `masters × (1 + replicas_per_master)` nodes; every node is killed by PID
/// when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    // Field order matters: nodes die before the directory is removed.
    nodes: Vec<RedisNode>,
    dir: TestDir,
    /// Time from the first spawn until the cluster was ready.
    pub startup: Duration,
}

impl RedisCluster {
    /// Starts the nodes, forms the cluster, waits until it is fully up. Panics with details (and
    /// keeps the logs) if that takes longer than [`CLUSTER_TIMEOUT`].
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 3, "Redis Cluster needs at least 3 masters");
        let started = Instant::now();
        let total = masters * (1 + replicas_per_master);
        // A port is free when `free_port` hands it out, not when the node binds it: another
        // process (a test binary beside this one has its own `free_port`) can take it in
        // between, and the node exits at once ("Address already in use"). Start again, on
        // fresh ports, rather than wait for it.
        let mut attempts = 1;
        let mut cluster = loop {
            let mut cluster = RedisCluster::spawn_nodes(total);
            if !cluster.lost_a_port_while_starting() || attempts == 3 {
                break cluster;
            }
            attempts += 1;
        };
        cluster.wait_or_panic("every node answers PING", |c| {
            c.nodes
                .iter()
                .all(|n| redis_cli_at(n.port, ["PING"]).is_ok_and(|s| s == "PONG"))
        });
        cluster.form(total, masters, replicas_per_master);
        cluster.startup = started.elapsed();
        cluster
    }

    /// Waits until every node answers PING, or one has exited because its port was taken
    /// (true).
    fn lost_a_port_while_starting(&mut self) -> bool {
        let mut lost = false;
        wait_until(CLUSTER_TIMEOUT, Duration::from_millis(50), || {
            for node in &mut self.nodes {
                if node.child.try_wait().is_some() {
                    lost = node.child.log().contains("Address already in use");
                    return true;
                }
            }
            self.nodes
                .iter()
                .all(|n| redis_cli_at(n.port, ["PING"]).is_ok_and(|s| s == "PONG"))
        });
        lost
    }

    /// `total` cluster-enabled nodes on fresh ports, started, not yet a cluster.
    fn spawn_nodes(total: usize) -> RedisCluster {
        let dir = TestDir::new("redis-cluster");
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            let port = free_port();
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir(&node_dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", node_dir.display()));
            let p = port.to_string();
            // The cluster bus defaults to `port + 10000`, a port nobody checked: it can be
            // some other socket's ephemeral port ("Address already in use"). Pick it too.
            let bus = free_port().to_string();
            let conf = format!("nodes-{port}.conf");
            let mut args: Vec<std::ffi::OsString> = [
                "--port",
                &p,
                "--cluster-port",
                &bus,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
            ]
            .iter()
            .chain(&THROWAWAY_ARGS)
            .chain(&["--dir"])
            .map(|s| s.into())
            .collect();
            args.push(node_dir.into_os_string());
            let child = Child::spawn(
                &format!("redis-{port}"),
                redis_server_bin(),
                args,
                &[],
                &dir.join(format!("redis-{port}.log")),
            )
            // Nothing to persist: a kill is immediate, and a master would otherwise wait for its
            // replicas on SIGTERM (shutdown-timeout).
            .with_grace(Duration::ZERO);
            nodes.push(RedisNode {
                port,
                child,
                killed: false,
            });
        }
        RedisCluster {
            nodes,
            dir,
            startup: Duration::ZERO,
        }
    }

    /// `redis-cli --cluster create` over the nodes, then waits until the cluster is whole.
    fn form(&self, total: usize, masters: usize, replicas_per_master: usize) {
        let create = Command::new(redis_cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(RedisNode::addr))
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli --cluster create: {e}"));
        let create_out = format!(
            "{}{}",
            String::from_utf8_lossy(&create.stdout),
            String::from_utf8_lossy(&create.stderr)
        );
        assert!(
            create.status.success() && create_out.contains("All 16384 slots covered"),
            "redis-cli --cluster create failed ({}):\n{create_out}",
            create.status
        );

        self.wait_or_panic("cluster_state:ok and all replicas in sync", |c| {
            c.is_healthy(total, masters)
        });
    }

    fn wait_or_panic(&self, what: &str, cond: impl Fn(&RedisCluster) -> bool) {
        if !wait_until(CLUSTER_TIMEOUT, Duration::from_millis(100), || cond(self)) {
            panic!(
                "Redis Cluster not ready after {CLUSTER_TIMEOUT:?}: {what}; status:\n{}\nlogs in {}",
                self.describe(),
                self.dir.path().display()
            );
        }
    }

    /// A master's `INFO replication`: every replica online and at the master's offset.
    fn replicas_caught_up(repl: &str) -> bool {
        let master_offset =
            info_field(repl, "master_repl_offset").and_then(|v| v.parse::<u64>().ok());
        let replicas: Vec<&str> = repl
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("ip="))
            .collect();
        replicas.iter().all(|line| {
            let offset = line
                .split(',')
                .find_map(|kv| kv.strip_prefix("offset="))
                .and_then(|v| v.parse::<u64>().ok());
            line.contains("state=online") && offset.is_some() && offset == master_offset
        })
    }

    /// Every live node sees `cluster_state:ok` and `total` known nodes; `masters` masters own
    /// slots; every replica's link is up.
    fn is_healthy(&self, total: usize, masters: usize) -> bool {
        let mut n_masters = 0;
        for node in self.live() {
            let Ok(info) = redis_cli_at(node.port, ["CLUSTER", "INFO"]) else {
                return false;
            };
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_known_nodes") != Some(&total.to_string())
            {
                return false;
            }
            let Ok(repl) = redis_cli_at(node.port, ["INFO", "replication"]) else {
                return false;
            };
            match info_field(&repl, "role") {
                Some("master") => {
                    // After a full sync, Redis 7.0 holds writes back from a replica until
                    // its first acknowledgement (up to a second): a master killed then
                    // loses every write. Ready means every replica has acknowledged all.
                    if !Self::replicas_caught_up(&repl) {
                        return false;
                    }
                    n_masters += 1
                }
                Some("slave") => {
                    if info_field(&repl, "master_link_status") != Some("up")
                        || info_field(&repl, "master_sync_in_progress") == Some("1")
                    {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        n_masters == masters
    }

    /// One line per node: address, pid, state, and what it reports.
    pub fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let state = if n.killed {
                    "killed".to_string()
                } else {
                    match redis_cli_at(n.port, ["CLUSTER", "INFO"]) {
                        Ok(info) => format!(
                            "cluster_state={} known_nodes={}",
                            info_field(&info, "cluster_state").unwrap_or("?"),
                            info_field(&info, "cluster_known_nodes").unwrap_or("?")
                        ),
                        Err(e) => e,
                    }
                };
                format!("  {} pid {}: {state}", n.addr(), n.pid())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// All nodes, including killed ones.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    fn live(&self) -> impl Iterator<Item = &RedisNode> {
        self.nodes.iter().filter(|n| !n.killed)
    }

    fn any_live_port(&self) -> u16 {
        self.live()
            .next()
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("every node of the cluster has been killed"))
    }

    /// `127.0.0.1:<port>` of every node, including killed ones.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::addr).collect()
    }

    /// `127.0.0.1:<port>` of every live node (what a cluster client takes as seeds).
    pub fn seed_nodes(&self) -> Vec<String> {
        self.live().map(RedisNode::addr).collect()
    }

    /// `redis://127.0.0.1:<port>` of every live node.
    pub fn seed_urls(&self) -> Vec<String> {
        self.live()
            .map(|n| format!("redis://{}", n.addr()))
            .collect()
    }

    /// `CLUSTER NODES` as seen by a live node.
    pub fn cluster_nodes(&self) -> Vec<NodeInfo> {
        let text = redis_cli_at(self.any_live_port(), ["CLUSTER", "NODES"])
            .unwrap_or_else(|e| panic!("CLUSTER NODES: {e}"));
        parse_cluster_nodes(&text)
    }

    /// The process ids of the nodes still running (for their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        (self.nodes.iter())
            .filter(|n| !n.is_killed())
            .map(RedisNode::pid)
            .collect()
    }

    /// Addresses of the masters that serve slots and are not failing, as a live node sees them.
    pub fn masters(&self) -> Vec<String> {
        self.cluster_nodes()
            .into_iter()
            .filter(|n| n.is_master() && !n.is_failing() && !n.slots.is_empty())
            .map(|n| n.addr)
            .collect()
    }

    /// The master serving `slot`, as a live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> Option<String> {
        self.cluster_nodes()
            .into_iter()
            .find(|n| n.is_master() && n.serves(slot))
            .map(|n| n.addr)
    }

    /// `redis-cli -c -p <a live node> args...` (cluster mode follows MOVED). Panics if redis-cli
    /// cannot connect; error replies are returned as text.
    pub fn redis_cli<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        let mut all = vec![OsStr::new("-c").to_os_string()];
        all.extend(args);
        redis_cli_at(self.any_live_port(), &all).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGKILLs the node at `addr` (by its PID) and reaps it. Returns the PID.
    pub fn kill_node(&mut self, addr: &str) -> u32 {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.addr() == addr)
            .unwrap_or_else(|| panic!("{addr} is not a node of this cluster"));
        let pid = node.pid();
        node.child.kill_hard();
        node.killed = true;
        pid
    }

    /// Kills the master serving `slot`; returns its address.
    pub fn kill_master_of_slot(&mut self, slot: u16) -> String {
        let addr = self
            .master_of_slot(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}:\n{}", self.describe()));
        self.kill_node(&addr);
        addr
    }

    /// Waits until every live node agrees that `slot` is served by a live, non-failing master
    /// and reports `cluster_state:ok`. Returns the new master's address; panics after `timeout`.
    pub fn wait_for_failover(&self, slot: u16, timeout: Duration) -> String {
        let killed: HashSet<String> = self
            .nodes
            .iter()
            .filter(|n| n.killed)
            .map(RedisNode::addr)
            .collect();
        let found = wait_for(timeout, Duration::from_millis(50), || {
            let mut owner: Option<String> = None;
            for node in self.live() {
                let info = redis_cli_at(node.port, ["CLUSTER", "INFO"]).ok()?;
                if info_field(&info, "cluster_state") != Some("ok") {
                    return None;
                }
                let nodes =
                    parse_cluster_nodes(&redis_cli_at(node.port, ["CLUSTER", "NODES"]).ok()?);
                let m = nodes
                    .into_iter()
                    .find(|n| n.is_master() && n.serves(slot) && !n.is_failing())?;
                if killed.contains(&m.addr) || owner.as_ref().is_some_and(|o| *o != m.addr) {
                    return None;
                }
                owner = Some(m.addr);
            }
            owner
        });
        found.unwrap_or_else(|| {
            panic!(
                "slot {slot} not taken over by a live master within {timeout:?}:\n{}",
                self.describe()
            )
        })
    }

    /// The cluster's directory (node data dirs and logs).
    pub fn dir(&self) -> &TestDir {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slot_matches_the_redis_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty `{}` means the whole key is hashed.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn parses_cluster_nodes() {
        let text = "07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected\n\
                    e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000\n\
                    67ed 127.0.0.1:30002@40002 master,fail - 0 1426238316232 2 disconnected\n";
        let n = parse_cluster_nodes(text);
        assert_eq!(n.len(), 3);
        assert!(!n[0].is_master());
        assert_eq!(n[1].addr, "127.0.0.1:30001");
        assert!(n[1].serves(7000) && n[1].serves(0) && !n[1].serves(5461));
        assert!(n[2].is_failing() && !n[2].link_connected);
    }
}
