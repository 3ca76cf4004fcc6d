//! The `gpu-kernels` crate compiled to PTX by the top-level `build.rs`.
//!
//! The host loads this module into the CUDA driver, which JIT-compiles it
//! for the GPU at hand.

/// The PTX module holding every kernel of `gpu-kernels`.
pub const GPU_KERNELS_PTX: &str = include_str!(env!("GPU_KERNELS_PTX_PATH"));

/// The `examples/kernel-import` crate compiled to PTX: kernels written in
/// another crate on `gpu_kernels::device` (the device layer's test kernels).
pub const KERNEL_IMPORT_PTX: &str = include_str!(env!("KERNEL_IMPORT_PTX_PATH"));
