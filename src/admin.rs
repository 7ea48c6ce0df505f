//! HTTP status and metrics (SPEC §11), on the node's admin address.
//!
//! A deliberately tiny HTTP/1.1 server: GET only, one request per
//! connection (`connection: close`), every read, write and count bounded.
//! What it serves comes from a [`StatusSource`] the node implements; this
//! module only routes and frames.
//!
//! Routes:
//! - `GET /v1/identity` → `identity_json()`
//! - `GET /v1/scopes` → `scopes_json()`
//! - `GET /v1/scopes/{64 hex chars, either case}` → `scope_json()`, 404 when
//!   `None` or when the id is not 64 hex characters
//! - `GET /metrics` → `metrics_text()`, Prometheus text exposition
//!
//! Anything else: 404 (unknown path), 405 (not GET), 400 (not HTTP/1.x),
//! 431 (head over [`REQUEST_HEAD_BYTES_MAX`]), 408 (head not in time).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinError, JoinSet};

/// What the admin server reports. Calls run on tokio's blocking pool, so
/// they may take locks or read the store.
pub trait StatusSource: Send + Sync + 'static {
    fn identity_json(&self) -> String;
    /// `None` => 404 (the scope's genesis is not applied, SPEC §11).
    fn scope_json(&self, scope: &[u8; 32]) -> Option<String>;
    fn scopes_json(&self) -> String;
    fn metrics_text(&self) -> String;
}

/// A request's head (request line and headers). 8 KiB is what common servers
/// allow per header line; ours need none, so this is generous.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;

/// Time for the whole request head to arrive. A client on the same network
/// sends it in one packet; 5 s tolerates a slow link while closing
/// slow-loris connections quickly.
pub const REQUEST_HEAD_TIMEOUT_MS: u64 = 5_000;

/// Time to write the response. Metrics text of a large node is some hundred
/// KiB; 10 s covers a slow scraper without holding a slot forever.
pub const RESPONSE_WRITE_TIMEOUT_MS: u64 = 10_000;

/// Requests handled at once. Operators and a scraper or two use this
/// endpoint; beyond the bound, connections wait in the kernel's backlog
/// instead of each taking a task and a blocking thread.
pub const ADMIN_CONNECTIONS_MAX: usize = 32;

/// Bounds of the lingering close: a client that read its response closes
/// at once; one that keeps sending is cut off after this much or this long.
const LINGER_MS: u64 = 1_000;
const LINGER_BYTES_MAX: usize = 64 * 1024;

/// Back-off after a failed `accept` (e.g. out of file descriptors), so the
/// loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;

/// Serves HTTP on `listener` until `shutdown` turns true (or its sender
/// drops). Requests still in flight then are dropped.
pub async fn serve_admin(listener: TcpListener, source: Arc<dyn StatusSource>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    // At most ADMIN_CONNECTIONS_MAX running, plus finished ones not yet
    // reaped (reaped before each accept).
    let mut requests = JoinSet::new();
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);
    loop {
        // Take a slot before accepting, so the bound holds at the socket.
        let slot = tokio::select! {
            biased;
            () = &mut stop => break,
            slot = slots.clone().acquire_owned() => slot.expect("the slot semaphore is never closed"),
        };
        let stream = tokio::select! {
            biased;
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        while let Some(done) = requests.try_join_next() {
            propagate_panic(done);
        }
        let source = source.clone();
        requests.spawn(async move {
            let _slot = slot;
            handle_connection(stream, source).await;
        });
    }
    requests.shutdown().await;
}

/// A panic in a request (a `StatusSource` bug) is a programmer's error.
fn propagate_panic(done: Result<(), JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

async fn handle_connection(mut stream: TcpStream, source: Arc<dyn StatusSource>) {
    let head_timeout = Duration::from_millis(REQUEST_HEAD_TIMEOUT_MS);
    let response = match tokio::time::timeout(head_timeout, read_head(&mut stream)).await {
        Ok(Ok(head)) => match parse_request(&head) {
            Ok(path) => {
                let path = path.to_owned();
                // The source may block (locks, store reads): keep it off the
                // async workers.
                match tokio::task::spawn_blocking(move || route(&path, source.as_ref())).await {
                    Ok(response) => response,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            }
            Err(response) => response,
        },
        Ok(Err(HeadError::TooLarge)) => Response::error(431, "request head too large"),
        Ok(Err(HeadError::Closed)) => return, // nothing asked, nothing to answer
        Err(_elapsed) => Response::error(408, "request head not received in time"),
    };
    let bytes = response.to_bytes();
    let write_timeout = Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS);
    // A failed or slow write only loses this response; the client retries.
    let written = tokio::time::timeout(write_timeout, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
    if matches!(written, Ok(Ok(()))) {
        linger(&mut stream).await;
    }
}

/// Reads and discards what the client still sends until it closes, within
/// bounds. Closing a socket with unread input makes the kernel send a reset,
/// which can destroy the response before the client reads it (a 431 sent
/// while the request is still arriving); draining first avoids that.
async fn linger(stream: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    let mut drained = 0usize;
    let _ = tokio::time::timeout(Duration::from_millis(LINGER_MS), async {
        while drained < LINGER_BYTES_MAX {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

enum HeadError {
    TooLarge,
    /// The peer closed (or the read failed) before a complete head.
    Closed,
}

/// Reads up to the blank line that ends the head, at most
/// `REQUEST_HEAD_BYTES_MAX` bytes. Bytes after it (a body) are ignored: GET
/// has none worth reading, and the connection closes after the response.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        // Look for the end only where it can newly appear.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head[from..]) {
            if from + end > REQUEST_HEAD_BYTES_MAX {
                return Err(HeadError::TooLarge);
            }
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > REQUEST_HEAD_BYTES_MAX {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The length up to and including the blank line, `\r\n\r\n` or a bare
/// `\n\n` (RFC 9112 §2.2 lets a server accept bare LF).
pub(crate) fn head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| {
        let rest = &bytes[i..];
        if rest.starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// Checks the request line and returns the path (query string removed).
fn parse_request(head: &[u8]) -> Result<&str, Response> {
    let bad = || Response::error(400, "malformed request");
    let line_end = head.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| bad())?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad());
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) || !target.starts_with('/') {
        return Err(bad());
    }
    if method != "GET" {
        return Err(Response::error(405, "only GET is served").with_header("allow: GET"));
    }
    Ok(target.split_once('?').map_or(target, |(path, _query)| path))
}

fn route(path: &str, source: &dyn StatusSource) -> Response {
    match path {
        "/v1/identity" => Response::json(200, source.identity_json()),
        "/v1/scopes" => Response::json(200, source.scopes_json()),
        "/metrics" => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            extra_header: None,
            body: source.metrics_text(),
        },
        _ => match path.strip_prefix("/v1/scopes/").and_then(parse_scope) {
            Some(scope) => match source.scope_json(&scope) {
                Some(json) => Response::json(200, json),
                None => Response::error(404, "no such scope"),
            },
            None => Response::error(404, "not found"),
        },
    }
}

/// A scope id: exactly 64 hex characters, either case.
fn parse_scope(hex_id: &str) -> Option<[u8; 32]> {
    crate::protocol::parse_hash_hex(hex_id)
}

struct Response {
    status: u16,
    content_type: &'static str,
    extra_header: Option<&'static str>,
    body: String,
}

impl Response {
    fn json(status: u16, body: String) -> Response {
        Response { status, content_type: "application/json", extra_header: None, body }
    }

    fn error(status: u16, message: &str) -> Response {
        Response::json(status, serde_json::json!({ "error": message }).to_string())
    }

    fn with_header(mut self, header: &'static str) -> Response {
        self.extra_header = Some(header);
        self
    }

    fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            other => unreachable!("status {other} is never produced"),
        };
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.status,
            reason,
            self.content_type,
            self.body.len()
        );
        if let Some(header) = self.extra_header {
            out.push_str(header);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(self.body.as_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end_finds_crlf_and_bare_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nhost: x\r\n"), None);
    }

    #[test]
    fn request_lines() {
        let check = |head: &str, expected: Result<&str, u16>| {
            let got = parse_request(head.as_bytes()).map_err(|r| r.status);
            assert_eq!(got, expected, "{head:?}");
        };
        check("GET /v1/identity HTTP/1.1\r\n\r\n", Ok("/v1/identity"));
        check("GET /metrics?x=1 HTTP/1.0\r\n\r\n", Ok("/metrics"));
        check("POST /v1/identity HTTP/1.1\r\n\r\n", Err(405));
        check("GET /v1/identity HTTP/2\r\n\r\n", Err(400));
        check("GET  /v1/identity HTTP/1.1\r\n\r\n", Err(400));
        check("GET v1 HTTP/1.1\r\n\r\n", Err(400));
        check("\r\n\r\n", Err(400));
    }

    #[test]
    fn scope_ids() {
        let lower = "ab".repeat(32);
        assert_eq!(parse_scope(&lower), Some([0xab; 32]));
        assert_eq!(parse_scope(&lower.to_uppercase()), Some([0xab; 32]));
        assert_eq!(parse_scope(&"ab".repeat(31)), None);
        assert_eq!(parse_scope(&format!("{}zz", "ab".repeat(31))), None);
        // Multi-byte characters make a 64-byte string that is not hex.
        assert_eq!(parse_scope(&"é".repeat(32)), None);
    }
}
