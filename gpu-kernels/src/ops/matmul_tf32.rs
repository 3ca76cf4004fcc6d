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
//! - When a stage has landed, each thread rounds the chunks it copied to
//!   TF32 in place (`cvt.rna`, once per element per block) before the
//!   barrier that publishes the stage, so the inner loop has no conversions.
//! - Fragments are read with 16-byte `ld.shared.v4`: lane `t` of a quad owns
//!   words `[8t, 8t+8)` of every row of the 32-deep stage and feeds them to
//!   the mma k-slots `t`/`t+4` of the four 8-deep steps (any k order is
//!   valid as long as A and B agree; see `K_PER_LANE`). Per 16 mma (64x32
//!   warp tile, one 8-deep step) that is 6 vector loads instead of 24
//!   scalar loads and 24 `cvt`.
//! - Each warp owns a `WM x WN` sub-tile: `MI = WM/16` by `NI = WN/8` mma
//!   tiles, accumulated in registers in f32.
//! - Epilogue: bias and optional GELU applied in registers, guarded stores.
//!
//! The body is generic over the tile shape; the macro at the bottom exports
//! one kernel per shape in [`crate::params::matmul_tf32::MATMUL_TF32_VARIANTS`].

use super::gelu::gelu;
use crate::device::Vec2;
use crate::device::Vec4;
use crate::device::bf16::f32_to_bf16;
use crate::device::mma::{
    cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k8_tf32, pack_bf16x2, split_tf32, to_tf32,
};
use crate::device::shared::dynamic_shared;
use crate::device::{UNROLL_MAX, unroll};
use crate::device::{WARP_SIZE, block_idx_x, block_idx_y, grid_dependency_sync, sync_threads, thread_idx_x};
use crate::params::matmul_bf16::{QKV_CACHE_HEAD_SIZE, QkvCacheOut};
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
/// Lanes sharing a fragment row (`t = lane % 4`), and the row offset of the
/// second half of an A fragment (a1/a3 are rows g+8).
const LANES_PER_ROW: usize = 4;
const FRAG_ROW_HALF: usize = MMA_M / 2;
/// k assignment: the mma only needs A's k-slot j and B's k-slot j to be the
/// same k, so instead of "slot t = k t, slot t+4 = k t+4" of each 8-deep
/// step, lane t owns the 8 consecutive words `[8t, 8t+8)` of every row of
/// the 32-deep stage: in mma step `s` (0..4), its slot t is word `8t + 2s`
/// and its slot t+4 is word `8t + 2s + 1`. Over t and s that is every word
/// once, and each lane reads its words with two 16-byte loads per row
/// (bank-conflict free with the 36-word row stride: the 8 lanes of a
/// quarter-warp hit 8 distinct 16-byte bank groups).
const K_PER_LANE: usize = BK / LANES_PER_ROW;
const VECS_PER_LANE: usize = K_PER_LANE / CHUNK;
/// mma steps fed by one 16-byte vector (two words per step: slots t, t+4).
const STEPS_PER_VEC: usize = CHUNK / 2;
const _: () = assert!(K_PER_LANE * LANES_PER_ROW == BK && VECS_PER_LANE * STEPS_PER_VEC * MMA_K == BK);

/// Asking for the dynamic shared memory as this type makes its base 16-byte
/// aligned, which `cp.async` of 16 bytes needs.
#[repr(C, align(16))]
struct Align16([f32; CHUNK]);
/// Padding (floats) of the epilogue's staging rows: with a stride of
/// `BN + 8` words, the 8-byte fragment stores of a half-warp (rows g..g+3,
/// columns 2t) cover all 32 banks once.
const EPI_PAD: usize = MATMUL_TF32_EPI_PAD as usize;

/// The output tile `(row, column)` of block `pid` in a `tiles_m x tiles_n`
/// grid under grouped rasterisation: `GROUP_M` row panels advance together
/// along N, so the blocks of a wave share a few panels of `inp` and a band
/// of `W`, re-read from L2 rather than DRAM.
#[inline(always)]
pub(crate) fn grouped_tile(pid: usize, tiles_m: usize, tiles_n: usize) -> (usize, usize) {
    let per_group = GROUP_M * tiles_n;
    let first_m = (pid / per_group) * GROUP_M;
    let group_rows = (tiles_m - first_m).min(GROUP_M);
    (first_m + (pid % per_group) % group_rows, (pid % per_group) / group_rows)
}

/// Wait until at most `STAGES - 2` copy groups are in flight: then the group
/// of the tile about to be consumed has landed. (A match because `STAGES - 2`
/// cannot be a const argument computed from a generic parameter.)
#[inline(always)]
pub(crate) fn wait_for_oldest_stage<const STAGES: usize>() {
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
    const { assert!((ROWS * CHUNKS_PER_ROW).is_multiple_of(THREADS)) };
    for i in 0..(ROWS * CHUNKS_PER_ROW) / THREADS {
        let chunk = tid + i * THREADS;
        let row = chunk / CHUNKS_PER_ROW;
        let col = (chunk % CHUNKS_PER_ROW) * CHUNK;
        let (gr, gk) = (r0 + row, k0 + col);
        let inside = gr < rows && gk < c;
        // Outside: copy 0 bytes (zero-fill) from an address that is valid anyway.
        let (from, bytes) = if inside {
            // SAFETY: inside: gr < rows and gk < c, so element (gr, gk) is in `src`.
            (unsafe { src.add(gr * c + gk) }, 16)
        } else {
            (src, 0)
        };
        // SAFETY: row < ROWS and col + 4 <= BK <= LDS: 16 bytes inside the caller's slab,
        // aligned (LDS and col are multiples of 4); `from` is readable for `bytes`.
        unsafe { cp_async_16_zfill(dst.add(row * LDS + col), from, bytes) };
    }
}

/// Most 16-byte chunks one thread rounds per stage ([`round_stage`]).
const ROUND_MAX_CHUNKS: usize = UNROLL_MAX * ROUND_BATCH;
/// Chunks [`round_stage`] loads before it stores any: enough loads in flight
/// to cover most of the shared-memory latency, few enough registers (16)
/// not to raise the kernels' register counts (8 raised 64x64's from 119 to
/// 132, i.e. from 4 to 3 blocks per SM).
const ROUND_BATCH: usize = 4;

/// Round to TF32, in place, the chunks of one stage (A rows then B rows,
/// `rows = BM + BN` rows of `LDS` floats, contiguous) that this thread
/// copied with [`load_slab`]: chunks `tid + i * THREADS`, which is the same
/// set for the A and B slabs taken separately because `BM * CHUNKS_PER_ROW`
/// is a multiple of `THREADS`. In batches of `ROUND_BATCH`, all loads are
/// issued before any store (the compiler cannot tell the chunks apart, so a
/// load-round-store loop would serialise on shared-memory latency).
/// Zero-filled chunks stay zero; the padding words are never read.
///
/// # Safety
/// `stage` is a stage's shared memory as filled by this thread's
/// `load_slab` calls, whose copies have completed (`cp.async.wait_group`);
/// `rows * CHUNKS_PER_ROW` is a multiple of `THREADS`, at most
/// `ROUND_MAX_CHUNKS * THREADS`.
#[inline(always)]
unsafe fn round_stage<const THREADS: usize>(stage: *mut f32, rows: usize, tid: usize) {
    let n = rows * CHUNKS_PER_ROW / THREADS;
    let at = |i: usize| {
        let chunk = tid + i * THREADS;
        // SAFETY: chunk < rows * CHUNKS_PER_ROW (callers check `first + j < n`), so the
        // row's chunk lies inside the stage; its offset is a multiple of 4 floats.
        unsafe { stage.add((chunk / CHUNKS_PER_ROW) * LDS + (chunk % CHUNKS_PER_ROW) * CHUNK) }.cast::<Vec4<f32>>()
    };
    unroll!(batch < n.div_ceil(ROUND_BATCH) => {
        let first = batch * ROUND_BATCH;
        let mut v = [Vec4([0.0; CHUNK]); ROUND_BATCH];
        unroll!(j < ROUND_BATCH => {
            if first + j < n {
                // SAFETY: i < n: a chunk of this thread's landed slab, 16-byte aligned (`at`).
                v[j] = unsafe { *at(first + j) };
            }
        });
        unroll!(j < ROUND_BATCH => {
            if first + j < n {
                // SAFETY: the same chunk: this thread's own, nobody reads it before the barrier
                // that follows the caller's rounding.
                unsafe { *at(first + j) = Vec4(v[j].0.map(|x| f32::from_bits(to_tf32(x)))) };
            }
        });
    });
}

/// Four consecutive shared-memory words as TF32 bit patterns, one 16-byte
/// load (`ld.shared.v4`).
///
/// # Safety
/// `p` is 16-byte aligned and points to 4 readable floats.
#[inline(always)]
unsafe fn load_u4(p: *const f32) -> [u32; CHUNK] {
    // SAFETY: the caller gives `p` 16-byte aligned with 4 readable floats, `Vec4`'s
    // size and alignment.
    unsafe { *p.cast::<Vec4<f32>>() }.0.map(f32::to_bits)
}

/// One 16-byte vector of k per fragment row: loads it for the warp's MI A
/// tiles (rows g and g+8) and NI B tiles (row g), at word `k` of each row,
/// and runs the `STEPS_PER_VEC` mma steps it holds (see `K_PER_LANE`).
/// `SPLIT3`: the staged values are f32, each product runs as three TF32
/// ones (`split_tf32`: FP32's accuracy); else they are TF32 already.
///
/// # Safety
/// `sa`/`sb` point to the warp's A and B rows of a staged tile (row stride
/// `LDS`; TF32-rounded unless `SPLIT3`), and `k + CHUNK <= BK`, `k % CHUNK
/// == 0`.
#[inline(always)]
unsafe fn mma_vector<const MI: usize, const NI: usize, const SPLIT3: bool>(
    acc: &mut [[[f32; 4]; NI]; MI],
    sa: *const f32,
    sb: *const f32,
    g: usize,
    k: usize,
) {
    const { assert!(MI <= UNROLL_MAX && NI <= UNROLL_MAX) };
    // a[mi] = (row g, row g+8) of mma tile mi; b[ni] = row g of tile ni.
    let mut a = [[[0u32; CHUNK]; 2]; MI];
    unroll!(mi < MI => {
        // SAFETY: mi * 16 + g < MI * 16: a row of the warp's A rows; k < BK (caller).
        let base = unsafe { sa.add((mi * MMA_M + g) * LDS + k) };
        // SAFETY: `base` and the row 8 below are A rows of the staged tile; k + 4 <= BK
        // and k % 4 == 0 keep the 16-byte load aligned inside the row.
        unsafe { a[mi] = [load_u4(base), load_u4(base.add(FRAG_ROW_HALF * LDS))] };
    });
    let mut b = [[0u32; CHUNK]; NI];
    unroll!(ni < NI => {
        // SAFETY: ni * 8 + g < NI * 8: a B row of the staged tile, k + 4 <= BK, aligned.
        b[ni] = unsafe { load_u4(sb.add((ni * MMA_N + g) * LDS + k)) };
    });
    unroll!(s < STEPS_PER_VEC => {
        // Slot t of this step is word 2s of the vector, slot t+4 word 2s+1.
        let (lo, hi) = (2 * s, 2 * s + 1);
        if SPLIT3 {
            // B's halves once per step, A's per tile; small terms first.
            let mut bb = [[0u32; 2]; NI];
            let mut bs = [[0u32; 2]; NI];
            unroll!(ni < NI => {
                let (b0, b1) = (split_tf32(f32::from_bits(b[ni][lo])), split_tf32(f32::from_bits(b[ni][hi])));
                bb[ni] = [b0.0, b1.0];
                bs[ni] = [b0.1, b1.1];
            });
            unroll!(mi < MI => {
                let [top, bottom] = a[mi];
                let h = [top[lo], bottom[lo], top[hi], bottom[hi]].map(|x| split_tf32(f32::from_bits(x)));
                let (ab, as_) = (h.map(|x| x.0), h.map(|x| x.1));
                unroll!(ni < NI => {
                    let d = mma_m16n8k8_tf32(as_, bb[ni], acc[mi][ni]);
                    let d = mma_m16n8k8_tf32(ab, bs[ni], d);
                    acc[mi][ni] = mma_m16n8k8_tf32(ab, bb[ni], d);
                });
            });
        } else {
            unroll!(mi < MI => {
                let [top, bottom] = a[mi];
                let af = [top[lo], bottom[lo], top[hi], bottom[hi]];
                unroll!(ni < NI => {
                    acc[mi][ni] = mma_m16n8k8_tf32(af, [b[ni][lo], b[ni][hi]], acc[mi][ni]);
                });
            });
        }
    });
}

/// The kernel body for one tile shape. `MI`/`NI` are `WM/16` and `WN/8`
/// (passed explicitly: array lengths cannot be computed from generics).
/// `SPLIT3`: FP32 accuracy as 3xTF32 (see [`mma_vector`]), the stages left
/// unrounded.
///
/// # Safety
/// Launched with `THREADS` threads, a grid of `ceil(n/BM) * ceil(oc/BN)`
/// blocks by the splits (`p.k_tiles_per_split`) and `STAGES * (BM+BN) * LDS
/// * 4` bytes of dynamic shared memory; the pointers of `p` hold the sizes
/// its fields say, `inp`/`weight` 16-byte aligned, `c % 4 == 0`.
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
    const SPLIT3: bool,
>(
    p: MatmulTf32Params,
) {
    const {
        assert!(WM == MI * MMA_M && WN == NI * MMA_N);
        assert!(BM.is_multiple_of(WM) && BN.is_multiple_of(WN));
        assert!(THREADS == (BM / WM) * (BN / WN) * WARP_SIZE as usize);
        assert!(STAGES >= 2 && STAGES <= 5);
        // The epilogue reuses the pipeline's shared memory for the output tile.
        assert!(BM * (BN + EPI_PAD) <= STAGES * (BM + BN) * LDS);
    };
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);

    let (tile_m, tile_n) = grouped_tile(block_idx_x() as usize, n.div_ceil(BM), oc.div_ceil(BN));
    let (m0, n0) = (tile_m * BM, tile_n * BN);
    // Split-K: grid row y sums k-tiles [kt0, kt0 + ktiles) into partial
    // output y of the workspace `out`.
    let all_ktiles = c.div_ceil(BK);
    let (kt0, ktiles, out) = if p.k_tiles_per_split == 0 {
        (0, all_ktiles, p.out)
    } else {
        let y = block_idx_y() as usize;
        let kt0 = (y * p.k_tiles_per_split as usize).min(all_ktiles);
        let end = (kt0 + p.k_tiles_per_split as usize).min(all_ktiles);
        // SAFETY: with splits, `out` holds gridDim.y partial outputs of n * oc.
        (kt0, end - kt0, unsafe { p.out.add(y * n * oc) })
    };

    let tid = thread_idx_x() as usize;
    let warp = tid / WARP_SIZE as usize;
    let lane = tid % WARP_SIZE as usize;
    let (warp_m, warp_n) = (warp % (BM / WM), warp / (BM / WM));
    let (g, t) = (lane / 4, lane % 4);

    // SAFETY: (whole body) the launch provides the shared memory and buffer
    // sizes stated in the contract; every global access is bounds-guarded.
    let smem: *mut f32 = unsafe { dynamic_shared::<Align16>() }.cast();
    let stage_floats = (BM + BN) * LDS;
    // SAFETY: stage < STAGES, both slabs inside the stage ring; `inp`/`weight` are the
    // launch's n x c and oc x c matrices, 16-byte aligned with c % 4 == 0.
    let load_inp = |stage: usize, kt: usize| unsafe {
        let sa = smem.add(stage * stage_floats);
        load_slab::<BM, THREADS>(sa, p.inp, m0, (kt0 + kt) * BK, n, c, tid);
    };
    // SAFETY: as for `load_inp`, the stage's B slab after its BM A rows.
    let load_weight = |stage: usize, kt: usize| unsafe {
        let sb = smem.add(stage * stage_floats + BM * LDS);
        load_slab::<BN, THREADS>(sb, p.weight, n0, (kt0 + kt) * BK, oc, c, tid);
    };

    const {
        assert!((BM * CHUNKS_PER_ROW).is_multiple_of(THREADS));
        assert!((BM + BN) * CHUNKS_PER_ROW <= ROUND_MAX_CHUNKS * THREADS);
    };
    // SAFETY: stage < STAGES; (BM + BN) rows fit the round's chunk bound (the const
    // asserts above), and callers only round landed stages.
    let round_stage = |stage: usize| unsafe { round_stage::<THREADS>(smem.add(stage * stage_floats), BM + BN, tid) };

    // Prologue: fill STAGES-1 stages (always commit, so group counts line up).
    // No kernel writes the weights, so their slabs go out before the PDL
    // wait and overlap the previous kernel's tail; the first group holds
    // them all, which only makes them land earlier than they are needed.
    for s in 0..STAGES - 1 {
        if s < ktiles {
            load_weight(s, s);
        }
    }
    grid_dependency_sync();
    for s in 0..STAGES - 1 {
        if s < ktiles {
            load_inp(s, s);
        }
        cp_async_commit();
    }

    let mut acc = [[[0f32; 4]; NI]; MI];
    let mut read_stage = 0usize;
    let mut write_stage = STAGES - 1;
    for kt in 0..ktiles {
        wait_for_oldest_stage::<STAGES>();
        // This thread's copies of tile kt have landed (visible to it alone):
        // round them to TF32 in place, once, instead of at every fragment
        // read (3xTF32 splits the f32 values as it reads them).
        if !SPLIT3 {
            round_stage(read_stage);
        }
        // Tile kt (rounded) is visible to all; and every warp is done with the
        // stage consumed last iteration, which the prefetch below overwrites.
        sync_threads();

        // SAFETY: warp_m * WM + WM <= BM: the warp's A rows of the read stage.
        let sa = unsafe { smem.add(read_stage * stage_floats + warp_m * WM * LDS) };
        // SAFETY: warp_n * WN + WN <= BN: the warp's B rows, after the stage's BM A rows.
        let sb = unsafe { smem.add(read_stage * stage_floats + BM * LDS + warp_n * WN * LDS) };
        // Each lane reads its own K_PER_LANE consecutive words of a row as
        // 16-byte vectors; vector `h` feeds mma steps 2h and 2h+1 (see
        // `K_PER_LANE`). The data were rounded to TF32 when staged. Written
        // out for both vectors (LLVM leaves a loop over them rolled), so
        // ptxas can overlap the second vector's loads with the first's mma.
        // The prefetch of tile kt + STAGES - 1 is issued between them: the
        // first fragment loads go out right after the barrier, and the copy
        // instructions issue while the tensor cores work.
        const { assert!(VECS_PER_LANE == 2) };
        // SAFETY: `sa`/`sb` are the warp's rows of the read stage, landed, rounded and
        // published by the barrier above; t < 4 lanes per row, so the lane's
        // K_PER_LANE = 2 * CHUNK words stay inside the row, 16-byte aligned.
        unsafe { mma_vector::<MI, NI, SPLIT3>(&mut acc, sa, sb, g, t * K_PER_LANE) };
        if kt + STAGES - 1 < ktiles {
            load_inp(write_stage, kt + STAGES - 1);
            load_weight(write_stage, kt + STAGES - 1);
        }
        cp_async_commit();
        // SAFETY: as above, the lane's second vector (VECS_PER_LANE == 2).
        unsafe { mma_vector::<MI, NI, SPLIT3>(&mut acc, sa, sb, g, t * K_PER_LANE + CHUNK) };
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
    // SAFETY: after the wait and barrier nobody reads the stages; the parked tile
    // (BM rows of BN + EPI_PAD) fits in them (`layout_bytes`).
    unsafe { park_fragments::<MI, NI>(&acc, smem, ldo, warp_m * WM, warp_n * WN, g, t) };
    sync_threads();

    // SAFETY: the barrier above published the parked tile; `out`/`bias` are sized by
    // the launch contract and `store_tile` guards every edge.
    unsafe {
        store_tile(
            smem,
            ldo,
            BM,
            BN,
            tid,
            THREADS,
            (m0, n0),
            TileOut::F32 { out, round_tf32: false },
            p.bias,
            n,
            oc,
            p.gelu != 0,
        )
    };
}

/// Step 1 of the `mma.sync` kernels' epilogue (TF32 and bf16): park a
/// warp's `MI x NI` accumulator fragments of m16n8 mma tiles in the shared
/// tile at `tile` (row stride `ldo` floats), the warp's sub-tile at
/// (`row0`, `col0`); lane (g, t) holds c0/c1 at row g, columns 2t and 2t+1,
/// and c2/c3 at row g + 8. Unrolled, so the accumulators are indexed by
/// constants only (a run-time index would move them all to local memory).
///
/// # Safety
/// `tile` holds `row0 + MI * 16` rows of `ldo` floats in shared memory,
/// 8-byte aligned, `col0 + NI * 8 <= ldo`; no other thread touches this
/// warp's part until the next barrier.
#[inline(always)]
pub(crate) unsafe fn park_fragments<const MI: usize, const NI: usize>(
    acc: &[[[f32; 4]; NI]; MI],
    tile: *mut f32,
    ldo: usize,
    row0: usize,
    col0: usize,
    g: usize,
    t: usize,
) {
    unroll!(mi < MI => {
        unroll!(ni < NI => {
            let frag = acc[mi][ni];
            let r = row0 + mi * MMA_M + g;
            let col = col0 + ni * MMA_N + 2 * t;
            // SAFETY: inside the tile (the caller's contract).
            unsafe {
                *tile.add(r * ldo + col).cast::<Vec2<f32>>() = Vec2([frag[0], frag[1]]);
                *tile.add((r + FRAG_ROW_HALF) * ldo + col).cast::<Vec2<f32>>() = Vec2([frag[2], frag[3]]);
            }
        });
    });
}

/// Where [`store_tile`] writes its results.
#[derive(Clone, Copy)]
pub(crate) enum TileOut {
    /// f32 `[n, oc]`, rounded to TF32 when `round_tf32` (the result feeds
    /// another TF32 matmul).
    F32 { out: *mut f32, round_tf32: bool },
    /// bf16 bits `[n, oc]`, rounded to nearest even (the result feeds a bf16
    /// matmul, which would round it the same way).
    // Only the sm90a module's wgmma kernels write bf16 tiles.
    #[cfg_attr(not(feature = "sm90a"), allow(dead_code))]
    Bf16(*mut u16),
    /// f32 `[n, oc]` (not rounded) of a qkv matmul whose keys and values
    /// also go, rounded to bf16, into the KV caches of `kv`
    /// ([`QkvCacheOut`]).
    #[cfg_attr(not(feature = "sm90a"), allow(dead_code))]
    F32Kv { out: *mut f32, kv: QkvCacheOut },
}

/// Store the four finished values `v` of output row `row`, columns
/// `col..col + 4` (`col` a multiple of 4) of a qkv matmul (`oc = 3C`) into
/// its KV caches where they are keys or values: bf16, rounded to nearest
/// even. u32 index math, the head size a constant: 64-bit divisions here
/// cost the epilogue more than the stores (measured: +5 µs a layer at
/// 1024 rows).
///
/// # Safety
/// `kv` is as [`QkvCacheOut`] says for this launch's `oc` and row count
/// (its `k` not null; every cache index fits u32); `row` is an output row,
/// `col + 4 <= oc`.
#[inline(always)]
pub(crate) unsafe fn store_kv_chunk(kv: &QkvCacheOut, oc: usize, row: usize, col: usize, v: [f32; 4]) {
    const HS: u32 = QKV_CACHE_HEAD_SIZE;
    let (c, row, col) = (oc as u32 / 3, row as u32, col as u32);
    if col < c {
        return; // a query column
    }
    let (plane, within) = if col < 2 * c {
        (kv.k, col - c)
    } else {
        (kv.v, col - 2 * c)
    };
    let (h, d) = (within / HS, within % HS);
    // (`max(1)`: the host guarantees t >= 1; it spares the panic path.)
    let t = kv.t.max(1);
    let seq = row / t;
    let pos = kv.pos0 + (row - seq * t);
    let at = ((seq * (c / HS) + h) * kv.max_t + pos) * HS + d;
    let w = Vec2([pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3])]);
    // SAFETY: the caller's contract: (seq, h, pos) is a cache row of the launch, d + 4 <= HS
    // (d a multiple of 4), so 8 bytes inside the plane, 8-byte aligned.
    unsafe { *plane.add(at as usize).cast::<Vec2<u32>>() = w };
}

/// The epilogue the tensor-core matmuls share: stream a `bm x bn` tile of
/// accumulated sums, parked in shared memory at `tile` (row stride `ldo`
/// floats), to `out[m0.., n0..]` (`n x oc`), adding `bias` (if not null) and
/// applying GELU (if `gelu_on`); threads `tid` of `threads` take 16-byte
/// chunks of the tile in turn, so a warp writes whole rows (one store per
/// chunk when `oc % 4 == 0`).
///
/// # Safety
/// `tile` holds `bm` rows of `ldo >= bn` floats of shared memory, written
/// and published by a barrier; `ldo` and `bn` are multiples of 4; `out`
/// holds `n * oc` elements (16-byte aligned for f32, 8-byte for bf16),
/// `bias` `oc` floats or is null.
#[inline(always)]
// Kept: a device helper inlined into its kernels, whose arguments are
// the caller's registers; a struct for them would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_tile(
    tile: *const f32,
    ldo: usize,
    bm: usize,
    bn: usize,
    tid: usize,
    threads: usize,
    (m0, n0): (usize, usize),
    out: TileOut,
    bias: *const f32,
    n: usize,
    oc: usize,
    gelu_on: bool,
) {
    let has_bias = !bias.is_null();
    // Vector stores need every output row to start aligned.
    let vector_ok = oc.is_multiple_of(CHUNK);
    let finish = |v: f32, col: usize| {
        // SAFETY: callers pass col < oc, and a non-null `bias` holds oc floats.
        let v = if has_bias { v + unsafe { *bias.add(col) } } else { v };
        if gelu_on { gelu(v) } else { v }
    };
    let chunks_per_row = bn / CHUNK;
    let mut chunk = tid;
    while chunk < bm * chunks_per_row {
        let r = chunk / chunks_per_row;
        let cl = (chunk % chunks_per_row) * CHUNK;
        let (row, col) = (m0 + r, n0 + cl);
        if row < n && col < oc {
            // SAFETY: r < bm rows and cl + 4 <= bn <= ldo: inside the parked tile, aligned
            // (ldo and cl multiples of 4), published by the caller's barrier.
            let v = unsafe { *tile.add(r * ldo + cl).cast::<Vec4<f32>>() }.0;
            let at = row * oc + col;
            match out {
                TileOut::F32 { out, round_tf32 } => {
                    let fin = |x: f32, col: usize| {
                        let x = finish(x, col);
                        if round_tf32 { f32::from_bits(to_tf32(x)) } else { x }
                    };
                    // SAFETY: row < n, col < oc: inside `out`'s n * oc elements.
                    let dst = unsafe { out.add(at) };
                    if vector_ok {
                        let o = Vec4([
                            fin(v[0], col),
                            fin(v[1], col + 1),
                            fin(v[2], col + 2),
                            fin(v[3], col + 3),
                        ]);
                        // SAFETY: vector_ok: oc % 4 == 0, col % 4 == 0, so col + 4 <= oc and the 16-byte
                        // store is aligned (out is 16-byte aligned per the contract).
                        unsafe { *dst.cast::<Vec4<f32>>() = o };
                    } else {
                        for (j, &x) in v.iter().enumerate() {
                            if col + j < oc {
                                // SAFETY: col + j < oc: inside the row.
                                unsafe { *dst.add(j) = fin(x, col + j) };
                            }
                        }
                    }
                }
                TileOut::F32Kv { out, kv } => {
                    // The host's contract: oc % 4 == 0 (vector_ok), so whole chunks.
                    let o = [
                        finish(v[0], col),
                        finish(v[1], col + 1),
                        finish(v[2], col + 2),
                        finish(v[3], col + 3),
                    ];
                    // SAFETY: row < n, col + 4 <= oc: inside `out`'s n * oc floats, 16-byte
                    // aligned (oc and col multiples of 4, `out` 16-byte aligned).
                    unsafe { *out.add(at).cast::<Vec4<f32>>() = Vec4(o) };
                    // SAFETY: `kv` is this launch's (the contract), row < n, col + 4 <= oc.
                    unsafe { store_kv_chunk(&kv, oc, row, col, o) };
                }
                TileOut::Bf16(out) => {
                    // SAFETY: row < n, col < oc: inside `out`'s n * oc elements.
                    let dst = unsafe { out.add(at) };
                    if vector_ok {
                        let lo = pack_bf16x2(finish(v[0], col), finish(v[1], col + 1));
                        let hi = pack_bf16x2(finish(v[2], col + 2), finish(v[3], col + 3));
                        // SAFETY: vector_ok: col + 4 <= oc and `dst` is 8-byte aligned (oc % 4 == 0, col
                        // % 4 == 0, out 8-byte aligned), as the `Vec2` store needs.
                        unsafe { *dst.cast::<Vec2<u32>>() = Vec2([lo, hi]) };
                    } else {
                        for (j, &x) in v.iter().enumerate() {
                            if col + j < oc {
                                // SAFETY: col + j < oc: inside the row.
                                unsafe { *dst.add(j) = f32_to_bf16(finish(x, col + j)) };
                            }
                        }
                    }
                }
            }
        }
        chunk += threads;
    }
}

/// Exports one kernel per tile shape; the name comes from the shape so the
/// host's launch configuration and the kernel are always the same shape.
macro_rules! matmul_tf32_kernel {
    ($fn_name:ident, $shape:expr) => {
        matmul_tf32_kernel!($fn_name, $shape, false);
    };
    ($fn_name:ident, $shape:expr, $split3:expr) => {
        /// # Safety
        /// As for `matmul_tf32_body`, with this kernel's tile shape.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fn_name(p: MatmulTf32Params) {
            const S: TileShape = $shape;
            // SAFETY: the host launches this kernel by its `TileShape`, which is
            // `matmul_tf32_body`'s contract for these parameters.
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
                    $split3,
                >(p)
            }
        }
    };
}

matmul_tf32_kernel!(matmul_forward_tf32_128x192, MATMUL_TF32_128X192);
matmul_tf32_kernel!(matmul_forward_tf32_128x128, MATMUL_TF32_128X128);
matmul_tf32_kernel!(matmul_forward_tf32_128x64, MATMUL_TF32_128X64);
matmul_tf32_kernel!(matmul_forward_tf32_64x64, MATMUL_TF32_64X64);
matmul_tf32_kernel!(matmul_forward_tf32_32x64, MATMUL_TF32_32X64);
// FP32 accuracy on the tensor cores (3xTF32).
matmul_tf32_kernel!(matmul_forward_3xtf32_128x64, MATMUL_3XTF32_128X64, true);
matmul_tf32_kernel!(matmul_forward_3xtf32_64x64, MATMUL_3XTF32_64X64, true);
matmul_tf32_kernel!(matmul_forward_3xtf32_32x64, MATMUL_3XTF32_32X64, true);
