//! The HTTP embedder: an OpenAI-compatible `POST {endpoint}/v1/embeddings`.
//!
//! A request is `{"model": M, "input": [texts]}` with at most `batch_size`
//! texts (32 by default; longer batches are split); the answer's
//! `data[i].embedding` vectors are put back in the order of their `index`.
//! Every answer is checked: one vector per text, each index exactly once, one
//! dimension for every vector this embedder ever returns, finite numbers.
//! Vectors are L2-normalised, so a dot product stays a cosine.
//!
//! Failures are typed ([`EmbedError`]): a connection failure, a timeout, a 5xx
//! or a 429 is tried again up to `retries` times, after `backoff · 2^n`
//! (capped at [`MAX_BACKOFF`]), then reported as `embedder_unavailable` or
//! `embedder_rejected`; another 4xx is `embedder_rejected` at once; an answer
//! that is not the shape above is `embedder_bad_response` (not retried: the
//! same request gives the same answer). Empty texts are not sent and get the
//! zero vector.
//!
//! The key is read from the environment variable named by `api_key_env`
//! (the configuration never holds the key itself) and sent as a bearer token.
//! The blocking client is made on first use, on the calling thread, so the
//! embedder can be built anywhere (it is used from the Embedder's own thread).

use crate::core::embedder::{normalize, Embed, EmbedError, EmbedErrorCode, DEFAULT_BATCH_SIZE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How to reach the endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpEmbedderConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080` (a trailing `/v1` is accepted).
    pub endpoint: String,
    /// The `model` field of every request.
    pub model: String,
    /// The bearer key, already read from the environment; `None` sends no key.
    pub api_key: Option<String>,
    /// Texts per request (at least 1).
    pub batch_size: usize,
    /// Limit for one request, connection included.
    pub timeout: Duration,
    /// Further attempts after a failed one.
    pub retries: u32,
    /// Wait before the first retry; doubled for each further one.
    pub backoff: Duration,
}

impl HttpEmbedderConfig {
    /// A configuration with the defaults: batches of 32, 10 s timeout, 2 retries, 100 ms backoff.
    pub fn new(endpoint: &str, model: &str) -> HttpEmbedderConfig {
        HttpEmbedderConfig {
            endpoint: endpoint.to_string(),
            model: model.to_string(),
            api_key: None,
            batch_size: DEFAULT_BATCH_SIZE,
            timeout: Duration::from_secs(10),
            retries: 2,
            backoff: Duration::from_millis(100),
        }
    }
}

/// The embedder of the module docs.
pub struct HttpEmbedder {
    config: HttpEmbedderConfig,
    url: String,
    client: OnceLock<Result<reqwest::blocking::Client, String>>,
    /// 0 until the first answer.
    dimensions: AtomicUsize,
}

impl std::fmt::Debug for HttpEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("HttpEmbedder").field("url", &self.url).field("model", &self.config.model).finish()
    }
}

#[derive(serde::Serialize)]
struct Request<'a> {
    model: &'a str,
    input: &'a [String],
}

#[derive(serde::Deserialize)]
struct Response {
    data: Vec<Datum>,
}

#[derive(serde::Deserialize)]
struct Datum {
    index: usize,
    embedding: Vec<f32>,
}

/// What one attempt gave, and whether another attempt may help.
enum Attempt {
    Done(Vec<Vec<f32>>),
    Retry(EmbedError),
    Fail(EmbedError),
}

impl HttpEmbedder {
    /// Checks the configuration; no request is made.
    pub fn new(config: HttpEmbedderConfig) -> Result<HttpEmbedder, EmbedError> {
        let bad = |message: String| Err(EmbedError::new(EmbedErrorCode::Config, message));
        let endpoint = config.endpoint.trim().trim_end_matches('/');
        let endpoint = endpoint.strip_suffix("/v1").unwrap_or(endpoint);
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return bad(format!("embedder.endpoint must start with http:// or https://, got {:?}", config.endpoint));
        }
        if config.model.trim().is_empty() {
            return bad("embedder.model must name the model to ask for".into());
        }
        if config.batch_size == 0 {
            return bad("embedder.batch_size must be at least 1".into());
        }
        if config.timeout.is_zero() {
            return bad("embedder.timeout_ms must be at least 1".into());
        }
        let url = format!("{endpoint}/v1/embeddings");
        Ok(HttpEmbedder { config, url, client: OnceLock::new(), dimensions: AtomicUsize::new(0) })
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn client(&self) -> Result<&reqwest::blocking::Client, EmbedError> {
        self.client
            .get_or_init(|| {
                crate::tls::install_provider();
                reqwest::blocking::Client::builder()
                    .timeout(self.config.timeout)
                    .connect_timeout(self.config.timeout)
                    .build()
                    .map_err(|err| err.to_string())
            })
            .as_ref()
            .map_err(|message| {
                EmbedError::new(EmbedErrorCode::Config, format!("cannot build the HTTP client: {message}"))
            })
    }

    /// One batch of non-empty texts, with retries.
    fn request(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut attempt = 0u32;
        loop {
            match self.attempt(texts)? {
                Attempt::Done(vectors) => return Ok(vectors),
                Attempt::Fail(err) => return Err(err),
                Attempt::Retry(err) if attempt >= self.config.retries => {
                    return Err(EmbedError::new(err.code, format!("{} (after {} attempts)", err.message, attempt + 1)))
                }
                Attempt::Retry(_) => {
                    let wait = self.config.backoff.saturating_mul(1u32 << attempt.min(16)).min(MAX_BACKOFF);
                    std::thread::sleep(wait);
                    attempt += 1;
                }
            }
        }
    }

    fn attempt(&self, texts: &[String]) -> Result<Attempt, EmbedError> {
        let mut request = self.client()?.post(&self.url).json(&Request { model: &self.config.model, input: texts });
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send() {
            Ok(response) => response,
            Err(err) => {
                let what = if err.is_timeout() { "timed out" } else { "could not be reached" };
                return Ok(Attempt::Retry(EmbedError::new(
                    EmbedErrorCode::Unavailable,
                    format!("{} {what}: {}", self.url, error_chain(&err)),
                )));
            }
        };
        let status = response.status();
        if !status.is_success() {
            let body: String = response.text().unwrap_or_default().chars().take(200).collect();
            let err = EmbedError::new(EmbedErrorCode::Rejected, format!("{} answered {status}: {body}", self.url));
            let transient = status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            return Ok(if transient { Attempt::Retry(err) } else { Attempt::Fail(err) });
        }
        let body = match response.bytes() {
            Ok(body) => body,
            Err(err) => {
                return Ok(Attempt::Retry(EmbedError::new(
                    EmbedErrorCode::Unavailable,
                    format!("{} broke off its answer: {}", self.url, error_chain(&err)),
                )))
            }
        };
        Ok(match self.parse(&body, texts.len()) {
            Ok(vectors) => Attempt::Done(vectors),
            Err(err) => Attempt::Fail(err),
        })
    }

    /// Checks an answer for `expected` texts and returns its vectors in input order, normalised.
    fn parse(&self, body: &[u8], expected: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let bad = |message: String| EmbedError::new(EmbedErrorCode::BadResponse, format!("{}: {message}", self.url));
        let response: Response =
            serde_json::from_slice(body).map_err(|err| bad(format!("answer is not an embeddings response ({err})")))?;
        if response.data.len() != expected {
            return Err(bad(format!("{} vectors for {expected} texts", response.data.len())));
        }
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; expected];
        for datum in response.data {
            let slot =
                vectors.get_mut(datum.index).ok_or_else(|| bad(format!("index {} out of range", datum.index)))?;
            if slot.is_some() {
                return Err(bad(format!("index {} given twice", datum.index)));
            }
            *slot = Some(datum.embedding);
        }
        let mut vectors: Vec<Vec<f32>> = vectors.into_iter().map(|v| v.unwrap_or_default()).collect();
        for vector in &mut vectors {
            if vector.is_empty() || vector.iter().any(|x| !x.is_finite()) {
                return Err(bad("an embedding is empty or not finite".into()));
            }
            let known = self.dimensions.load(Ordering::Relaxed);
            if known == 0 {
                self.dimensions.store(vector.len(), Ordering::Relaxed);
            } else if known != vector.len() {
                return Err(bad(format!("an embedding has {} dimensions, earlier ones had {known}", vector.len())));
            }
            normalize(vector);
        }
        Ok(vectors)
    }
}

/// An error with its causes, which say what actually failed (refused, reset, ...).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Embed for HttpEmbedder {
    fn model_id(&self) -> String {
        format!("openai-compatible:{}#{}", self.url, self.config.model)
    }

    fn dimensions(&self) -> usize {
        self.dimensions.load(Ordering::Relaxed)
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let sent: Vec<usize> = (0..texts.len()).filter(|&i| !texts[i].trim().is_empty()).collect();
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for chunk in sent.chunks(self.config.batch_size) {
            let batch: Vec<String> = chunk.iter().map(|&i| texts[i].clone()).collect();
            for (&i, vector) in chunk.iter().zip(self.request(&batch)?) {
                vectors[i] = vector;
            }
        }
        let dimensions = self.dimensions();
        for (i, vector) in vectors.iter_mut().enumerate() {
            if vector.is_empty() && !sent.contains(&i) {
                *vector = vec![0.0; dimensions];
            }
        }
        Ok(vectors)
    }
}

#[cfg(test)]
mod tests {
    //! Against a real HTTP server on 127.0.0.1 (a few lines of std, one thread).
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    /// How the test server answers the n-th request (0-based), given the inputs.
    type Answer = dyn Fn(usize, &[String]) -> (u16, String, Duration) + Send + Sync;

    /// The inputs and the authorization header of every request the server saw.
    type Seen = Arc<Mutex<Vec<(Vec<String>, Option<String>)>>>;

    /// A tiny HTTP/1.1 server; returns its base URL and what it saw.
    fn serve(answer: Arc<Answer>) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                let answer = answer.clone();
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    let (mut length, mut auth) = (0usize, None);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(value) = lower.strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        if lower.starts_with("authorization:") {
                            auth = Some(line["authorization:".len()..].trim().to_string());
                        }
                    }
                    let mut body = vec![0u8; length];
                    reader.read_exact(&mut body).unwrap();
                    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let inputs: Vec<String> = serde_json::from_value(request["input"].clone()).unwrap();
                    log.lock().unwrap().push((inputs.clone(), auth));
                    let (status, body, delay) = answer(n, &inputs);
                    std::thread::sleep(delay);
                    let mut stream = reader.into_inner();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        (url, seen)
    }

    /// A deterministic 3-dimensional vector per text, listed in reverse index order.
    fn vectors_for(inputs: &[String]) -> String {
        let data: Vec<serde_json::Value> = inputs
            .iter()
            .enumerate()
            .rev()
            .map(|(i, text)| serde_json::json!({"index": i, "embedding": [text.len() as f32, 1.0, 0.0]}))
            .collect();
        serde_json::json!({"object": "list", "data": data}).to_string()
    }

    fn ok() -> Arc<Answer> {
        Arc::new(|_, inputs: &[String]| (200, vectors_for(inputs), Duration::ZERO))
    }

    fn embedder(url: &str, tweak: impl FnOnce(&mut HttpEmbedderConfig)) -> HttpEmbedder {
        let mut config = HttpEmbedderConfig::new(url, "test-model");
        config.backoff = Duration::from_millis(1);
        tweak(&mut config);
        HttpEmbedder::new(config).unwrap()
    }

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| "x".repeat(i + 1)).collect()
    }

    #[test]
    fn batches_of_at_most_32_in_input_order() {
        let (url, seen) = serve(ok());
        let embedder = embedder(&url, |c| c.api_key = Some("k-123".into()));
        let vectors = embedder.embed_batch(&texts(70)).unwrap();
        assert_eq!(vectors.len(), 70);
        for (i, vector) in vectors.iter().enumerate() {
            let mut expected = vec![(i + 1) as f32, 1.0, 0.0];
            normalize(&mut expected);
            assert_eq!(vector, &expected, "text {i}");
        }
        let seen = seen.lock().unwrap();
        let sizes: Vec<usize> = seen.iter().map(|(inputs, _)| inputs.len()).collect();
        assert_eq!(sizes, vec![32, 32, 6]);
        assert!(seen.iter().all(|(_, auth)| auth.as_deref() == Some("Bearer k-123")));
        assert_eq!(embedder.dimensions(), 3);
        assert!(embedder.model_id().contains("test-model"));
    }

    #[test]
    fn empty_texts_are_not_sent() {
        let (url, seen) = serve(ok());
        let embedder = embedder(&url, |_| {});
        let vectors = embedder.embed_batch(&["abc".into(), "  ".into(), "de".into()]).unwrap();
        assert_eq!(vectors[1], vec![0.0; 3]);
        assert_eq!(seen.lock().unwrap()[0].0, vec!["abc".to_string(), "de".to_string()]);
        assert!(embedder.embed_batch(&[]).unwrap().is_empty());
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn server_errors_are_retried_then_succeed() {
        let answer: Arc<Answer> = Arc::new(|n, inputs: &[String]| {
            if n < 2 {
                (503, "busy".into(), Duration::ZERO)
            } else {
                (200, vectors_for(inputs), Duration::ZERO)
            }
        });
        let (url, seen) = serve(answer);
        let vectors = embedder(&url, |c| c.retries = 2).embed_batch(&texts(2)).unwrap();
        assert_eq!(vectors.len(), 2);
        assert_eq!(seen.lock().unwrap().len(), 3);
    }

    #[test]
    fn server_errors_past_the_retries_are_rejected() {
        let (url, seen) = serve(Arc::new(|_, _: &[String]| (500, "down".into(), Duration::ZERO)));
        let err = embedder(&url, |c| c.retries = 1).embed_batch(&texts(1)).unwrap_err();
        assert_eq!(err.code, EmbedErrorCode::Rejected, "{err}");
        assert!(err.message.contains("500") && err.message.contains("2 attempts"), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn client_errors_are_not_retried() {
        let (url, seen) = serve(Arc::new(|_, _: &[String]| (401, "{\"error\":\"no key\"}".into(), Duration::ZERO)));
        let err = embedder(&url, |c| c.retries = 3).embed_batch(&texts(1)).unwrap_err();
        assert_eq!(err.code, EmbedErrorCode::Rejected);
        assert!(err.message.contains("401"), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_slow_server_times_out() {
        let (url, seen) = serve(Arc::new(|_, inputs: &[String]| (200, vectors_for(inputs), Duration::from_secs(3))));
        let embedder = embedder(&url, |c| {
            c.timeout = Duration::from_millis(200);
            c.retries = 1;
        });
        let err = embedder.embed_batch(&texts(1)).unwrap_err();
        assert_eq!(err.code, EmbedErrorCode::Unavailable, "{err}");
        assert!(err.message.contains("timed out"), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[test]
    fn malformed_answers_are_bad_responses() {
        let cases: Vec<(&str, Arc<Answer>, &str)> = vec![
            ("bad json", Arc::new(|_, _: &[String]| (200, "{\"data\": [".into(), Duration::ZERO)), "not an embeddings"),
            (
                "wrong count",
                Arc::new(|_, inputs: &[String]| (200, vectors_for(&inputs[1..]), Duration::ZERO)),
                "1 vectors for 2 texts",
            ),
            (
                "index twice",
                Arc::new(|_, _: &[String]| {
                    let body = r#"{"data":[{"index":0,"embedding":[1,0]},{"index":0,"embedding":[0,1]}]}"#;
                    (200, body.into(), Duration::ZERO)
                }),
                "given twice",
            ),
            (
                "ragged",
                Arc::new(|_, _: &[String]| {
                    let body = r#"{"data":[{"index":0,"embedding":[1,0]},{"index":1,"embedding":[0,1,2]}]}"#;
                    (200, body.into(), Duration::ZERO)
                }),
                "dimensions",
            ),
        ];
        for (name, answer, needle) in cases {
            let (url, seen) = serve(answer);
            let err = embedder(&url, |c| c.retries = 3).embed_batch(&texts(2)).unwrap_err();
            assert_eq!(err.code, EmbedErrorCode::BadResponse, "{name}: {err}");
            assert!(err.message.contains(needle), "{name}: {err}");
            assert_eq!(seen.lock().unwrap().len(), 1, "{name}: a bad answer is not asked again");
        }
    }

    #[test]
    fn a_closed_port_is_unavailable() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let embedder = embedder(&format!("http://127.0.0.1:{port}/v1/"), |c| c.retries = 1);
        assert_eq!(embedder.url(), format!("http://127.0.0.1:{port}/v1/embeddings"));
        let err = embedder.embed_batch(&texts(1)).unwrap_err();
        assert_eq!(err.code, EmbedErrorCode::Unavailable, "{err}");
        assert_eq!(embedder.dimensions(), 0);
    }

    #[test]
    fn bad_configuration_is_refused_up_front() {
        for (endpoint, model, batch) in [("ftp://x", "m", 32), ("http://x", " ", 32), ("http://x", "m", 0)] {
            let mut config = HttpEmbedderConfig::new(endpoint, model);
            config.batch_size = batch;
            assert_eq!(HttpEmbedder::new(config).unwrap_err().code, EmbedErrorCode::Config, "{endpoint} {model}");
        }
        let debug = format!("{:?}", embedder("http://127.0.0.1:1", |c| c.api_key = Some("secret".into())));
        assert!(!debug.contains("secret"));
    }
}
