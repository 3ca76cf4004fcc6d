//! The GPU side: the runtime on `cudarc` (the role `cust` plays for Rust-CUDA).
pub mod ops;
pub mod runtime;

pub use runtime::{Gpu, GpuError, require_gpu_env, test_gpu};
pub mod engine;
