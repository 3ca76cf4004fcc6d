//! `out = a * x + y`: the pipeline's smoke test.

use crate::device::{global_idx_x, grid_stride_x};
use crate::params::SaxpyParams;

/// # Safety
/// `out`, `x`, `y` hold `n` floats each in device memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn saxpy(p: SaxpyParams) {
    let mut i = global_idx_x();
    while i < p.n {
        let i_ = i as usize;
        // SAFETY: i < n, and the launch contract gives `out`, `x`, `y` n floats each.
        unsafe { *p.out.add(i_) = p.a * *p.x.add(i_) + *p.y.add(i_) };
        i += grid_stride_x();
    }
}
