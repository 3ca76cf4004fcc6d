//! `out = inp1 + inp2`, elementwise.

/// Vectorised: one thread per 4 elements (16-byte loads), scalar tail.
pub const RESIDUAL_FORWARD: &str = "residual_forward";
/// Baseline: one thread per element.
pub const RESIDUAL_FORWARD_NAIVE: &str = "residual_forward_naive";
/// Threads per block of both kernels.
pub const RESIDUAL_BLOCK: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ResidualParams {
    /// `[n]`
    pub out: *mut f32,
    /// `[n]`
    pub inp1: *const f32,
    /// `[n]`
    pub inp2: *const f32,
    pub n: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe ResidualParams);
