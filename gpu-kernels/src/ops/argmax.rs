//! Greedy decoding on the device: one id per row comes back to the host.

use crate::device::warp::{shfl_xor_f32, shfl_xor_u32};
use crate::device::{
    WARP_SIZE, block_dim_x, block_idx_x, dynamic_shared, lane_id, sync_threads, thread_idx_x, warp_id,
};
use crate::params::argmax::ArgmaxParams;

/// "No candidate yet": larger than any index, so real candidates win ties.
const NONE: u32 = u32::MAX;

/// Whether candidate `(v2, i2)` beats `(v1, i1)`: larger value, or equal
/// value and lower index (NaN logits never win).
#[inline(always)]
fn better(v2: f32, i2: u32, v1: f32, i1: u32) -> bool {
    i2 != NONE && (i1 == NONE || v2 > v1 || (v2 == v1 && i2 < i1))
}

/// Warp-wide best candidate, every lane gets it.
#[inline(always)]
fn warp_best(mut v: f32, mut i: u32) -> (f32, u32) {
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        let (v2, i2) = (shfl_xor_f32(v, m), shfl_xor_u32(i, m));
        if better(v2, i2, v, i) {
            (v, i) = (v2, i2);
        }
        m /= 2;
    }
    (v, i)
}

/// One block per row: each thread scans a strided share of `0..v`, then warp
/// and block (value, index) reductions.
///
/// # Safety
/// Buffers as documented on [`ArgmaxParams`]; `2 * 32` words of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn argmax_forward(p: ArgmaxParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let row = block_idx_x();
    if row >= p.n {
        return;
    }
    // SAFETY: row < n.
    let x = unsafe { p.logits.add(row as usize * p.row_stride as usize) };
    let (mut best_v, mut best_i) = (f32::NEG_INFINITY, NONE);
    let mut j = thread_idx_x();
    while j < p.v {
        // SAFETY: j < v.
        let v = unsafe { *x.add(j as usize) };
        if !v.is_nan() && better(v, j, best_v, best_i) {
            (best_v, best_i) = (v, j);
        }
        j += block_dim_x();
    }
    let (v, i) = warp_best(best_v, best_i);
    // SAFETY: the launch provides 64 words: values then indices.
    let (vals, idxs) = unsafe {
        let s = dynamic_shared::<f32>();
        (s, s.add(WARP_SIZE as usize) as *mut u32)
    };
    let (w, lane) = (warp_id(), lane_id());
    if lane == 0 {
        // SAFETY: w < 32.
        unsafe {
            *vals.add(w as usize) = v;
            *idxs.add(w as usize) = i;
        }
    }
    sync_threads();
    if w == 0 {
        let warps = block_dim_x() / WARP_SIZE;
        let (v, i) = if lane < warps {
            // SAFETY: lane < warps <= 32: slots that warps 0..warps wrote before the barrier.
            unsafe { (*vals.add(lane as usize), *idxs.add(lane as usize)) }
        } else {
            (f32::NEG_INFINITY, NONE)
        };
        let (v, i) = warp_best(v, i);
        if lane == 0 {
            // All-NaN rows (never in a sane model) report 0 rather than garbage.
            // SAFETY: row < n.
            unsafe { *p.out.add(row as usize) = if i == NONE { 0 } else { i } };
            if !p.values.is_null() {
                // SAFETY: row < n; values holds n entries when not null.
                unsafe { *p.values.add(row as usize) = v };
            }
        }
    }
}
