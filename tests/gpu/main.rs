//! GPU tests, one binary (so the GPU bundle stays small). Each test skips
//! with a printed reason where no GPU is usable, and fails instead when
//! `GPT2_REQUIRE_GPU=1` (the GPU runner sets it).

mod decode;
mod device;
mod flash_attention;
mod forward;
mod kernels;
mod matmul_small;
mod matmul_tf32;
mod perplexity;
mod pipeline;
mod sampling;
