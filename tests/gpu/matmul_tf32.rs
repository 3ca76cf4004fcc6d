//! `matmul_forward_tf32` against the CPU reference `cpu::ops::matmul_forward`.
//!
//! Tolerance: TF32 rounds both operands to 10 mantissa bits (unit roundoff
//! u = 2^-11), so each product carries a relative error of about `sqrt(2/3) u`
//! and a dot product of `C` terms an absolute error with standard deviation
//! about `sqrt(C) · rms(a·b) · 0.8 u`. The bounds below are in units of
//! `scale = sqrt(C) · max|a| · max|b|`: max abs error ≤ 1e-3 · scale (about
//! 7 standard deviations for uniform inputs) and RMSE ≤ 2.5e-4 · scale.
//! The `wgmma` kernels (Hopper) round `inp` themselves but take `weight` as
//! given, so these tests hand them TF32-rounded weights (`round_tf32`, as
//! the engine does); `matmul_tf32_wgmma_error_matches_cublas` shows the
//! result errs exactly as much as cuBLAS TF32 on the unrounded weights.
//!
//! The measured errors are printed (run with `--nocapture`) and recorded in
//! docs/performance.md.

use cudarc::driver::CudaSlice;
use gpu_host::shape::{MatmulShape, RowShape};
use gpu_kernels::params::matmul_tf32::{MATMUL_TF32_VARIANTS, MATMUL_TF32_WGMMA_VARIANTS, TileEngine, TileShape};
use host::bench::{Blas, BlasMode};
use host::cpu::ops::{matmul_forward, round_tf32};
use host::gpu::Gpu;
use host::gpu::ops::matmul_tf32::{
    MatmulTf32Error, Tf32TileOptions, choose_tile, matmul_forward_tf32, matmul_forward_tf32_with, predicted_cost,
    tf32_blocks, tf32_variants,
};
use rand::Rng;

use crate::kernels::skip;

const MAX_ABS_PER_SCALE: f64 = 1e-3;
const RMSE_PER_SCALE: f64 = 2.5e-4;

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
    let mut rng = crate::seed::rng();
    let inp = random(n * c, &mut rng);
    let w = random(oc * c, &mut rng);
    let b = bias.then(|| random(oc, &mut rng));
    // The wgmma tiles take the weights as given (see the module docs).
    let wgmma = shape.map_or(gpu.has_wgmma(), |s| s.engine == TileEngine::Wgmma);
    let mut w_in = w.clone();
    if wgmma {
        round_tf32(&mut w_in);
    }
    let mut want = vec![0f32; n * oc];
    matmul_forward(&mut want, &inp, &w, b.as_deref(), MatmulShape::new(n, oc, c));
    if act {
        want.iter_mut().for_each(|v| *v = gelu(*v));
    }

    let d_inp = gpu.upload(&inp).unwrap();
    let d_w = gpu.upload(&w_in).unwrap();
    let d_b = b.as_ref().map(|b| gpu.upload(b).unwrap());
    let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
    let d_b_ref: Option<&CudaSlice<f32>> = d_b.as_ref();
    match shape {
        Some(s) => matmul_forward_tf32_with(
            gpu,
            Tf32TileOptions {
                gelu: act,
                ..Tf32TileOptions::new(*s)
            },
            &mut d_out,
            &d_inp,
            &d_w,
            d_b_ref,
            MatmulShape::new(n, oc, c),
        )
        .unwrap(),
        None => matmul_forward_tf32(gpu, &mut d_out, &d_inp, &d_w, d_b_ref, MatmulShape::new(n, oc, c), act).unwrap(),
    }
    let got = gpu.download(&d_out).unwrap();

    let amax = inp.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let bmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let scale = (c as f64).sqrt() * amax * bmax;
    let (max_abs, rmse) = errors(&got, &want, oc, &format!("n={n} c={c} oc={oc}"));
    let (max_bound, rmse_bound) = (MAX_ABS_PER_SCALE, RMSE_PER_SCALE);
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
        assert!(has(gpu_host::GPU_KERNELS_PTX, s), "{} missing", s.name);
        assert!(
            has(gpu_host::GPU_KERNELS_SM90A_PTX, s),
            "{} missing from the sm_90a module",
            s.name
        );
    }
    for s in &MATMUL_TF32_WGMMA_VARIANTS {
        assert!(
            has(gpu_host::GPU_KERNELS_SM90A_PTX, s),
            "{} missing from the sm_90a module",
            s.name
        );
        assert!(
            !has(gpu_host::GPU_KERNELS_PTX, s),
            "{} must not be in the portable module",
            s.name
        );
    }
    assert!(gpu_host::GPU_KERNELS_SM90A_PTX.contains(".target sm_90a"));
}

/// On a Hopper GPU (compute capability 9.0) the sm_90a module, with the
/// wgmma kernels, is the one loaded (unless GPT2_PORTABLE_KERNELS asks
/// otherwise): the speed of the TF32 path depends on it.
#[test]
#[ignore = "needs a GPU"]
fn hopper_loads_the_wgmma_module() {
    let Some(gpu) = skip::gpu() else { return };
    let (major, minor) = compute_capability(&gpu);
    eprintln!(
        "compute capability {major}.{minor}, wgmma kernels loaded: {}",
        gpu.has_wgmma()
    );
    assert_eq!(gpu.has_wgmma(), wgmma_expected(&gpu));
}

fn compute_capability(gpu: &Gpu) -> (i32, i32) {
    use cudarc::driver::sys::CUdevice_attribute as Attr;
    let attr = |a| gpu.attribute(a).unwrap();
    (
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
    )
}

/// Whether this GPU should have loaded the wgmma (sm_90a) module: compute
/// capability 9.0, unless `GPT2_PORTABLE_KERNELS` forces the portable one.
fn wgmma_expected(gpu: &Gpu) -> bool {
    let portable =
        std::env::var_os(host::gpu::runtime::PORTABLE_KERNELS_ENV).is_some_and(|v| !v.is_empty() && v != "0");
    compute_capability(gpu) == (9, 0) && !portable
}

/// The GPU for a test of the wgmma kernels, or `None` after a skip
/// (`SKIPPED: ...`) where they cannot run: another GPU, or the portable
/// module forced. Where they should have been loaded (compute capability
/// 9.0, not forced portable) and `GPT2_REQUIRE_GPU=1`, a missing wgmma module
/// fails the test instead.
///
/// `scripts/gpu-runner.sh` names the tests that call this in `WGMMA_TESTS`
/// and leaves them out of the passes where they cannot run (the portable
/// pass; a GPU that is not compute capability 9.0), since a skip fails its
/// summary: add a new wgmma-only test there too.
pub(crate) fn wgmma_gpu() -> Option<Gpu> {
    let gpu = skip::gpu()?;
    if gpu.has_wgmma() {
        return Some(gpu);
    }
    if wgmma_expected(&gpu) {
        skip::unless_required(
            skip::REQUIRE_GPU_ENV,
            "the GPU is compute capability 9.0, but the wgmma kernels were not loaded",
        );
    } else {
        let (major, minor) = compute_capability(&gpu);
        skip::skip(format_args!(
            "no wgmma kernels: compute capability {major}.{minor} (they need 9.0) or {} set",
            host::gpu::runtime::PORTABLE_KERNELS_ENV
        ));
    }
    None
}

#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_gpt2_shapes() {
    let Some(gpu) = skip::gpu() else { return };
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
#[ignore = "needs a GPU"]
fn matmul_tf32_awkward_shapes_every_variant() {
    let Some(gpu) = skip::gpu() else { return };
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
#[ignore = "needs a GPU"]
fn matmul_tf32_blocks_per_sm_matches_driver() {
    let Some(gpu) = skip::gpu() else { return };
    let fp32_tc = host::gpu::ops::matmul_tf32::fp32_tc_variants(gpu.has_wgmma());
    for s in tf32_variants(gpu.has_wgmma()).iter().chain(&fp32_tc) {
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
                let shape = MatmulShape::new(m, oc, c);
                let s = choose_tile(shape, SMS, wgmma);
                assert!(tf32_variants(wgmma).contains(&s) && s.engine == engine);
                eprintln!(
                    "M={m:5} N={oc:6} K={c:5}: {:36} {:6} blocks, cost {}",
                    s.name,
                    tf32_blocks(&s, shape),
                    predicted_cost(&s, shape, SMS)
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_rejects_c_not_multiple_of_4() {
    let Some(gpu) = skip::gpu() else { return };
    let (n, c, oc) = (2, 6, 3);
    let inp = gpu.upload(&vec![1f32; n * c]).unwrap();
    let w = gpu.upload(&vec![1f32; oc * c]).unwrap();
    let mut out = gpu.alloc::<f32>(n * oc).unwrap();
    let r = matmul_forward_tf32(
        &gpu,
        &mut out,
        &inp,
        &w,
        None::<&CudaSlice<f32>>,
        MatmulShape::new(n, oc, c),
        false,
    );
    assert!(matches!(r, Err(MatmulTf32Error::BadC(6))), "{r:?}");
}

/// On the same random inputs (cuBLAS given the raw weights, ours the
/// TF32-rounded ones, as the engine holds them) the wgmma tiles must err no
/// more than cuBLAS TF32 against the CPU reference: RMSE within 1.5x (both
/// round both operands; they differ in summation order).
#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_wgmma_error_matches_cublas() {
    let Some(gpu) = wgmma_gpu() else { return };
    let blas = Blas::new(&gpu, BlasMode::Tf32).unwrap();
    let mut rng = crate::seed::rng();
    for (n, c, oc) in [(1024, 768, 2304), (1024, 3072, 768), (256, 768, 50304)] {
        let inp = random(n * c, &mut rng);
        let w = random(oc * c, &mut rng);
        let mut want = vec![0f32; n * oc];
        matmul_forward(&mut want, &inp, &w, None, MatmulShape::new(n, oc, c));
        let scale = (c as f64).sqrt();
        let d_inp = gpu.upload(&inp).unwrap();
        let d_w = gpu.upload(&w).unwrap();
        let mut w_rounded = w.clone();
        round_tf32(&mut w_rounded);
        let d_w_rounded = gpu.upload(&w_rounded).unwrap();
        let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        blas.gemm(&mut d_out, &d_inp, &d_w, n, oc, c).unwrap();
        let (cublas_max, cublas_rmse) = errors(&gpu.download(&d_out).unwrap(), &want, oc, "cuBLAS");
        for s in &MATMUL_TF32_WGMMA_VARIANTS {
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            matmul_forward_tf32_with(
                &gpu,
                Tf32TileOptions::new(*s),
                &mut d_out,
                &d_inp,
                &d_w_rounded,
                None::<&CudaSlice<f32>>,
                MatmulShape::new(n, oc, c),
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
                rmse <= 1.5 * cublas_rmse,
                "{}: RMSE {rmse} vs cuBLAS TF32 {cublas_rmse}",
                s.name
            );
        }
    }
}

/// The `round_tf32` kernel against its CPU twin, bit for bit, on values of
/// every magnitude (and the ties, NaN and infinities the rule singles out).
#[test]
#[ignore = "needs a GPU"]
fn round_tf32_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let mut x: Vec<f32> = (0..100_003)
        .map(|_| f32::from_bits(rng.random::<u32>()))
        .filter(|v| !v.is_nan())
        .collect();
    // Exact ties (half of the dropped range), both signs; the largest finite value.
    x.extend([
        1.0 + 2f32.powi(-11),
        -(1.0 + 2f32.powi(-11)),
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
    ]);
    let mut want = x.clone();
    round_tf32(&mut want);
    let mut d = gpu.upload(&x).unwrap();
    host::gpu::ops::convert::round_tf32(&gpu, &mut d, x.len()).unwrap();
    let got = gpu.download(&d).unwrap();
    let bad = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    eprintln!("round_tf32: {} values, {bad} differ from the CPU twin", x.len());
    assert_eq!(bad, 0);
    assert_eq!(
        want[want.len() - 7],
        1.0 + 2f32.powi(-10),
        "a tie rounds away from zero"
    );
}

/// Every value is a TF32 value: its 13 low mantissa bits are zero.
fn all_tf32(x: &[f32]) -> bool {
    const DROPPED: u32 = (1 << 13) - 1;
    x.iter().all(|v| v.to_bits() & DROPPED == 0)
}

/// `layernorm_forward_tf32` (the producer of most of the engine's TF32
/// matmul inputs; the fused fc+GELU is `matmul_tf32_round_out_rounds_the_results`)
/// writes TF32 values, equal to its CPU twin (layernorm, then `round_tf32`)
/// up to one TF32 step where the FP32 result straddles a rounding boundary.
#[test]
#[ignore = "needs a GPU"]
fn layernorm_tf32_rounds_its_outputs() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (n, c) = (37, 768);
    let x = random(n * c, &mut rng);
    let (w, b) = (random(c, &mut rng), random(c, &mut rng));
    let one_step = |v: f32| v.abs() * 2f32.powi(-10) + 1e-6;

    let mut want = vec![0f32; n * c];
    host::cpu::ops::layernorm_forward(&mut want, &x, &w, &b, RowShape::new(n, c));
    round_tf32(&mut want);
    let (dx, dw, db) = (
        gpu.upload(&x).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&b).unwrap(),
    );
    let mut d_out = gpu.upload(&vec![f32::NAN; n * c]).unwrap();
    host::gpu::ops::layernorm::layernorm_forward_tf32(&gpu, &mut d_out, &dx, &dw, &db, RowShape::new(n, c)).unwrap();
    let got = gpu.download(&d_out).unwrap();
    assert!(all_tf32(&got), "layernorm_forward_tf32 wrote values that are not TF32");
    let far = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| (**g - **w).abs() > one_step(**w))
        .count();
    assert_eq!(
        far, 0,
        "layernorm_forward_tf32: {far} values more than one TF32 step from the CPU twin"
    );
}

/// With a producer-rounded `inp` the wgmma kernels skip their rounding pass
/// and give the same result as rounding it themselves (bit for bit: the
/// operands the tensor cores see are identical).
#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_rounded_inp_equals_in_kernel_rounding() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (n, c, oc) = (300, 768, 2304);
    let mut inp = random(n * c, &mut rng);
    let mut w = random(oc * c, &mut rng);
    round_tf32(&mut w);
    let bias = random(oc, &mut rng);
    let (dw, db) = (gpu.upload(&w).unwrap(), gpu.upload(&bias).unwrap());
    let run = |inp: &[f32], pre: bool| {
        let di = gpu.upload(inp).unwrap();
        let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        if pre {
            let opts = host::gpu::ops::matmul_tf32::Tf32Options {
                gelu: true,
                inp_rounded: true,
                round_out: false,
                split_workspace: None,
            };
            host::gpu::ops::matmul_tf32::matmul_forward_tf32_opts(
                &gpu,
                opts,
                &mut d_out,
                &di,
                &dw,
                Some(&db),
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
        } else {
            matmul_forward_tf32(&gpu, &mut d_out, &di, &dw, Some(&db), MatmulShape::new(n, oc, c), true).unwrap();
        }
        gpu.download(&d_out).unwrap()
    };
    let raw = run(&inp, false);
    round_tf32(&mut inp);
    let pre = run(&inp, true);
    let differ = raw.iter().zip(&pre).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(
        differ, 0,
        "{differ} outputs differ between producer and in-kernel rounding"
    );
}

/// Split-K on the wgmma tiles: every tile, 2 to 4 parts, uneven last parts
/// (c = 772 is 25 k-tiles), bias and GELU applied once by the reduction;
/// against the CPU reference with the usual TF32 bounds.
#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_split_k_every_wgmma_tile() {
    let Some(gpu) = wgmma_gpu() else { return };
    let mut rng = crate::seed::rng();
    for s in &MATMUL_TF32_WGMMA_VARIANTS {
        for (n, c, oc, splits, bias, act) in [
            (100, 772, 130, 4, true, true),
            (64, 3072, 768, 3, true, false),
            (33, 36, 10, 2, false, true),
        ] {
            let inp = random(n * c, &mut rng);
            let mut w = random(oc * c, &mut rng);
            round_tf32(&mut w);
            let b = bias.then(|| random(oc, &mut rng));
            let mut want = vec![0f32; n * oc];
            matmul_forward(&mut want, &inp, &w, b.as_deref(), MatmulShape::new(n, oc, c));
            if act {
                want.iter_mut().for_each(|v| *v = gelu(*v));
            }
            let (di, dw) = (gpu.upload(&inp).unwrap(), gpu.upload(&w).unwrap());
            let db = b.as_ref().map(|b| gpu.upload(b).unwrap());
            let mut ws = gpu.upload(&vec![f32::NAN; splits * n * oc]).unwrap();
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            host::gpu::ops::matmul_tf32::matmul_forward_tf32_with(
                &gpu,
                Tf32TileOptions {
                    splits,
                    gelu: act,
                    split_workspace: Some(&mut ws),
                    ..Tf32TileOptions::new(*s)
                },
                &mut d_out,
                &di,
                &dw,
                db.as_ref(),
                MatmulShape::new(n, oc, c),
            )
            .unwrap();
            let got = gpu.download(&d_out).unwrap();
            let what = format!("{} split {splits} n={n} c={c} oc={oc}", s.name);
            let (max_abs, rmse) = errors(&got, &want, oc, &what);
            let scale = (c as f64).sqrt();
            eprintln!(
                "{what}: max abs {:.2e} scale, RMSE {:.2e} scale",
                max_abs / scale,
                rmse / scale
            );
            assert!(
                max_abs <= MAX_ABS_PER_SCALE * scale && rmse <= RMSE_PER_SCALE * scale,
                "{what}"
            );
        }
    }
}

/// The split-K policy: only wgmma tiles, only under a wave, only deep `c`.
#[test]
fn matmul_tf32_split_policy() {
    use gpu_kernels::params::matmul_tf32::{MATMUL_TF32_128X192, MATMUL_TF32_WGMMA_64X128};
    use host::gpu::ops::matmul_tf32::{TF32_MAX_SPLITS, tf32_splits};
    const SMS: usize = 132;
    let deep = tf32_splits(&MATMUL_TF32_WGMMA_64X128, MatmulShape::new(1024, 768, 3072), SMS);
    assert!(
        (2..=TF32_MAX_SPLITS).contains(&deep),
        "M=1024 N=768 K=3072 should split, got {deep}"
    );
    assert_eq!(
        tf32_splits(&MATMUL_TF32_WGMMA_64X128, MatmulShape::new(1024, 768, 768), SMS),
        1,
        "K=768 is too shallow"
    );
    assert_eq!(
        tf32_splits(&MATMUL_TF32_WGMMA_64X128, MatmulShape::new(8192, 768, 3072), SMS),
        1,
        "a full GPU needs no split"
    );
    assert_eq!(
        tf32_splits(&MATMUL_TF32_128X192, MatmulShape::new(1024, 768, 3072), SMS),
        1,
        "mma.sync tiles never split"
    );
}

/// `round_out` (the engine's fused MLP up-projection): the same results as
/// without it, each rounded to TF32, bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn matmul_tf32_round_out_rounds_the_results() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (n, c, oc) = (200, 768, 3072);
    let mut w = random(oc * c, &mut rng);
    round_tf32(&mut w);
    let (di, dw, db) = (
        gpu.upload(&random(n * c, &mut rng)).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&random(oc, &mut rng)).unwrap(),
    );
    let run = |round_out: bool| {
        let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        let opts = host::gpu::ops::matmul_tf32::Tf32Options {
            gelu: true,
            inp_rounded: false,
            round_out,
            split_workspace: None,
        };
        host::gpu::ops::matmul_tf32::matmul_forward_tf32_opts(
            &gpu,
            opts,
            &mut d_out,
            &di,
            &dw,
            Some(&db),
            MatmulShape::new(n, oc, c),
        )
        .unwrap();
        gpu.download(&d_out).unwrap()
    };
    let mut want = run(false);
    let got = run(true);
    if gpu.has_wgmma() {
        round_tf32(&mut want);
        assert!(all_tf32(&got));
    }
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{differ} results differ");
}
