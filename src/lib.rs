//! The `gpu-kernels` crate compiled to PTX by the top-level `build.rs`.
//!
//! The host loads this module into the CUDA driver, which JIT-compiles it
//! for the GPU at hand.

/// The PTX module holding every kernel of `gpu-kernels`.
pub const GPU_KERNELS_PTX: &str = include_str!(env!("GPU_KERNELS_PTX_PATH"));
