//! The CPU reference: every GPU op's twin ([`ops`], same names and argument
//! orders) and the whole model with a KV cache ([`forward::CpuModel`]).
//! Tests use it as the oracle for the GPU engine; `--cpu` runs it.
pub mod forward;
pub mod ops;

pub use forward::{CpuLayer, CpuModel, CpuParams};
// Twin of the sampling kernel (`gpu::ops::sample`).
pub mod sample;
