//! Weight upload: raw checkpoint bytes (f32, bf16 or f16, maybe stored
//! transposed) to f32 or bf16 in llm.c's (out, in) layout, on the device.

/// One thread per output element, f32 out (`ConvertParams<f32>`).
pub const CONVERT_TO_F32: &str = "convert_to_f32";
/// The same, bf16 out (`ConvertParams<u16>`, bf16 bits), rounded to nearest
/// even: what the bf16 engine stores (bf16 input is copied exactly).
pub const CONVERT_TO_BF16: &str = "convert_to_bf16";
/// Threads per block.
pub const CONVERT_BLOCK: u32 = 256;

/// `ConvertParams::dtype` values.
pub const CONVERT_DTYPE_F32: u32 = 0;
pub const CONVERT_DTYPE_BF16: u32 = 1;
pub const CONVERT_DTYPE_F16: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvertParams<O = f32> {
    /// `[rows * cols]` in logical layout: f32, or bf16 bits (`O = u16`).
    pub out: *mut O,
    /// Raw little-endian elements, `rows * cols` of them; when `transposed`
    /// they are stored `(cols, rows)`.
    pub inp: *const u8,
    pub rows: u32,
    pub cols: u32,
    /// One of the `CONVERT_DTYPE_*` constants.
    pub dtype: u32,
    /// Nonzero: the input holds the transpose.
    pub transposed: u32,
}

/// `round_tf32`: f32 to the nearest TF32 value (10 mantissa bits, ties away
/// from zero, `cvt.rna.tf32.f32`), in place, one element per thread.
pub const ROUND_TF32: &str = "round_tf32";

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RoundTf32Params {
    /// `[n]`, rounded in place.
    pub x: *mut f32,
    pub n: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe ConvertParams<f32>, ConvertParams<u16>, RoundTf32Params);
