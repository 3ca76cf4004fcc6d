//! TF32 prefill (`attention_forward_flash_tf32`): the tensor-core body of
//! `prefill_tc` with TF32 operands (`mma.m16n8k8`):
//! - Each thread rounds the K/V chunks it copied to TF32 in place before the
//!   barrier that publishes a stage, so the MMA loops read ready operands with
//!   16-byte `ld.shared.v4` and no `cvt` (Q is rounded once, straight from
//!   global memory into registers). `kv_rounded` skips that pass when the
//!   caller's K/V are already TF32 values.
//! - Contraction orders are free as long as both operands agree, so they are
//!   chosen for vector loads without bank conflicts (row stride 68 = 4 mod 32):
//!   QKᵀ: lane t holds dims [8t, 8t+8) and [32+8t, 40+8t) of its rows, in that
//!   order; k-step s uses its entries 2s (k-slot t) and 2s+1 (k-slot t+4).
//!   PV: the key is the contraction index, k-slot t = key 2t and t+4 = key 2t+1
//!   of each 8-key step, exactly what the S C-fragment holds, so P feeds the
//!   MMA from registers; the output column n of n-tile dt is dim 4n + dt
//!   (dt < 4) or 32 + 4n + dt - 4, so lane g reads V\[key\]\[4g..4g+4\] and
//!   V\[key\]\[32+4g..36+4g\], and each lane ends up holding 8 contiguous output
//!   dims twice (16-byte stores).

use super::prefill_tc::{
    KvRows, RowState, SUB_K, Sub, T_COPY_BATCH, TcFormat, TileCopy, flash_prefill_tc, load_tile_f32, online_softmax,
    q_vectors,
};
use super::{DIM_STEPS, HS, MMA_N, STRIDE, TILE, VEC, ld4, st4};
use crate::device::lane_id;
use crate::device::mma::{mma_m16n8k8_tf32, to_tf32};
use crate::device::unroll;
use crate::params::flash_attention::*;

/// Keys of one warp step and its 8-key blocks.
const SUB_STEPS: usize = FLASH_TF32_SUB_KEYS as usize / MMA_N;
const _: () = assert!(SUB_STEPS == 4, "loops below are unrolled 4 times (`unroll!`)");

/// Mantissa bits an f32 has beyond TF32's 10.
const TF32_DROPPED_BITS: u32 = 13;
/// Half a TF32 ulp, in f32 bit units: added before truncation, it rounds to
/// nearest with ties away from zero, as `cvt.rna.tf32` does.
const TF32_HALF_ULP: u32 = 1 << (TF32_DROPPED_BITS - 1);
/// Keeps the sign, exponent and 10 mantissa bits.
const TF32_KEEP: u32 = !((1 << TF32_DROPPED_BITS) - 1);

/// `cvt.rna.tf32` for a softmax weight (in [0, 1], or NaN from NaN scores):
/// two integer ops instead of the cvt's expansion with its inf/NaN check. A
/// NaN may come out as a number here, but the row sum (taken before
/// rounding) stays NaN, so the output does too.
#[inline(always)]
fn round_p_tf32(x: f32) -> u32 {
    x.to_bits().wrapping_add(TF32_HALF_ULP) & TF32_KEEP
}

/// Round to TF32, in place, the chunks of one K/V stage that this thread
/// copied with [`load_tile_tf32`] (same chunks in both tiles). All loads of a
/// pass are issued before any store: the compiler cannot tell the chunks
/// apart, so a load-round-store sequence would serialise on latency.
///
/// # Safety
/// `k`, `v` are a stage's tiles whose copies by this thread have completed.
#[inline(always)]
unsafe fn round_stage_tf32(k: *mut f32, v: *mut f32, cp: TileCopy) {
    for pass in 0..cp.passes {
        let at = |tile: *mut f32, i: usize| {
            let r = cp.row_of(pass, i);
            // SAFETY: r < BK rows and cp.col + 4 <= HS: inside the stage tile (the caller's
            // K or V stage).
            unsafe { tile.add((r * STRIDE as u32 + cp.col) as usize) }
        };
        let mut x = [[0f32; VEC]; 2 * T_COPY_BATCH];
        unroll!(i < 8 => {
            // SAFETY: `at` is 16-byte aligned inside the tile (STRIDE, cp.col multiples of 4);
            // this thread's own chunk, landed (the caller waited for it).
            x[i] = unsafe { ld4(at(if i < T_COPY_BATCH { k } else { v }, i % T_COPY_BATCH)) };
        });
        unroll!(i < 8 => {
            let r = x[i].map(|e| f32::from_bits(to_tf32(e)));
            // SAFETY: the same chunk this thread read; no thread reads it before the caller's
            // barrier.
            unsafe { st4(at(if i < T_COPY_BATCH { k } else { v }, i % T_COPY_BATCH), r) };
        });
    }
}

/// TF32 operands: the format of `attention_forward_flash_tf32`.
struct Tf32;

impl TcFormat for Tf32 {
    const STAGES: usize = FLASH_TF32_STAGES as usize;
    const TILE_BYTES: usize = TILE * 4;
    const FROM_QKV: bool = true;
    type Cache = f32;
    type Q = [[u32; 4]; DIM_STEPS];

    unsafe fn q(qa: *const f32, qb: *const f32, tq: u32) -> Self::Q {
        // Lane t's dims [8t, 8t+8) and [32+8t, 40+8t), rounded; zeros past the last query.
        let o = 2 * VEC * tq as usize;
        let at = [o, o + VEC, HS / 2 + o, HS / 2 + o + VEC];
        // SAFETY: 8 * tq + 8 <= HS / 2: four aligned vectors inside each row's head
        // slice (the caller's contract).
        let (a, b) = unsafe { (q_vectors(qa, at), q_vectors(qb, at)) };
        let mut qf = [[0u32; 4]; DIM_STEPS];
        unroll!(ks < 8 => {
            let (w0, w1) = (2 * ks, 2 * ks + 1);
            qf[ks] = [
                to_tf32(a[w0 / VEC][w0 % VEC]),
                to_tf32(b[w0 / VEC][w0 % VEC]),
                to_tf32(a[w1 / VEC][w1 % VEC]),
                to_tf32(b[w1 / VEC][w1 % VEC]),
            ];
        });
        qf
    }

    unsafe fn load(k: *mut u8, v: *mut u8, src: KvRows<f32>, key0: u32, n_keys: u32) {
        let cp = TileCopy::f32_tile();
        // SAFETY: the caller's contract; the stages are f32 tiles of TILE floats.
        unsafe {
            load_tile_f32(k.cast(), src.k, src.stride, key0, n_keys, cp);
            load_tile_f32(v.cast(), src.v, src.stride, key0, n_keys, cp);
        }
    }

    unsafe fn prepare(p: &FlashAttentionParams<f32>, k: *mut u8, v: *mut u8) {
        // Unless the caller promised TF32 values.
        if p.kv_rounded == 0 {
            // SAFETY: the caller's contract: this thread's landed chunks (the ones
            // `load` copied: the same `TileCopy`).
            unsafe { round_stage_tf32(k.cast(), v.cast(), TileCopy::f32_tile()) };
        }
    }

    /// Rows g, g+8 of the warp's 16 against keys `32 * at.sub..` of the
    /// stages `at.k`/`at.v` (rounded shared memory, row stride [`STRIDE`]).
    unsafe fn attend<const MASK: bool>(
        st: &mut RowState,
        qf: &Self::Q,
        at: Sub,
        d0: [u32; 2],
        lim: [u32; 2],
        scale: f32,
    ) {
        let rows = at.sub as usize * SUB_K * STRIDE;
        // SAFETY: sub < 2: SUB_K rows inside each f32 stage.
        let (kb, vb) = unsafe { (at.k.cast::<f32>().add(rows), at.v.cast::<f32>().add(rows)) };
        let lane = lane_id() as usize;
        let (g, tq) = (lane / 4, lane % 4);

        // S = Q Kᵀ (16 x 32); B = Kᵀ "col": b0/b1 = K[key g][the lane's dims of step ks].
        let mut s = [[0f32; 4]; SUB_STEPS];
        unroll!(n < 4 => {
            // SAFETY: n * 8 + g < SUB_K keys of the stage, the lane's dims at 8 * tq.
            let kr = unsafe { kb.add((n * MMA_N + g) * STRIDE + 2 * VEC * tq) };
            // SAFETY: 8 * tq + 4 <= HS / 2 and HS / 2 + 8 * tq + 8 <= HS: four aligned
            // vectors inside the key row.
            let y = unsafe { [ld4(kr), ld4(kr.add(VEC)), ld4(kr.add(HS / 2)), ld4(kr.add(HS / 2 + VEC))] };
            unroll!(ks < 8 => {
                let (w0, w1) = (2 * ks, 2 * ks + 1);
                let bf = [y[w0 / VEC][w0 % VEC].to_bits(), y[w1 / VEC][w1 % VEC].to_bits()];
                s[n] = mma_m16n8k8_tf32(qf[ks], bf, s[n]);
            });
        });

        // Mask and row max on raw scores (the scale is positive), then P.
        online_softmax::<MASK>(st, &mut s, d0, lim, scale);

        // O += P V: A = P (k-slot t = key 2t, t+4 = key 2t+1); B = V rows 2t, 2t+1,
        // columns 4g.. and 32+4g.. (module docs).
        unroll!(ks < 4 => {
            let sk = s[ks];
            let af = [round_p_tf32(sk[0]), round_p_tf32(sk[2]), round_p_tf32(sk[1]), round_p_tf32(sk[3])];
            // SAFETY: ks * 8 + 2 * tq + 1 < SUB_K value rows, column 4 * g < HS / 2.
            let v0 = unsafe { vb.add((ks * MMA_N + 2 * tq) * STRIDE + VEC * g) };
            let (lo0, hi0, lo1, hi1) =
                // SAFETY: rows `v0` and `v0 + STRIDE` are value rows of the stage; 4 * g + 4 <=
                // HS / 2 and HS / 2 + 4 * g + 4 <= HS, aligned.
                unsafe { (ld4(v0), ld4(v0.add(HS / 2)), ld4(v0.add(STRIDE)), ld4(v0.add(STRIDE + HS / 2))) };
            unroll!(dt < 8 => {
                let bf = if dt < 4 {
                    [lo0[dt % 4].to_bits(), lo1[dt % 4].to_bits()]
                } else {
                    [hi0[dt % 4].to_bits(), hi1[dt % 4].to_bits()]
                };
                st.acc[dt] = mma_m16n8k8_tf32(af, bf, st.acc[dt]);
            });
        });
    }

    unsafe fn store(
        p: &FlashAttentionParams<f32>,
        at: usize,
        acc: &[[f32; 4]; DIM_STEPS],
        r: usize,
        inv: f32,
        tq: u32,
    ) {
        // Lane t holds dims [8t, 8t+8) (n-tiles 0..4) and [32+8t, 40+8t) (4..8).
        // Entry e of n-tiles dt0..dt0+4, normalised (constant indices once inlined).
        let v = |dt0: usize, e: usize| [0, 1, 2, 3].map(|i| acc[dt0 + i][2 * r + e] * inv);
        // SAFETY: 8 * tq + 8 <= HS / 2: the four vectors are inside the head slice of
        // `out`, aligned (the caller's contract; `out` is 16-byte aligned).
        unsafe {
            let o = p.out.add(at + 2 * VEC * tq as usize);
            st4(o, v(0, 0));
            st4(o.add(VEC), v(0, 1));
            st4(o.add(HS / 2), v(4, 0));
            st4(o.add(HS / 2 + VEC), v(4, 1));
        }
    }
}

/// Prefill flash attention with TF32 tensor-core products (f32 accumulate).
///
/// # Safety
/// Launched as [`FlashAttentionParams`] says (grid, block, shared memory,
/// kv_split 1 or 2); qkv holds b*t*3c floats, out b*t*c, caches b*nh*max_t*HS
/// with positions 0..pos0+t written; c = nh*HS with HS = 64; pos0 + t <= max_t;
/// 16-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_tf32(p: FlashAttentionParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: the launch contract of this kernel is `flash_prefill_tc`'s.
    unsafe { flash_prefill_tc::<Tf32>(&p) }
}
