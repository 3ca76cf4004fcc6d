//! The decode step's fused kernels (`ops::decode`): a few rows, one new
//! token each, at positions the device holds.
//!
//! A decode step reads every weight once, so it is bound by memory
//! bandwidth and, at ~60 kernels per token, by the gaps between kernels.
//! These kernels fold the small ops into the matrix-vector products that
//! need them, and take the step's state (token ids, per-row positions) from
//! device memory, so one captured CUDA graph serves every step:
//!
//! - [`DECODE_GEMV`]: `out = epilogue(prologue(inp) · weightᵀ)`. Prologues:
//!   the token + position embedding (`wte[tokens[r]] + wpe[pos[r]]`, the
//!   encoder) and/or a layernorm of each input row. Epilogues: bias, GELU,
//!   a residual add, the qkv split (q to `out`, k and v into the KV cache at
//!   each row's position), and the greedy choice over the vocabulary (the LM
//!   head), whose last block also advances the step state.
//! - [`DECODE_ATTENTION`]: flash-decoding over the cache with a fixed grid
//!   of key chunks sized for the cache (chunks past a row's position exit at
//!   once); the last chunk block of each (row, head) to finish merges the
//!   partials, so there is no separate combine launch.
//!
//! Rows may sit at different positions (`pos[r]`), so a scheduler can batch
//! requests that started at different times.

/// [`DecodeGemvParams`] kernels, by the most rows they serve (one
/// accumulator per row in registers: fewer rows, fewer registers, more
/// resident warps): `DECODE_GEMV_VARIANTS[i]` serves up to
/// `DECODE_GEMV_VARIANT_ROWS[i]` rows; [`DECODE_GEMV`] is the 8-row one.
pub const DECODE_GEMV: &str = "decode_gemv";
pub const DECODE_GEMV_VARIANTS: [&str; 4] = ["decode_gemv_1", "decode_gemv_2", "decode_gemv_4", DECODE_GEMV];
pub const DECODE_GEMV_VARIANT_ROWS: [u32; 4] = [1, 2, 4, DECODE_MAX_ROWS];
/// The same kernels over bf16 weights (`DecodeGemvParams<u16>`: `weight`
/// and `wte` hold bf16 bits), by the same row counts; the 8-row one is
/// [`DECODE_GEMV_BF16`].
pub const DECODE_GEMV_BF16: &str = "decode_gemv_bf16";
pub const DECODE_GEMV_BF16_VARIANTS: [&str; 4] = [
    "decode_gemv_bf16_1",
    "decode_gemv_bf16_2",
    "decode_gemv_bf16_4",
    DECODE_GEMV_BF16,
];
pub const DECODE_ATTENTION: &str = "decode_attention";
/// [`DECODE_ATTENTION`] over a bf16 cache (`DecodeAttentionParams<u16>`).
pub const DECODE_ATTENTION_BF16: &str = "decode_attention_bf16";
/// The GEMV on tensor cores (up to [`DECODE_MAX_ROWS`] rows): a warp
/// multiplies a 16-column tile of the weight by the rows with `mma.sync`
/// (columns as M, rows as N), so the staged rows are read once per 16
/// columns instead of once per column; the engine takes it for 2 rows and
/// more. bf16 weights (`DecodeGemvParams<u16>`): m16n8k16.
pub const DECODE_GEMV_BF16_MMA: &str = "decode_gemv_bf16_mma";
/// The same over f32 weights (`DecodeGemvParams<f32>`): m16n8k8 TF32, each
/// product as three (3xTF32: both operands split into a TF32 value and a
/// TF32 remainder), FP32's accuracy.
pub const DECODE_GEMV_MMA: &str = "decode_gemv_mma";
/// Columns of one tile of the tensor-core GEMVs (the mma's M).
pub const DECODE_GEMV_MMA_TILE: u32 = 16;
/// Bytes of a weight row one step of a warp covers: 4 lanes, 16 bytes each
/// (32 bf16 or 16 f32 of k); `c` must be a multiple of it in elements.
pub const DECODE_GEMV_MMA_STEP_BYTES: u32 = 64;
/// Steps whose loads a warp issues before the first is used.
pub const DECODE_GEMV_MMA_BATCH: u32 = 2;
/// Warps of a tensor-core GEMV block, all on one tile at a time, each a
/// slice of `c` (`k_warps`: `ceil(c / (2 steps))` within these bounds):
/// at least 4, the threads of the epilogue's 128 outputs (16 columns x 8
/// rows); at most 16 (512 threads of ~116 registers: one block fits an SM).
pub const DECODE_GEMV_MMA_MIN_WARPS: u32 = 4;
pub const DECODE_GEMV_MMA_MAX_WARPS: u32 = 16;
/// Outputs of one tile (16 columns x 8 rows), one per epilogue thread.
pub const DECODE_GEMV_MMA_OUTPUTS: u32 = DECODE_GEMV_MMA_TILE * DECODE_MAX_ROWS;

/// Most rows (batch entries) one decode launch serves: each lane keeps one
/// accumulator per row in registers.
pub const DECODE_MAX_ROWS: u32 = 8;
/// 16-byte weight loads a lane issues at once: a warp reads a chunk of
/// `32 * 8 * 4 = 1024` floats of a weight row, all loads in flight before
/// the first is used.
pub const DECODE_GEMV_LOADS: u32 = 8;
/// Floats of a weight row one warp covers: a row of `c` floats is split
/// over `ceil(c / CHUNK)` warps of a block (`k_warps`), whose partial dot
/// products meet in shared memory.
pub const DECODE_GEMV_CHUNK: u32 = 32 * DECODE_GEMV_LOADS * 4;
/// [`DECODE_GEMV_CHUNK`] of the bf16 kernels: the same 16-byte loads hold
/// 8 values each.
pub const DECODE_GEMV_CHUNK_BF16: u32 = 32 * DECODE_GEMV_LOADS * 8;
/// Largest `c` (inner size) the GEMV stages in shared memory: `rows * c`
/// floats, up to 8 x 6400 (gpt2-xl's fcproj) = 200 KiB. The host raises the
/// kernel's dynamic shared-memory limit to what a launch needs.
pub const DECODE_GEMV_MAX_C: u32 = 6400;
/// Most warps per GEMV block.
pub const DECODE_GEMV_MAX_WARPS: u32 = 8;
/// Shared memory after the staged rows for the split rows' partial sums:
/// one float per (warp, row).
pub const DECODE_GEMV_RED_SMEM_BYTES: u32 = DECODE_GEMV_MAX_WARPS * DECODE_MAX_ROWS * 4;
/// Shared memory the greedy epilogue adds after those: one (value, index)
/// pair per (warp, row).
pub const DECODE_GEMV_ARGMAX_SMEM_BYTES: u32 = DECODE_GEMV_MAX_WARPS * DECODE_MAX_ROWS * 8;

/// Dynamic shared memory of a [`DECODE_GEMV`] launch of `n` rows, inner size
/// `c`, with or without a layernorm prologue: the staged rows, the split
/// sums, the argmax scratch, then the layernorm's weight and bias and each
/// row's (mean, rstd), padded to 4 floats.
pub const fn decode_gemv_shared_bytes(n: u32, c: u32, ln: bool) -> u32 {
    let ln_bytes = if ln {
        (2 * c + (2 * n).next_multiple_of(4)) * 4
    } else {
        0
    };
    n * c * 4 + DECODE_GEMV_RED_SMEM_BYTES + DECODE_GEMV_ARGMAX_SMEM_BYTES + ln_bytes
}

/// Dynamic shared memory of a tensor-core GEMV launch of `warps`
/// warps: the staged rows, each warp's 128 partial sums, the argmax scratch
/// (a pair per warp and row), the layernorm's parameters and statistics.
pub const fn decode_gemv_mma_shared_bytes(n: u32, c: u32, ln: bool, warps: u32) -> u32 {
    let ln_bytes = if ln {
        (2 * c + (2 * n).next_multiple_of(4)) * 4
    } else {
        0
    };
    n * c * 4 + warps * DECODE_GEMV_MMA_OUTPUTS * 4 + warps * DECODE_MAX_ROWS * 8 + ln_bytes
}

/// Attention: keys per chunk (one block each).
pub const DECODE_ATTN_CHUNK: u32 = 64;
/// Attention: threads per block (4 warps; 8 lanes share a key, 8 head
/// dimensions each, so a group scores 4 of a chunk's 64 keys). With 2 warps
/// (8 keys a group) the kernel took 172 registers and an SM held 4 blocks,
/// 8 warps: latency-bound at the server's 64 rows (ncu: 10 % occupancy,
/// 0.19 eligible warps a scheduler). With 4 warps it takes 64 registers.
pub const DECODE_ATTN_THREADS: u32 = 128;
/// Attention: partials each chunk block writes (one per warp).
pub const DECODE_ATTN_PARTS_PER_CHUNK: u32 = DECODE_ATTN_THREADS / 32;
/// Head size the attention kernel is written for (every GPT-2 size has 64).
pub const DECODE_HEAD_SIZE: u32 = 64;

/// Ranges of later kernels' weights one decode kernel may prefetch into L2.
pub const DECODE_PREFETCH_RANGES: usize = 3;

/// A read-only byte range a decode kernel asks L2 to fetch for a later
/// kernel (a hint: it changes no value any load returns). `ptr` is 16-byte
/// aligned, `bytes % 16 == 0`; `bytes == 0` means none. The kernel's blocks
/// share the range in equal slices.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PrefetchRange {
    pub ptr: *const u8,
    pub bytes: u64,
}

impl PrefetchRange {
    pub const NONE: Self = PrefetchRange {
        ptr: core::ptr::null(),
        bytes: 0,
    };
}

/// Decode GEMV: `out[r, col] = epilogue(Σ_k x[r, k] · weight[col, k])` for
/// rows `r < n` and columns `col < oc`, where `x` is `inp` after the
/// prologue.
///
/// Launch: a 1-D grid of blocks of `warps * 32` threads, `warps` a
/// multiple of `k_warps = ceil(c / DECODE_GEMV_CHUNK)` and at most
/// [`DECODE_GEMV_MAX_WARPS`]: each group of `k_warps` warps owns one column
/// at a time (warp `j` of the group its `j`-th chunk of `c`), and the
/// block's `warps / k_warps` groups stride over the columns together.
/// Dynamic shared memory: [`decode_gemv_shared_bytes`]. `c % 4 == 0`, `c <=` [`DECODE_GEMV_MAX_C`], `n <=`
/// [`DECODE_MAX_ROWS`], every pointer 16-byte aligned.
///
/// [`DECODE_GEMV_BF16_MMA`] and [`DECODE_GEMV_MMA`] instead: blocks of
/// `k_warps` warps ([`DECODE_GEMV_MMA_MIN_WARPS`]..=[`DECODE_GEMV_MMA_MAX_WARPS`])
/// striding over 16-column tiles, [`decode_gemv_mma_shared_bytes`] of
/// dynamic shared memory, `c` a multiple of a step (32 bf16, 16 f32).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeGemvParams<W = f32> {
    /// `[n, oc]`; with `k_cache`, `[n, oc / 3]` (the q third only).
    pub out: *mut f32,
    /// `[n, c]` input rows; unused (may be null) with `tokens`.
    pub inp: *const f32,
    /// `[c]` each: when `ln_weight` is non-null, the prologue layernorms
    /// every input row (GPT-2's eps, biased variance).
    pub ln_weight: *const f32,
    pub ln_bias: *const f32,
    /// `[oc, c]`, row-major (GPT-2's (out, in) layout): f32, or bf16 bits
    /// (`W = u16`, the `decode_gemv_bf16*` kernels; then `c % 8 == 0`).
    pub weight: *const W,
    /// `[oc]` or null.
    pub bias: *const f32,
    /// `[n, oc]` or null: added after bias (and GELU). May not alias `out`.
    pub residual: *const f32,
    /// Non-null: the embedding prologue. Input row `r` is
    /// `wte[min(tokens[r], vocab - 1)] + wpe[min(pos[r], max_pos - 1)]`
    /// (clamped: never an out-of-bounds read), and block 0 writes it to
    /// `embed_out` (`[n, c]`, the residual stream).
    pub tokens: *const u32,
    /// `[n]`: each row's position (the new token's index in its sequence).
    /// Read by the embedding prologue and the KV-cache epilogue.
    pub pos: *const u32,
    /// `[vocab, c]`, the same element type as `weight`.
    pub wte: *const W,
    pub wpe: *const f32,
    pub embed_out: *mut f32,
    pub vocab: u32,
    pub max_pos: u32,
    /// Non-null (with `v_cache`): the qkv epilogue. Columns `[0, C)` go to
    /// `out` as q, `[C, 2C)` to `k_cache` and `[2C, 3C)` to `v_cache` at
    /// `[(r * nh + h) * max_t + pos[r]] * HS + d`, where `C = oc / 3`,
    /// `HS = C / nh`; rows whose `pos[r] >= max_t` store nothing. The
    /// caches hold what the weights do: f32, or bf16 bits (`W = u16`).
    pub k_cache: *mut W,
    pub v_cache: *mut W,
    pub nh: u32,
    pub max_t: u32,
    /// Non-null: the greedy epilogue (the LM head). Each block writes its
    /// best (value, column) per row over columns `< v` to `part_val` /
    /// `part_idx` (`[blocks, n]` each), and the block that arrives last (on
    /// `counter`, zero between launches) picks each row's argmax over them
    /// (ties to the lowest id, NaN never wins), writes it to `ids[r]` and
    /// `tokens_next[r]` and adds 1 to `pos_next[r]`, then resets `counter`.
    pub ids: *mut u32,
    pub tokens_next: *mut u32,
    pub pos_next: *mut u32,
    pub part_val: *mut f32,
    pub part_idx: *mut u32,
    pub counter: *mut u32,
    /// Real vocabulary: columns `>= v` (padding) never win the argmax.
    pub v: u32,
    pub n: u32,
    pub c: u32,
    pub oc: u32,
    /// Nonzero: GELU after the bias.
    pub gelu: u32,
    /// Warps sharing one column: `ceil(c / DECODE_GEMV_CHUNK)` (bf16:
    /// [`DECODE_GEMV_CHUNK_BF16`]). The tensor-core kernels: the block's
    /// warps, all on one 16-column tile, each `ceil(c / k_warps)` of `c`
    /// rounded up to a step ([`DECODE_GEMV_MMA_STEP_BYTES`]).
    pub k_warps: u32,
    /// Nonzero: prefetch `prefetch` after the main loop instead of before
    /// the PDL wait (for a kernel that streams more than L2 holds, whose own
    /// loads would evict an early prefetch).
    pub prefetch_late: u32,
    /// Nonzero: under PDL, let the next kernel launch before this one's
    /// wait (as soon as all its blocks started), not after it.
    pub early_trigger: u32,
    /// Weights of later kernels to bring into L2 (see [`PrefetchRange`]).
    pub prefetch: [PrefetchRange; DECODE_PREFETCH_RANGES],
}

/// Decode attention over the KV cache, one query per row, at each row's
/// position `pos[r]` (the key at `pos[r]` already stored by the qkv GEMV).
///
/// Launch: grid `(ceil(max_t / DECODE_ATTN_CHUNK), nh, n)`,
/// [`DECODE_ATTN_THREADS`] threads. Chunk blocks wholly past a row's last
/// key return at once; the others write (max, sum, acc) partials, and the
/// last of them to arrive (on `counter[r * nh + h]`, zero between launches)
/// merges them into `out`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeAttentionParams<K = f32> {
    /// `[n, C]`
    pub out: *mut f32,
    /// `[n, C]` queries.
    pub q: *const f32,
    /// `[cache_rows][nh][max_t][HS]`, f32 or bf16 bits (`K = u16`); row
    /// `r` of the call reads cache row `cache_row[r]` (or `r`).
    pub k_cache: *const K,
    pub v_cache: *const K,
    /// `[n]` positions; a row with `pos[r] >= max_t` is idle (a free slot
    /// of a server's batch): nothing is read for it and its `out` row is
    /// left as it was.
    pub pos: *const u32,
    /// `[n]` the cache row of each row of the call (several rows may share
    /// one: the tokens of a prefill, each at its own position), or null:
    /// row `r` is cache row `r`. A cache row at or past `cache_rows` makes
    /// the row idle.
    pub cache_row: *const u32,
    /// Rows the caches hold.
    pub cache_rows: u32,
    /// `[n * nh * parts_stride * HS]` and `[n * nh * parts_stride * 2]`.
    pub part_acc: *mut f32,
    pub part_ml: *mut f32,
    /// `[n * nh]` arrival counters.
    pub counter: *mut u32,
    pub n: u32,
    pub max_t: u32,
    pub c: u32,
    pub nh: u32,
    /// 0 = unlimited; else each query sees its last `window` keys.
    pub window: u32,
    /// log2(e) / sqrt(HS).
    pub scale_log2e: f32,
    /// Partials per (row, head) the buffers hold room for (>= chunks * 2).
    pub parts_stride: u32,
    /// As `DecodeGemvParams::early_trigger`.
    pub early_trigger: u32,
    /// Weights of later kernels to bring into L2 (see [`PrefetchRange`]),
    /// requested before the PDL wait.
    pub prefetch: [PrefetchRange; DECODE_PREFETCH_RANGES],
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe DecodeGemvParams<f32>, DecodeGemvParams<u16>);
// SAFETY: as above.
super::cache_kernel_params!(unsafe DecodeAttentionParams);
