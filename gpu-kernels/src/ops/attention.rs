//! Causal self-attention over a KV cache.
//!
//! Every call first stores its own keys and values in the cache
//! ([`attention_kv_store`]), then each query at absolute position `p`
//! attends to the cached keys `lo(p)..=p` (`lo = p + 1 - window` when
//! windowed, else 0). Prefill (`pos0 = 0`, many queries) and decode
//! (`t = 1` over a long cache) run the same kernels.

use super::vec4::{VEC, aligned16, load4};
use crate::device::math::exp_fast;
use crate::device::shared::dynamic_shared_align16;
use crate::device::warp::{block_reduce_max, block_reduce_sum};
use crate::device::{
    F32Storage, WARP_SIZE, block_dim_x, block_idx_x, block_idx_y, block_idx_z, global_idx_x, grid_stride_x, lane_id,
    sync_threads, thread_idx_x, warp_id,
};
use crate::params::attention::{ATTENTION_MAX_HEAD_SIZE, AttentionParams};
/// Floats of shared scratch the block reductions need (one per warp).
pub const REDUCE_SCRATCH: usize = 32;
/// Output dimensions each lane accumulates in `attention_forward`.
const DIMS_PER_LANE: usize = (ATTENTION_MAX_HEAD_SIZE / WARP_SIZE) as usize;

/// First key a query at absolute position `pos` may attend to.
#[inline(always)]
fn first_key(pos: u32, window: u32) -> u32 {
    if window == 0 {
        0
    } else {
        (pos + 1).saturating_sub(window)
    }
}

/// Offset of (row `b`, head `h`, position `pos`) in one layer's cache.
#[inline(always)]
fn cache_at<K>(p: &AttentionParams<K>, b: u32, h: u32, pos: u32) -> usize {
    let hs = (p.c / p.nh) as usize;
    ((b * p.nh + h) as usize * p.max_t as usize + pos as usize) * hs
}

/// Copy this call's K and V out of `qkv` into the caches at `pos0..pos0+t`.
/// A grid-stride loop over (row, token, channel), reads and writes both
/// coalesced: 4 channels per step with 16-byte accesses when C and the head
/// size are multiples of 4 and the buffers aligned (the host sizes the grid
/// for that: `kv_store_vectorised`), else one. Index arithmetic is u32 (the
/// host checks that `b*t*3c` and the cache size fit), which is no faster
/// than 64-bit in measurement (H200, 1x1024: 6.4 vs 6.6 µs, mostly the fixed
/// cost of a small launch) but needs no 64-bit divisions.
///
/// # Safety
/// Buffers as documented on [`AttentionParams`]; `pos0 + t <= max_t`;
/// `b*t*3c` and `b*nh*max_t*hs` fit in u32.
#[inline(always)]
unsafe fn attention_kv_store_impl<K: F32Storage>(p: AttentionParams<K>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let (c, hs, t) = (p.c, p.c / p.nh, p.t);
    let total = p.b * t * c;
    // Where channel `ch` of token `bt` is read, and where it lands in the cache.
    let at = |bt: u32, ch: u32| {
        let (b, pos) = (bt / t, p.pos0 + bt % t);
        let dst = ((b * p.nh + ch / hs) * p.max_t + pos) * hs + ch % hs;
        ((bt * 3 * c + ch) as usize, dst as usize)
    };
    let (c_us, stride) = (c as usize, grid_stride_x());
    let vectorised = c % VEC as u32 == 0
        && hs % VEC as u32 == 0
        && aligned16(p.qkv)
        && K::aligned4(p.k_cache)
        && K::aligned4(p.v_cache);
    let mut i = global_idx_x();
    if vectorised {
        while i < total / VEC as u32 {
            let e = i * VEC as u32;
            // A 4-channel group never straddles a head (hs % 4 == 0).
            let (src, dst) = at(e / c, e % c);
            // SAFETY: src + 2c + 4 <= b*t*3c; dst + 4 is inside the cache
            // (pos0 + t <= max_t); all 16-byte aligned (checked).
            unsafe {
                K::store4(p.k_cache.add(dst), load4(p.qkv.add(src + c_us)));
                K::store4(p.v_cache.add(dst), load4(p.qkv.add(src + 2 * c_us)));
            }
            i += stride;
        }
    } else {
        while i < total {
            let (src, dst) = at(i / c, i % c);
            // SAFETY: src + 2c < b*t*3c; dst is inside the cache (pos0 + t <= max_t).
            unsafe {
                K::store1(p.k_cache.add(dst), *p.qkv.add(src + c_us));
                K::store1(p.v_cache.add(dst), *p.qkv.add(src + 2 * c_us));
            }
            i += stride;
        }
    }
}

/// One block per (query, head, row): grid `(t, nh, b)`, `ATTENTION_BLOCK`
/// threads. Dynamic shared memory, in floats:
/// `REDUCE_SCRATCH | q[hs] | partial[warps * hs] | scores[span]` where
/// `span` bounds the number of keys of any query of the call.
///
/// 1. the scaled query goes to shared memory;
/// 2. thread `i` scores keys `lo + i, lo + i + blockDim, ...` (16-byte loads
///    of the key row) into `scores`, tracking its maximum;
/// 3. block max, then `exp(s - max)` in place and the block sum;
/// 4. warp `w` takes keys `lo + w, lo + w + warps, ...`; lane `l` owns
///    dimensions `l, l + 32, ...` and reads value rows coalesced;
/// 5. the warps' partial outputs are summed and divided by the softmax sum.
///
/// # Safety
/// Buffers as documented on [`AttentionParams`]; `hs <= ATTENTION_MAX_HEAD_SIZE`;
/// the cache holds keys `0..pos0 + t` of these rows (the store kernel ran);
/// shared memory as above.
#[inline(always)]
unsafe fn attention_forward_impl<K: F32Storage>(p: AttentionParams<K>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let (tq, h, b) = (block_idx_x(), block_idx_y(), block_idx_z());
    let hs = (p.c / p.nh) as usize;
    let tid = thread_idx_x() as usize;
    let threads = block_dim_x() as usize;
    let warps = threads / WARP_SIZE as usize;
    let pos = p.pos0 + tq;
    let lo = first_key(pos, p.window);
    let span = (pos + 1 - lo) as usize;
    // SAFETY: the launch sized shared memory for this layout.
    let (scratch, q_s, part, scores) = unsafe {
        let s = dynamic_shared_align16::<f32>();
        let q = s.add(REDUCE_SCRATCH);
        let part = q.add(hs);
        (s, q, part, part.add(warps * hs))
    };
    let row = (b * p.t + tq) as usize;
    let qkv_row = row * 3 * p.c as usize + h as usize * hs;
    let mut d = tid;
    while d < hs {
        // SAFETY: the query's head slice is inside qkv; d < hs.
        unsafe { *q_s.add(d) = *p.qkv.add(qkv_row + d) * p.scale };
        d += threads;
    }
    sync_threads();

    // SAFETY: lo <= pos < max_t, h < nh, b < B: the cache holds this row's
    // (b, h) slab of max_t positions, so `lo`'s offset is inside it.
    let keys = unsafe { p.k_cache.add(cache_at(&p, b, h, lo)) }.cast_const();
    // SAFETY: the same in-bounds offset as `keys`, in the value cache.
    let values = unsafe { p.v_cache.add(cache_at(&p, b, h, lo)) }.cast_const();
    let vec = hs.is_multiple_of(VEC) && K::aligned4(keys);
    let mut local_max = f32::NEG_INFINITY;
    let mut j = tid;
    while j < span {
        // SAFETY: key lo + j <= pos < pos0 + t <= max_t; the row has hs floats.
        let s = unsafe {
            let k = keys.add(j * hs);
            let mut s = 0.0f32;
            if vec {
                for i in 0..hs / VEC {
                    let kv = K::load4(k.add(i * VEC));
                    let qv = load4(q_s.add(i * VEC));
                    s += (qv[0] * kv[0] + qv[1] * kv[1]) + (qv[2] * kv[2] + qv[3] * kv[3]);
                }
            } else {
                for i in 0..hs {
                    s += *q_s.add(i) * K::load1(k.add(i));
                }
            }
            *scores.add(j) = s;
            s
        };
        local_max = local_max.max(s);
        j += threads;
    }
    // SAFETY: scratch is REDUCE_SCRATCH floats; every thread calls it.
    let max = unsafe { block_reduce_max(local_max, scratch) };
    let mut local_sum = 0.0f32;
    let mut j = tid;
    while j < span {
        // SAFETY: j < span, this thread's own score.
        unsafe {
            let e = exp_fast(*scores.add(j) - max);
            *scores.add(j) = e;
            local_sum += e;
        }
        j += threads;
    }
    // Its barriers also publish every thread's exponentials to the block.
    // SAFETY: scratch is REDUCE_SCRATCH floats; every thread calls it (as for the max).
    let sum = unsafe { block_reduce_sum(local_sum, scratch) };

    let (w, lane) = (warp_id() as usize, lane_id() as usize);
    let mut acc = [0.0f32; DIMS_PER_LANE];
    let mut j = w;
    while j < span {
        // SAFETY: j < span; dims d < hs of the value row.
        unsafe {
            let pj = *scores.add(j);
            let v = values.add(j * hs);
            for (r, a) in acc.iter_mut().enumerate() {
                let d = lane + r * WARP_SIZE as usize;
                if d < hs {
                    *a += pj * K::load1(v.add(d));
                }
            }
        }
        j += warps;
    }
    for (r, a) in acc.iter().enumerate() {
        let d = lane + r * WARP_SIZE as usize;
        if d < hs {
            // SAFETY: w < warps, d < hs.
            unsafe { *part.add(w * hs + d) = *a };
        }
    }
    sync_threads();
    let inv = 1.0 / sum;
    let out_row = row * p.c as usize + h as usize * hs;
    let mut d = tid;
    while d < hs {
        let mut o = 0.0f32;
        for w in 0..warps {
            // SAFETY: w < warps, d < hs.
            o += unsafe { *part.add(w * hs + d) };
        }
        // SAFETY: the head slice of this query's output row.
        unsafe { *p.out.add(out_row + d) = o * inv };
        d += threads;
    }
}

/// Baseline: one thread per (row, query, head), grid-stride; a first pass
/// over the keys finds the maximum score, a second accumulates
/// `exp(s - max) · v` straight into `out`, which is then normalised.
///
/// # Safety
/// As for [`attention_forward`] (no shared memory).
#[inline(always)]
unsafe fn attention_forward_naive_impl<K: F32Storage>(p: AttentionParams<K>) {
    let hs = (p.c / p.nh) as usize;
    let total = p.b * p.t * p.nh;
    let mut i = global_idx_x();
    while i < total {
        let (bt, h) = (i / p.nh, i % p.nh);
        let (b, tq) = (bt / p.t, bt % p.t);
        let pos = p.pos0 + tq;
        let lo = first_key(pos, p.window);
        // SAFETY: all offsets inside the buffers as documented.
        unsafe {
            let q = p.qkv.add(bt as usize * 3 * p.c as usize + h as usize * hs);
            let out = p.out.add(bt as usize * p.c as usize + h as usize * hs);
            let score = |j: u32| {
                let k = p.k_cache.add(cache_at(&p, b, h, j));
                let mut s = 0.0f32;
                for d in 0..hs {
                    s += *q.add(d) * K::load1(k.add(d));
                }
                s * p.scale
            };
            let mut max = f32::NEG_INFINITY;
            for j in lo..=pos {
                max = max.max(score(j));
            }
            for d in 0..hs {
                *out.add(d) = 0.0;
            }
            let mut sum = 0.0f32;
            for j in lo..=pos {
                let e = exp_fast(score(j) - max);
                sum += e;
                let v = p.v_cache.add(cache_at(&p, b, h, j));
                for d in 0..hs {
                    *out.add(d) += e * K::load1(v.add(d));
                }
            }
            for d in 0..hs {
                *out.add(d) /= sum;
            }
        }
        i += grid_stride_x();
    }
}

/// The kernels' entry points: each `_impl` over an f32 cache and over a
/// bf16 one (`_bf16`), with its safety contract.
macro_rules! attention_entries {
    ($($name:ident, $name_bf16:ident => $imp:ident;)+) => {$(
        /// The f32-cache entry of the `_impl` of the same name.
        ///
        /// # Safety
        /// As that `_impl`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: AttentionParams<f32>) {
            // SAFETY: the caller's contract.
            unsafe { $imp(p) }
        }

        /// The bf16-cache entry of the `_impl` of the same name.
        ///
        /// # Safety
        /// As that `_impl`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name_bf16(p: AttentionParams<u16>) {
            // SAFETY: the caller's contract.
            unsafe { $imp(p) }
        }
    )+};
}

attention_entries! {
    attention_kv_store, attention_kv_store_bf16 => attention_kv_store_impl;
    attention_forward, attention_forward_bf16 => attention_forward_impl;
    attention_forward_naive, attention_forward_naive_bf16 => attention_forward_naive_impl;
}
