//! `bench`: speed of our kernels against cuBLAS, the decode GEMVs against
//! cuBLAS and the copy-bandwidth floor, the attention kernels (unfused vs
//! flash), and the end-to-end engine. CUDA-event timing after warm-up, median of
//! `--samples` (≥ 20) samples, operands rotated among enough sets to exceed L2.
//!
//! Usage: `bench [gemm|gemv|attention|e2e|trace|step|slots|replicas|tp|sample|all]... [--json PATH] [--samples N] [--quick] [--devices LIST]`
//! Prints the device name, then a table per section; `--json` writes every
//! number (see `host::bench::GemmResult`).

use anyhow::Context;
use clap::Parser;
use cudarc::cublas::{Gemv, GemvConfig, sys as blas_sys};
use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use gpu_host::shape::{AttentionShape, MatmulShape};
use gpu_kernels::params::decode::DECODE_MAX_ROWS;
use gpu_kernels::params::decode_step::DECODE_STEP_MAX_ROWS;
use gpu_kernels::params::matmul::{MATMUL_GEMV_MAX_ROWS, MATMUL_TILE_M, MATMUL_TILE_M_MID};
use gpu_kernels::params::matmul_bf16::MATMUL_BF16_WGMMA_VARIANTS;
use gpu_kernels::params::matmul_tf32::{TileEngine, TileShape};
use gpu_kernels::params::sample::SampleRow;
use host::bench::replicas::bench_replicas;
use host::bench::step_trace::{PHASE_KINDS, PhaseTimes, by_kind, phase_times};
use host::bench::{
    AttnSets, Blas, BlasMode, DEFAULT_SAMPLES, DEFAULT_WARMUP, GemmResult, GemmSets, Timing, fill_random, median,
    tf32_variants, time_calls,
};
use host::generate::{Backend, LogitsWanted};
use host::gpu::Gpu;
use host::gpu::engine::{AttentionKind, DecodePath, DecodeTuning, GpuEngine, PREFETCH_AHEAD_TRY_BYTES, Precision};
use host::gpu::ops::args::OpError;
use host::gpu::ops::attention::{attention_forward, attention_forward_naive};
use host::gpu::ops::convert::convert_to_bf16;
use host::gpu::ops::decode::{
    DecodeLaunch, DecodeWorkspace, GemvWeights, Input as DecodeInput, Output as DecodeOutput, decode_gemv,
};
use host::gpu::ops::flash_attention::{FlashOptions, FlashPrecision, FlashWorkspace, attention_forward_flash};
use host::gpu::ops::matmul::{
    FP32_CHUNKED_GEMV_MAX_ROWS, MatmulKernel, MatmulOptions, MatmulWorkspace, SMALL_MAX_ROWS, SmallPlan, TiledPlan,
    matmul_forward_plan, matmul_forward_small, matmul_forward_with, split_k_workspace_floats,
};
use host::gpu::ops::matmul_bf16::{
    BF16_WGMMA_MAX_SPLITS, Bf16Out, Bf16TileOptions, bf16_wgmma_plan, matmul_forward_bf16, matmul_forward_bf16_wgmma,
    matmul_forward_bf16_wgmma_partials, matmul_forward_bf16_wgmma_split, matmul_forward_bf16_wgmma_with,
};
use host::gpu::ops::matmul_tf32::{
    MatmulTf32Error, TF32_MAX_SPLITS, Tf32Options, Tf32TileOptions, fp32_tc_plan, fp32_tc_variants,
    matmul_forward_fp32_tc, matmul_forward_fp32_tc_with, matmul_forward_tf32, matmul_forward_tf32_opts,
    matmul_forward_tf32_with,
};
use host::gpu::ops::weight::WeightRef;
use host::gpu::replicas::DeviceList;
use host::gpu::runtime::dptr_mut;
use host::model::fixtures::llmc_bytes;
use host::model::{DType, ModelConfig};
use host::sample::{Sampler, SamplingParams};
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
/// (B, T) prefill shapes whose end-to-end time is also taken with the unfused
/// attention, so the flash gain is visible.
const E2E_COMPARE_KINDS: [(usize, usize); 1] = [(1, 1024)];
/// Windowed prefill: (B, T, window).
const E2E_WINDOWED: [(usize, usize, usize); 1] = [(1, 1024, 128)];
/// Attention section: GPT-2 124M's shape.
const ATTN_C: usize = 768;
const ATTN_NH: usize = 12;
/// Cache lengths T and batch sizes B of the attention section.
const ATTN_T: [usize; 3] = [64, 256, 1024];
const ATTN_B: [usize; 2] = [1, 8];
/// Window of the windowed variants.
const ATTN_WINDOW: usize = 128;
/// Key-chunk sizes of the tensor-core prefill that `bench attention` forces
/// beside the automatic choice (0: unsplit).
const ATTN_CHUNK_TILES: [u32; 6] = [0, 4, 6, 8, 10, 12];
/// The naive attention (one thread per query, uncoalesced) is timed only up
/// to this T: past it one call takes milliseconds and says nothing new.
const ATTN_NAIVE_MAX_T: usize = 256;
/// The naive FP32 matmul is timed only up to this many rows (it is slow).
const NAIVE_MAX_M: usize = 1024;
/// Up to this many rows the FP32 tiled kernel is also timed unsplit on each
/// tile (checks the wave model's tile choice where it matters).
const FP32_EACH_TILE_MAX_M: usize = 1024;
/// Split counts of the small-M kernel's sweep (up to `SMALL_MAX_ROWS` rows).
const FP32_SMALL_SWEEP_SPLITS: [usize; 12] = [1, 2, 3, 4, 6, 8, 10, 11, 12, 16, 24, 32];
/// Split counts of the FP32 split-K sweep (up to `FP32_EACH_TILE_MAX_M` rows).
const FP32_SWEEP_SPLITS: [usize; 8] = [2, 3, 4, 6, 8, 12, 16, 24];
/// Largest split-K workspace the sweep allocates, floats (1 GiB).
const FP32_SWEEP_MAX_WORKSPACE: usize = 1 << 28;
/// Rows of split-K scratch the engine-like TF32 call gets (as the engine's
/// `TF32_SPLIT_MAX_ROWS`).
const BENCH_SPLIT_MAX_ROWS: usize = 2048;
/// `--quick`: one M only.
const QUICK_M: [usize; 1] = [1024];
/// `gemv` section: GPT-2 124M's decode matmuls as (name, out, in, has bias):
/// the weight is `out x in`.
const GEMV_SHAPES: [(&str, usize, usize, bool); 5] = [
    ("qkv", 2304, 768, true),
    ("attproj", 768, 768, true),
    ("fc", 3072, 768, true),
    ("fcproj", 768, 3072, true),
    ("lm_head", 50304, 768, false),
];
/// Input rows of the `gemv` section (batch sizes of a decode step).
const GEMV_ROWS: [usize; 2] = [1, 8];
/// `--quick`: batch 1 only.
const GEMV_QUICK_ROWS: [usize; 1] = [1];
/// The weight copies rotated per shape span at least this many L2 sizes, so
/// every timed call reads its weight from HBM.
const GEMV_L2_MULTIPLE: usize = 4;
/// At least this many samples per GEMV measurement (each is cheap).
const GEMV_MIN_SAMPLES: usize = 100;
/// Bytes copied by the bandwidth measurement (read once and written once:
/// twice this is counted).
const COPY_BYTES: usize = 1 << 30;
/// Random data uploaded once and copied over the copy source (64 MB).
const COPY_FILL_FLOATS: usize = 1 << 24;
/// The `gemm` section's split-K rows (bf16 `wgmma`): outputs of at most
/// this many rows and columns (where splitting can pay, and the parts of 8
/// splits stay small).
const SPLIT_BENCH_MAX_M: usize = 1024;
const SPLIT_BENCH_MAX_N: usize = 4096;
/// cuBLAS workspace of the `gemv` section's handle (PyTorch's default on
/// Hopper), set explicitly so cuBLAS never allocates during graph capture.
const GEMV_CUBLAS_WORKSPACE: usize = 32 << 20;

#[derive(Parser)]
#[command(about = "Benchmarks: GEMM (ours vs cuBLAS), GEMV, attention, end to end")]
struct Args {
    /// Sections: gemm, gemv, attention, e2e, trace, step, slots, replicas, tp, sample, all (default all: every one but trace, step, slots, replicas, tp and sample).
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
    /// `replicas` and `tp` sections: the GPUs (0,1 or all) timed against
    /// one GPU (one replica each; the tensor-parallel ranks in this order).
    #[arg(long, value_name = "LIST", default_value = "all")]
    devices: DeviceList,
    /// `gemm` section: only these M (comma-separated), e.g. for a profiler.
    #[arg(long, value_delimiter = ',')]
    gemm_m: Vec<usize>,
    /// `attention` section: only these cache lengths T (comma-separated).
    #[arg(long, value_delimiter = ',')]
    attn_t: Vec<usize>,
    /// `trace` section: the prefill shape B,T.
    #[arg(long, default_value = "1,1024", value_parser = parse_shape)]
    trace_shape: (usize, usize),
    /// `trace` section: the prefill's precision (fp32, tf32 or bf16).
    #[arg(long, default_value = "tf32", value_parser = parse_precision)]
    trace_precision: Precision,
    /// `slots` section: only these row counts (comma-separated, each 1 to
    /// the slot count).
    #[arg(long, value_delimiter = ',')]
    slot_rows: Vec<usize>,
    /// `sample` section: only these row counts (comma-separated).
    #[arg(long, value_delimiter = ',')]
    sample_rows: Vec<usize>,
    /// `step` section: tokens in the cache before the timed steps (the
    /// attention's length), at most 1024 - 1 - 32 (the steps a sample runs).
    #[arg(long, default_value_t = E2E_DECODE_PROMPT)]
    step_pos0: usize,
    /// `step` section: the persistent step's weight-ring slots (2 to 4,
    /// `DecodeTuning::step_ring_slots`); 0 lets the engine choose.
    #[arg(long, default_value_t = 0)]
    step_ring_slots: usize,
    /// `step` section: with `--step-ring-slots`, the slots share all the
    /// shared memory left (`DecodeTuning::step_ring_fill`).
    #[arg(long)]
    step_ring_fill: bool,
    /// `slots` section: wrap each row count's last step in the profiler's
    /// collection range (`cuProfilerStart`/`Stop`), for
    /// `ncu --profile-from-start off`.
    #[arg(long)]
    profile_slots: bool,
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    match s {
        "fp32" => Ok(Precision::Fp32),
        "tf32" => Ok(Precision::Tf32),
        "bf16" => Ok(Precision::Bf16),
        _ => Err(format!("expected fp32, tf32 or bf16, got `{s}`")),
    }
}

fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let (b, t) = s.split_once(',').ok_or_else(|| format!("expected B,T, got `{s}`"))?;
    let num = |x: &str| x.trim().parse::<usize>().map_err(|e| format!("`{x}`: {e}"));
    Ok((num(b)?, num(t)?))
}

#[derive(serde::Serialize, Default)]
struct Report {
    device: String,
    l2_bytes: usize,
    /// Whether `Gpu::launch` chained kernels with PDL (`GPT2_NO_CHAIN_PDL`).
    chain_pdl: bool,
    gemm: Vec<GemmResult>,
    /// The `gemv` section's rows (see `bench_gemv`).
    gemv: Vec<serde_json::Value>,
    /// The device-to-device copy the `gemv` floor divides by.
    copy_bandwidth: Option<serde_json::Value>,
    attention: Vec<serde_json::Value>,
    e2e: Vec<serde_json::Value>,
    /// The `replicas` section (`host::bench::replicas`).
    replicas: Option<serde_json::Value>,
    /// The `tp` section's rows (`host::bench::tp`).
    tp: Vec<serde_json::Value>,
    /// The `sample` section's rows (see `bench_sample`).
    sample: Vec<serde_json::Value>,
    notes: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    // SAFETY: first thing in main, before any thread starts.
    unsafe { host::gpu::nccl::keep_nvls_off() };
    let args = Args::parse();
    anyhow::ensure!(
        args.samples >= 20,
        "--samples must be at least 20 (the project's timing rule)"
    );
    let mut sections = args.sections.clone();
    if sections.is_empty() || sections.iter().any(|s| s == "all") {
        sections = vec!["gemm".into(), "gemv".into(), "attention".into(), "e2e".into()];
    }
    let gpu = Gpu::new(args.device)?;
    let mut report = Report {
        device: gpu.name(),
        l2_bytes: gpu.l2_bytes(),
        chain_pdl: gpu.chain_pdl(),
        ..Default::default()
    };
    println!(
        "device: {} (L2 {} MB), kernels chained with PDL: {}",
        report.device,
        report.l2_bytes >> 20,
        report.chain_pdl
    );

    for s in &sections {
        match s.as_str() {
            "gemm" => bench_gemm(&gpu, &args, &mut report)?,
            "gemv" => bench_gemv(&gpu, &args, &mut report)?,
            "attention" => bench_attention(&gpu, &args, &mut report)?,
            "e2e" => bench_e2e(&gpu, &args, &mut report)?,
            "trace" => bench_trace(&args, &mut report)?,
            "step" => bench_step(&args, &mut report)?,
            "slots" => bench_slots(&args, &mut report)?,
            "replicas" => report.replicas = Some(bench_replicas(&args.devices, args.samples, args.warmup)?),
            "tp" => bench_tp(&args, &mut report)?,
            "sample" => bench_sample(&gpu, &args, &mut report)?,
            other => anyhow::bail!(
                "unknown section `{other}` (gemm, gemv, attention, e2e, trace, step, slots, replicas, tp, sample, all)"
            ),
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

/// `sample` section: rows per launch.
const SAMPLE_ROWS: [usize; 4] = [1, 8, 16, 64];
/// `sample` section: (name, temperature, top-k, top-p): greedy, the CLI's
/// defaults, the server's (plain temperature), nucleus alone, and a top-k
/// too large for the cluster kernel's gathered list.
const SAMPLE_SETTINGS: [(&str, f32, u32, f32); 5] = [
    ("greedy", 0.0, 0, 1.0),
    ("T0.8_k40_p0.95", 0.8, 40, 0.95),
    ("T1", 1.0, 0, 1.0),
    ("T1_p0.9", 1.0, 0, 0.9),
    ("T1_k1000", 1.0, 1000, 1.0),
];
/// `sample` section: logits roughly normal with this mean and deviation, as
/// GPT-2's are (all negative: tokens near the maximum share a float
/// exponent, as real rows do; rows straddling 0 spread the keys wider).
const SAMPLE_LOGIT_MEAN: f32 = -45.0;
const SAMPLE_LOGIT_SD: f32 = 3.0;
/// Uniform draws summed per logit (Irwin-Hall: near-normal).
const SAMPLE_LOGIT_TERMS: usize = 4;

/// The sampling kernels (one block a row, and the cluster kernel where the
/// sm_90a module is loaded) on GPT-2's vocabulary: one launch choosing one
/// id per row, logits rotated among sets that exceed L2.
fn bench_sample(gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    use host::gpu::ops::sample::{DeviceSampleRow, Draws, SampleKernel, sample_forward_with};
    use host::gpu::shape::SampleShape;
    let (v, vp) = (50257, 50304);
    println!(
        "\n== sampling, v = {v} (row stride {vp}), median of {} samples, µs a launch",
        args.samples
    );
    println!(
        "{:>4}  {:18} {:>10} {:>10} {:>8}",
        "rows", "setting", "per-row", "cluster", "ratio"
    );
    let mut kernels = vec![SampleKernel::PerRow];
    if gpu.has_wgmma() {
        kernels.push(SampleKernel::Cluster);
    }
    let row_counts = if args.sample_rows.is_empty() {
        SAMPLE_ROWS.to_vec()
    } else {
        args.sample_rows.clone()
    };
    anyhow::ensure!(!row_counts.contains(&0), "--sample-rows: a row count of 0");
    for n in row_counts {
        let sets = host::bench::sets_for(n * vp * 4);
        // A sum of k uniforms on [-1, 1) has deviation sqrt(k / 3).
        let scale = SAMPLE_LOGIT_SD / (SAMPLE_LOGIT_TERMS as f32 / 3.0).sqrt();
        let host_logits: Vec<f32> = fill_random(sets * n * vp * SAMPLE_LOGIT_TERMS, E2E_SEED + n as u64)
            .chunks_exact(SAMPLE_LOGIT_TERMS)
            .map(|u| SAMPLE_LOGIT_MEAN + scale * u.iter().sum::<f32>())
            .collect();
        let logits = gpu.upload(&host_logits)?;
        let counter = gpu.upload(&(0..n as u32).collect::<Vec<_>>())?;
        let mut out = gpu.alloc::<u32>(n)?;
        for &(name, t, k, p) in &SAMPLE_SETTINGS {
            let rows: Vec<DeviceSampleRow> = (0..n)
                .map(|i| {
                    DeviceSampleRow(SampleRow {
                        temperature: t,
                        top_k: k,
                        top_p: p,
                        _pad: 0,
                        seed: E2E_SEED + i as u64,
                    })
                })
                .collect();
            let rows = gpu.upload(&rows)?;
            let mut us = Vec::new();
            for &kernel in &kernels {
                let timing = time_calls(gpu, sets, args.warmup, args.samples, |set| {
                    let view = logits.slice(set * n * vp..(set + 1) * n * vp);
                    sample_forward_with(
                        gpu,
                        kernel,
                        &mut out,
                        &view,
                        &rows,
                        Draws {
                            counter: Some(&counter),
                            streams: None,
                        },
                        None::<&mut CudaSlice<u32>>,
                        SampleShape { n, v, row_stride: vp },
                    )
                })?;
                report.sample.push(serde_json::json!({
                    "rows": n, "v": v, "setting": name, "temperature": t, "top_k": k, "top_p": p,
                    "kernel": format!("{kernel:?}"), "timing": timing,
                }));
                us.push(timing.median_us);
            }
            let cluster = us.get(1).copied();
            println!(
                "{n:>4}  {name:18} {:>10.1} {:>10} {:>8}",
                us[0],
                cluster.map_or("-".into(), |c| format!("{c:.1}")),
                cluster.map_or("-".into(), |c| format!("{:.2}x", us[0] / c))
            );
        }
    }
    Ok(())
}

/// `tp` section: tensor parallelism on `--devices` against one GPU
/// (`host::bench::tp`); skipped, saying so, without two distinct GPUs.
fn bench_tp(args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let devices = args.devices.resolve()?;
    let distinct = devices.iter().collect::<std::collections::HashSet<_>>().len() == devices.len();
    if devices.len() < 2 || !distinct {
        let note = format!("tp: skipped: needs two or more distinct GPUs, --devices gives {devices:?}");
        println!("\n== {note}");
        report.notes.push(note);
        return Ok(());
    }
    report.tp = host::bench::tp::bench_tp(&devices, args.warmup)?;
    Ok(())
}

fn tflops(flops: f64, us: f64) -> f64 {
    flops / (us * 1e-6) / 1e12
}

fn bench_gemm(gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let blas32 = Blas::new(gpu, BlasMode::Fp32)?;
    let blas_tf32 = Blas::new(gpu, BlasMode::Tf32)?;
    let blas_bf16 = Blas::new(gpu, BlasMode::Bf16)?;
    let ms: &[usize] = if !args.gemm_m.is_empty() {
        &args.gemm_m
    } else if args.quick {
        &QUICK_M
    } else {
        &GEMM_M
    };
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
            let gemm = MatmulShape::new(m, n, k);
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
                    gemm,
                    false,
                )
            })?;
            record("ours_tf32_auto".into(), "tf32", t);
            // The engine's call on a wgmma GPU: `inp` rounded by its producer
            // (layernorm / GELU; these random inputs are not, which changes
            // the values, not the time) and split-K scratch like the engine's.
            if gpu.has_wgmma() {
                let mut scratch = gpu.alloc::<f32>(TF32_MAX_SPLITS * m.min(BENCH_SPLIT_MAX_ROWS) * n)?;
                let t = time_calls::<MatmulTf32Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut sets;
                    let opts = Tf32Options {
                        gelu: false,
                        inp_rounded: true,
                        round_out: false,
                        split_workspace: Some(&mut scratch),
                    };
                    matmul_forward_tf32_opts(
                        gpu,
                        opts,
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        None::<&cudarc::driver::CudaSlice<f32>>,
                        gemm,
                    )
                })?;
                record("ours_tf32_engine".into(), "tf32", t);
            }
            for shape in &tf32_variants(gpu) {
                let t = time_calls::<MatmulTf32Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut sets;
                    matmul_forward_tf32_with(
                        gpu,
                        Tf32TileOptions::new(*shape),
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        None::<&cudarc::driver::CudaSlice<f32>>,
                        gemm,
                    )
                })?;
                record(
                    format!("ours_{}", shape.name.trim_start_matches("matmul_forward_")),
                    "tf32",
                    t,
                );
            }

            // bf16: cuBLAS on bf16 inp, W and out; ours on f32 inp (rounded
            // in the kernel, as the engine calls it), bf16 W, f32 out.
            {
                let to_bf16 = |x: &CudaSlice<f32>, rows: usize, cols: usize| -> anyhow::Result<CudaSlice<half::bf16>> {
                    let mut y = gpu.alloc::<half::bf16>(rows * cols)?;
                    // SAFETY: any f32 bits are valid bytes; the view covers rows*cols floats.
                    let raw = unsafe { x.transmute::<u8>(rows * cols * size_of::<f32>()) }
                        .context("a byte view of the inputs")?;
                    convert_to_bf16(gpu, &mut y, &raw, rows, cols, DType::F32, false)?;
                    Ok(y)
                };
                let inp16 = sets
                    .inp
                    .iter()
                    .map(|x| to_bf16(x, m, k))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let w16 = sets
                    .w
                    .iter()
                    .map(|x| to_bf16(x, n, k))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let mut out16 = (0..sn)
                    .map(|_| gpu.alloc::<half::bf16>(m * n))
                    .collect::<Result<Vec<_>, _>>()?;
                let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
                    blas_bf16.gemm_bf16(&mut out16[i], &inp16[i], &w16[i], m, n, k)
                })?;
                record("cublas_bf16".into(), "bf16", t);
                let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, out, .. } = &mut sets;
                    matmul_forward_bf16(gpu, &mut out[i], &inp[i], &w16[i], None, gemm, false)
                })?;
                record("ours_bf16_auto".into(), "bf16", t);
                if gpu.has_wgmma() {
                    // The Hopper kernels, as cuBLAS runs: bf16 inp and out.
                    let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                        let out = Bf16Out::Bf16(&mut out16[i]);
                        matmul_forward_bf16_wgmma(gpu, out, &inp16[i], &w16[i], None, gemm, false)
                    })?;
                    record("ours_bf16_wgmma_auto".into(), "bf16", t);
                    let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                        let out = Bf16Out::F32(&mut sets.out[i]);
                        matmul_forward_bf16_wgmma(gpu, out, &inp16[i], &w16[i], None, gemm, false)
                    })?;
                    record("ours_bf16_wgmma_auto_f32_out".into(), "bf16", t);
                    for shape in &MATMUL_BF16_WGMMA_VARIANTS {
                        let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                            let (opts, out) = (Bf16TileOptions::new(*shape), Bf16Out::Bf16(&mut out16[i]));
                            matmul_forward_bf16_wgmma_with(gpu, opts, out, &inp16[i], &w16[i], None, gemm)
                        })?;
                        record(
                            format!("ours_{}", shape.name.trim_start_matches("matmul_forward_")),
                            "bf16",
                            t,
                        );
                    }
                    // Split over k, the parts left for their reader to add
                    // (the engine's projections of short prompts; the
                    // reader's extra reads are not in these times): the
                    // planned call, then each tile at 2, 4 and 8 splits.
                    if m <= SPLIT_BENCH_MAX_M && n <= SPLIT_BENCH_MAX_N {
                        let mut parts = gpu.alloc::<f32>(BF16_WGMMA_MAX_SPLITS * m * n)?;
                        // (Named as the plan for an output map and the persistent
                        // tiles, which the call below has unless turned off.)
                        let persistent = gpu.persistent_gemm_blocks().is_some();
                        let (tile, s) = bf16_wgmma_plan(gemm, gpu.sm_count(), parts.len(), persistent);
                        let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                            let (inp, w) = (&inp16[i], &w16[i]);
                            matmul_forward_bf16_wgmma_partials(gpu, &mut parts, &mut sets.out[i], inp, w, None, gemm)
                                .map(|_| ())
                        })?;
                        let short = |t: &TileShape| t.name.trim_start_matches("matmul_forward_").to_string();
                        record(format!("ours_{}_planned_s{s}_parts", short(&tile)), "bf16", t);
                        for shape in &MATMUL_BF16_WGMMA_VARIANTS {
                            for splits in [2, 4, 8] {
                                let t = time_calls::<OpError>(gpu, sn, args.warmup, args.samples, |i| {
                                    let (inp, w) = (&inp16[i], &w16[i]);
                                    matmul_forward_bf16_wgmma_split(gpu, *shape, splits, &mut parts, inp, w, gemm)
                                        .map(|_| ())
                                })?;
                                record(format!("ours_{}_s{splits}_parts", short(shape)), "bf16", t);
                            }
                        }
                    }
                }
            }

            // Ours, FP32 (the naive and tiled matmul_forward): hook.
            for (name, t) in fp32_hook(gpu, args, &mut sets)? {
                record(name, "fp32", t);
            }

            // Ratios against cuBLAS in the same precision.
            let base = |p: &str| {
                rows.iter()
                    .find(|r| r.variant.starts_with("cublas") && r.precision == p)
                    .map(|r| r.timing.median_us)
            };
            let (b32, b_tf32, b_bf16) = (base("fp32"), base("tf32"), base("bf16"));
            for r in &mut rows {
                if !r.variant.starts_with("cublas") {
                    let b = match r.precision {
                        "fp32" => b32,
                        "bf16" => b_bf16,
                        _ => b_tf32,
                    };
                    r.vs_cublas = b.map(|b| b / r.timing.median_us);
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

/// The decode GEMV (`gpu::ops::decode::decode_gemv`) with a bias epilogue
/// (`weights` without a layernorm).
fn decode_gemv_bench(
    gpu: &Gpu,
    ws: &std::cell::RefCell<DecodeWorkspace>,
    pdl: bool,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weights: GemvWeights<'_>,
    shape: MatmulShape,
) -> anyhow::Result<()> {
    let output = DecodeOutput::Rows {
        out,
        residual: None,
        gelu: false,
    };
    let launch = DecodeLaunch::new(pdl);
    decode_gemv(
        gpu,
        &mut ws.borrow_mut(),
        launch,
        DecodeInput::Rows(inp),
        weights,
        output,
        shape,
    )?;
    Ok(())
}

/// One GEMV implementation of the `gemv` section: `launch(out, inp, weight,
/// bias, rows, c, oc)` computes `out[rows, oc] = inp[rows, c] · weight[oc, c]ᵀ
/// (+ bias[oc])` on [`Gpu::stream`]. Another variant (a new kernel) is one
/// more entry in `bench_gemv`'s list.
struct GemvVariant<'a> {
    name: &'static str,
    /// A cuBLAS reference: the ratio column divides by the fastest of these.
    cublas: bool,
    /// Whether it takes this many rows.
    takes: fn(usize) -> bool,
    launch: Box<GemvLaunch<'a>>,
}

/// See [`GemvVariant`].
type GemvLaunch<'a> = dyn Fn(
        &mut CudaSlice<f32>,
        &CudaSlice<f32>,
        &CudaSlice<f32>,
        Option<&CudaSlice<f32>>,
        usize,
        usize,
        usize,
    ) -> anyhow::Result<()>
    + 'a;

/// `y[oc] = W[oc, c] · x[c]` with cublasSgemv: W's row-major buffer read
/// column-major is a `c x oc` matrix (lda = c), so `y = Aᵀx` (`trans = T`).
fn cublas_sgemv(
    blas: &Blas,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    c: usize,
    oc: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        out.len() >= oc && inp.len() >= c && w.len() >= oc * c,
        "cuBLAS gemv: buffers too small"
    );
    let cfg = GemvConfig {
        trans: blas_sys::cublasOperation_t::CUBLAS_OP_T,
        m: c as i32,
        n: oc as i32,
        alpha: 1.0f32,
        lda: c as i32,
        incx: 1,
        beta: 0.0f32,
        incy: 1,
    };
    // SAFETY: sizes checked above match (m, n, lda, incx, incy).
    unsafe { blas.blas.gemv(cfg, w, inp, out)? };
    Ok(())
}

/// Time `op(set)` for every set like [`time_calls`], but with one pass over
/// all sets captured once into a CUDA graph and replayed: each sample is one
/// replay between CUDA events, divided by `sets`. Without the host's launch
/// cost in the way this is the GPU's own time per call (kernels back to back,
/// as in a captured decode step). One untimed pass runs before the capture
/// (first-call setup: kernel lookup, cuBLAS heuristics).
fn time_graph(
    gpu: &Gpu,
    sets: usize,
    warmup: usize,
    samples: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Timing> {
    let sets = sets.max(1);
    for s in 0..sets {
        op(s)?;
    }
    gpu.synchronize()?;
    gpu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = (0..sets).try_for_each(&mut op);
    // End the capture whatever happened, so the stream is usable again.
    let graph = gpu.end_capture(CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.context("stream capture produced no graph")?;
    graph.upload()?;
    for _ in 0..warmup.max(1) {
        graph.launch()?;
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        let start = gpu.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graph.launch()?;
        let end = gpu.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        times.push(start.elapsed_ms(&end)? as f64 * 1e3 / sets as f64);
    }
    let median_us = median(&mut times);
    Ok(Timing {
        median_us,
        min_us: times[0],
        max_us: times[times.len() - 1],
        samples: times.len(),
        calls_per_sample: sets,
    })
}

/// Device-to-device copy bandwidth: `COPY_BYTES` copied from one buffer to
/// another (random contents), CUDA-event timed, median of the samples;
/// bytes read plus bytes written per second. Returns (GB/s, timing).
fn copy_bandwidth(gpu: &Gpu, args: &Args) -> anyhow::Result<(f64, Timing)> {
    let n = COPY_BYTES / 4;
    let fill = gpu.upload(&fill_random(COPY_FILL_FLOATS, 99))?;
    let mut src = gpu.alloc::<f32>(n)?;
    for off in (0..n).step_by(COPY_FILL_FLOATS) {
        let len = COPY_FILL_FLOATS.min(n - off);
        gpu.memcpy_dtod(&fill.slice(0..len), &mut src.slice_mut(off..off + len))?;
    }
    let mut dst = gpu.alloc::<f32>(n)?;
    let t = time_calls::<anyhow::Error>(gpu, 1, args.warmup, args.samples, |_| {
        gpu.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    gpu.synchronize()?;
    Ok((2.0 * COPY_BYTES as f64 / (t.median_us * 1e-6) / 1e9, t))
}

/// Decode GEMVs: every GPT-2 124M matmul of a decode step (`GEMV_SHAPES`) at
/// 1 and 8 input rows, for each variant of the list below: cuBLAS (FP32,
/// `CUBLAS_PEDANTIC_MATH`: cublasSgemv at 1 row, cublasSgemm with M = rows,
/// as torch's `F.linear` calls it, at every row count) and ours
/// (`matmul_forward_with(MatmulKernel::Gemv)`, with the bias where GPT-2 has
/// one; cuBLAS gets none). Each shape's weight is copied until the copies
/// span `GEMV_L2_MULTIPLE` times the L2 (at least 2 copies), each with its
/// own random input and output, and the calls rotate among them, so every
/// call reads its weight from HBM. Each variant is timed twice: a pass over
/// all copies captured in a CUDA graph and replayed (`graph`, the headline:
/// GPU time per call, as in a captured decode step), and the same calls
/// launched from the host (`stream`, as `gemm` times). The floor is the
/// problem's bytes (weight, input, output, bias) over the device-to-device
/// copy bandwidth measured first in this process.
fn bench_gemv(gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let samples = args.samples.max(GEMV_MIN_SAMPLES);
    let (copy_gbs, copy_t) = copy_bandwidth(gpu, args)?;
    println!(
        "\n== GEMV out[rows,oc] = inp[rows,c] · W[oc,c]ᵀ (+bias), FP32, median of {samples} samples; \
         device copy {copy_gbs:.0} GB/s (read + write, {} MiB copied, median {:.1} us)",
        COPY_BYTES >> 20,
        copy_t.median_us
    );
    println!("   (graph: one captured pass over the rotated copies, replayed; stream: launched from the host)");
    report.copy_bandwidth = Some(serde_json::json!({
        "bytes_copied": COPY_BYTES, "bytes_counted": 2 * COPY_BYTES, "gb_s": copy_gbs, "timing": copy_t,
    }));
    // Declared before `blas`, so it is freed after the handle is destroyed.
    let mut blas_ws = gpu.alloc::<u8>(GEMV_CUBLAS_WORKSPACE)?;
    let blas = Blas::new(gpu, BlasMode::Fp32)?;
    // SAFETY: the handle is live (owned by `blas`); `blas_ws` is a device
    // buffer of that size that outlives the handle.
    let status = unsafe {
        blas_sys::cublasSetWorkspace_v2(
            *blas.blas.handle(),
            dptr_mut(&mut blas_ws).cast(),
            GEMV_CUBLAS_WORKSPACE,
        )
    };
    anyhow::ensure!(
        status == blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        "cublasSetWorkspace: {status:?}"
    );
    let decode_ws = std::cell::RefCell::new(DecodeWorkspace::new(gpu, DECODE_MAX_ROWS as usize, 1, 1)?);
    // The variants: a new kernel is one more entry.
    let mut variants: Vec<GemvVariant> = vec![
        GemvVariant {
            name: "cublas_sgemv",
            cublas: true,
            takes: |rows| rows == 1,
            launch: Box::new(|out, inp, w, _bias, _rows, c, oc| cublas_sgemv(&blas, out, inp, w, c, oc)),
        },
        GemvVariant {
            name: "cublas_sgemm",
            cublas: true,
            takes: |_| true,
            launch: Box::new(|out, inp, w, _bias, rows, c, oc| blas.gemm(out, inp, w, rows, oc, c)),
        },
        GemvVariant {
            name: "ours_gemv",
            cublas: false,
            takes: |rows| rows <= MATMUL_GEMV_MAX_ROWS as usize,
            launch: Box::new(|out, inp, w, bias, rows, c, oc| {
                matmul_forward_with(
                    gpu,
                    MatmulOptions {
                        kernel: MatmulKernel::Gemv,
                        gelu: false,
                        workspace: None,
                    },
                    out,
                    inp,
                    w,
                    bias,
                    MatmulShape::new(rows, oc, c),
                )?;
                Ok(())
            }),
        },
    ];
    // The decode step's fused GEMV (plain epilogue: bias), launched as in
    // the engine's graph, with and without programmatic dependent launch
    // (PDL only matters between kernels: in the graph pass here, one call's
    // weight loads overlap the previous call's tail).
    let decode_ws = &decode_ws;
    variants.extend(
        [("ours_decode_gemv", false), ("ours_decode_gemv_pdl", true)].map(|(name, pdl)| GemvVariant {
            name,
            cublas: false,
            takes: |rows| rows <= DECODE_MAX_ROWS as usize,
            launch: Box::new(move |out, inp, w, bias, rows, c, oc| {
                let weights = GemvWeights {
                    ln: None,
                    weight: WeightRef::F32(w),
                    bias,
                };
                decode_gemv_bench(gpu, decode_ws, pdl, out, inp, weights, MatmulShape::new(rows, oc, c))
            }),
        }),
    );
    let all_rows: &[usize] = if args.quick { &GEMV_QUICK_ROWS } else { &GEMV_ROWS };
    println!(
        "{:>8} {:>11} {:>4}  {:16} {:>9} {:>9} {:>8} {:>7} {:>9}",
        "shape", "oc x c", "rows", "variant", "graph us", "stream us", "GB/s", "% copy", "/ cuBLAS"
    );
    for (shape, oc, c, has_bias) in GEMV_SHAPES {
        // Weight copies: uploaded once, copied on the device.
        let w_bytes = 4 * oc * c;
        let sets = (GEMV_L2_MULTIPLE * report.l2_bytes).div_ceil(w_bytes).max(2);
        let first = gpu.upload(&fill_random(oc * c, 1000 + oc as u64 + c as u64))?;
        let mut weights = vec![first];
        for _ in 1..sets {
            let mut w = gpu.alloc::<f32>(oc * c)?;
            gpu.memcpy_dtod(&weights[0], &mut w)?;
            weights.push(w);
        }
        let bias = gpu.upload(&fill_random(oc, 7))?;
        let bias = has_bias.then_some(&bias);
        for &rows in all_rows {
            let inp: Vec<CudaSlice<f32>> = (0..sets)
                .map(|i| gpu.upload(&fill_random(rows * c, 2 * i as u64 + 1)))
                .collect::<Result<_, _>>()?;
            let mut out: Vec<CudaSlice<f32>> = (0..sets)
                .map(|_| gpu.upload(&vec![f32::NAN; rows * oc]))
                .collect::<Result<_, _>>()?;
            let bytes = 4 * (oc * c + rows * c + rows * oc + if has_bias { oc } else { 0 });
            let floor_us = bytes as f64 / (copy_gbs * 1e9) * 1e6;
            // (name, cublas, graph timing, stream timing)
            let mut measured: Vec<(&str, bool, Option<Timing>, Timing)> = Vec::new();
            for v in variants.iter().filter(|v| (v.takes)(rows)) {
                let mut call = |i: usize| (v.launch)(&mut out[i], &inp[i], &weights[i], bias, rows, c, oc);
                let stream = time_calls::<anyhow::Error>(gpu, sets, args.warmup, samples, &mut call)?;
                let graph = match time_graph(gpu, sets, args.warmup, samples, &mut call) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        let note = format!("gemv {shape} rows={rows} {}: CUDA graph timing failed: {e:#}", v.name);
                        println!("   {note}");
                        report.notes.push(note);
                        gpu.synchronize()?;
                        None
                    }
                };
                measured.push((v.name, v.cublas, graph, stream));
            }
            let headline = |g: &Option<Timing>, s: &Timing| g.map_or(s.median_us, |g| g.median_us);
            let best_cublas = measured
                .iter()
                .filter(|m| m.1)
                .map(|m| headline(&m.2, &m.3))
                .min_by(|a, b| a.total_cmp(b));
            let pct = |us: f64| bytes as f64 / (us * 1e-6) / 1e9 / copy_gbs * 100.0;
            println!(
                "{shape:>8} {:>11} {rows:>4}  {:16} {floor_us:>9.2} {:>9} {copy_gbs:>8.0} {:>7.1} {:>9}",
                format!("{oc}x{c}"),
                "floor (copy bw)",
                "-",
                100.0,
                best_cublas.map_or("-".into(), |b| format!("{:.2}", floor_us / b))
            );
            for (name, cublas, graph, stream) in &measured {
                let us = headline(graph, stream);
                let gbs = bytes as f64 / (us * 1e-6) / 1e9;
                let vs = best_cublas.map(|b| us / b);
                println!(
                    "{shape:>8} {:>11} {rows:>4}  {name:16} {:>9} {:>9.2} {gbs:>8.0} {:>7.1} {:>9}",
                    format!("{oc}x{c}"),
                    graph.map_or("-".into(), |g| format!("{:.2}", g.median_us)),
                    stream.median_us,
                    pct(us),
                    vs.map_or("-".into(), |v| format!("{v:.2}")),
                );
                report.gemv.push(serde_json::json!({
                    "shape": shape, "oc": oc, "c": c, "rows": rows, "bias": has_bias, "variant": name,
                    "cublas": cublas, "median_us": us, "timed_as": if graph.is_some() { "graph" } else { "stream" },
                    "timing_graph": graph, "timing_stream": stream, "bytes": bytes, "gb_s": gbs,
                    "pct_of_copy": pct(us), "floor_us": floor_us, "copy_gb_s": copy_gbs,
                    "vs_cublas_time": vs, "weight_copies": sets,
                }));
            }
        }
    }
    Ok(())
}

fn timing_us(t: &host::bench::Timing) -> f64 {
    t.median_us
}

/// Our FP32 matmuls (`host::gpu::ops::matmul`): `auto` is what the engine
/// runs (GEMV, chunked GEMV, the small-M kernel or the tiled plan, split-K
/// allowed); `tiled` the tiled kernel unsplit (tile by the wave model);
/// `splitk` the tiled plan with split-K allowed even where `auto` would take
/// another kernel; `small` the small-M kernel's planned split (up to
/// `SMALL_MAX_ROWS` rows); `gemv_chunked` at M <= 64; the naive one up to
/// 1024 rows (it takes seconds at M = 8192 x 50304 and only sets the
/// baseline); up to 1024 rows also each tile unsplit (`tile128`, `tile64`),
/// every split of the tiled and (M <= `SMALL_MAX_ROWS`) small-M kernels.
/// Workspaces are allocated once per shape, outside the timing.
fn fp32_hook(gpu: &Gpu, args: &Args, sets: &mut GemmSets) -> anyhow::Result<Vec<(String, host::bench::Timing)>> {
    let (m, n, k, sn) = (sets.m, sets.n, sets.k, sets.sets());
    let gemm = MatmulShape::new(m, n, k);
    let mut ws = MatmulWorkspace::new(gpu, split_k_workspace_floats(gemm, gpu.sm_count()))?;
    let mut kernels = vec![
        ("ours_fp32_auto", MatmulKernel::Auto),
        ("ours_fp32_tiled", MatmulKernel::Tiled),
        ("ours_fp32_splitk", MatmulKernel::SplitK),
    ];
    if m <= SMALL_MAX_ROWS {
        kernels.push(("ours_fp32_small", MatmulKernel::Small));
    }
    if m <= FP32_CHUNKED_GEMV_MAX_ROWS {
        kernels.push(("ours_fp32_gemv_chunked", MatmulKernel::GemvChunked));
    }
    if m <= NAIVE_MAX_M {
        kernels.push(("ours_fp32_naive", MatmulKernel::Naive));
    }
    let mut res = Vec::new();
    for (name, kernel) in kernels {
        let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
            let GemmSets { inp, w, out, .. } = &mut *sets;
            matmul_forward_with(
                gpu,
                MatmulOptions {
                    kernel,
                    gelu: false,
                    workspace: Some(&mut ws),
                },
                &mut out[i],
                &inp[i],
                &w[i],
                None::<&CudaSlice<f32>>,
                gemm,
            )?;
            Ok(())
        })?;
        res.push((name.to_string(), t));
    }
    // FP32 on the tensor cores (3xTF32), as the engine calls it (its split
    // partials in the same workspace), then each tile with its plan's
    // split count.
    let floats = ws.floats();
    let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
        let GemmSets { inp, w, out, .. } = &mut *sets;
        let bias = None::<&CudaSlice<f32>>;
        matmul_forward_fp32_tc(gpu, Some(ws.partial_mut()), &mut out[i], &inp[i], &w[i], bias, gemm)?;
        Ok(())
    })?;
    res.push(("ours_fp32_tc_auto".to_string(), t));
    for shape in &fp32_tc_variants(gpu.has_wgmma()) {
        let (_, splits) = fp32_tc_plan(gemm, gpu.sm_count(), floats, shape.engine == TileEngine::Wgmma);
        let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
            let GemmSets { inp, w, out, .. } = &mut *sets;
            let bias = None::<&CudaSlice<f32>>;
            let part = Some(ws.partial_mut());
            matmul_forward_fp32_tc_with(
                gpu,
                Tf32TileOptions {
                    splits,
                    split_workspace: part,
                    ..Tf32TileOptions::new(*shape)
                },
                &mut out[i],
                &inp[i],
                &w[i],
                bias,
                gemm,
            )?;
            Ok(())
        })?;
        let tile = shape.name.trim_start_matches("matmul_forward_");
        res.push((format!("ours_fp32_tc_{tile}_s{splits}"), t));
    }
    if m <= FP32_EACH_TILE_MAX_M {
        for tile in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
            let plan = TiledPlan::unsplit(tile, k);
            let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
                let GemmSets { inp, w, out, .. } = &mut *sets;
                let bias = None::<&CudaSlice<f32>>;
                matmul_forward_plan(
                    gpu,
                    MatmulOptions {
                        kernel: plan,
                        gelu: false,
                        workspace: None,
                    },
                    &mut out[i],
                    &inp[i],
                    &w[i],
                    bias,
                    gemm,
                )?;
                Ok(())
            })?;
            res.push((format!("ours_fp32_tile{tile}"), t));
        }
        // The small-M kernel at every split count of the sweep (rows
        // `ours_fp32_small_s<splits>`): what its model's choice is measured
        // against.
        if m <= SMALL_MAX_ROWS {
            let mut last = 0;
            for s in FP32_SMALL_SWEEP_SPLITS {
                let plan = SmallPlan::split(k, s);
                if plan.splits == last {
                    continue;
                }
                last = plan.splits;
                let mut sweep_ws = MatmulWorkspace::new(gpu, plan.workspace_floats(gemm))?;
                let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut *sets;
                    let bias = None::<&CudaSlice<f32>>;
                    let ws = Some(&mut sweep_ws);
                    matmul_forward_small(
                        gpu,
                        MatmulOptions {
                            kernel: plan,
                            gelu: false,
                            workspace: ws,
                        },
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        bias,
                        gemm,
                    )?;
                    Ok(())
                })?;
                res.push((format!("ours_fp32_small_s{}", plan.splits), t));
            }
        }
        // Every split of both tiles (rows `ours_fp32_t<tile>_s<splits>`): what
        // the wave model's choice is measured against.
        for tile in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
            let mut last = 1;
            for s in FP32_SWEEP_SPLITS {
                let plan = TiledPlan::split(tile, k, s);
                let floats = plan.workspace_floats(gemm);
                if plan.splits == last || floats > FP32_SWEEP_MAX_WORKSPACE {
                    continue;
                }
                last = plan.splits;
                let mut sweep_ws = MatmulWorkspace::new(gpu, floats)?;
                let t = time_calls::<anyhow::Error>(gpu, sn, args.warmup, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut *sets;
                    let bias = None::<&CudaSlice<f32>>;
                    let ws = Some(&mut sweep_ws);
                    matmul_forward_plan(
                        gpu,
                        MatmulOptions {
                            kernel: plan,
                            gelu: false,
                            workspace: ws,
                        },
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        bias,
                        gemm,
                    )?;
                    Ok(())
                })?;
                res.push((format!("ours_fp32_t{tile}_s{}", plan.splits), t));
            }
        }
    }
    Ok(res)
}

/// Attention variants at GPT-2 124M's shape (C = 768, NH = 12, HS = 64), for
/// T in `ATTN_T` and B in `ATTN_B`: prefill (t = T at pos0 = 0) and one
/// decode step (t = 1 at pos0 = T - 1 over a filled cache). Each call includes
/// its K,V store, as in the engine. Operand sets (qkv, K/V caches, out) are
/// rotated so one pass spans more than L2. Prefill reports TFLOP/s over the
/// causal half (QKᵀ and PV: 4·B·NH·HS·T(T+1)/2 FLOPs); decode reports the
/// GB/s of the K/V it reads. `flash/unfused` is the time ratio (< 1: flash
/// is faster) against the unfused kernel with the same window.
fn bench_attention(gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let (c, nh) = (ATTN_C, ATTN_NH);
    let hs = c / nh;
    println!(
        "\n== attention, C={c} NH={nh}, median of {} samples (flash/unfused: time ratio vs unfused, same window)",
        args.samples
    );
    println!(
        "{:>7} {:>2} {:>5}  {:22} {:>10} {:>12} {:>14}",
        "what", "B", "T", "variant", "time us", "TFLOP/s|GB/s", "flash/unfused"
    );
    #[derive(Clone, Copy, PartialEq)]
    enum V {
        Unfused,
        Naive,
        Flash(FlashPrecision),
        /// TF32 flash prefill with its `kv_split` forced (1 or 2).
        FlashTf32Split(u32),
        /// The bf16 prefill with its ring's depth forced.
        FlashBf16Stages(u32),
        /// Flash-decoding over a bf16 cache (the bf16 engine's).
        FlashDecodeBf16Cache,
        /// A tensor-core prefill with its key chunks forced (0: none).
        FlashChunks(FlashPrecision, u32),
    }
    for decode in [false, true] {
        for &b in &ATTN_B {
            let ts: &[usize] = if args.attn_t.is_empty() { &ATTN_T } else { &args.attn_t };
            for &t_cache in ts {
                let (t, pos0) = if decode { (1, t_cache - 1) } else { (t_cache, 0) };
                let max_t = t_cache;
                let mut sets = AttnSets::new(gpu, b, t, max_t, c)?;
                let mut ws = FlashWorkspace::new(gpu, b, nh, max_t)?;
                // (name, kernel, window): decode is FP32 flash-decoding either way, so one flash row.
                let mut variants: Vec<(String, V, usize)> = vec![("unfused".into(), V::Unfused, 0)];
                if t_cache <= ATTN_NAIVE_MAX_T {
                    variants.push(("naive".into(), V::Naive, 0));
                }
                if decode {
                    variants.push(("flash_decode".into(), V::Flash(FlashPrecision::Fp32), 0));
                    variants.push(("flash_decode_kv_bf16".into(), V::FlashDecodeBf16Cache, 0));
                } else {
                    variants.push(("flash_fp32".into(), V::Flash(FlashPrecision::Fp32), 0));
                    variants.push(("flash_tf32".into(), V::Flash(FlashPrecision::Tf32), 0));
                    variants.push(("flash_bf16".into(), V::Flash(FlashPrecision::Bf16), 0));
                    for stages in [3, 2] {
                        variants.push((format!("flash_bf16_stages{stages}"), V::FlashBf16Stages(stages), 0));
                    }
                    // Both tile plans, to check the automatic choice.
                    for split in [1, 2] {
                        variants.push((format!("flash_tf32_split{split}"), V::FlashTf32Split(split), 0));
                    }
                    // Key chunks, to check the automatic choice.
                    for chunk in ATTN_CHUNK_TILES {
                        let bf16 = V::FlashChunks(FlashPrecision::Bf16, chunk);
                        variants.push((format!("flash_bf16_chunks{chunk}"), bf16, 0));
                        let tf32 = V::FlashChunks(FlashPrecision::Tf32, chunk);
                        variants.push((format!("flash_tf32_chunks{chunk}"), tf32, 0));
                    }
                }
                if t_cache > ATTN_WINDOW {
                    variants.push((format!("unfused_w{ATTN_WINDOW}"), V::Unfused, ATTN_WINDOW));
                    let (name, prec) = if decode {
                        ("flash_decode", FlashPrecision::Fp32)
                    } else {
                        ("flash_tf32", FlashPrecision::Tf32)
                    };
                    variants.push((format!("{name}_w{ATTN_WINDOW}"), V::Flash(prec), ATTN_WINDOW));
                    if !decode {
                        let bf16 = V::Flash(FlashPrecision::Bf16);
                        variants.push((format!("flash_bf16_w{ATTN_WINDOW}"), bf16, ATTN_WINDOW));
                    }
                }
                let mut rows: Vec<(String, usize, Timing)> = Vec::new();
                for (name, v, window) in variants {
                    ws.force_tf32_kv_split(match v {
                        V::FlashTf32Split(split) => Some(split),
                        _ => None,
                    });
                    ws.force_bf16_stages(match v {
                        V::FlashBf16Stages(stages) => Some(stages),
                        _ => None,
                    });
                    ws.force_prefill_chunk_tiles(match v {
                        V::FlashChunks(_, chunk) => Some(chunk),
                        _ => None,
                    });
                    let shape = AttentionShape {
                        b,
                        t,
                        pos0,
                        max_t,
                        c,
                        nh,
                        window,
                    };
                    let flash = match v {
                        V::Flash(prec) => Some(prec),
                        V::FlashTf32Split(_) => Some(FlashPrecision::Tf32),
                        V::FlashBf16Stages(_) => Some(FlashPrecision::Bf16),
                        V::FlashChunks(prec, _) => Some(prec),
                        V::FlashDecodeBf16Cache => Some(FlashPrecision::Fp32),
                        V::Unfused | V::Naive => None,
                    };
                    // The bf16 kernels keep a bf16 cache (flash-decoding takes either).
                    let bf16_cache = flash == Some(FlashPrecision::Bf16) || v == V::FlashDecodeBf16Cache;
                    let timing = time_calls::<anyhow::Error>(gpu, sets.sets(), args.warmup, args.samples, |i| {
                        let AttnSets {
                            qkv,
                            k,
                            v: vc,
                            k16,
                            v16,
                            out,
                        } = &mut sets;
                        let (o, kc, vcc, q) = (&mut out[i], &mut k[i], &mut vc[i], &qkv[i]);
                        if let (true, Some(precision)) = (bf16_cache, flash) {
                            let opts = FlashOptions { precision, ws: &mut ws };
                            attention_forward_flash(gpu, o, &mut k16[i], &mut v16[i], q, shape, opts)?;
                            return Ok(());
                        }
                        match (v, flash) {
                            (_, Some(precision)) => {
                                let opts = FlashOptions { precision, ws: &mut ws };
                                attention_forward_flash(gpu, o, kc, vcc, q, shape, opts)?
                            }
                            (V::Naive, None) => attention_forward_naive(gpu, o, kc, vcc, q, shape)?,
                            (_, None) => attention_forward(gpu, o, kc, vcc, q, shape)?,
                        }
                        Ok(())
                    })?;
                    rows.push((name, window, timing));
                }
                let unfused = |w: usize| {
                    rows.iter()
                        .find(|(n, win, _)| n.starts_with("unfused") && *win == w)
                        .map(|r| r.2.median_us)
                };
                for (name, window, timing) in &rows {
                    let us = timing.median_us;
                    let keys = |p: usize| if *window == 0 { p + 1 } else { (p + 1).min(*window) };
                    // Attended (query, key) pairs of one (row, head).
                    let pairs: usize = (pos0..pos0 + t).map(keys).sum();
                    let (rate, unit) = if decode {
                        // K and V of every attended key, once per (row, head).
                        let elem = if name.contains("kv_bf16") { 2 } else { 4 };
                        let bytes = 2.0 * (b * nh * pairs * hs * elem) as f64;
                        (bytes / (us * 1e-6) / 1e9, "GB/s")
                    } else {
                        (tflops(4.0 * (b * nh * hs * pairs) as f64, us), "TFLOP/s")
                    };
                    let ratio = match (name.starts_with("unfused"), unfused(*window)) {
                        (false, Some(u)) => Some(us / u),
                        _ => None,
                    };
                    let what = if decode { "decode" } else { "prefill" };
                    println!(
                        "{what:>7} {b:>2} {t_cache:>5}  {name:22} {us:>10.1} {rate:>7.1} {unit:<4} {:>14}",
                        ratio.map_or("-".into(), |r| format!("{r:.3}"))
                    );
                    report.attention.push(serde_json::json!({
                        "what": what, "b": b, "t_cache": t_cache, "t": t, "pos0": pos0, "c": c, "nh": nh,
                        "variant": name, "window": window, "timing": timing, "rate": rate, "rate_unit": unit,
                        "flash_over_unfused": ratio,
                    }));
                }
            }
        }
    }
    Ok(())
}

/// Median time of one `forward` call, between CUDA events, over warm-up +
/// samples calls made by `call(i)`.
fn time_forward(
    engine: &mut GpuEngine,
    args: &Args,
    call: impl FnMut(&mut GpuEngine, usize) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, usize)> {
    time_forward_enqueue(engine, args, call).map(|(ms, n, _)| (ms, n))
}

/// [`time_forward`], plus the median wall-clock time the host spent in
/// `call` (enqueueing its launches): where it is close to the GPU's time,
/// the call is bound by its launches, not by its kernels.
fn time_forward_enqueue(
    engine: &mut GpuEngine,
    args: &Args,
    mut call: impl FnMut(&mut GpuEngine, usize) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, usize, f64)> {
    let (mut samples, mut host) = (Vec::new(), Vec::new());
    for i in 0..args.warmup + args.samples {
        let start = engine.gpu().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let wall = std::time::Instant::now();
        call(engine, i)?;
        let enqueued = wall.elapsed().as_secs_f64() * 1e3;
        let end = engine.gpu().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let ms = start.elapsed_ms(&end)? as f64;
        if i >= args.warmup {
            samples.push(ms);
            host.push(enqueued);
        }
    }
    Ok((median(&mut samples), samples.len(), median(&mut host)))
}

/// Slots of the server's engine in `bench slots`.
const SLOTS_MAX: usize = 128;
/// Rows of the decode steps `bench slots` times.
const SLOTS_ROWS: [usize; 7] = [1, 8, 9, 16, 32, 64, 128];
/// Prompt tokens each slot holds before the timed steps (the load test's ~32).
const SLOTS_PROMPT: usize = 32;
/// Activation rows of that engine (the server's default prefill chunk).
const SLOTS_CHUNK: usize = 256;

/// The server's decode step without HTTP (`SlotBackend` on `GpuEngine`,
/// GPT-2 124M random weights, FP32 and bf16, `SLOTS_MAX` slots each holding
/// a `SLOTS_PROMPT`-token prompt): one greedy step of `n` rows, `decode` then
/// `choose` (which reads the ids back), in rows `0..n`, as the scheduler
/// runs it. Wall-clock per step (host work, launches, the read-back: what a
/// stream's inter-token gap is made of), median of `--samples` after
/// `--warmup`; FP32 also with its matmuls on the CUDA cores (`Fp32cc`).
fn bench_slots(args: &Args, report: &mut Report) -> anyhow::Result<()> {
    use host::serve::backend::{Draw, SlotBackend, SlotToken};
    let config = ModelConfig::GPT2_124M;
    println!(
        "\n== server decode steps (SlotBackend), GPT-2 124M random weights, {SLOTS_MAX} slots, wall-clock median of {} steps",
        args.samples
    );
    println!("{:>6} {:>5} {:>12} {:>12}", "prec", "rows", "ms/step", "tokens/s");
    let bytes = llmc_bytes(&config, E2E_SEED, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    let greedy = SampleRow {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        _pad: 0,
        seed: 0,
    };
    for (label, precision, tc) in [
        ("Fp32", Precision::Fp32, true),
        ("Fp32cc", Precision::Fp32, false),
        ("Bf16", Precision::Bf16, true),
    ] {
        let gpu = Gpu::new(args.device)?;
        let mut engine = GpuEngine::with_rows(gpu, &weights, SLOTS_MAX, config.max_seq_len, SLOTS_CHUNK, precision)?;
        engine.set_fp32_tensor_cores(tc);
        let mut rng = rand::rng();
        for slot in 0..SLOTS_MAX {
            let prompt: Vec<u32> = (0..SLOTS_PROMPT)
                .map(|_| rng.random_range(0..config.vocab_size as u32))
                .collect();
            engine.prefill(slot, &prompt, 0)?;
        }
        let rows: &[usize] = if args.slot_rows.is_empty() {
            &SLOTS_ROWS
        } else {
            &args.slot_rows
        };
        for &n in rows {
            anyhow::ensure!(
                (1..=SLOTS_MAX).contains(&n),
                "--slot-rows {n}: each must be 1 to {SLOTS_MAX}"
            );
            let mut samples = Vec::with_capacity(args.samples);
            for i in 0..args.warmup + args.samples {
                // Every step at the same positions: the cache rows past the
                // prompt are rewritten, the work per step stays the same.
                let pos = SLOTS_PROMPT + i % 2;
                let rows: Vec<SlotToken> = (0..n)
                    .map(|slot| SlotToken {
                        slot,
                        token: rng.random_range(0..config.vocab_size as u32),
                        pos,
                    })
                    .collect();
                let draws: Vec<Draw> = (0..n)
                    .map(|slot| Draw {
                        settings: greedy,
                        counter: pos as u32 + 1,
                        stream: slot as u32,
                    })
                    .collect();
                let profiled = args.profile_slots && i + 1 == args.warmup + args.samples;
                if profiled {
                    engine.gpu().synchronize()?;
                    // SAFETY: no arguments; starts the profiler's collection range.
                    unsafe { cudarc::driver::sys::cuProfilerStart() };
                }
                let start = std::time::Instant::now();
                engine.decode(&rows)?;
                engine.choose(&draws)?;
                let ms = start.elapsed().as_secs_f64() * 1e3;
                if profiled {
                    engine.gpu().synchronize()?;
                    // SAFETY: as above; stops it.
                    unsafe { cudarc::driver::sys::cuProfilerStop() };
                }
                if i >= args.warmup {
                    samples.push(ms);
                }
            }
            let med = median(&mut samples);
            println!("{label:>6} {n:>5} {med:>12.3} {:>12.0}", n as f64 / (med * 1e-3));
            report.e2e.push(serde_json::json!({"precision": label, "what": "slot_step", "b": n, "median_ms": med, "samples": samples.len()}));
        }
    }
    Ok(())
}

/// End to end on `GpuEngine` with a random GPT-2 124M checkpoint: prefill
/// latency per (B, T) and decode tokens/s at batch 1 and 8, for both
/// precisions, on the engine's default (flash) attention; prefill of
/// `E2E_COMPARE_KINDS` also with the unfused attention, and windowed prefill
/// (`E2E_WINDOWED`) on both. Each timed call is one `Backend::forward`
/// between CUDA events (whatever host work it does in between is included:
/// that is the latency a user sees).
fn bench_e2e(_gpu: &Gpu, args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let config = ModelConfig::GPT2_124M;
    println!(
        "\n== end to end, GPT-2 124M random weights, median of {} samples",
        args.samples
    );
    let bytes = llmc_bytes(&config, E2E_SEED, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    println!(
        "{:>6} {:>8} {:>7} {:>6} {:>6} {:>6} {:>12} {:>12} {:>12}",
        "prec", "attn", "what", "B", "T", "window", "median ms", "tokens/s", "enqueue ms"
    );
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let gpu = Gpu::new(args.device)?;
        let mut engine = GpuEngine::new(gpu, &weights, E2E_MAX_BATCH, config.max_seq_len, precision)?;
        let mut rng = rand::rng();
        let mut tokens =
            |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..config.vocab_size as u32)).collect() };
        let prec = format!("{precision:?}");
        // (attention, B, T, window) of every prefill measurement.
        let mut prefills: Vec<(AttentionKind, usize, usize, usize)> = E2E_PREFILL
            .iter()
            .map(|&(b, t)| (AttentionKind::Flash, b, t, 0))
            .collect();
        prefills.extend(
            E2E_COMPARE_KINDS
                .iter()
                .map(|&(b, t)| (AttentionKind::Unfused, b, t, 0)),
        );
        for &(b, t, w) in &E2E_WINDOWED {
            prefills.push((AttentionKind::Flash, b, t, w));
            prefills.push((AttentionKind::Unfused, b, t, w));
        }
        for (kind, b, t, window) in prefills {
            engine.set_attention_kind(kind);
            engine.set_attention_window(window);
            let attn = format!("{:?}", engine.attention_in_use());
            let toks = tokens(b * t);
            let (med, n, host_ms) =
                time_forward_enqueue(&mut engine, args, |e, _| e.forward(&toks, b, t, 0, LogitsWanted::Last))?;
            println!(
                "{prec:>6} {attn:>8} {:>7} {b:>6} {t:>6} {window:>6} {med:>12.3} {:>12.0} {host_ms:>12.3}",
                "prefill",
                (b * t) as f64 / (med * 1e-3)
            );
            report.e2e.push(serde_json::json!({"precision": prec, "attention": attn, "what": "prefill", "b": b, "t": t, "window": window, "median_ms": med, "samples": n, "enqueue_ms": host_ms}));
        }
        engine.set_attention_kind(AttentionKind::Flash);
        engine.set_attention_window(0);
        if precision == Precision::Fp32 {
            // The FP32 matmuls on the CUDA cores (`Fp32cc`), as before they
            // ran as 3xTF32 on the tensor cores by default.
            engine.set_fp32_tensor_cores(false);
            for &(b, t) in &E2E_PREFILL {
                let toks = tokens(b * t);
                let (med, n) = time_forward(&mut engine, args, |e, _| e.forward(&toks, b, t, 0, LogitsWanted::Last))?;
                let attn = format!("{:?}", engine.attention_in_use());
                println!(
                    "{:>6} {attn:>8} {:>7} {b:>6} {t:>6} {:>6} {med:>12.3} {:>12.0}",
                    "Fp32cc",
                    "prefill",
                    0,
                    (b * t) as f64 / (med * 1e-3)
                );
                report.e2e.push(serde_json::json!({"precision": "Fp32cc", "attention": attn, "what": "prefill", "b": b, "t": t, "window": 0, "median_ms": med, "samples": n}));
            }
            engine.set_fp32_tensor_cores(true);
        }
        let attn = format!("{:?}", engine.attention_in_use());
        bench_decode_paths(&mut engine, args, &prec, report, &mut tokens)?;
        engine.set_decode_path(DecodePath::Graph, true);
        for b in E2E_DECODE_BATCH {
            let toks = tokens(b * E2E_DECODE_PROMPT);
            engine.forward(&toks, b, E2E_DECODE_PROMPT, 0, LogitsWanted::Last)?;
            let step = tokens(b);
            let (med, n) = time_forward(&mut engine, args, |e, i| {
                e.forward(&step, b, 1, E2E_DECODE_PROMPT + i, LogitsWanted::Last)
            })?;
            let tps = b as f64 / (med * 1e-3);
            println!(
                "{prec:>6} {attn:>8} {:>7} {b:>6} {:>6} {:>6} {med:>12.3} {tps:>12.0}",
                "decode", E2E_DECODE_PROMPT, 0
            );
            report.e2e.push(serde_json::json!({"precision": prec, "attention": attn, "what": "decode", "b": b, "pos0": E2E_DECODE_PROMPT, "median_ms_per_step": med, "tokens_per_s": tps, "samples": n}));
        }
    }
    Ok(())
}

/// Steps each device-driven decode sample runs back to back.
const DECODE_DEVICE_STEPS: usize = 32;

/// Decode steps on every path (`DecodePath`: graph and eager with and
/// without PDL, and the per-op kernels) at batch 1 and 8 after
/// `E2E_DECODE_PROMPT` tokens. Two timings per path:
/// - `host`: one `forward(t = 1)` plus `argmax()` per step, as the
///   generation loop calls them (uploads, launch or replay, the id read
///   back and the wait for it), CUDA-event timed per step;
/// - `device` (fused paths): `DECODE_DEVICE_STEPS` steps fed by the device
///   (`decode_on_device`) between two events, per step: the GPU's own step
///   time, with no host round trip between steps.
fn bench_decode_paths(
    engine: &mut GpuEngine,
    args: &Args,
    prec: &str,
    report: &mut Report,
    tokens: &mut impl FnMut(usize) -> Vec<u32>,
) -> anyhow::Result<()> {
    let base = DecodeTuning::default();
    // The default (the persistent step where it serves the batch on sm_90a:
    // one row over f32 weights, up to 8 over bf16), the chain of fused kernels, and one L2-prefetch experiment
    // on the chain; the other chain knobs were measured slower
    // (docs/performance.md).
    let chain = DecodeTuning {
        persistent: false,
        ..base
    };
    let prefetch = DecodeTuning {
        prefetch_ahead_bytes: PREFETCH_AHEAD_TRY_BYTES,
        ..chain
    };
    // The persistent step at every batch it serves (the default takes it
    // at one row over f32 weights), and with a weight ring of 3 and 4
    // smaller slots.
    let persistent = DecodeTuning {
        persistent_max_rows: DECODE_STEP_MAX_ROWS as usize,
        persistent_max_rows_bf16: DECODE_STEP_MAX_ROWS as usize,
        ..base
    };
    let ring3 = DecodeTuning {
        step_ring_slots: 3,
        ..persistent
    };
    let ring4 = DecodeTuning {
        step_ring_slots: 4,
        ..persistent
    };
    // (path, PDL, launch knobs, sampled): sampled steps use the CLI's
    // default settings (temperature 0.8, top-k 40, top-p 0.95).
    let paths = [
        (DecodePath::Graph, true, base, false),
        (DecodePath::Graph, true, base, true),
        (DecodePath::Graph, true, chain, false),
        (DecodePath::Graph, true, chain, true),
        (DecodePath::Graph, true, prefetch, false),
        (DecodePath::Graph, true, persistent, false),
        (DecodePath::Graph, true, persistent, true),
        (DecodePath::Graph, true, ring3, false),
        (DecodePath::Graph, true, ring4, false),
        (DecodePath::Graph, false, base, false),
        (DecodePath::Graph, false, chain, false),
        (DecodePath::Eager, true, base, false),
        (DecodePath::Eager, true, chain, false),
        (DecodePath::Eager, false, chain, false),
        (DecodePath::Unfused, false, base, false),
    ];
    let sample_row = Sampler::new(SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: Some(E2E_SEED),
    })?
    .row();
    for b in E2E_DECODE_BATCH {
        let prompt = tokens(b * E2E_DECODE_PROMPT);
        let rows = vec![sample_row; b];
        for (path, pdl, tuning, sampled) in paths {
            engine.set_decode_path(path, pdl);
            engine.set_decode_tuning(tuning);
            engine.prepare_sampling(sampled.then_some(&rows[..]))?;
            engine.forward(&prompt, b, E2E_DECODE_PROMPT, 0, LogitsWanted::Last)?;
            let step = tokens(b);
            let (host_ms, n) = time_forward(engine, args, |e, i| {
                let pos = E2E_DECODE_PROMPT + i;
                e.forward(&step, b, 1, pos, LogitsWanted::Last)?;
                if sampled {
                    e.sample(&rows, pos + 1)?;
                } else {
                    e.argmax()?;
                }
                Ok(())
            })?;
            let device_ms = if path != DecodePath::Unfused {
                Some(device_fed_ms(engine, args, &step, E2E_DECODE_PROMPT)?)
            } else {
                None
            };
            let shown = device_ms.map_or("-".to_string(), |m| format!("{m:.4}"));
            let persistent = engine.decode_step_is_persistent(b, E2E_DECODE_PROMPT);
            println!(
                "{prec:>6} decode {b:>2} rows after {E2E_DECODE_PROMPT}: {:>8} {:>10} pdl={pdl:<5} prefetch={:>2} MiB blocks/SM={} warps={} early={:<5} ring={} {} host {host_ms:.4} ms/step, device {shown} ms/step ({:.0} tok/s)",
                format!("{path:?}"),
                if persistent { "persistent" } else { "chain" },
                tuning.prefetch_ahead_bytes >> 20,
                tuning.gemv_blocks_per_sm,
                tuning.gemv_block_warps,
                tuning.early_trigger,
                tuning.step_ring_slots,
                if sampled { "sampled" } else { "greedy " },
                b as f64 / (device_ms.unwrap_or(host_ms) * 1e-3)
            );
            report.e2e.push(serde_json::json!({"precision": prec, "what": "decode_path", "path": format!("{path:?}"), "persistent": persistent, "pdl": pdl, "prefetch_bytes": tuning.prefetch_ahead_bytes, "gemv_blocks_per_sm": tuning.gemv_blocks_per_sm, "gemv_block_warps": tuning.gemv_block_warps, "early_trigger": tuning.early_trigger, "step_ring_slots": tuning.step_ring_slots, "sampled": sampled, "b": b, "pos0": E2E_DECODE_PROMPT, "host_ms_per_step": host_ms, "device_ms_per_step": device_ms, "samples": n}));
        }
    }
    engine.set_decode_path(DecodePath::default(), true);
    engine.set_decode_tuning(base);
    engine.prepare_sampling(None)?;
    Ok(())
}

/// A fused step's own time (ms): after a step from `step` at `pos0` (the
/// rows of `step`), `DECODE_DEVICE_STEPS` steps fed
/// by the device between two events, per step; median over the samples.
fn device_fed_ms(engine: &mut GpuEngine, args: &Args, step: &[u32], pos0: usize) -> anyhow::Result<f64> {
    let mut samples = Vec::new();
    for i in 0..args.warmup + args.samples {
        engine.forward(step, step.len(), 1, pos0, LogitsWanted::Last)?;
        // SAFETY: only events are recorded on it, on our own stream.
        let stream = unsafe { engine.gpu().stream() }.clone();
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        engine.decode_on_device(DECODE_DEVICE_STEPS)?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        if i >= args.warmup {
            samples.push(start.elapsed_ms(&end)? as f64 / DECODE_DEVICE_STEPS as f64);
        }
    }
    Ok(median(&mut samples))
}

/// `step` section: the decode step of one and of eight rows of GPT-2 124M (random weights,
/// FP32 and bf16) as the chain of fused kernels and as the persistent
/// kernel, device-fed as in `e2e`; then the persistent step traced
/// (`DecodeTuning::trace`, eager launches, one step at a time): per kind of
/// phase, where a block's time goes, medians over the samples.
fn bench_step(args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let config = ModelConfig::GPT2_124M;
    let pos0 = args.step_pos0;
    // A sample's device-fed steps, or the traced steps' offsets (up to 8), and the step itself.
    let room = config.max_seq_len.saturating_sub(1 + DECODE_DEVICE_STEPS);
    anyhow::ensure!(
        (1..=room).contains(&pos0),
        "--step-pos0 {pos0}: the step section needs 1 to {room} tokens in the cache"
    );
    let bytes = llmc_bytes(&config, E2E_SEED, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    for (b, precision) in E2E_DECODE_BATCH
        .into_iter()
        .flat_map(|b| [(b, Precision::Fp32), (b, Precision::Bf16)])
    {
        println!(
            "\n== decode step, {b} row(s) after {pos0} tokens, {precision:?}, GPT-2 124M random weights, median of {} samples",
            args.samples
        );
        let gpu = Gpu::new(args.device)?;
        let blocks = gpu.sm_count();
        let mut engine = GpuEngine::new(gpu, &weights, b, config.max_seq_len, precision)?;
        let mut rng = rand::rng();
        let mut tokens =
            |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..config.vocab_size as u32)).collect() };
        let prec = format!("{precision:?}");
        let prompt = tokens(b * pos0);
        let step = tokens(b);
        let base = DecodeTuning::default();
        let persistent = DecodeTuning {
            persistent: true,
            persistent_max_rows: DECODE_STEP_MAX_ROWS as usize,
            persistent_max_rows_bf16: DECODE_STEP_MAX_ROWS as usize,
            persistent_rows_max_keys: usize::MAX,
            persistent_rows_max_keys_bf16: usize::MAX,
            step_ring_slots: args.step_ring_slots,
            step_ring_fill: args.step_ring_fill,
            ..base
        };
        let chain = DecodeTuning {
            persistent: false,
            ..base
        };
        if args.step_ring_slots != 0 {
            println!(
                "  (the persistent step's ring: {} slots asked{})",
                args.step_ring_slots,
                if args.step_ring_fill {
                    ", filling shared memory"
                } else {
                    ""
                }
            );
        }
        engine.set_decode_path(DecodePath::Graph, true);
        for (name, tuning) in [("chain", chain), ("persistent", persistent)] {
            engine.set_decode_tuning(tuning);
            engine.forward(&prompt, b, pos0, 0, LogitsWanted::Last)?;
            let ms = device_fed_ms(&mut engine, args, &step, pos0)?;
            let ran = if engine.decode_step_is_persistent(b, pos0) {
                "persistent"
            } else {
                "chain"
            };
            println!("{prec:>6} {name:>10} (ran: {ran}): {ms:.4} ms/step, device-fed");
            report.e2e.push(serde_json::json!({"precision": prec, "what": "decode_step", "asked": name, "ran": ran, "b": b, "pos0": pos0, "device_ms_per_step": ms, "samples": args.samples}));
        }
        // The trace: eager launches (the graph would bake in a buffer the
        // first traced step allocates).
        engine.set_decode_path(DecodePath::Eager, true);
        engine.set_decode_tuning(DecodeTuning {
            trace: true,
            ..persistent
        });
        if !engine.decode_step_is_persistent(b, pos0) {
            println!("{prec:>6} no persistent step on this GPU: no trace");
            continue;
        }
        engine.forward(&prompt, b, pos0, 0, LogitsWanted::Last)?;
        let mut per_sample: Vec<Vec<PhaseTimes>> = Vec::new();
        let mut traced_ms = Vec::new();
        for i in 0..args.warmup + args.samples {
            engine.forward(&step, b, 1, pos0 + 1 + (i % 8), LogitsWanted::Last)?;
            // SAFETY: only events are recorded on it, on our own stream.
            let stream = unsafe { engine.gpu().stream() }.clone();
            let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            engine.decode_on_device(1)?;
            let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let words = engine.decode_step_trace()?.context("the traced step left no trace")?;
            let phases = phase_times(&words, blocks, config.num_layers).context("an incomplete trace")?;
            if i >= args.warmup {
                traced_ms.push(start.elapsed_ms(&end)? as f64);
                per_sample.push(by_kind(&phases));
            }
        }
        let ms = median(&mut traced_ms);
        println!(
            "{prec:>6} traced step {ms:.4} ms (eager, one step, a block barrier per phase more); per phase, µs, each kind's mean over the layers:"
        );
        let heads = [
            "period", "work med", "work max", "loaded", "staged", "w. wait", "compute", "tail", "issue", "barr min",
            "barr med",
        ];
        println!("{:>10}{}", "phase", heads.map(|h| format!("{h:>9}")).join(""));
        let mut steps_us = 0.0;
        for (k, kind) in PHASE_KINDS.iter().enumerate() {
            let col = |f: fn(&PhaseTimes) -> f64| {
                let mut v: Vec<f64> = per_sample
                    .iter()
                    .filter_map(|s| s.iter().find(|p| p.kind == k))
                    .map(f)
                    .collect();
                median(&mut v) / 1e3
            };
            let row = [
                col(|p| p.period),
                col(|p| p.work_med),
                col(|p| p.work_max),
                col(|p| p.loaded),
                col(|p| p.staged),
                col(|p| p.weight_wait),
                col(|p| p.compute),
                col(|p| p.tail),
                col(|p| p.issue),
                col(|p| p.barrier_min),
                col(|p| p.barrier_med),
            ];
            let count = if k + 1 == PHASE_KINDS.len() {
                1
            } else {
                config.num_layers
            };
            steps_us += row[0] * count as f64;
            println!("{kind:>10}{}", row.map(|v| format!("{v:>9.2}")).join(""));
            let us: serde_json::Map<String, serde_json::Value> =
                heads.iter().zip(row).map(|(h, v)| (h.to_string(), v.into())).collect();
            report.e2e.push(serde_json::json!({"precision": prec, "what": "decode_step_trace", "b": b, "phase": kind, "us": us, "samples": per_sample.len()}));
        }
        println!("{prec:>6} phases add up to {:.1} µs", steps_us);
    }
    Ok(())
}

/// One TF32 prefill shape timed like `e2e`, then one more forward inside a
/// profiler range (see the module docs).
fn bench_trace(args: &Args, report: &mut Report) -> anyhow::Result<()> {
    let config = ModelConfig::GPT2_124M;
    let (b, t) = args.trace_shape;
    anyhow::ensure!(
        (1..=E2E_MAX_BATCH).contains(&b) && (1..=config.max_seq_len).contains(&t),
        "--trace-shape {b},{t}: B must be 1..={E2E_MAX_BATCH}, T 1..={}",
        config.max_seq_len
    );
    let bytes = llmc_bytes(&config, E2E_SEED, DType::F32)?;
    let weights = host::model::llmc::parse(&bytes)?;
    let gpu = Gpu::new(args.device)?;
    let prec = args.trace_precision;
    let mut engine = GpuEngine::new(gpu, &weights, b, config.max_seq_len, prec)?;
    let mut rng = rand::rng();
    let toks: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let (med, n) = time_forward(&mut engine, args, |e, _| e.forward(&toks, b, t, 0, LogitsWanted::Last))?;
    println!("\n== trace: {prec:?} prefill B={b} T={t}: median {med:.3} ms over {n} samples");
    engine.gpu().synchronize()?;
    // SAFETY: no arguments; starts/stops the profiler's collection range.
    let started = unsafe { cudarc::driver::sys::cuProfilerStart() };
    engine.forward(&toks, b, t, 0, LogitsWanted::Last)?;
    engine.gpu().synchronize()?;
    // SAFETY: as above.
    let stopped = unsafe { cudarc::driver::sys::cuProfilerStop() };
    println!("profiler range: start {started:?}, stop {stopped:?}");
    report.e2e.push(
        serde_json::json!({"precision": format!("{prec:?}"), "what": "trace", "b": b, "t": t, "median_ms": med, "samples": n}),
    );
    Ok(())
}
