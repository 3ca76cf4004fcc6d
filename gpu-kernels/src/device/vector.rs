//! Aligned vectors of four and of two 4-byte values ([`Vec4`], [`Vec2`]),
//! for the kernels' vector loads and stores.
//!
//! Reading or writing a [`Vec4`] through a pointer the caller knows to be
//! 16-byte aligned compiles to one vector instruction (`ld.v4` / `st.v4`,
//! global or shared) instead of four scalar ones; copying it between
//! registers costs nothing. A kernel casts its `*const f32` (or `u32`: bf16
//! pairs, TF32 bits) to `*const Vec4<_>` where it has checked or been
//! promised the alignment.

/// Four values moved as one 16-byte access. Meant for 4-byte `T` (`f32`,
/// `u32`), where it is exactly 16 bytes; the alignment is what makes the
/// access a single vector instruction.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Vec4<T>(pub [T; 4]);

/// Two values moved as one 8-byte access (`ld.v2` / `st.v2`): two floats,
/// or two words of bf16 pairs. Meant for 4-byte `T`; the pointer must be
/// 8-byte aligned, as for [`Vec4`]'s 16.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct Vec2<T>(pub [T; 2]);

/// How f32 values are kept in memory: as `f32` itself, or as bf16 bits
/// (`u16`, half the bytes, rounded to nearest even). Kernels generic over
/// it read and write four consecutive values at a time as f32 (the KV
/// cache: f32 under the FP32 and TF32 paths, bf16 under bf16).
pub trait F32Storage: Copy + 'static {
    /// The four values at `p`, widened to f32 (exact).
    ///
    /// # Safety
    /// `p` is aligned to four elements (16 bytes for f32, 8 for bf16) and
    /// the four elements at it are readable.
    unsafe fn load4(p: *const Self) -> [f32; 4];
    /// [`F32Storage::load4`] through L2 only (`ld.global.cg`): for data
    /// another block of the same launch wrote.
    ///
    /// # Safety
    /// As [`F32Storage::load4`], in global memory.
    unsafe fn load4_cg(p: *const Self) -> [f32; 4];
    /// Four values stored at `p` (bf16: each rounded to nearest even).
    ///
    /// # Safety
    /// `p` is aligned to four elements and the four elements at it are
    /// writable.
    unsafe fn store4(p: *mut Self, v: [f32; 4]);
    /// One value at `p`.
    ///
    /// # Safety
    /// `p` is an aligned, readable element.
    unsafe fn load1(p: *const Self) -> f32;
    /// One value stored at `p`.
    ///
    /// # Safety
    /// `p` is an aligned, writable element.
    unsafe fn store1(p: *mut Self, v: f32);
    /// `x` as a store and load would give it back (bf16: rounded to
    /// nearest even): for a value used both from registers and, later,
    /// from memory, so both uses see the same number.
    fn round(x: f32) -> f32;
    /// Whether `p` is aligned to four elements (the vector methods' need).
    #[inline(always)]
    fn aligned4(p: *const Self) -> bool {
        (p as usize).is_multiple_of(4 * core::mem::size_of::<Self>())
    }
}

impl F32Storage for f32 {
    #[inline(always)]
    unsafe fn load4(p: *const f32) -> [f32; 4] {
        // SAFETY: the trait's contract: 16-byte aligned, 16 readable bytes.
        unsafe { (*(p as *const Vec4<f32>)).0 }
    }
    #[inline(always)]
    unsafe fn load4_cg(p: *const f32) -> [f32; 4] {
        let (a, b, c, d): (f32, f32, f32, f32);
        // SAFETY: the trait's contract.
        unsafe {
            core::arch::asm!(
                "ld.global.cg.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                p = in(reg64) p,
                options(nostack, readonly),
            )
        };
        [a, b, c, d]
    }
    #[inline(always)]
    unsafe fn store4(p: *mut f32, v: [f32; 4]) {
        // SAFETY: the trait's contract: 16-byte aligned, 16 writable bytes.
        unsafe { *(p as *mut Vec4<f32>) = Vec4(v) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const f32) -> f32 {
        // SAFETY: the trait's contract.
        unsafe { *p }
    }
    #[inline(always)]
    fn round(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn store1(p: *mut f32, v: f32) {
        // SAFETY: the trait's contract.
        unsafe { *p = v }
    }
}

/// bf16 bits: four values are two 32-bit words (one 8-byte access).
impl F32Storage for u16 {
    #[inline(always)]
    unsafe fn load4(p: *const u16) -> [f32; 4] {
        // SAFETY: the trait's contract: 8-byte aligned, 8 readable bytes.
        let [w0, w1] = unsafe { (*(p as *const Vec2<u32>)).0 };
        [
            super::bf16x2_lo(w0),
            super::bf16x2_hi(w0),
            super::bf16x2_lo(w1),
            super::bf16x2_hi(w1),
        ]
    }
    #[inline(always)]
    unsafe fn load4_cg(p: *const u16) -> [f32; 4] {
        let (w0, w1): (u32, u32);
        // SAFETY: the trait's contract.
        unsafe {
            core::arch::asm!(
                "ld.global.cg.v2.u32 {{{a}, {b}}}, [{p}];",
                a = out(reg32) w0, b = out(reg32) w1,
                p = in(reg64) p,
                options(nostack, readonly),
            )
        };
        [
            super::bf16x2_lo(w0),
            super::bf16x2_hi(w0),
            super::bf16x2_lo(w1),
            super::bf16x2_hi(w1),
        ]
    }
    #[inline(always)]
    unsafe fn store4(p: *mut u16, v: [f32; 4]) {
        let pair = |lo: f32, hi: f32| super::f32_to_bf16(lo) as u32 | (super::f32_to_bf16(hi) as u32) << 16;
        // SAFETY: the trait's contract: 8-byte aligned, 8 writable bytes.
        unsafe { *(p as *mut Vec2<u32>) = Vec2([pair(v[0], v[1]), pair(v[2], v[3])]) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u16) -> f32 {
        // SAFETY: the trait's contract.
        super::bf16_to_f32(unsafe { *p })
    }
    #[inline(always)]
    fn round(x: f32) -> f32 {
        super::bf16_to_f32(super::f32_to_bf16(x))
    }
    #[inline(always)]
    unsafe fn store1(p: *mut u16, v: f32) {
        // SAFETY: the trait's contract.
        unsafe { *p = super::f32_to_bf16(v) }
    }
}
