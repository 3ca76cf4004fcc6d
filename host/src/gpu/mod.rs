//! The GPU side. The runtime and the ops' launch wrappers are the
//! `gpu-host` library (re-exported here under their old paths); the GPT-2
//! engine that strings them together is this crate's.
pub use gpu_host::{Gpu, GpuError, nccl, ops, require_gpu_env, runtime, shape, test_gpu};
pub mod engine;
pub mod replicas;
