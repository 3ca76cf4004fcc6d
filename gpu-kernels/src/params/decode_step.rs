//! The whole decode step in one persistent kernel (`ops::decode_step`,
//! sm_90a only).
//!
//! The fused chain of `params::decode` pays ~6 µs per kernel boundary, 61
//! times a step, while the step's bytes take 0.12 ms. This kernel runs every
//! phase of the step (per layer: ln1 + qkv, attention, attproj + residual,
//! ln2 + fc + GELU, fcproj + residual; then lnf + the LM head + argmax) in
//! one launch of one block per SM; the phases meet at grid barriers. Each
//! block owns a fixed slice of every matrix's columns, and its slices stream
//! into a ring of shared-memory slots by TMA bulk copies issued as soon as a
//! slot frees, so the next phases' weights are already on chip when a
//! barrier opens: HBM keeps streaming through the dependencies.
//!
//! Same math as the fused chain (f32 accumulation, the same layernorm, GELU,
//! attention), in other summation orders; its CPU twin is the CPU forward at
//! `t = 1` (`cpu::forward`).

use super::decode::{DECODE_GEMV_MMA_OUTPUTS, DECODE_HEAD_SIZE, DECODE_MAX_ROWS};

/// Kernels by weight format (`DecodeStepParams<f32>` / `<u16>`), one row:
/// each warp takes whole columns on the FMA units (one row reads each
/// staged value once per column anyway, as a broadcast).
pub const DECODE_STEP: &str = "decode_step";
pub const DECODE_STEP_BF16: &str = "decode_step_bf16";
/// The same, writing the trace (`DecodeStepParams::trace`): diagnostics.
pub const DECODE_STEP_TRACED: &str = "decode_step_traced";
pub const DECODE_STEP_BF16_TRACED: &str = "decode_step_bf16_traced";
/// Two rows and more, up to [`DECODE_STEP_MAX_ROWS`]: the weight tiles are
/// multiplied on tensor cores (`mma.sync`, 16 columns as M, the rows as N;
/// f32 weights as 3xTF32, FP32's accuracy), as the chain's
/// `decode_gemv_mma`. One accumulator per row on the FMA units would need
/// more than the 128 registers a thread of a 512-thread block gets (ptxas
/// spilled from 4 rows up).
pub const DECODE_STEP_ROWS: &str = "decode_step_rows";
pub const DECODE_STEP_ROWS_BF16: &str = "decode_step_rows_bf16";
/// The same, writing the trace: diagnostics.
pub const DECODE_STEP_ROWS_TRACED: &str = "decode_step_rows_traced";
pub const DECODE_STEP_ROWS_BF16_TRACED: &str = "decode_step_rows_bf16_traced";
/// Most rows a launch serves: the chain's batch limit.
pub const DECODE_STEP_MAX_ROWS: u32 = DECODE_MAX_ROWS;

/// The kernel of a step of `n` rows over weights of `elem` bytes (4: f32,
/// 2: bf16), traced or not; `None` where none serves it.
pub const fn decode_step_kernel(n: u32, elem: usize, traced: bool) -> Option<&'static str> {
    match (n, elem, traced) {
        (1, 4, false) => Some(DECODE_STEP),
        (1, 2, false) => Some(DECODE_STEP_BF16),
        (1, 4, true) => Some(DECODE_STEP_TRACED),
        (1, 2, true) => Some(DECODE_STEP_BF16_TRACED),
        (2..=DECODE_STEP_MAX_ROWS, 4, false) => Some(DECODE_STEP_ROWS),
        (2..=DECODE_STEP_MAX_ROWS, 2, false) => Some(DECODE_STEP_ROWS_BF16),
        (2..=DECODE_STEP_MAX_ROWS, 4, true) => Some(DECODE_STEP_ROWS_TRACED),
        (2..=DECODE_STEP_MAX_ROWS, 2, true) => Some(DECODE_STEP_ROWS_BF16_TRACED),
        _ => None,
    }
}

/// Threads per block (16 warps): one block per SM.
pub const DECODE_STEP_THREADS: u32 = 512;
/// Warps per block.
pub const DECODE_STEP_WARPS: u32 = DECODE_STEP_THREADS / 32;
/// Most shared-memory slots in the weight ring.
pub const DECODE_STEP_MAX_SLOTS: u32 = 4;
/// Keys one warp scores in the attention phase (4 groups of 8 lanes, 2
/// keys each); a block's warps take consecutive keys, so one attention
/// work item is `DECODE_STEP_WARPS * DECODE_STEP_ATTN_KEYS` keys of a
/// head, and the partial buffers hold one partial per item.
pub const DECODE_STEP_ATTN_KEYS: u32 = 8;
/// The GEMV phases of a layer, in order (their weights stream in this
/// order, then the LM head's).
pub const DECODE_STEP_GEMVS_PER_LAYER: u32 = 4;
/// Kinds of GEMV phase: a layer's four, then the LM head.
pub const DECODE_STEP_GEMV_KINDS: u32 = DECODE_STEP_GEMVS_PER_LAYER + 1;
/// Words of the `sync` buffer: the grid barrier's arrivals, the LM head's,
/// and the launches so far (the flags' epoch, see `DecodeStepParams::flags`).
pub const DECODE_STEP_SYNC_WORDS: usize = 3;
/// Partials one (row, head) of the attention phase can have: one per item
/// of `DECODE_STEP_WARPS * DECODE_STEP_ATTN_KEYS` keys of a cache of
/// `max_t` positions.
pub const fn decode_step_att_items(max_t: u32) -> usize {
    max_t.div_ceil(DECODE_STEP_WARPS * DECODE_STEP_ATTN_KEYS) as usize
}

/// Words of one flagged attention partial: its 64 accumulators, then its
/// max and sum (an even count: every pair of words stays 16-byte aligned).
pub const DECODE_STEP_ATT_PART_WORDS: usize = DECODE_HEAD_SIZE as usize + 2;
const _: () = assert!(DECODE_STEP_ATT_PART_WORDS.is_multiple_of(2));

/// Words of the rows passed flagged between phases (`DecodeStepParams::flags`)
/// before the attention's partials: the residual stream after attproj
/// (`c`), the MLP's hidden row (`4c`), the residual stream after fcproj
/// (`c`), then qkv's output (`3c`: q, and the new key and value, which the
/// attention reads from here rather than from the cache).
pub const fn decode_step_flag_rows(c: u32) -> usize {
    9 * c as usize
}

/// Words of `DecodeStepParams::flags` for width `c` and a cache of `max_t`
/// positions: [`decode_step_flag_rows`], then the attention's partials,
/// [`decode_step_att_items`] per head of [`DECODE_STEP_ATT_PART_WORDS`].
pub const fn decode_step_flag_words(c: u32, max_t: u32) -> usize {
    let heads = (c / DECODE_HEAD_SIZE) as usize;
    decode_step_flag_rows(c) + heads * decode_step_att_items(max_t) * DECODE_STEP_ATT_PART_WORDS
}

/// Phases of a layer: qkv, attention, attproj, fc, fcproj (the LM head
/// follows the last layer).
pub const DECODE_STEP_PHASES_PER_LAYER: u32 = 5;
/// The step's trace (`DecodeStepParams::trace`, a diagnostic for the
/// bench): per block, [`DECODE_STEP_TRACE_HEADER`] words, then this many
/// `%clock64` readings per phase, indexed by [`DecodeStepMark`]. Marks a
/// phase does not have stay 0.
pub const DECODE_STEP_TRACE_MARKS: usize = 7;

/// What each mark of a phase records (thread 0 of the block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeStepMark {
    /// The phase starts: the grid barrier before it opened.
    Start = 0,
    /// A GEMV phase's input rows are staged and layernormed.
    Staged = 1,
    /// A GEMV phase's first weight tile is in shared memory.
    Ready = 2,
    /// The whole block has finished the phase (it arrives at the barrier).
    End = 3,
    /// Between arriving and waiting: the next phase's bias and layernorm
    /// parameters are on their way.
    Issued = 4,
    /// A GEMV phase's input rows have arrived (before the layernorm).
    Loaded = 5,
    /// The last warp has finished a GEMV phase's columns (before the block
    /// barrier that ends the phase).
    Computed = 6,
}

/// The trace header's words, per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeStepTraceHeader {
    /// `%globaltimer` (ns) and `%clock64` at the kernel's start and end:
    /// their ratio converts the block's cycles to time.
    TimerStart = 0,
    ClockStart = 1,
    TimerEnd = 2,
    ClockEnd = 3,
}

/// Words of [`DecodeStepTraceHeader`].
pub const DECODE_STEP_TRACE_HEADER: usize = 4;

/// Trace words per block for `n_layer` layers.
pub const fn decode_step_trace_words(n_layer: u32) -> usize {
    DECODE_STEP_TRACE_HEADER + (DECODE_STEP_PHASES_PER_LAYER * n_layer + 1) as usize * DECODE_STEP_TRACE_MARKS
}

/// One layer's tensors, as the kernel reads them from a device table
/// (`DecodeStepParams::layers`). Weights `[out, in]` row-major (GPT-2's
/// layout), f32 or bf16 bits (`W = u16`); everything else f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeStepLayer<W = f32> {
    pub ln1_w: *const f32,
    pub ln1_b: *const f32,
    /// `[3C, C]`, `[3C]`
    pub qkv_w: *const W,
    pub qkv_b: *const f32,
    /// `[C, C]`, `[C]`
    pub attproj_w: *const W,
    pub attproj_b: *const f32,
    pub ln2_w: *const f32,
    pub ln2_b: *const f32,
    /// `[4C, C]`, `[4C]`
    pub fc_w: *const W,
    pub fc_b: *const f32,
    /// `[C, 4C]`, `[C]`
    pub fcproj_w: *const W,
    pub fcproj_b: *const f32,
    /// `[max_batch][nh][max_t][64]` each, kept as the weights are: f32,
    /// or bf16 bits (`W = u16`).
    pub k_cache: *mut W,
    pub v_cache: *mut W,
    /// Null, or ln1 folded into qkv (`[3C]` pairs, see
    /// [`DECODE_STEP_FOLD`]): the one-row step then multiplies the raw row.
    pub qkv_fold: *const f32,
    /// Null, or ln2 folded into fc (`[4C]` pairs).
    pub fc_fold: *const f32,
}

/// Folds a layernorm into the linear layer that reads it, for the one-row
/// step over bf16 weights (f32 weights measured slower folded): `out[2j] = Σ_k γ_k W[j][k]` and `out[2j + 1] = bias_j + Σ_k β_k
/// W[j][k]`. As `LN(x)_k = (x_k - mean) rstd γ_k + β_k`, the layer's output
/// is `(LN(x) · Wᵀ)_j + bias_j = rstd ((x ⊙ γ) · W_j - mean out[2j]) +
/// out[2j + 1]`: the step multiplies `x ⊙ γ` (made as the row is staged)
/// and needs only the row's mean and rstd, which each warp sums for itself,
/// not the normalised row (no block reduction, no barrier). One warp a
/// column ([`DECODE_STEP_FOLD_THREADS`] threads a block);
/// `DecodeStepFoldParams<f32>` / `<u16>`.
pub const DECODE_STEP_FOLD: &str = "decode_step_fold";
pub const DECODE_STEP_FOLD_BF16: &str = "decode_step_fold_bf16";
/// Threads a block of [`DECODE_STEP_FOLD`] (a column a warp).
pub const DECODE_STEP_FOLD_THREADS: u32 = 256;
/// Columns a block of [`DECODE_STEP_FOLD`] folds: one a warp of 32 lanes.
pub const DECODE_STEP_FOLD_COLUMNS: u32 = DECODE_STEP_FOLD_THREADS / 32;
/// Floats a column takes in a fold: the two sums, side by side, so the
/// step's epilogue reads both with one 8-byte load.
pub const DECODE_STEP_FOLD_PAIR: usize = 2;

/// Units a column group of the step's f32 tiles of several rows, each a
/// warp's: k of `groups` column groups (`steps` loop steps each) cut into
/// `units` pieces of whole steps so that the block's busiest warp runs the
/// fewest steps, `ceil(groups * units / WARPS) * ceil(steps / units)`; a
/// tie goes to fewer units (fewer reductions); at most `2 * WARPS` units
/// in all (the partials' room), else 1. The rule before, a power of two
/// of units a group, left rounds mostly idle: a 19-column tile (10 groups
/// of two columns) at k = 768 took 20 units, so 16 warps and then 4, 12
/// steps on the busiest warp against 8 with 3 units a group
/// (docs/performance.md, decode step 22).
pub const fn decode_step_rows_units(groups: u32, steps: u32) -> u32 {
    let (mut best, mut best_cost) = (1, u32::MAX);
    let mut ks = 1;
    while ks <= steps && groups * ks <= 2 * DECODE_STEP_WARPS {
        let m = steps.div_ceil(ks);
        // The units that cover k at m steps each (at most ks).
        let units = steps.div_ceil(m);
        let cost = (groups * units).div_ceil(DECODE_STEP_WARPS) * m;
        if cost < best_cost {
            (best, best_cost) = (units, cost);
        }
        ks += 1;
    }
    best
}

/// Shared memory of a launch, in bytes from the (16-byte aligned) base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeStepSmem {
    /// `slots` mbarriers (8 bytes each).
    pub bars: u32,
    /// The block's trace pointer (8 bytes; see `DecodeStepParams::trace`)
    /// and a warp counter (4 bytes), at a fixed offset.
    pub trace: u32,
    /// This launch's epoch (`u32`, the trace slot's last 4 bytes), at a
    /// fixed offset: the flags it writes and waits for derive from it.
    pub epoch: u32,
    /// The block's columns and tiles of each kind of GEMV phase
    /// ([`DECODE_STEP_GEMV_KINDS`] entries of four `u32`), worked out once.
    pub shares: u32,
    /// Each row's position (`u32`), read once per launch.
    pub pos: u32,
    /// Split-column partial sums: `2 * WARPS * MAX_ROWS` floats for one
    /// row, each warp's 16x8 fragment (`WARPS * 128` floats) for more; the
    /// layernorm's reductions use them as scratch.
    pub red: u32,
    /// The LM head's per-warp bests: `WARPS * MAX_ROWS` (value, index) pairs.
    pub best: u32,
    /// A layernorm's weight and bias, `2 * c` floats.
    pub lnp: u32,
    /// The phase's bias for this block's columns: up to `ceil(4c / blocks)`
    /// floats.
    pub bias: u32,
    /// The block's columns of the residual stream's rows (the attproj and
    /// fcproj share, `[c*b/B, c*(b+1)/B)`) as the last layernorm phase
    /// staged them, `n` rows of [`decode_step_share_width`]`(c)` floats: the
    /// residual epilogues add to them.
    pub xraw: u32,
    /// The layer table, copied once per launch: `n_layer` entries.
    pub table: u32,
    /// The phase's input rows, `n * 4c` floats, [`DECODE_STEP_ROWS_ALIGN`]
    /// aligned; in the attention phase, the warps' partials (`WARPS * (64 +
    /// 2)` floats, if more).
    pub xs: u32,
    /// The weight ring: `slots * slot_bytes`.
    pub ring: u32,
    pub total: u32,
}

/// Alignment of the ring's slots (TMA needs 16; 128 keeps each slot on
/// its own shared-memory lines).
pub const DECODE_STEP_SLOT_ALIGN: u32 = 128;

/// Alignment of the staged input rows ([`DecodeStepSmem::xs`]).
pub const DECODE_STEP_ROWS_ALIGN: u32 = 128;

/// The most of `oc` columns one of `blocks` blocks owns (block `b` owns
/// `[oc*b/B, oc*(b+1)/B)`), rounded up to 16 bytes of floats: the room a
/// block keeps for a phase's bias and for its residual columns of a row
/// ([`DecodeStepSmem::bias`], [`DecodeStepSmem::xraw`]).
pub const fn decode_step_share_width(oc: u32, blocks: u32) -> u32 {
    let blocks = if blocks == 0 { 1 } else { blocks };
    oc.div_ceil(blocks).next_multiple_of(4)
}

/// The shared-memory layout of a launch of `n` rows, width `c`, `n_layer`
/// layers, `blocks` blocks, `slots` slots of `slot_bytes` (a multiple of
/// [`DECODE_STEP_SLOT_ALIGN`]).
pub const fn decode_step_smem(
    n: u32,
    c: u32,
    n_layer: u32,
    blocks: u32,
    slots: u32,
    slot_bytes: u32,
) -> DecodeStepSmem {
    let bars = 0;
    let trace = bars + DECODE_STEP_MAX_SLOTS * 8;
    let epoch = trace + 12;
    let shares = trace + 16;
    let pos = shares + DECODE_STEP_GEMV_KINDS * 16;
    let red = (pos + DECODE_MAX_ROWS * 4).next_multiple_of(16);
    let red_floats = if n > 1 {
        DECODE_STEP_WARPS * DECODE_GEMV_MMA_OUTPUTS
    } else {
        2 * DECODE_STEP_WARPS * DECODE_MAX_ROWS
    };
    let best = red + red_floats * 4;
    let lnp = best + DECODE_STEP_WARPS * DECODE_MAX_ROWS * 8;
    let bias = lnp + 2 * c * 4;
    // The widest phase has 4c columns.
    let xraw = bias + decode_step_share_width(4 * c, blocks) * 4;
    let table = xraw + n * decode_step_share_width(c, blocks) * 4;
    // On its own 128-byte lines: the residual phases' `cp.async` staging of
    // the input rows ran ~1.4 µs slower into rows 64 bytes off (measured on
    // an H100 at 8 rows: fcproj's rows staged in 3.7 µs against 2.2, the
    // step 3-6 % slower; docs/performance.md, decode step 11).
    let xs = (table + n_layer * size_of::<DecodeStepLayer<f32>>() as u32).next_multiple_of(DECODE_STEP_ROWS_ALIGN);
    let rows = n * 4 * c;
    let parts = DECODE_STEP_WARPS * (DECODE_HEAD_SIZE + 2);
    let ring = (xs + 4 * if rows > parts { rows } else { parts }).next_multiple_of(DECODE_STEP_SLOT_ALIGN);
    DecodeStepSmem {
        bars,
        trace,
        epoch,
        shares,
        pos,
        red,
        best,
        lnp,
        bias,
        xraw,
        table,
        xs,
        ring,
        total: ring + slots * slot_bytes,
    }
}

/// The decode step (see the module docs): `n` rows, each at its own
/// position `pos[r]`, feeding `tokens[r]`. A row at or past `max_t` is
/// idle (a free slot of a server's batch): it stores no key or value and
/// attends to nothing; its outputs mean nothing.
///
/// Launch: one block of [`DECODE_STEP_THREADS`] per SM (`gridDim.x` blocks,
/// all resident at once: the grid barriers wait for every block),
/// [`decode_step_smem`]`(n, c, n_layer, gridDim.x, slots, slot_bytes).total` bytes of dynamic
/// shared memory. `slot_bytes` holds at least one weight row of the widest
/// input (`4c` elements). `c = 64 * nh`, `c % 8 == 0`, `n <=`
/// [`DECODE_STEP_MAX_ROWS`], every buffer 16-byte aligned, the first two
/// `sync` words and the attention counters zero between launches (the
/// kernel leaves them so); `sync[2]` and `flags` as the last launch on them
/// left them (zero at first).
///
/// Results as the fused chain's: the logits, each row's argmax over the
/// first `v` columns in `ids` and `tokens` (the next step's input), `pos[r]
/// += 1`; k and v of the new token in the caches; `x` ends as the final
/// residual stream.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeStepParams<W = f32> {
    /// `[n_layer]` layer tables.
    pub layers: *const DecodeStepLayer<W>,
    /// `[vp, c]`: the token embedding, tied to the LM head.
    pub wte: *const W,
    /// `[max_pos, c]`
    pub wpe: *const f32,
    pub lnf_w: *const f32,
    pub lnf_b: *const f32,
    /// Null, or lnf folded into the LM head (`[vp]` pairs, see
    /// [`DECODE_STEP_FOLD`]).
    pub lnf_fold: *const f32,
    /// `[n]` step state: read at the start, advanced at the end.
    pub tokens: *mut u32,
    pub pos: *mut u32,
    pub ids: *mut u32,
    /// `[n, c]` the residual stream; `[n, c]` queries; `[n, c]` attention
    /// output; `[n, 4c]` the MLP's hidden rows; `[n, vp]` logits.
    pub x: *mut f32,
    pub q: *mut f32,
    pub att: *mut f32,
    pub h: *mut f32,
    pub logits: *mut f32,
    /// `[gridDim.x * n]` each: the LM head's per-block bests.
    pub part_val: *mut f32,
    pub part_idx: *mut u32,
    /// Attention partials: `[n * nh * parts_stride * 64]` and `[... * 2]`,
    /// one per item of `DECODE_STEP_WARPS * DECODE_STEP_ATTN_KEYS` keys;
    /// `[n * nh]` counters. With more than one row, a head with several
    /// items is merged by its last block (the counters). At one row the
    /// partials go flagged to `flags` instead, and the attproj phase merges
    /// them as it stages its input (`att` then holds nothing).
    pub att_acc: *mut f32,
    pub att_ml: *mut f32,
    pub att_counter: *mut u32,
    /// [`DECODE_STEP_SYNC_WORDS`] counters.
    pub sync: *mut u32,
    /// At one row, the rows that pass between the phases of a layer and
    /// into the next (the attention's partials too), without a grid
    /// barrier ([`decode_step_flag_words`]`(c, max_t)` words): each word
    /// holds a float (low half) and its flag (high half), written by one
    /// 8-byte store, so a reader that sees the flag it expects sees the
    /// value with it. A launch's flag for layer `l` is `epoch * n_layer +
    /// l`, its epoch one more than `sync[2]` (which its last block then
    /// advances): no flag repeats between a word's consecutive writes.
    /// Zero-filled at allocation (epochs start at 1). The other kernels
    /// only advance the epoch.
    pub flags: *mut u64,
    pub n_layer: u32,
    pub n: u32,
    pub c: u32,
    pub nh: u32,
    /// Real and padded vocabulary.
    pub v: u32,
    pub vp: u32,
    pub max_t: u32,
    pub max_pos: u32,
    /// 0 = unlimited; else each query sees its last `window` keys.
    pub window: u32,
    /// Partials per (row, head): `>= ceil(max_t / (DECODE_STEP_WARPS *
    /// DECODE_STEP_ATTN_KEYS))`.
    pub parts_stride: u32,
    /// log2(e) / sqrt(64).
    pub scale_log2e: f32,
    /// The weight ring: `slots` (2..=[`DECODE_STEP_MAX_SLOTS`]) of
    /// `slot_bytes` each.
    pub slots: u32,
    pub slot_bytes: u32,
    /// The `_traced` kernels: null, or `gridDim.x *
    /// decode_step_trace_words(n_layer)` words, where each block records
    /// when its phases start, get their inputs and end (a diagnostic; a
    /// block barrier more per phase). The other kernels ignore it.
    pub trace: *mut u64,
}

/// [`DECODE_STEP_FOLD`]: fold the layernorm `(ln_w, ln_b)` into the
/// `[oc, c]` weight `w` (f32, or bf16 bits for `W = u16`) and its bias.
/// Launch: `ceil(oc / (DECODE_STEP_FOLD_THREADS / 32))` blocks of
/// [`DECODE_STEP_FOLD_THREADS`]; `c % 8 == 0`, `w` 16-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeStepFoldParams<W = f32> {
    pub w: *const W,
    /// `[c]` each.
    pub ln_w: *const f32,
    pub ln_b: *const f32,
    /// `[oc]`, or null (no bias: the LM head).
    pub bias: *const f32,
    /// `[oc]` pairs ([`DECODE_STEP_FOLD_PAIR`] floats a column).
    pub out: *mut f32,
    pub c: u32,
    pub oc: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe DecodeStepParams<f32>, DecodeStepParams<u16>, DecodeStepFoldParams<f32>, DecodeStepFoldParams<u16>);
