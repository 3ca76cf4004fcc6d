//! The small-M FP32 matmul (`gpu_kernels::ops::matmul_small`: K split
//! across the warps of a block) against `host::cpu::ops::matmul_forward`,
//! in the style of `kernels.rs`: fresh random inputs, NaN-poisoned outputs,
//! awkward sizes, max abs error and RMSE per case, every tile width.

use cudarc::driver::CudaSlice;
use gpu_kernels::params::matmul::{MATMUL_SMALL_TILE_K, MATMUL_SMALL_TILE_M, MATMUL_SMALL_WARPS};
use host::cpu::ops as cpu;
use host::gpu::Gpu;
use host::gpu::ops::matmul::{
    AutoPlan, MatmulKernel, MatmulWorkspace, SmallPlan, matmul_forward_small, matmul_forward_ws, plan_auto,
    split_k_workspace_floats,
};

use crate::kernels::{check, poisoned, random_vec};

/// Tolerance of the FP32 matmul tests (`kernels.rs`): the kernel sums `c`
/// products in another order than the CPU.
const ATOL: f32 = 1e-4;
/// See [`ATOL`].
const RTOL: f32 = 1e-4;

/// `(n, c, oc)` cases. Edges of the kernel: n = 1, n not a multiple of the
/// 64-row tile and n > 64 (two block rows); oc not a multiple of any tile
/// width (32, 24, 16, 8) and oc % 4 != 0 (scalar stores); c a multiple of 4
/// but not of the 8-deep k-slice (partial last slice), c % 4 != 0 (scalar
/// loads), fewer k-slices than warps (idle K groups), and slice counts that
/// do not divide among the 8 warps; GPT-2's shapes at n = 64.
const SHAPES: [(usize, usize, usize); 12] = [
    (64, 768, 2304),
    (64, 3072, 768),
    (1, 768, 768),
    (37, 20, 50),
    (100, 13, 131),
    (128, 776, 770),
    (65, 136, 96),
    (9, 7, 5),
    (50, 203, 72),
    (3, 1, 33),
    (127, 516, 4),
    (64, 4, 200),
];

fn down(gpu: &Gpu, buf: &CudaSlice<f32>) -> Vec<f32> {
    gpu.download(buf).unwrap()
}

/// Host inputs of one case: `inp`, `weight` (scaled so outputs are O(1)
/// whatever c is), `bias`.
fn inputs(n: usize, c: usize, oc: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        random_vec(n * c, 1.0),
        random_vec(oc * c, 1.0 / (c as f32).sqrt()),
        random_vec(oc, 1.0),
    )
}

/// The CPU reference, with the optional GELU.
#[allow(clippy::too_many_arguments)]
fn reference(inp: &[f32], w: &[f32], bias: Option<&[f32]>, gelu: bool, n: usize, c: usize, oc: usize) -> Vec<f32> {
    let mut want = vec![0f32; n * oc];
    cpu::matmul_forward(&mut want, inp, w, bias, n, c, oc);
    if gelu {
        let mut g = vec![0f32; n * oc];
        cpu::gelu_forward(&mut g, &want, n * oc);
        return g;
    }
    want
}

#[test]
fn matmul_small_matches_cpu_every_tile() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    // The cases must exercise what the doc comment of SHAPES says.
    let slices = |c: usize| c.div_ceil(MATMUL_SMALL_TILE_K as usize);
    assert!(SHAPES.iter().any(|&(_, c, _)| slices(c) < MATMUL_SMALL_WARPS as usize));
    assert!(
        SHAPES
            .iter()
            .any(|&(_, c, _)| !slices(c).is_multiple_of(MATMUL_SMALL_WARPS as usize))
    );
    assert!(SHAPES.iter().any(|&(n, _, _)| n > MATMUL_SMALL_TILE_M as usize));
    for &(n, c, oc) in &SHAPES {
        let (inp, w, bias) = inputs(n, c, oc);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        for with_bias in [true, false] {
            for gelu in [false, true] {
                let want = reference(&inp, &w, with_bias.then_some(&bias[..]), gelu, n, c, oc);
                for plan in SmallPlan::all() {
                    let mut out = poisoned(&gpu, n * oc);
                    let b = with_bias.then_some(&db);
                    matmul_forward_small(&gpu, &plan, gelu, &mut out, &di, &dw, b, n, c, oc).unwrap();
                    let what = format!("matmul_small {plan:?} gelu={gelu} bias={with_bias} n={n} c={c} oc={oc}");
                    check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
                }
            }
        }
    }
}

/// Operands and output one float into their buffers (not 16-byte aligned,
/// although c % 4 == 0 and oc % 4 == 0): the scalar load and store paths.
/// The float before the output must stay untouched.
#[test]
fn matmul_small_unaligned_operands() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    for (n, c, oc) in [(64, 136, 96), (70, 64, 40)] {
        let inp = random_vec(n * c + 1, 1.0);
        let w = random_vec(oc * c + 1, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let want = reference(&inp[1..], &w[1..], Some(&bias), true, n, c, oc);
        let (vi, vw) = (di.slice(1..), dw.slice(1..));
        for plan in SmallPlan::all() {
            let mut out = poisoned(&gpu, n * oc + 1);
            let mut vo = out.slice_mut(1..);
            matmul_forward_small(&gpu, &plan, true, &mut vo, &vi, &vw, Some(&db), n, c, oc).unwrap();
            let got = down(&gpu, &out);
            assert!(got[0].is_nan(), "{plan:?}: wrote before the output");
            let what = format!("matmul_small {plan:?} unaligned n={n} c={c} oc={oc}");
            check(&what, &got[1..], &want, ATOL, RTOL);
        }
    }
}

/// The warps' partial tiles are summed in a fixed order: two runs give the
/// same bits.
#[test]
fn matmul_small_is_deterministic() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    let (n, c, oc) = (64, 3072, 768);
    let (inp, w, bias) = inputs(n, c, oc);
    let (di, dw, db) = (
        gpu.upload(&inp).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&bias).unwrap(),
    );
    for plan in SmallPlan::all() {
        let runs: Vec<Vec<f32>> = (0..2)
            .map(|_| {
                let mut out = poisoned(&gpu, n * oc);
                matmul_forward_small(&gpu, &plan, false, &mut out, &di, &dw, Some(&db), n, c, oc).unwrap();
                down(&gpu, &out)
            })
            .collect();
        let same = runs[0].iter().zip(&runs[1]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{plan:?}: two runs differ");
    }
}

/// `Auto` with the engine's workspace picks the small kernel for GPT-2's
/// n = 64 projections on this GPU, and gets them right; so do `Small` and
/// `Auto` on n just past the GEMV limit and at the small kernel's row limit.
#[test]
fn matmul_small_through_auto() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    let sms = gpu.sm_count();
    for (n, c, oc) in [(64, 768, 2304), (64, 768, 3072), (9, 768, 768), (128, 768, 2304)] {
        let (inp, w, bias) = inputs(n, c, oc);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let floats = split_k_workspace_floats(n, c, oc, sms);
        let auto = plan_auto(n, c, oc, sms, floats);
        println!("n={n} c={c} oc={oc} on {sms} SMs: Auto runs {auto:?}");
        if n == 64 && sms >= 100 {
            assert!(matches!(auto, AutoPlan::Small(_)), "{auto:?}");
        }
        let want = reference(&inp, &w, Some(&bias), true, n, c, oc);
        for k in [MatmulKernel::Auto, MatmulKernel::Small] {
            let mut ws = MatmulWorkspace::from_buffer(poisoned(&gpu, floats.max(1)));
            let mut out = poisoned(&gpu, n * oc);
            matmul_forward_ws(&gpu, k, true, &mut out, &di, &dw, Some(&db), n, c, oc, &mut ws).unwrap();
            let what = format!("matmul {k:?} gelu=true n={n} c={c} oc={oc}");
            check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
        }
    }
}
