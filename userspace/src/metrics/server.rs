//! The `/metrics` endpoint: HTTP/1.1 (hyper) on a thread and a one-thread
//! runtime of its own. Bounded whatever the scrapers do: a few connections at
//! once (the rest wait in the kernel's accept backlog), a deadline to send the
//! request head and one for the whole connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Notify, Semaphore};

use super::Metrics;
use crate::error::UserError;

/// Connections served at once.
const CONNECTIONS: usize = 4;
/// A client must send its request head within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection is closed after this, whatever it is doing (keep-alive scrapers reconnect).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// The text exposition format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves until dropped.
pub struct Server {
    shutdown: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub addr: SocketAddr,
}

impl Server {
    /// Binds `addr` now (so a port in use is an error before anything
    /// attaches) and serves `metrics` from a thread.
    pub fn start(addr: SocketAddr, metrics: Metrics) -> Result<Self, UserError> {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                UserError::new(
                    format!("--prometheus {addr}: cannot listen there: {e}"),
                    "give an address of this host and a port nothing else uses, e.g. --prometheus 127.0.0.1:9466",
                )
            })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| {
                UserError::new(
                    format!("--prometheus: cannot start its runtime: {e}"),
                    "free memory or threads and start again",
                )
            })?;
        let shutdown = Arc::new(Notify::new());
        let stop = Arc::clone(&shutdown);
        let thread = std::thread::Builder::new()
            .name("prometheus".into())
            .spawn(move || runtime.block_on(serve(listener, metrics, stop)))
            .map_err(|e| {
                UserError::new(
                    format!("--prometheus: cannot start its thread: {e}"),
                    "free memory or threads and start again",
                )
            })?;
        Ok(Self {
            shutdown,
            thread: Some(thread),
            addr,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, metrics: Metrics, shutdown: Arc<Notify>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let slots = Arc::new(Semaphore::new(CONNECTIONS));
    loop {
        let next = async {
            let slot = Arc::clone(&slots).acquire_owned().await;
            (slot, listener.accept().await)
        };
        let (slot, accepted) = tokio::select! {
            _ = shutdown.notified() => return,
            next = next => next,
        };
        let Ok(slot) = slot else { return };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors or the like: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| respond(req, metrics.clone()));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(slot);
        });
    }
}

async fn respond(
    req: Request<Incoming>,
    metrics: Metrics,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            CONTENT_TYPE,
            Bytes::from(metrics.render().to_string()),
        ),
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"stalltrace: metrics at /metrics\n"),
        ),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"not found: metrics are at /metrics\n"),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"only GET\n"),
        ),
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    Ok(response)
}
