//! `kv_cache_store`: one decode step's keys and values into the KV cache,
//! each row at its own position (a server's sequences, each at its own
//! position), and its queries into a buffer of their own.
//!
//! The fused decode step writes K and V from its qkv GEMV's epilogue; a
//! decode step over more rows than the fused kernels serve runs the qkv
//! matmul of the prefill path, then this, then `decode_attention` (which
//! reads the queries `[n, c]` and the cache).

/// One thread per 4 consecutive channels of a row's `3 * c` (q, k, v).
pub const KV_CACHE_STORE: &str = "kv_cache_store";
/// [`KV_CACHE_STORE`] into a bf16 cache (`KvCacheStoreParams<u16>`).
pub const KV_CACHE_STORE_BF16: &str = "kv_cache_store_bf16";
/// Threads per block (elementwise work).
pub const KV_CACHE_STORE_BLOCK: u32 = 256;
/// Channels per thread (16-byte loads and stores).
pub const KV_CACHE_STORE_VEC: u32 = 4;

/// Arguments of [`KV_CACHE_STORE`]. Launch: a grid-stride loop over
/// `n * 3 * c / 4` items, [`KV_CACHE_STORE_BLOCK`] threads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KvCacheStoreParams<K = f32> {
    /// `[n, c]`: row `r`'s query (the first `c` of its qkv row).
    pub q: *mut f32,
    /// `[cache_rows][nh][max_t][c / nh]` each, f32 or bf16 bits (`K = u16`,
    /// rounded to nearest even): row `r` of the call writes cache row
    /// `cache_row[r]` (or `r`), position `pos[r]`.
    pub k_cache: *mut K,
    pub v_cache: *mut K,
    /// `[splits][n, 3 * c]`: q, k, v of each row (the qkv matmul's output),
    /// in `splits` split-K parts that are added in order (1: whole).
    pub qkv: *const f32,
    /// `[3 * c]`, or null: the qkv matmul's bias, added after the parts
    /// (the bits `matmul_split_reduce` would give).
    pub bias: *const f32,
    pub splits: u32,
    /// `[n]` positions; a row at or past `max_t` is idle: its keys and
    /// values are not stored (its query still is).
    pub pos: *const u32,
    /// `[n]` the cache row of each row of the call (several rows may share
    /// one: a prefill's tokens), or null: row `r` is cache row `r`. A cache
    /// row at or past `cache_rows` is idle like a position past `max_t`.
    pub cache_row: *const u32,
    /// Rows the caches hold.
    pub cache_rows: u32,
    pub n: u32,
    /// Channels, a multiple of 4 and of `nh`; `c / nh` a multiple of 4.
    pub c: u32,
    pub nh: u32,
    pub max_t: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
super::cache_kernel_params!(unsafe KvCacheStoreParams);
