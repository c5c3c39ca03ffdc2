//! The other direction: a minimal HTTP/1.1 client for tests that call a server under test
//! (the scheduler extender, its cells inspector and metrics) the way `curl` or the
//! kube-scheduler would, one request per connection.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

/// A server's whole reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    /// The body.
    pub body: String,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// The status code and the body as JSON.
    pub fn status_json(&self) -> (u16, Value) {
        (self.status, self.json())
    }
}

/// Sends `method path` with `body` (JSON; `Content-Length` set, empty for none) on a fresh
/// connection that closes after the reply, and reads the reply. A 60 s socket timeout only
/// turns a hang into a failure.
pub fn request(addr: impl ToSocketAddrs, method: &str, path: &str, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    read_reply(&mut s)
}

/// Reads a whole reply from `s`, until the server closes the connection.
pub fn read_reply(s: &mut TcpStream) -> Reply {
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("server answered before the socket timeout");
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}
