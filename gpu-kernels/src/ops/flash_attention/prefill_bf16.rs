//! bf16 prefill (`attention_forward_flash_bf16`): the tensor-core body of
//! `prefill_tc` with bf16 operands (`mma.m16n8k16`, f32 accumulate), for
//! the bf16 engine. Half the `mma` instructions of TF32, and half its K/V
//! bytes from L2 and shared memory.
//! - K/V tiles come from the bf16 cache by `cp.async`, as they are: no
//!   conversion pass (the caller fills the cache first: the host wrapper's
//!   store kernel, or the bf16 qkv matmul's epilogue). Rows of 72 bf16 (144
//!   bytes, `FLASH_BF16_STRIDE`), so the 8 rows of one `ldmatrix` phase and
//!   the fragment loads below fall in distinct banks.
//! - Two kernels, by the depth of the ring: 3 tiles and 2 (`_2stage`). The
//!   host takes the second for grids of two blocks an SM and more.
//! - QKᵀ: the contraction order is free as long as Q and K agree, so lane t
//!   owns dims [16t, 16t+16) of its rows: k-step s takes dims 16t+4s, +1
//!   (k-slots 2t, 2t+1) and 16t+4s+2, +3 (2t+8, 2t+9). A K row's 32 bytes
//!   for the lane are two `ld.shared.v4`; key `8n + g` is column g of S
//!   n-tile n (the natural order, which the masks assume).
//! - PV: P's A fragments are S's C fragments of two n-tiles (16 keys) packed
//!   to bf16 in registers; V's B fragments come from the row-major V tile by
//!   `ldmatrix.trans` (four 8x8 matrices: two key halves by two 8-dim
//!   n-tiles). Output n-tile dt holds dims 8dt + 2t, +1 in lane t.
//! - Q rows are rounded to bf16 once, into registers. The row sums use the
//!   f32 probabilities (before rounding), as the TF32 kernel does.

use super::prefill_tc::{KvRows, RowState, Sub, T_THREADS, TcFormat, flash_prefill_tc, online_softmax, q_vectors};
use super::{BK, DIM_STEPS, HS, MMA_N, VEC, ld4};
use crate::device::mma::{cp_async_16_zfill, ldmatrix_x4_trans, mma_m16n8k16_bf16, pack_bf16x2, shared_addr};
use crate::device::unroll;
use crate::device::{Vec2, lane_id, thread_idx_x};
use crate::params::flash_attention::*;

/// bf16 elements per row of a ring tile.
const KS: usize = FLASH_BF16_STRIDE as usize;
/// Bytes of one ring tile (K or V).
const TILE_BYTES: usize = BK * KS * 2;
/// bf16 elements of one 16-byte copy.
const CHUNK: usize = 8;
/// 16-byte chunks of a tile row (HS bf16).
const CHUNKS_PER_ROW: usize = HS / CHUNK;
/// Chunks of a K (or V) tile each thread copies.
const COPIES: usize = BK * CHUNKS_PER_ROW / T_THREADS;
/// k-steps of 16 over the head dims (QKᵀ).
const K_STEPS: usize = HS / 16;
/// Keys of one warp step.
const SUB_K: usize = FLASH_TF32_SUB_KEYS as usize;
const _: () = assert!(
    K_STEPS == 4 && SUB_K / MMA_N == 4 && DIM_STEPS == 8,
    "the loops below are unrolled for these"
);
const _: () = assert!(
    (KS * 2).is_multiple_of(16),
    "rows stay 16-byte aligned for cp.async, ld.shared.v4 and ldmatrix"
);
const _: () = assert!(
    COPIES == 2 && COPIES * T_THREADS == BK * CHUNKS_PER_ROW,
    "each thread copies 2 chunks a tile"
);
const _: () = assert!(FLASH_SMEM_BYTES_BF16 as usize == 2 * FLASH_TF32_STAGES as usize * TILE_BYTES);
const _: () = assert!(FLASH_SMEM_BYTES_BF16_2STAGE as usize == 2 * FLASH_BF16_SHORT_STAGES as usize * TILE_BYTES);

/// Words `w` (bf16 pairs) of a 16-byte shared load.
///
/// # Safety
/// `p` is 16 readable bytes of shared memory, 16-byte aligned.
#[inline(always)]
unsafe fn ld_words(p: *const u16) -> [u32; 4] {
    // SAFETY: the caller's contract (ld4 reads 16 aligned bytes).
    unsafe { ld4(p as *const f32) }.map(f32::to_bits)
}

/// bf16 operands over a bf16 ring of `STAGES` tiles: the format of
/// `attention_forward_flash_bf16` (3) and `_bf16_2stage` (2).
struct Bf16<const STAGES: usize>;

impl<const STAGES: usize> TcFormat for Bf16<STAGES> {
    const STAGES: usize = STAGES;
    const TILE_BYTES: usize = TILE_BYTES;
    const FROM_QKV: bool = false;
    type Cache = u16;
    type Q = [[u32; 4]; K_STEPS];

    unsafe fn q(qa: *const f32, qb: *const f32, tq: u32) -> Self::Q {
        // Lane t's dims [16t, 16t+16); zeros past the last query.
        let o = 16 * tq as usize;
        let at = [o, o + VEC, o + 2 * VEC, o + 3 * VEC];
        // SAFETY: 16 * tq + 16 <= HS: four aligned vectors inside each row's head slice
        // (the caller's contract).
        let (a, b) = unsafe { (q_vectors(qa, at), q_vectors(qb, at)) };
        let mut qf = [[0u32; 4]; K_STEPS];
        // k-step s: dims 16t + 4s (vector s): entries 0, 1 at k-slots 2t, 2t+1; 2, 3 at 2t+8, 2t+9.
        unroll!(s < 4 => {
            qf[s] = [
                pack_bf16x2(a[s][0], a[s][1]),
                pack_bf16x2(b[s][0], b[s][1]),
                pack_bf16x2(a[s][2], a[s][3]),
                pack_bf16x2(b[s][2], b[s][3]),
            ];
        });
        qf
    }

    unsafe fn load(k: *mut u8, v: *mut u8, src: KvRows<u16>, key0: u32, n_keys: u32) {
        let tid = thread_idx_x() as usize;
        unroll!(j < 2 => {
            // Chunk tid + j * T_THREADS of the tile: row r, elements col..col + 8.
            let i = tid + j * T_THREADS;
            let (r, col) = ((i / CHUNKS_PER_ROW) as u32, (i % CHUNKS_PER_ROW) * CHUNK);
            let key = key0 + r;
            let valid = key < n_keys;
            // An invalid row copies 0 bytes; its source address is still kept in bounds.
            let src_row = if valid { key } else { n_keys - 1 };
            let dst = (r as usize * KS + col) * 2;
            let from = (src_row * src.stride) as usize + col;
            // SAFETY: r < BK rows of KS bf16 and col + 8 <= HS <= KS: 16 aligned bytes of the
            // caller's stages (KS * 2 and col * 2 multiples of 16); `src_row` < n_keys is a
            // readable row of `src`, 16-byte aligned; invalid rows copy 0 bytes. `cp.async`
            // copies bytes, so the f32 pointer type it takes is only an address.
            unsafe {
                let bytes = if valid { 16 } else { 0 };
                cp_async_16_zfill(k.add(dst).cast(), src.k.add(from).cast(), bytes);
                cp_async_16_zfill(v.add(dst).cast(), src.v.add(from).cast(), bytes);
            }
        });
    }

    unsafe fn prepare(_p: &FlashAttentionParams<u16>, _k: *mut u8, _v: *mut u8) {
        // The copies are the operands as they are.
    }

    unsafe fn attend<const MASK: bool>(
        st: &mut RowState,
        q: &Self::Q,
        at: Sub,
        d0: [u32; 2],
        lim: [u32; 2],
        scale: f32,
    ) {
        let lane = lane_id() as usize;
        let (g, tq) = (lane / 4, lane % 4);
        let rows = at.sub as usize * SUB_K * KS;
        // SAFETY: sub < 2: rows 32 * sub.. of each stage.
        let (kb, vb) = unsafe { (at.k.cast::<u16>().add(rows), at.v.cast::<u16>().add(rows)) };

        // S = Q Kᵀ (16 x 32): n-tile n is keys 8n..8n+8, lane g loads key 8n + g.
        let mut s = [[0f32; 4]; SUB_K / MMA_N];
        unroll!(n < 4 => {
            // SAFETY: key 8n + g < SUB_K rows of the step, dims 16 tq.. +16 inside the row.
            let kr = unsafe { kb.add((n * MMA_N + g) * KS + 16 * tq) };
            // SAFETY: 32 bytes of the row, 16-byte aligned (KS * 2 and 32 tq multiples of 16).
            let y = unsafe { [ld_words(kr), ld_words(kr.add(8))] };
            unroll!(ks < 4 => {
                let b = [y[ks / 2][2 * (ks % 2)], y[ks / 2][2 * (ks % 2) + 1]];
                s[n] = mma_m16n8k16_bf16(q[ks], b, s[n]);
            });
        });

        online_softmax::<MASK>(st, &mut s, d0, lim, scale);

        // O += P V, 16 keys a k-step: P from S n-tiles 2j, 2j+1; V by ldmatrix.trans,
        // matrix m = lane / 8 (keys 16j + 8 (m & 1) + lane % 8, dims 16 dp + 8 (m >> 1)).
        let (m, rr) = (lane / 8, lane % 8);
        unroll!(j < 2 => {
            let (lo, hi) = (s[2 * j], s[2 * j + 1]);
            let a = [
                pack_bf16x2(lo[0], lo[1]),
                pack_bf16x2(lo[2], lo[3]),
                pack_bf16x2(hi[0], hi[1]),
                pack_bf16x2(hi[2], hi[3]),
            ];
            let key = 16 * j + 8 * (m & 1) + rr;
            unroll!(dp < 4 => {
                // SAFETY: key < SUB_K rows of the step, dims 16 dp + 8 (m >> 1) + 8 <= HS: a
                // 16-byte aligned row piece of the published V tile.
                let b = unsafe { ldmatrix_x4_trans(shared_addr(vb.add(key * KS + 16 * dp + 8 * (m >> 1)))) };
                st.acc[2 * dp] = mma_m16n8k16_bf16(a, [b[0], b[1]], st.acc[2 * dp]);
                st.acc[2 * dp + 1] = mma_m16n8k16_bf16(a, [b[2], b[3]], st.acc[2 * dp + 1]);
            });
        });
    }

    unsafe fn store(
        p: &FlashAttentionParams<u16>,
        at: usize,
        acc: &[[f32; 4]; DIM_STEPS],
        r: usize,
        inv: f32,
        tq: u32,
    ) {
        let bf16 = !p.out_bf16.is_null();
        unroll!(dt < 8 => {
            let v = [acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv];
            let e = at + MMA_N * dt + 2 * tq as usize;
            // SAFETY: dims 8 dt + 2 tq, +1 < HS of the head slice (the caller's contract):
            // 4 aligned bytes of `out_bf16` (e even, the buffer 4-byte aligned) or 8 of `out`.
            unsafe {
                if bf16 {
                    *(p.out_bf16.add(e) as *mut u32) = pack_bf16x2(v[0], v[1]);
                } else {
                    *(p.out.add(e) as *mut Vec2<f32>) = Vec2(v);
                }
            }
        });
    }
}

/// Prefill flash attention with bf16 tensor-core products (bf16 Q, K, V and
/// P, f32 accumulate and softmax), a 3-tile ring of bf16 K/V from the cache
/// (`kv_from_qkv` is ignored: the caller fills the cache first).
///
/// # Safety
/// As for `attention_forward_flash_tf32`, with [`FLASH_SMEM_BYTES_BF16`]
/// bytes of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_bf16(p: FlashAttentionParams<u16>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: the launch contract of this kernel is `flash_prefill_tc`'s.
    unsafe { flash_prefill_tc::<Bf16<{ FLASH_TF32_STAGES as usize }>>(&p) }
}

/// [`attention_forward_flash_bf16`] over a 2-tile ring: two blocks an SM.
///
/// # Safety
/// As for [`attention_forward_flash_bf16`], with
/// [`FLASH_SMEM_BYTES_BF16_2STAGE`] bytes of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_forward_flash_bf16_2stage(p: FlashAttentionParams<u16>) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: the launch contract of this kernel is `flash_prefill_tc`'s.
    unsafe { flash_prefill_tc::<Bf16<{ FLASH_BF16_SHORT_STAGES as usize }>>(&p) }
}
