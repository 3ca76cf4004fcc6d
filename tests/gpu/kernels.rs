//! Every forward-pass kernel (optimised and naive) against `host::cpu::ops`,
//! llm.c's `test_gpt2_kernels` style: fresh random inputs each run, outputs
//! poisoned with NaN before the kernel runs, awkward sizes, and a report of
//! max abs error, RMSE and mismatch count per case.

// tests/common/skip.rs, loaded once in this binary (a second `mod` of the
// same file is clippy's duplicate_mod): other files use `crate::kernels::skip`.
#[path = "../common/skip.rs"]
pub mod skip;

use cudarc::driver::CudaSlice;
use gpu_host::shape::{AttentionShape, EncoderShape, LayernormWeights, MatmulShape, RowShape, SplitSums};
use host::cpu::ops as cpu;
use host::gpu::Gpu;
use host::gpu::ops::argmax::{argmax_forward, argmax_forward_values};
use host::gpu::ops::args::Variant;
use host::gpu::ops::attention::attention_forward_variant;
use host::gpu::ops::convert::convert_to_f32;
use host::gpu::ops::crossentropy::crossentropy_forward;
use host::gpu::ops::encoder::encoder_forward_variant;
use host::gpu::ops::gelu::gelu_forward_variant;
use host::gpu::ops::layernorm::{
    LayernormOut, RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS, layernorm_forward_bf16, layernorm_forward_variant,
    residual_layernorm_forward, residual_layernorm_split_forward,
};
use host::gpu::ops::matmul::{
    MatmulKernel, MatmulOptions, MatmulWorkspace, TiledPlan, matmul_forward_plan, matmul_forward_with, plan_tiled,
    split_k_workspace_floats,
};
use host::gpu::ops::residual::residual_forward_variant;
use host::gpu::ops::softmax::softmax_forward_variant;
use host::model::fixtures::encode;
use host::model::{DType, Tensor};
use rand::Rng;

/// Both variants of the ops that have them.
const VARIANTS: [Variant; 2] = [Variant::Best, Variant::Naive];

/// Uniform random values in `[-scale, scale)`, fresh each run.
pub fn random_vec(n: usize, scale: f32) -> Vec<f32> {
    let mut rng = crate::seed::rng();
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A device buffer of `n` NaNs: a kernel that skips an element leaves NaN,
/// which every comparison below reports.
pub fn poisoned(gpu: &Gpu, n: usize) -> CudaSlice<f32> {
    gpu.upload(&vec![f32::NAN; n]).unwrap()
}

/// Error statistics of `got` against `want`.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub max_abs: f64,
    pub rmse: f64,
    pub mismatches: usize,
    /// Index of the largest error (the first NaN, if any).
    pub worst: usize,
}

/// Compare with tolerance `atol + rtol * |want|` per element; NaN or a
/// length difference counts as a mismatch.
pub fn stats(got: &[f32], want: &[f32], atol: f32, rtol: f32) -> Stats {
    let mut max_abs = 0f64;
    let mut sq = 0f64;
    let mut mismatches = want.len().abs_diff(got.len());
    let mut worst = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = (g as f64 - w as f64).abs();
        if e.is_nan() || e > (atol + rtol * w.abs()) as f64 {
            mismatches += 1;
        }
        if e.is_nan() {
            if !max_abs.is_nan() {
                (max_abs, worst) = (f64::NAN, i);
            }
        } else if e > max_abs {
            (max_abs, worst) = (e, i);
        }
        sq += e * e;
    }
    Stats {
        max_abs,
        rmse: (sq / want.len().max(1) as f64).sqrt(),
        mismatches,
        worst,
    }
}

/// Print llm.c-style and fail on any mismatch.
pub fn check(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) -> Stats {
    let s = stats(got, want, atol, rtol);
    println!(
        "{what}: {} values, max abs err {:.3e}, rmse {:.3e}, mismatches {} (tol {atol:e} + {rtol:e}|x|)",
        want.len(),
        s.max_abs,
        s.rmse,
        s.mismatches
    );
    assert_eq!(
        s.mismatches, 0,
        "{what}: {} mismatches (max abs err {:e})",
        s.mismatches, s.max_abs
    );
    s
}

/// A device buffer back on the host.
pub fn down(gpu: &Gpu, buf: &CudaSlice<f32>) -> Vec<f32> {
    gpu.download(buf).unwrap()
}

#[test]
#[ignore = "needs a GPU"]
fn encoder_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (vocab, max_t) = (517, 1024);
    for &(b, t, c, pos0) in &[
        (1, 1, 768, 0),
        (3, 37, 768, 5),
        (4, 64, 1024, 0),
        (1, 1024, 768, 0),
        (3, 5, 66, 900),
    ] {
        let wte = random_vec(vocab * c, 1.0);
        let wpe = random_vec(max_t * c, 1.0);
        let ids: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..vocab as u32)).collect();
        let mut want = vec![0f32; b * t * c];
        cpu::encoder_forward(&mut want, &ids, &wte, &wpe, EncoderShape { b, t, c, pos0 });
        let (dwte, dwpe, dids) = (
            gpu.upload(&wte).unwrap(),
            gpu.upload(&wpe).unwrap(),
            gpu.upload(&ids).unwrap(),
        );
        for v in VARIANTS {
            let mut out = poisoned(&gpu, b * t * c);
            encoder_forward_variant(&gpu, v, &mut out, &dids, &dwte, &dwpe, EncoderShape { b, t, c, pos0 }).unwrap();
            check(
                &format!("encoder {v:?} b={b} t={t} c={c} pos0={pos0}"),
                &down(&gpu, &out),
                &want,
                0.0,
                0.0,
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn encoder_rejects_short_buffers_and_guards_bad_ids() {
    let Some(gpu) = skip::gpu() else { return };
    let (vocab, c, max_t) = (10, 8, 4);
    let (wte, wpe) = (
        gpu.upload(&random_vec(vocab * c, 1.0)).unwrap(),
        gpu.upload(&random_vec(max_t * c, 1.0)).unwrap(),
    );
    let ids = gpu.upload(&[3u32, 99]).unwrap();
    let mut out = poisoned(&gpu, 2 * c);
    // positions past the table: an error, not a read out of bounds
    assert!(
        encoder_forward_variant(
            &gpu,
            Variant::Best,
            &mut out,
            &ids,
            &wte,
            &wpe,
            EncoderShape { b: 1, t: 2, c, pos0: 3 }
        )
        .is_err()
    );
    // an id past wte gives a NaN row, the other row is right
    encoder_forward_variant(
        &gpu,
        Variant::Best,
        &mut out,
        &ids,
        &wte,
        &wpe,
        EncoderShape { b: 1, t: 2, c, pos0: 0 },
    )
    .unwrap();
    let got = down(&gpu, &out);
    assert!(got[..c].iter().all(|x| x.is_finite()) && got[c..].iter().all(|x| x.is_nan()));
}

/// Absolute bar for the naive layernorm (sequential f32 statistics), see below.
const LAYERNORM_NAIVE_ATOL: f32 = 5e-5;

#[test]
#[ignore = "needs a GPU"]
fn layernorm_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    // 2052 channels: past the register-resident path (up to 1024), the re-reading one.
    for &(n, c) in &[
        (1, 768),
        (3 * 37, 768),
        (4 * 64, 1024),
        (1024, 768),
        (3, 2052),
        (7, 66),
        (5, 3),
    ] {
        // A large common offset: the two-pass variance must not cancel.
        let inp: Vec<f32> = random_vec(n * c, 2.0).iter().map(|x| x + 10.0).collect();
        let (w, bias) = (random_vec(c, 1.0), random_vec(c, 1.0));
        let mut want = vec![0f32; n * c];
        cpu::layernorm_forward(&mut want, &inp, &w, &bias, RowShape::new(n, c));
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        // f32 statistics err by about ulp(offset) in x - mean, which the
        // layernorm divides by the row's deviation: a row whose few values
        // happen to lie close together (c = 3) amplifies it. Scale the bar by
        // 1 / (smallest deviation) where that is below 1 (seen: c = 3,
        // 1.5e-5 against 1e-5, seed 11870102253788305394).
        let min_std = inp
            .chunks(c)
            .map(|row| {
                let mean = row.iter().map(|&x| x as f64).sum::<f64>() / c as f64;
                (row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / c as f64).sqrt()
            })
            .fold(f64::INFINITY, f64::min);
        let conditioning = (1.0 / min_std).max(1.0) as f32;
        for v in VARIANTS {
            let mut out = poisoned(&gpu, n * c);
            layernorm_forward_variant(&gpu, v, &mut out, &di, &dw, &db, RowShape::new(n, c)).unwrap();
            // The naive baseline sums each row sequentially in f32 (as llm.c's
            // CPU code does), which drifts by up to ~C ulps of the sum on the
            // +10 offset used here; the optimised kernel reduces in a tree and
            // is held to the tight bar against the f64-statistics reference.
            let atol = conditioning
                * if v == Variant::Naive {
                    LAYERNORM_NAIVE_ATOL
                } else {
                    1e-5
                };
            check(
                &format!("layernorm {v:?} n={n} c={c}"),
                &down(&gpu, &out),
                &want,
                atol,
                1e-5,
            );
        }
    }
}

/// The fused residual add + layernorm against its CPU twin: the residual
/// output bit for bit (one f32 add either way), the layernorm as tightly as
/// the unfused kernel's; with TF32 rounding of the output too, and with a
/// misaligned input (the scalar path).
#[test]
#[ignore = "needs a GPU"]
fn residual_layernorm_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    // Up to RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS aligned rows run a block a row,
    // more (1100) or misaligned ones a warp a row.
    const { assert!(1100 > RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS) };
    for &(n, c) in &[
        (1, 768),
        (3 * 37, 768),
        (1024, 768),
        (1100, 768),
        (4 * 64, 1600),
        (3, 2052),
        (7, 66),
        (5, 3),
    ] {
        for (round, misaligned) in [(false, false), (true, false), (false, true)] {
            // Offset inputs: the variance of the sum must not cancel either.
            let inp1: Vec<f32> = random_vec(n * c + 1, 2.0).iter().map(|x| x + 10.0).collect();
            let inp2 = random_vec(n * c + 1, 1.0);
            let (w, bias) = (random_vec(c, 1.0), random_vec(c, 1.0));
            // `misaligned`: inp2 starts one float into its buffer.
            let off = misaligned as usize;
            let (mut want_res, mut want) = (vec![0f32; n * c], vec![0f32; n * c]);
            cpu::residual_layernorm_forward(
                &mut want_res,
                &mut want,
                &inp1[..n * c],
                &inp2[off..off + n * c],
                LayernormWeights {
                    weight: &w,
                    bias: &bias,
                },
                RowShape::new(n, c),
            );
            if round {
                cpu::round_tf32(&mut want);
            }
            let (d1, d2, dw, db) = (
                gpu.upload(&inp1[..n * c]).unwrap(),
                gpu.upload(&inp2).unwrap(),
                gpu.upload(&w).unwrap(),
                gpu.upload(&bias).unwrap(),
            );
            let (mut res, mut out) = (poisoned(&gpu, n * c), poisoned(&gpu, n * c));
            let d2v = d2.slice(off..off + n * c);
            let ln = LayernormWeights { weight: &dw, bias: &db };
            let out_ln = LayernormOut::f32(&mut out, round);
            residual_layernorm_forward(&gpu, &mut res, out_ln, &d1, &d2v, ln, RowShape::new(n, c)).unwrap();
            let what = format!("residual_layernorm n={n} c={c} round={round} misaligned={misaligned}");
            check(&format!("{what} (residual)"), &down(&gpu, &res), &want_res, 0.0, 0.0);
            // Rounded outputs: a last-bit difference before rounding can move
            // a value by one TF32 step (2^-10 relative).
            let rtol = if round { 1e-3 } else { 1e-5 };
            let atol = layernorm_atol(&want_res, &w, c);
            check(&format!("{what} (out)"), &down(&gpu, &out), &want, atol, rtol);
        }
    }
}

/// The residual layernorm that adds a split-K projection's parts itself:
/// the residual bit for bit the CPU twin's (the parts added in split order,
/// then the bias, then `inp1`: the bits of `matmul_split_reduce` followed by
/// `residual_layernorm_forward`), the layernorm in f32 or TF32 within
/// [`layernorm_atol`], in bf16 within a bf16 step. Split counts past the kernel's batch of
/// loads (8) take its second round; rows as narrow as one vector and as
/// wide as the block allows. Widths it cannot take are refused.
#[test]
#[ignore = "needs a GPU"]
fn residual_layernorm_split_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let cases = [(1, 768), (64, 768), (3, 1600), (5, 4), (2, 4096), (7, 36)];
    let split_counts = [1, 2, 6, 8, 9, 17];
    for (case, &(n, c)) in cases.iter().enumerate() {
        for (k, &splits) in split_counts.iter().enumerate() {
            let with_bias = (case + k) % 2 == 0;
            // f32, TF32-rounded or bf16 output, cycling over the cases.
            let format = (case + k) % 3;
            let inp1: Vec<f32> = random_vec(n * c, 2.0).iter().map(|x| x + 10.0).collect();
            let partial = random_vec(splits * n * c, 1.0);
            let (proj_bias, w, bias) = (random_vec(c, 1.0), random_vec(c, 1.0), random_vec(c, 1.0));
            let (mut want_res, mut want) = (vec![0f32; n * c], vec![0f32; n * c]);
            let parts = SplitSums {
                partial: &partial[..],
                splits,
                bias: with_bias.then_some(&proj_bias[..]),
            };
            let ln = LayernormWeights {
                weight: &w[..],
                bias: &bias[..],
            };
            cpu::residual_layernorm_split_forward(&mut want_res, &mut want, &inp1, parts, ln, RowShape::new(n, c));
            let up = |v: &[f32]| gpu.upload(v).unwrap();
            let (d1, dp, dpb, dw, db) = (up(&inp1), up(&partial), up(&proj_bias), up(&w), up(&bias));
            let parts = SplitSums {
                partial: &dp,
                splits,
                bias: with_bias.then_some(&dpb),
            };
            let ln = LayernormWeights { weight: &dw, bias: &db };
            let what = format!("residual_layernorm_split n={n} c={c} splits={splits} bias={with_bias} format={format}");
            let mut res = poisoned(&gpu, n * c);
            let shape = RowShape::new(n, c);
            if format == 2 {
                let mut out = gpu.upload(&vec![half::bf16::NAN; n * c]).unwrap();
                residual_layernorm_split_forward(&gpu, &mut res, LayernormOut::Bf16(&mut out), &d1, parts, ln, shape)
                    .unwrap();
                for (i, (g, &w)) in gpu.download(&out).unwrap().iter().zip(&want).enumerate() {
                    let (g, r) = (g.to_f32(), half::bf16::from_f32(w).to_f32());
                    assert!(
                        g == r || (g - w).abs() <= 1e-5 + w.abs() / 256.0,
                        "{what}: out[{i}] = {g}, twin {w} (bf16 {r})"
                    );
                }
            } else {
                let round = format == 1;
                let mut out = poisoned(&gpu, n * c);
                residual_layernorm_split_forward(
                    &gpu,
                    &mut res,
                    LayernormOut::f32(&mut out, round),
                    &d1,
                    parts,
                    ln,
                    shape,
                )
                .unwrap();
                if round {
                    cpu::round_tf32(&mut want);
                }
                let rtol = if round { 1e-3 } else { 1e-5 };
                let atol = layernorm_atol(&want_res, &w, c);
                check(&format!("{what} (out)"), &down(&gpu, &out), &want, atol, rtol);
            }
            check(&format!("{what} (residual)"), &down(&gpu, &res), &want_res, 0.0, 0.0);
        }
    }
    // Widths the kernel cannot take: an error, nothing launched.
    for c in [66, 4100] {
        let (d1, dp, dw) = (poisoned(&gpu, c), poisoned(&gpu, 2 * c), poisoned(&gpu, c));
        let (mut res, mut out) = (poisoned(&gpu, c), poisoned(&gpu, c));
        let parts = SplitSums {
            partial: &dp,
            splits: 2,
            bias: None,
        };
        let ln = LayernormWeights { weight: &dw, bias: &dw };
        let got = residual_layernorm_split_forward(
            &gpu,
            &mut res,
            LayernormOut::F32(&mut out),
            &d1,
            parts,
            ln,
            RowShape::new(1, c),
        );
        assert!(got.is_err(), "c = {c} was accepted");
    }
}

/// The absolute error an f32 layernorm of the rows `x` (of `c` channels,
/// scaled by `w`) may make beyond the kernels' 1e-5 bar: its deviations
/// `x - mean` are exact to a few ulps of the row's largest |x|, and the
/// output multiplies them by `rstd · w`. A row of few, close values (large
/// `rstd`) amplifies that: 4 values around 10 can carry 1e-5 of it.
fn layernorm_atol(x: &[f32], w: &[f32], c: usize) -> f32 {
    let wmax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = x
        .chunks(c)
        .map(|row| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            let xmax = row.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            xmax / (var + 1e-5).sqrt()
        })
        .fold(0f64, f64::max);
    1e-5 + (8.0 * f32::EPSILON as f64 * worst * wmax as f64) as f32
}

/// Both layernorm kernels writing bf16 (for the bf16 matmuls): each output
/// is the CPU twin's f32 value rounded to nearest even, allowing a last-bit
/// difference before the rounding to move it one bf16 step (2^-8 of it) and
/// the f32 kernels' own bar; the residual output stays f32, bit for bit. Odd
/// `c` and a misaligned input take the scalar stores.
#[test]
#[ignore = "needs a GPU"]
fn layernorm_bf16_out_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let bf16_check = |what: &str, got: &[half::bf16], want: &[f32]| {
        for (i, (g, &w)) in got.iter().zip(want).enumerate() {
            let (g, r) = (g.to_f32(), half::bf16::from_f32(w).to_f32());
            let bound = 1e-5 + w.abs() / 256.0;
            assert!(
                g == r || (g - w).abs() <= bound,
                "{what}: out[{i}] = {g}, twin {w} (bf16 {r})"
            );
        }
    };
    for &(n, c) in &[
        (1, 768),
        (3 * 37, 768),
        (1100, 768),
        (4 * 64, 1600),
        (3, 2052),
        (7, 66),
        (5, 3),
    ] {
        for misaligned in [false, true] {
            let inp1: Vec<f32> = random_vec(n * c + 1, 2.0).iter().map(|x| x + 10.0).collect();
            let inp2 = random_vec(n * c + 1, 1.0);
            let (w, bias) = (random_vec(c, 1.0), random_vec(c, 1.0));
            let off = misaligned as usize;
            let (mut want_res, mut want) = (vec![0f32; n * c], vec![0f32; n * c]);
            cpu::residual_layernorm_forward(
                &mut want_res,
                &mut want,
                &inp1[..n * c],
                &inp2[off..off + n * c],
                LayernormWeights {
                    weight: &w,
                    bias: &bias,
                },
                RowShape::new(n, c),
            );
            let (d1, d2, dw, db) = (
                gpu.upload(&inp1[..n * c]).unwrap(),
                gpu.upload(&inp2).unwrap(),
                gpu.upload(&w).unwrap(),
                gpu.upload(&bias).unwrap(),
            );
            let d2v = d2.slice(off..off + n * c);
            let what = format!("n={n} c={c} misaligned={misaligned}");
            let mut res = poisoned(&gpu, n * c);
            let mut out = gpu.upload(&vec![half::bf16::NAN; n * c]).unwrap();
            let ln = LayernormWeights { weight: &dw, bias: &db };
            let out_ln = LayernormOut::Bf16(&mut out);
            residual_layernorm_forward(&gpu, &mut res, out_ln, &d1, &d2v, ln, RowShape::new(n, c)).unwrap();
            check(
                &format!("residual_layernorm_bf16 {what} (residual)"),
                &down(&gpu, &res),
                &want_res,
                0.0,
                0.0,
            );
            bf16_check(
                &format!("residual_layernorm_bf16 {what}"),
                &gpu.download(&out).unwrap(),
                &want,
            );
            // The unfused kernel on the same row sums (the residual above).
            let mut out = gpu.upload(&vec![half::bf16::NAN; n * c]).unwrap();
            layernorm_forward_bf16(&gpu, &mut out, &res, &dw, &db, RowShape::new(n, c)).unwrap();
            bf16_check(&format!("layernorm_bf16 {what}"), &gpu.download(&out).unwrap(), &want);
        }
    }
}

/// `(n, c, oc)` cases of the matmul tests. Besides GPT-2's shapes, the
/// tiled kernel's edges: n and oc not multiples of either block tile (128 or
/// 64 rows, 128 columns), c not a multiple of the k-slice (8) but a multiple
/// of 4 (vector loads, partial last slice), and c % 4 != 0 (scalar loads);
/// every shape runs on both tile variants (explicit plans), unsplit and
/// split over c.
const MATMUL_SHAPES: [(usize, usize, usize); 14] = [
    (1, 768, 2304),
    (3, 768, 768),
    (8, 1024, 3072),
    (111, 768, 2304),
    (256, 3072, 768),
    (4 * 64, 768, 3072),
    (77, 66, 130),
    (65, 13, 63),
    (9, 768, 50304),
    // mid-size tile: vector loads with a partial k-slice; scalar loads
    (129, 20, 257),
    (200, 13, 131),
    // large tile (>= 132 blocks of 128x128): row and column edges with a
    // partial k-slice (516 = 64 * 8 + 4), and scalar loads (c = 37)
    (257, 516, 5700),
    (260, 37, 5627),
    (1000, 768, 2304),
];

/// Explicit tiled plans every matmul test shape runs besides the kernels:
/// both tiles unsplit, and both split in 3 over c (chunks of 8 or more,
/// so shallow c gives fewer splits or none).
fn explicit_plans(c: usize) -> Vec<TiledPlan> {
    use gpu_kernels::params::matmul::{MATMUL_TILE_M, MATMUL_TILE_M_MID};
    let mut plans = Vec::new();
    for tile in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
        plans.push(TiledPlan::unsplit(tile, c));
        let split = TiledPlan::split(tile, c, 3);
        if split.splits > 1 {
            plans.push(split);
        }
    }
    plans
}

#[test]
#[ignore = "needs a GPU"]
fn matmul_matches_cpu_all_kernels_and_edges() {
    let Some(gpu) = skip::gpu() else { return };
    for &(n, c, oc) in &MATMUL_SHAPES {
        let inp = random_vec(n * c, 1.0);
        // weights scaled so outputs are O(1) whatever c is
        let w = random_vec(oc * c, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        for with_bias in [true, false] {
            let mut want = vec![0f32; n * oc];
            cpu::matmul_forward(
                &mut want,
                &inp,
                &w,
                with_bias.then_some(&bias[..]),
                MatmulShape::new(n, oc, c),
            );
            let mut want_gelu = vec![0f32; n * oc];
            cpu::gelu_forward(&mut want_gelu, &want, n * oc);
            let mut kernels = vec![MatmulKernel::Tiled, MatmulKernel::Naive, MatmulKernel::Auto];
            if n <= gpu_kernels::params::matmul::MATMUL_GEMV_MAX_ROWS as usize {
                kernels.push(MatmulKernel::Gemv);
            }
            for k in kernels {
                for gelu in [false, true] {
                    let mut out = poisoned(&gpu, n * oc);
                    let b = with_bias.then_some(&db);
                    matmul_forward_with(
                        &gpu,
                        MatmulOptions {
                            kernel: k,
                            gelu,
                            workspace: None,
                        },
                        &mut out,
                        &di,
                        &dw,
                        b,
                        MatmulShape::new(n, oc, c),
                    )
                    .unwrap();
                    let what = format!("matmul {k:?} gelu={gelu} bias={with_bias} n={n} c={c} oc={oc}");
                    check(
                        &what,
                        &down(&gpu, &out),
                        if gelu { &want_gelu } else { &want },
                        1e-4,
                        1e-4,
                    );
                }
            }
            for plan in explicit_plans(c) {
                let gelu = with_bias;
                let mut out = poisoned(&gpu, n * oc);
                let mut ws = nan_workspace(&gpu, plan.workspace_floats(MatmulShape::new(n, oc, c)));
                let b = with_bias.then_some(&db);
                matmul_forward_plan(
                    &gpu,
                    MatmulOptions {
                        kernel: plan,
                        gelu,
                        workspace: Some(&mut ws),
                    },
                    &mut out,
                    &di,
                    &dw,
                    b,
                    MatmulShape::new(n, oc, c),
                )
                .unwrap();
                let what = format!("matmul {plan:?} gelu={gelu} bias={with_bias} n={n} c={c} oc={oc}");
                check(
                    &what,
                    &down(&gpu, &out),
                    if gelu { &want_gelu } else { &want },
                    1e-4,
                    1e-4,
                );
            }
        }
    }
}

/// A split-K workspace of `floats` NaNs: a partial the tiled kernel fails to
/// write, or a reduction reading past its splits, shows as NaN.
fn nan_workspace(gpu: &Gpu, floats: usize) -> MatmulWorkspace {
    MatmulWorkspace::from_buffer(gpu, poisoned(gpu, floats.max(1))).unwrap()
}

/// `(n, c, oc)` shapes for split-K through the planner: GPT-2's prefill
/// shapes that under-fill the GPU (M = 64 and 1024 at N = 768), the M = 64
/// MLP shapes, and odd ones (n, oc not tile multiples, oc % 4 != 0 so the
/// reduction's scalar path runs, c % 4 != 0 so the loads are scalar, c not
/// a multiple of the split depth).
const SPLIT_K_SHAPES: [(usize, usize, usize); 9] = [
    (64, 3072, 768),
    (64, 768, 768),
    (64, 768, 3072),
    (1024, 768, 768),
    (17, 768, 2304),
    (77, 1000, 130),
    (65, 516, 257),
    (33, 203, 771),
    (200, 4100, 7),
];

/// Split-K as the planner runs it (`MatmulKernel::SplitK` and `Auto` with a
/// workspace), bias and GELU on and off, against the CPU; the outputs and the
/// workspace are NaN-poisoned first; two runs must agree bit for bit (fixed
/// summation order).
#[test]
#[ignore = "needs a GPU"]
fn matmul_split_k_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let sms = gpu.sm_count();
    for &(n, c, oc) in &SPLIT_K_SHAPES {
        let plan = plan_tiled(MatmulShape::new(n, oc, c), sms, usize::MAX);
        println!("split-K n={n} c={c} oc={oc} on {sms} SMs: {plan:?}");
        let inp = random_vec(n * c, 1.0);
        let w = random_vec(oc * c, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let mut ws = nan_workspace(&gpu, split_k_workspace_floats(MatmulShape::new(n, oc, c), sms));
        for with_bias in [true, false] {
            let mut want = vec![0f32; n * oc];
            cpu::matmul_forward(
                &mut want,
                &inp,
                &w,
                with_bias.then_some(&bias[..]),
                MatmulShape::new(n, oc, c),
            );
            let mut want_gelu = vec![0f32; n * oc];
            cpu::gelu_forward(&mut want_gelu, &want, n * oc);
            for k in [MatmulKernel::SplitK, MatmulKernel::Auto] {
                for gelu in [false, true] {
                    let b = with_bias.then_some(&db);
                    let mut runs = Vec::new();
                    for _ in 0..2 {
                        let mut out = poisoned(&gpu, n * oc);
                        matmul_forward_with(
                            &gpu,
                            MatmulOptions {
                                kernel: k,
                                gelu,
                                workspace: Some(&mut ws),
                            },
                            &mut out,
                            &di,
                            &dw,
                            b,
                            MatmulShape::new(n, oc, c),
                        )
                        .unwrap();
                        runs.push(down(&gpu, &out));
                    }
                    let what = format!("matmul {k:?} {plan:?} gelu={gelu} bias={with_bias} n={n} c={c} oc={oc}");
                    check(&what, &runs[0], if gelu { &want_gelu } else { &want }, 1e-4, 1e-4);
                    let same = runs[0].iter().zip(&runs[1]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: two runs differ");
                }
            }
        }
    }
}

/// The split-K test shapes that stand for GPT-2's under-filled prefill
/// matmuls do split on an H100/H200-sized GPU (needs no GPU: plans only).
#[test]
fn matmul_split_k_shapes_split() {
    /// SMs of an H100 / H200 SXM.
    const SMS: usize = 132;
    for &(n, c, oc) in &SPLIT_K_SHAPES[..4] {
        let plan = plan_tiled(MatmulShape::new(n, oc, c), SMS, usize::MAX);
        assert!(plan.splits > 1, "n={n} c={c} oc={oc}: {plan:?}");
    }
}

/// Split-K plans forced on awkward cases: many splits (down to one k-slice
/// deep), operands one float off 16-byte alignment (scalar loads), and an
/// output view one float off (the reduction's scalar stores).
#[test]
#[ignore = "needs a GPU"]
fn matmul_split_k_explicit_plans_and_unaligned() {
    use gpu_kernels::params::matmul::{MATMUL_TILE_M, MATMUL_TILE_M_MID};
    let Some(gpu) = skip::gpu() else { return };
    for (n, c, oc) in [(129, 64, 257), (260, 68, 5627), (70, 96, 132)] {
        let inp = random_vec(n * c + 1, 1.0);
        let w = random_vec(oc * c + 1, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let mut want = vec![0f32; n * oc];
        cpu::matmul_forward(
            &mut want,
            &inp[1..],
            &w[1..],
            Some(&bias[..]),
            MatmulShape::new(n, oc, c),
        );
        let mut want_gelu = vec![0f32; n * oc];
        cpu::gelu_forward(&mut want_gelu, &want, n * oc);
        for tile in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
            for splits in [2, 5, c] {
                let plan = TiledPlan::split(tile, c, splits);
                let mut ws = nan_workspace(&gpu, plan.workspace_floats(MatmulShape::new(n, oc, c)));
                for aligned in [true, false] {
                    let gelu = !aligned;
                    let off = usize::from(!aligned);
                    let (vi, vw) = (di.slice(off..off + n * c), dw.slice(off..off + oc * c));
                    // Aligned operands are the views at 0, whose data are
                    // the buffers' first n*c floats: compare those instead.
                    let want_here = if aligned {
                        let mut x = vec![0f32; n * oc];
                        cpu::matmul_forward(
                            &mut x,
                            &inp[..n * c],
                            &w[..oc * c],
                            Some(&bias[..]),
                            MatmulShape::new(n, oc, c),
                        );
                        x
                    } else if gelu {
                        want_gelu.clone()
                    } else {
                        want.clone()
                    };
                    let mut out = poisoned(&gpu, n * oc + 1);
                    let mut ov = out.slice_mut(off..off + n * oc);
                    matmul_forward_plan(
                        &gpu,
                        MatmulOptions {
                            kernel: plan,
                            gelu,
                            workspace: Some(&mut ws),
                        },
                        &mut ov,
                        &vi,
                        &vw,
                        Some(&db),
                        MatmulShape::new(n, oc, c),
                    )
                    .unwrap();
                    let got = down(&gpu, &out);
                    let what = format!("matmul {plan:?} aligned={aligned} gelu={gelu} n={n} c={c} oc={oc}");
                    check(&what, &got[off..off + n * oc], &want_here, 1e-4, 1e-4);
                }
            }
        }
    }
}

/// The wave model's resident blocks per SM (`MATMUL_BLOCKS_PER_SM*`) are what
/// the driver's occupancy calculator says for the loaded kernels: a
/// register-count change in the tiled kernels shows here.
#[test]
#[ignore = "needs a GPU"]
fn matmul_blocks_per_sm_match_driver() {
    use gpu_kernels::params::matmul::{
        MATMUL_BLOCK, MATMUL_BLOCK_MID, MATMUL_BLOCKS_PER_SM, MATMUL_BLOCKS_PER_SM_MID, MATMUL_FORWARD,
        MATMUL_FORWARD_MID, MATMUL_FORWARD_SMALL, MATMUL_SMALL_BLOCK, MATMUL_SMALL_BLOCKS_PER_SM, MATMUL_TILE_M,
        MATMUL_TILE_M_MID, matmul_shared_bytes, matmul_small_shared_bytes,
    };
    let Some(gpu) = skip::gpu() else { return };
    for (name, threads, shared, want) in [
        (
            MATMUL_FORWARD,
            MATMUL_BLOCK,
            matmul_shared_bytes(MATMUL_TILE_M),
            MATMUL_BLOCKS_PER_SM,
        ),
        (
            MATMUL_FORWARD_MID,
            MATMUL_BLOCK_MID,
            matmul_shared_bytes(MATMUL_TILE_M_MID),
            MATMUL_BLOCKS_PER_SM_MID,
        ),
        (
            MATMUL_FORWARD_SMALL,
            MATMUL_SMALL_BLOCK,
            matmul_small_shared_bytes(),
            MATMUL_SMALL_BLOCKS_PER_SM,
        ),
    ] {
        let f = gpu.function(name).unwrap();
        let got = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, shared as usize, None)
            .unwrap();
        println!(
            "{name}: {got} resident blocks per SM ({} registers)",
            f.num_regs().unwrap()
        );
        assert_eq!(got, want, "{name}: resident blocks per SM");
    }
}

/// The tiled kernel with operands that are not 16-byte aligned (views one
/// float into their buffers) although c % 4 == 0: it must take the scalar
/// load path, on both tile variants.
#[test]
#[ignore = "needs a GPU"]
fn matmul_tiled_unaligned_operands() {
    use gpu_kernels::params::matmul::{MATMUL_TILE_M, MATMUL_TILE_M_MID};
    let Some(gpu) = skip::gpu() else { return };
    for (n, c, oc) in [(129, 64, 257), (260, 68, 5627)] {
        let inp = random_vec(n * c + 1, 1.0);
        let w = random_vec(oc * c + 1, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let mut want = vec![0f32; n * oc];
        cpu::matmul_forward(
            &mut want,
            &inp[1..],
            &w[1..],
            Some(&bias[..]),
            MatmulShape::new(n, oc, c),
        );
        let (vi, vw) = (di.slice(1..), dw.slice(1..));
        for tile in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
            let plan = TiledPlan::unsplit(tile, c);
            let mut out = poisoned(&gpu, n * oc);
            matmul_forward_plan(
                &gpu,
                MatmulOptions {
                    kernel: plan,
                    gelu: false,
                    workspace: None,
                },
                &mut out,
                &vi,
                &vw,
                Some(&db),
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
            let what = format!("matmul {plan:?} unaligned n={n} c={c} oc={oc}");
            check(&what, &down(&gpu, &out), &want, 1e-4, 1e-4);
        }
        let mut out = poisoned(&gpu, n * oc);
        matmul_forward_with(
            &gpu,
            MatmulOptions {
                kernel: MatmulKernel::Tiled,
                gelu: false,
                workspace: None,
            },
            &mut out,
            &vi,
            &vw,
            Some(&db),
            MatmulShape::new(n, oc, c),
        )
        .unwrap();
        let what = format!("matmul Tiled unaligned n={n} c={c} oc={oc}");
        check(&what, &down(&gpu, &out), &want, 1e-4, 1e-4);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn matmul_rejects_short_buffers() {
    let Some(gpu) = skip::gpu() else { return };
    let (di, dw) = (
        gpu.upload(&random_vec(10, 1.0)).unwrap(),
        gpu.upload(&random_vec(10, 1.0)).unwrap(),
    );
    let mut out = poisoned(&gpu, 4);
    let r = matmul_forward_with(
        &gpu,
        MatmulOptions {
            kernel: MatmulKernel::Auto,
            gelu: false,
            workspace: None,
        },
        &mut out,
        &di,
        &dw,
        None::<&CudaSlice<f32>>,
        MatmulShape::new(2, 3, 5),
    );
    assert!(r.is_err(), "out holds 4 floats, 6 needed");
}

/// A KV cache element the tests upload and read back: f32, or bf16 (the
/// bf16 engine's cache).
pub trait CacheElem: gpu_host::KvElem + Default {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;

    /// `x` as the cache keeps it.
    fn kept(x: f32) -> f32 {
        Self::from_f32(x).to_f32()
    }

    /// The device buffer widened to f32.
    fn down(gpu: &Gpu, buf: &CudaSlice<Self>) -> Vec<f32> {
        gpu.download(buf).unwrap().into_iter().map(Self::to_f32).collect()
    }

    /// `x` uploaded in this element type.
    fn up(gpu: &Gpu, x: &[f32]) -> CudaSlice<Self> {
        gpu.upload(&x.iter().map(|&v| Self::from_f32(v)).collect::<Vec<_>>())
            .unwrap()
    }
}

impl CacheElem for f32 {
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl CacheElem for half::bf16 {
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// One attention case: prefill `prefill.t` tokens (from position 0), then
/// `steps` single-token decode steps, each checked (output and caches)
/// against the CPU; over an f32 cache, then over a bf16 one.
fn attention_case(gpu: &Gpu, v: Variant, prefill: AttentionShape, steps: usize) {
    attention_case_in::<f32>(gpu, v, prefill, steps);
    attention_case_in::<half::bf16>(gpu, v, prefill, steps);
}

/// [`attention_case`] over a cache of `E`: the CPU's keys and values
/// rounded as `E` keeps them, so that both sides attend over the same
/// numbers.
fn attention_case_in<E: CacheElem>(gpu: &Gpu, v: Variant, prefill: AttentionShape, steps: usize) {
    let AttentionShape {
        b,
        t: t0,
        max_t,
        c,
        nh,
        window,
        ..
    } = prefill;
    let hs = c / nh;
    let cache = b * nh * max_t * hs;
    // Caches start as random garbage on both sides: positions not yet
    // written must never be read.
    let garbage: Vec<f32> = random_vec(cache, 1.0).into_iter().map(E::kept).collect();
    let (mut ck, mut cv) = (garbage.clone(), garbage.clone());
    let (mut gk, mut gv) = (E::up(gpu, &garbage), E::up(gpu, &garbage));
    let mut pos0 = 0;
    for (i, t) in std::iter::once(t0).chain(std::iter::repeat_n(1, steps)).enumerate() {
        let qkv = random_vec(b * t * 3 * c, 1.5);
        // The CPU's K and V as the cache keeps them.
        let mut qkv_kept = qkv.clone();
        for row in qkv_kept.chunks_exact_mut(3 * c) {
            for x in &mut row[c..] {
                *x = E::kept(*x);
            }
        }
        let mut want = vec![0f32; b * t * c];
        let shape = AttentionShape {
            b,
            t,
            pos0,
            max_t,
            c,
            nh,
            window,
        };
        cpu::attention_forward(&mut want, &mut ck, &mut cv, &qkv_kept, shape);
        let dq = gpu.upload(&qkv).unwrap();
        let mut out = poisoned(gpu, b * t * c);
        attention_forward_variant(gpu, v, &mut out, &mut gk, &mut gv, &dq, shape).unwrap();
        let elem = std::any::type_name::<E>();
        let what =
            format!("attention {v:?} {elem} cache b={b} t={t} pos0={pos0} c={c} nh={nh} window={window} (call {i})");
        check(&what, &down(gpu, &out), &want, 1e-5, 1e-4);
        pos0 += t;
    }
    check("k_cache", &E::down(gpu, &gk), &ck, 0.0, 0.0);
    check("v_cache", &E::down(gpu, &gv), &cv, 0.0, 0.0);
}

#[test]
#[ignore = "needs a GPU"]
fn attention_matches_cpu_prefill_and_decode() {
    let Some(gpu) = skip::gpu() else { return };
    for v in VARIANTS {
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 1,
                t: 1,
                pos0: 0,
                max_t: 16,
                c: 768,
                nh: 12,
                window: 0,
            },
            3,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 3,
                t: 37,
                pos0: 0,
                max_t: 64,
                c: 768,
                nh: 12,
                window: 0,
            },
            4,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 4,
                t: 64,
                pos0: 0,
                max_t: 128,
                c: 768,
                nh: 12,
                window: 0,
            },
            2,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 1,
                t: 1021,
                pos0: 0,
                max_t: 1024,
                c: 768,
                nh: 12,
                window: 0,
            },
            3,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 3,
                t: 100,
                pos0: 0,
                max_t: 128,
                c: 1024,
                nh: 16,
                window: 0,
            },
            2,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 3,
                t: 29,
                pos0: 0,
                max_t: 40,
                c: 96,
                nh: 3,
                window: 0,
            },
            2,
        ); // head size 32
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 2,
                t: 11,
                pos0: 0,
                max_t: 16,
                c: 60,
                nh: 5,
                window: 0,
            },
            2,
        ); // head size 12: no 16-byte loads
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 2,
                t: 9,
                pos0: 0,
                max_t: 16,
                c: 30,
                nh: 5,
                window: 0,
            },
            2,
        ); // head size 6: the K/V store's scalar path
    }
}

#[test]
#[ignore = "needs a GPU"]
fn attention_windowed_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    for v in VARIANTS {
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 3,
                t: 100,
                pos0: 0,
                max_t: 128,
                c: 768,
                nh: 12,
                window: 16,
            },
            5,
        );
        attention_case(
            &gpu,
            v,
            AttentionShape {
                b: 1,
                t: 300,
                pos0: 0,
                max_t: 512,
                c: 768,
                nh: 12,
                window: 128,
            },
            3,
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn attention_rejects_positions_past_the_cache() {
    let Some(gpu) = skip::gpu() else { return };
    let (c, nh, max_t) = (64, 4, 8);
    let mut k = poisoned(&gpu, max_t * c);
    let mut v = poisoned(&gpu, max_t * c);
    let q = gpu.upload(&random_vec(3 * 3 * c, 1.0)).unwrap();
    let mut out = poisoned(&gpu, 3 * c);
    assert!(
        attention_forward_variant(
            &gpu,
            Variant::Best,
            &mut out,
            &mut k,
            &mut v,
            &q,
            AttentionShape {
                b: 1,
                t: 3,
                pos0: 6,
                max_t,
                c,
                nh,
                window: 0
            },
        )
        .is_err()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gelu_and_residual_match_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    for &n in &[1usize, 3, 4 * 64 * 3072 + 3, (1 << 20) + 1] {
        let (x, y) = (random_vec(n + 1, 6.0), random_vec(n + 1, 6.0));
        let mut want_g = vec![0f32; n];
        cpu::gelu_forward(&mut want_g, &x, n);
        let mut want_r = vec![0f32; n];
        cpu::residual_forward(&mut want_r, &x, &y, n);
        let (dx, dy) = (gpu.upload(&x).unwrap(), gpu.upload(&y).unwrap());
        for v in VARIANTS {
            let mut out = poisoned(&gpu, n);
            gelu_forward_variant(&gpu, v, &mut out, &dx, n).unwrap();
            check(&format!("gelu {v:?} n={n}"), &down(&gpu, &out), &want_g, 1e-6, 1e-5);
            let mut out = poisoned(&gpu, n);
            residual_forward_variant(&gpu, v, &mut out, &dx, &dy, n).unwrap();
            check(&format!("residual {v:?} n={n}"), &down(&gpu, &out), &want_r, 0.0, 0.0);
        }
        // Misaligned views (offset by one float) take the scalar path.
        let mut want_g1 = vec![0f32; n];
        cpu::gelu_forward(&mut want_g1, &x[1..], n);
        let mut out = poisoned(&gpu, n + 1);
        gelu_forward_variant(&gpu, Variant::Best, &mut out.slice_mut(1..), &dx.slice(1..), n).unwrap();
        check(
            &format!("gelu misaligned n={n}"),
            &down(&gpu, &out)[1..],
            &want_g1,
            1e-6,
            1e-5,
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn softmax_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    for &(n, v, vp) in &[(1, 50257, 50304), (5, 50257, 50304), (3, 517, 640), (2, 7, 7)] {
        let logits = random_vec(n * vp, 8.0);
        let mut want = vec![0f32; n * vp];
        cpu::softmax_forward(&mut want, &logits, n, v, vp);
        let dl = gpu.upload(&logits).unwrap();
        for var in VARIANTS {
            let mut out = poisoned(&gpu, n * vp);
            softmax_forward_variant(&gpu, var, &mut out, &dl, n, v, vp).unwrap();
            check(
                &format!("softmax {var:?} n={n} v={v} vp={vp}"),
                &down(&gpu, &out),
                &want,
                1e-7,
                1e-4,
            );
        }
    }
}

/// The kernel's loss against the f64 reference rounded to f32: a sum of
/// ~100 f32 terms per thread (relative error ~100 · 2^-24), `exp_fast`
/// (2^-21 + |x| 2^-23 relative per term, |x| up to ~40 here) and `ln_fast`
/// add up to ~1e-5 at the losses of ~10-40 nats drawn here.
const CROSSENTROPY_ATOL: f32 = 5e-5;

#[test]
#[ignore = "needs a GPU"]
fn crossentropy_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    for &(n, v, vp) in &[(1, 50257, 50304), (9, 50257, 50304), (5, 517, 640), (3, 7, 7)] {
        // Logits wide enough that the loss depends on every term's exponent;
        // the padding is huge so that reading it would show.
        let mut logits = random_vec(n * vp, 20.0);
        for r in 0..n {
            logits[r * vp + v..(r + 1) * vp].fill(1e30);
        }
        // Every row scored but one in three ignored; the last row targets
        // the last real id.
        let targets: Vec<u32> = (0..n)
            .map(|r| match r {
                _ if r + 1 == n => v as u32 - 1,
                _ if r % 3 == 1 => cpu::IGNORED_TARGET,
                _ => rng.random_range(0..v as u32),
            })
            .collect();
        let mut want = vec![f32::NAN; n];
        cpu::crossentropy_forward(&mut want, &logits, &targets, n, v, vp);
        let (dl, dt) = (gpu.upload(&logits).unwrap(), gpu.upload(&targets).unwrap());
        let mut out = poisoned(&gpu, n);
        crossentropy_forward(&gpu, &mut out, &dl, &dt, n, v, vp).unwrap();
        let got = down(&gpu, &out);
        check(
            &format!("crossentropy n={n} v={v} vp={vp}"),
            &got,
            &want,
            CROSSENTROPY_ATOL,
            0.0,
        );
        for (r, &t) in targets.iter().enumerate() {
            if t == cpu::IGNORED_TARGET {
                assert_eq!(got[r], 0.0, "row {r}: an ignored target's loss");
            }
        }
    }
    // A target outside the vocabulary gives NaN (never an index), on both sides.
    let (v, vp) = (517, 640);
    let logits = random_vec(2 * vp, 4.0);
    let targets = [v as u32, 3];
    let mut want = vec![0f32; 2];
    cpu::crossentropy_forward(&mut want, &logits, &targets, 2, v, vp);
    let (dl, dt) = (gpu.upload(&logits).unwrap(), gpu.upload(&targets).unwrap());
    let mut out = poisoned(&gpu, 2);
    crossentropy_forward(&gpu, &mut out, &dl, &dt, 2, v, vp).unwrap();
    let got = down(&gpu, &out);
    assert!(
        want[0].is_nan() && got[0].is_nan(),
        "out-of-vocabulary target: cpu {}, gpu {}",
        want[0],
        got[0]
    );
    assert!(
        (got[1] - want[1]).abs() <= CROSSENTROPY_ATOL,
        "gpu {} cpu {}",
        got[1],
        want[1]
    );
}

#[test]
#[ignore = "needs a GPU"]
fn argmax_matches_cpu_with_ties_and_padding() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (v, vp) = (50257, 50304);
    for &n in &[1usize, 4, 7] {
        let mut logits = random_vec(n * vp, 4.0);
        for r in 0..n {
            let row = &mut logits[r * vp..(r + 1) * vp];
            // padded entries are larger than any real one: they must be ignored
            row[v..].fill(100.0);
            // a tie between two ids: the lower must win
            let (i, j) = (rng.random_range(0..v / 2), rng.random_range(v / 2..v));
            row[i] = 50.0;
            row[j] = 50.0;
        }
        let want: Vec<u32> = (0..n)
            .map(|r| host::cpu::forward::argmax(&logits[r * vp..r * vp + v]))
            .collect();
        let dl = gpu.upload(&logits).unwrap();
        let mut ids = gpu.upload(&vec![u32::MAX; n]).unwrap();
        argmax_forward(&gpu, &mut ids, &dl, n, v, vp).unwrap();
        let got = gpu.download(&ids).unwrap();
        println!("argmax n={n}: got {got:?}, want {want:?}");
        assert_eq!(got, want);
        // With the chosen logits too (NaN-poisoned first).
        let mut ids = gpu.upload(&vec![u32::MAX; n]).unwrap();
        let mut values = gpu.upload(&vec![f32::NAN; n]).unwrap();
        argmax_forward_values(&gpu, &mut ids, &mut values, &dl, n, v, vp).unwrap();
        assert_eq!(gpu.download(&ids).unwrap(), want);
        let want_values: Vec<f32> = (0..n).map(|r| logits[r * vp + want[r] as usize]).collect();
        assert_eq!(gpu.download(&values).unwrap(), want_values);
        // strided rows: only the last of every 3 rows
        if n >= 3 {
            let rows = n / 3;
            let want: Vec<u32> = (0..rows).map(|r| want[r * 3 + 2]).collect();
            let mut ids = gpu.upload(&vec![u32::MAX; rows]).unwrap();
            argmax_forward(&gpu, &mut ids, &dl.slice(2 * vp..), rows, v, 3 * vp).unwrap();
            assert_eq!(gpu.download(&ids).unwrap(), want);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn convert_matches_host_conversion() {
    let Some(gpu) = skip::gpu() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for transposed in [false, true] {
            let (rows, cols) = (37, 129);
            let values = random_vec(rows * cols, 3.0);
            let bytes = encode(&values, dtype);
            let t = Tensor {
                shape: [rows, cols],
                dtype,
                transposed,
                bytes: &bytes,
            };
            let want = t.to_f32().into_owned();
            let raw = gpu.upload(&bytes).unwrap();
            let mut out = poisoned(&gpu, rows * cols);
            convert_to_f32(&gpu, &mut out, &raw, rows, cols, dtype, transposed).unwrap();
            check(
                &format!("convert {dtype:?} transposed={transposed}"),
                &down(&gpu, &out),
                &want,
                0.0,
                0.0,
            );
        }
    }
}
