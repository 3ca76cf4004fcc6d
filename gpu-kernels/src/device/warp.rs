//! Warp shuffles and warp/block reductions.
//!
//! All functions assume every lane of the warp calls them together (full
//! mask), which is how the kernels of this crate use them.

use super::{FULL_MASK, WARP_SIZE};
use core::arch::asm;

/// `__shfl_xor_sync(FULL_MASK, v, lane_mask)`: the value of lane `lane ^ lane_mask`.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r: f32;
    // SAFETY: a register-only warp instruction; all lanes participate.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) lane_mask, full = in(reg32) FULL_MASK)
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
             r = out(reg32) r, v = in(reg32) v, d = in(reg32) delta, full = in(reg32) FULL_MASK)
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
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src_lane, full = in(reg32) FULL_MASK)
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

/// Sum over the warp; every lane gets the result (butterfly reduction).
#[inline(always)]
pub fn warp_reduce_sum(mut v: f32) -> f32 {
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        v += shfl_xor_f32(v, m);
        m /= 2;
    }
    v
}

/// Maximum over the warp; every lane gets the result.
#[inline(always)]
pub fn warp_reduce_max(mut v: f32) -> f32 {
    let mut m = WARP_SIZE / 2;
    while m > 0 {
        v = v.max(shfl_xor_f32(v, m));
        m /= 2;
    }
    v
}

/// Sum over a 1-D block; every thread gets the result.
///
/// # Safety
/// `scratch` points to at least 32 `f32`s of shared memory that no other code
/// uses during the call; the block size is a multiple of 32 and at most 1024;
/// every thread of the block calls this (it contains barriers).
#[inline(always)]
pub unsafe fn block_reduce_sum(v: f32, scratch: *mut f32) -> f32 {
    unsafe { block_reduce(v, scratch, warp_reduce_sum, 0.0) }
}

/// Maximum over a 1-D block; every thread gets the result.
///
/// # Safety
/// As for [`block_reduce_sum`].
#[inline(always)]
pub unsafe fn block_reduce_max(v: f32, scratch: *mut f32) -> f32 {
    unsafe { block_reduce(v, scratch, warp_reduce_max, f32::NEG_INFINITY) }
}

#[inline(always)]
unsafe fn block_reduce(v: f32, scratch: *mut f32, warp_op: fn(f32) -> f32, identity: f32) -> f32 {
    let lane = super::lane_id();
    let warp = super::warp_id();
    let warps = super::block_dim_x() / WARP_SIZE;
    let w = warp_op(v);
    // SAFETY (whole block): the caller guarantees 32 floats of scratch; warp < 32.
    unsafe {
        if lane == 0 {
            *scratch.add(warp as usize) = w;
        }
        super::sync_threads();
        let x = if lane < warps { *scratch.add(lane as usize) } else { identity };
        let r = warp_op(x);
        // The scratch may be reused right after return: wait until all have read it.
        super::sync_threads();
        r
    }
}
