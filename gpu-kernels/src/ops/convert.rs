//! Checkpoint bytes to f32 or bf16 (out, in) on the device.

use crate::device::bf16::{bf16_to_f32, f32_to_bf16};
use crate::device::mma::to_tf32;
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::convert::{CONVERT_DTYPE_BF16, CONVERT_DTYPE_F16, ConvertParams, RoundTf32Params};
use core::arch::asm;

/// IEEE half to f32 (exact; `cvt.f32.f16` handles subnormals, inf, NaN).
#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    let r: f32;
    // SAFETY: a register-only conversion.
    unsafe { asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) bits, options(pure, nomem, nostack)) }
    r
}

/// Element `idx` of the logical `rows x cols` tensor `p.inp` (read from
/// where it is stored, transposed or not), as f32.
///
/// # Safety
/// `idx < rows * cols`; `inp` holds `rows * cols` elements of `dtype`,
/// aligned to the element size.
#[inline(always)]
unsafe fn read_element<O>(p: &ConvertParams<O>, idx: u32) -> f32 {
    let (o, i) = (idx / p.cols, idx % p.cols);
    let src = if p.transposed != 0 { i * p.rows + o } else { idx } as usize;
    // SAFETY: src < rows*cols, the caller promises size and alignment.
    unsafe {
        match p.dtype {
            CONVERT_DTYPE_BF16 => bf16_to_f32(*(p.inp as *const u16).add(src)),
            CONVERT_DTYPE_F16 => f16_to_f32(*(p.inp as *const u16).add(src)),
            _ => *(p.inp as *const f32).add(src),
        }
    }
}

/// One output element per thread: read element `(o, i)` from where it is
/// stored (transposed or not), convert, write it at `o * cols + i`.
/// Transposed reads are strided; this runs once per weight at load time.
///
/// # Safety
/// `inp` holds `rows * cols` elements of `dtype`, aligned to the element
/// size; `out` holds `rows * cols` floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn convert_to_f32(p: ConvertParams<f32>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let total = p.rows * p.cols;
    let mut idx = global_idx_x();
    while idx < total {
        // SAFETY: idx < rows*cols; the caller's contract.
        unsafe { *p.out.add(idx as usize) = read_element(&p, idx) };
        idx += grid_stride_x();
    }
}

/// [`convert_to_f32`] with bf16 out, rounded to nearest even (a bf16 input
/// passes through exactly).
///
/// # Safety
/// As [`convert_to_f32`]; `out` holds `rows * cols` bf16 values.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn convert_to_bf16(p: ConvertParams<u16>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let total = p.rows * p.cols;
    let mut idx = global_idx_x();
    while idx < total {
        // SAFETY: idx < rows*cols; the caller's contract.
        unsafe { *p.out.add(idx as usize) = f32_to_bf16(read_element(&p, idx)) };
        idx += grid_stride_x();
    }
}

/// Round `x[..n]` to TF32 in place (what the TF32 matmuls need of their
/// weights; see `params::convert::ROUND_TF32`).
///
/// # Safety
/// `x` holds `n` floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn round_tf32(p: RoundTf32Params) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let mut idx = global_idx_x();
    while idx < p.n {
        // SAFETY: idx < n, the caller promises the size.
        unsafe {
            let at = p.x.add(idx as usize);
            *at = f32::from_bits(to_tf32(*at));
        }
        idx += grid_stride_x();
    }
}
