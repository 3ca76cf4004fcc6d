//! GELU (tanh approximation), as GPT-2 uses it.

use super::vec4::{VEC, load4, store4};
use crate::device::math::{exp2_approx, fma, rcp_approx};
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::gelu::GeluParams;
/// sqrt(2 / pi)
const GELU_SCALE: f32 = 0.797_884_6;
/// The cubic coefficient of the approximation.
const GELU_CUBIC: f32 = 0.044715;
/// -2·sqrt(2/pi)·log2(e): turns `x + 0.044715x³` into the `ex2` argument
/// that gives e^{-2u}.
const GELU_EX2_SCALE: f32 = -2.0 * GELU_SCALE * core::f32::consts::LOG2_E;

/// GELU of one value, the tanh approximation GPT-2 uses:
/// 0.5·x·(1 + tanh u) with u = sqrt(2/pi)·(x + 0.044715x³), computed as the
/// identical x·σ(2u) = x / (1 + e^{-2u}). That form needs one `ex2` and one
/// `rcp` on the SFU, no IEEE division and no branch (tanh's small-|u| series
/// and its exp form diverged inside warps), and it does not cancel where
/// 1 + tanh u → 0. Error: about |x|·1.2e-7 absolute at most (the rounding of
/// the `ex2` argument, ≤ 3·2^-24 of 2u, times σ'(2u)·|2u| ≤ 0.45), no worse
/// than the CPU twin's f32 tanh formula. x = -inf gives NaN, as that formula
/// does.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let poly = x * fma(GELU_CUBIC * x, x, 1.0);
    let e = exp2_approx(poly * GELU_EX2_SCALE);
    x * rcp_approx(1.0 + e)
}

/// Four elements per thread with 16-byte loads, then a scalar tail.
///
/// # Safety
/// Buffers hold `n` floats and are 16-byte aligned (the host checks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gelu_forward(p: GeluParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let n4 = p.n / VEC as u32;
    let mut i = global_idx_x();
    while i < n4 {
        // SAFETY: i < n/4, aligned as promised.
        unsafe {
            let e = i as usize * VEC;
            let a = load4(p.inp.add(e));
            store4(p.out.add(e), [gelu(a[0]), gelu(a[1]), gelu(a[2]), gelu(a[3])]);
        }
        i += grid_stride_x();
    }
    let j = n4 * VEC as u32 + global_idx_x();
    if j < p.n {
        // SAFETY: j < n.
        unsafe { *p.out.add(j as usize) = gelu(*p.inp.add(j as usize)) };
    }
}

/// Baseline: one element per thread.
///
/// # Safety
/// Buffers hold `n` floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gelu_forward_naive(p: GeluParams) {
    let mut i = global_idx_x();
    while i < p.n {
        // SAFETY: i < n.
        unsafe { *p.out.add(i as usize) = gelu(*p.inp.add(i as usize)) };
        i += grid_stride_x();
    }
}
