//! The connection behind the store, one kind per Redis deployment.
//!
//! - **cluster**: the crate's `ClusterConnection` (slot map, MOVED/ASK, one multiplexed
//!   connection per node, its own reconnection).
//! - **standalone** and **sentinel**: one multiplexed connection to *the master*, found
//!   either at the one address given or by asking the sentinels, and found again after it
//!   is lost ([`MasterConnection`]).
//!
//! Everything above this module (EVALSHA with NOSCRIPT fallback, the timeout, the error
//! classes) is the same for every kind: the store sends a `Cmd` and gets a `Value`.
//!
//! **Losing the master.** A connection is dropped, and the master looked up again by the
//! next call, when a call on it fails the way a lost master fails: the socket closes or
//! errs (a restart, a SIGKILL), `READONLY` or `MASTERDOWN` (a failover demoted the node
//! we talk to), or the call is abandoned before an answer (the store's timeout: a frozen
//! or partitioned master looks exactly like that). The last one has a cost: a master
//! merely slower than `--redis-timeout` is reconnected to as well (one connection setup).
//! Sentinel also moves the master while the old one still answers (`SENTINEL FAILOVER`, or
//! a master cut off from the sentinels but not from the bridge): the old master keeps
//! taking writes until the sentinels reconfigure it, measured at 10 s after the switch
//! here, and writes it takes then are lost. So in sentinel mode the bridge also asks the
//! sentinels for the master every [`SENTINEL_CHECK`] and drops a connection to any other
//! node: a switch is followed within that period even when nothing fails.
//!
//! Only one lookup runs at a time; calls that arrive during it wait for it, bounded by
//! their own timeout, and it is not cancelled when they give up, so a lookup slower than
//! `--redis-timeout` (TLS across a WAN) still completes for the calls after.

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind,
    TlsCertificates, Value,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// How often, in sentinel mode, the sentinels are asked which node is the master.
pub const SENTINEL_CHECK: Duration = Duration::from_secs(1);

/// What the bridge connects with, before connecting.
#[derive(Clone)]
pub enum RedisClient {
    Cluster(Box<redis::cluster::ClusterClient>),
    /// One `redis-server`, at one address.
    Standalone(Box<Client>),
    /// The master the sentinels name.
    Sentinel(Arc<Sentinels>),
}

impl From<&redis::cluster::ClusterClient> for RedisClient {
    fn from(client: &redis::cluster::ClusterClient) -> Self {
        RedisClient::Cluster(Box::new(client.clone()))
    }
}

impl RedisClient {
    /// The connection, still to be made: nothing is sent until the first call, so the
    /// bridge starts (and answers 503) while Redis is down.
    pub fn connect(&self, timeout: Duration, connect_timeout: Duration) -> RedisConnection {
        match self {
            RedisClient::Cluster(client) => {
                // A connection config replaces the client's timeouts: repeat them.
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(timeout);
                RedisConnection::Cluster(client.get_pending_async_connection_with_config(config))
            }
            RedisClient::Standalone(client) => {
                MasterConnection::new(Finder::Fixed(client.clone()), timeout, connect_timeout)
                    .into()
            }
            RedisClient::Sentinel(client) => {
                MasterConnection::new(Finder::Sentinel(client.clone()), timeout, connect_timeout)
                    .into()
            }
        }
    }
}

/// A connection to Redis, whatever its deployment. Cheap to clone.
#[derive(Clone)]
pub enum RedisConnection {
    Cluster(ClusterConnection),
    Master(MasterConnection),
}

impl From<ClusterConnection> for RedisConnection {
    fn from(conn: ClusterConnection) -> Self {
        RedisConnection::Cluster(conn)
    }
}

impl From<MasterConnection> for RedisConnection {
    fn from(conn: MasterConnection) -> Self {
        RedisConnection::Master(conn)
    }
}

impl RedisConnection {
    /// Sends one command (the cluster client routes it by its first key) and returns the
    /// raw reply.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            RedisConnection::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
            RedisConnection::Master(conn) => conn.query(cmd).await,
        }
    }

    /// `PING` to the master (standalone, sentinel) or to any one node the cluster client
    /// is connected to (cluster: see [`crate::store::RedisStore::ping`] for why not every
    /// master).
    pub async fn ping(&self) -> Result<(), RedisError> {
        match self {
            RedisConnection::Cluster(conn) => {
                let any_node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                conn.clone()
                    .route_command(redis::cmd("PING"), any_node)
                    .await
                    .map(drop)
            }
            RedisConnection::Master(conn) => conn.query(&redis::cmd("PING")).await.map(drop),
        }
    }
}

/// How to reach a Redis node: TLS, its certificates, and the AUTH credentials that
/// replace a URL's own.
#[derive(Clone, Default)]
pub struct NodeAccess {
    pub tls: bool,
    pub certs: Option<TlsCertificates>,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl NodeAccess {
    /// A client for `url` (`redis://` or `rediss://host:port`). Nothing connects yet.
    pub fn client(&self, url: &str) -> Result<Client, RedisError> {
        let mut info = url.into_connection_info()?;
        let mut redis = info.redis_settings().clone();
        if let Some(user) = &self.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
        match &self.certs {
            Some(certs) => Client::build_with_tls(info, certs.clone()),
            None => Client::open(info),
        }
    }

    fn client_at(&self, host: &str, port: u16) -> Result<Client, RedisError> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        self.client(&format!("{scheme}://{host}:{port}"))
    }
}

/// The sentinels and the name they monitor the master under.
pub struct Sentinels {
    pub name: String,
    /// Each with its own URL's credentials: a sentinel's `requirepass` is its own.
    pub sentinels: Vec<Client>,
    /// How to reach the master they name.
    pub master: NodeAccess,
}

impl Sentinels {
    /// `host:port` of the master, from the first sentinel to answer (all are asked at
    /// once: one that is down costs nothing). `SENTINEL GET-MASTER-ADDR-BY-NAME` names
    /// the promoted replica as soon as a failover promotes it; `SENTINEL MASTERS` (what
    /// the redis crate's `SentinelClient` reads) keeps the old master until the whole
    /// failover ends, its other replicas reconfigured.
    async fn master_address(&self, config: &AsyncConnectionConfig) -> Result<String, RedisError> {
        let mut asks = tokio::task::JoinSet::new();
        for sentinel in &self.sentinels {
            let (sentinel, name, config) = (sentinel.clone(), self.name.clone(), config.clone());
            asks.spawn(async move {
                let mut conn = sentinel
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
            });
        }
        let mut last = None;
        while let Some(answer) = asks.join_next().await {
            match answer {
                Ok(Ok(Some((host, port)))) => return Ok(format!("{host}:{port}")),
                Ok(Ok(None)) => {
                    last = Some(not_found(&format!(
                        "no sentinel monitors a master named {}",
                        self.name
                    )))
                }
                Ok(Err(err)) => last = Some(err),
                Err(_) => last = Some(lookup_abandoned()),
            }
        }
        Err(last.unwrap_or_else(lookup_abandoned))
    }

    async fn master(&self, config: &AsyncConnectionConfig) -> Result<Client, RedisError> {
        let address = self.master_address(config).await?;
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse().ok()?)))
            .ok_or_else(|| not_found("a sentinel named no host:port"))?;
        self.master.client_at(host, port)
    }
}

/// Where the master is.
enum Finder {
    Fixed(Box<Client>),
    Sentinel(Arc<Sentinels>),
}

impl Finder {
    async fn client(&self, config: &AsyncConnectionConfig) -> Result<Client, RedisError> {
        match self {
            Finder::Fixed(client) => Ok(Client::clone(client)),
            Finder::Sentinel(sentinels) => sentinels.master(config).await,
        }
    }
}

/// `host:port` of a client's server.
fn address(client: &Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// The outcome of one lookup, shared with every call that waited for it.
type Lookup = watch::Receiver<Option<Result<(), RedisError>>>;

enum State {
    /// No connection, no lookup running: the next call starts one.
    Idle,
    Looking(Lookup),
    /// `generation` tells a stale failure (on a connection already replaced) from a
    /// current one.
    Ready {
        conn: MultiplexedConnection,
        generation: u64,
        /// `host:port` of the master it goes to.
        address: String,
    },
}

/// One multiplexed connection to the master, looked up again when lost.
#[derive(Clone)]
pub struct MasterConnection(Arc<Inner>);

struct Inner {
    finder: Finder,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    state: Mutex<(State, u64)>,
    /// Whether the sentinel watch ([`watch_sentinels`]) runs.
    watching: AtomicBool,
}

impl MasterConnection {
    fn new(finder: Finder, timeout: Duration, connect_timeout: Duration) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout));
        MasterConnection(Arc::new(Inner {
            finder,
            config,
            connect_timeout,
            state: Mutex::new((State::Idle, 0)),
            watching: AtomicBool::new(false),
        }))
    }

    async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let (mut conn, generation) = self.connection().await?;
        // Dropped unfinished (the caller's timeout) or disarmed on a failure that does
        // not mean the master is gone.
        let mut guard = ForgetOnDrop {
            inner: &self.0,
            generation,
            armed: true,
        };
        let result = cmd.query_async::<Value>(&mut conn).await;
        guard.armed = matches!(&result, Err(err) if master_lost(err));
        result
    }

    /// The current connection, after a lookup if there is none.
    async fn connection(&self) -> Result<(MultiplexedConnection, u64), RedisError> {
        loop {
            let mut lookup = {
                let mut state = lock(&self.0.state);
                match &state.0 {
                    State::Ready {
                        conn, generation, ..
                    } => return Ok((conn.clone(), *generation)),
                    State::Looking(lookup) => lookup.clone(),
                    State::Idle => {
                        let (tx, rx) = watch::channel(None);
                        state.0 = State::Looking(rx.clone());
                        tokio::spawn(look_up(self.0.clone(), tx));
                        rx
                    }
                }
            };
            let waited = lookup
                .wait_for(Option::is_some)
                .await
                .map(|outcome| outcome.clone());
            let outcome = match waited {
                Ok(outcome) => outcome,
                Err(_) => {
                    // The lookup ended without a word (its task was cancelled: the
                    // runtime is stopping): let the next call start another.
                    let mut state = lock(&self.0.state);
                    if matches!(&state.0, State::Looking(l) if l.same_channel(&lookup)) {
                        state.0 = State::Idle;
                    }
                    return Err(lookup_abandoned());
                }
            };
            match outcome {
                Some(Err(err)) => return Err(err),
                // Ready now (or already lost again: look once more).
                _ => continue,
            }
        }
    }
}

/// Finds the master, connects, and publishes the outcome to the calls waiting for it.
async fn look_up(inner: Arc<Inner>, tx: watch::Sender<Option<Result<(), RedisError>>>) {
    if matches!(inner.finder, Finder::Sentinel(_)) && !inner.watching.swap(true, Ordering::AcqRel) {
        tokio::spawn(watch_sentinels(Arc::downgrade(&inner)));
    }
    let connect = async {
        let client = inner.finder.client(&inner.config).await?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&inner.config)
            .await?;
        if let Finder::Sentinel(_) = inner.finder {
            // Named by a sentinel, maybe not promoted yet, or stale: it must say so.
            let role = redis::cmd("ROLE")
                .query_async::<Vec<Value>>(&mut conn)
                .await?;
            if role.first() != Some(&Value::BulkString(b"master".to_vec())) {
                return Err(not_found("the node the sentinels name is not a master"));
            }
        }
        Ok::<_, RedisError>((conn, address(&client)))
    };
    // One bound for the sentinels, the connection and the ROLE check.
    let result = match tokio::time::timeout(inner.connect_timeout, connect).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no master connection within the connect timeout",
        ))),
    };
    let outcome = {
        let mut state = lock(&inner.state);
        match result {
            Ok((conn, address)) => {
                state.1 += 1;
                state.0 = State::Ready {
                    conn,
                    generation: state.1,
                    address,
                };
                Ok(())
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot connect to the Redis master");
                state.0 = State::Idle;
                Err(err)
            }
        }
    };
    let _ = tx.send(Some(outcome));
}

/// Every [`SENTINEL_CHECK`], while the connection is in use: which master the sentinels
/// name; a connection to another node is dropped. A failed check changes nothing: calls
/// on a lost master fail on their own.
async fn watch_sentinels(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(SENTINEL_CHECK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Finder::Sentinel(sentinels) = &inner.finder else {
            return;
        };
        let check = tokio::time::timeout(
            inner.connect_timeout,
            sentinels.master_address(&inner.config),
        )
        .await;
        let Ok(Ok(named)) = check else {
            continue;
        };
        let mut state = lock(&inner.state);
        if let State::Ready { address, .. } = &state.0 {
            if *address != named {
                tracing::info!(
                    old = %address,
                    new = %named,
                    "the sentinels name another master: switching"
                );
                state.0 = State::Idle;
            }
        }
    }
}

/// Drops the connection of `generation` unless disarmed: the next call looks the master
/// up again.
struct ForgetOnDrop<'a> {
    inner: &'a Inner,
    generation: u64,
    armed: bool,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(&self.inner.state);
        if matches!(state.0, State::Ready { generation, .. } if generation == self.generation) {
            tracing::info!("lost the Redis master's connection: looking it up again");
            state.0 = State::Idle;
        }
    }
}

/// Whether `err` says the node we talk to is gone or no longer the master.
fn master_lost(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_unrecoverable_error()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

/// A transient failure to find the master (classified `io`, a 503).
fn not_found(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        what.to_string(),
    ))
}

fn lookup_abandoned() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the master lookup ended without an outcome",
    ))
}

/// The state's lock: its holders never panic, and a poisoned one is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
