//! TF32 tensor-core matmul: `out[N,OC] = inp[N,C] · W[OC,C]ᵀ (+ bias) (GELU)`.
//!
//! Structure (per block, tile `BM x BN`, `BK = 32` deep):
//! - `STAGES` shared-memory buffers filled by 16-byte `cp.async` copies, so
//!   the loads of tile `k + STAGES - 1` overlap the tensor-core work on tile
//!   `k`; out-of-range rows and columns are zero-filled (`src-size 0`), so any
//!   `N` and `OC` work and every `C` that is a multiple of 4.
//! - Both operands are stored K-contiguous (`inp` rows, `W` rows), which is
//!   exactly the "row" A and "col" B operand of `mma.m16n8k8`; each shared
//!   row is padded by 4 floats so fragment reads are bank-conflict free.
//! - Each warp owns a `WM x WN` sub-tile: `MI = WM/16` by `NI = WN/8` mma
//!   tiles, accumulated in registers in f32.
//! - Epilogue: bias and optional GELU applied in registers, guarded stores.
//!
//! The body is generic over the tile shape; the macro at the bottom exports
//! one kernel per shape in [`crate::params::matmul_tf32::MATMUL_TF32_VARIANTS`].

use crate::device::math::tanh_precise;
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k8_tf32, to_tf32};
use crate::device::shared::dynamic_shared;
use crate::device::{WARP_SIZE, block_idx_x, sync_threads, thread_idx_x};
use crate::params::matmul_tf32::*;

const BK: usize = MATMUL_TF32_BK as usize;
/// Shared-memory row stride in floats (see `MATMUL_TF32_PAD`).
const LDS: usize = BK + MATMUL_TF32_PAD as usize;
/// Floats per 16-byte `cp.async` chunk.
const CHUNK: usize = 4;
const CHUNKS_PER_ROW: usize = BK / CHUNK;
/// Depth of one `mma.m16n8k8` step, and its M and N.
const MMA_K: usize = 8;
const MMA_M: usize = 16;
const MMA_N: usize = 8;
const GROUP_M: usize = MATMUL_TF32_GROUP_M as usize;

/// Asking for the dynamic shared memory as this type makes its base 16-byte
/// aligned, which `cp.async` of 16 bytes needs.
#[repr(C, align(16))]
struct Align16([f32; CHUNK]);
/// Four floats moved as one 16-byte access (`ld/st.v4.f32`).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct F4([f32; CHUNK]);
/// Two floats moved as one 8-byte access.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct F2([f32; 2]);
/// Padding (floats) of the epilogue's staging rows: with a stride of
/// `BN + 8` words, the 8-byte fragment stores of a half-warp (rows g..g+3,
/// columns 2t) cover all 32 banks once.
const EPI_PAD: usize = MATMUL_TF32_EPI_PAD as usize;

/// sqrt(2/pi), of the tanh approximation of GELU (same formula as the FP32 `gelu_forward`).
const GELU_SCALE: f32 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f32 = 0.044_715;

#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + tanh_precise(GELU_SCALE * (x + GELU_CUBIC * x * x * x)))
}

/// Wait until at most `STAGES - 2` copy groups are in flight: then the group
/// of the tile about to be consumed has landed. (A match because `STAGES - 2`
/// cannot be a const argument computed from a generic parameter.)
#[inline(always)]
fn wait_for_oldest_stage<const STAGES: usize>() {
    match STAGES {
        2 => cp_async_wait_group::<0>(),
        3 => cp_async_wait_group::<1>(),
        4 => cp_async_wait_group::<2>(),
        5 => cp_async_wait_group::<3>(),
        _ => cp_async_wait_group::<0>(),
    }
}

/// Copy one `ROWS x BK` slab of a K-contiguous matrix (`rows` rows of `c`
/// floats) starting at row `r0`, column `k0` into shared memory at `dst`,
/// zero-filling what lies outside the matrix.
///
/// # Safety
/// `dst` holds `ROWS * LDS` floats of shared memory; `src` is a device
/// matrix of `rows x c` floats, 16-byte aligned, `c % 4 == 0`.
#[inline(always)]
unsafe fn load_slab<const ROWS: usize, const THREADS: usize>(
    dst: *mut f32,
    src: *const f32,
    r0: usize,
    k0: usize,
    rows: usize,
    c: usize,
    tid: usize,
) {
    const { assert!((ROWS * CHUNKS_PER_ROW) % THREADS == 0) };
    for i in 0..(ROWS * CHUNKS_PER_ROW) / THREADS {
        let chunk = tid + i * THREADS;
        let row = chunk / CHUNKS_PER_ROW;
        let col = (chunk % CHUNKS_PER_ROW) * CHUNK;
        let (gr, gk) = (r0 + row, k0 + col);
        let inside = gr < rows && gk < c;
        // Outside: copy 0 bytes (zero-fill) from an address that is valid anyway.
        let (from, bytes) = if inside {
            (unsafe { src.add(gr * c + gk) }, 16)
        } else {
            (src, 0)
        };
        unsafe { cp_async_16_zfill(dst.add(row * LDS + col), from, bytes) };
    }
}

/// The kernel body for one tile shape. `MI`/`NI` are `WM/16` and `WN/8`
/// (passed explicitly: array lengths cannot be computed from generics).
///
/// # Safety
/// Launched with `THREADS` threads, a 1-D grid of
/// `ceil(n/BM) * ceil(oc/BN)` blocks and `STAGES * (BM+BN) * LDS * 4` bytes
/// of dynamic shared memory; the pointers of `p` hold the sizes its fields
/// say, `inp`/`weight` 16-byte aligned, `c % 4 == 0`.
#[inline(always)]
unsafe fn matmul_tf32_body<
    const BM: usize,
    const BN: usize,
    const WM: usize,
    const WN: usize,
    const STAGES: usize,
    const MI: usize,
    const NI: usize,
    const THREADS: usize,
>(
    p: MatmulTf32Params,
) {
    const {
        assert!(WM == MI * MMA_M && WN == NI * MMA_N);
        assert!(BM % WM == 0 && BN % WN == 0);
        assert!(THREADS == (BM / WM) * (BN / WN) * WARP_SIZE as usize);
        assert!(STAGES >= 2 && STAGES <= 5);
        // The epilogue reuses the pipeline's shared memory for the output tile.
        assert!(BM * (BN + EPI_PAD) <= STAGES * (BM + BN) * LDS);
    };
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);

    // Grouped rasterisation: GROUP_M row panels advance together along N.
    let tiles_m = n.div_ceil(BM);
    let tiles_n = oc.div_ceil(BN);
    let pid = block_idx_x() as usize;
    let per_group = GROUP_M * tiles_n;
    let first_m = (pid / per_group) * GROUP_M;
    let group_rows = (tiles_m - first_m).min(GROUP_M);
    let tile_m = first_m + (pid % per_group) % group_rows;
    let tile_n = (pid % per_group) / group_rows;
    let (m0, n0) = (tile_m * BM, tile_n * BN);

    let tid = thread_idx_x() as usize;
    let warp = tid / WARP_SIZE as usize;
    let lane = tid % WARP_SIZE as usize;
    let (warp_m, warp_n) = (warp % (BM / WM), warp / (BM / WM));
    let (g, t) = (lane / 4, lane % 4);

    // SAFETY (whole body): the launch provides the shared memory and buffer
    // sizes stated in the contract; every global access is bounds-guarded.
    let smem: *mut f32 = unsafe { dynamic_shared::<Align16>() }.cast();
    let stage_floats = (BM + BN) * LDS;
    let load_stage = |stage: usize, kt: usize| unsafe {
        let sa = smem.add(stage * stage_floats);
        let sb = sa.add(BM * LDS);
        load_slab::<BM, THREADS>(sa, p.inp, m0, kt * BK, n, c, tid);
        load_slab::<BN, THREADS>(sb, p.weight, n0, kt * BK, oc, c, tid);
    };

    let ktiles = c.div_ceil(BK);
    // Prologue: fill STAGES-1 stages (always commit, so group counts line up).
    for s in 0..STAGES - 1 {
        if s < ktiles {
            load_stage(s, s);
        }
        cp_async_commit();
    }

    let mut acc = [[[0f32; 4]; NI]; MI];
    let mut read_stage = 0usize;
    let mut write_stage = STAGES - 1;
    for kt in 0..ktiles {
        wait_for_oldest_stage::<STAGES>();
        // Tile kt is visible to all; and every warp is done with the stage
        // consumed last iteration, which the prefetch below overwrites.
        sync_threads();
        if kt + STAGES - 1 < ktiles {
            load_stage(write_stage, kt + STAGES - 1);
        }
        cp_async_commit();

        let sa = unsafe { smem.add(read_stage * stage_floats + warp_m * WM * LDS) };
        let sb = unsafe { smem.add(read_stage * stage_floats + BM * LDS + warp_n * WN * LDS) };
        for kk in 0..BK / MMA_K {
            let mut af = [[0u32; 4]; MI];
            for (mi, a) in af.iter_mut().enumerate() {
                let base = unsafe { sa.add((mi * MMA_M + g) * LDS + kk * MMA_K + t) };
                unsafe {
                    *a = [
                        to_tf32(*base),
                        to_tf32(*base.add(8 * LDS)),
                        to_tf32(*base.add(4)),
                        to_tf32(*base.add(8 * LDS + 4)),
                    ];
                }
            }
            let mut bf = [[0u32; 2]; NI];
            for (ni, b) in bf.iter_mut().enumerate() {
                let base = unsafe { sb.add((ni * MMA_N + g) * LDS + kk * MMA_K + t) };
                unsafe { *b = [to_tf32(*base), to_tf32(*base.add(4))] };
            }
            for mi in 0..MI {
                for ni in 0..NI {
                    acc[mi][ni] = mma_m16n8k8_tf32(af[mi], bf[ni], acc[mi][ni]);
                }
            }
        }
        read_stage = if read_stage + 1 == STAGES { 0 } else { read_stage + 1 };
        write_stage = if write_stage + 1 == STAGES { 0 } else { write_stage + 1 };
    }

    // Epilogue, in two steps so the accumulators are only ever indexed by
    // constants (a run-time index would move all of them to local memory):
    // 1. every warp parks its fragments in shared memory (c0/c1: row g,
    //    columns 2t and 2t+1; c2/c3: the same at row g+8);
    // 2. the block streams the BM x BN tile out row by row, 16 bytes per
    //    thread, adding the bias and applying GELU on the way.
    cp_async_wait_group::<0>();
    sync_threads(); // all warps done reading the pipeline stages
    let ldo = BN + EPI_PAD;
    for (mi, acc_m) in acc.iter().enumerate() {
        for (ni, frag) in acc_m.iter().enumerate() {
            let r = warp_m * WM + mi * MMA_M + g;
            let col = warp_n * WN + ni * MMA_N + 2 * t;
            unsafe {
                *smem.add(r * ldo + col).cast::<F2>() = F2([frag[0], frag[1]]);
                *smem.add((r + 8) * ldo + col).cast::<F2>() = F2([frag[2], frag[3]]);
            }
        }
    }
    sync_threads();

    let has_bias = !p.bias.is_null();
    let do_gelu = p.gelu != 0;
    // 16-byte stores need every output row to start 16-byte aligned.
    let vector_ok = oc % CHUNK == 0;
    let finish = |v: f32, col: usize| {
        let v = if has_bias { v + unsafe { *p.bias.add(col) } } else { v };
        if do_gelu { gelu(v) } else { v }
    };
    let chunks_per_row = BN / CHUNK;
    let mut chunk = tid;
    while chunk < BM * chunks_per_row {
        let r = chunk / chunks_per_row;
        let cl = (chunk % chunks_per_row) * CHUNK;
        let (row, col) = (m0 + r, n0 + cl);
        if row < n && col < oc {
            let v = unsafe { *smem.add(r * ldo + cl).cast::<F4>() }.0;
            let dst = unsafe { p.out.add(row * oc + col) };
            if vector_ok {
                let o = F4([
                    finish(v[0], col),
                    finish(v[1], col + 1),
                    finish(v[2], col + 2),
                    finish(v[3], col + 3),
                ]);
                unsafe { *dst.cast::<F4>() = o };
            } else {
                for (j, &x) in v.iter().enumerate() {
                    if col + j < oc {
                        unsafe { *dst.add(j) = finish(x, col + j) };
                    }
                }
            }
        }
        chunk += THREADS;
    }
}

/// Exports one kernel per tile shape; the name comes from the shape so the
/// host's launch configuration and the kernel are always the same shape.
macro_rules! matmul_tf32_kernel {
    ($fn_name:ident, $shape:expr) => {
        /// # Safety
        /// As for `matmul_tf32_body`, with this kernel's tile shape.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fn_name(p: MatmulTf32Params) {
            const S: TileShape = $shape;
            unsafe {
                matmul_tf32_body::<
                    { S.bm as usize },
                    { S.bn as usize },
                    { S.wm as usize },
                    { S.wn as usize },
                    { S.stages as usize },
                    { (S.wm / 16) as usize },
                    { (S.wn / 8) as usize },
                    { S.threads() as usize },
                >(p)
            }
        }
    };
}

matmul_tf32_kernel!(matmul_forward_tf32_128x128, MATMUL_TF32_128X128);
matmul_tf32_kernel!(matmul_forward_tf32_128x64, MATMUL_TF32_128X64);
matmul_tf32_kernel!(matmul_forward_tf32_64x64, MATMUL_TF32_64X64);
matmul_tf32_kernel!(matmul_forward_tf32_32x64, MATMUL_TF32_32X64);
