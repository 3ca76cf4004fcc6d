//! Weight element types a kernel may stream: f32, or bf16 stored as its
//! bits (`u16`). Kernels generic over [`Weight`] read either with 16-byte
//! loads and compute in f32, so the bf16 engine halves the bytes a decode
//! step reads without a second copy of each kernel's code.

use super::vec4::load4;
use crate::device::Vec2;
use crate::device::bf16::{bf16_to_f32, bf16x2_hi, bf16x2_lo, f32_to_bf16};

/// A weight element: f32, or `u16` holding bf16 bits.
pub trait Weight: crate::device::F32Storage {
    /// Values in one 16-byte load.
    const PER_LOAD: usize;

    /// An input activation as a matmul over these weights multiplies it:
    /// bf16 matmuls multiply bf16 by bf16, on the tensor cores (prefill) and
    /// in the decode GEMV alike, so both compute the same products; f32
    /// leaves it as it is.
    fn round_input(x: f32) -> f32;

    /// The 16 bytes at element `i` of `p`, as raw words.
    ///
    /// # Safety
    /// `p.add(i)` is 16-byte aligned and 16 bytes there are readable.
    unsafe fn load_raw(p: *const Self, i: usize) -> [u32; 4];

    /// Value `e` (< `PER_LOAD`) of a [`Weight::load_raw`], as f32.
    fn value(raw: &[u32; 4], e: usize) -> f32;

    /// Four values from element `i` of `p`, as f32.
    ///
    /// # Safety
    /// `p.add(i)` is aligned to 4 elements and 4 elements there are readable.
    unsafe fn load4_f32(p: *const Self, i: usize) -> [f32; 4];
}

impl Weight for f32 {
    const PER_LOAD: usize = 4;

    #[inline(always)]
    fn round_input(x: f32) -> f32 {
        x
    }

    #[inline(always)]
    unsafe fn load_raw(p: *const f32, i: usize) -> [u32; 4] {
        // SAFETY: the caller's contract.
        unsafe { load4(p.add(i)) }.map(f32::to_bits)
    }

    #[inline(always)]
    fn value(raw: &[u32; 4], e: usize) -> f32 {
        f32::from_bits(raw[e])
    }

    #[inline(always)]
    unsafe fn load4_f32(p: *const f32, i: usize) -> [f32; 4] {
        // SAFETY: the caller's contract.
        unsafe { load4(p.add(i)) }
    }
}

/// bf16 as its bits. Element `2j` of a load is the low half of word `j`
/// (little-endian).
impl Weight for u16 {
    const PER_LOAD: usize = 8;

    #[inline(always)]
    fn round_input(x: f32) -> f32 {
        bf16_to_f32(f32_to_bf16(x))
    }

    #[inline(always)]
    unsafe fn load_raw(p: *const u16, i: usize) -> [u32; 4] {
        // SAFETY: the caller's contract (16 bytes, aligned).
        unsafe { load4(p.add(i) as *const f32) }.map(f32::to_bits)
    }

    #[inline(always)]
    fn value(raw: &[u32; 4], e: usize) -> f32 {
        let w = raw[e / 2];
        if e.is_multiple_of(2) {
            bf16x2_lo(w)
        } else {
            bf16x2_hi(w)
        }
    }

    #[inline(always)]
    unsafe fn load4_f32(p: *const u16, i: usize) -> [f32; 4] {
        // SAFETY: the caller's contract: 8 bytes, 8-byte aligned.
        let w = unsafe { (*(p.add(i) as *const Vec2<u32>)).0 };
        [bf16x2_lo(w[0]), bf16x2_hi(w[0]), bf16x2_lo(w[1]), bf16x2_hi(w[1])]
    }
}
