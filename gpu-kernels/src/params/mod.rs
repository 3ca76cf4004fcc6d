//! The contract between host and kernels: for every kernel, its PTX name and
//! one `#[repr(C)]` struct of arguments, passed by value.
//!
//! This module compiles for the host too, so the host builds exactly the
//! struct the kernel reads. Device pointers are raw pointers here; the host
//! fills them with device addresses (`CUdeviceptr as *mut f32`).

/// Marker for kernel parameter structs.
///
/// # Safety
/// Implement only for `#[repr(C)]`, `Copy` structs made of plain numbers and
/// device pointers, whose layout is the same on host and device (both are
/// 64-bit little-endian, so that holds for such structs).
pub unsafe trait KernelParams: Copy {}

macro_rules! kernel_params {
    ($($t:ty),* $(,)?) => { $(unsafe impl KernelParams for $t {})* };
}

/// `out[i] = a * x[i] + y[i]`: the smallest kernel, used to prove the pipeline.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SaxpyParams {
    pub out: *mut f32,
    pub x: *const f32,
    pub y: *const f32,
    pub a: f32,
    pub n: u32,
}

/// PTX names of the kernels, one constant per kernel.
pub mod names {
    pub const SAXPY: &str = "saxpy";
}

kernel_params!(SaxpyParams);
