//! TF32 and bf16 matmuls on Hopper's warpgroup tensor cores (sm_90a):
//! `out[N,OC] = inp[N,C] · W[OC,C]ᵀ (+ bias) (GELU)`, the contracts of
//! `ops::matmul_tf32` and `ops::matmul_bf16` (whose `mma.sync` kernels run
//! on any GPU). One body serves both (`WgmmaOperands`): a staged row of
//! k is 128 bytes either way (32 f32 or 64 bf16), and one `wgmma` step reads
//! 32 bytes of it (k = 8 TF32 or 16 bf16), so the layout, descriptors and
//! pipeline are the same; only the instruction and the depth of a stage in
//! elements differ. The bf16 kernels read `inp` as bf16 (rounded once by
//! its producer) and may write bf16 (`TileOut::Bf16`) for a bf16 matmul
//! that reads the result next. The 3xTF32 kernels (`Tf32x3`) give FP32's
//! accuracy: the consumers write each stage's small halves beside it and
//! issue three products per k-step.
//!
//! Why a second kernel: `mma.sync` is issued per warp and reads its operands
//! from registers, so every k-step costs shared-memory loads, a barrier per
//! stage and registers for fragments; on Hopper it reaches about a third of
//! cuBLAS. Here the operands never pass through a thread:
//! - One producer warp (after the consumer warpgroups) has one lane issue,
//!   per k-tile of 32, two TMA copies (an `inp` box of `BM x 32` and a `W`
//!   box of `BN x 32`) into a ring of `STAGES` shared buffers, written with
//!   the 128-byte swizzle `wgmma` reads. Edges are zero-filled by the TMA.
//! - `BM / 64` consumer warpgroups each own a `64 x BN` accumulator in
//!   registers and issue 4 `wgmma.m64nBNk8` per k-tile straight from shared
//!   memory (both operands K-major, the only TF32 layout `wgmma` accepts).
//! - Two `mbarrier`s per stage: `full` completes when the TMA bytes of the
//!   stage have landed (one arrival from the producer plus the transaction
//!   bytes); `empty` completes when every consumer warpgroup has finished
//!   reading it (one arrival per warpgroup after its `wgmma.wait_group`
//!   shows the stage's group done). No block-wide barrier in the loop: the
//!   producer runs up to `STAGES` tiles ahead, one `wgmma` group stays in
//!   flight while the next stage is awaited.
//! - Rounding: `weight` must already hold TF32-rounded values (the engine
//!   rounds its weights once, `convert::round_tf32`); the tensor cores use
//!   the top 19 bits of what they read, so unrounded weights are truncated.
//!   `inp` changes every call, so (unless its producer already rounded it,
//!   `round_inp = 0`) each consumer warpgroup rounds its own 64
//!   rows of a landed stage in place (`cvt.rna`), fences the writes to the
//!   async proxy and syncs its 128 threads before its `wgmma`s: a quarter to
//!   a half of the stage instead of all of it, and no cross-warpgroup
//!   barrier. (Rounding both operands in the kernel cost about a third of
//!   its speed; not rounding at all doubles cuBLAS TF32's error.)
//! - Epilogue: after a consumer barrier (nobody reads the stages any more),
//!   a tile whose rows all lie in the output (with an output map: unsplit;
//!   with KV caches, a block of one tile) is finished in registers and
//!   stored box by box by the copy engine (`TmaEpilogue`), the keys and
//!   values then read back from the staged boxes into the caches. Otherwise each thread parks its
//!   accumulator pairs in shared memory by constant index, then
//!   `matmul_tf32::store_tile` streams the tile out with bias, GELU and
//!   16-byte stores: a compact loop instead of `BN / 2` unrolled store
//!   sequences per thread (which made the 128x256 kernel 16k instructions
//!   long, and slow).

use crate::device::mma::{pack_bf16x2, shared_addr, to_tf32};
use crate::device::shared::{dynamic_shared_align16, st_shared_v2_f32};
use crate::device::tma::{
    BULK_WAIT_PENDING_MAX, MBARRIER_BYTES, bulk_commit_group, bulk_wait_group_read, bulk_wait_group_read_all,
    fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait_parity, tma_load_2d,
    tma_store_2d,
};
use crate::device::wgmma::{
    SWIZZLE_ROW_BYTES, WgmmaAccumulator, descriptor_k_major_sw128, fence_proxy_async_shared, warpgroup_registers,
    wgmma_commit_group, wgmma_fence,
};
use crate::device::{Vec2, Vec4};
use crate::device::{
    WARP_SIZE, block_idx_x, block_idx_y, grid_dependency_sync, grid_dim_x, named_barrier_sync, opaque_u32,
    sync_threads, thread_idx_x, trap,
};
use crate::ops::gelu::gelu;
use crate::ops::matmul_tf32::{TileOut, grouped_tile, store_kv_chunk, store_tile};
use crate::params::matmul_bf16::*;
use crate::params::matmul_tf32::*;

/// Bytes of a staged row one `wgmma` step advances (8 TF32 or 16 bf16).
const WGMMA_K_BYTES: u32 = 32;
const STEPS_PER_STAGE: usize = (SWIZZLE_ROW_BYTES / WGMMA_K_BYTES) as usize;
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

const _: () = assert!(SWIZZLE_ROW_BYTES == MATMUL_TF32_BK * 4 && SWIZZLE_ROW_BYTES == MATMUL_BF16_WGMMA_BK * 2);

/// The operand type of a `wgmma` kernel: what one step issues, and how many
/// elements of k a stage (one 128-byte row) holds.
pub(crate) trait WgmmaOperands {
    /// Elements of k per stage.
    const BK: usize;
    /// 3xTF32: each stage also holds the small halves of its loaded tiles,
    /// written by the consumers ([`split_stage`]), and a k-step is three
    /// products (see [`Tf32x3`]).
    const SPLIT: bool = false;
    /// One 32-byte-deep step of the warpgroup's tile (see
    /// `WgmmaAccumulator::mma_tf32`).
    ///
    /// # Safety
    /// `WgmmaAccumulator::mma_tf32`'s contract, with tiles of this type.
    unsafe fn mma<Acc: WgmmaAccumulator>(acc: &mut Acc, a: u64, b: u64);
}

/// TF32 operands (f32 storage; `weight` pre-rounded, `inp` rounded in the
/// kernel or by its producer).
pub(crate) struct Tf32;
impl WgmmaOperands for Tf32 {
    const BK: usize = MATMUL_TF32_BK as usize;
    #[inline(always)]
    unsafe fn mma<Acc: WgmmaAccumulator>(acc: &mut Acc, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { acc.mma_tf32(a, b) }
    }
}

/// f32 operands at FP32's accuracy (3xTF32). The tensor cores read the
/// loaded f32 tiles as their big halves (they use the top 19 bits:
/// truncation), and the stage's second half holds the small ones,
/// `x - trunc(x)` rounded to TF32; a product is then small·big + big·small
/// + big·big, the dropped small·small under 2^-20 of it.
pub(crate) struct Tf32x3;
impl WgmmaOperands for Tf32x3 {
    const BK: usize = MATMUL_TF32_BK as usize;
    const SPLIT: bool = true;
    #[inline(always)]
    unsafe fn mma<Acc: WgmmaAccumulator>(acc: &mut Acc, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { acc.mma_tf32(a, b) }
    }
}

/// bf16 operands.
pub(crate) struct Bf16;
impl WgmmaOperands for Bf16 {
    const BK: usize = MATMUL_BF16_WGMMA_BK as usize;
    #[inline(always)]
    unsafe fn mma<Acc: WgmmaAccumulator>(acc: &mut Acc, a: u64, b: u64) {
        // SAFETY: forwarded.
        unsafe { acc.mma_bf16(a, b) }
    }
}

/// One launch's GEMM, whichever kernel family's parameters it came from.
#[derive(Clone, Copy)]
struct Gemm {
    inp_map: u64,
    weight_map: u64,
    /// The output's map for TMA stores, 0 for none (see
    /// `MatmulTf32WgmmaParams::out_map`).
    out_map: u64,
    out: TileOut,
    bias: *const f32,
    n: usize,
    c: usize,
    oc: usize,
    gelu: bool,
    /// Round `inp` to TF32 in shared memory (TF32 only).
    round_inp: bool,
    /// Split-K: k-tiles per split, 0 for none.
    k_tiles_per_split: usize,
}

/// Bytes of one 16-byte chunk of a staged row.
const CHUNK_BYTES: usize = 16;
/// Chunks [`round_stage`] loads before it stores any (latency vs registers).
const ROUND_BATCH: usize = 4;
/// Named barrier of all consumer warpgroups (0 is the whole block's), and
/// the first of the per-warpgroup ones (`+ warpgroup`).
const CONSUMER_BARRIER: u32 = 1;
const WARPGROUP_BARRIER_BASE: u32 = 2;
const EPI_PAD: usize = WGMMA_EPI_PAD as usize;

/// Map `f` over this thread's share of `bytes` bytes of a landed stage at
/// `src`, writing the results to the same offsets at `dst` (which may be
/// `src`): 16-byte chunks `tid + i * participants`, loaded `ROUND_BATCH` at
/// a time before any is stored (latency against registers). Elementwise,
/// hence layout-blind: the 128-byte swizzle permutes chunks within rows,
/// and both areas start on a swizzle atom.
///
/// # Safety
/// `src` and `dst` are generic addresses of `bytes` bytes of this block's
/// shared memory, 16-byte aligned: `src` landed, and neither area written
/// (nor `dst` read) by anyone else until the participants' next barrier.
#[inline(always)]
unsafe fn map_stage(
    src: *const u8,
    dst: *mut u8,
    bytes: usize,
    tid: usize,
    participants: usize,
    f: impl Fn(f32) -> f32,
) {
    let chunks = bytes / CHUNK_BYTES;
    let mut first = tid;
    while first < chunks {
        let mut v = [Vec4([0.0; 4]); ROUND_BATCH];
        for (j, x) in v.iter_mut().enumerate() {
            let chunk = first + j * participants;
            if chunk < chunks {
                // SAFETY: chunk < bytes / 16: inside the caller's landed area, 16-byte aligned.
                *x = unsafe { *src.add(chunk * CHUNK_BYTES).cast::<Vec4<f32>>() };
            }
        }
        for (j, x) in v.iter().enumerate() {
            let chunk = first + j * participants;
            if chunk < chunks {
                // SAFETY: the same in-bounds offset of `dst`, which only this thread touches
                // until the participants' barrier (the caller's contract).
                unsafe { *dst.add(chunk * CHUNK_BYTES).cast::<Vec4<f32>>() = Vec4(x.0.map(&f)) };
            }
        }
        first += ROUND_BATCH * participants;
    }
}

/// Round to TF32, in place, this thread's share of `bytes` bytes of a landed
/// stage ([`map_stage`]).
///
/// # Safety
/// `stage` is the generic address of `bytes` bytes of a landed stage that
/// nobody else writes or reads until the participants' next barrier.
#[inline(always)]
unsafe fn round_stage(stage: *mut u8, bytes: usize, tid: usize, consumers: usize) {
    // SAFETY: the caller's contract, with `dst` = `src`.
    unsafe { map_stage(stage, stage, bytes, tid, consumers, |f| f32::from_bits(to_tf32(f))) }
}

/// TF32's truncation of an f32: the bits the tensor cores use.
const TF32_TRUNCATE_MASK: u32 = 0xffff_e000;

/// The small half of `x` for 3xTF32: what the tensor cores' truncation of
/// `x` drops (exact in f32), rounded to TF32.
#[inline(always)]
fn tf32_small_half(x: f32) -> f32 {
    let big = f32::from_bits(x.to_bits() & TF32_TRUNCATE_MASK);
    f32::from_bits(to_tf32(x - big))
}

/// Write the small halves ([`tf32_small_half`]) of this thread's share of
/// `bytes` bytes of a landed stage at `src` to the same offsets at `dst`
/// ([`map_stage`]).
///
/// # Safety
/// [`map_stage`]'s contract.
#[inline(always)]
unsafe fn split_stage(src: *const u8, dst: *mut u8, bytes: usize, tid: usize, participants: usize) {
    // SAFETY: forwarded.
    unsafe { map_stage(src, dst, bytes, tid, participants, tf32_small_half) }
}

/// The kernel body for one tile shape: `BM / 64` consumer warpgroups and a
/// producer warp, `BN = Acc::N`. `CONSUMER_REGS` > 0
/// (`TileShape::consumer_regs`): the producer is a warpgroup, which lowers
/// its registers to `WGMMA_PRODUCER_REGS` before it starts, and the
/// consumers raise theirs to `CONSUMER_REGS` (`setmaxnreg`).
///
/// # Safety
/// Launched on an sm_90a device with `TileShape::threads()` threads, a 1-D
/// grid of `ceil(n/BM) * ceil(oc/BN)` blocks (a persistent tile,
/// `EPI_BOXES > 0`: at most that many blocks, unsplit, with an output map
/// and no KV caches, so rows of 16-byte multiples) by `splits` (see
/// `MatmulTf32WgmmaParams::k_tiles_per_split`) and `TileShape::shared_bytes()`
/// of dynamic shared memory; `p`'s maps, in global memory, describe `inp` `[n, c]` and `weight` `[oc, c]` with boxes of `32 x BM`
/// and `32 x BN` and the 128-byte swizzle, `out` holds `n * oc` floats,
/// 16-byte aligned, `bias` `oc` floats or null.
#[inline(always)]
unsafe fn matmul_wgmma_body<
    Op: WgmmaOperands,
    Acc: WgmmaAccumulator,
    const BM: usize,
    const BN: usize,
    const STAGES: usize,
    const CONSUMERS: usize,
    const EPI_BOXES: usize,
    const CONSUMER_REGS: u32,
>(
    p: Gemm,
) {
    let bk = Op::BK;
    const {
        assert!(CONSUMER_REGS.is_multiple_of(SETMAXNREG_STEP) && CONSUMER_REGS <= SETMAXNREG_MAX);
        assert!(Acc::N == BN);
        assert!(BM.is_multiple_of(WG_ROWS) && CONSUMERS == BM / WG_ROWS * WG_THREADS);
        // One to three consumer warpgroups (their barrier ids below).
        assert!(BM / WG_ROWS <= 3);
        assert!(2 * STAGES as u32 * MBARRIER_BYTES <= WGMMA_BARRIER_BYTES);
        // The epilogue parks the output tile in the stages' memory (one tile a
        // block; a persistent block stages its boxes in a buffer of its own).
        assert!(EPI_BOXES > 0 || BM * (BN + EPI_PAD) * 4 <= STAGES * (BM + BN) * SWIZZLE_ROW_BYTES as usize);
        // A persistent ring of boxes: at least two (one stored while the next is
        // staged), and its slot waits leave at most BULK_WAIT_PENDING_MAX pending.
        assert!(EPI_BOXES == 0 || (EPI_BOXES >= 2 && EPI_BOXES <= BULK_WAIT_PENDING_MAX as usize + 2));
        // A stage's small halves start on a swizzle atom, as the stage does.
        assert!(((BM + BN) * SWIZZLE_ROW_BYTES as usize).is_multiple_of(WGMMA_SMEM_ALIGN as usize));
    };
    let (n, c, oc) = (p.n, p.c, p.oc);
    let (tiles_m, tiles_n) = (n.div_ceil(BM), oc.div_ceil(BN));
    // A persistent block takes tiles `blockIdx.x + i * gridDim.x`; otherwise
    // the grid has a block a tile, and the loops below run once.
    let persistent = EPI_BOXES > 0;
    let tiles = tiles_m * tiles_n;
    let tile_stride = grid_dim_x() as usize;
    let origin = |t: usize| {
        let (tile_m, tile_n) = grouped_tile(t, tiles_m, tiles_n);
        (tile_m * BM, tile_n * BN)
    };
    // A block of one tile works its origin out first, as before the loop
    // over tiles (later, it cost the TF32 kernels 14 registers).
    let first_origin = origin(block_idx_x() as usize);
    let tid = thread_idx_x() as usize;

    // SAFETY: (whole body) the launch provides `shared_bytes()` of dynamic
    // shared memory: `WGMMA_SMEM_ALIGN` bytes of slack to align the first
    // stage to a swizzle atom, `STAGES` stages, then the barriers.
    let raw = unsafe { dynamic_shared_align16::<u8>() };
    // SAFETY: `raw` is a pointer into this block's shared memory.
    let raw_addr = unsafe { shared_addr(raw) };
    let skip = (WGMMA_SMEM_ALIGN - raw_addr % WGMMA_SMEM_ALIGN) % WGMMA_SMEM_ALIGN;
    let smem = raw_addr + skip;
    // The same memory as a generic pointer, for ordinary loads and stores.
    // SAFETY: skip < WGMMA_SMEM_ALIGN, the slack `shared_bytes()` reserves before the
    // stages.
    let smem_ptr = unsafe { raw.add(skip as usize) };
    let a_bytes = BM as u32 * SWIZZLE_ROW_BYTES;
    // What the TMA loads per stage; 3xTF32 keeps the small halves of those
    // rows right after them (`small`: the offset from a loaded row to its
    // small half).
    let load_bytes = (BM + BN) as u32 * SWIZZLE_ROW_BYTES;
    let small = load_bytes;
    let stage_bytes = if Op::SPLIT { 2 * load_bytes } else { load_bytes };
    let stage = |s: usize| smem + s as u32 * stage_bytes;
    // A persistent tile's epilogue buffer follows the stages: its boxes, then
    // the bias columns (`TileShape::wgmma_epilogue_bytes`).
    let box_bytes = BM * SWIZZLE_ROW_BYTES as usize;
    let epi_bytes = if persistent { EPI_BOXES * box_bytes + BN * 4 } else { 0 };
    let barriers = stage(STAGES) + epi_bytes as u32;
    let full = |s: usize| barriers + s as u32 * MBARRIER_BYTES;
    let empty = |s: usize| barriers + (STAGES + s) as u32 * MBARRIER_BYTES;
    let consumer_groups = (CONSUMERS / WG_THREADS) as u32;

    if tid == 0 {
        for s in 0..STAGES {
            // SAFETY: thread 0 alone initialises the barriers, in the block's shared memory
            // after the stages; the fence and block barrier below come before any use.
            unsafe {
                mbarrier_init(full(s), 1);
                mbarrier_init(empty(s), consumer_groups);
            }
        }
        fence_mbarrier_init();
    }
    sync_threads();
    // The barriers' set-up overlaps the previous kernel's tail (PDL); the
    // maps' matrices are read only after this.
    grid_dependency_sync();

    // Split-K: block row `y` of the grid takes k-tiles `first..last` and
    // writes a partial tile (no bias, no GELU) to slice `y` of `out`.
    let ktiles_all = c.div_ceil(bk);
    let split = block_idx_y() as usize;
    let per_split = if p.k_tiles_per_split == 0 {
        ktiles_all
    } else {
        p.k_tiles_per_split
    };
    let first = (split * per_split).min(ktiles_all);
    let ktiles = (first + per_split).min(ktiles_all) - first;
    let out = match p.out {
        TileOut::F32 { out, round_tf32 } => TileOut::F32 {
            // SAFETY: a split launch's `out` holds splits * n * oc floats (the launch contract).
            out: unsafe { out.add(split * n * oc) },
            round_tf32,
        },
        // No split-K for bf16 or KV-cache output (the host's contract).
        other => other,
    };
    if tid >= CONSUMERS {
        if CONSUMER_REGS > 0 {
            // SAFETY: the producer is a whole warpgroup here (`TileShape::threads`), every
            // thread of which runs this once; its registers go back to the block's pool,
            // from which the consumers take theirs (`TileShape::with_consumer_regs` checked
            // that the pool covers them).
            unsafe { warpgroup_registers::<WGMMA_PRODUCER_REGS, true>() };
        }
        // Producer warp: one lane streams the k-tiles through the ring.
        if tid == CONSUMERS {
            let (inp_map, weight_map) = (p.inp_map, p.weight_map);
            // The ring runs on across a persistent block's tiles: `done`
            // k-tiles were loaded for the earlier ones.
            let mut done = 0usize;
            let mut t = block_idx_x() as usize;
            loop {
                let (m0, n0) = if persistent { origin(t) } else { first_origin };
                for kt in 0..ktiles {
                    let (s, round) = ((done + kt) % STAGES, (done + kt) / STAGES);
                    if round > 0 {
                        // Wait until the consumers released this buffer's previous tile.
                        // SAFETY: `empty(s)` was initialised above (fence and barrier since);
                        // the consumer groups arrive on it once per round, so the phase
                        // completes.
                        unsafe { mbarrier_wait_parity(empty(s), ((round - 1) & 1) as u32) };
                    }
                    let k = ((first + kt) * bk) as i32;
                    // SAFETY: the producer alone arms `full(s)` with the stage's bytes, then
                    // loads into stage `s`, which every consumer released (the wait above);
                    // the maps and boxes are the launch contract's.
                    unsafe {
                        mbarrier_arrive_expect_tx(full(s), load_bytes);
                        tma_load_2d(stage(s), inp_map, k, m0 as i32, full(s));
                        tma_load_2d(stage(s) + a_bytes, weight_map, k, n0 as i32, full(s));
                    }
                }
                done += ktiles;
                if !persistent {
                    break;
                }
                t += tile_stride;
                if t >= tiles {
                    break;
                }
            }
        }
        return;
    }

    // Consumers.
    if CONSUMER_REGS > 0 {
        // SAFETY: every consumer warpgroup runs this once, whole; the producer warpgroup
        // gives back what they take (`TileShape::with_consumer_regs`), so the wait ends.
        unsafe { warpgroup_registers::<CONSUMER_REGS, false>() };
    }
    let warpgroup = tid / WG_THREADS;
    let leader = tid.is_multiple_of(WG_THREADS);
    // The epilogue's memory: a persistent block's own buffer after the
    // stages, else the stages themselves.
    let (epi_smem, epi_ptr) = if persistent {
        // SAFETY: STAGES * stage_bytes is inside the launch's shared memory (the buffer
        // follows the stages, `TileShape::shared_bytes`).
        (stage(STAGES), unsafe { smem_ptr.add(STAGES * stage_bytes as usize) })
    } else {
        (smem, smem_ptr)
    };
    // The ring runs on across a persistent block's tiles, as the producer's:
    // `done` k-tiles were consumed for the earlier ones. (Stage and phase
    // derived from the count: kept as counters of their own, they cost
    // registers beside the accumulators.)
    let mut done = 0u32;
    // The launch's grid has at most `tiles` blocks: the first tile is real.
    let mut tile = block_idx_x();
    loop {
        // (Its origin is worked out after the main loop, which needs none.)
        let mut acc = Acc::zeroed();
        // The last wait sits inside `ktiles > 0`: were it where the zero-tile
        // path (a split with no k-tiles) joins, ptxas would see plain `mov`s
        // define the accumulators inside a wgmma pipeline stage and serialise
        // every wgmma of the kernel (warning C7515; scripts/ptxas-check.sh
        // fails on it).
        if ktiles > 0 {
            for kt in 0..ktiles {
                let i = done as usize + kt;
                let s = i % STAGES;
                // SAFETY: `full(s)` is initialised; the producer armed this phase with its
                // TMA loads, which complete it.
                unsafe { mbarrier_wait_parity(full(s), ((i / STAGES) & 1) as u32) };
                if Op::SPLIT {
                    // Small halves: each warpgroup its own rows of `inp`, all of them the
                    // weight's rows together; then every consumer waits for all of them.
                    let wg_tid = tid % WG_THREADS;
                    let loaded = s * stage_bytes as usize;
                    let own_a = loaded + warpgroup * WG_ROWS * SWIZZLE_ROW_BYTES as usize;
                    let b = loaded + a_bytes as usize;
                    // SAFETY: the stage landed (the `full` wait above) and nobody writes it;
                    // the small halves' rows of stage `s` are free (the ring reuses a stage
                    // only after every consumer released it, and nobody reads them until the
                    // barrier below); each area is in bounds (stage s of `stage_bytes`) and
                    // 16-byte aligned.
                    unsafe {
                        split_stage(
                            smem_ptr.add(own_a),
                            smem_ptr.add(own_a + small as usize),
                            WG_ROWS * SWIZZLE_ROW_BYTES as usize,
                            wg_tid,
                            WG_THREADS,
                        );
                        split_stage(
                            smem_ptr.add(b),
                            smem_ptr.add(b + small as usize),
                            BN * SWIZZLE_ROW_BYTES as usize,
                            tid,
                            CONSUMERS,
                        );
                    }
                    // Generic-proxy writes, read next by the tensor cores.
                    fence_proxy_async_shared();
                    named_barrier_sync(CONSUMER_BARRIER, CONSUMERS as u32);
                } else if p.round_inp {
                    // Round this warpgroup's rows of `inp` (its A operand) in place.
                    // SAFETY: s < STAGES, and this warpgroup's WG_ROWS rows lie inside the
                    // stage's A part (BM rows).
                    let a_rows = unsafe {
                        smem_ptr.add(s * stage_bytes as usize + warpgroup * WG_ROWS * SWIZZLE_ROW_BYTES as usize)
                    };
                    // SAFETY: the stage landed (the `full` wait above); its rows here are this
                    // warpgroup's alone until the named barrier below.
                    unsafe {
                        round_stage(
                            a_rows,
                            WG_ROWS * SWIZZLE_ROW_BYTES as usize,
                            tid % WG_THREADS,
                            WG_THREADS,
                        )
                    };
                    // Generic-proxy writes, read next by the tensor cores.
                    fence_proxy_async_shared();
                    // A constant barrier id per warpgroup (a computed one makes ptxas
                    // reserve all 16).
                    match warpgroup {
                        0 => named_barrier_sync(WARPGROUP_BARRIER_BASE, WG_THREADS as u32),
                        1 => named_barrier_sync(WARPGROUP_BARRIER_BASE + 1, WG_THREADS as u32),
                        _ => named_barrier_sync(WARPGROUP_BARRIER_BASE + 2, WG_THREADS as u32),
                    }
                }
                let a_addr = stage(s) + (warpgroup * WG_ROWS) as u32 * SWIZZLE_ROW_BYTES;
                let b_addr = stage(s) + a_bytes;
                wgmma_fence();
                for step in 0..STEPS_PER_STAGE {
                    let k_bytes = step as u32 * WGMMA_K_BYTES;
                    let (a, b) = (
                        descriptor_k_major_sw128(a_addr + k_bytes),
                        descriptor_k_major_sw128(b_addr + k_bytes),
                    );
                    if Op::SPLIT {
                        let (a_small, b_small) = (
                            descriptor_k_major_sw128(a_addr + small + k_bytes),
                            descriptor_k_major_sw128(b_addr + small + k_bytes),
                        );
                        // The small products first: they are the least significant.
                        // SAFETY: as below; the small halves were written and fenced before
                        // the consumers' barrier above, and live in the same stage.
                        unsafe {
                            Op::mma(&mut acc, a_small, b);
                            Op::mma(&mut acc, a, b_small);
                        }
                    }
                    // SAFETY: the whole warpgroup runs this with the same descriptors
                    // of a landed stage; the stage is refilled only after this
                    // warpgroup releases it below, once this group has completed.
                    unsafe { Op::mma(&mut acc, a, b) };
                }
                wgmma_commit_group();
                // Keep this tile's group in flight; the previous one is done now.
                acc.wait::<1>();
                if kt > 0 && leader {
                    // SAFETY: `empty` barriers are initialised; the leader arrives once per
                    // k-tile for its warpgroup, as the init count (consumer_groups) expects.
                    unsafe { mbarrier_arrive(empty((i - 1) % STAGES)) };
                }
            }
            acc.wait::<0>();
            if persistent && leader {
                // The tile's last stage, for the producer's next tile (a block of one
                // tile never reuses it).
                // SAFETY: as for the arrivals above; every group of the tile is done.
                unsafe { mbarrier_arrive(empty((done as usize + ktiles - 1) % STAGES)) };
            }
        }
        done += ktiles as u32;

        // Epilogue, once every consumer is done with the stages (and every
        // TMA write has landed: each stage's `full` phase was awaited):
        // - whole-row tiles of an unsplit launch with an output map are
        //   finished in registers and stored through the copy engine
        //   ([`TmaEpilogue`]), staged over the stages or, in a persistent
        //   block, in its own buffer, whose previous tile's boxes thread 0
        //   waits out first;
        // - the rest of a persistent launch (its last row of tiles) is staged
        //   the same way and copied out by the threads;
        // - the rest of a block of one tile is parked over the stages (pair
        //   layout in `device::wgmma`) and streamed out by `store_tile`.
        // One pass over the pairs serves every path: two passes (one a path)
        // kept a second copy of the accumulators alive and took every tile
        // past its register budget.
        let (m0, n0) = if persistent {
            origin(tile as usize)
        } else {
            first_origin
        };
        if persistent && tid == 0 {
            bulk_wait_group_read_all();
        }
        // (Also: every consumer is done copying out the previous tile's last boxes.)
        named_barrier_sync(CONSUMER_BARRIER, CONSUMERS as u32);
        let kv = matches!(p.out, TileOut::F32Kv { .. });
        // KV caches only in a block of one tile, whose boxes stay staged to
        // the end (`TmaEpilogue::store_kv_boxes`).
        let tma = p.out_map != 0 && m0 + BM <= n && p.k_tiles_per_split == 0 && !(kv && persistent);
        let epi = TmaEpilogue::<BM, BN, EPI_BOXES>::new(&p, epi_smem, epi_ptr, n0, persistent);
        if tma || persistent {
            // SAFETY: every consumer is past the barrier above (the epilogue's memory is
            // free: nobody reads the stages, and a persistent buffer's previous boxes were
            // read) and runs this (the barrier inside); the memory holds the staged tile
            // and its bias (checked at compile time, or `TileShape::shared_bytes`);
            // `p.bias` is null or holds `oc` floats (the launch contract).
            unsafe { epi.copy_bias::<STAGES, CONSUMERS>(tid) };
        }
        let ldo = BN + EPI_PAD;
        // Worked out here, not before the main loop, where they would hold
        // registers beside the accumulators (hence, in a persistent block's
        // loop, from a thread index LLVM cannot hoist them by).
        let tid = if persistent {
            opaque_u32(tid as u32) as usize
        } else {
            tid
        };
        let lane = tid % WARP_SIZE as usize;
        let warp_in_group = (tid % WG_THREADS) / WARP_SIZE as usize;
        let (g, t4) = (lane / LANES_PER_ROW, lane % LANES_PER_ROW);
        let row0 = warpgroup * WG_ROWS + warp_in_group * WARP_ROWS + g;
        acc.for_each_pair(|pair, v| {
            let pair = pair as usize;
            let row = row0 + HALF_ROWS * (pair % 2);
            let col = GROUP_COLS * (pair / 2) + 2 * t4;
            if tma || persistent {
                // SAFETY: row < BM, col + 2 <= BN (even), row % 8 == g; the bias was copied.
                unsafe { epi.stage_pair(row, col, g, v) };
                // Pairs come in column order: a box is complete after its last
                // column group's pairs, and goes out while the next is staged.
                let pairs_per_box = epi.box_cols() / GROUP_COLS * 2;
                if (pair + 1).is_multiple_of(pairs_per_box) || pair + 1 == BN / GROUP_COLS * 2 {
                    let boxes = BN.div_ceil(epi.box_cols());
                    // SAFETY: every consumer staged box pair / pairs_per_box (the same pairs
                    // in every thread); the map covers rows m0..m0 + BM where `tma`, and
                    // otherwise (a persistent block's partial tile) `out` holds n rows of
                    // oc values, 16-byte rows (the host's contract for an output map).
                    unsafe { epi.store_box::<CONSUMERS>(tid, (m0, n), pair / pairs_per_box, boxes, tma) };
                }
            } else {
                // SAFETY: row < BM and col + 2 <= BN < ldo: inside the tile parked over the
                // stages (all consumers are past the barrier above); col is even, so the
                // 8-byte store is aligned. (The store's asm keeps the pair two registers,
                // as the TMA path uses it: see `st_shared_v2_f32`.)
                unsafe { st_shared_v2_f32(smem + ((row * ldo + col) * 4) as u32, v) };
            }
        });
        if tma && kv && !persistent {
            // SAFETY: every box was staged and published (the last box's barrier in
            // `store_box`), in a block of one tile (`EPI_BOXES == 0`: box j at slot j,
            // nothing restaged); the rows m0..m0 + BM lie below n (`tma`); the caches
            // are this launch's (the contract).
            unsafe { epi.store_kv_boxes::<CONSUMERS>(tid, m0) };
        }
        if !tma && !persistent {
            named_barrier_sync(CONSUMER_BARRIER, CONSUMERS as u32);
            // SAFETY: every consumer's fragments are parked (the named barrier above); `out`
            // and `bias` are sized by the launch contract and store_tile guards edges.
            unsafe {
                store_tile(
                    smem_ptr.cast::<f32>(),
                    ldo,
                    BM,
                    BN,
                    tid,
                    CONSUMERS,
                    (m0, n0),
                    out,
                    p.bias,
                    n,
                    oc,
                    p.gelu,
                )
            };
        }
        if !persistent {
            break;
        }
        tile += tile_stride as u32;
        if tile as usize >= tiles {
            break;
        }
    }
    if tid == 0 {
        // The block's shared memory must outlive the copies' reads.
        bulk_wait_group_read_all();
    }
}

/// The epilogue through the copy engine, for a `BM x BN` tile whose rows all
/// lie inside the output: each consumer finishes its accumulator pairs in
/// registers (bias, GELU, TF32 rounding, bf16 packing) and writes them to
/// the stages' memory as the output map's boxes (128 bytes of a row by `BM`
/// rows each, 128-byte swizzle, box `j` holding the columns from `j * 128 /
/// size`). The pairs come in column order, so each box is complete after
/// its columns' pairs: a consumer barrier, and one thread starts its store
/// (`tma_store_2d`) while the next box is staged; that thread waits until
/// every box has been read before the block ends. (Storing all boxes after
/// the last pair left the block waiting for the reads of the whole tile:
/// slower than the element-wise store for f32 tiles.)
///
/// Against [`store_tile`]'s loop of 4-value chunks (index math, edge
/// checks and a load and a store each, about 40 instructions) this is a few
/// instructions a pair and no second pass, and the copy engine clips the
/// columns past `oc`. The swizzle also keeps the pairs' shared stores free
/// of bank conflicts: a warp's eight rows put their 16-byte chunk `q` at `q
/// ^ row % 8`.
///
/// `EPI_BOXES`: 0 for a block of one tile, staged over the stages, box `j`
/// at offset `j` and the bias past the last box. A persistent block stages
/// in its own buffer of `EPI_BOXES` boxes (box `j` in slot `j %
/// EPI_BOXES`, thread 0 waiting out a slot's previous store before it is
/// reused), the bias after them; its partial tiles are staged the same way
/// and copied out by the threads ([`Self::copy_box_rows`]), the map
/// spanning rows past the output's.
///
/// A qkv launch (`TileOut::F32Kv`) in a block of one tile stores its f32
/// tile the same way, then every consumer reads the staged boxes of keys
/// and values back into the KV caches ([`Self::store_kv_boxes`]): one loop
/// after the last box, not one a box, as the per-box copy, inlined at each
/// box of the unrolled pairs, made every persistent tile 3-9 % slower
/// (measured on an H200), KV caches or not.
#[derive(Clone, Copy)]
struct TmaEpilogue<const BM: usize, const BN: usize, const EPI_BOXES: usize> {
    /// The epilogue's memory (generic address, 1024-byte aligned).
    smem_ptr: *mut u8,
    /// The same as a shared-window address.
    smem: u32,
    /// The tile's bias columns, copied past the staged tile (null: no bias).
    tile_bias: *mut f32,
    bias: *const f32,
    out_map: u64,
    /// The output as bytes (f32 or bf16; null for a KV-cache output), for
    /// partial tiles copied out by the threads.
    out: *mut u8,
    /// The KV caches of a qkv launch (`k` null: none).
    kv: QkvCacheOut,
    n0: usize,
    oc: usize,
    gelu: bool,
    round_tf32: bool,
    bf16: bool,
}

impl<const BM: usize, const BN: usize, const EPI_BOXES: usize> TmaEpilogue<BM, BN, EPI_BOXES> {
    /// Bytes of one box (`BM` rows of 128 bytes).
    const BOX_BYTES: usize = BM * SWIZZLE_ROW_BYTES as usize;

    /// `in_loop`: built inside a persistent block's loop over tiles, where
    /// the offsets computed from the output type and the memory's address
    /// must not be hoisted before the main loop ([`opaque_u32`]).
    #[inline(always)]
    fn new(p: &Gemm, smem: u32, smem_ptr: *mut u8, n0: usize, in_loop: bool) -> Self {
        let (bf16, round_tf32) = match p.out {
            TileOut::Bf16(_) => (true, false),
            TileOut::F32 { round_tf32, .. } => (false, round_tf32),
            TileOut::F32Kv { .. } => (false, false),
        };
        let (smem, bf16) = if in_loop {
            (opaque_u32(smem), opaque_u32(bf16 as u32) != 0)
        } else {
            (smem, bf16)
        };
        let size = if bf16 { 2 } else { 4 };
        Self {
            smem_ptr,
            smem,
            tile_bias: if p.bias.is_null() {
                core::ptr::null_mut()
            } else if EPI_BOXES > 0 {
                smem_ptr.wrapping_add(EPI_BOXES * Self::BOX_BYTES).cast::<f32>()
            } else {
                smem_ptr.wrapping_add(BM * BN * size).cast::<f32>()
            },
            bias: p.bias,
            out_map: p.out_map,
            out: match p.out {
                TileOut::F32 { out, .. } => out.cast::<u8>(),
                TileOut::Bf16(out) => out.cast::<u8>(),
                TileOut::F32Kv { .. } => core::ptr::null_mut(),
            },
            kv: match p.out {
                TileOut::F32Kv { kv, .. } => kv,
                _ => QkvCacheOut::NONE,
            },
            n0,
            oc: p.oc,
            gelu: p.gelu,
            round_tf32,
            bf16,
        }
    }

    /// Bytes of one output value.
    #[inline(always)]
    fn size(&self) -> usize {
        if self.bf16 { 2 } else { 4 }
    }

    /// Copy the tile's bias columns (zero past `oc`) to shared memory past
    /// the staged tile, then a consumer barrier: read from there, a pair's
    /// bias is a short load, where global loads, which ptxas schedules early
    /// to hide their latency, cost registers.
    ///
    /// # Safety
    /// Every consumer calls this after a consumer barrier that freed the
    /// epilogue's memory; that memory (the stages, `STAGES` of the tile's;
    /// or a persistent block's buffer) holds the staged values and `BN`
    /// floats; `bias` is null or holds `oc` floats.
    #[inline(always)]
    unsafe fn copy_bias<const STAGES: usize, const CONSUMERS: usize>(&self, tid: usize) {
        const {
            // The staged tile (at most 4-byte values) and the bias columns fit in the
            // stages (a persistent buffer: `TileShape::wgmma_epilogue_bytes`).
            assert!(EPI_BOXES > 0 || (BM + 1) * BN * 4 <= STAGES * (BM + BN) * SWIZZLE_ROW_BYTES as usize);
        };
        if self.tile_bias.is_null() {
            return;
        }
        let mut col = tid;
        while col < BN {
            let v = if self.n0 + col < self.oc {
                // SAFETY: n0 + col < oc: inside `bias` (the caller's contract).
                unsafe { *self.bias.add(self.n0 + col) }
            } else {
                0.0
            };
            // SAFETY: col < BN: inside the BN floats past the staged tile, which fit in
            // the stages (checked above), free after the caller's barrier.
            unsafe { *self.tile_bias.add(col) = v };
            col += CONSUMERS;
        }
        named_barrier_sync(CONSUMER_BARRIER, CONSUMERS as u32);
    }

    /// Finish the pair `v` of row `row`, columns `col, col + 1`, and write it
    /// to its box.
    ///
    /// # Safety
    /// `row < BM`, `col` even with `col + 2 <= BN`, `g == row % 8`; the bias
    /// was copied ([`Self::copy_bias`]); nobody else writes these bytes.
    #[inline(always)]
    unsafe fn stage_pair(&self, row: usize, col: usize, g: usize, v: [f32; 2]) {
        // SAFETY: forwarded (col + 2 <= BN, the bias copied).
        let x = unsafe { self.finish(col, v) };
        let size = self.size();
        let box_cols = self.box_cols();
        let byte = (col % box_cols) * size;
        // Row `row` of box `col / box_cols`, its 16-byte chunk swizzled by row % 8.
        let at = self.slot(col / box_cols) * Self::BOX_BYTES
            + row * SWIZZLE_ROW_BYTES as usize
            + (((byte / CHUNK_BYTES) ^ g) * CHUNK_BYTES)
            + byte % CHUNK_BYTES;
        // SAFETY: row < BM and col + 2 <= BN: `at` and the pair's bytes lie inside the
        // staged boxes (the caller's contract; a persistent buffer's slot < EPI_BOXES);
        // `at` is a multiple of the pair's size (byte is).
        unsafe {
            if self.bf16 {
                *self.smem_ptr.add(at).cast::<u32>() = pack_bf16x2(x[0], x[1]);
            } else {
                st_shared_v2_f32(self.smem + at as u32, x);
            }
        }
    }

    /// Bias, GELU and TF32 rounding of the pair `v` at tile column `col`.
    ///
    /// # Safety
    /// `col` even with `col + 2 <= BN`; the bias was copied
    /// ([`Self::copy_bias`]).
    #[inline(always)]
    unsafe fn finish(&self, col: usize, v: [f32; 2]) -> [f32; 2] {
        let b = if self.tile_bias.is_null() {
            [0.0; 2]
        } else {
            // SAFETY: col + 2 <= BN: inside the copied columns; col is even and the area
            // 8-byte aligned (a multiple of 8 bytes past a 1024-byte boundary), as the
            // `Vec2` load needs.
            unsafe { (*self.tile_bias.add(col).cast::<Vec2<f32>>()).0 }
        };
        let mut x = [v[0] + b[0], v[1] + b[1]];
        if self.gelu {
            x = x.map(gelu);
        }
        if self.round_tf32 {
            x = x.map(|f| f32::from_bits(to_tf32(f)));
        }
        x
    }

    /// Output columns a box holds.
    #[inline(always)]
    fn box_cols(&self) -> usize {
        WGMMA_OUT_BOX_BYTES as usize / self.size()
    }

    /// Where box `j` is staged, in boxes from the epilogue's memory.
    #[inline(always)]
    fn slot(&self, j: usize) -> usize {
        if EPI_BOXES > 0 { j % EPI_BOXES } else { j }
    }

    /// Publish box `j` of the tile's `boxes` and store it: where `tma`,
    /// thread 0 starts its store through the copy engine, one bulk group a
    /// box (empty past `oc`); otherwise (a persistent block's partial tile,
    /// which the output map could overrun) every consumer copies its share
    /// of the box's rows below `n` out, 16 bytes at a time. In a persistent
    /// block's ring, thread 0 first waits until the slot box `j + 1` reuses
    /// has been read, so the barrier also frees it (a copied box is read by
    /// the time the consumers pass the next box's barrier). Thread 0 waits
    /// for every box's reads before the block ends, and a persistent one
    /// before it stages its next tile (`bulk_wait_group_read_all`).
    ///
    /// # Safety
    /// Every consumer calls this once its pairs of box `j` are staged, with
    /// the same arguments; `(m0, n)`: the tile's first row and the output's
    /// rows. Where `tma`, the output map covers rows `m0 .. m0 + BM`;
    /// otherwise `self.out` holds `n` rows of `oc` values whose rows are
    /// 16-byte multiples, 16-byte aligned. Nothing else in this grid touches
    /// the tile's part of the output; this tile's boxes before `j` went
    /// through here with the same `tma`, and no other bulk group of thread
    /// 0's is pending.
    #[inline(always)]
    unsafe fn store_box<const CONSUMERS: usize>(
        &self,
        tid: usize,
        (m0, n): (usize, usize),
        j: usize,
        boxes: usize,
        tma: bool,
    ) {
        if EPI_BOXES > 0 && tma && tid == 0 && j + 1 >= EPI_BOXES && j + 1 < boxes {
            // Groups pending: boxes 0..j - 1, one each. Box j + 1 reuses box
            // j + 1 - EPI_BOXES's slot: let at most the EPI_BOXES - 2 after it pend.
            bulk_wait_group_read((EPI_BOXES - 2) as u32);
        }
        // Generic-proxy writes, read next by the copy engine.
        fence_proxy_async_shared();
        named_barrier_sync(CONSUMER_BARRIER, CONSUMERS as u32);
        let x0 = self.n0 + j * self.box_cols();
        let at = self.slot(j) * Self::BOX_BYTES;
        if !tma {
            // SAFETY: the box is staged and published (the barrier above); the rest is
            // the caller's contract.
            unsafe { self.copy_box_rows::<CONSUMERS>(tid, at, (m0, n), x0) };
        } else if tid == 0 {
            if x0 < self.oc {
                // SAFETY: box j is staged, fenced and published (the barrier above) at a
                // 1024-byte aligned offset (a box is a multiple of 8 rows of 128 bytes);
                // the map and rows m0..m0 + BM are the caller's contract; nobody writes
                // its slot again before the slot's wait above (a ring) or the block's
                // final wait.
                unsafe { tma_store_2d(self.out_map, x0 as i32, m0 as i32, self.smem + at as u32) };
            }
            bulk_commit_group();
        }
    }

    /// Byte offset, in a staged box, of row `row`'s 16-byte chunk `q` (of its
    /// 128 bytes): swizzled to place `q ^ row % 8`, as the pairs are staged
    /// ([`Self::stage_pair`]) and the copy engine reads them.
    #[inline(always)]
    fn chunk_in_box(row: usize, q: usize) -> usize {
        row * SWIZZLE_ROW_BYTES as usize + ((q ^ (row % 8)) * CHUNK_BYTES)
    }

    /// Store a qkv tile's keys and values into the KV caches from its staged
    /// boxes (f32, `BM` rows of 32 columns each, box `j` at slot `j`): the
    /// boxes whose columns lie in `C..oc` (`C = oc / 3`; a box lies inside
    /// one of q, k and v, as `C` is a multiple of the head size and so of a
    /// box's columns), 16-byte chunks `tid + i * CONSUMERS` of them in turn,
    /// each row's chunk `q` read from its swizzled place `q ^ row % 8`. The
    /// values are the finished ones `store_tile` would store, so the caches
    /// get the same bits (`store_kv_chunk`).
    ///
    /// # Safety
    /// A block of one tile (`EPI_BOXES == 0`) whose every box was staged and
    /// published to every consumer, and is not written again; rows `m0 ..
    /// m0 + BM` are output rows; `self.kv` is this launch's caches (f32
    /// out, `oc = 3C`), whose rows of this tile are this block's alone.
    #[inline(always)]
    unsafe fn store_kv_boxes<const CONSUMERS: usize>(&self, tid: usize, m0: usize) {
        let box_cols = self.box_cols();
        let c = self.oc / 3;
        // The tile's boxes of keys or values: first..last.
        let first = c.saturating_sub(self.n0).div_ceil(box_cols);
        let last = BN.div_ceil(box_cols).min((self.oc - self.n0).div_ceil(box_cols));
        let chunks_per_row = SWIZZLE_ROW_BYTES as usize / CHUNK_BYTES;
        let per_box = BM * chunks_per_row;
        let mut i = first * per_box + tid;
        while i < last * per_box {
            let (j, within) = (i / per_box, i % per_box);
            let (row, q) = (within / chunks_per_row, within % chunks_per_row);
            let col = self.n0 + j * box_cols + q * (CHUNK_BYTES / size_of::<f32>());
            let src = j * Self::BOX_BYTES + Self::chunk_in_box(row, q);
            // SAFETY: `src` is a 16-byte chunk of staged box j (row < BM, q < 8, j <
            // the tile's boxes), 16-byte aligned; the caches are this launch's, m0 +
            // row an output row and col + 4 <= oc (boxes below `last`; oc a multiple
            // of 4, the host's contract for a qkv launch).
            unsafe {
                let v = *self.smem_ptr.add(src).cast::<Vec4<f32>>();
                store_kv_chunk(&self.kv, self.oc, m0 + row, col, v.0);
            }
            i += CONSUMERS;
        }
    }

    /// Copy the rows below `n` of the staged box at byte `at` (output
    /// columns from `x0`, clipped at `oc`) to `self.out`: 16-byte chunks
    /// `tid + i * CONSUMERS`, each row's chunk `q` read from its swizzled
    /// place `q ^ row % 8`.
    ///
    /// # Safety
    /// The box is staged and published to every consumer; `self.out` is
    /// non-null and holds `n` rows of `oc` values, 16-byte aligned rows of
    /// 16-byte multiples, of which this tile's part is this block's alone.
    #[inline(always)]
    unsafe fn copy_box_rows<const CONSUMERS: usize>(&self, tid: usize, at: usize, (m0, n): (usize, usize), x0: usize) {
        if self.out.is_null() {
            // A KV-cache output is never launched persistent (the contract).
            trap();
        }
        let size = self.size();
        let row_bytes = self.oc * size;
        let (first_byte, rows) = (x0 * size, n.saturating_sub(m0).min(BM));
        let chunks_per_row = SWIZZLE_ROW_BYTES as usize / CHUNK_BYTES;
        let mut i = tid;
        while i < rows * chunks_per_row {
            let (row, q) = (i / chunks_per_row, i % chunks_per_row);
            let byte = first_byte + q * CHUNK_BYTES;
            if byte < row_bytes {
                let src = at + Self::chunk_in_box(row, q);
                // SAFETY: `src` is a 16-byte chunk of the staged box (row < BM, q < 8);
                // `byte` + 16 <= row_bytes (both multiples of 16) and m0 + row < n: inside
                // `out`, 16-byte aligned (the caller's contract).
                unsafe {
                    let v = *self.smem_ptr.add(src).cast::<Vec4<u32>>();
                    *self.out.add((m0 + row) * row_bytes + byte).cast::<Vec4<u32>>() = v;
                }
            }
            i += CONSUMERS;
        }
    }
}

/// Exports one kernel per wgmma tile shape, named and sized from its
/// `TileShape`: `$op` the operands, `$params` the parameter struct, `$gemm`
/// how it becomes a [`Gemm`].
macro_rules! matmul_wgmma_kernel {
    ($fn_name:ident, $shape:expr, $op:ty, $params:ty, $gemm:path) => {
        /// # Safety
        /// As for `matmul_wgmma_body`, with this kernel's tile shape.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fn_name(p: $params) {
            const S: TileShape = $shape;
            const { assert!(matches!(S.engine, TileEngine::Wgmma) && S.split_tf32 == <$op as WgmmaOperands>::SPLIT) };
            // SAFETY: the host launches this kernel by its `TileShape` on sm_90a, which is
            // `matmul_wgmma_body`'s contract for these parameters.
            unsafe {
                matmul_wgmma_body::<
                    $op,
                    [f32; { S.bn as usize / 2 }],
                    { S.bm as usize },
                    { S.bn as usize },
                    { S.stages as usize },
                    { (S.bm / WGMMA_M * WARPGROUP_THREADS) as usize },
                    { S.epi_boxes as usize },
                    { S.consumer_regs },
                >($gemm(&p))
            }
        }
    };
}

/// The [`Gemm`] of a TF32 launch.
#[inline(always)]
fn tf32_gemm(p: &MatmulTf32WgmmaParams) -> Gemm {
    Gemm {
        inp_map: p.inp_map as u64,
        weight_map: p.weight_map as u64,
        out_map: p.out_map as u64,
        out: TileOut::F32 {
            out: p.out,
            round_tf32: p.round_out != 0,
        },
        bias: p.bias,
        n: p.n as usize,
        c: p.c as usize,
        oc: p.oc as usize,
        gelu: p.gelu != 0,
        round_inp: p.round_inp != 0,
        k_tiles_per_split: p.k_tiles_per_split as usize,
    }
}

/// The [`Gemm`] of a bf16 launch: bf16 out where `out_bf16` is set, f32
/// and the KV caches where `kv` names them.
#[inline(always)]
fn bf16_gemm(p: &MatmulBf16WgmmaParams) -> Gemm {
    Gemm {
        inp_map: p.inp_map as u64,
        weight_map: p.weight_map as u64,
        out_map: p.out_map as u64,
        out: if !p.out_bf16.is_null() {
            TileOut::Bf16(p.out_bf16)
        } else if !p.kv.k.is_null() {
            TileOut::F32Kv { out: p.out, kv: p.kv }
        } else {
            TileOut::F32 {
                out: p.out,
                round_tf32: false,
            }
        },
        bias: p.bias,
        n: p.n as usize,
        c: p.c as usize,
        oc: p.oc as usize,
        gelu: p.gelu != 0,
        round_inp: false,
        k_tiles_per_split: p.k_tiles_per_split as usize,
    }
}

macro_rules! tf32_kernel {
    ($fn_name:ident, $shape:expr) => {
        matmul_wgmma_kernel!($fn_name, $shape, Tf32, MatmulTf32WgmmaParams, tf32_gemm);
    };
}
macro_rules! tf32x3_kernel {
    ($fn_name:ident, $shape:expr) => {
        matmul_wgmma_kernel!($fn_name, $shape, Tf32x3, MatmulTf32WgmmaParams, tf32_gemm);
    };
}
macro_rules! bf16_kernel {
    ($fn_name:ident, $shape:expr) => {
        matmul_wgmma_kernel!($fn_name, $shape, Bf16, MatmulBf16WgmmaParams, bf16_gemm);
    };
}

tf32_kernel!(matmul_forward_tf32_wgmma_128x256, MATMUL_TF32_WGMMA_128X256);
tf32_kernel!(matmul_forward_tf32_wgmma_192x192, MATMUL_TF32_WGMMA_192X192);
tf32_kernel!(matmul_forward_tf32_wgmma_128x192, MATMUL_TF32_WGMMA_128X192);
tf32_kernel!(matmul_forward_tf32_wgmma_128x128, MATMUL_TF32_WGMMA_128X128);
tf32_kernel!(matmul_forward_tf32_wgmma_64x128, MATMUL_TF32_WGMMA_64X128);
tf32_kernel!(matmul_forward_tf32_wgmma_64x64, MATMUL_TF32_WGMMA_64X64);

tf32x3_kernel!(matmul_forward_3xtf32_wgmma_128x128, MATMUL_3XTF32_WGMMA_128X128);
tf32x3_kernel!(matmul_forward_3xtf32_wgmma_64x128, MATMUL_3XTF32_WGMMA_64X128);
tf32x3_kernel!(matmul_forward_3xtf32_wgmma_64x64, MATMUL_3XTF32_WGMMA_64X64);

bf16_kernel!(matmul_forward_bf16_wgmma_128x256, MATMUL_BF16_WGMMA_128X256);
bf16_kernel!(matmul_forward_bf16_wgmma_192x192, MATMUL_BF16_WGMMA_192X192);
bf16_kernel!(matmul_forward_bf16_wgmma_128x192, MATMUL_BF16_WGMMA_128X192);
bf16_kernel!(matmul_forward_bf16_wgmma_128x128, MATMUL_BF16_WGMMA_128X128);
bf16_kernel!(matmul_forward_bf16_wgmma_64x128, MATMUL_BF16_WGMMA_64X128);
bf16_kernel!(matmul_forward_bf16_wgmma_64x64, MATMUL_BF16_WGMMA_64X64);

bf16_kernel!(
    matmul_forward_bf16_wgmma_128x192_persistent,
    MATMUL_BF16_WGMMA_PERSISTENT[0]
);
bf16_kernel!(
    matmul_forward_bf16_wgmma_128x128_persistent,
    MATMUL_BF16_WGMMA_PERSISTENT[1]
);
bf16_kernel!(
    matmul_forward_bf16_wgmma_192x192_persistent,
    MATMUL_BF16_WGMMA_PERSISTENT[2]
);
