//! The device standard library: what `cuda_std` is to Rust-CUDA.
//!
//! Everything here compiles only for `nvptx64-nvidia-cuda`. Intrinsics that
//! `core::arch::nvptx` lacks are written as inline PTX. Each `unsafe fn`
//! states the contract its caller must keep.

pub mod bf16;
pub mod index;
pub mod math;
pub mod mma;
pub mod prefetch;
pub mod shared;
pub mod sync;
pub mod tma;
pub mod warp;
pub mod wgmma;

// Flat access (`device::warp_reduce_sum`) as well as by module.
pub use bf16::*;
pub use index::*;
pub use math::*;
pub use mma::*;
pub use prefetch::*;
pub use shared::*;
pub use sync::*;
pub use warp::*;

/// Lanes in a warp on every NVIDIA GPU this crate targets.
pub const WARP_SIZE: u32 = 32;
/// Mask naming every lane of a warp, for the `*.sync` instructions.
pub const FULL_MASK: u32 = 0xffff_ffff;
