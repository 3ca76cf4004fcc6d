//! `serve_load`: a bounded load test of a running `serve` on the loopback
//! address. `--clients` threads each send streaming completions, one after
//! another, until `--requests` have been sent in all or `--duration`
//! seconds have passed; then it prints one JSON object: throughput
//! (completion tokens per second over the wall time), time to first token
//! and inter-token latency (p50/p99, milliseconds).
//!
//! ```text
//! cargo run --release -p host --bin serve_load -- --url http://127.0.0.1:8000 \
//!     --clients 8 --requests 64 --max-tokens 64
//! ```
//!
//! Inter-token latency is the gap between successive stream chunks that
//! carry text (a chunk is one token, except where a UTF-8 character spans
//! several).

use std::io::{BufRead, BufReader};
use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use serde_json::{Value, json};

use host::cli::main_with;

/// Upper bound of `--clients`.
const MAX_CLIENTS: usize = 1024;
/// Upper bound of `--requests`.
const MAX_REQUESTS: usize = 100_000;
/// Upper bound of `--duration` (seconds).
const MAX_DURATION_SECS: u64 = 3600;
/// Milliseconds per second.
const MS: f64 = 1e3;

/// Load-test a running `serve` (loopback only) and print JSON statistics.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// The server, as `serve` printed it (must be a loopback address).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Concurrent streaming clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// `max_tokens` of each request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// The prompt; request `i` appends " (i)" so prompts differ.
    #[arg(long, default_value = "The history of the city begins")]
    prompt: String,
    /// Sampling temperature of the requests (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Stop sending new requests after this many seconds.
    #[arg(long, default_value_t = 300)]
    duration: u64,
    /// Timeout of one request, in seconds.
    #[arg(long, default_value_t = 120)]
    request_timeout: u64,
}

/// What one request measured.
#[derive(Default)]
struct Sample {
    ttft: Option<Duration>,
    gaps: Vec<Duration>,
    tokens: usize,
}

fn main() -> ExitCode {
    main_with(run)
}

/// The `host:port` of an `http://` URL, checked to be a loopback address.
fn loopback_base(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("http://")
        .context("--url must start with http:// (the server speaks plain HTTP)")?;
    let authority = rest.trim_end_matches('/');
    ensure!(
        !authority.contains('/'),
        "--url must be the server's base address, like http://127.0.0.1:8000"
    );
    let addrs: Vec<_> = authority
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {authority}"))?
        .collect();
    ensure!(!addrs.is_empty(), "{authority} resolves to nothing");
    if let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        bail!("{authority} resolves to {a}, not a loopback address: this tool only loads a local server");
    }
    Ok(format!("http://{authority}"))
}

/// The `p` quantile (0..=1) of sorted values, nearest rank.
fn quantile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn stats_ms(mut values: Vec<f64>) -> Value {
    values.sort_by(f64::total_cmp);
    json!({
        "p50": quantile(&values, 0.5),
        "p99": quantile(&values, 0.99),
        "count": values.len(),
    })
}

fn one_request(agent: &ureq::Agent, url: &str, body: &Value) -> Result<Sample> {
    let start = Instant::now();
    let resp = match agent.post(url).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, r)) => {
            bail!("HTTP {code}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => return Err(e).context("sending the request"),
    };
    let mut sample = Sample::default();
    let mut last: Option<Instant> = None;
    let mut done = false;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).context("a stream chunk is not JSON")?;
        if let Some(err) = chunk.get("error") {
            bail!("the server sent an error: {err}");
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            sample.tokens = usize::try_from(n).unwrap_or(usize::MAX);
        }
        let has_text = chunk["choices"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
        if has_text {
            let now = Instant::now();
            match last {
                None => sample.ttft = Some(now - start),
                Some(prev) => sample.gaps.push(now - prev),
            }
            last = Some(now);
        }
    }
    ensure!(done, "the stream ended without [DONE]");
    Ok(sample)
}

fn run(cli: Cli) -> Result<()> {
    ensure!(
        (1..=MAX_CLIENTS).contains(&cli.clients),
        "--clients must be in 1..={MAX_CLIENTS}"
    );
    ensure!(
        (1..=MAX_REQUESTS).contains(&cli.requests),
        "--requests must be in 1..={MAX_REQUESTS}"
    );
    ensure!(
        (1..=MAX_DURATION_SECS).contains(&cli.duration),
        "--duration must be in 1..={MAX_DURATION_SECS} seconds"
    );
    ensure!(cli.max_tokens >= 1, "--max-tokens must be at least 1");
    let base = loopback_base(&cli.url)?;
    let url = format!("{base}/v1/completions");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(cli.request_timeout))
        .build();
    let deadline = Instant::now() + Duration::from_secs(cli.duration);
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..cli.clients {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= cli.requests || Instant::now() >= deadline {
                        break;
                    }
                    let body = json!({
                        "prompt": format!("{} ({i})", cli.prompt),
                        "max_tokens": cli.max_tokens,
                        "temperature": cli.temperature,
                        "stream": true,
                        "stream_options": {"include_usage": true},
                    });
                    match one_request(&agent, &url, &body) {
                        Ok(sample) => samples.lock().unwrap_or_else(|e| e.into_inner()).push(sample),
                        Err(e) => failures
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("request {i}: {e:#}")),
                    }
                }
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let samples = samples.into_inner().unwrap_or_else(|e| e.into_inner());
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let ttft: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.ttft)
        .map(|d| d.as_secs_f64() * MS)
        .collect();
    let itl: Vec<f64> = samples
        .iter()
        .flat_map(|s| &s.gaps)
        .map(|d| d.as_secs_f64() * MS)
        .collect();
    let report = json!({
        "url": base,
        "clients": cli.clients,
        "requests": samples.len() + failures.len(),
        "completed": samples.len(),
        "failed": failures.len(),
        "max_tokens": cli.max_tokens,
        "completion_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": if wall > 0.0 { tokens as f64 / wall } else { 0.0 },
        "ttft_ms": stats_ms(ttft),
        "itl_ms": stats_ms(itl),
        "errors": failures.iter().take(5).collect::<Vec<_>>(),
    });
    println!("{report}");
    ensure!(failures.is_empty(), "{} of the requests failed", failures.len());
    Ok(())
}
