//! Tests of the nats-server test helpers (`tests/it/support/nats_server.rs`,
//! `nats_cluster.rs`): they start a real server or cluster, kill a server, and
//! restart it on the same ports with JetStream state intact. Speaks the NATS text protocol over a plain
//! `TcpStream` so it does not depend on the crate under test.

#[path = "it/support/nats_cluster.rs"]
mod nats_cluster;
#[path = "it/support/nats_server.rs"]
mod nats_server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nats_cluster::NatsCluster;
use nats_server::NatsServer;
use std::time::Instant;

/// Connects and returns the server's `INFO` JSON.
fn server_info(port: u16) -> String {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nats-server");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.strip_prefix("INFO ").unwrap_or_else(|| panic!("expected INFO, got {line:?}")).trim_end().to_owned()
}

/// Sends one request with the raw NATS protocol and returns the reply payload.
fn request(port: u16, subject: &str, payload: &str) -> String {
    try_request(port, subject, None, payload).unwrap_or_else(|e| panic!("request on {subject}: {e}"))
}

/// [`request`], or why there was no reply within 5 s. With `msg_id` the
/// message carries a `Nats-Msg-Id` header, so JetStream stores it once however
/// often it is sent within the stream's duplicate window.
///
/// Every call listens on an inbox of its own: a publish whose request timed
/// out may still be stored and acknowledged a moment later (a JetStream stream
/// electing a leader), and that late acknowledgement must not be read as the
/// reply to a later request.
fn try_request(port: u16, subject: &str, msg_id: Option<&str>, payload: &str) -> std::io::Result<String> {
    static INBOXES: AtomicU64 = AtomicU64::new(0);
    let inbox = format!("_INBOX.helper.{}.{}", std::process::id(), INBOXES.fetch_add(1, Ordering::Relaxed));
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let publish = match msg_id {
        None => format!("PUB {subject} {inbox} {}\r\n{payload}\r\n", payload.len()),
        Some(id) => {
            let headers = format!("NATS/1.0\r\nNats-Msg-Id: {id}\r\n\r\n");
            let total = headers.len() + payload.len();
            format!("HPUB {subject} {inbox} {} {total}\r\n{headers}{payload}\r\n", headers.len())
        }
    };
    write!(
        stream,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true}}\r\n\
         SUB {inbox} 1\r\n\
         {publish}"
    )?;
    let mut reader = BufReader::new(stream.try_clone()?);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        if line.starts_with("PING") {
            stream.write_all(b"PONG\r\n")?;
        } else if let Some(rest) = line.strip_prefix("MSG ") {
            let len: usize = rest.split_whitespace().last().unwrap().parse().unwrap();
            let mut body = vec![0; len + 2]; // payload + CRLF
            reader.read_exact(&mut body)?;
            body.truncate(len);
            return Ok(String::from_utf8(body).unwrap());
        } else if let Some(rest) = line.strip_prefix("HMSG ") {
            // `HMSG subject sid [reply] header_len total_len`: a reply with headers
            // (a status such as 503 "no responders" when nobody listens).
            let fields: Vec<usize> = rest.split_whitespace().rev().take(2).map(|n| n.parse().unwrap()).collect();
            let (total, header_len) = (fields[0], fields[1]);
            let mut body = vec![0; total + 2];
            reader.read_exact(&mut body)?;
            let headers = String::from_utf8_lossy(&body[..header_len]).into_owned();
            let payload = String::from_utf8_lossy(&body[header_len..total]).into_owned();
            if payload.is_empty() {
                return Err(std::io::Error::other(format!("a status reply: {}", headers.trim())));
            }
            return Ok(payload);
        } else if line.starts_with("-ERR") {
            return Err(std::io::Error::other(format!("server error: {line}")));
        }
        // INFO, +OK, PONG: skip.
    }
}

#[test]
fn starts_kills_and_restarts_with_jetstream_state() {
    let mut server = NatsServer::start();
    let port = server.port();
    assert_eq!(server.url(), format!("nats://127.0.0.1:{port}"));

    let info = server_info(port);
    assert!(info.contains("\"jetstream\":true"), "INFO: {info}");

    let created =
        request(port, "$JS.API.STREAM.CREATE.HELPER", r#"{"name":"HELPER","subjects":["helper.>"],"storage":"file"}"#);
    assert!(
        created.contains("\"type\":\"io.nats.jetstream.api.v1.stream_create_response\"")
            && !created.contains("\"error\""),
        "stream create: {created}"
    );

    server.kill();
    assert!(!server.is_running());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "port {port} still accepts connections after kill");

    server.restart();
    assert_eq!(server.port(), port, "restart must keep the port");
    assert!(server_info(port).contains("\"jetstream\":true"));
    let stream_info = request(port, "$JS.API.STREAM.INFO.HELPER", "");
    assert!(
        stream_info.contains("\"name\":\"HELPER\"") && !stream_info.contains("\"error\""),
        "stream lost across restart: {stream_info}"
    );

    // Restarting a running server also works.
    server.restart();
    assert!(server_info(port).contains("\"jetstream\":true"));
}

#[test]
fn drop_stops_the_server_and_removes_the_store() {
    let server = NatsServer::start();
    let port = server.port();
    let store = server.store_dir();
    server_info(port);
    drop(server);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(!store.exists(), "store dir {} not removed", store.display());
}

#[test]
fn restart_waits_for_the_port_to_be_free() {
    let mut server = NatsServer::start();
    let port = server.port();
    server.kill();
    // Someone else holds the port for a moment; restart retries until it is free.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        drop(squatter);
    });
    server.restart();
    releaser.join().unwrap();
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert!(server_info(port).contains("\"jetstream\":true"));
}

/// Retries `request` for up to 20 s until its reply passes `ok` (a JetStream
/// request after a kill waits for a new stream leader); returns that reply.
fn request_until(port: u16, subject: &str, msg_id: Option<&str>, payload: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = try_request(port, subject, msg_id, payload);
        match &reply {
            Ok(reply) if ok(reply) => return reply.clone(),
            _ if Instant::now() >= deadline => panic!("{subject} on port {port}: {reply:?}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn stream_messages(info: &str) -> u64 {
    let info: serde_json::Value = serde_json::from_str(info).unwrap();
    info["state"]["messages"].as_u64().unwrap_or_else(|| panic!("no state.messages: {info}"))
}

#[test]
fn a_cluster_keeps_an_r3_stream_through_a_kill_9_and_a_restart() {
    let mut cluster = NatsCluster::start(3);
    assert_eq!(cluster.size(), 3);
    let urls = cluster.urls_from(1);
    assert_eq!(urls, format!("{},{},{}", cluster.url(1), cluster.url(0), cluster.url(2)));
    for i in 0..3 {
        let info = server_info(cluster.port(i));
        assert!(info.contains("\"jetstream\":true") && info.contains(&format!("\"server_name\":\"n{i}\"")), "{info}");
        assert!(info.contains(&format!("\"cluster\":\"{}\"", nats_cluster::CLUSTER_NAME)), "{info}");
    }
    let created = request(
        cluster.port(0),
        "$JS.API.STREAM.CREATE.CLUSTERED",
        r#"{"name":"CLUSTERED","subjects":["clustered.>"],"storage":"file","num_replicas":3}"#,
    );
    assert!(!created.contains("\"error\""), "stream create: {created}");
    let acked = |reply: &str| reply.contains("\"stream\":\"CLUSTERED\"") && !reply.contains("\"error\"");
    // Each message has an id: a publish retried after a timeout while the stream elects a
    // leader may be stored twice otherwise (the first try can land late), and the count below is exact.
    for n in 0..5 {
        request_until(cluster.port(n % 3), "clustered.a", Some(&format!("before-{n}")), "before", acked);
    }

    // Kill the server the stream lives on first; the two others keep it writable.
    let pid = cluster.pid(0).unwrap();
    cluster.kill_9(0);
    assert!(!cluster.is_running(0) && cluster.pid(0).is_none());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still exists");
    assert!(TcpStream::connect(("127.0.0.1", cluster.port(0))).is_err());
    for n in 0..5 {
        request_until(cluster.port(1 + n % 2), "clustered.a", Some(&format!("during-{n}")), "during", acked);
    }
    cluster.wait_healthy();

    // Restarted on the same port and store, it catches up with what it missed.
    let port = cluster.port(0);
    cluster.restart(0);
    assert_eq!(cluster.port(0), port);
    assert!(cluster.is_running(0));
    let info = request_until(port, "$JS.API.STREAM.INFO.CLUSTERED", None, "", |reply| reply.contains("\"state\""));
    assert_eq!(stream_messages(&info), 10, "{info}");
    // Whichever server is asked, the leader answers with ten messages and two replicas, both current:
    // the restarted server caught up with what it missed.
    for i in 0..3 {
        // The restarted replica catches up a moment after its server is back: asked until it has.
        let info = request_until(cluster.port(i), "$JS.API.STREAM.INFO.CLUSTERED", None, "", |reply| {
            reply.contains("\"state\"") && !reply.contains("\"current\":false")
        });
        assert_eq!(stream_messages(&info), 10, "via n{i}: {info}");
        let parsed: serde_json::Value = serde_json::from_str(&info).unwrap();
        let replicas = parsed["cluster"]["replicas"].as_array().cloned().unwrap_or_default();
        assert_eq!(replicas.len(), 2, "an R3 stream has a leader and two replicas: {info}");
        assert!(replicas.iter().all(|replica| replica["current"] == true), "{info}");
    }
}

#[test]
fn a_one_server_cluster_is_a_plain_server_with_jetstream() {
    let mut cluster = NatsCluster::start(1);
    assert_eq!(cluster.urls(), vec![cluster.url(0)]);
    assert!(server_info(cluster.port(0)).contains("\"jetstream\":true"));
    cluster.restart(0);
    assert!(server_info(cluster.port(0)).contains("\"jetstream\":true"));
}
