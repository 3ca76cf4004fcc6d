//! `crossentropy_forward`: each position's negative log-likelihood of its
//! target, from the logits on the device (twin of `cpu::ops::crossentropy_forward`).

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::crossentropy::{CROSSENTROPY_BLOCK, CROSSENTROPY_FORWARD, CrossentropyParams};

use super::args::{OpError, check_len, in_ptr, out_ptr, to_u32};
use crate::Gpu;

const OP: &str = "crossentropy_forward";
/// Shared floats of a block reduction (one per warp of the largest block).
const REDUCE_SCRATCH_BYTES: u32 = 32 * 4;

/// Launch configuration: one block per row.
pub fn launch_config(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n, 1, 1),
        block_dim: (CROSSENTROPY_BLOCK, 1, 1),
        shared_mem_bytes: REDUCE_SCRATCH_BYTES,
    }
}

/// `losses[i] = logsumexp(logits[i, ..v]) - logits[i, targets[i]]` (nats)
/// for the `n` rows of `vp` logits; 0 where `targets[i]` is
/// `IGNORED_TARGET`, NaN for any other target `>= v`.
pub fn crossentropy_forward(
    gpu: &Gpu,
    losses: &mut impl DevicePtrMut<f32>,
    logits: &impl DevicePtr<f32>,
    targets: &impl DevicePtr<u32>,
    n: usize,
    v: usize,
    vp: usize,
) -> Result<(), OpError> {
    if v > vp || v == 0 {
        return Err(OpError::shape(OP, format!("need 0 < v <= vp, got v = {v}, vp = {vp}")));
    }
    check_len(OP, "losses", losses.len(), n)?;
    check_len(OP, "targets", targets.len(), n)?;
    check_len(OP, "logits", logits.len(), n * vp)?;
    if n == 0 {
        return Ok(());
    }
    let params = CrossentropyParams {
        losses: out_ptr(gpu, losses),
        logits: in_ptr(gpu, logits),
        targets: in_ptr(gpu, targets),
        n: to_u32(OP, "n", n)?,
        v: to_u32(OP, "v", v)?,
        vp: to_u32(OP, "vp", vp)?,
    };
    // SAFETY: losses and targets hold n entries, logits n rows of vp
    // (checked); the kernel reads a row only below v and never indexes with
    // a target >= v; it gets its 32 floats of shared memory.
    unsafe { gpu.launch(CROSSENTROPY_FORWARD, launch_config(params.n), params)? };
    Ok(())
}
