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
#[derive(Clone, Copy)]
struct Row {
    /// The row's logits (`v` readable).
    x: *const f32,
    v: u32,
    /// Largest key of the row (not 0: the row has a non-NaN logit).
    kmax: u32,
    /// The largest logit, `key_logit(kmax)`.
    m: f32,
    /// `temperature_scale(T)`.
    s: f32,
}

impl Row {
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
    unsafe fn each(&self, f: impl FnMut(u32, f32)) {
        // SAFETY: the caller's contract.
        unsafe { for_each(self.x, thread_idx_x(), self.v, THREADS, f) }
    }
}

/// Greedy: the argmax, ties to the lowest id, NaN never wins; 0 for an
/// all-NaN row.
///
/// # Safety
/// `x[0..v)` readable; every thread calls it; `sm` as in [`Smem::get`].
#[inline(always)]
unsafe fn greedy(x: *const f32, v: u32, sm: Smem) -> u32 {
    let (mut bv, mut bi) = (f32::NEG_INFINITY, NONE);
    // SAFETY: the caller's contract.
    unsafe {
        for_each(x, thread_idx_x(), v, THREADS, |j, l| {
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
    if bi == NONE { 0 } else { bi }
}

/// The smallest id `J` of the row with `sum_{j <= J} f(j, x[j]) > goal`,
/// where `goal = goal_of(total)` and `total` is the sum over the whole row
/// (`goal < total` is the caller's promise).
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
                f(j, unsafe { *row.x.add(j as usize) })
            } else {
                0
            };
            if tid == 0 {
                // Never kept when `goal < total` holds; an in-range answer otherwise.
                // SAFETY: a broadcast word; read after the barriers below.
                unsafe { *sm.bcast = lo as u64 };
            }
            // SAFETY: every thread is here.
            let (before, total) = unsafe { block_scan_u64(w, sm.scratch) };
            let g = goal.unwrap_or_else(|| goal_of(total));
            if w > 0 && before <= g && g - before < w {
                // SAFETY: one thread at most (the intervals are disjoint).
                unsafe { *sm.bcast = j as u64 };
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
        unsafe { for_each(row.x, start + lane, stop, WARP_SIZE, |j, l| acc += f(j, l)) };
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
/// # Safety
/// As for [`greedy`]; `goal_of` is the same function in every thread.
#[inline(always)]
// `!(l >= cut)` is meant: a NaN logit fails `>=` and is skipped, as NaN is
// in no kept set; `l < cut` would let it through.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
unsafe fn select(row: &Row, sm: Smem, limit: u64, measure: Measure, goal_of: impl Fn(u64) -> Option<u64>) -> u64 {
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
            row.each(|j, l| {
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
        sync_threads();
        // Thread t owns buckets [t * BUCKETS_PER_THREAD, +BUCKETS_PER_THREAD).
        let first = tid as usize * BUCKETS_PER_THREAD;
        let mut vals = [0u64; BUCKETS_PER_THREAD];
        let mut local = 0u64;
        unroll!(i < BUCKETS_PER_THREAD => {
            // SAFETY: first + i < BUCKETS.
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
            None => match goal_of(total) {
                Some(g) => g,
                None => return limit,
            },
        };
        goal = Some(g);
        // The bucket where base + (measure so far) first reaches g; the goal
        // is at most base + total, so exactly one thread finds it.
        let mut acc = base + before;
        unroll!(i < BUCKETS_PER_THREAD => {
            let below = acc;
            acc += vals[i];
            if below < g && acc >= g {
                let bucket = first + i;
                // SAFETY: broadcast words, read after the barrier.
                unsafe {
                    *sm.bcast = bucket as u64;
                    *sm.bcast.add(1) = below;
                    *sm.bcast.add(2) = *sm.counts.add(bucket) as u64;
                    *sm.bcast.add(3) = *sm.masses.add(bucket);
                }
            }
        });
        sync_threads();
        // SAFETY: written before the barrier by the one thread that found it.
        let (bucket, below, count, mass) =
            unsafe { (*sm.bcast as u32, *sm.bcast.add(1), *sm.bcast.add(2), *sm.bcast.add(3)) };
        // Everyone has read the broadcast before anyone can write it again.
        sync_threads();
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
/// such `d` exists: a bitwise search, one counting barrier per bit of
/// `rmax`. Every thread calls it and gets the same answer.
#[inline(always)]
fn max_rank_of_kth(mine: u32, kmax: u32, rmax: u32, k: u32) -> u32 {
    // Threads without a key (0) never count: their rank is past any rmax.
    let rank = if mine == 0 { u32::MAX } else { kmax - mine };
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
// `!(l >= cut)` is meant: a NaN logit fails `>=` and is skipped (NaN is in
// no kept set); `l < cut` would count it.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
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
    let row = Row { x, v, kmax, m, s };
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
    if cfg.top_k > 0 {
        let k = cfg.top_k as u64;
        // SAFETY: as for this function.
        limit = unsafe { select(&row, sm, limit, Measure::Count, |total| (k < total).then_some(k)) };
    }
    if top_p_active(cfg) {
        let top_p = cfg.top_p;
        // SAFETY: as for this function.
        limit = unsafe { select(&row, sm, limit, Measure::Mass, |total| Some(top_p_target(top_p, total))) };
    }
    let cut = row.floor((limit >> 32) as u32);
    // SAFETY: as for this function; the kept mass is at least WEIGHT_ONE
    // (the most likely token is always kept), so the goal is below it.
    unsafe {
        search(
            &row,
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
        let random = row_random(cfg.seed, counter, stream);
        // SAFETY: as above.
        unsafe { sampled(x, p.v, &cfg, random, sm) }
    };
    if thread_idx_x() == 0 {
        // SAFETY: out (and next_tokens where not null) hold n ids.
        unsafe {
            *p.out.add(row as usize) = id;
            if !p.next_tokens.is_null() {
                *p.next_tokens.add(row as usize) = id;
            }
        }
    }
}
