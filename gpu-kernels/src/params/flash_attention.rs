//! Flash attention (the `attention_forward` op, fused): parameter structs and
//! PTX names of its kernels. Contract of the op: docs/design.md.
//!
//! Kernels (all in `ops::flash_attention`):
//! - The first half of the op's contract, appending this call's K,V rows of
//!   `qkv` to the layer's KV cache, is the shared `attention_kv_store`
//!   kernel of `ops::attention`, except for a TF32 prefill from position 0:
//!   there the prefill kernel reads K,V from `qkv` and stores them itself
//!   ([`FlashAttentionParams::kv_from_qkv`]), one launch fewer per layer.
//! - [`ATTENTION_FORWARD_FLASH_TF32`]: prefill on tensor cores, one block of
//!   8 warps per (query tile, head, batch row), 1-D grid, heaviest tiles first;
//!   the query tile is 128, 64 or 32 rows by [`FlashAttentionParams::kv_split`].
//! - [`ATTENTION_FORWARD_FLASH_FP32`]: prefill with exact FP32 (SIMT) products,
//!   one block of 4 warps per (64-query tile, head, batch row).
//! - [`ATTENTION_FORWARD_FLASH_DECODE`] + [`ATTENTION_FORWARD_FLASH_COMBINE`]:
//!   flash-decoding for a few queries over a long cache: each block reduces one
//!   chunk of keys to a partial (max, sum, acc); the second kernel merges them.

pub const ATTENTION_FORWARD_FLASH_TF32: &str = "attention_forward_flash_tf32";
pub const ATTENTION_FORWARD_FLASH_BF16: &str = "attention_forward_flash_bf16";
pub const ATTENTION_FORWARD_FLASH_BF16_2STAGE: &str = "attention_forward_flash_bf16_2stage";
pub const ATTENTION_FORWARD_FLASH_FP32: &str = "attention_forward_flash_fp32";
pub const ATTENTION_FORWARD_FLASH_DECODE: &str = "attention_forward_flash_decode";
/// [`ATTENTION_FORWARD_FLASH_DECODE`] over a bf16 cache (`FlashDecodeParams<u16>`).
pub const ATTENTION_FORWARD_FLASH_DECODE_BF16: &str = "attention_forward_flash_decode_bf16";
pub const ATTENTION_FORWARD_FLASH_COMBINE: &str = "attention_forward_flash_combine";

/// Head size the kernels are written for (every GPT-2 size has 64).
pub const FLASH_HEAD_SIZE: u32 = 64;

/// FP32 prefill tiles: queries per block (16 per warp: one m16 row block).
pub const FLASH_BLOCK_Q: u32 = 64;
/// Prefill tiles (both kernels): keys per shared-memory K/V tile.
pub const FLASH_BLOCK_K: u32 = 64;
/// FP32 prefill threads per block: one warp per 16 queries.
pub const FLASH_THREADS: u32 = 128;
/// Floats per shared-memory row: HS plus 4 of padding, so that the fragment
/// reads of a warp (rows g = lane/4, columns t = lane%4) fall in 32 distinct
/// banks (row stride 68 = 4 mod 32), while rows stay 16-byte aligned for cp.async.
pub const FLASH_SMEM_STRIDE: u32 = FLASH_HEAD_SIZE + 4;
/// Floats of one shared-memory tile (Q, K, V or a P block).
pub const FLASH_TILE_FLOATS: u32 = FLASH_BLOCK_K * FLASH_SMEM_STRIDE;
/// FP32 prefill K/V pipeline depth: the next tile loads while this one is used.
pub const FLASH_STAGES: u32 = 2;
/// Dynamic shared memory of the FP32 prefill kernel: Q + STAGES x (K, V) plus
/// one 16-row P block per warp (the SIMT PV product reads whole P rows).
pub const FLASH_SMEM_BYTES_FP32: u32 = (2 + 2 * FLASH_STAGES) * FLASH_TILE_FLOATS * 4;

/// TF32 prefill threads per block (8 warps, each owning 16 query rows).
pub const FLASH_TF32_THREADS: u32 = 256;
/// TF32 prefill: keys one warp scores per step (half a K/V tile). With
/// `kv_split` 2 the two warps of a row slice take one half each, so each
/// 64-key tile feeds 64 queries and the longest warp chain halves; with
/// `kv_split` 1 a warp takes both halves, and each tile feeds 128 queries.
pub const FLASH_TF32_SUB_KEYS: u32 = 32;
/// TF32 prefill query rows per block: 128 / kv_split.
pub const FLASH_TF32_ROWS_MAX: u32 = FLASH_TF32_THREADS / 32 * 16;
/// TF32 prefill K/V ring depth: two tiles in flight while one is used (Q goes
/// straight to registers, so 3 stages still leave room for 2 blocks per SM).
pub const FLASH_TF32_STAGES: u32 = 3;
/// Dynamic shared memory of the TF32 prefill kernel: STAGES x (K, V) tiles
/// (104,448 bytes; two blocks fit in an H100/H200 SM's 228 KiB).
pub const FLASH_SMEM_BYTES_TF32: u32 = 2 * FLASH_TF32_STAGES * FLASH_TILE_FLOATS * 4;
/// bf16 prefill: bf16 elements per row of its K/V ring tiles (HS plus 8 of
/// padding: 144-byte rows put the 8 rows of an `ldmatrix` phase, and the
/// QKᵀ fragment loads, in distinct banks while keeping 16-byte alignment).
pub const FLASH_BF16_STRIDE: u32 = FLASH_HEAD_SIZE + 8;
/// Bytes of one bf16 ring tile (K or V).
pub const FLASH_BF16_TILE_BYTES: u32 = FLASH_BLOCK_K * FLASH_BF16_STRIDE * 2;
/// Dynamic shared memory of the bf16 prefill kernel: a ring of
/// [`FLASH_TF32_STAGES`] bf16 K and V tiles, copied from the bf16 cache
/// (55,296 bytes).
pub const FLASH_SMEM_BYTES_BF16: u32 = 2 * FLASH_TF32_STAGES * FLASH_BF16_TILE_BYTES;
/// Ring depth of [`ATTENTION_FORWARD_FLASH_BF16_2STAGE`]: one tile loads
/// while one is used.
pub const FLASH_BF16_SHORT_STAGES: u32 = 2;
/// Its dynamic shared memory (36,864 bytes).
pub const FLASH_SMEM_BYTES_BF16_2STAGE: u32 = 2 * FLASH_BF16_SHORT_STAGES * FLASH_BF16_TILE_BYTES;
/// Blocks of the bf16 prefill kernels an SM must hold at once (registers
/// included: `params::LAUNCH_BOUNDS`); both rings fit twice in shared memory.
pub const FLASH_BF16_BLOCKS_PER_SM: u32 = 2;
/// The host takes the 2-stage bf16 kernel for grids of at least this many
/// blocks an SM (where a second resident block has work to overlap).
pub const FLASH_BF16_2STAGE_MIN_BLOCKS_PER_SM: u32 = 2;
/// Largest `kv_split` of the TF32 kernel. (A `kv_split` 4, 32-row tiles with
/// two warp groups on alternate K/V tiles, was tried on 2026-11-22: 48.6 us
/// against 39.7 for 2 at B=1, T=1024 on an H200, and compute-sanitizer
/// racecheck flagged it; removed.)
pub const FLASH_TF32_KV_SPLIT_MAX: u32 = 2;
/// The host doubles `kv_split` (1 -> 2, up to [`FLASH_TF32_KV_SPLIT_MAX`]:
/// half the query rows per block, twice the blocks) while the grid would have
/// fewer than this many blocks per SM: at B=1, T=1024, 128-row tiles give 96
/// blocks on 132 SMs and 64-row tiles 192; at B=8 the 128-row tiles halve the
/// K/V traffic from L2.
pub const FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM: u32 = 2;

/// Floats one lane of a tensor-core prefill warp hands over when its
/// online-softmax state is merged with another's: the accumulator fragment
/// (`HS / 2`), then two maxima and two sums (rows g and g + 8).
pub const FLASH_PREFILL_LANE_STATE: u32 = FLASH_HEAD_SIZE / 2 + 4;
/// Floats of one block's state in [`FlashAttentionParams::part_state`]: every
/// row slice's lanes (at most 8 slices of 16 rows).
pub const FLASH_PREFILL_BLOCK_STATE: u32 = FLASH_TF32_ROWS_MAX / 16 * 32 * FLASH_PREFILL_LANE_STATE;
/// Key chunks: the host splits the keys of the query tiles only while the
/// unsplit grid has fewer than [`FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM`]
/// blocks an SM, and then into chunks of at least this many tiles (each
/// chunk pays for a state written and read back by the last block).
pub const FLASH_PREFILL_MIN_CHUNK_TILES: u32 = 4;
/// Key chunks: the host's choice splits a query tile's keys over at most
/// this many blocks (each split adds a state written, read back and merged
/// on the last block's path).
pub const FLASH_PREFILL_MAX_CHUNKS: u32 = 2;
/// Most blocks a split grid may have, per SM: what the workspace's block
/// states are sized for (a forced chunk size that would need more is
/// enlarged until it fits).
pub const FLASH_PREFILL_SPLIT_MAX_BLOCKS_PER_SM: u32 = 4;

/// Key tiles (of [`FLASH_BLOCK_K`]) that query tile `q_tile` (of `bq` rows,
/// of a call of `t` queries from position `pos0`, `window` 0 or the keys a
/// query sees) attends to: from the tile of its first query's first key to
/// the tile of its last query. The tensor-core kernel and its host agree on
/// the grid through this.
pub const fn flash_prefill_key_tiles(q_tile: u32, bq: u32, t: u32, pos0: u32, window: u32) -> u32 {
    let q0 = q_tile * bq;
    let rows = if bq < t - q0 { bq } else { t - q0 };
    let (p_min, p_max) = (pos0 + q0, pos0 + q0 + rows - 1);
    let key_lo = if window > 0 {
        (p_min + 1).saturating_sub(window)
    } else {
        0
    };
    p_max / FLASH_BLOCK_K + 1 - key_lo / FLASH_BLOCK_K
}

/// Chunks (blocks) a query tile of `key_tiles` key tiles takes at chunks of
/// at most `chunk_tiles` (0: one, unsplit).
pub const fn flash_prefill_chunks(key_tiles: u32, chunk_tiles: u32) -> u32 {
    if chunk_tiles == 0 {
        1
    } else {
        key_tiles.div_ceil(chunk_tiles)
    }
}

/// Blocks of the tensor-core prefill grid: every query tile's chunks, for
/// each of the `pairs` (batch row, head) pairs.
pub const fn flash_prefill_blocks(t: u32, bq: u32, pos0: u32, window: u32, pairs: u32, chunk_tiles: u32) -> u32 {
    let mut blocks = 0;
    let mut q = 0;
    while q < t.div_ceil(bq) {
        blocks += flash_prefill_chunks(flash_prefill_key_tiles(q, bq, t, pos0, window), chunk_tiles);
        q += 1;
    }
    blocks * pairs
}

/// Decode: keys per block (one chunk of the cache).
pub const FLASH_DECODE_CHUNK: u32 = 64;
/// Decode: threads per block.
pub const FLASH_DECODE_THREADS: u32 = 64;
/// Decode: lanes cooperating on one key (each holds 8 of the 64 dimensions).
pub const FLASH_DECODE_LANES_PER_KEY: u32 = 8;
/// Decode: partials each block writes (one per warp).
pub const FLASH_DECODE_PARTS_PER_CHUNK: u32 = FLASH_DECODE_THREADS / 32;
/// Largest `t` the wrapper sends to the decode kernels; longer calls use prefill.
pub const FLASH_DECODE_MAX_T: u32 = 4;
/// Combine: threads per block, one per head dimension.
pub const FLASH_COMBINE_THREADS: u32 = FLASH_HEAD_SIZE;

/// Prefill flash attention (every precision).
/// - TF32: grid ([`flash_prefill_blocks`]: ceil(t / (ROWS_MAX / kv_split)) * nh * b
///   without key chunks), [`FLASH_TF32_THREADS`]
///   threads, [`FLASH_SMEM_BYTES_TF32`] bytes (bf16: [`FLASH_SMEM_BYTES_BF16`]).
/// - FP32: grid (ceil(t/BLOCK_Q), nh, b), [`FLASH_THREADS`] threads, [`FLASH_SMEM_BYTES_FP32`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashAttentionParams<K = f32> {
    /// [B, T, C]
    pub out: *mut f32,
    /// `[B][NH][maxT][HS]`, positions 0..pos0+t filled (or, with
    /// `kv_from_qkv` on TF32, written by this kernel): f32 for the FP32 and
    /// TF32 kernels, bf16 bits (`K = u16`) for the bf16 ones.
    pub k_cache: *mut K,
    pub v_cache: *mut K,
    /// [B, T, 3C]; only the Q third is read (all of it with `kv_from_qkv`).
    pub qkv: *const f32,
    pub b: u32,
    pub t: u32,
    pub pos0: u32,
    pub max_t: u32,
    pub c: u32,
    pub nh: u32,
    /// 0 = unlimited; else each query sees its last `window` keys.
    pub window: u32,
    /// log2(e) / sqrt(HS): scores go straight to `exp2`.
    pub scale_log2e: f32,
    /// TF32 and bf16 kernels (FP32 ignores it): 1 or 2 warps per 16-row slice,
    /// splitting the keys between them (see [`FLASH_TF32_SUB_KEYS`],
    /// [`FLASH_TF32_KV_SPLIT_MAX`]).
    pub kv_split: u32,
    /// TF32 kernel only: nonzero promises that every K/V cache entry the call
    /// reads (positions 0..pos0+t) is already a TF32 value (low 13 mantissa
    /// bits zero, e.g. written by a matmul that rounds its output), so the
    /// kernel skips rounding each K/V tile in shared memory. Results are then
    /// identical to 0's. 0: the kernel rounds (any f32 input).
    pub kv_rounded: u32,
    /// TF32 kernel only: nonzero (only with `pos0 == 0`) makes the kernel
    /// read K/V from `qkv` instead of the caches and store this call's K/V
    /// into the caches itself, each block its own query rows: the caller
    /// then launches no `attention_kv_store`. 0: K/V are read from the
    /// caches, which the caller has filled (always so for the bf16 kernels,
    /// which ignore it).
    pub kv_from_qkv: u32,
    /// bf16 kernels only (the others write `out`): non-null sends the
    /// output here instead, rounded to bf16 (to nearest even), `[B, T, C]`,
    /// and `out` is not touched (it may be null): the bf16 engine's attention
    /// projection reads bf16.
    pub out_bf16: *mut u16,
    /// Tensor-core kernels: 0 leaves each query tile's keys to one block;
    /// `n > 0` splits a tile with more than `n` key tiles over
    /// [`flash_prefill_chunks`] blocks of consecutive keys (balanced), whose
    /// last to finish merges their states in order and writes the output
    /// (flash-decoding's split, for the few long query tiles of a batch-1
    /// prefill). The grid is then [`flash_prefill_blocks`].
    pub chunk_tiles: u32,
    /// With `chunk_tiles`: [`FLASH_PREFILL_BLOCK_STATE`] floats per block
    /// of the grid, where each block leaves its state.
    pub part_state: *mut f32,
    /// With `chunk_tiles`: one arrival counter per (query tile, batch row,
    /// head), zero between launches (the last block resets it).
    pub part_count: *mut u32,
}

/// Flash-decoding, pass 1. Grid (max_chunks, nh, b * t), [`FLASH_DECODE_THREADS`] threads.
/// Partial `i` of query row `r = (b*t + ti)*nh + h` lives at
/// `part_acc[(r * parts_stride + i) * HS ..]` and `part_ml[(r * parts_stride + i) * 2 ..]` (max, sum),
/// max in log2 units (scores already times `scale_log2e`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashDecodeParams<K = f32> {
    pub part_acc: *mut f32,
    pub part_ml: *mut f32,
    pub k_cache: *const K,
    pub v_cache: *const K,
    pub qkv: *const f32,
    pub b: u32,
    pub t: u32,
    pub pos0: u32,
    pub max_t: u32,
    pub c: u32,
    pub nh: u32,
    pub window: u32,
    pub scale_log2e: f32,
    /// Partials per query row that were written: gridDim.x * PARTS_PER_CHUNK.
    pub parts: u32,
    /// Row stride of the partial buffers, in partials (>= parts).
    pub parts_stride: u32,
}

/// Flash-decoding, pass 2. Grid (b * t * nh), [`FLASH_COMBINE_THREADS`] threads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlashCombineParams {
    /// [B, T, C]
    pub out: *mut f32,
    pub part_acc: *const f32,
    pub part_ml: *const f32,
    pub b: u32,
    pub t: u32,
    pub c: u32,
    pub nh: u32,
    pub parts: u32,
    pub parts_stride: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe FlashCombineParams);
// SAFETY: as above.
super::cache_kernel_params!(unsafe FlashAttentionParams, FlashDecodeParams);
