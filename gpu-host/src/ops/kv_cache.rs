//! `kv_cache_store`: a decode step's keys and values into the KV cache at
//! each row's own position, its queries into `[n, c]` (twin of
//! `cpu::ops::kv_cache_store`; `kv_cache_store_split`, of
//! `cpu::ops::kv_cache_store_split`, reads the qkv rows as split-K parts).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use gpu_kernels::params::CacheBits;
use gpu_kernels::params::kv_cache::{
    KV_CACHE_STORE, KV_CACHE_STORE_BF16, KV_CACHE_STORE_BLOCK, KV_CACHE_STORE_VEC, KvCacheStoreParams,
};
use half::bf16;

use super::args::{OpError, aligned16, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::{Gpu, GpuError, KvCacheShape, KvRows, SplitSums};

const OP: &str = "kv_cache_store";

/// How a KV cache keeps its values on the device: `f32` (the FP32 and TF32
/// engines), or `bf16` (the bf16 engine's: half the bytes; stores round to
/// nearest even). Every op that reads or writes a cache is generic over it
/// and launches the kernel built for it.
pub trait KvElem: DeviceRepr + ValidAsZeroBits + Copy + Unpin + Send + Sync + 'static {
    /// The element as the kernels' parameters name it (bf16: its bits).
    type Bits: CacheBits;

    /// A device address of these elements as the kernels take it.
    fn bits(p: *const Self) -> *const Self::Bits {
        p.cast()
    }

    /// [`KvElem::bits`], writable.
    fn bits_mut(p: *mut Self) -> *mut Self::Bits {
        p.cast()
    }
}

impl KvElem for f32 {
    type Bits = f32;
}

impl KvElem for bf16 {
    type Bits = u16;
}

/// One layer's K and V caches (`[rows][nh][max_t][hs]` each) in the
/// element type an engine keeps them in: f32, or bf16 (the bf16 engine's).
/// [`with_kv!`](crate::with_kv) runs code generic over [`KvElem`] on
/// either.
pub enum KvCache {
    F32(CudaSlice<f32>, CudaSlice<f32>),
    Bf16(CudaSlice<bf16>, CudaSlice<bf16>),
}

impl KvCache {
    /// Zeroed caches of `len` elements each, bf16 or f32.
    pub fn alloc(gpu: &Gpu, len: usize, bf16: bool) -> Result<Self, GpuError> {
        Ok(if bf16 {
            KvCache::Bf16(gpu.alloc(len)?, gpu.alloc(len)?)
        } else {
            KvCache::F32(gpu.alloc(len)?, gpu.alloc(len)?)
        })
    }

    /// Elements of each cache.
    pub fn len(&self) -> usize {
        match self {
            KvCache::F32(k, v) => k.len().min(v.len()),
            KvCache::Bf16(k, v) => k.len().min(v.len()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `with_kv!(cache, |k, v| body)`: `body` with `k` and `v` bound to the K
/// and V caches of a [`KvCache`] (or of a `&`/`&mut` one: the bindings
/// borrow the same way), once for each element type, so that `body` may
/// call ops generic over [`KvElem`].
#[macro_export]
macro_rules! with_kv {
    ($cache:expr, |$k:ident, $v:ident| $body:expr) => {
        match $cache {
            $crate::ops::kv_cache::KvCache::F32($k, $v) => $body,
            $crate::ops::kv_cache::KvCache::Bf16($k, $v) => $body,
        }
    };
}

/// Launch configuration: a grid-stride loop over `items` (4 channels each).
fn launch_config(items: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(items, KV_CACHE_STORE_BLOCK), 1, 1),
        block_dim: (KV_CACHE_STORE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Row `r` of `qkv` (`[n, 3c]`, `n = shape.rows`): its query to `q[r]`, its
/// key and value into `cache` at the row's position and cache row
/// ([`KvRows`]). A row whose position is at or past `max_t`, or whose cache
/// row is past the caches' rows, is idle: nothing of it enters the cache.
/// The positions and cache rows are read on the device, so a captured graph
/// serves every step.
pub fn kv_cache_store<E: KvElem, K: DevicePtrMut<E>, P: DevicePtr<u32>, Q: DevicePtr<f32>>(
    gpu: &Gpu,
    q: &mut impl DevicePtrMut<f32>,
    cache: KvRows<'_, &mut K, P>,
    qkv: &Q,
    shape: KvCacheShape,
) -> Result<(), OpError> {
    let whole = SplitSums {
        partial: qkv,
        splits: 1,
        bias: None,
    };
    kv_cache_store_split(gpu, q, cache, whole, shape)
}

/// [`kv_cache_store`] of a qkv matmul's output still in split-K parts
/// ([`SplitSums`]: `qkv.splits` slices of `[n, 3c]`, added in order, then
/// the bias), so that no `matmul_split_reduce` runs before it.
pub fn kv_cache_store_split<E: KvElem, K: DevicePtrMut<E>, P: DevicePtr<u32>, Q: DevicePtr<f32>>(
    gpu: &Gpu,
    q: &mut impl DevicePtrMut<f32>,
    cache: KvRows<'_, &mut K, P>,
    qkv: SplitSums<'_, Q>,
    shape: KvCacheShape,
) -> Result<(), OpError> {
    let KvRows {
        k_cache,
        v_cache,
        pos,
        cache_row,
    } = cache;
    let SplitSums {
        partial: qkv,
        splits,
        bias,
    } = qkv;
    let KvCacheShape { rows: n, c, nh, max_t } = shape;
    let vec = KV_CACHE_STORE_VEC as usize;
    if nh == 0 || !c.is_multiple_of(nh) || !(c / nh).is_multiple_of(vec) {
        return Err(OpError::shape(
            OP,
            format!("c = {c}, nh = {nh}: the head size must be a multiple of {vec}"),
        ));
    }
    if splits == 0 {
        return Err(OpError::shape(OP, "no parts to add (splits = 0)"));
    }
    let total = count_u32(OP, "n * 3 * c", &[n, 3, c])?;
    count_u32(OP, "splits * n * 3 * c", &[splits, n, 3, c])?;
    check_len(OP, "q", q.len(), n * c)?;
    check_len(OP, "qkv", qkv.len(), splits * n * 3 * c)?;
    if let Some(b) = bias {
        check_len(OP, "bias", b.len(), 3 * c)?;
    }
    check_len(OP, "pos", pos.len(), n)?;
    let cache_rows = k_cache.len().min(v_cache.len()) / (c * max_t).max(1);
    match cache_row {
        Some(rows) => check_len(OP, "cache_row", rows.len(), n)?,
        None => check_len(OP, "cache rows", cache_rows, n)?,
    }
    if total == 0 {
        return Ok(());
    }
    let p = KvCacheStoreParams {
        q: out_ptr(gpu, q),
        k_cache: E::bits_mut(out_ptr(gpu, k_cache)),
        v_cache: E::bits_mut(out_ptr(gpu, v_cache)),
        qkv: in_ptr(gpu, qkv),
        bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        splits: to_u32(OP, "splits", splits)?,
        pos: in_ptr(gpu, pos),
        cache_row: cache_row.map_or(std::ptr::null(), |r| in_ptr(gpu, r)),
        cache_rows: to_u32(OP, "cache rows", cache_rows)?,
        n: n as u32,
        c: c as u32,
        nh: nh as u32,
        max_t: to_u32(OP, "max_t", max_t)?,
    };
    let addresses = [p.q as usize, p.k_cache as usize, p.v_cache as usize];
    if !aligned16(&addresses) || !aligned16(&[p.qkv as usize, p.bias as usize]) {
        return Err(OpError::shape(OP, "buffers must be 16-byte aligned"));
    }
    // The kernel for the cache's element type.
    let kernel = E::Bits::kernel(KV_CACHE_STORE, KV_CACHE_STORE_BF16);
    // SAFETY: q holds n*c floats, qkv splits*n*3c, the bias (if any) 3c, pos n,
    // cache_row n (or is null and the caches hold n rows), the caches
    // cache_rows rows of nh x max_t x c/nh, and the kernel writes no row past
    // them (checked above); c and c/nh are multiples of 4 and the buffers
    // 16-byte aligned (a null bias passes as 0); splits*n*3*c < 2^32; the
    // kernel is the one for the caches' element type.
    unsafe { gpu.launch(kernel, launch_config(total / KV_CACHE_STORE_VEC), p)? };
    Ok(())
}
