//! What the tests, the benchmarks and the tools share and the node does not:
//! built only with the `testkit` feature (and for the library's own tests),
//! so the shipped library holds only the node. The deterministic workloads
//! are beside it, in `workload`, under the same feature.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};


/// The largest response `http_get` reads: metrics text with many scopes
/// and labels stays far below.
pub const HTTP_GET_RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A blocking HTTP/1.1 GET for tests and tools: returns the status and the
/// body. `timeout` bounds the whole exchange, connect included; the response
/// is read to the server's close, at most [`HTTP_GET_RESPONSE_BYTES_MAX`].
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("http_get: {what}"));
    if !path.starts_with('/') || path.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "http_get: path must start with / and hold no spaces"));
    }
    let deadline = Instant::now() + timeout;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "http_get: timed out"))
    };
    let mut stream = TcpStream::connect_timeout(&addr, remaining()?)?;
    stream.set_write_timeout(Some(remaining()?))?;
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // Reset before each read so the deadline bounds the total, not each read.
        stream.set_read_timeout(Some(remaining()?))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        if response.len() + n > HTTP_GET_RESPONSE_BYTES_MAX {
            return Err(invalid("response too large"));
        }
        response.extend_from_slice(&chunk[..n]);
    }
    let head_len = head_end(&response).ok_or_else(|| invalid("no complete head"))?;
    let head = std::str::from_utf8(&response[..head_len]).map_err(|_| invalid("head not UTF-8"))?;
    let mut lines = head.lines();
    let status_line = lines.next().ok_or_else(|| invalid("no status line"))?;
    let mut fields = status_line.split(' ');
    let status = match (fields.next(), fields.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") => {
            code.parse::<u16>().map_err(|_| invalid("bad status code"))?
        }
        _ => return Err(invalid("bad status line")),
    };
    let content_length = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse::<usize>().map_err(|_| invalid("bad content-length")))
        .transpose()?;
    let mut body = &response[head_len..];
    if let Some(len) = content_length {
        if body.len() < len {
            return Err(invalid("body shorter than content-length"));
        }
        body = &body[..len];
    }
    let body = String::from_utf8(body.to_vec()).map_err(|_| invalid("body not UTF-8"))?;
    Ok((status, body))
}

/// The length of a response head up to and including its blank line,
/// `\r\n\r\n` or a bare `\n\n`.
fn head_end(bytes: &[u8]) -> Option<usize> {
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
