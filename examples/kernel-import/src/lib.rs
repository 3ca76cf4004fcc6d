//! Proof that a third-party crate can build its own kernels on
//! `gpu_kernels::device` and share parameter structs with its host through
//! `gpu_kernels::kernel_params!`. Its panic handler comes from
//! `gpu_kernels::panic_handler!`, which cannot collide with another crate's.
//!
//! Its kernels are the device layer's test kernels, one per family of device
//! functions; `tests/gpu/device.rs` launches them through
//! `gpt2::KERNEL_IMPORT_PTX`.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

pub mod params;

#[cfg(target_arch = "nvptx64")]
mod kernels;

// The module's panic handler, defined only when kernel-builder compiles
// this crate as the module's root (never a second one beside gpu-kernels').
gpu_kernels::panic_handler!();
