//! Encoder: token embedding plus position embedding.

use super::vec4::{VEC, load4, store4};
use crate::device::{global_idx_x, grid_stride_x};
use crate::params::encoder::EncoderParams;

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
        let bt = i / c4;
        let k = i % c4;
        let t = bt % p.t;
        // SAFETY: bt < b*t, the id is < rows of wte, pos0 + t < max_t (host checks);
        // alignment promised by the caller.
        unsafe {
            let id = *p.inp.add(bt as usize) as usize;
            let k = k as usize * VEC;
            let w = load4(p.wte.add(id * p.c as usize + k));
            let q = load4(p.wpe.add((p.pos0 + t) as usize * p.c as usize + k));
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
        let bt = i / p.c;
        let ch = i % p.c;
        let t = bt % p.t;
        // SAFETY: as above.
        unsafe {
            let id = *p.inp.add(bt as usize) as usize;
            *p.out.add(i as usize) = *p.wte.add(id * p.c as usize + ch as usize)
                + *p.wpe
                    .add((p.pos0 + t) as usize * p.c as usize + ch as usize);
        }
        i += grid_stride_x();
    }
}
