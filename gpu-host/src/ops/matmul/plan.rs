//! The cost model and planners of the FP32 matmul: a wave model of the
//! tiled kernel (with split-K), the small-M kernel and chunked GEMV, each
//! predicting microseconds for a shape on the device's SM count, and the
//! rule ([`plan_auto`]) that picks the fastest.

use super::WARP;
use crate::MatmulShape;
use gpu_kernels::params::matmul::{
    MATMUL_BLOCK, MATMUL_BLOCK_MID, MATMUL_BLOCKS_PER_SM, MATMUL_BLOCKS_PER_SM_MID, MATMUL_FORWARD, MATMUL_FORWARD_MID,
    MATMUL_GEMV_MAX_ROWS, MATMUL_SMALL_BLOCKS_PER_SM, MATMUL_SMALL_PARTIAL_FLOATS, MATMUL_SMALL_TILE_K,
    MATMUL_SMALL_TILE_M, MATMUL_SMALL_TILE_N, MATMUL_TILE_K, MATMUL_TILE_M, MATMUL_TILE_M_MID, MATMUL_TILE_N,
};

/// Most rows the FP32 dispatch ([`MatmulKernel::Auto`](super::MatmulKernel::Auto) with a workspace)
/// considers running as GEMV launches over chunks of `MATMUL_GEMV_MAX_ROWS`
/// rows; it does so only where [`predict_gemv_chunked_us`] beats the tiled
/// plan. Past a few chunks the repeated launches and weight re-reads lose.
pub const FP32_CHUNKED_GEMV_MAX_ROWS: usize = 64;

// The wave model of the tiled kernel (see `predict_tiled_us`). Calibrated on
// the H200 (132 SMs) runs of "FP32 SGEMM v2" (docs/performance.md): a wave of
// two 128x128 blocks per SM over K = 768 takes 160 µs (fits M = 8192 and
// M = 1024 within 3 %), one lone 64x128 block per SM over K = 768 takes 75 µs.

/// FP32 FFMA rate of one SM, FLOP/s: 128 lanes x 2 FLOP x 1.98 GHz (H100 /
/// H200 SXM boost clock).
const SM_PEAK_FLOPS: f64 = 128.0 * 2.0 * 1.98e9;
/// The tiled kernel's fraction of SM peak with `w` resident warps is
/// `EFF_MAX * w / (w + EFF_HALF_WARPS)`: 0.62 at 16 warps (two 128x128
/// blocks, measured), 0.33 at 4 warps (one 64x128 block, measured), 0.48 at
/// 8, 0.57 at 12 (interpolated). Few warps cannot hide the per-k-slice
/// global-load latency.
const EFF_MAX: f64 = 0.877;
/// See [`EFF_MAX`].
const EFF_HALF_WARPS: f64 = 6.63;
/// Fixed cost per wave of blocks, µs: the first k-slice's load latency and
/// the epilogue's stores, which no other work of the block hides.
const WAVE_OVERHEAD_US: f64 = 1.5;
/// Cost of the split-K reduction's extra launch (gap between dependent
/// kernels plus its own ramp), µs.
const SPLIT_REDUCE_LAUNCH_US: f64 = 2.0;
/// Partial sums up to this many bytes are assumed to stay in L2 (H100/H200
/// have 50 MB) between their write and the reduction's read.
const PARTIAL_L2_BYTES: f64 = 32.0 * 1024.0 * 1024.0;
/// Bandwidth of partial-sum traffic that stays in L2, bytes/s.
const PARTIAL_BW_L2: f64 = 7.0e12;
/// Bandwidth of partial-sum traffic that goes to HBM, bytes/s (H200
/// device-to-device copies reach ~4.3 TB/s).
const PARTIAL_BW_HBM: f64 = 3.5e12;
/// Smallest depth of `c` one split covers: below it the per-block prologue
/// and epilogue and the partial traffic outweigh the extra parallelism.
pub(super) const MIN_SPLIT_DEPTH: usize = 64;
/// Most splits of `c`.
const MAX_SPLITS: usize = 64;
/// Split-K is considered only while its grid stays within this many waves of
/// resident blocks: splitting is for grids that under-fill the GPU, and the
/// bound caps the workspace (see [`split_k_workspace_floats`]).
const MAX_SPLIT_WAVES: usize = 3;
/// Launch cost of one GEMV launch of the chunked path, µs.
const GEMV_LAUNCH_US: f64 = 2.0;
/// Latency of one step of the GEMV kernel's loop (each warp walks its weight
/// row 128 floats per step, with few warps per SM to hide the load), µs.
const GEMV_STEP_US: f64 = 0.7;
/// Floats of `c` one GEMV warp covers per step (32 lanes x 4).
const GEMV_STEP_FLOATS: usize = 128;
/// Bytes per f32.
const F32_BYTES: usize = 4;

/// Most rows [`plan_auto`] considers for the small-M kernels: two 64-row
/// block rows. Past that the 128-row tiles fill the GPU and reuse operands
/// better, and the small kernels' model is not calibrated.
pub const SMALL_MAX_ROWS: usize = 128;
// The small-M kernel's model (`predict_small_us`), fitted to the H200 sweep
// of every split count at n = 64 and 128 (`bench gemm`, rows
// `ours_fp32_small_s<splits>`; docs/performance.md, "Small-M FP32 v2"). An SM
// runs one 8-deep k-slice of a 64x64 block in 0.43 µs whether the block is
// alone or not (the SM issues at about a third of its peak either way; more
// resident blocks gain a little), and a split launch pays 5-12 µs for the
// last blocks' sum: the partials' stores, a fence and an atomic per block,
// then L2 round trips for the loads, each ~0.9 µs.

/// Time of one k-slice of one block on an SM, µs.
const SMALL_US_PER_SLICE: f64 = 0.43;
/// Fraction of [`SMALL_US_PER_SLICE`] each further resident block saves
/// (0.38 µs per block-slice measured with 3 blocks per SM, 0.34 with 4).
const SMALL_RESIDENT_GAIN: f64 = 0.07;
/// Fixed cost of a split launch's sum, µs (5.6 µs at 2 splits).
const SMALL_FIXUP_US: f64 = 5.2;
/// Cost of the sum per split, µs (8.4 µs at 11 splits, 11.8 at 24).
const SMALL_FIXUP_US_PER_SPLIT: f64 = 0.27;
/// Smallest depth of `c` one split of the small kernel covers.
pub(super) const SMALL_MIN_SPLIT_DEPTH: usize = 32;
/// Most waves of resident blocks a split small-M grid may take (splitting
/// is for grids that under-fill the GPU; the bound caps the workspace).
const SMALL_MAX_SPLIT_WAVES: usize = 2;

/// What the tiled wave model ([`predict_tiled_us`]) leaves out at small n,
/// µs: measured minus predicted time of the tiled plans at n = 64 and 128
/// on the H200 is 8.3..9.6 µs for all ten (N, K) (launch gaps, pipeline
/// fill, the split reduction's ramp). It ranks tiled plans among themselves
/// without it; [`plan_auto`] adds it when it compares a tiled plan with the
/// small-M kernel, whose model is fitted to absolute times.
const TILED_SMALL_N_MISSING_US: f64 = 9.0;

/// `(splits, k_chunk)` cutting `k` into at most `splits` chunks, each a
/// multiple of `step` deep and none empty (the count may come out lower);
/// `None` when that leaves one chunk.
fn split_depth(k: usize, splits: usize, step: usize) -> Option<(u32, u32)> {
    let chunk = k.div_ceil(splits.max(1)).div_ceil(step) * step;
    (chunk > 0 && chunk < k).then(|| (k.div_ceil(chunk) as u32, chunk as u32))
}

/// Every distinct split of `k` a planner considers: [`split_depth`] for 2..=
/// `MAX_SPLITS` asked, while the chunk stays at least `min_depth` deep, each
/// resulting split count once.
fn split_candidates(k: usize, step: usize, min_depth: usize) -> impl Iterator<Item = (u32, u32)> {
    let mut last_splits = 1;
    (2..=MAX_SPLITS)
        .map_while(move |s| split_depth(k, s, step).filter(|&(_, chunk)| chunk as usize >= min_depth))
        .filter(move |&(splits, _)| std::mem::replace(&mut last_splits, splits) != splits)
}

/// How the tiled kernel runs: block tile rows (`MATMUL_TILE_M` or
/// `MATMUL_TILE_M_MID`; the tile is always `MATMUL_TILE_N` columns wide) and
/// the split of `k`: `splits` blocks along grid z, each covering `k_chunk`
/// of `k` (the last one the rest). `splits == 1` is the plain kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledPlan {
    pub tile_m: u32,
    pub splits: u32,
    pub k_chunk: u32,
}

impl TiledPlan {
    /// The unsplit kernel with a `tile_m`-row tile.
    pub fn unsplit(tile_m: u32, k: usize) -> Self {
        TiledPlan {
            tile_m,
            splits: 1,
            k_chunk: k as u32,
        }
    }

    /// At most `splits` splits of `k`, each a multiple of `MATMUL_TILE_K`
    /// deep (so 16-byte loads stay aligned), none empty: the split count may
    /// come out lower than asked.
    pub fn split(tile_m: u32, k: usize, splits: usize) -> Self {
        match split_depth(k, splits, MATMUL_TILE_K as usize) {
            Some((splits, k_chunk)) => TiledPlan {
                tile_m,
                splits,
                k_chunk,
            },
            None => Self::unsplit(tile_m, k),
        }
    }

    /// Floats of workspace this plan needs for an `m x n` output.
    pub fn workspace_floats(&self, shape: MatmulShape) -> usize {
        if self.splits > 1 {
            self.splits as usize * shape.out_len()
        } else {
            0
        }
    }

    /// Kernel name, threads per block and resident blocks per SM of the tile.
    pub(super) fn kernel(&self) -> (&'static str, u32, u32) {
        if self.tile_m == MATMUL_TILE_M {
            (MATMUL_FORWARD, MATMUL_BLOCK, MATMUL_BLOCKS_PER_SM)
        } else {
            (MATMUL_FORWARD_MID, MATMUL_BLOCK_MID, MATMUL_BLOCKS_PER_SM_MID)
        }
    }

    /// Blocks of the tiled launch for an `m x n` output.
    pub fn blocks(&self, shape: MatmulShape) -> usize {
        let MatmulShape { m, n, .. } = shape;
        m.div_ceil(self.tile_m as usize) * n.div_ceil(MATMUL_TILE_N as usize) * self.splits as usize
    }
}

/// Fraction of SM peak the tiled kernel reaches with `warps` resident warps.
fn efficiency(warps: usize) -> f64 {
    let w = warps as f64;
    EFF_MAX * w / (w + EFF_HALF_WARPS)
}

/// Predicted time of `plan` for `out[m, n] = inp[m, k] · weightᵀ` on `sms`
/// SMs, µs, by waves: a grid that fits the resident slots (`sms x blocks per
/// SM`) spreads breadth-first, so the busiest SM runs `ceil(blocks / sms)`
/// blocks at once; a larger grid runs in `ceil(blocks / slots)` full waves
/// (freed slots are refilled in pairs, so the last partial wave costs a full
/// one: the M = 8192 measurements follow this). Split-K adds the reduction:
/// one launch plus writing and reading the partials. Coarse (it ignores
/// memory bandwidth of the operands, fine for K >= 64 on these tiles); its
/// job is ranking plans.
pub fn predict_tiled_us(plan: &TiledPlan, shape: MatmulShape, sms: usize) -> f64 {
    let MatmulShape { m, n, k } = shape;
    let (_, threads, resident) = plan.kernel();
    let (warps, resident) = ((threads / WARP) as usize, resident as usize);
    let blocks = plan.blocks(shape);
    let depth = (plan.k_chunk as usize).min(k);
    let block_us = 2.0 * (plan.tile_m * MATMUL_TILE_N) as f64 * depth as f64 / SM_PEAK_FLOPS * 1e6;
    let sms = sms.max(1);
    let slots = sms * resident;
    let gemm = if blocks <= slots {
        let per_sm = blocks.div_ceil(sms);
        per_sm as f64 * block_us / efficiency(per_sm * warps) + WAVE_OVERHEAD_US
    } else {
        let waves = blocks.div_ceil(slots);
        waves as f64 * (resident as f64 * block_us / efficiency(resident * warps) + WAVE_OVERHEAD_US)
    };
    if plan.splits <= 1 {
        return gemm;
    }
    // Rows padded to the mid tile: the plan then depends on m only through
    // ceil(m / 64), which `split_k_workspace_floats` relies on.
    let rows = m.div_ceil(MATMUL_TILE_M_MID as usize) * MATMUL_TILE_M_MID as usize;
    let partial_bytes = (plan.splits as usize * rows * n * F32_BYTES) as f64;
    let bw = if partial_bytes <= PARTIAL_L2_BYTES {
        PARTIAL_BW_L2
    } else {
        PARTIAL_BW_HBM
    };
    // Written by the tiled kernel, read by the reduction.
    gemm + SPLIT_REDUCE_LAUNCH_US + 2.0 * partial_bytes / bw * 1e6
}

/// Predicted time of the chunked GEMV path ([`MatmulKernel::GemvChunked`](super::MatmulKernel::GemvChunked)),
/// µs: one launch per `MATMUL_GEMV_MAX_ROWS` rows, each bound by its warps'
/// serial walk over `k` or by streaming the weights from memory.
pub fn predict_gemv_chunked_us(shape: MatmulShape) -> f64 {
    let MatmulShape { m, n, k } = shape;
    let chunks = m.div_ceil(MATMUL_GEMV_MAX_ROWS as usize);
    let walk = k.div_ceil(GEMV_STEP_FLOATS) as f64 * GEMV_STEP_US;
    let stream = (n * k * F32_BYTES) as f64 / PARTIAL_BW_HBM * 1e6;
    chunks as f64 * (GEMV_LAUNCH_US + walk.max(stream))
}

/// How the small-M kernel runs: `splits` blocks per 64x64 output tile
/// (grid z), each covering `k_chunk` of `k` (the last one the rest). With
/// `splits > 1` the partial tiles go through a [`MatmulWorkspace`](super::MatmulWorkspace) and the
/// last block of each tile sums them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmallPlan {
    pub splits: u32,
    pub k_chunk: u32,
}

impl SmallPlan {
    /// One split: every block covers all of `k` (no workspace).
    pub fn unsplit(k: usize) -> Self {
        SmallPlan {
            splits: 1,
            k_chunk: k as u32,
        }
    }

    /// At most `splits` splits of `k`, each a multiple of
    /// `MATMUL_SMALL_TILE_K` deep, none empty: the count may come out lower
    /// than asked.
    pub fn split(k: usize, splits: usize) -> Self {
        match split_depth(k, splits, MATMUL_SMALL_TILE_K as usize) {
            Some((splits, k_chunk)) => SmallPlan { splits, k_chunk },
            None => Self::unsplit(k),
        }
    }

    /// Output tiles of an `m x n` output.
    pub fn tiles(shape: MatmulShape) -> usize {
        let MatmulShape { m, n, .. } = shape;
        m.div_ceil(MATMUL_SMALL_TILE_M as usize) * n.div_ceil(MATMUL_SMALL_TILE_N as usize)
    }

    /// Blocks of the launch.
    pub fn blocks(&self, shape: MatmulShape) -> usize {
        Self::tiles(shape) * self.splits.max(1) as usize
    }

    /// Floats of workspace the plan needs (partial tiles; 0 unsplit).
    pub fn workspace_floats(&self, shape: MatmulShape) -> usize {
        if self.splits > 1 {
            self.blocks(shape) * MATMUL_SMALL_PARTIAL_FLOATS as usize
        } else {
            0
        }
    }
}

/// Predicted time of the small-M kernel under `plan`, µs: the busiest SM's
/// blocks (spread breadth-first while the grid fits the resident slots, else
/// full waves) times their k-slices, plus the last blocks' sum.
pub fn predict_small_us(plan: &SmallPlan, shape: MatmulShape, sms: usize) -> f64 {
    let k = shape.k;
    let resident = MATMUL_SMALL_BLOCKS_PER_SM as usize;
    let sms = sms.max(1);
    let blocks = plan.blocks(shape);
    let slices = (plan.k_chunk as usize).min(k).div_ceil(MATMUL_SMALL_TILE_K as usize);
    let per_sm = if blocks <= sms * resident {
        blocks.div_ceil(sms)
    } else {
        blocks.div_ceil(sms * resident) * resident
    };
    let together = per_sm.clamp(1, resident) as f64;
    let slice_us = SMALL_US_PER_SLICE * (1.0 - SMALL_RESIDENT_GAIN * (together - 1.0));
    let fixup = if plan.splits > 1 {
        SMALL_FIXUP_US + SMALL_FIXUP_US_PER_SPLIT * plan.splits as f64
    } else {
        0.0
    };
    (per_sm * slices) as f64 * slice_us + fixup
}

/// The fastest small-M plan by [`predict_small_us`] whose partials fit
/// `workspace_floats` (0: unsplit only). Ties keep fewer splits.
pub fn plan_small(shape: MatmulShape, sms: usize, workspace_floats: usize) -> SmallPlan {
    let k = shape.k;
    let mut best = SmallPlan::unsplit(k);
    let mut best_us = predict_small_us(&best, shape, sms);
    let slots = sms.max(1) * MATMUL_SMALL_BLOCKS_PER_SM as usize;
    for (splits, k_chunk) in split_candidates(k, MATMUL_SMALL_TILE_K as usize, SMALL_MIN_SPLIT_DEPTH) {
        let plan = SmallPlan { splits, k_chunk };
        if plan.blocks(shape) > SMALL_MAX_SPLIT_WAVES * slots || plan.workspace_floats(shape) > workspace_floats {
            continue;
        }
        let us = predict_small_us(&plan, shape, sms);
        if us < best_us {
            (best, best_us) = (plan, us);
        }
    }
    best
}

/// What [`MatmulKernel::Auto`](super::MatmulKernel::Auto) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoPlan {
    Gemv,
    GemvChunked,
    Small(SmallPlan),
    Tiled(TiledPlan),
}

/// The rule of [`MatmulKernel::Auto`](super::MatmulKernel::Auto) (with a split-K workspace of
/// `workspace_floats`): GEMV for `m <= MATMUL_GEMV_MAX_ROWS` (decode: the
/// weights are streamed once, nothing else comes close); otherwise the
/// tiled plan ([`plan_tiled`], split-K within the workspace), unless
/// chunked GEMV (`m <= FP32_CHUNKED_GEMV_MAX_ROWS`) is predicted faster;
/// then, for `m <= SMALL_MAX_ROWS`, the small-M kernel ([`plan_small`])
/// where it is predicted faster than that tiled plan. Ties keep the tiled
/// plan.
pub fn plan_auto(shape: MatmulShape, sms: usize, workspace_floats: usize) -> AutoPlan {
    let m = shape.m;
    if m <= MATMUL_GEMV_MAX_ROWS as usize {
        return AutoPlan::Gemv;
    }
    let tiled = plan_tiled(shape, sms, workspace_floats);
    let tiled_us = predict_tiled_us(&tiled, shape, sms);
    // Chunked GEMV against the tiled plan in the wave model's own units (as
    // calibrated together), then the small-M kernel against the winner.
    let mut best = AutoPlan::Tiled(tiled);
    if m <= FP32_CHUNKED_GEMV_MAX_ROWS && predict_gemv_chunked_us(shape) < tiled_us {
        best = AutoPlan::GemvChunked;
    }
    if m <= SMALL_MAX_ROWS && best == AutoPlan::Tiled(tiled) {
        let small = plan_small(shape, sms, workspace_floats);
        if predict_small_us(&small, shape, sms) < tiled_us + TILED_SMALL_N_MISSING_US {
            best = AutoPlan::Small(small);
        }
    }
    best
}

/// The fastest tiled plan by [`predict_tiled_us`] for an `m x n` output
/// over depth `k` on `sms` SMs, among both tiles unsplit and split-K plans
/// whose partials fit `workspace_floats` (0: no split-K). Splits are at least
/// `MIN_SPLIT_DEPTH` deep, at most `MAX_SPLITS`, and the grid at most
/// `MAX_SPLIT_WAVES` waves. Ties keep the earlier candidate (large tile,
/// fewer splits).
pub fn plan_tiled(shape: MatmulShape, sms: usize, workspace_floats: usize) -> TiledPlan {
    let k = shape.k;
    let mut best = TiledPlan::unsplit(MATMUL_TILE_M, k);
    let mut best_us = predict_tiled_us(&best, shape, sms);
    for tile_m in [MATMUL_TILE_M, MATMUL_TILE_M_MID] {
        let mut consider = |plan: TiledPlan| {
            let us = predict_tiled_us(&plan, shape, sms);
            if us < best_us {
                (best, best_us) = (plan, us);
            }
        };
        consider(TiledPlan::unsplit(tile_m, k));
        let slots = sms.max(1) * TiledPlan::unsplit(tile_m, k).kernel().2 as usize;
        for (splits, k_chunk) in split_candidates(k, MATMUL_TILE_K as usize, MIN_SPLIT_DEPTH) {
            let plan = TiledPlan {
                tile_m,
                splits,
                k_chunk,
            };
            if plan.blocks(shape) > MAX_SPLIT_WAVES * slots || plan.workspace_floats(shape) > workspace_floats {
                continue;
            }
            consider(plan);
        }
    }
    best
}
