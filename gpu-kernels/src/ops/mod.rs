//! GPT-2 kernels, one module per op. Each kernel takes one parameter struct
//! from [`crate::params`] and is exported under the name in [`crate::params::names`].

/// Most iterations [`unroll_below!`] writes out.
pub(crate) const UNROLL_MAX: usize = 16;

/// Repeat `$body` for `$i` = 0, 1, ... while `$i < $n` (a constant, at most
/// `UNROLL_MAX`), with `$i` a constant each time. The fragment and
/// accumulator arrays (and rows held in registers) must be indexed by constants to stay in registers, and
/// LLVM's unroller gives up on the larger nests (it leaves a loop over a
/// local-memory array).
macro_rules! unroll_below {
    ($i:ident < $n:expr => $body:block) => {
        unroll_below!(@ $i $n, $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $i:ident $n:expr, $body:block; $($k:literal)*) => {
        $( if $k < $n { let $i: usize = $k; $body } )*
    };
}

pub mod flash_attention;
pub mod saxpy;

// Issue 4: the forward pass.
pub mod argmax;
pub mod attention;
pub mod convert;
// Issue 13: the decode step's fused kernels.
pub mod decode;
pub mod encoder;
pub mod gelu;
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
// Issue 14: f32 or bf16 weights through one generic kernel body.
pub mod weight;
// GPU sampling (the rule is in `params::sample`).
pub mod sample;
// Issue 14: bf16.
pub mod matmul_bf16;
