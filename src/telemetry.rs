//! Logs (tracing) and metrics (Prometheus exporter) setup.
//!
//! Metric names follow `capdex_<name>_<unit>[_total]` with low-cardinality labels:
//! `capdex_discover_requests_total`, `capdex_discover_duration_seconds`,
//! `capdex_capabilities_indexed`, `capdex_embedder_texts_total`,
//! `capdex_outcomes_total{status}`, `capdex_outcomes_duplicate_total`,
//! `capdex_kpi_alerts_total{severity}` (severity `warning`, `critical`, `recovered`),
//! `capdex_kpi_scopes`, `capdex_kpi_scopes_alerting`, `capdex_kpi_scopes_adaptive_degraded`
//! (gauges: scopes held, scopes in alert, scopes planned adaptively),
//! per scope for the first `kpi.metrics_max_scopes` scopes (label `scope`): `capdex_kpi_samples`,
//! `capdex_kpi_success_rate`, `capdex_kpi_average_score`, `capdex_kpi_weighted_success_rate`,
//! `capdex_kpi_alerting`, `capdex_kpi_adaptive_degraded`;
//! `capdex_outcome_prior_capabilities` (capabilities the prior adjusts),
//! `capdex_outcome_prior_ignored_total` (observations of untracked ids once the table is full),
//! `capdex_plans_total{selection_mode, fallback_reason}`,
//! `capdex_store_flush_duration_seconds`, `capdex_store_flush_callers`, `capdex_store_flush_writes`
//! (group-commit batch sizes), `capdex_store_write_errors_total`,
//! `capdex_dispatch_total{outcome}`, `capdex_request_errors_total{code}`.
//! Scopes are unbounded, so only the first `kpi.metrics_max_scopes` get labelled gauges; every
//! scope's KPI is on `capdex.v1.kpi.<scope>` and `capdex kpi`.

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
