//! Flash attention (`host::gpu::ops::flash_attention`) against the CPU
//! reference `host::cpu::ops::attention_forward`.
//!
//! Every case draws fresh random qkv and cache prefixes, fills the cache past
//! `pos0 + t` with NaN (the kernels must never read it) and the output with
//! NaN (every element must be written), and checks the stored K,V bit for bit
//! and the output within the precision's bar. The bf16 kernels keep a bf16
//! cache (the bf16 engine's): its prefix is drawn as bf16 values, and the
//! stored K,V must be the CPU's rounded to nearest even. Each case prints max abs error,
//! RMSE and mismatches (`--nocapture`); failures are collected and reported
//! together at the end of each test.
//!
//! Bars: FP32 |gpu - cpu| <= 1e-5 (outputs are convex combinations of V rows
//! in [-1, 1], so this is 1e-5 relative to the data's scale); TF32 <= 1e-2
//! (10-bit mantissas on Q, K, P and V); bf16 <= 3e-2 (7-bit mantissas: a
//! unit roundoff 8x TF32's, on the same four operands). The measured errors
//! are printed.

use gpu_host::KvElem;
use gpu_host::shape::AttentionShape;
use half::bf16;
use host::gpu::Gpu;
use host::gpu::ops::flash_attention::{
    FlashOptions, FlashPrecision, FlashWorkspace, KvStore, attention_forward_flash, attention_forward_flash_bf16_out,
    attention_forward_flash_decode, attention_forward_flash_prefill,
};
use rand::Rng;

use crate::kernels::{random_vec, skip, stats};

const HS: usize = 64;
const FP32_TOL: f32 = 1e-5;
const TF32_TOL: f32 = 1e-2;
const BF16_TOL: f32 = 3e-2;
/// Cache rows past the call's last position (NaN-filled): an awkward, non-tile size.
const CACHE_SLACK: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Auto,
    Prefill,
    Decode,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    t: usize,
    pos0: usize,
    nh: usize,
    window: usize,
    precision: FlashPrecision,
    path: Path,
    /// TF32 prefill: force `kv_split` 1 or 2 (`None`: the wrapper's choice).
    kv_split: Option<u32>,
    /// bf16 prefill: force the ring's depth, 2 or 3 (`None`: the wrapper's choice).
    stages: Option<u32>,
    /// Tensor-core prefill: force the key chunks (`Some(0)`: none; `None`: the wrapper's choice).
    chunk_tiles: Option<u32>,
}

impl Case {
    /// A prefill case with every kernel choice left to the wrapper.
    fn prefill(b: usize, t: usize, pos0: usize, nh: usize, window: usize, precision: FlashPrecision) -> Self {
        Case {
            b,
            t,
            pos0,
            nh,
            window,
            precision,
            path: Path::Prefill,
            kv_split: None,
            stages: None,
            chunk_tiles: None,
        }
    }
}

/// Runs one case; `Err` describes a failure (printed summary either way).
fn run_case(gpu: &Gpu, k: Case) -> Result<(), String> {
    let Case {
        b,
        t,
        pos0,
        nh,
        window,
        precision,
        path,
        kv_split,
        stages,
        chunk_tiles,
    } = k;
    let c = nh * HS;
    let max_t = pos0 + t + CACHE_SLACK;
    let shape = AttentionShape {
        b,
        t,
        pos0,
        max_t,
        c,
        nh,
        window,
    };
    let mut rng = crate::seed::rng();
    let qkv = random_vec(b * t * 3 * c, 1.0);
    let cache_len = b * nh * max_t * HS;
    // Random prefix (positions < pos0), NaN from pos0 on (the store overwrites
    // pos0..pos0+t; the rest must stay unread).
    let mut prefix = || -> Vec<f32> {
        (0..cache_len)
            .map(|i| {
                if (i / HS) % max_t < pos0 {
                    rng.random_range(-1.0..1.0)
                } else {
                    f32::NAN
                }
            })
            .collect()
    };
    let bf16_cache = precision == FlashPrecision::Bf16;
    // As the cache keeps a value (bf16: rounded to nearest even).
    let kept = |x: f32| if bf16_cache { bf16::from_f32(x).to_f32() } else { x };
    let (mut k_cpu, mut v_cpu) = (prefix(), prefix());
    for x in k_cpu.iter_mut().chain(v_cpu.iter_mut()) {
        *x = kept(*x);
    }
    let (k_init, v_init) = (k_cpu.clone(), v_cpu.clone());
    let mut out_cpu = vec![0f32; b * t * c];
    host::cpu::ops::attention_forward(&mut out_cpu, &mut k_cpu, &mut v_cpu, &qkv, shape);
    for x in k_cpu.iter_mut().chain(v_cpu.iter_mut()) {
        *x = kept(*x);
    }

    let mut ws = FlashWorkspace::new(gpu, b, nh, max_t).unwrap();
    ws.force_tf32_kv_split(kv_split);
    ws.force_bf16_stages(stages);
    ws.force_prefill_chunk_tiles(chunk_tiles);
    let run = Run {
        gpu,
        path,
        precision,
        shape,
        qkv: &qkv,
    };
    let (out, k_gpu, v_gpu) = if bf16_cache {
        let to16 = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
        let (out, k, v) = run.launch(&mut ws, &to16(&k_init), &to16(&v_init))?;
        let to32 = |x: Vec<bf16>| x.into_iter().map(bf16::to_f32).collect::<Vec<_>>();
        (out, to32(k), to32(v))
    } else {
        run.launch(&mut ws, &k_init, &v_init)?
    };

    let cache_bad = k_gpu
        .iter()
        .zip(&k_cpu)
        .chain(v_gpu.iter().zip(&v_cpu))
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let tol = match precision {
        FlashPrecision::Fp32 => FP32_TOL,
        FlashPrecision::Tf32 => TF32_TOL,
        FlashPrecision::Bf16 => BF16_TOL,
    };
    let s = stats(&out, &out_cpu, tol, 0.0);
    println!(
        "flash {k:?}: max abs err {:.3e}, RMSE {:.3e}, mismatches {}/{} (tol {tol:e}), cache mismatches {cache_bad}",
        s.max_abs,
        s.rmse,
        s.mismatches,
        out.len()
    );
    if s.mismatches > 0 || cache_bad > 0 {
        return Err(format!(
            "{k:?}: {} outputs off by > {tol:e} (max {:e} at {}: gpu {} cpu {}), {cache_bad} cache entries differ",
            s.mismatches, s.max_abs, s.worst, out[s.worst], out_cpu[s.worst]
        ));
    }
    Ok(())
}

/// What a case's launch leaves: the output, and the K and V caches.
type Launched<E> = (Vec<f32>, Vec<E>, Vec<E>);

/// One case's launch, on a cache of either element type.
struct Run<'a> {
    gpu: &'a Gpu,
    path: Path,
    precision: FlashPrecision,
    shape: AttentionShape,
    qkv: &'a [f32],
}

impl Run<'_> {
    /// The output (poisoned first) and the caches after the call, from
    /// caches uploaded as `k_init` and `v_init`.
    fn launch<E: KvElem + Default>(
        &self,
        ws: &mut FlashWorkspace,
        k_init: &[E],
        v_init: &[E],
    ) -> Result<Launched<E>, String> {
        let Run {
            gpu,
            path,
            precision,
            shape,
            qkv,
        } = *self;
        let d_qkv = gpu.upload(qkv).unwrap();
        let mut d_k = gpu.upload(k_init).unwrap();
        let mut d_v = gpu.upload(v_init).unwrap();
        let mut d_out = gpu.upload(&vec![f32::NAN; shape.b * shape.t * shape.c]).unwrap();
        let r = match path {
            Path::Auto => {
                let opts = FlashOptions { precision, ws };
                attention_forward_flash(gpu, &mut d_out, &mut d_k, &mut d_v, &d_qkv, shape, opts)
            }
            Path::Prefill => {
                let opts = FlashOptions { precision, ws };
                attention_forward_flash_prefill(gpu, &mut d_out, &mut d_k, &mut d_v, &d_qkv, shape, opts)
            }
            Path::Decode => attention_forward_flash_decode(gpu, &mut d_out, &mut d_k, &mut d_v, &d_qkv, shape, ws),
        };
        r.map_err(|e| format!("{shape:?}: launch failed: {e}"))?;
        gpu.synchronize().map_err(|e| format!("{shape:?}: kernel fault: {e}"))?;
        let out = gpu.download(&d_out).unwrap();
        Ok((out, gpu.download(&d_k).unwrap(), gpu.download(&d_v).unwrap()))
    }
}

fn run_all(cases: impl IntoIterator<Item = Case>) {
    let Some(gpu) = skip::gpu() else {
        return;
    };
    let failures: Vec<String> = cases.into_iter().filter_map(|k| run_case(&gpu, k).err()).collect();
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The brief's grid: B in {1, 3}, T in {1, 2, 63, 64, 65, 257, 1024}, with and
/// without a cached prefix, window in {0, 128}, on the prefill kernel.
fn prefill_grid(precision: FlashPrecision) -> Vec<Case> {
    prefill_grid_split(precision, None)
}

/// [`prefill_grid`] with the TF32 kernel's `kv_split` forced (or not).
fn prefill_grid_split(precision: FlashPrecision, kv_split: Option<u32>) -> Vec<Case> {
    let mut cases = Vec::new();
    for b in [1, 3] {
        for t in [1, 2, 63, 64, 65, 257, 1024] {
            // pos0 = 0; a prefix not a multiple of the tile; a long one.
            for pos0 in [0, 37, 700] {
                for window in [0, 128] {
                    let nh = if b == 1 { 3 } else { 2 };
                    cases.push(Case {
                        kv_split,
                        ..Case::prefill(b, t, pos0, nh, window, precision)
                    });
                }
            }
        }
    }
    cases
}

#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_fp32_matches_cpu() {
    run_all(prefill_grid(FlashPrecision::Fp32));
}

#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_tf32_matches_cpu() {
    run_all(prefill_grid(FlashPrecision::Tf32));
}

/// The tensor-core kernels' `kv_split`s.
const TF32_KV_SPLITS: [u32; 2] = [1, 2];

/// The bf16 kernels' ring depths (3 tiles or 2).
const BF16_STAGES: [u32; 2] = [3, 2];

/// The bf16 kernels (the TF32 kernel's body with bf16 operands) on the grid,
/// at both `kv_split`s and both ring depths (the test shapes' grids alone
/// would run only the 3-stage one).
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_bf16_matches_cpu() {
    if skip::gpu().is_none() {
        return;
    }
    let cases = TF32_KV_SPLITS.into_iter().flat_map(|split| {
        BF16_STAGES.into_iter().flat_map(move |stages| {
            prefill_grid_split(FlashPrecision::Bf16, Some(split))
                .into_iter()
                .map(move |c| Case {
                    stages: Some(stages),
                    ..c
                })
        })
    });
    run_all(cases);
}

/// The TF32 grid on every tile shape of the kernel: 128 query rows per block
/// (kv_split 1), 64 rows with each K/V tile's keys split between two warps
/// that merge at the end (kv_split 2); the wrapper picks by grid size, so the
/// test shapes alone would mostly run one of them.
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_tf32_all_splits_match_cpu() {
    if skip::gpu().is_none() {
        return;
    }
    run_all(
        TF32_KV_SPLITS
            .into_iter()
            .flat_map(|s| prefill_grid_split(FlashPrecision::Tf32, Some(s))),
    );
}

/// `attention_forward_flash_bf16_out` (the bf16 engine's call) writes exactly
/// the f32 output of the same kernel rounded to bf16 (to nearest even, as
/// `half` rounds), on both ring depths and `kv_split`s, from position 0 (K/V
/// stored by the wrapper's store kernel) and after a prefix, windowed and not; the bf16
/// output poisoned first.
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_bf16_out_is_the_f32_output_rounded() {
    let Some(gpu) = skip::gpu() else { return };
    let (b, t, nh) = (2, 200, 2);
    let c = nh * HS;
    for pos0 in [0, 37] {
        let max_t = pos0 + t + CACHE_SLACK;
        let qkv = random_vec(b * t * 3 * c, 1.0);
        let prefix: Vec<bf16> = random_vec(b * nh * max_t * HS, 1.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        for window in [0, 40] {
            for stages in BF16_STAGES {
                for kv_split in TF32_KV_SPLITS {
                    let mut ws = FlashWorkspace::new(&gpu, b, nh, max_t).unwrap();
                    ws.force_tf32_kv_split(Some(kv_split));
                    ws.force_bf16_stages(Some(stages));
                    let d_qkv = gpu.upload(&qkv).unwrap();
                    let (mut d_k, mut d_v) = (gpu.upload(&prefix).unwrap(), gpu.upload(&prefix).unwrap());
                    let shape = AttentionShape {
                        b,
                        t,
                        pos0,
                        max_t,
                        c,
                        nh,
                        window,
                    };
                    let mut out = gpu.upload(&vec![f32::NAN; b * t * c]).unwrap();
                    attention_forward_flash_prefill(
                        &gpu,
                        &mut out,
                        &mut d_k,
                        &mut d_v,
                        &d_qkv,
                        shape,
                        FlashOptions {
                            precision: FlashPrecision::Bf16,
                            ws: &mut ws,
                        },
                    )
                    .unwrap();
                    let mut out16 = gpu.upload(&vec![half::bf16::NAN; b * t * c]).unwrap();
                    attention_forward_flash_bf16_out(
                        &gpu,
                        &mut out16,
                        &mut d_k,
                        &mut d_v,
                        &d_qkv,
                        shape,
                        &mut ws,
                        KvStore::Store,
                    )
                    .unwrap();
                    let (f, h) = (gpu.download(&out).unwrap(), gpu.download(&out16).unwrap());
                    let bad = f
                        .iter()
                        .zip(&h)
                        .filter(|(x, y)| half::bf16::from_f32(**x).to_bits() != y.to_bits())
                        .count();
                    assert_eq!(
                        bad, 0,
                        "pos0 {pos0} window {window} stages {stages} kv_split {kv_split}: {bad} bf16 outputs differ from the f32 ones rounded"
                    );
                }
            }
        }
    }
}

/// TF32 rounding (`cvt.rna.tf32`: nearest, ties away from zero) of a finite f32.
fn round_tf32(x: f32) -> f32 {
    f32::from_bits(x.to_bits().wrapping_add(1 << 12) & !((1 << 13) - 1))
}

/// `FlashWorkspace::set_kv_rounded`: with K/V (this call's and the cached
/// prefix) already TF32 values, the kernel that skips its rounding pass gives
/// bit-for-bit the output of the one that rounds, on every kv_split, with a
/// prefix and a window; and both match the CPU within the TF32 bar.
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_tf32_kv_rounded_matches_unflagged() {
    let Some(gpu) = skip::gpu() else {
        return;
    };
    let mut failures = Vec::new();
    for split in TF32_KV_SPLITS {
        for (b, t, pos0, nh, window) in [(1, 1024, 0, 3, 0), (2, 200, 37, 2, 0), (2, 129, 700, 2, 96)] {
            let c = nh * HS;
            let max_t = pos0 + t + CACHE_SLACK;
            // Whole qkv rounded (the Q third too, as a rounding matmul writes it).
            let qkv: Vec<f32> = random_vec(b * t * 3 * c, 1.0).into_iter().map(round_tf32).collect();
            let cache_len = b * nh * max_t * HS;
            let prefix = || -> Vec<f32> {
                let r = random_vec(cache_len, 1.0);
                (0..cache_len)
                    .map(|i| {
                        if (i / HS) % max_t < pos0 {
                            round_tf32(r[i])
                        } else {
                            f32::NAN
                        }
                    })
                    .collect()
            };
            let (k_init, v_init) = (prefix(), prefix());
            let (mut k_cpu, mut v_cpu) = (k_init.clone(), v_init.clone());
            let mut out_cpu = vec![0f32; b * t * c];
            let shape = AttentionShape {
                b,
                t,
                pos0,
                max_t,
                c,
                nh,
                window,
            };
            host::cpu::ops::attention_forward(&mut out_cpu, &mut k_cpu, &mut v_cpu, &qkv, shape);
            let run = |rounded: bool| -> Vec<f32> {
                let mut ws = FlashWorkspace::new(&gpu, b, nh, max_t).unwrap();
                ws.force_tf32_kv_split(Some(split));
                ws.set_kv_rounded(rounded);
                let d_qkv = gpu.upload(&qkv).unwrap();
                let mut d_k = gpu.upload(&k_init).unwrap();
                let mut d_v = gpu.upload(&v_init).unwrap();
                let mut d_out = gpu.upload(&vec![f32::NAN; b * t * c]).unwrap();
                attention_forward_flash_prefill(
                    &gpu,
                    &mut d_out,
                    &mut d_k,
                    &mut d_v,
                    &d_qkv,
                    shape,
                    FlashOptions {
                        precision: FlashPrecision::Tf32,
                        ws: &mut ws,
                    },
                )
                .unwrap();
                gpu.synchronize().unwrap();
                gpu.download(&d_out).unwrap()
            };
            let (plain, flagged) = (run(false), run(true));
            let differ = plain
                .iter()
                .zip(&flagged)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let s = stats(&flagged, &out_cpu, TF32_TOL, 0.0);
            println!(
                "kv_rounded split {split} b {b} t {t} pos0 {pos0} window {window}: {differ} outputs differ from unflagged, max abs err {:.3e}",
                s.max_abs
            );
            // Equal NaNs would pass the bit comparison: the CPU check catches them.
            if differ > 0 || s.mismatches > 0 {
                failures.push(format!(
                    "split {split} b {b} t {t} pos0 {pos0} window {window}: {differ} differ, {} off the CPU",
                    s.mismatches
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Edges of the TF32 and bf16 tiles on every kv_split: T around the 128-row tile
/// (partial last tiles, warps with no rows),
/// windows that start mid 32-key step (1: each query sees only itself; 40;
/// 96), prefixes not a multiple of the tile.
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_tf32_tile_edges_match_cpu() {
    let mut cases = Vec::new();
    if skip::gpu().is_none() {
        return;
    }
    let formats = [
        (FlashPrecision::Tf32, None),
        (FlashPrecision::Bf16, Some(3)),
        (FlashPrecision::Bf16, Some(2)),
    ];
    for (precision, stages) in formats {
        for kv_split in TF32_KV_SPLITS {
            for t in [16, 127, 128, 129, 200] {
                for pos0 in [0, 37] {
                    for window in [0, 1, 40, 96] {
                        cases.push(Case {
                            b: 2,
                            t,
                            pos0,
                            nh: 2,
                            window,
                            precision,
                            path: Path::Prefill,
                            kv_split: Some(kv_split),
                            stages,
                            chunk_tiles: None,
                        });
                    }
                }
            }
        }
    }
    run_all(cases);
}

/// The tensor-core kernels with each query tile's keys split over several
/// blocks (key chunks, merged by the last block of a tile): chunks of 1, 2,
/// 3 and 5 key tiles on both `kv_split`s, TF32 (from position 0 it reads
/// K/V from `qkv` and the first chunk stores them) and bf16, long tiles
/// (T = 1024), a long prefix, windows that leave whole chunks unseen by
/// some rows (1, 96, 128), and a partial last query tile.
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_key_chunks_match_cpu() {
    if skip::gpu().is_none() {
        return;
    }
    let mut cases = Vec::new();
    for precision in [FlashPrecision::Tf32, FlashPrecision::Bf16] {
        for kv_split in TF32_KV_SPLITS {
            for chunk in [1, 2, 3, 5] {
                for (b, t, pos0, nh, window) in [
                    (1, 1024, 0, 3, 0),
                    (1, 1024, 0, 2, 128),
                    (3, 257, 700, 2, 0),
                    (2, 200, 37, 2, 96),
                    (1, 129, 300, 2, 1),
                ] {
                    cases.push(Case {
                        kv_split: Some(kv_split),
                        chunk_tiles: Some(chunk),
                        ..Case::prefill(b, t, pos0, nh, window, precision)
                    });
                }
            }
        }
    }
    run_all(cases);
}

/// Key chunks are merged in chunk order whichever block arrives last, so
/// two launches of the same call give the same bits (the GPT-2 124M shape at
/// B = 1, T = 1024, the wrapper's choice and chunks of 2 tiles), and the
/// arrival counters are back at zero for the second launch (else its merges
/// would be missing or doubled: the CPU check below catches either).
#[test]
#[ignore = "needs a GPU"]
fn flash_prefill_key_chunks_are_deterministic() {
    let Some(gpu) = skip::gpu() else { return };
    let (b, t, nh) = (1, 1024, 12);
    let c = nh * HS;
    let shape = AttentionShape {
        b,
        t,
        pos0: 0,
        max_t: t,
        c,
        nh,
        window: 0,
    };
    let qkv = random_vec(b * t * 3 * c, 1.0);
    let mut out_cpu = vec![0f32; b * t * c];
    let (mut k_cpu, mut v_cpu) = (vec![0f32; b * nh * t * HS], vec![0f32; b * nh * t * HS]);
    host::cpu::ops::attention_forward(&mut out_cpu, &mut k_cpu, &mut v_cpu, &qkv, shape);
    let mut failures = Vec::new();
    for precision in [FlashPrecision::Tf32, FlashPrecision::Bf16] {
        for chunk in [None, Some(2)] {
            let mut ws = FlashWorkspace::new(&gpu, b, nh, t).unwrap();
            ws.force_prefill_chunk_tiles(chunk);
            let run = Run {
                gpu: &gpu,
                path: Path::Prefill,
                precision,
                shape,
                qkv: &qkv,
            };
            // The output of a launch on NaN-poisoned caches of the precision's element.
            let mut launch = || -> Vec<f32> {
                let out = if precision == FlashPrecision::Bf16 {
                    let nan = vec![bf16::NAN; k_cpu.len()];
                    run.launch(&mut ws, &nan, &nan).map(|r| r.0)
                } else {
                    let nan = vec![f32::NAN; k_cpu.len()];
                    run.launch(&mut ws, &nan, &nan).map(|r| r.0)
                };
                out.unwrap()
            };
            let (first, second) = (launch(), launch());
            let differ = first
                .iter()
                .zip(&second)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            let tol = if precision == FlashPrecision::Bf16 {
                BF16_TOL
            } else {
                TF32_TOL
            };
            let (s1, s) = (stats(&first, &out_cpu, tol, 0.0), stats(&second, &out_cpu, tol, 0.0));
            println!(
                "key chunks {precision:?} {chunk:?}: {differ} outputs differ between launches, max abs err {:.3e} / {:.3e}, RMSE {:.3e} / {:.3e}",
                s1.max_abs, s.max_abs, s1.rmse, s.rmse
            );
            if differ > 0 || s.mismatches > 0 || s1.mismatches > 0 {
                failures.push(format!(
                    "{precision:?} chunks {chunk:?}: {differ} differ between launches, {} / {} off the CPU",
                    s1.mismatches, s.mismatches
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Flash-decoding: t in 1..=4 over short and long caches, windowed and not.
#[test]
#[ignore = "needs a GPU"]
fn flash_decode_matches_cpu() {
    let mut cases = Vec::new();
    for b in [1, 3] {
        for t in 1..=4 {
            for pos0 in [0, 1, 63, 64, 200, 1019] {
                for window in [0, 1, 128] {
                    cases.push(Case {
                        b,
                        t,
                        pos0,
                        nh: 3,
                        window,
                        precision: FlashPrecision::Fp32,
                        path: Path::Decode,
                        kv_split: None,
                        stages: None,
                        chunk_tiles: None,
                    });
                }
            }
        }
    }
    run_all(cases);
}

/// GPT-2 124M's shape (12 heads) through the auto path: decode for t = 1,
/// prefill for T = 1024 (at B = 4 a grid that takes the 2-stage bf16 kernel).
#[test]
#[ignore = "needs a GPU"]
fn flash_auto_gpt2_shape_matches_cpu() {
    let mut cases = Vec::new();
    for precision in [FlashPrecision::Fp32, FlashPrecision::Tf32, FlashPrecision::Bf16] {
        for (b, t, pos0, window) in [
            (1, 1024, 0, 0),
            (4, 1024, 0, 0),
            (4, 64, 0, 0),
            (1, 1, 1023, 0),
            (4, 1, 500, 0),
            (1, 1024, 0, 128),
            (2, 5, 300, 0),
        ] {
            cases.push(Case {
                b,
                t,
                pos0,
                nh: 12,
                window,
                precision,
                path: Path::Auto,
                kv_split: None,
                stages: None,
                chunk_tiles: None,
            });
        }
    }
    run_all(cases);
}

/// No GPU needed: every kernel is in the PTX, and the hot kernels keep their
/// fragments in registers (no local memory) and use the intended instructions.
#[test]
fn flash_ptx_shape() {
    use gpu_kernels::params::flash_attention::*;
    let ptx = gpu_host::GPU_KERNELS_PTX;
    let body = |name: &str| -> &str {
        let start = ptx
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("no entry {name} in the PTX"));
        let rest = &ptx[start..];
        &rest[..rest.find("\n}").expect("unterminated entry")]
    };
    for name in [
        ATTENTION_FORWARD_FLASH_TF32,
        ATTENTION_FORWARD_FLASH_BF16,
        ATTENTION_FORWARD_FLASH_BF16_2STAGE,
        ATTENTION_FORWARD_FLASH_FP32,
        ATTENTION_FORWARD_FLASH_DECODE,
        ATTENTION_FORWARD_FLASH_COMBINE,
    ] {
        assert!(!body(name).contains(".local"), "{name} uses local memory");
    }
    let tf32 = body(ATTENTION_FORWARD_FLASH_TF32);
    // One 16x32 warp step, fully unrolled (4x8 MMAs for QKᵀ, 4x8 for PV),
    // written twice: with and without the causal/window mask.
    assert_eq!(tf32.matches("mma.sync.aligned.m16n8k8").count(), 2 * 64);
    assert!(tf32.contains("cp.async"));
    // Operands rounded in shared memory once and read as 16-byte vectors:
    // per step 16 K and 16 V vectors, plus 8 per pass of the rounding loop.
    assert_eq!(tf32.matches("ld.shared.v4").count(), 2 * 32 + 8);
    // No panic paths (index or division checks) in the hot kernel.
    assert!(!tf32.contains("call"), "the TF32 prefill kernel calls a function");
    for name in [ATTENTION_FORWARD_FLASH_BF16, ATTENTION_FORWARD_FLASH_BF16_2STAGE] {
        let bf16 = body(name);
        // The same step in bf16: 4x4 MMAs for QKᵀ and 2x8 for PV, twice; V's B
        // fragments by ldmatrix.trans (2 k-steps x 4 dim pairs, twice).
        assert_eq!(bf16.matches("mma.sync.aligned.m16n8k16").count(), 2 * 32, "{name}");
        assert_eq!(
            bf16.matches("ldmatrix.sync.aligned.m8n8.x4.trans").count(),
            2 * 8,
            "{name}"
        );
        assert!(!bf16.contains("call"), "{name} calls a function");
    }
    assert!(!body(ATTENTION_FORWARD_FLASH_FP32).contains("mma.sync"));
}
