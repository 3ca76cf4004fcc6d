//! `matmul_forward_bf16`: the prefill matmul with bf16 weights, on the bf16
//! tensor cores (`mma.sync.m16n8k16`): `inp` (f32) is rounded to bf16 (to
//! nearest, ties to even) in the kernel, products are accumulated in f32,
//! then the bias and optionally GELU. CPU twin: `cpu::ops::matmul_forward_bf16`.
//!
//! Two tile shapes are compiled (`MATMUL_BF16_VARIANTS`); [`choose_tile`]
//! picks one per GEMM shape, [`matmul_forward_bf16_with`] runs a given one.

use cudarc::driver::{CudaSlice, LaunchConfig};
use gpu_kernels::params::matmul_bf16::{
    Bf16TileShape, MATMUL_BF16_64X64, MATMUL_BF16_128X128, MATMUL_BF16_C_MULTIPLE, MatmulBf16Params,
};

use super::args::{OpError, aligned16, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::gpu::Gpu;

const OP: &str = "matmul_forward_bf16";

/// `c` must be a multiple of this (see `MATMUL_BF16_C_MULTIPLE`).
pub const BF16_C_MULTIPLE: usize = MATMUL_BF16_C_MULTIPLE as usize;

/// Blocks a launch of `shape` needs for an `n x oc` output: one per tile.
pub fn bf16_blocks(shape: &Bf16TileShape, n: usize, oc: usize) -> usize {
    n.div_ceil(shape.bm as usize) * oc.div_ceil(shape.bn as usize)
}

/// The tile for an `n x oc` output on a GPU of `sms` multiprocessors:
/// 128x128 (the most tensor work per staged byte) when it gives every SM a
/// block at least, else 64x64, which makes four times the blocks, so a short
/// prompt still spreads over the whole GPU.
pub fn choose_tile(n: usize, oc: usize, sms: usize) -> Bf16TileShape {
    if bf16_blocks(&MATMUL_BF16_128X128, n, oc) >= sms {
        MATMUL_BF16_128X128
    } else {
        MATMUL_BF16_64X64
    }
}

/// Launch configuration of `shape` for an `n x oc` output: a 1-D grid of
/// one block per output tile (the kernel maps block index to tile, grouped
/// along M), the shape's threads and dynamic shared memory.
pub fn launch_config(shape: &Bf16TileShape, n: usize, oc: usize) -> Result<LaunchConfig, OpError> {
    Ok(LaunchConfig {
        grid_dim: (to_u32(OP, "blocks", bf16_blocks(shape, n, oc))?, 1, 1),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: shape.shared_bytes(),
    })
}

/// `out[n, oc] = round_bf16(inp[n, c]) · weight[oc, c]ᵀ (+ bias[oc])`, then
/// GELU if `gelu`, f32 accumulation; the tile shape is chosen for the
/// GEMM's size ([`choose_tile`]). `c` must be a multiple of 8.
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward_bf16(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    n: usize,
    c: usize,
    oc: usize,
    gelu: bool,
) -> Result<(), OpError> {
    let shape = choose_tile(n, oc, gpu.sm_count());
    matmul_forward_bf16_with(gpu, &shape, out, inp, weight, bias, n, c, oc, gelu)
}

/// [`matmul_forward_bf16`] with an explicit tile shape (one of
/// `MATMUL_BF16_VARIANTS`).
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward_bf16_with(
    gpu: &Gpu,
    shape: &Bf16TileShape,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    n: usize,
    c: usize,
    oc: usize,
    gelu: bool,
) -> Result<(), OpError> {
    if !c.is_multiple_of(BF16_C_MULTIPLE) {
        return Err(OpError::shape(
            OP,
            format!("c = {c} is not a multiple of {BF16_C_MULTIPLE} (weight rows are copied in 16-byte chunks)"),
        ));
    }
    count_u32(OP, "n * c", &[n, c])?;
    count_u32(OP, "oc * c", &[oc, c])?;
    count_u32(OP, "n * oc", &[n, oc])?;
    check_len(OP, "out", out.len(), n * oc)?;
    check_len(OP, "inp", inp.len(), n * c)?;
    check_len(OP, "weight", weight.len(), oc * c)?;
    if let Some(b) = bias {
        check_len(OP, "bias", b.len(), oc)?;
    }
    if n == 0 || oc == 0 {
        return Ok(());
    }
    let params = MatmulBf16Params {
        out: out_ptr(gpu, out),
        inp: in_ptr(gpu, inp),
        weight: in_ptr(gpu, weight).cast::<u16>(),
        bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        n: to_u32(OP, "n", n)?,
        c: to_u32(OP, "c", c)?,
        oc: to_u32(OP, "oc", oc)?,
        gelu: gelu as u32,
    };
    if !aligned16(&[params.out as usize, params.inp as usize, params.weight as usize]) {
        return Err(OpError::shape(OP, "inp, weight and out must be 16-byte aligned"));
    }
    let cfg = launch_config(shape, n, oc)?;
    gpu.set_max_dynamic_shared(shape.name, shape.shared_bytes())?;
    // SAFETY: `shape.name` is the kernel compiled for `shape` (its name and
    // tile come from the same constant), whose parameter type is
    // MatmulBf16Params. `out` holds n*oc floats, `inp` n*c, `weight` oc*c
    // bf16 (two bytes each, as the kernel's u16), `bias` oc floats or is
    // null (all checked above); inp/weight/out are 16-byte aligned and
    // c % 8 == 0 (the kernel's cp.async contract). Grid, block and dynamic
    // shared memory come from `shape` (the kernel checks at compile time that
    // its layout takes `shared_bytes`), and the limit was raised for it.
    unsafe { gpu.launch(shape.name, cfg, params)? };
    Ok(())
}
