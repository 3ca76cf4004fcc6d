//! The decode step's fused kernels (contract: `params::decode`).
//!
//! `decode_gemv`: a group of `k_warps` warps owns one output column at a
//! time, each warp one chunk of [`DECODE_GEMV_CHUNK`] floats of its weight
//! row, 8 16-byte loads per lane all in flight at once; the groups stride
//! over the columns, issuing the next column's loads before they reduce and
//! store the current one. Few registers (one chunk, no double buffer) keep
//! many warps resident, which is what keeps enough bytes in flight: for
//! GPT-2's projections the whole matrix is requested at kernel start. The
//! input rows, after the prologue, sit in shared memory, so the weight is
//! the only stream from HBM. The first chunk is loaded before
//! [`grid_dependency_wait`]: under programmatic dependent launch those loads
//! overlap the previous kernel's tail (weights are never written by a kernel).
//!
//! `decode_attention`: flash-decoding as `ops::flash_attention`'s decode
//! kernel (8 lanes share a key, 8 keys per lane group, online softmax merged
//! by shuffles), with the position read from the device and the combine done
//! by the chunk block that arrives last.

use super::flash_attention::decode::{decode_query, key_lanes_sum, key_score_part, merge_state};
use super::flash_attention::softmax_base;
use super::gelu::gelu;
use super::vec4::{VEC, load_cg, load4, store4};
use super::weight::Weight;
use crate::device::F32Storage;
use crate::device::math::{exp2_approx, fma, rsqrt_precise};
use crate::device::mma::{mma_m16n8k8_tf32, mma_m16n8k16_bf16, pack_bf16x2, split_tf32};
use crate::device::shared::dynamic_shared_align16;
use crate::device::warp::{shfl_xor_f32, shfl_xor_u32, warp_reduce_sum, warp_reduce_sum_many};
use crate::device::{UNROLL_MAX, unroll};
use crate::device::{
    WARP_SIZE, atomic_add_acq_rel_u32, block_dim_x, block_idx_x, block_idx_y, block_idx_z, grid_dependency_wait,
    grid_dim_x, grid_dim_y, grid_dim_z, lane_id, launch_dependents, prefetch_l2_slice, sync_threads, sync_threads_or,
    thread_fence, thread_idx_x, warp_id,
};
use crate::params::decode::*;
use crate::params::layernorm::LAYERNORM_EPS;

const ROWS: usize = DECODE_MAX_ROWS as usize;
const LOADS: usize = DECODE_GEMV_LOADS as usize;
const LANES: usize = WARP_SIZE as usize;
const _: () = assert!(DECODE_GEMV_CHUNK as usize == LANES * LOADS * <f32 as Weight>::PER_LOAD);
const _: () = assert!(DECODE_GEMV_CHUNK_BF16 as usize == LANES * LOADS * <u16 as Weight>::PER_LOAD);

/// Elements of a weight row one warp covers (`DECODE_GEMV_CHUNK` for f32,
/// `DECODE_GEMV_CHUNK_BF16` for bf16): 16 bytes per lane per load.
const fn chunk_elems<W: Weight>() -> usize {
    LANES * LOADS * W::PER_LOAD
}

/// One chunk of a weight row, raw: lane `l` holds the 16 bytes at element
/// `k0 + (j*32 + l) * PER_LOAD` for `j < LOADS`, so each load instruction of
/// a warp reads 512 consecutive bytes.
type Chunk = [[u32; 4]; LOADS];

/// Ask L2 for this block's share (`block` of `blocks`) of every range.
///
/// # Safety
/// Each range is as `PrefetchRange` says: readable, aligned, or empty.
#[inline(always)]
unsafe fn prefetch_ranges(ranges: &[PrefetchRange; DECODE_PREFETCH_RANGES], block: usize, blocks: usize) {
    for r in ranges {
        if r.bytes > 0 {
            // SAFETY: the caller's contract.
            unsafe { prefetch_l2_slice(r.ptr, r.bytes as usize, block, blocks) };
        }
    }
}

/// Load the chunk of `row` (a weight row of `c` elements) that starts at
/// `k0`; elements at or past `c` are never read (their slots stay 0).
///
/// # Safety
/// `row` holds `c` elements and is 16-byte aligned; `c % W::PER_LOAD == 0`.
#[inline(always)]
unsafe fn load_chunk<W: Weight>(row: *const W, k0: usize, c: usize, lane: usize) -> Chunk {
    let mut w = [[0u32; 4]; LOADS];
    unroll!(j < LOADS => {
        let k = k0 + (j * LANES + lane) * W::PER_LOAD;
        if k < c {
            // SAFETY: k + PER_LOAD <= c, aligned.
            w[j] = unsafe { W::load_raw(row, k) };
        }
    });
    w
}

/// `acc[r] += Σ w · x[r]` over this lane's part of the chunk at `k0`, for
/// rows `r < n` of the staged input `xs` (`[n][c]` in shared memory).
///
/// # Safety
/// `xs` holds `n * c` floats, 16-byte aligned; `c % W::PER_LOAD == 0`;
/// `n <= R`.
#[inline(always)]
unsafe fn dot_chunk<W: Weight, const R: usize>(
    acc: &mut [f32; R],
    w: &Chunk,
    xs: *const f32,
    k0: usize,
    c: usize,
    n: usize,
    lane: usize,
) {
    unroll!(j < LOADS => {
        let k = k0 + (j * LANES + lane) * W::PER_LOAD;
        if k < c {
            let wj = &w[j];
            unroll!(r < R => {
                if r < n {
                    // Four elements per 16-byte read of the staged row.
                    unroll!(q < W::PER_LOAD / VEC => {
                        // SAFETY: r < n, k + PER_LOAD <= c.
                        let x = unsafe { load4(xs.add(r * c + k + q * VEC)) };
                        let e = q * VEC;
                        acc[r] = fma(
                            x[0],
                            W::value(wj, e),
                            fma(x[1], W::value(wj, e + 1), fma(x[2], W::value(wj, e + 2), fma(x[3], W::value(wj, e + 3), acc[r]))),
                        );
                    });
                }
            });
        }
    });
}

/// 16-byte vectors each thread loads before it stores any while staging
/// the input rows: a batch's loads are in flight together, so staging one
/// row of 3072 floats with 192 threads costs one memory round trip instead
/// of four (8 rows: 8 instead of 32). Larger batches raise the kernels'
/// registers past 128, which halves the resident blocks.
const STAGE_BATCH: usize = 4;
const _: () = assert!(STAGE_BATCH <= UNROLL_MAX);

/// Stage `n` rows of `c` floats (`c % 4 == 0`) by the block's threads, one
/// 16-byte vector at a time, [`STAGE_BATCH`] vectors per thread in flight:
/// `load(r, k)` gives the 4 floats of row `r` from column `k`, then
/// `store(r, k, v)` puts them where they go. Indices in 32 bits (64-bit
/// division is a long software sequence on the GPU; sizes fit).
#[inline(always)]
pub(crate) fn stage_vectors(
    n: usize,
    c: usize,
    load: impl Fn(usize, usize) -> [f32; VEC],
    store: impl Fn(usize, usize, [f32; VEC]),
) {
    let c4 = (c / VEC) as u32;
    let total = n * c4 as usize;
    let stride = block_dim_x() as usize;
    let at = |i: usize| (((i as u32) / c4) as usize, ((i as u32) % c4) as usize * VEC);
    let mut base = thread_idx_x() as usize;
    while base < total {
        let mut x = [[0.0f32; VEC]; STAGE_BATCH];
        unroll!(u < STAGE_BATCH => {
            let i = base + u * stride;
            if i < total {
                let (r, k) = at(i);
                x[u] = load(r, k);
            }
        });
        unroll!(u < STAGE_BATCH => {
            let i = base + u * stride;
            if i < total {
                let (r, k) = at(i);
                store(r, k, x[u]);
            }
        });
        base += STAGE_BATCH * stride;
    }
}

/// Fill the shared rows `xs[r][0..c]` for `r < n`: the embedding
/// (`tokens` non-null; block 0 also writes it to `embed_out`) or the input
/// rows (see [`stage_vectors`]).
///
/// # Safety
/// `params::decode::DecodeGemvParams`' contract; `xs` holds `n * c` floats.
#[inline(always)]
unsafe fn stage_rows<W: Weight>(p: &DecodeGemvParams<W>, xs: *mut f32, n: usize, c: usize) {
    let embed = !p.tokens.is_null();
    // Rows that go straight into the product are rounded as the matmul
    // multiplies them (bf16 weights: to bf16); with a layernorm, its output
    // is rounded instead (`layernorm_rows`). The residual stream stays f32.
    let round = p.ln_weight.is_null();
    stage_vectors(
        n,
        c,
        // SAFETY: (both) r < n, k + 4 <= c; token and position clamped into
        // the tables; embed_out and xs hold n * c floats.
        |r, k| unsafe {
            if embed {
                let tok = (*p.tokens.add(r)).min(p.vocab - 1) as usize;
                let pos = (*p.pos.add(r)).min(p.max_pos - 1) as usize;
                let (a, b) = (W::load4_f32(p.wte, tok * c + k), load4(p.wpe.add(pos * c + k)));
                [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
            } else {
                load4(p.inp.add(r * c + k))
            }
        },
        // SAFETY: r < n, k + 4 <= c: embed_out and xs hold n * c floats, 16-byte aligned.
        |r, k, x| unsafe {
            if embed && block_idx_x() == 0 {
                store4(p.embed_out.add(r * c + k), x);
            }
            store4(xs.add(r * c + k), if round { x.map(W::round_input) } else { x });
        },
    );
}

/// Copy the layernorm's weight and bias (`c` floats each) to shared memory.
/// Called before [`grid_dependency_wait`]: weights only, so under PDL the
/// loads overlap the previous kernel.
///
/// # Safety
/// `ln_weight`/`ln_bias` hold `c` floats (16-byte aligned); `dst` holds `2 * c`.
#[inline(always)]
unsafe fn stage_ln_params<W>(p: &DecodeGemvParams<W>, dst: *mut f32, c: usize) {
    let mut k = thread_idx_x() as usize * VEC;
    let step = block_dim_x() as usize * VEC;
    while k < c {
        // SAFETY: k + 4 <= c (c % 4 == 0).
        unsafe {
            store4(dst.add(k), load4(p.ln_weight.add(k)));
            store4(dst.add(c + k), load4(p.ln_bias.add(k)));
        }
        k += step;
    }
}

/// Layernorm each staged row in place: warp `r` finds row `r`'s mean and
/// rstd (two passes over shared memory: mean, then the biased variance
/// around it), then every thread normalises its vectors of every row with
/// the weight and bias staged in `lnp` (`[2][c]`), rounded as a matmul over
/// `W` weights multiplies them. `stats` holds `2 * n`.
///
/// Each pass loads 4 floats at a time into 4 accumulators, so a lane's
/// loads are all in flight at once and its adds form 4 short chains; the
/// normalising pass walks the rows by vectors without dividing. (The scalar
/// version, one accumulator and a 32-bit division per element, took ~2.4
/// µs at 8 rows of 768 on an H100; see docs/performance.md, decode step
/// 17.)
///
/// # Safety
/// `xs` holds `n * c` staged floats, 16-byte aligned, `c % 4 == 0`;
/// `lnp` (16-byte aligned) and `stats` as said; every thread of the block
/// calls this (it has a barrier; the normalised rows are not yet
/// published: the caller's barrier does that).
#[inline(always)]
pub(crate) unsafe fn layernorm_rows<W: Weight>(xs: *mut f32, lnp: *const f32, stats: *mut f32, n: usize, c: usize) {
    let lane_k = lane_id() as usize * VEC;
    let warps = (block_dim_x() / WARP_SIZE) as usize;
    let inv_c = 1.0 / c as f32;
    let mut r = warp_id() as usize;
    while r < n {
        // SAFETY: (loop) row r < n of xs, 16-byte aligned (c % 4 == 0).
        let row = unsafe { xs.add(r * c) };
        let mut sum = [0.0f32; VEC];
        let mut k = lane_k;
        while k < c {
            // SAFETY: k + 4 <= c: inside row r.
            let v = unsafe { load4(row.add(k)) };
            for i in 0..VEC {
                sum[i] += v[i];
            }
            k += LANES * VEC;
        }
        let mean = warp_reduce_sum((sum[0] + sum[1]) + (sum[2] + sum[3])) * inv_c;
        let mut var = [0.0f32; VEC];
        k = lane_k;
        while k < c {
            // SAFETY: k + 4 <= c: inside row r.
            let v = unsafe { load4(row.add(k)) };
            for i in 0..VEC {
                let d = v[i] - mean;
                var[i] = fma(d, d, var[i]);
            }
            k += LANES * VEC;
        }
        let rstd = rsqrt_precise(warp_reduce_sum((var[0] + var[1]) + (var[2] + var[3])) * inv_c + LAYERNORM_EPS);
        if lane_id() == 0 {
            // SAFETY: r < n.
            unsafe {
                *stats.add(2 * r) = mean;
                *stats.add(2 * r + 1) = rstd;
            }
        }
        r += warps;
    }
    sync_threads();
    // Vector `v` of the rows is row r, columns k..k + 4; (r, k) advance
    // by the block's stride without a division per vector.
    let step = block_dim_x() as usize * VEC;
    let (mut r, mut k) = (0, thread_idx_x() as usize * VEC);
    while k >= c {
        k -= c;
        r += 1;
    }
    while r < n {
        // SAFETY: r < n, k + 4 <= c: inside row r; `lnp` holds c weights,
        // then c biases, 16-byte aligned; `stats` 2n floats.
        unsafe {
            let (mean, rstd) = (*stats.add(2 * r), *stats.add(2 * r + 1));
            let x = load4(xs.add(r * c + k));
            let (w, b) = (load4(lnp.add(k)), load4(lnp.add(c + k)));
            let mut y = [0.0f32; VEC];
            for i in 0..VEC {
                y[i] = W::round_input(fma((x[i] - mean) * rstd, w[i], b[i]));
            }
            store4(xs.add(r * c + k), y);
        }
        k += step;
        while k >= c {
            k -= c;
            r += 1;
        }
    }
}

/// Where output value `v` of row `r`, column `col` goes: `out` (after the
/// residual), or with the qkv epilogue q / the K and V caches.
///
/// # Safety
/// The params' contract; `r < n`, `col < oc`.
#[inline(always)]
unsafe fn store_out<W: F32Storage>(p: &DecodeGemvParams<W>, r: usize, col: usize, v: f32) {
    let oc = p.oc as usize;
    // SAFETY: the caller's r < n and col < oc, with buffers as the params' contract
    // sizes them (output, residual, cache rows).
    unsafe {
        if p.k_cache.is_null() {
            let v = if p.residual.is_null() {
                v
            } else {
                v + *p.residual.add(r * oc + col)
            };
            *p.out.add(r * oc + col) = v;
            return;
        }
        let c = oc / 3;
        if col < c {
            *p.out.add(r * c + col) = v;
            return;
        }
        let pos = *p.pos.add(r);
        if pos >= p.max_t {
            return;
        }
        let (cache, cc) = if col < 2 * c {
            (p.k_cache, col - c)
        } else {
            (p.v_cache, col - 2 * c)
        };
        let nh = p.nh as usize;
        let hs = c / nh;
        let (h, d) = (cc / hs, cc % hs);
        W::store1(cache.add(((r * nh + h) * p.max_t as usize + pos as usize) * hs + d), v);
    }
}

/// Where the greedy epilogue's end writes (see [`argmax_finish`]).
pub(crate) struct ArgmaxOut {
    /// `[gridDim.x * n]` each: the per-block bests.
    pub part_val: *mut f32,
    pub part_idx: *mut u32,
    /// Arrivals, zero between launches; reset by the last block.
    pub counter: *mut u32,
    /// `[n]` each: the chosen ids, the next step's tokens, the positions.
    pub ids: *mut u32,
    pub tokens_next: *mut u32,
    pub pos_next: *mut u32,
}

/// The greedy epilogue's end: each block's best (value, column) per row goes
/// to the partial buffers; the last block to arrive reduces them, writes the
/// ids and advances the step state, resets the counter, and returns true
/// (to every thread of that block).
///
/// `best` is this lane's (value, column) for row `lane` (lanes `< n`) over
/// its warp's columns.
///
/// # Safety
/// `out` as [`ArgmaxOut`] says; `scratch` holds one (value, index) pair
/// per (warp, row): `warps * DECODE_MAX_ROWS * 8` bytes of shared memory,
/// 8-byte aligned; every thread of the block calls this.
#[inline(always)]
pub(crate) unsafe fn argmax_finish(out: &ArgmaxOut, best: (f32, u32), scratch: *mut u32, n: usize) -> bool {
    let lane = lane_id() as usize;
    let warp = warp_id() as usize;
    let warps = (block_dim_x() / WARP_SIZE) as usize;
    // SAFETY: the caller's scratch holds the value half (warps * ROWS words), then
    // the index half this offset starts.
    let (sv, si) = (scratch as *mut f32, unsafe { scratch.add(warps * ROWS) });
    if lane < n {
        // SAFETY: warp < warps, lane < ROWS.
        unsafe {
            *sv.add(warp * ROWS + lane) = best.0;
            *si.add(warp * ROWS + lane) = best.1;
        }
    }
    sync_threads();
    let block = block_idx_x() as usize;
    if warp == 0 && lane < n {
        let mut b = (f32::NEG_INFINITY, u32::MAX);
        for w in 0..warps {
            // SAFETY: as above.
            let (v, i) = unsafe { (*sv.add(w * ROWS + lane), *si.add(w * ROWS + lane)) };
            b = better(b, (v, i));
        }
        // SAFETY: part buffers hold gridDim.x * n entries.
        unsafe {
            *out.part_val.add(block * n + lane) = b.0;
            *out.part_idx.add(block * n + lane) = b.1;
        }
        thread_fence();
    }
    // Every lane's part written and fenced before thread 0 arrives:
    // `sync_threads_or` evaluates its argument (the arrival) before it
    // synchronises, and lanes of a warp are not ordered without a barrier.
    sync_threads();
    let arrived_last = sync_threads_or(
        thread_idx_x() == 0
            // SAFETY: counter is a live u32, zero between launches.
            && unsafe { atomic_add_acq_rel_u32(out.counter, 1) } == grid_dim_x() - 1,
    );
    if !arrived_last {
        return false;
    }
    thread_fence();
    if warp == 0 && lane < n {
        let mut b = (f32::NEG_INFINITY, u32::MAX);
        for blk in 0..grid_dim_x() as usize {
            // SAFETY: written by every block before its arrival; volatile
            // reads skip L1, which never held these lines anyway.
            let (v, i) = unsafe {
                (
                    core::ptr::read_volatile(out.part_val.add(blk * n + lane)),
                    core::ptr::read_volatile(out.part_idx.add(blk * n + lane)),
                )
            };
            b = better(b, (v, i));
        }
        // Every row has a finite or -inf winner unless every logit was NaN:
        // then id 0, a valid token.
        let id = if b.1 == u32::MAX { 0 } else { b.1 };
        // SAFETY: ids, tokens_next, pos_next hold n entries.
        unsafe {
            *out.ids.add(lane) = id;
            *out.tokens_next.add(lane) = id;
            *out.pos_next.add(lane) += 1;
        }
    }
    if thread_idx_x() == 0 {
        // SAFETY: as above; no block touches the counter any more.
        unsafe { *out.counter = 0 };
    }
    true
}

/// The better of two (value, id) candidates: larger value, then lower id;
/// NaN never wins (id `u32::MAX` marks "none yet").
#[inline(always)]
pub(crate) fn better(a: (f32, u32), b: (f32, u32)) -> (f32, u32) {
    if b.1 == u32::MAX || b.0.is_nan() {
        return a;
    }
    if a.1 == u32::MAX || b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
        b
    } else {
        a
    }
}

/// What both GEMV kernels do between their first weight loads and their
/// tiles: stage the layernorm's parameters, prefetch later weights (unless
/// late), wait for the previous kernel under PDL (and trigger the next),
/// stage the input rows in `xs`, layernorm them. Ends with a block barrier.
///
/// # Safety
/// The params' contract; `xs` holds `n * c` floats and `lnp` (with a
/// layernorm) `2c + 2n` of shared memory; every thread of the block calls it.
#[inline(always)]
unsafe fn gemv_prologue<W: Weight>(p: &DecodeGemvParams<W>, xs: *mut f32, lnp: *mut f32, n: usize, c: usize) {
    let ln = !p.ln_weight.is_null();
    if ln {
        // SAFETY: with a layernorm, the params give `ln_weight`/`ln_bias` c floats each,
        // and the caller's `lnp` holds 2 * c.
        unsafe { stage_ln_params(p, lnp, c) };
    }
    if p.prefetch_late == 0 {
        // SAFETY: the params' contract (later kernels' weights).
        unsafe { prefetch_ranges(&p.prefetch, block_idx_x() as usize, grid_dim_x() as usize) };
    }
    grid_dependency_wait();
    if p.early_trigger == 0 {
        launch_dependents();
    }
    // SAFETY: the params' contract, and the caller's `xs` holds n * c floats.
    unsafe { stage_rows(p, xs, n, c) };
    sync_threads();
    if ln {
        // SAFETY: the staged rows are published (barrier above); `lnp` holds 2c floats of
        // parameters, then 2n of statistics; every thread calls this.
        unsafe { layernorm_rows::<W>(xs, lnp, lnp.add(2 * c), n, c) };
        sync_threads();
    }
}

/// Column `col` of row `r` is `sum`: the bias, GELU and the output's
/// epilogue ([`store_out`]); a greedy launch's `best` of row `r` follows it
/// over the vocabulary's columns.
///
/// # Safety
/// The params' contract; `r < n`, `col < oc`.
#[inline(always)]
unsafe fn finish_column<W: F32Storage>(p: &DecodeGemvParams<W>, r: usize, col: usize, sum: f32, best: &mut (f32, u32)) {
    let mut v = sum;
    if !p.bias.is_null() {
        // SAFETY: col < oc.
        v += unsafe { *p.bias.add(col) };
    }
    if p.gelu != 0 {
        v = gelu(v);
    }
    // SAFETY: r < n, col < oc.
    unsafe { store_out(p, r, col, v) };
    if !p.ids.is_null() && col < p.v as usize {
        *best = better(*best, (v, col as u32));
    }
}

impl ArgmaxOut {
    /// The greedy end's buffers of a GEMV launch.
    fn of<W>(p: &DecodeGemvParams<W>) -> ArgmaxOut {
        ArgmaxOut {
            part_val: p.part_val,
            part_idx: p.part_idx,
            counter: p.counter,
            ids: p.ids,
            tokens_next: p.tokens_next,
            pos_next: p.pos_next,
        }
    }
}

/// The decode GEMV for up to `R` rows (see the module docs and
/// `DecodeGemvParams`): one accumulator per row in registers, so the
/// batch-1 kernel holds few registers and many warps fit on an SM.
///
/// # Safety
/// `DecodeGemvParams`' contract, with the launch it describes; `n <= R`.
#[inline(always)]
unsafe fn decode_gemv_rows<W: Weight, const R: usize>(p: DecodeGemvParams<W>) {
    if p.early_trigger != 0 {
        launch_dependents();
    }
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let lane = lane_id() as usize;
    let warp = warp_id() as usize;
    let kw = p.k_warps as usize;
    let groups = (block_dim_x() / WARP_SIZE) as usize / kw;
    let (group, k0) = (warp / kw, (warp % kw) * chunk_elems::<W>());
    let stride = grid_dim_x() as usize * groups;
    let mut base = block_idx_x() as usize * groups;

    // Weights only: safe to read before the previous kernel has finished,
    // so under PDL these loads overlap its tail.
    let mut cur: Chunk = [[0; 4]; LOADS];
    if base + group < oc {
        // SAFETY: column base + group < oc, a row of c floats.
        cur = unsafe { load_chunk(p.weight.add((base + group) * c), k0, c, lane) };
    }
    // SAFETY: the launch provides n*c floats, then the split sums, the
    // argmax scratch, and with a layernorm 2*c floats of its parameters and
    // 2*n of row statistics; every part is a multiple of 4 floats long, so
    // each stays 16-byte aligned.
    let xs = unsafe { dynamic_shared_align16::<f32>() };
    // SAFETY: xs's n * c floats end where the next part of the layout starts.
    let red = unsafe { xs.add(n * c) };
    // SAFETY: past the split sums and the argmax scratch: the layernorm part.
    let lnp = unsafe { red.add((DECODE_GEMV_RED_SMEM_BYTES + DECODE_GEMV_ARGMAX_SMEM_BYTES) as usize / 4) };
    let (block, blocks) = (block_idx_x() as usize, grid_dim_x() as usize);
    // SAFETY: the launch's layout (above); every thread calls it.
    unsafe { gemv_prologue(&p, xs, lnp, n, c) };

    let greedy = !p.ids.is_null();
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    // `base` is uniform across the block, so every barrier below is reached
    // by all its threads.
    while base < oc {
        let col = base + group;
        let mut acc = [0.0f32; R];
        if col < oc {
            // SAFETY: col < oc; `xs` holds the n * c staged floats (16-byte aligned), the
            // params give c % W::PER_LOAD == 0 and n <= R.
            unsafe { dot_chunk::<W, R>(&mut acc, &cur, xs, k0, c, n, lane) };
        }
        // The next column's loads go out before this one's sums and stores.
        let next = col + stride;
        if next < oc {
            // SAFETY: next < oc.
            cur = unsafe { load_chunk(p.weight.add(next * c), k0, c, lane) };
        }
        // Lane r gets row r's sum (rows past n summed zeros).
        let mut mine = warp_reduce_sum_many(acc);
        if kw > 1 {
            if lane < n {
                // SAFETY: warp < MAX_WARPS, lane < ROWS.
                unsafe { *red.add(warp * ROWS + lane) = mine };
            }
            sync_threads();
            if warp.is_multiple_of(kw) && lane < n {
                mine = 0.0;
                for j in 0..kw {
                    // SAFETY: the group's warps wrote these before the barrier.
                    mine += unsafe { *red.add((warp + j) * ROWS + lane) };
                }
            }
        }
        if warp.is_multiple_of(kw) && col < oc && lane < n {
            // SAFETY: lane < n, col < oc.
            unsafe { finish_column(&p, lane, col, mine, &mut best) };
        }
        if kw > 1 {
            // `red` is rewritten next round.
            sync_threads();
        }
        base += stride;
    }
    if p.prefetch_late != 0 {
        // SAFETY: as above.
        unsafe { prefetch_ranges(&p.prefetch, block, blocks) };
    }
    if greedy {
        // SAFETY: the launch adds the argmax scratch after the split sums.
        let scratch = unsafe { red.add(DECODE_GEMV_RED_SMEM_BYTES as usize / 4) } as *mut u32;
        let out = ArgmaxOut::of(&p);
        // SAFETY: `scratch` is the argmax part of the launch's layout (8-byte aligned),
        // `out` the params' argmax buffers; `greedy` is uniform, so every thread calls.
        unsafe { argmax_finish(&out, best, scratch, n) };
    }
}

macro_rules! decode_gemv_entry {
    ($name:ident, $w:ty, $rows:expr) => {
        /// `decode_gemv_rows` for up to this many rows, weights of this type.
        ///
        /// # Safety
        /// `DecodeGemvParams`' contract, with the launch it describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeGemvParams<$w>) {
            // SAFETY: forwarded; the host picks the entry with n <= rows.
            unsafe { decode_gemv_rows::<$w, { $rows }>(p) }
        }
    };
}
decode_gemv_entry!(decode_gemv_1, f32, 1);
decode_gemv_entry!(decode_gemv_2, f32, 2);
decode_gemv_entry!(decode_gemv_4, f32, 4);
decode_gemv_entry!(decode_gemv, f32, ROWS);
// bf16 weights (bits in u16), f32 everywhere else.
decode_gemv_entry!(decode_gemv_bf16_1, u16, 1);
decode_gemv_entry!(decode_gemv_bf16_2, u16, 2);
decode_gemv_entry!(decode_gemv_bf16_4, u16, 4);
decode_gemv_entry!(decode_gemv_bf16, u16, ROWS);

/// The best of a warp's (value, index) candidates under `better`, in
/// every lane.
#[inline(always)]
pub(crate) fn warp_best(mut b: (f32, u32)) -> (f32, u32) {
    let mut off = WARP_SIZE / 2;
    while off > 0 {
        b = better(b, (shfl_xor_f32(b.0, off), shfl_xor_u32(b.1, off)));
        off /= 2;
    }
    b
}

pub(crate) const MMA_TILE: usize = DECODE_GEMV_MMA_TILE as usize;
pub(crate) const MMA_BATCH: usize = DECODE_GEMV_MMA_BATCH as usize;
pub(crate) const MMA_OUTPUTS: usize = DECODE_GEMV_MMA_OUTPUTS as usize;
/// Lanes sharing a fragment row (`t = lane % 4`); the row offset of a
/// fragment's second half (`g + 8`).
pub(crate) const MMA_QUAD: usize = 4;
const MMA_HALF: usize = MMA_TILE / 2;
/// Accumulators of one m16n8 fragment per lane.
pub(crate) const MMA_ACC: usize = 4;
/// Bytes of a lane's load of one weight row per step.
const MMA_LOAD_BYTES: usize = 16;
/// Most staged floats a lane reads per step (bf16: 8).
const MMA_MAX_LANE_K: usize = 8;
// Every output of a tile has an epilogue thread; a step is 4 lanes' loads.
const _: () = assert!(MMA_QUAD * MMA_LOAD_BYTES == DECODE_GEMV_MMA_STEP_BYTES as usize);
const _: () =
    assert!(MMA_OUTPUTS == LANES * MMA_ACC && MMA_OUTPUTS <= (DECODE_GEMV_MMA_MIN_WARPS * WARP_SIZE) as usize);

/// A weight format of the tensor-core GEMV: a step is one 16-byte load per
/// lane of each of its two weight rows (`g`, `g + 8`), `LANE_K` values of
/// k, so `4 * LANE_K` per warp (`DECODE_GEMV_MMA_STEP_BYTES`).
pub(crate) trait MmaWeight: Weight {
    const LANE_K: usize = MMA_LOAD_BYTES / size_of::<Self>();
    /// `acc += W_tile · x` over one step: `lo`/`hi` the lane's loads of rows
    /// `g` and `g + 8`, `x` the staged row `g` at the same k (first
    /// `LANE_K` entries; zeros for rows past `n`). The lane's k values feed
    /// the mma's k slots in a fixed permutation shared by both operands (a
    /// sum does not depend on the order of its terms).
    fn mma_step(acc: [f32; MMA_ACC], lo: &[u32; 4], hi: &[u32; 4], x: &[f32; MMA_MAX_LANE_K]) -> [f32; MMA_ACC];
}

impl MmaWeight for u16 {
    /// Two m16n8k16: lane `t` holds k `8t..8t+8`, slots `2t, 2t+1, 2t+8,
    /// 2t+9` of each instruction; the staged values are bf16 already, so
    /// packing them is exact.
    #[inline(always)]
    fn mma_step(acc: [f32; MMA_ACC], lo: &[u32; 4], hi: &[u32; 4], x: &[f32; MMA_MAX_LANE_K]) -> [f32; MMA_ACC] {
        let b = [
            pack_bf16x2(x[0], x[1]),
            pack_bf16x2(x[2], x[3]),
            pack_bf16x2(x[4], x[5]),
            pack_bf16x2(x[6], x[7]),
        ];
        let acc = mma_m16n8k16_bf16([lo[0], hi[0], lo[1], hi[1]], [b[0], b[1]], acc);
        mma_m16n8k16_bf16([lo[2], hi[2], lo[3], hi[3]], [b[2], b[3]], acc)
    }
}

impl MmaWeight for f32 {
    /// Two m16n8k8 slices (lane `t` holds k `4t..4t+4`, slots `t, t+4` of
    /// each), each as three TF32 products (3xTF32): both operands split into
    /// big + small, and small·big + big·small + big·big summed (small·small,
    /// ~2^-22 of the product, dropped), which keeps FP32's accuracy where
    /// one TF32 product would lose 13 bits.
    #[inline(always)]
    fn mma_step(acc: [f32; MMA_ACC], lo: &[u32; 4], hi: &[u32; 4], x: &[f32; MMA_MAX_LANE_K]) -> [f32; MMA_ACC] {
        let mut acc = acc;
        unroll!(h < 2 => {
            let (a0, a1, a2, a3) = (
                split_tf32(f32::from_bits(lo[2 * h])),
                split_tf32(f32::from_bits(hi[2 * h])),
                split_tf32(f32::from_bits(lo[2 * h + 1])),
                split_tf32(f32::from_bits(hi[2 * h + 1])),
            );
            let (b0, b1) = (split_tf32(x[2 * h]), split_tf32(x[2 * h + 1]));
            let a_big = [a0.0, a1.0, a2.0, a3.0];
            let a_small = [a0.1, a1.1, a2.1, a3.1];
            acc = mma_m16n8k8_tf32(a_small, [b0.0, b1.0], acc);
            acc = mma_m16n8k8_tf32(a_big, [b0.1, b1.1], acc);
            acc = mma_m16n8k8_tf32(a_big, [b0.0, b1.0], acc);
        });
        acc
    }
}

/// Output `o < MMA_OUTPUTS` of a 16-column fragment, as (row, column of
/// the tile): lane `o / 4`'s accumulator `j = o % 4`, `(2t + j % 2, g + 8 *
/// (j / 2))` for `g, t` of that lane.
#[inline(always)]
pub(crate) fn mma_out(o: usize) -> (usize, usize) {
    let (ol, oj) = (o / MMA_ACC, o % MMA_ACC);
    ((ol % MMA_QUAD) * 2 + oj % 2, ol / MMA_QUAD + MMA_HALF * (oj / 2))
}

/// One batch of a warp's weight loads: per step, 16 bytes of weight row
/// `col0 + g` and of row `col0 + g + 8` (zeros past `oc` or `k_hi`).
type MmaBatch = [[[u32; 4]; 2]; MMA_BATCH];

/// Load the batch of steps from `k` (below `k_hi`) of the tile at `col0`.
///
/// # Safety
/// `w` holds `oc` rows of `c` values, 16-byte aligned, `c` a multiple of
/// the step; `k_hi <= c`.
#[inline(always)]
pub(crate) unsafe fn mma_load_batch<W: MmaWeight>(
    w: *const W,
    col0: usize,
    oc: usize,
    c: usize,
    k: usize,
    k_hi: usize,
    lane: usize,
) -> MmaBatch {
    let (g, t) = (lane / MMA_QUAD, lane % MMA_QUAD);
    let step = MMA_QUAD * W::LANE_K;
    let mut b = [[[0u32; 4]; 2]; MMA_BATCH];
    unroll!(s < MMA_BATCH => {
        let kk = k + s * step + t * W::LANE_K;
        if k + s * step < k_hi {
            unroll!(h < 2 => {
                let col = col0 + g + h * MMA_HALF;
                if col < oc {
                    // SAFETY: col < oc, kk + LANE_K <= c, aligned.
                    b[s][h] = unsafe { W::load_raw(w.add(col * c), kk) };
                }
            });
        }
    });
    b
}

/// A lane's staged values of one step: row `g` of the staged rows at the
/// step's k (zeros for `g >= n`).
pub(crate) type MmaStaged = [f32; MMA_MAX_LANE_K];

/// Load the staged values of the step at `k0` (`k0 < k_hi`).
///
/// # Safety
/// `xs` holds `n` rows of `c` floats (16-byte aligned); `k_hi <= c`.
#[inline(always)]
pub(crate) unsafe fn mma_stage_step<W: MmaWeight>(
    xs: *const f32,
    c: usize,
    k0: usize,
    n: usize,
    lane: usize,
) -> MmaStaged {
    let (g, t) = (lane / MMA_QUAD, lane % MMA_QUAD);
    let kk = k0 + t * W::LANE_K;
    let mut x = [0f32; MMA_MAX_LANE_K];
    if g < n {
        unroll!(q < MMA_MAX_LANE_K / VEC => {
            if q * VEC < W::LANE_K {
                // SAFETY: row g < n, kk + LANE_K <= c.
                let v = unsafe { load4(xs.add(g * c + kk + q * VEC)) };
                x[q * VEC..q * VEC + VEC].copy_from_slice(&v);
            }
        });
    }
    x
}

/// `acc += W_tile · x` over one batch of steps ([`MmaWeight::mma_step`]);
/// each step's staged values loaded just before its product
/// ([`mma_stage_step`]).
///
/// # Safety
/// `xs` holds `n` rows of `c` floats (16-byte aligned); `k_hi <= c`.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
unsafe fn mma_batch<W: MmaWeight>(
    acc: &mut [f32; MMA_ACC],
    w: &MmaBatch,
    xs: *const f32,
    c: usize,
    k: usize,
    k_hi: usize,
    n: usize,
    lane: usize,
) {
    let step = MMA_QUAD * W::LANE_K;
    unroll!(s < MMA_BATCH => {
        if k + s * step < k_hi {
            // SAFETY: the caller's contract; k + s * step < k_hi.
            let x = unsafe { mma_stage_step::<W>(xs, c, k + s * step, n, lane) };
            *acc = W::mma_step(*acc, &w[s][0], &w[s][1], &x);
        }
    });
}

/// The GEMV on tensor cores ([`DECODE_GEMV_BF16_MMA`], [`DECODE_GEMV_MMA`];
/// the prologue, epilogues and greedy end of [`decode_gemv_rows`]). A
/// block's `k_warps` warps take one 16-column tile at a time, warp `j` its
/// `j`-th slice of `c`; their partial fragments meet in shared memory,
/// where thread `o < 128` sums output `o` of the tile (lane `o / 4`'s
/// accumulator `o % 4`: column `g + 8 * (j / 2)`, row `2t + j % 2`) and runs
/// its epilogue. So each epilogue thread always serves the same row, and
/// keeps that row's best for the greedy end.
///
/// # Safety
/// `DecodeGemvParams`' contract for these kernels, with the launch it describes.
#[inline(always)]
unsafe fn decode_gemv_mma_rows<W: MmaWeight>(p: DecodeGemvParams<W>) {
    if p.early_trigger != 0 {
        launch_dependents();
    }
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let (tid, lane, warp) = (thread_idx_x() as usize, lane_id() as usize, warp_id() as usize);
    let warps = p.k_warps as usize;
    let step = MMA_QUAD * W::LANE_K;
    let slice = c.div_ceil(warps).next_multiple_of(step);
    let (k_lo, k_hi) = ((warp * slice).min(c), ((warp + 1) * slice).min(c));
    let tiles = oc.div_ceil(MMA_TILE);
    let mut tile = block_idx_x() as usize;

    // Weights only, before the PDL wait: the first batch of the first tile.
    let mut first = [[[0u32; 4]; 2]; MMA_BATCH];
    if tile < tiles {
        // SAFETY: the params' contract.
        first = unsafe { mma_load_batch(p.weight, tile * MMA_TILE, oc, c, k_lo, k_hi, lane) };
    }
    // SAFETY: the launch provides decode_gemv_mma_shared_bytes: the staged
    // rows, the partial fragments, the argmax scratch, the layernorm's
    // parameters; each part a multiple of 16 bytes.
    let xs = unsafe { dynamic_shared_align16::<f32>() };
    // SAFETY: xs's n * c floats end where the next part of the layout starts.
    let red = unsafe { xs.add(n * c) };
    // SAFETY: past the warps * MMA_OUTPUTS partial fragments: the argmax scratch.
    let scratch = unsafe { red.add(warps * MMA_OUTPUTS) } as *mut u32;
    // SAFETY: past the argmax scratch (warps * ROWS pairs): the layernorm's
    // parameters.
    let lnp = unsafe { scratch.add(warps * ROWS * 2) } as *mut f32;
    let (block, blocks) = (block_idx_x() as usize, grid_dim_x() as usize);
    // SAFETY: the launch's layout (above); every thread calls it.
    unsafe { gemv_prologue(&p, xs, lnp, n, c) };

    // This thread's output of every tile (threads below 128).
    let (o_row, o_col) = mma_out(tid);
    let greedy = !p.ids.is_null();
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    // `tile` is uniform across the block: every barrier is reached by all.
    while tile < tiles {
        let col0 = tile * MMA_TILE;
        let mut acc = [0f32; MMA_ACC];
        let mut k = k_lo;
        let mut w = first;
        while k < k_hi {
            // SAFETY: the params' contract; k < k_hi <= c.
            unsafe { mma_batch::<W>(&mut acc, &w, xs, c, k, k_hi, n, lane) };
            k += MMA_BATCH * step;
            if k < k_hi {
                // SAFETY: the params' weight is oc rows of c, aligned; k < k_hi <= c.
                w = unsafe { mma_load_batch(p.weight, col0, oc, c, k, k_hi, lane) };
            }
        }
        // The next tile's first loads go out before this one's sums.
        let next = tile + blocks;
        if next < tiles {
            // SAFETY: as above.
            first = unsafe { mma_load_batch(p.weight, next * MMA_TILE, oc, c, k_lo, k_hi, lane) };
        }
        unroll!(j < MMA_ACC => {
            // SAFETY: warp < warps fragments of 128 floats.
            unsafe { *red.add(warp * MMA_OUTPUTS + lane * MMA_ACC + j) = acc[j] };
        });
        sync_threads();
        if tid < MMA_OUTPUTS {
            let col = col0 + o_col;
            if o_row < n && col < oc {
                let mut v = 0f32;
                for wi in 0..warps {
                    // SAFETY: written before the barrier.
                    v += unsafe { *red.add(wi * MMA_OUTPUTS + tid) };
                }
                // SAFETY: o_row < n, col < oc.
                unsafe { finish_column(&p, o_row, col, v, &mut best) };
            }
        }
        // `red` is rewritten next tile.
        sync_threads();
        tile = next;
    }
    if p.prefetch_late != 0 {
        // SAFETY: as above.
        unsafe { prefetch_ranges(&p.prefetch, block, blocks) };
    }
    if greedy {
        // Lane r of each warp: row r's best over the warp's candidates.
        let mut mine = (f32::NEG_INFINITY, u32::MAX);
        for r in 0..ROWS {
            let cand = if tid < MMA_OUTPUTS && o_row == r {
                best
            } else {
                (f32::NEG_INFINITY, u32::MAX)
            };
            let b = warp_best(cand);
            if lane == r {
                mine = b;
            }
        }
        let out = ArgmaxOut::of(&p);
        // SAFETY: the scratch holds a pair per (warp, row).
        unsafe { argmax_finish(&out, mine, scratch, n) };
    }
}

/// `decode_gemv_mma_rows` over bf16 weights.
///
/// # Safety
/// `DecodeGemvParams`' contract for this kernel, with the launch it describes.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_gemv_bf16_mma(p: DecodeGemvParams<u16>) {
    // SAFETY: forwarded.
    unsafe { decode_gemv_mma_rows(p) }
}

/// `decode_gemv_mma_rows` over f32 weights (3xTF32).
///
/// # Safety
/// `DecodeGemvParams`' contract for this kernel, with the launch it describes.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_gemv_mma(p: DecodeGemvParams<f32>) {
    // SAFETY: forwarded.
    unsafe { decode_gemv_mma_rows(p) }
}

pub(crate) const HS: usize = DECODE_HEAD_SIZE as usize;
pub(crate) const ATT_LANES: usize = 8;
/// Key groups per block (8 lanes each).
const ATT_GROUPS: usize = DECODE_ATTN_THREADS as usize / ATT_LANES;
/// Keys each group scores per chunk.
const ATT_KEYS_PER_GROUP: usize = DECODE_ATTN_CHUNK as usize / ATT_GROUPS;
/// Dimensions per lane: two 16-byte vectors, at `4*l8` and `32 + 4*l8`.
const ATT_HALF: usize = HS / 2;
const _: () = assert!(ATT_LANES * 2 * VEC == HS);
const _: () = assert!(ATT_GROUPS * ATT_KEYS_PER_GROUP == DECODE_ATTN_CHUNK as usize);
const _: () = assert!(ATT_KEYS_PER_GROUP <= UNROLL_MAX);

/// Decode attention (see the module docs and `DecodeAttentionParams`).
///
/// # Safety
/// `DecodeAttentionParams`' contract, with the launch it describes.
#[inline(always)]
unsafe fn decode_attention_impl<K: F32Storage>(p: DecodeAttentionParams<K>) {
    if p.early_trigger != 0 {
        launch_dependents();
    }
    // Attention reads little from HBM: the time to fetch later weights.
    let block = block_idx_x() + grid_dim_x() * (block_idx_y() + grid_dim_y() * block_idx_z());
    let blocks = grid_dim_x() * grid_dim_y() * grid_dim_z();
    // SAFETY: the params' contract (later kernels' weights).
    unsafe { prefetch_ranges(&p.prefetch, block as usize, blocks as usize) };
    grid_dependency_wait();
    if p.early_trigger == 0 {
        launch_dependents();
    }
    let (c, nh, max_t, window) = (p.c as usize, p.nh as usize, p.max_t as usize, p.window as usize);
    let tid = thread_idx_x() as usize;
    let lane = lane_id() as usize;
    let (grp, l8) = (tid / ATT_LANES, lane % ATT_LANES);
    let chunk = block_idx_x() as usize;
    let h = block_idx_y() as usize;
    let r = block_idx_z() as usize;
    // SAFETY: pos (and cache_row, when not null) hold n entries.
    let (pos, cr) = unsafe { (*p.pos.add(r) as usize, super::kv_cache::cache_row(p.cache_row, r)) };
    // An idle row (a free slot of a server's batch) attends to nothing.
    if pos >= max_t || cr >= p.cache_rows as usize {
        return;
    }
    let key_lo = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let chunks = (pos + 1 - key_lo).div_ceil(DECODE_ATTN_CHUNK as usize);
    if chunk >= chunks {
        return;
    }
    let key_begin = key_lo + chunk * DECODE_ATTN_CHUNK as usize;
    let key_end = pos + 1;

    // This lane's 8 query dimensions, pre-scaled into log2 units.
    // SAFETY: q holds n*c floats; h*HS + 36 + 4 <= c.
    let q = unsafe { decode_query(p.q.add(r * c + h * HS + VEC * l8), p.scale_log2e) };
    let plane = (cr * nh + h) * max_t * HS + VEC * l8;
    // SAFETY: cache row cr < cache_rows, head h: max_t * HS floats from `plane`.
    let (k_g, v_g) = unsafe { (p.k_cache.add(plane), p.v_cache.add(plane)) };
    // SAFETY: keys below key_end lie in the cache plane.
    let (m, l, acc) =
        unsafe { attend_keys::<ATT_KEYS_PER_GROUP, _>(&q, k_g, v_g, key_begin + grp, ATT_GROUPS, key_end) };

    let head = r * nh + h;
    let first = head * p.parts_stride as usize;
    let part = first + chunk * DECODE_ATTN_PARTS_PER_CHUNK as usize + warp_id() as usize;
    // SAFETY: part < (head + 1) * parts_stride (chunks * 2 <= parts_stride).
    unsafe { store_part(p.part_acc, p.part_ml, part, m, l, &acc) };
    // SAFETY: counter holds n * nh entries, zero between launches.
    let counter = unsafe { p.counter.add(head) };
    // Both warps' partials written and fenced before thread 0 arrives
    // (`sync_threads_or` evaluates the arrival before it synchronises).
    sync_threads();
    // A row's only chunk is last without asking the counter.
    let arrived_last = sync_threads_or(
        // SAFETY: counter holds n * nh entries (head < n * nh) and is 4-byte aligned.
        tid == 0 && (chunks == 1 || unsafe { atomic_add_acq_rel_u32(counter, 1) } as usize == chunks - 1),
    );
    if !arrived_last {
        return;
    }
    thread_fence();
    // The combine: thread d owns dimension d.
    let parts = chunks * DECODE_ATTN_PARTS_PER_CHUNK as usize;
    // SAFETY: the head's `parts` partials were written before the
    // arrivals; r < n, h*HS + HS <= c.
    unsafe {
        combine_parts(
            p.part_acc.add(first * HS),
            p.part_ml.add(2 * first),
            parts,
            p.out.add(r * c + h * HS),
            tid,
            DECODE_ATTN_THREADS as usize,
        )
    };
    if tid == 0 {
        // SAFETY: every block of this head has arrived; none touches it again.
        unsafe { *counter = 0 };
    }
}

/// `decode_attention_impl` over an f32 cache.
///
/// # Safety
/// As `decode_attention_impl`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_attention(p: DecodeAttentionParams<f32>) {
    // SAFETY: the caller's contract.
    unsafe { decode_attention_impl(p) }
}

/// `decode_attention_impl` over a bf16 cache.
///
/// # Safety
/// As `decode_attention_impl`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_attention_bf16(p: DecodeAttentionParams<u16>) {
    // SAFETY: the caller's contract.
    unsafe { decode_attention_impl(p) }
}

/// One warp's online-softmax state over keys `first + i * stride` (`i <
/// K <= 16`, below `key_end`) of one head, where lanes `8g..8g+8` form group `g`
/// (its `first` differs by `g`) and lane `l % 8` holds 8 of the 64
/// dimensions of `q` (pre-scaled into log2 units, `decode_query`), of
/// `k_g`/`v_g` (the head's cache planes offset by `4 * (lane % 8)`): the
/// warp's 4 groups merged, returned as (max, sum, acc) in every lane.
/// Loads of the cache go through L2 only (`load4_cg`): another block may
/// have stored the newest key in the same launch.
///
/// # Safety
/// Every key below `key_end` is a row of the planes; all 32 lanes call it.
#[inline(always)]
pub(crate) unsafe fn attend_keys<const K: usize, E: F32Storage>(
    q: &[f32; 2 * VEC],
    k_g: *const E,
    v_g: *const E,
    first: usize,
    stride: usize,
    key_end: usize,
) -> (f32, f32, [f32; 2 * VEC]) {
    // SAFETY: the caller's contract.
    let kv = unsafe { load_keys::<K, E>(k_g, v_g, first, stride, key_end) };
    attend_loaded(q, &kv, first, stride, key_end)
}

/// This lane's 8 dimensions of K and V of the keys [`attend_keys`] takes
/// (`[key][ka, kb, va, vb]`; keys at or past `key_end` left zero), every
/// load in flight at once (V does not depend on the scores, so the keys
/// cost one memory round trip, not two).
///
/// # Safety
/// As for [`attend_keys`].
#[inline(always)]
pub(crate) unsafe fn load_keys<const K: usize, E: F32Storage>(
    k_g: *const E,
    v_g: *const E,
    first: usize,
    stride: usize,
    key_end: usize,
) -> [[[f32; VEC]; 4]; K] {
    let mut kv = [[[0f32; VEC]; 4]; K];
    unroll!(i < K => {
        let key = first + i * stride;
        if key < key_end {
            // SAFETY: the caller's contract.
            unsafe {
                kv[i] = [
                    E::load4_cg(k_g.add(key * HS)),
                    E::load4_cg(k_g.add(key * HS + ATT_HALF)),
                    E::load4_cg(v_g.add(key * HS)),
                    E::load4_cg(v_g.add(key * HS + ATT_HALF)),
                ];
            }
        }
    });
    kv
}

/// [`attend_keys`] over the keys [`load_keys`] loaded (`kv`, the same
/// `first`, `stride` and `key_end`). Keys all past `key_end`: max -inf,
/// sum 0. All 32 lanes call it.
#[inline(always)]
pub(crate) fn attend_loaded<const K: usize>(
    q: &[f32; 2 * VEC],
    kv: &[[[f32; VEC]; 4]; K],
    first: usize,
    stride: usize,
    key_end: usize,
) -> (f32, f32, [f32; 2 * VEC]) {
    let key_of = |i: usize| first + i * stride;
    let mut s = [0f32; K];
    unroll!(i < K => {
        let key = key_of(i);
        let dot = key_lanes_sum(key_score_part(q, kv[i][0], kv[i][1]), ATT_LANES as u32);
        s[i] = if key < key_end { dot } else { f32::NEG_INFINITY };
    });
    let mut m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let base = softmax_base(m);
    let mut l = 0f32;
    let mut acc = [0f32; 2 * VEC];
    unroll!(i < K => {
        if key_of(i) < key_end {
            let w = exp2_approx(s[i] - base);
            l += w;
            let (va, vb) = (kv[i][2], kv[i][3]);
            for e in 0..VEC {
                acc[e] = fma(w, va[e], acc[e]);
                acc[VEC + e] = fma(w, vb[e], acc[VEC + e]);
            }
        }
    });
    // Merge the warp's 4 key groups (lanes 8 and 16 apart).
    merge_state(&mut m, &mut l, &mut acc, 8);
    merge_state(&mut m, &mut l, &mut acc, 16);
    (m, l, acc)
}

/// Write one partial (lanes `< 8` of the warp that [`attend_keys`] gave
/// (max, sum, acc)): `acc` at `part_acc[part * 64 ..]`, (max, sum) at
/// `part_ml[2 * part ..]`; each writing lane then fences, so an arrival
/// after it publishes the partial.
///
/// # Safety
/// Partial `part` lies inside both buffers.
#[inline(always)]
pub(crate) unsafe fn store_part(
    part_acc: *mut f32,
    part_ml: *mut f32,
    part: usize,
    m: f32,
    l: f32,
    acc: &[f32; 2 * VEC],
) {
    let l8 = lane_id() as usize % ATT_LANES;
    if (lane_id() as usize) < ATT_LANES {
        // SAFETY: the caller's contract.
        unsafe {
            let a = part_acc.add(part * HS + VEC * l8);
            store4(a, [acc[0], acc[1], acc[2], acc[3]]);
            store4(a.add(ATT_HALF), [acc[4], acc[5], acc[6], acc[7]]);
            if l8 == 0 {
                *part_ml.add(2 * part) = m;
                *part_ml.add(2 * part + 1) = l;
            }
        }
        thread_fence();
    }
}

/// Merge a head's `parts` partials (`acc` at `part_acc[i * 64..]`, (max,
/// sum) at `part_ml[2i..]`) into its 64 outputs at `out`: thread `tid` of
/// `threads` owns dimensions `tid, tid + threads, ...`. Reads through L2
/// only (other blocks wrote the partials).
///
/// # Safety
/// The partials were written and published before; `out` holds 64 floats.
#[inline(always)]
pub(crate) unsafe fn combine_parts(
    part_acc: *const f32,
    part_ml: *const f32,
    parts: usize,
    out: *mut f32,
    tid: usize,
    threads: usize,
) {
    let mut d = tid;
    while d < HS {
        // SAFETY: the caller's contract; d < HS.
        unsafe {
            let (_, l_all, o) = merge_parts_dim(|x| load_cg(x), part_acc, part_ml, parts, d);
            *out.add(d) = o / l_all;
        }
        d += threads;
    }
}

/// Dimension `d` of `parts` partials laid out as for [`combine_parts`],
/// read by `load`, merged: (max, sum, the unnormalised output), itself a
/// partial of the same form.
///
/// # Safety
/// `load` reads the `parts` partials; `d < 64`; at least one partial has a
/// finite max (the one holding the query's own key).
#[inline(always)]
pub(crate) unsafe fn merge_parts_dim(
    load: impl Fn(*const f32) -> f32,
    part_acc: *const f32,
    part_ml: *const f32,
    parts: usize,
    d: usize,
) -> (f32, f32, f32) {
    let mut m_all = f32::NEG_INFINITY;
    for i in 0..parts {
        // SAFETY: partial i < parts.
        m_all = m_all.max(load(unsafe { part_ml.add(2 * i) }));
    }
    let (mut l_all, mut o) = (0f32, 0f32);
    for i in 0..parts {
        // SAFETY: partial i < parts, d < 64.
        let (mi, li, ai) = unsafe {
            (
                load(part_ml.add(2 * i)),
                load(part_ml.add(2 * i + 1)),
                load(part_acc.add(i * HS + d)),
            )
        };
        // A partial without keys (max -inf) weighs 0.
        let w = exp2_approx(mi - m_all);
        l_all = fma(li, w, l_all);
        o = fma(ai, w, o);
    }
    (m_all, l_all, o)
}
