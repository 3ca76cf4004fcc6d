//! GPU tests, one binary (so the GPU bundle stays small). The tests that
//! need a GPU are `#[ignore = "needs a GPU"]`, so that `cargo test` on a
//! machine without one reports them as ignored rather than passed; run them
//! with `-- --include-ignored`. Run so, a test skips with a printed reason
//! where no GPU is usable, and fails instead when `GPT2_REQUIRE_GPU=1` (the
//! GPU runner sets both). The tests without `#[ignore]` need no device (they
//! read the embedded PTX or evaluate cost models). Random inputs come from
//! `crate::seed::rng()`: a failure prints its seed, `GPT2_TEST_SEED` replays it.

#[path = "../common/seed.rs"]
mod seed;

mod bf16;
mod decode;
mod device;
mod flash_attention;
mod forward;
mod kernels;
mod matmul_bf16;
mod matmul_fp32_tc;
mod matmul_small;
mod matmul_tf32;
mod perplexity;
mod pipeline;
mod replicas;
mod sampling;
mod serve;
mod tensor_parallel;
