//! Cross-entropy over the real vocabulary, from the logits (a fused
//! log-softmax): only one float per row goes back to the host.

use super::softmax::row_max_sum_exp;
use crate::device::math::ln_fast;
use crate::device::{block_idx_x, thread_idx_x};
use crate::params::crossentropy::{CrossentropyParams, IGNORED_TARGET};

/// One block per row: a strided pass for the max, one for the sum of
/// exponentials (the row is in L2 by then), block reductions in between;
/// thread 0 writes `max + ln(sum) - logits[target]`. A row whose target is
/// [`IGNORED_TARGET`] gets 0 without being read; any other target `>= v`
/// gets NaN (it is never used as an index), so a bad id shows in the sum.
///
/// # Safety
/// Buffers as documented on [`CrossentropyParams`]; 32 floats of dynamic
/// shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn crossentropy_forward(p: CrossentropyParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let row = block_idx_x();
    if row >= p.n {
        return;
    }
    // SAFETY: row < n.
    let target = unsafe { *p.targets.add(row as usize) };
    if target == IGNORED_TARGET || target >= p.v {
        if thread_idx_x() == 0 {
            let loss = if target == IGNORED_TARGET { 0.0 } else { f32::NAN };
            // SAFETY: row < n.
            unsafe { *p.losses.add(row as usize) = loss };
        }
        return;
    }
    // SAFETY: row < n.
    let x = unsafe { p.logits.add(row as usize * p.vp as usize) };
    // SAFETY: the row holds v <= vp floats; the launch provides 32 floats of
    // shared memory and the whole block gets here (both early returns are
    // per block).
    let (m, s) = unsafe { row_max_sum_exp(x, p.v as usize) };
    if thread_idx_x() == 0 {
        // SAFETY: target < v (checked above); row < n.
        unsafe { *p.losses.add(row as usize) = m + ln_fast(s) - *x.add(target as usize) };
    }
}
