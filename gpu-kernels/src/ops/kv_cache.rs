//! `kv_cache_store`: a decode step's keys and values into the cache at each
//! row's own position, its queries into `[n, c]` (contract:
//! `params::kv_cache`).

use super::vec4::{VEC, store4, sum_parts4};
use crate::device::{F32Storage, global_idx_x, grid_stride_x};
use crate::params::kv_cache::KvCacheStoreParams;

/// The cache row of row `r` of a call: `cache_row[r]`, or `r` where the
/// call maps rows to themselves (null).
///
/// # Safety
/// `cache_row` is null or holds more than `r` entries.
#[inline(always)]
pub(crate) unsafe fn cache_row(cache_row: *const u32, r: usize) -> usize {
    if cache_row.is_null() {
        r
    } else {
        // SAFETY: the caller's contract.
        unsafe { *cache_row.add(r) as usize }
    }
}

/// Q of row `r` to `q[r]`, K and V to its cache row at `pos[r]` (nothing
/// for an idle row), 4 channels per thread; the qkv row summed from its
/// split-K parts, plus the bias, where the matmul left them so.
///
/// # Safety
/// Buffers as documented on [`KvCacheStoreParams`], 16-byte aligned; `c`,
/// `c / nh` multiples of 4 (the host checks).
#[inline(always)]
unsafe fn kv_cache_store_impl<K: F32Storage>(p: KvCacheStoreParams<K>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // 32-bit index arithmetic (64-bit division is a long software sequence
    // on the GPU): `n * 3 * c` < 2^32 (the host checks).
    let (c, nh, max_t) = (p.c, p.nh, p.max_t as usize);
    let hs = c / nh;
    let row_items = 3 * c / VEC as u32;
    let total = p.n * row_items;
    let mut i = global_idx_x();
    while i < total {
        let (r, j) = (i / row_items, (i % row_items) * VEC as u32);
        let (part, ch) = (j / c, j % c);
        let (r, j, c) = (r as usize, j as usize, c as usize);
        let bias = if p.bias.is_null() {
            p.bias
        } else {
            // SAFETY: j + 4 <= 3c, inside the bias's 3c floats.
            unsafe { p.bias.add(j) }
        };
        // SAFETY: r < n, j + 4 <= 3c: inside the qkv row of every part (part s at
        // s * n * 3c); aligned as promised.
        let x = unsafe { sum_parts4(p.qkv.add(r * 3 * c + j), p.n as usize * 3 * c, p.splits as usize, bias) };
        if part == 0 {
            // SAFETY: r * c + ch + 4 <= n * c.
            unsafe { store4(p.q.add(r * c + ch as usize), x) };
        } else {
            // SAFETY: pos (and cache_row, when not null) hold n entries.
            let (pos, cr) = unsafe { (*p.pos.add(r) as usize, cache_row(p.cache_row, r)) };
            if pos < max_t && cr < p.cache_rows as usize {
                let (h, d) = ((ch / hs) as usize, (ch % hs) as usize);
                let (nh, hs) = (nh as usize, hs as usize);
                let cache = if part == 1 { p.k_cache } else { p.v_cache };
                // SAFETY: cache row cr < cache_rows, head h < nh, pos < max_t,
                // d + 4 <= hs (hs % 4 == 0).
                unsafe { K::store4(cache.add(((cr * nh + h) * max_t + pos) * hs + d), x) };
            }
        }
        i += grid_stride_x();
    }
}

/// `kv_cache_store_impl` into an f32 cache.
///
/// # Safety
/// As `kv_cache_store_impl`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_cache_store(p: KvCacheStoreParams<f32>) {
    // SAFETY: the caller's contract.
    unsafe { kv_cache_store_impl(p) }
}

/// `kv_cache_store_impl` into a bf16 cache.
///
/// # Safety
/// As `kv_cache_store_impl` (the cache 8-byte aligned).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_cache_store_bf16(p: KvCacheStoreParams<u16>) {
    // SAFETY: the caller's contract.
    unsafe { kv_cache_store_impl(p) }
}
