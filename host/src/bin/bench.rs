//! `bench`: speed of our kernels against cuBLAS, and (hooks) attention and
//! the end-to-end engine. CUDA-event timing after warm-up, median of
//! `--samples` (≥ 20) samples, operands rotated among enough sets to exceed L2.
//!
//! Usage: `bench [gemm|attention|e2e|all]... [--json PATH] [--samples N] [--quick]`
//! Prints the device name, then a table per section; `--json` writes every
//! number (see `host::bench::GemmResult`).

use anyhow::Context;
use clap::Parser;
use cudarc::driver::CudaSlice;
use cudarc::driver::sys::CUevent_flags;
use host::bench::{
    Blas, BlasMode, DEFAULT_SAMPLES, DEFAULT_WARMUP, GemmResult, GemmSets, l2_bytes, tf32_variants, time_calls,
};
use host::generate::{Backend, LogitsWanted};
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision};
use host::gpu::ops::matmul::{MatmulKernel, matmul_forward_with};
use host::gpu::ops::matmul_tf32::{MatmulTf32Error, matmul_forward_tf32, matmul_forward_tf32_with};
use host::model::fixtures::llmc_bytes;
use host::model::{DType, ModelConfig};
use rand::Rng;

/// Token counts M = B·T: one short prompt, one full context, a batch of 8 full contexts.
const GEMM_M: [usize; 3] = [64, 1024, 8192];
/// (N, K) of GPT-2 124M's matmuls: qkv, attention projection, MLP up, MLP
/// down, LM head (Vp = 50304).
const GEMM_NK: [(usize, usize); 5] = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)];
/// Checkpoint seed of the e2e section's random GPT-2 124M.
const E2E_SEED: u64 = 124;
/// Largest batch the e2e engine is built for.
const E2E_MAX_BATCH: usize = 8;
/// (B, T) of the prefill measurements.
const E2E_PREFILL: [(usize, usize); 4] = [(1, 64), (4, 64), (1, 1024), (8, 1024)];
/// Batch sizes of the decode measurements, and the prompt they decode after.
const E2E_DECODE_BATCH: [usize; 2] = [1, 8];
const E2E_DECODE_PROMPT: usize = 64;
/// The naive FP32 matmul is timed only up to this many rows (it is slow).
const NAIVE_MAX_M: usize = 1024;
/// `--quick`: one M only.
const QUICK_M: [usize; 1] = [1024];

#[derive(Parser)]
#[command(about = "Benchmarks: GEMM (ours vs cuBLAS), attention, end to end")]
struct Args {
    /// Sections: gemm, attention, e2e, all (default all).
    sections: Vec<String>,
    /// Write all results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Timed samples per measurement (median reported).
    #[arg(long, default_value_t = DEFAULT_SAMPLES)]
    samples: usize,
    /// Untimed warm-up passes.
    #[arg(long, default_value_t = DEFAULT_WARMUP)]
    warmup: usize,
    /// Fewer shapes (M = 1024 only), for a fast look.
    #[arg(long)]
    quick: bool,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

#[derive(serde::Serialize, Default)]
struct Report {
    device: String,
    l2_bytes: usize,
    gemm: Vec<GemmResult>,
    attention: Vec<serde_json::Value>,
    e2e: Vec<serde_json::Value>,
    notes: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.samples >= 20,
        "--samples must be at least 20 (the project's timing rule)"
    );
    let mut sections = args.sections.clone();
    if sections.is_empty() || sections.iter().any(|s| s == "all") {
        sections = vec!["gemm".into(), "attention".into(), "e2e".into()];
    }
    let gpu = Gpu::new(args.device)?;
    let mut report = Report {
        device: gpu.name(),
        l2_bytes: l2_bytes(&gpu)?,
        ..Default::default()
    };
    println!("device: {} (L2 {} MB)", report.device, report.l2_bytes >> 20);

    for s in &sections {
        match s.as_str() {
            "gemm" => bench_gemm(&gpu, &args, &mut report)?,
            "attention" => bench_attention(&gpu, &args, &mut report)?,
            "e2e" => bench_e2e(&gpu, &args, &mut report)?,
            other => anyhow::bail!("unknown section `{other}` (gemm, attention, e2e, all)"),
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

fn tflops(flops: f64, us: f64) -> f64 {
    flops / (us * 1e-6) / 1e12
}

fn bench_gemm(gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let blas32 = Blas::new(gpu.stream.clone(), BlasMode::Fp32)?;
    let blas_tf32 = Blas::new(gpu.stream.clone(), BlasMode::Tf32)?;
    let ms: &[usize] = if args.quick { &QUICK_M } else { &GEMM_M };
    println!(
        "\n== GEMM out[M,N] = inp[M,K] · W[N,K]ᵀ (no bias), median of {} samples",
        args.samples
    );
    println!(
        "{:>5} {:>6} {:>5}  {:34} {:>10} {:>8} {:>9}",
        "M", "N", "K", "variant", "time us", "TFLOP/s", "vs cuBLAS"
    );
    for &m in ms {
        for &(n, k) in &GEMM_NK {
            let mut sets = GemmSets::new(gpu, m, n, k)?;
            let flops = sets.flops();
            let mut rows: Vec<GemmResult> = Vec::new();
            let mut record = |variant: String, precision: &'static str, timing| {
                rows.push(GemmResult {
                    m,
                    n,
                    k,
                    variant,
                    precision,
                    tflops: tflops(flops, timing_us(&timing)),
                    timing,
                    vs_cublas: None,
                });
            };
            let sn = sets.sets();

            // cuBLAS references first.
            for (blas, name, prec) in [
                (&blas32, "cublas_sgemm_fp32", "fp32"),
                (&blas_tf32, "cublas_tf32", "tf32"),
            ] {
                let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut sets;
                    blas.gemm(&mut out[i], &inp[i], &w[i], m, n, k)
                })?;
                record(name.into(), prec, t);
            }

            // Ours, TF32: the automatic tile choice, then every tile shape.
            let t = time_calls::<MatmulTf32Error>(gpu, sn, args.warmup, args.samples, |i| {
                let GemmSets { inp, w, out, .. } = &mut sets;
                matmul_forward_tf32(
                    gpu,
                    &mut out[i],
                    &inp[i],
                    &w[i],
                    None::<&cudarc::driver::CudaSlice<f32>>,
                    m,
                    k,
                    n,
                    false,
                )
            })?;
            record("ours_tf32_auto".into(), "tf32", t);
            for shape in tf32_variants() {
                let t = time_calls::<MatmulTf32Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut sets;
                    matmul_forward_tf32_with(
                        gpu,
                        shape,
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        None::<&cudarc::driver::CudaSlice<f32>>,
                        m,
                        k,
                        n,
                        false,
                    )
                })?;
                record(
                    format!("ours_{}", shape.name.trim_start_matches("matmul_forward_")),
                    "tf32",
                    t,
                );
            }

            // Ours, FP32 (H4's naive and tiled matmul_forward): hook.
            for (name, t) in fp32_hook(gpu, args, &mut sets)? {
                record(name, "fp32", t);
            }

            // Ratios against cuBLAS in the same precision.
            let base = |p: &str| {
                rows.iter()
                    .find(|r| r.variant.starts_with("cublas") && r.precision == p)
                    .map(|r| r.timing.median_us)
            };
            let (b32, b_tf32) = (base("fp32"), base("tf32"));
            for r in &mut rows {
                if !r.variant.starts_with("cublas") {
                    r.vs_cublas = if r.precision == "fp32" { b32 } else { b_tf32 }.map(|b| b / r.timing.median_us);
                }
            }
            for r in &rows {
                let ratio = r.vs_cublas.map_or(String::from("-"), |v| format!("{v:.2}x"));
                println!(
                    "{m:>5} {n:>6} {k:>5}  {:34} {:>10.1} {:>8.1} {:>9}",
                    r.variant, r.timing.median_us, r.tflops, ratio
                );
            }
            report.gemm.extend(rows);
        }
    }
    Ok(())
}

fn timing_us(t: &host::bench::Timing) -> f64 {
    t.median_us
}

/// H4's FP32 matmuls (`host::gpu::ops::matmul`): the shared-memory tiled
/// kernel (the GEMV kernel is what `Auto` picks for a handful of rows, so it
/// is timed too where it applies) and the naive one (skipped above 1024 rows:
/// it takes seconds at M = 8192 x 50304 and only sets the baseline).
fn fp32_hook(gpu: &Gpu, args: &Args, sets: &mut GemmSets) -> anyhow::Result<Vec<(String, host::bench::Timing)>> {
    let (m, n, k, sn) = (sets.m, sets.n, sets.k, sets.sets());
    let mut kernels = vec![
        ("ours_fp32_auto", MatmulKernel::Auto),
        ("ours_fp32_tiled", MatmulKernel::Tiled),
    ];
    if m <= NAIVE_MAX_M {
        kernels.push(("ours_fp32_naive", MatmulKernel::Naive));
    }
    let mut res = Vec::new();
    for (name, kernel) in kernels {
        let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
            let GemmSets { inp, w, out, .. } = &mut *sets;
            matmul_forward_with(
                gpu,
                kernel,
                false,
                &mut out[i],
                &inp[i],
                &w[i],
                None::<&CudaSlice<f32>>,
                m,
                k,
                n,
            )?;
            Ok(())
        })?;
        res.push((name.to_string(), t));
    }
    Ok(res)
}

/// HOOK (issue 5): H7's attention variants (`host::gpu::ops::attention`):
/// time `attention_forward` (+ naive) at (B, T) = (4, 64), (1, 1024),
/// (8, 1024) and decode (t = 1, pos0 = T-1); report µs and GB/s.
fn bench_attention(_gpu: &Gpu, _args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let note = "attention: not benchmarked yet (hook in bench.rs::bench_attention waits for host::gpu::ops::attention)";
    println!("\n== {note}");
    report.notes.push(note.into());
    Ok(())
}

/// End to end on H4's `GpuEngine` with a random GPT-2 124M checkpoint:
/// prefill latency per (B, T) and decode tokens/s at batch 1 and 8, for
/// both precisions. Each timed call is one `Backend::forward` between CUDA
/// events (whatever host work it does in between is included: that is the
/// latency a user sees).
fn bench_e2e(_gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let config = ModelConfig::GPT2_124M;
    println!(
        "\n== end to end, GPT-2 124M random weights, median of {} samples",
        args.samples
    );
    let bytes = llmc_bytes(&config, E2E_SEED, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    println!(
        "{:>6} {:>10} {:>6} {:>6} {:>12} {:>12}",
        "prec", "what", "B", "T", "median ms", "tokens/s"
    );
    for precision in [Precision::Fp32, Precision::Tf32] {
        let gpu = Gpu::new(args.device)?;
        let mut engine = GpuEngine::new(gpu, &weights, E2E_MAX_BATCH, config.max_seq_len, precision)?;
        let mut rng = rand::rng();
        let mut tokens =
            |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..config.vocab_size as u32)).collect() };
        let prec = format!("{precision:?}");
        for (b, t) in E2E_PREFILL {
            let toks = tokens(b * t);
            let mut samples = Vec::new();
            for i in 0..args.warmup + args.samples {
                let gpu = engine.gpu();
                let start = gpu.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                engine.forward(&toks, b, t, 0, LogitsWanted::Last)?;
                let end = engine
                    .gpu()
                    .stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                let ms = start.elapsed_ms(&end)? as f64;
                if i >= args.warmup {
                    samples.push(ms);
                }
            }
            let med = median(&mut samples);
            println!(
                "{prec:>6} {:>10} {b:>6} {t:>6} {med:>12.3} {:>12.0}",
                "prefill",
                (b * t) as f64 / (med * 1e-3)
            );
            report.e2e.push(serde_json::json!({"precision": prec, "what": "prefill", "b": b, "t": t, "median_ms": med, "samples": samples.len()}));
        }
        for b in E2E_DECODE_BATCH {
            let toks = tokens(b * E2E_DECODE_PROMPT);
            engine.forward(&toks, b, E2E_DECODE_PROMPT, 0, LogitsWanted::Last)?;
            let step = tokens(b);
            let mut samples = Vec::new();
            for i in 0..args.warmup + args.samples {
                let pos = E2E_DECODE_PROMPT + i;
                let start = engine
                    .gpu()
                    .stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                engine.forward(&step, b, 1, pos, LogitsWanted::Last)?;
                let end = engine
                    .gpu()
                    .stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                let ms = start.elapsed_ms(&end)? as f64;
                if i >= args.warmup {
                    samples.push(ms);
                }
            }
            let med = median(&mut samples);
            let tps = b as f64 / (med * 1e-3);
            println!(
                "{prec:>6} {:>10} {b:>6} {:>6} {med:>12.3} {tps:>12.0}",
                "decode", E2E_DECODE_PROMPT
            );
            report.e2e.push(serde_json::json!({"precision": prec, "what": "decode", "b": b, "pos0": E2E_DECODE_PROMPT, "median_ms_per_step": med, "tokens_per_s": tps, "samples": samples.len()}));
        }
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
