//! `matmul_forward`: `out = inp · weightᵀ + bias` in FP32 (twin of
//! `cpu::ops::matmul_forward`), with an optional fused GELU epilogue.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::matmul::{
    MATMUL_BLOCK, MATMUL_BLOCK_MID, MATMUL_FORWARD, MATMUL_FORWARD_GEMV, MATMUL_FORWARD_MID, MATMUL_FORWARD_NAIVE,
    MATMUL_GEMV_BLOCK, MATMUL_GEMV_MAX_ROWS, MATMUL_NAIVE_SIDE, MATMUL_TILE_M, MATMUL_TILE_M_MID, MATMUL_TILE_N,
    MatmulParams, matmul_shared_bytes,
};

use super::args::{OpError, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::gpu::Gpu;

const OP: &str = "matmul_forward";
/// Threads per warp (the GEMV kernel gives each output column one warp).
const WARP: u32 = 32;
/// Largest grid y/z extent CUDA allows.
const MAX_GRID_YZ: u32 = 65535;
/// SMs of the GPUs we tune for (H100 SXM and H200 SXM both have 132): below
/// this many large tiles the tiled kernel switches to the mid-size tile,
/// which doubles the blocks so the first wave fills more SMs.
const FILL_SMS: u32 = 132;

/// Rows per block tile of the tiled kernel [`launch_config`] picks for an
/// `n x oc` output: the 128x128 tile when it gives at least one block per
/// SM, else the 64x128 one.
pub fn tiled_tile_m(n: u32, oc: u32) -> u32 {
    let large_blocks = n.div_ceil(MATMUL_TILE_M) * oc.div_ceil(MATMUL_TILE_N);
    if large_blocks >= FILL_SMS {
        MATMUL_TILE_M
    } else {
        MATMUL_TILE_M_MID
    }
}

/// Blocks the tiled kernel launches for an `n x oc` output.
pub fn tiled_blocks(n: u32, oc: u32) -> u32 {
    n.div_ceil(tiled_tile_m(n, oc)) * oc.div_ceil(MATMUL_TILE_N)
}

/// Which matmul kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// GEMV for `n <= MATMUL_GEMV_MAX_ROWS` (decode), else tiled.
    Auto,
    Tiled,
    Gemv,
    Naive,
}

/// The kernel [`MatmulKernel::Auto`] picks for `n` rows.
pub fn choose(n: usize) -> MatmulKernel {
    if n <= MATMUL_GEMV_MAX_ROWS as usize {
        MatmulKernel::Gemv
    } else {
        MatmulKernel::Tiled
    }
}

/// Kernel name and launch configuration for an `n x oc` output.
pub fn launch_config(kernel: MatmulKernel, n: u32, oc: u32) -> Result<(&'static str, LaunchConfig), OpError> {
    let cfg = match kernel {
        MatmulKernel::Auto => return launch_config(choose(n as usize), n, oc),
        MatmulKernel::Tiled => {
            let tile_m = tiled_tile_m(n, oc);
            let (name, threads) = if tile_m == MATMUL_TILE_M {
                (MATMUL_FORWARD, MATMUL_BLOCK)
            } else {
                (MATMUL_FORWARD_MID, MATMUL_BLOCK_MID)
            };
            (
                name,
                LaunchConfig {
                    grid_dim: (oc.div_ceil(MATMUL_TILE_N), n.div_ceil(tile_m), 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: matmul_shared_bytes(tile_m),
                },
            )
        }
        MatmulKernel::Gemv => {
            if n > MATMUL_GEMV_MAX_ROWS {
                return Err(OpError::shape(
                    OP,
                    format!("the GEMV kernel takes at most {MATMUL_GEMV_MAX_ROWS} rows, got {n}"),
                ));
            }
            let cols_per_block = MATMUL_GEMV_BLOCK / WARP;
            (
                MATMUL_FORWARD_GEMV,
                LaunchConfig {
                    grid_dim: (oc.div_ceil(cols_per_block), 1, 1),
                    block_dim: (MATMUL_GEMV_BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        }
        MatmulKernel::Naive => (
            MATMUL_FORWARD_NAIVE,
            LaunchConfig {
                grid_dim: (oc.div_ceil(MATMUL_NAIVE_SIDE), n.div_ceil(MATMUL_NAIVE_SIDE), 1),
                block_dim: (MATMUL_NAIVE_SIDE, MATMUL_NAIVE_SIDE, 1),
                shared_mem_bytes: 0,
            },
        ),
    };
    if cfg.1.grid_dim.1 > MAX_GRID_YZ {
        return Err(OpError::TooLarge {
            op: OP,
            what: "row blocks",
            value: cfg.1.grid_dim.1 as usize,
        });
    }
    Ok(cfg)
}

/// `out[n, oc] = inp[n, c] · weight[oc, c]ᵀ (+ bias[oc])`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    n: usize,
    c: usize,
    oc: usize,
) -> Result<(), OpError> {
    matmul_forward_with(gpu, MatmulKernel::Auto, false, out, inp, weight, bias, n, c, oc)
}

/// [`matmul_forward`] followed by GELU, fused into the epilogue.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward_gelu<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    n: usize,
    c: usize,
    oc: usize,
) -> Result<(), OpError> {
    matmul_forward_with(gpu, MatmulKernel::Auto, true, out, inp, weight, bias, n, c, oc)
}

/// [`matmul_forward`] on the baseline kernel.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward_naive<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    n: usize,
    c: usize,
    oc: usize,
) -> Result<(), OpError> {
    matmul_forward_with(gpu, MatmulKernel::Naive, false, out, inp, weight, bias, n, c, oc)
}

/// The matmul on a chosen kernel, with or without the GELU epilogue.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward_with<B: DevicePtr<f32>>(
    gpu: &Gpu,
    kernel: MatmulKernel,
    gelu: bool,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    n: usize,
    c: usize,
    oc: usize,
) -> Result<(), OpError> {
    count_u32(OP, "n * c", &[n, c])?;
    count_u32(OP, "n * oc", &[n, oc])?;
    count_u32(OP, "oc * c", &[oc, c])?;
    check_len(OP, "out", out.len(), n * oc)?;
    check_len(OP, "inp", inp.len(), n * c)?;
    check_len(OP, "weight", weight.len(), oc * c)?;
    if let Some(b) = bias {
        check_len(OP, "bias", b.len(), oc)?;
    }
    if n == 0 || oc == 0 {
        return Ok(());
    }
    let (name, cfg) = launch_config(kernel, to_u32(OP, "n", n)?, to_u32(OP, "oc", oc)?)?;
    let params = MatmulParams {
        out: out_ptr(gpu, out),
        inp: in_ptr(gpu, inp),
        weight: in_ptr(gpu, weight),
        bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        n: n as u32,
        c: c as u32,
        oc: oc as u32,
        gelu: gelu as u32,
    };
    // SAFETY: out n*oc, inp n*c, weight oc*c and bias oc floats (checked);
    // the configuration comes from `launch_config` for this kernel (tile
    // sizes and shared memory from the same params constants the kernel
    // uses; GEMV only for n <= MATMUL_GEMV_MAX_ROWS); kernels check
    // alignment before any 16-byte access.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}
