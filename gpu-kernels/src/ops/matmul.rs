//! `out = inp · weightᵀ + bias` (optionally GELU), FP32 on the CUDA cores.

use super::gelu::gelu;
use super::vec4::{VEC, aligned16, load4, store4};
use crate::device::shared::dynamic_shared_align16;
use crate::device::warp::warp_reduce_sum;
use crate::device::{
    WARP_SIZE, block_dim_x, block_idx_x, block_idx_y, lane_id, sync_threads, thread_idx_x, thread_idx_y, warp_id,
};
use crate::params::matmul::{
    MATMUL_BLOCK, MATMUL_GEMV_MAX_ROWS, MATMUL_THREAD_M, MATMUL_THREAD_N, MATMUL_TILE_K, MATMUL_TILE_M, MATMUL_TILE_N,
    MatmulParams,
};

const TM: usize = MATMUL_TILE_M as usize;
const TN: usize = MATMUL_TILE_N as usize;
const TK: usize = MATMUL_TILE_K as usize;
const RM: usize = MATMUL_THREAD_M as usize;
const RN: usize = MATMUL_THREAD_N as usize;
const THREADS: usize = MATMUL_BLOCK as usize;
/// Threads along the tile's columns.
const THREADS_N: usize = TN / RN;

// The loaders below move one 16-byte vector per thread per operand per
// k-step, and the compute loop reads 4-wide vectors from shared memory.
const _: () = assert!(TM * TK == THREADS * VEC && TN * TK == THREADS * VEC);
const _: () = assert!(RM == VEC && RN == VEC && TM % 32 == 0 && TN % 32 == 0);

/// Bias then the optional GELU: the epilogue shared by every variant.
#[inline(always)]
fn epilogue(p: &MatmulParams, acc: f32, col: usize) -> f32 {
    // SAFETY: col < oc, and a non-null bias holds oc floats.
    let v = if p.bias.is_null() {
        acc
    } else {
        acc + unsafe { *p.bias.add(col) }
    };
    if p.gelu != 0 { gelu(v) } else { v }
}

/// True when rows of `inp` and `weight` can be read as aligned 16-byte vectors.
#[inline(always)]
fn vec_loads(p: &MatmulParams) -> bool {
    p.c as usize % VEC == 0 && aligned16(p.inp) && aligned16(p.weight)
}

/// Stage a `rows x TK` slice (rows `r0..`, depth `k0..`) of a row-major
/// `[nrows, c]` matrix into shared memory transposed (`dst[k][row]`), so the
/// compute loop reads 4 consecutive rows as one vector. Out-of-range
/// elements become 0, which leaves the dot products unchanged.
///
/// Thread `tid` loads row `tid % rows`, depth `k0 + (tid / rows) * 4 ..+4`:
/// the 32 lanes of a warp then write 32 consecutive floats of one `dst[k]`
/// (no bank conflicts), and each row's 64 bytes are read whole across warps.
#[inline(always)]
unsafe fn stage(dst: *mut f32, src: *const f32, rows: usize, r0: usize, nrows: usize, k0: usize, c: usize, vec: bool) {
    let tid = thread_idx_x() as usize;
    let r = tid % rows;
    let kq = (tid / rows) * VEC;
    let (gr, gk) = (r0 + r, k0 + kq);
    let mut v = [0.0f32; VEC];
    if gr < nrows {
        // SAFETY: gr < nrows; with `vec` c % 4 == 0, so gk < c means the whole
        // vector is in the row, and the pointer is 16-byte aligned.
        unsafe {
            let row = src.add(gr * c);
            if vec {
                if gk < c {
                    v = load4(row.add(gk));
                }
            } else {
                for (e, x) in v.iter_mut().enumerate() {
                    if gk + e < c {
                        *x = *row.add(gk + e);
                    }
                }
            }
        }
    }
    for (e, x) in v.iter().enumerate() {
        // SAFETY: kq + e < TK and r < rows: inside the rows x TK tile.
        unsafe { *dst.add((kq + e) * rows + r) = *x };
    }
}

/// Tiled matmul: a block computes a `TILE_M x TILE_N` tile of `out`; per
/// k-step it stages `TILE_K`-deep slices of `inp` and `weight` in shared
/// memory, and each thread accumulates a `THREAD_M x THREAD_N` patch in
/// registers from 4-wide shared-memory reads. Edges in n, oc and c are
/// handled by zero-filled staging and guarded stores.
///
/// Launch: grid `(ceil(oc / TILE_N), ceil(n / TILE_M))`, `MATMUL_BLOCK`
/// threads, `(TILE_M + TILE_N) * TILE_K * 4` bytes of dynamic shared memory.
///
/// # Safety
/// Buffers as documented on [`MatmulParams`]; launch as above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_forward(p: MatmulParams) {
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let m0 = block_idx_y() as usize * TM;
    let n0 = block_idx_x() as usize * TN;
    let tid = thread_idx_x() as usize;
    let (ty, tx) = (tid / THREADS_N, tid % THREADS_N);
    let vec = vec_loads(&p);
    // SAFETY: the launch provides (TM + TN) * TK floats of shared memory.
    let (a_s, b_s) = unsafe {
        let s = dynamic_shared_align16::<f32>();
        (s, s.add(TM * TK))
    };
    let mut acc = [[0.0f32; RN]; RM];
    let mut k0 = 0;
    while k0 < c {
        // SAFETY: tiles fit the shared allocation; sources as documented.
        unsafe {
            stage(a_s, p.inp, TM, m0, n, k0, c, vec);
            stage(b_s, p.weight, TN, n0, oc, k0, c, vec);
        }
        sync_threads();
        for k in 0..TK {
            // SAFETY: ty*RM + 3 < TM and tx*RN + 3 < TN; 16-byte aligned
            // because TM, TN and RM, RN are multiples of 4.
            let (a, b) = unsafe { (load4(a_s.add(k * TM + ty * RM)), load4(b_s.add(k * TN + tx * RN))) };
            for i in 0..RM {
                for j in 0..RN {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        // The next staging overwrites the tiles others may still be reading.
        sync_threads();
        k0 += TK;
    }
    let col0 = n0 + tx * RN;
    // Written out, not looped: LLVM does not unroll a loop over this large
    // epilogue, and a rolled loop indexes `acc` dynamically, which moves it
    // to local memory.
    const _: () = assert!(RM == 4);
    let row0 = m0 + ty * RM;
    // SAFETY: rows and columns are bounds-checked inside.
    unsafe {
        store_row(&p, acc[0], row0, col0);
        store_row(&p, acc[1], row0 + 1, col0);
        store_row(&p, acc[2], row0 + 2, col0);
        store_row(&p, acc[3], row0 + 3, col0);
    }
}

/// Epilogue of one thread's row of results: bias, optional GELU, and a
/// 16-byte store when the whole vector is in range and aligned, else guarded
/// scalar stores.
///
/// # Safety
/// `p.out` holds `n * oc` floats.
#[inline(always)]
unsafe fn store_row(p: &MatmulParams, vals: [f32; RN], row: usize, col0: usize) {
    let (n, oc) = (p.n as usize, p.oc as usize);
    if row >= n {
        return;
    }
    let mut o = [0.0f32; RN];
    for j in 0..RN {
        if col0 + j < oc {
            o[j] = epilogue(p, vals[j], col0 + j);
        }
    }
    // SAFETY: row < n; only columns < oc are written.
    unsafe {
        let dst = p.out.add(row * oc + col0);
        if RN == VEC && oc % VEC == 0 && col0 + RN <= oc && aligned16(dst) {
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
        let mut k = lane;
        while k < c / VEC {
            // SAFETY: k < c/4, aligned (checked); rows r < n hold c floats.
            unsafe {
                let wv = load4(w.add(k * VEC));
                for (r, a) in acc.iter_mut().enumerate() {
                    if r < n {
                        let x = load4(p.inp.add(r * c + k * VEC));
                        *a += (x[0] * wv[0] + x[1] * wv[1]) + (x[2] * wv[2] + x[3] * wv[3]);
                    }
                }
            }
            k += lanes;
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
