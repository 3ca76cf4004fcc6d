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

/// `atomicAdd` on a `u32` in this block's shared memory (relaxed,
/// `atom.shared::cta.add.u32`): returns the old value.
///
/// # Safety
/// `p` is a 4-byte aligned `u32` in the block's shared memory (generic address).
#[inline(always)]
pub unsafe fn atomic_add_shared_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller's contract; cvta turns the generic address into
    // the shared window's.
    unsafe {
        asm!(
            "{{ .reg .b64 s; cvta.to.shared.u64 s, {p}; atom.shared::cta.add.u32 {o}, [s], {v}; }}",
            o = out(reg32) old,
            p = in(reg64) p,
            v = in(reg32) v,
        )
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

/// The start of a kernel in a chain of dependent launches: wait for the
/// previous kernel ([`grid_dependency_wait`]), then let the next one launch
/// ([`launch_dependents`]), so at most one kernel waits ahead of the running
/// one. Nothing written by an earlier kernel may be read, and nothing at all
/// written, before it. Kernels that call it first are launched with PDL by
/// the host where the sm_90a module is loaded (the host finds the wait in
/// the kernel's PTX); the next kernel's launch then overlaps this one's
/// tail. A no-op outside the sm_90a module and without PDL.
#[inline(always)]
pub fn grid_dependency_sync() {
    grid_dependency_wait();
    launch_dependents();
}

/// `__syncthreads_or(pred)`: a block-wide barrier (like [`sync_threads`])
/// that also returns, to every thread, whether `pred` was true in any of
/// them (`bar.red.or.pred`). Broadcasts one thread's decision, such as
/// "this block arrived last", without a shared-memory slot.
///
/// Must be reached by all threads of the block, as [`sync_threads`].
/// `pred` is evaluated before the barrier: an arrival counted in it (an
/// atomic) is not ordered after the other threads' writes unless a
/// [`sync_threads`] comes first (compute-sanitizer's racecheck scheduling
/// showed a merge reading partials not yet written without one).
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

/// A `u32` load with acquire semantics at GPU scope (`ld.acquire.gpu`):
/// writes another block released before the value it returns was written
/// are visible to this thread's later loads.
///
/// # Safety
/// `p` is a 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn load_acquire_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe { asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack)) };
    v
}

/// A barrier across the whole grid: every block waits here until all
/// `gridDim.x * gridDim.y * gridDim.z` blocks have arrived, and the global
/// writes any block made before it are visible to every block after it.
/// [`grid_arrive`] then [`grid_wait`] by thread 0, between block barriers.
///
/// `counter` counts arrivals for the whole launch; the `k`-th barrier
/// (from 1) of a launch passes `target = k * blocks`. The counter must be
/// zero at the launch's start; resetting it is the caller's (once no block
/// can still be waiting on it).
///
/// Every block of the grid must be resident at once (one block per SM and
/// a grid of at most the SM count, say), or the blocks that arrived wait
/// forever for those that cannot start. Every thread of the block calls it.
///
/// # Safety
/// `counter` is a 4-byte aligned `u32` in global memory that only this
/// launch's barriers touch; the residency rule above holds.
#[inline(always)]
pub unsafe fn grid_barrier(counter: *mut u32, target: u32) {
    sync_threads();
    if super::thread_idx_x() == 0 {
        // SAFETY: the caller's contract.
        unsafe {
            grid_arrive(counter);
            grid_wait(counter, target);
        }
    }
    sync_threads();
}

/// The arrival half of a grid barrier ([`grid_barrier`] shows the whole),
/// split so a block can do work of its own between arriving and waiting:
/// one thread calls it after a block barrier that follows the block's
/// writes. A release reduction publishes those writes (the block barrier
/// ordered them before this thread's); no full fence, which would also
/// wait for this thread's outstanding loads and copies. So the thread
/// that arrives should not be one that issues asynchronous copies.
///
/// # Safety
/// As [`grid_barrier`]'s `counter`.
#[inline(always)]
pub unsafe fn grid_arrive(counter: *mut u32) {
    // SAFETY: the caller's contract.
    unsafe { asm!("red.release.gpu.global.add.u32 [{p}], 1;", p = in(reg64) counter, options(nostack)) };
}

/// The waiting half of a grid barrier: one thread polls `counter` with
/// acquire loads until it reaches `target`; a block barrier after it then
/// lets the whole block see every block's published writes.
///
/// # Safety
/// As [`grid_barrier`]'s `counter`; the residency rule holds.
#[inline(always)]
pub unsafe fn grid_wait(counter: *const u32, target: u32) {
    // SAFETY: the caller's contract.
    while unsafe { load_acquire_u32(counter) } < target {}
}

/// A float published with its flag in one 64-bit word (the flag in the
/// high half): one 8-byte store writes both, so a reader that sees the
/// flag it waits for sees the value written with it, with no fence or
/// barrier between writer and reader (NCCL's "LL" protocol rests on the
/// same single-copy atomicity of aligned 8-byte accesses). The flag must
/// differ from whatever the word held before, or a reader would take the
/// old value.
///
/// # Safety
/// `p` is an 8-byte aligned `u64` in global memory.
#[inline(always)]
pub unsafe fn store_flagged(p: *mut u64, value: f32, flag: u32) {
    let word = ((flag as u64) << 32) | value.to_bits() as u64;
    // SAFETY: the caller's contract.
    unsafe { asm!("st.relaxed.gpu.global.b64 [{p}], {w};", p = in(reg64) p, w = in(reg64) word, options(nostack)) };
}

/// Two flagged words ([`store_flagged`]) in one 16-byte load at GPU scope
/// (each word read whole, so each flag comes with its own value).
///
/// # Safety
/// `p` is a 16-byte aligned pair of `u64` in global memory.
#[inline(always)]
pub unsafe fn load_flagged2(p: *const u64) -> [u64; 2] {
    let (a, b): (u64, u64);
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "ld.relaxed.gpu.global.v2.b64 {{{a}, {b}}}, [{p}];",
            a = out(reg64) a,
            b = out(reg64) b,
            p = in(reg64) p,
            options(nostack),
        )
    };
    [a, b]
}

/// The flag of a flagged word ([`store_flagged`]).
#[inline(always)]
pub fn flag_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The value of a flagged word ([`store_flagged`]).
#[inline(always)]
pub fn flagged_value(word: u64) -> f32 {
    f32::from_bits(word as u32)
}
