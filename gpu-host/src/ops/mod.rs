//! Launch wrappers, one module per op (same names as `cpu::ops` and the
//! kernels). Each wrapper checks buffer sizes, computes its launch
//! configuration, builds the kernel's parameter struct and launches.
pub mod flash_attention;
// The forward pass (FP32), plus shared argument checks.
pub mod argmax;
pub mod args;
pub mod attention;
pub mod convert;
pub mod crossentropy;
pub mod decode;
pub mod decode_step;
pub mod encoder;
pub mod gelu;
pub mod kv_cache;
pub mod layernorm;
pub mod matmul;
pub mod matmul_tf32;
pub mod residual;
pub mod softmax;
// f32 or bf16 weight matrices.
pub mod weight;
// GPU sampling (twin: `cpu::sample`).
pub mod sample;
// bf16.
pub mod matmul_bf16;
