//! The FP32 matmul on the TF32 tensor cores as 3xTF32
//! (`matmul_forward_fp32_tc`, every `mma.sync` tile and, on Hopper, every
//! `wgmma` one (`fp32_tc_variants`), several
//! split counts) against `host::cpu::ops::matmul_forward` at the FP32
//! kernels' tolerance: fresh random inputs, NaN-poisoned outputs and
//! workspaces, awkward sizes, the error printed per case.

use cudarc::driver::CudaSlice;
use gpu_host::shape::MatmulShape;
use gpu_kernels::params::matmul_tf32::{MATMUL_3XTF32_VARIANTS, MATMUL_3XTF32_WGMMA_VARIANTS};
use host::cpu::ops as cpu;
use host::gpu::ops::matmul_tf32::{
    FP32_TC_MAX_SPLITS, FP32_TC_WGMMA_MIN_ROWS, Tf32TileOptions, fp32_tc_plan, fp32_tc_uses_wgmma, fp32_tc_variants,
    matmul_forward_fp32_tc, matmul_forward_fp32_tc_with,
};

use crate::kernels::{check, down, poisoned, random_vec, skip};

/// The FP32 matmul tests' tolerance (`matmul_small.rs`): 3xTF32 keeps
/// FP32's accuracy (the dropped small·small term is ~2^-22 of a product),
/// and sums in another order than the CPU.
const ATOL: f32 = 1e-4;
/// See [`ATOL`].
const RTOL: f32 = 1e-4;
/// Split counts asked for.
const SPLITS: [usize; 4] = [1, 2, 3, FP32_TC_MAX_SPLITS];

/// `(n, c, oc)`: GPT-2's shapes at the server's 64 rows and a prefill's
/// 300; n = 1; n, oc not multiples of any tile; c a multiple of 4 but not of
/// the 32-deep k-tile; c shorter than one k-tile; splits with a short last part.
const SHAPES: [(usize, usize, usize); 8] = [
    (64, 768, 2304),
    (64, 3072, 768),
    (300, 768, 3072),
    (1, 768, 768),
    (37, 132, 70),
    (129, 516, 4),
    (5, 4, 33),
    (70, 200, 131),
];

/// Every tile, split count, bias and GELU setting against the CPU; each
/// call's output and the workspace poisoned first.
#[test]
#[ignore = "needs a GPU"]
fn matmul_fp32_tc_matches_cpu_every_tile_and_split() {
    let Some(gpu) = skip::gpu() else { return };
    let floats = SHAPES.iter().map(|&(n, _, oc)| n * oc).max().unwrap() * FP32_TC_MAX_SPLITS;
    let mut ws: CudaSlice<f32> = poisoned(&gpu, floats);
    for &(n, c, oc) in &SHAPES {
        let inp = random_vec(n * c, 1.0);
        let w = random_vec(oc * c, 1.0 / (c as f32).sqrt());
        let bias = random_vec(oc, 1.0);
        let (di, dw, db) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&bias).unwrap(),
        );
        for with_bias in [true, false] {
            for gelu in [false, true] {
                let b = with_bias.then_some(&bias[..]);
                let mut want = vec![0f32; n * oc];
                cpu::matmul_forward(&mut want, &inp, &w, b, MatmulShape::new(n, oc, c));
                if gelu {
                    let pre = want.clone();
                    cpu::gelu_forward(&mut want, &pre, n * oc);
                }
                for shape in &fp32_tc_variants(gpu.has_wgmma()) {
                    for splits in SPLITS {
                        let mut out = poisoned(&gpu, n * oc);
                        let db_ref = with_bias.then_some(&db);
                        matmul_forward_fp32_tc_with(
                            &gpu,
                            Tf32TileOptions {
                                splits,
                                gelu,
                                split_workspace: Some(&mut ws),
                                ..Tf32TileOptions::new(*shape)
                            },
                            &mut out,
                            &di,
                            &dw,
                            db_ref,
                            MatmulShape::new(n, oc, c),
                        )
                        .unwrap();
                        let what = format!(
                            "{} splits {splits} n={n} c={c} oc={oc} bias={with_bias} gelu={gelu}",
                            shape.name
                        );
                        check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
                    }
                }
            }
        }
    }
}

/// The planned call (`matmul_forward_fp32_tc`) on GPT-2's shapes at the
/// server's and a prefill's rows, and the plan it takes.
#[test]
#[ignore = "needs a GPU"]
fn matmul_fp32_tc_planned_gpt2_shapes() {
    let Some(gpu) = skip::gpu() else { return };
    let mut ws: CudaSlice<f32> = poisoned(&gpu, 64 * 3072 * FP32_TC_MAX_SPLITS);
    for n in [16, 64, 512] {
        for (c, oc) in [(768, 2304), (768, 768), (768, 3072), (3072, 768)] {
            let (shape, splits) = fp32_tc_plan(
                MatmulShape::new(n, oc, c),
                gpu.sm_count(),
                ws.len(),
                fp32_tc_uses_wgmma(&gpu),
            );
            let inp = random_vec(n * c, 1.0);
            let w = random_vec(oc * c, 1.0 / (c as f32).sqrt());
            let (di, dw) = (gpu.upload(&inp).unwrap(), gpu.upload(&w).unwrap());
            let mut want = vec![0f32; n * oc];
            cpu::matmul_forward(&mut want, &inp, &w, None, MatmulShape::new(n, oc, c));
            let mut out = poisoned(&gpu, n * oc);
            matmul_forward_fp32_tc(
                &gpu,
                Some(&mut ws),
                &mut out,
                &di,
                &dw,
                None::<&CudaSlice<f32>>,
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
            let what = format!("planned {} x{splits} n={n} c={c} oc={oc}", shape.name);
            check(&what, &down(&gpu, &out), &want, ATOL, RTOL);
        }
    }
}

/// The plan splits only outputs that leave the GPU idle, within the
/// workspace, and never beyond the k-tiles (no GPU needed).
#[test]
fn matmul_fp32_tc_plan_policy() {
    const SMS: usize = 132;
    let big = usize::MAX / 2;
    for wgmma in [false, true] {
        let (_, s) = fp32_tc_plan(MatmulShape::new(64, 2304, 768), SMS, big, wgmma);
        assert!(s > 1, "M=64 N=2304 K=768 leaves SMs idle: should split, got {s}");
        let (_, s) = fp32_tc_plan(MatmulShape::new(8192, 2304, 768), SMS, big, wgmma);
        assert_eq!(s, 1, "a full GPU needs no split");
        let (_, s) = fp32_tc_plan(MatmulShape::new(64, 2304, 768), SMS, 64 * 2304, wgmma);
        assert_eq!(s, 1, "a workspace of one output allows no split");
        let (_, s) = fp32_tc_plan(MatmulShape::new(64, 2304, 8), SMS, big, wgmma);
        assert_eq!(s, 1, "one k-tile cannot split");
        let tiles: &[_] = if wgmma {
            &MATMUL_3XTF32_WGMMA_VARIANTS
        } else {
            &MATMUL_3XTF32_VARIANTS
        };
        for n in [1, 64, 1024, 8192] {
            for (c, oc) in [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50304)] {
                let (shape, splits) = fp32_tc_plan(MatmulShape::new(n, oc, c), SMS, big, wgmma);
                let tiles = if n >= FP32_TC_WGMMA_MIN_ROWS {
                    tiles
                } else {
                    &MATMUL_3XTF32_VARIANTS
                };
                assert!(tiles.contains(&shape) && (1..=FP32_TC_MAX_SPLITS).contains(&splits));
                eprintln!("M={n:5} N={oc:6} K={c:5}: {:40} x{splits}", shape.name);
            }
        }
    }
}

/// Every 3xTF32 kernel is in both modules (the `wgmma` ones, sm_90a only,
/// are checked with every other kernel by
/// `pipeline::embedded_ptx_has_every_kernel_entry`).
#[test]
fn embedded_ptx_has_every_fp32_tc_variant() {
    for s in &MATMUL_3XTF32_VARIANTS {
        let entry = format!(".visible .entry {}(", s.name);
        assert!(gpu_host::GPU_KERNELS_PTX.contains(&entry), "{} missing", s.name);
        assert!(
            gpu_host::GPU_KERNELS_SM90A_PTX.contains(&entry),
            "{} missing from sm_90a",
            s.name
        );
    }
}
