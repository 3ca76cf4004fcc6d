//! 16-byte vector loads and stores (`ld.global.v4.f32`, `ld.shared.v4.f32`).
//!
//! A plain `[f32; 4]` has 4-byte alignment, so LLVM splits its loads into
//! four scalar ones; reading through a 16-byte-aligned type tells it the
//! address is aligned and yields one vector instruction.
//! `load4`, `store4` and `load4_cg` name the f32 case of
//! `device::F32Storage`, which holds the code.

use crate::device::F32Storage;

/// Floats per vector.
pub const VEC: usize = 4;

/// Element-wise sum of two 4-float groups.
#[inline(always)]
pub fn add4(a: [f32; VEC], b: [f32; VEC]) -> [f32; VEC] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
}

/// Split-K parts [`sum_parts4`] loads before it adds any: a plan's parts,
/// up to this many, in flight at once.
const PARTS_BATCH: usize = 8;

/// The 4 floats at `src + s * stride` summed over the parts `s < splits` in
/// order, then plus the 4 at `bias` unless it is null: the bits
/// `matmul_split_reduce` gives a split-K output, for kernels that read the
/// parts in its place.
///
/// # Safety
/// `splits >= 1`; `src + s * stride` for every `s < splits`, and `bias`
/// unless null, are 16-byte aligned with 16 readable bytes.
#[inline(always)]
pub unsafe fn sum_parts4(src: *const f32, stride: usize, splits: usize, bias: *const f32) -> [f32; VEC] {
    // SAFETY: the caller's contract, part 0.
    let mut acc = unsafe { load4(src) };
    let mut s = 1;
    while s < splits {
        let mut part = [[0.0; VEC]; PARTS_BATCH];
        for (k, v) in part.iter_mut().enumerate() {
            if s + k < splits {
                // SAFETY: the caller's contract, part s + k < splits.
                *v = unsafe { load4(src.add((s + k) * stride)) };
            }
        }
        for (k, v) in part.iter().enumerate() {
            if s + k < splits {
                acc = add4(acc, *v);
            }
        }
        s += PARTS_BATCH;
    }
    if !bias.is_null() {
        // SAFETY: the caller's contract.
        acc = add4(acc, unsafe { load4(bias) });
    }
    acc
}

/// The 4 floats at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and 16 bytes at it are readable.
#[inline(always)]
pub unsafe fn load4(p: *const f32) -> [f32; 4] {
    // SAFETY: the caller's contract is `F32Storage::load4`'s.
    unsafe { <f32 as F32Storage>::load4(p) }
}

/// Write 4 floats at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and 16 bytes at it are writable.
#[inline(always)]
pub unsafe fn store4(p: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller's contract is `F32Storage::store4`'s.
    unsafe { <f32 as F32Storage>::store4(p, v) }
}

/// Whether `p` may be used with [`load4`]/[`store4`].
#[inline(always)]
pub fn aligned16<T>(p: *const T) -> bool {
    (p as usize).is_multiple_of(VEC * 4)
}

/// [`load4`] through L2 only (`ld.global.cg.v4.f32`): for data another
/// block of the same launch wrote since this block last read it (a line
/// this SM's L1 kept would be stale).
///
/// # Safety
/// As [`load4`], in global memory.
#[inline(always)]
pub unsafe fn load4_cg(p: *const f32) -> [f32; 4] {
    // SAFETY: the caller's contract is `F32Storage::load4_cg`'s.
    unsafe { <f32 as F32Storage>::load4_cg(p) }
}

/// One float through L2 only (see [`load4_cg`]).
///
/// # Safety
/// `p` is a 4-byte aligned float in global memory.
#[inline(always)]
pub unsafe fn load_cg(p: *const f32) -> f32 {
    let a: f32;
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!("ld.global.cg.f32 {a}, [{p}];", a = out(reg32) a, p = in(reg64) p, options(nostack, readonly))
    };
    a
}
