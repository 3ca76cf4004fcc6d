//! TF32 prefill (`attention_forward_flash_tf32`), tensor cores for QKᵀ and PV
//! (the tiling both prefill kernels share is in the parent module's notes):
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

use super::{BK, DIM_STEPS, HS, MMA_N, STRIDE, TILE, VEC, VECS_PER_ROW, WARP_ROWS, ld4, softmax_base, st4};
use crate::device::math::{exp2_approx, fma};
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k8_tf32, to_tf32};
use crate::device::shared::dynamic_shared_align16;
use crate::device::unroll;
use crate::device::warp::shfl_xor_f32;
use crate::device::{WARP_SIZE, block_idx_x, lane_id, sync_threads, thread_idx_x, warp_id};
use crate::params::flash_attention::*;

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
const _: () = assert!((BK * VECS_PER_ROW).is_multiple_of(T_THREADS));
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
