//! `perplexity`: how well GPT-2 predicts a text file, by the sliding-window
//! method (see `host::perplexity`).
//!
//! ```text
//! cargo run --release -p host --bin perplexity -- tests/data/perplexity_sample.txt
//! cargo run --release -p host --bin perplexity -- --cpu --window 256 --stride 128 FILE
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use host::cli::{BackendArgs, WeightsArgs, main_with};
use host::perplexity::{MIN_TOKENS, PerplexityConfig, perplexity_with, plan_windows};
use host::prompt::first_out_of_vocab;
use host::tokenizer::Gpt2Tokenizer;

/// Windows per forward call and GPU unless `--batch` says otherwise (with
/// several `--devices`, every replica gets this many).
const DEFAULT_GPU_BATCH: usize = 4;
/// Windows per forward call on the CPU (batching gains nothing there).
const DEFAULT_CPU_BATCH: usize = 1;
/// Default stride as a fraction of the window: `window / STRIDE_DIVISOR`.
const STRIDE_DIVISOR: usize = 2;

/// Perplexity of GPT-2 (124M by default) on a text file, on the GPU or the CPU.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// UTF-8 text file to evaluate (tokenized with the GPT-2 tokenizer).
    file: PathBuf,
    #[command(flatten)]
    weights: WeightsArgs,
    /// Tokens per window (default: the model's context, 1024 for GPT-2).
    #[arg(long, value_name = "N")]
    window: Option<usize>,
    /// Tokens between window starts (default: half the window).
    #[arg(long, value_name = "N")]
    stride: Option<usize>,
    /// Windows per forward call (default: 4 per GPU, 1 on the CPU).
    #[arg(long, value_name = "N")]
    batch: Option<usize>,
    #[command(flatten)]
    backend: BackendArgs,
}

fn main() -> ExitCode {
    main_with(run)
}

fn run(cli: Cli) -> Result<()> {
    // Check the flags that need no model before the slow parts.
    if cli.window == Some(0) {
        bail!("--window must be at least 1");
    }
    if cli.stride == Some(0) {
        bail!("--stride must be at least 1");
    }
    if cli.batch == Some(0) {
        bail!("--batch must be at least 1");
    }
    let text = std::fs::read_to_string(&cli.file).with_context(|| format!("reading {}", cli.file.display()))?;
    if text.trim().is_empty() {
        bail!("{} is empty (or only whitespace)", cli.file.display());
    }
    let tokenizer = Gpt2Tokenizer::default_files().context("loading the GPT-2 tokenizer")?;
    let tokens = tokenizer
        .encode(&text)
        .with_context(|| format!("tokenizing {}", cli.file.display()))?;
    if tokens.len() < MIN_TOKENS {
        bail!(
            "{} has {} token(s); at least {MIN_TOKENS} are needed to measure perplexity",
            cli.file.display(),
            tokens.len()
        );
    }

    let (path, checkpoint) = cli.weights.open()?;
    let weights = checkpoint.weights()?;
    let vocab = weights.config.vocab_size;
    if let Some((_, bad)) = first_out_of_vocab(&tokens, vocab) {
        bail!(
            "{} tokenizes to id {bad}, outside the vocabulary of {vocab} of {} (the GPT-2 tokenizer needs a model with {} tokens)",
            cli.file.display(),
            path.display(),
            tokenizer.vocab_size()
        );
    }
    let context = weights.config.max_seq_len;
    let window = cli.window.unwrap_or(context);
    if window > context {
        bail!("--window {window} is larger than the model's context of {context} tokens");
    }
    let stride = cli.stride.unwrap_or((window / STRIDE_DIVISOR).max(1));
    if stride > window {
        bail!("--stride {stride} is larger than the window of {window} tokens");
    }
    // Checks window >= 2 and every other combination before any allocation.
    let windows = plan_windows(tokens.len(), window, stride)?;
    let gpus = cli.backend.gpus()?;
    let default_batch = if cli.backend.cpu {
        DEFAULT_CPU_BATCH
    } else {
        DEFAULT_GPU_BATCH * gpus.len()
    };
    let batch = cli.batch.unwrap_or(default_batch).min(windows.len());
    // No window is longer than the text, so the cache need not be either.
    let seq_len = window.min(tokens.len());
    let mut backend = cli.backend.backend(&weights, batch, seq_len)?;
    drop(weights);

    eprintln!(
        "{}: {} tokens, {} window(s) of {window} tokens, stride {stride}, {} on the {}",
        cli.file.display(),
        tokens.len(),
        windows.len(),
        if batch == 1 {
            "one window per call".to_string()
        } else {
            format!("{batch} windows per call")
        },
        match gpus.len() {
            0 => "CPU".to_string(),
            1 => "GPU".to_string(),
            n => format!("{n} GPUs (data parallel)"),
        },
    );
    let bar = ProgressBar::new(windows.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} windows [{elapsed_precise}]")
            .context("progress bar template")?,
    );
    let config = PerplexityConfig { window, stride, batch };
    let report = perplexity_with(backend.as_mut(), &tokens, &config, |done, _| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    let report = report?;

    println!("perplexity: {:.4}", report.perplexity());
    println!("mean NLL:   {:.6} nats/token", report.mean_nll());
    println!(
        "scored {} tokens in {} window(s) ({} positions run) in {:.2} s: {:.1} tokens/s",
        report.tokens_scored,
        report.windows,
        report.positions,
        report.elapsed.as_secs_f64(),
        report.tokens_per_second()
    );
    Ok(())
}
