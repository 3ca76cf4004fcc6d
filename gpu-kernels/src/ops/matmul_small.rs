//! `out = inp · weightᵀ + bias` (optionally GELU), FP32 on the CUDA cores,
//! for few rows (short prompts): split-K finished inside the same launch.
//!
//! Block `(x, y, z)` computes the `64 x 64` tile `(y, x)` of `out` over split
//! `z` of `c` (`k_chunk` deep). Its 128 threads each hold an `8 x 4` patch
//! (rows `ty + 8 i`, columns `tx + 16 j`); the split is staged through a
//! 4-slice `cp.async` ring of 8-deep slices (A rows, then W rows), one barrier
//! per slice. With one split the block writes the result directly. With
//! more, it writes its partial tile to the workspace and counts its arrival
//! on the tile's counter; the block that arrives last sums the tile's
//! partials in split order 0, 1, ... (fixed, so results do not depend on
//! which block came last), adds the bias, applies GELU, stores, and sets the
//! counter back to zero for the next launch.
//!
//! Why: at n = 64 the output has only 12..48 tiles of 64 x 64, far from
//! filling 132 SMs; splitting `c` gives each SM a few small blocks (their
//! loads overlap each other's FFMAs), and finishing the sum in the last
//! block saves the second launch and the partials' round trip that grid
//! split-K pays. The partials stay in L2 (a few MB).

use super::gelu::gelu;
use super::vec4::{VEC, add4, aligned16, load4, store4};
use crate::device::math::fma;
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group};
use crate::device::shared::dynamic_shared_align16;
use crate::device::sync::{atomic_add_acq_rel_u32, thread_fence};
use crate::device::unroll;
use crate::device::{block_idx_x, block_idx_y, block_idx_z, grid_dim_x, sync_threads, thread_idx_x};
use crate::params::matmul::{
    MATMUL_SMALL_BLOCK, MATMUL_SMALL_PAD, MATMUL_SMALL_PARTIAL_FLOATS, MATMUL_SMALL_STAGES, MATMUL_SMALL_THREAD_M,
    MATMUL_SMALL_THREAD_N, MATMUL_SMALL_TILE_K, MATMUL_SMALL_TILE_M, MATMUL_SMALL_TILE_N, MatmulSmallParams,
};

const BM: usize = MATMUL_SMALL_TILE_M as usize;
const BN: usize = MATMUL_SMALL_TILE_N as usize;
const TK: usize = MATMUL_SMALL_TILE_K as usize;
const TM: usize = MATMUL_SMALL_THREAD_M as usize;
const TN: usize = MATMUL_SMALL_THREAD_N as usize;
const THREADS: usize = MATMUL_SMALL_BLOCK as usize;
const STAGES: usize = MATMUL_SMALL_STAGES as usize;
/// Floats per staged row (`TK` deep plus the pad).
const LDS: usize = TK + MATMUL_SMALL_PAD as usize;
/// Threads along the tile's columns (and the row stride of a patch).
const LANES_N: usize = BN / TN;
/// Rows of a staged slice: the tile's A rows, then its W rows.
const ROWS: usize = BM + BN;
/// Floats of one staged slice.
const STAGE: usize = ROWS * LDS;
/// 16-byte chunks per staged row.
const CHUNKS_K: usize = TK / VEC;
/// 16-byte chunks each thread copies per slice.
const LOADS: usize = ROWS * CHUNKS_K / THREADS;
/// `cp.async` groups still in flight when slice `t` is consumed: the ring
/// holds `STAGES` slices, one being read, the others loading.
const IN_FLIGHT: u32 = MATMUL_SMALL_STAGES - 2;
/// Partial-tile floats per thread (its patch), stored as `TM` vectors of `TN`.
const PATCH: usize = TM * TN;
/// Vectors of its patch a thread of the last block sums per pass over the
/// partials.
const FIXUP_VECS: usize = 2;
/// Passes over the partials: `TM / FIXUP_VECS`.
const FIXUP_PASSES: usize = TM / FIXUP_VECS;
/// Partial tiles loaded at once per step of a pass: `FIXUP_VECS *
/// FIXUP_DEPTH` 16-byte loads in flight per thread. 2 x 11 keeps the kernel
/// at 122 registers on sm_90 (4 blocks per SM, as the main loop alone) and
/// needs 4 round trips for 11 splits; 8 x 3 needed 146 registers, 4 x 4 six
/// round trips.
const FIXUP_DEPTH: usize = 11;

const _: () = assert!(THREADS == (BM / TM) * LANES_N && TN == VEC && STAGES >= 2);
const _: () = assert!(TK.is_multiple_of(VEC) && LDS.is_multiple_of(VEC) && ROWS * CHUNKS_K == LOADS * THREADS);
// Load round `l` covers rows `l * THREADS / CHUNKS_K ..`: round 0 is all A
// rows, round 1 all W rows.
const _: () = assert!(LOADS == 2 && BM == THREADS / CHUNKS_K && BN == BM);
// The k step below reads two 16-byte chunks per staged row.
const _: () = assert!(CHUNKS_K == 2);
const _: () = assert!(PATCH * THREADS == MATMUL_SMALL_PARTIAL_FLOATS as usize);
const _: () = assert!(FIXUP_PASSES * FIXUP_VECS == TM);

/// Small-M matmul (see the module docs).
///
/// Launch: grid `(ceil(oc / MATMUL_SMALL_TILE_N), ceil(n /
/// MATMUL_SMALL_TILE_M), splits)`, `MATMUL_SMALL_BLOCK` threads,
/// `matmul_small_shared_bytes()` bytes of dynamic shared memory.
///
/// # Safety
/// Buffers and `k_chunk` / `splits` as documented on [`MatmulSmallParams`]
/// (workspace and zeroed counters when `splits > 1`, and no other launch
/// using the same counters or partials at the same time); launch as above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward_small(p: MatmulSmallParams) {
    // Deliberately not chained with PDL (no `grid_dependency_sync` here):
    // chained, the server's steps on the CUDA-core matmuls took 0.26-0.38 ms
    // longer at 9-64 rows (H100, docs/performance.md, "Kernels chained with
    // PDL"); every other kernel of those steps gained.
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let (m0, n0) = (block_idx_y() as usize * BM, block_idx_x() as usize * BN);
    let (z, splits) = (block_idx_z() as usize, p.splits as usize);
    let k_begin = z * p.k_chunk as usize;
    let k_end = c.min(k_begin + p.k_chunk as usize);
    let tid = thread_idx_x() as usize;
    let (ty, tx) = (tid / LANES_N, tid % LANES_N);
    let vec = c % VEC == 0 && aligned16(p.inp) && aligned16(p.weight);
    // SAFETY: the launch provides matmul_small_shared_bytes() bytes: STAGES
    // slices of STAGE floats.
    let smem = unsafe { dynamic_shared_align16::<f32>() };
    let slices = k_end.saturating_sub(k_begin).div_ceil(TK);

    // The chunk this thread copies in load round `l`: staged row `lr + l *
    // BM` (round 0: A row lr, round 1: W row lr), depth `kq..kq + 4`.
    let (lr, kq) = (tid / CHUNKS_K, (tid % CHUNKS_K) * VEC);
    let dst0 = lr * LDS + kq;
    // (source matrix, its row, its row count) per round.
    let sources = [(p.inp, m0 + lr, n), (p.weight, n0 + lr, oc)];

    // Stage slice `t` of this split into ring buffer `t % STAGES`. Elements
    // outside `n`, `oc` or the split are staged as 0.
    let load_slice = |t: usize| {
        let k = k_begin + t * TK + kq;
        // SAFETY: buffer t % STAGES of the ring; rows lr + l * BM < ROWS.
        let buf = unsafe { smem.add((t % STAGES) * STAGE + dst0) };
        for (l, &(src, row, rows)) in sources.iter().enumerate() {
            // SAFETY: this thread's chunk of row lr + l * BM of the slice.
            let dst = unsafe { buf.add(l * BM * LDS) };
            if vec {
                // c % 4 == 0, k % 4 == 0 and k_end is c or a multiple of 8:
                // a chunk is wholly inside the split or wholly outside.
                let ok = row < rows && k < k_end;
                // SAFETY: when ok, row < rows and k + 4 <= c: 16 readable,
                // aligned bytes (vec); else 0 bytes are read from a valid
                // base. The destination is 16-byte aligned (LDS, kq % 4 == 0).
                unsafe {
                    let s = if ok { src.add(row * c + k) } else { src };
                    cp_async_16_zfill(dst, s, if ok { 16 } else { 0 });
                }
            } else {
                // Scalar path (c % 4 != 0 or unaligned operands): plain loads
                // and shared stores, ordered before the slice is read by the
                // barrier that precedes it, as the cp.async wait is.
                for e in 0..VEC {
                    let v = if row < rows && k + e < k_end {
                        // SAFETY: row < rows and k + e < c: inside the matrix.
                        unsafe { *src.add(row * c + k + e) }
                    } else {
                        0.0
                    };
                    // SAFETY: this thread's chunk of the slice.
                    unsafe { *dst.add(e) = v };
                }
            }
        }
    };

    // Prologue: slices 0..STAGES-1 in flight (empty groups past `slices`, so
    // group i is always slice i and the wait count below stays constant).
    for t in 0..STAGES - 1 {
        if t < slices {
            load_slice(t);
        }
        cp_async_commit();
    }

    let mut acc = [[0.0f32; TN]; TM];
    // A reads: the 2 rows of a warp (ty, ty + 1) are broadcast; W reads: 16
    // rows 12 floats apart, each bank quad twice (the minimum for 256 B).
    let a_off = ty * LDS;
    let b_off = (BM + tx) * LDS;
    for t in 0..slices {
        cp_async_wait_group::<IN_FLIGHT>();
        // Every thread's copies of slice t have landed, and every thread is
        // done reading buffer (t - 1) % STAGES, which the next load refills.
        sync_threads();
        if t + STAGES - 1 < slices {
            load_slice(t + STAGES - 1);
        }
        cp_async_commit();
        // SAFETY: buffer t % STAGES of the ring.
        let buf = unsafe { smem.add((t % STAGES) * STAGE) };
        // Four k of the slice: TM + TN `ld.shared.v4`, then 4 TM TN FFMA.
        // Written out per quad (a macro, not a loop): the arrays are then
        // indexed by constants only and stay in registers.
        macro_rules! quad {
            ($q:expr) => {{
                // SAFETY: rows ty + 8 i < BM of the slice; depth $q * 4 + 4 <= TK.
                let av: [[f32; VEC]; TM] = core::array::from_fn(|i| unsafe {
                    load4(buf.add(a_off + i * (BM / TM) * LDS + $q * VEC))
                });
                let bv: [[f32; VEC]; TN] =
                    // SAFETY: rows BM + tx + 16 j < ROWS of the slice.
                    core::array::from_fn(|j| unsafe { load4(buf.add(b_off + j * LANES_N * LDS + $q * VEC)) });
                // Written out per k (LLVM leaves the whole nest rolled,
                // and `acc` in local memory, otherwise).
                unroll!(kk < VEC => {
                    for i in 0..TM {
                        for j in 0..TN {
                            acc[i][j] = fma(av[i][kk], bv[j][kk], acc[i][j]);
                        }
                    }
                });
            }};
        }
        quad!(0);
        quad!(1);
    }
    cp_async_wait_group::<0>();

    // The patch's bias values, loaded before the (latency-bound) sum of the
    // partials rather than after it.
    let bias: [f32; TN] = core::array::from_fn(|j| {
        let col = n0 + tx + j * LANES_N;
        if col < oc && !p.bias.is_null() {
            // SAFETY: col < oc, and a non-null bias holds oc floats.
            unsafe { *p.bias.add(col) }
        } else {
            0.0
        }
    });
    // Epilogue of row `i` of the patch: bias, GELU, guarded stores (the
    // patch's columns are 16 apart). Called with constant `i` only.
    let store_row = |i: usize, vals: [f32; TN]| {
        let row = m0 + ty + i * (BM / TM);
        unroll!(j < TN => {
            let col = n0 + tx + j * LANES_N;
            if row < n && col < oc {
                let v = vals[j] + bias[j];
                // SAFETY: row < n, col < oc.
                unsafe { *p.out.add(row * oc + col) = if p.gelu != 0 { gelu(v) } else { v } };
            }
        });
    };
    if splits > 1 {
        let tile = block_idx_y() as usize * grid_dim_x() as usize + block_idx_x() as usize;
        // This tile's partials: split s at tile_base + s * PARTIAL; within
        // one, vector i of thread tid at (i * THREADS + tid) * VEC, so each
        // warp's stores and loads are 512 contiguous bytes.
        // SAFETY: the workspace holds tiles * splits partials (the contract).
        let tile_base = unsafe { p.partial.add(tile * splits * PATCH * THREADS) };
        let at = |s: usize, i: usize| (s * THREADS * TM + i * THREADS + tid) * VEC;
        unroll!(i < TM => {
            // SAFETY: partial z of this tile, inside the workspace; 16-byte
            // aligned (the workspace is, and every offset is a multiple of 4).
            unsafe { store4(tile_base.add(at(z, i)), acc[i]) };
        });
        // Release: the barrier orders every thread's partial store before
        // thread 0's fence, which (cumulative, GPU scope) makes them visible
        // device-wide before the block's arrival is counted. One fence per
        // block rather than per thread (ncu: the per-thread fences' membar
        // stalls went away; the call's time did not measurably change).
        sync_threads();
        // One shared word says whether this block arrived last (the ring is
        // no longer read: every thread passed the barrier above after its
        // last slice).
        if tid == 0 {
            thread_fence();
            // SAFETY: counters[tile] exists (the contract); one u32 of the
            // ring's shared memory.
            unsafe {
                let counter = p.counters.add(tile);
                let last = atomic_add_acq_rel_u32(counter, 1) as usize == splits - 1;
                if last {
                    // Every split has arrived: nobody else touches it in this
                    // launch, and the next launch finds it zero.
                    *counter = 0;
                }
                *(smem as *mut u32) = last as u32;
            }
        }
        // Acquire: thread 0's acquire-release atomic saw every arrival; the
        // barrier orders the loads below after it.
        sync_threads();
        // SAFETY: written by thread 0 before the barrier.
        if unsafe { *(smem as *const u32) } == 0 {
            return;
        }
        // The sum in passes of FIXUP_VECS of the patch's TM vectors, each
        // step loading FIXUP_DEPTH partials at once (one L2 round trip per
        // step), added in split order.
        unroll!(h < FIXUP_PASSES => {
            let mut sum = [[0.0f32; VEC]; FIXUP_VECS];
            let mut s = 0;
            while s < splits {
                let mut parts = [[[0.0f32; VEC]; FIXUP_VECS]; FIXUP_DEPTH];
                unroll!(d < FIXUP_DEPTH => {
                    if s + d < splits {
                        unroll!(v < FIXUP_VECS => {
                            // SAFETY: partial s + d < splits of this tile
                            // (all written: every split arrived).
                            parts[d][v] = unsafe { load4(tile_base.add(at(s + d, h * FIXUP_VECS + v))) };
                        });
                    }
                });
                unroll!(d < FIXUP_DEPTH => {
                    if s + d < splits {
                        unroll!(v < FIXUP_VECS => {
                            sum[v] = add4(sum[v], parts[d][v]);
                        });
                    }
                });
                s += FIXUP_DEPTH;
            }
            // Stored pass by pass: nothing of the sum stays live across
            // passes (registers for the loads in flight instead).
            unroll!(v < FIXUP_VECS => {
                store_row(h * FIXUP_VECS + v, sum[v]);
            });
        });
        return;
    }

    // Unsplit: the accumulators are the result. Every loop over `acc` here
    // and above is written out (`unroll!`): one run-time index
    // anywhere puts the whole array in local memory.
    unroll!(i < TM => {
        store_row(i, acc[i]);
    });
}
