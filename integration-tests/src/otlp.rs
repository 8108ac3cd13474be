//! Traces as a backend receives them, for the sampling test and the volume measurement:
//! an OTLP/HTTP sink that decodes every export request (gzip or not) and keeps each span's
//! trace id, name and attributes, with the bytes and spans received; and the repository's
//! OpenTelemetry Collector configuration (`deploy/otel-collector/config.yaml`) run by the
//! local stack's collector binary (Jaeger v2's, `.local/jaeger/bin/jaeger`) in front of it.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue as AnyValueMsg, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::standin::read_request;
use crate::workspace_root;

/// One span as received.
#[derive(Debug, Clone)]
pub struct SpanSeen {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    /// Its span id and its parent's (hex; empty for a root).
    pub span_id: String,
    pub parent_span_id: String,
    /// The span ids (hex) of the spans it links to (a consumer's `process` span links to
    /// its batch's `receive`, which may be in another trace).
    pub links: Vec<String>,
    /// Start and end, nanoseconds since the Unix epoch, as the exporter stamped them.
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Received {
    pub requests: u64,
    /// Request bodies as sent (compressed when the sender compressed them).
    pub wire_bytes: u64,
    /// The same bodies as protobuf, uncompressed.
    pub proto_bytes: u64,
    pub spans: u64,
    /// Spans by trace id (hex).
    pub traces: BTreeMap<String, Vec<SpanSeen>>,
    pub last_at: Option<Instant>,
}

/// An OTLP/HTTP traces endpoint on a free loopback port (`POST /v1/traces`).
pub struct OtlpSink {
    pub addr: String,
    received: Arc<Mutex<Received>>,
}

impl OtlpSink {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let received = Arc::new(Mutex::new(Received::default()));
        let shared = received.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Self { addr, received })
    }

    /// The traces endpoint for Herald's `telemetry.traces_endpoint`.
    pub fn traces_endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    pub fn received(&self) -> Received {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets what was received (between two phases of a measurement).
    pub fn reset(&self) {
        *self.received.lock().unwrap_or_else(|e| e.into_inner()) = Received::default();
    }

    /// Waits until nothing has arrived for `quiet` (the exporters have flushed), at most
    /// `timeout`; returns what was received.
    pub async fn settled(&self, quiet: Duration, timeout: Duration) -> Result<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.received();
            let idle = r.last_at.is_none_or(|t| t.elapsed() >= quiet);
            if idle && r.last_at.is_some() {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                bail!(
                    "the OTLP sink did not settle within {timeout:?} ({} spans so far)",
                    r.spans
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn serve(mut s: TcpStream, received: Arc<Mutex<Received>>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(req) = read_request(&mut s, &mut buf).await {
        let body_at = req
            .raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |p| p + 4);
        let wire = &req.raw[body_at..];
        let gzip = req.head.lines().any(|l| {
            l.strip_prefix("content-encoding:")
                .is_some_and(|v| v.trim() == "gzip")
        });
        let status = match record(wire, gzip, &received) {
            Ok(()) => "200 OK",
            Err(_) => "400 Bad Request",
        };
        // An empty ExportTraceServiceResponse: nothing rejected.
        let response =
            format!("HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
        if s.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn record(wire: &[u8], gzip: bool, received: &Mutex<Received>) -> Result<()> {
    let proto = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(wire)
            .read_to_end(&mut out)
            .context("gunzip")?;
        out
    } else {
        wire.to_vec()
    };
    let request =
        ExportTraceServiceRequest::decode(proto.as_slice()).context("decoding the export request")?;
    let mut r = received.lock().unwrap_or_else(|e| e.into_inner());
    r.requests += 1;
    r.wire_bytes += wire.len() as u64;
    r.proto_bytes += proto.len() as u64;
    for span in request
        .resource_spans
        .iter()
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| &ss.spans)
    {
        let trace_id = hex(&span.trace_id);
        let attributes = span
            .attributes
            .iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(AnyValue::StringValue(s)) => s.clone(),
                    Some(AnyValue::BoolValue(b)) => b.to_string(),
                    Some(AnyValue::IntValue(i)) => i.to_string(),
                    Some(AnyValue::DoubleValue(d)) => d.to_string(),
                    Some(other) => format!("{other:?}"),
                    None => String::new(),
                };
                (kv.key.clone(), v)
            })
            .collect();
        r.spans += 1;
        r.traces.entry(trace_id).or_default().push(SpanSeen {
            name: span.name.clone(),
            attributes,
            span_id: hex(&span.span_id),
            parent_span_id: hex(&span.parent_span_id),
            links: span.links.iter().map(|l| hex(&l.span_id)).collect(),
            start_ns: span.start_time_unix_nano,
            end_ns: span.end_time_unix_nano,
        });
    }
    r.last_at = Some(Instant::now());
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span to export by hand (`export`): its trace id (32 hex digits), name and string
/// attributes.
pub struct SpanOut<'a> {
    pub trace_id: &'a str,
    pub name: &'a str,
    pub attributes: &'a [(&'a str, &'a str)],
}

/// Exports `spans` to the OTLP/HTTP receiver at `addr` (`POST /v1/traces`, protobuf), as a
/// Herald would; fails unless it answers 200.
pub async fn export(addr: &str, spans: &[SpanOut<'_>]) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let spans = spans
        .iter()
        .map(|s| {
            let trace_id = (0..16)
                .map(|i| u8::from_str_radix(&s.trace_id[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()?;
            Ok(Span {
                trace_id,
                span_id: uuid::Uuid::new_v4().as_bytes()[..8].to_vec(),
                name: s.name.to_owned(),
                kind: 1,
                start_time_unix_nano: now - 1_000_000,
                end_time_unix_nano: now,
                attributes: s
                    .attributes
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: (*k).to_owned(),
                        value: Some(AnyValueMsg {
                            value: Some(AnyValue::StringValue((*v).to_owned())),
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        })
        .collect::<Result<Vec<Span>>>()?;
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let answer = crate::http::exchange(
        addr,
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/x-protobuf")],
        &request.encode_to_vec(),
    )
    .await?;
    anyhow::ensure!(answer.status == 200, "OTLP export answered {}", answer.status);
    Ok(())
}

/// Settings of one collector run (the configuration's environment variables).
pub struct CollectorSettings<'a> {
    pub backend: &'a str,
    pub routine_percent: f64,
    pub decision_wait: Duration,
}

/// `deploy/otel-collector/config.yaml` run by the local stack's collector binary, its
/// receivers and metrics on free loopback ports. Stopped (SIGKILL) on drop.
pub struct Collector {
    child: Child,
    pub otlp_http: String,
    pub metrics: String,
    pub log_path: std::path::PathBuf,
}

/// A free loopback port (bound, then released for the collector to take).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn collector_binary() -> std::path::PathBuf {
    workspace_root().join(".local/jaeger/bin/jaeger")
}

pub fn collector_config() -> std::path::PathBuf {
    workspace_root().join("deploy/otel-collector/config.yaml")
}

impl Collector {
    pub async fn start(settings: CollectorSettings<'_>, log_path: std::path::PathBuf) -> Result<Self> {
        let (grpc, http, metrics) = (free_port()?, free_port()?, free_port()?);
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(collector_binary())
            .arg("--config")
            .arg(collector_config())
            .env("OTLP_LISTEN_HOST", "127.0.0.1")
            .env("OTLP_GRPC_PORT", grpc.to_string())
            .env("OTLP_HTTP_PORT", http.to_string())
            .env("METRICS_HOST", "127.0.0.1")
            .env("METRICS_PORT", metrics.to_string())
            .env("TRACES_BACKEND", settings.backend)
            .env("ROUTINE_TRACES_PERCENT", settings.routine_percent.to_string())
            .env(
                "DECISION_WAIT",
                format!("{}ms", settings.decision_wait.as_millis()),
            )
            .env("MEMORY_LIMIT_MIB", "1024")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", collector_binary().display()))?;
        let mut c = Self {
            child,
            otlp_http: format!("127.0.0.1:{http}"),
            metrics: format!("127.0.0.1:{metrics}"),
            log_path,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.child.try_wait()? {
                bail!(
                    "the collector exited ({status}): {}",
                    std::fs::read_to_string(&c.log_path).unwrap_or_default()
                );
            }
            if TcpStream::connect(&c.otlp_http).await.is_ok() {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                bail!("the collector's OTLP receiver did not open {}", c.otlp_http);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The traces endpoint for Herald's `telemetry.traces_endpoint`.
    pub fn traces_endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.otlp_http)
    }

    /// Traces the tail sampler has decided so far, kept and dropped (from the collector's
    /// own metrics).
    pub async fn decisions(&self) -> Result<(u64, u64)> {
        let text = crate::http::scrape(&self.metrics).await?;
        let count = |sampled: &str| {
            crate::http::metric(
                &text,
                "otelcol_processor_tail_sampling_global_count_traces_sampled_total",
                &[&format!("sampled=\"{sampled}\"")],
            ) as u64
        };
        Ok((count("true"), count("false")))
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
