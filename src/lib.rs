//! The `gpu-kernels` crate compiled to PTX by the top-level `build.rs`.
//!
//! The host loads this module into the CUDA driver, which JIT-compiles it
//! for the GPU at hand.

/// The PTX module holding every kernel of `gpu-kernels`, for any GPU from
/// sm_80 on (`GPU_KERNELS_ARCH`, default sm_80).
pub const GPU_KERNELS_PTX: &str = include_str!(env!("GPU_KERNELS_PTX_PATH"));

/// The same kernels plus the Hopper-only `wgmma` matmuls, compiled for
/// sm_90a: it loads only on compute capability 9.0 (H100, H200).
pub const GPU_KERNELS_SM90A_PTX: &str = include_str!(env!("GPU_KERNELS_SM90A_PTX_PATH"));

/// The `examples/kernel-import` crate compiled to PTX: kernels written in
/// another crate on `gpu_kernels::device` (the device layer's test kernels).
pub const KERNEL_IMPORT_PTX: &str = include_str!(env!("KERNEL_IMPORT_PTX_PATH"));
