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

/// Small-M kernels (`ops::matmul_small`): a `64 x BN` output tile per block
/// whose `MATMUL_SMALL_WARPS` warps each take every `MATMUL_SMALL_WARPS`-th
/// k-slice of `c` (the K reduction split inside the block), then sum their
/// partial tiles through shared memory in warp order (deterministic, no
/// atomics). For `n` up to a few tiles of rows, where the 128-row tiles
/// waste rows and grid split-K pays a second launch. One kernel per `BN`.
pub const MATMUL_FORWARD_SMALL_N32: &str = "matmul_forward_small_n32";
/// [`MATMUL_FORWARD_SMALL_N32`] with a 24-column tile.
pub const MATMUL_FORWARD_SMALL_N24: &str = "matmul_forward_small_n24";
/// [`MATMUL_FORWARD_SMALL_N32`] with a 16-column tile.
pub const MATMUL_FORWARD_SMALL_N16: &str = "matmul_forward_small_n16";
/// [`MATMUL_FORWARD_SMALL_N32`] with an 8-column tile.
pub const MATMUL_FORWARD_SMALL_N8: &str = "matmul_forward_small_n8";
/// The small-M kernels' tile widths, in the order of [`MATMUL_SMALL_KERNELS`].
pub const MATMUL_SMALL_TILE_NS: [u32; 4] = [32, 24, 16, 8];
/// Kernel names by tile width (same order as [`MATMUL_SMALL_TILE_NS`]).
pub const MATMUL_SMALL_KERNELS: [&str; 4] = [
    MATMUL_FORWARD_SMALL_N32,
    MATMUL_FORWARD_SMALL_N24,
    MATMUL_FORWARD_SMALL_N16,
    MATMUL_FORWARD_SMALL_N8,
];
/// Lanes of a warp along the tile's rows; each lane holds rows `ty + 8 i`.
pub const MATMUL_SMALL_LANES_M: u32 = 8;
/// Lanes of a warp along the tile's columns; each lane holds columns `tx + 4 j`.
pub const MATMUL_SMALL_LANES_N: u32 = 4;
/// Rows each lane accumulates: with 8 row lanes a 64-row tile, which covers
/// the short prompts this kernel is for in one block row.
pub const MATMUL_SMALL_THREAD_M: u32 = 8;
/// Rows of `out` per block tile.
pub const MATMUL_SMALL_TILE_M: u32 = MATMUL_SMALL_LANES_M * MATMUL_SMALL_THREAD_M;
/// Warps per block = K groups. A block is alone on its SM (the tile is
/// small so that N = 768..3072 gives about one block per SM), and its warps
/// must keep the FFMA pipes busy: eight ran at a third of peak on the H200.
/// Twelve is the most whose registers fit (the 32-column tile takes ~130 per
/// thread; 16 warps would need <= 128) and whose rings fit 227 KiB.
pub const MATMUL_SMALL_WARPS: u32 = 12;
/// Threads per block.
pub const MATMUL_SMALL_BLOCK: u32 = MATMUL_SMALL_WARPS * 32;
/// Depth of one k-slice a warp stages (two 16-byte chunks per row).
pub const MATMUL_SMALL_TILE_K: u32 = 8;
/// Staging buffers per warp (`cp.async` ring): three slices in flight while
/// the fourth is consumed hide the L2/HBM latency with one block per SM.
pub const MATMUL_SMALL_STAGES: u32 = 4;
/// Floats of padding after each staged row (`TILE_K + PAD = 12`: the 8 rows a
/// warp reads with one `ld.shared.v4` fall in 8 distinct bank quads) and
/// after each row of a partial tile (`BN + PAD`: a warp's scalar stores of
/// one register hit 32 distinct banks). Keeps rows 16-byte aligned.
pub const MATMUL_SMALL_PAD: u32 = 4;

/// Dynamic shared memory, bytes, of the small-M kernel with `tile_n`
/// columns: the larger of the warps' staging rings and the partial tiles
/// summed at the end (which reuse the same memory).
pub const fn matmul_small_shared_bytes(tile_n: u32) -> u32 {
    let rows = MATMUL_SMALL_TILE_M + tile_n;
    let staging = MATMUL_SMALL_WARPS * MATMUL_SMALL_STAGES * rows * (MATMUL_SMALL_TILE_K + MATMUL_SMALL_PAD);
    let partials = MATMUL_SMALL_WARPS * MATMUL_SMALL_TILE_M * (tile_n + MATMUL_SMALL_PAD);
    let floats = if staging > partials { staging } else { partials };
    floats * core::mem::size_of::<f32>() as u32
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

crate::kernel_params!(MatmulParams, MatmulSplitReduceParams);
