//! `bench tp`: tensor parallelism over two GPUs against one GPU, in the same
//! process, on the gpt2-xl shape (48 layers, 25 heads, 1600 channels;
//! random FP32 weights): prefill, decode steps at several batch sizes and
//! contexts, and the all-reduce alone at each of their sizes (two a layer).
//!
//! Times are wall-clock per call with every GPU synchronised, median of the
//! samples after warm-up: a TP call ends when its slowest rank does, and
//! CUDA events on one GPU would not see the other.

use std::time::Instant;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::bench::{median, wall_times};
use crate::generate::{Backend, LogitsWanted};
use crate::gpu::Gpu;
use crate::gpu::engine::{GpuEngine, Precision, TpEngine};
use crate::gpu::nccl::Collective;
use crate::model::checkpoint::Checkpoint;
use crate::model::fixtures::llmc_bytes;
use crate::model::{DType, ModelConfig};

/// gpt2-xl's shape.
pub const GPT2_XL: ModelConfig = ModelConfig {
    max_seq_len: 1024,
    vocab_size: 50257,
    padded_vocab_size: 50304,
    num_layers: 48,
    num_heads: 25,
    channels: 1600,
};
/// Seed of the random checkpoint.
const SEED: u64 = 1558;
/// Prefill shapes (B, T).
const PREFILL: [(usize, usize); 3] = [(1, 128), (1, 1024), (8, 1024)];
/// Decode: batch sizes and the context each row holds before the timed steps.
const DECODE_BATCH: [usize; 3] = [1, 8, 32];
const DECODE_CONTEXT: [usize; 2] = [128, 896];
/// Engines are built for this many rows (the largest decode batch).
const MAX_BATCH: usize = 32;
/// Timed samples of a prefill (each takes up to a few hundred ms here).
const PREFILL_SAMPLES: usize = 7;
/// Timed decode steps per (batch, context), after one untimed.
const DECODE_STEPS: usize = 24;
/// All-reduces per timed sample (two a layer, one step's worth).
const REDUCES_PER_SAMPLE: usize = 2 * 48;

/// Synchronise every GPU.
fn sync_all(gpus: &[&Gpu]) -> Result<()> {
    for g in gpus {
        g.synchronize().context("synchronising")?;
    }
    Ok(())
}

/// Median wall-clock ms of `f` over `samples` calls after `warmup`; `f`
/// returns once its GPU work is done (it synchronises).
fn time_ms(warmup: usize, samples: usize, f: impl FnMut() -> Result<()>) -> Result<f64> {
    Ok(median(&mut wall_times(warmup, samples, f)?) * 1e3)
}

/// Per-step ms of greedy decoding: `steps` steps after one untimed, each
/// feeding the last choice (`forward` + `argmax`, as the generation loop).
fn decode_ms(engine: &mut dyn Backend, b: usize, context: usize, steps: usize, rng: &mut StdRng) -> Result<f64> {
    let v = engine.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..b * context).map(|_| rng.random_range(0..v)).collect();
    engine.forward(&prompt, b, context, 0, LogitsWanted::Last)?;
    let mut ids = engine.argmax()?;
    let mut ms = Vec::with_capacity(steps);
    for (i, pos) in (context..=context + steps).enumerate() {
        let t0 = Instant::now();
        engine.forward(&ids, b, 1, pos, LogitsWanted::Last)?;
        ids = engine.argmax()?;
        if i > 0 {
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(median(&mut ms))
}

/// The section: needs GPUs `devices` (two or more, distinct); prints a
/// table and returns its rows for the JSON report.
pub fn bench_tp(devices: &[usize], warmup: usize) -> Result<Vec<serde_json::Value>> {
    let config = GPT2_XL;
    println!(
        "\n== tensor parallel over devices {devices:?} vs one GPU, gpt2-xl shape (L={}, NH={}, C={}), random FP32 weights; wall-clock medians",
        config.num_layers, config.num_heads, config.channels
    );
    let t0 = Instant::now();
    let bytes = llmc_bytes(&config, SEED, DType::F32)?;
    let ckpt = Checkpoint::from_bytes(bytes, "gpt2-xl-random.bin", Some(config.num_heads))?;
    let weights = ckpt.weights()?;
    println!("random checkpoint made in {:.1} s", t0.elapsed().as_secs_f64());
    let max_t = config.max_seq_len;
    let gpus = devices.iter().map(|&d| Gpu::new(d)).collect::<Result<Vec<_>, _>>()?;
    let mut tp = TpEngine::new(gpus, &weights, MAX_BATCH, max_t, Precision::Fp32)?;
    let mut one = GpuEngine::new(Gpu::new(devices[0])?, &weights, MAX_BATCH, max_t, Precision::Fp32)?;
    drop(weights);
    let world = devices.len();
    let mut rows = Vec::new();
    let mut rng = StdRng::seed_from_u64(SEED);

    println!(
        "{:>10} {:>6} {:>6} {:>12} {:>12} {:>9}",
        "what", "B", "T", "one GPU ms", "TP ms", "TP / one"
    );
    for (b, t) in PREFILL {
        let tokens: Vec<u32> = (0..b * t)
            .map(|_| rng.random_range(0..config.vocab_size as u32))
            .collect();
        let one_ms = time_ms(warmup.min(2), PREFILL_SAMPLES, || {
            one.forward(&tokens, b, t, 0, LogitsWanted::Last)?;
            Ok(one.gpu().synchronize()?)
        })?;
        let tp_ms = time_ms(warmup.min(2), PREFILL_SAMPLES, || {
            tp.forward(&tokens, b, t, 0, LogitsWanted::Last)?;
            tp.synchronize()
        })?;
        println!(
            "{:>10} {b:>6} {t:>6} {one_ms:>12.3} {tp_ms:>12.3} {:>9.3}",
            "prefill",
            tp_ms / one_ms
        );
        rows.push(json!({"kind": "prefill", "b": b, "t": t, "world": world, "one_gpu_ms": one_ms, "tp_ms": tp_ms}));
    }
    for context in DECODE_CONTEXT {
        for b in DECODE_BATCH {
            let one_ms = decode_ms(&mut one, b, context, DECODE_STEPS, &mut rng)?;
            tp.set_decode_graphs(false);
            let queued_ms = decode_ms(&mut tp, b, context, DECODE_STEPS, &mut rng)?;
            tp.set_decode_graphs(true);
            let tp_ms = decode_ms(&mut tp, b, context, DECODE_STEPS, &mut rng)?;
            if let Some(e) = tp.decode_graph_error() {
                println!("(TP decode graphs unavailable, queued kernels instead: {e})");
            }
            println!(
                "{:>10} {b:>6} {context:>6} {one_ms:>12.3} {tp_ms:>12.3} {:>9.3}   (TP without graphs {queued_ms:.3} ms)",
                "decode",
                tp_ms / one_ms
            );
            rows.push(json!({"kind": "decode", "b": b, "context": context, "world": world,
                "one_gpu_ms": one_ms, "tp_ms": tp_ms, "tp_queued_ms": queued_ms,
                "tp_graphs": tp.decode_graph_error().is_none()}));
        }
    }
    drop((one, tp));

    // The all-reduce alone, at the sizes a step reduces (rows x C floats).
    let tp_gpus: Vec<Gpu> = devices.iter().map(|&d| Gpu::new(d)).collect::<Result<_, _>>()?;
    let sync: Vec<&Gpu> = tp_gpus.iter().collect();
    let collective = Collective::new(&sync)?;
    println!(
        "{:>10} {:>8} {:>14} {:>14}",
        "all-reduce", "rows", "us each", "us a layer (2)"
    );
    for rows_n in DECODE_BATCH.into_iter().chain([1024, 8 * 1024]) {
        let len = rows_n * config.channels;
        let mut bufs = tp_gpus
            .iter()
            .map(|g| g.upload(&crate::bench::fill_random(len, 5)))
            .collect::<Result<Vec<_>, _>>()?;
        let ms = time_ms(warmup, PREFILL_SAMPLES * 3, || {
            for _ in 0..REDUCES_PER_SAMPLE {
                let mut refs: Vec<_> = bufs.iter_mut().collect();
                collective.all_reduce_sum(&mut refs, len)?;
            }
            sync_all(&sync)
        })?;
        let us = ms * 1e3 / REDUCES_PER_SAMPLE as f64;
        println!("{:>10} {rows_n:>8} {us:>14.2} {:>14.2}", "", 2.0 * us);
        rows.push(json!({"kind": "all_reduce", "rows": rows_n, "floats": len, "world": world, "us": us}));
    }
    Ok(rows)
}
