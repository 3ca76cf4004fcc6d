//! Argument checks shared by the forward-pass launch wrappers: buffer
//! lengths, 32-bit sizes, device addresses of buffers and views.
//!
//! The wrappers accept anything cudarc can hand out as device memory
//! (`CudaSlice`, `CudaView`, `CudaViewMut`), so the engine can pass
//! per-layer sub-ranges. A buffer may be longer than needed: only its
//! prefix is used (activations are sized for the largest batch).

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::runtime::{Gpu, GpuError};

/// Why a launch wrapper refused its arguments (or the launch failed).
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{op}: buffer `{what}` holds {have} elements, {need} needed")]
    TooSmall {
        op: &'static str,
        what: &'static str,
        have: usize,
        need: usize,
    },
    #[error("{op}: {what} = {value} does not fit the kernel's 32-bit sizes")]
    TooLarge {
        op: &'static str,
        what: &'static str,
        value: usize,
    },
    #[error("{op}: {msg}")]
    Shape { op: &'static str, msg: String },
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl OpError {
    /// A shape the kernel cannot handle, with the reason.
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        OpError::Shape { op, msg: msg.into() }
    }
}

/// `Ok` when `have >= need`.
pub fn check_len(op: &'static str, what: &'static str, have: usize, need: usize) -> Result<(), OpError> {
    if have < need {
        Err(OpError::TooSmall { op, what, have, need })
    } else {
        Ok(())
    }
}

/// `value` as the kernel's `u32`.
pub fn to_u32(op: &'static str, what: &'static str, value: usize) -> Result<u32, OpError> {
    u32::try_from(value).map_err(|_| OpError::TooLarge { op, what, value })
}

/// Checks that a product of sizes (an element count the kernel computes in
/// 32 bits) fits.
pub fn count_u32(op: &'static str, what: &'static str, factors: &[usize]) -> Result<u32, OpError> {
    let value = factors
        .iter()
        .try_fold(1usize, |a, &f| a.checked_mul(f))
        .unwrap_or(usize::MAX);
    to_u32(op, what, value)
}

/// Device address of an input buffer or view.
///
/// The guard cudarc returns records an event for cross-stream tracking;
/// `Gpu` disables that tracking (one stream), so dropping it here is a no-op.
pub fn in_ptr<T>(gpu: &Gpu, x: &impl DevicePtr<T>) -> *const T {
    let (p, _guard) = x.device_ptr(&gpu.stream);
    p as *const T
}

/// Device address of an output buffer or view (see [`in_ptr`]).
pub fn out_ptr<T>(gpu: &Gpu, x: &mut impl DevicePtrMut<T>) -> *mut T {
    let (p, _guard) = x.device_ptr_mut(&gpu.stream);
    p as *mut T
}

/// Bytes of a 16-byte vector: vectorised kernels need this alignment.
pub const VEC_ALIGN: usize = 16;

/// Largest grid y/z extent CUDA allows.
pub const MAX_GRID_YZ: u32 = 65535;

/// Whether all device addresses are 16-byte aligned (for the vectorised kernels).
pub fn aligned16(ptrs: &[usize]) -> bool {
    ptrs.iter().all(|p| p % VEC_ALIGN == 0)
}

/// Blocks of `block` threads to cover `work` items, one item per thread,
/// at least one block.
pub fn blocks_for(work: u32, block: u32) -> u32 {
    work.div_ceil(block).max(1)
}

/// Which kernel of an op runs: tests run both and compare them with the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The optimised kernel (it may still fall back to a simpler one when a
    /// shape or alignment rules out its fast path).
    Best,
    /// The plain baseline kernel (`<name>_naive`).
    Naive,
}
