//! `tune`: sweep the TF32 matmul tile shapes per GEMM shape and write the
//! fastest to a JSON cache (`--out`, default the user's cache,
//! `~/.cache/gpt2/tune/<gpu>.json`, where the engine looks for it from any
//! directory; `GPT2_TUNE_CACHE` points the engine elsewhere).
//!
//! The cache maps "M,N,K" to the winning kernel name plus every variant's
//! median time; `matmul_forward_tf32` uses the winner for shapes in the cache
//! and `choose_tile`'s heuristic (printed beside it) for the rest. Timing as
//! in `bench`.

use anyhow::Context;
use clap::Parser;
use cudarc::driver::CudaSlice;
use gpu_host::shape::MatmulShape;
use host::bench::{DEFAULT_SAMPLES, DEFAULT_WARMUP, GemmSets, tf32_variants, time_calls};
use host::gpu::Gpu;
use host::gpu::ops::matmul_tf32::{MatmulTf32Error, Tf32TileOptions, TuneCache, choose_tile, matmul_forward_tf32_with};

/// Token counts swept: decode batches, short prompts, full contexts.
const TUNE_M: [usize; 7] = [1, 8, 64, 256, 1024, 4096, 8192];
/// GPT-2 124M's (N, K): qkv, attention projection, MLP up, MLP down, LM head.
const TUNE_NK: [(usize, usize); 5] = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)];

#[derive(Parser)]
#[command(about = "Sweep TF32 matmul tile shapes per GEMM shape; write the winners as JSON")]
struct Args {
    /// Output file; default `$XDG_CACHE_HOME/gpt2/tune/<gpu name>.json`
    /// (else under `~/.cache`), read by the engine.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = DEFAULT_SAMPLES)]
    samples: usize,
    #[arg(long, default_value_t = 0)]
    device: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let gpu = Gpu::new(args.device)?;
    let sms = gpu.sm_count();
    println!("device: {} ({sms} SMs)", gpu.name());
    println!(
        "{:>5} {:>6} {:>5}  {:30} {:30} {:>8}",
        "M", "N", "K", "best", "heuristic", "heur/best"
    );
    let mut cache = serde_json::Map::new();
    for m in TUNE_M {
        for (n, k) in TUNE_NK {
            let mut sets = GemmSets::new(&gpu, m, n, k)?;
            let sn = sets.sets();
            let mut times = serde_json::Map::new();
            let mut best: Option<(&str, f64)> = None;
            for shape in &tf32_variants(&gpu) {
                let t = time_calls::<MatmulTf32Error>(&gpu, sn, DEFAULT_WARMUP, args.samples, |i| {
                    let GemmSets { inp, w, out, .. } = &mut sets;
                    matmul_forward_tf32_with(
                        &gpu,
                        Tf32TileOptions::new(*shape),
                        &mut out[i],
                        &inp[i],
                        &w[i],
                        None::<&CudaSlice<f32>>,
                        MatmulShape::new(m, n, k),
                    )
                })?;
                times.insert(shape.name.into(), t.median_us.into());
                if best.is_none_or(|(_, b)| t.median_us < b) {
                    best = Some((shape.name, t.median_us));
                }
            }
            let (best_name, best_us) = best.context("no TF32 variants compiled")?;
            let heur = choose_tile(MatmulShape::new(m, n, k), sms, gpu.has_wgmma()).name;
            let heur_us = times[heur].as_f64().unwrap_or(f64::NAN);
            println!(
                "{m:>5} {n:>6} {k:>5}  {best_name:30} {heur:30} {:>8.2}",
                heur_us / best_us
            );
            cache.insert(
                format!("{m},{n},{k}"),
                serde_json::json!({"best": best_name, "best_us": best_us, "heuristic": heur, "median_us": times}),
            );
        }
    }
    let doc = serde_json::json!({"device": gpu.name(), "sms": sms, "shapes": cache});
    let out = match args.out {
        Some(out) => out,
        None => TuneCache::user_path(&gpu.name())
            .context("no cache directory (neither XDG_CACHE_HOME nor HOME is set): pass --out PATH")?,
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?).with_context(|| format!("writing {}", out.display()))?;
    println!("written to {}", out.display());
    Ok(())
}
