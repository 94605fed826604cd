//! What capdex says about itself: the top-level `log` and `log_format` keys and
//! the `[metrics]` section (the Prometheus listener).

use super::error::{InvalidKind, InvalidSetting};
use serde::Deserialize;
use std::net::SocketAddr;

/// `[metrics]` as written; documented in `config/capdex.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen_addr: String,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// Reads the top-level `log_format`: `"text"` or `"json"`.
    pub fn from_raw(text: &str) -> Result<LogFormat, InvalidSetting> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(InvalidSetting::new(
                "log_format",
                InvalidKind::UnknownChoice,
                format!("must be \"text\" or \"json\", got {other:?}"),
            )),
        }
    }
}

/// Reads `[metrics] listen_addr`: `host:port`, or empty for no listener.
pub fn metrics_listen_addr(raw: &RawMetrics) -> Result<Option<SocketAddr>, InvalidSetting> {
    match raw.listen_addr.trim() {
        "" => Ok(None),
        text => text.parse().map(Some).map_err(|err| {
            InvalidSetting::new(
                "metrics.listen_addr",
                InvalidKind::Malformed,
                format!("{text:?} is not host:port ({err})"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{defaults, load};

    #[test]
    fn the_defaults_log_text_and_listen_on_loopback() {
        let raw = defaults();
        assert_eq!(LogFormat::from_raw(&raw.log_format).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::from_raw("json").unwrap(), LogFormat::Json);
        assert_eq!(metrics_listen_addr(&raw.metrics).unwrap(), Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(metrics_listen_addr(&RawMetrics { listen_addr: " ".into() }).unwrap(), None, "empty turns it off");
    }

    #[test]
    fn each_invalid_value_names_its_key_and_kind() {
        let err = LogFormat::from_raw("yaml").unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("log_format", InvalidKind::UnknownChoice));
        let err = metrics_listen_addr(&RawMetrics { listen_addr: "localhost".into() }).unwrap_err();
        assert_eq!((err.field.as_str(), err.kind), ("metrics.listen_addr", InvalidKind::Malformed));
    }

    #[test]
    fn the_environment_overrides_the_keys() {
        let settings =
            load(&[("CAPDEX_LOG", "capdex=debug"), ("CAPDEX_LOG_FORMAT", "json"), ("CAPDEX_METRICS_LISTEN_ADDR", "")])
                .unwrap();
        assert_eq!((settings.log.as_str(), settings.log_format), ("capdex=debug", LogFormat::Json));
        assert_eq!(settings.metrics_listen_addr, None);
    }
}
