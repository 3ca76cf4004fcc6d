//! `host`: generate text with GPT-2 on the GPU (default) or the CPU reference.
//!
//! ```text
//! cargo run --release -p host -- "The meaning of life is"
//! cargo run --release -p host -- --cpu -n 20 --temperature 0 "Hello world"
//! ```
//!
//! Sampling defaults follow llama.cpp: temperature 0.8, top-k 40, top-p 0.95;
//! `--temperature 0` is greedy. One prompt streams its continuation as it is
//! produced; several prompts run as one batch and each continuation is
//! printed when the batch is done.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;

use host::cli::{BackendArgs, WeightsArgs, main_with};
use host::generate::StopReason;
use host::model::ModelConfig;
use host::prompt::{PromptLimits, check_prompts, positions_needed};
use host::sample::{Sampler, SamplingParams};
use host::tokenizer::Gpt2Tokenizer;

/// llama.cpp's default temperature.
const DEFAULT_TEMPERATURE: f32 = 0.8;
/// llama.cpp's default top-k.
const DEFAULT_TOP_K: usize = 40;
/// llama.cpp's default top-p.
const DEFAULT_TOP_P: f32 = 0.95;
/// Default number of tokens to generate per prompt.
const DEFAULT_MAX_TOKENS: usize = 64;

/// Generate text with GPT-2 (124M by default), on the GPU or the CPU.
#[derive(Parser, Debug)]
#[command(version, allow_negative_numbers = true)]
struct Cli {
    /// Prompt(s); several prompts run together as one batch.
    prompts: Vec<String>,
    /// Read a prompt from a file (the whole file is one prompt; repeatable).
    #[arg(long, value_name = "PATH")]
    prompt_file: Vec<PathBuf>,
    #[command(flatten)]
    weights: WeightsArgs,
    /// Tokens to generate per prompt.
    #[arg(short = 'n', long, default_value_t = DEFAULT_MAX_TOKENS)]
    max_tokens: usize,
    /// Sampling temperature; 0 = greedy (always the most likely token).
    #[arg(long, default_value_t = DEFAULT_TEMPERATURE)]
    temperature: f32,
    /// Sample among the k most likely tokens only (0 = no limit).
    #[arg(long, default_value_t = DEFAULT_TOP_K)]
    top_k: usize,
    /// Sample among the most likely tokens holding this probability mass (1 = no limit).
    #[arg(long, default_value_t = DEFAULT_TOP_P)]
    top_p: f32,
    /// Random seed (default: drawn at random and printed, so a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    backend: BackendArgs,
}

fn main() -> ExitCode {
    main_with(run)
}

fn run(cli: Cli) -> Result<()> {
    // Check everything about the request before the slow parts.
    if cli.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let mut texts = cli.prompts.clone();
    for path in &cli.prompt_file {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading prompt file {}", path.display()))?;
        texts.push(text.strip_suffix('\n').unwrap_or(&text).to_string());
    }
    if texts.is_empty() {
        bail!("no prompt given: pass the prompt as an argument (see --help)");
    }
    let mut sampler = Sampler::new(SamplingParams {
        temperature: cli.temperature,
        top_k: cli.top_k,
        top_p: cli.top_p,
        seed: cli.seed,
    })?;
    let tokenizer = Gpt2Tokenizer::default_files().context("loading the GPT-2 tokenizer")?;
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tokenizer.encode(t))
        .collect::<Result<_, _>>()
        .context("tokenizing the prompt")?;
    // An empty prompt fails here, before the checkpoint (maybe a download).
    check_prompts(&prompts, None)?;

    let (_, checkpoint) = cli.weights.open()?;
    let weights = checkpoint.weights()?;
    let config = weights.config;
    check_prompts(&prompts, Some(PromptLimits::of(&config)))?;
    // The KV cache only needs room for the longest prompt and its continuation.
    let max_seq_len = positions_needed(&prompts, cli.max_tokens, config.max_seq_len);
    let mut backend = cli.backend.backend(&weights, prompts.len(), max_seq_len)?;
    drop(weights);
    if cli.seed.is_none() && !sampler.is_greedy() {
        eprintln!(
            "seed: {} (pass --seed {} to repeat this run)",
            sampler.seed(),
            sampler.seed()
        );
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let streaming = prompts.len() == 1;
    let mut stream = tokenizer.stream_decoder();
    let mut write_error = None;
    if streaming {
        write!(out, "{}", texts[0])?;
        out.flush()?;
    }
    let result = backend.generate_batch(&prompts, cli.max_tokens, &mut sampler, &mut |_row, id| {
        if !streaming || write_error.is_some() {
            return;
        }
        let piece = stream.push(id).unwrap_or_default();
        if let Err(e) = write!(out, "{piece}").and_then(|_| out.flush()) {
            write_error = Some(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    if streaming {
        writeln!(out, "{}", stream.finish().unwrap_or_default())?;
    } else {
        for (i, (text, ids)) in texts.iter().zip(&result.tokens).enumerate() {
            writeln!(out, "--- prompt {} ---\n{text}{}", i + 1, tokenizer.decode(ids)?)?;
        }
    }
    out.flush()?;

    if result.hit_context_limit() {
        eprintln!(
            "stopped: reached the context window of {} tokens",
            config_window(backend.config(), max_seq_len)
        );
    }
    let ended = result.stop.iter().filter(|&&s| s == StopReason::EndOfText).count();
    if ended > 0 && prompts.len() > 1 {
        eprintln!("{ended} of {} rows ended with <|endoftext|>", prompts.len());
    }
    let decode_rate = result.generated as f64 / result.decode_time.as_secs_f64().max(f64::MIN_POSITIVE);
    eprintln!(
        "{} tokens generated ({:.1} tokens/s; prefill {:.2} ms, then {:.1} tokens/s)",
        result.generated,
        result.tokens_per_second(),
        result.prefill_time.as_secs_f64() * 1e3,
        decode_rate
    );
    Ok(())
}

/// The context window that stopped generation (the model's own, since the
/// cache is sized to fit the request otherwise).
fn config_window(config: &ModelConfig, max_seq_len: usize) -> usize {
    max_seq_len.min(config.max_seq_len)
}
