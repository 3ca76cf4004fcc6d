//! Encoder: `out[b,t,:] = wte[inp[b,t],:] + wpe[pos0 + t,:]`, or with
//! per-row positions `wpe[pos[b*t]]` (a server's sequences, each at its own
//! position: `EncoderParams::pos`).

/// Vectorised kernel: one thread per 4 consecutive channels (needs `c % 4 == 0`
/// and 16-byte aligned buffers, which the host checks before choosing it).
pub const ENCODER_FORWARD: &str = "encoder_forward";
/// [`ENCODER_FORWARD`] over a bf16 `wte` (`EncoderParams<u16>`, bf16 bits),
/// for the bf16 engine; `wpe` and the output stay f32.
pub const ENCODER_FORWARD_BF16: &str = "encoder_forward_bf16";
/// Baseline: one thread per output element.
pub const ENCODER_FORWARD_NAIVE: &str = "encoder_forward_naive";
/// Threads per block of both encoder kernels (elementwise work: 256 keeps
/// enough warps resident per SM without limiting blocks per SM).
pub const ENCODER_BLOCK: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EncoderParams<W = f32> {
    /// `[b * t * c]`
    pub out: *mut f32,
    /// Token ids `[b * t]`.
    pub inp: *const u32,
    /// `[wte_rows * c]`: f32, or bf16 bits (`W = u16`).
    pub wte: *const W,
    /// `[wpe_rows * c]`; with `pos` null, `pos0 + t <= wpe_rows` (the host
    /// checks).
    pub wpe: *const f32,
    /// Null: row `(b, t)` takes position `pos0 + t`. Else `[b * t]`
    /// per-row positions; one at or past `wpe_rows` reads the last row of
    /// `wpe` (an idle row of a decode step, whose output nobody reads),
    /// never out of bounds.
    pub pos: *const u32,
    pub b: u32,
    pub t: u32,
    pub c: u32,
    pub pos0: u32,
    /// Rows of `wte`: a token id at or past it yields a NaN row instead of
    /// an out-of-bounds read (the engine rejects such ids before upload).
    pub wte_rows: u32,
    /// Rows of `wpe`.
    pub wpe_rows: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe EncoderParams<f32>, EncoderParams<u16>);
