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
