//! GPU tests of `gpu_kernels::device`, through the test kernels of
//! `examples/kernel-import` (a separate crate importing gpu-kernels, loaded
//! as a second PTX module with `Gpu::load_module`).
//!
//! Every test draws fresh random inputs, poisons its outputs (NaN, or
//! [`POISON_U32`]) before the launch and checks every element. Measured
//! errors are printed (run with `--nocapture` to see them).

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use host::gpu::Gpu;
use host::gpu::runtime::{Module, dptr, dptr_mut};
use kernel_import::params::*;
use rand::Rng;

use crate::kernels::skip;

const WARP: usize = 32;
/// Poison for integer outputs; a random result equals it with probability 2^-32.
const POISON_U32: u32 = 0xDEAD_BEEF;
/// f32 unit roundoff (half an ulp of 1).
const U: f64 = f32::EPSILON as f64 / 2.0;

fn setup() -> Option<(Gpu, Module)> {
    let gpu = skip::gpu()?;
    let module = gpu
        .load_module(gpt2::KERNEL_IMPORT_PTX)
        .expect("loading the kernel-import PTX");
    Some((gpu, module))
}

fn cfg(grid: u32, block: u32, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared_bytes,
    }
}

fn filled<T: DeviceRepr + Clone>(gpu: &Gpu, value: T, n: usize) -> CudaSlice<T> {
    gpu.upload(&vec![value; n]).unwrap()
}

/// The body of `.entry name(...) { ... }` in a PTX module.
fn entry_body<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry {name} in the PTX"));
    let rest = &ptx[start..];
    let end = rest.find("\n}").expect("unterminated entry");
    &rest[..end]
}

#[test]
fn kernel_import_ptx_has_the_intended_instructions() {
    let ptx = gpt2::KERNEL_IMPORT_PTX;
    for name in [
        SHFL_XOR,
        SHFL_DOWN,
        SHFL_IDX,
        WARP_REDUCE,
        BLOCK_REDUCE,
        MATH,
        DYNAMIC_SHARED,
        MMA_TF32,
        CP_ASYNC,
    ] {
        let body = entry_body(ptx, name);
        // No stack frame: everything stays in registers.
        assert!(!body.contains(".local"), "{name} uses local memory");
    }
    let has = |name: &str, insn: &str| assert!(entry_body(ptx, name).contains(insn), "{name} lacks `{insn}`");
    has(SHFL_XOR, "shfl.sync.bfly.b32");
    has(SHFL_DOWN, "shfl.sync.down.b32");
    has(SHFL_IDX, "shfl.sync.idx.b32");
    has(WARP_REDUCE, "shfl.sync.bfly.b32");
    has(BLOCK_REDUCE, "bar.sync");
    has(MATH, "ex2.approx.ftz.f32");
    has(MATH, "tanh.approx.f32");
    has(MATH, "rsqrt.approx.ftz.f32");
    has(MATH, "lg2.approx.ftz.f32");
    has(MATH, "cvt.rna.tf32.f32");
    has(DYNAMIC_SHARED, "bar.sync");
    has(MMA_TF32, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32");
    has(CP_ASYNC, "cp.async.cg.shared.global");
    has(CP_ASYNC, "cp.async.commit_group");
    has(CP_ASYNC, "cp.async.wait_group 0");
    assert!(
        ptx.contains(".extern .shared .align 16"),
        "dynamic shared memory is not 16-byte aligned"
    );
}

// ---------------------------------------------------------------- shuffles

/// Launches one shuffle kernel and checks all rows against `src_lane(lane, arg)`.
fn check_shuffle(kernel: &'static str, src_lane: fn(usize, usize) -> usize) {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let (block, grid) = (128u32, 3u32);
    let n = (block * grid) as usize;
    let rows = SHFL_ROWS as usize;
    let inp_f32: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
    let inp_u32: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    // 0..64: only the low 5 bits of the lane argument count (PTX ISA).
    let lane_arg: Vec<u32> = (0..n).map(|_| rng.random_range(0..2 * WARP as u32)).collect();
    let (d_f32, d_u32, d_arg) = (
        gpu.upload(&inp_f32).unwrap(),
        gpu.upload(&inp_u32).unwrap(),
        gpu.upload(&lane_arg).unwrap(),
    );
    let mut o_f32 = filled(&gpu, f32::NAN, rows * n);
    let mut o_u32 = filled(&gpu, POISON_U32, rows * n);
    let mut o_i32 = filled(&gpu, POISON_U32 as i32, rows * n);
    let p = ShflParams {
        out_f32: dptr_mut(&mut o_f32),
        out_u32: dptr_mut(&mut o_u32),
        out_i32: dptr_mut(&mut o_i32),
        inp_f32: dptr(&d_f32),
        inp_u32: dptr(&d_u32),
        lane_arg: dptr(&d_arg),
        n: n as u32,
    };
    // SAFETY: inputs hold n elements, outputs SHFL_ROWS * n; n = grid * block, a multiple of 32.
    unsafe { gpu.launch_in(&module, kernel, cfg(grid, block, 0), p).unwrap() };
    let (g_f32, g_u32, g_i32) = (
        gpu.download(&o_f32).unwrap(),
        gpu.download(&o_u32).unwrap(),
        gpu.download(&o_i32).unwrap(),
    );
    for row in 0..rows {
        for (i, &own_arg) in lane_arg.iter().enumerate() {
            let arg = if row == SHFL_LANE_ARG_ROW as usize {
                own_arg as usize
            } else {
                row
            };
            let (base, lane) = (i - i % WARP, i % WARP);
            let src = base + src_lane(lane, arg % WARP);
            let o = row * n + i;
            assert_eq!(
                g_f32[o].to_bits(),
                inp_f32[src].to_bits(),
                "{kernel} f32 row {row} thread {i}"
            );
            assert_eq!(g_u32[o], inp_u32[src], "{kernel} u32 row {row} thread {i}");
            assert_eq!(g_i32[o], inp_u32[src] as i32, "{kernel} i32 row {row} thread {i}");
        }
    }
    println!("{kernel}: {} values exact (f32, u32, i32)", 3 * rows * n);
}

#[test]
#[ignore = "needs a GPU"]
fn shfl_xor_exact() {
    check_shuffle(SHFL_XOR, |lane, m| lane ^ m);
}

#[test]
#[ignore = "needs a GPU"]
fn shfl_down_exact() {
    // Lanes whose source would be past lane 31 keep their own value.
    check_shuffle(SHFL_DOWN, |lane, d| if lane + d < WARP { lane + d } else { lane });
}

#[test]
#[ignore = "needs a GPU"]
fn shfl_idx_exact() {
    check_shuffle(SHFL_IDX, |_, s| s);
}

// ---------------------------------------------------------------- reductions

/// |got - exact| / sum|x|, the error measure a pairwise f32 sum is bounded in.
fn sum_error(got: f32, xs: &[f32]) -> f64 {
    let exact: f64 = xs.iter().map(|&x| x as f64).sum();
    let scale: f64 = xs.iter().map(|&x| (x as f64).abs()).sum();
    (got as f64 - exact).abs() / scale
}

#[test]
#[ignore = "needs a GPU"]
fn warp_reductions() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let (block, grid) = (256u32, 4u32);
    let n = (block * grid) as usize;
    // Mixed magnitudes so that rounding matters, with a non-zero mean.
    let inp: Vec<f32> = (0..n)
        .map(|_| rng.random_range(-1.0f32..2.0) * 10f32.powi(rng.random_range(-3..4)))
        .collect();
    let inp_u32: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    // Few distinct values: ties are common, so the lowest-index rule is exercised.
    let inp_argmax: Vec<f32> = (0..n).map(|_| rng.random_range(-3..4) as f32).collect();
    let (d_inp, d_u32, d_am) = (
        gpu.upload(&inp).unwrap(),
        gpu.upload(&inp_u32).unwrap(),
        gpu.upload(&inp_argmax).unwrap(),
    );
    let [mut sum, mut max, mut min, mut am_val] = std::array::from_fn(|_| filled(&gpu, f32::NAN, n));
    let [mut sum_u32, mut max_u32, mut am_idx] = std::array::from_fn(|_| filled(&gpu, POISON_U32, n));
    let p = WarpReduceParams {
        sum: dptr_mut(&mut sum),
        max: dptr_mut(&mut max),
        min: dptr_mut(&mut min),
        sum_u32: dptr_mut(&mut sum_u32),
        max_u32: dptr_mut(&mut max_u32),
        argmax_val: dptr_mut(&mut am_val),
        argmax_idx: dptr_mut(&mut am_idx),
        inp: dptr(&d_inp),
        inp_u32: dptr(&d_u32),
        inp_argmax: dptr(&d_am),
        n: n as u32,
    };
    // SAFETY: every buffer holds n elements; n = grid * block, a multiple of 32.
    unsafe { gpu.launch_in(&module, WARP_REDUCE, cfg(grid, block, 0), p).unwrap() };
    let [sum, max, min, am_val] = [sum, max, min, am_val].map(|b| gpu.download(&b).unwrap());
    let [sum_u32, max_u32, am_idx] = [sum_u32, max_u32, am_idx].map(|b| gpu.download(&b).unwrap());

    // A 32-term pairwise sum: |error| <= log2(32) u sum|x| (+ second order).
    let bound = 5.0 * U * (1.0 + 1e-6);
    let mut worst = 0f64;
    for w in 0..n / WARP {
        let r = w * WARP..(w + 1) * WARP;
        let xs = &inp[r.clone()];
        let want_max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want_min = xs.iter().copied().fold(f32::INFINITY, f32::min);
        let want_su = inp_u32[r.clone()].iter().fold(0u32, |a, &b| a.wrapping_add(b));
        let want_mu = *inp_u32[r.clone()].iter().max().unwrap();
        let am = &inp_argmax[r.clone()];
        let best = am.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let best_idx = (r.start + am.iter().position(|&v| v == best).unwrap()) as u32;
        let err = sum_error(sum[r.start], xs);
        worst = worst.max(err);
        assert!(err <= bound, "warp {w}: sum error {err:e} > {bound:e} (of sum|x|)");
        for i in r {
            // Every lane gets the same bits: the butterfly is symmetric.
            assert_eq!(
                sum[i].to_bits(),
                sum[w * WARP].to_bits(),
                "sum differs across lanes, thread {i}"
            );
            assert_eq!(max[i], want_max, "max, thread {i}");
            assert_eq!(min[i], want_min, "min, thread {i}");
            assert_eq!(sum_u32[i], want_su, "sum_u32, thread {i}");
            assert_eq!(max_u32[i], want_mu, "max_u32, thread {i}");
            assert_eq!((am_val[i], am_idx[i]), (best, best_idx), "argmax, thread {i}");
        }
    }
    println!("warp_reduce_sum: max error {worst:.3e} of sum|x| (bound {bound:.3e}); max/min/u32/argmax exact");
}

#[test]
#[ignore = "needs a GPU"]
fn block_reductions_at_every_block_size() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let grid = 5u32;
    // Warp pairwise sums, then a pairwise sum of up to 32 warp sums: at most
    // 10 rounding levels, |error| <= 10 u sum|x|.
    let bound = 10.0 * U * (1.0 + 1e-6);
    let scratch_bytes = BLOCK_REDUCE_SCRATCH_F32S * std::mem::size_of::<f32>() as u32;
    for block in [32u32, 64, 96, 160, 256, 480, 512, 1024] {
        let n = (block * grid) as usize;
        let inp: Vec<f32> = (0..n)
            .map(|_| rng.random_range(-1.0f32..2.0) * 10f32.powi(rng.random_range(-3..4)))
            .collect();
        let d_inp = gpu.upload(&inp).unwrap();
        let [mut sum, mut max, mut min] = std::array::from_fn(|_| filled(&gpu, f32::NAN, n));
        let p = BlockReduceParams {
            sum: dptr_mut(&mut sum),
            max: dptr_mut(&mut max),
            min: dptr_mut(&mut min),
            inp: dptr(&d_inp),
            n: n as u32,
        };
        // SAFETY: buffers hold n = grid * block elements; the block is a
        // multiple of 32 up to 1024 and gets the scratch in dynamic shared memory.
        unsafe {
            gpu.launch_in(&module, BLOCK_REDUCE, cfg(grid, block, scratch_bytes), p)
                .unwrap()
        };
        let [sum, max, min] = [sum, max, min].map(|b| gpu.download(&b).unwrap());
        let mut worst = 0f64;
        for b in 0..grid as usize {
            let r = b * block as usize..(b + 1) * block as usize;
            let xs = &inp[r.clone()];
            let want_max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want_min = xs.iter().copied().fold(f32::INFINITY, f32::min);
            let err = sum_error(sum[r.start], xs);
            worst = worst.max(err);
            assert!(err <= bound, "block {block}: sum error {err:e} > {bound:e}");
            for i in r.clone() {
                assert_eq!(
                    sum[i].to_bits(),
                    sum[r.start].to_bits(),
                    "block {block}: sum differs, thread {i}"
                );
                assert_eq!(max[i], want_max, "block {block}: max, thread {i}");
                assert_eq!(min[i], want_min, "block {block}: min, thread {i}");
            }
        }
        println!("block_reduce_sum, block {block}: max error {worst:.3e} of sum|x| (bound {bound:.3e}); max/min exact");
    }
}

// ---------------------------------------------------------------- math

/// Inputs for the math functions: edge values, then random ones over many magnitudes.
fn math_inputs(rng: &mut impl Rng, random: usize) -> Vec<f32> {
    let mut v = vec![
        0.0,
        f32::MIN_POSITIVE,
        1e-40, // subnormal
        1e-30,
        1e-10,
        1e-3,
        0.125 - 1e-6, // either side of tanh_precise's switch
        0.125,
        0.125 + 1e-6,
        0.5,
        1.0,
        2.0,
        10.0,
        20.0,
        44.5,
        87.0,
        88.5,
        88.8,
        100.0,
        1e10,
        1e30,
        f32::MAX,
        f32::INFINITY,
    ];
    let negated: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(negated);
    v.push(f32::NAN);
    for _ in 0..random {
        let x = if rng.random_bool(0.5) {
            rng.random_range(-20.0f32..20.0)
        } else {
            let s = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            s * 10f32.powf(rng.random_range(-12.0f32..3.0))
        };
        v.push(x);
    }
    v
}

/// Flush a subnormal to zero (sign kept), as `.ftz` instructions do to inputs.
fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// Largest relative (and absolute) error seen for one function.
#[derive(Default)]
struct Worst {
    rel: f64,
    rel_at: f32,
    abs: f64,
    abs_at: f32,
}

impl Worst {
    fn note(&mut self, x: f32, got: f32, exact: f64) {
        // Below the normal range ftz results are judged by absolute slack only.
        if exact.abs() < f32::MIN_POSITIVE as f64 {
            return;
        }
        let abs = (got as f64 - exact).abs();
        if abs > self.abs {
            (self.abs, self.abs_at) = (abs, x);
        }
        if exact != 0.0 && abs / exact.abs() > self.rel {
            (self.rel, self.rel_at) = (abs / exact.abs(), x);
        }
    }
}

/// An error bound: |err| <= rel |exact| + tiny and |err| <= abs + tiny,
/// `tiny` being the absolute slack where results may be flushed (ftz).
#[derive(Clone, Copy)]
struct Bound {
    rel: f64,
    abs: f64,
    tiny: f64,
}

/// Checks `got` against the f64 `exact` within `bound`, after the cases
/// every function shares: NaN in gives NaN out, an infinite exact value must
/// be met exactly, an exact zero too.
fn check_close(name: &str, x: f32, got: f32, exact: f64, bound: Bound, worst: &mut Worst) {
    let Bound { rel, abs, tiny } = bound;
    if exact.is_nan() {
        assert!(got.is_nan(), "{name}({x:e}) = {got:e}, want NaN");
        return;
    }
    if exact.is_infinite() || exact == 0.0 {
        assert_eq!(got as f64, exact, "{name}({x:e})");
        return;
    }
    assert!(got.is_finite(), "{name}({x:e}) = {got:e}, want {exact:e}");
    worst.note(x, got, exact);
    let err = (got as f64 - exact).abs();
    assert!(
        err <= rel * exact.abs() + tiny && err <= abs + tiny,
        "{name}({x:e}) = {got:e}, want {exact:e}: error {err:e} (rel {:e}) exceeds rel {rel:e} / abs {abs:e}",
        err / exact.abs()
    );
}

/// [`check_close`] over every input `x` of one row of the math kernel, with
/// `exact(x)` and the bound `rel(x)`, `abs`, `tiny`; returns the worst
/// errors seen. Where the exact value (within the relative bound) passes
/// `f32::MAX`, the result must be `+inf`, or may be either `+inf` or within
/// the bound near the threshold.
fn sweep(
    name: &str,
    inp: &[f32],
    got: &[f32],
    exact: impl Fn(f32) -> f64,
    rel: impl Fn(f32) -> f64,
    abs: f64,
    tiny: f64,
) -> Worst {
    let f32_max = f32::MAX as f64;
    let mut w = Worst::default();
    for (&x, &got) in inp.iter().zip(got) {
        let (exact, rel) = (exact(x), rel(x));
        if exact * (1.0 - rel) > f32_max {
            assert_eq!(got, f32::INFINITY, "{name}({x:e})");
        } else if exact * (1.0 + rel) > f32_max {
            // Near the overflow threshold rounding may go either way.
            assert!(
                got == f32::INFINITY || (got as f64 - exact).abs() <= rel * exact,
                "{name}({x:e}) = {got:e}"
            );
        } else {
            check_close(name, x, got, exact, Bound { rel, abs, tiny }, &mut w);
        }
    }
    w
}

#[test]
#[ignore = "needs a GPU"]
fn math_functions_within_documented_bounds() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let inp = math_inputs(&mut rng, 1 << 16);
    let n = inp.len();
    let d_inp = gpu.upload(&inp).unwrap();
    let mut out = filled(&gpu, f32::NAN, MATH_ROWS as usize * n);
    let p = MathParams {
        out: dptr_mut(&mut out),
        inp: dptr(&d_inp),
        n: n as u32,
    };
    // SAFETY: inp holds n floats, out MATH_ROWS * n; a grid-stride loop covers any grid.
    unsafe { gpu.launch_in(&module, MATH, cfg(64, 256, 0), p).unwrap() };
    let out = gpu.download(&out).unwrap();
    let row = |r: u32| &out[r as usize * n..(r as usize + 1) * n];
    let min_normal = f32::MIN_POSITIVE as f64;
    let inf = f64::INFINITY;

    // Bounds as documented in gpu_kernels::device::math.
    let w = sweep(
        "exp2_approx",
        &inp,
        row(MATH_EXP2_APPROX),
        |x| (ftz(x) as f64).exp2(),
        |_| 2f64.powi(-21),
        inf,
        min_normal,
    );
    println!(
        "exp2_approx: max rel error {:.3e} at {:e} (bound 2^-21 = {:.3e})",
        w.rel,
        w.rel_at,
        2f64.powi(-21)
    );

    let exp_rel = |x: f32| 2f64.powi(-21) + (x.abs() as f64) * 2f64.powi(-23);
    let w = sweep(
        "exp_fast",
        &inp,
        row(MATH_EXP_FAST),
        |x| (ftz(x) as f64).exp(),
        exp_rel,
        inf,
        min_normal,
    );
    println!(
        "exp_fast: max rel error {:.3e} at {:e} (bound 2^-21 + |x| 2^-23, {:.3e} there)",
        w.rel,
        w.rel_at,
        2f64.powi(-21) + (w.rel_at.abs() as f64) * 2f64.powi(-23)
    );

    let tanh_approx_rel = 2f64.powf(-10.987);
    let w = sweep(
        "tanh_approx",
        &inp,
        row(MATH_TANH_APPROX),
        |x| (x as f64).tanh(),
        |_| tanh_approx_rel,
        inf,
        min_normal,
    );
    println!(
        "tanh_approx: max rel error {:.3e} at {:e} (bound 2^-10.987 = {tanh_approx_rel:.3e})",
        w.rel, w.rel_at
    );

    let (tp_rel, tp_abs) = (2f64.powi(-18), 2f64.powi(-21));
    let w = sweep(
        "tanh_precise",
        &inp,
        row(MATH_TANH_PRECISE),
        |x| (x as f64).tanh(),
        |_| tp_rel,
        tp_abs,
        0.0,
    );
    println!(
        "tanh_precise: max rel error {:.3e} at {:e} (bound 2^-18 = {tp_rel:.3e}), max abs error {:.3e} at {:e} (bound 2^-21 = {tp_abs:.3e})",
        w.rel, w.rel_at, w.abs, w.abs_at
    );

    // ftz: a subnormal x is read as ±0, giving ±inf.
    let w = sweep(
        "rsqrt_approx",
        &inp,
        row(MATH_RSQRT_APPROX),
        |x| 1.0 / (ftz(x) as f64).sqrt(),
        |_| 2f64.powi(-21),
        inf,
        0.0,
    );
    println!(
        "rsqrt_approx: max rel error {:.3e} at {:e} (bound 2^-21 = {:.3e})",
        w.rel,
        w.rel_at,
        2f64.powi(-21)
    );

    // Two roundings of at most 2^-24 each; the slack covers their product.
    let rp_rel = 2f64.powi(-23) * (1.0 + 1e-6);
    let w = sweep(
        "rsqrt_precise",
        &inp,
        row(MATH_RSQRT_PRECISE),
        |x| 1.0 / (x as f64).sqrt(),
        |_| rp_rel,
        inf,
        0.0,
    );
    println!(
        "rsqrt_precise: max rel error {:.3e} at {:e} (bound 2^-23 = {:.3e})",
        w.rel,
        w.rel_at,
        2f64.powi(-23)
    );

    // ftz both ways: a subnormal x is read as ±0 (giving ±inf), a subnormal
    // result may be ±0 (the `tiny` slack).
    let w = sweep(
        "rcp_approx",
        &inp,
        row(MATH_RCP_APPROX),
        |x| 1.0 / ftz(x) as f64,
        |_| 2f64.powi(-23),
        inf,
        min_normal,
    );
    println!(
        "rcp_approx: max rel error {:.3e} at {:e} (bound 2^-23 = {:.3e})",
        w.rel,
        w.rel_at,
        2f64.powi(-23)
    );

    // log2_approx: abs ≤ 2^-22 on [0.5, 2], rel ≤ 2^-22 elsewhere; ln_fast:
    // the same abs bound on [0.5, 2] (ln 2 · 2^-22 plus a rounding of at
    // most 2^-24 · ln 2), rel ≤ 2^-21 elsewhere. Both ftz: a subnormal x
    // gives -inf.
    for (name, r, scale, rel) in [
        ("log2_approx", MATH_LOG2_APPROX, 1.0, 2f64.powi(-22)),
        ("ln_fast", MATH_LN_FAST, std::f64::consts::LN_2, 2f64.powi(-21)),
    ] {
        let abs = 2f64.powi(-22);
        // Worst abs error on [0.5, 2], worst rel error elsewhere.
        let (mut worst_abs, mut worst_rel) = (0f64, 0f64);
        for (&x, &got) in inp.iter().zip(row(r)) {
            let xf = ftz(x) as f64;
            let exact = xf.log2() * scale;
            if exact.is_nan() || exact.is_infinite() {
                assert!(
                    got.is_nan() && exact.is_nan() || got as f64 == exact,
                    "{name}({x:e}) = {got:e}, want {exact:e}"
                );
                continue;
            }
            let err = (got as f64 - exact).abs();
            let near_one = (0.5..=2.0).contains(&xf);
            let bound = if near_one { abs } else { rel * exact.abs() };
            assert!(
                err <= bound,
                "{name}({x:e}) = {got:e}, want {exact:e}: error {err:e} exceeds {bound:e}"
            );
            if near_one {
                worst_abs = worst_abs.max(err);
            } else {
                worst_rel = worst_rel.max(err / exact.abs());
            }
        }
        println!(
            "{name}: max abs error {worst_abs:.3e} on [0.5, 2] (bound 2^-22), max rel error {worst_rel:.3e} elsewhere (bound {rel:.3e})"
        );
    }

    // Correctly rounded: f64 then one rounding to f32 gives the same bits
    // (53 >= 2*24 + 2, so double rounding is harmless for sqrt and division).
    let exactly = |name: &str, r: u32, f: fn(f64) -> f64| {
        for (&x, &got) in inp.iter().zip(row(r)) {
            let want = f(x as f64) as f32;
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{name}({x:e}) = {got:e}, want {want:e}"
            );
        }
        println!("{name}: all {n} results correctly rounded");
    };
    exactly("sqrt_rn", MATH_SQRT_RN, f64::sqrt);
    exactly("rcp_rn", MATH_RCP_RN, |x| 1.0 / x);

    // to_tf32: round to nearest, ties away, keeping 10 mantissa bits. Only
    // the upper 19 bits are compared: mma ignores the rest.
    for (&x, &got) in inp.iter().zip(row(MATH_TO_TF32)) {
        if x.is_nan() {
            assert!(got.is_nan(), "to_tf32(NaN) = {got:e}");
            continue;
        }
        let want = tf32_rna(x);
        let same = got.to_bits() & TF32_KEPT_MASK == want.to_bits();
        // Subnormals may be flushed.
        let flushed = x.abs() < f32::MIN_POSITIVE && got.to_bits() & TF32_KEPT_MASK & !SIGN_BIT == 0;
        // Past the largest TF32 value rounding gives inf (IEEE) or may saturate.
        let saturated = want.is_infinite()
            && x.is_finite()
            && got.to_bits() & TF32_KEPT_MASK == f32::MAX.copysign(x).to_bits() & TF32_KEPT_MASK;
        assert!(
            same || flushed || saturated,
            "to_tf32({x:e}) = {got:e} ({:#x}), want {want:e} ({:#x})",
            got.to_bits(),
            want.to_bits()
        );
    }
    println!("to_tf32: all {n} results round to nearest (ties away) at 10 mantissa bits");
}

const SIGN_BIT: u32 = 0x8000_0000;
/// Mantissa bits f32 has and TF32 drops.
const TF32_DROPPED_BITS: u32 = 13;
const TF32_KEPT_MASK: u32 = !((1 << TF32_DROPPED_BITS) - 1);

/// `cvt.rna.tf32.f32` on the host: add half of the dropped ulp to the
/// magnitude, then truncate (a carry into the exponent is the right answer,
/// up to overflow to infinity).
fn tf32_rna(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let half = 1 << (TF32_DROPPED_BITS - 1);
    f32::from_bits((x.to_bits() + half) & TF32_KEPT_MASK)
}

// ---------------------------------------------------------------- shared memory, cp.async

#[test]
#[ignore = "needs a GPU"]
fn dynamic_shared_round_trip() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let grid = 3u32;
    for block in [32u32, 100, 256, 1024] {
        let n = (block * grid) as usize;
        let inp: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
        let d_inp = gpu.upload(&inp).unwrap();
        let mut out = filled(&gpu, f32::NAN, n);
        let mut align_ok = filled(&gpu, POISON_U32, grid as usize);
        let p = DynamicSharedParams {
            out: dptr_mut(&mut out),
            inp: dptr(&d_inp),
            align_ok: dptr_mut(&mut align_ok),
            n: n as u32,
        };
        let shared = block * std::mem::size_of::<f32>() as u32;
        // SAFETY: n = grid * block floats in and out, one flag per block, block floats of shared memory.
        unsafe {
            gpu.launch_in(&module, DYNAMIC_SHARED, cfg(grid, block, shared), p)
                .unwrap()
        };
        let (out, align_ok) = (gpu.download(&out).unwrap(), gpu.download(&align_ok).unwrap());
        let bd = block as usize;
        for (i, got) in out.iter().enumerate() {
            let (b, t) = (i / bd, i % bd);
            assert_eq!(
                got.to_bits(),
                inp[b * bd + bd - 1 - t].to_bits(),
                "block size {block}, element {i}"
            );
        }
        assert!(
            align_ok.iter().all(|&f| f == 1),
            "block size {block}: alignment flags {align_ok:?}"
        );
    }
    println!("dynamic shared memory: round trips exact, base 16-byte aligned");
}

#[test]
#[ignore = "needs a GPU"]
fn cp_async_copies_exactly_and_zero_fills() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let (block, grid) = (128u32, 4u32);
    let chunks = (block * grid) as usize;
    // The last block is partly past the input: those chunks are zero-filled.
    let valid = chunks - rng.random_range(1..block as usize);
    let cw = CP_ASYNC_CHUNK as usize;
    let inp: Vec<f32> = (0..valid * cw).map(|_| rng.random_range(-1e3..1e3)).collect();
    let d_inp = gpu.upload(&inp).unwrap();
    let mut out = filled(&gpu, f32::NAN, chunks * cw);
    let p = CpAsyncParams {
        out: dptr_mut(&mut out),
        inp: dptr(&d_inp),
        valid_chunks: valid as u32,
        chunks: chunks as u32,
    };
    let shared = block * CP_ASYNC_CHUNK * std::mem::size_of::<f32>() as u32;
    // SAFETY: inp holds valid chunks (cudarc allocations are 256-byte
    // aligned), out holds grid * block chunks, shared memory a chunk per thread.
    unsafe { gpu.launch_in(&module, CP_ASYNC, cfg(grid, block, shared), p).unwrap() };
    let out = gpu.download(&out).unwrap();
    for (i, &got) in out.iter().enumerate() {
        let want = if i < valid * cw { inp[i] } else { 0.0 };
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "element {i} (chunk {}, {valid} valid)",
            i / cw
        );
    }
    println!(
        "cp.async: {} floats copied exactly, {} zero-filled",
        valid * cw,
        (chunks - valid) * cw
    );
}

// ---------------------------------------------------------------- mma

/// D = A·B + C in f64 for one tile; `b_at(k, n)` reads B.
fn mma_reference(a: &[f32], b_at: impl Fn(usize, usize) -> f64, c: &[f32], round: fn(f32) -> f32) -> Vec<(f64, f64)> {
    let (m, n, k) = (MMA_M as usize, MMA_N as usize, MMA_K as usize);
    let mut d = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * n + j] as f64;
            let mut scale = (c[i * n + j] as f64).abs();
            for kk in 0..k {
                let p = round(a[i * k + kk]) as f64 * b_at(kk, j);
                acc += p;
                scale += p.abs();
            }
            d.push((acc, scale));
        }
    }
    d
}

#[test]
#[ignore = "needs a GPU"]
fn mma_m16n8k8_tf32_fragment_layout() {
    let Some((gpu, module)) = setup() else { return };
    let mut rng = crate::seed::rng();
    let (m, n, k) = (MMA_M as usize, MMA_N as usize, MMA_K as usize);
    let tiles = 64usize;
    let warps_per_block = 2u32;
    let mut rand_vec = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let (a, b, c) = (
        rand_vec(tiles * m * k),
        rand_vec(tiles * k * n),
        rand_vec(tiles * m * n),
    );
    let (da, db, dc) = (
        gpu.upload(&a).unwrap(),
        gpu.upload(&b).unwrap(),
        gpu.upload(&c).unwrap(),
    );
    let mut d = filled(&gpu, f32::NAN, tiles * m * n);
    let p = MmaParams {
        d: dptr_mut(&mut d),
        a: dptr(&da),
        b: dptr(&db),
        c: dptr(&dc),
        tiles: tiles as u32,
    };
    let block = warps_per_block * WARP as u32;
    // SAFETY: buffers hold `tiles` tiles; one warp per tile, blocks of whole warps.
    unsafe {
        gpu.launch_in(&module, MMA_TF32, cfg(tiles as u32 / warps_per_block, block, 0), p)
            .unwrap()
    };
    let d = gpu.download(&d).unwrap();

    // Loose: against unrounded inputs, TF32 rounding (2^-11 per operand) dominates.
    let loose = 1e-2;
    // Tight: against TF32-rounded inputs only the f32 accumulation remains.
    let tight = 2f64.powi(-18);
    let (mut worst_loose, mut worst_tight, mut swapped_hits) = (0f64, 0f64, 0usize);
    for t in 0..tiles {
        let (ta, tb, tc) = (
            &a[t * m * k..][..m * k],
            &b[t * k * n..][..k * n],
            &c[t * m * n..][..m * n],
        );
        let td = &d[t * m * n..][..m * n];
        let plain = mma_reference(ta, |kk, j| tb[kk * n + j] as f64, tc, |x| x);
        let rounded = mma_reference(ta, |kk, j| tf32_rna(tb[kk * n + j]) as f64, tc, tf32_rna);
        // The result a transposed B fragment would give (B is square): the
        // test must tell it apart from the right one.
        let transposed = mma_reference(ta, |kk, j| tb[j * n + kk] as f64, tc, |x| x);
        for e in 0..m * n {
            let got = td[e] as f64;
            let (want, scale) = plain[e];
            let (want_r, scale_r) = rounded[e];
            let err = (got - want).abs() / scale;
            let err_r = (got - want_r).abs() / scale_r;
            worst_loose = worst_loose.max(err);
            worst_tight = worst_tight.max(err_r);
            assert!(
                err <= loose,
                "tile {t} D[{}][{}] = {got}, want {want}: rel {err:e}",
                e / n,
                e % n
            );
            assert!(
                err_r <= tight,
                "tile {t} D[{}][{}] = {got}, want {want_r} (tf32 inputs): rel {err_r:e}",
                e / n,
                e % n
            );
            if ((got - transposed[e].0).abs() / transposed[e].1) <= tight {
                swapped_hits += 1;
            }
        }
    }
    // A layout bug (e.g. B read transposed) would match `transposed` everywhere.
    assert!(
        swapped_hits < tiles * m * n / 10,
        "{swapped_hits} elements also match a transposed B"
    );
    println!(
        "mma_m16n8k8_tf32: max error {worst_loose:.3e} of sum|a||b|+|c| vs f32 inputs (bound {loose:.0e}), \
         {worst_tight:.3e} vs tf32-rounded inputs (bound {tight:.3e})"
    );
}
