//! Encoder: `out[b,t,:] = wte[inp[b,t],:] + wpe[pos0 + t,:]`.

/// Vectorised kernel: one thread per 4 consecutive channels (needs `c % 4 == 0`
/// and 16-byte aligned buffers, which the host checks before choosing it).
pub const ENCODER_FORWARD: &str = "encoder_forward";
/// Baseline: one thread per output element.
pub const ENCODER_FORWARD_NAIVE: &str = "encoder_forward_naive";
/// Threads per block of both encoder kernels (elementwise work: 256 keeps
/// enough warps resident per SM without limiting blocks per SM).
pub const ENCODER_BLOCK: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EncoderParams {
    /// `[b * t * c]`
    pub out: *mut f32,
    /// Token ids `[b * t]`.
    pub inp: *const u32,
    /// `[wte_rows * c]`
    pub wte: *const f32,
    /// `[max_t * c]`, `pos0 + t <= max_t` (the host checks).
    pub wpe: *const f32,
    pub b: u32,
    pub t: u32,
    pub c: u32,
    pub pos0: u32,
    /// Rows of `wte`: a token id at or past it yields a NaN row instead of
    /// an out-of-bounds read (the engine rejects such ids before upload).
    pub wte_rows: u32,
}

crate::kernel_params!(EncoderParams);
