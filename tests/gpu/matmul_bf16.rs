//! `matmul_forward_bf16` against its CPU twin `cpu::ops::matmul_forward_bf16`.
//!
//! Tolerance: both sides multiply the same bf16 values (`inp` rounded to
//! nearest even, the weights as stored), and the product of two bf16 (8-bit
//! significands) is exact in f32, so the two differ only in how they sum:
//! the twin in f64, rounded once; the kernel in f32, in `S = C/16` mma steps
//! per output, each adding 16 exact products to the accumulator. Tensor
//! cores may truncate rather than round in those additions, so take every
//! step to err by up to 2 ulp of its partial sum (2^-22 relative), all of
//! them the same way. With |a|, |w| ≤ 1 random, the partial sum after step
//! s is about `sqrt(16s)/3` (one standard deviation), at most 5x that over
//! all outputs. Summed over the steps, the error is then at most about
//! `2^-22 · 5 · (4/3) · (2/3) · S^1.5`: 3.5e-4 for C = 768 and 2.8e-3 for
//! C = 3072, i.e. 1.3e-5 and 5.1e-5 of `scale = sqrt(C) · max|a| · max|w|`
//! (the size of the outputs); with one-sigma partial sums (the RMS) a fifth
//! of that, 1.0e-5 scale at C = 3072. The bounds, max abs error ≤ 1e-4 ·
//! scale and RMSE ≤ 2e-5 · scale, are twice those pessimistic estimates,
//! and far below the signature of wrong operand rounding: truncating `inp`
//! instead of rounding it to nearest shifts the outputs by about 1.2e-3 ·
//! scale (RMS), 60 times the RMSE bound. GELU (both sides' tanh formula,
//! within about 1e-7 · |x| of each other) and the f32 bias add (half an ulp)
//! add nothing visible at that scale.
//!
//! `matmul_bf16_selects_and_rounds_exactly` needs no tolerance: with one-hot
//! weight rows each output is one rounded input, bit for bit.
//!
//! The `wgmma` kernels (`matmul_forward_bf16_wgmma`, sm_90a) take `inp` in
//! bf16, rounded once where it is made (here: by the test, as the CPU twin
//! rounds it), and are held to the same bounds. Their bf16 output adds one
//! rounding of the result: half a bf16 ulp, at most 2^-8 of its magnitude
//! (8 significant bits), allowed on top (`BF16_OUT_REL`).
//!
//! The split-K launches (`matmul_forward_bf16_wgmma_split`, the planned
//! `matmul_forward_bf16_wgmma_partials`) are held to the same bounds: their
//! parts, added in order in f32 on the host as the residual layernorm adds
//! them, sum the same exact products in another order, each split's
//! accumulator over fewer steps.
//!
//! The measured errors are printed (run with `--nocapture`).

use cudarc::driver::CudaSlice;
use gpu_host::shape::MatmulShape;
use gpu_kernels::params::matmul_bf16::{
    Bf16TileShape, MATMUL_BF16_VARIANTS, MATMUL_BF16_WGMMA_128X192, MATMUL_BF16_WGMMA_128X256,
    MATMUL_BF16_WGMMA_192X192, MATMUL_BF16_WGMMA_BK, MATMUL_BF16_WGMMA_VARIANTS, bf16_wgmma_persistent_twin,
};
use gpu_kernels::params::matmul_tf32::{TileEngine, TileShape};
use half::bf16;
use host::cpu::ops::{gelu_forward, matmul_forward_bf16 as cpu_matmul_forward_bf16};
use host::gpu::Gpu;
use host::gpu::ops::args::OpError;
use host::gpu::ops::matmul_bf16::{
    BF16_WGMMA_MAX_SPLITS, BF16_WGMMA_MIN_KTILES_PER_SPLIT, Bf16Out, Bf16TileOptions, QkvCache, bf16_blocks,
    bf16_wgmma_plan, choose_tile, choose_wgmma_tile, matmul_forward_bf16, matmul_forward_bf16_wgmma,
    matmul_forward_bf16_wgmma_partials, matmul_forward_bf16_wgmma_split, matmul_forward_bf16_wgmma_with,
    matmul_forward_bf16_with,
};
use host::gpu::ops::matmul_tf32::{
    Tf32Options, Tf32TileOptions, matmul_forward_tf32_opts, matmul_forward_tf32_with, tf32_blocks, tf32_variants,
};
use host::gpu::runtime::TensorElem;
use rand::Rng;

use crate::kernels::skip;
use crate::matmul_tf32::wgmma_gpu;

const MAX_ABS_PER_SCALE: f64 = 1e-4;
const RMSE_PER_SCALE: f64 = 2e-5;
/// A bf16 result's own rounding: half an ulp, at most 2^-8 of its magnitude.
const BF16_OUT_REL: f64 = 1.0 / 256.0;

fn random(n: usize, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// Max abs error and RMSE of `got` against `want`; fails on a non-finite element.
fn errors(got: &[f32], want: &[f32], oc: usize, what: &str) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
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

/// One GEMM's random operands, on the host and on the device, and the CPU
/// twin's result for it.
struct Case {
    n: usize,
    c: usize,
    oc: usize,
    gelu: bool,
    d_inp: CudaSlice<f32>,
    /// `inp` rounded to bf16 (the `wgmma` kernels' input).
    d_inp16: CudaSlice<bf16>,
    d_w: CudaSlice<bf16>,
    d_b: Option<CudaSlice<f32>>,
    want: Vec<f32>,
    scale: f64,
}

impl Case {
    fn new(gpu: &Gpu, n: usize, c: usize, oc: usize, bias: bool, gelu: bool) -> Case {
        let mut rng = crate::seed::rng();
        let inp = random(n * c, &mut rng);
        let w = to_bf16(&random(oc * c, &mut rng));
        let b = bias.then(|| random(oc, &mut rng));
        let mut want = vec![f32::NAN; n * oc];
        cpu_matmul_forward_bf16(&mut want, &inp, &w, b.as_deref(), MatmulShape::new(n, oc, c), gelu);
        let amax = inp.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let wmax = w.iter().fold(0f32, |m, v| m.max(v.to_f32().abs())) as f64;
        Case {
            n,
            c,
            oc,
            gelu,
            d_inp: gpu.upload(&inp).unwrap(),
            d_inp16: gpu.upload(&to_bf16(&inp)).unwrap(),
            d_w: gpu.upload(&w).unwrap(),
            d_b: b.map(|b| gpu.upload(&b).unwrap()),
            want,
            scale: (c as f64).sqrt() * amax * wmax,
        }
    }

    /// Runs the case with `shape` (or the chosen tile) on an output poisoned
    /// with NaN and checks every element against the twin.
    fn check(&self, gpu: &Gpu, shape: Option<&Bf16TileShape>) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        let bias = self.d_b.as_ref();
        match shape {
            Some(s) => {
                let opts = Bf16TileOptions {
                    gelu: self.gelu,
                    ..Bf16TileOptions::new(*s)
                };
                let shape = MatmulShape::new(n, oc, c);
                matmul_forward_bf16_with(gpu, opts, &mut d_out, &self.d_inp, &self.d_w, bias, shape).unwrap()
            }
            None => matmul_forward_bf16(
                gpu,
                &mut d_out,
                &self.d_inp,
                &self.d_w,
                bias,
                MatmulShape::new(n, oc, c),
                self.gelu,
            )
            .unwrap(),
        }
        let got = gpu.download(&d_out).unwrap();
        let name = shape.map_or("auto", |s| s.name);
        let (max_abs, rmse) = errors(&got, &self.want, oc, &format!("{name} n={n} c={c} oc={oc}"));
        let scale = self.scale;
        eprintln!(
            "matmul_bf16 {name:28} n={n:4} c={c:5} oc={oc:5} bias={:5} gelu={:5}: max abs {max_abs:.3e} ({:.2e} scale), RMSE {rmse:.3e} ({:.2e} scale)",
            bias.is_some(),
            self.gelu,
            max_abs / scale,
            rmse / scale
        );
        assert!(
            max_abs <= MAX_ABS_PER_SCALE * scale,
            "{name}: max abs error {max_abs} > {} (n={n} c={c} oc={oc})",
            MAX_ABS_PER_SCALE * scale
        );
        assert!(
            rmse <= RMSE_PER_SCALE * scale,
            "{name}: RMSE {rmse} > {} (n={n} c={c} oc={oc})",
            RMSE_PER_SCALE * scale
        );
    }
}

impl Case {
    /// Runs the case on a bf16 `wgmma` tile (or the chosen one), f32 or
    /// bf16 out (`bf16_out`), on a NaN-poisoned output, and checks every
    /// element against the twin (a bf16 result allowed its own rounding).
    fn check_wgmma(&self, gpu: &Gpu, shape: Option<&TileShape>, bf16_out: bool) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        let bias = self.d_b.as_ref();
        let (inp, w) = (&self.d_inp16, &self.d_w);
        let run = |out: Bf16Out<'_>| match shape {
            Some(s) => {
                let opts = Bf16TileOptions {
                    gelu: self.gelu,
                    ..Bf16TileOptions::new(*s)
                };
                matmul_forward_bf16_wgmma_with(gpu, opts, out, inp, w, bias, MatmulShape::new(n, oc, c))
            }
            None => matmul_forward_bf16_wgmma(gpu, out, inp, w, bias, MatmulShape::new(n, oc, c), self.gelu),
        };
        let got = if bf16_out {
            let mut d_out = gpu.upload(&vec![bf16::NAN; n * oc]).unwrap();
            run(Bf16Out::Bf16(&mut d_out)).unwrap();
            gpu.download(&d_out).unwrap().iter().map(|v| v.to_f32()).collect()
        } else {
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            run(Bf16Out::F32(&mut d_out)).unwrap();
            gpu.download(&d_out).unwrap()
        };
        let name = shape.map_or("wgmma auto", |s| s.name);
        let what = format!("{name} n={n} c={c} oc={oc} bf16 out={bf16_out}");
        self.check_against_twin(&got, &what, bf16_out);
    }

    /// The split-K launch with `tile` and `splits`: its parts added up in
    /// order on the host with the bias (as the residual layernorm adds
    /// them), against the twin. The parts buffer is poisoned with NaN and
    /// one slice longer than asked: the slices past those written must stay
    /// untouched.
    fn check_wgmma_split(&self, gpu: &Gpu, tile: &TileShape, splits: usize) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        assert!(!self.gelu, "split-K parts take no GELU");
        let len = n * oc;
        let mut d_parts = gpu.upload(&vec![f32::NAN; (splits + 1) * len]).unwrap();
        let shape = MatmulShape::new(n, oc, c);
        let written =
            matmul_forward_bf16_wgmma_split(gpu, *tile, splits, &mut d_parts, &self.d_inp16, &self.d_w, shape).unwrap();
        let what = format!("{} split {splits} ({written} written) n={n} c={c} oc={oc}", tile.name);
        assert!((1..=splits).contains(&written), "{what}: wrote {written} parts");
        let parts = gpu.download(&d_parts).unwrap();
        assert!(
            parts[written * len..].iter().all(|v| v.is_nan()),
            "{what}: a slice past the parts written was touched"
        );
        let got = self.add_parts(gpu, &parts, written);
        self.check_against_twin(&got, &what, false);
    }

    /// The planned call (`matmul_forward_bf16_wgmma_partials`, the engine's
    /// projections) with room for the most parts a plan makes: whole rows
    /// in `out` or parts in the workspace, as it says, against the twin.
    fn check_wgmma_planned(&self, gpu: &Gpu) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        let len = n * oc;
        let mut d_parts = gpu.upload(&vec![f32::NAN; BF16_WGMMA_MAX_SPLITS * len]).unwrap();
        let mut d_out = gpu.upload(&vec![f32::NAN; len]).unwrap();
        let shape = MatmulShape::new(n, oc, c);
        let (inp, w, bias) = (&self.d_inp16, &self.d_w, self.d_b.as_ref());
        let parts = matmul_forward_bf16_wgmma_partials(gpu, &mut d_parts, &mut d_out, inp, w, bias, shape).unwrap();
        let what = format!("planned, {parts} parts, n={n} c={c} oc={oc}");
        let got = if parts == 1 {
            gpu.download(&d_out).unwrap()
        } else {
            assert!(
                gpu.download(&d_out).unwrap().iter().all(|v| v.is_nan()),
                "{what}: out was written though the result is in parts"
            );
            self.add_parts(gpu, &gpu.download(&d_parts).unwrap(), parts)
        };
        self.check_against_twin(&got, &what, false);
    }

    /// `parts` slices of `n * oc` partial sums added in order, then the bias.
    fn add_parts(&self, gpu: &Gpu, parts: &[f32], count: usize) -> Vec<f32> {
        let (len, oc) = (self.n * self.oc, self.oc);
        let bias = self.d_b.as_ref().map(|b| gpu.download(b).unwrap());
        (0..len)
            .map(|i| {
                let sum = (1..count).fold(parts[i], |acc, s| acc + parts[s * len + i]);
                sum + bias.as_ref().map_or(0.0, |b| b[i % oc])
            })
            .collect()
    }

    /// Every element of `got` within the bounds of the twin (module docs),
    /// the errors printed.
    fn check_against_twin(&self, got: &[f32], what: &str, bf16_out: bool) {
        let oc = self.oc;
        let (max_abs, rmse) = errors(got, &self.want, oc, what);
        let scale = self.scale;
        eprintln!(
            "matmul_bf16 {what}: max abs {max_abs:.3e} ({:.2e} scale), RMSE {rmse:.3e} ({:.2e} scale)",
            max_abs / scale,
            rmse / scale
        );
        let out_rel = if bf16_out { BF16_OUT_REL } else { 0.0 };
        for (i, (&g, &r)) in got.iter().zip(&self.want).enumerate() {
            let bound = MAX_ABS_PER_SCALE * scale + out_rel * r.abs() as f64;
            assert!(
                (g as f64 - r as f64).abs() <= bound,
                "{what}: out[{}][{}] = {g}, twin {r} (bound {bound:.3e})",
                i / oc,
                i % oc
            );
        }
        if !bf16_out {
            assert!(
                rmse <= RMSE_PER_SCALE * scale,
                "{what}: RMSE {rmse} > {}",
                RMSE_PER_SCALE * scale
            );
        }
    }
}

/// The CPU twin on a case small enough to do by hand, with inputs that
/// exercise bf16's round-to-nearest-even (bf16 keeps 8 significant bits, so
/// between 1 and 2 its spacing is 2^-7):
/// - 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to the even one, 1;
/// - 1 + 3·2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6;
/// - 1 + 2^-8 + 2^-12 is past the tie: up to 1 + 2^-7;
/// - 0.5 and -2 are exact.
#[test]
fn matmul_bf16_cpu_twin_hand_computed() {
    let h = 2f32.powi(-8);
    // n = 2 rows of c = 3.
    let inp = [1.0 + h, 1.0 + 3.0 * h, 0.5, 1.0 + h + h / 16.0, -2.0, 1.0];
    let rounded = [1.0, 1.0 + 4.0 * h, 0.5, 1.0 + 2.0 * h, -2.0, 1.0];
    // oc = 2 weight rows (exact in bf16).
    let w = to_bf16(&[1.0, 2.0, 4.0, 0.25, -1.0, 0.5]);
    let bias = [0.5, -1.0];
    let (n, c, oc) = (2, 3, 2);
    // out[r][o] = Σ_k rounded[r][k] · w[o][k] + bias[o], by hand:
    let want = [
        1.0 + 2.0 * (1.0 + 4.0 * h) + 4.0 * 0.5 + 0.5,
        0.25 - (1.0 + 4.0 * h) + 0.5 * 0.5 - 1.0,
        (1.0 + 2.0 * h) + 2.0 * -2.0 + 4.0 * 1.0 + 0.5,
        0.25 * (1.0 + 2.0 * h) - -2.0 + 0.5 * 1.0 - 1.0,
    ];
    for (x, r) in inp.iter().zip(&rounded) {
        assert_eq!(bf16::from_f32(*x).to_f32(), *r, "bf16 rounding of {x}");
    }
    let mut out = [f32::NAN; 4];
    cpu_matmul_forward_bf16(&mut out, &inp, &w, Some(&bias[..]), MatmulShape::new(n, oc, c), false);
    assert_eq!(out, want);

    // Without bias: the same minus the bias.
    cpu_matmul_forward_bf16(&mut out, &inp, &w, None, MatmulShape::new(n, oc, c), false);
    let no_bias: Vec<f32> = want.iter().enumerate().map(|(i, v)| v - bias[i % oc]).collect();
    assert_eq!(out.to_vec(), no_bias);

    // With GELU: the CPU GELU of each of those values.
    cpu_matmul_forward_bf16(&mut out, &inp, &w, Some(&bias[..]), MatmulShape::new(n, oc, c), true);
    let mut gelu_want = [0f32; 4];
    gelu_forward(&mut gelu_want, &want, 4);
    assert_eq!(out, gelu_want);
    // GELU(x) ≈ x for large x, ≈ 0 for very negative x; GELU(0) = 0.
    assert!((out[0] - want[0]).abs() < 1e-3 && out[0] > 5.0);

    // A row of zeros with a zero bias gives exactly GELU(0) = 0.
    let mut z = [f32::NAN; 2];
    cpu_matmul_forward_bf16(
        &mut z,
        &[0.0; 3],
        &w,
        Some(&[0.0, 0.0][..]),
        MatmulShape::new(1, oc, c),
        true,
    );
    assert_eq!(z, [0.0, 0.0]);
}

/// Both embedded modules have every bf16 tile's kernel.
#[test]
fn embedded_ptx_has_every_bf16_variant() {
    let has = |ptx: &str, s: &Bf16TileShape| ptx.contains(&format!(".visible .entry {}(", s.name));
    for s in &MATMUL_BF16_VARIANTS {
        assert!(has(gpu_host::GPU_KERNELS_PTX, s), "{} missing", s.name);
        assert!(
            has(gpu_host::GPU_KERNELS_SM90A_PTX, s),
            "{} missing from the sm_90a module",
            s.name
        );
    }
}

/// The chooser returns a compiled variant, the big tile wherever it fills
/// the GPU (no GPU needed).
#[test]
fn matmul_bf16_chooser_choices() {
    const SMS: usize = 132;
    for n in [1, 7, 64, 200, 1024, 8192] {
        for oc in [768, 2304, 3072, 50304] {
            // The chooser reads the output's size only.
            let shape = MatmulShape::new(n, oc, 768);
            let s = choose_tile(shape, SMS);
            assert!(MATMUL_BF16_VARIANTS.contains(&s));
            let big = MATMUL_BF16_VARIANTS[0];
            assert_eq!(s == big, bf16_blocks(&big, shape) >= SMS, "n={n} oc={oc}: {}", s.name);
            eprintln!("n={n:5} oc={oc:6}: {:28} {:6} blocks", s.name, bf16_blocks(&s, shape));
        }
    }
}

/// GPT-2's matmuls (qkv: 768 -> 2304, fc projection: 3072 -> 768) at a few
/// token counts, through the tile chooser and with every tile.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_gpt2_shapes() {
    let Some(gpu) = skip::gpu() else { return };
    for n in [1, 7, 64, 200] {
        for (c, oc, gelu) in [(768, 2304, false), (3072, 768, false), (768, 3072, true)] {
            let case = Case::new(&gpu, n, c, oc, true, gelu);
            case.check(&gpu, None);
            for s in &MATMUL_BF16_VARIANTS {
                case.check(&gpu, Some(s));
            }
        }
    }
}

/// Edges everywhere, with every tile: n and oc not multiples of any tile
/// (oc odd or 2 mod 4: the epilogue's scalar stores), c a multiple of 8 but
/// not of BK = 32 (a partial last k-tile) or smaller than it; bias and GELU
/// on and off.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_awkward_shapes_every_variant() {
    let Some(gpu) = skip::gpu() else { return };
    let cases = [
        (77, 768, 50, true, false),
        (77, 768, 50, false, true),
        (1, 8, 1, true, true),
        (129, 40, 130, false, false),
        (65, 24, 67, true, false),
        (200, 776, 129, true, true),
        (3, 3072, 769, false, false),
    ];
    for (n, c, oc, bias, gelu) in cases {
        let case = Case::new(&gpu, n, c, oc, bias, gelu);
        for s in &MATMUL_BF16_VARIANTS {
            case.check(&gpu, Some(s));
        }
    }
}

/// One-hot weight rows (`w[o][k_o] = 1`, random `k_o`) make each output a
/// single rounded input, `out[r][o] = bf16(inp[r][k_o])`, exactly whatever
/// the summation order: a wrong fragment layout or k order, a wrong row or
/// column mapping, or a rounding other than to nearest even shows as a
/// mismatch. The inputs include exact ties of both parities and signs.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_selects_and_rounds_exactly() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let h = 2f32.powi(-8);
    let ties = [
        1.0 + h,
        1.0 + 3.0 * h,
        -(1.0 + h),
        -(1.0 + 3.0 * h),
        0.75 + h / 2.0,
        3.0 + 2.0 * h,
    ];
    for (n, c, oc) in [(3, 40, 50), (130, 64, 136), (17, 776, 33)] {
        let mut inp = random(n * c, &mut rng);
        for (i, t) in ties.iter().enumerate() {
            inp[(i * 7) % (n * c)] = *t;
        }
        let picks: Vec<usize> = (0..oc).map(|_| rng.random_range(0..c)).collect();
        let mut w = vec![bf16::ZERO; oc * c];
        for (o, &k) in picks.iter().enumerate() {
            w[o * c + k] = bf16::ONE;
        }
        let d_inp = gpu.upload(&inp).unwrap();
        let d_w = gpu.upload(&w).unwrap();
        for s in &MATMUL_BF16_VARIANTS {
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            let opts = Bf16TileOptions::new(*s);
            matmul_forward_bf16_with(&gpu, opts, &mut d_out, &d_inp, &d_w, None, MatmulShape::new(n, oc, c)).unwrap();
            let got = gpu.download(&d_out).unwrap();
            for r in 0..n {
                for (o, &k) in picks.iter().enumerate() {
                    let x = inp[r * c + k];
                    let want = bf16::from_f32(x).to_f32();
                    assert_eq!(
                        got[r * oc + o].to_bits(),
                        want.to_bits(),
                        "{} n={n} c={c} oc={oc}: out[{r}][{o}] = {} but bf16({x}) = {want}",
                        s.name,
                        got[r * oc + o]
                    );
                }
            }
        }
    }
}

/// A `c` that is not a multiple of 8 is refused before any launch: the
/// poisoned output stays untouched.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_rejects_c_not_multiple_of_8() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    for (n, c, oc) in [(2, 12, 3), (4, 36, 8), (1, 770, 5)] {
        let inp = gpu.upload(&random(n * c, &mut rng)).unwrap();
        let w = gpu.upload(&to_bf16(&random(oc * c, &mut rng))).unwrap();
        let mut out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
        for s in &MATMUL_BF16_VARIANTS {
            let opts = Bf16TileOptions::new(*s);
            let r = matmul_forward_bf16_with(&gpu, opts, &mut out, &inp, &w, None, MatmulShape::new(n, oc, c));
            assert!(matches!(r, Err(OpError::Shape { .. })), "c = {c}: {r:?}");
        }
        let r = matmul_forward_bf16(&gpu, &mut out, &inp, &w, None, MatmulShape::new(n, oc, c), false);
        assert!(matches!(r, Err(OpError::Shape { .. })), "c = {c}: {r:?}");
        gpu.synchronize().unwrap();
        assert!(
            gpu.download(&out).unwrap().iter().all(|v| v.is_nan()),
            "c = {c}: output written"
        );
    }
}

/// The sm_90a module has every bf16 `wgmma` tile's kernel.
#[test]
fn embedded_sm90a_ptx_has_every_bf16_wgmma_variant() {
    for s in &MATMUL_BF16_WGMMA_VARIANTS {
        let entry = format!(".visible .entry {}(", s.name);
        assert!(gpu_host::GPU_KERNELS_SM90A_PTX.contains(&entry), "{} missing", s.name);
        assert!(
            !gpu_host::GPU_KERNELS_PTX.contains(&entry),
            "{} in the portable module",
            s.name
        );
    }
}

/// The `wgmma` chooser returns a bf16 variant for every shape, launched
/// persistent or not; persistence never changes the choice where every SM
/// gets at most one tile (no GPU needed).
#[test]
fn matmul_bf16_wgmma_chooser_choices() {
    const SMS: usize = 132;
    for n in [1, 7, 64, 200, 1024, 8192] {
        for oc in [768, 2304, 3072, 50304] {
            let shape = MatmulShape::new(n, oc, 768);
            let (one, persistent) = (
                choose_wgmma_tile(shape, SMS, false),
                choose_wgmma_tile(shape, SMS, true),
            );
            for s in [one, persistent] {
                assert!(MATMUL_BF16_WGMMA_VARIANTS.contains(&s), "n={n} oc={oc}: {}", s.name);
            }
            if MATMUL_BF16_WGMMA_VARIANTS
                .iter()
                .all(|t| tf32_blocks(t, shape) <= SMS * t.blocks_per_sm as usize)
            {
                assert_eq!(one, persistent, "n={n} oc={oc}: one tile an SM, nothing to overlap");
            }
            eprintln!("n={n:5} oc={oc:6}: {} / persistent {}", one.name, persistent.name);
        }
    }
}

/// The chooser's decisions measured on an H200 at M = 8192 (132 SMs; see
/// docs/performance.md): one-tile blocks take 192x192 at N = 2304 (the qkv
/// launch, which fills the KV caches and has no output map: a one-tile
/// 128x192 was 18 % slower there) and 128x256 at N = 3072; launched
/// persistent, N = 2304 takes the 192x192 twin (59.8 against 62.8 µs for
/// the 128x192 one) and N = 3072 the 128x192 twin (85.0 against 87.3 µs for
/// 192x192, 88.5 for one-tile 128x256); N = 768 takes 128x192 either way
/// (no GPU needed).
#[test]
fn matmul_bf16_wgmma_chooser_knows_persistent_launches() {
    const SMS: usize = 132;
    let name = |n: usize, persistent: bool| choose_wgmma_tile(MatmulShape::new(8192, n, 768), SMS, persistent).name;
    assert_eq!(name(2304, false), MATMUL_BF16_WGMMA_192X192.name);
    assert_eq!(name(3072, false), MATMUL_BF16_WGMMA_128X256.name);
    for n in [768, 3072] {
        assert_eq!(name(n, true), MATMUL_BF16_WGMMA_128X192.name, "N = {n}, persistent");
    }
    // The 192x192 twin: 4 tiles an SM where 128x192 needs 6.
    assert_eq!(name(2304, true), MATMUL_BF16_WGMMA_192X192.name);
    assert_eq!(name(768, false), MATMUL_BF16_WGMMA_128X192.name);
}

/// GPT-2's matmuls at a few token counts, f32 and bf16 out, through the
/// chooser and with every `wgmma` tile.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_wgmma_gpt2_shapes() {
    let Some(gpu) = wgmma_gpu() else { return };
    for n in [1, 64, 200, 1024] {
        for (c, oc, gelu) in [(768, 2304, false), (3072, 768, false), (768, 3072, true)] {
            let case = Case::new(&gpu, n, c, oc, true, gelu);
            for bf16_out in [false, true] {
                case.check_wgmma(&gpu, None, bf16_out);
                for s in &MATMUL_BF16_WGMMA_VARIANTS {
                    case.check_wgmma(&gpu, Some(s), bf16_out);
                }
            }
        }
    }
}

/// Split over `k` (the projections of short prompts, whose parts the
/// residual layernorm adds): every `wgmma` tile at 2, 3 and 8 splits on the
/// GPT-2 projection shapes at 1, 64 and 200 rows and on an awkward shape
/// (c = 776: 13 k-tiles, the last zero-filled, so 8 splits become 7), then
/// the planned call, each against the twin.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_wgmma_split_k_parts_add_up_to_the_twin() {
    let Some(gpu) = wgmma_gpu() else { return };
    for (n, c, oc) in [
        (1, 768, 768),
        (64, 3072, 768),
        (64, 768, 768),
        (200, 3072, 768),
        (77, 776, 50),
    ] {
        let case = Case::new(&gpu, n, c, oc, true, false);
        for s in &MATMUL_BF16_WGMMA_VARIANTS {
            for splits in [2, 3, 8] {
                case.check_wgmma_split(&gpu, s, splits);
            }
        }
        case.check_wgmma_planned(&gpu);
    }
}

/// The split plan splits only outputs that leave the GPU's block slots
/// idle, within the workspace, never beyond the k-tiles, and every split
/// gets k-tiles (no GPU needed).
#[test]
fn matmul_bf16_wgmma_plan_policy() {
    const SMS: usize = 132;
    let big = usize::MAX / 2;
    let (tile, s) = bf16_wgmma_plan(MatmulShape::new(64, 768, 3072), SMS, big, true);
    assert!(
        s > 1,
        "M=64 N=768 K=3072 ({}) leaves SMs idle: should split, got {s}",
        tile.name
    );
    let (_, s) = bf16_wgmma_plan(MatmulShape::new(8192, 768, 3072), SMS, big, true);
    assert_eq!(s, 1, "a full GPU needs no split");
    let (_, s) = bf16_wgmma_plan(MatmulShape::new(64, 768, 3072), SMS, 64 * 768, true);
    assert_eq!(s, 1, "a workspace of one output allows no split");
    let (_, s) = bf16_wgmma_plan(MatmulShape::new(64, 768, 64), SMS, big, true);
    assert_eq!(s, 1, "one k-tile cannot split");
    for n in [1, 64, 256, 1024, 8192] {
        for (c, oc) in [(768, 768), (3072, 768), (776, 50)] {
            let shape = MatmulShape::new(n, oc, c);
            let (tile, splits) = bf16_wgmma_plan(shape, SMS, big, false);
            let ktiles = c.div_ceil(MATMUL_BF16_WGMMA_BK as usize);
            assert!(MATMUL_BF16_WGMMA_VARIANTS.contains(&tile) && (1..=BF16_WGMMA_MAX_SPLITS).contains(&splits));
            assert_eq!(
                tile,
                choose_wgmma_tile(shape, SMS, false),
                "the split keeps the unsplit tile"
            );
            // Persistent or not, the same split; unsplit, the persistent
            // choice (a split launch stores element-wise, never persistent).
            let (p_tile, p_splits) = bf16_wgmma_plan(shape, SMS, big, true);
            assert_eq!(p_splits, splits, "M={n} K={c}: persistence changed the split");
            let expect = choose_wgmma_tile(shape, SMS, splits == 1);
            assert_eq!(p_tile, expect, "M={n} K={c}: persistent plan's tile");
            if splits > 1 {
                let per = ktiles.div_ceil(splits);
                assert!(
                    per >= BF16_WGMMA_MIN_KTILES_PER_SPLIT,
                    "M={n} K={c}: {per} k-tiles a split"
                );
                assert!(
                    (splits - 1) * per < ktiles,
                    "M={n} K={c}: split {splits} of {per} gets none"
                );
            }
            eprintln!("M={n:5} N={oc:6} K={c:5}: {:40} x{splits}", tile.name);
        }
    }
}

/// Edges with every `wgmma` tile: n and oc not multiples of any tile (oc
/// odd: scalar stores), c a multiple of 8 but not of the 64-deep stage or
/// smaller than it (the TMA's zero fill), bias and GELU on and off, both
/// outputs.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_wgmma_awkward_shapes_every_variant() {
    let Some(gpu) = wgmma_gpu() else { return };
    let cases = [
        (77, 768, 50, true, false),
        (77, 768, 50, false, true),
        (1, 8, 1, true, true),
        (129, 40, 130, false, false),
        (65, 24, 67, true, false),
        (200, 776, 129, true, true),
        (3, 3072, 769, false, false),
        (300, 136, 260, true, true),
    ];
    for (n, c, oc, bias, gelu) in cases {
        let case = Case::new(&gpu, n, c, oc, bias, gelu);
        for s in &MATMUL_BF16_WGMMA_VARIANTS {
            for bf16_out in [false, true] {
                case.check_wgmma(&gpu, Some(s), bf16_out);
            }
        }
    }
}

/// One-hot weight rows through the `wgmma` tiles: each output is one bf16
/// input, bit for bit (f32 out), whatever the summation order: a wrong
/// swizzle, descriptor, k order or row/column mapping shows as a mismatch.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_wgmma_selects_exactly() {
    let Some(gpu) = wgmma_gpu() else { return };
    let mut rng = crate::seed::rng();
    for (n, c, oc) in [(3, 40, 50), (130, 64, 136), (17, 776, 33), (200, 1536, 300)] {
        let inp = to_bf16(&random(n * c, &mut rng));
        let picks: Vec<usize> = (0..oc).map(|_| rng.random_range(0..c)).collect();
        let mut w = vec![bf16::ZERO; oc * c];
        for (o, &k) in picks.iter().enumerate() {
            w[o * c + k] = bf16::ONE;
        }
        let d_inp = gpu.upload(&inp).unwrap();
        let d_w = gpu.upload(&w).unwrap();
        for s in &MATMUL_BF16_WGMMA_VARIANTS {
            let mut d_out = gpu.upload(&vec![f32::NAN; n * oc]).unwrap();
            let (opts, out) = (Bf16TileOptions::new(*s), Bf16Out::F32(&mut d_out));
            matmul_forward_bf16_wgmma_with(&gpu, opts, out, &d_inp, &d_w, None, MatmulShape::new(n, oc, c)).unwrap();
            let got = gpu.download(&d_out).unwrap();
            for r in 0..n {
                for (o, &k) in picks.iter().enumerate() {
                    let want = inp[r * c + k].to_f32();
                    assert_eq!(
                        got[r * oc + o].to_bits(),
                        want.to_bits(),
                        "{} n={n} c={c} oc={oc}: out[{r}][{o}] = {} but inp[{r}][{k}] = {want}",
                        s.name,
                        got[r * oc + o]
                    );
                }
            }
        }
    }
}

/// A qkv matmul with `Bf16Out::QkvF32` writes the f32 output of a plain
/// launch, bit for bit, and also each key and value, rounded to bf16 (to
/// nearest even, as `half` rounds), into the caches at its sequence's
/// positions `pos0..pos0 + t`, on every tile and every epilogue: the
/// element-wise store, the TMA store (the caches filled from its staged
/// boxes) and, for tiles with a persistent twin, with persistent tiles on
/// (at most a block an SM, and two blocks), which a qkv launch must not
/// take (its caches come from a tile's boxes after the last, which a
/// persistent block's ring has reused); every other cache entry keeps its
/// NaN poison. Rows that do not make whole sequences are refused.
#[test]
#[ignore = "needs a GPU"]
fn matmul_bf16_wgmma_qkv_fills_the_kv_cache() {
    let Some(gpu) = wgmma_gpu() else { return };
    let mut rng = crate::seed::rng();
    // k = 96: a partial k-tile; t odd, so m = 422 makes whole row tiles and
    // a partial one on every tile height; n = 384 a partial column tile for
    // 256-wide tiles; the caches wider than the call.
    let (seqs, t, nh, hs, k, pos0, max_t) = (2, 211, 2, 64, 96, 5, 230);
    let c = nh * hs;
    let (m, n) = (seqs * t, 3 * c);
    let shape = MatmulShape::new(m, n, k);
    let inp = to_bf16(&random(m * k, &mut rng));
    let w = to_bf16(&random(n * k, &mut rng));
    let bias = random(n, &mut rng);
    let (d_inp, d_w, d_bias) = (
        gpu.upload(&inp).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&bias).unwrap(),
    );
    let cache_len = seqs * c * max_t;
    let poison = vec![bf16::NAN; cache_len];
    // (TMA store, persistent tiles' most blocks): element-wise, TMA, and
    // persistent tiles on at most a block an SM and on two blocks (which the
    // launch must decline).
    let sms = gpu.sm_count();
    let epilogues = [(false, None), (true, None), (true, Some(sms)), (true, Some(2))];
    for (s, (tma, persistent)) in MATMUL_BF16_WGMMA_VARIANTS
        .iter()
        .flat_map(|s| epilogues.map(|e| (s, e)))
        .filter(|(s, (_, persistent))| persistent.is_none() || bf16_wgmma_persistent_twin(s).is_some())
    {
        let what = format!("{} (TMA store {tma}, persistent {persistent:?})", s.name);
        let opts = Bf16TileOptions::new(*s);
        gpu.set_tma_store(false);
        gpu.set_persistent_gemm_blocks(None);
        let mut d_plain = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        matmul_forward_bf16_wgmma_with(
            &gpu,
            opts,
            Bf16Out::F32(&mut d_plain),
            &d_inp,
            &d_w,
            Some(&d_bias),
            shape,
        )
        .unwrap();
        let plain = gpu.download(&d_plain).unwrap();

        let mut d_out = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        let (mut d_k, mut d_v) = (gpu.upload(&poison).unwrap(), gpu.upload(&poison).unwrap());
        let cache = QkvCache {
            k_cache: d_k.slice_mut(..),
            v_cache: d_v.slice_mut(..),
            t,
            pos0,
            max_t,
            nh,
        };
        let out = Bf16Out::QkvF32(&mut d_out, cache);
        gpu.set_tma_store(tma);
        gpu.set_persistent_gemm_blocks(persistent);
        matmul_forward_bf16_wgmma_with(&gpu, opts, out, &d_inp, &d_w, Some(&d_bias), shape).unwrap();
        let got = gpu.download(&d_out).unwrap();
        let bad = got
            .iter()
            .zip(&plain)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(bad, 0, "{what}: {bad} f32 outputs differ from the plain launch's");

        for (which, d_cache) in [(1, &d_k), (2, &d_v)] {
            let cache = gpu.download(d_cache).unwrap();
            let mut want = vec![bf16::NAN; cache_len];
            for r in 0..m {
                let (seq, pos) = (r / t, pos0 + r % t);
                for h in 0..nh {
                    for d in 0..hs {
                        let x = plain[r * n + which * c + h * hs + d];
                        want[((seq * nh + h) * max_t + pos) * hs + d] = bf16::from_f32(x);
                    }
                }
            }
            let bad = cache
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                bad,
                0,
                "{what}: {bad} {} cache entries differ (stored rows rounded, the rest poison)",
                if which == 1 { "key" } else { "value" }
            );
        }
    }
    gpu.set_tma_store(true);
    gpu.set_persistent_gemm_blocks(Some(sms));

    // Rows that are not whole sequences of t: refused before any launch.
    let mut d_out = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
    let (mut d_k, mut d_v) = (gpu.upload(&poison).unwrap(), gpu.upload(&poison).unwrap());
    let cache = QkvCache {
        k_cache: d_k.slice_mut(..),
        v_cache: d_v.slice_mut(..),
        t: t + 1,
        pos0,
        max_t,
        nh,
    };
    let err = matmul_forward_bf16_wgmma(
        &gpu,
        Bf16Out::QkvF32(&mut d_out, cache),
        &d_inp,
        &d_w,
        None,
        shape,
        false,
    );
    assert!(
        matches!(err, Err(OpError::Shape { .. })),
        "a ragged call was accepted: {err:?}"
    );
}

/// The `wgmma` tiles' TMA-store epilogue (whole-row tiles finished in
/// registers and stored by the copy engine) against their element-wise
/// store, bit for bit: every bf16 tile (f32 and bf16 out, bias and GELU)
/// and every TF32 tile (bias and GELU; the chosen tile with its results
/// rounded to TF32, as the engine's MLP up-projection asks). `n` spans
/// several row tiles and a partial one, `oc` a partial 128-byte box (200
/// bf16 or f32 columns) and a partial column tile; both outputs start as
/// NaN, so an element the copy engine missed shows. The output buffers have
/// `SPARE_ROWS` rows more than `n`, which the output map spans (one map a
/// buffer, whatever `n`): they must stay NaN. The element-wise results are
/// themselves checked against the CPU twin. The bf16 tiles with a
/// persistent twin run it too, the same bits asked: at most a block an SM,
/// and on two blocks, each then looping over many tiles (a ring of
/// epilogue boxes reused, partial tiles copied out by the threads).
#[test]
#[ignore = "needs a GPU"]
fn wgmma_tma_store_matches_the_elementwise_store() {
    let Some(gpu) = wgmma_gpu() else { return };
    const SPARE_ROWS: usize = 70;
    gpu.set_tma_store(true);
    assert!(gpu.tma_store(TensorElem::Bf16) && gpu.tma_store(TensorElem::F32));
    let same = |tma: &[f32], plain: &[f32], n: usize, oc: usize, what: &str| {
        assert!(
            tma[n * oc..].iter().chain(&plain[n * oc..]).all(|v| v.is_nan()),
            "{what}: a row past n was written"
        );
        for (i, (a, b)) in tma[..n * oc].iter().zip(&plain[..n * oc]).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{what}: element {i} is {a} through the TMA store, {b} element-wise"
            );
        }
    };
    for (n, c, oc) in [(400, 136, 200), (392, 64, 2304)] {
        let case = Case::new(&gpu, n, c, oc, true, true);
        let shape = MatmulShape::new(n, oc, c);
        for s in &MATMUL_BF16_WGMMA_VARIANTS {
            for bf16_out in [false, true] {
                // `persistent`: the most blocks of a persistent twin's launch (two make
                // each block loop over many tiles, partial ones included), None for off.
                let run = |tma: bool, persistent: Option<usize>| -> Vec<f32> {
                    gpu.set_tma_store(tma);
                    gpu.set_persistent_gemm_blocks(persistent);
                    let opts = Bf16TileOptions {
                        gelu: true,
                        ..Bf16TileOptions::new(*s)
                    };
                    let (inp, w, bias) = (&case.d_inp16, &case.d_w, case.d_b.as_ref());
                    if bf16_out {
                        let mut d_out = gpu.upload(&vec![bf16::NAN; (n + SPARE_ROWS) * oc]).unwrap();
                        matmul_forward_bf16_wgmma_with(&gpu, opts, Bf16Out::Bf16(&mut d_out), inp, w, bias, shape)
                            .unwrap();
                        gpu.download(&d_out).unwrap().iter().map(|v| v.to_f32()).collect()
                    } else {
                        let mut d_out = gpu.upload(&vec![f32::NAN; (n + SPARE_ROWS) * oc]).unwrap();
                        matmul_forward_bf16_wgmma_with(&gpu, opts, Bf16Out::F32(&mut d_out), inp, w, bias, shape)
                            .unwrap();
                        gpu.download(&d_out).unwrap()
                    }
                };
                let what = format!("{} n={n} c={c} oc={oc} bf16 out={bf16_out}", s.name);
                let plain = run(false, None);
                case.check_against_twin(&plain[..n * oc], &what, bf16_out);
                same(&run(true, None), &plain, n, oc, &what);
                if bf16_wgmma_persistent_twin(s).is_some() {
                    let sms = gpu.sm_count();
                    for blocks in [sms, 2] {
                        let what = format!("{what}, persistent twin on at most {blocks} blocks");
                        same(&run(true, Some(blocks)), &plain, n, oc, &what);
                    }
                }
            }
        }
        let mut rng = crate::seed::rng();
        let inp: Vec<f32> = random(n * c, &mut rng);
        let w: Vec<f32> = random(oc * c, &mut rng);
        let b: Vec<f32> = random(oc, &mut rng);
        let (d_inp, d_w, d_b) = (
            gpu.upload(&inp).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let tf32_tiles = tf32_variants(true)
            .into_iter()
            .filter(|t| t.engine == TileEngine::Wgmma);
        for tile in tf32_tiles.map(Some).chain([None]) {
            let run = |tma: bool| -> Vec<f32> {
                gpu.set_tma_store(tma);
                let mut d_out = gpu.upload(&vec![f32::NAN; (n + SPARE_ROWS) * oc]).unwrap();
                match tile {
                    Some(tile) => {
                        let opts = Tf32TileOptions {
                            tile,
                            splits: 1,
                            gelu: true,
                            inp_rounded: false,
                            split_workspace: None,
                        };
                        matmul_forward_tf32_with(&gpu, opts, &mut d_out, &d_inp, &d_w, Some(&d_b), shape).unwrap()
                    }
                    None => {
                        let opts = Tf32Options {
                            gelu: true,
                            round_out: true,
                            ..Tf32Options::default()
                        };
                        matmul_forward_tf32_opts(&gpu, opts, &mut d_out, &d_inp, &d_w, Some(&d_b), shape).unwrap()
                    }
                }
                gpu.download(&d_out).unwrap()
            };
            let name = tile.map_or("TF32 chosen tile, rounded out", |t| t.name);
            let what = format!("{name} n={n} c={c} oc={oc}");
            let plain = run(false);
            assert!(
                plain[..n * oc].iter().all(|v| v.is_finite()),
                "{what}: the element-wise store left NaN"
            );
            same(&run(true), &plain, n, oc, &what);
        }
    }
    gpu.set_tma_store(true);
    gpu.set_persistent_gemm_blocks(Some(gpu.sm_count()));
}
