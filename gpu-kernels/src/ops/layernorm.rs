//! Layernorm over rows of `c` channels.

use super::vec4::{VEC, aligned16, load4, store4};
use crate::device::math::rsqrt_precise;
use crate::device::mma::to_tf32;
use crate::device::warp::warp_reduce_sum;
use crate::device::{WARP_SIZE, block_dim_x, block_idx_x, global_idx_x, lane_id, warp_id};
use crate::params::layernorm::{LAYERNORM_EPS, LayernormParams};

/// True when every pointer is 16-byte aligned and rows are whole vectors, so
/// 16-byte loads of every row stay aligned.
#[inline(always)]
fn vectorisable(p: &LayernormParams) -> bool {
    p.c as usize % VEC == 0 && aligned16(p.out) && aligned16(p.inp) && aligned16(p.weight) && aligned16(p.bias)
}

/// One warp per row. Two passes over the row (mean, then the mean of squared
/// deviations) instead of E[x²] − E[x]², which cancels badly when |mean| is
/// large next to the spread; the re-reads hit L1.
///
/// # Safety
/// Buffers as documented on [`LayernormParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn layernorm_forward(p: LayernormParams) {
    let row = block_idx_x() * (block_dim_x() / WARP_SIZE) + warp_id();
    if row >= p.n {
        // Whole warps leave together, so the shuffles below see full warps.
        return;
    }
    let lane = lane_id() as usize;
    let c = p.c as usize;
    let lanes = WARP_SIZE as usize;
    // SAFETY: row < n, so the row's c floats are inside `inp`/`out`.
    let (x, y) = unsafe { (p.inp.add(row as usize * c), p.out.add(row as usize * c)) };
    let inv_c = 1.0 / p.c as f32;
    if vectorisable(&p) {
        let c4 = c / VEC;
        let mut sum = 0.0;
        let mut i = lane;
        while i < c4 {
            // SAFETY: i < c/4 within the row; aligned (checked above).
            let v = unsafe { load4(x.add(i * VEC)) };
            sum += (v[0] + v[1]) + (v[2] + v[3]);
            i += lanes;
        }
        let mean = warp_reduce_sum(sum) * inv_c;
        let mut var = 0.0;
        let mut i = lane;
        while i < c4 {
            // SAFETY: as above.
            let v = unsafe { load4(x.add(i * VEC)) };
            let d = [v[0] - mean, v[1] - mean, v[2] - mean, v[3] - mean];
            var += (d[0] * d[0] + d[1] * d[1]) + (d[2] * d[2] + d[3] * d[3]);
            i += lanes;
        }
        let rstd = rsqrt_precise(warp_reduce_sum(var) * inv_c + LAYERNORM_EPS);
        let mut i = lane;
        while i < c4 {
            // SAFETY: as above; weight and bias hold c floats.
            unsafe {
                let e = i * VEC;
                let (v, w, b) = (load4(x.add(e)), load4(p.weight.add(e)), load4(p.bias.add(e)));
                let mut o = [0.0; 4];
                for k in 0..VEC {
                    o[k] = rounded((v[k] - mean) * rstd * w[k] + b[k], p.round_tf32);
                }
                store4(y.add(e), o);
            }
            i += lanes;
        }
    } else {
        let mut sum = 0.0;
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            sum += unsafe { *x.add(i) };
            i += lanes;
        }
        let mean = warp_reduce_sum(sum) * inv_c;
        let mut var = 0.0;
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            let d = unsafe { *x.add(i) } - mean;
            var += d * d;
            i += lanes;
        }
        let rstd = rsqrt_precise(warp_reduce_sum(var) * inv_c + LAYERNORM_EPS);
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            unsafe {
                *y.add(i) = rounded(
                    (*x.add(i) - mean) * rstd * *p.weight.add(i) + *p.bias.add(i),
                    p.round_tf32,
                )
            };
            i += lanes;
        }
    }
}

/// Baseline: one thread per row, the same two passes.
///
/// # Safety
/// Buffers as documented on [`LayernormParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn layernorm_forward_naive(p: LayernormParams) {
    let row = global_idx_x();
    if row >= p.n {
        return;
    }
    let c = p.c as usize;
    // SAFETY: row < n.
    let (x, y) = unsafe { (p.inp.add(row as usize * c), p.out.add(row as usize * c)) };
    let mut sum = 0.0;
    for i in 0..c {
        // SAFETY: i < c.
        sum += unsafe { *x.add(i) };
    }
    let mean = sum / p.c as f32;
    let mut var = 0.0;
    for i in 0..c {
        // SAFETY: i < c.
        let d = unsafe { *x.add(i) } - mean;
        var += d * d;
    }
    let rstd = rsqrt_precise(var / p.c as f32 + LAYERNORM_EPS);
    for i in 0..c {
        // SAFETY: i < c.
        unsafe {
            *y.add(i) = rounded(
                (*x.add(i) - mean) * rstd * *p.weight.add(i) + *p.bias.add(i),
                p.round_tf32,
            )
        };
    }
}

/// `v`, rounded to TF32 when `round` is nonzero (`LayernormParams::round_tf32`).
#[inline(always)]
fn rounded(v: f32, round: u32) -> f32 {
    if round != 0 { f32::from_bits(to_tf32(v)) } else { v }
}
