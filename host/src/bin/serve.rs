//! `serve`: an OpenAI-compatible completions server with continuous batching.
//!
//! ```text
//! cargo run --release -p host --bin serve -- --port 8000
//! curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \
//!     -d '{"prompt": "The meaning of life is", "max_tokens": 20}'
//! ```
//!
//! The first line on stdout is the bound address (`http://HOST:PORT`), once
//! the model is loaded and the server accepts connections; `--port 0` picks
//! a free port. SIGINT or SIGTERM stops accepting, lets in-flight requests
//! finish (up to `--shutdown-grace` seconds, then cancels them) and exits 0.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;

use host::cli::{BackendArgs, WeightsArgs, main_with};
use host::cpu::CpuModel;
use host::gpu::Gpu;
use host::gpu::engine::GpuEngine;
use host::gpu::replicas::Replicas;
use host::serve::backend::SlotBackend;
use host::serve::engine::SchedulerConfig;
use host::serve::http::{AppState, ServerLimits};
use host::serve::{CANCEL_WAIT, run_server, start_engine};
use host::tokenizer::Gpt2Tokenizer;

/// Default port (as vLLM's).
const DEFAULT_PORT: u16 = 8000;
/// Default KV cache slots: sequences decoded together.
const DEFAULT_MAX_RUNNING: usize = 16;
/// Default number of prompts that may wait for a slot.
const DEFAULT_MAX_QUEUE: usize = 256;
/// Default prompt tokens prefilled between two decode steps.
const DEFAULT_PREFILL_CHUNK: usize = 256;
/// Default seconds in-flight requests get to finish at shutdown.
const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 30;
/// Worker threads of the HTTP runtime: the model runs on its own thread, so
/// the HTTP side needs little.
const HTTP_THREADS: usize = 2;

/// Serve GPT-2 over the OpenAI completions API (continuous batching).
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    weights: WeightsArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
    /// Port to listen on; 0 picks a free one (printed on stdout).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Sequences decoded together (KV cache slots).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_RUNNING)]
    max_running: usize,
    /// Prompts that may wait for a slot; beyond, requests get 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_QUEUE)]
    max_queue: usize,
    /// Positions per sequence, prompt + completion (default: the model's context).
    #[arg(long, value_name = "N")]
    max_seq_len: Option<usize>,
    /// Prompt tokens prefilled between two decode steps, over all new
    /// sequences (a long prompt is prefilled in chunks of this size).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PREFILL_CHUNK)]
    prefill_chunk: usize,
    /// The model name `/v1/models` lists.
    #[arg(long, value_name = "NAME", default_value = "gpt2")]
    model_name: String,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_SHUTDOWN_GRACE_SECS)]
    shutdown_grace: u64,
    /// Sleep this long after each scheduler iteration (for tests that need a
    /// sequence to hold its slot for a while).
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    step_delay_ms: u64,
    #[command(flatten)]
    backend: BackendArgs,
}

fn main() -> ExitCode {
    main_with(run)
}

fn run(cli: Cli) -> Result<()> {
    ensure!(cli.max_running > 0, "--max-running must be at least 1");
    ensure!(cli.max_queue > 0, "--max-queue must be at least 1");
    ensure!(cli.prefill_chunk > 0, "--prefill-chunk must be at least 1");
    if let Some(n) = cli.max_seq_len {
        ensure!(
            n >= 2,
            "--max-seq-len must be at least 2 (a prompt token and a completion token)"
        );
    }
    ensure!(
        !cli.backend.tensor_parallel,
        "the server does not run tensor-parallel yet: use --devices without --tensor-parallel (one replica a GPU)"
    );
    let tokenizer = Arc::new(Gpt2Tokenizer::default_files().context("loading the GPT-2 tokenizer")?);
    let (_, checkpoint) = cli.weights.open()?;
    let (slots, window, prefill_chunk) = (cli.max_running, cli.max_seq_len, cli.prefill_chunk);
    let backend = cli.backend.clone();
    let factory = move || -> Result<Box<dyn SlotBackend>> {
        let weights = checkpoint.weights()?;
        let max_seq_len = window.unwrap_or(weights.config.max_seq_len);
        if max_seq_len > weights.config.max_seq_len {
            bail!(
                "--max-seq-len {max_seq_len} exceeds the model's context window of {} positions",
                weights.config.max_seq_len
            );
        }
        if backend.cpu {
            let mut model = CpuModel::new(&weights, slots, max_seq_len)?;
            model.set_attention_window(backend.attention_window);
            return Ok(Box::new(model));
        }
        // Activations for one prefill chunk plus one decode row a slot (the
        // two run in one call): the cache holds the sequences.
        let rows = prefill_chunk.min(max_seq_len) + slots;
        let gpus = backend.gpus()?;
        if gpus.len() > 1 {
            // Data parallel: the slots spread over one replica per GPU.
            let precision = backend.precision.into();
            let mut replicas = Replicas::for_slots(&gpus, &weights, slots, max_seq_len, rows, precision)?;
            let window = backend.attention_window;
            replicas.with_each(move |_, e| {
                e.set_attention_window(window);
                Ok(())
            })?;
            return Ok(Box::new(replicas));
        }
        let &device = gpus.first().context("no GPU listed")?;
        let gpu = Gpu::new(device)?;
        let mut engine = GpuEngine::with_rows(gpu, &weights, slots, max_seq_len, rows, backend.precision.into())?;
        engine.set_attention_window(backend.attention_window);
        engine.check_slots()?;
        Ok(Box::new(engine))
    };
    let scheduler = SchedulerConfig {
        prefill_chunk: cli.prefill_chunk,
        step_delay: Duration::from_millis(cli.step_delay_ms),
    };
    let engine = start_engine(factory, Arc::clone(&tokenizer), scheduler)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(HTTP_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let state = Arc::new(AppState::new(
        engine.commands.clone(),
        tokenizer,
        Arc::clone(&engine.metrics),
        cli.model_name.clone(),
        ServerLimits {
            max_seq_len: engine.max_seq_len,
            vocab_size: engine.vocab_size,
            slots: engine.slots,
            max_queue: cli.max_queue,
        },
    ));
    let grace = Duration::from_secs(cli.shutdown_grace);
    runtime.block_on(async {
        let addr = SocketAddr::new(cli.host, cli.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener.local_addr().context("reading the bound address")?;
        // The first line on stdout: scripts and tests wait for it.
        let mut out = std::io::stdout().lock();
        writeln!(out, "http://{bound}").and_then(|()| out.flush())?;
        drop(out);
        eprintln!(
            "serving {} on http://{bound} ({} slots of {} positions, queue {})",
            cli.model_name, engine.slots, engine.max_seq_len, cli.max_queue
        );
        run_server(listener, state, grace).await
    })?;
    // Ends the connection tasks a cancelled shutdown left, and with them the
    // last handles on the engine's channel, so the engine thread can end.
    runtime.shutdown_timeout(CANCEL_WAIT);
    engine.join()?;
    eprintln!("stopped");
    Ok(())
}
