//! Flash attention: the `attention_forward` op fused into one pass over the
//! KV cache, with no T x T matrix in memory (contract: docs/design.md).
//!
//! One module per kernel (three prefill variants, the two passes of
//! flash-decoding), each with its own notes:
//! - [`prefill_tf32`]: `attention_forward_flash_tf32`, prefill with TF32
//!   tensor-core products, and [`prefill_bf16`]:
//!   `attention_forward_flash_bf16`, with bf16 ones; both run the
//!   tensor-core body of `prefill_tc` (its notes say how);
//! - [`prefill_fp32`]: `attention_forward_flash_fp32`, prefill with FP32 FMA
//!   products (the exact path);
//! - [`decode`]: `attention_forward_flash_decode`, pass 1 of flash-decoding
//!   (a few queries over a long cache), and the per-key helpers that the
//!   fused decode kernels (`ops::decode`) share with it;
//! - [`combine`]: `attention_forward_flash_combine`, pass 2 of
//!   flash-decoding.
//!
//! This module holds what they share: the tile geometry, 16-byte shared and
//! global accesses, and the guard of the online softmax.
//!
//! Common to both prefill kernels: K/V tiles of 64 keys in a shared-memory
//! ring filled by `cp.async`; each warp owns 16 query rows and keeps their
//! scores, running max/sum and output accumulator in registers in the
//! m16n8k8 C-fragment layout (row g = lane/4 and g+8, columns 2t, 2t+1 with
//! t = lane%4). Scores are scaled by log2(e)/sqrt(HS) so `ex2` is the only
//! transcendental. Tiles above the causal diagonal or wholly before the
//! window are never loaded; (sub-)tiles a warp cannot see are skipped by that
//! warp; only those that straddle a boundary pay for per-element masks.

pub mod combine;
pub mod decode;
pub mod prefill_bf16;
pub mod prefill_fp32;
mod prefill_tc;
pub mod prefill_tf32;

use crate::device::Vec4;
use crate::params::flash_attention::*;

const HS: usize = FLASH_HEAD_SIZE as usize;
const BK: usize = FLASH_BLOCK_K as usize;
const STRIDE: usize = FLASH_SMEM_STRIDE as usize;
const TILE: usize = FLASH_TILE_FLOATS as usize;
/// Rows of one MMA tile (m16): the query rows one warp owns.
const WARP_ROWS: usize = 16;
/// Width of one MMA n- or k-step (n8, k8).
const MMA_N: usize = 8;
/// 8-wide blocks of the head dimension (k-steps of QKᵀ, n-tiles of O).
const DIM_STEPS: usize = HS / MMA_N;
/// Floats per 16-byte vector (one `cp.async`, one `ld.v4`).
const VEC: usize = 4;
/// 16-byte vectors per tile row.
const VECS_PER_ROW: usize = HS / VEC;

/// # Safety
/// `p` is 16-byte aligned and readable for 16 bytes.
#[inline(always)]
unsafe fn ld4(p: *const f32) -> [f32; 4] {
    // SAFETY: the caller gives `p` 16-byte aligned and readable for 16 bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { (*(p as *const Vec4<f32>)).0 }
}

/// # Safety
/// `p` is 16-byte aligned and writable for 16 bytes.
#[inline(always)]
unsafe fn st4(p: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller gives `p` 16-byte aligned and writable for 16 bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { *(p as *mut Vec4<f32>) = Vec4(v) }
}

/// `exp2(x - m)` where `m` is a running maximum that may still be -inf (no
/// key seen yet): then every `x` is -inf too and the result must be 0, not NaN.
#[inline(always)]
pub(crate) fn softmax_base(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}
