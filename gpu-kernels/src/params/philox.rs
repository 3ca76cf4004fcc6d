//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
//! 3", SC 2011; the Random123 library): a counter-based generator. The
//! output is a pure function of a 128-bit counter and a 64-bit key, so a
//! GPU thread can draw the number it needs without carrying generator state,
//! and the host computes the very same number with this very function (this
//! module compiles for the host and for the device).
//!
//! Known-answer vectors (Random123's `tests/kat_vectors`) are checked by
//! `tests/cpu/sample_twin.rs`.

/// Multiplier of counter word 0.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Multiplier of counter word 2.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0 (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1 (sqrt(3) - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Rounds of the standard variant; fewer fail statistical tests (Crush).
pub const PHILOX_ROUNDS: usize = 10;

/// High and low 32-bit halves of the 64-bit product `a * b`.
#[inline(always)]
fn mul_hi_lo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32-10: four pseudo-random words from counter `ctr` and key `key`.
#[inline(always)]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
        }
        let (hi0, lo0) = mul_hi_lo(PHILOX_M0, c[0]);
        let (hi1, lo1) = mul_hi_lo(PHILOX_M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The key words of a 64-bit seed (low word first).
#[inline(always)]
pub fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}
