//! `weir-bridge`: settings, tracing, the cluster client, serve, graceful shutdown.

use clap::Parser;
use std::process::ExitCode;
use tokio::net::TcpListener;
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
    let client = settings.cluster_client()?;
    let state = weir_bridge::state_from_client(
        &client,
        settings.redis_timeout,
        settings.redis_connect_timeout,
        secret.as_deref(),
    );
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        listen = %local,
        redis_nodes = ?settings.seeds_for_log(),
        secret = secret.is_some(),
        redis_timeout = ?settings.redis_timeout,
        "weir-bridge serving"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, weir_bridge::app(state)).with_graceful_shutdown({
        let mut stop_rx = stop_rx.clone();
        async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        }
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        result = &mut server => return result.map_err(|e| format!("server: {e}")),
        signal = shutdown_signal() => tracing::info!(signal, "shutting down: no new connections, finishing in-flight requests"),
    }
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

/// The name of the first of SIGTERM / SIGINT to arrive.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
