//! An OpenAI-compatible completions server with continuous batching (the
//! `serve` binary).
//!
//! - [`backend`]: [`backend::SlotBackend`], the model interface of
//!   continuous batching (a KV cache of independent slots, each sequence at
//!   its own position), implemented by the CPU reference;
//! - [`engine`]: the scheduler thread that owns the backend;
//! - [`api`]: the request and reply bodies of the OpenAI API;
//! - [`http`]: the axum routes;
//! - here: starting the engine thread and running the server until
//!   SIGINT/SIGTERM.

pub mod api;
pub mod backend;
pub mod engine;
pub mod http;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::Notify;

use backend::SlotBackend;
use engine::{Command, Metrics, SchedulerConfig};
use http::AppState;

use crate::tokenizer::Gpt2Tokenizer;

/// After the grace period has cancelled what was left, how long the last
/// replies get to go out before the server stops waiting for them.
pub const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// The engine thread and what it reported when it started.
pub struct Engine {
    pub commands: Sender<Command>,
    pub metrics: Arc<Metrics>,
    pub slots: usize,
    pub max_seq_len: usize,
    pub vocab_size: usize,
    thread: JoinHandle<()>,
}

impl Engine {
    /// Waits for the engine thread to end (it ends once every command
    /// sender is dropped and its work is done).
    pub fn join(self) -> Result<()> {
        drop(self.commands);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the engine thread panicked"))
    }
}

/// Marks the engine stopped when its thread ends, also by a panic.
struct StoppedOnDrop(Arc<Metrics>);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.engine_stopped.store(true, Ordering::Relaxed);
    }
}

/// Starts the engine thread: it builds its backend with `factory` (on that
/// thread, since a GPU context belongs to one thread), reports the backend's
/// sizes (or the factory's error, returned here) and runs the scheduler.
pub fn start_engine<F>(factory: F, tokenizer: Arc<Gpt2Tokenizer>, config: SchedulerConfig) -> Result<Engine>
where
    F: FnOnce() -> Result<Box<dyn SlotBackend>> + Send + 'static,
{
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (commands, command_rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let thread_metrics = Arc::clone(&metrics);
    let thread = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            let _stopped = StoppedOnDrop(Arc::clone(&thread_metrics));
            let mut backend = match factory() {
                Ok(b) => b,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let sizes = (backend.slots(), backend.max_seq_len(), backend.config().vocab_size);
            if ready_tx.send(Ok(sizes)).is_ok() {
                engine::run(backend.as_mut(), &tokenizer, command_rx, config, &thread_metrics);
            }
        })
        .context("starting the engine thread")?;
    let (slots, max_seq_len, vocab_size) = ready_rx.recv().context("the engine thread ended while starting")??;
    Ok(Engine {
        commands,
        metrics,
        slots,
        max_seq_len,
        vocab_size,
        thread,
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Serves `state` on `listener` until SIGINT/SIGTERM; then stops accepting,
/// lets in-flight requests finish for up to `grace`, cancels what is left
/// and returns.
pub async fn run_server(listener: tokio::net::TcpListener, state: Arc<AppState>, grace: Duration) -> Result<()> {
    let signalled = Arc::new(Notify::new());
    let notify = Arc::clone(&signalled);
    let app = http::router(Arc::clone(&state));
    let mut server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                notify.notify_one();
            })
            .await
    });
    tokio::select! {
        result = &mut server => {
            return result.context("the HTTP server task failed")?.context("the HTTP server failed");
        }
        () = signalled.notified() => {}
    }
    eprintln!(
        "shutting down: no new connections; finishing in-flight requests (up to {} s)",
        grace.as_secs()
    );
    match tokio::time::timeout(grace, &mut server).await {
        Ok(result) => result
            .context("the HTTP server task failed")?
            .context("the HTTP server failed")?,
        Err(_) => {
            eprintln!("shutdown grace period over: cancelling the remaining requests");
            // The engine may already be gone; then nothing is left to cancel.
            let _ = state.commands.send(Command::CancelAll);
            if tokio::time::timeout(CANCEL_WAIT, &mut server).await.is_err() {
                server.abort();
            }
        }
    }
    Ok(())
}
