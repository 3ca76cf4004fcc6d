//! Layernorm over rows of `c` channels.

use super::vec4::{VEC, add4, aligned16, load4, store4, sum_parts4};
use crate::device::Vec2;
use crate::device::bf16::f32_to_bf16;
use crate::device::math::rsqrt_precise;
use crate::device::mma::{pack_bf16x2, to_tf32};
use crate::device::unroll;
use crate::device::warp::{BLOCK_REDUCE_SCRATCH, block_reduce_sum, warp_reduce_sum};
use crate::device::{
    WARP_SIZE, block_dim_x, block_idx_x, dynamic_shared, global_idx_x, lane_id, thread_idx_x, warp_id,
};
use crate::params::layernorm::{
    LAYERNORM_EPS, LayernormParams, RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES, RESIDUAL_LAYERNORM_SPLIT_VEC,
    ResidualLayernormParams, ResidualLayernormSplitParams,
};

/// One row's buffers for [`layernorm_row`]. With `add` (the fused residual
/// kernel) the row is `inp1 + inp2`, written to `x` on the first pass and
/// read back from there; without it the row is read from `x`.
struct Row {
    /// The row to normalise (the residual output when fused).
    x: *mut f32,
    /// `(inp1, inp2)` whose sum is the row, when fused.
    add: Option<(*const f32, *const f32)>,
    out: Out,
    weight: *const f32,
    bias: *const f32,
}

/// Where a row's normalised values go (`LayernormParams::out_bf16`,
/// `round_tf32`): f32, maybe TF32-rounded, or bf16. The pointers are the
/// row's start.
#[derive(Clone, Copy)]
enum Out {
    F32 { out: *mut f32, round_tf32: bool },
    Bf16(*mut u16),
}

impl Out {
    /// The row's output: bf16 where `out_bf16` is set, else `out`.
    #[inline(always)]
    fn new(out: *mut f32, out_bf16: *mut u16, round_tf32: u32, at: usize) -> Out {
        if out_bf16.is_null() {
            Out::F32 {
                // SAFETY: `at` is the caller's row offset, inside `out` when it is the output.
                out: unsafe { out.add(at) },
                round_tf32: round_tf32 != 0,
            }
        } else {
            // SAFETY: `at` is the caller's row offset, inside `out_bf16` when it is the output.
            Out::Bf16(unsafe { out_bf16.add(at) })
        }
    }

    /// Whether 4-value stores at multiples of 4 are aligned (16 bytes of f32,
    /// 8 of bf16).
    #[inline(always)]
    fn aligned(self) -> bool {
        match self {
            Out::F32 { out, .. } => aligned16(out),
            Out::Bf16(out) => (out as usize).is_multiple_of(8),
        }
    }

    /// Element `i` is `v`.
    ///
    /// # Safety
    /// `i` is inside the row.
    #[inline(always)]
    unsafe fn put(self, i: usize, v: f32) {
        match self {
            // SAFETY: the caller keeps `i` inside the row this `out` points at.
            Out::F32 { out, round_tf32 } => unsafe {
                *out.add(i) = if round_tf32 { f32::from_bits(to_tf32(v)) } else { v }
            },
            // SAFETY: the caller keeps `i` inside the row this `out_bf16` points at.
            Out::Bf16(out) => unsafe { *out.add(i) = f32_to_bf16(v) },
        }
    }

    /// Elements `i..i + 4` are `v`, one store.
    ///
    /// # Safety
    /// `i + 4` is inside the row, `i` a multiple of 4, and [`Self::aligned`].
    #[inline(always)]
    unsafe fn put4(self, i: usize, v: [f32; VEC]) {
        match self {
            // SAFETY: `i + 4` is inside the row and `aligned()` held, so `out + i` is
            // 16-byte aligned (i is a multiple of 4).
            Out::F32 { out, round_tf32 } => unsafe {
                store4(
                    out.add(i),
                    if round_tf32 {
                        v.map(|x| f32::from_bits(to_tf32(x)))
                    } else {
                        v
                    },
                )
            },
            // SAFETY: `i + 4` is inside the row; `aligned()` gave 8-byte alignment and `i` is
            // a multiple of 4, so the `Vec2` (two bf16 pairs) store is aligned.
            Out::Bf16(out) => unsafe {
                *out.add(i).cast::<Vec2<u32>>() = Vec2([pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3])]);
            },
        }
    }
}

/// True when every pointer is 16-byte aligned and rows are whole vectors, so
/// 16-byte loads of every row stay aligned.
#[inline(always)]
fn vectorisable(r: &Row, c: usize) -> bool {
    let add_aligned = r.add.is_none_or(|(a, b)| aligned16(a) && aligned16(b));
    c.is_multiple_of(VEC)
        && aligned16(r.x)
        && r.out.aligned()
        && aligned16(r.weight)
        && aligned16(r.bias)
        && add_aligned
}

/// 16-byte vectors of a row that each lane holds in registers on the fast
/// path: rows of up to `ROW_VECS_PER_LANE * 32 * 4` = 1024 channels (GPT-2
/// small and medium; wider rows take the re-reading path). With the fused
/// add's second operand that is 64 registers of row data per lane.
const ROW_VECS_PER_LANE: usize = 8;

/// Layernorm of one row of `c` floats by one warp, two passes (mean, then
/// the mean of squared deviations) rather than E[x²] − E[x]², which cancels
/// badly when |mean| is large next to the spread.
///
/// Fast path (aligned, `c % 4 == 0`, `c <= 1024`): the lane's share of the
/// row is loaded into registers by loads issued back to back, none of whose
/// results is used before the last is issued (one memory round trip per row
/// instead of one per vector); both passes read the registers, and the
/// residual (when fused) is stored from them. Measured on an H200 it is as
/// fast as the re-reading loop, no faster (7.1 µs at 1024 rows, 28.8 µs at
/// 8192: launch cost and the weight/bias round trip remain; see
/// docs/performance.md). Otherwise the row is re-read from memory for each pass
/// (L1 hits, or, fused, what this lane wrote on the first pass).
///
/// # Safety
/// Every pointer of `r` is valid for `c` floats (weight, bias) or the row's
/// `c` floats; `x` and `out` do not overlap the inputs.
#[inline(always)]
unsafe fn layernorm_row(r: Row, c: usize) {
    let lane = lane_id() as usize;
    let lanes = WARP_SIZE as usize;
    let inv_c = 1.0 / c as f32;
    if vectorisable(&r, c) && c <= ROW_VECS_PER_LANE * lanes * VEC {
        let c4 = c / VEC;
        // Vector k of this lane is row vector lane + 32k (coalesced per k).
        let has = |k: usize| lane + k * lanes < c4;
        let at = |k: usize| (lane + k * lanes) * VEC;
        // The row (fused: the first addend) and the fused second addend.
        let mut v = [[0f32; VEC]; ROW_VECS_PER_LANE];
        let mut v2 = [[0f32; VEC]; ROW_VECS_PER_LANE];
        unroll!(k < ROW_VECS_PER_LANE => {
            if has(k) {
                // SAFETY: vector k is inside the row; aligned (checked above).
                unsafe {
                    match r.add {
                        Some((a, b)) => (v[k], v2[k]) = (load4(a.add(at(k))), load4(b.add(at(k)))),
                        None => v[k] = load4(r.x.add(at(k))),
                    }
                }
            }
        });
        let mut sum = 0.0;
        unroll!(k < ROW_VECS_PER_LANE => {
            if has(k) {
                if r.add.is_some() {
                    v[k] = [v[k][0] + v2[k][0], v[k][1] + v2[k][1], v[k][2] + v2[k][2], v[k][3] + v2[k][3]];
                    // SAFETY: as above.
                    unsafe { store4(r.x.add(at(k)), v[k]) };
                }
                sum += (v[k][0] + v[k][1]) + (v[k][2] + v[k][3]);
            }
        });
        let mean = warp_reduce_sum(sum) * inv_c;
        let mut var = 0.0;
        unroll!(k < ROW_VECS_PER_LANE => {
            if has(k) {
                let d = v[k].map(|e| e - mean);
                var += (d[0] * d[0] + d[1] * d[1]) + (d[2] * d[2] + d[3] * d[3]);
            }
        });
        let rstd = rsqrt_precise(warp_reduce_sum(var) * inv_c + LAYERNORM_EPS);
        unroll!(k < ROW_VECS_PER_LANE => {
            if has(k) {
                // SAFETY: as above; weight and bias hold c floats.
                unsafe {
                    let (w, b) = (load4(r.weight.add(at(k))), load4(r.bias.add(at(k))));
                    let mut o = [0.0; VEC];
                    for e in 0..VEC {
                        o[e] = (v[k][e] - mean) * rstd * w[e] + b[e];
                    }
                    r.out.put4(at(k), o);
                }
            }
        });
    } else if vectorisable(&r, c) {
        let c4 = c / VEC;
        let mut sum = 0.0;
        let mut i = lane;
        while i < c4 {
            let e = i * VEC;
            let v = match r.add {
                // SAFETY: i < c/4 within the row; aligned (checked above).
                Some((a, b)) => unsafe {
                    let (a, b) = (load4(a.add(e)), load4(b.add(e)));
                    let v = [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]];
                    store4(r.x.add(e), v);
                    v
                },
                // SAFETY: i < c/4 within the row; `x` aligned (checked in `vectorisable`).
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
                    o[k] = (v[k] - mean) * rstd * w[k] + b[k];
                }
                r.out.put4(e, o);
            }
            i += lanes;
        }
    } else {
        let mut sum = 0.0;
        let mut i = lane;
        while i < c {
            let v = match r.add {
                // SAFETY: i < c.
                Some((a, b)) => unsafe {
                    let v = *a.add(i) + *b.add(i);
                    *r.x.add(i) = v;
                    v
                },
                // SAFETY: i < c, inside the row.
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
            unsafe {
                r.out
                    .put(i, (*r.x.add(i) - mean) * rstd * *r.weight.add(i) + *r.bias.add(i))
            };
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

/// One warp per row (`layernorm_row`).
///
/// # Safety
/// Buffers as documented on [`LayernormParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn layernorm_forward(p: LayernormParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let Some(row) = warp_row(p.n) else { return };
    let c = p.c as usize;
    // SAFETY: row < n, so the row's c floats are inside `inp`/`out`; the
    // unfused row is only read through `x`.
    let r = unsafe {
        Row {
            x: p.inp.add(row * c).cast_mut(),
            add: None,
            out: Out::new(p.out, p.out_bf16, p.round_tf32, row * c),
            weight: p.weight,
            bias: p.bias,
        }
    };
    // SAFETY: `r` points at row `row` < n of buffers the launch contract sizes,
    // which is `layernorm_row`'s contract; `x` is only read.
    unsafe { layernorm_row(r, c) };
}

/// `residual = inp1 + inp2` and `out = layernorm(residual)`, one warp per
/// row (`layernorm_row`): one launch and one pass where a residual add and
/// the next layernorm took two.
///
/// # Safety
/// Buffers as documented on [`ResidualLayernormParams`]; `residual` and
/// `out` overlap neither each other nor the inputs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn residual_layernorm_forward(p: ResidualLayernormParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let Some(row) = warp_row(p.n) else { return };
    let c = p.c as usize;
    let at = row * c;
    // SAFETY: row < n, so the row's c floats are inside every [n * c] buffer.
    let r = unsafe {
        Row {
            x: p.residual.add(at),
            add: Some((p.inp1.add(at), p.inp2.add(at))),
            out: Out::new(p.out, p.out_bf16, p.round_tf32, at),
            weight: p.weight,
            bias: p.bias,
        }
    };
    // SAFETY: `r` points at row `row` < n of the launch's buffers; `residual` (x) is
    // a separate buffer from the inputs, as `layernorm_row` requires.
    unsafe { layernorm_row(r, c) };
}

/// `residual = inp1 + proj` and `out = layernorm(residual)`, where `proj` is
/// a split-K projection still in parts: `sum(partial[s]) + proj_bias`, the
/// parts added in split order as `matmul_split_reduce` adds them (so the
/// residual has the same bits as the two launches it replaces). One block a
/// row, one 16-byte vector a thread: every load a thread needs (its parts,
/// `inp1`, the weights) is issued before the first is used, so a row costs
/// about one memory round trip and two block reductions; a warp a row
/// (`residual_layernorm_forward`) would wait for its vectors one after
/// another, and the server's steps have few rows (64 rows: 64 warps).
///
/// # Safety
/// Launch and buffers as documented on [`ResidualLayernormSplitParams`];
/// `residual` and `out` overlap neither each other nor the inputs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn residual_layernorm_split_forward(p: ResidualLayernormSplitParams) {
    const V: usize = RESIDUAL_LAYERNORM_SPLIT_VEC as usize;
    const _: () = assert!(V == VEC && RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES as usize >= BLOCK_REDUCE_SCRATCH * 4);
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let row = block_idx_x();
    // The whole block leaves together (the reductions below have barriers).
    if row >= p.n {
        return;
    }
    let (c, splits) = (p.c as usize, p.splits as usize);
    let total = p.n as usize * c;
    let i = thread_idx_x() as usize * V;
    let mine = i < c;
    let at = row as usize * c + i;
    let mut x = [0.0; V];
    let (mut w, mut b) = ([0.0; V], [0.0; V]);
    if mine {
        // SAFETY: i + 4 <= c (c % 4 == 0), so every vector below is inside its
        // buffer's row (or `c`-float vector); 16-byte aligned (the contract).
        unsafe {
            let res = load4(p.inp1.add(at));
            (w, b) = (load4(p.weight.add(i)), load4(p.bias.add(i)));
            let pb = if p.proj_bias.is_null() {
                p.proj_bias
            } else {
                p.proj_bias.add(i)
            };
            let acc = sum_parts4(p.partial.add(at), total, splits, pb);
            x = add4(res, acc);
            store4(p.residual.add(at), x);
        }
    }
    // SAFETY: the launch gives RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES of dynamic shared
    // memory (at least BLOCK_REDUCE_SCRATCH floats), used by nothing else; the block is
    // whole warps, at most 1024 threads, and every thread gets here.
    let scratch = unsafe { dynamic_shared::<f32>() };
    let inv_c = 1.0 / c as f32;
    // SAFETY: as above.
    let mean = unsafe { block_reduce_sum((x[0] + x[1]) + (x[2] + x[3]), scratch) } * inv_c;
    let d = x.map(|e| e - mean);
    let var = if mine {
        (d[0] * d[0] + d[1] * d[1]) + (d[2] * d[2] + d[3] * d[3])
    } else {
        0.0
    };
    // SAFETY: as above.
    let rstd = rsqrt_precise(unsafe { block_reduce_sum(var, scratch) } * inv_c + LAYERNORM_EPS);
    if mine {
        let mut o = [0.0; V];
        for e in 0..V {
            o[e] = d[e] * rstd * w[e] + b[e];
        }
        let out = Out::new(p.out, p.out_bf16, p.round_tf32, row as usize * c);
        // SAFETY: i + 4 <= c inside the row; `out` (either format) is aligned (the
        // contract: 16-byte aligned pointers), i a multiple of 4.
        unsafe { out.put4(i, o) };
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
    let (x, y) = unsafe {
        (
            p.inp.add(row as usize * c),
            Out::new(p.out, p.out_bf16, p.round_tf32, row as usize * c),
        )
    };
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
        unsafe { y.put(i, (*x.add(i) - mean) * rstd * *p.weight.add(i) + *p.bias.add(i)) };
    }
}
