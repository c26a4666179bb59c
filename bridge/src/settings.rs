//! Settings, from flags or `WEIR_BRIDGE_*` environment variables (flags win).

use crate::app::Secret;
use crate::connection::{NodeAccess, RedisClient, Sentinels};
use clap::{Parser, ValueEnum};
use redis::cluster::ClusterClientBuilder;
use redis::{ClientTlsConfig, TlsCertificates, TlsMode};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;
use weir_protocol::bounds::BRIDGE_REDIS_TIMEOUT_MS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How Redis is deployed: what `--redis-nodes` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisMode {
    /// A Redis Cluster: the nodes are seeds, the rest is discovered.
    Cluster,
    /// One `redis-server` (no cluster mode): exactly one node.
    Standalone,
    /// A master found through Redis Sentinel: the nodes are the sentinels.
    Sentinel,
}

/// weir-bridge: global rate-limit quotas on Redis for the weir Envoy filter.
#[derive(Debug, Clone, Parser)]
#[command(name = "weir-bridge", version, about)]
pub struct Settings {
    /// Address to serve HTTP on.
    #[arg(long, env = "WEIR_BRIDGE_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,

    /// Redis nodes, comma-separated: `host:port` or `redis[s]://host:port`. Cluster: seed
    /// nodes, the rest of the cluster is discovered from them. Standalone: the one server.
    /// Sentinel: the sentinels (a `user:password@` in their URLs is the sentinels' own
    /// AUTH).
    #[arg(
        long,
        env = "WEIR_BRIDGE_REDIS_NODES",
        value_delimiter = ',',
        required = true
    )]
    pub redis_nodes: Vec<String>,

    /// How Redis is deployed: `cluster`, `standalone` (one server) or `sentinel`.
    #[arg(
        long,
        env = "WEIR_BRIDGE_REDIS_MODE",
        value_enum,
        default_value = "cluster"
    )]
    pub redis_mode: RedisMode,

    /// The master name the sentinels monitor (`sentinel monitor <name> ...`); sentinel
    /// mode only.
    #[arg(long, env = "WEIR_BRIDGE_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    /// Redis ACL user name (AUTH username password).
    #[arg(long, env = "WEIR_BRIDGE_REDIS_USERNAME")]
    pub redis_username: Option<String>,

    /// Redis password. Prefer the environment variable to the flag (visible in `ps`).
    #[arg(long, env = "WEIR_BRIDGE_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,

    /// Connect to Redis over TLS (rustls; server certificate and host name verified).
    #[arg(long, env = "WEIR_BRIDGE_REDIS_TLS")]
    pub redis_tls: bool,

    /// PEM file of the CA(s) that sign the Redis certificates, instead of the system's
    /// trust store. Implies --redis-tls.
    #[arg(long, env = "WEIR_BRIDGE_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --redis-client-key).
    #[arg(
        long,
        env = "WEIR_BRIDGE_REDIS_CLIENT_CERT",
        requires = "redis_client_key"
    )]
    pub redis_client_cert: Option<PathBuf>,

    /// PEM private key for mutual TLS (with --redis-client-cert).
    #[arg(
        long,
        env = "WEIR_BRIDGE_REDIS_CLIENT_KEY",
        requires = "redis_client_cert"
    )]
    pub redis_client_key: Option<PathBuf>,

    /// Longest wait for one Redis call, retries and redirects included; past it the
    /// request fails with 503. Keep it at least 10ms below the filter's `bridge.timeout`
    /// (default 50ms), or the filter gives up on calls that Redis still answers and the
    /// units granted are lost.
    #[arg(long, env = "WEIR_BRIDGE_REDIS_TIMEOUT", default_value = default_redis_timeout(), value_parser = duration)]
    pub redis_timeout: Duration,

    /// Longest wait to open a connection to one Redis node.
    #[arg(long, env = "WEIR_BRIDGE_REDIS_CONNECT_TIMEOUT", default_value = "1s", value_parser = duration)]
    pub redis_connect_timeout: Duration,

    /// Shared secret every /v1/acquire must carry in `x-weir-secret`.
    #[arg(
        long,
        env = "WEIR_BRIDGE_SECRET",
        hide_env_values = true,
        conflicts_with = "secret_file"
    )]
    pub secret: Option<String>,

    /// File holding the shared secret (one line; surrounding whitespace ignored).
    #[arg(long, env = "WEIR_BRIDGE_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,

    /// A second secret accepted as well as the first, while the filters move to it (a
    /// rotation: docs/operations.md). Needs --secret or --secret-file.
    #[arg(
        long,
        env = "WEIR_BRIDGE_SECRET_NEXT",
        hide_env_values = true,
        conflicts_with = "secret_next_file"
    )]
    pub secret_next: Option<String>,

    /// File holding the next secret, as --secret-file holds the first.
    #[arg(long, env = "WEIR_BRIDGE_SECRET_NEXT_FILE")]
    pub secret_next_file: Option<PathBuf>,

    /// After SIGTERM/SIGINT, how long `/healthz` answers 503 `draining` while every other
    /// path is served as before, so that load balancers (an Envoy cluster's active health
    /// check, a Kubernetes readiness probe and endpoint removal) stop sending calls here
    /// before the listener closes. Make it longer than their time to notice (the shipped
    /// Envoy health check: 2 failed checks 1 s apart). 0s closes the listener at once. A
    /// second signal ends the delay early.
    #[arg(long, env = "WEIR_BRIDGE_DRAIN_DELAY", default_value = "5s", value_parser = duration_or_zero)]
    pub drain_delay: Duration,

    /// After the drain delay, how long in-flight requests may take before the process
    /// exits anyway.
    #[arg(long, env = "WEIR_BRIDGE_SHUTDOWN_GRACE", default_value = "10s", value_parser = duration)]
    pub shutdown_grace: Duration,

    /// Log format.
    #[arg(
        long,
        env = "WEIR_BRIDGE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Log filter (tracing-subscriber `EnvFilter` syntax).
    #[arg(long, env = "WEIR_BRIDGE_LOG", default_value = "info")]
    pub log: String,
}

/// `--redis-timeout`'s default, [`BRIDGE_REDIS_TIMEOUT_MS`] in the flags' syntax: the
/// number the config checker adds the call's margin to.
fn default_redis_timeout() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| format!("{BRIDGE_REDIS_TIMEOUT_MS}ms"))
}

/// One secret, from its flag `name` (or its variable) or from the file of `name-file`.
fn read_secret(
    name: &str,
    value: &Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, String> {
    let secret = match (value, file) {
        (Some(s), _) => s.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("{name}-file {}: {e}", path.display()))?
            .trim()
            .to_string(),
        (None, None) => return Ok(None),
    };
    if secret.is_empty() {
        return Err(format!("the shared secret is empty ({name})"));
    }
    Ok(Some(secret))
}

/// "100ms", "2s": the config's duration syntax.
fn duration(text: &str) -> Result<Duration, String> {
    weir_protocol::duration::parse_duration(text).map(Duration::from_micros)
}

/// A duration that may also be zero ("0s", "0ms"): off.
fn duration_or_zero(text: &str) -> Result<Duration, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    if !digits.is_empty()
        && digits.bytes().all(|b| b == b'0')
        && duration(&format!("1{unit}")).is_ok()
    {
        return Ok(Duration::ZERO);
    }
    duration(text)
}

impl Settings {
    fn tls(&self) -> bool {
        self.redis_tls || self.redis_ca_file.is_some() || self.redis_client_cert.is_some()
    }

    /// The seed URLs: a bare `host:port` gets `redis://` (or `rediss://` with TLS).
    pub fn seed_urls(&self) -> Result<Vec<String>, String> {
        let tls = self.tls();
        let urls: Vec<String> = self
            .redis_nodes
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .map(|n| {
                if let Some(rest) = n.strip_prefix("redis://").filter(|_| tls) {
                    format!("rediss://{rest}")
                } else if n.contains("://") {
                    n.to_string()
                } else if tls {
                    format!("rediss://{n}")
                } else {
                    format!("redis://{n}")
                }
            })
            .collect();
        if urls.is_empty() {
            return Err("--redis-nodes: at least one seed node is required".into());
        }
        Ok(urls)
    }

    /// The seeds as they may be logged: any `user:password@` in a URL is dropped.
    pub fn seeds_for_log(&self) -> Vec<String> {
        self.seed_urls()
            .unwrap_or_default()
            .into_iter()
            .map(|url| match (url.split_once("://"), url.rsplit_once('@')) {
                (Some((scheme, _)), Some((_, host))) => format!("{scheme}://{host}"),
                _ => url,
            })
            .collect()
    }

    /// The shared secret, and the next one during a rotation, from the flags, the
    /// environment or the files.
    pub fn load_secret(&self) -> Result<Option<Secret>, String> {
        let current = read_secret("--secret", &self.secret, &self.secret_file)?;
        let next = read_secret("--secret-next", &self.secret_next, &self.secret_next_file)?;
        match (current, next) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(
                "--secret-next needs --secret or --secret-file: the secret in use, which \
                 stays accepted until the rotation ends"
                    .into(),
            ),
            (Some(current), None) => Ok(Some(Secret::new(&current))),
            (Some(current), Some(next)) => Ok(Some(Secret::new(&current).with_next(&next))),
        }
    }

    /// The client of `--redis-mode`: timeouts, credentials and TLS. Nothing connects yet.
    pub fn redis_client(&self) -> Result<RedisClient, String> {
        let urls = self.seed_urls()?;
        let certs = self.certificates()?;
        let master = self.redis_sentinel_master.as_deref().map(str::trim);
        match (self.redis_mode, master) {
            (RedisMode::Sentinel, None | Some("")) => {
                return Err(
                    "--redis-mode sentinel needs --redis-sentinel-master: the name \
                            the sentinels monitor the master under"
                        .into(),
                )
            }
            (RedisMode::Cluster | RedisMode::Standalone, Some(name)) => {
                return Err(format!(
                    "--redis-sentinel-master {name}: only used with --redis-mode sentinel \
                     (the mode is {})",
                    self.mode_name()
                ))
            }
            _ => {}
        }
        match self.redis_mode {
            RedisMode::Cluster => self.cluster_client(urls, certs),
            RedisMode::Standalone => self.standalone_client(urls, certs),
            RedisMode::Sentinel => self.sentinel_client(urls, master.unwrap_or_default(), certs),
        }
    }

    fn mode_name(&self) -> String {
        self.redis_mode
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The CA and client certificate, when TLS is on and either is given.
    fn certificates(&self) -> Result<Option<TlsCertificates>, String> {
        if !self.tls() {
            return Ok(None);
        }
        let read =
            |p: &PathBuf| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let client_tls = match (&self.redis_client_cert, &self.redis_client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            _ => None,
        };
        let root_cert = self.redis_ca_file.as_ref().map(read).transpose()?;
        Ok(
            (client_tls.is_some() || root_cert.is_some()).then_some(TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }

    fn cluster_client(
        &self,
        urls: Vec<String>,
        certs: Option<TlsCertificates>,
    ) -> Result<RedisClient, String> {
        let mut builder = ClusterClientBuilder::new(urls)
            .connection_timeout(self.redis_connect_timeout)
            .response_timeout(self.redis_timeout)
            // Retries (MOVED, TRYAGAIN, reconnects) run inside the same bound.
            .overall_response_timeout(Some(self.redis_timeout))
            .min_retry_wait(5)
            .max_retry_wait(50);
        if let Some(user) = &self.redis_username {
            builder = builder.username(user);
        }
        if let Some(password) = &self.redis_password {
            builder = builder.password(password);
        }
        if self.tls() {
            builder = builder.tls(TlsMode::Secure);
        }
        if let Some(certs) = certs {
            builder = builder.certs(certs);
        }
        let client = builder.build().map_err(client_error)?;
        Ok(RedisClient::Cluster(Box::new(client)))
    }

    /// The flags' TLS and credentials, for a standalone server or the master.
    fn node_access(&self, certs: Option<TlsCertificates>) -> NodeAccess {
        NodeAccess {
            tls: self.tls(),
            certs,
            username: self.redis_username.clone(),
            password: self.redis_password.clone(),
        }
    }

    fn standalone_client(
        &self,
        urls: Vec<String>,
        certs: Option<TlsCertificates>,
    ) -> Result<RedisClient, String> {
        let [url] = urls.as_slice() else {
            return Err(format!(
                "--redis-nodes {}: --redis-mode standalone takes exactly one server, got {}",
                self.redis_nodes.join(","),
                urls.len()
            ));
        };
        let client = self.node_access(certs).client(url).map_err(client_error)?;
        Ok(RedisClient::Standalone(Box::new(client)))
    }

    /// Sentinel: the flags' credentials go to the master, the TLS settings to the master
    /// and the sentinels; a sentinel's own AUTH is the `user:password@` of its URL.
    fn sentinel_client(
        &self,
        urls: Vec<String>,
        master: &str,
        certs: Option<TlsCertificates>,
    ) -> Result<RedisClient, String> {
        let access = self.node_access(certs);
        let to_sentinels = NodeAccess {
            username: None,
            password: None,
            ..access.clone()
        };
        let sentinels = urls
            .iter()
            .map(|url| to_sentinels.client(url))
            .collect::<Result<_, _>>()
            .map_err(client_error)?;
        Ok(RedisClient::Sentinel(Arc::new(Sentinels {
            name: master.to_string(),
            sentinels,
            master: access,
        })))
    }
}

fn client_error(err: redis::RedisError) -> String {
    format!("Redis client settings: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_protocol::bounds::MIN_BRIDGE_TIMEOUT_MS;

    fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
        Settings::try_parse_from(std::iter::once("weir-bridge").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_and_seed_urls() {
        let s = parse(&["--redis-nodes", "127.0.0.1:7000, redis://127.0.0.1:7001"]).unwrap();
        assert_eq!(s.listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(
            s.redis_timeout,
            Duration::from_millis(BRIDGE_REDIS_TIMEOUT_MS)
        );
        assert_eq!(s.redis_timeout, Duration::from_millis(40));
        // Within the filter's default timeout, with the call's margin.
        assert!(s.redis_timeout < Duration::from_millis(MIN_BRIDGE_TIMEOUT_MS));
        assert_eq!(s.drain_delay, Duration::from_secs(5));
        let no_drain = parse(&["--redis-nodes", "a:1", "--drain-delay", "0s"]).unwrap();
        assert_eq!(no_drain.drain_delay, Duration::ZERO);
        let short = parse(&["--redis-nodes", "a:1", "--drain-delay", "1500ms"]).unwrap();
        assert_eq!(short.drain_delay, Duration::from_millis(1500));
        for bad in ["0", "0x", "", "-1s"] {
            assert!(
                parse(&["--redis-nodes", "a:1", "--drain-delay", bad]).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            s.seed_urls().unwrap(),
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        assert!(s.load_secret().unwrap().is_none());
        assert!(s.redis_client().is_ok());

        let tls = parse(&["--redis-nodes", "a:1,redis://b:2", "--redis-tls"]).unwrap();
        assert_eq!(tls.seed_urls().unwrap(), ["rediss://a:1", "rediss://b:2"]);

        let secret = parse(&["--redis-nodes", "redis://u:p@w@a:1,b:2"]).unwrap();
        assert_eq!(secret.seeds_for_log(), ["redis://a:1", "redis://b:2"]);
    }

    #[test]
    fn redis_modes_and_their_errors() {
        let cluster = parse(&["--redis-nodes", "a:1,b:2"]).unwrap();
        assert_eq!(cluster.redis_mode, RedisMode::Cluster, "the default");
        assert!(matches!(
            cluster.redis_client(),
            Ok(RedisClient::Cluster(_))
        ));
        let one = parse(&["--redis-mode", "standalone", "--redis-nodes", "a:1"]).unwrap();
        assert!(matches!(one.redis_client(), Ok(RedisClient::Standalone(_))));
        let sentinel = parse(&[
            "--redis-mode",
            "sentinel",
            "--redis-nodes",
            "a:26379,redis://:pw@b:26379",
            "--redis-sentinel-master",
            "mymaster",
        ])
        .unwrap();
        assert!(matches!(
            sentinel.redis_client(),
            Ok(RedisClient::Sentinel(_))
        ));

        let error = |args: &[&str]| parse(args).unwrap().redis_client().err();
        assert_eq!(
            error(&["--redis-mode", "standalone", "--redis-nodes", "a:1,b:2"]).as_deref(),
            Some("--redis-nodes a:1,b:2: --redis-mode standalone takes exactly one server, got 2")
        );
        assert_eq!(
            error(&["--redis-mode", "sentinel", "--redis-nodes", "a:26379"]).as_deref(),
            Some(
                "--redis-mode sentinel needs --redis-sentinel-master: the name the sentinels \
                 monitor the master under"
            )
        );
        assert_eq!(
            error(&[
                "--redis-nodes",
                "a:1",
                "--redis-sentinel-master",
                "mymaster"
            ])
            .as_deref(),
            Some(
                "--redis-sentinel-master mymaster: only used with --redis-mode sentinel (the \
                 mode is cluster)"
            )
        );
        assert!(parse(&["--redis-mode", "replicated", "--redis-nodes", "a:1"]).is_err());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(parse(&[]).is_err(), "seed nodes are required");
        assert!(parse(&["--redis-nodes", "a:1", "--redis-timeout", "1.5s"]).is_err());
        assert!(parse(&[
            "--redis-nodes",
            "a:1",
            "--secret",
            "x",
            "--secret-file",
            "f"
        ])
        .is_err());
        let empty = parse(&["--redis-nodes", "a:1", "--secret", ""]).unwrap();
        assert!(empty.load_secret().is_err());
        let missing_ca = parse(&["--redis-nodes", "a:1", "--redis-ca-file", "/nonexistent"]);
        assert!(missing_ca.unwrap().redis_client().is_err());
    }

    #[test]
    fn a_next_secret_is_accepted_beside_the_current_one() {
        let dir = std::env::temp_dir().join(format!("weir-bridge-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let next_file = dir.join("next");
        std::fs::write(&next_file, "  new-secret\n").unwrap();
        let next_file = next_file.to_str().unwrap();

        let one = parse(&["--redis-nodes", "a:1", "--secret", "old-secret"]).unwrap();
        let one = one.load_secret().unwrap().unwrap();
        assert!(one.accepts(b"old-secret") && !one.accepts(b"new-secret"));

        for next in [
            &["--secret-next", "new-secret"][..],
            &["--secret-next-file", next_file][..],
        ] {
            let mut args = vec!["--redis-nodes", "a:1", "--secret", "old-secret"];
            args.extend_from_slice(next);
            let both = parse(&args).unwrap().load_secret().unwrap().unwrap();
            assert!(both.accepts(b"old-secret"), "{next:?}");
            assert!(both.accepts(b"new-secret"), "{next:?}");
            for wrong in [&b""[..], b"old", b"new-secret\n", b"old-secretnew-secret"] {
                assert!(!both.accepts(wrong), "{next:?}: {wrong:?}");
            }
        }

        let alone = parse(&["--redis-nodes", "a:1", "--secret-next", "new-secret"]).unwrap();
        assert_eq!(
            alone.load_secret().err().as_deref(),
            Some(
                "--secret-next needs --secret or --secret-file: the secret in use, which \
                 stays accepted until the rotation ends"
            )
        );
        let missing = parse(&[
            "--redis-nodes",
            "a:1",
            "--secret",
            "x",
            "--secret-next-file",
            "/nonexistent/next",
        ]);
        let error = missing.unwrap().load_secret().err().unwrap();
        assert!(
            error.starts_with("--secret-next-file /nonexistent/next: "),
            "{error}"
        );
        let empty = parse(&["--redis-nodes", "a:1", "--secret", "x", "--secret-next", ""]);
        assert_eq!(
            empty.unwrap().load_secret().err().as_deref(),
            Some("the shared secret is empty (--secret-next)")
        );
        assert!(parse(&[
            "--redis-nodes",
            "a:1",
            "--secret-next",
            "x",
            "--secret-next-file",
            "f"
        ])
        .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
