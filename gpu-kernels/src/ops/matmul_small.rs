//! `out = inp · weightᵀ + bias` (optionally GELU), FP32 on the CUDA cores,
//! for few rows (short prompts): the K reduction is split inside the block.
//!
//! A block computes a `TILE_M x BN` tile of `out` (`TILE_M = 64`). Its
//! `MATMUL_SMALL_WARPS` warps are K groups: warp `g` takes k-slices `g, g +
//! WARPS, g + 2 WARPS, ...` of `c` and accumulates the *whole* tile over
//! them in registers (each lane `THREAD_M x TN` outputs). Each warp stages
//! its slices through its own shared-memory ring with `cp.async` (no block
//! barrier in the main loop, only `__syncwarp`). At the end the warps' partial
//! tiles go to shared memory and are summed in warp order 0, 1, ... (fixed,
//! so results do not depend on scheduling), then bias and GELU are applied.
//!
//! Why: at n = 64 the 128-row tiles of `ops::matmul` waste half their rows
//! and their grids under-fill the GPU, and grid split-K pays a second launch
//! plus partial traffic through L2. Here N = 2304 gives 72..96 blocks of
//! eight warps, one launch, and every FMA is useful.

use super::gelu::gelu;
use super::vec4::{VEC, aligned16, load4, store4};
use crate::device::math::fma;
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group};
use crate::device::shared::dynamic_shared_align16;
use crate::device::{WARP_SIZE, block_idx_x, block_idx_y, lane_id, sync_threads, sync_warp, thread_idx_x, warp_id};
use crate::params::matmul::{
    MATMUL_SMALL_BLOCK, MATMUL_SMALL_LANES_M, MATMUL_SMALL_LANES_N, MATMUL_SMALL_PAD, MATMUL_SMALL_STAGES,
    MATMUL_SMALL_THREAD_M, MATMUL_SMALL_TILE_K, MATMUL_SMALL_TILE_M, MATMUL_SMALL_TILE_NS, MATMUL_SMALL_WARPS,
    MatmulParams,
};

const TK: usize = MATMUL_SMALL_TILE_K as usize;
const PAD: usize = MATMUL_SMALL_PAD as usize;
/// Floats per staged row (`TK` deep plus the pad).
const LDS: usize = TK + PAD;
const STAGES: usize = MATMUL_SMALL_STAGES as usize;
const WARPS: usize = MATMUL_SMALL_WARPS as usize;
const THREADS: usize = MATMUL_SMALL_BLOCK as usize;
const LANES: usize = WARP_SIZE as usize;
const LM: usize = MATMUL_SMALL_LANES_M as usize;
const LN: usize = MATMUL_SMALL_LANES_N as usize;
const TM: usize = MATMUL_SMALL_THREAD_M as usize;
const BM: usize = MATMUL_SMALL_TILE_M as usize;
/// 16-byte chunks per staged row.
const CHUNKS_K: usize = TK / VEC;
/// Rows of a staged slice one round of a warp's loads covers (one chunk per lane).
const ROWS_PER_ROUND: usize = LANES / CHUNKS_K;
/// `cp.async` groups still in flight when slice `t` is consumed: the ring
/// holds `STAGES` slices, one being read, the others loading.
const IN_FLIGHT: u32 = MATMUL_SMALL_STAGES - 2;

const _: () = assert!(LM * LN == LANES && BM == LM * TM && THREADS == WARPS * LANES);
const _: () = assert!(TK % VEC == 0 && PAD % VEC == 0 && STAGES >= 2);
// A-rows of one load round are all A or all B: the stage holds the 64 A rows
// first, then the B rows, and a round covers ROWS_PER_ROUND of them.
const _: () = assert!(BM % ROWS_PER_ROUND == 0);
// The k-quad step below reads two 16-byte chunks per row.
const _: () = assert!(CHUNKS_K == 2);

/// Element-wise sum of two 4-float groups.
#[inline(always)]
fn add4(a: [f32; VEC], b: [f32; VEC]) -> [f32; VEC] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
}

/// The small-M matmul with `TN` columns per lane (tile `64 x 4 TN`).
///
/// # Safety
/// Buffers as documented on [`MatmulParams`] (`k_chunk` is ignored: every
/// block covers all of `c`); `MATMUL_SMALL_BLOCK` threads; grid
/// `(ceil(oc / (4 TN)), ceil(n / 64))`; `matmul_small_shared_bytes(4 TN)`
/// bytes of dynamic shared memory.
#[inline(always)]
unsafe fn small<const TN: usize>(p: &MatmulParams) {
    let bn = TN * LN;
    // Stage: BM A rows then bn B rows, LDS floats each.
    let stage = (BM + bn) * LDS;
    // Partial tiles: row stride bn + PAD.
    let ldp = bn + PAD;
    let b_rounds = bn.div_ceil(ROWS_PER_ROUND);
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let m0 = block_idx_y() as usize * BM;
    let n0 = block_idx_x() as usize * bn;
    let lane = lane_id() as usize;
    let g = warp_id() as usize;
    let (ty, tx) = (lane / LN, lane % LN);
    let vec = c % VEC == 0 && aligned16(p.inp) && aligned16(p.weight);
    // SAFETY: the launch provides matmul_small_shared_bytes(bn) bytes, at
    // least WARPS * STAGES * stage floats.
    let smem = unsafe { dynamic_shared_align16::<f32>() };
    // SAFETY: warp g's ring: STAGES stages from g * STAGES * stage.
    let ring = unsafe { smem.add(g * STAGES * stage) };
    let slices = c.div_ceil(TK);
    // This warp's slices: g, g + WARPS, ... below `slices`.
    let mine = if slices > g { (slices - g).div_ceil(WARPS) } else { 0 };

    // The chunk this lane loads in each round: row `lr + r * ROWS_PER_ROUND`
    // of the stage, depth `kq..kq + 4` of the slice.
    let (lr, kq) = (lane / CHUNKS_K, (lane % CHUNKS_K) * VEC);
    let dst0 = lr * LDS + kq;
    let a_row = m0 + lr;
    let b_row = n0 + lr;

    // Stage slice number `t` of this warp into ring buffer `t % STAGES`.
    // Elements outside `n`, `oc` or `c` are staged as 0.
    let load_slice = |t: usize| {
        let k0 = (g + t * WARPS) * TK;
        // SAFETY: buffer t % STAGES of this warp's ring; rows < BM + bn.
        let buf = unsafe { ring.add((t % STAGES) * stage + dst0) };
        let k = k0 + kq;
        if vec {
            // c % 4 == 0 and k % 4 == 0: a chunk is wholly inside c or out.
            for r in 0..BM / ROWS_PER_ROUND {
                let row = a_row + r * ROWS_PER_ROUND;
                let ok = row < n && k < c;
                // SAFETY: when ok, row < n and k + 4 <= c: 16 readable,
                // aligned bytes (vec); else 0 bytes are read from a valid
                // base. The destination is this lane's chunk of the stage.
                unsafe {
                    let src = if ok { p.inp.add(row * c + k) } else { p.inp };
                    cp_async_16_zfill(buf.add(r * ROWS_PER_ROUND * LDS), src, if ok { 16 } else { 0 });
                }
            }
            for r in 0..b_rounds {
                let sr = lr + r * ROWS_PER_ROUND;
                if sr < bn {
                    let row = b_row + r * ROWS_PER_ROUND;
                    let ok = row < oc && k < c;
                    // SAFETY: as above, for weight (rows < oc); stage row
                    // BM + sr < BM + bn.
                    unsafe {
                        let src = if ok { p.weight.add(row * c + k) } else { p.weight };
                        cp_async_16_zfill(buf.add((BM + r * ROWS_PER_ROUND) * LDS), src, if ok { 16 } else { 0 });
                    }
                }
            }
        } else {
            // Scalar path (c % 4 != 0 or unaligned operands): plain loads and
            // shared stores; the next `sync_warp` before the slice is read
            // orders them like the cp.async wait.
            let put = |dst: *mut f32, src: *const f32, row: usize, rows: usize| {
                for e in 0..VEC {
                    let v = if row < rows && k + e < c {
                        // SAFETY: row < rows and k + e < c: inside the matrix.
                        unsafe { *src.add(row * c + k + e) }
                    } else {
                        0.0
                    };
                    // SAFETY: this lane's chunk of the stage.
                    unsafe { *dst.add(e) = v };
                }
            };
            for r in 0..BM / ROWS_PER_ROUND {
                // SAFETY: stage row lr + r * ROWS_PER_ROUND < BM.
                put(
                    unsafe { buf.add(r * ROWS_PER_ROUND * LDS) },
                    p.inp,
                    a_row + r * ROWS_PER_ROUND,
                    n,
                );
            }
            for r in 0..b_rounds {
                if lr + r * ROWS_PER_ROUND < bn {
                    // SAFETY: stage row BM + lr + r * ROWS_PER_ROUND < BM + bn.
                    let dst = unsafe { buf.add((BM + r * ROWS_PER_ROUND) * LDS) };
                    put(dst, p.weight, b_row + r * ROWS_PER_ROUND, oc);
                }
            }
        }
    };

    // Prologue: slices 0..STAGES-1 in flight (empty groups past `mine`, so
    // group i is always slice i and the wait count below stays constant).
    for t in 0..STAGES - 1 {
        if t < mine {
            load_slice(t);
        }
        cp_async_commit();
    }

    let mut acc = [[0.0f32; TN]; TM];
    // Lane (ty, tx) holds rows ty + LM i and columns tx + LN j: a warp's
    // `ld.shared.v4` of one i reads 8 rows 12 floats apart (8 distinct bank
    // quads), of one j 4 rows (conflict-free too).
    let a_off = ty * LDS;
    let b_off = (BM + tx) * LDS;
    let mut t = 0;
    while t < mine {
        cp_async_wait_group::<IN_FLIGHT>();
        // Every lane's copies of slice t have landed, and every lane is done
        // reading buffer (t - 1) % STAGES, which the next load refills.
        sync_warp();
        if t + STAGES - 1 < mine {
            load_slice(t + STAGES - 1);
        }
        cp_async_commit();
        // SAFETY: buffer t % STAGES of this warp's ring.
        let buf = unsafe { ring.add((t % STAGES) * stage) };
        // Four k of the slice: TM + TN `ld.shared.v4`, then 4 TM TN FFMA.
        // Written out per k (macros, not loops): the arrays are then indexed
        // by constants only and stay in registers.
        macro_rules! quad {
            ($q:expr) => {{
                // SAFETY: rows ty + LM i < BM of the stage; depth $q * 4 + 4 <= TK.
                let av = unsafe {
                    let a = buf.add(a_off + $q * VEC);
                    let mut av = [[0.0f32; VEC]; TM];
                    for i in 0..TM {
                        av[i] = load4(a.add(i * LM * LDS));
                    }
                    av
                };
                // SAFETY: rows BM + tx + LN j < BM + bn of the stage.
                let bv = unsafe {
                    let b = buf.add(b_off + $q * VEC);
                    let mut bv = [[0.0f32; VEC]; TN];
                    for j in 0..TN {
                        bv[j] = load4(b.add(j * LN * LDS));
                    }
                    bv
                };
                macro_rules! k_step {
                    ($kk:expr) => {
                        for i in 0..TM {
                            for j in 0..TN {
                                acc[i][j] = fma(av[i][$kk], bv[j][$kk], acc[i][j]);
                            }
                        }
                    };
                }
                k_step!(0);
                k_step!(1);
                k_step!(2);
                k_step!(3);
            }};
        }
        quad!(0);
        quad!(1);
        t += 1;
    }
    cp_async_wait_group::<0>();

    // Partial tiles, then the ordered sum. The first barrier: every warp is
    // done with its ring, which the partials overwrite.
    sync_threads();
    // SAFETY: warp g's partial tile: BM * ldp floats from g * BM * ldp,
    // within matmul_small_shared_bytes(bn).
    unsafe {
        let part = smem.add(g * BM * ldp + ty * ldp + tx);
        for i in 0..TM {
            for j in 0..TN {
                *part.add(i * LM * ldp + j * LN) = acc[i][j];
            }
        }
    }
    sync_threads();
    let groups = BM * bn / VEC;
    let per_row = bn / VEC;
    let tid = thread_idx_x() as usize;
    for l in 0..(BM * TN * LN / VEC).div_ceil(THREADS) {
        let q = tid + l * THREADS;
        if q < groups {
            let (r, col) = (q / per_row, (q % per_row) * VEC);
            // SAFETY: r < BM, col + 4 <= bn < ldp; partial w at w * BM * ldp.
            let sum = unsafe {
                let src = smem.add(r * ldp + col);
                let mut s = load4(src);
                for w in 1..WARPS {
                    s = add4(s, load4(src.add(w * BM * ldp)));
                }
                s
            };
            // SAFETY: bounds checked inside.
            unsafe { store4_epilogue(p, sum, m0 + r, n0 + col) };
        }
    }
}

/// Bias, optional GELU and the store of 4 consecutive results of a row: a
/// 16-byte store when the vector is in range and aligned, else guarded
/// scalar stores.
///
/// # Safety
/// `p.out` holds `n * oc` floats, `p.bias` `oc` floats or is null.
#[inline(always)]
unsafe fn store4_epilogue(p: &MatmulParams, vals: [f32; VEC], row: usize, col0: usize) {
    let (n, oc) = (p.n as usize, p.oc as usize);
    if row >= n {
        return;
    }
    let mut o = [0.0f32; VEC];
    for j in 0..VEC {
        let col = col0 + j;
        if col < oc {
            // SAFETY: col < oc, and a non-null bias holds oc floats.
            let v = if p.bias.is_null() {
                vals[j]
            } else {
                vals[j] + unsafe { *p.bias.add(col) }
            };
            o[j] = if p.gelu != 0 { gelu(v) } else { v };
        }
    }
    // SAFETY: row < n; only columns < oc are written.
    unsafe {
        let dst = p.out.add(row * oc + col0);
        if oc % VEC == 0 && col0 + VEC <= oc && aligned16(dst) {
            store4(dst, o);
        } else {
            for (j, v) in o.iter().enumerate() {
                if col0 + j < oc {
                    *dst.add(j) = *v;
                }
            }
        }
    }
}

macro_rules! small_kernel {
    ($name:ident, $tn:expr, $index:expr) => {
        /// Small-M matmul (see the module docs), tile
        #[doc = concat!("`64 x ", stringify!($tn), " * 4`.")]
        ///
        /// Launch: grid `(ceil(oc / BN), ceil(n / MATMUL_SMALL_TILE_M))`,
        /// `MATMUL_SMALL_BLOCK` threads, `matmul_small_shared_bytes(BN)`
        /// bytes of dynamic shared memory (`BN` the tile width).
        ///
        /// # Safety
        /// Buffers as documented on [`MatmulParams`]; launch as above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: MatmulParams) {
            const { assert!(MATMUL_SMALL_TILE_NS[$index] as usize == $tn * LN) };
            // SAFETY: forwarded contract.
            unsafe { small::<$tn>(&p) }
        }
    };
}

small_kernel!(matmul_forward_small_n32, 8, 0);
small_kernel!(matmul_forward_small_n24, 6, 1);
small_kernel!(matmul_forward_small_n16, 4, 2);
small_kernel!(matmul_forward_small_n8, 2, 3);
