//! Flash-decoding pass 1 (`attention_forward_flash_decode`), for a few
//! queries over a long cache: a block reduces one 64-key chunk for one
//! (query, head); 8 lanes share a key (8 dimensions each, 16-byte loads, so a
//! warp reads 4 whole K rows per instruction pair), each warp merges its 4 key
//! groups with shuffles and writes one partial (max, sum, acc\[64\]); pass 2
//! (`super::combine`) merges the partials of each (query, head).
//!
//! The per-key helpers here are shared with the fused decode kernels
//! (`ops::decode`), which score keys the same way.

use super::{HS, VEC, ld4, softmax_base, st4};
use crate::device::math::{exp2_approx, fma};
use crate::device::unroll;
use crate::device::warp::shfl_xor_f32;
use crate::device::{F32Storage, block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x, warp_id};
use crate::params::flash_attention::*;

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
#[inline(always)]
unsafe fn attention_forward_flash_decode_impl<K: F32Storage>(p: FlashDecodeParams<K>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
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
            let (ka, kb) = unsafe { (K::load4(k_g.add(key * HS)), K::load4(k_g.add(key * HS + DEC_HALF))) };
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
            let (va, vb) = unsafe { (K::load4(v_g.add(key * HS)), K::load4(v_g.add(key * HS + DEC_HALF))) };
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

/// `attention_forward_flash_decode_impl` over an f32 cache.
///
/// # Safety
/// As `attention_forward_flash_decode_impl`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_decode(p: FlashDecodeParams<f32>) {
    // SAFETY: the caller's contract.
    unsafe { attention_forward_flash_decode_impl(p) }
}

/// `attention_forward_flash_decode_impl` over a bf16 cache.
///
/// # Safety
/// As `attention_forward_flash_decode_impl`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_decode_bf16(p: FlashDecodeParams<u16>) {
    // SAFETY: the caller's contract.
    unsafe { attention_forward_flash_decode_impl(p) }
}
