//! The workspace's root package: the end-to-end tests (`tests/`), and the
//! PTX of `examples/kernel-import` they launch.
//!
//! The GPT-2 kernels' PTX is `gpu_host::GPU_KERNELS_PTX` (and `_SM90A_PTX`).

/// The `examples/kernel-import` crate compiled to PTX: kernels written in
/// another crate on `gpu_kernels::device` (the device layer's test kernels).
pub const KERNEL_IMPORT_PTX: &str = include_str!(env!("KERNEL_IMPORT_PTX_PATH"));
