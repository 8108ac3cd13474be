//! How every HTTP listener of Herald (HTTP ingest, admin, probes) treats its connections,
//! whoever opens them:
//! - at most `max_connections` at once: one more is closed as soon as it is accepted;
//! - a request's headers within `header_read_timeout` (hyper's own timer). hyper starts it
//!   when the connection opens and again when an answer has been written, so it also
//!   closes a kept-alive connection that sends no next request in that time;
//! - a connection that moves no byte either way for `idle_timeout` is closed: a body that
//!   never arrives, an answer the client does not read. Not while Herald is working on a
//!   request whose body has all arrived (a slow store call or Kafka read is not the
//!   client's idleness).
//!
//! A client that opens connections and never finishes its headers holds a slot for one
//! header timeout, not forever. Counted per listener: `herald_http_connections` (open
//! now) and `herald_http_connections_closed_total{reason}` (`limit`, `header_timeout`,
//! `idle`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::Service;

use crate::shutdown::Shutdown;

/// One listener's connection discipline (`[listeners]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// What a listener is called in logs and metrics (`listener` label).
pub type Name = &'static str;

/// How long shutdown waits for connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until shutdown: requests in flight are finished (for up to
/// [`DRAIN`]); idle connections are closed at once.
pub async fn serve(
    name: Name,
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<herald_telemetry::Metrics>,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    metrics.init_http_listener(name);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut refused_logged = Instant::now() - Duration::from_secs(60);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        // Ended connections' tasks, reaped so that the set holds only open ones.
        while tasks.try_join_next().is_some() {}
        let (stream, _) = tokio::select! {
            _ = shutdown.requested() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: the process is out of descriptors; wait, not spin.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.http_connection_closed(name, "limit");
            if refused_logged.elapsed() >= Duration::from_secs(10) {
                refused_logged = Instant::now();
                tracing::warn!(
                    listener = name,
                    max_connections = limits.max_connections,
                    "connection limit reached: new connections are closed until others end"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let metrics = metrics.clone();
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            // Counted out and its slot freed however the task ends (a handler's panic, or
            // its abort after the drain, too).
            let open = Open::new(name, metrics);
            connection(name, stream, app, limits, &open.metrics, stop).await;
            drop((open, slot));
        });
    }
    // Closing: no new connections; each open one finishes its request in flight.
    drop(listener);
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            open = limits.max_connections - slots.available_permits(),
            "connections still open after the drain: closed"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    Ok(())
}

/// One open connection in `herald_http_connections`, until dropped.
struct Open {
    name: Name,
    metrics: Arc<herald_telemetry::Metrics>,
}

impl Open {
    fn new(name: Name, metrics: Arc<herald_telemetry::Metrics>) -> Self {
        metrics.http_connection_opened(name);
        Self { name, metrics }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.http_connection_ended(self.name);
    }
}

/// Serves one connection until the client closes it, a timeout closes it, or shutdown.
async fn connection(
    name: Name,
    stream: TcpStream,
    app: Router,
    limits: Limits,
    metrics: &herald_telemetry::Metrics,
    mut stop: watch::Receiver<bool>,
) {
    let started = Instant::now();
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
        started,
    });
    let service = Requests {
        app,
        activity: activity.clone(),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).max(Duration::from_millis(100));
    let mut shutting_down = false;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    if e.is_timeout() {
                        metrics.http_connection_closed(name, "header_timeout");
                    } else {
                        tracing::debug!(listener = name, error = %e, "connection ended with an error");
                    }
                }
                return;
            }
            changed = stop.changed(), if !shutting_down => {
                if changed.is_err() || *stop.borrow() {
                    shutting_down = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = tokio::time::sleep(tick) => {
                if activity.idle_for(started) >= limits.idle_timeout {
                    metrics.http_connection_closed(name, "idle");
                    return;
                }
            }
        }
    }
}

/// When a connection last moved a byte, and its requests being answered.
#[derive(Default)]
struct Activity {
    /// Milliseconds from the connection's start.
    last_ms: AtomicU64,
    /// Requests called and not yet answered.
    answering: AtomicUsize,
    /// Of those, requests whose body has not all arrived.
    receiving: AtomicUsize,
}

impl Activity {
    fn touch(&self, started: Instant) {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long nothing moved; zero while Herald works on a request it has whole.
    fn idle_for(&self, started: Instant) -> Duration {
        if self.answering.load(Ordering::Relaxed) > self.receiving.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        started.elapsed().saturating_sub(last)
    }
}

/// The socket, noting each byte moved.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
    started: Instant,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch(self.started);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch(self.started);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router, as hyper calls a service, counting the requests being answered.
#[derive(Clone)]
struct Requests {
    app: Router,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Requests {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        // Router is always ready (axum documents it): no poll_ready needed.
        let mut app = self.app.clone();
        let activity = self.activity.clone();
        activity.answering.fetch_add(1, Ordering::Relaxed);
        let answering = Answering(activity.clone());
        let receiving = !hyper::body::Body::is_end_stream(request.body());
        if receiving {
            activity.receiving.fetch_add(1, Ordering::Relaxed);
        }
        let request = request.map(|body| {
            axum::body::Body::new(Tracked {
                inner: body,
                activity: receiving.then_some(activity),
            })
        });
        Box::pin(async move {
            let _answering = answering;
            app.call(request).await
        })
    }
}

/// Ends "answering" when the request's future ends or is dropped (the client went away).
struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's body, saying when it has all arrived (or is dropped unread).
struct Tracked {
    inner: Incoming,
    /// Set until the body ends.
    activity: Option<Arc<Activity>>,
}

impl Tracked {
    fn ended(&mut self) {
        if let Some(a) = self.activity.take() {
            a.receiving.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl hyper::body::Body for Tracked {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.ended();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.ended();
    }
}
