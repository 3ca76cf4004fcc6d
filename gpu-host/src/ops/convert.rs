//! `convert_to_f32` / `convert_to_bf16`: checkpoint bytes (f32/bf16/f16,
//! maybe transposed) to f32 or bf16 in (out, in) layout, on the device, so
//! the host never converts or copies the mapped weights.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::KernelParams;
use gpu_kernels::params::convert::{
    CONVERT_BLOCK, CONVERT_DTYPE_BF16, CONVERT_DTYPE_F16, CONVERT_DTYPE_F32, CONVERT_TO_BF16, CONVERT_TO_F32,
    ConvertParams, ROUND_TF32, RoundTf32Params,
};
use half::bf16;

use super::args::{OpError, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::DType;
use crate::Gpu;

const OP: &str = "convert_to_f32";

/// Launch configuration: a grid-stride loop over `work` elements.
pub fn launch_config(work: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(work, CONVERT_BLOCK), 1, 1),
        block_dim: (CONVERT_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out[o * cols + i]` = element `(o, i)` of the `rows x cols` tensor whose
/// raw bytes are `inp` (stored `(cols, rows)` when `transposed`).
pub fn convert_to_f32(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u8>,
    rows: usize,
    cols: usize,
    dtype: DType,
    transposed: bool,
) -> Result<(), OpError> {
    let out_len = out.len();
    let out = out_ptr(gpu, out);
    check_len(OP, "out", out_len, rows * cols)?;
    let src = Source {
        rows,
        cols,
        dtype,
        transposed,
    };
    convert(gpu, CONVERT_TO_F32, out, inp, src)
}

/// [`convert_to_f32`] to bf16, rounded to nearest even (CPU twin:
/// `half::bf16::from_f32` of each element).
pub fn convert_to_bf16(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<bf16>,
    inp: &impl DevicePtr<u8>,
    rows: usize,
    cols: usize,
    dtype: DType,
    transposed: bool,
) -> Result<(), OpError> {
    let out_len = out.len();
    let out = out_ptr(gpu, out) as *mut u16;
    check_len(OP, "out", out_len, rows * cols)?;
    let src = Source {
        rows,
        cols,
        dtype,
        transposed,
    };
    convert(gpu, CONVERT_TO_BF16, out, inp, src)
}

/// How the input bytes hold the `rows x cols` tensor: elements of `dtype`,
/// stored `(cols, rows)` when `transposed`.
#[derive(Clone, Copy)]
struct Source {
    rows: usize,
    cols: usize,
    dtype: DType,
    transposed: bool,
}

/// The launch both conversions share: `kernel` takes a `ConvertParams<O>`
/// whose `out` (checked by the caller) holds `rows * cols` elements of `O`.
fn convert<O>(
    gpu: &Gpu,
    kernel: &'static str,
    out: *mut O,
    inp: &impl DevicePtr<u8>,
    src: Source,
) -> Result<(), OpError>
where
    ConvertParams<O>: KernelParams,
{
    let Source {
        rows,
        cols,
        dtype,
        transposed,
    } = src;
    let total = count_u32(OP, "rows * cols", &[rows, cols])?;
    check_len(OP, "inp (bytes)", inp.len(), rows * cols * dtype.size())?;
    if total == 0 {
        return Ok(());
    }
    let params = ConvertParams {
        out,
        inp: in_ptr(gpu, inp),
        rows: to_u32(OP, "rows", rows)?,
        cols: to_u32(OP, "cols", cols)?,
        dtype: match dtype {
            DType::F32 => CONVERT_DTYPE_F32,
            DType::BF16 => CONVERT_DTYPE_BF16,
            DType::F16 => CONVERT_DTYPE_F16,
        },
        transposed: transposed as u32,
    };
    if !(params.inp as usize).is_multiple_of(dtype.size()) {
        return Err(OpError::shape(OP, "input bytes are not aligned to the element size"));
    }
    // SAFETY: out holds rows*cols elements of O, the kernel's output type
    // (the callers check and pair CONVERT_TO_F32 with f32, CONVERT_TO_BF16
    // with bf16 bits); inp rows*cols elements of dtype, aligned to the
    // element size (checked).
    unsafe { gpu.launch(kernel, launch_config(total), params)? };
    Ok(())
}

/// `round_tf32`: round `x[..n]` to the nearest TF32 value in place (CPU
/// twin: `cpu::ops::round_tf32`).
pub fn round_tf32(gpu: &Gpu, x: &mut impl DevicePtrMut<f32>, n: usize) -> Result<(), OpError> {
    const OP: &str = "round_tf32";
    let total = count_u32(OP, "n", &[n])?;
    check_len(OP, "x", x.len(), n)?;
    if total == 0 {
        return Ok(());
    }
    let params = RoundTf32Params {
        x: out_ptr(gpu, x),
        n: total,
    };
    // SAFETY: x holds n floats (checked).
    unsafe { gpu.launch(ROUND_TF32, launch_config(total), params)? };
    Ok(())
}

/// `out[..n]` = `inp[..n]` rounded to bf16, to nearest even (CPU twin:
/// `half::bf16::from_f32` of each element): an activation made in f32 for a
/// bf16 matmul that reads it next (the `convert_to_bf16` kernel, reading
/// the floats as a plain `n x 1` f32 tensor).
pub fn f32_to_bf16(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<bf16>,
    inp: &impl DevicePtr<f32>,
    n: usize,
) -> Result<(), OpError> {
    const OP: &str = "f32_to_bf16";
    let total = count_u32(OP, "n", &[n])?;
    check_len(OP, "out", out.len(), n)?;
    check_len(OP, "inp", inp.len(), n)?;
    if total == 0 {
        return Ok(());
    }
    let params = ConvertParams {
        out: out_ptr(gpu, out).cast::<u16>(),
        inp: in_ptr(gpu, inp).cast::<u8>(),
        rows: total,
        cols: 1,
        dtype: CONVERT_DTYPE_F32,
        transposed: 0,
    };
    // SAFETY: out holds n bf16 (the kernel's u16 bits) and inp n floats
    // (checked), aligned as their element types; CONVERT_TO_BF16 takes
    // ConvertParams<u16>.
    unsafe { gpu.launch(CONVERT_TO_BF16, launch_config(total), params)? };
    Ok(())
}
