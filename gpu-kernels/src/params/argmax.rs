//! Greedy decoding: the index of the largest logit among the real vocabulary
//! of each row (ties go to the lowest index), so the host reads back only ids.

/// One block per row, warp-shuffle (value, index) reductions.
pub const ARGMAX_FORWARD: &str = "argmax_forward";
/// Threads per block.
pub const ARGMAX_BLOCK: u32 = 512;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ArgmaxParams {
    /// `[n]` ids
    pub out: *mut u32,
    /// `[n]` the chosen logits, or null: not written. (Tensor-parallel ranks
    /// compare their best candidates by value.)
    pub values: *mut f32,
    /// Row `i` starts at `logits + i * row_stride` and has at least `v` entries.
    pub logits: *const f32,
    pub n: u32,
    /// Real vocabulary size: entries `>= v` are padding and never chosen.
    pub v: u32,
    /// Distance between rows, in floats (`vp` for consecutive rows).
    pub row_stride: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe ArgmaxParams);
