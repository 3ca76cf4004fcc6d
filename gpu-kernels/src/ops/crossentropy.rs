//! Cross-entropy over the real vocabulary, from the logits (a fused
//! log-softmax): only one float per row goes back to the host.

use crate::device::math::{exp_fast, ln_fast};
use crate::device::warp::{block_reduce_max, block_reduce_sum};
use crate::device::{block_dim_x, block_idx_x, dynamic_shared, thread_idx_x};
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
    let v = p.v as usize;
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: row < n.
    let x = unsafe { p.logits.add(row as usize * p.vp as usize) };
    // SAFETY: the launch provides 32 floats.
    let scratch = unsafe { dynamic_shared::<f32>() };
    let mut m = f32::NEG_INFINITY;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v <= vp.
        m = m.max(unsafe { *x.add(j) });
        j += threads;
    }
    // SAFETY: `scratch` holds the launch's 32 floats; the whole block gets here
    // (both early returns are per block).
    let m = unsafe { block_reduce_max(m, scratch) };
    let mut s = 0.0f32;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v.
        s += exp_fast(unsafe { *x.add(j) } - m);
        j += threads;
    }
    // SAFETY: as for the max (its closing barrier frees the scratch).
    let s = unsafe { block_reduce_sum(s, scratch) };
    if tid == 0 {
        // SAFETY: target < v (checked above); row < n.
        unsafe { *p.losses.add(row as usize) = m + ln_fast(s) - *x.add(target as usize) };
    }
}
