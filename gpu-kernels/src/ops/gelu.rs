//! GELU (tanh approximation), as GPT-2 uses it.

use super::vec4::{VEC, load4, store4};
use crate::device::math::tanh_precise;
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::gelu::GeluParams;
/// sqrt(2 / pi)
const GELU_SCALE: f32 = 0.797_884_6;
/// The cubic coefficient of the approximation.
const GELU_CUBIC: f32 = 0.044715;

/// GELU of one value. `tanh_precise`, not the SFU's `tanh.approx` (rel error
/// 2^-11), keeps the FP32 path within 1e-3 of the CPU end to end.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + tanh_precise(GELU_SCALE * (x + GELU_CUBIC * x * x * x)))
}

/// Four elements per thread with 16-byte loads, then a scalar tail.
///
/// # Safety
/// Buffers hold `n` floats and are 16-byte aligned (the host checks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gelu_forward(p: GeluParams) {
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
