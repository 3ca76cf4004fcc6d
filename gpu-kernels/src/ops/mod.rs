//! GPT-2 kernels, one module per op. Each kernel takes one parameter struct
//! from [`crate::params`] and is exported under the name in [`crate::params::names`].

pub mod flash_attention;
pub mod saxpy;

// The forward pass.
pub mod argmax;
pub mod attention;
pub mod convert;
pub mod crossentropy;
// The decode step's fused kernels.
pub mod decode;
pub mod encoder;
pub mod gelu;
pub mod kv_cache;
pub mod layernorm;
pub mod matmul;
pub mod matmul_small;
pub mod matmul_tf32;
// Hopper only: the PTX assembler accepts `wgmma` for sm_90a alone.
#[cfg(feature = "sm90a")]
pub mod matmul_wgmma;
// Hopper only: bulk copies into shared memory that complete on mbarriers.
#[cfg(feature = "sm90a")]
pub mod decode_step;
pub mod residual;
pub mod softmax;
pub mod vec4;
// f32 or bf16 weights through one generic kernel body.
pub mod weight;
// GPU sampling (the rule is in `params::sample`).
pub mod sample;
// bf16.
pub mod matmul_bf16;
