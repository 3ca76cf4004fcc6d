//! Flash-decoding pass 2 (`attention_forward_flash_combine`): merges the
//! partials (max, sum, acc) that pass 1 (`super::decode`) wrote for each
//! (query, head), one block per (query, head), one thread per dimension.

use super::HS;
use crate::device::math::{exp2_approx, fma};
use crate::device::{block_idx_x, thread_idx_x};
use crate::params::flash_attention::*;

/// Flash-decoding pass 2: one block per (query, head), one thread per dimension.
///
/// # Safety
/// As [`FlashCombineParams`] says; partials written by pass 1 with the same
/// `parts` / `parts_stride`; out holds b*t*c floats.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_combine(p: FlashCombineParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    let (c, nh, parts) = (p.c as usize, p.nh as usize, p.parts as usize);
    let r = block_idx_x() as usize; // (b*t + ti) * nh + h
    let d = thread_idx_x() as usize;
    let first = r * p.parts_stride as usize;
    // SAFETY: r < b * t * nh rows of parts_stride parts; `first` starts row r's.
    let ml = unsafe { p.part_ml.add(2 * first) };
    let mut m_all = f32::NEG_INFINITY;
    for i in 0..parts {
        // SAFETY: i < parts <= parts_stride: row r's (m, l) pairs.
        m_all = m_all.max(unsafe { *ml.add(2 * i) });
    }
    // Finite: the part holding the query's own key saw a real score.
    let (mut l_all, mut o) = (0f32, 0f32);
    for i in 0..parts {
        // SAFETY: i < parts: row r's (m, l) pairs.
        let w = exp2_approx(unsafe { *ml.add(2 * i) } - m_all);
        // SAFETY: i < parts: row r's (m, l) pairs.
        l_all = fma(unsafe { *ml.add(2 * i + 1) }, w, l_all);
        // SAFETY: i < parts, d < HS: row r's parts in part_acc.
        o = fma(unsafe { *p.part_acc.add((first + i) * HS + d) }, w, o);
    }
    // SAFETY: r / nh < b * t rows of `out`, head r % nh, d < HS.
    unsafe { *p.out.add((r / nh) * c + (r % nh) * HS + d) = o / l_all };
}
