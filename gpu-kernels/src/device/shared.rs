//! Shared memory: the launch's dynamic allocation, typed.

/// The dynamic shared memory of this launch (CUDA's `extern __shared__`),
/// as a pointer to `T`, aligned to at least `align_of::<T>()` (every call in
/// a kernel returns the same address, whatever `T`).
///
/// # Safety
/// The launch must have asked for at least as many bytes as the caller reads
/// or writes through the pointer. Memory is uninitialised at kernel start;
/// threads must synchronise (`sync_threads`) between writing and reading
/// another thread's elements.
#[inline(always)]
pub unsafe fn dynamic_shared<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

/// Alignment `cp.async` of 16 bytes and vector loads (`ld.shared.v4`) need.
pub const SHARED_ALIGN: usize = 16;

#[repr(C, align(16))]
struct Align16([u8; SHARED_ALIGN]);

/// [`dynamic_shared`], but 16-byte aligned whatever `T` is: the base for
/// `cp.async` targets and `float4` tiles.
///
/// # Safety
/// As for [`dynamic_shared`].
#[inline(always)]
pub unsafe fn dynamic_shared_align16<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Align16>().cast()
}

/// The two floats at shared-memory address `addr` (`ld.shared.v2.f32`, a
/// 32-bit address as [`super::mma::shared_addr`] gives). A loop that keeps
/// such addresses, rather than generic pointers, saves the generic-to-shared
/// conversion on every load and a register per pointer; ptxas folds a
/// constant added to `addr` into the load's offset.
///
/// # Safety
/// `addr` is 8-byte aligned and the 8 bytes at it lie in this block's shared
/// memory, written before the last barrier (or by this thread).
#[inline(always)]
pub unsafe fn ld_shared_v2_f32(addr: u32) -> [f32; 2] {
    let (a, b): (f32, f32);
    // SAFETY: the caller's contract; the asm reads 8 shared bytes and writes none.
    unsafe {
        core::arch::asm!(
            "ld.shared.v2.f32 {{{a}, {b}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            p = in(reg32) addr,
            options(nostack, readonly, preserves_flags)
        )
    }
    [a, b]
}

/// Store two floats at shared-memory address `addr` (`st.shared.v2.f32`,
/// as [`ld_shared_v2_f32`] loads them). Through the asm the pair stays two
/// 32-bit registers: stored as a `[f32; 2]` through a pointer, LLVM moves it
/// as one 64-bit integer, which costs registers where the same pair also
/// feeds arithmetic (the `wgmma` kernels' epilogue).
///
/// # Safety
/// `addr` is 8-byte aligned, the 8 bytes at it lie in this block's shared
/// memory, and no other thread reads or writes them until a barrier.
#[inline(always)]
pub unsafe fn st_shared_v2_f32(addr: u32, v: [f32; 2]) {
    // SAFETY: the caller's contract; the asm writes 8 shared bytes.
    unsafe {
        core::arch::asm!(
            "st.shared.v2.f32 [{p}], {{{a}, {b}}};",
            p = in(reg32) addr,
            a = in(reg32) v[0],
            b = in(reg32) v[1],
            options(nostack, preserves_flags)
        )
    }
}
