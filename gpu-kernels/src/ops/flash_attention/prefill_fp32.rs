//! FP32 prefill (`attention_forward_flash_fp32`, the exact path): 4 warps and
//! 64 queries per block, a 2-stage ring, FMA products; P goes through a
//! per-warp shared-memory block because SIMT PV needs whole rows. The tiling
//! both prefill kernels share is in the parent module's notes.

use super::{BK, DIM_STEPS, HS, MMA_N, STRIDE, TILE, VEC, VECS_PER_ROW, WARP_ROWS, ld4, softmax_base};
use crate::device::math::{exp2_approx, fma};
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group};
use crate::device::shared::dynamic_shared_align16;
use crate::device::unroll;
use crate::device::warp::shfl_xor_f32;
use crate::device::{
    WARP_SIZE, block_idx_x, block_idx_y, block_idx_z, grid_dim_x, lane_id, sync_threads, sync_warp, thread_idx_x,
    warp_id,
};
use crate::params::flash_attention::*;

const BQ: usize = FLASH_BLOCK_Q as usize;
const THREADS: usize = FLASH_THREADS as usize;
const STAGES: usize = FLASH_STAGES as usize;
/// 8-key column blocks of a score tile (n-tiles of S, k-steps of PV).
const KEY_STEPS: usize = BK / MMA_N;
const _: () = assert!(
    BQ == (THREADS / WARP_SIZE as usize) * WARP_ROWS,
    "one warp per 16 query rows"
);
const _: () = assert!(BQ == BK, "Q and K/V tiles share the copy routine");
const _: () = assert!((BK * VECS_PER_ROW).is_multiple_of(THREADS));
const _: () = assert!(STAGES == 2, "the FP32 pipeline is written for a 2-stage ring");
const _: () = assert!(
    KEY_STEPS == 8 && DIM_STEPS == 8,
    "the fragment loops are unrolled 8 times (`unroll!`)"
);

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

/// Prefill flash attention with FP32 FMA products (the exact path).
///
/// # Safety
/// Launched as [`FlashAttentionParams`] says; buffers as for
/// [`attention_forward_flash_tf32`](super::prefill_tf32::attention_forward_flash_tf32).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_fp32(p: FlashAttentionParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: the launch contract of this kernel is `flash_prefill_fp32`'s.
    unsafe { flash_prefill_fp32(&p) }
}
