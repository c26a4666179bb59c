//! Running the scripts on Redis, whatever its deployment ([`crate::connection`]).
//!
//! Each call is `EVALSHA` (on a cluster, routed by its first key's slot); on `NOSCRIPT` it
//! is sent again as `EVAL` with the source, to the same node, which also caches the script
//! there.
//! `SCRIPT LOAD` and `EVAL` are not replicated, so a replica promoted by a failover (or a
//! node that restarted or ran `SCRIPT FLUSH`) answers NOSCRIPT once.
//!
//! The crate's `ScriptInvocation::invoke_async` recovers too (checked on a real cluster
//! after a promotion), but differently: `SCRIPT LOAD` fanned out to every master the client
//! is connected to, all of which must answer, then `EVALSHA` again — two more round trips
//! and a dependency on the whole cluster, during the failover that caused the NOSCRIPT.
//! Ours is one round trip to the one node that needs the script.
//!
//! Every call is bounded by the command timeout, whatever the client's own retries do.

use crate::connection::RedisConnection;
use crate::metrics::Metrics;
use crate::scripts::{decode_reply, decode_settled, Invocation, ScriptReply, Scripts};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a script call gave no decision.
#[derive(Debug)]
pub enum CallError {
    /// No answer within the command timeout.
    Timeout,
    Redis(RedisError),
    /// An answer the decoder refused (a script bug).
    BadReply(String),
}

/// The connection and the scripts. Cheap to clone (the connection multiplexes).
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    scripts: Arc<Scripts>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl RedisStore {
    /// `conn` may still be connecting (a pending connection): nothing is sent until the
    /// first call.
    pub fn new(conn: impl Into<RedisConnection>, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        RedisStore {
            conn: conn.into(),
            scripts: Arc::new(Scripts::load()),
            timeout,
            metrics,
        }
    }

    /// Runs one acquire script call and decodes its reply.
    pub async fn run(&self, inv: &Invocation) -> Result<ScriptReply, CallError> {
        let value = self.call(inv).await?;
        decode_reply(&value).map_err(CallError::BadReply)
    }

    /// Runs one settle script call: whether the key's state changed, and Redis's clock.
    pub async fn run_settle(&self, inv: &Invocation) -> Result<(bool, u64), CallError> {
        let value = self.call(inv).await?;
        decode_settled(&value).map_err(CallError::BadReply)
    }

    async fn call(&self, inv: &Invocation) -> Result<Value, CallError> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.eval(inv)).await;
        self.metrics
            .observe_redis(inv.kind.name(), started.elapsed().as_secs_f64());
        match result {
            Err(_) => Err(CallError::Timeout),
            Ok(Err(err)) => Err(CallError::Redis(err)),
            Ok(Ok(value)) => Ok(value),
        }
    }

    async fn eval(&self, inv: &Invocation) -> Result<Value, RedisError> {
        let Some(script) = self.scripts.get(inv.kind, inv.purpose) else {
            return Err(RedisError::from((
                ErrorKind::Client,
                "no Lua script shipped for the algorithm",
                inv.kind.to_string(),
            )));
        };
        let sha = command("EVALSHA", &script.sha1, inv);
        match self.conn.query(&sha).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.metrics.script_fallback(inv.kind.name());
                tracing::info!(algorithm = %inv.kind, "NOSCRIPT: sending the script with EVAL");
                self.conn.query(&command("EVAL", script.source, inv)).await
            }
            other => other,
        }
    }

    /// `PING` within the timeout: whether this replica reaches Redis. Standalone and
    /// sentinel: the master. Cluster: one node the client is connected to. A master that
    /// is down fails the calls for its own slots, not this: were readiness to need every master, one dead shard would take
    /// every bridge replica out of service, and every key with it. (A fan-out to every
    /// master taking the first answer waits here on the dead master's reconnection:
    /// measured on a cluster with one master killed, it timed out.)
    pub async fn ping(&self) -> Result<(), CallError> {
        match tokio::time::timeout(self.timeout, self.conn.ping()).await {
            Err(_) => Err(CallError::Timeout),
            Ok(Err(err)) => Err(CallError::Redis(err)),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// The connection the scripts run on, for commands of the caller's own (tests
    /// inspecting keys). Not bounded by the timeout.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }
}

/// `EVALSHA <sha> n keys... args...` or `EVAL <source> n keys... args...`: the cluster
/// client routes both by the first key.
fn command(verb: &str, script: &str, inv: &Invocation) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(inv.keys.len()).arg(&inv.keys);
    for a in &inv.args {
        cmd.arg(*a);
    }
    cmd
}
