//! Encoder: token embedding plus position embedding.

use super::vec4::{VEC, load4, store4};
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::encoder::EncoderParams;

/// Offset of the first channel of token `id`'s embedding, or `None` for an
/// id past the table (its row becomes NaN rather than an out-of-bounds read).
#[inline(always)]
fn wte_row(p: &EncoderParams, id: u32) -> Option<usize> {
    (id < p.wte_rows).then(|| id as usize * p.c as usize)
}

/// `out[b,t,:] = wte[inp[b,t],:] + wpe[pos0+t,:]`, 4 channels per thread.
///
/// # Safety
/// Buffers as documented on [`EncoderParams`]; `c % 4 == 0` and every
/// pointer 16-byte aligned (the host checks, else it launches the naive kernel).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn encoder_forward(p: EncoderParams) {
    let c4 = p.c / VEC as u32;
    let total = p.b * p.t * c4;
    let mut i = global_idx_x();
    while i < total {
        let (bt, k) = (i / c4, (i % c4) as usize * VEC);
        let pos = p.pos0 + bt % p.t;
        // SAFETY: bt < b*t; the wte row is checked; pos < max_t (host
        // checks); alignment promised by the caller.
        unsafe {
            let w = match wte_row(&p, *p.inp.add(bt as usize)) {
                Some(r) => load4(p.wte.add(r + k)),
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

/// Baseline: one output element per thread.
///
/// # Safety
/// Buffers as documented on [`EncoderParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn encoder_forward_naive(p: EncoderParams) {
    let total = p.b * p.t * p.c;
    let mut i = global_idx_x();
    while i < total {
        let (bt, ch) = (i / p.c, (i % p.c) as usize);
        let pos = p.pos0 + bt % p.t;
        // SAFETY: as above.
        unsafe {
            let w = match wte_row(&p, *p.inp.add(bt as usize)) {
                Some(r) => *p.wte.add(r + ch),
                None => f32::NAN,
            };
            *p.out.add(i as usize) = w + *p.wpe.add(pos as usize * p.c as usize + ch);
        }
        i += grid_stride_x();
    }
}
