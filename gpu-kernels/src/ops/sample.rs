//! Sampling on the device: one block per row picks the row's next token by
//! the rule of [`crate::params::sample`] (greedy, temperature, top-k, top-p,
//! a Philox draw), so only one id per row comes back.
//!
//! Every decision is made on integers — order-preserving u32 keys of the
//! logits and fixed-point u64 weights — so sums do not depend on the order
//! in which threads add them, and the result equals the CPU twin's
//! (`host::cpu::sample`) bit for bit, whatever the schedule.
//!
//! # Passes over the row
//! Each pass reads the row from global memory (from L2 the first time; a
//! GPT-2 row, 201 KB, then mostly from L1) and first compares each logit
//! with one float bound, so tokens that cannot matter cost a load and a
//! compare.
//! 1. The maximum key `K` (or, greedy, the argmax: done).
//! 2. Only tokens "near" the maximum can weigh anything: those with
//!    `key >= key(near_bound(M, s))`, i.e. rank `r = K - key` in `[0, R]`.
//!    The selects below work on `r`, which spans about 22 bits for real
//!    logits (not 32: the bits above are common to all near tokens).
//! 3. Top-k: for `k <= SAMPLE_BLOCK`, the k-th largest of the threads'
//!    maxima (found with counting barriers, no pass) bounds the top-k set
//!    from below, which shrinks it to a few k candidates. Then a radix
//!    select of the `top_k`-th token in (r, id) order, 11 bits of `r` per
//!    pass, with u32 bucket counts (shared-memory atomics: integer sums,
//!    order-independent). Exact ties at the k-th key are cut at the right id
//!    by a search in id order (below).
//! 4. Top-p: the same radix select with u64 bucket *masses* over the top-k
//!    set, to find the token where the prefix mass first reaches
//!    `top_p_target(top_p, W)`; `W` is the total of the first pass's masses.
//!    Ties there weigh the same (same logit, same weight), so how many of
//!    them are needed is a division, and which ones again a search by id.
//! 5. The draw: a hierarchical search in id order for the token whose
//!    cumulative-mass interval contains `t = draw_target(random, W_S)`: each
//!    warp sums one sixteenth of the range, the block picks the sixteenth
//!    holding `t`, and so on down to one block-wide scan.
//!
//! Every kept set is a prefix of the (r ascending, id ascending) order, so
//! it is carried as one u64 limit on `(r << 32) | id`. Selects stop early
//! when the bucket holding the target has a single token (usual for top-k
//! with small k, and for the top-p cut inside a small top-k set).
//!
//! # Cost
//! Full passes over the row: 1 for greedy; typically 4 with top-k 40 and
//! top-p 0.95 (max, one or two top-k passes, one top-p pass, the draw), at
//! most 10: 1 + (3 + 1) + (3 + 1) + 1, when both cuts fall inside runs of
//! tied logits. The software exponential of
//! [`sample_weight`] (about 30 instructions, the price of bit-exact
//! agreement with the host) runs only for tokens inside the current
//! candidate set: a handful with top-k, every near token with top-k 0.

use core::arch::asm;

use crate::device::mma::shared_addr;
use crate::device::warp::{shfl_idx_u32, shfl_xor_f32, shfl_xor_u32, warp_reduce_max_u32};
use crate::device::{UNROLL_MAX, unroll};
use crate::device::{
    WARP_SIZE, block_idx_x, dynamic_shared, lane_id, sync_threads, sync_threads_count, thread_idx_x, warp_id,
};
use crate::params::sample::{
    SAMPLE_BLOCK, SAMPLE_BROADCAST_WORDS, SAMPLE_BUCKETS, SAMPLE_RADIX_BITS, SAMPLE_SCRATCH_WORDS, SampleParams,
    SampleRow, draw_target, is_greedy, key_logit, logit_key, near_bound, row_random, sample_shared_bytes,
    sample_weight, temperature_scale, top_p_active, top_p_target,
};

#[cfg(feature = "sm90a")]
use crate::device::{ballot, block_idx_y, cluster_ctarank, cluster_shared_addr, cluster_sync, cluster_sync_relaxed};
#[cfg(feature = "sm90a")]
use crate::device::{load_cluster_u32, load_cluster_u64};
#[cfg(feature = "sm90a")]
use crate::params::sample::{
    SAMPLE_CLUSTER, SAMPLE_CLUSTER_BLOCK_CAP, SAMPLE_CLUSTER_EXCHANGE_WORDS, SAMPLE_CLUSTER_LIST_CAP,
    SAMPLE_CLUSTER_SLICE, sample_cluster_shared_bytes,
};

const THREADS: u32 = SAMPLE_BLOCK;
const WARPS: u32 = THREADS / WARP_SIZE;
const BUCKETS: u32 = SAMPLE_BUCKETS;
/// Buckets each thread scans (consecutive ones, so bucket order is thread order).
const BUCKETS_PER_THREAD: usize = (BUCKETS / THREADS) as usize;
/// Logits each thread loads before using them: several loads in flight
/// hide the latency of L2 that one at a time would expose.
const UNROLL: usize = 8;
/// "No candidate yet" in the argmax: larger than any id, so real ids win ties.
const NONE: u32 = u32::MAX;
/// Rank of a NaN logit: above every real rank (at most `0xff00_0001`), so
/// NaN is in no kept set.
const NAN_RANK: u32 = u32::MAX;
/// The id half of a limit that keeps every id of its rank.
const ALL_IDS: u64 = u32::MAX as u64;

const _: () = assert!(THREADS.is_multiple_of(WARP_SIZE) && WARPS <= WARP_SIZE);
const _: () = assert!(BUCKETS.is_multiple_of(THREADS) && BUCKETS_PER_THREAD <= UNROLL_MAX);
const _: () = assert!(UNROLL <= UNROLL_MAX);
const _: () = assert!(SAMPLE_SCRATCH_WORDS == WARPS && SAMPLE_BROADCAST_WORDS >= 4);
// The layout `Smem::get` carves.
const _: () = assert!(
    sample_shared_bytes() as usize
        == BUCKETS as usize * (size_of::<u64>() + size_of::<u32>())
            + (SAMPLE_SCRATCH_WORDS + SAMPLE_BROADCAST_WORDS) as usize * size_of::<u64>()
);

/// The launch's dynamic shared memory (`sample_shared_bytes()` bytes), carved.
#[derive(Clone, Copy)]
struct Smem {
    /// `[BUCKETS]` per-bucket masses of a radix pass.
    masses: *mut u64,
    /// `[BUCKETS]` per-bucket token counts of a radix pass.
    counts: *mut u32,
    /// `[WARPS]` one word per warp for block reductions and scans.
    scratch: *mut u64,
    /// `[SAMPLE_BROADCAST_WORDS]` values one thread hands to the block.
    bcast: *mut u64,
}

impl Smem {
    /// # Safety
    /// The launch provides `sample_shared_bytes()` bytes of dynamic shared memory.
    #[inline(always)]
    unsafe fn get() -> Smem {
        // SAFETY: the layout of `sample_shared_bytes`: masses (8-byte
        // aligned at the start), counts, scratch, broadcast words.
        unsafe {
            let masses = dynamic_shared::<u64>();
            let counts = masses.add(BUCKETS as usize) as *mut u32;
            let scratch = counts.add(BUCKETS as usize) as *mut u64;
            let bcast = scratch.add(WARPS as usize);
            Smem {
                masses,
                counts,
                scratch,
                bcast,
            }
        }
    }
}

/// `*p += v` in shared memory, atomically (`red.shared.add.u32`).
///
/// # Safety
/// `p` points into this block's shared memory, 4-byte aligned.
#[inline(always)]
unsafe fn shared_add_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller's contract; `red` only adds.
    unsafe {
        let a = shared_addr(p);
        asm!("red.shared.add.u32 [{a}], {v};", a = in(reg32) a, v = in(reg32) v, options(nostack));
    }
}

/// `*p += v` in shared memory, atomically (`red.shared.add.u64`): integer
/// addition commutes, so the sum is the same in any order.
///
/// # Safety
/// `p` points into this block's shared memory, 8-byte aligned.
#[inline(always)]
unsafe fn shared_add_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract; `red` only adds.
    unsafe {
        let a = shared_addr(p);
        asm!("red.shared.add.u64 [{a}], {v};", a = in(reg32) a, v = in(reg64) v, options(nostack));
    }
}

/// [`shfl_xor_u32`] for u64 (two shuffles).
#[inline(always)]
fn shfl_xor_u64(v: u64, m: u32) -> u64 {
    shfl_xor_u32(v as u32, m) as u64 | (shfl_xor_u32((v >> 32) as u32, m) as u64) << 32
}

/// [`shfl_idx_u32`] for u64 (two shuffles).
#[inline(always)]
fn shfl_idx_u64(v: u64, src: u32) -> u64 {
    shfl_idx_u32(v as u32, src) as u64 | (shfl_idx_u32((v >> 32) as u32, src) as u64) << 32
}

/// Sum over the warp; every lane gets it.
#[inline(always)]
fn warp_sum_u64(mut v: u64) -> u64 {
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        v += shfl_xor_u64(v, m);
        m /= 2;
    }
    v
}

/// Inclusive prefix sum over the lanes of the warp (lane order).
#[inline(always)]
fn warp_scan_u64(mut v: u64) -> u64 {
    let lane = lane_id();
    let mut d = 1;
    while d < WARP_SIZE {
        // Lanes below d read a lane that wraps around; they ignore it.
        let o = shfl_idx_u64(v, lane.wrapping_sub(d));
        if lane >= d {
            v += o;
        }
        d *= 2;
    }
    v
}

/// `(exclusive prefix in thread order, total)` of `v` over the block.
///
/// # Safety
/// Every thread of the block calls it (it has barriers); `scratch` is the
/// [`Smem`] scratch, free during the call and again after it.
#[inline(always)]
unsafe fn block_scan_u64(v: u64, scratch: *mut u64) -> (u64, u64) {
    let (lane, warp) = (lane_id(), warp_id());
    let incl = warp_scan_u64(v);
    if lane == WARP_SIZE - 1 {
        // SAFETY: warp < WARPS words.
        unsafe { *scratch.add(warp as usize) = incl };
    }
    sync_threads();
    let (mut before, mut total) = (0u64, 0u64);
    for w in 0..WARPS {
        // SAFETY: every warp wrote its word before the barrier.
        let s = unsafe { *scratch.add(w as usize) };
        if w < warp {
            before += s;
        }
        total += s;
    }
    // The scratch may be written again right after return.
    sync_threads();
    (before + incl - v, total)
}

/// Maximum over the block; every thread gets it.
///
/// # Safety
/// As for [`block_scan_u64`].
#[inline(always)]
unsafe fn block_max_u32(v: u32, scratch: *mut u64) -> u32 {
    let w = warp_reduce_max_u32(v);
    if lane_id() == 0 {
        // SAFETY: warp < WARPS words.
        unsafe { *scratch.add(warp_id() as usize) = w as u64 };
    }
    sync_threads();
    let mut m = 0;
    for w in 0..WARPS {
        // SAFETY: written before the barrier.
        m = m.max(unsafe { *scratch.add(w as usize) } as u32);
    }
    sync_threads();
    m
}

/// Whether argmax candidate `(v2, i2)` beats `(v1, i1)`: larger value, or
/// equal value and lower id (as `ops::argmax`; -0 and +0 tie).
#[inline(always)]
fn better(v2: f32, i2: u32, v1: f32, i1: u32) -> bool {
    i2 != NONE && (i1 == NONE || v2 > v1 || (v2 == v1 && i2 < i1))
}

/// Calls `f(j, x[j])` for `j = first, first + step, ...` below `end`,
/// loading [`UNROLL`] logits before using them.
///
/// # Safety
/// `x[first..end)` is readable.
#[inline(always)]
unsafe fn for_each(x: *const f32, first: u32, end: u32, step: u32, mut f: impl FnMut(u32, f32)) {
    let mut j = first;
    while j < end {
        let mut l = [0f32; UNROLL];
        unroll!(u < UNROLL => {
            let jj = j + u as u32 * step;
            if jj < end {
                // SAFETY: jj < end.
                l[u] = unsafe { *x.add(jj as usize) };
            }
        });
        unroll!(u < UNROLL => {
            let jj = j + u as u32 * step;
            if jj < end {
                f(jj, l[u]);
            }
        });
        // end <= 2^31, so this does not overflow.
        j += UNROLL as u32 * step;
    }
}

/// The row being sampled and what the first pass learnt about it.
///
/// The tokens may be the whole row, a contiguous part of it, or a gathered
/// list of candidates in id order (the cluster kernel's): entry `j` is token
/// [`Row::id`]`(j)`, and every closure below receives that id.
#[derive(Clone, Copy)]
struct Row {
    /// The tokens' logits (`v` readable).
    x: *const f32,
    v: u32,
    /// Null, or `[v]` the id of each entry, ascending.
    ids: *const u32,
    /// Without `ids`: the id of entry 0 (entries are consecutive ids).
    id0: u32,
    /// Largest key of the row (not 0: the row has a non-NaN logit).
    kmax: u32,
    /// The largest logit, `key_logit(kmax)`.
    m: f32,
    /// `temperature_scale(T)`.
    s: f32,
}

impl Row {
    /// A whole row (or a part of one starting at id `id0`) of `v` logits.
    #[inline(always)]
    fn part(x: *const f32, id0: u32, v: u32, kmax: u32, m: f32, s: f32) -> Row {
        Row {
            x,
            v,
            ids: core::ptr::null(),
            id0,
            kmax,
            m,
            s,
        }
    }

    /// The id of entry `j < v`.
    #[inline(always)]
    fn id(&self, j: u32) -> u32 {
        if self.ids.is_null() {
            self.id0 + j
        } else {
            // SAFETY: `ids` holds `v` entries and j < v.
            unsafe { *self.ids.add(j as usize) }
        }
    }

    /// Rank of logit `l`: 0 for the largest, growing as logits shrink.
    #[inline(always)]
    fn rank(&self, l: f32) -> u32 {
        if l.is_nan() { NAN_RANK } else { self.kmax - logit_key(l) }
    }

    /// The smallest logit ranked at most `r` (`r <= kmax - near`): every
    /// logit of rank `<= r` compares `>=` to it as a float (float order is
    /// the key order with -0 and +0 merged), and NaN compares false. One
    /// float comparison against it rejects most of a row before any key
    /// arithmetic.
    #[inline(always)]
    fn floor(&self, r: u32) -> f32 {
        key_logit(self.kmax - r)
    }

    /// Position of `(rank, id)` in the sampling order, for prefix limits.
    #[inline(always)]
    fn order(r: u32, id: u32) -> u64 {
        (r as u64) << 32 | id as u64
    }

    /// This thread's strided share of the row, [`for_each`] style.
    ///
    /// # Safety
    /// `x[0..v)` is readable.
    #[inline(always)]
    unsafe fn each(&self, mut f: impl FnMut(u32, f32)) {
        // SAFETY: the caller's contract.
        unsafe { for_each(self.x, thread_idx_x(), self.v, THREADS, |j, l| f(self.id(j), l)) }
    }
}

/// Greedy: the argmax, ties to the lowest id, NaN never wins; 0 for an
/// all-NaN row.
///
/// # Safety
/// `x[0..v)` readable; every thread calls it; `sm` as in [`Smem::get`].
#[inline(always)]
unsafe fn greedy(x: *const f32, v: u32, sm: Smem) -> u32 {
    // SAFETY: the caller's contract.
    let (_, bi) = unsafe { argmax_part(x, 0, v, sm) };
    if bi == NONE { 0 } else { bi }
}

/// The argmax `(value, id)` of ids `first..end` (ties to the lowest id, NaN
/// never wins); `(-inf, NONE)` when there is no number there. Every thread
/// gets it.
///
/// # Safety
/// `x[first..end)` readable; every thread calls it; `sm` as in [`Smem::get`].
#[inline(always)]
unsafe fn argmax_part(x: *const f32, first: u32, end: u32, sm: Smem) -> (f32, u32) {
    let (mut bv, mut bi) = (f32::NEG_INFINITY, NONE);
    // SAFETY: the caller's contract.
    unsafe {
        for_each(x, first + thread_idx_x(), end, THREADS, |j, l| {
            if !l.is_nan() && better(l, j, bv, bi) {
                (bv, bi) = (l, j);
            }
        })
    };
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        let (v2, i2) = (shfl_xor_f32(bv, m), shfl_xor_u32(bi, m));
        if better(v2, i2, bv, bi) {
            (bv, bi) = (v2, i2);
        }
        m /= 2;
    }
    if lane_id() == 0 {
        // SAFETY: warp < WARPS words.
        unsafe { *sm.scratch.add(warp_id() as usize) = (bv.to_bits() as u64) << 32 | bi as u64 };
    }
    sync_threads();
    let (mut bv, mut bi) = (f32::NEG_INFINITY, NONE);
    for w in 0..WARPS {
        // SAFETY: written before the barrier.
        let s = unsafe { *sm.scratch.add(w as usize) };
        let (v2, i2) = (f32::from_bits((s >> 32) as u32), s as u32);
        if better(v2, i2, bv, bi) {
            (bv, bi) = (v2, i2);
        }
    }
    sync_threads();
    (bv, bi)
}

/// The smallest id `J` among the row's tokens with `sum_{id <= J} f(id,
/// l_id) > goal`, where `goal = goal_of(total)` and `total` is the sum over
/// all of them (`goal < total` is the caller's promise).
///
/// Hierarchical, in id order: each warp sums one contiguous sixteenth of
/// the current range (its lanes read consecutive ids: coalesced), every
/// thread finds the sixteenth holding the goal from the 16 sums, and the
/// range shrinks to it, until one block-wide scan over at most `THREADS`
/// ids finishes. The first level reads the row once; the others read 1/16
/// of the previous range.
///
/// # Safety
/// As for [`greedy`]; `f` and `goal_of` are the same functions in every thread.
#[inline(always)]
unsafe fn search(row: &Row, sm: Smem, f: impl Fn(u32, f32) -> u64, goal_of: impl Fn(u64) -> u64) -> u32 {
    let (tid, lane, warp) = (thread_idx_x(), lane_id(), warp_id());
    let (mut lo, mut len) = (0u32, row.v);
    let mut goal: Option<u64> = None;
    loop {
        if len <= THREADS {
            let j = lo + tid;
            let w = if tid < len {
                // SAFETY: j < lo + len <= v.
                f(row.id(j), unsafe { *row.x.add(j as usize) })
            } else {
                0
            };
            if tid == 0 {
                // Never kept when `goal < total` holds; an in-range answer otherwise.
                // SAFETY: a broadcast word; read after the barriers below.
                unsafe { *sm.bcast = row.id(lo) as u64 };
            }
            // SAFETY: every thread is here.
            let (before, total) = unsafe { block_scan_u64(w, sm.scratch) };
            let g = goal.unwrap_or_else(|| goal_of(total));
            if w > 0 && before <= g && g - before < w {
                // SAFETY: one thread at most (the intervals are disjoint).
                unsafe { *sm.bcast = row.id(j) as u64 };
            }
            sync_threads();
            // SAFETY: written before the barrier.
            let id = unsafe { *sm.bcast } as u32;
            // The broadcast word may be reused after return.
            sync_threads();
            return id;
        }
        // Sub-ranges of whole warp rounds.
        let sub = len.div_ceil(WARPS).next_multiple_of(WARP_SIZE);
        let end = lo + len;
        let start = lo + warp * sub;
        let stop = end.min(start + sub);
        let mut acc = 0u64;
        // SAFETY: ids below stop <= end <= v.
        unsafe { for_each(row.x, start + lane, stop, WARP_SIZE, |j, l| acc += f(row.id(j), l)) };
        let s = warp_sum_u64(acc);
        if lane == 0 {
            // SAFETY: warp < WARPS words.
            unsafe { *sm.scratch.add(warp as usize) = s };
        }
        sync_threads();
        let mut sums = [0u64; WARPS as usize];
        let mut total = 0u64;
        unroll!(w < WARPS as usize => {
            // SAFETY: written before the barrier.
            sums[w] = unsafe { *sm.scratch.add(w) };
            total += sums[w];
        });
        sync_threads();
        let mut g = goal.unwrap_or_else(|| goal_of(total));
        // The first sixteenth whose sum exceeds what is left of the goal.
        let mut pick = WARPS;
        unroll!(w < WARPS as usize => {
            if pick == WARPS {
                if g < sums[w] {
                    pick = w as u32;
                } else {
                    g -= sums[w];
                }
            }
        });
        // g < total rules out finding none; stay in range regardless.
        let pick = pick.min(WARPS - 1);
        goal = Some(g);
        lo += pick * sub;
        len = end.min(lo + sub) - lo;
    }
}

/// Whose tokens a radix select histograms, and how the bucket holding the
/// goal is found among the sums: see [`select`].
trait Scope {
    /// Calls `f(id, logit)` for each of this thread's tokens of the scope.
    ///
    /// # Safety
    /// The row's tokens are readable.
    unsafe fn each(&self, row: &Row, f: impl FnMut(u32, f32));

    /// Once every thread of the scope has added its tokens to its block's
    /// buckets: the bucket where `base` plus the running measure over the
    /// scope's buckets (in bucket order) first reaches the goal, which is
    /// `goal`, or (first pass) `goal_of` of the buckets' total; `None` where
    /// `goal_of` gives `None`. After return the block's buckets may be
    /// cleared; every thread of the block gets the same answer.
    ///
    /// # Safety
    /// Every thread of the scope calls it; the goal is above `base` and at
    /// most `base` plus the buckets' total.
    unsafe fn find(
        &self,
        sm: Smem,
        measure: Measure,
        base: u64,
        goal: Option<u64>,
        goal_of: &impl Fn(u64) -> Option<u64>,
    ) -> Option<Found>;
}

/// The bucket a pass of a radix select settles on.
#[derive(Clone, Copy)]
struct Found {
    bucket: u32,
    /// The goal (the pass's, or the first pass's `goal_of`).
    goal: u64,
    /// `base` plus the measure of the buckets before it.
    below: u64,
    /// Its token count and mass (0 when counting).
    count: u64,
    mass: u64,
}

impl Found {
    /// Hands the bucket this thread found to the block (the broadcast
    /// words), for [`Found::take`].
    ///
    /// # Safety
    /// One thread of the block calls it, before the barrier of the
    /// [`Found::take`] that every thread then calls.
    #[inline(always)]
    unsafe fn announce(sm: Smem, bucket: u32, below: u64, count: u64, mass: u64) {
        // SAFETY: the broadcast words, read after take's first barrier.
        unsafe {
            *sm.bcast = bucket as u64;
            *sm.bcast.add(1) = below;
            *sm.bcast.add(2) = count;
            *sm.bcast.add(3) = mass;
        }
    }

    /// Every thread's copy of the announced bucket (two barriers: after the
    /// second, the broadcast words may be written again).
    ///
    /// # Safety
    /// Every thread of the block calls it; one announced before.
    #[inline(always)]
    unsafe fn take(sm: Smem, goal: u64) -> Found {
        sync_threads();
        // SAFETY: written before the barrier by the one thread that found it.
        let found = unsafe {
            Found {
                bucket: *sm.bcast as u32,
                goal,
                below: *sm.bcast.add(1),
                count: *sm.bcast.add(2),
                mass: *sm.bcast.add(3),
            }
        };
        sync_threads();
        found
    }
}

/// The whole row, one block.
struct OneBlock;

impl Scope for OneBlock {
    #[inline(always)]
    unsafe fn each(&self, row: &Row, f: impl FnMut(u32, f32)) {
        // SAFETY: the caller's contract.
        unsafe { row.each(f) }
    }

    #[inline(always)]
    unsafe fn find(
        &self,
        sm: Smem,
        measure: Measure,
        base: u64,
        goal: Option<u64>,
        goal_of: &impl Fn(u64) -> Option<u64>,
    ) -> Option<Found> {
        sync_threads();
        // Thread t owns buckets [t * BUCKETS_PER_THREAD, +BUCKETS_PER_THREAD).
        let first = thread_idx_x() as usize * BUCKETS_PER_THREAD;
        let mut vals = [0u64; BUCKETS_PER_THREAD];
        let mut local = 0u64;
        unroll!(i < BUCKETS_PER_THREAD => {
            // SAFETY: first + i < BUCKETS, written before the barrier.
            vals[i] = unsafe {
                match measure {
                    Measure::Count => *sm.counts.add(first + i) as u64,
                    Measure::Mass => *sm.masses.add(first + i),
                }
            };
            local += vals[i];
        });
        // SAFETY: every thread is here.
        let (before, total) = unsafe { block_scan_u64(local, sm.scratch) };
        let g = match goal {
            Some(g) => g,
            None => goal_of(total)?,
        };
        // The goal is at most base + total, so exactly one thread finds it.
        let mut acc = base + before;
        unroll!(i < BUCKETS_PER_THREAD => {
            let below = acc;
            acc += vals[i];
            if below < g && acc >= g {
                let b = first + i;
                // SAFETY: one thread; b < BUCKETS.
                unsafe { Found::announce(sm, b as u32, below, *sm.counts.add(b) as u64, *sm.masses.add(b)) };
            }
        });
        // SAFETY: every thread is here; one announced the bucket.
        Some(unsafe { Found::take(sm, g) })
    }
}

/// What a radix select accumulates per bucket.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Tokens (top-k).
    Count,
    /// Weights (top-p).
    Mass,
}

/// Among the tokens whose order is at most `limit` (a prefix of the
/// sampling order), the shortest prefix whose measure reaches
/// `goal_of(total)`; `None` from `goal_of` keeps the whole set. Returns the
/// new limit.
///
/// Radix select on the rank, [`SAMPLE_RADIX_BITS`] bits per pass: each pass
/// histograms (count and, for `Mass`, weight) the set's tokens inside the
/// rank range still open, finds the bucket where the running measure —
/// buckets in rank order, after everything below the range — reaches the
/// goal, and narrows the range to it. It stops when that bucket holds one
/// token (then every set token up to the bucket's end is kept) or, for
/// counts, when the whole bucket is needed; else when the rank is exact, and
/// the tokens tied on it are cut at the right id.
///
/// The histograms are `scope`'s: this block's alone over the whole row
/// ([`OneBlock`]), or summed over a cluster whose blocks each take a part
/// (`ClusterPart`). Every block of a cluster then takes the same steps and
/// returns the same limit (the sums are integers, the same in each).
///
/// # Safety
/// As for [`greedy`] (every thread of `scope` calls it); `goal_of` is the
/// same function in every thread.
#[inline(always)]
// `!(l >= cut)` is meant: a NaN logit fails `>=` and is skipped, as NaN is
// in no kept set; `l < cut` would let it through.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
unsafe fn select(
    row: &Row,
    sm: Smem,
    scope: &impl Scope,
    limit: u64,
    measure: Measure,
    goal_of: impl Fn(u64) -> Option<u64>,
) -> u64 {
    let tid = thread_idx_x();
    let rmax = (limit >> 32) as u32;
    // Open range of ranks: [lo, lo + 2^width).
    let (mut lo, mut width) = (0u32, u32::BITS - rmax.leading_zeros());
    // Measure of the set's tokens ranked below `lo`.
    let mut base = 0u64;
    let mut goal: Option<u64> = None;
    loop {
        let digit = width.min(SAMPLE_RADIX_BITS);
        let shift = width - digit;
        let mut b = tid;
        while b < BUCKETS {
            // SAFETY: b < BUCKETS.
            unsafe {
                *sm.counts.add(b as usize) = 0;
                *sm.masses.add(b as usize) = 0;
            }
            b += THREADS;
        }
        sync_threads();
        let span = 1u64 << width;
        // No token ranked past the range's end or the set's can count.
        let cut = row.floor((lo as u64 + span - 1).min(rmax as u64) as u32);
        // SAFETY: the row's v logits are readable.
        unsafe {
            scope.each(row, |j, l| {
                if !(l >= cut) {
                    return;
                }
                let r = row.rank(l);
                let off = (r as u64).wrapping_sub(lo as u64);
                if off < span && Row::order(r, j) <= limit {
                    let bucket = (off >> shift) as usize;
                    // SAFETY: off < 2^width, so bucket < 2^digit <= BUCKETS.
                    shared_add_u32(sm.counts.add(bucket), 1);
                    if measure == Measure::Mass {
                        let w = sample_weight(l, row.m, row.s);
                        if w != 0 {
                            shared_add_u64(sm.masses.add(bucket), w);
                        }
                    }
                }
            })
        };
        // SAFETY: every thread of the scope is here; the goal is above base
        // (the last pass's bucket reached it) and within its bucket.
        let Some(Found {
            bucket,
            goal: g,
            below,
            count,
            mass,
        }) = (unsafe { scope.find(sm, measure, base, goal, &goal_of) })
        else {
            return limit;
        };
        goal = Some(g);
        base = below;
        lo += bucket << shift;
        width = shift;
        let whole = match measure {
            Measure::Count => base + count == g,
            Measure::Mass => false,
        };
        if width > 0 && (count == 1 || whole) {
            // Every set token up to the end of this bucket is kept.
            let last = lo as u64 + (1u64 << width) - 1;
            return limit.min(last << 32 | ALL_IDS);
        }
        if width == 0 {
            // Rank `lo` exactly: `count` tied tokens of equal weight.
            // The bucket reached the goal, so count >= 1 and (for masses)
            // mass >= 1; `max(1)` only spares the division its panic path.
            let need = match measure {
                Measure::Count => g - base,
                Measure::Mass => (g - base).div_ceil((mass / count.max(1)).max(1)),
            };
            if need >= count {
                return limit.min((lo as u64) << 32 | ALL_IDS);
            }
            let (r, cut) = (lo, row.floor(lo));
            // SAFETY: as for this function; need - 1 < count, the total.
            let id = unsafe {
                search(
                    row,
                    sm,
                    |j, l| (l >= cut && row.rank(l) == r && Row::order(r, j) <= limit) as u64,
                    |_| need - 1,
                )
            };
            return Row::order(r, id);
        }
    }
}

/// The smallest rank `d <= rmax` such that at least `k` threads' largest
/// keys `mine` rank at most `d` (rank = `kmax - key`), or `rmax` when no
/// such `d` exists (see [`kth_rank`]).
#[inline(always)]
fn max_rank_of_kth(mine: u32, kmax: u32, rmax: u32, k: u32) -> u32 {
    // Threads without a key (0) never count: their rank is past any rmax.
    kth_rank(if mine == 0 { u32::MAX } else { kmax - mine }, rmax, k)
}

/// The smallest `d <= rmax` such that at least `k` threads' `rank`s are at
/// most `d`, or `rmax` when no such `d` exists: a bitwise search, one
/// counting barrier per bit of `rmax`. Every thread calls it and gets the
/// same answer.
#[inline(always)]
fn kth_rank(rank: u32, rmax: u32, k: u32) -> u32 {
    let enough = |d: u32| sync_threads_count(rank <= d) >= k;
    if !enough(rmax) {
        return rmax;
    }
    // Invariant: enough(d + 2^(b+1) - 1) holds; find the smallest such d.
    let mut d = 0u32;
    let mut b = u32::BITS - rmax.leading_zeros();
    while b > 0 {
        b -= 1;
        let half = (1u32 << b) - 1;
        if !enough(d + half) {
            d += 1 << b;
        }
    }
    d.min(rmax)
}

/// A sampled (not greedy) row.
///
/// # Safety
/// As for [`greedy`].
#[inline(always)]
unsafe fn sampled(x: *const f32, v: u32, cfg: &SampleRow, random: u64, sm: Smem) -> u32 {
    // This thread's largest key (0: none, or only NaN).
    let mut mine = 0u32;
    // SAFETY: the caller's contract.
    unsafe { for_each(x, thread_idx_x(), v, THREADS, |_, l| mine = mine.max(logit_key(l))) };
    // SAFETY: every thread is here.
    let kmax = unsafe { block_max_u32(mine, sm.scratch) };
    if kmax == 0 {
        // Every logit is NaN.
        return 0;
    }
    let m = key_logit(kmax);
    let s = temperature_scale(cfg.temperature);
    let row = Row::part(x, 0, v, kmax, m, s);
    // Tokens ranked above R weigh nothing (see `near_bound`).
    let near = logit_key(near_bound(m, s)).min(kmax);
    let mut limit = Row::order(kmax - near, u32::MAX);
    if cfg.top_k > 0 && cfg.top_k <= THREADS {
        // The k-th largest of the threads' maxima is a key that at least k
        // tokens reach (those maxima), so every top-k token reaches it too:
        // the select may start from that prefix, usually a few k tokens
        // instead of every near one.
        let d = max_rank_of_kth(mine, kmax, (limit >> 32) as u32, cfg.top_k);
        limit = limit.min(Row::order(d, u32::MAX));
    }
    // SAFETY: as for this function.
    unsafe { keep_and_draw(&row, sm, limit, cfg, random) }
}

/// The end of a sampled row's choice, once `limit` bounds a prefix of the
/// sampling order that holds every token top-k keeps (and the near bound
/// holds): top-k, top-p, then the draw.
///
/// # Safety
/// As for [`greedy`], with `row`'s tokens readable.
#[inline(always)]
// `!(l >= cut)` is meant: a NaN logit fails `>=` and is skipped.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
unsafe fn keep_and_draw(row: &Row, sm: Smem, mut limit: u64, cfg: &SampleRow, random: u64) -> u32 {
    if cfg.top_k > 0 {
        let k = cfg.top_k as u64;
        // SAFETY: as for this function.
        limit = unsafe {
            select(row, sm, &OneBlock, limit, Measure::Count, |total| {
                (k < total).then_some(k)
            })
        };
    }
    if top_p_active(cfg) {
        let top_p = cfg.top_p;
        // SAFETY: as for this function.
        limit = unsafe {
            select(row, sm, &OneBlock, limit, Measure::Mass, |total| {
                Some(top_p_target(top_p, total))
            })
        };
    }
    let cut = row.floor((limit >> 32) as u32);
    let (m, s) = (row.m, row.s);
    // SAFETY: as for this function; the kept mass is at least WEIGHT_ONE
    // (the most likely token is always kept), so the goal is below it.
    unsafe {
        search(
            row,
            sm,
            |j, l| {
                if !(l >= cut) {
                    return 0;
                }
                let r = row.rank(l);
                if Row::order(r, j) <= limit {
                    sample_weight(l, m, s)
                } else {
                    0
                }
            },
            |total| draw_target(random, total),
        )
    }
}

/// Sampling, one block per row (see the module docs).
///
/// Launch: grid `(n, 1, 1)`, `SAMPLE_BLOCK` threads,
/// `sample_shared_bytes()` bytes of dynamic shared memory.
///
/// # Safety
/// Buffers as documented on [`SampleParams`] (`out`, `rows`, `counter`,
/// `next_tokens` and `streams` hold `n` entries where not null, every row's first `v`
/// logits are readable, `1 <= v <= SAMPLE_MAX_VOCAB`); launch as above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn sample_forward(p: SampleParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let row = block_idx_x();
    if row >= p.n {
        return;
    }
    // SAFETY: row < n; the row's v logits are readable.
    let x = unsafe { p.logits.add(row as usize * p.row_stride as usize) };
    // SAFETY: rows holds n settings.
    let cfg = unsafe { *p.rows.add(row as usize) };
    // SAFETY: the launch provides the shared memory.
    let sm = unsafe { Smem::get() };
    let id = if is_greedy(&cfg) {
        // SAFETY: every thread is here; x[0..v) readable.
        unsafe { greedy(x, p.v, sm) }
    } else {
        // SAFETY: row < n.
        let random = unsafe { draw_bits(&p, row, &cfg) };
        // SAFETY: as above.
        unsafe { sampled(x, p.v, &cfg, random, sm) }
    };
    if thread_idx_x() == 0 {
        // SAFETY: row < n.
        unsafe { write_id(&p, row, id) };
    }
}

/// Row `row`'s 64 random bits: its counter and stream (see [`SampleParams`]).
///
/// # Safety
/// `row < p.n`, and `p`'s buffers as documented there.
#[inline(always)]
unsafe fn draw_bits(p: &SampleParams, row: u32, cfg: &SampleRow) -> u64 {
    let counter = if p.counter.is_null() {
        0
    } else {
        // SAFETY: counter holds n words where not null.
        unsafe { *p.counter.add(row as usize) }
    };
    let stream = if p.streams.is_null() {
        row
    } else {
        // SAFETY: streams holds n words where not null.
        unsafe { *p.streams.add(row as usize) }
    };
    row_random(cfg.seed, counter, stream)
}

/// Row `row`'s choice into `out` (and `next_tokens` where not null).
///
/// # Safety
/// `row < p.n`, and `p`'s buffers as documented on [`SampleParams`].
#[inline(always)]
unsafe fn write_id(p: &SampleParams, row: u32, id: u32) {
    // SAFETY: out (and next_tokens where not null) hold n ids.
    unsafe {
        *p.out.add(row as usize) = id;
        if !p.next_tokens.is_null() {
            *p.next_tokens.add(row as usize) = id;
        }
    }
}

// ---------------------------------------------------------------------------
// Eight blocks a row: `sample_forward_cluster` (sm_90a module).
//
// The one-block kernel spends its time in passes over the whole row by one
// SM (the max, the top-k bound, the selects' histograms, the draw's
// search). Here a cluster of `SAMPLE_CLUSTER` blocks shares the row, one
// contiguous part each:
// 1. Each block finds its part's largest key and, for top-k up to
//    `SAMPLE_BLOCK`, the k-th largest of its threads' maxima (a key at least
//    k of its tokens reach); the blocks exchange them through distributed
//    shared memory. The row's largest key is the largest part's; the largest
//    of the parts' bounds is reached by k tokens of that part, so it bounds
//    the top-k set as well.
// 2. Each block counts (and weighs) the tokens of its part inside that
//    prefix of the sampling order and keeps them, in id order, in its
//    shared memory.
// 3. The first block gathers the candidates of all parts in part order (so
//    in id order) and runs the one-block kernel's selects and draw over that
//    list instead of the row. The kept set, the masses and the draw's
//    cumulative order are those of the row, so the id is the same.
// 4. When the candidates do not fit (no top-k or a large one, flat logits):
//    top-k and top-p run the one-block kernel's radix selects, but each
//    block histograms its own part and every block sums the parts' buckets
//    through distributed shared memory (integer sums, so every block takes
//    the same steps to the same kept set: `ClusterPart`). The draw then goes
//    by the parts' kept masses, then inside the chosen part, by the first
//    block. Top-p over a whole GPT-2 row (no top-k) was the one-block path
//    on one SM before (~0.11 ms a launch).
// ---------------------------------------------------------------------------

#[cfg(feature = "sm90a")]
const CLUSTER: u32 = SAMPLE_CLUSTER;
/// Buckets each block of a cluster sums over the cluster in a radix pass
/// (`ClusterPart::find`): one slice of the buckets per block.
#[cfg(feature = "sm90a")]
const SLICE: u32 = SAMPLE_CLUSTER_SLICE;
#[cfg(feature = "sm90a")]
const _: () = assert!(SLICE * CLUSTER == BUCKETS && SLICE <= THREADS);
/// Rounds of one entry a thread that gather the longest list.
#[cfg(feature = "sm90a")]
const GATHER_ROUNDS: usize = SAMPLE_CLUSTER_LIST_CAP.div_ceil(THREADS) as usize;
#[cfg(feature = "sm90a")]
const _: () = assert!(GATHER_ROUNDS <= UNROLL_MAX);
/// Exchange word: `kmax << 32 | top-k bound` of the block's part.
#[cfg(feature = "sm90a")]
const XCHG_KEYS: usize = 0;
/// Exchange word: how many candidates the block's part holds.
#[cfg(feature = "sm90a")]
const XCHG_COUNT: usize = 1;
/// Exchange word: the candidates' total weight.
#[cfg(feature = "sm90a")]
const XCHG_MASS: usize = 2;
/// Exchange word: the part's argmax, `value bits << 32 | id`.
#[cfg(feature = "sm90a")]
const XCHG_ARGMAX: usize = 3;

#[cfg(feature = "sm90a")]
const _: () = assert!(CLUSTER <= WARP_SIZE && SAMPLE_CLUSTER_EXCHANGE_WORDS as usize > XCHG_ARGMAX);
// The layout `ClusterSmem::get` carves after `Smem`'s.
#[cfg(feature = "sm90a")]
const _: () = assert!(
    sample_cluster_shared_bytes()
        == sample_shared_bytes()
            + SAMPLE_CLUSTER_EXCHANGE_WORDS * 8
            + (SAMPLE_CLUSTER_BLOCK_CAP + SAMPLE_CLUSTER_LIST_CAP) * (size_of::<f32>() + size_of::<u32>()) as u32
            + size_of::<u64>() as u32
            + SAMPLE_CLUSTER_SLICE * (size_of::<u64>() + size_of::<u32>()) as u32
);

/// The cluster kernel's shared memory after [`Smem`]'s.
#[cfg(feature = "sm90a")]
#[derive(Clone, Copy)]
struct ClusterSmem {
    /// `[SAMPLE_CLUSTER_EXCHANGE_WORDS]` what this block publishes (`XCHG_*`).
    xchg: *mut u64,
    /// `[SAMPLE_CLUSTER_BLOCK_CAP]` this part's candidates' logits, in id order.
    own_l: *mut f32,
    /// `[SAMPLE_CLUSTER_BLOCK_CAP]` their ids.
    own_id: *mut u32,
    /// `[SAMPLE_CLUSTER_LIST_CAP]` every part's candidates (first block only).
    list_l: *mut f32,
    /// `[SAMPLE_CLUSTER_LIST_CAP]` their ids.
    list_id: *mut u32,
    /// The measure of this block's slice of a radix pass's buckets, summed
    /// over the cluster (`ClusterPart::find`).
    slice_total: *mut u64,
    /// `[SLICE]` that slice's masses and counts, summed over the cluster.
    slice_masses: *mut u64,
    slice_counts: *mut u32,
}

#[cfg(feature = "sm90a")]
impl ClusterSmem {
    /// # Safety
    /// The launch provides `sample_cluster_shared_bytes()` bytes.
    #[inline(always)]
    unsafe fn get(sm: Smem) -> ClusterSmem {
        // SAFETY: the layout of `sample_cluster_shared_bytes`, after Smem's
        // broadcast words (8-byte aligned, so the u64 words are too).
        unsafe {
            let xchg = sm.bcast.add(SAMPLE_BROADCAST_WORDS as usize);
            let own_l = xchg.add(SAMPLE_CLUSTER_EXCHANGE_WORDS as usize) as *mut f32;
            let own_id = own_l.add(SAMPLE_CLUSTER_BLOCK_CAP as usize) as *mut u32;
            let list_l = own_id.add(SAMPLE_CLUSTER_BLOCK_CAP as usize) as *mut f32;
            let list_id = list_l.add(SAMPLE_CLUSTER_LIST_CAP as usize) as *mut u32;
            // Both caps are even, so this is 8-byte aligned.
            let slice_total = list_id.add(SAMPLE_CLUSTER_LIST_CAP as usize) as *mut u64;
            let slice_masses = slice_total.add(1);
            let slice_counts = slice_masses.add(SLICE as usize) as *mut u32;
            ClusterSmem {
                xchg,
                own_l,
                own_id,
                list_l,
                list_id,
                slice_total,
                slice_masses,
                slice_counts,
            }
        }
    }

    /// In lane `g < CLUSTER` of every warp: block `g`'s exchange word `w`
    /// (0 in the other lanes).
    ///
    /// # Safety
    /// Every block wrote the word before a [`cluster_sync`] this thread has
    /// passed, and none has exited.
    #[inline(always)]
    unsafe fn word(&self, w: usize) -> u64 {
        let g = lane_id();
        if g < CLUSTER {
            // SAFETY: the caller's contract; g is a rank of the cluster.
            unsafe { load_cluster_u64(cluster_shared_addr(self.xchg.add(w), g)) }
        } else {
            0
        }
    }
}

/// The ids `[first, end)` of block `rank`'s part of a row of `v` tokens:
/// parts of whole warps' rounds, the last ones shorter or empty.
#[cfg(feature = "sm90a")]
#[inline(always)]
fn cluster_part(v: u32, rank: u32) -> (u32, u32) {
    // v <= 2^31, so rank * part stays below 2^32.
    let part = v.div_ceil(CLUSTER).next_multiple_of(WARP_SIZE);
    let first = (rank * part).min(v);
    (first, (first + part).min(v))
}

/// Calls `f(j, x[j], j < end)` for the ids of `[first, end)` in rounds of
/// one warp (lane `i` takes `round + i`), loading [`UNROLL`] rounds before
/// using them; every lane of the warp calls `f` for every round, so `f` may
/// use warp votes.
///
/// # Safety
/// `x[first..end)` readable; `first` and `end` are the same in the warp.
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn for_each_round(x: *const f32, first: u32, end: u32, mut f: impl FnMut(u32, f32, bool)) {
    let lane = lane_id();
    let mut base = first;
    while base < end {
        let mut l = [f32::NAN; UNROLL];
        unroll!(u < UNROLL => {
            let j = base + u as u32 * WARP_SIZE + lane;
            if j < end {
                // SAFETY: j < end.
                l[u] = unsafe { *x.add(j as usize) };
            }
        });
        unroll!(u < UNROLL => {
            let round = base + u as u32 * WARP_SIZE;
            if round < end {
                f(round + lane, l[u], round + lane < end);
            }
        });
        // end <= 2^31, so this does not overflow.
        base += UNROLL as u32 * WARP_SIZE;
    }
}

/// This block's part `[first, end)` of a row the cluster shares: each
/// block histograms its part, and a bucket's sums add every block's copy
/// (read through distributed shared memory).
#[cfg(feature = "sm90a")]
struct ClusterPart {
    first: u32,
    end: u32,
    cs: ClusterSmem,
}

#[cfg(feature = "sm90a")]
impl Scope for ClusterPart {
    #[inline(always)]
    unsafe fn each(&self, row: &Row, mut f: impl FnMut(u32, f32)) {
        // SAFETY: the caller's contract; the part's ids are the row's
        // (entries are ids: the row has no id list and starts at 0).
        unsafe {
            for_each(row.x, self.first + thread_idx_x(), self.end, THREADS, |j, l| {
                f(row.id(j), l)
            })
        }
    }

    /// In two steps, so that no block reads every block's every bucket:
    /// block `g` sums slice `g` of the buckets over the cluster (its
    /// [`SLICE`] buckets in each block); then every block finds the slice
    /// holding the goal from the slices' totals, and the bucket inside it
    /// from that slice's sums.
    #[inline(always)]
    unsafe fn find(
        &self,
        sm: Smem,
        measure: Measure,
        base: u64,
        goal: Option<u64>,
        goal_of: &impl Fn(u64) -> Option<u64>,
    ) -> Option<Found> {
        let (tid, lane) = (thread_idx_x(), lane_id());
        let cs = self.cs;
        let mass = measure == Measure::Mass;
        let measured = |count: u32, m: u64| if mass { m } else { count as u64 };
        // Every block's buckets are complete.
        cluster_sync();
        let (mut count, mut m) = (0u32, 0u64);
        if tid < SLICE {
            let b = (cluster_ctarank() * SLICE + tid) as usize;
            for g in 0..CLUSTER {
                // SAFETY: b < BUCKETS; every block wrote its buckets before
                // the barrier and clears them only after the next one.
                unsafe {
                    count += load_cluster_u32(cluster_shared_addr(sm.counts.add(b), g));
                    if mass {
                        m += load_cluster_u64(cluster_shared_addr(sm.masses.add(b), g));
                    }
                }
            }
            // SAFETY: tid < SLICE entries of this block's slice sums.
            unsafe {
                *cs.slice_counts.add(tid as usize) = count;
                *cs.slice_masses.add(tid as usize) = m;
            }
        }
        // SAFETY: every thread is here.
        let (_, slice_total) = unsafe { block_scan_u64(measured(count, m), sm.scratch) };
        if tid == 0 {
            // SAFETY: this block's word.
            unsafe { *cs.slice_total = slice_total };
        }
        // Every slice is summed (and no block reads another's buckets past
        // here, so they may be cleared after return).
        cluster_sync();
        let t = if lane < CLUSTER {
            // SAFETY: block `lane`'s word, written before the barrier; it is
            // written again only after the next pass's first barrier.
            unsafe { load_cluster_u64(cluster_shared_addr(cs.slice_total, lane)) }
        } else {
            0
        };
        let mut total = 0u64;
        for g in 0..CLUSTER {
            total += shfl_idx_u64(t, g);
        }
        let g = match goal {
            Some(g) => g,
            None => goal_of(total)?,
        };
        // The first slice whose running measure reaches the goal (the goal
        // is at most base + total; stay in range regardless).
        let (mut pick, mut acc) = (CLUSTER - 1, base);
        for k in 0..CLUSTER {
            let tk = shfl_idx_u64(t, k);
            if acc + tk >= g {
                pick = k;
                break;
            }
            acc += tk;
        }
        let (mut count, mut m) = (0u32, 0u64);
        if tid < SLICE {
            // SAFETY: block `pick`'s slice sums, written before the barrier
            // and again only after the next pass's first barrier.
            unsafe {
                count = load_cluster_u32(cluster_shared_addr(cs.slice_counts.add(tid as usize), pick));
                if mass {
                    m = load_cluster_u64(cluster_shared_addr(cs.slice_masses.add(tid as usize), pick));
                }
            }
        }
        let v = measured(count, m);
        // SAFETY: every thread is here.
        let (before, _) = unsafe { block_scan_u64(v, sm.scratch) };
        let below = acc + before;
        if below < g && below + v >= g {
            // SAFETY: one thread.
            unsafe { Found::announce(sm, pick * SLICE + tid, below, count as u64, m) };
        }
        // SAFETY: every thread is here; one announced the bucket.
        Some(unsafe { Found::take(sm, g) })
    }
}

/// Greedy over the cluster: each block's part's argmax, then the first
/// block's pick among them (parts in id order, so ties still go to the
/// lowest id). The id is meaningful in the first block.
///
/// # Safety
/// Every thread of every block of the cluster calls it; the row's `v` logits
/// readable; `sm`, `cs` as in their `get`.
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn greedy_cluster(x: *const f32, v: u32, rank: u32, sm: Smem, cs: ClusterSmem) -> u32 {
    let (first, end) = cluster_part(v, rank);
    // SAFETY: the caller's contract.
    let (bv, bi) = unsafe { argmax_part(x, first, end, sm) };
    if thread_idx_x() == 0 {
        // SAFETY: an exchange word of this block.
        unsafe { *cs.xchg.add(XCHG_ARGMAX) = (bv.to_bits() as u64) << 32 | bi as u64 };
    }
    cluster_sync();
    let mut id = 0;
    if rank == 0 && thread_idx_x() == 0 {
        let (mut bv, mut bi) = (f32::NEG_INFINITY, NONE);
        for g in 0..CLUSTER {
            // SAFETY: written by block g before the barrier; no block exits
            // before the barrier below.
            let w = unsafe { load_cluster_u64(cluster_shared_addr(cs.xchg.add(XCHG_ARGMAX), g)) };
            let (v2, i2) = (f32::from_bits((w >> 32) as u32), w as u32);
            if better(v2, i2, bv, bi) {
                (bv, bi) = (v2, i2);
            }
        }
        id = if bi == NONE { 0 } else { bi };
    }
    // Every block's words stay until the first block has read them.
    cluster_sync();
    id
}

/// A sampled row over the cluster (see the section's comment). The id is
/// meaningful in the first block.
///
/// # Safety
/// As for [`greedy_cluster`].
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn sampled_cluster(
    x: *const f32,
    v: u32,
    rank: u32,
    cfg: &SampleRow,
    random: u64,
    sm: Smem,
    cs: ClusterSmem,
) -> u32 {
    let (tid, lane, warp) = (thread_idx_x(), lane_id(), warp_id());
    let (first, end) = cluster_part(v, rank);
    let s = temperature_scale(cfg.temperature);

    // 1. The part's largest key and top-k bound, exchanged.
    let mut mine = 0u32;
    // SAFETY: ids of the part are below v.
    unsafe { for_each(x, first + tid, end, THREADS, |_, l| mine = mine.max(logit_key(l))) };
    // SAFETY: every thread is here.
    let kpart = unsafe { block_max_u32(mine, sm.scratch) };
    let mut bound = 0u32;
    if cfg.top_k > 0 && cfg.top_k <= THREADS && kpart != 0 {
        // As in `sampled`, within the part: k of its tokens reach the key
        // `kpart - d` (or it is the part's own near bound, which is no
        // higher than the row's).
        let near = logit_key(near_bound(key_logit(kpart), s)).min(kpart);
        bound = kpart - max_rank_of_kth(mine, kpart, kpart - near, cfg.top_k);
    }
    if tid == 0 {
        // SAFETY: an exchange word of this block.
        unsafe { *cs.xchg.add(XCHG_KEYS) = (kpart as u64) << 32 | bound as u64 };
    }
    cluster_sync();
    // SAFETY: every block wrote its word before the barrier.
    let w = unsafe { cs.word(XCHG_KEYS) };
    let kmax = warp_reduce_max_u32((w >> 32) as u32);
    let bound = warp_reduce_max_u32(w as u32);
    if kmax == 0 {
        // Every logit is NaN (every block sees it); the words stay until
        // everyone has read them.
        cluster_sync();
        return 0;
    }
    let m = key_logit(kmax);
    let row = Row::part(x, 0, v, kmax, m, s);
    // The prefix of the order every kept token lies in.
    let low = logit_key(near_bound(m, s)).min(kmax).max(bound);
    let limit = Row::order(kmax - low, u32::MAX);
    let cut = row.floor(kmax - low);
    // Token j is inside a prefix `lim` of the order (`l >= cut` rejects NaN).
    // `&`, not `&&`: no branch, so the warp stays converged for the ballots
    // that count these tokens.
    let within = |j: u32, l: f32, lim: u64| (l >= cut) & (Row::order(row.rank(l), j) <= lim);

    // 2. This part's candidates: count and mass (warp by warp over
    // contiguous ranges, so ballots keep id order), then kept in order.
    let span = (end - first).div_ceil(WARPS).next_multiple_of(WARP_SIZE);
    let wfirst = (first + warp * span).min(end);
    let wend = (wfirst + span).min(end);
    let (mut count, mut mass) = (0u32, 0u64);
    // SAFETY: ids below wend <= v.
    unsafe {
        for_each_round(x, wfirst, wend, |j, l, valid| {
            let keep = valid && within(j, l, limit);
            count += ballot(keep).count_ones();
            if keep {
                mass += sample_weight(l, m, s);
            }
        })
    };
    let mass = warp_sum_u64(mass);
    // SAFETY: every thread is here (count is the warp's, the same in every lane).
    let (before, total) = unsafe { block_scan_u64(if lane == 0 { count as u64 } else { 0 }, sm.scratch) };
    let mut at = shfl_idx_u64(before, 0) as u32;
    // SAFETY: as above.
    let (_, part_mass) = unsafe { block_scan_u64(if lane == 0 { mass } else { 0 }, sm.scratch) };
    if total <= SAMPLE_CLUSTER_BLOCK_CAP as u64 {
        let below = (1u32 << lane) - 1;
        // SAFETY: as above; positions stay below the part's count, at most the cap.
        unsafe {
            for_each_round(x, wfirst, wend, |j, l, valid| {
                let keep = valid && within(j, l, limit);
                let votes = ballot(keep);
                if keep {
                    let pos = (at + (votes & below).count_ones()) as usize;
                    *cs.own_l.add(pos) = l;
                    *cs.own_id.add(pos) = j;
                }
                at += votes.count_ones();
            })
        };
    }
    if tid == 0 {
        // SAFETY: exchange words of this block.
        unsafe {
            *cs.xchg.add(XCHG_COUNT) = total;
            *cs.xchg.add(XCHG_MASS) = part_mass;
        }
    }
    cluster_sync();

    // 3. Every thread learns the parts' counts; the first block gathers the
    // candidates when they fit.
    // SAFETY: written by every block before the barrier.
    let counts = unsafe { cs.word(XCHG_COUNT) };
    let (mut all, mut fits) = (0u64, true);
    for g in 0..CLUSTER {
        let c = shfl_idx_u64(counts, g);
        fits &= c <= SAMPLE_CLUSTER_BLOCK_CAP as u64;
        all += c;
    }
    let list = fits && all <= SAMPLE_CLUSTER_LIST_CAP as u64;
    if rank == 0 && list {
        // Entry i of the list is entry i - starts[g] of part g, the last
        // part starting at or below i (an empty part starts where the next
        // one does, so it is never the last).
        let mut starts = [0u32; CLUSTER as usize];
        let mut off = 0u32;
        for (g, start) in starts.iter_mut().enumerate() {
            *start = off;
            off += shfl_idx_u64(counts, g as u32) as u32;
        }
        let mut got = [(0u32, 0u32); GATHER_ROUNDS];
        // Every load issued before any store: one round trip through
        // distributed shared memory, not one a part.
        unroll!(r < GATHER_ROUNDS => {
            let i = tid + r as u32 * THREADS;
            if (i as u64) < all {
                let (mut g, mut first) = (0u32, 0u32);
                for (h, &start) in starts.iter().enumerate() {
                    if start <= i {
                        (g, first) = (h as u32, start);
                    }
                }
                let j = i - first;
                // SAFETY: entry j < count of block g's own list, written
                // before the barrier; no block exits before the next one.
                got[r] = unsafe {
                    (
                        load_cluster_u32(cluster_shared_addr(cs.own_l, g) + 4 * j),
                        load_cluster_u32(cluster_shared_addr(cs.own_id, g) + 4 * j),
                    )
                };
            }
        });
        unroll!(r < GATHER_ROUNDS => {
            let i = tid + r as u32 * THREADS;
            if (i as u64) < all {
                // SAFETY: i < all <= LIST_CAP entries of the gathered list.
                unsafe {
                    *cs.list_l.add(i as usize) = f32::from_bits(got[r].0);
                    *cs.list_id.add(i as usize) = got[r].1;
                }
            }
        });
    }
    if list {
        // No block exits while the first one reads its shared memory. The
        // first block used every value it read (stored it), so the barrier
        // need not order memory; a block barrier orders the gathered list
        // for the first block's threads.
        cluster_sync_relaxed();
        if rank != 0 {
            return 0;
        }
        sync_threads();
        let gathered = Row {
            x: cs.list_l,
            v: all as u32,
            ids: cs.list_id,
            id0: 0,
            kmax,
            m,
            s,
        };
        // SAFETY: the first block alone, every thread; the list's entries
        // are the row's tokens inside `limit`, in id order.
        return unsafe {
            if all <= THREADS as u64 {
                choose_small(&gathered, sm, limit, cfg, random)
            } else {
                keep_and_draw(&gathered, sm, limit, cfg, random)
            }
        };
    }
    // Not gathered: the parts' masses too (read only here, so that in the
    // list path every value read from another block is used before the
    // relaxed barrier); no block exits or rewrites its words while another
    // may still read them.
    // SAFETY: written by every block before the barrier after step 2.
    let masses = unsafe { cs.word(XCHG_MASS) };
    cluster_sync();
    // 4. Too many candidates to gather: top-k and top-p as radix selects
    // whose histograms every block sums over the cluster (each block takes
    // the same steps to the same limit), then the draw by parts.
    let scope = ClusterPart { first, end, cs };
    let mut kept = limit;
    // Whether a select ran (its last barrier leaves slice sums to read).
    let mut selected = false;
    if cfg.top_k > 0 {
        selected = true;
        let k = cfg.top_k as u64;
        // SAFETY: every thread of the cluster is here.
        kept = unsafe { select(&row, sm, &scope, kept, Measure::Count, |total| (k < total).then_some(k)) };
    }
    if top_p_active(cfg) {
        selected = true;
        let top_p = cfg.top_p;
        // SAFETY: as above.
        kept = unsafe {
            select(&row, sm, &scope, kept, Measure::Mass, |total| {
                Some(top_p_target(top_p, total))
            })
        };
    }
    let masses = if kept == limit {
        if selected {
            // No block exits while another may still read its slice sums.
            cluster_sync();
        }
        masses
    } else {
        // The parts' kept masses, exchanged again (every block read the
        // last ones before the barriers of the selects).
        let mut mass = 0u64;
        // SAFETY: ids of the part are below v.
        unsafe {
            for_each(x, first + tid, end, THREADS, |j, l| {
                mass += if within(j, l, kept) { sample_weight(l, m, s) } else { 0 }
            })
        };
        // SAFETY: every thread is here.
        let (_, part_mass) = unsafe { block_scan_u64(mass, sm.scratch) };
        if tid == 0 {
            // SAFETY: an exchange word of this block.
            unsafe { *cs.xchg.add(XCHG_MASS) = part_mass };
        }
        cluster_sync();
        // SAFETY: written by every block before the barrier.
        let masses = unsafe { cs.word(XCHG_MASS) };
        // No block exits while another reads its word.
        cluster_sync();
        masses
    };
    if rank != 0 {
        return 0;
    }
    // The draw's target falls in the first part whose running kept mass
    // passes it (parts are in id order), then inside that part.
    let mut total = 0u64;
    for g in 0..CLUSTER {
        total += shfl_idx_u64(masses, g);
    }
    let mut goal = draw_target(random, total);
    // goal < total, so a part is found; stay in range regardless.
    let mut pick = CLUSTER - 1;
    for g in 0..CLUSTER {
        let mg = shfl_idx_u64(masses, g);
        if goal < mg {
            pick = g;
            break;
        }
        goal -= mg;
    }
    let (pf, pe) = cluster_part(v, pick);
    // SAFETY: ids pf..pe of the row.
    let part = Row::part(unsafe { x.add(pf as usize) }, pf, pe - pf, kmax, m, s);
    // SAFETY: the first block alone, every thread; goal is below the
    // part's kept mass.
    unsafe {
        search(
            &part,
            sm,
            |j, l| if within(j, l, kept) { sample_weight(l, m, s) } else { 0 },
            |_| goal,
        )
    }
}

/// [`keep_and_draw`] over a list of at most `THREADS` tokens (in id order,
/// every token top-k may keep among them), one a thread: top-k is a
/// bitwise search for the k-th rank with counting barriers (tokens tied
/// there cut by id, i.e. list order), top-p counts each kept token's place
/// among the kept ones, and the draw is a block scan. The same kept set and
/// the same cumulative masses as the selects', so the same id.
///
/// # Safety
/// As for [`greedy`]; `row.v <= THREADS`, at least 1; every entry's order
/// is at most `limit`.
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn choose_small(row: &Row, sm: Smem, limit: u64, cfg: &SampleRow, random: u64) -> u32 {
    let tid = thread_idx_x();
    let n = row.v;
    let mine = tid < n;
    let (l, id) = if mine {
        // SAFETY: entry tid < v.
        (unsafe { *row.x.add(tid as usize) }, row.id(tid))
    } else {
        (f32::NAN, NONE)
    };
    // NaN is never in the list (it fails `>= cut`), so every entry ranks;
    // NAN_RANK (past every real rank) keeps the other threads out.
    let rank = if mine { row.rank(l) } else { NAN_RANK };
    let w = if mine { sample_weight(l, row.m, row.s) } else { 0 };
    let mut keep = mine;
    if cfg.top_k > 0 && cfg.top_k < n {
        let k = cfg.top_k;
        // At least k entries rank at most d, fewer than k below it; every
        // rank is at most the limit's, and n > k, so d is found.
        let d = kth_rank(rank, (limit >> 32) as u32, k);
        keep = rank <= d;
        if sync_threads_count(keep) > k {
            // Tied at d past the k-th: the first ones by id stay.
            let below = sync_threads_count(rank < d);
            let tied = rank == d;
            // SAFETY: every thread is here.
            let (before, _) = unsafe { block_scan_u64(tied as u64, sm.scratch) };
            keep = rank < d || (tied && below as u64 + before < k as u64);
        }
    }
    if top_p_active(cfg) {
        // The kept entries' orders, compacted in list order, for the kept
        // ones to count against (the buckets are free here).
        // SAFETY: every thread is here.
        let (at, kept) = unsafe { block_scan_u64(keep as u64, sm.scratch) };
        let order = Row::order(rank, id);
        if keep {
            // SAFETY: at < kept <= v <= THREADS <= BUCKETS words.
            unsafe { *sm.masses.add(at as usize) = order };
        }
        sync_threads();
        // Place among the kept entries in the sampling order (orders are
        // distinct: ids are). The kept set is a prefix of that order, so
        // this is the place among all entries too.
        let mut place = 0u32;
        if keep {
            for j in 0..kept as usize {
                // SAFETY: written before the barrier, j < kept.
                place += (unsafe { *sm.masses.add(j) } < order) as u32;
            }
        }
        // Everyone has counted before the orders are overwritten.
        sync_threads();
        if keep {
            // The kept weights by place; places are 0..kept, each once.
            // SAFETY: place < kept <= BUCKETS words.
            unsafe { *sm.masses.add(place as usize) = w };
        }
        sync_threads();
        let at = if (tid as u64) < kept {
            // SAFETY: written before the barrier (tid < kept).
            unsafe { *sm.masses.add(tid as usize) }
        } else {
            0
        };
        // SAFETY: every thread is here.
        let (before, total) = unsafe { block_scan_u64(at, sm.scratch) };
        // The shortest prefix reaching the target ends at the one place
        // where the running mass first reaches it (the first token alone
        // weighs WEIGHT_ONE >= 1, and the target is at most the total).
        let goal = top_p_target(cfg.top_p, total);
        if before < goal && before + at >= goal {
            // SAFETY: a broadcast word, read after the barrier; one thread.
            unsafe { *sm.bcast = tid as u64 };
        }
        sync_threads();
        // SAFETY: written before the barrier.
        let last = unsafe { *sm.bcast } as u32;
        keep &= place <= last;
        // Everyone has read the broadcast word before it is written again.
        sync_threads();
    }
    // The draw, in id order (the list's order).
    let kept = if keep { w } else { 0 };
    if tid == 0 {
        // Replaced below by the one token whose interval holds the target.
        // SAFETY: a broadcast word, read after the barriers below.
        unsafe { *sm.bcast = row.id(0) as u64 };
    }
    // SAFETY: every thread is here.
    let (before, total) = unsafe { block_scan_u64(kept, sm.scratch) };
    let t = draw_target(random, total);
    if kept > 0 && before <= t && t - before < kept {
        // SAFETY: one thread (the intervals are disjoint).
        unsafe { *sm.bcast = id as u64 };
    }
    sync_threads();
    // SAFETY: written before the barrier.
    let chosen = unsafe { *sm.bcast } as u32;
    sync_threads();
    chosen
}

/// Sampling with a cluster of [`SAMPLE_CLUSTER`] blocks per row (see the
/// section's comment); the same ids as [`sample_forward`].
///
/// Launch: grid `(SAMPLE_CLUSTER, n, 1)` in clusters of `(SAMPLE_CLUSTER, 1,
/// 1)`, `SAMPLE_BLOCK` threads, `sample_cluster_shared_bytes()` bytes of
/// dynamic shared memory.
///
/// # Safety
/// As for [`sample_forward`]; launch as above.
#[cfg(feature = "sm90a")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn sample_forward_cluster(p: SampleParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // A cluster spans x only: all its blocks take the same row.
    let row = block_idx_y();
    if row >= p.n {
        return;
    }
    let rank = cluster_ctarank();
    // SAFETY: row < n; the row's v logits are readable.
    let x = unsafe { p.logits.add(row as usize * p.row_stride as usize) };
    // SAFETY: rows holds n settings.
    let cfg = unsafe { *p.rows.add(row as usize) };
    // SAFETY: the launch provides the shared memory.
    let (sm, cs) = unsafe {
        let sm = Smem::get();
        (sm, ClusterSmem::get(sm))
    };
    let id = if is_greedy(&cfg) {
        // SAFETY: every thread of the cluster is here.
        unsafe { greedy_cluster(x, p.v, rank, sm, cs) }
    } else {
        // SAFETY: row < n.
        let random = unsafe { draw_bits(&p, row, &cfg) };
        // SAFETY: every thread of the cluster is here.
        unsafe { sampled_cluster(x, p.v, rank, &cfg, random, sm, cs) }
    };
    if rank == 0 && thread_idx_x() == 0 {
        // SAFETY: row < n.
        unsafe { write_id(&p, row, id) };
    }
}
