//! `layernorm_forward` (twin of `cpu::ops::layernorm_forward`),
//! `residual_layernorm_forward` (twin of `cpu::ops::residual_layernorm_forward`)
//! and `residual_layernorm_split_forward` (twin of
//! `cpu::ops::residual_layernorm_split_forward`).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::layernorm::{
    LAYERNORM_BLOCK, LAYERNORM_FORWARD, LAYERNORM_FORWARD_NAIVE, LAYERNORM_NAIVE_BLOCK, LayernormParams,
    RESIDUAL_LAYERNORM_FORWARD, RESIDUAL_LAYERNORM_SPLIT_FORWARD, RESIDUAL_LAYERNORM_SPLIT_MAX_C,
    RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES, RESIDUAL_LAYERNORM_SPLIT_VEC, ResidualLayernormParams,
    ResidualLayernormSplitParams, residual_layernorm_split_block,
};

use super::args::{OpError, Variant, aligned16, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::{Gpu, LayernormWeights, RowShape, SplitSums};
use half::bf16;

const OP: &str = "layernorm_forward";
/// Threads per warp: the optimised kernel gives each row one warp.
const WARP: u32 = 32;

/// Launch configuration of `variant` for `rows` rows.
pub fn launch_config(variant: Variant, rows: u32) -> (&'static str, LaunchConfig) {
    let (name, block, rows_per_block) = match variant {
        Variant::Best => (LAYERNORM_FORWARD, LAYERNORM_BLOCK, LAYERNORM_BLOCK / WARP),
        Variant::Naive => (LAYERNORM_FORWARD_NAIVE, LAYERNORM_NAIVE_BLOCK, LAYERNORM_NAIVE_BLOCK),
    };
    (
        name,
        LaunchConfig {
            grid_dim: (blocks_for(rows, rows_per_block), 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        },
    )
}

/// Layernorm of `shape.rows` rows of `shape.c` channels (eps 1e-5).
pub fn layernorm_forward(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    layernorm_forward_variant(gpu, Variant::Best, out, inp, weight, bias, shape)
}

/// [`layernorm_forward`] on the baseline kernel.
pub fn layernorm_forward_naive(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    layernorm_forward_variant(gpu, Variant::Naive, out, inp, weight, bias, shape)
}

/// [`layernorm_forward`], then every output rounded to TF32 (CPU twin: the
/// two in turn, `cpu::ops::layernorm_forward` and `cpu::ops::round_tf32`):
/// for a TF32 matmul that reads it, which then skips its own rounding.
pub fn layernorm_forward_tf32(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    check_len(OP, "out", out.len(), shape.len())?;
    let out = Dst::F32(out_ptr(gpu, out), true);
    launch(gpu, Variant::Best, out, inp, weight, bias, shape)
}

/// [`layernorm_forward`] written as bf16, rounded to nearest even (CPU
/// twin: `cpu::ops::layernorm_forward`, then `half::bf16::from_f32` of each
/// output): for a bf16 matmul that reads it, which would round it the same
/// way.
pub fn layernorm_forward_bf16(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<bf16>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    check_len(OP, "out", out.len(), shape.len())?;
    let out = Dst::Bf16(out_ptr(gpu, out).cast::<u16>());
    launch(gpu, Variant::Best, out, inp, weight, bias, shape)
}

/// Where a layernorm launch writes (the length checked by the caller).
#[derive(Clone, Copy)]
enum Dst {
    /// f32, rounded to TF32 when the flag is set.
    F32(*mut f32, bool),
    Bf16(*mut u16),
}

impl Dst {
    /// `(out, round_tf32, out_bf16)` of the kernels' parameters.
    fn fields(self) -> (*mut f32, u32, *mut u16) {
        match self {
            Dst::F32(p, round) => (p, round as u32, std::ptr::null_mut()),
            Dst::Bf16(p) => (std::ptr::null_mut(), 0, p),
        }
    }
}

/// [`layernorm_forward`] with the kernel chosen by `variant`.
pub fn layernorm_forward_variant(
    gpu: &Gpu,
    variant: Variant,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    check_len(OP, "out", out.len(), shape.len())?;
    let out = Dst::F32(out_ptr(gpu, out), false);
    launch(gpu, variant, out, inp, weight, bias, shape)
}

/// `out` holds `shape.len()` elements (checked by the caller).
fn launch(
    gpu: &Gpu,
    variant: Variant,
    out: Dst,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    let RowShape { rows, c } = shape;
    count_u32(OP, "rows * c", &[rows, c])?;
    check_len(OP, "inp", inp.len(), rows * c)?;
    check_len(OP, "weight", weight.len(), c)?;
    check_len(OP, "bias", bias.len(), c)?;
    if shape.is_empty() {
        return Ok(());
    }
    let (out, round_tf32, out_bf16) = out.fields();
    let params = LayernormParams {
        out,
        inp: in_ptr(gpu, inp),
        weight: in_ptr(gpu, weight),
        bias: in_ptr(gpu, bias),
        n: to_u32(OP, "rows", rows)?,
        c: to_u32(OP, "c", c)?,
        round_tf32,
        out_bf16,
    };
    let (name, cfg) = launch_config(variant, params.n);
    // SAFETY: out (f32 or bf16, whichever is set) and inp hold rows*c elements,
    // weight/bias c (checked); the kernel
    // picks 16-byte loads only after checking alignment itself; blocks are
    // whole warps as the warp-per-row kernel assumes.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}

const FUSED_OP: &str = "residual_layernorm_forward";

/// Where [`residual_layernorm_forward`] writes its layernorm, and how.
pub enum LayernormOut<'a> {
    /// f32 (as [`layernorm_forward`]).
    F32(&'a mut CudaSlice<f32>),
    /// f32 rounded to TF32 (as [`layernorm_forward_tf32`]), for a TF32 matmul
    /// that reads it.
    Tf32(&'a mut CudaSlice<f32>),
    /// bf16, rounded to nearest even (as [`layernorm_forward_bf16`]), for a
    /// bf16 matmul that reads it.
    Bf16(&'a mut CudaSlice<bf16>),
}

impl LayernormOut<'_> {
    /// The launch's destination, after checking it holds `len` elements.
    fn dst(self, gpu: &Gpu, op: &'static str, len: usize) -> Result<Dst, OpError> {
        let have = match &self {
            LayernormOut::F32(o) | LayernormOut::Tf32(o) => o.len(),
            LayernormOut::Bf16(o) => o.len(),
        };
        check_len(op, "out", have, len)?;
        Ok(match self {
            LayernormOut::F32(o) => Dst::F32(out_ptr(gpu, o), false),
            LayernormOut::Tf32(o) => Dst::F32(out_ptr(gpu, o), true),
            LayernormOut::Bf16(o) => Dst::Bf16(out_ptr(gpu, o).cast::<u16>()),
        })
    }

    /// `F32`, or `Tf32` when `round_tf32`.
    pub fn f32(out: &mut CudaSlice<f32>, round_tf32: bool) -> LayernormOut<'_> {
        if round_tf32 {
            LayernormOut::Tf32(out)
        } else {
            LayernormOut::F32(out)
        }
    }
}

/// Most rows [`residual_layernorm_forward`] gives a block each (the kernel of
/// [`residual_layernorm_split_forward`], one part): a server step's or a short
/// prefill's few rows would leave most SMs idle at a warp a row, each warp
/// waiting for its vectors in turn.
pub const RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS: usize = 1024;

/// `residual = inp1 + inp2`, then `out` = its layernorm (eps 1e-5), in one
/// launch: the residual add closing a sub-block fused with the layernorm
/// opening the next. `out` says the layernorm's format; `residual` is f32
/// either way, never rounded. Up to [`RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS`]
/// rows (of a width it takes, aligned) run a block a row, more a warp a row.
pub fn residual_layernorm_forward(
    gpu: &Gpu,
    residual: &mut impl DevicePtrMut<f32>,
    out: LayernormOut<'_>,
    inp1: &impl DevicePtr<f32>,
    inp2: &impl DevicePtr<f32>,
    ln: LayernormWeights<'_, impl DevicePtr<f32>>,
    shape: RowShape,
) -> Result<(), OpError> {
    let (rows, c) = (shape.rows, shape.c);
    let aligned = aligned16(&[
        in_ptr(gpu, inp1) as usize,
        in_ptr(gpu, inp2) as usize,
        out_ptr(gpu, residual) as usize,
    ]);
    if rows <= RESIDUAL_LAYERNORM_BLOCK_MAX_ROWS && residual_layernorm_split_fits(c) && aligned {
        let whole = SplitSums {
            partial: inp2,
            splits: 1,
            bias: None,
        };
        return residual_layernorm_split_forward(gpu, residual, out, inp1, whole, ln, shape);
    }
    let out = out.dst(gpu, FUSED_OP, shape.len())?;
    let RowShape { rows, c } = shape;
    count_u32(FUSED_OP, "rows * c", &[rows, c])?;
    check_len(FUSED_OP, "residual", residual.len(), rows * c)?;
    check_len(FUSED_OP, "inp1", inp1.len(), rows * c)?;
    check_len(FUSED_OP, "inp2", inp2.len(), rows * c)?;
    let LayernormWeights { weight, bias } = ln;
    check_len(FUSED_OP, "weight", weight.len(), c)?;
    check_len(FUSED_OP, "bias", bias.len(), c)?;
    if shape.is_empty() {
        return Ok(());
    }
    let (out, round_tf32, out_bf16) = out.fields();
    let params = ResidualLayernormParams {
        residual: out_ptr(gpu, residual),
        out,
        inp1: in_ptr(gpu, inp1),
        inp2: in_ptr(gpu, inp2),
        weight: in_ptr(gpu, weight),
        bias: in_ptr(gpu, bias),
        n: to_u32(FUSED_OP, "rows", rows)?,
        c: to_u32(FUSED_OP, "c", c)?,
        round_tf32,
        out_bf16,
    };
    // The same warp-per-row shape as the unfused kernel.
    let (_, cfg) = launch_config(Variant::Best, params.n);
    // SAFETY: every [rows * c] buffer holds rows*c elements, weight/bias c
    // (checked); `residual` and `out` are distinct `&mut` borrows, so they overlap
    // neither each other nor the shared inputs; the kernel checks alignment
    // before using 16-byte loads; blocks are whole warps.
    unsafe { gpu.launch(RESIDUAL_LAYERNORM_FORWARD, cfg, params)? };
    Ok(())
}

const SPLIT_OP: &str = "residual_layernorm_split_forward";

/// Whether [`residual_layernorm_split_forward`] takes rows of `c` channels.
pub fn residual_layernorm_split_fits(c: usize) -> bool {
    c.is_multiple_of(RESIDUAL_LAYERNORM_SPLIT_VEC as usize) && c <= RESIDUAL_LAYERNORM_SPLIT_MAX_C as usize
}

/// Launch configuration of `residual_layernorm_split_forward`: a block per
/// row, a 16-byte vector per thread.
pub fn residual_layernorm_split_launch_config(rows: u32, c: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (residual_layernorm_split_block(c), 1, 1),
        shared_mem_bytes: RESIDUAL_LAYERNORM_SPLIT_SHARED_BYTES,
    }
}

/// `residual = inp1 + proj`, then `out` = its layernorm, where `proj` is a
/// split-K projection still in parts ([`SplitSums`]): the parts added in
/// split order, then the bias (the bits `matmul_split_reduce` would give),
/// so one launch replaces the reduction and [`residual_layernorm_forward`].
/// `c` must pass [`residual_layernorm_split_fits`] and every buffer be
/// 16-byte aligned.
pub fn residual_layernorm_split_forward<T: DevicePtr<f32>>(
    gpu: &Gpu,
    residual: &mut impl DevicePtrMut<f32>,
    out: LayernormOut<'_>,
    inp1: &impl DevicePtr<f32>,
    inp2: SplitSums<'_, T>,
    ln: LayernormWeights<'_, impl DevicePtr<f32>>,
    shape: RowShape,
) -> Result<(), OpError> {
    let out = out.dst(gpu, SPLIT_OP, shape.len())?;
    let RowShape { rows, c } = shape;
    if !residual_layernorm_split_fits(c) {
        return Err(OpError::shape(
            SPLIT_OP,
            format!(
                "c = {c} is not a multiple of {RESIDUAL_LAYERNORM_SPLIT_VEC} at most {RESIDUAL_LAYERNORM_SPLIT_MAX_C}"
            ),
        ));
    }
    let SplitSums {
        partial,
        splits,
        bias: proj_bias,
    } = inp2;
    if splits == 0 {
        return Err(OpError::shape(SPLIT_OP, "no parts to add (splits = 0)"));
    }
    count_u32(SPLIT_OP, "splits * rows * c", &[splits, rows, c])?;
    check_len(SPLIT_OP, "residual", residual.len(), rows * c)?;
    check_len(SPLIT_OP, "inp1", inp1.len(), rows * c)?;
    check_len(SPLIT_OP, "partial", partial.len(), splits * rows * c)?;
    if let Some(b) = proj_bias {
        check_len(SPLIT_OP, "proj bias", b.len(), c)?;
    }
    let LayernormWeights { weight, bias } = ln;
    check_len(SPLIT_OP, "weight", weight.len(), c)?;
    check_len(SPLIT_OP, "bias", bias.len(), c)?;
    if shape.is_empty() {
        return Ok(());
    }
    let (out, round_tf32, out_bf16) = out.fields();
    let params = ResidualLayernormSplitParams {
        residual: out_ptr(gpu, residual),
        out,
        inp1: in_ptr(gpu, inp1),
        partial: in_ptr(gpu, partial),
        proj_bias: proj_bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        splits: to_u32(SPLIT_OP, "splits", splits)?,
        weight: in_ptr(gpu, weight),
        bias: in_ptr(gpu, bias),
        n: to_u32(SPLIT_OP, "rows", rows)?,
        c: to_u32(SPLIT_OP, "c", c)?,
        round_tf32,
        out_bf16,
    };
    let addresses = [
        params.residual as usize,
        out as usize,
        out_bf16 as usize,
        params.inp1 as usize,
        params.partial as usize,
        params.proj_bias as usize,
        params.weight as usize,
        params.bias as usize,
    ];
    if !aligned16(&addresses) {
        return Err(OpError::shape(SPLIT_OP, "every buffer must be 16-byte aligned"));
    }
    let cfg = residual_layernorm_split_launch_config(params.n, params.c);
    // SAFETY: every buffer holds what the kernel reads or writes (checked: rows*c, the
    // partials splits*rows*c, the biases and weights c) and is 16-byte aligned (checked;
    // null pointers pass as 0); c fits the block (`residual_layernorm_split_fits`);
    // `residual` and `out` are distinct `&mut` borrows, so they overlap neither each
    // other nor the shared inputs; the launch configuration is the kernel's.
    unsafe { gpu.launch(RESIDUAL_LAYERNORM_SPLIT_FORWARD, cfg, params)? };
    Ok(())
}
