//! A real OTLP/HTTP trace receiver for the tests (issue 54 item 4): it listens on 127.0.0.1,
//! takes `POST /v1/traces` requests as the exporter sends them (HTTP/1.1, keep-alive,
//! `application/x-protobuf`) and decodes each body with the official protobuf definitions
//! (`opentelemetry-proto`'s prost types), answering with an `ExportTraceServiceResponse` as a
//! collector does. No OpenTelemetry Collector can be installed here; this one checks the wire
//! format the same way. [`Receiver::stop`] makes the collector go away mid-run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// One span as received, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct Received {
    /// The span.
    pub span: Span,
    /// Its resource's attributes as text.
    pub resource: HashMap<String, String>,
}

impl Received {
    /// The trace id as 32 hex digits.
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span id as 16 hex digits.
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent span id as hex ("" for a root).
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// An attribute as text (ints and bools printed), if present.
    pub fn attr(&self, key: &str) -> Option<String> {
        attrs(&self.span.attributes).remove(key)
    }
}

/// Attributes as text.
pub fn attrs(kv: &[KeyValue]) -> HashMap<String, String> {
    kv.iter()
        .map(|k| (k.key.clone(), text(k.value.as_ref())))
        .collect()
}

fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The receiver: a listening thread and one thread per connection.
pub struct Receiver {
    /// `http://127.0.0.1:PORT/v1/traces`, for `traces.endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
    requests: Arc<Mutex<u64>>,
    stop: Arc<AtomicBool>,
    hang: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the OTLP receiver");
        let port = listener.local_addr().expect("its port").port();
        listener.set_nonblocking(true).expect("non-blocking accept");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let hang = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (spans, requests, stop, open) =
                (spans.clone(), requests.clone(), stop.clone(), open.clone());
            let hang = hang.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            conn.set_nonblocking(false).expect("blocking connection");
                            if let Ok(c) = conn.try_clone() {
                                open.lock().expect("open").push(c);
                            }
                            let (spans, requests) = (spans.clone(), requests.clone());
                            let (stop, hang) = (stop.clone(), hang.clone());
                            std::thread::spawn(move || {
                                serve(conn, &spans, &requests, || {
                                    // A hung collector: reads the request, never answers.
                                    while hang.load(Ordering::SeqCst)
                                        && !stop.load(Ordering::SeqCst)
                                    {
                                        std::thread::sleep(Duration::from_millis(20));
                                    }
                                    !stop.load(Ordering::SeqCst)
                                })
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Self {
            endpoint: format!("http://127.0.0.1:{port}/v1/traces"),
            spans,
            requests,
            stop,
            hang,
            open,
            accept: Some(accept),
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("spans").clone()
    }

    /// Export requests answered so far.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().expect("requests")
    }

    /// The collector hangs: it takes connections and requests and never answers (a
    /// black-holed collector: every export waits for its timeout).
    pub fn hang(&self) {
        self.hang.store(true, Ordering::SeqCst);
    }

    /// The collector goes away: the port is closed and open connections are cut.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            t.join().expect("accept thread");
        }
        for c in self.open.lock().expect("open").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one keep-alive connection until the client closes it.
/// `answer`: waits while the collector hangs; false when it was stopped meanwhile.
fn serve(
    conn: TcpStream,
    spans: &Mutex<Vec<Received>>,
    requests: &Mutex<u64>,
    answer: impl Fn() -> bool,
) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if !answer() {
            return;
        }
        let ok = request_line.starts_with("POST /v1/traces ")
            && headers.get("content-type").map(String::as_str) == Some("application/x-protobuf");
        let decoded = ok
            .then(|| ExportTraceServiceRequest::decode(body.as_slice()).ok())
            .flatten();
        let status = match decoded {
            Some(req) => {
                keep(req, spans);
                *requests.lock().expect("requests") += 1;
                "200 OK"
            }
            None => "400 Bad Request",
        };
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&answer).is_err() {
            return;
        }
    }
}

fn keep(req: ExportTraceServiceRequest, spans: &Mutex<Vec<Received>>) {
    let mut all = spans.lock().expect("spans");
    for rs in req.resource_spans {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                all.push(Received {
                    span,
                    resource: resource.clone(),
                });
            }
        }
    }
}
