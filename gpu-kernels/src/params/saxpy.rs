//! `out[i] = a * x[i] + y[i]`: the smallest kernel, used to prove the pipeline.

pub const SAXPY: &str = "saxpy";

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SaxpyParams {
    pub out: *mut f32,
    pub x: *const f32,
    pub y: *const f32,
    pub a: f32,
    pub n: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe SaxpyParams);
