//! GPT-2 kernels, one module per op. Each kernel takes one parameter struct
//! from [`crate::params`] and is exported under the name in [`crate::params::names`].

pub mod flash_attention;
pub mod saxpy;

// Issue 4: the forward pass.
pub mod argmax;
pub mod attention;
pub mod convert;
pub mod encoder;
pub mod gelu;
pub mod layernorm;
pub mod matmul;
pub mod matmul_small;
pub mod matmul_tf32;
// Hopper only: the PTX assembler accepts `wgmma` for sm_90a alone.
#[cfg(feature = "sm90a")]
pub mod matmul_tf32_wgmma;
pub mod residual;
pub mod softmax;
pub mod vec4;
