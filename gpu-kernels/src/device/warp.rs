//! Warp shuffles and warp/block reductions.
//!
//! All functions assume every lane of the warp calls them together (full
//! mask), which is how the kernels of this crate use them.
//!
//! The shuffles are inline PTX marked `nomem` (they touch registers only,
//! so loads may move across them) but not `pure`: LLVM must neither
//! speculate, merge nor drop them, since what a lane receives depends on the
//! other lanes. rustc does not mark inline asm `convergent` the way clang
//! does for CUDA, so LLVM could in principle tail-duplicate a shuffle into
//! divergent branches; the PTX ISA requires all lanes to execute the same
//! `shfl.sync` only for sm_6x and below, and this crate targets sm_80+.
//! Lane and delta arguments count modulo 32 (only their low 5 bits are read).

use super::{FULL_MASK, WARP_SIZE};
use core::arch::asm;

/// `__shfl_xor_sync(FULL_MASK, v, lane_mask)`: the value of lane `lane ^ lane_mask`.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r: f32;
    // SAFETY: a register-only warp instruction; all lanes participate.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) lane_mask, full = in(reg32) FULL_MASK,
             options(nomem, nostack))
    }
    r
}

/// `__shfl_down_sync(FULL_MASK, v, delta)`: the value of lane `lane + delta`
/// (lanes past the end keep their own value).
#[inline(always)]
pub fn shfl_down_f32(v: f32, delta: u32) -> f32 {
    let r: f32;
    // SAFETY: as above.
    unsafe {
        asm!("shfl.sync.down.b32 {r}, {v}, {d}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, d = in(reg32) delta, full = in(reg32) FULL_MASK,
             options(nomem, nostack))
    }
    r
}

/// `__shfl_sync(FULL_MASK, v, src_lane)`: the value of lane `src_lane` (taken modulo 32).
#[inline(always)]
pub fn shfl_idx_f32(v: f32, src_lane: u32) -> f32 {
    let r: f32;
    // SAFETY: as above.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src_lane, full = in(reg32) FULL_MASK,
             options(nomem, nostack))
    }
    r
}

/// [`shfl_xor_f32`] for 32-bit integers.
#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    f32::to_bits(shfl_xor_f32(f32::from_bits(v), lane_mask))
}

/// [`shfl_down_f32`] for 32-bit integers.
#[inline(always)]
pub fn shfl_down_u32(v: u32, delta: u32) -> u32 {
    f32::to_bits(shfl_down_f32(f32::from_bits(v), delta))
}

/// [`shfl_idx_f32`] for 32-bit integers.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src_lane: u32) -> u32 {
    f32::to_bits(shfl_idx_f32(f32::from_bits(v), src_lane))
}

/// [`shfl_xor_f32`] for signed 32-bit integers.
#[inline(always)]
pub fn shfl_xor_i32(v: i32, lane_mask: u32) -> i32 {
    shfl_xor_u32(v as u32, lane_mask) as i32
}

/// [`shfl_down_f32`] for signed 32-bit integers.
#[inline(always)]
pub fn shfl_down_i32(v: i32, delta: u32) -> i32 {
    shfl_down_u32(v as u32, delta) as i32
}

/// [`shfl_idx_f32`] for signed 32-bit integers.
#[inline(always)]
pub fn shfl_idx_i32(v: i32, src_lane: u32) -> i32 {
    shfl_idx_u32(v as u32, src_lane) as i32
}

/// Butterfly all-reduce: after log2(32) exchange rounds every lane holds
/// `op` folded over the warp. `op` must be associative and commutative for
/// all lanes to agree.
#[inline(always)]
fn warp_all_reduce<T: Copy>(mut v: T, shfl_xor: impl Fn(T, u32) -> T, op: impl Fn(T, T) -> T) -> T {
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        v = op(v, shfl_xor(v, m));
        m /= 2;
    }
    v
}

/// Sum over the warp; every lane gets the same result (butterfly
/// reduction, so the rounding is that of a pairwise sum).
#[inline(always)]
pub fn warp_reduce_sum(v: f32) -> f32 {
    warp_all_reduce(v, shfl_xor_f32, |a, b| a + b)
}

/// `R` warp sums at once (`R` a power of two up to 32): lane `r < R` gets
/// `Σ_lanes v[r]`; other lanes get one of the sums.
///
/// `R` separate [`warp_reduce_sum`]s cost `5 R` shuffles. Here each
/// butterfly step halves the values a lane carries: a lane keeps the half
/// its lane bit selects and sends the other half to its partner, so
/// 8 sums cost 4 + 2 + 1 shuffles, then 2 for the lanes left, then one to
/// move each sum to its lane: 10 instead of 40. The rounding is that of a
/// pairwise sum over the lanes, in another order than `warp_reduce_sum`'s.
#[inline(always)]
pub fn warp_reduce_sum_many<const R: usize>(v: [f32; R]) -> f32 {
    /// Butterfly levels of a warp (log2 of 32).
    const LEVELS: usize = 5;
    const { assert!(R.is_power_of_two() && R <= 32 && 1 << LEVELS == super::WARP_SIZE) };
    let lane = super::lane_id();
    let mut vals = v;
    // Written out level by level and value by value (constant indices): as
    // loops, 32 values left the array in local memory.
    super::unroll!(level < LEVELS => {
        let half = R >> (level + 1);
        if half > 0 {
            let offset = (super::WARP_SIZE / 2) >> level;
            let upper = lane & offset != 0;
            super::unroll!(i < 16 => {
                if i < half {
                    let (keep, send) = if upper {
                        (vals[i + half], vals[i])
                    } else {
                        (vals[i], vals[i + half])
                    };
                    vals[i] = keep + shfl_xor_f32(send, offset);
                }
            });
        }
    });
    let mut offset = (super::WARP_SIZE / 2) >> R.trailing_zeros();
    // The lanes that differ only in the bits below `offset` hold parts of
    // the same sum.
    while offset > 0 {
        vals[0] += shfl_xor_f32(vals[0], offset);
        offset /= 2;
    }
    // Sum r sits on the lanes whose selecting bits spell r: bit `R/2^(k+1)`
    // of r is lane bit `16 >> k`.
    let r = lane as usize % R;
    let (mut src, mut half, mut bit) = (0u32, R / 2, super::WARP_SIZE / 2);
    while half > 0 {
        if r & half != 0 {
            src |= bit;
        }
        half /= 2;
        bit /= 2;
    }
    shfl_idx_f32(vals[0], src)
}

/// Maximum over the warp; every lane gets the result. NaN lanes are ignored
/// (`max.f32` semantics) unless every lane is NaN.
#[inline(always)]
pub fn warp_reduce_max(v: f32) -> f32 {
    warp_all_reduce(v, shfl_xor_f32, f32::max)
}

/// Minimum over the warp; every lane gets the result. NaN as in [`warp_reduce_max`].
#[inline(always)]
pub fn warp_reduce_min(v: f32) -> f32 {
    warp_all_reduce(v, shfl_xor_f32, f32::min)
}

/// Wrapping sum of `u32`s over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_reduce_sum_u32(v: u32) -> u32 {
    warp_all_reduce(v, shfl_xor_u32, u32::wrapping_add)
}

/// Maximum of `u32`s over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_reduce_max_u32(v: u32) -> u32 {
    warp_all_reduce(v, shfl_xor_u32, u32::max)
}

/// `(max value, its index)` over the warp; every lane gets the result. Ties
/// go to the smallest index, matching a first-wins CPU argmax (-0 and +0
/// tie). Values must not be NaN (lanes could then disagree).
#[inline(always)]
pub fn warp_reduce_argmax(v: f32, idx: u32) -> (f32, u32) {
    warp_all_reduce(
        (v, idx),
        |(v, i), m| (shfl_xor_f32(v, m), shfl_xor_u32(i, m)),
        |(v, i), (ov, oi)| {
            if ov > v || (ov == v && oi < i) {
                (ov, oi)
            } else {
                (v, i)
            }
        },
    )
}

/// Sum over a 1-D block; every thread gets the result.
///
/// # Safety
/// `scratch` points to at least [`BLOCK_REDUCE_SCRATCH`] `f32`s of shared
/// memory that no other code uses during the call (it may be reused right
/// after: the call ends with a barrier); the block size is a multiple of 32
/// and at most 1024; every thread of the block calls this (it contains barriers).
#[inline(always)]
pub unsafe fn block_reduce_sum(v: f32, scratch: *mut f32) -> f32 {
    // SAFETY: the caller's contract is `block_reduce`'s (scratch size, block shape,
    // every thread calls), passed on unchanged.
    unsafe { block_reduce(v, scratch, warp_reduce_sum, 0.0) }
}

/// Maximum over a 1-D block; every thread gets the result.
///
/// # Safety
/// As for [`block_reduce_sum`].
#[inline(always)]
pub unsafe fn block_reduce_max(v: f32, scratch: *mut f32) -> f32 {
    // SAFETY: as in `block_reduce_sum`: the caller's contract is `block_reduce`'s.
    unsafe { block_reduce(v, scratch, warp_reduce_max, f32::NEG_INFINITY) }
}

/// Minimum over a 1-D block; every thread gets the result.
///
/// # Safety
/// As for [`block_reduce_sum`].
#[inline(always)]
pub unsafe fn block_reduce_min(v: f32, scratch: *mut f32) -> f32 {
    // SAFETY: as in `block_reduce_sum`: the caller's contract is `block_reduce`'s.
    unsafe { block_reduce(v, scratch, warp_reduce_min, f32::INFINITY) }
}

/// `f32`s of shared scratch a block reduction needs: one per warp of the
/// largest block (1024 threads).
pub const BLOCK_REDUCE_SCRATCH: usize = 32;

/// A block-wide all-reduce from a warp all-reduce: each warp reduces, warp
/// results meet in `scratch`, and every warp reduces those again (so no
/// second broadcast through shared memory is needed). `identity` pads the
/// slots of warps the block does not have.
///
/// # Safety
/// As for [`block_reduce_sum`].
#[inline(always)]
pub unsafe fn block_reduce(v: f32, scratch: *mut f32, warp_op: impl Fn(f32) -> f32, identity: f32) -> f32 {
    let lane = super::lane_id();
    let warp = super::warp_id();
    let warps = super::block_dim_x() / WARP_SIZE;
    let w = warp_op(v);
    // SAFETY: the caller guarantees BLOCK_REDUCE_SCRATCH floats
    // of scratch; warp < 32 because the block has at most 1024 threads.
    unsafe {
        if lane == 0 {
            *scratch.add(warp as usize) = w;
        }
        super::sync_threads();
        let x = if lane < warps {
            *scratch.add(lane as usize)
        } else {
            identity
        };
        let r = warp_op(x);
        // The scratch may be reused right after return: wait until all have read it.
        super::sync_threads();
        r
    }
}

/// `__ballot_sync(FULL_MASK, pred)`: bit `i` is lane `i`'s `pred`. Every
/// lane of the warp must call it.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let b: u32;
    // SAFETY: a warp vote; no memory-safety preconditions.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {b}, p, 0xffffffff; }}",
            x = in(reg32) pred as u32,
            b = out(reg32) b,
            options(nomem, nostack),
        )
    };
    b
}
