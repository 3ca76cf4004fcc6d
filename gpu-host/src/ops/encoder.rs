//! `encoder_forward`: token plus position embeddings (twin of
//! `cpu::ops::encoder_forward`); `encoder_forward_rows`: the same with a
//! position per row, read from the device (twin of
//! `cpu::ops::encoder_forward_rows`).

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::encoder::{
    ENCODER_BLOCK, ENCODER_FORWARD, ENCODER_FORWARD_BF16, ENCODER_FORWARD_NAIVE, EncoderParams,
};
use half::bf16;

use super::args::{OpError, Variant, aligned16, blocks_for, check_len, count_u32, in_ptr, out_ptr, to_u32};
use super::weight::WeightRef;
use crate::{EncoderShape, Gpu, RowShape};

const OP: &str = "encoder_forward";
/// Channels per thread of the vectorised kernel.
const VEC: usize = 4;

/// Launch configuration: a grid-stride loop over `work` items.
pub fn launch_config(work: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(work, ENCODER_BLOCK), 1, 1),
        block_dim: (ENCODER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out[b,t,:] = wte[inp[b,t],:] + wpe[pos0+t,:]`. Token ids at or past
/// `wte`'s rows give NaN rows (never an out-of-bounds read).
pub fn encoder_forward(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    wte: &impl DevicePtr<f32>,
    wpe: &impl DevicePtr<f32>,
    shape: EncoderShape,
) -> Result<(), OpError> {
    encoder_forward_variant(gpu, Variant::Best, out, inp, wte, wpe, shape)
}

/// [`encoder_forward`] over a bf16 token table (the bf16 engine's; `wpe`
/// and `out` stay f32). CPU twin: `cpu::ops::encoder_forward` over the
/// table widened to f32 (exact).
pub fn encoder_forward_bf16(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    wte: &impl DevicePtr<bf16>,
    wpe: &impl DevicePtr<f32>,
    shape: EncoderShape,
) -> Result<(), OpError> {
    const OP: &str = "encoder_forward_bf16";
    let wte_ptr = in_ptr(gpu, wte) as *const u16;
    let Some((params, total)) = encoder_params(gpu, OP, out, inp, (wte_ptr, wte.len()), wpe, shape)? else {
        return Ok(());
    };
    launch_bf16(gpu, OP, params, total)
}

/// Launch the bf16 kernel with checked `params` over `total` elements.
fn launch_bf16(gpu: &Gpu, op: &'static str, params: EncoderParams<u16>, total: u32) -> Result<(), OpError> {
    let c = params.c as usize;
    // 4 bf16 per thread: 8-byte aligned rows.
    const WTE_ALIGN: usize = VEC * size_of::<u16>();
    if !c.is_multiple_of(VEC)
        || !aligned16(&[params.out as usize, params.wpe as usize])
        || !(params.wte as usize).is_multiple_of(WTE_ALIGN)
    {
        return Err(OpError::shape(
            op,
            format!("c = {c} must be a multiple of {VEC}, with aligned buffers"),
        ));
    }
    // SAFETY: lengths checked by encoder_params (out b*t*c, inp b*t, wpe
    // (pos0+t)*c or per-row positions clamped to its rows, wte wte_rows*c
    // bf16, ids guarded against wte_rows); c % 4 == 0, out and wpe
    // 16-byte, wte 8-byte aligned (rows of c bf16 keep that alignment).
    unsafe { gpu.launch(ENCODER_FORWARD_BF16, launch_config(total / VEC as u32), params)? };
    Ok(())
}

/// The checked parameters of an encoder launch over a token table of
/// `wte.1` elements at `wte.0` (`None`: nothing to do), and the element
/// count `b * t * c`.
fn encoder_params<W>(
    gpu: &Gpu,
    op: &'static str,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    wte: (*const W, usize),
    wpe: &impl DevicePtr<f32>,
    shape: EncoderShape,
) -> Result<Option<(EncoderParams<W>, u32)>, OpError> {
    let EncoderShape { b, t, c, pos0 } = shape;
    let total = count_u32(op, "b * t * c", &[b, t, c])?;
    check_len(op, "out", out.len(), b * t * c)?;
    check_len(op, "inp", inp.len(), b * t)?;
    check_len(op, "wpe", wpe.len(), (pos0 + t) * c)?;
    if c == 0 || total == 0 {
        return Ok(None);
    }
    let wpe_rows = to_u32(op, "rows of wpe", wpe.len() / c)?;
    let params = EncoderParams {
        out: out_ptr(gpu, out),
        inp: in_ptr(gpu, inp),
        wte: wte.0,
        wpe: in_ptr(gpu, wpe),
        b: b as u32,
        t: t as u32,
        c: c as u32,
        pos0: to_u32(op, "pos0", pos0)?,
        pos: std::ptr::null(),
        wte_rows: to_u32(op, "rows of wte", wte.1 / c)?,
        wpe_rows,
    };
    Ok(Some((params, total)))
}

/// `out[r,:] = wte[inp[r],:] + wpe[pos[r],:]` for `shape.rows` rows of
/// `shape.c` channels, each at its own
/// position (a decode step over sequences at different positions), read
/// from the device so a captured graph serves every step. A position at or
/// past `wpe`'s rows reads its last row (an idle row, whose output nobody
/// reads), never out of bounds; token ids as in [`encoder_forward`].
pub fn encoder_forward_rows(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    pos: &impl DevicePtr<u32>,
    wte: WeightRef<'_>,
    wpe: &impl DevicePtr<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    const OP: &str = "encoder_forward_rows";
    let RowShape { rows, c } = shape;
    check_len(OP, "pos", pos.len(), rows)?;
    if wpe.len() < c {
        return Err(OpError::shape(OP, "the position table is empty"));
    }
    let pos = in_ptr(gpu, pos);
    // One position per row, read from `pos` (`pos0` unused).
    let shape = EncoderShape {
        b: rows,
        t: 1,
        c,
        pos0: 0,
    };
    match wte {
        WeightRef::F32(w) => {
            let wte_ptr = in_ptr(gpu, w);
            let Some((mut params, total)) = encoder_params(gpu, OP, out, inp, (wte_ptr, w.len()), wpe, shape)? else {
                return Ok(());
            };
            params.pos = pos;
            launch_f32(gpu, Variant::Best, params, total)
        }
        WeightRef::Bf16(w) => {
            let wte_ptr = in_ptr(gpu, w) as *const u16;
            let Some((mut params, total)) = encoder_params(gpu, OP, out, inp, (wte_ptr, w.len()), wpe, shape)? else {
                return Ok(());
            };
            params.pos = pos;
            launch_bf16(gpu, OP, params, total)
        }
    }
}

/// [`encoder_forward`] on the baseline kernel.
pub fn encoder_forward_naive(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    wte: &impl DevicePtr<f32>,
    wpe: &impl DevicePtr<f32>,
    shape: EncoderShape,
) -> Result<(), OpError> {
    encoder_forward_variant(gpu, Variant::Naive, out, inp, wte, wpe, shape)
}

/// [`encoder_forward`] with the kernel chosen by `variant`.
pub fn encoder_forward_variant(
    gpu: &Gpu,
    variant: Variant,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<u32>,
    wte: &impl DevicePtr<f32>,
    wpe: &impl DevicePtr<f32>,
    shape: EncoderShape,
) -> Result<(), OpError> {
    let wte_ptr = in_ptr(gpu, wte);
    let Some((params, total)) = encoder_params(gpu, OP, out, inp, (wte_ptr, wte.len()), wpe, shape)? else {
        return Ok(());
    };
    launch_f32(gpu, variant, params, total)
}

/// Launch the f32 kernel `variant` asks for with checked `params` over
/// `total` elements: the vectorised one where `c % 4 == 0` and the buffers
/// are aligned, else the naive one.
fn launch_f32(gpu: &Gpu, variant: Variant, params: EncoderParams<f32>, total: u32) -> Result<(), OpError> {
    let c = params.c as usize;
    let vec = variant == Variant::Best
        && c.is_multiple_of(VEC)
        && aligned16(&[params.out as usize, params.wte as usize, params.wpe as usize]);
    let (name, cfg) = if vec {
        (ENCODER_FORWARD, launch_config(total / VEC as u32))
    } else {
        (ENCODER_FORWARD_NAIVE, launch_config(total))
    };
    // SAFETY: `encoder_params` checked the lengths (out b*t*c, inp b*t, wpe
    // (pos0+t)*c or, with per-row positions, at least one row, which the
    // kernel clamps them to; wte wte_rows*c, the kernel guards ids against
    // wte_rows); the vector kernel only runs with c % 4 == 0 and aligned
    // buffers.
    unsafe { gpu.launch(name, cfg, params)? };
    Ok(())
}
