//! The small-M FP32 matmul (`gpu_kernels::ops::matmul_small`: 64x64 tiles,
//! split-K finished by the last block of each tile) against
//! `host::cpu::ops::matmul_forward`, in the style of `kernels.rs`: fresh
//! random inputs, NaN-poisoned outputs and workspaces, awkward sizes, max
//! abs error and RMSE per case, several split counts.

use cudarc::driver::CudaSlice;
use gpu_host::shape::MatmulShape;
use gpu_kernels::params::matmul::{MATMUL_SMALL_TILE_K, MATMUL_SMALL_TILE_M, MATMUL_SMALL_TILE_N};
use host::cpu::ops as cpu;
use host::gpu::Gpu;
use host::gpu::ops::matmul::{
    AutoPlan, MatmulKernel, MatmulOptions, MatmulWorkspace, SmallPlan, matmul_forward_small, matmul_forward_with,
    plan_auto, split_k_workspace_floats,
};

use crate::kernels::{check, down, poisoned, random_vec, skip};

/// Tolerance of the FP32 matmul tests (`kernels.rs`): the kernel sums `c`
/// products in another order than the CPU.
const ATOL: f32 = 1e-4;
/// See [`ATOL`].
const RTOL: f32 = 1e-4;
/// Split counts asked for (the plan may come out with fewer).
const SPLITS: [usize; 5] = [1, 2, 3, 7, 24];

/// `(n, c, oc)` cases. Edges of the kernel: n = 1, n not a multiple of the
/// 64-row tile and n > 64 (two tile rows); oc not a multiple of the 64-column
/// tile and oc % 4 != 0; c a multiple of 4 but not of the 8-deep k-slice
/// (partial last slice), c % 4 != 0 (scalar loads), c shorter than one
/// slice, splits whose last chunk is shorter; GPT-2's shapes at n = 64.
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
fn reference(inp: &[f32], w: &[f32], bias: Option<&[f32]>, gelu: bool, n: usize, c: usize, oc: usize) -> Vec<f32> {
    let mut want = vec![0f32; n * oc];
    cpu::matmul_forward(&mut want, inp, w, bias, MatmulShape::new(n, oc, c));
    if gelu {
        let mut g = vec![0f32; n * oc];
        cpu::gelu_forward(&mut g, &want, n * oc);
        return g;
    }
    want
}

/// The distinct plans of [`SPLITS`] for depth `c`.
fn plans(c: usize) -> Vec<SmallPlan> {
    let mut v: Vec<SmallPlan> = SPLITS.iter().map(|&s| SmallPlan::split(c, s)).collect();
    v.dedup();
    v
}

/// A workspace of NaNs big enough for every plan of every shape: a partial
/// the kernel fails to write, or a sum reading past its splits, shows as NaN.
fn nan_workspace(gpu: &Gpu, shapes: &[(usize, usize, usize)]) -> MatmulWorkspace {
    let floats = shapes
        .iter()
        .flat_map(|&(n, c, oc)| {
            plans(c)
                .into_iter()
                .map(move |p| p.workspace_floats(MatmulShape::new(n, oc, c)))
        })
        .max()
        .unwrap_or(0);
    MatmulWorkspace::from_buffer(gpu, poisoned(gpu, floats.max(1))).unwrap()
}

/// Every shape, split count, bias and GELU setting, all through one
/// workspace in turn (as the engine's calls share one): each plan runs twice,
/// so a tile counter the last block failed to reset leaves the second
/// call's output unwritten (NaN).
#[test]
#[ignore = "needs a GPU"]
fn matmul_small_matches_cpu_every_split() {
    let Some(gpu) = skip::gpu() else { return };
    // The cases must exercise what the doc comment of SHAPES says.
    let tk = MATMUL_SMALL_TILE_K as usize;
    assert!(SHAPES.iter().any(|&(_, c, _)| c < tk));
    assert!(SHAPES.iter().any(|&(_, c, _)| c % 4 != 0));
    assert!(SHAPES.iter().any(|&(_, c, _)| c % 4 == 0 && c % tk != 0));
    assert!(SHAPES.iter().any(|&(n, _, _)| n > MATMUL_SMALL_TILE_M as usize));
    assert!(
        SHAPES
            .iter()
            .any(|&(_, _, oc)| oc % MATMUL_SMALL_TILE_N as usize != 0 && oc % 4 != 0)
    );
    assert!(SHAPES.iter().any(|&(_, c, _)| {
        plans(c)
            .iter()
            .any(|p| p.splits > 2 && !c.is_multiple_of(p.k_chunk as usize))
    }));
    let mut ws = nan_workspace(&gpu, &SHAPES);
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
                for plan in plans(c) {
                    for run in 0..2 {
                        let mut out = poisoned(&gpu, n * oc);
                        let b = with_bias.then_some(&db);
                        matmul_forward_small(
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
                        let what =
                            format!("matmul_small {plan:?} run {run} gelu={gelu} bias={with_bias} n={n} c={c} oc={oc}");
                        check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
                    }
                }
            }
        }
    }
}

/// Operands and output one float into their buffers (not 16-byte aligned,
/// although c % 4 == 0 and oc % 4 == 0): the scalar load path. The float
/// before the output must stay untouched.
#[test]
#[ignore = "needs a GPU"]
fn matmul_small_unaligned_operands() {
    let Some(gpu) = skip::gpu() else { return };
    let shapes = [(64, 136, 96), (70, 64, 40)];
    let mut ws = nan_workspace(&gpu, &shapes);
    for (n, c, oc) in shapes {
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
        for plan in plans(c) {
            let mut out = poisoned(&gpu, n * oc + 1);
            let mut vo = out.slice_mut(1..);
            matmul_forward_small(
                &gpu,
                MatmulOptions {
                    kernel: plan,
                    gelu: true,
                    workspace: Some(&mut ws),
                },
                &mut vo,
                &vi,
                &vw,
                Some(&db),
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
            let got = down(&gpu, &out);
            assert!(got[0].is_nan(), "{plan:?}: wrote before the output");
            let what = format!("matmul_small {plan:?} unaligned n={n} c={c} oc={oc}");
            check(&what, &got[1..], &want, ATOL, RTOL);
        }
    }
}

/// The partial tiles are summed in split order whichever block arrives
/// last: two runs of the same plan give the same bits.
#[test]
#[ignore = "needs a GPU"]
fn matmul_small_is_deterministic() {
    let Some(gpu) = skip::gpu() else { return };
    let (n, c, oc) = (64, 3072, 768);
    let (inp, w, bias) = inputs(n, c, oc);
    let (di, dw, db) = (
        gpu.upload(&inp).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&bias).unwrap(),
    );
    let mut ws = nan_workspace(&gpu, &[(n, c, oc)]);
    for plan in plans(c) {
        let runs: Vec<Vec<f32>> = (0..3)
            .map(|_| {
                let mut out = poisoned(&gpu, n * oc);
                matmul_forward_small(
                    &gpu,
                    MatmulOptions {
                        kernel: plan,
                        gelu: false,
                        workspace: Some(&mut ws),
                    },
                    &mut out,
                    &di,
                    &dw,
                    Some(&db),
                    MatmulShape::new(n, oc, c),
                )
                .unwrap();
                down(&gpu, &out)
            })
            .collect();
        for r in &runs[1..] {
            let same = runs[0].iter().zip(r).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{plan:?}: runs differ");
        }
    }
}

/// A split plan without a workspace, or with one too small, is an error,
/// not an out-of-bounds write.
#[test]
#[ignore = "needs a GPU"]
fn matmul_small_checks_its_workspace() {
    let Some(gpu) = skip::gpu() else { return };
    let (n, c, oc) = (64, 768, 768);
    let (inp, w, _) = inputs(n, c, oc);
    let (di, dw) = (gpu.upload(&inp).unwrap(), gpu.upload(&w).unwrap());
    let plan = SmallPlan::split(c, 4);
    assert!(plan.splits > 1);
    let mut out = poisoned(&gpu, n * oc);
    let none = None::<&CudaSlice<f32>>;
    assert!(
        matmul_forward_small(
            &gpu,
            MatmulOptions {
                kernel: plan,
                gelu: false,
                workspace: None
            },
            &mut out,
            &di,
            &dw,
            none,
            MatmulShape::new(n, oc, c)
        )
        .is_err()
    );
    let mut small = MatmulWorkspace::new(&gpu, plan.workspace_floats(MatmulShape::new(n, oc, c)) - 1).unwrap();
    let r = matmul_forward_small(
        &gpu,
        MatmulOptions {
            kernel: plan,
            gelu: false,
            workspace: Some(&mut small),
        },
        &mut out,
        &di,
        &dw,
        none,
        MatmulShape::new(n, oc, c),
    );
    assert!(r.is_err());
    let bad = SmallPlan {
        splits: 3,
        k_chunk: 100,
    };
    let mut ws = MatmulWorkspace::new(&gpu, bad.workspace_floats(MatmulShape::new(n, oc, c))).unwrap();
    let r = matmul_forward_small(
        &gpu,
        MatmulOptions {
            kernel: bad,
            gelu: false,
            workspace: Some(&mut ws),
        },
        &mut out,
        &di,
        &dw,
        none,
        MatmulShape::new(n, oc, c),
    );
    assert!(r.is_err(), "a chunk that is not a multiple of the k-slice");
    assert!(down(&gpu, &out).iter().all(|v| v.is_nan()), "a refused call wrote");
}

/// `Auto` with the engine's workspace picks the small kernel for GPT-2's
/// n = 64 projections on this GPU, and gets them right; so do `Small` and
/// `Auto` on n just past the GEMV limit and at the small kernel's row limit.
#[test]
#[ignore = "needs a GPU"]
fn matmul_small_through_auto() {
    let Some(gpu) = skip::gpu() else { return };
    let sms = gpu.sm_count();
    for (n, c, oc) in [(64, 768, 2304), (64, 768, 3072), (9, 768, 768), (128, 768, 2304)] {
        let (inp, w, bias) = inputs(n, c, oc);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        let floats = split_k_workspace_floats(MatmulShape::new(n, oc, c), sms);
        let auto = plan_auto(MatmulShape::new(n, oc, c), sms, floats);
        println!("n={n} c={c} oc={oc} on {sms} SMs: Auto runs {auto:?}");
        if n == 64 && sms >= 100 {
            assert!(matches!(auto, AutoPlan::Small(_)), "{auto:?}");
        }
        let want = reference(&inp, &w, Some(&bias), true, n, c, oc);
        let mut ws = MatmulWorkspace::from_buffer(&gpu, poisoned(&gpu, floats.max(1))).unwrap();
        for k in [MatmulKernel::Auto, MatmulKernel::Small] {
            let mut out = poisoned(&gpu, n * oc);
            matmul_forward_with(
                &gpu,
                MatmulOptions {
                    kernel: k,
                    gelu: true,
                    workspace: Some(&mut ws),
                },
                &mut out,
                &di,
                &dw,
                Some(&db),
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
            let what = format!("matmul {k:?} gelu=true n={n} c={c} oc={oc}");
            check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
        }
    }
}
