//! `attention_forward`: causal self-attention over the KV cache (twin of
//! `cpu::ops::attention_forward`): stores this call's K,V at positions
//! `pos0..pos0+t`, then attends.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::CacheBits;
use gpu_kernels::params::attention::{
    ATTENTION_BLOCK, ATTENTION_FORWARD, ATTENTION_FORWARD_BF16, ATTENTION_FORWARD_NAIVE, ATTENTION_FORWARD_NAIVE_BF16,
    ATTENTION_KV_STORE, ATTENTION_KV_STORE_BF16, ATTENTION_MAX_HEAD_SIZE, ATTENTION_SIMPLE_BLOCK, AttentionParams,
};

use super::args::{MAX_GRID_YZ, OpError, Variant, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::{AttentionShape, Gpu, GpuError, KvElem};

const OP: &str = "attention_forward";
/// Threads per warp.
const WARP: u32 = 32;
/// Floats of block-reduction scratch at the start of the shared memory.
const REDUCE_SCRATCH: u32 = 32;
/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

/// Shared memory of `attention_forward` (see the kernel's docs): reduction
/// scratch, the query, one partial output per warp, and `span` scores.
pub fn shared_bytes(hs: u32, span: u32) -> u32 {
    let warps = ATTENTION_BLOCK / WARP;
    (REDUCE_SCRATCH + hs + warps * hs + span) * 4
}

/// Most keys any query of a call attends to.
pub fn max_span(pos0: u32, t: u32, window: u32) -> u32 {
    let keys = pos0 + t;
    if window == 0 { keys } else { keys.min(window) }
}

/// Launch configuration of the attention kernel of `variant` over a cache
/// of `K` elements (the KV store's is `kv_store_config`).
pub fn launch_config<K: CacheBits>(variant: Variant, p: &AttentionParams<K>) -> (&'static str, LaunchConfig) {
    let hs = p.c / p.nh;
    match variant {
        Variant::Best => (
            K::kernel(ATTENTION_FORWARD, ATTENTION_FORWARD_BF16),
            LaunchConfig {
                grid_dim: (p.t, p.nh, p.b),
                block_dim: (ATTENTION_BLOCK, 1, 1),
                shared_mem_bytes: shared_bytes(hs, max_span(p.pos0, p.t, p.window)),
            },
        ),
        Variant::Naive => (
            K::kernel(ATTENTION_FORWARD_NAIVE, ATTENTION_FORWARD_NAIVE_BF16),
            LaunchConfig {
                grid_dim: (blocks_for(p.b * p.t * p.nh, ATTENTION_SIMPLE_BLOCK), 1, 1),
                block_dim: (ATTENTION_SIMPLE_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
        ),
    }
}

/// Launch configuration of `attention_kv_store`: a grid-stride loop over
/// b*t*c channels, one thread per 4 of them where the kernel takes 16-byte
/// steps (C and the head size multiples of 4; cudarc's allocations are
/// aligned, and were a buffer not, the loop would still cover it, by strides).
fn kv_store_config<K: CacheBits>(p: &AttentionParams<K>) -> LaunchConfig {
    let vectorised = p.c.is_multiple_of(VEC) && (p.c / p.nh).is_multiple_of(VEC);
    let per_thread = if vectorised { VEC } else { 1 };
    LaunchConfig {
        grid_dim: (blocks_for(p.b * p.t * p.c / per_thread, ATTENTION_SIMPLE_BLOCK), 1, 1),
        block_dim: (ATTENTION_SIMPLE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Channels per 16-byte step of `attention_kv_store`.
const VEC: u32 = 4;

/// The first half of the op, shared by this unfused path and the flash path:
/// store K,V of this call (rows of `p.qkv`) at positions `pos0..pos0+t` of
/// the caches. Reads only `k_cache`, `v_cache`, `qkv` and the sizes of `p`.
///
/// # Safety
/// The caller has checked what `attention_forward_variant` checks: `qkv`
/// holds b*t*3c floats, each cache b*nh*max_t*(c/nh), `pos0 + t <= max_t`,
/// and the pointers belong to `gpu`'s context.
pub(crate) unsafe fn launch_kv_store<K: CacheBits>(gpu: &Gpu, p: &AttentionParams<K>) -> Result<(), GpuError> {
    let kernel = K::kernel(ATTENTION_KV_STORE, ATTENTION_KV_STORE_BF16);
    // SAFETY: forwarded from this function's contract; the kernel is the
    // one for the caches' elements.
    unsafe { gpu.launch(kernel, kv_store_config(p), *p) }
}

/// Store K,V of this call into one layer's caches (f32 or bf16,
/// [`KvElem`]), then attention of every
/// query at positions `pos0..pos0+t` over keys `max(0, p-window+1)..=p`
/// (`window == 0`: all), scale `1/sqrt(hs)`.
pub fn attention_forward<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
) -> Result<(), OpError> {
    attention_forward_variant(gpu, Variant::Best, out, k_cache, v_cache, qkv, shape)
}

/// [`attention_forward`] on the baseline kernel.
pub fn attention_forward_naive<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
) -> Result<(), OpError> {
    attention_forward_variant(gpu, Variant::Naive, out, k_cache, v_cache, qkv, shape)
}

/// [`attention_forward`] with the kernel chosen by `variant`.
pub fn attention_forward_variant<E: KvElem>(
    gpu: &Gpu,
    variant: Variant,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
) -> Result<(), OpError> {
    let AttentionShape {
        b,
        t,
        pos0,
        max_t,
        c,
        nh,
        window,
    } = shape;
    if nh == 0 || !c.is_multiple_of(nh) {
        return Err(OpError::shape(
            OP,
            format!("channels {c} are not divisible by heads {nh}"),
        ));
    }
    let hs = c / nh;
    if pos0 + t > max_t {
        return Err(OpError::shape(
            OP,
            format!("positions {pos0}..{} exceed the cache ({max_t})", pos0 + t),
        ));
    }
    if variant == Variant::Best && hs > ATTENTION_MAX_HEAD_SIZE as usize {
        return Err(OpError::shape(
            OP,
            format!("head size {hs} > {ATTENTION_MAX_HEAD_SIZE}"),
        ));
    }
    count_u32(OP, "b * t * 3c", &[b, t, 3 * c])?;
    count_u32(OP, "cache size", &[b, nh, max_t, hs])?;
    check_len(OP, "out", out.len(), b * t * c)?;
    check_len(OP, "qkv", qkv.len(), b * t * 3 * c)?;
    check_len(OP, "k_cache", k_cache.len(), b * nh * max_t * hs)?;
    check_len(OP, "v_cache", v_cache.len(), b * nh * max_t * hs)?;
    if b == 0 || t == 0 || c == 0 {
        return Ok(());
    }
    if nh > MAX_GRID_YZ as usize || b > MAX_GRID_YZ as usize {
        return Err(OpError::TooLarge {
            op: OP,
            what: "b or nh (grid extent)",
            value: b.max(nh),
        });
    }
    let params = AttentionParams {
        out: out_ptr(gpu, out),
        k_cache: E::bits_mut(out_ptr(gpu, k_cache)),
        v_cache: E::bits_mut(out_ptr(gpu, v_cache)),
        qkv: in_ptr(gpu, qkv),
        b: b as u32,
        t: t as u32,
        pos0: pos0 as u32,
        max_t: to_u32(OP, "max_t", max_t)?,
        c: c as u32,
        nh: nh as u32,
        window: to_u32(OP, "window", window)?,
        scale: 1.0 / (hs as f32).sqrt(),
    };
    let attend = launch_config(variant, &params);
    if attend.1.shared_mem_bytes > DEFAULT_SHARED_LIMIT {
        // Long contexts: opt in to more shared memory (fails cleanly past the device's limit).
        gpu.set_max_dynamic_shared(attend.0, attend.1.shared_mem_bytes)?;
    }
    // SAFETY: sizes checked above (out b*t*c, qkv b*t*3c, caches
    // b*nh*max_t*hs, pos0 + t <= max_t, hs within the kernel's register
    // budget); both launches are on one stream, so the store finishes before
    // attention reads the cache; shared memory sized by `shared_bytes`.
    unsafe {
        launch_kv_store(gpu, &params)?;
        gpu.launch(attend.0, attend.1, params)?;
    }
    Ok(())
}
