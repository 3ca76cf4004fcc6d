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

/// Defines the nvptx module's `#[panic_handler]` (a `trap`: there is no
/// unwinding on the GPU; bounds and overflow checks end the kernel, and the
/// host sees the failed launch at its next synchronisation).
///
/// Every kernel crate calls this once at its root, and the handler exists
/// only in the crate that `kernel-builder` compiles as the module's root
/// (it passes `--cfg kernel_builder_root` to that crate alone). So two kernel
/// crates in one build, each with its own call, never collide, and a crate
/// built as a dependency of another module brings none.
#[macro_export]
macro_rules! panic_handler {
    () => {
        // Outside nvptx the module and its inner cfg are stripped unread.
        #[cfg(target_arch = "nvptx64")]
        mod __kernel_panic_handler {
            #[cfg(kernel_builder_root)]
            #[panic_handler]
            fn panic(_: &::core::panic::PanicInfo) -> ! {
                $crate::device::trap()
            }
        }
    };
}

panic_handler!();
