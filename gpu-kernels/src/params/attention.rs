//! Causal self-attention with a KV cache (see docs/design.md for the contract).

/// Stores this call's K and V (from `qkv`) into the caches at positions
/// `pos0..pos0 + t`. Runs before either attention kernel.
pub const ATTENTION_KV_STORE: &str = "attention_kv_store";
/// One block per (query, head, batch row): the block's warps split the keys,
/// scores live in shared memory, softmax by block reductions, then each warp
/// accumulates its keys' share of `P·V` and the warps' partial sums are added.
/// Good for prefill and for decode (t = 1 over a long cache alike).
pub const ATTENTION_FORWARD: &str = "attention_forward";
/// Baseline: one thread per (query, head), two passes over the keys.
pub const ATTENTION_FORWARD_NAIVE: &str = "attention_forward_naive";
/// The three kernels above over a bf16 cache (`AttentionParams<u16>`).
pub const ATTENTION_KV_STORE_BF16: &str = "attention_kv_store_bf16";
pub const ATTENTION_FORWARD_BF16: &str = "attention_forward_bf16";
pub const ATTENTION_FORWARD_NAIVE_BF16: &str = "attention_forward_naive_bf16";

/// Threads per block of `attention_forward` (4 warps).
pub const ATTENTION_BLOCK: u32 = 128;
/// Threads per block of the KV store and naive kernels.
pub const ATTENTION_SIMPLE_BLOCK: u32 = 256;
/// Largest head size `attention_forward` supports: each lane keeps
/// `MAX_HEAD_SIZE / 32` output accumulators in registers.
pub const ATTENTION_MAX_HEAD_SIZE: u32 = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams<K = f32> {
    /// `[b * t * c]`
    pub out: *mut f32,
    /// `[b * nh * max_t * hs]`, one layer: f32, or bf16 bits (`K = u16`)
    pub k_cache: *mut K,
    /// `[b * nh * max_t * hs]`, one layer, as `k_cache`
    pub v_cache: *mut K,
    /// `[b * t * 3c]`, rows `[q | k | v]`
    pub qkv: *const f32,
    pub b: u32,
    pub t: u32,
    pub pos0: u32,
    pub max_t: u32,
    pub c: u32,
    pub nh: u32,
    /// 0: attend to every earlier key; else to the last `window` keys (self included).
    pub window: u32,
    /// `1 / sqrt(hs)`, computed once on the host.
    pub scale: f32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
super::cache_kernel_params!(unsafe AttentionParams);
