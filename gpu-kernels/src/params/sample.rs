//! Choosing the next token on the device: greedy, temperature, top-k and
//! top-p (nucleus), in Hugging Face's order (temperature, then top-k, then
//! top-p), as `host::sample::Sampler` does on the CPU, so that only one id
//! per row comes back to the host.
//!
//! Besides the launch contract, this file holds the *rule* both faces of the
//! op apply, as plain functions that compile for the host and the device:
//! the kernel (`ops::sample`) and its CPU twin (`host::cpu::sample`) call the
//! same [`sample_weight`], [`top_p_target`], [`draw_target`] and
//! [`row_random`], so they choose the same token bit for bit.
//!
//! # The rule, per row (`v` real entries `l_0 .. l_{v-1}`)
//! - Greedy ([`is_greedy`]: temperature 0, or top-k 1): the argmax, ties to
//!   the lowest id, NaN never wins (an all-NaN row gives 0).
//! - Otherwise NaN logits are left out (they are never chosen and do not
//!   count towards top-k; the CPU `Sampler` has no defined behaviour for
//!   them). The others are ordered by (logit descending, id ascending) —
//!   `f32::total_cmp` on the logit, so -0 sorts below +0 — and top-k keeps
//!   the first `top_k` of that order.
//! - Each token gets the integer weight `w_i = sample_weight(l_i, M, s)`,
//!   about `2^32 · exp((l_i - M) / T)` (`M` the largest logit): every mass
//!   below is a sum of integers, so it does not depend on the order of
//!   summation (no float atomics, one answer whatever the thread schedule).
//! - Top-p (when `top_p < 1`): with `W` the mass of the top-k set, keep the
//!   shortest prefix of the order whose mass reaches
//!   `P = top_p_target(top_p, W) = max(1, ceil(top_p · W))` (exact).
//! - The draw: with `W_S` the mass of the kept set and `r` the row's 64
//!   random bits ([`row_random`]), `t = draw_target(r, W_S) = floor(r · W_S /
//!   2^64)`; the chosen token is the kept token, in id order, whose
//!   cumulative-mass interval `[c_i - w_i, c_i)` contains `t`. Zero-weight
//!   tokens have empty intervals: they are never chosen.
//!
//! # How close to the exact distribution
//! `w_i = 2^32 · 2^{x_i} · (1 + e_i) - d_i` with `x_i` the computed
//! `(l_i - M) · log2(e) / T`, `|e_i| <= 2^-21` (the polynomial of
//! [`exp2_fixed`] and its f32 rounding; `tests/cpu/sample_twin.rs` asserts
//! it and measures about 9e-8) and `0 <= d_i < 1` (the floor to an
//! integer). `x_i` itself carries four f32 roundings (`log2(e)`, the
//! division by `T`, the subtraction, the product), a relative 3.5 · 2^-24:
//! an error of at most `|x_i| · 1.5e-7` relative in `2^{x_i}`, so at most
//! 4.6e-6 over the weighted range `x_i >= -32`. Below it (probability under
//! 2^-32 of the most likely token's) the weight is 0. Together, each
//! probability `w_i / W_S` is within a relative `2 · (2^-21 + 4.6e-6) <
//! 1.1e-5` of the exact `exp((l_i - M)/T) / Z` over the same kept set, plus
//! the floors: a relative `v / W_S <= v · 2^-32` (1.2e-5 for GPT-2's
//! vocabulary at worst; `W_S` is usually many times `2^32`) and an absolute
//! `2^-32`. The draw adds at most 2^-64 per token. The CPU sampler's own f32
//! softmax is no more exact than that. The top-p cut, decided on integer
//! masses, can differ from an exact-arithmetic cut only where the exact
//! prefix mass lies within that error of `top_p`.

use super::philox::{philox4x32_10, seed_key};

/// One block per row: a max pass, radix selects for top-k and top-p, and a
/// hierarchical search for the draw (see `ops::sample`).
pub const SAMPLE_FORWARD: &str = "sample_forward";
/// Threads per block (16 warps: up to 128 registers a thread, which the
/// kernel's 64-bit bookkeeping can use without spilling).
pub const SAMPLE_BLOCK: u32 = 512;
/// Bits of the key resolved per radix pass: an 11-bit digit leaves 2048
/// buckets, so the typical span of near-maximal keys (about 22 bits) takes
/// two passes.
pub const SAMPLE_RADIX_BITS: u32 = 11;
/// Buckets of a radix pass.
pub const SAMPLE_BUCKETS: u32 = 1 << SAMPLE_RADIX_BITS;
/// Largest vocabulary (`v`) the kernel accepts: ids, counts and the loop
/// indices stay below 2^32 and a mass (at most `v · 2^32`) below 2^64.
pub const SAMPLE_MAX_VOCAB: u32 = 1 << 31;
/// 64-bit words of shared scratch for block reductions and scans: one per
/// warp of the block.
pub const SAMPLE_SCRATCH_WORDS: u32 = SAMPLE_BLOCK / 32;
/// 64-bit words the block broadcasts through shared memory (a chosen
/// bucket, its count and mass, the prefix before it).
pub const SAMPLE_BROADCAST_WORDS: u32 = 4;

/// Dynamic shared memory of one block, in bytes: per-bucket masses (u64)
/// and counts (u32), then the scratch and broadcast words. 24.7 KB: under
/// the 48 KB every launch may use without opting in.
pub const fn sample_shared_bytes() -> u32 {
    SAMPLE_BUCKETS * 8 + SAMPLE_BUCKETS * 4 + (SAMPLE_SCRATCH_WORDS + SAMPLE_BROADCAST_WORDS) * 8
}

/// The same choice with a cluster of [`SAMPLE_CLUSTER`] blocks per row
/// (sm_90a module only): each block reads a contiguous part of the row and
/// keeps the tokens that can matter, and the cluster's first block chooses
/// among the gathered candidates (see `ops::sample`). Same rule, same ids.
pub const SAMPLE_CLUSTER_FORWARD: &str = "sample_forward_cluster";
/// Blocks of a cluster, one part of the row each: 8 is the largest cluster
/// every sm_90 GPU schedules without opting in.
pub const SAMPLE_CLUSTER: u32 = 8;
/// Candidates one block of the cluster keeps in its shared memory (a part
/// with more sends the row down the cluster-wide selects).
pub const SAMPLE_CLUSTER_BLOCK_CAP: u32 = 512;
/// Candidates the first block gathers at most (more: the cluster-wide
/// selects over the row's parts).
/// Top-k 40 on GPT-2-like logits gathers ~260 (the parts' bounds are loose).
pub const SAMPLE_CLUSTER_LIST_CAP: u32 = 2048;
/// 64-bit words each block of a cluster publishes to the others: its part's
/// largest key and top-k bound, its candidate count, its candidates' mass and
/// its part's argmax.
pub const SAMPLE_CLUSTER_EXCHANGE_WORDS: u32 = 4;
/// The host launches [`SAMPLE_CLUSTER_FORWARD`] (where it is loaded) for at
/// most this many rows: eight blocks a row fill the GPU's SMs from 16 rows
/// on, past which one block a row does as well.
pub const SAMPLE_CLUSTER_MAX_ROWS: u32 = 16;

/// Radix buckets each block of a cluster sums over the cluster in a pass of
/// the cluster-wide selects: one slice of [`SAMPLE_BUCKETS`] per block.
pub const SAMPLE_CLUSTER_SLICE: u32 = SAMPLE_BUCKETS / SAMPLE_CLUSTER;

/// Dynamic shared memory of a block of [`SAMPLE_CLUSTER_FORWARD`]:
/// [`sample_shared_bytes`], the exchange words, the block's own candidates
/// (logit and id), the gathered list (logit and id), and its slice's sums
/// (a total, then mass and count a bucket). 47.2 KB: under the 48 KB
/// default.
pub const fn sample_cluster_shared_bytes() -> u32 {
    sample_shared_bytes()
        + SAMPLE_CLUSTER_EXCHANGE_WORDS * 8
        + SAMPLE_CLUSTER_BLOCK_CAP * 8
        + SAMPLE_CLUSTER_LIST_CAP * 8
        + 8
        + SAMPLE_CLUSTER_SLICE * 12
}

const _: () = assert!(sample_cluster_shared_bytes() <= 48 * 1024);

/// Per-row sampling settings, in device memory (one per batch row), so rows
/// of one batch may sample differently.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow {
    /// Logits are divided by this; 0 (or anything not > 0, NaN included)
    /// picks the argmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all; 1 = greedy).
    pub top_k: u32,
    /// Keep the shortest most-likely prefix whose probability reaches
    /// `top_p`, in (0, 1]; 1 (or anything not < 1) keeps all, anything <= 0
    /// keeps only the most likely token.
    pub top_p: f32,
    /// Keeps `seed` 8-byte aligned; set to 0.
    pub _pad: u32,
    /// Key of the row's random numbers ([`row_random`]).
    pub seed: u64,
}

/// Arguments of [`SAMPLE_FORWARD`] and [`SAMPLE_CLUSTER_FORWARD`].
///
/// Launch of [`SAMPLE_FORWARD`]: grid `(n, 1, 1)` (one block per row),
/// [`SAMPLE_BLOCK`] threads, [`sample_shared_bytes`] bytes of dynamic shared
/// memory. Of [`SAMPLE_CLUSTER_FORWARD`]: grid `(SAMPLE_CLUSTER, n, 1)` in
/// clusters of `(SAMPLE_CLUSTER, 1, 1)`, [`SAMPLE_BLOCK`] threads,
/// [`sample_cluster_shared_bytes`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleParams {
    /// `[n]`: the chosen id of each row (always written).
    pub out: *mut u32,
    /// Row `i` starts at `logits + i * row_stride`; its first `v` entries
    /// are the real vocabulary (padding after them is never read). Only read.
    pub logits: *const f32,
    /// `[n]` settings, one per row.
    pub rows: *const SampleRow,
    /// `[n]` per-row draw counters, the first word of the random numbers'
    /// counter (the engine passes each row's position, so successive steps
    /// draw new numbers); null means 0 for every row.
    pub counter: *const u32,
    /// Null, or `[n]` that also receives each row's chosen id (the next
    /// decode step's input ids).
    pub next_tokens: *mut u32,
    /// Null, or `[n]` per-row stream indices, the second word of the random
    /// numbers' counter ([`row_random`]'s `row`); null means the row index.
    /// A server's sequences sit in any row of a step, yet each draws from
    /// its own stream, as the same prompt would alone.
    pub streams: *const u32,
    /// Rows.
    pub n: u32,
    /// Real vocabulary size, 1 ..= [`SAMPLE_MAX_VOCAB`].
    pub v: u32,
    /// Distance between rows, in floats (`vp` for consecutive padded rows; 0
    /// makes every row read the same logits).
    pub row_stride: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe SampleParams);

/// Fractional bits of a weight: the most likely token weighs `2^32`.
pub const WEIGHT_FRAC_BITS: u32 = 32;
/// Weight of the most likely token (probability ratio 1).
pub const WEIGHT_ONE: u64 = 1 << WEIGHT_FRAC_BITS;
/// Below this log2 probability ratio a weight would round to 0 anyway.
pub const WEIGHT_MIN_LOG2: f32 = -(WEIGHT_FRAC_BITS as f32);
/// Margin past `-WEIGHT_MIN_LOG2` (in log2 units) of [`near_bound`]: its
/// three f32 roundings move the true bound by a relative 2^-22 at most, far
/// inside 32 versus 40.
const NEAR_LOG2: f32 = 40.0;
/// `ln 2^k / k!` for `k = 0..=7`: Taylor coefficients of `2^f`. On `|f| <=
/// 1/2` the first omitted term is below 7e-9 relative.
const EXP2_TAYLOR: [f32; 8] = [
    1.0,
    core::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];
/// `2^24`: scales `2^f` in `[2^-1/2, 2^1/2]` to an integer mantissa exactly
/// (an f32 there has 24 significant bits and an exponent of at most 0).
const MANTISSA_SCALE: f32 = 16_777_216.0;
/// `WEIGHT_FRAC_BITS - 24`: the shift that turns the mantissa into weight units.
const MANTISSA_SHIFT: i32 = WEIGHT_FRAC_BITS as i32 - 24;

/// Whether the row takes the argmax (no randomness involved).
#[inline(always)]
pub fn is_greedy(row: &SampleRow) -> bool {
    // NaN and negative temperatures are greedy too.
    row.temperature.is_nan() || row.temperature <= 0.0 || row.top_k == 1
}

/// Whether top-p cuts anything (`top_p < 1`; NaN does not).
#[inline(always)]
pub fn top_p_active(row: &SampleRow) -> bool {
    row.top_p < 1.0
}

/// Order-preserving key of a logit: `a < b` (as `f32::total_cmp` orders
/// them) exactly when `logit_key(a) < logit_key(b)`. NaN gets 0, below every
/// other key (`-inf` gets `0x007f_ffff`).
#[inline(always)]
pub fn logit_key(l: f32) -> u32 {
    if l.is_nan() {
        return 0;
    }
    let b = l.to_bits();
    if b >> 31 == 1 { !b } else { b | 0x8000_0000 }
}

/// The logit whose [`logit_key`] is `k` (`k` not 0).
#[inline(always)]
pub fn key_logit(k: u32) -> f32 {
    f32::from_bits(if k >> 31 == 1 { k & 0x7fff_ffff } else { !k })
}

/// `log2(e) / T`: [`sample_weight`]'s exponent is `(l - M) · s`.
#[inline(always)]
pub fn temperature_scale(temperature: f32) -> f32 {
    core::f32::consts::LOG2_E / temperature
}

/// A logit at or below which no token can have a positive weight, other than
/// one equal to `m`: every `l` with `sample_weight(l, m, s) > 0` satisfies
/// `l >= near_bound(m, s)`.
///
/// Why it holds: a positive weight needs `x = RN(RN(l - m) · s) >= -32`,
/// so `m - l < 32.001 / s`, while `RN(40 / s) > 39.99 / s` (or is +inf); so
/// `l > m - RN(40 / s)` exactly, and rounding is monotonic, so
/// `l >= RN(m - RN(40 / s))` since `l` is a float. The kernel restricts its
/// selects to keys at or above this bound; the tokens below weigh nothing.
#[inline(always)]
pub fn near_bound(m: f32, s: f32) -> f32 {
    let b = m - NEAR_LOG2 / s;
    // inf - inf (m = +inf, s tiny): everything is "near" then.
    if b.is_nan() { f32::NEG_INFINITY } else { b }
}

/// `floor(y)` as an integer, for `|y| < 2^31` (core has no `f32::floor`).
#[inline(always)]
fn floor_i32(y: f32) -> i32 {
    let t = y as i32;
    if (t as f32) > y { t - 1 } else { t }
}

/// `floor(2^32 · 2^x)` for `x <= 0`, within a relative 2^-21 (see the
/// module docs; `tests/cpu/sample_twin.rs` measures it): 0 for `x < -32`
/// (and NaN), `WEIGHT_ONE` at `x = 0`, never more than `WEIGHT_ONE`.
///
/// Only f32 additions and multiplications (each correctly rounded, never
/// contracted into an FMA: the nvptx back end writes them as `add.rn.f32` /
/// `mul.rn.f32`, which ptxas does not fuse), float-integer conversions and
/// integer shifts: the host and the device compute the same bits.
#[inline(always)]
pub fn exp2_fixed(x: f32) -> u64 {
    if x.is_nan() || x < WEIGHT_MIN_LOG2 {
        return 0;
    }
    if x >= 0.0 {
        return WEIGHT_ONE;
    }
    // x = n + f, n an integer in [-32, 0], |f| <= 1/2.
    let n = floor_i32(x + 0.5);
    let f = x - n as f32;
    let c = EXP2_TAYLOR;
    let p = ((((((c[7] * f + c[6]) * f + c[5]) * f + c[4]) * f + c[3]) * f + c[2]) * f + c[1]) * f + c[0];
    // p in [0.70, 1.42]: p · 2^24 is an integer below 2^25.
    let mantissa = (p * MANTISSA_SCALE) as u64;
    // w = p · 2^(32 + n) = mantissa · 2^(8 + n), 8 + n in [-24, 8].
    let shift = MANTISSA_SHIFT + n;
    let w = if shift >= 0 {
        mantissa << shift
    } else {
        mantissa >> -shift
    };
    if w > WEIGHT_ONE { WEIGHT_ONE } else { w }
}

/// Integer weight of logit `l` when the largest logit is `m` and the
/// temperature scale is `s` ([`temperature_scale`]): `WEIGHT_ONE` for
/// `l == m` (also when `m` is infinite), else `exp2_fixed((l - m) · s)`.
#[inline(always)]
pub fn sample_weight(l: f32, m: f32, s: f32) -> u64 {
    if l == m { WEIGHT_ONE } else { exp2_fixed((l - m) * s) }
}

/// Fraction bits of an f32.
const F32_FRAC_BITS: u32 = 23;
/// Mask of an f32's fraction bits.
const F32_FRAC_MASK: u32 = (1 << F32_FRAC_BITS) - 1;
/// Mask of an f32's (shifted) exponent bits.
const F32_EXP_MASK: u32 = 0xff;
/// Exponent bias of an f32.
const F32_BIAS: u32 = 127;
/// Bits of `m · mass` in [`top_p_target`]: a 24-bit mantissa times a mass
/// below 2^64.
const PRODUCT_BITS: u32 = F32_FRAC_BITS + 1 + u64::BITS;

/// `max(1, ceil(top_p · mass))`, exactly: the mass a top-p prefix must
/// reach. `top_p <= 0` gives 1 (only the first token is kept); call it for
/// `top_p < 1` only (NaN and `top_p >= 1` mean no top-p cut).
#[inline(always)]
pub fn top_p_target(top_p: f32, mass: u64) -> u64 {
    if top_p.is_nan() || top_p <= 0.0 {
        return 1;
    }
    // top_p = m · 2^-e exactly, m < 2^24; e >= 24 since top_p < 1.
    let bits = top_p.to_bits();
    let (exp, frac) = ((bits >> F32_FRAC_BITS) & F32_EXP_MASK, bits & F32_FRAC_MASK);
    let (m, e) = if exp == 0 {
        (frac, F32_BIAS + F32_FRAC_BITS - 1)
    } else {
        (frac | 1 << F32_FRAC_BITS, F32_BIAS + F32_FRAC_BITS - exp)
    };
    let product = m as u128 * mass as u128;
    // With e at least the product's bit length, the quotient is below 1 and
    // its ceiling 1 (and a shift by e >= 128 would overflow).
    if e >= PRODUCT_BITS {
        return 1;
    }
    let ceil = (product + (1u128 << e) - 1) >> e;
    if ceil == 0 { 1 } else { ceil as u64 }
}

/// `floor(random · mass / 2^64)`: uniform on `[0, mass)` up to 2^-64 per value.
#[inline(always)]
pub fn draw_target(random: u64, mass: u64) -> u64 {
    ((random as u128 * mass as u128) >> 64) as u64
}

/// The 64 random bits of one row's draw: Philox4x32-10 keyed by `seed`, at
/// counter `(counter, row, 0, 0)` (the row index keeps rows that share a
/// seed and a counter apart), words 0 and 1 (low word first).
#[inline(always)]
pub fn row_random(seed: u64, counter: u32, row: u32) -> u64 {
    let x = philox4x32_10([counter, row, 0, 0], seed_key(seed));
    x[0] as u64 | (x[1] as u64) << 32
}
