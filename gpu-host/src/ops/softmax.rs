//! `softmax_forward` over the real vocabulary (twin of `cpu::ops::softmax_forward`).

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::softmax::{
    SOFTMAX_BLOCK, SOFTMAX_FORWARD, SOFTMAX_FORWARD_NAIVE, SOFTMAX_NAIVE_BLOCK, SoftmaxParams,
};

use super::args::{OpError, Variant, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::Gpu;

const OP: &str = "softmax_forward";
/// Shared floats of a block reduction (one per warp of the largest block).
const REDUCE_SCRATCH_BYTES: u32 = 32 * 4;

/// Launch configuration of `variant` for `n` rows.
pub fn launch_config(variant: Variant, n: u32) -> (&'static str, LaunchConfig) {
    match variant {
        Variant::Best => (
            SOFTMAX_FORWARD,
            LaunchConfig {
                grid_dim: (n, 1, 1),
                block_dim: (SOFTMAX_BLOCK, 1, 1),
                shared_mem_bytes: REDUCE_SCRATCH_BYTES,
            },
        ),
        Variant::Naive => (
            SOFTMAX_FORWARD_NAIVE,
            LaunchConfig {
                grid_dim: (blocks_for(n, SOFTMAX_NAIVE_BLOCK), 1, 1),
                block_dim: (SOFTMAX_NAIVE_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
        ),
    }
}

/// Softmax of `n` rows of `vp` logits over their first `v` entries; the
/// padded entries get probability 0.
pub fn softmax_forward(
    gpu: &Gpu,
    probs: &mut impl DevicePtrMut<f32>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    vp: usize,
) -> Result<(), OpError> {
    softmax_forward_variant(gpu, Variant::Best, probs, logits, n, v, vp)
}

/// [`softmax_forward`] on the baseline kernel.
pub fn softmax_forward_naive(
    gpu: &Gpu,
    probs: &mut impl DevicePtrMut<f32>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    vp: usize,
) -> Result<(), OpError> {
    softmax_forward_variant(gpu, Variant::Naive, probs, logits, n, v, vp)
}

/// [`softmax_forward`] with the kernel chosen by `variant`.
pub fn softmax_forward_variant(
    gpu: &Gpu,
    variant: Variant,
    probs: &mut impl DevicePtrMut<f32>,
    logits: &impl DevicePtr<f32>,
    n: usize,
    v: usize,
    vp: usize,
) -> Result<(), OpError> {
    if v > vp || v == 0 {
        return Err(OpError::shape(OP, format!("need 0 < v <= vp, got v = {v}, vp = {vp}")));
    }
    count_u32(OP, "n * vp", &[n, vp])?;
    check_len(OP, "probs", probs.len(), n * vp)?;
    check_len(OP, "logits", logits.len(), n * vp)?;
    if n == 0 {
        return Ok(());
    }
    let params = SoftmaxParams {
        probs: out_ptr(gpu, probs),
        logits: in_ptr(gpu, logits),
        n: to_u32(OP, "n", n)?,
        v: v as u32,
        vp: vp as u32,
    };
    let (name, cfg) = launch_config(variant, params.n);
    // SAFETY: both buffers hold n*vp floats, v <= vp (checked); the block
    // kernel gets its 32 floats of reduction scratch.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}
