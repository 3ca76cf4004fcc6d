//! `gelu_forward`: GELU, tanh approximation (twin of `cpu::ops::gelu_forward`).

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::gelu::{GELU_BLOCK, GELU_FORWARD, GELU_FORWARD_NAIVE, GeluParams};

use super::args::{OpError, Variant, aligned16, blocks_for, check_len, in_ptr, out_ptr, to_u32};
use crate::Gpu;

const OP: &str = "gelu_forward";
/// Elements per thread of the vectorised kernel.
const VEC: u32 = 4;

/// Launch configuration: a grid-stride loop over `work` items.
pub fn launch_config(work: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(work, GELU_BLOCK), 1, 1),
        block_dim: (GELU_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out = gelu(inp)` over `n` elements.
pub fn gelu_forward(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    gelu_forward_variant(gpu, Variant::Best, out, inp, n)
}

/// [`gelu_forward`] on the baseline kernel.
pub fn gelu_forward_naive(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    gelu_forward_variant(gpu, Variant::Naive, out, inp, n)
}

/// [`gelu_forward`] with the kernel chosen by `variant`.
pub fn gelu_forward_variant(
    gpu: &Gpu,
    variant: Variant,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    let n32 = to_u32(OP, "n", n)?;
    check_len(OP, "out", out.len(), n)?;
    check_len(OP, "inp", inp.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let params = GeluParams {
        out: out_ptr(gpu, out),
        inp: in_ptr(gpu, inp),
        n: n32,
    };
    let vec = variant == Variant::Best && aligned16(&[params.out as usize, params.inp as usize]);
    let (name, cfg) = if vec {
        // One thread per vector; the first n % 4 threads also take the tail.
        (GELU_FORWARD, launch_config((n32 / VEC).max(n32 % VEC)))
    } else {
        (GELU_FORWARD_NAIVE, launch_config(n32))
    };
    // SAFETY: both buffers hold n floats (checked); the vector kernel runs
    // only on 16-byte aligned buffers.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}
