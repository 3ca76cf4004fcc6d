//! `out[n, oc] = inp[n, c] · weight[oc, c]ᵀ + bias[oc]`, optionally followed by GELU.

/// Shared-memory + register tiled kernel: each block computes a
/// `MATMUL_TILE_M x MATMUL_TILE_N` tile of `out`, each thread
/// `MATMUL_THREAD_M x MATMUL_THREAD_N` of it.
pub const MATMUL_FORWARD: &str = "matmul_forward";
/// Decode path for few rows (`n <= MATMUL_GEMV_MAX_ROWS`): one warp per
/// output column streams its weight row once for every input row.
pub const MATMUL_FORWARD_GEMV: &str = "matmul_forward_gemv";
/// Baseline: one thread per output element (llm.c's kernel 1).
pub const MATMUL_FORWARD_NAIVE: &str = "matmul_forward_naive";

/// Rows of `out` per block tile.
pub const MATMUL_TILE_M: u32 = 64;
/// Columns of `out` per block tile.
pub const MATMUL_TILE_N: u32 = 64;
/// Depth of the slice of `c` staged in shared memory per step.
pub const MATMUL_TILE_K: u32 = 16;
/// Rows of `out` per thread.
pub const MATMUL_THREAD_M: u32 = 4;
/// Columns of `out` per thread.
pub const MATMUL_THREAD_N: u32 = 4;
/// Threads per block of the tiled kernel: one per `THREAD_M x THREAD_N` patch.
pub const MATMUL_BLOCK: u32 = (MATMUL_TILE_M / MATMUL_THREAD_M) * (MATMUL_TILE_N / MATMUL_THREAD_N);

/// Most input rows the GEMV kernel keeps accumulators for.
pub const MATMUL_GEMV_MAX_ROWS: u32 = 8;
/// Threads per block of the GEMV kernel (4 warps: 4 output columns per block,
/// small blocks so even `oc = 768` fills every SM).
pub const MATMUL_GEMV_BLOCK: u32 = 128;
/// Threads per block of the naive kernel, as a square `NAIVE_SIDE x NAIVE_SIDE`.
pub const MATMUL_NAIVE_SIDE: u32 = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulParams {
    /// `[n * oc]`
    pub out: *mut f32,
    /// `[n * c]`
    pub inp: *const f32,
    /// `[oc * c]` (PyTorch's Linear layout: out, in)
    pub weight: *const f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU (tanh approximation) to the result.
    pub gelu: u32,
}

crate::kernel_params!(MatmulParams);
