//! TF32 matmul on Hopper's warpgroup tensor cores (sm_90a):
//! `out[N,OC] = inp[N,C] · W[OC,C]ᵀ (+ bias) (GELU)`, the same contract as
//! `ops::matmul_tf32` (whose `mma.sync` kernels run on any GPU).
//!
//! Why a second kernel: `mma.sync` is issued per warp and reads its operands
//! from registers, so every k-step costs shared-memory loads, a barrier per
//! stage and registers for fragments; on Hopper it reaches a fraction of the
//! tensor cores' rate (see docs/performance.md). `wgmma.mma_async` is issued
//! per warpgroup (4 warps), reads both operands straight from shared memory
//! through descriptors, and runs asynchronously, so the tensor cores work on
//! one stage while the threads wait for, round and publish the next.
//!
//! Structure (block tile `BM x BN`, `BM / 64` warpgroups each `64 x BN`,
//! `BK = 32` deep):
//! - Both operands are K-major (rows of `inp` and of `W`), the only layout
//!   `wgmma` accepts for TF32. A stage holds `BM + BN` rows of 32 floats =
//!   128 bytes each, stored with the 128-byte swizzle (16-byte chunk `c` of
//!   row `r` at position `c ^ (r % 8)`), filled by 16-byte `cp.async` copies
//!   (zero-filled outside the matrices).
//! - When a stage has landed, each thread rounds its own chunks to TF32 in
//!   place (`cvt.rna`, as the `mma.sync` kernels do: `wgmma` would otherwise
//!   truncate), then `fence.proxy.async` hands them to the tensor cores'
//!   proxy and a barrier publishes the stage.
//! - Pipeline: `STAGES` buffers; one `wgmma` group (4 steps of k = 8) in
//!   flight while the next stage is published. After the barrier of tile
//!   `kt`, every warpgroup has finished tile `kt - 2`, so its buffer is
//!   refilled with tile `kt + STAGES - 2`.
//! - Epilogue straight from the accumulator registers: bias, GELU, guarded
//!   8-byte stores (a warp writes whole 32-byte sectors).

use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, shared_addr, to_tf32};
use crate::device::shared::dynamic_shared_align16;
use crate::device::wgmma::{
    SWIZZLE_ATOM_ROWS, SWIZZLE_ROW_BYTES, WgmmaAccumulator, descriptor_k_major_sw128, fence_proxy_async_shared,
    swizzle_128b_offset, wgmma_commit_group, wgmma_fence,
};
use crate::device::{block_idx_x, sync_threads, thread_idx_x};
use crate::ops::matmul_tf32::{gelu, grouped_tile};
use crate::params::matmul_tf32::*;

const BK: usize = MATMUL_TF32_BK as usize;
/// Floats per 16-byte chunk (one `cp.async`).
const CHUNK: usize = 4;
/// Chunks per staged row (one 128-byte swizzle row).
const CHUNKS_PER_ROW: usize = BK / CHUNK;
/// k depth of one TF32 `wgmma`, and the bytes it advances in a staged row.
const WGMMA_K: usize = 8;
const WGMMA_K_BYTES: u32 = (WGMMA_K * 4) as u32;
const STEPS_PER_STAGE: usize = BK / WGMMA_K;
/// Rows of A per warpgroup, threads per warpgroup.
const WG_ROWS: usize = WGMMA_M as usize;
const WG_THREADS: usize = WARPGROUP_THREADS as usize;
/// Row offset of a warp's second accumulator row (`g + 8`), and the lanes
/// sharing an accumulator row.
const HALF_ROWS: usize = 8;
const LANES_PER_ROW: usize = 4;
/// Columns per accumulator register group (`8i .. 8i + 8`).
const GROUP_COLS: usize = 8;
/// Rows of one warp's accumulator slice.
const WARP_ROWS: usize = 16;
/// Chunks [`round_own_chunks`] loads before it stores any (latency vs registers).
const ROUND_BATCH: usize = 4;

const _: () = assert!(SWIZZLE_ROW_BYTES as usize == BK * 4 && CHUNKS_PER_ROW == 8);
const _: () = assert!(SWIZZLE_ATOM_ROWS as usize == CHUNKS_PER_ROW);

/// Four floats moved as one 16-byte shared-memory access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct F4([f32; CHUNK]);
/// Two floats stored as one 8-byte access.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct F2([f32; 2]);

/// Where this thread's chunks of a stage are. Threads are assigned chunks
/// `tid + i * THREADS`; because `THREADS` is a multiple of 8 and of 64, the
/// chunk column `tid % 8` and the swizzle row phase `(tid / 8) % 8` are the
/// same for all of a thread's chunks, and its rows are `tid / 8 + i * ROW_STEP`.
#[derive(Clone, Copy)]
struct ChunkMap {
    /// First row of this thread (`tid / 8`).
    row: usize,
    /// Rows between this thread's consecutive chunks (`THREADS / 8`).
    row_step: usize,
    /// The chunk's column in the unswizzled row, in floats.
    col: usize,
    /// Byte offset of the swizzled chunk within its row.
    swizzled_col_bytes: usize,
}

impl ChunkMap {
    #[inline(always)]
    fn new<const THREADS: usize>(tid: usize) -> ChunkMap {
        let row = tid / CHUNKS_PER_ROW;
        let chunk = (tid % CHUNKS_PER_ROW) as u32;
        let swizzled = swizzle_128b_offset(row as u32, chunk) - row as u32 * SWIZZLE_ROW_BYTES;
        ChunkMap {
            row,
            row_step: THREADS / CHUNKS_PER_ROW,
            col: chunk as usize * CHUNK,
            swizzled_col_bytes: swizzled as usize,
        }
    }

    /// Byte offset in the stage of this thread's chunk `i` (its row is
    /// `row + i * row_step`, whose `% 8` equals `row % 8`).
    #[inline(always)]
    fn stage_offset(&self, i: usize) -> usize {
        (self.row + i * self.row_step) * SWIZZLE_ROW_BYTES as usize + self.swizzled_col_bytes
    }
}

/// Copy this thread's chunks of k-tile `kt` into `stage`: rows `0..BM` of
/// the stage are `inp` rows `m0..`, rows `BM..BM+BN` are `W` rows `n0..`.
///
/// # Safety
/// `stage` is a stage buffer of `(BM + BN) * 128` bytes of shared memory,
/// 1024-byte aligned; `inp` is `n x c`, `w` is `oc x c`, both 16-byte
/// aligned with `c % 4 == 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn load_stage<const BM: usize, const BN: usize, const THREADS: usize>(
    stage: *mut u8,
    map: ChunkMap,
    p: &MatmulTf32Params,
    m0: usize,
    n0: usize,
    kt: usize,
) {
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let k = kt * BK + map.col;
    let k_inside = k < c;
    let rows_per_pass = THREADS / CHUNKS_PER_ROW;
    const { assert!(BM % (THREADS / CHUNKS_PER_ROW) == 0 && BN % (THREADS / CHUNKS_PER_ROW) == 0) };
    for i in 0..(BM + BN) / rows_per_pass {
        let row = map.row + i * rows_per_pass;
        let (src, rows, r) = if row < BM {
            (p.inp, n, m0 + row)
        } else {
            (p.weight, oc, n0 + row - BM)
        };
        let inside = k_inside && r < rows;
        // Outside: copy 0 bytes (zero-fill) from an address that is valid anyway.
        let (from, bytes) = if inside {
            (unsafe { src.add(r * c + k) }, CHUNK as u32 * 4)
        } else {
            (src, 0)
        };
        unsafe { cp_async_16_zfill(stage.add(map.stage_offset(i)).cast(), from, bytes) };
    }
}

/// Round, in place, the chunks of `stage` that this thread copied (their
/// copies have completed): loads `ROUND_BATCH` before storing, so the
/// shared-memory latency is paid once per batch.
///
/// # Safety
/// As for [`load_stage`], after `cp.async.wait_group` covered this stage.
#[inline(always)]
unsafe fn round_own_chunks<const BM: usize, const BN: usize, const THREADS: usize>(stage: *mut u8, map: ChunkMap) {
    let per_thread = (BM + BN) / (THREADS / CHUNKS_PER_ROW);
    let mut first = 0;
    while first < per_thread {
        let mut v = [F4([0.0; CHUNK]); ROUND_BATCH];
        for (j, x) in v.iter_mut().enumerate() {
            if first + j < per_thread {
                *x = unsafe { *stage.add(map.stage_offset(first + j)).cast::<F4>() };
            }
        }
        for (j, x) in v.iter().enumerate() {
            if first + j < per_thread {
                let rounded = F4(x.0.map(|f| f32::from_bits(to_tf32(f))));
                unsafe { *stage.add(map.stage_offset(first + j)).cast::<F4>() = rounded };
            }
        }
        first += ROUND_BATCH;
    }
}

/// Wait until this thread's copies of the oldest outstanding stage have
/// landed: at most `STAGES - 3` newer groups may stay in flight (the
/// prefetch distance is `STAGES - 2` tiles).
#[inline(always)]
fn wait_for_stage<const STAGES: usize>() {
    match STAGES {
        4 => cp_async_wait_group::<1>(),
        5 => cp_async_wait_group::<2>(),
        6 => cp_async_wait_group::<3>(),
        _ => cp_async_wait_group::<0>(),
    }
}

/// The kernel body for one tile shape: `BM / 64` warpgroups, `BN = Acc::N`.
///
/// # Safety
/// Launched with `THREADS = 128 * BM / 64` threads, a 1-D grid of
/// `ceil(n/BM) * ceil(oc/BN)` blocks and `TileShape::shared_bytes()` of
/// dynamic shared memory, on an sm_90a device; the pointers of `p` hold the
/// sizes its fields say, `inp`/`weight`/`out` 16-byte aligned, `c % 4 == 0`.
#[inline(always)]
unsafe fn matmul_tf32_wgmma_body<
    Acc: WgmmaAccumulator,
    const BM: usize,
    const BN: usize,
    const STAGES: usize,
    const THREADS: usize,
    const ROUND: bool,
>(
    p: MatmulTf32Params,
) {
    let bn = BN;
    const {
        assert!(Acc::N == BN);
        assert!(BM % WG_ROWS == 0 && THREADS == BM / WG_ROWS * WG_THREADS);
        assert!(STAGES >= 3 && STAGES <= 6);
    };
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);
    let (tile_m, tile_n) = grouped_tile(block_idx_x() as usize, n.div_ceil(BM), oc.div_ceil(bn));
    let (m0, n0) = (tile_m * BM, tile_n * bn);

    let tid = thread_idx_x() as usize;
    let warpgroup = tid / WG_THREADS;
    let map = ChunkMap::new::<THREADS>(tid);

    // SAFETY (whole body): the launch provides `shared_bytes()` of dynamic
    // shared memory: `STAGES` stages plus `WGMMA_SMEM_ALIGN` bytes of slack,
    // used to align the first stage to a swizzle atom.
    let raw: *mut u8 = unsafe { dynamic_shared_align16::<u8>() };
    let raw_addr = unsafe { shared_addr(raw) };
    let skip = (WGMMA_SMEM_ALIGN - raw_addr % WGMMA_SMEM_ALIGN) % WGMMA_SMEM_ALIGN;
    let smem = unsafe { raw.add(skip as usize) };
    let smem_addr = raw_addr + skip;
    let stage_bytes = (BM + bn) * SWIZZLE_ROW_BYTES as usize;
    let stage_ptr = |s: usize| unsafe { smem.add(s * stage_bytes) };

    let ktiles = c.div_ceil(BK);
    let prefetch = STAGES - 2;
    // Prologue: tiles 0..prefetch (always commit, so group counts line up).
    for s in 0..prefetch {
        if s < ktiles {
            unsafe { load_stage::<BM, BN, THREADS>(stage_ptr(s), map, &p, m0, n0, s) };
        }
        cp_async_commit();
    }

    let mut acc = Acc::zeroed();
    for kt in 0..ktiles {
        let stage = kt % STAGES;
        wait_for_stage::<STAGES>();
        if ROUND {
            unsafe { round_own_chunks::<BM, BN, THREADS>(stage_ptr(stage), map) };
        }
        fence_proxy_async_shared();
        // Tile kt is published; every warpgroup has waited for its wgmma
        // group of tile kt - 2, whose buffer the prefetch below refills.
        sync_threads();
        let next = kt + prefetch;
        if next < ktiles {
            unsafe { load_stage::<BM, BN, THREADS>(stage_ptr(next % STAGES), map, &p, m0, n0, next) };
        }
        cp_async_commit();

        let stage_addr = smem_addr + (stage * stage_bytes) as u32;
        let a_addr = stage_addr + (warpgroup * WG_ROWS) as u32 * SWIZZLE_ROW_BYTES;
        let b_addr = stage_addr + BM as u32 * SWIZZLE_ROW_BYTES;
        wgmma_fence();
        for step in 0..STEPS_PER_STAGE {
            let k_bytes = step as u32 * WGMMA_K_BYTES;
            let (a, b) = (
                descriptor_k_major_sw128(a_addr + k_bytes),
                descriptor_k_major_sw128(b_addr + k_bytes),
            );
            // SAFETY: all 128 threads of the warpgroup run this with the same
            // descriptors of the published stage; the stage is refilled only
            // after every warpgroup's wait below has covered this group.
            unsafe { acc.mma_tf32(a, b) };
        }
        wgmma_commit_group();
        acc.wait::<1>();
    }
    acc.wait::<0>();

    // Epilogue from registers (layout in `device::wgmma`).
    let lane = tid % 32;
    let warp_in_group = (tid % WG_THREADS) / 32;
    let (g, t) = (lane / LANES_PER_ROW, lane % LANES_PER_ROW);
    let row0 = m0 + warpgroup * WG_ROWS + warp_in_group * WARP_ROWS + g;
    let col0 = n0 + 2 * t;
    let has_bias = !p.bias.is_null();
    let do_gelu = p.gelu != 0;
    // 8-byte stores need even `oc` (every row then starts 8-byte aligned).
    let pairs_ok = oc % 2 == 0;
    let finish = |v: f32, col: usize| {
        let v = if has_bias { v + unsafe { *p.bias.add(col) } } else { v };
        if do_gelu { gelu(v) } else { v }
    };
    acc.for_each_pair(|pair, [lo, hi]| {
        let pair = pair as usize;
        let row = row0 + HALF_ROWS * (pair % 2);
        let col = col0 + GROUP_COLS * (pair / 2);
        if row >= n || col >= oc {
            return;
        }
        let dst = unsafe { p.out.add(row * oc + col) };
        if pairs_ok {
            unsafe { *dst.cast::<F2>() = F2([finish(lo, col), finish(hi, col + 1)]) };
        } else {
            unsafe { *dst = finish(lo, col) };
            if col + 1 < oc {
                unsafe { *dst.add(1) = finish(hi, col + 1) };
            }
        }
    });
}

/// Exports one kernel per wgmma tile shape, named and sized from its `TileShape`.
macro_rules! matmul_tf32_wgmma_kernel {
    ($fn_name:ident, $shape:expr) => {
        /// # Safety
        /// As for `matmul_tf32_wgmma_body`, with this kernel's tile shape.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fn_name(p: MatmulTf32Params) {
            const S: TileShape = $shape;
            const { assert!(matches!(S.engine, TileEngine::Wgmma)) };
            unsafe {
                matmul_tf32_wgmma_body::<
                    [f32; { S.bn as usize / 2 }],
                    { S.bm as usize },
                    { S.bn as usize },
                    { S.stages as usize },
                    { S.threads() as usize },
                    { S.rounds },
                >(p)
            }
        }
    };
}

matmul_tf32_wgmma_kernel!(matmul_forward_tf32_wgmma_128x256, MATMUL_TF32_WGMMA_128X256);
matmul_tf32_wgmma_kernel!(matmul_forward_tf32_wgmma_128x192, MATMUL_TF32_WGMMA_128X192);
matmul_tf32_wgmma_kernel!(matmul_forward_tf32_wgmma_128x128, MATMUL_TF32_WGMMA_128X128);
matmul_tf32_wgmma_kernel!(matmul_forward_tf32_wgmma_64x128, MATMUL_TF32_WGMMA_64X128);
matmul_tf32_wgmma_kernel!(matmul_forward_tf32_wgmma_64x64, MATMUL_TF32_WGMMA_64X64);
