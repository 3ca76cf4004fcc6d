//! `out[N,OC] = inp[N,C] · W[OC,C]ᵀ (+ bias[OC]) (then GELU if asked)` on the
//! TF32 tensor cores (`mma.sync.m16n8k8`), f32 accumulate.
//!
//! Two kernel bodies, each monomorphised into a few tile shapes, each
//! exported under its own PTX name so the host (and the `tune` binary) can
//! pick per GEMM shape:
//! - [`TileEngine::MmaSync`] (`ops::matmul_tf32`): warp-level
//!   `mma.sync.m16n8k8`, any GPU from sm_80 on;
//! - [`TileEngine::Wgmma`] (`ops::matmul_wgmma`): Hopper's warpgroup
//!   `wgmma.mma_async.m64nNk8`, only in the sm_90a module (feature `sm90a`).
//!
//! The shapes are described by [`TileShape`]; the kernels read their shape
//! from the same constants, so host launch configurations and device code
//! cannot disagree.

/// Rows (of `k`) staged in shared memory per pipeline stage.
pub const MATMUL_TF32_BK: u32 = 32;
/// Padding (floats) appended to every shared-memory row of `BK` floats: with a
/// row stride of 36 words, the fragment reads `row = lane/4, col = lane%4`
/// land in banks `4*row + col`, all 32 distinct, and rows stay 16-byte
/// aligned for `cp.async`.
pub const MATMUL_TF32_PAD: u32 = 4;
/// Padding (floats) of each row of the output tile the epilogue stages in
/// shared memory (bank-conflict-free 8-byte fragment stores).
pub const MATMUL_TF32_EPI_PAD: u32 = 8;
/// Blocks along M processed together before moving along N (grouped
/// rasterisation): a wave of blocks then shares a few row panels of `inp` and
/// a band of `W`, so both are re-read from L2 rather than from DRAM.
pub const MATMUL_TF32_GROUP_M: u32 = 8;

/// Rows of A one warpgroup's `wgmma.m64nNk8` covers.
pub const WGMMA_M: u32 = 64;
/// Threads of a warpgroup (4 warps).
pub const WARPGROUP_THREADS: u32 = 128;
/// Bytes of a staged row of k in the wgmma kernels: `MATMUL_TF32_BK` f32,
/// exactly one 128-byte swizzle row (TMA writes it swizzled; no padding).
pub const WGMMA_ROW_BYTES: u32 = MATMUL_TF32_BK * 4;
/// Alignment the wgmma kernels' shared tiles need (one 128-byte swizzle atom
/// of 8 rows); the dynamic shared memory is over-allocated by this much so
/// the kernel can align its base.
pub const WGMMA_SMEM_ALIGN: u32 = 1024;
/// Bytes of an output row one TMA store box of the wgmma kernels spans (the
/// 128-byte swizzle's limit): 32 f32 or 64 bf16 columns.
pub const WGMMA_OUT_BOX_BYTES: u32 = 128;
/// Padding (floats) of the rows of the output tile the wgmma kernels stage
/// in shared memory for their epilogue.
pub const WGMMA_EPI_PAD: u32 = 8;
/// Shared bytes the wgmma kernels reserve after the stages for their
/// `mbarrier`s (two per stage, 8 bytes each, up to 16 stages).
pub const WGMMA_BARRIER_BYTES: u32 = 256;
/// The wgmma kernels' producer: one warp after the consumer warpgroups,
/// one lane of which issues the TMA copies (a whole warpgroup in a tile
/// that moves registers to its consumers, [`TileShape::consumer_regs`]).
pub const WGMMA_PRODUCER_THREADS: u32 = 32;
/// Registers a thread a producer warpgroup keeps when it gives the rest to
/// the consumers ([`TileShape::consumer_regs`]): its one working lane holds
/// loop counters and map addresses (CUTLASS's producers keep 40 too).
pub const WGMMA_PRODUCER_REGS: u32 = 40;
/// Registers of an SM (the pool a block of one an SM shares out).
pub const SM_REGISTERS: u32 = 65536;
/// `setmaxnreg`'s counts: multiples of this step, at most the maximum.
pub const SETMAXNREG_STEP: u32 = 8;
pub const SETMAXNREG_MAX: u32 = 256;

/// Which tensor-core instruction family a tile's kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileEngine {
    /// `mma.sync.m16n8k8` per warp; in every module (sm_80 and later).
    /// Operands are rounded to TF32 (`cvt.rna`) in shared memory.
    MmaSync,
    /// `wgmma.mma_async.m64nNk8` per warpgroup, operands staged by TMA; only
    /// in the sm_90a module. `inp` is rounded in shared memory; `weight` is
    /// used as given, so it must already be TF32-rounded for
    /// round-to-nearest accuracy (the tensor cores truncate).
    Wgmma,
}

/// A block tile `bm x bn` with `stages` cp.async pipeline stages, split
/// among warps (`MmaSync`: each computes `wm x wn`) or warpgroups (`Wgmma`:
/// each computes `64 x bn`, so `wm = 64`, `wn = bn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub name: &'static str,
    pub engine: TileEngine,
    pub bm: u32,
    pub bn: u32,
    pub wm: u32,
    pub wn: u32,
    pub stages: u32,
    /// Blocks of this shape expected to be resident on one sm_90 SM: the
    /// smaller of what its registers (ptxas 13 `-v` for sm_90, x threads;
    /// 64 Ki registers per SM) and its shared memory (228 KiB per SM) allow.
    /// Only the host's tile chooser reads it; `tests/gpu/matmul_tf32.rs`
    /// checks it against the driver's occupancy calculator.
    pub blocks_per_sm: u32,
    /// 3xTF32 (FP32's accuracy from three TF32 products of the operands'
    /// big and small halves). `MmaSync`: split as fragments are read, no
    /// extra memory. `Wgmma`: each stage also holds the small halves of
    /// its loaded tiles (`wgmma` reads its operands from shared memory), so
    /// a stage takes twice the bytes.
    pub split_tf32: bool,
    /// `Wgmma` only: 0 for one output tile a block, its epilogue staged over
    /// the stages. Otherwise the kernel is persistent (a block loops over
    /// tiles, the grid at most one wave: see `persistent_wgmma_tile`) and
    /// its epilogue has a buffer of its own, this many TMA-store boxes
    /// ([`WGMMA_OUT_BOX_BYTES`] by `bm`) and the tile's bias columns, so the
    /// producer fills the next tile's stages while the consumers store.
    pub epi_boxes: u32,
    /// `Wgmma` only: 0, or the registers a thread each consumer warpgroup
    /// takes (`setmaxnreg`) after the producer, then a whole warpgroup,
    /// gives all but [`WGMMA_PRODUCER_REGS`] back. For tiles whose
    /// accumulators and loop state do not fit the even share of the
    /// register file (see [`TileShape::with_consumer_regs`]).
    pub consumer_regs: u32,
}

impl TileShape {
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        match self.engine {
            TileEngine::MmaSync => (self.bm / self.wm) * (self.bn / self.wn) * 32,
            TileEngine::Wgmma => (self.bm / WGMMA_M) * WARPGROUP_THREADS + self.producer_threads(),
        }
    }
    /// Bytes of one stage of a `Wgmma` tile: the `bm + bn` loaded rows, and
    /// as many again for their small halves when `split_tf32`.
    pub const fn wgmma_stage_bytes(&self) -> u32 {
        (self.bm + self.bn) * WGMMA_ROW_BYTES * if self.split_tf32 { 2 } else { 1 }
    }
    /// Dynamic shared memory per block: `stages` copies of an A and a B
    /// tile (`MmaSync`: rows padded, and the epilogue's output tile reuses
    /// them; `Wgmma`: unpadded swizzled rows, the alignment slack and the
    /// barriers).
    pub const fn shared_bytes(&self) -> u32 {
        match self.engine {
            TileEngine::MmaSync => self.stages * (self.bm + self.bn) * (MATMUL_TF32_BK + MATMUL_TF32_PAD) * 4,
            TileEngine::Wgmma => {
                self.stages * self.wgmma_stage_bytes()
                    + self.wgmma_epilogue_bytes()
                    + WGMMA_SMEM_ALIGN
                    + WGMMA_BARRIER_BYTES
            }
        }
    }
    /// Bytes of a persistent `Wgmma` tile's own epilogue buffer (after the
    /// stages): `epi_boxes` boxes, then the tile's `bn` bias floats; 0 for
    /// the others.
    pub const fn wgmma_epilogue_bytes(&self) -> u32 {
        if self.epi_boxes == 0 {
            0
        } else {
            self.epi_boxes * self.bm * WGMMA_OUT_BOX_BYTES + self.bn * 4
        }
    }
    /// Threads of a `Wgmma` tile's producer: a warp, or a warpgroup where it
    /// gives registers to the consumers ([`TileShape::consumer_regs`]:
    /// `setmaxnreg` is warpgroup-wide).
    pub const fn producer_threads(&self) -> u32 {
        if self.consumer_regs > 0 {
            WARPGROUP_THREADS
        } else {
            WGMMA_PRODUCER_THREADS
        }
    }
    /// This tile with its consumer warpgroups at `regs` registers a thread
    /// and a producer warpgroup at [`WGMMA_PRODUCER_REGS`]. Checked at
    /// compile time: one block an SM, and the two counts within the block's
    /// even share of the register file (what ptxas gives each thread at
    /// entry, which the producer's release must cover; a `setmaxnreg.inc`
    /// past the pool would wait forever).
    pub const fn with_consumer_regs(self, regs: u32) -> TileShape {
        let shifted = TileShape {
            consumer_regs: regs,
            ..self
        };
        let threads = shifted.threads();
        let consumers = threads - WARPGROUP_THREADS;
        // The even share, in setmaxnreg's steps.
        let entry = SM_REGISTERS / threads / SETMAXNREG_STEP * SETMAXNREG_STEP;
        assert!(matches!(self.engine, TileEngine::Wgmma) && self.blocks_per_sm == 1);
        assert!(regs > entry && regs.is_multiple_of(SETMAXNREG_STEP) && regs <= SETMAXNREG_MAX);
        assert!(WGMMA_PRODUCER_REGS * WARPGROUP_THREADS + regs * consumers <= entry * threads);
        shifted
    }
    /// Whether blocks loop over output tiles ([`TileShape::epi_boxes`]).
    pub const fn persistent(&self) -> bool {
        self.epi_boxes > 0
    }
}

/// 128x192 block, 8 warps of 64x48, 3 stages (138.2 KiB shared): the
/// largest tile (least shared-memory traffic per mma: 112 words per 6x4
/// mma step); one wave of it covers M=1024 x N=2304 or 3072 in 96 or 128
/// blocks, where 128x128 needs two waves of 144 or 192 on 132 SMs.
pub const MATMUL_TF32_128X192: TileShape = TileShape {
    name: "matmul_forward_tf32_128x192",
    engine: TileEngine::MmaSync,
    bm: 128,
    bn: 192,
    wm: 64,
    wn: 48,
    stages: 3,
    blocks_per_sm: 1,
    split_tf32: false,
    epi_boxes: 0,
    consumer_regs: 0,
};
/// 128x128 block, 8 warps of 64x32, 4 stages (147.5 KiB shared): large GEMMs.
/// One block per SM (ptxas: ~172 registers x 256 threads), so the pipeline is
/// one stage deeper than the smaller tiles' to cover DRAM latency alone.
pub const MATMUL_TF32_128X128: TileShape = TileShape {
    name: "matmul_forward_tf32_128x128",
    engine: TileEngine::MmaSync,
    bm: 128,
    bn: 128,
    wm: 64,
    wn: 32,
    stages: 4,
    blocks_per_sm: 1,
    split_tf32: false,
    epi_boxes: 0,
    consumer_regs: 0,
};
/// 128x64 block, 4 warps of 64x32, 4 stages (110.6 KiB): two blocks per SM.
pub const MATMUL_TF32_128X64: TileShape = TileShape {
    name: "matmul_forward_tf32_128x64",
    engine: TileEngine::MmaSync,
    bm: 128,
    bn: 64,
    wm: 64,
    wn: 32,
    stages: 4,
    blocks_per_sm: 2,
    split_tf32: false,
    epi_boxes: 0,
    consumer_regs: 0,
};
/// 64x64 block, 4 warps of 32x32, 3 stages (55.3 KiB): medium GEMMs.
pub const MATMUL_TF32_64X64: TileShape = TileShape {
    name: "matmul_forward_tf32_64x64",
    engine: TileEngine::MmaSync,
    bm: 64,
    bn: 64,
    wm: 32,
    wn: 32,
    stages: 3,
    blocks_per_sm: 4,
    split_tf32: false,
    epi_boxes: 0,
    consumer_regs: 0,
};
/// 32x64 block, 4 warps of 16x32, 4 stages (55.3 KiB): small M (decode, short
/// prompts), where more blocks are needed to fill the GPU.
pub const MATMUL_TF32_32X64: TileShape = TileShape {
    name: "matmul_forward_tf32_32x64",
    engine: TileEngine::MmaSync,
    bm: 32,
    bn: 64,
    wm: 16,
    wn: 32,
    stages: 4,
    blocks_per_sm: 4,
    split_tf32: false,
    epi_boxes: 0,
    consumer_regs: 0,
};

/// FP32 matmuls on the TF32 tensor cores at FP32's accuracy ("3xTF32":
/// each product as three TF32 ones of the operands' big and small halves,
/// split as the fragments are read; the stages stay f32). The `mma.sync`
/// tiles' shapes, each with its own kernel; for the rows where the FP32
/// kernels on the CUDA cores are issue-bound (the server's decode steps of
/// many rows, short prompts, prefill). Resident blocks from ptxas 13 for
/// sm_90 (246-255, 134-140 and 96-97 registers: 2, 3 and 4 blocks).
pub const MATMUL_3XTF32_128X64: TileShape = TileShape {
    name: "matmul_forward_3xtf32_128x64",
    blocks_per_sm: 2,
    split_tf32: true,
    ..MATMUL_TF32_128X64
};
pub const MATMUL_3XTF32_64X64: TileShape = TileShape {
    name: "matmul_forward_3xtf32_64x64",
    blocks_per_sm: 3,
    split_tf32: true,
    ..MATMUL_TF32_64X64
};
pub const MATMUL_3XTF32_32X64: TileShape = TileShape {
    name: "matmul_forward_3xtf32_32x64",
    blocks_per_sm: 4,
    split_tf32: true,
    ..MATMUL_TF32_32X64
};

/// Every 3xTF32 tile shape (in every module).
pub const MATMUL_3XTF32_VARIANTS: [TileShape; 3] = [MATMUL_3XTF32_128X64, MATMUL_3XTF32_64X64, MATMUL_3XTF32_32X64];

/// Every `mma.sync` tile shape (in every module), for tuning sweeps.
pub const MATMUL_TF32_VARIANTS: [TileShape; 5] = [
    MATMUL_TF32_128X192,
    MATMUL_TF32_128X128,
    MATMUL_TF32_128X64,
    MATMUL_TF32_64X64,
    MATMUL_TF32_32X64,
];

/// A wgmma tile: `bm / 64` warpgroups, each `64 x bn`.
pub const fn wgmma_tile(name: &'static str, bm: u32, bn: u32, stages: u32, blocks_per_sm: u32) -> TileShape {
    TileShape {
        name,
        engine: TileEngine::Wgmma,
        bm,
        bn,
        wm: WGMMA_M,
        wn: bn,
        stages,
        blocks_per_sm,
        split_tf32: false,
        epi_boxes: 0,
        consumer_regs: 0,
    }
}

/// The persistent twin of a one-block-an-SM wgmma tile: `stages` stages and
/// an epilogue buffer of `epi_boxes` boxes. Launched with at most one block
/// an SM, each looping over the tiles `blockIdx.x + i * gridDim.x`, and
/// only with an output map (the host's contract: unsplit, no KV caches):
/// whole-row tiles go out through the copy engine from the epilogue's own
/// buffer while the producer loads the next tile; the last row of tiles is
/// staged the same way and copied out by the threads.
pub const fn persistent_wgmma_tile(name: &'static str, bm: u32, bn: u32, stages: u32, epi_boxes: u32) -> TileShape {
    TileShape {
        epi_boxes,
        ..wgmma_tile(name, bm, bn, stages, 1)
    }
}

/// 128x256, 2 consumer warpgroups of m64n256 (128 accumulator registers per
/// thread), 4 stages (193 KiB): the most tensor work per staged byte
/// (42.7 FLOP/B).
pub const MATMUL_TF32_WGMMA_128X256: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_128x256", 128, 256, 4, 1);
/// 192x192, 3 consumer warpgroups of m64n192, 4 stages (193 KiB): M = 8192
/// x N = 2304 in 516 blocks (3.9 waves on 132 SMs, the last 91 % full)
/// where 128x256 needs 576 (4.36 waves, the last 36 % full).
pub const MATMUL_TF32_WGMMA_192X192: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_192x192", 192, 192, 4, 1);
/// 128x192, 2 warpgroups of m64n192, 5 stages (201 KiB): N = 768 in 4
/// column tiles instead of 3 (M = 8192: 256 blocks, two full waves on 132
/// SMs, where 128x256 needs 1.45 waves).
pub const MATMUL_TF32_WGMMA_128X192: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_128x192", 128, 192, 5, 1);
/// 128x128, 2 warpgroups of m64n128, 6 stages (193 KiB).
pub const MATMUL_TF32_WGMMA_128X128: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_128x128", 128, 128, 6, 1);
/// 64x128, one warpgroup, 4 stages (97 KiB, two blocks per SM): M = 1024.
pub const MATMUL_TF32_WGMMA_64X128: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_64x128", 64, 128, 4, 2);
/// 64x64, one warpgroup, 4 stages (65 KiB, three blocks per SM): small
/// outputs (M = 1024 x N = 768: 192 blocks).
pub const MATMUL_TF32_WGMMA_64X64: TileShape = wgmma_tile("matmul_forward_tf32_wgmma_64x64", 64, 64, 4, 3);

/// A 3xTF32 wgmma tile (`TileShape::split_tf32`).
pub const fn wgmma_3xtf32_tile(name: &'static str, bm: u32, bn: u32, stages: u32, blocks_per_sm: u32) -> TileShape {
    TileShape {
        split_tf32: true,
        ..wgmma_tile(name, bm, bn, stages, blocks_per_sm)
    }
}

/// FP32 at FP32's accuracy on the `wgmma` tensor cores (3xTF32, sm_90a
/// only): the TMA loads plain f32 tiles; the consumers write each stage's
/// small halves (`x - trunc(x)`, rounded to TF32) beside it, and the
/// tensor cores' own truncation of the loaded tile gives the big halves.
/// Three `wgmma` per k-step (small·big, big·small, big·big). 128x128, 3
/// stages of 64 KiB (193 KiB): prefill.
pub const MATMUL_3XTF32_WGMMA_128X128: TileShape =
    wgmma_3xtf32_tile("matmul_forward_3xtf32_wgmma_128x128", 128, 128, 3, 1);
/// 64x128, 4 stages of 48 KiB (193 KiB): medium M.
pub const MATMUL_3XTF32_WGMMA_64X128: TileShape =
    wgmma_3xtf32_tile("matmul_forward_3xtf32_wgmma_64x128", 64, 128, 4, 1);
/// 64x64, 3 stages of 32 KiB (97 KiB, two blocks per SM): the server's
/// steps of tens of rows (many blocks, split over k).
pub const MATMUL_3XTF32_WGMMA_64X64: TileShape = wgmma_3xtf32_tile("matmul_forward_3xtf32_wgmma_64x64", 64, 64, 3, 2);

/// Every 3xTF32 `wgmma` tile shape (sm_90a module only).
pub const MATMUL_3XTF32_WGMMA_VARIANTS: [TileShape; 3] = [
    MATMUL_3XTF32_WGMMA_128X128,
    MATMUL_3XTF32_WGMMA_64X128,
    MATMUL_3XTF32_WGMMA_64X64,
];

/// Every `wgmma` tile shape (sm_90a module only).
pub const MATMUL_TF32_WGMMA_VARIANTS: [TileShape; 6] = [
    MATMUL_TF32_WGMMA_128X256,
    MATMUL_TF32_WGMMA_192X192,
    MATMUL_TF32_WGMMA_128X192,
    MATMUL_TF32_WGMMA_128X128,
    MATMUL_TF32_WGMMA_64X128,
    MATMUL_TF32_WGMMA_64X64,
];

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulTf32Params {
    /// `[n, oc]`, written.
    pub out: *mut f32,
    /// `[n, c]`.
    pub inp: *const f32,
    /// `[oc, c]` (PyTorch's (out, in) layout).
    pub weight: *const f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    /// Inner dimension; must be a multiple of 4 (16-byte rows for cp.async).
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU (tanh approximation) after the bias.
    pub gelu: u32,
    /// Split-K: 0 for none (grid y = 1, `out` is the result); else the
    /// `MATMUL_TF32_BK`-deep k-tiles each of the grid's y splits sums, block
    /// row `y` writing its partial tile to `out + y * n * oc` (`out` holds
    /// `splits * n * oc` floats, `bias` is null, `gelu` 0: the split reduce
    /// kernel of `params::matmul` finishes the sum).
    pub k_tiles_per_split: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe MatmulTf32Params);

/// The bytes of a `CUtensorMap` (opaque; encoded on the host by
/// `cuTensorMapEncodeTiled`), aligned as the copy engine requires.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// Parameters of the wgmma (TMA-fed) kernels: the same matmul as
/// [`MatmulTf32Params`], with `inp` and `weight` described by tensor maps in
/// global memory (a kernel parameter can only be 16-byte aligned in this
/// toolchain's ABI, a tensor map needs 64).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulTf32WgmmaParams {
    /// Map of `inp` `[n, c]`: box of `MATMUL_TF32_BK` x `bm`, 128-byte swizzle.
    pub inp_map: *const TensorMap,
    /// Map of `weight` `[oc, c]`: box of `MATMUL_TF32_BK` x `bn`, 128-byte swizzle.
    pub weight_map: *const TensorMap,
    /// Null, or a map of `out` for the tile's TMA stores (unsplit launches):
    /// at least `n` rows of `oc` elements (f32, or bf16 for a bf16 out), box
    /// of 128 bytes of a row ([`WGMMA_OUT_BOX_BYTES`]) by `bm` rows, 128-byte
    /// swizzle. A block whose `bm` rows all lie below `n` stores through it;
    /// the last row of tiles, and a launch without it, store element-wise.
    pub out_map: *const TensorMap,
    /// `[n, oc]`, written; 16-byte aligned.
    pub out: *mut f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU (tanh approximation) after the bias.
    pub gelu: u32,
    /// Nonzero: round `inp` to TF32 in shared memory. Zero when the producer
    /// of `inp` already rounded it (layernorm/GELU with `round_tf32`).
    pub round_inp: u32,
    /// Split-K: 0 for none (grid y = 1, `out` is the result); else the
    /// `MATMUL_TF32_BK`-deep k-tiles each of the grid's y splits sums, block
    /// row `y` writing its partial tile to `out + y * n * oc` (`out` holds
    /// `splits * n * oc` floats, `bias` is null, `gelu` 0: the split reduce
    /// kernel of `params::matmul` finishes the sum).
    pub k_tiles_per_split: u32,
    /// Nonzero: round the results (after bias and GELU) to TF32, for a TF32
    /// matmul that reads them next (the engine's MLP up-projection). Not
    /// with split-K (the reduction does not round).
    pub round_out: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe MatmulTf32WgmmaParams);
