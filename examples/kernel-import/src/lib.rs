//! Proof that a third-party crate can build its own kernels on
//! `gpu_kernels::device` and share parameter structs with its host through
//! `gpu_kernels::kernel_params!`. It imports `gpu-kernels` without its
//! `panic-handler` feature and brings its own handler.
//!
//! Its kernels are the device layer's test kernels, one per family of device
//! functions; `tests/gpu/device.rs` launches them through
//! `gpt2::KERNEL_IMPORT_PTX`.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

pub mod params;

#[cfg(target_arch = "nvptx64")]
mod kernels;

/// The final nvptx module needs exactly one panic handler; `gpu-kernels`
/// leaves it to us. Bounds checks and the like end the kernel.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    gpu_kernels::device::trap()
}
