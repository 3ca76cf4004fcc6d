//! Fast math through PTX: nvptx has no libm, so `f32::exp` and friends
//! cannot be lowered. Accuracy of each is measured by the GPU tests.

use core::arch::asm;

/// log2(e), to turn `exp(x)` into `2^(x * log2 e)`.
const LOG2_E: f32 = core::f32::consts::LOG2_E;

macro_rules! unary_ptx {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: f32) -> f32 {
            let r: f32;
            // SAFETY: a register-only arithmetic instruction.
            unsafe { asm!(concat!($insn, " {r}, {x};"), r = out(reg32) r, x = in(reg32) x) }
            r
        }
    };
}

unary_ptx!(
    /// 2^x, `ex2.approx.ftz.f32` (max relative error about 2^-22).
    exp2_approx, "ex2.approx.ftz.f32");
unary_ptx!(
    /// tanh(x), `tanh.approx.f32` (sm_75+; max relative error about 2^-11).
    tanh_approx, "tanh.approx.f32");
unary_ptx!(
    /// 1/sqrt(x), `rsqrt.approx.ftz.f32`.
    rsqrt_approx, "rsqrt.approx.ftz.f32");
unary_ptx!(
    /// sqrt(x), correctly rounded (`sqrt.rn.f32`).
    sqrt_rn, "sqrt.rn.f32");
unary_ptx!(
    /// 1/x, correctly rounded (`rcp.rn.f32`).
    rcp_rn, "rcp.rn.f32");

/// e^x as `2^(x log2 e)` on the SFU. Relative error grows with |x| because
/// `x * log2 e` is rounded; about 1e-6 for |x| < 10 (see the device tests).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    exp2_approx(x * LOG2_E)
}

/// tanh(x) accurate to a few ulp, built from `exp_fast`: tanh(x) = 1 - 2/(e^{2x}+1).
/// Slower than [`tanh_approx`] but within 1e-6 absolute, which the FP32 path
/// needs for GELU to match the CPU reference within 1e-3 end to end.
#[inline(always)]
pub fn tanh_precise(x: f32) -> f32 {
    // For |x| small, 1 - 2/(e^{2x}+1) cancels: use the odd series there.
    let ax = x.abs();
    if ax < 0.0625 {
        let x2 = x * x;
        // tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315
        x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    } else {
        let e = exp_fast(2.0 * ax);
        let t = 1.0 - 2.0 / (e + 1.0);
        if x < 0.0 { -t } else { t }
    }
}

/// 1/sqrt(x) to within an ulp or so: the approximate SFU result refined by
/// one Newton step.
#[inline(always)]
pub fn rsqrt_precise(x: f32) -> f32 {
    let y = rsqrt_approx(x);
    y * (1.5 - 0.5 * x * y * y)
}

/// Integer division rounding up.
#[inline(always)]
pub const fn ceil_div(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}
