//! `matmul_forward_tf32` against the CPU reference `cpu::ops::matmul_forward`.
//!
//! Tolerances, in units of `scale = sqrt(C) · max|a| · max|b|`:
//! - `mma.sync` tiles round both operands to TF32 (10 mantissa bits, unit
//!   roundoff u = 2^-11): each product carries a relative error of about
//!   `sqrt(2/3) u`, a dot product of `C` terms an absolute error with
//!   standard deviation about `sqrt(C) · rms(a·b) · 0.8 u`. Bounds: max abs
//!   ≤ 1e-3 · scale (about 7 standard deviations for uniform inputs), RMSE
//!   ≤ 2.5e-4 · scale.
//! - `wgmma` tiles round in shared memory too; their `_trunc` twins feed raw
//!   f32 to the tensor cores, which truncate to TF32: each operand shrinks by a relative
//!   `δ ∈ [0, 2u)`, so a product shrinks by `2u` on average (a bias of
//!   `-2u · out`, rms `2u · scale / 3` for uniform inputs: 3.3e-4 · scale)
//!   plus a fluctuation of rms `sqrt(C) · rms(a·b) · 0.82 u` (1.3e-4 ·
//!   scale): RMSE ≈ 3.5e-4 · scale expected. Bounds: max abs ≤ 2.5e-3 ·
//!   scale, RMSE ≤ 5e-4 · scale. `matmul_tf32_wgmma_error_matches_cublas`
//!   compares both with cuBLAS TF32 on the same inputs.
//!
//! The measured errors are printed (run with `--nocapture`) and recorded in
//! docs/performance.md.

use cudarc::driver::CudaSlice;
use gpu_kernels::params::matmul_tf32::{MATMUL_TF32_VARIANTS, MATMUL_TF32_WGMMA_VARIANTS, TileEngine, TileShape};
use host::bench::{Blas, BlasMode};
use host::cpu::ops::matmul_forward;
use host::gpu::Gpu;
use host::gpu::ops::matmul_tf32::{
    MatmulTf32Error, choose_tile, matmul_forward_tf32, matmul_forward_tf32_with, predicted_cost, tf32_blocks,
    tf32_variants,
};
use rand::Rng;

/// Bounds for rounded operands (`mma.sync` tiles).
const MAX_ABS_PER_SCALE: f64 = 1e-3;
const RMSE_PER_SCALE: f64 = 2.5e-4;
/// Bounds for truncated operands (`wgmma` `_trunc` tiles).
const TRUNC_MAX_ABS_PER_SCALE: f64 = 2.5e-3;
const TRUNC_RMSE_PER_SCALE: f64 = 5e-4;

/// (max abs, RMSE) bounds per scale for a tile (`None`: the automatic pick,
/// which always rounds).
fn bounds(shape: Option<&TileShape>) -> (f64, f64) {
    if shape.is_none_or(|s| s.rounds) {
        (MAX_ABS_PER_SCALE, RMSE_PER_SCALE)
    } else {
        (TRUNC_MAX_ABS_PER_SCALE, TRUNC_RMSE_PER_SCALE)
    }
}

/// Max abs error and RMSE of `got` against `want`; fails on a non-finite element.
fn errors(got: &[f32], want: &[f32], oc: usize, what: &str) -> (f64, f64) {
    let (mut max_abs, mut sq) = (0f64, 0f64);
    for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} (row {}, col {}) is {g}",
            i / oc,
            i % oc
        );
        let e = (g as f64 - r as f64).abs();
        max_abs = max_abs.max(e);
        sq += e * e;
    }
    (max_abs, (sq / got.len().max(1) as f64).sqrt())
}

fn gelu(x: f32) -> f32 {
    let mut o = [0f32];
    host::cpu::ops::gelu_forward(&mut o, &[x], 1);
    o[0]
}

fn random(n: usize, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Runs one case (with the chosen tile, or `shape`), checks every element
/// and returns (max abs error, RMSE, scale).
fn check(gpu: &Gpu, shape: Option<&TileShape>, n: usize, c: usize, oc: usize, bias: bool, act: bool) -> (f64, f64) {
    let mut rng = rand::rng();
    let inp = random(n * c, &mut rng);
    let w = random(oc * c, &mut rng);
    let b = bias.then(|| random(oc, &mut rng));
    let mut want = vec![0f32; n * oc];
    matmul_forward(&mut want, &inp, &w, b.as_deref(), n, c, oc);
    if act {
        want.iter_mut().for_each(|v| *v = gelu(*v));
    }

    let d_inp = gpu.upload(&inp).unwrap();
    let d_w = gpu.upload(&w).unwrap();
    let d_b = b.as_ref().map(|b| gpu.upload(b).unwrap());
    let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
    let d_b_ref: Option<&CudaSlice<f32>> = d_b.as_ref();
    match shape {
        Some(s) => matmul_forward_tf32_with(gpu, s, &mut d_out, &d_inp, &d_w, d_b_ref, n, c, oc, act).unwrap(),
        None => matmul_forward_tf32(gpu, &mut d_out, &d_inp, &d_w, d_b_ref, n, c, oc, act).unwrap(),
    }
    let got = gpu.download(&d_out).unwrap();

    let amax = inp.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let bmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let scale = (c as f64).sqrt() * amax * bmax;
    let (max_abs, rmse) = errors(&got, &want, oc, &format!("n={n} c={c} oc={oc}"));
    let (max_bound, rmse_bound) = bounds(shape);
    let name = shape.map_or("auto", |s| s.name);
    eprintln!(
        "matmul_tf32 {name:32} n={n:5} c={c:5} oc={oc:6} bias={bias:5} gelu={act:5}: max abs {max_abs:.3e} ({:.2e} scale), RMSE {rmse:.3e} ({:.2e} scale)",
        max_abs / scale,
        rmse / scale
    );
    assert!(
        max_abs <= max_bound * scale,
        "{name}: max abs error {max_abs} > {} (n={n} c={c} oc={oc})",
        max_bound * scale
    );
    assert!(
        rmse <= rmse_bound * scale,
        "{name}: RMSE {rmse} > {} (n={n} c={c} oc={oc})",
        rmse_bound * scale
    );
    (max_abs, rmse)
}

#[test]
fn embedded_ptx_has_every_tf32_variant() {
    let has = |ptx: &str, s: &TileShape| ptx.contains(&format!(".visible .entry {}(", s.name));
    for s in &MATMUL_TF32_VARIANTS {
        assert!(has(gpt2::GPU_KERNELS_PTX, s), "{} missing", s.name);
        assert!(
            has(gpt2::GPU_KERNELS_SM90A_PTX, s),
            "{} missing from the sm_90a module",
            s.name
        );
    }
    for s in &MATMUL_TF32_WGMMA_VARIANTS {
        assert!(
            has(gpt2::GPU_KERNELS_SM90A_PTX, s),
            "{} missing from the sm_90a module",
            s.name
        );
        assert!(
            !has(gpt2::GPU_KERNELS_PTX, s),
            "{} must not be in the portable module",
            s.name
        );
    }
    assert!(gpt2::GPU_KERNELS_SM90A_PTX.contains(".target sm_90a"));
}

/// On a Hopper GPU (compute capability 9.0) the sm_90a module, with the
/// wgmma kernels, is the one loaded (unless GPT2_PORTABLE_KERNELS asks
/// otherwise): the speed of the TF32 path depends on it.
#[test]
fn hopper_loads_the_wgmma_module() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    use cudarc::driver::sys::CUdevice_attribute as Attr;
    let major = gpu
        .ctx
        .attribute(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .unwrap();
    let minor = gpu
        .ctx
        .attribute(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .unwrap();
    let portable =
        std::env::var_os(host::gpu::runtime::PORTABLE_KERNELS_ENV).is_some_and(|v| !v.is_empty() && v != "0");
    eprintln!(
        "compute capability {major}.{minor}, wgmma kernels loaded: {}",
        gpu.has_wgmma()
    );
    assert_eq!(gpu.has_wgmma(), (major, minor) == (9, 0) && !portable);
}

#[test]
fn matmul_tf32_gpt2_shapes() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    // (n, c, oc, bias, gelu): GPT-2's four linear layers at several token
    // counts, plus a slice of the LM head (oc = Vp = 50304, no bias).
    let cases = [
        (1, 768, 2304, true, false),
        (3, 768, 768, true, false),
        (64, 768, 3072, true, true),
        (100, 3072, 768, true, false),
        (1024, 768, 2304, true, false),
        (1024, 768, 3072, true, true),
        (1024, 3072, 768, true, false),
        (3, 768, 50304, false, false),
        (64, 768, 50304, false, false),
    ];
    for (n, c, oc, bias, act) in cases {
        check(&gpu, None, n, c, oc, bias, act);
    }
}

#[test]
fn matmul_tf32_awkward_shapes_every_variant() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    // Edges everywhere: n, oc not multiples of any tile; c not a multiple of
    // BK (a partial last k-tile) or smaller than it; oc odd (scalar stores).
    let cases = [
        (1, 768, 37, true, true),
        (100, 772, 130, true, false),
        (37, 12, 5, true, false),
        (129, 36, 257, false, true),
        (3, 3072, 769, true, false),
    ];
    for s in &tf32_variants(gpu.has_wgmma()) {
        for (n, c, oc, bias, act) in cases {
            check(&gpu, Some(s), n, c, oc, bias, act);
        }
    }
}

/// The chooser's `blocks_per_sm` (from ptxas for sm_90) against the
/// driver's occupancy calculator for the PTX it actually JIT-compiled. A
/// mismatch only makes the chooser's predictions wrong, so it is printed
/// loudly; it fails the test only where the shape cannot even fit once.
#[test]
fn matmul_tf32_blocks_per_sm_matches_driver() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    for s in &tf32_variants(gpu.has_wgmma()) {
        gpu.set_max_dynamic_shared(s.name, s.shared_bytes()).unwrap();
        let f = gpu.function(s.name).unwrap();
        let got = f
            .occupancy_max_active_blocks_per_multiprocessor(s.threads(), s.shared_bytes() as usize, None)
            .unwrap();
        let regs = f
            .get_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
            .unwrap();
        let local = f
            .get_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
            .unwrap();
        let note = if got == s.blocks_per_sm {
            ""
        } else {
            "  <-- MISMATCH: update blocks_per_sm"
        };
        eprintln!(
            "{:32} {} threads, {} B shared, {regs} registers, {local} B local: {got} blocks/SM (expected {}){note}",
            s.name,
            s.threads(),
            s.shared_bytes(),
            s.blocks_per_sm
        );
        assert!(got >= 1, "{} cannot be resident at all", s.name);
    }
}

/// The tile chooser always returns a compiled variant, and prints its
/// choice and predicted wave use for GPT-2's GEMMs (no GPU needed).
#[test]
fn matmul_tf32_chooser_choices() {
    const SMS: usize = 132;
    for (wgmma, engine) in [(false, TileEngine::MmaSync), (true, TileEngine::Wgmma)] {
        for m in [1, 64, 1024, 8192] {
            for (oc, c) in [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)] {
                let s = choose_tile(m, oc, SMS, wgmma);
                assert!(tf32_variants(wgmma).contains(&s) && s.engine == engine);
                eprintln!(
                    "M={m:5} N={oc:6} K={c:5}: {:36} {:6} blocks, cost {}",
                    s.name,
                    tf32_blocks(&s, m, oc),
                    predicted_cost(&s, m, oc, SMS)
                );
            }
        }
    }
}

#[test]
fn matmul_tf32_rejects_c_not_multiple_of_4() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    let (n, c, oc) = (2, 6, 3);
    let inp = gpu.upload(&vec![1f32; n * c]).unwrap();
    let w = gpu.upload(&vec![1f32; oc * c]).unwrap();
    let mut out = gpu.alloc::<f32>(n * oc).unwrap();
    let r = matmul_forward_tf32(&gpu, &mut out, &inp, &w, None::<&CudaSlice<f32>>, n, c, oc, false);
    assert!(matches!(r, Err(MatmulTf32Error::BadC(6))), "{r:?}");
}

/// On the same random inputs, the rounding wgmma tiles must err no more than
/// cuBLAS TF32 does against the CPU reference (RMSE within 1.5x: both round
/// to TF32 and differ in summation order); the truncating ones are printed.
#[test]
fn matmul_tf32_wgmma_error_matches_cublas() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    if !gpu.has_wgmma() {
        eprintln!("skipped: no wgmma kernels on this GPU");
        return;
    }
    let blas = Blas::new(gpu.stream.clone(), BlasMode::Tf32).unwrap();
    let mut rng = rand::rng();
    for (n, c, oc) in [(1024, 768, 2304), (1024, 3072, 768), (256, 768, 50304)] {
        let inp = random(n * c, &mut rng);
        let w = random(oc * c, &mut rng);
        let mut want = vec![0f32; n * oc];
        matmul_forward(&mut want, &inp, &w, None, n, c, oc);
        let scale = (c as f64).sqrt();
        let d_inp = gpu.upload(&inp).unwrap();
        let d_w = gpu.upload(&w).unwrap();
        let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        blas.gemm(&mut d_out, &d_inp, &d_w, n, oc, c).unwrap();
        let (cublas_max, cublas_rmse) = errors(&gpu.download(&d_out).unwrap(), &want, oc, "cuBLAS");
        for s in &MATMUL_TF32_WGMMA_VARIANTS {
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            matmul_forward_tf32_with(
                &gpu,
                s,
                &mut d_out,
                &d_inp,
                &d_w,
                None::<&CudaSlice<f32>>,
                n,
                c,
                oc,
                false,
            )
            .unwrap();
            let (max_abs, rmse) = errors(&gpu.download(&d_out).unwrap(), &want, oc, s.name);
            eprintln!(
                "n={n} c={c} oc={oc} {:34}: max abs {:.2e} scale, RMSE {:.2e} scale; cuBLAS TF32: {:.2e}, {:.2e}",
                s.name,
                max_abs / scale,
                rmse / scale,
                cublas_max / scale,
                cublas_rmse / scale
            );
            assert!(
                !s.rounds || rmse <= 1.5 * cublas_rmse,
                "{}: RMSE {rmse} vs cuBLAS TF32 {cublas_rmse}",
                s.name
            );
        }
    }
}
