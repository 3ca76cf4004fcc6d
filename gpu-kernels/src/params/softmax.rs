//! Row softmax over the real vocabulary: `probs[i, j] = exp(l[i, j] - max) / sum`
//! for `j < v`, and 0 for padded columns `v <= j < vp`.

/// One block per row, block reductions (max, then sum).
pub const SOFTMAX_FORWARD: &str = "softmax_forward";
/// Baseline: one thread per row.
pub const SOFTMAX_FORWARD_NAIVE: &str = "softmax_forward_naive";
/// Threads per block of `softmax_forward` (rows are long: 50k entries).
pub const SOFTMAX_BLOCK: u32 = 512;
/// Threads per block of the naive kernel.
pub const SOFTMAX_NAIVE_BLOCK: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxParams {
    /// `[n * vp]`
    pub probs: *mut f32,
    /// `[n * vp]`
    pub logits: *const f32,
    pub n: u32,
    pub v: u32,
    pub vp: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe SoftmaxParams);
