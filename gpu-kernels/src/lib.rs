//! GPT-2 kernels in Rust, compiled to PTX by rustc's `nvptx64-nvidia-cuda` backend.
//!
//! Two halves:
//! - `device` (nvptx only): the device standard library, the role Rust-CUDA's
//!   `cuda_std` plays: indices, barriers, warp shuffles and reductions, shared
//!   memory, fast math, tensor-core `mma.sync`. Other Rust GPU crates can use it.
//! - [`params`] (host and device): one `#[repr(C)]` parameter struct and one
//!   name constant per kernel, so the host and the kernels cannot disagree on
//!   arguments: the host builds the struct and passes it by value.
//!
//! The kernels themselves live in `ops` (nvptx only), one module per GPT-2 op.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        stdarch_nvptx,
        asm_experimental_arch,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    )
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]

pub mod params;

#[cfg(target_arch = "nvptx64")]
pub mod device;

#[cfg(all(target_arch = "nvptx64", feature = "kernels"))]
pub mod ops;

/// The kernels end in `trap` on panic (bounds checks, overflow checks in
/// debug builds); there is no unwinding on the GPU.
#[cfg(all(target_arch = "nvptx64", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: trap aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}
