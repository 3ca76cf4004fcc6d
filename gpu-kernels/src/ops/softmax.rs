//! Softmax over the real vocabulary of each row; padded columns get 0.

use crate::device::math::exp_fast;
use crate::device::warp::{block_reduce_max, block_reduce_sum};
use crate::device::{block_dim_x, block_idx_x, dynamic_shared, global_idx_x, thread_idx_x};
use crate::params::softmax::SoftmaxParams;

/// One block per row: strided passes for the max, the sum of exponentials
/// and the normalised output, with block reductions (warp shuffles plus 32
/// floats of dynamic shared memory) in between.
///
/// # Safety
/// Buffers as documented on [`SoftmaxParams`]; 32 floats of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_forward(p: SoftmaxParams) {
    let row = block_idx_x();
    if row >= p.n {
        return;
    }
    let (v, vp) = (p.v as usize, p.vp as usize);
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: row < n.
    let (x, y) = unsafe { (p.logits.add(row as usize * vp), p.probs.add(row as usize * vp)) };
    // SAFETY: the launch provides 32 floats.
    let scratch = unsafe { dynamic_shared::<f32>() };
    let mut m = f32::NEG_INFINITY;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v <= vp.
        m = m.max(unsafe { *x.add(j) });
        j += threads;
    }
    // SAFETY: `scratch` is the launch's 32 floats of dynamic shared memory; the whole
    // block gets here (the early return is per block) with SOFTMAX_THREADS threads.
    let m = unsafe { block_reduce_max(m, scratch) };
    let mut s = 0.0f32;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v.
        s += exp_fast(unsafe { *x.add(j) } - m);
        j += threads;
    }
    // SAFETY: as for the max: 32 floats of scratch, the whole block calls (the max's
    // closing barrier frees the scratch).
    let inv = 1.0 / unsafe { block_reduce_sum(s, scratch) };
    let mut j = tid;
    while j < vp {
        // SAFETY: j < vp.
        unsafe { *y.add(j) = if j < v { exp_fast(*x.add(j) - m) * inv } else { 0.0 } };
        j += threads;
    }
}

/// Baseline: one thread per row, three serial passes.
///
/// # Safety
/// Buffers as documented on [`SoftmaxParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_forward_naive(p: SoftmaxParams) {
    let row = global_idx_x();
    if row >= p.n {
        return;
    }
    let (v, vp) = (p.v as usize, p.vp as usize);
    // SAFETY: row < n; every index below is < vp.
    unsafe {
        let (x, y) = (p.logits.add(row as usize * vp), p.probs.add(row as usize * vp));
        let mut m = f32::NEG_INFINITY;
        for j in 0..v {
            m = m.max(*x.add(j));
        }
        let mut s = 0.0f32;
        for j in 0..v {
            s += exp_fast(*x.add(j) - m);
        }
        for j in 0..vp {
            *y.add(j) = if j < v { exp_fast(*x.add(j) - m) / s } else { 0.0 };
        }
    }
}
