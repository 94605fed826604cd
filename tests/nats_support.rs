//! Tests of the nats-server test helper (`tests/it/support/nats_server.rs`):
//! it starts a real server, kills it, and restarts it on the same port with
//! JetStream state intact. Speaks the NATS text protocol over a plain
//! `TcpStream` so it does not depend on the crate under test.

#[path = "it/support/nats_server.rs"]
mod nats_server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use nats_server::NatsServer;

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
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to nats-server");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        stream,
        "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\n\
         SUB _INBOX.helper 1\r\n\
         PUB {subject} _INBOX.helper {}\r\n{payload}\r\n",
        payload.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "connection closed");
        if line.starts_with("PING") {
            stream.write_all(b"PONG\r\n").unwrap();
        } else if let Some(rest) = line.strip_prefix("MSG ") {
            let len: usize = rest.split_whitespace().last().unwrap().parse().unwrap();
            let mut body = vec![0; len + 2]; // payload + CRLF
            reader.read_exact(&mut body).unwrap();
            body.truncate(len);
            return String::from_utf8(body).unwrap();
        } else if line.starts_with("-ERR") {
            panic!("server error: {line}");
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
