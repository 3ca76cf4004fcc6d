//! Residual add.

use super::vec4::{VEC, load4, store4};
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::residual::ResidualParams;

/// `out = inp1 + inp2`, four elements per thread with 16-byte loads, then a
/// scalar tail for `n % 4` elements.
///
/// # Safety
/// Buffers hold `n` floats and are 16-byte aligned (the host checks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn residual_forward(p: ResidualParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let n4 = p.n / VEC as u32;
    let mut i = global_idx_x();
    while i < n4 {
        // SAFETY: i < n/4, aligned as promised.
        unsafe {
            let e = i as usize * VEC;
            let (a, b) = (load4(p.inp1.add(e)), load4(p.inp2.add(e)));
            store4(p.out.add(e), [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]);
        }
        i += grid_stride_x();
    }
    let j = n4 * VEC as u32 + global_idx_x();
    if j < p.n {
        // SAFETY: j < n.
        unsafe { *p.out.add(j as usize) = *p.inp1.add(j as usize) + *p.inp2.add(j as usize) };
    }
}

/// Baseline: one element per thread.
///
/// # Safety
/// Buffers hold `n` floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn residual_forward_naive(p: ResidualParams) {
    let mut i = global_idx_x();
    while i < p.n {
        // SAFETY: i < n.
        unsafe { *p.out.add(i as usize) = *p.inp1.add(i as usize) + *p.inp2.add(i as usize) };
        i += grid_stride_x();
    }
}
