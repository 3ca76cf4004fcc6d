//! `kv_cache_store`: a decode step's keys and values into the cache at each
//! row's own position, its queries into `[n, c]` (contract:
//! `params::kv_cache`).

use super::vec4::{VEC, load4, store4};
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::kv_cache::KvCacheStoreParams;

/// Q of row `r` to `q[r]`, K and V to the cache at `pos[r]` (nothing for an
/// idle row), 4 channels per thread.
///
/// # Safety
/// Buffers as documented on [`KvCacheStoreParams`], 16-byte aligned; `c`,
/// `c / nh` multiples of 4 (the host checks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_cache_store(p: KvCacheStoreParams) {
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
        // SAFETY: r < n, j + 4 <= 3c: inside the qkv row; aligned as promised.
        let x = unsafe { load4(p.qkv.add(r * 3 * c + j)) };
        if part == 0 {
            // SAFETY: r * c + ch + 4 <= n * c.
            unsafe { store4(p.q.add(r * c + ch as usize), x) };
        } else {
            // SAFETY: pos holds n entries.
            let pos = unsafe { *p.pos.add(r) } as usize;
            if pos < max_t {
                let (h, d) = ((ch / hs) as usize, (ch % hs) as usize);
                let (nh, hs) = (nh as usize, hs as usize);
                let cache = if part == 1 { p.k_cache } else { p.v_cache };
                // SAFETY: cache row r < rows, head h < nh, pos < max_t, d + 4
                // <= hs (hs % 4 == 0).
                unsafe { store4(cache.add(((r * nh + h) * max_t + pos) * hs + d), x) };
            }
        }
        i += grid_stride_x();
    }
}
