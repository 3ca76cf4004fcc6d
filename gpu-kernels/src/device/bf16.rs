//! bf16 on the device: bf16 is the upper half of an f32 (same exponent,
//! 7 mantissa bits), so widening is a shift and narrowing a rounding of the
//! low 16 bits.

/// The f32 of bf16 bits (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The lower bf16 of a 32-bit word holding two (the one at the lower
/// address in memory: little-endian), as f32.
#[inline(always)]
pub fn bf16x2_lo(word: u32) -> f32 {
    f32::from_bits(word << 16)
}

/// The upper bf16 of a 32-bit word holding two, as f32.
#[inline(always)]
pub fn bf16x2_hi(word: u32) -> f32 {
    f32::from_bits(word & 0xffff_0000)
}

/// Bits of the bf16 nearest to `x`, ties to even (what `half::bf16::from_f32`
/// and `cvt.rn.bf16.f32` do); a NaN stays a (quiet) NaN. Integer arithmetic,
/// so it needs no sm_80 instruction.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    /// The quiet-NaN bit of bf16, kept so a NaN never rounds to infinity.
    const QUIET: u16 = 0x0040;
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) as u16 | QUIET;
    }
    // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even.
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}
