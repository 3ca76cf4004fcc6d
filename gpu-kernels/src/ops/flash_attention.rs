//! Flash attention: the `attention_forward` op fused into one pass over the
//! KV cache, with no T x T matrix in memory (contract: docs/design.md).
//!
//! Prefill (`attention_forward_flash_{tf32,fp32}`): one block of 4 warps per
//! (64-query tile, head, batch row). Q and a 2-stage ring of 64-key K/V tiles
//! live in shared memory (filled by `cp.async`); each warp owns 16 query rows
//! and keeps their scores, running max/sum and output accumulator in registers
//! in the m16n8k8 C-fragment layout (row g = lane/4 and g+8, columns 2t, 2t+1
//! with t = lane%4). Scores are scaled by log2(e)/sqrt(HS) so `ex2` is the
//! only transcendental. Tiles above the causal diagonal or wholly before the
//! window are never loaded; tiles a warp cannot see are skipped by that warp;
//! only tiles that straddle a boundary pay for per-element masks.
//! - TF32: QKᵀ and PV on tensor cores. The P fragment is fed to the PV MMA
//!   straight from the score registers: the contraction index of PV is the key,
//!   whose order inside an 8-key step is free, so logical k = t holds key 2t and
//!   k = t+4 holds key 2t+1 (exactly what the C fragment of S holds), and the V
//!   operand is read with the same permutation. No shuffles, no shared-memory trip.
//! - FP32: the same tiles and register layout with FMA products (exact path);
//!   P goes through a per-warp shared-memory block because SIMT PV needs whole rows.
//!
//! Decode (`attention_forward_flash_decode` + `_combine`), flash-decoding for a
//! few queries over a long cache: a block reduces one 64-key chunk for one
//! (query, head); 8 lanes share a key (8 dimensions each, 16-byte loads, so a
//! warp reads 4 whole K rows per instruction pair), each warp merges its 4 key
//! groups with shuffles and writes one partial (max, sum, acc[64]); the combine
//! kernel merges the partials of each (query, head).

use crate::device::math::exp2_approx;
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k8_tf32, to_tf32};
use crate::device::shared::dynamic_shared_align16;
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
/// 16-byte copies each thread issues per tile.
const COPIES_PER_THREAD: usize = BK * VECS_PER_ROW / THREADS;
const _: () = assert!(
    BQ == (THREADS / WARP_SIZE as usize) * WARP_ROWS,
    "one warp per 16 query rows"
);
const _: () = assert!(BQ == BK, "Q and K/V tiles share the copy routine");
const _: () = assert!(BK * VECS_PER_ROW % THREADS == 0);
const _: () = assert!(STAGES == 2, "the pipeline below is written for a 2-stage ring");
const _: () = assert!(
    KEY_STEPS == 8 && DIM_STEPS == 8,
    "the fragment loops are unrolled by `unroll8!`"
);

/// Repeat `$body` for `$i` = 0..8 as a constant. The fragment arrays must be
/// indexed by constants to stay in registers, and LLVM's unroller gives up on
/// the 8x8 MMA nests (it left them as loops over a 128-byte local array).
macro_rules! unroll8 {
    ($i:ident => $body:block) => {
        unroll8!(@ $i $body; 0 1 2 3 4 5 6 7)
    };
    (@ $i:ident $body:block; $($n:literal)*) => {
        $( { let $i: usize = $n; $body } )*
    };
}

/// 16 aligned bytes, so loads of it become `ld.v4.f32`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct F4([f32; 4]);

/// # Safety
/// `p` is 16-byte aligned and readable for 16 bytes.
#[inline(always)]
unsafe fn ld4(p: *const f32) -> [f32; 4] {
    unsafe { (*(p as *const F4)).0 }
}

/// # Safety
/// `p` is 16-byte aligned and writable for 16 bytes.
#[inline(always)]
unsafe fn st4(p: *mut f32, v: [f32; 4]) {
    unsafe { *(p as *mut F4) = F4(v) }
}

/// a*b + c with one rounding (`fma.rn.f32`); Rust does not contract `a*b+c` itself.
#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

/// `exp2(x - m)` where `m` is a running maximum that may still be -inf (no
/// key seen yet): then every `x` is -inf too and the result must be 0, not NaN.
#[inline(always)]
fn softmax_base(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}

/// Issue the `cp.async` copies of one 64x64 tile: rows `row0..row0+64` of a
/// row-major source with `src_stride` floats per row; rows at or past `rows`
/// are zero-filled (never read from memory).
///
/// # Safety
/// `dst` is a shared tile of [`TILE`] floats; rows `row0..rows` of `src` are readable.
#[inline(always)]
unsafe fn load_tile(dst: *mut f32, src: *const f32, src_stride: usize, row0: usize, rows: usize) {
    let tid = thread_idx_x() as usize;
    for i in 0..COPIES_PER_THREAD {
        let idx = tid + i * THREADS;
        let (r, col) = (idx / VECS_PER_ROW, (idx % VECS_PER_ROW) * VEC);
        let valid = row0 + r < rows;
        // An invalid row copies 0 bytes; its source address is still kept in bounds.
        let src_row = if valid { row0 + r } else { row0.min(rows - 1) };
        unsafe {
            cp_async_16_zfill(
                dst.add(r * STRIDE + col),
                src.add(src_row * src_stride + col),
                if valid { 16 } else { 0 },
            );
        }
    }
}

/// The prefill kernel body, for both precisions (see the module docs).
///
/// # Safety
/// As for [`attention_forward_flash_tf32`].
#[inline(always)]
unsafe fn flash_prefill<const TF32: bool>(p: &FlashAttentionParams) {
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

    // SAFETY (whole body): the launch provides FLASH_SMEM_BYTES_{TF32,FP32} of
    // dynamic shared memory, laid out Q | K stages | V stages | P blocks (FP32).
    // 16-byte aligned: cp.async targets and ld.shared.v4 rows.
    let smem = unsafe { dynamic_shared_align16::<f32>() };
    let q_s = smem;
    let k_s = unsafe { smem.add(TILE) };
    let v_s = unsafe { smem.add((1 + STAGES) * TILE) };
    let p_s = unsafe { smem.add((1 + 2 * STAGES) * TILE + warp * WARP_ROWS * STRIDE) };

    let plane = (bi * nh + h) * max_t * HS;
    let (k_g, v_g) = unsafe { (p.k_cache.add(plane), p.v_cache.add(plane)) };
    let q_g = unsafe { p.qkv.add(bi * t * 3 * c + h * HS) };
    let load_kv = |tile: usize, stage: usize| unsafe {
        load_tile(k_s.add(stage * TILE), k_g, HS, tile * BK, n_keys);
        load_tile(v_s.add(stage * TILE), v_g, HS, tile * BK, n_keys);
    };
    unsafe { load_tile(q_s, q_g, 3 * c, q0, t) };
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
    let mut q_frag = [[0u32; 4]; DIM_STEPS]; // TF32 only: Q as A fragments, loaded once

    for j in 0..n_tiles {
        let stage = j % STAGES;
        if j + 1 < n_tiles {
            load_kv(first_tile + j + 1, (j + 1) % STAGES);
        }
        // Always commit (maybe an empty group), so "all but 1 pending" means tile j is in.
        cp_async_commit();
        cp_async_wait_group::<1>();
        sync_threads();

        if TF32 && j == 0 {
            unroll8!(ks => {
                let qa = unsafe { q_s.add((warp * WARP_ROWS + g) * STRIDE + ks * MMA_N + tq) };
                unsafe {
                    q_frag[ks] = [to_tf32(*qa), to_tf32(*qa.add(8 * STRIDE)), to_tf32(*qa.add(4)), to_tf32(*qa.add(8 * STRIDE + 4))];
                }
            });
        }

        let k0 = (first_tile + j) * BK; // first key of the tile
        let k_last = k0 + BK - 1;
        // Warp-uniform: can any row of this warp see any key of the tile?
        let visible = warp_has_rows && k0 <= w_p_max && (window == 0 || k_last + window > w_p_min);
        if visible {
            let kb = unsafe { k_s.add(stage * TILE) };
            let vb = unsafe { v_s.add(stage * TILE) };

            // S = Q Kᵀ for the warp's 16 rows x 64 keys, C-fragment layout.
            let mut s = [[0f32; 4]; KEY_STEPS];
            if TF32 {
                unroll8!(n => {
                    unroll8!(ks => {
                        // B = Kᵀ (8 dims x 8 keys), "col": b0 = K[key g][dim t], b1 = K[key g][dim t+4].
                        let kr = unsafe { kb.add((n * MMA_N + g) * STRIDE + ks * MMA_N + tq) };
                        let bf = unsafe { [to_tf32(*kr), to_tf32(*kr.add(4))] };
                        s[n] = mma_m16n8k8_tf32(q_frag[ks], bf, s[n]);
                    });
                });
            } else {
                let qa = unsafe { q_s.add((warp * WARP_ROWS + g) * STRIDE) };
                let qb = unsafe { qa.add(8 * STRIDE) };
                for d in (0..HS).step_by(VEC) {
                    let (a0, a1) = unsafe { (ld4(qa.add(d)), ld4(qb.add(d))) };
                    unroll8!(n => {
                        let kr = unsafe { kb.add((n * MMA_N + 2 * tq) * STRIDE + d) };
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
            }

            // Scale into log2 units; mask only where the tile straddles the
            // diagonal, the window start or the end of the keys.
            let needs_mask = k_last > w_p_min || (window > 0 && k0 + window <= w_p_max);
            let mut tile_max = [f32::NEG_INFINITY; 2];
            unroll8!(n => {
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
            unroll8!(n => {
                for (e, x) in s[n].iter_mut().enumerate() {
                    *x = exp2_approx(*x - base[e / 2]);
                    l[e / 2] += *x;
                }
            });
            unroll8!(dt => {
                for (e, x) in acc[dt].iter_mut().enumerate() {
                    *x *= alpha[e / 2];
                }
            });

            // O += P V.
            if TF32 {
                unroll8!(ks => {
                    // Key order permuted within the step (module docs): A = P with
                    // k=t -> key 2t, k=t+4 -> key 2t+1; B rows follow suit.
                    let sk = s[ks];
                    let af = [to_tf32(sk[0]), to_tf32(sk[2]), to_tf32(sk[1]), to_tf32(sk[3])];
                    let v0 = unsafe { vb.add((ks * MMA_N + 2 * tq) * STRIDE + g) };
                    unroll8!(dt => {
                        let bf = unsafe { [to_tf32(*v0.add(dt * MMA_N)), to_tf32(*v0.add(STRIDE + dt * MMA_N))] };
                        acc[dt] = mma_m16n8k8_tf32(af, bf, acc[dt]);
                    });
                });
            } else {
                unroll8!(n => {
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
                    let (pa, pb) = unsafe { (*p_s.add(g * STRIDE + key), *p_s.add((g + 8) * STRIDE + key)) };
                    let vr = unsafe { vb.add(key * STRIDE + 2 * tq) };
                    unroll8!(dt => {
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
            let o = unsafe { p.out.add((bi * t + qi) * c + h * HS + 2 * tq) };
            unroll8!(dt => {
                unsafe {
                    *o.add(dt * MMA_N) = acc[dt][2 * r] * inv;
                    *o.add(dt * MMA_N + 1) = acc[dt][2 * r + 1] * inv;
                }
            });
        }
    }
}

/// Prefill flash attention with TF32 tensor-core products (f32 accumulate).
///
/// # Safety
/// Launched as [`FlashAttentionParams`] says (grid, block, shared memory);
/// qkv holds b*t*3c floats, out b*t*c, caches b*nh*max_t*HS with positions
/// 0..pos0+t written; c = nh*HS with HS = 64; pos0 + t <= max_t; 16-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_tf32(p: FlashAttentionParams) {
    unsafe { flash_prefill::<true>(&p) }
}

/// Prefill flash attention with FP32 FMA products (the exact path).
///
/// # Safety
/// As for [`attention_forward_flash_tf32`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_fp32(p: FlashAttentionParams) {
    unsafe { flash_prefill::<false>(&p) }
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
const _: () = assert!(DEC_KEYS_PER_GROUP == 8, "the key loops are unrolled by `unroll8!`");

/// Merge online-softmax states (m, l, acc) of two lane sets; `m` in log2 units.
#[inline(always)]
fn merge_state(m: &mut f32, l: &mut f32, acc: &mut [f32; 2 * VEC], lane_mask: u32) {
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
    let q_g = unsafe { p.qkv.add(bt * 3 * c + h * HS + VEC * l8) };
    let (qa, qb) = unsafe { (ld4(q_g), ld4(q_g.add(DEC_HALF))) };
    let mut q = [0f32; 2 * VEC];
    for e in 0..VEC {
        q[e] = qa[e] * p.scale_log2e;
        q[VEC + e] = qb[e] * p.scale_log2e;
    }

    let plane = (bi * nh + h) * max_t * HS + VEC * l8;
    let (k_g, v_g) = unsafe { (p.k_cache.add(plane), p.v_cache.add(plane)) };
    // Keys are interleaved across groups so that neighbouring groups read neighbouring rows.
    let key_of = |i: usize| key_begin + grp + i * DEC_GROUPS;

    let mut s = [0f32; DEC_KEYS_PER_GROUP];
    unroll8!(i => {
        let key = key_of(i);
        let mut dot = 0f32;
        if key < key_end {
            let (ka, kb) = unsafe { (ld4(k_g.add(key * HS)), ld4(k_g.add(key * HS + DEC_HALF))) };
            for e in 0..VEC {
                dot = fma(q[e], ka[e], dot);
                dot = fma(q[VEC + e], kb[e], dot);
            }
        }
        // All lanes shuffle (full mask), valid key or not.
        let mut off = 1;
        while off < DEC_LANES as u32 {
            dot += shfl_xor_f32(dot, off);
            off *= 2;
        }
        s[i] = if key < key_end { dot } else { f32::NEG_INFINITY };
    });
    let mut m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let base = softmax_base(m);
    let mut l = 0f32;
    let mut acc = [0f32; 2 * VEC];
    unroll8!(i => {
        let key = key_of(i);
        if key < key_end {
            let w = exp2_approx(s[i] - base);
            l += w;
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
    let ml = unsafe { p.part_ml.add(2 * first) };
    let mut m_all = f32::NEG_INFINITY;
    for i in 0..parts {
        m_all = m_all.max(unsafe { *ml.add(2 * i) });
    }
    // Finite: the part holding the query's own key saw a real score.
    let (mut l_all, mut o) = (0f32, 0f32);
    for i in 0..parts {
        let w = exp2_approx(unsafe { *ml.add(2 * i) } - m_all);
        l_all = fma(unsafe { *ml.add(2 * i + 1) }, w, l_all);
        o = fma(unsafe { *p.part_acc.add((first + i) * HS + d) }, w, o);
    }
    unsafe { *p.out.add((r / nh) * c + (r % nh) * HS + d) = o / l_all };
}
