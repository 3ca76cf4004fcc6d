//! `bench`: speed of our kernels against cuBLAS, and (hooks) attention and
//! the end-to-end engine. CUDA-event timing after warm-up, median of
//! `--samples` (≥ 20) samples, operands rotated among enough sets to exceed L2.
//!
//! Usage: `bench [gemm|attention|e2e|all]... [--json PATH] [--samples N] [--quick]`
//! Prints the device name, then a table per section; `--json` writes every
//! number (see `host::bench::GemmResult`).

use anyhow::Context;
use clap::Parser;
use host::bench::{
    Blas, BlasMode, DEFAULT_SAMPLES, DEFAULT_WARMUP, GemmResult, GemmSets, l2_bytes, tf32_variants, time_calls,
};
use host::gpu::Gpu;
use host::gpu::ops::matmul_tf32::{MatmulTf32Error, matmul_forward_tf32, matmul_forward_tf32_with};

/// Token counts M = B·T: one short prompt, one full context, a batch of 8 full contexts.
const GEMM_M: [usize; 3] = [64, 1024, 8192];
/// (N, K) of GPT-2 124M's matmuls: qkv, attention projection, MLP up, MLP
/// down, LM head (Vp = 50304).
const GEMM_NK: [(usize, usize); 5] = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)];
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

/// HOOK (issue 5): H4's FP32 `host::gpu::ops::matmul::matmul_forward` (tiled)
/// and `matmul_forward_naive`. Wire them in here once they land:
/// time each like the TF32 variants above and return ("ours_fp32_tiled", t).
fn fp32_hook(_gpu: &Gpu, _args: &Args, _sets: &mut GemmSets) -> anyhow::Result<Vec<(String, host::bench::Timing)>> {
    Ok(Vec::new())
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

/// HOOK (issue 5): H4's `GpuEngine` (host/src/gpu/engine.rs): prefill latency
/// for (B, T) in (1,64), (4,64), (1,1024), (8,1024) and decode tokens/s at
/// batch 1 and 8, for Precision::Fp32 and Precision::Tf32, on a random
/// checkpoint (`host::model::fixtures`).
fn bench_e2e(_gpu: &Gpu, _args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let note = "e2e: not benchmarked yet (hook in bench.rs::bench_e2e waits for host::gpu::engine::GpuEngine)";
    println!("\n== {note}");
    report.notes.push(note.into());
    Ok(())
}
