//! `bench replicas`: data-parallel throughput, one GPU against every listed
//! GPU (`--devices`, one replica each), in one process on GPT-2 124M with
//! random weights, FP32 and bf16: batch generation (greedy, wall clock
//! from the first forward call to the last token) and perplexity (windows
//! of the full context, a batch of them per forward call, each position's
//! NLL from the backend's `crossentropy` and summed on the host, as the
//! `perplexity` program does). Prints each rate and the speedup; returns
//! them all as JSON.
//!
//! Two scalings are timed against the one GPU: the same work split over the
//! replicas ("same total": each GPU gets a smaller batch, which runs less
//! efficiently), and the same batch on each GPU ("same per GPU": `n` times
//! the work, as `perplexity` does by default and as a server fills its
//! replicas).
//!
//! With fewer than two GPUs it says so and times two replicas on GPU 0:
//! that exercises the split and the gathering, not a speedup.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::bench::{median, wall_times};
use crate::generate::Backend;
use crate::gpu::Gpu;
use crate::gpu::engine::{GpuEngine, Precision};
use crate::gpu::replicas::{DeviceList, Replicas};
use crate::model::fixtures::llmc_bytes;
use crate::model::{DType, ModelConfig};
use crate::perplexity::{PerplexityConfig, perplexity_with};
use crate::sample::{Sampler, SamplingParams};

/// Checkpoint seed of the random GPT-2 124M (the e2e section's).
const CHECKPOINT_SEED: u64 = 124;
/// Seed of the prompts and of the perplexity text.
const TOKEN_SEED: u64 = 7;
/// Prompts generated for together on one GPU, one batch row each.
const GEN_PROMPTS: usize = 16;
/// Prompt tokens per row.
const GEN_PROMPT_LEN: usize = 64;
/// Tokens generated per row.
const GEN_TOKENS: usize = 64;
/// Perplexity: windows scored per run on one GPU (non-overlapping, the
/// full context each), and windows per forward call on one GPU.
const PPL_WINDOWS: usize = 16;
const PPL_BATCH: usize = 8;
/// Perplexity runs timed (each scores `PPL_WINDOWS` windows of 1024 tokens,
/// about a second on one GPU; min and max are reported beside the median).
const PPL_RUNS: usize = 5;
/// Devices timed on one GPU, for the logic only.
const FALLBACK_DEVICES: [usize; 2] = [0, 0];

/// Median, min and max of `times` (seconds).
fn spread(mut times: Vec<f64>) -> (f64, f64, f64) {
    let med = median(&mut times);
    (med, times[0], times[times.len() - 1])
}

/// One GPU (`devices.len() == 1`) or replicas on `devices`.
fn backend(
    devices: &[usize],
    config: &crate::model::Weights,
    max_batch: usize,
    max_seq_len: usize,
    precision: Precision,
) -> Result<Box<dyn Backend>> {
    Ok(if let [device] = devices {
        let gpu = Gpu::new(*device)?;
        Box::new(GpuEngine::new(gpu, config, max_batch, max_seq_len, precision)?)
    } else {
        Box::new(Replicas::new(devices, config, max_batch, max_seq_len, precision)?)
    })
}

/// The section: see the module's documentation. `samples` and `warmup`
/// apply to the generation runs (perplexity: `PPL_RUNS` runs after one warm-up).
pub fn bench_replicas(devices: &DeviceList, samples: usize, warmup: usize) -> Result<serde_json::Value> {
    let listed = devices.resolve()?;
    let (devices, note) = if listed.len() >= 2 {
        (listed, None)
    } else {
        let note = format!(
            "replicas: data parallelism needs 2 GPUs, {} listed; timing {} replicas on GPU 0 for the logic only (no speedup expected)",
            listed.len(),
            FALLBACK_DEVICES.len()
        );
        println!("{note}");
        (FALLBACK_DEVICES.to_vec(), Some(note))
    };
    let n = devices.len();
    let config = ModelConfig::GPT2_124M;
    let bytes = llmc_bytes(&config, CHECKPOINT_SEED, DType::F32)?;
    let weights = crate::model::llmc::parse(&bytes)?;
    let mut rng = StdRng::seed_from_u64(TOKEN_SEED);
    let vocab = config.vocab_size as u32;
    // Enough for the largest run: `n` times one GPU's work.
    let prompts: Vec<Vec<u32>> = (0..GEN_PROMPTS * n)
        .map(|_| (0..GEN_PROMPT_LEN).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let window = config.max_seq_len;
    let text: Vec<u32> = (0..PPL_WINDOWS * n * window)
        .map(|_| rng.random_range(0..vocab))
        .collect();
    println!("\n== replicas: GPT-2 124M random weights, 1 GPU against {n} replicas on GPUs {devices:?}");
    println!(
        "   one GPU: generate {GEN_PROMPTS} prompts x {GEN_TOKENS} greedy tokens after {GEN_PROMPT_LEN}, median of {samples} runs; perplexity {PPL_WINDOWS} windows of {window}, {PPL_BATCH} a call, median of {PPL_RUNS} runs"
    );
    println!(
        "   {n} GPUs: the same work (same total), and {n} times it (same per GPU: as many rows a GPU as the one GPU)"
    );
    println!(
        "{:>6} {:>10} {:>5} {:>13} {:>10} {:>10} {:>12} {:>9}",
        "prec", "what", "GPUs", "scaling", "median s", "min s", "tokens/s", "speedup"
    );
    let mut rows = Vec::new();
    for precision in [Precision::Fp32, Precision::Bf16] {
        let prec = format!("{precision:?}");
        let mut one_gpu: Vec<(&str, f64)> = Vec::new();
        // (GPUs, scaling, work multiple): one GPU, then the replicas both ways.
        for (set, scaling, times_work) in [
            (&devices[..1], "one GPU", 1),
            (&devices[..], "same total", 1),
            (&devices[..], "same per GPU", n),
        ] {
            let gpus = set.len();
            // Generation.
            let batch = &prompts[..GEN_PROMPTS * times_work];
            let mut b = backend(set, &weights, batch.len(), GEN_PROMPT_LEN + GEN_TOKENS, precision)?;
            let mut generated = 0;
            let times = wall_times(warmup, samples, || {
                let mut sampler = Sampler::new(SamplingParams::GREEDY)?;
                generated = b
                    .generate_batch(batch, GEN_TOKENS, &mut sampler, &mut |_, _| {})?
                    .generated;
                Ok(())
            })?;
            drop(b);
            let (median, min, _) = spread(times);
            let rate = generated as f64 / median;
            // Perplexity.
            let ppl = PerplexityConfig {
                window,
                stride: window,
                batch: PPL_BATCH * times_work,
            };
            let mut b = backend(set, &weights, ppl.batch, window, precision)?;
            let text = &text[..PPL_WINDOWS * times_work * window];
            let mut scored = 0;
            let times = wall_times(1, PPL_RUNS, || {
                scored = perplexity_with(b.as_mut(), text, &ppl, |_, _| {})?.tokens_scored;
                Ok(())
            })?;
            drop(b);
            let (ppl_median, ppl_min, _) = spread(times);
            let ppl_rate = scored as f64 / ppl_median;
            for (what, med, min, rate) in [
                ("generate", median, min, rate),
                ("perplexity", ppl_median, ppl_min, ppl_rate),
            ] {
                if gpus == 1 {
                    one_gpu.push((what, rate));
                }
                let one = one_gpu.iter().find(|(w, _)| *w == what).map(|&(_, r)| r);
                let speedup = one.map_or(1.0, |one| rate / one);
                println!(
                    "{prec:>6} {what:>10} {gpus:>5} {scaling:>13} {med:>10.4} {min:>10.4} {rate:>12.0} {speedup:>8.2}x"
                );
                rows.push(json!({
                    "precision": prec, "what": what, "gpus": gpus, "devices": set, "scaling": scaling,
                    "median_s": med, "min_s": min, "tokens_per_s": rate, "speedup": speedup,
                }));
            }
        }
    }
    Ok(json!({ "devices": devices, "note": note, "rows": rows }))
}
