//! The decode step as one persistent kernel (contract and rationale:
//! `params::decode_step`). sm_90a only: the weight ring is filled by bulk
//! copies (`cp.async.bulk`) that complete on `mbarrier`s.
//!
//! Work split. GEMV phases: block `b` of `B` owns columns `[oc*b/B,
//! oc*(b+1)/B)` of every matrix, which are consecutive rows of the weight,
//! so each tile of them is one bulk copy. Thread 0 keeps up to `slots`
//! tiles in flight, in the order the phases consume them, refilling a slot
//! as soon as the block has read it, whatever phase the next tile belongs
//! to. A tile's columns go to warps, one column each, or when the tile has
//! fewer columns than warps, a column's dot product is split over several
//! warps whose partial sums meet in shared memory. Attention: one block
//! per (chunk of `WARPS * 8` keys, row, head), 8 keys a warp, the warps'
//! partials merged in shared memory; where a head has several chunks, the
//! last block to finish one merges theirs (at one row, the attproj phase
//! merges them instead as it stages its input: `Merge`).
//!
//! Between phases a block arrives at the grid barrier first, then starts
//! the small copies the next phase needs (its bias, layernorm parameters),
//! then waits: their latency hides behind the barrier's. At one row no
//! phase needs a barrier: each output (a row's value, or
//! an attention partial's) goes out with a flag in the same 8-byte word,
//! and its readers poll for the flag (`flagged`). The weight tiles
//! are issued by a producer thread once a phase has staged its input rows
//! (and normalised them), so their bytes stream while the block computes,
//! not while the next phase waits on its inputs: a load issued behind a tile's bytes waits for
//! them (measured: `bench step` traces, the notes in docs/performance.md).
//! The tiles are marked to leave L2 first: read once a step, they would
//! otherwise evict the caches and activations. One loop over the GEMV phases keeps one copy of
//! each phase's code: the step is larger than the instruction caches.

use super::decode::{
    ATT_LANES, ArgmaxOut, HS, MMA_ACC, MMA_BATCH, MMA_OUTPUTS, MMA_QUAD, MMA_TILE, MmaStaged, MmaWeight, argmax_finish,
    attend_keys, attend_loaded, better, combine_parts, layernorm_rows, load_keys, merge_parts_dim, mma_load_batch,
    mma_out, mma_stage_step, stage_vectors, warp_best,
};
use super::flash_attention::decode::{key_lanes_sum, key_score_part};
use super::gelu::gelu;
use super::vec4::{VEC, load4, load4_cg, store4};
use super::weight::Weight;
use crate::device::Vec2;
use crate::device::math::{exp2_approx, fma, rsqrt_precise};
use crate::device::mma::{cp_async_4, cp_async_16, cp_async_commit, cp_async_wait_group, shared_addr};
use crate::device::shared::{dynamic_shared_align16, ld_shared_v2_f32};
use crate::device::tma::{
    bulk_copy_to_shared_evict_first, fence_mbarrier_init, fence_proxy_async_shared, mbarrier_arrive_expect_tx,
    mbarrier_init, mbarrier_wait_parity,
};
use crate::device::warp::{BLOCK_REDUCE_SCRATCH, block_reduce_sum, warp_reduce_sum, warp_reduce_sum_many};
use crate::device::{
    WARP_SIZE, atomic_add_acq_rel_u32, atomic_add_shared_u32, block_idx_x, clock64, flag_of, flagged_value,
    global_timer_ns, grid_arrive, grid_dependency_wait, grid_dim_x, grid_wait, lane_id, launch_dependents,
    load_acquire_u32, load_flagged2, store_flagged, sync_threads, sync_threads_or, thread_fence, thread_idx_x, warp_id,
};
use crate::device::{no_unroll, unroll};
use crate::params::decode::DECODE_MAX_ROWS;
use crate::params::decode_step::*;
use crate::params::layernorm::LAYERNORM_EPS;

// The layernorm's reductions use the split-column scratch.
const _: () = assert!(2 * WARPS * ROWS >= BLOCK_REDUCE_SCRATCH);

const ROWS: usize = DECODE_MAX_ROWS as usize;
const WARPS: usize = DECODE_STEP_WARPS as usize;
const LANES: usize = WARP_SIZE as usize;
/// Key groups of 8 lanes in a warp.
const ATT_GROUPS_PER_WARP: usize = LANES / ATT_LANES;
const ATT_KEYS: usize = DECODE_STEP_ATTN_KEYS as usize;
/// Keys each group of 8 lanes scores per item, all their loads in flight
/// (fewer than the attention kernel's 8: 16 floats each in registers, and
/// this kernel's blocks of 512 threads get at most 128 registers a thread).
const ATT_KEYS_PER_GROUP: usize = ATT_KEYS / ATT_GROUPS_PER_WARP;
const GEMVS: usize = DECODE_STEP_GEMVS_PER_LAYER as usize;
/// Keys of one attention work item: each warp of the block takes `ATT_KEYS`.
const ATT_ITEM_KEYS: usize = WARPS * ATT_KEYS;
/// The thread that arrives at and waits on the grid barriers: the last
/// warp's first lane, which issues no copies (thread 0 issues the weight
/// tiles, the low threads the layernorm parameters and biases), so its
/// release waits for nothing of theirs.
const BARRIER_THREAD: u32 = DECODE_STEP_THREADS - WARP_SIZE;
/// The thread that issues the weight tiles (the producer): warp 14's
/// first lane. Not warp 0, which takes the most columns when they do not
/// divide evenly (the tiles' issue sits on its path); not the barrier's.
const PRODUCER_THREAD: u32 = DECODE_STEP_THREADS - 2 * WARP_SIZE;

/// Items (of `ATT_ITEM_KEYS` keys) of the attention of a row at position
/// `raw` (0 for an idle row, at or past `max_t`).
#[inline(always)]
fn att_items(raw: usize, max_t: usize, window: usize) -> usize {
    if raw >= max_t {
        return 0;
    }
    let key_lo = if window > 0 {
        (raw + 1).saturating_sub(window)
    } else {
        0
    };
    (raw + 1 - key_lo).div_ceil(ATT_ITEM_KEYS)
}

/// Fold a batch of partials (max `m`, sum `l`, accumulators `a`; a missing
/// one has max -inf) into the running (`m_all`, `l_all`, `o`), as
/// `combine_parts` would.
#[inline(always)]
fn merge_batch<const B: usize, const D: usize>(
    m_all: &mut f32,
    l_all: &mut f32,
    o: &mut [f32; D],
    m: &[f32; B],
    l: &[f32; B],
    a: &[[f32; D]; B],
) {
    let mut mb = *m_all;
    unroll!(u < B => {
        mb = mb.max(m[u]);
    });
    // Item 0 holds the query's own key: mb is finite from the first batch.
    let s = exp2_approx(*m_all - mb);
    *l_all *= s;
    unroll!(e < D => {
        o[e] *= s;
    });
    unroll!(u < B => {
        // A missing item (max -inf) weighs 0.
        let w = exp2_approx(m[u] - mb);
        *l_all = fma(l[u], w, *l_all);
        unroll!(e < D => {
            o[e] = fma(a[u][e], w, o[e]);
        });
    });
    *m_all = mb;
}

/// Flagged partial `item` of head `head` ([`decode_step_flag_words`]'s
/// layout): its accumulators, then its max and sum.
///
/// # Safety
/// The params' contract (`flags` sized for `c` and `max_t`); `head < nh`,
/// `item < decode_step_att_items(max_t)`.
#[inline(always)]
unsafe fn att_flagged_part<W>(p: &DecodeStepParams<W>, head: usize, item: usize) -> *mut u64 {
    let items = decode_step_att_items(p.max_t);
    // SAFETY: the caller's contract: inside the flags' partials.
    unsafe {
        p.flags
            .add(decode_step_flag_rows(p.c) + (head * items + item) * DECODE_STEP_ATT_PART_WORDS)
    }
}

/// Partials [`merged_att2_flagged`] loads at once: two pairs of words
/// each (8 registers).
const MERGE_BATCH_FLAGGED: usize = 4;

/// Dimensions `d, d + 1` of head `head`'s attention output, merged from
/// its `items` flagged partials (`AttOut::Flagged`): each partial's max
/// and sum and its two accumulators loaded for a whole batch first, then
/// each pair polled until it carries `flag`. Two dimensions a thread, not
/// four: a flagged word is twice a float's registers, and 384 of the
/// block's 512 threads then cover a 768-wide row in one pass.
///
/// # Safety
/// The params' contract; the attention phase of this layer writes the
/// head's `items` partials flagged `flag` without waiting on this block;
/// `d` even, `d + 2 <= 64`; `items >= 1`.
#[inline(always)]
unsafe fn merged_att2_flagged<W>(p: &DecodeStepParams<W>, head: usize, d: usize, items: usize, flag: u32) -> [f32; 2] {
    // Each partial's pairs: (max, sum), then dimensions d, d + 1.
    let offs = [HS, d];
    let (mut m_all, mut l_all, mut o) = (f32::NEG_INFINITY, 0f32, [0f32; 2]);
    let mut i0 = 0;
    while i0 < items {
        let mut w = [[[0u64; 2]; 2]; MERGE_BATCH_FLAGGED];
        unroll!(u < MERGE_BATCH_FLAGGED => {
            if i0 + u < items {
                // SAFETY: item i0 + u < items of the head; even offsets: 16-byte aligned pairs.
                let part = unsafe { att_flagged_part(p, head, i0 + u) };
                for (j, &off) in offs.iter().enumerate() {
                    // SAFETY: as above.
                    w[u][j] = unsafe { load_flagged2(part.add(off)) };
                }
            }
        });
        let mut m = [f32::NEG_INFINITY; MERGE_BATCH_FLAGGED];
        let mut l = [0f32; MERGE_BATCH_FLAGGED];
        let mut a = [[0f32; 2]; MERGE_BATCH_FLAGGED];
        unroll!(u < MERGE_BATCH_FLAGGED => {
            if i0 + u < items {
                // SAFETY: as above.
                let part = unsafe { att_flagged_part(p, head, i0 + u) };
                for (j, &off) in offs.iter().enumerate() {
                    // `&`, not `&&`: one test, no branch between the halves.
                    while (flag_of(w[u][j][0]) != flag) | (flag_of(w[u][j][1]) != flag) {
                        // SAFETY: as above.
                        w[u][j] = unsafe { load_flagged2(part.add(off)) };
                    }
                }
                m[u] = flagged_value(w[u][0][0]);
                l[u] = flagged_value(w[u][0][1]);
                a[u] = [flagged_value(w[u][1][0]), flagged_value(w[u][1][1])];
            }
        });
        merge_batch(&mut m_all, &mut l_all, &mut o, &m, &l, &a);
        i0 += MERGE_BATCH_FLAGGED;
    }
    o.map(|x| x / l_all)
}

/// `a / b` in 32 bits (64-bit division is a long software sequence on the
/// GPU): every size and index here is below 2^32 (the params' contract).
#[inline(always)]
fn div32(a: usize, b: usize) -> usize {
    (a as u32 / b as u32) as usize
}

/// `a % b` in 32 bits (see [`div32`]).
#[inline(always)]
fn rem32(a: usize, b: usize) -> usize {
    (a as u32 % b as u32) as usize
}

/// The block's trace (`DecodeStepParams::trace`), when on: thread 0
/// records, through the block's pointer kept in shared memory (not held in
/// registers through the kernel).
/// `ON`: the traced kernels; elsewhere every mark compiles away (tracing in
/// every kernel made ptxas spill the FP32 step).
struct Trace<'a, W, const ON: bool>(&'a DecodeStepParams<W>);

// By hand: the derives would ask `W: Copy`.
impl<W, const ON: bool> Clone for Trace<'_, W, ON> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W, const ON: bool> Copy for Trace<'_, W, ON> {}

/// Where the block's trace pointer lies in shared memory (a fixed offset).
const TRACE_SLOT: usize = decode_step_smem(0, 0, 0, 1, 0, 0).trace as usize;

impl<W, const ON: bool> Trace<'_, W, ON> {
    /// Whether the launch traces: the same answer in every thread.
    #[inline(always)]
    fn on(self) -> bool {
        ON && !self.0.trace.is_null()
    }

    /// Thread 0, at the start: keep the block's part of the trace.
    #[inline(always)]
    fn init(self) {
        if self.on() && thread_idx_x() == 0 {
            let words = decode_step_trace_words(self.0.n_layer);
            // SAFETY: the pointer and counter are the first 12 bytes of the
            // 16-byte slot in the launch's shared memory (the epoch has the
            // rest); the trace holds gridDim.x blocks of
            // `words` (the contract).
            unsafe {
                *Self::slot() = self.0.trace.add(block_idx_x() as usize * words);
                *(Self::slot().add(1) as *mut u32) = 0;
            }
        }
    }

    /// The shared-memory slot of the block's pointer.
    #[inline(always)]
    fn slot() -> *mut *mut u64 {
        // SAFETY: the launch's shared memory holds the layout's `trace` slot.
        unsafe { dynamic_shared_align16::<u8>().add(TRACE_SLOT) as *mut *mut u64 }
    }

    /// Thread 0 writes `v` to word `i` of the block's part.
    #[inline(always)]
    fn put(self, i: usize, v: u64) {
        if self.on() && thread_idx_x() == 0 {
            // SAFETY: `init` set the slot (thread 0 wrote it, thread 0
            // reads it); i < the block's words.
            unsafe { *(*Self::slot()).add(i) = v };
        }
    }

    /// Thread 0 records `mark` of phase `phase` (its clock, now).
    #[inline(always)]
    fn mark(self, phase: usize, mark: DecodeStepMark) {
        self.put(
            DECODE_STEP_TRACE_HEADER + phase * DECODE_STEP_TRACE_MARKS + mark as usize,
            clock64(),
        );
    }

    /// The last warp of the block to get here records `mark` (lane 0,
    /// counting arrivals in the trace word itself, which ends as the time).
    #[inline(always)]
    fn mark_last_warp(self, phase: usize, mark: DecodeStepMark) {
        if self.on() && lane_id() == 0 {
            // SAFETY: the counter beside the slot (zeroed by `init` before a
            // block barrier); the slot holds the block's part.
            unsafe {
                let counter = Self::slot().add(1) as *mut u32;
                if (atomic_add_shared_u32(counter, 1) + 1).is_multiple_of(WARPS as u32) {
                    *(*Self::slot()).add(DECODE_STEP_TRACE_HEADER + phase * DECODE_STEP_TRACE_MARKS + mark as usize) =
                        clock64();
                }
            }
        }
    }

    /// Thread 0 records the global timer and its clock in the header.
    #[inline(always)]
    fn clocks(self, timer: DecodeStepTraceHeader, clock: DecodeStepTraceHeader) {
        self.put(timer as usize, global_timer_ns());
        self.put(clock as usize, clock64());
    }
}

/// The trace's phase index of GEMV phase `g` (see `DecodeStepMark`).
#[inline(always)]
fn traced_phase(g: usize) -> usize {
    const AT: [usize; GEMVS] = [0, 2, 3, 4];
    let per = DECODE_STEP_PHASES_PER_LAYER as usize;
    div32(g, GEMVS) * per + AT[rem32(g, GEMVS)]
}

/// What a GEMV phase does with a column's sum (after the bias).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    /// q to `q`, k and v into the layer's caches at the row's position.
    Qkv,
    /// `x += sum` (attproj, fcproj).
    Residual,
    /// `h = gelu(sum)` (fc).
    Gelu,
    /// The logits, and each row's best so far (the LM head).
    Logits,
}

/// One GEMV phase of the step.
#[derive(Clone, Copy)]
struct Gemv<W> {
    w: *const W,
    /// Null: no bias (the LM head).
    bias: *const f32,
    /// Null: no layernorm of the input rows.
    ln_w: *const f32,
    ln_b: *const f32,
    /// The input rows (`n * c_in`); null: the token + position embedding.
    inp: *const f32,
    c_in: usize,
    oc: usize,
    epi: Epilogue,
    /// The caches, kept as the weights are (f32, or bf16 bits).
    k_cache: *mut W,
    v_cache: *mut W,
    /// Non-null: the input row comes flagged from here (`DecodeStepParams::flags`),
    /// each word carrying `flag_in` once written (`with_flags`).
    flags_in: *const u64,
    flag_in: u32,
    /// Non-null: the outputs also go here, flagged `flag_out`.
    flags_out: *mut u64,
    flag_out: u32,
    /// Null, or the layernorm folded into this phase's columns (pairs, see
    /// [`DECODE_STEP_FOLD`]); used at one row ([`folded`]).
    fold: *const f32,
}

/// GEMV phase `g` of the step: per layer qkv, attproj, fc, fcproj; then
/// (`g == GEMVS * n_layer`) the LM head. `tbl` is the layer table (the
/// block's copy in shared memory).
///
/// # Safety
/// The params' contract; `tbl` holds `n_layer` entries; `g <= GEMVS * n_layer`.
#[inline(always)]
unsafe fn gemv_phase<W: Weight>(p: &DecodeStepParams<W>, tbl: *const DecodeStepLayer<W>, g: usize) -> Gemv<W> {
    let c = p.c as usize;
    let nl = p.n_layer as usize;
    let null = core::ptr::null::<f32>();
    if g >= GEMVS * nl {
        return Gemv {
            w: p.wte,
            bias: null,
            ln_w: p.lnf_w,
            ln_b: p.lnf_b,
            inp: p.x,
            c_in: c,
            oc: p.vp as usize,
            epi: Epilogue::Logits,
            k_cache: core::ptr::null_mut(),
            v_cache: core::ptr::null_mut(),
            flags_in: core::ptr::null(),
            flag_in: 0,
            flags_out: core::ptr::null_mut(),
            flag_out: 0,
            fold: p.lnf_fold,
        };
    }
    let layer = g / GEMVS;
    // SAFETY: layer < n_layer entries of the table.
    let lw = unsafe { &*tbl.add(layer) };
    let mut ph = Gemv {
        w: lw.qkv_w,
        bias: lw.qkv_b,
        ln_w: lw.ln1_w,
        ln_b: lw.ln1_b,
        inp: if layer == 0 { null } else { p.x },
        c_in: c,
        oc: 3 * c,
        epi: Epilogue::Qkv,
        k_cache: lw.k_cache,
        v_cache: lw.v_cache,
        flags_in: core::ptr::null(),
        flag_in: 0,
        flags_out: core::ptr::null_mut(),
        flag_out: 0,
        fold: lw.qkv_fold,
    };
    match g % GEMVS {
        0 => {}
        1 => {
            (ph.w, ph.bias, ph.ln_w, ph.ln_b, ph.fold) = (lw.attproj_w, lw.attproj_b, null, null, null);
            (ph.inp, ph.oc, ph.epi) = (p.att, c, Epilogue::Residual);
        }
        2 => {
            (ph.w, ph.bias, ph.ln_w, ph.ln_b, ph.fold) = (lw.fc_w, lw.fc_b, lw.ln2_w, lw.ln2_b, lw.fc_fold);
            (ph.inp, ph.oc, ph.epi) = (p.x, 4 * c, Epilogue::Gelu);
        }
        _ => {
            (ph.w, ph.bias, ph.ln_w, ph.ln_b, ph.fold) = (lw.fcproj_w, lw.fcproj_b, null, null, null);
            (ph.inp, ph.c_in, ph.oc, ph.epi) = (p.h, 4 * c, c, Epilogue::Residual);
        }
    }
    ph
}

/// Whether the GEMV phases pass their rows flagged (`DecodeStepParams::flags`)
/// instead of through grid barriers: the readers of a flagged row poll
/// it, and no grid barrier remains in the step: the attention reads q
/// and the new key and value flagged too, and its partials go flagged to
/// attproj (`AttOut::Flagged`). One row, of either weight type. Measured
/// (`bench step`, docs/performance.md): decode step 16 (H100), rows only,
/// bf16 6-7 % faster a step, f32 0-1.3 % slower; step 19 (H200), the
/// attention flagged too: f32 7.6 % faster at one row, taken in step 20.
/// At 8 rows the residual phases stage their rows with `cp.async`, which
/// cannot check flags.
const fn flagged<const R: usize>() -> bool {
    R == 1
}

/// Where this launch's epoch lies in shared memory (a fixed offset).
const EPOCH_SLOT: usize = decode_step_smem(0, 0, 0, 1, 0, 0).epoch as usize;

/// The shared-memory slot of the launch's epoch (`DecodeStepParams::flags`).
#[inline(always)]
fn epoch_slot() -> *mut u32 {
    // SAFETY: the launch's shared memory holds the layout's `epoch` slot.
    unsafe { dynamic_shared_align16::<u8>().add(EPOCH_SLOT) as *mut u32 }
}

/// This launch's flag for layer `layer`'s flagged words (`DecodeStepParams::flags`).
///
/// # Safety
/// The epoch slot was written before a block barrier.
#[inline(always)]
unsafe fn layer_flag<W>(p: &DecodeStepParams<W>, layer: usize) -> u32 {
    // SAFETY: the caller's contract.
    let epoch = unsafe { *epoch_slot() };
    epoch.wrapping_mul(p.n_layer).wrapping_add(layer as u32)
}

/// GEMV phase `g`'s flagged input and output (`flagged`): the rows after
/// qkv, attproj, fc and fcproj go flagged to their readers (the attention,
/// fc, fcproj, and the next qkv or the LM head), each layer's with its own
/// flag.
///
/// # Safety
/// The params' contract (`flags` holds `decode_step_flag_words(c, max_t)` words);
/// the epoch slot was written before a block barrier.
#[inline(always)]
unsafe fn with_flags<W>(p: &DecodeStepParams<W>, mut ph: Gemv<W>, g: usize) -> Gemv<W> {
    let (c, nl) = (p.c as usize, p.n_layer as usize);
    let layer = div32(g, GEMVS);
    // SAFETY: the caller's contract.
    let flag = unsafe { layer_flag(p, layer) };
    // SAFETY: (all) the regions after attproj `[0, c)`, after fc `[c, 5c)`,
    // after fcproj `[5c, 6c)` and after qkv `[6c, 9c)` lie in the flags' rows.
    let (xa, h, xf, qkv) = unsafe { (p.flags, p.flags.add(c), p.flags.add(5 * c), p.flags.add(6 * c)) };
    if g >= GEMVS * nl {
        (ph.flags_in, ph.flag_in) = (xf, flag.wrapping_sub(1));
        return ph;
    }
    match rem32(g, GEMVS) {
        0 => {
            (ph.flags_out, ph.flag_out) = (qkv, flag);
            if layer > 0 {
                (ph.flags_in, ph.flag_in) = (xf, flag.wrapping_sub(1));
            }
        }
        1 => (ph.flags_out, ph.flag_out) = (xa, flag),
        2 => (ph.flags_in, ph.flag_in, ph.flags_out, ph.flag_out) = (xa, flag, h, flag),
        _ => (ph.flags_in, ph.flag_in, ph.flags_out, ph.flag_out) = (h, flag, xf, flag),
    }
    ph
}

/// This block's share of one kind of GEMV phase (the same in every
/// layer): its columns `[lo, hi)`, `tc` columns a tile, `tiles` tiles.
/// Worked out once per launch (`share_kinds`): the divisions cost a
/// fraction of a microsecond on every phase's path.
#[derive(Clone, Copy)]
#[repr(C)]
struct Share {
    lo: u32,
    hi: u32,
    tc: u32,
    tiles: u32,
}

const KINDS: usize = DECODE_STEP_GEMV_KINDS as usize;

/// The kind of GEMV phase `g` (`Share`'s index): `g % 4` in a layer, then
/// the LM head.
#[inline(always)]
fn kind_of(g: usize, n_layer: usize) -> usize {
    if g >= GEMVS * n_layer { GEMVS } else { g % GEMVS }
}

/// Threads `k < KINDS` fill `shares[k]`: block `b` of `B` owns columns
/// `[oc*b/B, oc*(b+1)/B)`, in tiles of as many columns as a slot holds.
///
/// # Safety
/// The params' contract; `shares` holds `KINDS` entries of shared memory;
/// `tbl` the layer table; a block barrier follows before any read.
#[inline(always)]
unsafe fn share_kinds<W: Weight>(
    p: &DecodeStepParams<W>,
    tbl: *const DecodeStepLayer<W>,
    shares: *mut Share,
    slot_bytes: usize,
) {
    let k = thread_idx_x() as usize;
    if k < KINDS {
        let g = if k < GEMVS { k } else { GEMVS * p.n_layer as usize };
        // SAFETY: g is a phase of the step.
        let ph = unsafe { gemv_phase(p, tbl, g) };
        let (b, nb) = (block_idx_x() as usize, grid_dim_x() as usize);
        let (lo, hi) = (div32(ph.oc * b, nb), div32(ph.oc * (b + 1), nb));
        // At least one column (the contract: a slot holds a row).
        let tc = div32(slot_bytes, ph.c_in * size_of::<W>()).max(1);
        let share = Share {
            lo: lo as u32,
            hi: hi as u32,
            tc: tc as u32,
            tiles: div32(hi - lo + tc - 1, tc) as u32,
        };
        // SAFETY: k < KINDS.
        unsafe { *shares.add(k) = share };
    }
}

/// The weight ring in shared memory.
#[derive(Clone, Copy)]
struct Ring {
    /// Shared-window addresses of the first slot and the first mbarrier.
    base: u32,
    bars: u32,
    /// The same slots, as a generic pointer (for loads).
    ptr: *const u8,
    slots: usize,
    slot_bytes: usize,
    /// The layer table in shared memory.
    tbl: *const u8,
    /// Each kind's `Share` in shared memory.
    shares: *const Share,
}

/// Where the producer's bulk copies have got to: the next tile is tile `j` of
/// GEMV phase `g`; `issued` tiles so far.
struct Producer {
    g: usize,
    j: usize,
    issued: usize,
}

/// The producer: issue the next tiles while a slot is free (`consumed` tiles
/// read so far; a slot frees when its tile has been read).
///
/// # Safety
/// The params' contract; the producer only, after the barriers' init; the
/// slot of every tile issued is no longer read (the block synchronised
/// after consuming the tile before it).
#[inline(always)]
unsafe fn issue<W: Weight>(p: &DecodeStepParams<W>, prod: &mut Producer, consumed: usize, ring: &Ring) {
    let last = GEMVS * p.n_layer as usize;
    while prod.issued < consumed + ring.slots && prod.g <= last {
        // SAFETY: g <= last.
        let ph = unsafe { gemv_phase(p, ring.tbl as *const DecodeStepLayer<W>, prod.g) };
        // SAFETY: KINDS entries.
        let sh = unsafe { *ring.shares.add(kind_of(prod.g, p.n_layer as usize)) };
        if prod.j >= sh.tiles as usize {
            prod.g += 1;
            prod.j = 0;
            continue;
        }
        let (tc, hi) = (sh.tc as usize, sh.hi as usize);
        let c0 = sh.lo as usize + prod.j * tc;
        let cols = tc.min(hi - c0);
        let bytes = (cols * ph.c_in * size_of::<W>()) as u32;
        let slot = rem32(prod.issued, ring.slots);
        let bar = ring.bars + 8 * slot as u32;
        // SAFETY: columns c0..c0+cols of the weight are rows of c_in
        // elements, 16-byte multiples (c % 8 == 0) at 16-byte aligned
        // offsets; the slot holds slot_bytes >= bytes and is not read
        // (the caller's contract); the barrier's phase expects them.
        // The weights are read once a step: marked first to leave L2, they
        // leave the caches and activations there (measured: 2 % faster at
        // one row, the same at 8; docs/performance.md, decode step 8).
        unsafe {
            fence_proxy_async_shared();
            mbarrier_arrive_expect_tx(bar, bytes);
            bulk_copy_to_shared_evict_first(
                ring.base + (slot * ring.slot_bytes) as u32,
                ph.w.add(c0 * ph.c_in) as *const u8,
                bytes,
                bar,
            );
        }
        prod.j += 1;
        prod.issued += 1;
    }
}

/// Start copying the bias of a phase's columns `[lo, hi)` (if it has one)
/// to the bias slot (`cp.async`, waited for with the phase's staging).
///
/// # Safety
/// `lo <= hi <= oc` of the phase; no thread reads the slot until a
/// `cp_async_wait_group` and a block barrier.
#[inline(always)]
unsafe fn stage_bias<W>(ph: &Gemv<W>, sm: &Smem, lo: usize, hi: usize) {
    if !ph.bias.is_null() {
        let t = thread_idx_x() as usize;
        if t < hi - lo {
            // SAFETY: lo + t < oc; the bias slot holds 4c >= hi - lo floats.
            unsafe { cp_async_4(sm.bias.add(t), ph.bias.add(lo + t)) };
        }
        cp_async_commit();
    }
}

/// Start copying a layernorm's weight and bias (`c` floats each) to `lnp`
/// (`cp.async`: the block does not wait for them until the phase that
/// uses them, after its grid barrier).
///
/// # Safety
/// Both hold `c` floats, 16-byte aligned; `lnp` (shared) holds `2 * c`, and
/// no thread reads it until a `cp_async_wait_group` and a block barrier.
#[inline(always)]
unsafe fn stage_ln(lnp: *mut f32, w: *const f32, b: *const f32, c: usize) {
    let mut k = thread_idx_x() as usize * VEC;
    while k < c {
        // SAFETY: k + 4 <= c.
        unsafe {
            cp_async_16(lnp.add(k), w.add(k));
            cp_async_16(lnp.add(c + k), b.add(k));
        }
        k += DECODE_STEP_THREADS as usize * VEC;
    }
    cp_async_commit();
}

/// Whether phase `ph` runs with its layernorm folded into its weights
/// ([`DECODE_STEP_FOLD`]): one row of bf16 weights, and a fold given. Its
/// stagers read the layernorm's weight, and its epilogues the fold pairs,
/// from global memory (L2). Measured on an H200 (`bench step`, docs/
/// performance.md, decode step 18): bf16 1.3 % faster a step, the CLI
/// 1.5-2 %; f32 weights 0.3 % slower a step and their CLI 1 %, so they
/// layernorm the row. Copying the weight and pairs to shared memory at the
/// boundary before the phase ahead lengthened those grid barriers by ~0.45
/// µs, which cancelled the gain.
#[inline(always)]
fn folded<W, const R: usize>(ph: &Gemv<W>) -> bool {
    R == 1 && size_of::<W>() == 2 && !ph.fold.is_null()
}

/// Start copying what GEMV phase `g` needs besides its rows and weights:
/// its layernorm's parameters (unless folded: [`folded`]) and its bias.
///
/// # Safety
/// The params' contract; `g` a GEMV phase; `lnp` and the bias slot's last
/// readers finished before a block barrier.
#[inline(always)]
unsafe fn stage_phase_params<W: Weight, const R: usize>(p: &DecodeStepParams<W>, sm: &Smem, ring: &Ring, g: usize) {
    let tbl = ring.tbl as *const DecodeStepLayer<W>;
    // SAFETY: g <= last; KINDS shares.
    let (ph, sh) = unsafe { (gemv_phase(p, tbl, g), *ring.shares.add(kind_of(g, p.n_layer as usize))) };
    if folded::<W, R>(&ph) {
        // Its pairs carry the bias.
        return;
    }
    if !ph.ln_w.is_null() {
        // SAFETY: the parameters hold c floats; lnp is free (the contract).
        unsafe { stage_ln(sm.lnp, ph.ln_w, ph.ln_b, p.c as usize) };
    }
    // SAFETY: the bias slot is free (the contract).
    unsafe { stage_bias(&ph, sm, sh.lo as usize, sh.hi as usize) };
}

/// Layernorm the staged rows `xs[r][0..c]`, `r < n`, in place, each with
/// the whole block (two block reductions a row: the mean, then the
/// variance about it), output rounded as the weights multiply it. One
/// warp a row (`layernorm_rows`) left 15 warps idle through a serial chain
/// of ~1 µs; the step has one row.
///
/// # Safety
/// `xs` holds `n * c` floats, `lnp` the weight and bias (`2c`), `red`
/// `BLOCK_REDUCE_SCRATCH` floats; every thread calls it after a block
/// barrier that follows the staging; it ends with one.
#[inline(always)]
unsafe fn layernorm_block<W: Weight>(xs: *mut f32, lnp: *const f32, red: *mut f32, n: usize, c: usize) {
    let (tid, threads) = (thread_idx_x() as usize, DECODE_STEP_THREADS as usize);
    let inv_c = 1.0 / c as f32;
    for r in 0..n {
        // SAFETY: (all) row r < n of xs; k < c; red the reductions' scratch.
        let row = unsafe { xs.add(r * c) };
        let mut s = 0f32;
        let mut k = tid;
        while k < c {
            // SAFETY: k < c: inside row r.
            s += unsafe { *row.add(k) };
            k += threads;
        }
        // SAFETY: `red` is the reductions' scratch; every thread of the block runs this
        // loop the same n times.
        let mean = unsafe { block_reduce_sum(s, red) } * inv_c;
        let mut v = 0f32;
        k = tid;
        while k < c {
            // SAFETY: k < c: inside row r.
            let d = unsafe { *row.add(k) } - mean;
            v = fma(d, d, v);
            k += threads;
        }
        // SAFETY: `red` as for the mean; all threads call it (the mean's closing barrier
        // freed the scratch).
        let rstd = rsqrt_precise(unsafe { block_reduce_sum(v, red) } * inv_c + LAYERNORM_EPS);
        k = tid;
        while k < c {
            // Each thread normalises the elements it summed.
            // SAFETY: k < c: element k of row r, written only by the thread that read it;
            // `lnp` holds c weights, then c biases.
            unsafe {
                let x = *row.add(k);
                *row.add(k) = W::round_input(fma((x - mean) * rstd, *lnp.add(k), *lnp.add(c + k)));
            }
            k += threads;
        }
        // The rows are read by other threads next.
        sync_threads();
    }
}

/// Start copying the phase's `n * c_in` input floats as they are into
/// `xs` (`cp.async`, no registers held: 8 rows of fcproj's 3072 floats
/// are 12 vectors a thread, three round trips through registers); waited
/// for with the bias. Tensor-core tiles only: they round the rows to bf16
/// as they pack them (`pack_bf16x2`, to nearest even like
/// `Weight::round_input`).
///
/// # Safety
/// `inp` holds `len` floats (a multiple of 4, 16-byte aligned), `xs` too;
/// no thread reads `xs` until a `cp_async_wait_group` and a block barrier.
#[inline(always)]
unsafe fn stage_copy(inp: *const f32, xs: *mut f32, len: usize) {
    let mut i = thread_idx_x() as usize * VEC;
    while i < len {
        // SAFETY: i + 4 <= len.
        unsafe { cp_async_16(xs.add(i), inp.add(i)) };
        i += DECODE_STEP_THREADS as usize * VEC;
    }
    cp_async_commit();
}

/// Fill `xs[r][0..c_in]` for `r < n` (see `stage_vectors`): the phase's
/// input rows, or the embedding (block 0 also writes it to `x`, the
/// residual stream). Rows without a layernorm are rounded as the weights
/// multiply them. The qkv and fc phases' rows (the residual stream) also go
/// to `xraw` as read, the block's residual columns `res` of them. A folded
/// phase (`gamma`, its layernorm's `c_in` weights, not null; one row) also
/// stores the row times them after the row, at `xs[c_in..]`.
///
/// # Safety
/// The params' contract; `sm` as `decode_step_smem` lays it out; `res` the
/// block's share of the residual phases (attproj, fcproj); `merge` given:
/// the phase is attproj at one row, whose input is the attention's
/// flagged partials, merged as staged.
#[inline(always)]
unsafe fn stage_rows<W: Weight>(
    p: &DecodeStepParams<W>,
    ph: &Gemv<W>,
    sm: &Smem,
    n: usize,
    res: Share,
    merge: Option<Merge>,
    gamma: *const f32,
) {
    // The residual stream's rows, kept raw for the residual epilogues.
    let keep = matches!(ph.epi, Epilogue::Qkv | Epilogue::Gelu);
    let (res_lo, res_hi) = (res.lo as usize, res.hi as usize);
    let c_in = ph.c_in;
    let round = ph.ln_w.is_null();
    let embed = ph.inp.is_null();
    if !ph.flags_in.is_null() {
        // SAFETY: one row of c_in flagged words (`with_flags`); the rest as above.
        unsafe { stage_flagged::<W>(ph, sm, keep, round, (res_lo, res_hi), gamma) };
        return;
    }
    if let Some(Merge { items, flag }) = merge {
        // The attention output of the one row, merged from its flagged
        // partials: two dimensions a thread.
        let mut k = thread_idx_x() as usize * 2;
        while k < c_in {
            // An idle row (no items) attends to nothing.
            let v = if items == 0 {
                [0f32; 2]
            } else {
                // SAFETY: k + 2 <= c_in = nh * 64, k even: dims k % 64.. of head k / 64,
                // whose partials the attention phase writes flagged.
                unsafe { merged_att2_flagged(p, k / HS, k % HS, items, flag) }
            };
            // SAFETY: xs holds c_in floats, 16-byte aligned: k even, 8-byte aligned.
            unsafe { *sm.xs.add(k).cast::<Vec2<f32>>() = Vec2(if round { v.map(W::round_input) } else { v }) };
            k += DECODE_STEP_THREADS as usize * 2;
        }
        return;
    }
    // SAFETY: r < n, k + 4 <= c_in; token and position clamped into the
    // tables.
    let load = |r: usize, k: usize| unsafe {
        if embed {
            let tok = (*p.tokens.add(r)).min(p.v - 1) as usize;
            let pos = (*sm.pos.add(r)).min(p.max_pos - 1) as usize;
            let (a, b) = (W::load4_f32(p.wte, tok * c_in + k), load4(p.wpe.add(pos * c_in + k)));
            [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
        } else {
            load4_cg(ph.inp.add(r * c_in + k))
        }
    };
    // SAFETY: r < n, k + 4 <= c_in: `x` and `xs` hold n * c_in floats (c_in == c when
    // embedding or keeping), xraw n rows of xw >= res_hi - res_lo, written at k - res_lo
    // only inside that range.
    let store = |r: usize, k: usize, v: [f32; VEC]| unsafe {
        if embed && block_idx_x() == 0 {
            store4(p.x.add(r * c_in + k), v);
        }
        if keep && k + VEC > res_lo && k < res_hi {
            for (i, &e) in v.iter().enumerate() {
                if (res_lo..res_hi).contains(&(k + i)) {
                    *sm.xraw.add(r * sm.xw + k + i - res_lo) = e;
                }
            }
        }
        store4(sm.xs.add(r * c_in + k), if round { v.map(W::round_input) } else { v });
    };
    if !gamma.is_null() {
        // One row, its layernorm folded: a vector a thread (c_in = 768 is
        // 192 of them), the weight's loaded beside the row's, their
        // product after the row.
        let mut k = thread_idx_x() as usize * VEC;
        while k < c_in {
            // SAFETY: k + 4 <= c_in: gamma holds c_in floats, xs 2 * c_in (one row).
            unsafe {
                let (v, gm) = (load(0, k), load4(gamma.add(k)));
                store(0, k, v);
                store4(
                    sm.xs.add(c_in + k),
                    [v[0] * gm[0], v[1] * gm[1], v[2] * gm[2], v[3] * gm[3]],
                );
            }
            k += DECODE_STEP_THREADS as usize * VEC;
        }
        return;
    }
    stage_vectors(n, c_in, load, store);
}

/// Flagged words a thread loads (in pairs) before it waits on any: one
/// round trip for fcproj's 3072 inputs over 512 threads.
const FLAG_BATCH: usize = 4;

/// Stage the one row of a flagged input (`ph.flags_in`, `c_in` words)
/// into `xs`, each pair of words polled until both carry `ph.flag_in`
/// (at once: pausing 32 ns between polls was ~0.7 % slower on an H100);
/// `keep`, `round` and `gamma` as in `stage_rows`, `res` its residual
/// columns.
///
/// # Safety
/// The params' contract; `ph.flags_in` holds `c_in` words, which their
/// writers flag `ph.flag_in` without waiting on this block; `sm` as
/// `decode_step_smem` lays it out for one row.
#[inline(always)]
unsafe fn stage_flagged<W: Weight>(
    ph: &Gemv<W>,
    sm: &Smem,
    keep: bool,
    round: bool,
    (res_lo, res_hi): (usize, usize),
    gamma: *const f32,
) {
    let threads = DECODE_STEP_THREADS as usize;
    let c_in = ph.c_in;
    let pairs = c_in / 2;
    let mut base = thread_idx_x() as usize;
    while base < pairs {
        let mut w = [[0u64; 2]; FLAG_BATCH];
        let mut gm = [Vec2([0f32; 2]); FLAG_BATCH];
        unroll!(u < FLAG_BATCH => {
            let i = base + u * threads;
            if i < pairs {
                // SAFETY: 2i + 2 <= c_in words, 16-byte aligned (the buffer is); gamma
                // (when given) c_in floats, 8-byte aligned.
                unsafe {
                    w[u] = load_flagged2(ph.flags_in.add(2 * i));
                    if !gamma.is_null() {
                        gm[u] = *gamma.add(2 * i).cast::<Vec2<f32>>();
                    }
                }
            }
        });
        unroll!(u < FLAG_BATCH => {
            let i = base + u * threads;
            if i < pairs {
                // `&`, not `&&`: one test, no branch between the halves.
                while (flag_of(w[u][0]) != ph.flag_in) | (flag_of(w[u][1]) != ph.flag_in) {
                    // SAFETY: as above.
                    w[u] = unsafe { load_flagged2(ph.flags_in.add(2 * i)) };
                }
                let k = 2 * i;
                for (j, &word) in w[u].iter().enumerate() {
                    let e = flagged_value(word);
                    if keep && (res_lo..res_hi).contains(&(k + j)) {
                        // SAFETY: xraw holds the block's residual columns of the row.
                        unsafe { *sm.xraw.add(k + j - res_lo) = e };
                    }
                    // SAFETY: k + j < c_in: xs holds the row (and its product with
                    // gamma after it, when given).
                    unsafe {
                        *sm.xs.add(k + j) = if round { W::round_input(e) } else { e };
                        if !gamma.is_null() {
                            *sm.xs.add(c_in + k + j) = e * gm[u].0[j];
                        }
                    }
                }
            }
        });
        base += FLAG_BATCH * threads;
    }
}

/// The epilogue of column `col`, row `r`, whose dot product is `sum`; the
/// block's columns start at `lo`. `best` is the thread's best logit so
/// far: a thread always serves the same row (`mma_row`).
///
/// # Safety
/// The params' contract; `r < n`, `lo <= col < ph.oc`; `sm` holds the
/// phase's bias slice and the residual rows.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue<W: Weight>(
    p: &DecodeStepParams<W>,
    ph: &Gemv<W>,
    sm: &Smem,
    lo: usize,
    r: usize,
    col: usize,
    sum: f32,
    best: &mut (f32, u32),
) {
    let c = p.c as usize;
    let mut v = sum;
    if !ph.bias.is_null() {
        // SAFETY: the phase staged bias[lo..hi], lo <= col < hi.
        v += unsafe { *sm.bias.add(col - lo) };
    }
    // SAFETY: (all arms) r < n, col < oc; each (r, col) has one writer.
    unsafe {
        match ph.epi {
            Epilogue::Qkv => {
                if !ph.flags_out.is_null() {
                    // One row: q, k and v flagged for this step's attention,
                    // which reads the new key and value from there (the
                    // cache keeps them for the steps after).
                    store_flagged(ph.flags_out.add(col), v, ph.flag_out);
                } else if col < c {
                    *p.q.add(r * c + col) = v;
                }
                if col < c {
                    return;
                }
                let pos = *sm.pos.add(r);
                if pos >= p.max_t {
                    return;
                }
                let (cache, cc) = if col < 2 * c {
                    (ph.k_cache, col - c)
                } else {
                    (ph.v_cache, col - 2 * c)
                };
                let nh = p.nh as usize;
                let (h, d) = (cc / HS, cc % HS);
                W::store1(cache.add(((r * nh + h) * p.max_t as usize + pos as usize) * HS + d), v);
            }
            // The residual phases' share is the one `xraw` keeps: lo is its start.
            Epilogue::Residual => {
                let x = *sm.xraw.add(r * sm.xw + col - lo) + v;
                *p.x.add(r * c + col) = x;
                if !ph.flags_out.is_null() {
                    // One row: the flagged row's word col.
                    store_flagged(ph.flags_out.add(col), x, ph.flag_out);
                }
            }
            Epilogue::Gelu => {
                let y = gelu(v);
                *p.h.add(r * 4 * c + col) = y;
                if !ph.flags_out.is_null() {
                    store_flagged(ph.flags_out.add(col), y, ph.flag_out);
                }
            }
            Epilogue::Logits => {
                *p.logits.add(r * p.vp as usize + col) = v;
                if col < p.v as usize {
                    *best = better(*best, (v, col as u32));
                }
            }
        }
    }
}

/// One tile of a phase's weights in the ring: `cols` columns from `c0` at
/// `wt` in shared memory, rows of `c_in`; the block's columns start at `lo`.
#[derive(Clone, Copy)]
struct Tile<W> {
    wt: *const W,
    lo: usize,
    c0: usize,
    cols: usize,
}

/// The mean and rstd of the staged row `xs[..c]`, each warp for itself
/// (every warp gets the same bits: a butterfly sum adds the same pairs in
/// every lane). One pass, Σx and Σx² in f32: a folded phase needs no
/// normalised row, only these, and no block reduction or barrier for them.
///
/// # Safety
/// `xs` holds `c` floats (`c % 4 == 0`), 16-byte aligned, published to the
/// warp by a block barrier.
#[inline(always)]
unsafe fn warp_row_moments(xs: *const f32, c: usize) -> (f32, f32) {
    let stride = LANES * VEC;
    // Two vectors a pass, each with its own sums: shorter add chains.
    let (mut s, mut q) = ([0f32; 2], [0f32; 2]);
    let mut k = lane_id() as usize * VEC;
    while k < c {
        unroll!(h < 2 => {
            let kk = k + h * stride;
            if kk < c {
                // SAFETY: kk + 4 <= c.
                let x = unsafe { load4(xs.add(kk)) };
                s[h] += (x[0] + x[1]) + (x[2] + x[3]);
                q[h] = fma(x[0], x[0], fma(x[1], x[1], fma(x[2], x[2], fma(x[3], x[3], q[h]))));
            }
        });
        k += 2 * stride;
    }
    let (sum, sq) = (warp_reduce_sum(s[0] + s[1]), warp_reduce_sum(q[0] + q[1]));
    let inv_c = 1.0 / c as f32;
    let mean = sum * inv_c;
    let var = (sq * inv_c - mean * mean).max(0.0);
    (mean, rsqrt_precise(var + LAYERNORM_EPS))
}

/// Column `col`'s fold pair ([`DECODE_STEP_FOLD`]) where the phase is
/// folded (`moments`), loaded ahead of its sum (its L2 latency then
/// overlaps the dot product); zeros otherwise.
///
/// # Safety
/// With `moments`: `col < ph.oc`.
#[inline(always)]
unsafe fn fold_pair<W>(ph: &Gemv<W>, moments: Option<(f32, f32)>, col: usize) -> Vec2<f32> {
    if moments.is_some() {
        // SAFETY: oc pairs; 8-byte aligned (the buffer is 16).
        unsafe { *ph.fold.add(DECODE_STEP_FOLD_PAIR * col).cast::<Vec2<f32>>() }
    } else {
        Vec2([0.0; 2])
    }
}

/// A folded phase's sum (`(x ⊙ γ) · W_j`) to the layer's output, from the
/// row's `(mean, rstd)` and the column's `pair` ([`fold_pair`]); other
/// phases' sums as they are.
#[inline(always)]
fn unfold(moments: Option<(f32, f32)>, pair: Vec2<f32>, sum: f32) -> f32 {
    match moments {
        None => sum,
        Some((mean, rstd)) => fma(rstd, fma(-mean, pair.0[0], sum), pair.0[1]),
    }
}

/// Multiply one tile by the staged rows `xs` and run each sum's epilogue,
/// one column a warp on the FMA units (one row: each thread serves row 0).
/// A folded phase (`moments`, the row's mean and rstd) multiplies the row
/// times the layernorm's weight (`xs[c_in..]`) and unfolds each sum.
///
/// # Safety
/// The params' contract; the tile's bytes have arrived; `red` holds
/// `2 * WARPS * ROWS` floats; every thread of the block calls it; with
/// `moments`, the phase is folded.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_gemv<W: Weight, const R: usize>(
    p: &DecodeStepParams<W>,
    ph: &Gemv<W>,
    sm: &Smem,
    tile: Tile<W>,
    n: usize,
    best: &mut (f32, u32),
    moments: Option<(f32, f32)>,
) {
    // Each thread's rows vary with its lane beyond one row: `best` serves one.
    const { assert!(R == 1) };
    let Tile { wt, lo, c0, cols } = tile;
    let (c_in, lane, warp) = (ph.c_in, lane_id() as usize, warp_id() as usize);
    let xs = if moments.is_some() {
        // SAFETY: a folded phase staged x ⊙ γ after the row.
        unsafe { sm.xs.add(c_in) as *const f32 }
    } else {
        sm.xs as *const f32
    };
    let red = sm.red;
    // Split each column over `ks` warps when the tile has fewer columns
    // than warps (then fewer than 2 * WARPS units: `red` holds them).
    let mut ks = 1;
    while cols * ks < WARPS {
        ks *= 2;
    }
    // ks is a power of two.
    let span = ((c_in + ks - 1) >> ks.trailing_zeros()).next_multiple_of(W::PER_LOAD);
    let step = LANES * W::PER_LOAD;
    let units = cols * ks;
    // Two units a warp at once (`u` and `u + WARPS`: the same k range, as
    // ks divides WARPS), so their chains of loads, products and the
    // reduction overlap and each staged x serves both columns.
    // bf16 tiles only: with f32 weights (twice the bytes a column, so
    // bound by the stream, not this chain) the second column's registers
    // made ptxas spill.
    if size_of::<W>() == 2 {
        let mut u = warp;
        while u < units {
            let two = u + WARPS < units;
            let (col, part) = (u >> ks.trailing_zeros(), u & (ks - 1));
            let col2 = (u + WARPS) >> ks.trailing_zeros();
            let (k_lo, k_hi) = ((part * span).min(c_in), ((part + 1) * span).min(c_in));
            // The epilogue lanes' fold pairs, loaded before the sums.
            let pair = if ks == 1 && (lane == 0 || (lane == 1 && two)) {
                // SAFETY: col (col2 when `two`) < cols: c0 + it < oc.
                unsafe { fold_pair(ph, moments, c0 + if lane == 0 { col } else { col2 }) }
            } else {
                Vec2([0.0; 2])
            };
            let mut acc = [0f32; 2];
            let mut k = k_lo + lane * W::PER_LOAD;
            while k < k_hi {
                // SAFETY: col (and col2 when `two`) < cols of the tile, k + PER_LOAD <= c_in.
                let w = unsafe { W::load_raw(wt.add(col * c_in), k) };
                let w2 = if two {
                    // SAFETY: as above.
                    unsafe { W::load_raw(wt.add(col2 * c_in), k) }
                } else {
                    w
                };
                unroll!(q < W::PER_LOAD / VEC => {
                    // SAFETY: row 0 of xs; k + PER_LOAD <= c_in.
                    let x = unsafe { load4(xs.add(k + q * VEC)) };
                    let e = q * VEC;
                    acc[0] = fma(
                        x[0],
                        W::value(&w, e),
                        fma(x[1], W::value(&w, e + 1), fma(x[2], W::value(&w, e + 2), fma(x[3], W::value(&w, e + 3), acc[0]))),
                    );
                    acc[1] = fma(
                        x[0],
                        W::value(&w2, e),
                        fma(x[1], W::value(&w2, e + 1), fma(x[2], W::value(&w2, e + 2), fma(x[3], W::value(&w2, e + 3), acc[1]))),
                    );
                });
                k += step;
            }
            // Lane j gets unit j's sum (u, then u + WARPS).
            let s = warp_reduce_sum_many(acc);
            if n > 0 && (lane == 0 || (lane == 1 && two)) {
                let (unit, c) = if lane == 0 { (u, col) } else { (u + WARPS, col2) };
                if ks == 1 {
                    // SAFETY: row 0 < n, c0 + c < oc.
                    unsafe { epilogue(p, ph, sm, lo, 0, c0 + c, unfold(moments, pair, s), best) };
                } else {
                    // SAFETY: unit < 2 * WARPS.
                    unsafe { *red.add(unit * ROWS) = s };
                }
            }
            u += 2 * WARPS;
        }
    } else {
        let mut u = warp;
        while u < cols * ks {
            let (col, part) = (u >> ks.trailing_zeros(), u & (ks - 1));
            let (k_lo, k_hi) = ((part * span).min(c_in), ((part + 1) * span).min(c_in));
            let pair = if ks == 1 && lane < n {
                // SAFETY: col < cols: c0 + col < oc.
                unsafe { fold_pair(ph, moments, c0 + col) }
            } else {
                Vec2([0.0; 2])
            };
            let mut acc = [0f32; R];
            let mut k = k_lo + lane * W::PER_LOAD;
            while k < k_hi {
                // SAFETY: col < cols of the tile, k + PER_LOAD <= c_in.
                let w = unsafe { W::load_raw(wt.add(col * c_in), k) };
                unroll!(r < R => {
                    if r < n {
                        unroll!(q < W::PER_LOAD / VEC => {
                            // SAFETY: r < n, k + PER_LOAD <= c_in.
                            let x = unsafe { load4(xs.add(r * c_in + k + q * VEC)) };
                            let e = q * VEC;
                            acc[r] = fma(
                                x[0],
                                W::value(&w, e),
                                fma(x[1], W::value(&w, e + 1), fma(x[2], W::value(&w, e + 2), fma(x[3], W::value(&w, e + 3), acc[r]))),
                            );
                        });
                    }
                });
                k += step;
            }
            // Lane r gets row r's sum.
            let s = warp_reduce_sum_many(acc);
            if lane < n {
                if ks == 1 {
                    // SAFETY: lane < n, c0 + col < oc.
                    unsafe { epilogue(p, ph, sm, lo, lane, c0 + col, unfold(moments, pair, s), best) };
                } else {
                    // SAFETY: u < 2 * WARPS.
                    unsafe { *red.add(u * ROWS + lane) = s };
                }
            }
            u += WARPS;
        }
    }
    if ks > 1 {
        sync_threads();
        let t = thread_idx_x() as usize;
        if t < cols * n {
            let (col, r) = (div32(t, n), rem32(t, n));
            let mut s = 0f32;
            for part in 0..ks {
                // SAFETY: written above, before the barrier.
                s += unsafe { *red.add((col * ks + part) * ROWS + r) };
            }
            // SAFETY: r < n, c0 + col < oc.
            unsafe {
                let pair = fold_pair(ph, moments, c0 + col);
                epilogue(p, ph, sm, lo, r, c0 + col, unfold(moments, pair, s), best);
            }
        }
    }
}

/// Columns a warp multiplies at once in [`tile_gemv_rows`]: each staged
/// value read from shared memory serves this many. Two: with four (32
/// sums a lane), the row and column addresses pushed the step past its
/// 128 registers and ptxas spilled.
const ROWS_TILE_COLS: usize = 2;
/// Sums a warp makes at once in [`tile_gemv_rows`]: every row of each column.
const ROWS_TILE_OUTS: usize = ROWS_TILE_COLS * ROWS;
/// k values a lane takes per step in [`tile_gemv_rows`] (one 8-byte load).
const PAIR: usize = 2;

/// Whether the steps of two rows and more multiply their tiles on the FMA
/// units ([`tile_gemv_rows`]) rather than the tensor cores
/// ([`tile_gemv_mma`]): f32 weights, whose tensor-core product is 3xTF32
/// (three `mma.sync` and the operands' splits a k slice). Measured on an
/// H100 at 8 rows (docs/performance.md, decode step 9): fcproj's tiles
/// (~6 columns of a 3072-long k a block) took 5.4 µs on the FMA units
/// against 11.5, the step 0.620 ms against 0.650; the wide phases were
/// slower (the LM head 96 µs against 78), but both paths in one kernel
/// spilled (ptxas, at its 128 registers), so the choice is per weight type.
const fn simt_rows<W>() -> bool {
    size_of::<W>() == size_of::<f32>()
}

/// [`tile_gemv`] for up to `ROWS` rows on the FMA units (f32 weights, see
/// [`simt_rows`]): a warp takes [`ROWS_TILE_COLS`] columns against every
/// staged row, each lane 2 consecutive k; the warp's [`ROWS_TILE_OUTS`]
/// sums reduce-scatter so lane `i < ROWS_TILE_OUTS` holds column
/// `i / ROWS`, row `i % ROWS`. A group's k is split into units of whole
/// loop steps ([`rows_units`]), each a warp's, whose partials meet in
/// `red` when there are several. Either way thread `t`
/// runs the epilogues of row `t % ROWS` only ([`simt_row`]), the row its
/// `best` tracks.
///
/// # Safety
/// The params' contract; the tile's bytes have arrived; `red` holds
/// `2 * WARPS * ROWS_TILE_OUTS` floats; the rows in `xs` are staged as the weights
/// multiply them (f32: as read); every thread of the block calls it.
#[inline(always)]
unsafe fn tile_gemv_rows<W: Weight>(
    p: &DecodeStepParams<W>,
    ph: &Gemv<W>,
    sm: &Smem,
    tile: Tile<W>,
    n: usize,
    best: &mut (f32, u32),
) {
    const CB: usize = ROWS_TILE_COLS;
    const OUTS: usize = ROWS_TILE_OUTS;
    let Tile { wt, lo, c0, cols } = tile;
    let (c_in, tid, lane, warp) = (ph.c_in, thread_idx_x() as usize, lane_id() as usize, warp_id() as usize);
    let (xs, red) = (sm.xs as *const f32, sm.red);
    let groups = cols.div_ceil(CB);
    // `ks` units a group (at most 2 * WARPS units in all: `red` holds
    // them), each of whole loop steps.
    let steps = div32(c_in + STEP as usize - 1, STEP as usize);
    let ks = rows_units(groups, steps);
    let span = div32(steps + ks - 1, ks) * STEP as usize;
    // The output this lane ends with: column `j` of the group, row `r`.
    let (j, r) = (lane / ROWS, lane % ROWS);
    // f32 weights (`simt_rows`): the tile is rows of c_in floats.
    let wf = wt as *const f32;
    let mut u = warp;
    while u < groups * ks {
        let (grp, part) = (div32(u, ks), rem32(u, ks));
        let (k_lo, k_hi) = ((part * span).min(c_in), ((part + 1) * span).min(c_in));
        // The unit's columns: the group's, cut at the tile's last.
        let cols_here = (cols - grp * CB).min(CB);
        // SAFETY: grp * CB < cols: the group's first column lies in the tile.
        let w0 = unsafe { wf.add(grp * CB * c_in) };
        let acc = if n == ROWS {
            // SAFETY: the unit's columns lie in the tile, [k_lo, k_hi) in c_in (even: c_in
            // and span are); all ROWS rows are staged.
            unsafe { rows_dot::<true>(w0, xs, c_in, cols_here, k_lo, k_hi, n) }
        } else {
            // SAFETY: as above, with the n staged rows.
            unsafe { rows_dot::<false>(w0, xs, c_in, cols_here, k_lo, k_hi, n) }
        };
        let s = warp_reduce_sum_many(acc);
        let col = grp * CB + j;
        if lane < OUTS && r < n && col < cols {
            if ks == 1 {
                // SAFETY: r < n, c0 + col < oc; r is this thread's row.
                unsafe { epilogue(p, ph, sm, lo, r, c0 + col, s, best) };
            } else {
                // SAFETY: u < 2 * WARPS units of OUTS floats.
                unsafe { *red.add(u * OUTS + lane) = s };
            }
        }
        u += WARPS;
    }
    if ks > 1 {
        sync_threads();
        // Thread t sums output t % OUTS of group t / OUTS: its row is
        // still t % ROWS (OUTS is a multiple of ROWS).
        let (grp, i) = (tid / OUTS, tid % OUTS);
        let col = grp * CB + i / ROWS;
        if grp < groups && i % ROWS < n && col < cols {
            let mut s = 0f32;
            for part in 0..ks {
                // SAFETY: written above, before the barrier.
                s += unsafe { *red.add((grp * ks + part) * OUTS + i) };
            }
            // SAFETY: row < n, c0 + col < oc; the row is this thread's.
            unsafe { epilogue(p, ph, sm, lo, i % ROWS, c0 + col, s, best) };
        }
    }
}

/// Loop steps of k up to which [`ROWS_SPLIT`] holds
/// [`decode_step_rows_units`] (k = 8192 in f32 pairs; longer k takes the
/// row for this many, which still covers it, in longer units).
const ROWS_SPLIT_STEPS: usize = 128;

/// [`decode_step_rows_units`] for every `steps <= ROWS_SPLIT_STEPS` and
/// `groups <= 2 * WARPS`, worked out at compile time: the search's
/// divisions would cost more than the loop they balance, on every tile.
static ROWS_SPLIT: [[u8; 2 * WARPS + 1]; ROWS_SPLIT_STEPS + 1] = {
    let mut t = [[1u8; 2 * WARPS + 1]; ROWS_SPLIT_STEPS + 1];
    let mut s = 1;
    while s <= ROWS_SPLIT_STEPS {
        let mut g = 1;
        while g <= 2 * WARPS {
            t[s][g] = decode_step_rows_units(g as u32, s as u32) as u8;
            g += 1;
        }
        s += 1;
    }
    t
};

/// [`decode_step_rows_units`] by table: 1 past `2 * WARPS` groups (no
/// split).
#[inline(always)]
fn rows_units(groups: usize, steps: usize) -> usize {
    if groups > 2 * WARPS {
        return 1;
    }
    ROWS_SPLIT[steps.min(ROWS_SPLIT_STEPS)][groups] as usize
}

/// One unit's dot products in [`tile_gemv_rows`]: columns `0..cols` of
/// `w0` (rows of `c_in` floats) against the staged rows `xs`, over k in
/// `[k_lo, k_hi)`, each lane taking `PAIR` consecutive k every [`STEP`];
/// returns the lane's partial sums, `[column * ROWS + row]`.
///
/// Written for the instruction count (the 8-row f32 step is bound by issue,
/// docs/performance.md, decode step 21). The SASS of the loop before:
/// 74 instructions for its 32 FMAs, a predicate re-evaluated per row, a
/// 64-bit counter, and three instructions per row's address. Now: with
/// `ALL` (the caller's choice when `n == ROWS`) no row is predicated; the
/// addresses are 32-bit shared-window ones, one instruction a row; and
/// ptxas is asked not to unroll (its 4x unroll hoisted the copies' loads
/// together and the step spilled): 57 instructions a step.
///
/// # Safety
/// `w0` holds `cols <= ROWS_TILE_COLS` rows of `c_in` floats, `xs` `n`
/// rows (`ROWS` with `ALL`), both in shared memory, 8-byte aligned with
/// `c_in`, `k_lo` and `k_hi` even, `k_hi <= c_in`.
#[inline(always)]
unsafe fn rows_dot<const ALL: bool>(
    w0: *const f32,
    xs: *const f32,
    c_in: usize,
    cols: usize,
    k_lo: usize,
    k_hi: usize,
    n: usize,
) -> [f32; ROWS_TILE_OUTS] {
    let mut acc = [0f32; ROWS_TILE_OUTS];
    // Shared-memory byte addresses (32-bit): the lane's first pair in row 0
    // of the staged rows and of the weights, and the rows' pitch.
    const BYTES: u32 = size_of::<f32>() as u32;
    let k0 = k_lo as u32 + lane_id() * PAIR as u32;
    let pitch = c_in as u32 * BYTES;
    // SAFETY: both point into shared memory (the staged rows, the ring).
    let (xa, wa) = unsafe { (shared_addr(xs) + k0 * BYTES, shared_addr(w0) + k0 * BYTES) };
    let mut k = k0;
    let mut off = 0u32;
    while k < k_hi as u32 {
        no_unroll();
        let mut w = [[0f32; PAIR]; ROWS_TILE_COLS];
        unroll!(jj < ROWS_TILE_COLS => {
            if jj < cols {
                // SAFETY: column jj < cols of the tile, k + 2 <= c_in, 8-byte aligned.
                w[jj] = unsafe { ld_shared_v2_f32(wa + jj as u32 * pitch + off) };
            }
        });
        unroll!(rr < ROWS => {
            if ALL || rr < n {
                // SAFETY: row rr is staged (ALL: all ROWS are), k + 2 <= c_in, 8-byte aligned.
                let x = unsafe { ld_shared_v2_f32(xa + rr as u32 * pitch + off) };
                unroll!(jj < ROWS_TILE_COLS => {
                    let a = &mut acc[jj * ROWS + rr];
                    *a = fma(x[1], w[jj][1], fma(x[0], w[jj][0], *a));
                });
            }
        });
        k += STEP;
        off += STEP * BYTES;
    }
    acc
}

/// k values a warp takes per step in [`rows_dot`].
const STEP: u32 = (LANES * PAIR) as u32;

/// The row whose epilogues thread `tid` runs in [`tile_gemv_rows`] (its
/// lane's, and a split's summing thread's: both `tid % ROWS`).
#[inline(always)]
fn simt_row(tid: usize) -> usize {
    tid % ROWS
}
// `tile_gemv_rows`: whole rows of outputs in a warp, every split unit's
// partials in the multi-row layout's `red`, every group's outputs in the block.
const _: () = assert!(ROWS_TILE_OUTS.is_multiple_of(ROWS) && ROWS_TILE_OUTS <= LANES);
const _: () = assert!(2 * WARPS * ROWS_TILE_OUTS <= WARPS * MMA_OUTPUTS);

/// The row whose epilogues thread `tid` runs in [`tile_gemv_mma`] (the
/// same in every tile: the block's threads are a multiple of
/// `MMA_OUTPUTS`).
#[inline(always)]
fn mma_row(tid: usize) -> usize {
    mma_out(tid % MMA_OUTPUTS).0
}
const _: () = assert!((DECODE_STEP_THREADS as usize).is_multiple_of(MMA_OUTPUTS));

/// [`tile_gemv`] for two rows and more, on tensor cores: the tile's
/// columns in 16-column fragments (M) times the staged rows (N = 8),
/// `mma.sync` as the chain's `decode_gemv_mma` (`MmaWeight::mma_step`,
/// f32 weights as 3xTF32). With fewer fragments than warps, each
/// fragment's k is split over `ks` warps; the warps' partial fragments
/// meet in `red`, where thread `o` sums output `o % 128` of a fragment
/// and runs its epilogue (so each thread keeps serving one row, its
/// `best`'s).
///
/// # Safety
/// The params' contract; the tile's bytes have arrived; `red` holds
/// `WARPS * MMA_OUTPUTS` floats; `c_in` a multiple of the step (4 lanes'
/// loads); every thread of the block calls it.
#[inline(always)]
unsafe fn tile_gemv_mma<W: MmaWeight>(
    p: &DecodeStepParams<W>,
    ph: &Gemv<W>,
    sm: &Smem,
    tile: Tile<W>,
    n: usize,
    best: &mut (f32, u32),
) {
    let (c_in, tid, lane, warp) = (ph.c_in, thread_idx_x() as usize, lane_id() as usize, warp_id() as usize);
    let (xs, red) = (sm.xs as *const f32, sm.red);
    let step = MMA_QUAD * W::LANE_K;
    let frags = tile.cols.div_ceil(MMA_TILE);
    // Warps per fragment (a power of two), fragments per round.
    let ks = WARPS / frags.next_power_of_two().min(WARPS);
    let group = WARPS / ks;
    let span = c_in.div_ceil(ks).next_multiple_of(step);
    let part = warp & (ks - 1);
    let (k_lo, k_hi) = ((part * span).min(c_in), ((part + 1) * span).min(c_in));
    let mut f0 = 0;
    while f0 < frags {
        let f = f0 + warp / ks;
        let mut acc = [0f32; MMA_ACC];
        if f < frags {
            let mut k = k_lo;
            while k < k_hi {
                // SAFETY: the tile holds `cols` rows of c_in values (16-byte
                // aligned rows: c_in % 8 == 0), xs n rows of c_in; k < k_hi <= c_in.
                let w = unsafe { mma_load_batch(tile.wt, f * MMA_TILE, tile.cols, c_in, k, k_hi, lane) };
                // Both steps' staged values before the products (ptxas
                // spilled when each was loaded after the product before).
                let mut x: [MmaStaged; MMA_BATCH] = Default::default();
                unroll!(s < MMA_BATCH => {
                    if k + s * step < k_hi {
                        // SAFETY: k + s * step < k_hi <= c_in, and `xs` holds n rows of c_in staged floats,
                        // 16-byte aligned (the caller's contract).
                        x[s] = unsafe { mma_stage_step::<W>(xs, c_in, k + s * step, n, lane) };
                    }
                });
                unroll!(s < MMA_BATCH => {
                    if k + s * step < k_hi {
                        acc = W::mma_step(acc, &w[s][0], &w[s][1], &x[s]);
                    }
                });
                k += MMA_BATCH * step;
            }
        }
        unroll!(j < MMA_ACC => {
            // SAFETY: warp < WARPS fragments of MMA_OUTPUTS floats.
            unsafe { *red.add(warp * MMA_OUTPUTS + lane * MMA_ACC + j) = acc[j] };
        });
        sync_threads();
        let outs = group.min(frags - f0) * MMA_OUTPUTS;
        let mut o = tid;
        while o < outs {
            let (gf, oo) = (o / MMA_OUTPUTS, o % MMA_OUTPUTS);
            let (r, cf) = mma_out(oo);
            let col = (f0 + gf) * MMA_TILE + cf;
            if r < n && col < tile.cols {
                let mut v = 0f32;
                for part in 0..ks {
                    // SAFETY: written above, before the barrier.
                    v += unsafe { *red.add((gf * ks + part) * MMA_OUTPUTS + oo) };
                }
                // SAFETY: r < n, c0 + col < oc; r is this thread's row.
                unsafe { epilogue(p, ph, sm, tile.lo, r, tile.c0 + col, v, best) };
            }
            o += DECODE_STEP_THREADS as usize;
        }
        f0 += group;
        if f0 < frags {
            // `red` is rewritten by the next round.
            sync_threads();
        }
    }
}

/// Shared memory of the step, as pointers.
#[derive(Clone, Copy)]
struct Smem {
    pos: *mut u32,
    bias: *mut f32,
    xraw: *mut f32,
    red: *mut f32,
    best: *mut u32,
    lnp: *mut f32,
    xs: *mut f32,
    /// Floats of each row of `xraw` (`decode_step_share_width`).
    xw: usize,
}

/// One GEMV phase: stage (and layernorm) the input rows, refill the slot
/// the last phase freed, then every tile of this block's columns as the
/// ring delivers them, refilling each slot as it is read (but after the
/// last tile: the next phase refills that one). Ends with a block barrier.
///
/// # Safety
/// The params' contract; `lnp` and the bias slot hold the phase's
/// layernorm parameters and bias (copies in flight since the barrier
/// before it); every thread of the block calls it, after a grid barrier
/// that published the phase's inputs.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
unsafe fn run_gemv<W: MmaWeight, const R: usize, const T: bool>(
    p: &DecodeStepParams<W>,
    g: usize,
    sm: &Smem,
    ring: &Ring,
    prod: &mut Producer,
    consumed: &mut usize,
    best: &mut (f32, u32),
    tr: Trace<'_, W, T>,
) {
    let n = p.n as usize;
    // SAFETY: g is a phase of the step.
    let ph = unsafe { gemv_phase(p, ring.tbl as *const DecodeStepLayer<W>, g) };
    let ph = if flagged::<R>() {
        // SAFETY: the params' contract (flags hold `decode_step_flag_words(c, max_t)`
        // words); the epoch slot was written at the start, before a block barrier.
        unsafe { with_flags(p, ph, g) }
    } else {
        ph
    };
    // SAFETY: KINDS entries.
    let sh = unsafe { *ring.shares.add(kind_of(g, p.n_layer as usize)) };
    let (lo, hi, tc) = (sh.lo as usize, sh.hi as usize, sh.tc as usize);
    // A folded phase's pairs carry its bias.
    let fold = folded::<W, R>(&ph);
    let ph = if fold {
        Gemv {
            bias: core::ptr::null(),
            ..ph
        }
    } else {
        ph
    };
    // SAFETY: KINDS entries; kind 1 is attproj's share, fcproj's too (both
    // have c columns).
    let res = unsafe { *ring.shares.add(1) };
    if R > 1 && matches!(ph.epi, Epilogue::Residual) {
        // SAFETY: attproj's and fcproj's inputs (att, h) hold n rows of c_in.
        unsafe { stage_copy(ph.inp, sm.xs, n * ph.c_in) };
    } else {
        // The attproj phase of one row merges the attention's flagged partials.
        let merge = if flagged::<R>() && g < GEMVS * p.n_layer as usize && g % GEMVS == 1 {
            Some(Merge {
                // SAFETY: one row's position.
                items: att_items(unsafe { *sm.pos } as usize, p.max_t as usize, p.window as usize),
                // SAFETY: the epoch slot was written before a block barrier.
                flag: unsafe { layer_flag(p, div32(g, GEMVS)) },
            })
        } else {
            None
        };
        let gamma = if fold { ph.ln_w } else { core::ptr::null() };
        // SAFETY: the params' contract, `sm` laid out by `decode_step_smem`, `res` this
        // block's residual share, `merge` the row's items where it merges, `gamma` the
        // layernorm's c_in weights where folded (one row): `stage_rows`' contract.
        unsafe { stage_rows(p, &ph, sm, n, res, merge, gamma) };
    }
    tr.mark(traced_phase(g), DecodeStepMark::Loaded);
    // The bias and the layernorm's parameters (`stage_ln`) have landed.
    cp_async_wait_group::<0>();
    sync_threads();
    let mut moments = None;
    if fold {
        // SAFETY: xs holds the row (c_in floats), staged before the barrier.
        moments = Some(unsafe { warp_row_moments(sm.xs, ph.c_in) });
    } else if !ph.ln_w.is_null() {
        if R == 1 {
            // SAFETY: xs holds n rows of c_in, lnp the parameters, red at
            // least BLOCK_REDUCE_SCRATCH floats (unused until the tiles).
            unsafe { layernorm_block::<W>(sm.xs, sm.lnp, sm.red, n, ph.c_in) };
        } else {
            // A warp a row: the rows' chains run side by side (measured
            // on an H100 at 8 rows: 2.4 µs, against 3.5 for one block
            // reduction of all rows' sums at a time; vectorised, decode
            // step 17, 1.6 µs and the step 5 % faster). At one row the
            // block's two reductions above stay: this warp-a-row version
            // made the one-row step 0.5-1 % slower, and so did moments
            // published by the stagers' warps (step 17: 1-3 %).
            // SAFETY: as above; red holds 2n floats of statistics.
            unsafe { layernorm_rows::<W>(sm.xs, sm.lnp, sm.red, n, ph.c_in) };
            // The normalised rows are read by other threads next.
            sync_threads();
        }
    }
    tr.mark(traced_phase(g), DecodeStepMark::Staged);
    // The slot the last phase freed gets its next tile now, not at the
    // barrier: its bytes then stream while this phase computes, not while
    // the next one waits on its input rows. Issued once the rows arrived
    // instead, before their layernorm: 6 % faster for f32 weights at one
    // row under grid barriers (H100, decode step 8), 1-4 % slower for bf16
    // and 8 rows, and with flagged rows 2-8 % slower for f32 too (H200,
    // decode step 20). Issued at the phase's start (before the loads):
    // slower in every case, and so was half a tile at each point.
    if thread_idx_x() == PRODUCER_THREAD {
        // SAFETY: every slot consumed so far was read.
        unsafe { issue(p, prod, *consumed, ring) };
    }
    let mut c0 = lo;
    while c0 < hi {
        let cols = tc.min(hi - c0);
        let slot = rem32(*consumed, ring.slots);
        // SAFETY: the barrier was initialised; thread 0 issued this tile
        // (tiles are issued in the order they are consumed).
        unsafe { mbarrier_wait_parity(ring.bars + 8 * slot as u32, (div32(*consumed, ring.slots) & 1) as u32) };
        if c0 == lo {
            tr.mark(traced_phase(g), DecodeStepMark::Ready);
        }
        let tile = Tile {
            // SAFETY: slot < ring.slots: the slot's slot_bytes lie inside the ring.
            wt: unsafe { ring.ptr.add(slot * ring.slot_bytes) } as *const W,
            lo,
            c0,
            cols,
        };
        if R == 1 {
            // SAFETY: the tile's bytes arrived (the parity wait above); `sm.red` holds the
            // reduction scratch the layout sizes; every thread of the block gets here.
            unsafe { tile_gemv::<W, 1>(p, &ph, sm, tile, n, best, moments) };
        } else if simt_rows::<W>() {
            // SAFETY: as for `tile_gemv`; `red` holds WARPS * MMA_OUTPUTS >= 2 * WARPS * OUTS
            // floats (the layout's size for more than one row); f32 rows are staged as read.
            unsafe { tile_gemv_rows::<W>(p, &ph, sm, tile, n, best) };
        } else {
            // SAFETY: as for `tile_gemv`: the tile has arrived, `sm.red` is sized by the
            // layout, c_in a multiple of the step; every thread of the block gets here.
            unsafe { tile_gemv_mma::<W>(p, &ph, sm, tile, n, best) };
        }
        if c0 + cols >= hi {
            tr.mark_last_warp(traced_phase(g), DecodeStepMark::Computed);
        }
        *consumed += 1;
        // Every thread is done with the slot (and `red`) before its refill.
        sync_threads();
        c0 += cols;
        // After the phase's last tile, the refill waits for the block's
        // arrival at the grid barrier (`between_phases`).
        if c0 < hi && thread_idx_x() == PRODUCER_THREAD {
            // SAFETY: the slot just read is free.
            unsafe { issue(p, prod, *consumed, ring) };
        }
    }
}

/// Attproj's input at one row, merged from the attention's flagged
/// partials (`AttOut::Flagged`) as it is staged: the row's items a head,
/// and the flag the layer's partials carry. Every block stages the row's
/// partials (a few KB) anyway; a merge by the head's last block put a
/// publication, an atomic and the merge's L2 reads on the attention's
/// path (its slowest block 8.3 µs at 512 keys against 2.7 at 64; H100).
#[derive(Clone, Copy)]
struct Merge {
    items: usize,
    flag: u32,
}

/// Where the attention phase's items go (more than one row: `LastBlock`;
/// one row: `Flagged`).
#[derive(Clone, Copy)]
enum AttOut {
    /// A head of one item writes `att`; otherwise the head's last block to
    /// finish merges its partials into `att`.
    LastBlock,
    /// Every item's partial goes to the flags' partials with this flag, a
    /// head of one item's too; attproj's staging polls and merges them
    /// ([`merged_att2_flagged`]), and no grid barrier follows the phase.
    Flagged(u32),
}

/// Fold one more key into an online-softmax state (`m` in log2 units):
/// its score `s` (finite) and this lane's 8 dimensions of its value.
#[inline(always)]
fn add_key(m: &mut f32, l: &mut f32, acc: &mut [f32; 2 * VEC], s: f32, va: [f32; VEC], vb: [f32; VEC]) {
    let m_new = m.max(s);
    // exp2(-inf) = 0: a state without keys keeps nothing of its own.
    let (a, w) = (exp2_approx(*m - m_new), exp2_approx(s - m_new));
    *l = fma(*l, a, w);
    for e in 0..VEC {
        acc[e] = fma(acc[e], a, w * va[e]);
        acc[VEC + e] = fma(acc[VEC + e], a, w * vb[e]);
    }
    *m = m_new;
}

/// Lanes' pairs of flagged words for their 8 dimensions of a q, k or v
/// row (`decode_query`'s: `4 * (lane % 8)` and 32 more, two words a pair).
const ATT_PAIRS: usize = 2 * VEC / 2;

/// [`attend_keys`] for one warp of an item at one row whose inputs came
/// flagged (`AttOut::Flagged`): q, and the new key and value at `pos`,
/// from qkv's flagged row (`with_flags`), the keys before `pos` from the
/// cache. q's loads (and the new key's) go out with the cache's, so the
/// flags cost no round trip more than the cache; the new value's go out
/// once q has arrived (in flight beside the cache's, they spilled).
///
/// # Safety
/// The params' contract at one row; `lw` the layer's entry, whose qkv
/// phase flags its row `flag` without waiting on this block; `head < nh`;
/// `first <= pos < max_t`, the warp's keys `first + lane / 8 + 4i`; all 32
/// lanes call it.
#[inline(always)]
unsafe fn attend_flagged<W: Weight>(
    p: &DecodeStepParams<W>,
    lw: &DecodeStepLayer<W>,
    head: usize,
    first: usize,
    pos: usize,
    flag: u32,
) -> (f32, f32, [f32; 2 * VEC]) {
    let (c, max_t) = (p.c as usize, p.max_t as usize);
    let l8 = lane_id() as usize % ATT_LANES;
    let key0 = first + lane_id() as usize / ATT_LANES;
    let plane = head * max_t * HS + VEC * l8;
    // SAFETY: the planes of the head; keys below pos < max_t.
    let kv = unsafe {
        load_keys::<ATT_KEYS_PER_GROUP, _>(
            lw.k_cache.add(plane),
            lw.v_cache.add(plane),
            key0,
            ATT_GROUPS_PER_WARP,
            pos,
        )
    };
    // SAFETY: qkv's 3c flagged words lie at 6c in the flags (`with_flags`).
    let row = unsafe { p.flags.add(6 * c) } as *const u64;
    // Pair j of the lane's words of q (part 0), k (1) or v (2): dims
    // 4*l8 + 2j of the head for j < 2, the same 32 further for j >= 2.
    let word = |part: usize, j: usize| part * c + head * HS + VEC * l8 + (j / 2) * (HS / 2) + 2 * (j % 2);
    // The lane's pairs of part `part`, loaded at once.
    let issue = |part: usize| {
        let mut w = [[0u64; 2]; ATT_PAIRS];
        unroll!(j < ATT_PAIRS => {
            // SAFETY: word(part, j) + 2 <= 3c, even: a 16-byte aligned pair.
            w[j] = unsafe { load_flagged2(row.add(word(part, j))) };
        });
        w
    };
    // Their 8 values, each pair polled until flagged.
    let settle = |part: usize, mut w: [[u64; 2]; ATT_PAIRS]| {
        let mut vals = [0f32; 2 * VEC];
        unroll!(j < ATT_PAIRS => {
            // `&`, not `&&`: one test, no branch between the halves.
            while (flag_of(w[j][0]) != flag) | (flag_of(w[j][1]) != flag) {
                // SAFETY: as in `issue`.
                w[j] = unsafe { load_flagged2(row.add(word(part, j))) };
            }
            vals[2 * j] = flagged_value(w[j][0]);
            vals[2 * j + 1] = flagged_value(w[j][1]);
        });
        vals
    };
    // The warp that holds the newest key folds it in: its q and k go out
    // with the cache's loads, its v (registers short) once they arrived.
    let new = pos < first + ATT_KEYS;
    let wq = issue(0);
    let wk = if new { issue(1) } else { [[0u64; 2]; ATT_PAIRS] };
    let q = settle(0, wq).map(|x| x * p.scale_log2e);
    let wv = if new { issue(2) } else { [[0u64; 2]; ATT_PAIRS] };
    let (mut m, mut l, mut acc) = attend_loaded(&q, &kv, key0, ATT_GROUPS_PER_WARP, pos);
    if new {
        // As the cache keeps them (bf16 rounds), so that this step and the
        // later ones, which read the cache, see the same key and value.
        let (k, v) = (settle(1, wk).map(W::round), settle(2, wv).map(W::round));
        let half = |x: &[f32; 2 * VEC], h: usize| [x[VEC * h], x[VEC * h + 1], x[VEC * h + 2], x[VEC * h + 3]];
        let s = key_lanes_sum(key_score_part(&q, half(&k, 0), half(&k, 1)), ATT_LANES as u32);
        add_key(&mut m, &mut l, &mut acc, s, half(&v, 0), half(&v, 1));
    }
    (m, l, acc)
}

/// Where layer `layer`'s attention puts its items, for `R` rows of `W` weights.
///
/// # Safety
/// The epoch slot was written before a block barrier.
#[inline(always)]
unsafe fn att_dest<W, const R: usize>(p: &DecodeStepParams<W>, layer: usize) -> AttOut {
    if flagged::<R>() {
        // SAFETY: the caller's contract.
        AttOut::Flagged(unsafe { layer_flag(p, layer) })
    } else {
        AttOut::LastBlock
    }
}

/// Decode attention of layer `layer`: one block per item of
/// [`ATT_ITEM_KEYS`] keys of a (row, head), items past a row's position
/// skipped; each warp scores 8 of the item's keys, and the warps' partials
/// merge in shared memory (`xs`); the merged item goes where `dest` says.
///
/// # Safety
/// The params' contract; after a grid barrier that published q and the
/// new keys and values, or (`dest` flagged) after qkv's phase in this
/// block, its row then polled; every thread of the block calls it.
#[inline(always)]
unsafe fn run_attention<W: Weight>(p: &DecodeStepParams<W>, ring: &Ring, sm: &Smem, layer: usize, dest: AttOut) {
    // SAFETY: layer < n_layer entries of the table.
    let lw = unsafe { &*(ring.tbl as *const DecodeStepLayer<W>).add(layer) };
    let (n, nh, c, max_t, window) = (
        p.n as usize,
        p.nh as usize,
        p.c as usize,
        p.max_t as usize,
        p.window as usize,
    );
    let (tid, lane, warp) = (thread_idx_x() as usize, lane_id() as usize, warp_id() as usize);
    let l8 = lane % ATT_LANES;
    let max_keys = if window > 0 { window.min(max_t) } else { max_t };
    let heads = n * nh;
    let total = heads * max_keys.div_ceil(ATT_ITEM_KEYS);
    // The warps' partials: acc `[WARPS][64]`, then (max, sum) `[WARPS][2]`.
    // SAFETY: `decode_step_smem` sizes xs to at least WARPS * (HS + 2) floats
    // (the `parts` term), so the (max, sum) pairs after WARPS * HS fit.
    let (pacc, pml) = (sm.xs, unsafe { sm.xs.add(WARPS * HS) });
    let nb = grid_dim_x() as usize;
    let mut i = block_idx_x() as usize;
    while i < total {
        let (item, head) = (div32(i, heads), rem32(i, heads));
        let (r, h) = (div32(head, nh), rem32(head, nh));
        // SAFETY: r < n.
        let raw = unsafe { *sm.pos.add(r) } as usize;
        // Clamped so no key index reaches max_t; an idle row (at or past
        // max_t: a free slot of a server's batch) has no items.
        let pos = raw.min(max_t - 1);
        let key_lo = if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        };
        let items = att_items(raw, max_t, window);
        // The same answer in the whole block.
        if item < items {
            let first = key_lo + item * ATT_ITEM_KEYS + warp * ATT_KEYS;
            let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0f32, [0f32; 2 * VEC]);
            if let (AttOut::Flagged(flag), true) = (dest, first <= pos) {
                // SAFETY: one row: head < nh; the rest as `attend_flagged` asks.
                (m, l, acc) = unsafe { attend_flagged(p, lw, head, first, pos, flag) };
            } else if first <= pos {
                // This lane's 8 query dimensions, pre-scaled into log2 units.
                // SAFETY: h*HS + 36 + 4 <= c.
                let q_g = unsafe { p.q.add(r * c + h * HS + VEC * l8) };
                // SAFETY: `q_g` and `q_g + HS / 2` are 16-byte aligned floats of this row's head,
                // inside q (the comment above); q was written by an earlier phase, hence `cg`.
                let (qa, qb) = unsafe { (load4_cg(q_g), load4_cg(q_g.add(HS / 2))) };
                let mut q = [0f32; 2 * VEC];
                for e in 0..VEC {
                    q[e] = qa[e] * p.scale_log2e;
                    q[VEC + e] = qb[e] * p.scale_log2e;
                }
                let plane = head * max_t * HS + VEC * l8;
                // SAFETY: the planes of (r, h); keys below pos + 1 <= max_t.
                (m, l, acc) = unsafe {
                    attend_keys::<ATT_KEYS_PER_GROUP, _>(
                        &q,
                        lw.k_cache.add(plane),
                        lw.v_cache.add(plane),
                        first + lane / ATT_LANES,
                        ATT_GROUPS_PER_WARP,
                        pos + 1,
                    )
                };
            }
            if lane < ATT_LANES {
                // SAFETY: warp < WARPS partials in xs (the layout's size).
                unsafe {
                    let a = pacc.add(warp * HS + VEC * l8);
                    store4(a, [acc[0], acc[1], acc[2], acc[3]]);
                    store4(a.add(HS / 2), [acc[4], acc[5], acc[6], acc[7]]);
                    if l8 == 0 {
                        *pml.add(2 * warp) = m;
                        *pml.add(2 * warp + 1) = l;
                    }
                }
            }
            sync_threads();
            // Thread d < 64 merges dimension d of the warps' partials
            // (warp 0's holds the item's first key: a finite max).
            let merged = if tid < HS {
                // SAFETY: WARPS partials, written before the barrier.
                Some(unsafe { merge_parts_dim(|x| *x, pacc, pml, WARPS, tid) })
            } else {
                None
            };
            if let AttOut::Flagged(flag) = dest {
                if let Some((m_all, l_all, o)) = merged {
                    // SAFETY: head < nh (one row), item < items <= the flags' items a head;
                    // tid < 64 words of the partial, then its max and sum.
                    unsafe {
                        let part = att_flagged_part(p, head, item);
                        store_flagged(part.add(tid), o, flag);
                        if tid == 0 {
                            store_flagged(part.add(HS), m_all, flag);
                            store_flagged(part.add(HS + 1), l_all, flag);
                        }
                    }
                }
                // The partials in xs are read before the next item rewrites them.
                sync_threads();
                i += nb;
                continue;
            }
            // SAFETY: r * c + h * HS + 64 <= n * c.
            let out = unsafe { p.att.add(r * c + h * HS) };
            if items == 1 {
                if let Some((_, l_all, o)) = merged {
                    // SAFETY: tid < 64.
                    unsafe { *out.add(tid) = o / l_all };
                }
            } else {
                let part0 = head * p.parts_stride as usize;
                if let Some((m_all, l_all, o)) = merged {
                    // SAFETY: item < items <= parts_stride.
                    unsafe {
                        *p.att_acc.add((part0 + item) * HS + tid) = o;
                        if tid == 0 {
                            *p.att_ml.add(2 * (part0 + item)) = m_all;
                            *p.att_ml.add(2 * (part0 + item) + 1) = l_all;
                        }
                    }
                    thread_fence();
                }
                sync_threads();
                // SAFETY: n * nh counters, zero between launches.
                let counter = unsafe { p.att_counter.add(head) };
                // SAFETY: `counter` is one of the n * nh att counters, 4-byte aligned.
                let arrived_last = tid == 0 && unsafe { atomic_add_acq_rel_u32(counter, 1) } as usize == items - 1;
                if sync_threads_or(arrived_last) {
                    thread_fence();
                    if warp == 0 {
                        // SAFETY: the head's items published their partials
                        // before arriving; its 64 outputs lie in att.
                        unsafe {
                            combine_parts(
                                p.att_acc.add(part0 * HS),
                                p.att_ml.add(2 * part0),
                                items,
                                out,
                                lane,
                                LANES,
                            )
                        };
                    }
                    if tid == 0 {
                        // SAFETY: every item of this head has arrived.
                        unsafe { *counter = 0 };
                    }
                }
            }
            // The partials in xs are read before the next item rewrites them.
            sync_threads();
        }
        i += nb;
    }
    // Blocks without an item reach `between_phases` past a barrier too.
    sync_threads();
}

/// What the phases after a boundary need staged early: the next GEMV
/// phase's parameters ([`stage_phase_params`]).
struct Boundary {
    gemv: Option<usize>,
    /// Whether the blocks meet at a grid barrier here (not where the next
    /// phase polls its flagged input, `flagged`).
    grid: bool,
}

/// The phase boundaries of the launch so far (the trace's phase index),
/// and how many of them were grid barriers (the barrier's target).
struct Boundaries {
    phases: u32,
    grid: u32,
}

/// Between two phases: the block arrives at the grid barrier (after every
/// thread's writes, [`BARRIER_THREAD`]), then starts the copies the next
/// phases need ([`stage_phase_params`] of `next.gemv`),
/// then waits for the other blocks; without the grid barrier (`next.grid`
/// false) only the copies. `b` counts this launch's boundaries.
///
/// # Safety
/// The params' contract (one block per SM, all resident; `sync` word 0
/// counts this launch's arrivals); every thread of the block calls it,
/// after a block barrier that follows the phase's work; `next.gemv` is a
/// phase.
#[inline(always)]
unsafe fn between_phases<W: Weight, const R: usize, const T: bool>(
    p: &DecodeStepParams<W>,
    sm: &Smem,
    ring: &Ring,
    b: &mut Boundaries,
    next: Boundary,
    tr: Trace<'_, W, T>,
) {
    let tid = thread_idx_x();
    let phase = b.phases as usize;
    tr.mark(phase, DecodeStepMark::End);
    b.phases += 1;
    let grid = next.grid;
    if grid {
        b.grid += 1;
    }
    if grid && tid == BARRIER_THREAD {
        // SAFETY: the caller's contract.
        unsafe { grid_arrive(p.sync) };
    }
    if let Some(g) = next.gemv {
        // SAFETY: g is a phase of the step; lnp's and the bias slot's last
        // readers finished before the block barrier.
        unsafe { stage_phase_params::<W, R>(p, sm, ring, g) };
    }
    tr.mark(phase, DecodeStepMark::Issued);
    if grid && tid == BARRIER_THREAD {
        // SAFETY: the caller's contract.
        unsafe { grid_wait(p.sync, b.grid * grid_dim_x()) };
    }
    sync_threads();
    tr.mark(phase + 1, DecodeStepMark::Start);
}

/// The LM head's end: each row's best over the block (`best` is the
/// thread's best of row `row`; lane `r` of every warp gets row `r`'s best
/// over the warp's candidates) to
/// [`argmax_finish`], whose last block picks the argmax, writes the ids and
/// the next step's tokens and advances the positions; that block also
/// resets the grid barrier's counter.
///
/// # Safety
/// The params' contract; after the LM head's last tile; every thread of
/// the block calls it.
#[inline(always)]
unsafe fn lm_head_finish<W, const R: usize>(p: &DecodeStepParams<W>, best: (f32, u32), row: usize, sm: &Smem) {
    let (n, lane) = (p.n as usize, lane_id() as usize);
    let none = (f32::NEG_INFINITY, u32::MAX);
    let mut mine = none;
    unroll!(r < R => {
        if r < n {
            let b = warp_best(if row == r { best } else { none });
            if lane == r {
                mine = b;
            }
        }
    });
    let out = ArgmaxOut {
        part_val: p.part_val,
        part_idx: p.part_idx,
        // SAFETY: the sync buffer's second word.
        counter: unsafe { p.sync.add(1) },
        ids: p.ids,
        tokens_next: p.tokens,
        pos_next: p.pos,
    };
    // SAFETY: the params' contract; `best` holds WARPS * ROWS pairs.
    if unsafe { argmax_finish(&out, mine, sm.best, n) } && thread_idx_x() == 0 {
        // SAFETY: every block has passed every grid barrier and arrived;
        // none touches the barrier's counter again in this launch, and
        // every block read the epoch at its start.
        unsafe {
            *p.sync = 0;
            *p.sync.add(2) = *epoch_slot();
        }
    }
}

/// The step for up to `R` rows (see the module docs).
///
/// # Safety
/// `DecodeStepParams`' contract, with the launch it describes; `n <= R`.
#[inline(always)]
unsafe fn decode_step_body<W: MmaWeight, const R: usize, const T: bool>(p: DecodeStepParams<W>) {
    let nl = p.n_layer as usize;
    let lay = decode_step_smem(p.n, p.c, p.n_layer, grid_dim_x(), p.slots, p.slot_bytes);
    // SAFETY: the launch provides `lay.total` bytes, 16-byte aligned.
    let base = unsafe { dynamic_shared_align16::<u8>() };
    // SAFETY: every offset of `lay` lies inside `lay.total`.
    let at = |off: u32| unsafe { base.add(off as usize) };
    let sm = Smem {
        pos: at(lay.pos) as *mut u32,
        bias: at(lay.bias) as *mut f32,
        xraw: at(lay.xraw) as *mut f32,
        red: at(lay.red) as *mut f32,
        best: at(lay.best) as *mut u32,
        lnp: at(lay.lnp) as *mut f32,
        xs: at(lay.xs) as *mut f32,
        xw: decode_step_share_width(p.c, grid_dim_x()) as usize,
    };
    // SAFETY: both point into shared memory.
    let ring = unsafe {
        Ring {
            base: shared_addr(at(lay.ring)),
            bars: shared_addr(at(lay.bars)),
            ptr: at(lay.ring),
            slots: p.slots as usize,
            slot_bytes: p.slot_bytes as usize,
            tbl: at(lay.table),
            shares: at(lay.shares) as *const Share,
        }
    };
    let tid = thread_idx_x();
    let tr = Trace::<W, T>(&p);
    tr.init();
    tr.clocks(DecodeStepTraceHeader::TimerStart, DecodeStepTraceHeader::ClockStart);
    if tid == 0 {
        for s in 0..ring.slots {
            // SAFETY: slots <= MAX_SLOTS barriers at `bars`.
            unsafe { mbarrier_init(ring.bars + 8 * s as u32, 1) };
        }
        fence_mbarrier_init();
    }
    // The layer table, once: every phase reads its pointers from here, not
    // through a global round trip.
    let words = nl * size_of::<DecodeStepLayer<W>>() / size_of::<u64>();
    let mut i = tid as usize;
    while i < words {
        // SAFETY: the table holds n_layer entries of pointers (8-byte
        // words), and so does its copy.
        unsafe { *(ring.tbl as *mut u64).add(i) = *(p.layers as *const u64).add(i) };
        i += DECODE_STEP_THREADS as usize;
    }
    // Each kind's share reads its pointers from the global table (the copy
    // is not complete yet); only its sizes are kept.
    // SAFETY: the layout's `shares` slot; the barrier below.
    unsafe {
        share_kinds(&p, p.layers, at(lay.shares) as *mut Share, ring.slot_bytes);
    }
    sync_threads();
    let mut prod = Producer { g: 0, j: 0, issued: 0 };
    let mut consumed = 0;
    // Weights only before the PDL wait: they overlap the previous kernel.
    if tid == PRODUCER_THREAD {
        // SAFETY: the barriers are initialised; no slot was read yet.
        unsafe { issue(&p, &mut prod, consumed, &ring) };
    }
    // The first phase's parameters (later phases' come at the boundaries
    // before them, `between_phases`).
    // SAFETY: phase 0; nothing read lnp or the bias slot yet.
    unsafe { stage_phase_params::<W, R>(&p, &sm, &ring, 0) };
    grid_dependency_wait();
    launch_dependents();
    // The positions, once (only the LM head's last block changes them).
    if (tid as usize) < p.n as usize {
        // SAFETY: n entries.
        unsafe { *sm.pos.add(tid as usize) = *p.pos.add(tid as usize) };
    }
    if tid == 0 {
        // This launch's epoch: one past the last launch's (`flags`), read
        // at GPU scope (not from a line this SM's L1 kept from before).
        // SAFETY: the sync words; the last launch completed (the PDL wait).
        unsafe { *epoch_slot() = load_acquire_u32(p.sync.add(2)).wrapping_add(1) };
    }
    sync_threads();
    tr.mark(0, DecodeStepMark::Start);

    let mut bounds = Boundaries { phases: 0, grid: 0 };
    // One loop over the GEMV phases, so each phase's code exists once: the
    // step's code is larger than the instruction caches, and a copy per
    // phase (the layer's order written out) had every phase fetching its
    // own instructions again (ncu: a fifth of the warps' stalls).
    let last = GEMVS * nl;
    // The row this thread's epilogues serve (every row's, one by one, with
    // one row), and its best logit (the LM head's epilogue tracks it).
    let row = if R == 1 {
        0
    } else if simt_rows::<W>() {
        simt_row(tid as usize)
    } else {
        mma_row(tid as usize)
    };
    for g in 0..=last {
        let mut best = (f32::NEG_INFINITY, u32::MAX);
        // SAFETY: (phases) the params' contract; each phase after the
        // barrier that published its inputs; g <= last; layer < n_layer.
        unsafe {
            // ln1 + qkv (q, and k, v into the cache); x += attproj(att);
            // h = gelu(fc(ln2(x))); x += fcproj(h); then lnf + the LM head.
            run_gemv::<W, R, T>(&p, g, &sm, &ring, &mut prod, &mut consumed, &mut best, tr);
            if g == last {
                tr.mark(traced_phase(g), DecodeStepMark::End);
                lm_head_finish::<W, R>(&p, best, row, &sm);
                break;
            }
            let layer = g / GEMVS;
            let grid = !flagged::<R>();
            let mut next = Boundary {
                gemv: Some(g + 1),
                grid,
            };
            if g % GEMVS == 0 {
                // Attention between qkv and attproj.
                between_phases::<W, R, T>(&p, &sm, &ring, &mut bounds, next, tr);
                run_attention(&p, &ring, &sm, layer, att_dest::<W, R>(&p, layer));
                // Flagged partials need no barrier before attproj.
                next = Boundary {
                    gemv: None,
                    grid: !flagged::<R>(),
                };
            }
            between_phases::<W, R, T>(&p, &sm, &ring, &mut bounds, next, tr);
        }
    }
    tr.clocks(DecodeStepTraceHeader::TimerEnd, DecodeStepTraceHeader::ClockEnd);
}

macro_rules! decode_step_entry {
    ($name:ident, $w:ty, $rows:expr, $trace:expr) => {
        /// `decode_step_body` for up to this many rows, weights of this
        /// type; the `_traced` entries also write `DecodeStepParams::trace`.
        ///
        /// # Safety
        /// `DecodeStepParams`' contract, with the launch it describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeStepParams<$w>) {
            // SAFETY: forwarded; the host picks the entry with n <= rows.
            unsafe { decode_step_body::<$w, { $rows }, { $trace }>(p) }
        }
    };
}
decode_step_entry!(decode_step, f32, 1, false);
decode_step_entry!(decode_step_bf16, u16, 1, false);
decode_step_entry!(decode_step_traced, f32, 1, true);
decode_step_entry!(decode_step_bf16_traced, u16, 1, true);
decode_step_entry!(decode_step_rows, f32, DECODE_STEP_MAX_ROWS as usize, false);
decode_step_entry!(decode_step_rows_bf16, u16, DECODE_STEP_MAX_ROWS as usize, false);
decode_step_entry!(decode_step_rows_traced, f32, DECODE_STEP_MAX_ROWS as usize, true);
decode_step_entry!(decode_step_rows_bf16_traced, u16, DECODE_STEP_MAX_ROWS as usize, true);

/// [`DECODE_STEP_FOLD`]: column `j` of `w` (one warp) to its fold pair,
/// `(Σ_k γ_k w[j][k], bias_j + Σ_k β_k w[j][k])`, in f32 over the weight's
/// values as stored (bf16 ones too: the step multiplies those).
///
/// # Safety
/// `DecodeStepFoldParams`' contract, with the launch it describes.
#[inline(always)]
unsafe fn decode_step_fold_body<W: Weight>(p: DecodeStepFoldParams<W>) {
    let (c, oc) = (p.c as usize, p.oc as usize);
    let j = (block_idx_x() * DECODE_STEP_FOLD_COLUMNS + warp_id()) as usize;
    if j >= oc {
        return;
    }
    let lane = lane_id() as usize;
    let (mut g, mut b) = (0f32, 0f32);
    let mut k = lane * W::PER_LOAD;
    while k < c {
        // SAFETY: j < oc, k + PER_LOAD <= c (c % 8 == 0); row j is 16-byte
        // aligned as w is and c % 8 == 0.
        let w = unsafe { W::load_raw(p.w.add(j * c), k) };
        unroll!(e < W::PER_LOAD => {
            let wv = W::value(&w, e);
            // SAFETY: k + e < c.
            unsafe {
                g = fma(*p.ln_w.add(k + e), wv, g);
                b = fma(*p.ln_b.add(k + e), wv, b);
            }
        });
        k += LANES * W::PER_LOAD;
    }
    let (g, b) = (warp_reduce_sum(g), warp_reduce_sum(b));
    if lane == 0 {
        // SAFETY: j < oc: bias (when given) and the pairs hold oc.
        unsafe {
            let bias = if p.bias.is_null() { 0.0 } else { *p.bias.add(j) };
            *p.out.add(DECODE_STEP_FOLD_PAIR * j) = g;
            *p.out.add(DECODE_STEP_FOLD_PAIR * j + 1) = bias + b;
        }
    }
}

/// `decode_step_fold_body` over f32 weights.
///
/// # Safety
/// `DecodeStepFoldParams`' contract, with the launch it describes.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_step_fold(p: DecodeStepFoldParams<f32>) {
    // SAFETY: forwarded.
    unsafe { decode_step_fold_body(p) }
}

/// `decode_step_fold_body` over bf16 weights.
///
/// # Safety
/// `DecodeStepFoldParams`' contract, with the launch it describes.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn decode_step_fold_bf16(p: DecodeStepFoldParams<u16>) {
    // SAFETY: forwarded.
    unsafe { decode_step_fold_body(p) }
}
