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

/// Programmatic dependent launch (PDL), the device half: wait until the
/// kernels this one depends on have finished and their memory writes are
/// visible (`griddepcontrol.wait`, sm_90+).
///
/// A kernel launched with programmatic stream serialisation may start while
/// the previous kernel in its stream is still running. Before this call it
/// may only read memory that no earlier kernel writes (weights, say: their
/// loads then overlap the previous kernel's tail); after it, everything.
/// Launched without PDL, it returns at once. Compiled only into the sm_90a
/// module (feature `sm90a`); elsewhere a no-op, since the host launches the
/// portable module without PDL.
#[inline(always)]
pub fn grid_dependency_wait() {
    #[cfg(feature = "sm90a")]
    // SAFETY: a wait has no memory-safety preconditions.
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    }
}

/// PDL, the other half: let the next kernel in the stream start launching
/// its blocks (`griddepcontrol.launch_dependents`, sm_90+) once every block
/// of this one has called it or exited. Calling it after
/// [`grid_dependency_wait`] keeps at most one kernel waiting ahead of the
/// running one. A no-op outside the sm_90a module.
#[inline(always)]
pub fn launch_dependents() {
    #[cfg(feature = "sm90a")]
    // SAFETY: only a scheduling hint; no memory effects.
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack))
    }
}

/// `__syncthreads_or(pred)`: a block-wide barrier (like [`sync_threads`])
/// that also returns, to every thread, whether `pred` was true in any of
/// them (`bar.red.or.pred`). Broadcasts one thread's decision, such as
/// "this block arrived last", without a shared-memory slot.
///
/// Must be reached by all threads of the block, as [`sync_threads`].
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let any: u32;
    // SAFETY: a barrier with a reduction; no memory-safety preconditions.
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
            x = in(reg32) pred as u32,
            r = out(reg32) any,
        )
    };
    any != 0
}

/// `__syncthreads_count(pred)`: a block-wide barrier (like [`sync_threads`])
/// that returns to every thread how many threads had `pred` true
/// (`bar.red.popc`). Must be reached by every thread of the block.
#[inline(always)]
pub fn sync_threads_count(pred: bool) -> u32 {
    let n: u32;
    // SAFETY: a barrier with a reduction; no memory-safety preconditions.
    // Not `nomem`: like `bar.sync`, it orders the block's memory accesses.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {x}, 0; bar.red.popc.u32 {n}, 0, p; }}",
            x = in(reg32) pred as u32,
            n = out(reg32) n,
            options(nostack),
        )
    };
    n
}
