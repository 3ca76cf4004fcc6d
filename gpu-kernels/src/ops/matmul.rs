//! `out = inp · weightᵀ + bias` (optionally GELU), FP32 on the CUDA cores.

use super::gelu::gelu;
use super::vec4::{VEC, aligned16, load4, store4, sum_parts4};
use crate::device::math::fma;
use crate::device::shared::dynamic_shared_align16;
use crate::device::warp::warp_reduce_sum;
use crate::device::{
    WARP_SIZE, block_dim_x, block_idx_x, block_idx_y, block_idx_z, global_idx_x, lane_id, sync_threads, thread_idx_x,
    thread_idx_y, warp_id,
};
use crate::params::matmul::{
    MATMUL_BLOCK, MATMUL_BLOCK_MID, MATMUL_GEMV_MAX_ROWS, MATMUL_SMEM_PAD, MATMUL_SPLIT_REDUCE_PER_THREAD,
    MATMUL_STAGES, MATMUL_THREAD_M, MATMUL_THREAD_N, MATMUL_TILE_K, MATMUL_TILE_M, MATMUL_TILE_M_MID, MATMUL_TILE_N,
    MatmulParams, MatmulSplitReduceParams,
};

const TN: usize = MATMUL_TILE_N as usize;
const TK: usize = MATMUL_TILE_K as usize;
const RM: usize = MATMUL_THREAD_M as usize;
const RN: usize = MATMUL_THREAD_N as usize;
const PAD: usize = MATMUL_SMEM_PAD as usize;
const STAGES: usize = MATMUL_STAGES as usize;
/// Threads along the tile's columns.
const THREADS_N: usize = TN / RN;
/// 16-byte chunks per k-slice of one row (global loads walk a row's slice
/// in this many consecutive chunks).
const CHUNKS_K: usize = TK / VEC;
/// Most 16-byte chunks one thread loads per operand per k-slice (B of the
/// mid-size tile: 128 rows x 8 deep over 128 threads).
const MAX_LOADS: usize = 2;

// A thread's patch is two 4x4 quadrants per dimension, half a tile apart
// (rows `ty*4..+4` and `BM/2 + ty*4..+4`): each quadrant row is one
// `ld.shared.v4`, and a warp's 16 column-threads read 16 consecutive vectors.
const _: () = assert!(RM == 2 * VEC && RN == 2 * VEC && TK.is_multiple_of(VEC));
const _: () = assert!(MATMUL_BLOCK as usize == (MATMUL_TILE_M as usize / RM) * THREADS_N);
const _: () = assert!(MATMUL_BLOCK_MID as usize == (MATMUL_TILE_M_MID as usize / RM) * THREADS_N);
// Padded rows stay 16-byte aligned (vector reads and writes).
const _: () = assert!(PAD.is_multiple_of(VEC));

/// Bias then the optional GELU: the epilogue shared by every variant.
#[inline(always)]
fn epilogue(p: &MatmulParams, acc: f32, col: usize) -> f32 {
    epilogue_of(p.bias, p.gelu, acc, col)
}

/// [`epilogue`] with its bias (null: none) and GELU flag given directly.
#[inline(always)]
fn epilogue_of(bias: *const f32, gelu_on: u32, acc: f32, col: usize) -> f32 {
    let v = if bias.is_null() {
        acc
    } else {
        // SAFETY: col < oc, and a non-null bias holds oc floats.
        acc + unsafe { *bias.add(col) }
    };
    if gelu_on != 0 { gelu(v) } else { v }
}

/// True when rows of `inp` and `weight` can be read as aligned 16-byte vectors.
#[inline(always)]
fn vec_loads(p: &MatmulParams) -> bool {
    (p.c as usize).is_multiple_of(VEC) && aligned16(p.inp) && aligned16(p.weight)
}

/// Global read of 16-byte chunk `q` of a `rows x TK` slice (rows `r0..`,
/// depth `k0..`) of a row-major `[nrows, c]` matrix, within the depth range
/// that ends at `k_end <= c` (the block's split of `c`). Chunk `q` is row
/// `q / CHUNKS_K`, depth `(q % CHUNKS_K) * 4`: consecutive threads read
/// consecutive 16 bytes of a row. Out-of-range elements are 0, which leaves
/// the dot products unchanged.
///
/// # Safety
/// `src` holds `nrows * c` floats; `k_end <= c`; with `vec`, `c % 4 == 0`,
/// `k_end % 4 == 0`, `k0 % 4 == 0` and `src` is 16-byte aligned.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
unsafe fn fetch(
    src: *const f32,
    q: usize,
    r0: usize,
    nrows: usize,
    k0: usize,
    k_end: usize,
    c: usize,
    vec: bool,
) -> [f32; VEC] {
    let (gr, gk) = (r0 + q / CHUNKS_K, k0 + (q % CHUNKS_K) * VEC);
    let mut v = [0.0f32; VEC];
    if gr < nrows {
        // SAFETY: gr < nrows, k_end <= c; with `vec` gk and k_end are
        // multiples of 4, so gk < k_end means the whole vector is in the
        // range, and the address is 16-byte aligned.
        unsafe {
            let row = src.add(gr * c);
            if vec {
                if gk < k_end {
                    v = load4(row.add(gk));
                }
            } else {
                for (e, x) in v.iter_mut().enumerate() {
                    if gk + e < k_end {
                        *x = *row.add(gk + e);
                    }
                }
            }
        }
    }
    v
}

/// Store chunk `q` (as read by [`fetch`]) transposed into a shared tile
/// `dst[k][row]` with row stride `ld`, so the compute loop reads 4
/// consecutive rows of one k as a vector. A warp writes 16 rows x 2
/// k-halves; the pad makes the halves 16 banks apart: conflict-free.
///
/// # Safety
/// `dst` holds `TK * ld` floats and the chunk's row is `< ld`.
#[inline(always)]
unsafe fn put(dst: *mut f32, ld: usize, q: usize, v: [f32; VEC]) {
    let (r, kq) = (q / CHUNKS_K, (q % CHUNKS_K) * VEC);
    for (e, x) in v.iter().enumerate() {
        // SAFETY: kq + e < TK and r < ld.
        unsafe { *dst.add((kq + e) * ld + r) = *x };
    }
}

/// The tiled matmul for a `BM x TN` block tile with `THREADS` threads.
///
/// Per k-slice of `TK`: the block's `inp` rows and `weight` rows are staged
/// transposed in shared memory (`[TK][BM + PAD]`, `[TK][TN + PAD]`); each
/// thread accumulates its 8x8 patch as outer products of 8 `inp` values and
/// 8 `weight` values (4 `ld.shared.v4`, 64 FFMA per k). Double buffered with
/// a register prefetch: the next slice's global loads are issued before the
/// current slice's math and stored to the other buffer after it, so one
/// barrier per slice suffices (the barrier ending slice t orders both the
/// reads of buffer t%2 before its rewrite at t+1 and the writes of buffer
/// (t+1)%2 before their reads).
///
/// Split-K: block `z` of the grid covers depths `z * k_chunk ..` of `c` and
/// writes its partial tile to `out + z * n * oc` (see
/// [`MatmulParams::k_chunk`]); unsplit launches have one z and `k_chunk >= c`.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`]; `THREADS` threads; grid
/// `(ceil(oc / TN), ceil(n / BM), splits)`; `matmul_shared_bytes(BM)` bytes
/// of dynamic shared memory.
#[inline(always)]
unsafe fn tiled<const BM: usize, const THREADS: usize>(p: &MatmulParams) {
    let lda = BM + PAD;
    let ldb = TN + PAD;
    let a_loads = BM * CHUNKS_K / THREADS;
    let b_loads = TN * CHUNKS_K / THREADS;
    // Every chunk of both tiles is loaded by exactly one thread, in at most
    // MAX_LOADS rounds; the thread grid matches the 8x8 patches.
    const {
        assert!((BM * CHUNKS_K).is_multiple_of(THREADS) && (TN * CHUNKS_K).is_multiple_of(THREADS));
        assert!(BM * CHUNKS_K / THREADS <= MAX_LOADS && TN * CHUNKS_K / THREADS <= MAX_LOADS);
        assert!(THREADS == (BM / RM) * THREADS_N && BM.is_multiple_of(2 * VEC));
    }
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let m0 = block_idx_y() as usize * BM;
    let n0 = block_idx_x() as usize * TN;
    // This block's split of c, and where its (partial) tile goes.
    let split = block_idx_z() as usize;
    let k_begin = (split * p.k_chunk as usize).min(c);
    let k_end = (k_begin + p.k_chunk as usize).min(c);
    let p = &MatmulParams {
        // SAFETY: a split launch's `out` holds splits * n * oc floats.
        out: unsafe { p.out.add(split * n * oc) },
        ..*p
    };
    let tid = thread_idx_x() as usize;
    let (ty, tx) = (tid / THREADS_N, tid % THREADS_N);
    let vec = vec_loads(p);
    // SAFETY: the launch provides STAGES * TK * (lda + ldb) floats.
    let (a_s, b_s) = unsafe {
        let s = dynamic_shared_align16::<f32>();
        (s, s.add(STAGES * TK * lda))
    };
    let mut ra = [[0.0f32; VEC]; MAX_LOADS];
    let mut rb = [[0.0f32; VEC]; MAX_LOADS];
    // Constant trip counts with a monomorphic-constant guard: unrolled, so
    // `ra`/`rb` are indexed by constants and stay in registers.
    macro_rules! fetch_all {
        ($k0:expr) => {
            for l in 0..MAX_LOADS {
                // SAFETY: sources as documented on MatmulParams; vec checked.
                unsafe {
                    if l < a_loads {
                        ra[l] = fetch(p.inp, tid + l * THREADS, m0, n, $k0, k_end, c, vec);
                    }
                    if l < b_loads {
                        rb[l] = fetch(p.weight, tid + l * THREADS, n0, oc, $k0, k_end, c, vec);
                    }
                }
            }
        };
    }
    macro_rules! put_all {
        ($buf:expr) => {
            for l in 0..MAX_LOADS {
                // SAFETY: buffer `$buf < STAGES` of each operand; chunk rows
                // are < BM (resp. TN) because a_loads * THREADS chunks cover
                // exactly the tile.
                unsafe {
                    if l < a_loads {
                        put(a_s.add($buf * TK * lda), lda, tid + l * THREADS, ra[l]);
                    }
                    if l < b_loads {
                        put(b_s.add($buf * TK * ldb), ldb, tid + l * THREADS, rb[l]);
                    }
                }
            }
        };
    }

    let mut acc = [[0.0f32; RN]; RM];
    let tiles = (k_end - k_begin).div_ceil(TK);
    fetch_all!(k_begin);
    put_all!(0);
    sync_threads();
    let mut t = 0;
    while t < tiles {
        let cur = t % STAGES;
        let more = t + 1 < tiles;
        if more {
            fetch_all!(k_begin + (t + 1) * TK);
        }
        // SAFETY: buffer `cur` of each operand; quadrant offsets + 4 <= BM/TN.
        let (a, b) = unsafe { (a_s.add(cur * TK * lda + ty * VEC), b_s.add(cur * TK * ldb + tx * VEC)) };
        // One k of the slice: 4 `ld.shared.v4`, 64 FFMA. Expanded for every
        // k below rather than looped: LLVM leaves a loop over 8 such steps
        // rolled, and ptxas then cannot issue step k+1's shared loads under
        // step k's FFMAs (the load latency is exposed once per step).
        macro_rules! k_step {
            ($k:expr) => {
                // SAFETY: $k < TK rows of the buffer; see above.
                unsafe {
                    let (ka, kb) = (a.add($k * lda), b.add($k * ldb));
                    let (a0, a1) = (load4(ka), load4(ka.add(BM / 2)));
                    let (b0, b1) = (load4(kb), load4(kb.add(TN / 2)));
                    let av = [a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]];
                    let bv = [b0[0], b0[1], b0[2], b0[3], b1[0], b1[1], b1[2], b1[3]];
                    for i in 0..RM {
                        for j in 0..RN {
                            acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                        }
                    }
                }
            };
        }
        const _: () = assert!(TK == 8, "k_step is expanded once per k of the slice");
        k_step!(0);
        k_step!(1);
        k_step!(2);
        k_step!(3);
        k_step!(4);
        k_step!(5);
        k_step!(6);
        k_step!(7);
        if more {
            put_all!((t + 1) % STAGES);
        }
        sync_threads();
        t += 1;
    }

    // Rows ty*4 + {0..3} and BM/2 + ty*4 + {0..3}; columns likewise in two
    // halves. Written out, not looped: LLVM does not unroll a loop over this
    // large epilogue, and a rolled loop indexes `acc` dynamically, which
    // moves it to local memory.
    let (r0, r1) = (m0 + ty * VEC, m0 + BM / 2 + ty * VEC);
    let (c0, c1) = (n0 + tx * VEC, n0 + TN / 2 + tx * VEC);
    // SAFETY: rows and columns are bounds-checked inside.
    unsafe {
        store_row8(p, acc[0], r0, c0, c1);
        store_row8(p, acc[1], r0 + 1, c0, c1);
        store_row8(p, acc[2], r0 + 2, c0, c1);
        store_row8(p, acc[3], r0 + 3, c0, c1);
        store_row8(p, acc[4], r1, c0, c1);
        store_row8(p, acc[5], r1 + 1, c0, c1);
        store_row8(p, acc[6], r1 + 2, c0, c1);
        store_row8(p, acc[7], r1 + 3, c0, c1);
    }
}

/// Tiled matmul, `MATMUL_TILE_M x MATMUL_TILE_N` block tile (see `tiled`).
///
/// Launch: grid `(ceil(oc / TILE_N), ceil(n / TILE_M), splits)`,
/// `MATMUL_BLOCK` threads, `matmul_shared_bytes(MATMUL_TILE_M)` bytes of
/// dynamic shared memory.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`]; launch as above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward(p: MatmulParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: forwarded contract.
    unsafe { tiled::<{ MATMUL_TILE_M as usize }, { MATMUL_BLOCK as usize }>(&p) }
}

/// Tiled matmul, `MATMUL_TILE_M_MID x MATMUL_TILE_N` block tile.
///
/// Launch: grid `(ceil(oc / TILE_N), ceil(n / TILE_M_MID), splits)`,
/// `MATMUL_BLOCK_MID` threads, `matmul_shared_bytes(MATMUL_TILE_M_MID)` bytes
/// of dynamic shared memory.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`]; launch as above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward_mid(p: MatmulParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    // SAFETY: forwarded contract.
    unsafe { tiled::<{ MATMUL_TILE_M_MID as usize }, { MATMUL_BLOCK_MID as usize }>(&p) }
}

/// One thread's row of 8 results: columns `c0..c0+4` and `c1..c1+4`.
///
/// # Safety
/// `p.out` holds `n * oc` floats.
#[inline(always)]
unsafe fn store_row8(p: &MatmulParams, v: [f32; RN], row: usize, c0: usize, c1: usize) {
    // SAFETY: forwarded contract.
    unsafe {
        store_row(p, [v[0], v[1], v[2], v[3]], row, c0);
        store_row(p, [v[4], v[5], v[6], v[7]], row, c1);
    }
}

/// Epilogue of 4 consecutive results of a row: bias, optional GELU, and a
/// 16-byte store when the whole vector is in range and aligned, else guarded
/// scalar stores.
///
/// # Safety
/// `p.out` holds `n * oc` floats.
#[inline(always)]
unsafe fn store_row(p: &MatmulParams, vals: [f32; VEC], row: usize, col0: usize) {
    let (n, oc) = (p.n as usize, p.oc as usize);
    if row >= n {
        return;
    }
    let mut o = [0.0f32; VEC];
    for j in 0..VEC {
        if col0 + j < oc {
            o[j] = epilogue(p, vals[j], col0 + j);
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

/// Split-K second pass: each thread sums the `splits` partials of
/// `MATMUL_SPLIT_REDUCE_PER_THREAD` consecutive outputs in the fixed order
/// s = 0, 1, ... (so results do not depend on scheduling), then applies bias
/// and the optional GELU. 16-byte loads and stores when `oc % 4 == 0` and
/// `out`, `partial` are 16-byte aligned (a group then lies in one row, and
/// every split's slice `s * n * oc` stays aligned), scalar ones otherwise.
///
/// Launch: `ceil(n * oc / PER_THREAD)` threads (any block size), 1-D.
///
/// # Safety
/// Buffers as documented on [`MatmulSplitReduceParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_split_reduce(p: MatmulSplitReduceParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    const PER: usize = MATMUL_SPLIT_REDUCE_PER_THREAD as usize;
    const _: () = assert!(PER == VEC, "a thread's group is one 16-byte vector");
    let (oc, splits) = (p.oc as usize, p.splits as usize);
    let total = p.n as usize * oc;
    let e = global_idx_x() as usize * PER;
    // (oc > 0 also spares the remainders below their divide-by-zero panic.)
    if oc == 0 || e >= total {
        return;
    }
    let col = e % oc;
    if oc % VEC == 0 && aligned16(p.out) && aligned16(p.partial) {
        // SAFETY: e + 4 <= total (oc % 4 == 0 and e % 4 == 0); every split's
        // group is at s * total + e, a multiple of 4 floats from an aligned base.
        unsafe {
            // The bias goes in through the epilogue, after the parts (as `sum_parts4`
            // would add it).
            let acc = sum_parts4(p.partial.add(e), total, splits, core::ptr::null());
            let o = [
                epilogue_of(p.bias, p.gelu, acc[0], col),
                epilogue_of(p.bias, p.gelu, acc[1], col + 1),
                epilogue_of(p.bias, p.gelu, acc[2], col + 2),
                epilogue_of(p.bias, p.gelu, acc[3], col + 3),
            ];
            store4(p.out.add(e), o);
        }
    } else {
        for j in 0..PER {
            let i = e + j;
            if i < total {
                // SAFETY: i < total; split s's element is at s * total + i.
                unsafe {
                    let mut acc = *p.partial.add(i);
                    for s in 1..splits {
                        acc += *p.partial.add(s * total + i);
                    }
                    *p.out.add(i) = epilogue_of(p.bias, p.gelu, acc, i % oc);
                }
            }
        }
    }
}

/// 16-byte weight loads each GEMV lane issues before it uses the first: one
/// in flight per lane leaves HBM latency-bound (the LM head row ran at about
/// half the bandwidth); four cover a GPT-2 row (C/4/32 = 6..13) in 2-4
/// chunks. The loop body is written out for exactly this many.
const GEMV_LOADS_IN_FLIGHT: usize = 4;

/// Few rows (decode): one warp per output column. The warp streams the
/// column's weight row once (16-byte loads) and dots it with every input row
/// (`n <= MATMUL_GEMV_MAX_ROWS`, accumulators in registers; the small input
/// stays in L1/L2). Weight traffic, the cost of decoding, is read once.
///
/// Launch: `ceil(oc / warps_per_block)` blocks of `MATMUL_GEMV_BLOCK` threads.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`]; `n <= MATMUL_GEMV_MAX_ROWS`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward_gemv(p: MatmulParams) {
    // Nothing an earlier kernel wrote is read before this (PDL).
    crate::device::grid_dependency_sync();
    const ROWS: usize = MATMUL_GEMV_MAX_ROWS as usize;
    let col = (block_idx_x() * (block_dim_x() / WARP_SIZE) + warp_id()) as usize;
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    if col >= oc {
        return;
    }
    let lane = lane_id() as usize;
    let lanes = WARP_SIZE as usize;
    let mut acc = [0.0f32; ROWS];
    // SAFETY: col < oc.
    let w = unsafe { p.weight.add(col * c) };
    if vec_loads(&p) {
        let c4 = c / VEC;
        let mut k0 = lane;
        while k0 < c4 {
            // Every weight load of the chunk first, then the products: each
            // lane keeps GEMV_LOADS_IN_FLIGHT 16-byte loads outstanding instead
            // of one, which is what streaming the weights from HBM needs. Each
            // accumulator still sums its k in increasing order. Written out
            // (no array indexed in a loop): LLVM kept such an array in local
            // memory and split its loads.
            let ks = [k0, k0 + lanes, k0 + 2 * lanes, k0 + 3 * lanes];
            let load = |k: usize| {
                if k < c4 {
                    // SAFETY: k < c/4 (checked per load), aligned (checked above).
                    unsafe { load4(w.add(k * VEC)) }
                } else {
                    [0.0; VEC]
                }
            };
            let (w0, w1, w2, w3) = (load(ks[0]), load(ks[1]), load(ks[2]), load(ks[3]));
            let mut dot = |k: usize, wu: [f32; VEC]| {
                if k < c4 {
                    for (r, a) in acc.iter_mut().enumerate() {
                        if r < n {
                            // SAFETY: rows r < n hold c floats; aligned (checked).
                            let x = unsafe { load4(p.inp.add(r * c + k * VEC)) };
                            *a += (x[0] * wu[0] + x[1] * wu[1]) + (x[2] * wu[2] + x[3] * wu[3]);
                        }
                    }
                }
            };
            dot(ks[0], w0);
            dot(ks[1], w1);
            dot(ks[2], w2);
            dot(ks[3], w3);
            k0 += GEMV_LOADS_IN_FLIGHT * lanes;
        }
    } else {
        let mut k = lane;
        while k < c {
            // SAFETY: k < c; rows r < n hold c floats.
            unsafe {
                let wv = *w.add(k);
                for (r, a) in acc.iter_mut().enumerate() {
                    if r < n {
                        *a += *p.inp.add(r * c + k) * wv;
                    }
                }
            }
            k += lanes;
        }
    }
    // Reduce all accumulators (unused ones are 0): a fixed-trip loop that
    // unrolls, keeping `acc` in registers.
    for a in acc.iter_mut() {
        *a = warp_reduce_sum(*a);
    }
    // Lane r writes row r: pick acc[r] by a chain of selects (a tiny loop that
    // unrolls, so `acc` stays in registers).
    let mut mine = 0.0f32;
    for (r, a) in acc.iter().enumerate() {
        if lane == r {
            mine = *a;
        }
    }
    if lane < n {
        // SAFETY: lane < n, col < oc.
        unsafe { *p.out.add(lane * oc + col) = epilogue(&p, mine, col) };
    }
}

/// Baseline: one thread per output element, 2-D blocks
/// (`MATMUL_NAIVE_SIDE` squared), grid `(ceil(oc / side), ceil(n / side))`.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward_naive(p: MatmulParams) {
    let side = block_dim_x();
    let col = (block_idx_x() * side + thread_idx_x()) as usize;
    let row = (block_idx_y() * side + thread_idx_y()) as usize;
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    if row >= n || col >= oc {
        return;
    }
    let mut acc = 0.0f32;
    for k in 0..c {
        // SAFETY: row < n, col < oc, k < c.
        acc += unsafe { *p.inp.add(row * c + k) * *p.weight.add(col * c + k) };
    }
    // SAFETY: row < n, col < oc.
    unsafe { *p.out.add(row * oc + col) = epilogue(&p, acc, col) };
}
