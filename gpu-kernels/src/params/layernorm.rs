//! Layernorm over the last axis: `out = (x - mean) / sqrt(var + eps) * weight + bias`.

/// One warp per row, two-pass mean/variance, 16-byte loads where aligned.
pub const LAYERNORM_FORWARD: &str = "layernorm_forward";
/// `residual = inp1 + inp2`, then the layernorm of `residual` (same launch
/// shape as [`LAYERNORM_FORWARD`]): the residual add that closes one
/// sub-block and the layernorm that opens the next, in one pass.
pub const RESIDUAL_LAYERNORM_FORWARD: &str = "residual_layernorm_forward";
/// `residual = inp1 + (the split-K partial sums of a projection, added in
/// split order, + its bias)`, then the layernorm of `residual`: the
/// projection's `matmul_split_reduce` folded in too. One block per row, a
/// 16-byte vector per thread ([`residual_layernorm_split_block`]).
pub const RESIDUAL_LAYERNORM_SPLIT_FORWARD: &str = "residual_layernorm_split_forward";
/// Baseline: one thread per row (llm.c's kernel 1).
pub const LAYERNORM_FORWARD_NAIVE: &str = "layernorm_forward_naive";
/// Threads per block of `layernorm_forward`: 8 warps, so 8 rows per block.
pub const LAYERNORM_BLOCK: u32 = 256;
/// Threads per block of the naive kernel (one row per thread).
pub const LAYERNORM_NAIVE_BLOCK: u32 = 128;
/// Floats per thread of `residual_layernorm_split_forward` (one 16-byte vector).
pub const RESIDUAL_LAYERNORM_SPLIT_VEC: u32 = 4;
/// Widest row `residual_layernorm_split_forward` takes: one vector per thread
/// of a 1024-thread block.
pub const RESIDUAL_LAYERNORM_SPLIT_MAX_C: u32 = 1024 * RESIDUAL_LAYERNORM_SPLIT_VEC;
/// Dynamic shared memory of `residual_layernorm_split_forward`: the block
/// reductions' scratch, a float per warp of a 1024-thread block.
pub const RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES: u32 = 32 * 4;

/// Threads per block of `residual_layernorm_split_forward` for rows of `c`
/// channels: a vector each, whole warps.
pub const fn residual_layernorm_split_block(c: u32) -> u32 {
    c.div_ceil(RESIDUAL_LAYERNORM_SPLIT_VEC).div_ceil(32) * 32
}

/// GPT-2's epsilon.
pub const LAYERNORM_EPS: f32 = 1e-5;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LayernormParams {
    /// `[n * c]`
    pub out: *mut f32,
    /// `[n * c]`
    pub inp: *const f32,
    /// `[c]`
    pub weight: *const f32,
    /// `[c]`
    pub bias: *const f32,
    pub n: u32,
    pub c: u32,
    /// Nonzero: round every output to TF32 (it feeds a TF32 matmul that then
    /// need not round it; see `matmul_tf32::MatmulTf32WgmmaParams::round_inp`).
    pub round_tf32: u32,
    /// Null, or `[n * c]` bf16 bits written instead of `out` (rounded to
    /// nearest even), for a bf16 matmul that reads them next (`out` is then
    /// not touched and `round_tf32` not used).
    pub out_bf16: *mut u16,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe LayernormParams);

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ResidualLayernormParams {
    /// `[n * c]`: `inp1 + inp2` (the residual stream after the add).
    pub residual: *mut f32,
    /// `[n * c]`: the layernorm of `residual`.
    pub out: *mut f32,
    /// `[n * c]`
    pub inp1: *const f32,
    /// `[n * c]`
    pub inp2: *const f32,
    /// `[c]`
    pub weight: *const f32,
    /// `[c]`
    pub bias: *const f32,
    pub n: u32,
    pub c: u32,
    /// As [`LayernormParams::round_tf32`] (for `out`; `residual` is exact).
    pub round_tf32: u32,
    /// As [`LayernormParams::out_bf16`].
    pub out_bf16: *mut u16,
}

/// Arguments of [`RESIDUAL_LAYERNORM_SPLIT_FORWARD`]. Grid `n` blocks of
/// [`residual_layernorm_split_block`]`(c)` threads,
/// [`RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES`] of dynamic shared memory;
/// `c % 4 == 0`, `c <=` [`RESIDUAL_LAYERNORM_SPLIT_MAX_C`], every pointer
/// 16-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ResidualLayernormSplitParams {
    /// `[n * c]`: `inp1 + sum(partial) + proj_bias`.
    pub residual: *mut f32,
    /// `[n * c]`: the layernorm of `residual`.
    pub out: *mut f32,
    /// `[n * c]`
    pub inp1: *const f32,
    /// `[splits * n * c]`: slice `s` holds part `s` of the projection's k.
    pub partial: *const f32,
    /// `[c]`, or null: the projection's bias.
    pub proj_bias: *const f32,
    pub splits: u32,
    /// `[c]`
    pub weight: *const f32,
    /// `[c]`
    pub bias: *const f32,
    pub n: u32,
    pub c: u32,
    /// As [`LayernormParams::round_tf32`] (for `out`; `residual` is exact).
    pub round_tf32: u32,
    /// As [`LayernormParams::out_bf16`].
    pub out_bf16: *mut u16,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe ResidualLayernormParams, ResidualLayernormSplitParams);
