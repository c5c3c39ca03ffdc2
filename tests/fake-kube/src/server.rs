//! The HTTP side: one thread per connection, one request per connection (`Connection: close`),
//! JSON answers with optional headers, watch streams chunked as the API server sends them
//! (one `{"type", "object"}` JSON line per chunk).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Req {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Request body.
    pub body: Vec<u8>,
    /// Query parameters, percent-decoded.
    pub query: BTreeMap<String, String>,
    /// The query string as sent.
    pub raw_query: String,
    /// Headers, names lower-cased.
    pub headers: BTreeMap<String, String>,
    /// When it arrived.
    pub at: Instant,
}

impl Req {
    /// Whether this is a watch request (`watch=true`).
    pub fn is_watch(&self) -> bool {
        self.query.get("watch").map(String::as_str) == Some("true")
    }
    /// The `resourceVersion` query parameter ("" when absent).
    pub fn rv(&self) -> &str {
        self.query.get("resourceVersion").map_or("", String::as_str)
    }
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What the fake answers to one request.
pub enum Answer {
    /// Status code, JSON body, extra headers.
    Json(u16, Value, Vec<(&'static str, String)>),
    /// A watch stream: these events, then the stream ends (`hang = false`) or stays open.
    Stream(Vec<Value>, bool),
    /// A watch stream that sends these events after a while, then stays open.
    Later(Duration, Vec<Value>),
    /// A watch stream that sends each event as it arrives; it ends when the sender is dropped
    /// or the server stops.
    Live(Receiver<Value>),
}

/// A running fake API server; it stops accepting when dropped.
pub struct FakeApi {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Every request received, in order.
    pub reqs: Arc<Mutex<Vec<Req>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl FakeApi {
    /// The requests made to `path`.
    pub fn requests(&self, path: &str) -> Vec<Req> {
        self.reqs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
    /// The list (not watch) requests made to `path`.
    pub fn lists(&self, path: &str) -> Vec<Req> {
        self.requests(path).into_iter().filter(|r| !r.is_watch()).collect()
    }
    /// The watch requests made to `path`.
    pub fn watches(&self, path: &str) -> Vec<Req> {
        self.requests(path).into_iter().filter(Req::is_watch).collect()
    }
    /// All requests so far.
    pub fn all(&self) -> Vec<Req> {
        self.reqs.lock().unwrap().clone()
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    let unescape = |s: &str| {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                c => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).unwrap()
    };
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

/// Serves `answer(request, same-path requests before it)` on loopback.
pub fn fake_api(answer: impl Fn(&Req, &[Req]) -> Answer + Send + Sync + 'static) -> FakeApi {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let reqs: Arc<Mutex<Vec<Req>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let answer = Arc::new(answer);
    let (r, st) = (reqs.clone(), stop.clone());
    std::thread::spawn(move || {
        while !st.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let (r, st, answer) = (r.clone(), st.clone(), answer.clone());
                    std::thread::spawn(move || serve(stream, &r, &st, &*answer));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    FakeApi { url, reqs, stop }
}

fn chunk(stream: &mut TcpStream, e: &Value) -> bool {
    let line = format!("{e}\n");
    let ok = write!(stream, "{:x}\r\n{line}\r\n", line.len()).is_ok();
    ok && stream.flush().is_ok()
}

const STREAM_HEAD: &str =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";

fn serve(mut stream: TcpStream, reqs: &Mutex<Vec<Req>>, stop: &AtomicBool, answer: &dyn Fn(&Req, &[Req]) -> Answer) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut length = 0;
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut body = vec![0; length];
    if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let method = line.split_whitespace().next().unwrap_or("GET").to_string();
    let req = Req {
        method,
        path: path.to_string(),
        body,
        query: parse_query(query),
        raw_query: query.to_string(),
        headers,
        at: Instant::now(),
    };
    let before: Vec<Req> = {
        let mut all = reqs.lock().unwrap();
        let before = all.iter().filter(|r| r.path == req.path).cloned().collect();
        all.push(req.clone());
        before
    };
    match answer(&req, &before) {
        Answer::Json(code, body, headers) => {
            let body = body.to_string();
            let mut head = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            let _ = write!(stream, "{head}\r\n{body}");
        }
        Answer::Later(delay, events) => {
            let _ = write!(stream, "{STREAM_HEAD}");
            let _ = stream.flush();
            std::thread::sleep(delay);
            for e in events {
                chunk(&mut stream, &e);
            }
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = write!(stream, "0\r\n\r\n");
        }
        Answer::Stream(events, hang) => {
            let _ = write!(stream, "{STREAM_HEAD}");
            for e in events {
                chunk(&mut stream, &e);
            }
            if hang {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = write!(stream, "0\r\n\r\n");
        }
        Answer::Live(rx) => {
            let _ = write!(stream, "{STREAM_HEAD}");
            let _ = stream.flush();
            while !stop.load(Ordering::SeqCst) {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(e) => {
                        if !chunk(&mut stream, &e) {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            let _ = write!(stream, "0\r\n\r\n");
        }
    }
    let _ = stream.flush();
}
