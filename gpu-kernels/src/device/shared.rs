//! Shared memory: the launch's dynamic allocation, typed.

/// The dynamic shared memory of this launch (CUDA's `extern __shared__`),
/// as a pointer to `T`.
///
/// # Safety
/// The launch must have asked for at least as many bytes as the caller reads
/// or writes through the pointer, and `T`'s alignment must not exceed 16.
/// Memory is uninitialised at kernel start; threads must synchronise
/// (`sync_threads`) between writing and reading another thread's elements.
#[inline(always)]
pub unsafe fn dynamic_shared<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}
