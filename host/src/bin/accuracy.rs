//! `accuracy`: what each GPU precision costs in accuracy, against the FP32
//! CPU reference, on a seeded random GPT-2 124M checkpoint (the seeds'
//! error table; docs/precision.md).
//!
//! ```text
//! cargo run --release -p host --bin accuracy -- --json accuracy.json
//! ```
//!
//! Per precision (fp32, tf32, bf16):
//! - logits of every position of a B x T prompt: max abs error and RMSE
//!   against the CPU's, and the largest reference logit for scale;
//! - greedy agreement over `--tokens` generated tokens: the CPU's greedy
//!   continuation is the reference; fed that sequence (teacher forcing),
//!   the share of steps whose argmax equals the reference's next token, and
//!   where free-running greedy generation first leaves it;
//! - perplexity of the sample text (sliding windows) and its relative
//!   difference from the CPU's.
//!
//! Random weights give near-flat next-token distributions, where a small
//! error flips the argmax far more often than with trained weights: the
//! agreement numbers are a pessimistic bound for a real checkpoint.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};

use host::cli::main_with;
use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision};
use host::model::fixtures::llmc_bytes;
use host::model::{DType, ModelConfig};
use host::perplexity::perplexity;
use host::tokenizer::Gpt2Tokenizer;

/// Error of each GPU precision against the FP32 CPU reference.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Seed of the random checkpoint and the prompts.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Prompt rows and positions of the logits comparison.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    positions: usize,
    /// Tokens of the greedy comparison (after a 16-token prompt).
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Text whose perplexity is compared.
    #[arg(long, default_value = "tests/data/perplexity_sample.txt")]
    text: PathBuf,
    /// Perplexity window and stride (tokens).
    #[arg(long, default_value_t = 256)]
    window: usize,
    #[arg(long, default_value_t = 128)]
    stride: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Also write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Tokens of the greedy comparison's prompt.
const GREEDY_PROMPT: usize = 16;

fn main() -> ExitCode {
    main_with(run)
}

/// Logits error of `got` against `want` over the real vocabulary of each
/// row: (max abs, RMSE, max |want|).
fn logit_error(got: &[f32], want: &[f32], v: usize, vp: usize) -> (f64, f64, f64) {
    let (mut max_abs, mut sq, mut scale, mut n) = (0f64, 0f64, 0f64, 0usize);
    for (g, w) in got.chunks(vp).zip(want.chunks(vp)) {
        for (&a, &b) in g[..v].iter().zip(&w[..v]) {
            let d = (a as f64 - b as f64).abs();
            max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d });
            sq += d * d;
            scale = scale.max((b as f64).abs());
            n += 1;
        }
    }
    (max_abs, (sq / n.max(1) as f64).sqrt(), scale)
}

/// The greedy continuation of `prompt` (one row) for `steps` tokens.
fn greedy(m: &mut dyn Backend, prompt: &[u32], steps: usize) -> Result<Vec<u32>> {
    let mut out = Vec::with_capacity(steps);
    m.forward(prompt, 1, prompt.len(), 0, LogitsWanted::Last)?;
    for s in 0..steps {
        let id = m.argmax()?[0];
        out.push(id);
        if s + 1 < steps {
            m.forward(&[id], 1, 1, prompt.len() + s, LogitsWanted::Last)?;
        }
    }
    Ok(out)
}

/// Steps where `m`, fed `prompt` then `reference`, predicts the reference's
/// next token.
fn teacher_forced_agreement(m: &mut dyn Backend, prompt: &[u32], reference: &[u32]) -> Result<usize> {
    let mut agree = 0;
    m.forward(prompt, 1, prompt.len(), 0, LogitsWanted::Last)?;
    for (s, &want) in reference.iter().enumerate() {
        agree += usize::from(m.argmax()?[0] == want);
        if s + 1 < reference.len() {
            m.forward(&[want], 1, 1, prompt.len() + s, LogitsWanted::Last)?;
        }
    }
    Ok(agree)
}

fn run(cli: Cli) -> Result<()> {
    let cfg = ModelConfig::GPT2_124M;
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let bytes = llmc_bytes(&cfg, cli.seed, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    let tokenizer = Gpt2Tokenizer::default_files().context("loading the GPT-2 tokenizer")?;
    let text = std::fs::read_to_string(&cli.text).with_context(|| format!("reading {}", cli.text.display()))?;
    let text_ids = tokenizer.encode(&text)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cli.seed);
    let (b, t) = (cli.batch, cli.positions);
    let prompt: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..v as u32)).collect();
    let greedy_prompt: Vec<u32> = (0..GREEDY_PROMPT).map(|_| rng.random_range(0..v as u32)).collect();
    let max_t = cfg.max_seq_len;
    anyhow::ensure!(
        t <= max_t && GREEDY_PROMPT + cli.tokens <= max_t && cli.window <= max_t,
        "sizes exceed the context of {max_t}"
    );

    eprintln!("CPU reference (FP32)...");
    let mut cpu = CpuModel::new(&weights, b, max_t)?;
    cpu.forward(&prompt, b, t, 0, LogitsWanted::All)?;
    let ref_logits = cpu.logits()?;
    let reference = greedy(&mut cpu, &greedy_prompt, cli.tokens)?;
    let ref_ppl = perplexity(&mut cpu, &text_ids, cli.window, cli.stride)?.perplexity();

    let gpu_name = Gpu::new(cli.device)?.name().to_string();
    println!(
        "device {gpu_name}; GPT-2 124M random weights (seed {}); logits over {b} x {t} positions; \
         greedy over {} tokens; perplexity of {} ({} tokens, window {}, stride {}): CPU FP32 {ref_ppl:.3}",
        cli.seed,
        cli.tokens,
        cli.text.display(),
        text_ids.len(),
        cli.window,
        cli.stride
    );
    println!(
        "{:>6} {:>12} {:>12} {:>10} {:>14} {:>16} {:>12} {:>12}",
        "prec", "max abs", "rmse", "max |ref|", "greedy agree", "first diverge", "perplexity", "rel diff"
    );
    let mut rows = Vec::new();
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let gpu = Gpu::new(cli.device)?;
        let mut eng = GpuEngine::new(gpu, &weights, b, max_t, precision)?;
        eng.forward(&prompt, b, t, 0, LogitsWanted::All)?;
        let (max_abs, rmse, scale) = logit_error(&eng.logits()?, &ref_logits, v, vp);
        let agree = teacher_forced_agreement(&mut eng, &greedy_prompt, &reference)?;
        let free = greedy(&mut eng, &greedy_prompt, cli.tokens)?;
        let diverge = free.iter().zip(&reference).position(|(a, b)| a != b);
        let ppl = perplexity(&mut eng, &text_ids, cli.window, cli.stride)?.perplexity();
        let rel = (ppl - ref_ppl) / ref_ppl;
        let name = format!("{precision:?}").to_lowercase();
        let diverge_s = diverge.map_or("never".to_string(), |d| d.to_string());
        println!(
            "{name:>6} {max_abs:>12.3e} {rmse:>12.3e} {scale:>10.3} {:>13.1}% {diverge_s:>16} {ppl:>12.3} {rel:>12.2e}",
            100.0 * agree as f64 / cli.tokens as f64
        );
        rows.push(serde_json::json!({
            "precision": name, "max_abs": max_abs, "rmse": rmse, "max_abs_ref": scale,
            "greedy_agree": agree, "greedy_tokens": cli.tokens, "first_divergence": diverge,
            "perplexity": ppl, "perplexity_cpu": ref_ppl, "perplexity_rel_diff": rel,
        }));
    }
    if let Some(path) = &cli.json {
        let doc = serde_json::json!({"device": gpu_name, "seed": cli.seed, "batch": b, "positions": t, "rows": rows});
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
