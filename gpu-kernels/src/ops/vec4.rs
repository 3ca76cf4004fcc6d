//! 16-byte vector loads and stores (`ld.global.v4.f32`, `ld.shared.v4.f32`).
//!
//! A plain `[f32; 4]` has 4-byte alignment, so LLVM splits its loads into
//! four scalar ones; reading through a 16-byte-aligned type tells it the
//! address is aligned and yields one vector instruction.

use crate::device::Vec4;

/// Floats per vector.
pub const VEC: usize = 4;

/// The 4 floats at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and 16 bytes at it are readable.
#[inline(always)]
pub unsafe fn load4(p: *const f32) -> [f32; 4] {
    // SAFETY: the caller gives `p` 16-byte aligned with 16 readable bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { (*(p as *const Vec4<f32>)).0 }
}

/// Write 4 floats at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and 16 bytes at it are writable.
#[inline(always)]
pub unsafe fn store4(p: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller gives `p` 16-byte aligned with 16 writable bytes, which is
    // `Vec4`'s size and alignment.
    unsafe { *(p as *mut Vec4<f32>) = Vec4(v) }
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
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!(
            "ld.global.cg.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            p = in(reg64) p,
            options(nostack, readonly),
        )
    };
    [a, b, c, d]
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
