//! `capdex serve` against real nats-servers configured for each kind of
//! credential (user and password, token, nkey, creds file) and for mutual TLS
//! with certificates generated here (rcgen), plus `config/nats-server.conf`:
//! one allowed and one denied action per role (capdex, runtime, ops).
//!
//! Each server runs from a config file written by the test, on a free port of
//! 127.0.0.1; a secret given to capdex must never appear in its output.

use crate::cli::{capdex, examples_dir};
use crate::serve_over_nats::body;
use crate::support::nats_server::free_port;
use crate::support::serving::{wait_until_serving, KillOnDrop};
use futures::StreamExt;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CAPDEX_NATS_SERVER").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/nats-server");
    assert!(venv.is_file(), "set CAPDEX_NATS_SERVER or run scripts/test.sh (it installs nats-server into .venv)");
    venv
}

/// Starts nats-server with `conf` (which must listen on `port`), with `env`; it keeps `dir`
/// (its config and log) and is killed on drop.
pub(crate) fn start_server(dir: tempfile::TempDir, port: u16, conf: &str, env: &[(&str, &str)]) -> KillOnDrop {
    let conf_path = dir.path().join("nats-server.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let log_path = dir.path().join("nats-server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = Command::new(nats_server_binary());
    command.arg("-c").arg(&conf_path).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command.spawn().expect("nats-server runs");
    let mut server = KillOnDrop::new(child).with_log(log_path).keeping(dir);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("nats-server exited with {status}:\n{}\nconfig:\n{conf}", server.log());
        }
        if let Ok(stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
            stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut line = String::new();
            if BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO ") {
                return server;
            }
        }
        assert!(Instant::now() < deadline, "nats-server did not come up on {port}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Starts `capdex serve` at `url` with `env` (debug logging on, so a leaked secret would show),
/// its stderr kept in a file; killed on drop.
pub(crate) fn start_capdex(url: &str, env: &[(&str, String)]) -> KillOnDrop {
    let data = tempfile::tempdir().unwrap();
    let stderr = data.path().join("capdex.stderr");
    let mut command = capdex();
    command
        .arg("serve")
        .env("CAPDEX_NATS_URL", url)
        .env("CAPDEX_DATA_DIR", data.path().join("data"))
        .env("CAPDEX_CAPABILITY_DIRS", examples_dir())
        .env("CAPDEX_WATCH", "false")
        // These servers test authentication, not JetStream (several nodes are tests/it/multinode.rs).
        .env("CAPDEX_JETSTREAM_ENABLED", "false")
        .env("CAPDEX_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap());
    for (name, value) in env {
        command.env(name, value);
    }
    KillOnDrop::new(command.spawn().expect("capdex serve starts")).with_log(stderr).keeping(data)
}

/// Waits until capdex answers `$SRV.PING.capdex` through `client`.
async fn wait_for_ping(served: &mut KillOnDrop, client: &async_nats::Client) {
    wait_until_serving(served, client).await;
}

/// Waits for `capdex serve` to exit and returns its status.
async fn wait_for_exit(served: &mut KillOnDrop) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "capdex serve still running:\n{}", served.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn discover_through(client: &async_nats::Client) -> serde_json::Value {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request("capdex.v1.discover", json!({"message": "send a message on telegram"}).to_string().into()),
    )
    .await
    .expect("reply within 10 s")
    .expect("request succeeds");
    body(&reply)
}

#[tokio::test]
async fn user_and_password_authenticate_and_a_wrong_password_is_refused_without_being_shown() {
    let port = free_port();
    let conf = format!(
        "listen: 127.0.0.1:{port}\nauthorization {{ users = [ {{ user: capdex, password: \"pw-Correct-7781\" }} ] }}\n"
    );
    let _server = start_server(tempfile::tempdir().unwrap(), port, &conf, &[]);
    let url = format!("nats://127.0.0.1:{port}");

    let mut served = start_capdex(
        &url,
        &[("CAPDEX_NATS_USER", "capdex".into()), ("CAPDEX_NATS_PASSWORD", "pw-Correct-7781".into())],
    );
    let client = async_nats::ConnectOptions::with_user_and_password("capdex".into(), "pw-Correct-7781".into())
        .connect(&url)
        .await
        .unwrap();
    wait_for_ping(&mut served, &client).await;
    assert_eq!(discover_through(&client).await["tier1"][0]["id"], "channel:telegram");
    assert!(!served.log().contains("pw-Correct-7781"), "the password was logged");
    assert!(async_nats::connect(&url).await.is_err(), "the server refuses clients without credentials");

    let mut refused =
        start_capdex(&url, &[("CAPDEX_NATS_USER", "capdex".into()), ("CAPDEX_NATS_PASSWORD", "pw-Wrong-5512".into())]);
    let status = wait_for_exit(&mut refused).await;
    let output = refused.log();
    assert!(!status.success(), "capdex must not start with a wrong password:\n{output}");
    assert!(output.to_lowercase().contains("authorization"), "{output}");
    assert!(!output.contains("pw-Wrong-5512"), "the password was shown:\n{output}");
}

#[tokio::test]
async fn a_token_from_a_file_authenticates() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("nats-token");
    std::fs::write(&token_file, "tok-3b1f9c\n").unwrap();
    let conf = format!("listen: 127.0.0.1:{port}\nauthorization {{ token: \"tok-3b1f9c\" }}\n");
    let _server = start_server(dir, port, &conf, &[]);
    let url = format!("nats://127.0.0.1:{port}");
    let mut served = start_capdex(&url, &[("CAPDEX_NATS_TOKEN_FILE", token_file.display().to_string())]);
    let client = async_nats::ConnectOptions::with_token("tok-3b1f9c".into()).connect(&url).await.unwrap();
    wait_for_ping(&mut served, &client).await;
    assert_eq!(discover_through(&client).await["tier1"][0]["id"], "channel:telegram");
    assert!(!served.log().contains("tok-3b1f9c"), "the token was logged");
}

#[tokio::test]
async fn an_nkey_seed_authenticates() {
    let port = free_port();
    let capdex_key = nkeys::KeyPair::new_user();
    let client_key = nkeys::KeyPair::new_user();
    let conf = format!(
        "listen: 127.0.0.1:{port}\nauthorization {{ users = [ {{ nkey: {} }}, {{ nkey: {} }} ] }}\n",
        capdex_key.public_key(),
        client_key.public_key()
    );
    let _server = start_server(tempfile::tempdir().unwrap(), port, &conf, &[]);
    let url = format!("nats://127.0.0.1:{port}");
    let seed = capdex_key.seed().unwrap();
    let mut served = start_capdex(&url, &[("CAPDEX_NATS_NKEY_SEED", seed.clone())]);
    let client = async_nats::ConnectOptions::with_nkey(client_key.seed().unwrap()).connect(&url).await.unwrap();
    wait_for_ping(&mut served, &client).await;
    assert_eq!(discover_through(&client).await["tier1"][0]["id"], "channel:telegram");
    assert!(!served.log().contains(&seed), "the nkey seed was logged");
}

/// Base64url without padding, as JWTs use.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A NATS JWT (`ed25519-nkey`) of `claims`, signed by `issuer`.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, nats: serde_json::Value) -> String {
    let header = base64url(json!({"typ": "JWT", "alg": "ed25519-nkey"}).to_string().as_bytes());
    let claims = json!({
        "jti": base64url(subject.as_bytes()),
        "iat": 1_700_000_000,
        "iss": issuer.public_key(),
        "name": subject,
        "sub": subject,
        "nats": nats,
    });
    let signing_input = format!("{header}.{}", base64url(claims.to_string().as_bytes()));
    let signature = issuer.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", base64url(&signature))
}

/// A `.creds` file for a user of `account`.
fn creds_file(account: &nkeys::KeyPair, user: &nkeys::KeyPair) -> String {
    let jwt = nats_jwt(
        account,
        &user.public_key(),
        json!({"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}),
    );
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    )
}

#[tokio::test]
async fn a_creds_file_authenticates_in_operator_mode() {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let operator_jwt = nats_jwt(&operator, &operator.public_key(), json!({"type": "operator", "version": 2}));
    let limits = json!({"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                        "wildcards": true, "conn": -1, "leaf": -1});
    let account_jwt =
        nats_jwt(&operator, &account.public_key(), json!({"type": "account", "version": 2, "limits": limits}));
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let capdex_creds = dir.path().join("capdex.creds");
    std::fs::write(&capdex_creds, creds_file(&account, &nkeys::KeyPair::new_user())).unwrap();
    let client_creds = dir.path().join("client.creds");
    std::fs::write(&client_creds, creds_file(&account, &nkeys::KeyPair::new_user())).unwrap();
    let conf = format!(
        "listen: 127.0.0.1:{port}\noperator: {operator_jwt}\nresolver: MEMORY\n\
         resolver_preload: {{ {}: {account_jwt} }}\n",
        account.public_key()
    );
    let _server = start_server(dir, port, &conf, &[]);
    let url = format!("nats://127.0.0.1:{port}");
    let mut served = start_capdex(&url, &[("CAPDEX_NATS_CREDS_FILE", capdex_creds.display().to_string())]);
    let client = async_nats::ConnectOptions::with_credentials_file(&client_creds).await.unwrap().connect(&url).await;
    let client = client.expect("a client with creds of the same account connects");
    wait_for_ping(&mut served, &client).await;
    assert_eq!(discover_through(&client).await["tier1"][0]["id"], "channel:telegram");
    assert!(async_nats::connect(&url).await.is_err(), "the server refuses clients without credentials");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`.
struct TestPki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn generate_pki(dir: &Path) -> TestPki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "capdex test CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>, purpose: ExtendedKeyUsagePurpose, name: &str| {
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) =
        leaf(vec!["127.0.0.1".into(), "localhost".into()], ExtendedKeyUsagePurpose::ServerAuth, "nats test server");
    let (client_cert, client_key) = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth, "capdex");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    TestPki {
        ca: write("ca.pem", &ca.pem()),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server-key.pem", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client-key.pem", &client_key),
    }
}

#[tokio::test]
async fn mutual_tls_with_a_ca_file_and_a_client_certificate() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_pki(dir.path());
    let conf = format!(
        "listen: 127.0.0.1:{port}\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}\n",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display()
    );
    let _server = start_server(dir, port, &conf, &[]);
    let url = format!("tls://127.0.0.1:{port}");
    let tls_env = |with_client_cert: bool| {
        let mut env = vec![("CAPDEX_NATS_TLS_CA_FILE", pki.ca.display().to_string())];
        if with_client_cert {
            env.push(("CAPDEX_NATS_TLS_CERT_FILE", pki.client_cert.display().to_string()));
            env.push(("CAPDEX_NATS_TLS_KEY_FILE", pki.client_key.display().to_string()));
        }
        env
    };
    let mut served = start_capdex(&url, &tls_env(true));
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(pki.ca.clone())
        .add_client_certificate(pki.client_cert.clone(), pki.client_key.clone())
        .require_tls(true)
        .connect(&url)
        .await
        .expect("the test client connects with TLS");
    wait_for_ping(&mut served, &client).await;
    assert_eq!(discover_through(&client).await["tier1"][0]["id"], "channel:telegram");

    // Without its client certificate, capdex is refused and says so.
    let mut refused = start_capdex(&url, &tls_env(false));
    let status = wait_for_exit(&mut refused).await;
    let output = refused.log();
    assert!(!status.success(), "capdex must not connect without a client certificate:\n{output}");
    assert!(output.contains("failed to connect to NATS"), "{output}");
    // Without the CA, the server's certificate is not trusted.
    let mut untrusted = start_capdex(
        &url,
        &[
            ("CAPDEX_NATS_TLS_CERT_FILE", pki.client_cert.display().to_string()),
            ("CAPDEX_NATS_TLS_KEY_FILE", pki.client_key.display().to_string()),
        ],
    );
    let status = wait_for_exit(&mut untrusted).await;
    let output = untrusted.log();
    assert!(!status.success(), "capdex must not trust an unknown CA:\n{output}");
    assert!(output.to_lowercase().contains("certificate"), "{output}");
}

/// The passwords the test copies of `config/nats-server.conf` read from the environment.
pub(crate) const SHIPPED_PASSWORDS: [(&str, &str); 6] = [
    ("NATS_CAPDEX_PASSWORD", "capdex-pw-1"),
    ("NATS_RUNTIME_PASSWORD", "runtime-pw-2"),
    ("NATS_OPS_PASSWORD", "ops-pw-3"),
    ("NATS_AGENT_ALPHA_PASSWORD", "alpha-pw-4"),
    ("NATS_AGENT_BETA_PASSWORD", "beta-pw-5"),
    ("NATS_APPROVER_PASSWORD", "approver-pw-6"),
];

/// Starts nats-server with a copy of the shipped `config/nats-server.conf`
/// (its users, roles and permissions as shipped), listening on a free port of
/// 127.0.0.1 with JetStream in a temp dir; returns it and its URL.
pub(crate) fn start_shipped_server() -> (KillOnDrop, String) {
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nats-server.conf")).unwrap();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("jetstream");
    let mut conf = String::new();
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("port:") {
            conf.push_str(&format!("listen: 127.0.0.1:{port}\n"));
        } else if trimmed.starts_with("http_port:") || trimmed.starts_with("http:") {
            continue;
        } else if trimmed.starts_with("store_dir:") {
            conf.push_str(&format!("  store_dir: \"{}\"\n", store.display()));
        } else {
            conf.push_str(line);
            conf.push('\n');
        }
    }
    assert!(conf.contains(&format!("listen: 127.0.0.1:{port}")) && conf.contains(&store.display().to_string()));
    (start_server(dir, port, &conf, &SHIPPED_PASSWORDS), format!("nats://127.0.0.1:{port}"))
}

/// Collects the server errors (permission violations) a client is sent.
pub(crate) async fn client_with_errors(
    url: &str,
    user: &str,
    password: &str,
) -> (async_nats::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    client_with_errors_at(url, user, password, None).await
}

/// [`client_with_errors`] whose replies come to `inbox_prefix` (the user's own inboxes) when given.
pub(crate) async fn client_with_errors_at(
    url: &str,
    user: &str,
    password: &str,
    inbox_prefix: Option<&str>,
) -> (async_nats::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (errors_tx, errors_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut options = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into());
    if let Some(prefix) = inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    let client = options
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = errors_tx.send(err.to_string());
                }
            }
        })
        .connect(url)
        .await
        .unwrap_or_else(|err| panic!("{user} connects: {err}"));
    (client, errors_rx)
}

pub(crate) async fn expect_violation(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str) {
    let error = tokio::time::timeout(Duration::from_secs(10), errors.recv())
        .await
        .unwrap_or_else(|_| panic!("no permissions violation for {what} within 10 s"))
        .unwrap();
    assert!(error.to_lowercase().contains("permissions violation"), "{what}: {error}");
}

#[tokio::test]
async fn the_shipped_nats_server_conf_gives_each_role_only_its_subjects() {
    let (_server, url) = start_shipped_server();

    // capdex: allowed to serve its subjects (and $SRV); denied anything else.
    let mut served =
        start_capdex(&url, &[("CAPDEX_NATS_USER", "capdex".into()), ("CAPDEX_NATS_PASSWORD", "capdex-pw-1".into())]);
    let (runtime, mut runtime_errors) = client_with_errors(&url, "runtime", "runtime-pw-2").await;
    wait_for_ping(&mut served, &runtime).await;
    let (capdex_user, mut capdex_errors) = client_with_errors(&url, "capdex", "capdex-pw-1").await;
    let _denied = capdex_user.subscribe("payments.>").await.unwrap();
    expect_violation(&mut capdex_errors, "capdex subscribing to payments.>").await;

    // runtime: allowed to request discovery (and receive the reply); denied KPI events.
    assert_eq!(discover_through(&runtime).await["tier1"][0]["id"], "channel:telegram");
    let _denied = runtime.subscribe("capdex.v1.kpi.>").await.unwrap();
    expect_violation(&mut runtime_errors, "runtime subscribing to capdex.v1.kpi.>").await;

    // ops: allowed to subscribe to KPI events; denied publishing requests.
    let (ops, mut ops_errors) = client_with_errors(&url, "ops", "ops-pw-3").await;
    let mut kpis = ops.subscribe("capdex.v1.kpi.>").await.unwrap();
    ops.flush().await.unwrap();
    // Let the server apply the subscription before the event is published.
    let _ = tokio::time::timeout(Duration::from_millis(300), ops_errors.recv()).await;
    let outcome = json!({"turnId": "sec-1", "organizationId": "acme", "personaId": "bot", "status": "success"});
    let reply = runtime.request("capdex.v1.outcome", outcome.to_string().into()).await.unwrap();
    assert_eq!(body(&reply)["accepted"], true);
    let kpi =
        tokio::time::timeout(Duration::from_secs(10), kpis.next()).await.expect("ops gets the KPI event").unwrap();
    assert_eq!(kpi.subject.as_str(), "capdex.v1.kpi.acme_bot");
    ops.publish("capdex.v1.outcome", outcome.to_string().into()).await.unwrap();
    ops.flush().await.unwrap();
    expect_violation(&mut ops_errors, "ops publishing to capdex.v1.outcome").await;
}
