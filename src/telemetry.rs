//! Logs (tracing) and metrics (Prometheus exporter) setup.
//!
//! Metric names follow `capdex_<name>_<unit>[_total]` with low-cardinality labels; the list of
//! every emitted metric, with its labels and the file that emits it, is in ARCHITECTURE.md
//! (Telemetry), and `tests/tidy` fails when an emitted name is missing there.

use crate::config::LogFormat;
use std::net::SocketAddr;
use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber, writing to stderr. `RUST_LOG`, when
/// set, wins over the configured filter. Safe to call more than once.
pub fn init_logging(filter: &str, format: LogFormat) {
    let env_filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt().with_env_filter(env_filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Starts the Prometheus `/metrics` listener on `addr`. Needs a running tokio runtime.
pub fn init_metrics(addr: SocketAddr) -> Result<(), String> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|err| format!("failed to start the metrics listener on {addr}: {err}"))
}
