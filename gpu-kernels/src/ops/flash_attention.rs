//! Flash attention: the `attention_forward` op fused into one pass over the
//! KV cache, with no T x T matrix in memory (contract: docs/design.md).
//!
//! Common to both prefill kernels: K/V tiles of 64 keys in a shared-memory
//! ring filled by `cp.async`; each warp owns 16 query rows and keeps their
//! scores, running max/sum and output accumulator in registers in the
//! m16n8k8 C-fragment layout (row g = lane/4 and g+8, columns 2t, 2t+1 with
//! t = lane%4). Scores are scaled by log2(e)/sqrt(HS) so `ex2` is the only
//! transcendental. Tiles above the causal diagonal or wholly before the
//! window are never loaded; (sub-)tiles a warp cannot see are skipped by that
//! warp; only those that straddle a boundary pay for per-element masks.
//!
//! TF32 prefill (`attention_forward_flash_tf32`), tensor cores for QKᵀ and PV:
//! - 8 warps per block. `kv_split` 1: 128 query rows, each warp scores both
//!   32-key halves of every tile (each tile feeds 128 queries: half the L2
//!   traffic of 64-row tiles, which matters at B=8). `kv_split` 2: 64 rows,
//!   the two warps of a row slice take one half each and merge their
//!   (max, sum, acc) through shared memory at the end (twice the blocks and
//!   half the longest chain, which matters at B=1 where 128-row tiles would
//!   leave SMs idle). The host picks (params:
//!   FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM).
//! - The warp step exists twice: with the causal/window mask (steps that
//!   straddle a boundary) and without any mask code (the common step).
//!   Index arithmetic is u32: 64-bit compares doubled the integer work.
//! - 1-D grid, heaviest query tiles (latest positions: most causal keys) of
//!   every head first, so the light tiles fill the tail of the last wave.
//! - 3-stage K/V ring, one barrier per tile; each thread rounds the chunks it
//!   copied to TF32 in place before that barrier, so the MMA loops read
//!   ready operands with 16-byte `ld.shared.v4` and no `cvt` (Q is rounded once,
//!   straight from global memory into registers). `kv_rounded` skips that
//!   pass when the caller's K/V are already TF32 values.
//! - A call from position 0 (`kv_from_qkv`) reads K/V tiles straight from
//!   `qkv` (row stride 3C) and each block copies its own query rows' K/V into
//!   the caches, so no separate store kernel runs before it.
//! - Contraction orders are free as long as both operands agree, so they are
//!   chosen for vector loads without bank conflicts (row stride 68 = 4 mod 32):
//!   QKᵀ: lane t holds dims [8t, 8t+8) and [32+8t, 40+8t) of its rows, in that
//!   order; k-step s uses its entries 2s (k-slot t) and 2s+1 (k-slot t+4).
//!   PV: the key is the contraction index, k-slot t = key 2t and t+4 = key 2t+1
//!   of each 8-key step, exactly what the S C-fragment holds, so P feeds the
//!   MMA from registers; the output column n of n-tile dt is dim 4n + dt
//!   (dt < 4) or 32 + 4n + dt - 4, so lane g reads V\[key\]\[4g..4g+4\] and
//!   V\[key\]\[32+4g..36+4g\], and each lane ends up holding 8 contiguous output
//!   dims twice (16-byte stores).
//!
//! FP32 prefill (`attention_forward_flash_fp32`, the exact path): 4 warps and
//! 64 queries per block, a 2-stage ring, FMA products; P goes through a
//! per-warp shared-memory block because SIMT PV needs whole rows.
//!
//! Decode (`attention_forward_flash_decode` + `_combine`), flash-decoding for a
//! few queries over a long cache: a block reduces one 64-key chunk for one
//! (query, head); 8 lanes share a key (8 dimensions each, 16-byte loads, so a
//! warp reads 4 whole K rows per instruction pair), each warp merges its 4 key
//! groups with shuffles and writes one partial (max, sum, acc\[64\]); the combine
//! kernel merges the partials of each (query, head).

use crate::device::Vec4;
use crate::device::math::{exp2_approx, fma};
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k8_tf32, to_tf32};
use crate::device::shared::dynamic_shared_align16;
use crate::device::unroll;
use crate::device::warp::shfl_xor_f32;
use crate::device::{
    WARP_SIZE, block_idx_x, block_idx_y, block_idx_z, grid_dim_x, lane_id, sync_threads, sync_warp, thread_idx_x,
    warp_id,
};
use crate::params::flash_attention::*;

const HS: usize = FLASH_HEAD_SIZE as usize;
const BQ: usize = FLASH_BLOCK_Q as usize;
const BK: usize = FLASH_BLOCK_K as usize;
const THREADS: usize = FLASH_THREADS as usize;
const STRIDE: usize = FLASH_SMEM_STRIDE as usize;
const TILE: usize = FLASH_TILE_FLOATS as usize;
const STAGES: usize = FLASH_STAGES as usize;
/// Rows of one MMA tile (m16): the query rows one warp owns.
const WARP_ROWS: usize = 16;
/// Width of one MMA n- or k-step (n8, k8).
const MMA_N: usize = 8;
/// 8-key column blocks of a score tile (n-tiles of S, k-steps of PV).
const KEY_STEPS: usize = BK / MMA_N;
/// 8-wide blocks of the head dimension (k-steps of QKᵀ, n-tiles of O).
const DIM_STEPS: usize = HS / MMA_N;
/// Floats per 16-byte vector (one `cp.async`, one `ld.v4`).
const VEC: usize = 4;
/// 16-byte vectors per tile row.
const VECS_PER_ROW: usize = HS / VEC;
const _: () = assert!(
    BQ == (THREADS / WARP_SIZE as usize) * WARP_ROWS,
    "one warp per 16 query rows"
);
const _: () = assert!(BQ == BK, "Q and K/V tiles share the copy routine");
const _: () = assert!((BK * VECS_PER_ROW).is_multiple_of(THREADS) && (BK * VECS_PER_ROW).is_multiple_of(T_THREADS));
const _: () = assert!(STAGES == 2, "the FP32 pipeline is written for a 2-stage ring");
const _: () = assert!(
    KEY_STEPS == 8 && DIM_STEPS == 8,
    "the fragment loops are unrolled 8 times (`unroll!`)"
);

const T_THREADS: usize = FLASH_TF32_THREADS as usize;
const T_WARPS: usize = T_THREADS / WARP_SIZE as usize;
const T_STAGES: usize = FLASH_TF32_STAGES as usize;
/// Keys of one warp step (a half tile) and its 8-key blocks.
const SUB_K: usize = FLASH_TF32_SUB_KEYS as usize;
const SUB_STEPS: usize = SUB_K / MMA_N;
const SUBS_PER_TILE: usize = BK / SUB_K;
/// Floats one lane hands over in the kv_split merge: acc (32), m (2), l (2).
const MERGE_VALS: usize = DIM_STEPS * 4 + 4;
/// 16-byte K (and V) chunks per thread when a block stores its own rows into
/// the caches (`kv_from_qkv`): at most `ROWS_MAX` rows of `VECS_PER_ROW`.
const STORE_CHUNKS_PER_THREAD: usize = FLASH_TF32_ROWS_MAX as usize * VECS_PER_ROW / T_THREADS;
const _: () = assert!(STORE_CHUNKS_PER_THREAD * T_THREADS == FLASH_TF32_ROWS_MAX as usize * VECS_PER_ROW);
const _: () = assert!(
    STORE_CHUNKS_PER_THREAD == 8,
    "the store loops are unrolled 8 times (`unroll!`)"
);
const _: () = assert!(FLASH_TF32_ROWS_MAX as usize == T_WARPS * WARP_ROWS);
const _: () = assert!(
    SUBS_PER_TILE == 2 && SUB_STEPS == 4,
    "loops below are unrolled 4 times (`unroll!`)"
);
const _: () = assert!(
    BK * VECS_PER_ROW == T_THREADS * T_COPY_BATCH && T_THREADS.is_multiple_of(VECS_PER_ROW),
    "each thread copies one batch of T_COPY_BATCH chunks of a tile, whole rows per batch step"
);
const _: () = assert!(
    FLASH_TF32_KV_SPLIT_MAX == 2,
    "the merge below hands one state per slice over"
);
const _: () = assert!(T_STAGES == 3, "the TF32 pipeline waits with wait_group<1> (3 stages)");
const _: () = assert!(HS == 64, "the QKᵀ and PV lane orders are written for 64 dims");
const _: () = assert!(
    (T_WARPS - T_WARPS / FLASH_TF32_KV_SPLIT_MAX as usize) * MERGE_VALS * WARP_SIZE as usize * 4
        <= FLASH_SMEM_BYTES_TF32 as usize,
    "the merge area (every warp but part 0 of each slice) reuses the K/V ring"
);

/// # Safety
/// `p` is 16-byte aligned and readable for 16 bytes.
#[inline(always)]
unsafe fn ld4(p: *const f32) -> [f32; 4] {
    // SAFETY: the caller gives `p` 16-byte aligned and readable for 16 bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { (*(p as *const Vec4<f32>)).0 }
}

/// # Safety
/// `p` is 16-byte aligned and writable for 16 bytes.
#[inline(always)]
unsafe fn st4(p: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller gives `p` 16-byte aligned and writable for 16 bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { *(p as *mut Vec4<f32>) = Vec4(v) }
}

/// `exp2(x - m)` where `m` is a running maximum that may still be -inf (no
/// key seen yet): then every `x` is -inf too and the result must be 0, not NaN.
#[inline(always)]
pub(crate) fn softmax_base(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}

/// Issue the `cp.async` copies of one 64x64 tile by the `NT` threads of the
/// block: rows `row0..row0+64` of a row-major source with `src_stride` floats
/// per row; rows at or past `rows` are zero-filled (never read from memory).
/// Thread `tid` copies chunks `tid + i*NT` (row = chunk / 16, 16 chunks a row).
///
/// # Safety
/// `dst` is a shared tile of [`TILE`] floats; rows `row0..rows` of `src` are readable.
#[inline(always)]
unsafe fn load_tile<const NT: usize>(dst: *mut f32, src: *const f32, src_stride: usize, row0: usize, rows: usize) {
    let tid = thread_idx_x() as usize;
    for i in 0..BK * VECS_PER_ROW / NT {
        let idx = tid + i * NT;
        let (r, col) = (idx / VECS_PER_ROW, (idx % VECS_PER_ROW) * VEC);
        let valid = row0 + r < rows;
        // An invalid row copies 0 bytes; its source address is still kept in bounds.
        let src_row = if valid { row0 + r } else { row0.min(rows - 1) };
        // SAFETY: r < 64 rows and col + 4 <= HS <= STRIDE: 16 aligned bytes of the
        // caller's tile; `src_row` < rows is readable, and only `valid` rows copy bytes.
        unsafe {
            cp_async_16_zfill(
                dst.add(r * STRIDE + col),
                src.add(src_row * src_stride + col),
                if valid { 16 } else { 0 },
            );
        }
    }
}

/// The FP32 prefill kernel body (see the module docs).
///
/// # Safety
/// As for [`attention_forward_flash_fp32`].
#[inline(always)]
unsafe fn flash_prefill_fp32(p: &FlashAttentionParams) {
    let (t, c, nh, max_t, pos0, window) = (
        p.t as usize,
        p.c as usize,
        p.nh as usize,
        p.max_t as usize,
        p.pos0 as usize,
        p.window as usize,
    );
    let lane = lane_id() as usize;
    let warp = warp_id() as usize;
    let (g, tq) = (lane / 4, lane % 4);
    // Heaviest (latest) query tiles first: causal work grows with the tile index.
    let q_tile = (grid_dim_x() - 1 - block_idx_x()) as usize;
    let (h, bi) = (block_idx_y() as usize, block_idx_z() as usize);

    let q0 = q_tile * BQ;
    let q_rows = BQ.min(t - q0);
    // Absolute positions of the block's first and last query.
    let (p_min, p_max) = (pos0 + q0, pos0 + q0 + q_rows - 1);
    let key_lo = if window > 0 {
        (p_min + 1).saturating_sub(window)
    } else {
        0
    };
    let first_tile = key_lo / BK;
    let n_tiles = p_max / BK + 1 - first_tile;
    let n_keys = p_max + 1; // keys past it are zero-filled, and masked

    // SAFETY: (whole body) the launch provides FLASH_SMEM_BYTES_FP32 of
    // dynamic shared memory, laid out Q | K stages | V stages | P blocks.
    // 16-byte aligned: cp.async targets and ld.shared.v4 rows.
    let smem = unsafe { dynamic_shared_align16::<f32>() };
    let q_s = smem;
    // SAFETY: the K stages follow the Q tile: STAGES tiles from float TILE.
    let k_s = unsafe { smem.add(TILE) };
    // SAFETY: the V stages follow the K stages.
    let v_s = unsafe { smem.add((1 + STAGES) * TILE) };
    // SAFETY: warp < BQ / 16: the warp's 16 P rows in the P blocks after the V stages.
    let p_s = unsafe { smem.add((1 + 2 * STAGES) * TILE + warp * WARP_ROWS * STRIDE) };

    let plane = (bi * nh + h) * max_t * HS;
    // SAFETY: the row's (bi, h) plane of max_t * HS floats lies inside each cache.
    let (k_g, v_g) = unsafe { (p.k_cache.add(plane), p.v_cache.add(plane)) };
    // SAFETY: this row's (bi) first qkv row, head h's q columns: inside qkv (n rows
    // of 3 * c).
    let q_g = unsafe { p.qkv.add(bi * t * 3 * c + h * HS) };
    // SAFETY: stage < STAGES: inside the K/V stages; keys below n_keys <= pos0 + t
    // <= max_t are in the cache plane.
    let load_kv = |tile: usize, stage: usize| unsafe {
        load_tile::<THREADS>(k_s.add(stage * TILE), k_g, HS, tile * BK, n_keys);
        load_tile::<THREADS>(v_s.add(stage * TILE), v_g, HS, tile * BK, n_keys);
    };
    // SAFETY: the Q tile holds TILE floats; q rows q0..t of `q_g` (stride 3c) are in
    // the launch's qkv.
    unsafe { load_tile::<THREADS>(q_s, q_g, 3 * c, q0, t) };
    load_kv(first_tile, 0);
    cp_async_commit();

    // This warp's rows: local query index, absolute positions (rows g and g+8).
    let w_q0 = q0 + warp * WARP_ROWS;
    let w_p_min = pos0 + w_q0;
    let w_p_max = w_p_min + WARP_ROWS - 1;
    let row_p = [w_p_min + g, w_p_min + g + 8];
    let warp_has_rows = warp * WARP_ROWS < q_rows;

    let mut m = [f32::NEG_INFINITY; 2]; // running max, log2 units
    let mut l = [0f32; 2]; // running sum of this lane's columns (quad-reduced at the end)
    let mut acc = [[0f32; 4]; DIM_STEPS]; // O fragment, unnormalised

    for j in 0..n_tiles {
        let stage = j % STAGES;
        if j + 1 < n_tiles {
            load_kv(first_tile + j + 1, (j + 1) % STAGES);
        }
        // Always commit (maybe an empty group), so "all but 1 pending" means tile j is in.
        cp_async_commit();
        cp_async_wait_group::<1>();
        sync_threads();

        let k0 = (first_tile + j) * BK; // first key of the tile
        let k_last = k0 + BK - 1;
        // Warp-uniform: can any row of this warp see any key of the tile?
        let visible = warp_has_rows && k0 <= w_p_max && (window == 0 || k_last + window > w_p_min);
        if visible {
            // SAFETY: stage < STAGES: one of the K stages.
            let kb = unsafe { k_s.add(stage * TILE) };
            // SAFETY: stage < STAGES: one of the V stages.
            let vb = unsafe { v_s.add(stage * TILE) };

            // S = Q Kᵀ for the warp's 16 rows x 64 keys, C-fragment layout.
            let mut s = [[0f32; 4]; KEY_STEPS];
            // SAFETY: warp * 16 + g < BQ: a row of the Q tile.
            let qa = unsafe { q_s.add((warp * WARP_ROWS + g) * STRIDE) };
            // SAFETY: 8 rows below, still the warp's 16 rows of the Q tile.
            let qb = unsafe { qa.add(8 * STRIDE) };
            for d in (0..HS).step_by(VEC) {
                // SAFETY: d + 4 <= HS <= STRIDE: inside both Q rows, 16-byte aligned (STRIDE and d
                // multiples of 4); the copies landed before the barrier.
                let (a0, a1) = unsafe { (ld4(qa.add(d)), ld4(qb.add(d))) };
                unroll!(n < 8 => {
                    // SAFETY: n * 8 + 2 * tq + 1 < BK: a key row of this stage, at column d.
                    let kr = unsafe { kb.add((n * MMA_N + 2 * tq) * STRIDE + d) };
                    // SAFETY: rows `kr` and `kr + STRIDE` are key rows < BK, d + 4 <= HS, aligned.
                    let (b0, b1) = unsafe { (ld4(kr), ld4(kr.add(STRIDE))) };
                    let sn = &mut s[n];
                    for e in 0..VEC {
                        sn[0] = fma(a0[e], b0[e], sn[0]);
                        sn[1] = fma(a0[e], b1[e], sn[1]);
                        sn[2] = fma(a1[e], b0[e], sn[2]);
                        sn[3] = fma(a1[e], b1[e], sn[3]);
                    }
                });
            }

            // Scale into log2 units; mask only where the tile straddles the
            // diagonal, the window start or the end of the keys.
            let needs_mask = k_last > w_p_min || (window > 0 && k0 + window <= w_p_max);
            let mut tile_max = [f32::NEG_INFINITY; 2];
            unroll!(n < 8 => {
                for (e, x) in s[n].iter_mut().enumerate() {
                    let r = e / 2;
                    let mut v = *x * p.scale_log2e;
                    if needs_mask {
                        let key = k0 + n * MMA_N + 2 * tq + (e & 1);
                        if key > row_p[r] || (window > 0 && key + window <= row_p[r]) {
                            v = f32::NEG_INFINITY;
                        }
                    }
                    *x = v;
                    tile_max[r] = tile_max[r].max(v);
                }
            });
            // Online softmax: a row lives on the 4 lanes of a quad.
            let mut base = [0f32; 2];
            let mut alpha = [0f32; 2];
            for r in 0..2 {
                let mut mx = tile_max[r];
                mx = mx.max(shfl_xor_f32(mx, 1));
                mx = mx.max(shfl_xor_f32(mx, 2));
                let m_new = m[r].max(mx);
                base[r] = softmax_base(m_new);
                alpha[r] = exp2_approx(m[r] - base[r]);
                m[r] = m_new;
                l[r] *= alpha[r];
            }
            unroll!(n < 8 => {
                for (e, x) in s[n].iter_mut().enumerate() {
                    *x = exp2_approx(*x - base[e / 2]);
                    l[e / 2] += *x;
                }
            });
            unroll!(dt < 8 => {
                for (e, x) in acc[dt].iter_mut().enumerate() {
                    *x *= alpha[e / 2];
                }
            });

            // O += P V.
            unroll!(n < 8 => {
                // SAFETY: g + 8 < 16 rows and n * 8 + 2 * tq + 1 < BK columns of this warp's own
                // P block (no other warp touches it).
                unsafe {
                    let pr = p_s.add(g * STRIDE + n * MMA_N + 2 * tq);
                    *pr = s[n][0];
                    *pr.add(1) = s[n][1];
                    *pr.add(8 * STRIDE) = s[n][2];
                    *pr.add(8 * STRIDE + 1) = s[n][3];
                }
            });
            sync_warp();
            for key in 0..BK {
                // SAFETY: key < BK, g + 8 < 16: this warp's P block, written above by its lanes
                // and made visible by `sync_warp`.
                let (pa, pb) = unsafe { (*p_s.add(g * STRIDE + key), *p_s.add((g + 8) * STRIDE + key)) };
                // SAFETY: key < BK rows of the V stage; 2 * tq < 8 columns.
                let vr = unsafe { vb.add(key * STRIDE + 2 * tq) };
                unroll!(dt < 8 => {
                    // SAFETY: dt * 8 + 2 * tq + 1 < HS: inside the V row.
                    let (v0, v1) = unsafe { (*vr.add(dt * MMA_N), *vr.add(dt * MMA_N + 1)) };
                    let a = &mut acc[dt];
                    a[0] = fma(pa, v0, a[0]);
                    a[1] = fma(pa, v1, a[1]);
                    a[2] = fma(pb, v0, a[2]);
                    a[3] = fma(pb, v1, a[3]);
                });
            }
            // The next tile rewrites this warp's P block.
            sync_warp();
        }
        // Everyone is done with `stage` before iteration j+1 refills it.
        sync_threads();
    }

    for r in 0..2 {
        let mut sum = l[r];
        sum += shfl_xor_f32(sum, 1);
        sum += shfl_xor_f32(sum, 2);
        let qi = w_q0 + g + 8 * r;
        if qi < t {
            // Every valid row saw at least its own key, so sum >= 1.
            let inv = 1.0 / sum;
            // SAFETY: qi < t: this row's head-h slice of `out` (n * t rows of c floats).
            let o = unsafe { p.out.add((bi * t + qi) * c + h * HS + 2 * tq) };
            unroll!(dt < 8 => {
                // SAFETY: dt * 8 + 2 * tq + 1 < HS: inside the row's head slice.
                unsafe {
                    *o.add(dt * MMA_N) = acc[dt][2 * r] * inv;
                    *o.add(dt * MMA_N + 1) = acc[dt][2 * r + 1] * inv;
                }
            });
        }
    }
}

/// Mantissa bits an f32 has beyond TF32's 10.
const TF32_DROPPED_BITS: u32 = 13;
/// Half a TF32 ulp, in f32 bit units: added before truncation, it rounds to
/// nearest with ties away from zero, as `cvt.rna.tf32` does.
const TF32_HALF_ULP: u32 = 1 << (TF32_DROPPED_BITS - 1);
/// Keeps the sign, exponent and 10 mantissa bits.
const TF32_KEEP: u32 = !((1 << TF32_DROPPED_BITS) - 1);

/// `cvt.rna.tf32` for a softmax weight (in [0, 1], or NaN from NaN scores):
/// two integer ops instead of the cvt's expansion with its inf/NaN check. A
/// NaN may come out as a number here, but the row sum (taken before
/// rounding) stays NaN, so the output does too.
#[inline(always)]
fn round_p_tf32(x: f32) -> u32 {
    x.to_bits().wrapping_add(TF32_HALF_ULP) & TF32_KEEP
}

/// Which 16-byte chunks of a 64x64 K/V tile one thread copies (and rounds):
/// thread `tid` of the block takes column chunk `tid % 16` of rows
/// `tid / 16 + i * threads / 16`, `i < 4 * passes`.
#[derive(Clone, Copy)]
struct TileCopy {
    /// First row, and the row step between this thread's chunks.
    row: u32,
    row_step: u32,
    /// Float column of the chunk.
    col: u32,
    /// Batches of [`T_COPY_BATCH`] chunks per tile (1 or 2).
    passes: u32,
}

/// Chunks per K (or V) tile that one copy pass of a thread handles; a
/// rounding pass holds one batch of K and one of V in registers.
const T_COPY_BATCH: usize = 4;

/// Issue this thread's `cp.async` copies of K/V tile rows `key0..key0+64`
/// (rows at or past `n_keys` are zero-filled, never read) from rows of
/// `src_stride` floats.
///
/// # Safety
/// `dst` is a shared tile of [`TILE`] floats; `src` holds K or V rows of
/// `HS` floats every `src_stride` floats (16-byte aligned), rows
/// `0..n_keys` (`n_keys >= 1`) readable.
#[inline(always)]
unsafe fn load_tile_tf32(dst: *mut f32, src: *const f32, src_stride: u32, key0: u32, n_keys: u32, cp: TileCopy) {
    for pass in 0..cp.passes {
        unroll!(i < 4 => {
            let r = cp.row + (pass * T_COPY_BATCH as u32 + i as u32) * cp.row_step;
            let key = key0 + r;
            let valid = key < n_keys;
            // An invalid row copies 0 bytes; its source address is still kept in bounds.
            let src_row = if valid { key } else { n_keys - 1 };
            // SAFETY: r < BK, cp.col + 4 <= HS <= STRIDE: 16 aligned bytes of the caller's
            // stage; `src_row` < n_keys is in the cache plane; invalid rows copy 0 bytes.
            unsafe {
                cp_async_16_zfill(
                    dst.add((r * STRIDE as u32 + cp.col) as usize),
                    src.add((src_row * src_stride + cp.col) as usize),
                    if valid { 16 } else { 0 },
                );
            }
        });
    }
}

/// Round to TF32, in place, the chunks of one K/V stage that this thread
/// copied with [`load_tile_tf32`] (same chunks in both tiles). All loads of a
/// pass are issued before any store: the compiler cannot tell the chunks
/// apart, so a load-round-store sequence would serialise on latency.
///
/// # Safety
/// `k`, `v` are a stage's tiles whose copies by this thread have completed.
#[inline(always)]
unsafe fn round_stage_tf32(k: *mut f32, v: *mut f32, cp: TileCopy) {
    for pass in 0..cp.passes {
        let at = |tile: *mut f32, i: usize| {
            let r = cp.row + (pass * T_COPY_BATCH as u32 + i as u32) * cp.row_step;
            // SAFETY: r < BK rows and cp.col + 4 <= HS: inside the stage tile (the caller's
            // K or V stage).
            unsafe { tile.add((r * STRIDE as u32 + cp.col) as usize) }
        };
        let mut x = [[0f32; VEC]; 2 * T_COPY_BATCH];
        unroll!(i < 8 => {
            // SAFETY: `at` is 16-byte aligned inside the tile (STRIDE, cp.col multiples of 4);
            // this thread's own chunk, landed (the caller waited for it).
            x[i] = unsafe { ld4(at(if i < T_COPY_BATCH { k } else { v }, i % T_COPY_BATCH)) };
        });
        unroll!(i < 8 => {
            let r = x[i].map(|e| f32::from_bits(to_tf32(e)));
            // SAFETY: the same chunk this thread read; no thread reads it before the caller's
            // barrier.
            unsafe { st4(at(if i < T_COPY_BATCH { k } else { v }, i % T_COPY_BATCH), r) };
        });
    }
}

/// Online-softmax state of one warp's 16 rows (two per lane: g and g+8).
struct RowState {
    /// Running max, log2 units.
    m: [f32; 2],
    /// Running sum of this lane's columns (quad-reduced at the end).
    l: [f32; 2],
    /// O fragment, unnormalised; column order as in the module docs.
    acc: [[f32; 4]; DIM_STEPS],
}

/// One warp step of the TF32 kernel: rows g, g+8 of the warp's 16 against 32
/// keys at `kb`/`vb` (rounded shared memory, row stride [`STRIDE`]): S = QKᵀ,
/// mask, online softmax, O += PV.
///
/// `MASK` (only for steps that straddle the diagonal, the window start or the
/// end of the keys; the common step compiles with no mask code at all): the
/// key of column `kk` of the step is visible to row r iff
/// `d0[r] - kk < lim[r]` (u32, wrapping), where `d0[r]` = position of row r
/// minus the step's first key minus 2t, and `lim[r]` = min(window, position
/// + 1): keys after the row wrap to huge distances.
///
/// # Safety
/// `kb`, `vb` point at 32 rows of a published, rounded K/V stage.
#[inline(always)]
unsafe fn attend_sub_tf32<const MASK: bool>(
    st: &mut RowState,
    qf: &[[u32; 4]; DIM_STEPS],
    kb: *const f32,
    vb: *const f32,
    d0: [u32; 2],
    lim: [u32; 2],
    scale: f32,
) {
    let lane = lane_id() as usize;
    let (g, tq) = (lane / 4, lane % 4);

    // S = Q Kᵀ (16 x 32); B = Kᵀ "col": b0/b1 = K[key g][the lane's dims of step ks].
    let mut s = [[0f32; 4]; SUB_STEPS];
    unroll!(n < 4 => {
        // SAFETY: n * 8 + g < SUB_K keys of the stage, the lane's dims at 8 * tq.
        let kr = unsafe { kb.add((n * MMA_N + g) * STRIDE + 2 * VEC * tq) };
        // SAFETY: 8 * tq + 4 <= HS / 2 and HS / 2 + 8 * tq + 8 <= HS: four aligned
        // vectors inside the key row.
        let y = unsafe { [ld4(kr), ld4(kr.add(VEC)), ld4(kr.add(HS / 2)), ld4(kr.add(HS / 2 + VEC))] };
        unroll!(ks < 8 => {
            let (w0, w1) = (2 * ks, 2 * ks + 1);
            let bf = [y[w0 / VEC][w0 % VEC].to_bits(), y[w1 / VEC][w1 % VEC].to_bits()];
            s[n] = mma_m16n8k8_tf32(qf[ks], bf, s[n]);
        });
    });

    // Mask and row max, on raw scores: the scale is positive.
    let mut mx = [f32::NEG_INFINITY; 2];
    unroll!(n < 4 => {
        for (e, x) in s[n].iter_mut().enumerate() {
            let r = e / 2;
            if MASK && d0[r].wrapping_sub((n * MMA_N + (e & 1)) as u32) >= lim[r] {
                *x = f32::NEG_INFINITY;
            }
            mx[r] = mx[r].max(*x);
        }
    });
    // Online softmax: a row lives on the 4 lanes of a quad.
    let mut neg_base = [0f32; 2];
    let mut alpha = [0f32; 2];
    for r in 0..2 {
        let mut x = mx[r];
        x = x.max(shfl_xor_f32(x, 1));
        x = x.max(shfl_xor_f32(x, 2));
        let m_new = st.m[r].max(x * scale);
        let base = softmax_base(m_new);
        alpha[r] = exp2_approx(st.m[r] - base);
        neg_base[r] = -base;
        st.m[r] = m_new;
        st.l[r] *= alpha[r];
    }
    // p = exp2(s*scale - base): one FMA per score; masked -inf gives 0.
    unroll!(n < 4 => {
        for (e, x) in s[n].iter_mut().enumerate() {
            *x = exp2_approx(fma(*x, scale, neg_base[e / 2]));
            st.l[e / 2] += *x;
        }
    });
    unroll!(dt < 8 => {
        for (e, x) in st.acc[dt].iter_mut().enumerate() {
            *x *= alpha[e / 2];
        }
    });

    // O += P V: A = P (k-slot t = key 2t, t+4 = key 2t+1); B = V rows 2t, 2t+1,
    // columns 4g.. and 32+4g.. (module docs).
    unroll!(ks < 4 => {
        let sk = s[ks];
        let af = [round_p_tf32(sk[0]), round_p_tf32(sk[2]), round_p_tf32(sk[1]), round_p_tf32(sk[3])];
        // SAFETY: ks * 8 + 2 * tq + 1 < SUB_K value rows, column 4 * g < HS / 2.
        let v0 = unsafe { vb.add((ks * MMA_N + 2 * tq) * STRIDE + VEC * g) };
        let (lo0, hi0, lo1, hi1) =
            // SAFETY: rows `v0` and `v0 + STRIDE` are value rows of the stage; 4 * g + 4 <=
            // HS / 2 and HS / 2 + 4 * g + 4 <= HS, aligned.
            unsafe { (ld4(v0), ld4(v0.add(HS / 2)), ld4(v0.add(STRIDE)), ld4(v0.add(STRIDE + HS / 2))) };
        unroll!(dt < 8 => {
            let bf = if dt < 4 {
                [lo0[dt % 4].to_bits(), lo1[dt % 4].to_bits()]
            } else {
                [hi0[dt % 4].to_bits(), hi1[dt % 4].to_bits()]
            };
            st.acc[dt] = mma_m16n8k8_tf32(af, bf, st.acc[dt]);
        });
    });
}

/// The TF32 prefill kernel body (see the module docs). Index arithmetic is
/// u32 (the host checks every buffer index fits): 64-bit compares and
/// products doubled the integer work of the hot loop.
///
/// # Safety
/// As for [`attention_forward_flash_tf32`].
#[inline(always)]
unsafe fn flash_prefill_tf32(p: &FlashAttentionParams) {
    let (t, c, nh, b, max_t, pos0, window) = (p.t, p.c, p.nh, p.b, p.max_t, p.pos0, p.window);
    let (hs, bk, rows_w) = (HS as u32, BK as u32, WARP_ROWS as u32);
    let lane = lane_id();
    let warp = warp_id();
    let (g, tq) = (lane / 4, lane % 4);
    // kv_split s: T_WARPS/s row slices of 16 rows; warp w works on slice
    // w % slices with part w / slices of the keys: at kv_split 2 each part
    // takes one 32-key half of every tile, at kv_split 1 a warp takes both.
    let split = if p.kv_split == 2 { 2 } else { 1 };
    let slices = T_WARPS as u32 / split;
    let bq = slices * rows_w;
    let (slice, part) = (warp % slices, warp / slices);
    let (gt, gtid) = (T_THREADS as u32, thread_idx_x());
    let cp = TileCopy {
        row: gtid / VECS_PER_ROW as u32,
        row_step: gt / VECS_PER_ROW as u32,
        col: (gtid % VECS_PER_ROW as u32) * VEC as u32,
        passes: (BK * VECS_PER_ROW) as u32 / gt / T_COPY_BATCH as u32,
    };
    let (sub_lo, sub_hi) = if split == 1 { (0, 2) } else { (part % 2, part % 2 + 1) };

    // 1-D grid, heaviest (latest) query tiles of all (head, row) pairs first.
    // (`max(1)`: the launch guarantees nh, b >= 1; it spares the panic paths.)
    let lin = block_idx_x();
    let (nh1, pairs) = (nh.max(1), (nh * b).max(1));
    let q_tile = t.div_ceil(bq) - 1 - lin / pairs;
    let (h, bi) = ((lin % pairs) % nh1, (lin % pairs) / nh1);

    let q0 = q_tile * bq;
    let q_rows = bq.min(t - q0);
    // Absolute positions of the block's first and last query.
    let (p_min, p_max) = (pos0 + q0, pos0 + q0 + q_rows - 1);
    let key_lo = if window > 0 {
        (p_min + 1).saturating_sub(window)
    } else {
        0
    };
    let first_tile = key_lo / bk;
    let n_tiles = p_max / bk + 1 - first_tile;
    let n_keys = p_max + 1; // keys past it are zero-filled, and masked

    // SAFETY: (whole body) the launch provides FLASH_SMEM_BYTES_TF32 of
    // dynamic shared memory: K stages | V stages (16-byte aligned rows); the
    // kv_split merge reuses it after the loop.
    let smem = unsafe { dynamic_shared_align16::<f32>() };
    let k_s = smem;
    // SAFETY: the V stages follow the T_STAGES K stages.
    let v_s = unsafe { k_s.add(T_STAGES * TILE) };
    let plane = ((bi * nh + h) * max_t * hs) as usize;
    // Where K/V rows come from: the caches, or (`kv_from_qkv`: this call
    // fills them from position 0) this call's own `qkv` rows, whose K/V the
    // block also stores into the caches below (no separate store kernel).
    let from_qkv = p.kv_from_qkv != 0;
    let (k_g, v_g, kv_stride) = if from_qkv {
        let row0 = (bi * t * 3 * c + h * hs) as usize;
        // SAFETY: row0 is row (bi, 0)'s head-h q columns; its K and V columns (+c, +2c)
        // are inside qkv's 3c-float rows.
        unsafe { (p.qkv.add(row0 + c as usize), p.qkv.add(row0 + 2 * c as usize), 3 * c) }
    } else {
        // SAFETY: the row's (bi, h) plane of max_t * hs floats lies inside each cache.
        unsafe { (p.k_cache.add(plane).cast_const(), p.v_cache.add(plane).cast_const(), hs) }
    };
    // SAFETY: stage < T_STAGES: inside the K/V rings; keys below n_keys are readable
    // rows of `k_g`/`v_g` (the cache plane, or this call's qkv rows).
    let load_kv = |i: u32, stage: u32| unsafe {
        let key0 = (first_tile + i) * bk;
        let at = stage as usize * TILE;
        load_tile_tf32(k_s.add(at), k_g, kv_stride, key0, n_keys, cp);
        load_tile_tf32(v_s.add(at), v_g, kv_stride, key0, n_keys, cp);
    };
    // Two tiles in flight from the start (commit group i holds tile i; maybe empty).
    load_kv(0, 0);
    cp_async_commit();
    if n_tiles > 1 {
        load_kv(1, 1);
    }
    cp_async_commit();

    if from_qkv {
        // Keys q0..q0 + q_rows (pos0 = 0) are this block's own query rows:
        // copy their K and V into the caches, all loads of a thread before
        // its stores (they mostly hit L2: the tile copies read the same rows).
        let chunks = q_rows * VECS_PER_ROW as u32;
        let mut kv = [[[0f32; VEC]; 2]; STORE_CHUNKS_PER_THREAD];
        unroll!(j < 8 => {
            let i = gtid + j as u32 * gt;
            if i < chunks {
                let (r, col) = (q0 + i / VECS_PER_ROW as u32, (i % VECS_PER_ROW as u32) * VEC as u32);
                let src = (r * kv_stride + col) as usize;
                // SAFETY: r < q0 + q_rows <= t rows of kv_stride floats, col + 4 <= HS: inside
                // the source, 16-byte aligned.
                kv[j] = unsafe { [ld4(k_g.add(src)), ld4(v_g.add(src))] };
            }
        });
        unroll!(j < 8 => {
            let i = gtid + j as u32 * gt;
            if i < chunks {
                let (r, col) = (q0 + i / VECS_PER_ROW as u32, (i % VECS_PER_ROW as u32) * VEC as u32);
                let dst = plane + (r * hs + col) as usize;
                // SAFETY: r < t <= max_t (pos0 = 0): a row of the (bi, h) plane, col + 4 <= HS;
                // this thread alone writes chunk i.
                unsafe {
                    st4(p.k_cache.add(dst), kv[j][0]);
                    st4(p.v_cache.add(dst), kv[j][1]);
                }
            }
        });
    }

    // This warp's rows: local query index, absolute positions (rows g and g+8).
    let w_q0 = q0 + slice * rows_w;
    let w_p_min = pos0 + w_q0;
    let w_p_max = w_p_min + rows_w - 1;
    let row_p = [w_p_min + g, w_p_min + g + 8];
    // Mask limits (see `attend_sub_tf32`): distance < min(window, pos + 1).
    let lim = row_p.map(|rp| if window > 0 { window.min(rp + 1) } else { rp + 1 });
    let warp_has_rows = slice * rows_w < q_rows;

    // Q as rounded A fragments, straight from global memory (while the first
    // tiles load): lane t's dims [8t, 8t+8) and [32+8t, 40+8t) of rows g, g+8,
    // zero past the last query.
    let q_row = |qi: u32| -> [[f32; VEC]; 4] {
        if qi < t {
            // SAFETY: qi < t: row (bi, qi) of qkv, head h's q columns, lane offset 8 * tq < HS / 2.
            let r = unsafe {
                p.qkv
                    .add(((bi * t + qi) * 3 * c + h * hs + 2 * VEC as u32 * tq) as usize)
            };
            // SAFETY: 8 * tq + 8 <= HS / 2, so the four 16-byte vectors lie inside the row's
            // head slice, aligned (c, hs and the offsets multiples of 4).
            unsafe { [ld4(r), ld4(r.add(VEC)), ld4(r.add(HS / 2)), ld4(r.add(HS / 2 + VEC))] }
        } else {
            [[0.0; VEC]; 4]
        }
    };
    let (qa, qb) = (q_row(w_q0 + g), q_row(w_q0 + g + 8));
    let mut qf = [[0u32; 4]; DIM_STEPS];
    unroll!(ks < 8 => {
        let (w0, w1) = (2 * ks, 2 * ks + 1);
        qf[ks] = [
            to_tf32(qa[w0 / VEC][w0 % VEC]),
            to_tf32(qb[w0 / VEC][w0 % VEC]),
            to_tf32(qa[w1 / VEC][w1 % VEC]),
            to_tf32(qb[w1 / VEC][w1 % VEC]),
        ];
    });

    let mut st = RowState {
        m: [f32::NEG_INFINITY; 2],
        l: [0.0; 2],
        acc: [[0.0; 4]; DIM_STEPS],
    };
    let ring = T_STAGES as u32;
    let (mut stage, mut next_stage) = (0, 2);
    for i in 0..n_tiles {
        // SAFETY: stage < T_STAGES: one K and one V stage of the rings.
        let (kb, vb) = unsafe { (k_s.add(stage as usize * TILE), v_s.add(stage as usize * TILE)) };
        // Tile i's commit group is in (at most the one after it pending);
        // round what this thread copied (unless the caller promised TF32
        // values), then one barrier publishes the stage and also retires
        // iteration i-1, whose stage the next copies reuse.
        cp_async_wait_group::<1>();
        if p.kv_rounded == 0 {
            // SAFETY: the wait above landed this thread's copies of the stage, which only it
            // touches until the barrier below.
            unsafe { round_stage_tf32(kb, vb, cp) };
        }
        sync_threads();
        if i + 2 < n_tiles {
            load_kv(i + 2, next_stage);
        }
        cp_async_commit(); // always, so commit group i stays tile i

        if warp_has_rows {
            let tile = first_tile + i;
            for sub in sub_lo..sub_hi {
                let k0 = tile * bk + sub * SUB_K as u32;
                let k_last = k0 + SUB_K as u32 - 1;
                // Warp-uniform: can any row of this warp see any key of the step?
                if k0 <= w_p_max && (window == 0 || k_last + window > w_p_min) {
                    let needs_mask = k_last > w_p_min || (window > 0 && k0 + window <= w_p_max);
                    // SAFETY: sub < SUBS_PER_TILE: SUB_K rows of the stage.
                    let (kb, vb) = unsafe {
                        (
                            kb.add(sub as usize * SUB_K * STRIDE),
                            vb.add(sub as usize * SUB_K * STRIDE),
                        )
                    };
                    if needs_mask {
                        let d0 = row_p.map(|rp| rp.wrapping_sub(k0 + 2 * tq));
                        // SAFETY: `kb`/`vb` are 32 rows of the stage, rounded and published by the
                        // barrier at the top of the iteration.
                        unsafe { attend_sub_tf32::<true>(&mut st, &qf, kb, vb, d0, lim, p.scale_log2e) };
                    } else {
                        // SAFETY: as for the masked call: 32 published rows of the stage.
                        unsafe { attend_sub_tf32::<false>(&mut st, &qf, kb, vb, [0; 2], [0; 2], p.scale_log2e) };
                    }
                }
            }
        }
        stage = if stage + 1 == ring { 0 } else { stage + 1 };
        next_stage = if next_stage + 1 == ring { 0 } else { next_stage + 1 };
    }

    if split > 1 {
        // Parts 1.. hand their state to part 0 of their slice (same rows, same
        // lane layout), which merges them in order. The rings are free once
        // everyone is past the last step; no copy is in flight (the commit
        // groups after the last tile are empty).
        let others = split - 1;
        // SAFETY: k < others and v < MERGE_VALS: inside the merge area, which the launch's
        // K/V rings (now free: barrier below, no copy in flight) are large enough for.
        let at = |k: u32, v: usize| unsafe {
            smem.add((((slice * others + k) as usize * MERGE_VALS + v) * WARP_SIZE as usize) + lane as usize)
        };
        sync_threads();
        if part > 0 {
            let k = part - 1;
            unroll!(dt < 8 => {
                for e in 0..4 {
                    // SAFETY: 4 * dt + e < MERGE_VALS: this lane's slot of part k's block.
                    unsafe { *at(k, 4 * dt + e) = st.acc[dt][e] };
                }
            });
            for r in 0..2 {
                // SAFETY: 4 * DIM_STEPS + 3 < MERGE_VALS: this lane's m and l slots.
                unsafe {
                    *at(k, 4 * DIM_STEPS + r) = st.m[r];
                    *at(k, 4 * DIM_STEPS + 2 + r) = st.l[r];
                }
            }
        }
        sync_threads();
        if part == 0 {
            for k in 0..others {
                let mut a = [0f32; 2];
                let mut b2 = [0f32; 2];
                for r in 0..2 {
                    // SAFETY: part k's m/l slots, written before the barrier above.
                    let (m2, l2) = unsafe { (*at(k, 4 * DIM_STEPS + r), *at(k, 4 * DIM_STEPS + 2 + r)) };
                    let m_new = st.m[r].max(m2);
                    let base = softmax_base(m_new);
                    a[r] = exp2_approx(st.m[r] - base);
                    b2[r] = exp2_approx(m2 - base);
                    st.l[r] = st.l[r] * a[r] + l2 * b2[r];
                    st.m[r] = m_new;
                }
                unroll!(dt < 8 => {
                    for e in 0..4 {
                        // SAFETY: part k's accumulator slot, written before the barrier above.
                        let other = unsafe { *at(k, 4 * dt + e) };
                        st.acc[dt][e] = fma(st.acc[dt][e], a[e / 2], other * b2[e / 2]);
                    }
                });
            }
        }
    }

    if part == 0 {
        for r in 0..2 {
            let mut sum = st.l[r];
            sum += shfl_xor_f32(sum, 1);
            sum += shfl_xor_f32(sum, 2);
            let qi = w_q0 + g + 8 * r as u32;
            if qi < t {
                // Every valid row saw at least its own key, so sum >= 1.
                let inv = 1.0 / sum;
                // Lane t holds dims [8t, 8t+8) (n-tiles 0..4) and [32+8t, 40+8t) (4..8).
                let a = &st.acc;
                // Entry e of n-tiles dt0..dt0+4, normalised (constant indices once inlined).
                let v = |dt0: usize, e: usize| [0, 1, 2, 3].map(|i| a[dt0 + i][2 * r + e] * inv);
                // SAFETY: qi < t: row (bi, qi) of `out` (b * t rows of c), head h, lane dims 8 * tq.
                let o = unsafe { p.out.add(((bi * t + qi) * c + h * hs + 2 * VEC as u32 * tq) as usize) };
                // SAFETY: 8 * tq + 8 <= HS / 2: the four vectors are inside the head slice, aligned.
                unsafe {
                    st4(o, v(0, 0));
                    st4(o.add(VEC), v(0, 1));
                    st4(o.add(HS / 2), v(4, 0));
                    st4(o.add(HS / 2 + VEC), v(4, 1));
                }
            }
        }
    }
}

/// Prefill flash attention with TF32 tensor-core products (f32 accumulate).
///
/// # Safety
/// Launched as [`FlashAttentionParams`] says (grid, block, shared memory,
/// kv_split 1 or 2); qkv holds b*t*3c floats, out b*t*c, caches b*nh*max_t*HS
/// with positions 0..pos0+t written; c = nh*HS with HS = 64; pos0 + t <= max_t;
/// 16-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_tf32(p: FlashAttentionParams) {
    // SAFETY: the launch contract of this kernel is `flash_prefill_tf32`'s.
    unsafe { flash_prefill_tf32(&p) }
}

/// Prefill flash attention with FP32 FMA products (the exact path).
///
/// # Safety
/// Launched as [`FlashAttentionParams`] says; buffers as for [`attention_forward_flash_tf32`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_fp32(p: FlashAttentionParams) {
    // SAFETY: the launch contract of this kernel is `flash_prefill_fp32`'s.
    unsafe { flash_prefill_fp32(&p) }
}

const DEC_LANES: usize = FLASH_DECODE_LANES_PER_KEY as usize;
/// Key groups per block (8 lanes each).
const DEC_GROUPS: usize = FLASH_DECODE_THREADS as usize / DEC_LANES;
/// Keys each group scores per chunk; unrolled so all their loads are in flight at once.
const DEC_KEYS_PER_GROUP: usize = FLASH_DECODE_CHUNK as usize / DEC_GROUPS;
/// Dimensions per lane: two 16-byte vectors, at `4*lane8` and `32 + 4*lane8`
/// (so 8 lanes read one contiguous 128-byte half row per instruction).
const DEC_HALF: usize = HS / 2;
const _: () = assert!(DEC_LANES * 2 * VEC == HS);
const _: () = assert!(DEC_GROUPS * DEC_KEYS_PER_GROUP == FLASH_DECODE_CHUNK as usize);
const _: () = assert!(
    DEC_KEYS_PER_GROUP == 8,
    "the key loops are unrolled 8 times (`unroll!`)"
);

/// This lane's 8 of a head's 64 query dimensions for the decode kernels:
/// 4 at `q_g`, 4 at `q_g + HS / 2`, multiplied by `scale` (into log2 units).
///
/// # Safety
/// Both 16-byte vectors are readable and 16-byte aligned.
#[inline(always)]
pub(crate) unsafe fn decode_query(q_g: *const f32, scale: f32) -> [f32; 2 * VEC] {
    // SAFETY: the caller's contract.
    let (qa, qb) = unsafe { (ld4(q_g), ld4(q_g.add(HS / 2))) };
    let mut q = [0f32; 2 * VEC];
    for e in 0..VEC {
        q[e] = qa[e] * scale;
        q[VEC + e] = qb[e] * scale;
    }
    q
}

/// This lane's part of one key's score for the decode kernels: q·k over
/// the key's dimensions matching [`decode_query`]'s (`ka`, `kb`); the
/// lanes sharing the key add their parts with [`key_lanes_sum`].
#[inline(always)]
pub(crate) fn key_score_part(q: &[f32; 2 * VEC], ka: [f32; VEC], kb: [f32; VEC]) -> f32 {
    let mut dot = 0f32;
    for e in 0..VEC {
        dot = fma(q[e], ka[e], dot);
        dot = fma(q[VEC + e], kb[e], dot);
    }
    dot
}

/// The sum of `part` over the `lanes` neighbouring lanes that share a key.
/// Every lane of the warp calls it (full-mask shuffles), whether its key is
/// valid or not.
#[inline(always)]
pub(crate) fn key_lanes_sum(mut part: f32, lanes: u32) -> f32 {
    let mut off = 1;
    while off < lanes {
        part += shfl_xor_f32(part, off);
        off *= 2;
    }
    part
}

/// Merge online-softmax states (m, l, acc) of two lane sets; `m` in log2 units.
#[inline(always)]
pub(crate) fn merge_state(m: &mut f32, l: &mut f32, acc: &mut [f32; 2 * VEC], lane_mask: u32) {
    let m2 = shfl_xor_f32(*m, lane_mask);
    let l2 = shfl_xor_f32(*l, lane_mask);
    let m_new = m.max(m2);
    let base = softmax_base(m_new);
    let (a1, a2) = (exp2_approx(*m - base), exp2_approx(m2 - base));
    *l = *l * a1 + l2 * a2;
    for x in acc.iter_mut() {
        let x2 = shfl_xor_f32(*x, lane_mask);
        *x = *x * a1 + x2 * a2;
    }
    *m = m_new;
}

/// Flash-decoding pass 1: one block per (64-key chunk, head, query).
///
/// # Safety
/// As [`FlashDecodeParams`] says; buffers as for the prefill kernels, and the
/// partial buffers hold b*t*nh*parts_stride partials; gridDim.x * 2 <= parts_stride.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_decode(p: FlashDecodeParams) {
    let (t, c, nh, max_t, pos0, window) = (
        p.t as usize,
        p.c as usize,
        p.nh as usize,
        p.max_t as usize,
        p.pos0 as usize,
        p.window as usize,
    );
    let tid = thread_idx_x() as usize;
    let lane = lane_id() as usize;
    let (grp, l8) = (tid / DEC_LANES, lane % DEC_LANES);
    let chunk = block_idx_x() as usize;
    let h = block_idx_y() as usize;
    let bt = block_idx_z() as usize;
    let (bi, ti) = (bt / t, bt % t);
    let pos = pos0 + ti;
    let key_lo = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let key_begin = key_lo + chunk * FLASH_DECODE_CHUNK as usize;
    let key_end = pos + 1;

    // This lane's 8 query dimensions, pre-scaled into log2 units.
    // SAFETY: row bt's head-h q columns plus 4 * l8: two aligned vectors inside qkv.
    let q = unsafe { decode_query(p.qkv.add(bt * 3 * c + h * HS + VEC * l8), p.scale_log2e) };

    let plane = (bi * nh + h) * max_t * HS + VEC * l8;
    // SAFETY: the (bi, h) plane of max_t * HS floats lies inside each cache.
    let (k_g, v_g) = unsafe { (p.k_cache.add(plane), p.v_cache.add(plane)) };
    // Keys are interleaved across groups so that neighbouring groups read neighbouring rows.
    let key_of = |i: usize| key_begin + grp + i * DEC_GROUPS;

    let mut s = [0f32; DEC_KEYS_PER_GROUP];
    unroll!(i < 8 => {
        let key = key_of(i);
        let mut part = 0f32;
        if key < key_end {
            // SAFETY: key < key_end <= max_t: a key row of the plane, both halves aligned.
            let (ka, kb) = unsafe { (ld4(k_g.add(key * HS)), ld4(k_g.add(key * HS + DEC_HALF))) };
            part = key_score_part(&q, ka, kb);
        }
        let dot = key_lanes_sum(part, DEC_LANES as u32);
        s[i] = if key < key_end { dot } else { f32::NEG_INFINITY };
    });
    let mut m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let base = softmax_base(m);
    let mut l = 0f32;
    let mut acc = [0f32; 2 * VEC];
    unroll!(i < 8 => {
        let key = key_of(i);
        if key < key_end {
            let w = exp2_approx(s[i] - base);
            l += w;
            // SAFETY: key < key_end <= max_t: a value row of the plane, both halves aligned.
            let (va, vb) = unsafe { (ld4(v_g.add(key * HS)), ld4(v_g.add(key * HS + DEC_HALF))) };
            for e in 0..VEC {
                acc[e] = fma(w, va[e], acc[e]);
                acc[VEC + e] = fma(w, vb[e], acc[VEC + e]);
            }
        }
    });
    // Merge the warp's 4 key groups (lanes 8 and 16 apart).
    merge_state(&mut m, &mut l, &mut acc, 8);
    merge_state(&mut m, &mut l, &mut acc, 16);

    if lane < DEC_LANES {
        let part = chunk * FLASH_DECODE_PARTS_PER_CHUNK as usize + warp_id() as usize;
        let row = (bt * nh + h) * p.parts_stride as usize + part;
        // SAFETY: part < parts_stride: this warp's row of part_acc (HS floats) and part_ml.
        unsafe {
            let a = p.part_acc.add(row * HS + VEC * l8);
            st4(a, [acc[0], acc[1], acc[2], acc[3]]);
            st4(a.add(DEC_HALF), [acc[4], acc[5], acc[6], acc[7]]);
            if l8 == 0 {
                *p.part_ml.add(2 * row) = m;
                *p.part_ml.add(2 * row + 1) = l;
            }
        }
    }
}

/// Flash-decoding pass 2: one block per (query, head), one thread per dimension.
///
/// # Safety
/// As [`FlashCombineParams`] says; partials written by pass 1 with the same
/// `parts` / `parts_stride`; out holds b*t*c floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_combine(p: FlashCombineParams) {
    let (c, nh, parts) = (p.c as usize, p.nh as usize, p.parts as usize);
    let r = block_idx_x() as usize; // (b*t + ti) * nh + h
    let d = thread_idx_x() as usize;
    let first = r * p.parts_stride as usize;
    // SAFETY: r < b * t * nh rows of parts_stride parts; `first` starts row r's.
    let ml = unsafe { p.part_ml.add(2 * first) };
    let mut m_all = f32::NEG_INFINITY;
    for i in 0..parts {
        // SAFETY: i < parts <= parts_stride: row r's (m, l) pairs.
        m_all = m_all.max(unsafe { *ml.add(2 * i) });
    }
    // Finite: the part holding the query's own key saw a real score.
    let (mut l_all, mut o) = (0f32, 0f32);
    for i in 0..parts {
        // SAFETY: i < parts: row r's (m, l) pairs.
        let w = exp2_approx(unsafe { *ml.add(2 * i) } - m_all);
        // SAFETY: i < parts: row r's (m, l) pairs.
        l_all = fma(unsafe { *ml.add(2 * i + 1) }, w, l_all);
        // SAFETY: i < parts, d < HS: row r's parts in part_acc.
        o = fma(unsafe { *p.part_acc.add((first + i) * HS + d) }, w, o);
    }
    // SAFETY: r / nh < b * t rows of `out`, head r % nh, d < HS.
    unsafe { *p.out.add((r / nh) * c + (r % nh) * HS + d) = o / l_all };
}
