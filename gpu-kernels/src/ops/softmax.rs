//! Softmax over the real vocabulary of each row; padded columns get 0.

use crate::device::math::exp_fast;
use crate::device::warp::{block_reduce_max, block_reduce_sum};
use crate::device::{block_dim_x, block_idx_x, dynamic_shared, global_idx_x, thread_idx_x};
use crate::params::softmax::SoftmaxParams;

/// The max of a row's first `v` values and the sum of their exponentials
/// relative to it, `(m, sum_j exp(x[j] - m))`, every thread of the block
/// getting both: two strided passes with a block reduction after each.
///
/// # Safety
/// `x` holds `v` floats; called by every thread of the block (up to 1024)
/// with 32 floats of dynamic shared memory, which it uses as scratch.
#[inline(always)]
pub(crate) unsafe fn row_max_sum_exp(x: *const f32, v: usize) -> (f32, f32) {
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: the caller's launch provides 32 floats.
    let scratch = unsafe { dynamic_shared::<f32>() };
    let mut m = f32::NEG_INFINITY;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v.
        m = m.max(unsafe { *x.add(j) });
        j += threads;
    }
    // SAFETY: 32 floats of scratch, the whole block calls (the caller's contract).
    let m = unsafe { block_reduce_max(m, scratch) };
    let mut s = 0.0f32;
    let mut j = tid;
    while j < v {
        // SAFETY: j < v.
        s += exp_fast(unsafe { *x.add(j) } - m);
        j += threads;
    }
    // SAFETY: as for the max (its closing barrier frees the scratch).
    (m, unsafe { block_reduce_sum(s, scratch) })
}

/// One block per row: strided passes for the max, the sum of exponentials
/// and the normalised output, with block reductions (warp shuffles plus 32
/// floats of dynamic shared memory) in between.
///
/// # Safety
/// Buffers as documented on [`SoftmaxParams`]; 32 floats of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_forward(p: SoftmaxParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let row = block_idx_x();
    if row >= p.n {
        return;
    }
    let (v, vp) = (p.v as usize, p.vp as usize);
    let (tid, threads) = (thread_idx_x() as usize, block_dim_x() as usize);
    // SAFETY: row < n.
    let (x, y) = unsafe { (p.logits.add(row as usize * vp), p.probs.add(row as usize * vp)) };
    // SAFETY: the row holds v <= vp floats; the launch provides 32 floats of
    // shared memory and the whole block gets here (the early return is per block).
    let (m, s) = unsafe { row_max_sum_exp(x, v) };
    let inv = 1.0 / s;
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
