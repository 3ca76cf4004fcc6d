//! `out[n, oc] = inp[n, c] · weight[oc, c]ᵀ + bias[oc]`, optionally followed by GELU.

/// Shared-memory + register tiled kernel, `MATMUL_TILE_M x MATMUL_TILE_N`
/// block tile (`MATMUL_BLOCK` threads, each `MATMUL_THREAD_M x
/// MATMUL_THREAD_N` outputs).
pub const MATMUL_FORWARD: &str = "matmul_forward";
/// The same kernel with a `MATMUL_TILE_M_MID x MATMUL_TILE_N` block tile
/// (`MATMUL_BLOCK_MID` threads): twice the blocks, for shapes where the large
/// tile would leave SMs idle.
pub const MATMUL_FORWARD_MID: &str = "matmul_forward_mid";
/// Decode path for few rows (`n <= MATMUL_GEMV_MAX_ROWS`): one warp per
/// output column streams its weight row once for every input row.
pub const MATMUL_FORWARD_GEMV: &str = "matmul_forward_gemv";
/// Baseline: one thread per output element (llm.c's kernel 1).
pub const MATMUL_FORWARD_NAIVE: &str = "matmul_forward_naive";
/// Split-K second pass: sums the `[splits, n, oc]` partial tiles the tiled
/// kernels wrote (fixed order, no atomics), then bias and the optional GELU.
pub const MATMUL_SPLIT_REDUCE: &str = "matmul_split_reduce";

/// Rows of `out` per block tile (large variant).
pub const MATMUL_TILE_M: u32 = 128;
/// Rows of `out` per block tile (mid-size variant).
pub const MATMUL_TILE_M_MID: u32 = 64;
/// Columns of `out` per block tile (both variants).
pub const MATMUL_TILE_N: u32 = 128;
/// Depth of the slice of `c` staged in shared memory per step.
pub const MATMUL_TILE_K: u32 = 8;
/// Rows of `out` per thread.
pub const MATMUL_THREAD_M: u32 = 8;
/// Columns of `out` per thread.
pub const MATMUL_THREAD_N: u32 = 8;
/// Threads per block of the large variant: one per `THREAD_M x THREAD_N` patch.
pub const MATMUL_BLOCK: u32 = (MATMUL_TILE_M / MATMUL_THREAD_M) * (MATMUL_TILE_N / MATMUL_THREAD_N);
/// Threads per block of the mid-size variant.
pub const MATMUL_BLOCK_MID: u32 = (MATMUL_TILE_M_MID / MATMUL_THREAD_M) * (MATMUL_TILE_N / MATMUL_THREAD_N);
/// Floats of padding after each k-row of a shared tile: makes the transposed
/// stores of the two k-halves of a warp land in different banks, and keeps
/// rows 16-byte aligned for `ld.shared.v4`.
pub const MATMUL_SMEM_PAD: u32 = 4;
/// Shared-memory buffers per operand (double buffering: one is read while
/// the next k-slice is written to the other).
pub const MATMUL_STAGES: u32 = 2;

/// Dynamic shared memory, in bytes, of the tiled kernel with `tile_m` rows.
pub const fn matmul_shared_bytes(tile_m: u32) -> u32 {
    let floats = MATMUL_STAGES * MATMUL_TILE_K * ((tile_m + MATMUL_SMEM_PAD) + (MATMUL_TILE_N + MATMUL_SMEM_PAD));
    floats * core::mem::size_of::<f32>() as u32
}

/// Blocks of the large tiled kernel resident on one SM (registers: ptxas
/// gives it at most 128 per thread, 256 threads, 64 K registers per SM).
/// The host's wave model uses it; a GPU test checks it against the driver's
/// occupancy calculator.
pub const MATMUL_BLOCKS_PER_SM: u32 = 2;
/// Blocks of the mid-size tiled kernel resident on one SM (128 registers x
/// 128 threads).
pub const MATMUL_BLOCKS_PER_SM_MID: u32 = 4;

/// Threads per block of the split-K reduction (one 4-float group of the
/// output per thread).
pub const MATMUL_SPLIT_REDUCE_BLOCK: u32 = 256;
/// Output floats each thread of the split-K reduction sums.
pub const MATMUL_SPLIT_REDUCE_PER_THREAD: u32 = 4;

/// Most input rows the GEMV kernel keeps accumulators for.
pub const MATMUL_GEMV_MAX_ROWS: u32 = 8;
/// Threads per block of the GEMV kernel (4 warps: 4 output columns per block,
/// small blocks so even `oc = 768` fills every SM).
pub const MATMUL_GEMV_BLOCK: u32 = 128;
/// Threads per block of the naive kernel, as a square `NAIVE_SIDE x NAIVE_SIDE`.
pub const MATMUL_NAIVE_SIDE: u32 = 16;

/// Small-M kernel (`ops::matmul_small`): a `MATMUL_SMALL_TILE_M x
/// MATMUL_SMALL_TILE_N` output tile per block over one split of `c` (grid
/// z); each block writes its partial tile to a workspace, and the block of a
/// tile that arrives last (an arrival counter per tile) sums the partials in
/// split order, adds the bias and applies GELU: split-K in one launch,
/// deterministic. For `n` up to a couple of tiles of rows (short prompts),
/// where the 128-row tiles waste rows and a second reduction launch costs as
/// much as the GEMM.
pub const MATMUL_FORWARD_SMALL: &str = "matmul_forward_small";
/// Rows of `out` per block tile: one tile row covers a 64-token prompt.
pub const MATMUL_SMALL_TILE_M: u32 = 64;
/// Columns of `out` per block tile: small, so that N = 768 still gives 12
/// tiles to split, and the A tile (re-read once per tile column) stays
/// cheap next to W.
pub const MATMUL_SMALL_TILE_N: u32 = 64;
/// Rows each thread accumulates (`ty + 8 i`).
pub const MATMUL_SMALL_THREAD_M: u32 = 8;
/// Columns each thread accumulates (`tx + 16 j`).
pub const MATMUL_SMALL_THREAD_N: u32 = 4;
/// Threads per block: one per `THREAD_M x THREAD_N` patch of the tile.
pub const MATMUL_SMALL_BLOCK: u32 =
    (MATMUL_SMALL_TILE_M / MATMUL_SMALL_THREAD_M) * (MATMUL_SMALL_TILE_N / MATMUL_SMALL_THREAD_N);
/// Depth of one staged k-slice (two 16-byte chunks per row); a split's depth
/// (`k_chunk`) is a multiple of it.
pub const MATMUL_SMALL_TILE_K: u32 = 8;
/// Shared-memory slices of the `cp.async` ring: three in flight while the
/// fourth is read.
pub const MATMUL_SMALL_STAGES: u32 = 4;
/// Floats of padding after each staged row (`TILE_K + PAD = 12`): the 16
/// W rows a warp reads with one `ld.shared.v4` cover the 8 bank quads twice
/// each (the minimum for 256 bytes); keeps rows 16-byte aligned.
pub const MATMUL_SMALL_PAD: u32 = 4;
/// Floats of one block's partial tile in the workspace.
pub const MATMUL_SMALL_PARTIAL_FLOATS: u32 = MATMUL_SMALL_TILE_M * MATMUL_SMALL_TILE_N;
/// Blocks of the small-M kernel resident on one SM (the host's model uses
/// it; a GPU test checks it against the driver's occupancy calculator).
pub const MATMUL_SMALL_BLOCKS_PER_SM: u32 = 4;

/// Dynamic shared memory, bytes, of the small-M kernel: the ring of staged
/// slices, each the tile's A rows then its W rows.
pub const fn matmul_small_shared_bytes() -> u32 {
    let rows = MATMUL_SMALL_TILE_M + MATMUL_SMALL_TILE_N;
    MATMUL_SMALL_STAGES * rows * (MATMUL_SMALL_TILE_K + MATMUL_SMALL_PAD) * core::mem::size_of::<f32>() as u32
}

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
    /// Tiled kernels only: depth of `c` each split covers. Block `z` of a
    /// grid with `Z` splits sums `k` in `z * k_chunk .. min(c, (z + 1) *
    /// k_chunk)` and writes its partial tile to `out + z * n * oc`. Unsplit
    /// (grid z = 1): `k_chunk >= c`, `out` is the result. Split (z > 1):
    /// `k_chunk` is a multiple of `MATMUL_TILE_K`, `out` holds `Z * n * oc`
    /// floats, `bias` is null and `gelu` is 0 (the reduction applies them).
    pub k_chunk: u32,
}

/// Arguments of [`MATMUL_SPLIT_REDUCE`]: `out[i] = epilogue(sum over s of
/// partial[s * n * oc + i])`, summed in order s = 0, 1, ... .
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulSplitReduceParams {
    /// `[n * oc]`
    pub out: *mut f32,
    /// `[splits * n * oc]`: the tiled kernels' partial sums.
    pub partial: *const f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    pub oc: u32,
    pub splits: u32,
    /// Nonzero: apply GELU (tanh approximation) to the result.
    pub gelu: u32,
}

/// Arguments of [`MATMUL_FORWARD_SMALL`]. Grid `(ceil(oc / TILE_N),
/// ceil(n / TILE_M), splits)`; block `z` sums `k` in `z * k_chunk ..
/// min(c, (z + 1) * k_chunk)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulSmallParams {
    /// `[n * oc]`
    pub out: *mut f32,
    /// `[n * c]`
    pub inp: *const f32,
    /// `[oc * c]`
    pub weight: *const f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    /// `[tiles * splits * MATMUL_SMALL_PARTIAL_FLOATS]` (`tiles` = grid x *
    /// grid y): the blocks' partial tiles, in a layout of the kernel's own.
    /// Unused (may be null) when `splits == 1`.
    pub partial: *mut f32,
    /// `[tiles]` arrival counters, all zero before the launch; the last block
    /// of each tile sets its counter back to zero. Unused when `splits == 1`.
    pub counters: *mut u32,
    pub n: u32,
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU to the result.
    pub gelu: u32,
    /// Depth of `c` per split: a nonzero multiple of `MATMUL_SMALL_TILE_K`
    /// with `ceil(c / k_chunk) == splits` (every split non-empty).
    pub k_chunk: u32,
    /// Splits of `c` (= grid z).
    pub splits: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe MatmulParams, MatmulSplitReduceParams, MatmulSmallParams);
