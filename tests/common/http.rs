//! The tests' one HTTP client: a raw HTTP/1.1 request on a fresh connection to 127.0.0.1,
//! read until the server closes it. Raw on purpose: tests also send what no client library
//! would (garbage, bad framing, oversized bodies) and read the answer byte for byte.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long an answer may take: generous for a loaded machine, short enough that a server
/// that never closes fails the test instead of hanging it.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Sends `request` as is and reads until the server closes the connection (a timeout after
/// `limit`); the whole response, as text. An answer followed by a reset (a server that closes
/// on input it did not read) is still the answer.
pub async fn exchange(
    port: u16,
    request: impl AsRef<[u8]>,
    limit: Duration,
) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(request.as_ref()).await?;
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 8192];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) => return Ok(()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) if !buf.is_empty() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| std::io::Error::other("timeout"))??;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `GET path`; the whole response.
pub async fn get(port: u16, path: &str) -> std::io::Result<String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    exchange(port, request, ANSWER_LIMIT).await
}

/// `method path` with an optional bearer token and JSON body; the whole response.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    json: Option<&str>,
) -> std::io::Result<String> {
    let payload = json.unwrap_or_default();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    exchange(port, request, ANSWER_LIMIT).await
}

/// The status code of a whole response (0 when there is none).
pub fn status(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The body of a whole response (empty when the head never ends).
pub fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}
