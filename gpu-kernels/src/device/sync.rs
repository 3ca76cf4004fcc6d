//! Barriers and memory fences.

use core::arch::asm;

/// `__syncthreads()`: every thread of the block waits here, and shared and
/// global writes made before it are visible to the block after it.
///
/// Must be reached by all threads of the block (the usual CUDA rule: calling
/// it under divergent control flow deadlocks or is undefined). It is a safe
/// function because breaking that rule cannot corrupt memory by itself.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: bar.sync has no memory-safety preconditions.
    unsafe { core::arch::nvptx::_syncthreads() }
}

/// Barrier `id` (1..16; 0 is [`sync_threads`]'s) for `threads` threads, a
/// multiple of 32: a subset of the block (e.g. the consumer warpgroups of a
/// warp-specialised kernel) synchronises without the others. Orders shared
/// memory like `sync_threads` among the participants.
///
/// Must be reached by exactly `threads` threads (whole warps) of the block
/// for the same `id`; a safe function for the same reason as `sync_threads`.
#[inline(always)]
pub fn named_barrier_sync(id: u32, threads: u32) {
    // SAFETY: bar.sync has no memory-safety preconditions.
    unsafe { asm!("bar.sync {i}, {n};", i = in(reg32) id, n = in(reg32) threads) }
}

/// `__syncwarp()`: the lanes of the warp reconverge and order their
/// shared-memory accesses.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: all 32 lanes are named, which is what our warp code assumes.
    unsafe { asm!("bar.warp.sync {m};", m = in(reg32) super::FULL_MASK) }
}

/// `__threadfence()`: orders this thread's global writes before later ones, device-wide.
#[inline(always)]
pub fn thread_fence() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.acq_rel.gpu;") }
}

/// `atomicAdd` on a `u32` in global memory with acquire-release semantics
/// at GPU scope (`atom.acq_rel.gpu.global.add.u32`): returns the old value.
/// With [`thread_fence`] around it, this is the arrival counter of the
/// "last block finishes the job" pattern: the writes a block made before
/// its arrival are visible to the block that arrives last.
///
/// # Safety
/// `p` is a 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) p, v = in(reg32) v)
    };
    old
}

/// Abort the kernel (`trap`): the launch fails with an error the host sees
/// at its next synchronisation. What a `#[panic_handler]` on the GPU calls.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: trap ends the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}
