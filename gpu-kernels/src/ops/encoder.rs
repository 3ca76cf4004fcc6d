//! Encoder: token embedding plus position embedding.

use super::vec4::{VEC, load4, store4};
use super::weight::Weight;
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::encoder::EncoderParams;

/// Offset of the first channel of token `id`'s embedding, or `None` for an
/// id past the table (its row becomes NaN rather than an out-of-bounds read).
#[inline(always)]
fn wte_row<W>(p: &EncoderParams<W>, id: u32) -> Option<usize> {
    (id < p.wte_rows).then(|| id as usize * p.c as usize)
}

/// The position of flat row `bt` (of `b * t`): `pos0 + bt % t`, or the row's own
/// (`EncoderParams::pos`), clamped into `wpe`.
///
/// # Safety
/// `bt < b * t`; `pos`, where not null, holds `b * t` entries.
#[inline(always)]
unsafe fn position<W>(p: &EncoderParams<W>, bt: u32) -> u32 {
    if p.pos.is_null() {
        p.pos0 + bt % p.t
    } else {
        // SAFETY: the caller's contract.
        unsafe { *p.pos.add(bt as usize) }.min(p.wpe_rows - 1)
    }
}

/// `out[b,t,:] = wte[inp[b,t],:] + wpe[pos0+t,:]`, 4 channels per thread,
/// `wte` of either weight type.
///
/// # Safety
/// Buffers as documented on [`EncoderParams`]; `c % 4 == 0`, `out` and
/// `wpe` 16-byte aligned and `wte` aligned to 4 elements (the host checks,
/// else it launches the naive kernel).
#[inline(always)]
unsafe fn encoder_vec4<W: Weight>(p: EncoderParams<W>) {
    let c4 = p.c / VEC as u32;
    let total = p.b * p.t * c4;
    let mut i = global_idx_x();
    while i < total {
        let (bt, k) = (i / c4, (i % c4) as usize * VEC);
        // SAFETY: bt < b*t; the wte row is checked; pos < wpe_rows (host
        // checks, or clamped); alignment promised by the caller.
        unsafe {
            let pos = position(&p, bt);
            let w = match wte_row(&p, *p.inp.add(bt as usize)) {
                Some(r) => W::load4_f32(p.wte, r + k),
                None => [f32::NAN; 4],
            };
            let q = load4(p.wpe.add(pos as usize * p.c as usize + k));
            store4(
                p.out.add(i as usize * VEC),
                [w[0] + q[0], w[1] + q[1], w[2] + q[2], w[3] + q[3]],
            );
        }
        i += grid_stride_x();
    }
}

/// `encoder_vec4` over an f32 `wte`.
///
/// # Safety
/// As `encoder_vec4`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn encoder_forward(p: EncoderParams<f32>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: forwarded.
    unsafe { encoder_vec4(p) }
}

/// `encoder_vec4` over a bf16 `wte` (the bf16 engine's).
///
/// # Safety
/// As `encoder_vec4`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn encoder_forward_bf16(p: EncoderParams<u16>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: forwarded.
    unsafe { encoder_vec4(p) }
}

/// Baseline: one output element per thread.
///
/// # Safety
/// Buffers as documented on [`EncoderParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn encoder_forward_naive(p: EncoderParams<f32>) {
    let total = p.b * p.t * p.c;
    let mut i = global_idx_x();
    while i < total {
        let (bt, ch) = (i / p.c, (i % p.c) as usize);
        // SAFETY: as above.
        unsafe {
            let pos = position(&p, bt);
            let w = match wte_row(&p, *p.inp.add(bt as usize)) {
                Some(r) => *p.wte.add(r + ch),
                None => f32::NAN,
            };
            *p.out.add(i as usize) = w + *p.wpe.add(pos as usize * p.c as usize + ch);
        }
        i += grid_stride_x();
    }
}
