//! Cross-entropy of next-token targets under rows of logits, over the real
//! vocabulary: `losses[i] = logsumexp(logits[i, ..v]) - logits[i, targets[i]]`
//! (nats), or 0 where `targets[i] == IGNORED_TARGET` (NaN for any other
//! id `>= v`). Perplexity reads one
//! float per position back instead of a row of logits.

/// One block per row, block reductions (max, then sum of exponentials).
pub const CROSSENTROPY_FORWARD: &str = "crossentropy_forward";
/// Threads per block (rows are long: 50k entries).
pub const CROSSENTROPY_BLOCK: u32 = 512;
/// A target that is not scored: its loss is 0 and its row is not read.
pub const IGNORED_TARGET: u32 = u32::MAX;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CrossentropyParams {
    /// `[n]` losses (nats).
    pub losses: *mut f32,
    /// `[n * vp]`: row `i` scores `targets[i]`.
    pub logits: *const f32,
    /// `[n]` ids below `v`, or [`IGNORED_TARGET`] (loss 0); any other id
    /// gets a NaN loss.
    pub targets: *const u32,
    pub n: u32,
    /// Real vocabulary size: entries `>= v` are padding and never read.
    pub v: u32,
    /// Distance between rows, in floats.
    pub vp: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe CrossentropyParams);
