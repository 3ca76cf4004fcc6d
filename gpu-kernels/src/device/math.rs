//! Fast math through PTX: nvptx has no libm, so `f32::exp` and friends
//! cannot be lowered (LLVM aborts on the libcall).
//!
//! Each function states its error bound; `tests/gpu/device.rs` measures every
//! one against an f64 reference over random and edge inputs and asserts the
//! bound written here ("rel" = |got - exact| / |exact|, "ulp" = units in the
//! last place of an f32). "ftz" means subnormal inputs and results are
//! flushed to zero (sign kept).

use core::arch::asm;

/// log2(e), to turn `exp(x)` into `2^(x * log2 e)`.
const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln(2), to turn `ln(x)` into `log2(x) * ln 2`.
const LN_2: f32 = core::f32::consts::LN_2;

/// Below this |x|, [`tanh_precise`] uses its odd series: there
/// `1 - 2/(e^{2x}+1)` cancels, losing more bits the smaller x is.
const TANH_SERIES_BELOW: f32 = 0.125;

macro_rules! unary_ptx {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: f32) -> f32 {
            let r: f32;
            // SAFETY: a register-only arithmetic instruction.
            unsafe {
                asm!(concat!($insn, " {r}, {x};"), r = out(reg32) r, x = in(reg32) x,
                     options(pure, nomem, nostack))
            }
            r
        }
    };
}

unary_ptx!(
    /// 2^x, `ex2.approx.ftz.f32`: rel ≤ 2^-21 (the PTX ISA promises 2 ulp;
    /// the tests assert twice that), ftz. 2^-inf = +0, 2^+inf = +inf, NaN stays NaN.
    exp2_approx, "ex2.approx.ftz.f32");
unary_ptx!(
    /// log2(x), `lg2.approx.ftz.f32`: abs ≤ 2^-22 for x in [0.5, 2], rel ≤
    /// 2^-22 elsewhere (the CUDA programming guide's bound for `__log2f`),
    /// ftz: a subnormal x gives -inf. log2(±0) = -inf, log2(+inf) = +inf,
    /// x < 0 and NaN give NaN.
    log2_approx, "lg2.approx.ftz.f32");
unary_ptx!(
    /// tanh(x), `tanh.approx.f32` (sm_75+): rel error at most 2^-10.987 (PTX
    /// ISA; measured about 1.1e-5). ±inf give ±1, NaN stays NaN.
    tanh_approx, "tanh.approx.f32");
unary_ptx!(
    /// 1/sqrt(x), `rsqrt.approx.ftz.f32`: rel ≤ 2^-21, ftz (so a subnormal x
    /// gives ±inf). ±0 gives ±inf, +inf gives 0, x < 0 gives NaN.
    rsqrt_approx, "rsqrt.approx.ftz.f32");
unary_ptx!(
    /// sqrt(x), correctly rounded (`sqrt.rn.f32`, IEEE 754, subnormals kept).
    sqrt_rn, "sqrt.rn.f32");
unary_ptx!(
    /// 1/x, correctly rounded (`rcp.rn.f32`, IEEE 754, subnormals kept).
    rcp_rn, "rcp.rn.f32");
unary_ptx!(
    /// 1/x, `rcp.approx.ftz.f32`: rel ≤ 2^-23 (the PTX ISA promises 1 ulp),
    /// ftz (a subnormal x gives ±inf, a result below 2^-126 is ±0). ±0 gives
    /// ±inf, ±inf gives ±0, NaN stays NaN. One SFU instruction where `/`
    /// compiles to the IEEE division sequence.
    rcp_approx, "rcp.approx.ftz.f32");

/// `a * b + c` with one rounding (`fma.rn.f32`). Rust never contracts a
/// multiply and an add into one, so kernels ask for it by name.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

/// e^x as `2^(x log2 e)` on the SFU. Rounding `x log2 e` to f32 adds a
/// relative error of up to |x|·2^-24·ln 2, so the bound is
/// rel ≤ 2^-21 + |x|·2^-23 (about 1.7e-6 at |x| = 10, 1.1e-5 at |x| = 88),
/// ftz: results below 2^-126 (x < -87.3) may be 0. exp(-inf) = 0,
/// exp(+inf) = +inf, x > 88.73 gives +inf, NaN stays NaN.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    exp2_approx(x * LOG2_E)
}

/// ln(x) as `log2(x) · ln 2` on the SFU: [`log2_approx`]'s error times
/// ln 2 plus one rounding, so abs ≤ 2^-22 for x in [0.5, 2] and rel ≤ 2^-21
/// elsewhere; ftz and the special values as for [`log2_approx`].
#[inline(always)]
pub fn ln_fast(x: f32) -> f32 {
    log2_approx(x) * LN_2
}

/// tanh(x) within 2^-21 absolute (about 4.8e-7) and 2^-18 relative (3.8e-6)
/// over the whole range, from [`exp_fast`] as tanh|x| = 1 - 2/(e^{2|x|}+1),
/// with an odd series below |x| = 1/8 where that form cancels (the worst
/// relative error sits just above 1/8, where the error of `ex2` is amplified).
/// Slower than [`tanh_approx`], but close enough for GELU to match the CPU
/// reference. ±0 give ±0, ±inf give ±1, NaN stays NaN, subnormals are kept.
#[inline(always)]
pub fn tanh_precise(x: f32) -> f32 {
    let ax = x.abs();
    if ax < TANH_SERIES_BELOW {
        let x2 = x * x;
        // tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315; the next term,
        // 62x^9/2835, is below 2^-29 relative for |x| < 1/8.
        x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    } else {
        // e = inf for |x| > 44 gives exactly 1; a NaN x falls through to NaN.
        let e = exp_fast(2.0 * ax);
        let t = 1.0 - 2.0 / (e + 1.0);
        if x < 0.0 { -t } else { t }
    }
}

/// 1/sqrt(x) within 2^-23 relative (about 1 ulp), IEEE edge cases included:
/// `rcp.rn(sqrt.rn(x))` rounds twice, by at most 2^-24 each. +0 gives +inf,
/// -0 gives -inf, +inf gives 0, x < 0 and NaN give NaN, subnormal x works.
/// (A Newton step on [`rsqrt_approx`] is cheaper but turns 0 and inf into
/// NaN.)
#[inline(always)]
pub fn rsqrt_precise(x: f32) -> f32 {
    rcp_rn(sqrt_rn(x))
}

/// Integer division rounding up.
#[inline(always)]
pub const fn ceil_div(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}
