//! Layernorm over rows of `c` channels.

use super::vec4::{VEC, aligned16, load4, store4};
use crate::device::math::rsqrt_precise;
use crate::device::mma::to_tf32;
use crate::device::warp::warp_reduce_sum;
use crate::device::{WARP_SIZE, block_dim_x, block_idx_x, global_idx_x, lane_id, warp_id};
use crate::params::layernorm::{LAYERNORM_EPS, LayernormParams, ResidualLayernormParams};

/// One row's buffers for [`layernorm_row`]. With `add` (the fused residual
/// kernel) the row is `inp1 + inp2`, written to `x` on the first pass and
/// read back from there; without it the row is read from `x`.
struct Row {
    /// The row to normalise (the residual output when fused).
    x: *mut f32,
    /// `(inp1, inp2)` whose sum is the row, when fused.
    add: Option<(*const f32, *const f32)>,
    out: *mut f32,
    weight: *const f32,
    bias: *const f32,
}

/// True when every pointer is 16-byte aligned and rows are whole vectors, so
/// 16-byte loads of every row stay aligned.
#[inline(always)]
fn vectorisable(r: &Row, c: usize) -> bool {
    let add_aligned = r.add.is_none_or(|(a, b)| aligned16(a) && aligned16(b));
    c % VEC == 0 && aligned16(r.x) && aligned16(r.out) && aligned16(r.weight) && aligned16(r.bias) && add_aligned
}

/// Layernorm of one row of `c` floats by one warp. Two passes over the row
/// (mean, then the mean of squared deviations) instead of E[x²] − E[x]²,
/// which cancels badly when |mean| is large next to the spread; the re-reads
/// hit L1 (or, fused, read back what this same lane wrote on the first pass).
///
/// # Safety
/// Every pointer of `r` is valid for `c` floats (weight, bias) or the row's
/// `c` floats; `x` and `out` do not overlap the inputs.
#[inline(always)]
unsafe fn layernorm_row(r: Row, c: usize, round: u32) {
    let lane = lane_id() as usize;
    let lanes = WARP_SIZE as usize;
    let inv_c = 1.0 / c as f32;
    if vectorisable(&r, c) {
        let c4 = c / VEC;
        let mut sum = 0.0;
        let mut i = lane;
        while i < c4 {
            let e = i * VEC;
            // SAFETY: i < c/4 within the row; aligned (checked above).
            let v = match r.add {
                Some((a, b)) => unsafe {
                    let (a, b) = (load4(a.add(e)), load4(b.add(e)));
                    let v = [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]];
                    store4(r.x.add(e), v);
                    v
                },
                None => unsafe { load4(r.x.add(e)) },
            };
            sum += (v[0] + v[1]) + (v[2] + v[3]);
            i += lanes;
        }
        let mean = warp_reduce_sum(sum) * inv_c;
        let mut var = 0.0;
        let mut i = lane;
        while i < c4 {
            // SAFETY: as above (this lane's own elements: its writes are visible to it).
            let v = unsafe { load4(r.x.add(i * VEC)) };
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
                let (v, w, b) = (load4(r.x.add(e)), load4(r.weight.add(e)), load4(r.bias.add(e)));
                let mut o = [0.0; 4];
                for k in 0..VEC {
                    o[k] = rounded((v[k] - mean) * rstd * w[k] + b[k], round);
                }
                store4(r.out.add(e), o);
            }
            i += lanes;
        }
    } else {
        let mut sum = 0.0;
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            let v = match r.add {
                Some((a, b)) => unsafe {
                    let v = *a.add(i) + *b.add(i);
                    *r.x.add(i) = v;
                    v
                },
                None => unsafe { *r.x.add(i) },
            };
            sum += v;
            i += lanes;
        }
        let mean = warp_reduce_sum(sum) * inv_c;
        let mut var = 0.0;
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            let d = unsafe { *r.x.add(i) } - mean;
            var += d * d;
            i += lanes;
        }
        let rstd = rsqrt_precise(warp_reduce_sum(var) * inv_c + LAYERNORM_EPS);
        let mut i = lane;
        while i < c {
            // SAFETY: i < c.
            unsafe { *r.out.add(i) = rounded((*r.x.add(i) - mean) * rstd * *r.weight.add(i) + *r.bias.add(i), round) };
            i += lanes;
        }
    }
}

/// The warp's row, or `None` past the last one (whole warps leave together,
/// so the shuffles of [`layernorm_row`] see full warps).
#[inline(always)]
fn warp_row(n: u32) -> Option<usize> {
    let row = block_idx_x() * (block_dim_x() / WARP_SIZE) + warp_id();
    (row < n).then_some(row as usize)
}

/// One warp per row ([`layernorm_row`]).
///
/// # Safety
/// Buffers as documented on [`LayernormParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn layernorm_forward(p: LayernormParams) {
    let Some(row) = warp_row(p.n) else { return };
    let c = p.c as usize;
    // SAFETY: row < n, so the row's c floats are inside `inp`/`out`; the
    // unfused row is only read through `x`.
    let r = unsafe {
        Row {
            x: p.inp.add(row * c).cast_mut(),
            add: None,
            out: p.out.add(row * c),
            weight: p.weight,
            bias: p.bias,
        }
    };
    unsafe { layernorm_row(r, c, p.round_tf32) };
}

/// `residual = inp1 + inp2` and `out = layernorm(residual)`, one warp per
/// row ([`layernorm_row`]): one launch and one pass where a residual add and
/// the next layernorm took two.
///
/// # Safety
/// Buffers as documented on [`ResidualLayernormParams`]; `residual` and
/// `out` overlap neither each other nor the inputs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn residual_layernorm_forward(p: ResidualLayernormParams) {
    let Some(row) = warp_row(p.n) else { return };
    let c = p.c as usize;
    let at = row * c;
    // SAFETY: row < n, so the row's c floats are inside every [n * c] buffer.
    let r = unsafe {
        Row {
            x: p.residual.add(at),
            add: Some((p.inp1.add(at), p.inp2.add(at))),
            out: p.out.add(at),
            weight: p.weight,
            bias: p.bias,
        }
    };
    unsafe { layernorm_row(r, c, p.round_tf32) };
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
