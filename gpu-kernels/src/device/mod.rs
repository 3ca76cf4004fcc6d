//! The device standard library: what `cuda_std` is to Rust-CUDA.
//!
//! Everything here compiles only for `nvptx64-nvidia-cuda`. Intrinsics that
//! `core::arch::nvptx` lacks are written as inline PTX. Each `unsafe fn`
//! states the contract its caller must keep.

pub mod bf16;
pub mod cluster;
pub mod index;
pub mod math;
pub mod mma;
pub mod prefetch;
pub mod shared;
pub mod sync;
pub mod tma;
pub mod vector;
pub mod warp;
pub mod wgmma;

// Flat access (`device::warp_reduce_sum`) as well as by module.
pub use bf16::*;
pub use cluster::*;
pub use index::*;
pub use math::*;
pub use mma::*;
pub use prefetch::*;
pub use shared::*;
pub use sync::*;
pub use vector::{F32Storage, Vec2, Vec4};
pub use warp::*;

/// Lanes in a warp on every NVIDIA GPU this crate targets.
pub const WARP_SIZE: u32 = 32;
/// Mask naming every lane of a warp, for the `*.sync` instructions.
pub const FULL_MASK: u32 = 0xffff_ffff;

/// Most iterations `unroll!` writes out.
pub const UNROLL_MAX: usize = 16;

/// Repeat `$body` for `$i` = 0, 1, ... while `$i < $n` (a constant, at most
/// [`UNROLL_MAX`]), with `$i` a constant `usize` each time.
///
/// Why not a `for` loop: fragment, accumulator and row arrays kept in
/// registers must be indexed by constants, and LLVM's unroller gives up on
/// the larger nests (it leaves a loop over a local-memory array, which then
/// shows as a stack frame or spills in `scripts/ptxas-check.sh`). Each copy
/// is guarded by `$i < $n`, a constant condition the compiler folds away.
/// Crate-internal for now (`use crate::device::unroll`).
macro_rules! unroll {
    ($i:ident < $n:expr => $body:block) => {
        $crate::device::unroll!(@ $i $n, $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $i:ident $n:expr, $body:block; $($k:literal)*) => {
        $( if $k < $n { let $i: usize = $k; $body } )*
    };
}
pub(crate) use unroll;

/// Ask ptxas not to unroll the loop this is called in (PTX's `.pragma
/// "nounroll"`, which applies to the loop whose header block holds it: call
/// it first thing in the loop's body). For hot loops written out as wide as
/// the registers allow: ptxas's own unrolling hoists the copies' loads
/// together, and the kernel spills.
#[inline(always)]
pub fn no_unroll() {
    // SAFETY: a directive to the assembler; no instruction, no operand.
    unsafe { core::arch::asm!(".pragma \"nounroll\";", options(nomem, nostack, preserves_flags)) };
}
