//! `argmax_forward`: greedy token choice on the device, so only ids come
//! back to the host. Twin of `cpu::forward::argmax` applied per row.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::argmax::{ARGMAX_BLOCK, ARGMAX_FORWARD, ArgmaxParams};

use super::args::{OpError, check_len, in_ptr, out_ptr, to_u32};
use crate::Gpu;

const OP: &str = "argmax_forward";
/// Shared memory: 32 values and 32 indices (one pair per warp).
const SHARED_BYTES: u32 = 2 * 32 * 4;

/// Launch configuration: one block per row.
pub fn launch_config(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (ARGMAX_BLOCK, 1, 1),
        shared_mem_bytes: SHARED_BYTES,
    }
}

/// `out[i] = argmax_{j < v} logits[i * row_stride + j]` for `i < n` (ties to
/// the lowest id; NaN never wins).
pub fn argmax_forward(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<u32>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    row_stride: usize,
) -> Result<(), OpError> {
    launch(gpu, out, None::<&mut CudaSlice<f32>>, logits, n, v, row_stride)
}

/// [`argmax_forward`], also writing each row's chosen logit to `values[i]`
/// (tensor-parallel ranks compare their best candidates by it).
pub fn argmax_forward_values(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<u32>,
    values: &mut impl DevicePtrMut<f32>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    row_stride: usize,
) -> Result<(), OpError> {
    launch(gpu, out, Some(values), logits, n, v, row_stride)
}

/// Both entry points: checks every length, then one launch.
fn launch(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<u32>,
    values: Option<&mut impl DevicePtrMut<f32>>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    row_stride: usize,
) -> Result<(), OpError> {
    if v == 0 {
        return Err(OpError::shape(OP, "empty vocabulary"));
    }
    check_len(OP, "out", out.len(), n)?;
    if let Some(values) = &values {
        check_len(OP, "values", values.len(), n)?;
    }
    if n == 0 {
        return Ok(());
    }
    let need = (n - 1) * row_stride + v;
    check_len(OP, "logits", logits.len(), need)?;
    to_u32(OP, "logits span", need)?;
    let params = ArgmaxParams {
        out: out_ptr(gpu, out),
        values: values.map_or(std::ptr::null_mut(), |v| out_ptr(gpu, v)),
        logits: in_ptr(gpu, logits),
        n: to_u32(OP, "n", n)?,
        v: v as u32,
        row_stride: to_u32(OP, "row_stride", row_stride)?,
    };
    // SAFETY: out (and values, when given) hold n entries, logits every
    // row's first v entries (checked); the kernel gets its 64 words of
    // shared memory.
    unsafe { gpu.launch(ARGMAX_FORWARD, launch_config(params.n), params)? };
    Ok(())
}
