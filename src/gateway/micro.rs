//! The NATS micro-service protocol (ADR-32, "Service API" v1): `$SRV.PING`,
//! `$SRV.INFO` and `$SRV.STATS` (each at the `$SRV.<verb>`, `$SRV.<verb>.<name>`
//! and `$SRV.<verb>.<name>.<id>` levels), endpoints as queue subscriptions in
//! the group `q`, and per-endpoint request, error and time statistics.
//!
//! capdex speaks the protocol itself instead of using `async_nats::service`
//! because there an error reply always has an empty body, while capdex's error
//! replies carry `{code, message}` (in the request's codec) as well as the
//! `Nats-Service-Error` headers; and only the service API's own error path
//! counts errors in `$SRV.STATS`. Here the gateway sends each reply and then
//! records it, so `num_errors` and `last_error` are true.

use async_nats::{Client, Subscriber};
use futures::StreamExt;
use serde::Serialize;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The default queue group of service endpoints (ADR-32).
pub const QUEUE_GROUP: &str = "q";

/// The service-discovery subject prefix.
pub const SERVICE_PREFIX: &str = "$SRV";

/// What the service announces.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Letters, digits, `-` and `_` (validated by the config).
    pub name: String,
    /// SemVer.
    pub version: String,
    pub description: String,
}

/// A running micro service: answers the discovery verbs until dropped or stopped.
pub struct MicroService {
    client: Client,
    state: Arc<State>,
    verbs: tokio::task::JoinHandle<()>,
}

/// One endpoint: its queue subscription and the handle that records its replies.
pub struct Endpoint {
    pub subscriber: Subscriber,
    pub stats: EndpointStats,
}

/// Records the replies of one endpoint in `$SRV.STATS`.
#[derive(Clone)]
pub struct EndpointStats {
    index: usize,
    state: Arc<State>,
}

struct State {
    config: ServiceConfig,
    id: String,
    started: String,
    endpoints: Mutex<Vec<EndpointRecord>>,
}

#[derive(Clone, Debug, Default)]
struct EndpointRecord {
    name: String,
    subject: String,
    requests: u64,
    errors: u64,
    processing_time: Duration,
    last_error: String,
}

impl MicroService {
    /// Subscribes to the nine discovery subjects and answers them on a task.
    pub async fn start(client: Client, config: ServiceConfig) -> Result<MicroService, async_nats::SubscribeError> {
        let state = Arc::new(State {
            id: instance_id(),
            started: rfc3339(SystemTime::now()),
            endpoints: Mutex::new(Vec::new()),
            config,
        });
        let mut subscriptions = Vec::new();
        for verb in Verb::ALL {
            for subject in [
                format!("{SERVICE_PREFIX}.{}", verb.token()),
                format!("{SERVICE_PREFIX}.{}.{}", verb.token(), state.config.name),
                format!("{SERVICE_PREFIX}.{}.{}.{}", verb.token(), state.config.name, state.id),
            ] {
                let subscriber = client.subscribe(subject).await?;
                subscriptions.push(subscriber.map(move |message| (verb, message)).boxed());
            }
        }
        let answering_client = client.clone();
        let answering_state = state.clone();
        let verbs = tokio::spawn(async move {
            let mut requests = futures::stream::select_all(subscriptions);
            while let Some((verb, message)) = requests.next().await {
                let Some(reply) = message.reply else { continue };
                let body = answering_state.answer(verb);
                if let Err(err) = answering_client.publish(reply, body.into()).await {
                    tracing::warn!(%err, "failed to answer a service discovery request");
                }
            }
        });
        Ok(MicroService { client, state, verbs })
    }

    /// The instance id, unique per process start.
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// Adds an endpoint named `name` (letters, digits, `-`, `_`) on `subject`,
    /// subscribed in the queue group [`QUEUE_GROUP`].
    pub async fn endpoint(&self, name: &str, subject: &str) -> Result<Endpoint, async_nats::SubscribeError> {
        let subscriber = self.client.queue_subscribe(subject.to_string(), QUEUE_GROUP.to_string()).await?;
        let mut endpoints = self.state.endpoints.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        endpoints.push(EndpointRecord { name: name.to_string(), subject: subject.to_string(), ..Default::default() });
        Ok(Endpoint { subscriber, stats: EndpointStats { index: endpoints.len() - 1, state: self.state.clone() } })
    }

    /// Stops answering the discovery verbs.
    pub fn stop(&self) {
        self.verbs.abort();
    }
}

impl Drop for MicroService {
    fn drop(&mut self) {
        self.verbs.abort();
    }
}

impl EndpointStats {
    /// Counts one answered request that took `elapsed`, and its error (as
    /// shown in `last_error`) if it failed.
    pub fn record(&self, elapsed: Duration, error: Option<String>) {
        let mut endpoints = self.state.endpoints.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let record = &mut endpoints[self.index];
        record.requests += 1;
        record.processing_time += elapsed;
        if let Some(error) = error {
            record.errors += 1;
            record.last_error = error;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Ping,
    Info,
    Stats,
}

impl Verb {
    const ALL: [Verb; 3] = [Verb::Ping, Verb::Info, Verb::Stats];

    fn token(self) -> &'static str {
        match self {
            Verb::Ping => "PING",
            Verb::Info => "INFO",
            Verb::Stats => "STATS",
        }
    }
}

#[derive(Serialize)]
struct Identity<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    id: &'a str,
    version: &'a str,
    metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize)]
struct InfoEndpoint<'a> {
    name: &'a str,
    subject: &'a str,
    queue_group: &'static str,
    metadata: Option<()>,
}

#[derive(Serialize)]
struct StatsEndpoint<'a> {
    name: &'a str,
    subject: &'a str,
    queue_group: &'static str,
    num_requests: u64,
    num_errors: u64,
    last_error: &'a str,
    /// Nanoseconds.
    processing_time: u64,
    /// Nanoseconds.
    average_processing_time: u64,
    data: Option<()>,
}

impl State {
    fn identity(&self, kind: &'static str) -> Identity<'_> {
        Identity {
            kind,
            name: &self.config.name,
            id: &self.id,
            version: &self.config.version,
            metadata: serde_json::Map::new(),
        }
    }

    /// The JSON answer to `verb`.
    fn answer(&self, verb: Verb) -> Vec<u8> {
        let endpoints = self.endpoints.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let value = match verb {
            Verb::Ping => serde_json::to_value(self.identity("io.nats.micro.v1.ping_response")),
            Verb::Info => {
                #[derive(Serialize)]
                struct Info<'a> {
                    #[serde(flatten)]
                    identity: Identity<'a>,
                    description: &'a str,
                    endpoints: Vec<InfoEndpoint<'a>>,
                }
                serde_json::to_value(Info {
                    identity: self.identity("io.nats.micro.v1.info_response"),
                    description: &self.config.description,
                    endpoints: endpoints
                        .iter()
                        .map(|e| InfoEndpoint {
                            name: &e.name,
                            subject: &e.subject,
                            queue_group: QUEUE_GROUP,
                            metadata: None,
                        })
                        .collect(),
                })
            }
            Verb::Stats => {
                #[derive(Serialize)]
                struct Stats<'a> {
                    #[serde(flatten)]
                    identity: Identity<'a>,
                    started: &'a str,
                    endpoints: Vec<StatsEndpoint<'a>>,
                }
                serde_json::to_value(Stats {
                    identity: self.identity("io.nats.micro.v1.stats_response"),
                    started: &self.started,
                    endpoints: endpoints.iter().map(stats_endpoint).collect(),
                })
            }
        };
        value.map(|v| v.to_string().into_bytes()).unwrap_or_default()
    }
}

fn stats_endpoint(record: &EndpointRecord) -> StatsEndpoint<'_> {
    let total = u64::try_from(record.processing_time.as_nanos()).unwrap_or(u64::MAX);
    StatsEndpoint {
        name: &record.name,
        subject: &record.subject,
        queue_group: QUEUE_GROUP,
        num_requests: record.requests,
        num_errors: record.errors,
        last_error: &record.last_error,
        processing_time: total,
        average_processing_time: total.checked_div(record.requests).unwrap_or(0),
        data: None,
    }
}

/// A 22-character id unique to this process start: the time, the process id
/// and the standard library's per-process random hash keys, in base 62.
fn instance_id() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    let high = hasher.finish();
    hasher.write_u64(high);
    let mut value = (u128::from(high) << 64) | u128::from(hasher.finish());
    (0..22)
        .map(|_| {
            let digit = (value % 62) as usize;
            value /= 62;
            ALPHABET[digit] as char
        })
        .collect()
}

/// Formats `time` as RFC 3339 in UTC with nanoseconds (`2026-11-30T10:29:20.123456789Z`).
pub fn rfc3339(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let (days, seconds_of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        seconds_of_day / 3600,
        seconds_of_day / 60 % 60,
        seconds_of_day % 60,
        since_epoch.subsec_nanos()
    )
}

/// Days since 1970-01-01 to a (year, month, day) date, proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(seconds: u64, expected: &str) {
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(seconds)), expected);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        check(0, "1970-01-01T00:00:00.000000000Z");
        check(951_782_400, "2000-02-29T00:00:00.000000000Z");
        check(1_796_034_560, "2026-11-30T10:29:20.000000000Z");
        check(4_107_542_399, "2100-02-28T23:59:59.000000000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::new(1, 5)), "1970-01-01T00:00:01.000000005Z");
    }

    #[test]
    fn instance_ids_are_22_characters_and_differ() {
        let (first, second) = (instance_id(), instance_id());
        assert_eq!(first.len(), 22);
        assert!(first.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(first, second);
    }

    #[test]
    fn stats_average_is_total_over_requests() {
        let record = EndpointRecord {
            requests: 4,
            errors: 1,
            processing_time: Duration::from_nanos(1000),
            ..Default::default()
        };
        let stats = stats_endpoint(&record);
        assert_eq!((stats.processing_time, stats.average_processing_time, stats.num_errors), (1000, 250, 1));
        assert_eq!(stats_endpoint(&EndpointRecord::default()).average_processing_time, 0);
    }
}
