//! GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.

/// Vectorised: one thread per 4 elements (16-byte loads), scalar tail.
pub const GELU_FORWARD: &str = "gelu_forward";
/// Baseline: one thread per element.
pub const GELU_FORWARD_NAIVE: &str = "gelu_forward_naive";
/// Threads per block of both kernels.
pub const GELU_BLOCK: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GeluParams {
    /// `[n]`
    pub out: *mut f32,
    /// `[n]`
    pub inp: *const f32,
    pub n: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe GeluParams);
