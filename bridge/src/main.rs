//! `weir-bridge`: settings, tracing, the Redis client, serve, then on SIGTERM or SIGINT
//! a drain (readiness fails, requests still served) and a graceful shutdown.

use clap::Parser;
use std::process::ExitCode;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use weir_bridge::settings::Settings;

#[tokio::main]
async fn main() -> ExitCode {
    let settings = Settings::parse();
    weir_bridge::logging::init(settings.log_format, &settings.log);
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), String> {
    // The redis crate's rustls has no crypto provider of its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secret = settings.load_secret()?;
    let client = settings.redis_client()?;
    let secret_next = secret.as_ref().is_some_and(|s| s.has_next());
    let state = weir_bridge::state_from_client(
        client,
        settings.redis_timeout,
        settings.redis_connect_timeout,
        secret,
    );
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        listen = %local,
        redis_mode = ?settings.redis_mode,
        redis_nodes = ?settings.seeds_for_log(),
        secret = state.secret.is_some(),
        secret_next,
        redis_timeout = ?settings.redis_timeout,
        "weir-bridge serving"
    );

    let mut signals = Signals::install();
    let draining = state.draining.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let listener = weir_bridge::app::nodelay_listener(listener);
    let server = axum::serve(listener, weir_bridge::app(state)).with_graceful_shutdown({
        let mut stop_rx = stop_rx.clone();
        async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        }
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    let signal = tokio::select! {
        result = &mut server => return result.map_err(|e| format!("server: {e}")),
        signal = signals.next() => signal,
    };
    // Readiness fails first, while everything is still served: the load balancers stop
    // sending calls here before the listener closes, so none is refused.
    if !settings.drain_delay.is_zero() {
        draining.start();
        tracing::info!(signal, drain_delay = ?settings.drain_delay, "draining: /healthz answers 503, requests are still served");
        tokio::select! {
            result = &mut server => return result.map_err(|e| format!("server: {e}")),
            () = tokio::time::sleep(settings.drain_delay) => {}
            again = signals.next() => tracing::info!(signal = again, "second signal: the drain ends early"),
        }
    }
    tracing::info!(
        signal,
        "shutting down: no new connections, finishing in-flight requests"
    );
    let _ = stop_tx.send(true);
    match tokio::time::timeout(settings.shutdown_grace, server).await {
        Ok(result) => {
            tracing::info!("stopped");
            result.map_err(|e| format!("server: {e}"))
        }
        Err(_) => Err(format!(
            "in-flight requests still running after {:?}; exiting",
            settings.shutdown_grace
        )),
    }
}

/// SIGTERM and SIGINT, listened to from the start: one received during the drain is
/// not lost.
struct Signals(Option<(Signal, Signal)>);

impl Signals {
    fn install() -> Signals {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Signals(Some((term, int))),
            _ => {
                tracing::error!("cannot install signal handlers; stop with SIGKILL");
                Signals(None)
            }
        }
    }

    /// The name of the next of SIGTERM / SIGINT to arrive.
    async fn next(&mut self) -> &'static str {
        let Some((term, int)) = &mut self.0 else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }
}
