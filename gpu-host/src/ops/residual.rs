//! `residual_forward`: `out = inp1 + inp2` (twin of `cpu::ops::residual_forward`).

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::residual::{RESIDUAL_BLOCK, RESIDUAL_FORWARD, RESIDUAL_FORWARD_NAIVE, ResidualParams};

use super::args::{OpError, Variant, aligned16, blocks_for, check_len, in_ptr, out_ptr, to_u32};
use crate::Gpu;

const OP: &str = "residual_forward";
/// Elements per thread of the vectorised kernel.
const VEC: u32 = 4;

/// Launch configuration: a grid-stride loop over `work` items.
pub fn launch_config(work: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(work, RESIDUAL_BLOCK), 1, 1),
        block_dim: (RESIDUAL_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out = inp1 + inp2` over `n` elements.
pub fn residual_forward(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp1: &impl DevicePtr<f32>,
    inp2: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    residual_forward_variant(gpu, Variant::Best, out, inp1, inp2, n)
}

/// [`residual_forward`] on the baseline kernel.
pub fn residual_forward_naive(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp1: &impl DevicePtr<f32>,
    inp2: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    residual_forward_variant(gpu, Variant::Naive, out, inp1, inp2, n)
}

/// [`residual_forward`] with the kernel chosen by `variant`.
pub fn residual_forward_variant(
    gpu: &Gpu,
    variant: Variant,
    out: &mut impl DevicePtrMut<f32>,
    inp1: &impl DevicePtr<f32>,
    inp2: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    let n32 = to_u32(OP, "n", n)?;
    check_len(OP, "out", out.len(), n)?;
    check_len(OP, "inp1", inp1.len(), n)?;
    check_len(OP, "inp2", inp2.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let params = ResidualParams {
        out: out_ptr(gpu, out),
        inp1: in_ptr(gpu, inp1),
        inp2: in_ptr(gpu, inp2),
        n: n32,
    };
    let vec = variant == Variant::Best && aligned16(&[params.out as usize, params.inp1 as usize, params.inp2 as usize]);
    let (name, cfg) = if vec {
        // One thread per vector; the first n % 4 threads also take the tail.
        (RESIDUAL_FORWARD, launch_config((n32 / VEC).max(n32 % VEC)))
    } else {
        (RESIDUAL_FORWARD_NAIVE, launch_config(n32))
    };
    // SAFETY: all three buffers hold n floats (checked); the vector kernel
    // runs only on 16-byte aligned buffers.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}
