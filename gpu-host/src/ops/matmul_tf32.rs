//! `matmul_forward_tf32`: the matmul of `cpu::ops::matmul_forward` on the
//! TF32 tensor cores, with an optional fused GELU (for the MLP up-projection).
//!
//! Several tile shapes are compiled: `mma.sync` ones in every module
//! (`MATMUL_TF32_VARIANTS`) and, in the sm_90a module a Hopper GPU loads,
//! `wgmma` ones (`MATMUL_TF32_WGMMA_VARIANTS`). [`choose_tile`] picks one
//! per GEMM shape, [`matmul_forward_tf32_with`] runs a given one (the `tune`
//! and `bench` binaries sweep [`tf32_variants`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::matmul::MatmulSplitReduceParams;
use gpu_kernels::params::matmul_tf32::{
    MATMUL_3XTF32_VARIANTS, MATMUL_3XTF32_WGMMA_VARIANTS, MATMUL_TF32_BK, MATMUL_TF32_VARIANTS,
    MATMUL_TF32_WGMMA_VARIANTS, MatmulTf32Params, MatmulTf32WgmmaParams, TileEngine, TileShape, WGMMA_M,
};

use crate::MatmulShape;
use crate::ops::matmul::launch_split_reduce;
use crate::runtime::{Gpu, GpuError, TensorElem};

/// Floats per 16-byte `cp.async` copy: rows of `inp` and `W` are copied in
/// such chunks, so `c` must be a multiple of it.
pub const TF32_C_MULTIPLE: usize = 4;
/// Byte alignment `cp.async` needs of the `inp` and `W` base addresses.
const CP_ASYNC_ALIGN: u64 = 16;
/// Why a TF32 matmul could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum MatmulTf32Error {
    #[error("matmul_forward_tf32 needs k % {TF32_C_MULTIPLE} == 0 (got k = {0}); use the FP32 matmul_forward")]
    BadC(usize),
    #[error("matmul_forward_tf32: buffer `{0}` holds {1} floats, {2} needed")]
    TooSmall(&'static str, usize, usize),
    #[error("matmul_forward_tf32: buffer `{0}` is not 16-byte aligned (cp.async needs it)")]
    Misaligned(&'static str),
    #[error("matmul_forward_tf32: m * max(k, n) = {0} does not fit the kernel's 32-bit sizes")]
    TooLarge(usize),
    #[error("matmul_forward_tf32: tile {0} needs the sm_90a (wgmma) kernels, which this GPU's module lacks")]
    NoWgmma(&'static str),
    #[error("matmul_forward_fp32_tc: {0} is not a 3xTF32 tile")]
    NotFp32Tc(&'static str),
    #[error("matmul_forward_fp32_tc_partials: GELU cannot be applied to partial sums")]
    GeluInParts,
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Blocks a launch of `tile` needs for an `m x n` output.
pub fn tf32_blocks(tile: &TileShape, shape: MatmulShape) -> usize {
    let MatmulShape { m, n, .. } = shape;
    m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize)
}

/// Relative cost of one block of `tile`: its output elements times the
/// shared-memory words its warps read per output element and k step,
/// `(wm + wn) / (wm · wn)` (the inner loop is bound by shared-memory
/// traffic, so bigger warp tiles are cheaper per element). A `wgmma` tile
/// that leaves an SM fewer than [`WGMMA_BUSY_WARPGROUPS`] consumer
/// warpgroups costs proportionally more: one warpgroup alone waits on its
/// own stages and conversions with the tensor cores idle (the 3xTF32
/// 64x128 tile, one block an SM, measured at 0.7x the 128x128's rate at
/// M = 8192). In units of 1/`(wm · wn)`, kept integral.
fn block_cost(tile: &TileShape) -> u64 {
    let (bm, bn, wm, wn) = (tile.bm as u64, tile.bn as u64, tile.wm as u64, tile.wn as u64);
    // Common denominator of every variant's wm·wn (powers of two up to
    // 64·256, times 3 at most), so the integer division is exact.
    const DENOM: u64 = 64 * 256 * 3;
    let base = bm * bn * (wm + wn) * DENOM / (wm * wn);
    if tile.engine != TileEngine::Wgmma {
        return base;
    }
    let per_sm = (tile.bm / WGMMA_M * tile.blocks_per_sm).clamp(1, WGMMA_BUSY_WARPGROUPS) as u64;
    base * WGMMA_BUSY_WARPGROUPS as u64 / per_sm
}

/// Consumer warpgroups an SM needs resident to keep its tensor cores busy
/// (one issues while the other waits): the tile chooser charges a `wgmma` tile that
/// leaves fewer resident per SM proportionally more per block.
pub const WGMMA_BUSY_WARPGROUPS: u32 = 2;

/// Predicted time of an `m x n` GEMM with `tile` on `sms` SMs, in the
/// units of `block_cost`: the busiest SM holds `ceil(blocks / sms)`
/// blocks, runs them `blocks_per_sm` at a time, and a round of
/// `blocks_per_sm` blocks takes as long whether or not it is full (a lone
/// block gets about its share of the SM, not all of it).
pub fn predicted_cost(tile: &TileShape, shape: MatmulShape, sms: usize) -> u64 {
    let per_sm = tf32_blocks(tile, shape).div_ceil(sms.max(1)) as u64;
    let bps = tile.blocks_per_sm.max(1) as u64;
    per_sm.div_ceil(bps) * bps * block_cost(tile)
}

/// Part of a block's cost that a persistent block (one an SM, looping over
/// tiles) hides on each tile after its first, as `1 / this`: the producer
/// loads the next tile's operands while the consumers store the last. Fit
/// to the bf16 128x192 twin on an H200 at M = 8192 against its one-tile
/// blocks: 13 % faster at 2 tiles an SM (N = 768), 17-18 % at 6 and 8
/// (N = 2304, 3072); a fifth a tile predicts 10 %, 17 % and 18 %.
pub const PERSISTENT_TILE_SAVING_DIV: u64 = 5;

/// [`predicted_cost`] of `tile` run persistent (its twin: one block an SM,
/// `blocks_per_sm` 1): the busiest SM's `ceil(tiles / sms)` tiles, each
/// after the first cheaper by [`PERSISTENT_TILE_SAVING_DIV`]. Equal to the
/// one-tile cost when every SM has at most one tile.
pub fn persistent_predicted_cost(tile: &TileShape, shape: MatmulShape, sms: usize) -> u64 {
    let per_sm = tf32_blocks(tile, shape).div_ceil(sms.max(1)) as u64;
    let cost = block_cost(tile);
    per_sm * cost - per_sm.saturating_sub(1) * (cost / PERSISTENT_TILE_SAVING_DIV)
}

/// Every tile shape the loaded module has: the `mma.sync` ones, plus the
/// `wgmma` ones when `wgmma` (the sm_90a module, see `Gpu::has_wgmma`).
pub fn tf32_variants(wgmma: bool) -> Vec<TileShape> {
    let mut v = MATMUL_TF32_VARIANTS.to_vec();
    if wgmma {
        v.extend(MATMUL_TF32_WGMMA_VARIANTS);
    }
    v
}

/// The tile with the least [`predicted_cost`] (wave quantisation and
/// inner-loop efficiency together); on a tie, the one that keeps more blocks
/// running at once (more SMs busy, more bandwidth for small M), then the
/// smaller tile (less work on zero-filled edge rows). With `wgmma`, only the
/// `wgmma` tiles compete (the cost model compares tiles of one engine).
pub fn choose_tile(shape: MatmulShape, sms: usize, wgmma: bool) -> TileShape {
    let key = |s: &TileShape| {
        let running = tf32_blocks(s, shape).min(sms * s.blocks_per_sm as usize);
        (predicted_cost(s, shape, sms), std::cmp::Reverse(running), s.bm * s.bn)
    };
    let candidates: &[TileShape] = if wgmma {
        &MATMUL_TF32_WGMMA_VARIANTS
    } else {
        &MATMUL_TF32_VARIANTS
    };
    candidates
        .iter()
        .copied()
        .min_by_key(key)
        .expect("variant lists are not empty")
}

/// `out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n])`, then GELU if
/// `gelu`, in TF32 with f32 accumulation; the tile shape is chosen for the
/// GEMM's size. `k` must be a multiple of 4.
///
/// Rounding: `inp` is rounded to TF32 (to nearest) by every kernel. `weight`
/// must already be TF32-rounded (`convert::round_tf32`, once per weight: the
/// engine does it at load) for the same accuracy on a Hopper GPU, whose
/// `wgmma` kernels use it as given and so truncate unrounded weights; the
/// `mma.sync` kernels round it either way.
pub fn matmul_forward_tf32<O, I, W, B>(
    gpu: &Gpu,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
    gelu: bool,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let opts = Tf32TileOptions {
        gelu,
        ..Tf32TileOptions::new(auto_tile(gpu, shape))
    };
    matmul_forward_tf32_with(gpu, opts, out, inp, weight, bias, shape)
}

/// How [`matmul_forward_tf32_opts`] runs beyond the defaults of
/// [`matmul_forward_tf32`].
#[derive(Default)]
pub struct Tf32Options<'a> {
    /// Apply GELU after the bias.
    pub gelu: bool,
    /// `inp` was rounded to TF32 by its producer (`layernorm_forward_tf32`,
    /// or a TF32 matmul with `round_out`): the `wgmma` kernels skip their
    /// rounding pass.
    /// An unrounded `inp` here is truncated to TF32 instead of rounded (an
    /// accuracy loss, nothing worse).
    pub inp_rounded: bool,
    /// Round the results (after bias and GELU) to TF32 (`wgmma` tiles; the
    /// `mma.sync` ones ignore it): they feed another TF32 matmul, which can
    /// then be told `inp_rounded`. Disables split-K.
    pub round_out: bool,
    /// Scratch for split-K partial sums: when the output has too few tiles
    /// to fill the GPU and `k` is deep, a `wgmma` tile splits `k` (see
    /// [`tf32_splits`]) if `splits * m * n` floats fit here.
    pub split_workspace: Option<&'a mut CudaSlice<f32>>,
}

/// [`matmul_forward_tf32`] with [`Tf32Options`] (the engine's entry).
pub fn matmul_forward_tf32_opts<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32Options,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let tile = auto_tile(gpu, shape);
    let splits = tf32_splits(&tile, shape, gpu.sm_count());
    match opts.split_workspace {
        Some(ws) if splits > 1 && !opts.round_out && ws.len() >= splits * shape.out_len() => {
            let opts = Tf32TileOptions {
                tile,
                splits,
                gelu: opts.gelu,
                inp_rounded: opts.inp_rounded,
                split_workspace: Some(ws),
            };
            matmul_forward_tf32_with(gpu, opts, out, inp, weight, bias, shape)
        }
        _ => {
            let how = Launch {
                tile,
                gelu: opts.gelu,
                inp_rounded: opts.inp_rounded,
                split: None,
                round_out: opts.round_out,
            };
            launch(gpu, how, out, inp, weight, bias, shape)
        }
    }
}

/// Fewest k-tiles (`MATMUL_TF32_BK` deep) a split-K part should have: less
/// and the partial sums' traffic outweighs the gain.
pub const TF32_MIN_KTILES_PER_SPLIT: usize = 16;
/// Most parts split-K cuts `k` into.
pub const TF32_MAX_SPLITS: usize = 4;

/// Split-K parts for a `wgmma` tile: enough to bring an output of fewer
/// tiles than one wave of resident blocks up to about one wave, within
/// [`TF32_MAX_SPLITS`] and [`TF32_MIN_KTILES_PER_SPLIT`]; 1 (no split) for
/// `mma.sync` tiles and outputs that fill the GPU.
pub fn tf32_splits(tile: &TileShape, shape: MatmulShape, sms: usize) -> usize {
    if tile.engine != TileEngine::Wgmma {
        return 1;
    }
    let blocks = tf32_blocks(tile, shape).max(1);
    let wave = sms * tile.blocks_per_sm as usize;
    let ktiles = shape.k.div_ceil(MATMUL_TF32_BK as usize);
    (wave / blocks)
        .min(ktiles / TF32_MIN_KTILES_PER_SPLIT)
        .clamp(1, TF32_MAX_SPLITS)
}

/// An explicit TF32 or 3xTF32 kernel and how it runs: what
/// [`matmul_forward_tf32_with`] and [`matmul_forward_fp32_tc_with`] take (the
/// `tune` and `bench` sweeps, the tests), where [`Tf32Options`] leaves the
/// tile and the split to the planner.
pub struct Tf32TileOptions<'a> {
    /// The tile shape: one of `MATMUL_TF32_VARIANTS` or
    /// `MATMUL_TF32_WGMMA_VARIANTS` (TF32), of [`fp32_tc_variants`]
    /// (3xTF32).
    pub tile: TileShape,
    /// Parts `k` is split into (1: none); more need `split_workspace`.
    pub splits: usize,
    /// Apply GELU after the bias.
    pub gelu: bool,
    /// As [`Tf32Options::inp_rounded`] (TF32 tiles only: 3xTF32 reads plain
    /// f32).
    pub inp_rounded: bool,
    /// Scratch for the partial sums of a split: `splits * m * n` floats.
    pub split_workspace: Option<&'a mut CudaSlice<f32>>,
}

impl Tf32TileOptions<'_> {
    /// `tile` unsplit, no GELU, `inp` not rounded.
    pub fn new(tile: TileShape) -> Self {
        Tf32TileOptions {
            tile,
            splits: 1,
            gelu: false,
            inp_rounded: false,
            split_workspace: None,
        }
    }
}

/// [`matmul_forward_tf32`] with an explicit tile and split count. Split over
/// `k` in `splits` parts: partial sums into the split workspace (`splits *
/// m * n` floats), then `matmul_split_reduce` adds them in order, with the
/// bias and GELU.
pub fn matmul_forward_tf32_with<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32TileOptions,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    run_tile(gpu, opts, out, inp, weight, bias, shape, SplitEnd::Reduce).map(|_| ())
}

/// What a split launch leaves: the reduced output, or the parts alone.
#[derive(Clone, Copy, PartialEq)]
enum SplitEnd {
    /// `matmul_split_reduce` adds the parts into `out` (with bias and GELU).
    Reduce,
    /// The partial sums stay in the split workspace for the consumer.
    Parts,
}

/// [`matmul_forward_tf32_with`], or with [`SplitEnd::Parts`] its first launch
/// alone when it splits. Returns the parts `k` was split into (1: `out`
/// holds the finished result).
#[allow(clippy::too_many_arguments)]
fn run_tile<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32TileOptions,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
    end: SplitEnd,
) -> Result<usize, MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let Tf32TileOptions {
        tile,
        splits,
        gelu,
        inp_rounded,
        split_workspace,
    } = opts;
    let ktiles = shape.k.div_ceil(MATMUL_TF32_BK as usize);
    let per_split = ktiles.div_ceil(splits.max(1)).max(1);
    let splits = ktiles.div_ceil(per_split).max(1);
    let how = Launch {
        tile,
        gelu,
        inp_rounded,
        split: None,
        round_out: false,
    };
    if splits == 1 {
        return launch(gpu, how, out, inp, weight, bias, shape).map(|_| 1);
    }
    let MatmulShape { m, n, .. } = shape;
    let have = split_workspace.as_ref().map_or(0, |w| w.len());
    let Some(workspace) = split_workspace.filter(|w| w.len() >= splits * m * n) else {
        return Err(MatmulTf32Error::TooSmall("split workspace", have, splits * m * n));
    };
    check_buffers(out.len(), inp, weight, bias, shape)?;
    let partials = Launch {
        gelu: false,
        split: Some((splits, per_split)),
        ..how
    };
    launch(gpu, partials, workspace, inp, weight, None::<&B>, shape)?;
    if end == SplitEnd::Parts {
        return Ok(splits);
    }
    let stream = gpu.stream.clone();
    let (ws_p, _g1) = workspace.device_ptr(&stream);
    let (out_p, _g2) = out.device_ptr_mut(&stream);
    let bias_p = bias.map(|b| b.device_ptr(&stream));
    let params = MatmulSplitReduceParams {
        out: out_p as *mut f32,
        partial: ws_p as *const f32,
        bias: bias_p.as_ref().map_or(std::ptr::null(), |(p, _)| *p as *const f32),
        n: m as u32,
        oc: n as u32,
        splits: splits as u32,
        gelu: gelu as u32,
    };
    // SAFETY: `out` holds m*n floats and `bias` n, m*n fits u32 (checked
    // above); the workspace holds the splits*m*n partials the launch above
    // wrote (same stream).
    unsafe { launch_split_reduce(gpu, params)? };
    Ok(splits)
}

/// Fewest k-tiles a 3xTF32 split-K part should have: the partial sums'
/// round trip costs about as much as this many k-tiles of 3xTF32 work.
pub const FP32_TC_MIN_KTILES_PER_SPLIT: usize = 4;
/// Most parts a 3xTF32 matmul cuts `k` into.
pub const FP32_TC_MAX_SPLITS: usize = 8;

/// Every 3xTF32 tile shape the loaded module has: the `mma.sync` ones, or
/// with `wgmma` (the sm_90a module) the `wgmma` ones too.
pub fn fp32_tc_variants(wgmma: bool) -> Vec<TileShape> {
    let mut v = MATMUL_3XTF32_VARIANTS.to_vec();
    if wgmma {
        v.extend(MATMUL_3XTF32_WGMMA_VARIANTS);
    }
    v
}

/// Environment variable that keeps the planned 3xTF32 matmuls off the
/// `wgmma` tiles when set to `1` (the `mma.sync` ones then run, as on a GPU
/// without the sm_90a module): for same-process comparisons.
pub const FP32_TC_NO_WGMMA_ENV: &str = "GPT2_FP32_TC_NO_WGMMA";

/// Whether [`fp32_tc_planned`] plans on the `wgmma` tiles: the sm_90a
/// module is loaded and [`FP32_TC_NO_WGMMA_ENV`] is not `1` (read once).
pub fn fp32_tc_uses_wgmma(gpu: &Gpu) -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var_os(FP32_TC_NO_WGMMA_ENV).is_some_and(|v| v == "1"));
    gpu.has_wgmma() && !off
}

/// Fewest rows a 3xTF32 matmul takes the `wgmma` tiles for: their 64-row
/// tiles do all 64 rows' tensor work, so fewer rows run faster on the
/// `mma.sync` 32-row tiles (measured: the server's steps of 9-32 rows 7 %
/// faster there, of 64 rows 3-8 % slower, 128 rows 17 % slower).
pub const FP32_TC_WGMMA_MIN_ROWS: usize = 33;

/// The 3xTF32 tile and split-K parts for an `m x n` output of depth `k`:
/// the tile of least [`predicted_cost`] among one engine's tiles (the
/// `wgmma` ones where `wgmma` and `m` has at least
/// [`FP32_TC_WGMMA_MIN_ROWS`] rows, else the `mma.sync` ones); then, where its
/// blocks fill less than a wave of resident blocks, enough parts to bring
/// them to about one (each at least [`FP32_TC_MIN_KTILES_PER_SPLIT`]
/// k-tiles), as many as `workspace_floats` holds partial outputs of.
pub fn fp32_tc_plan(shape: MatmulShape, sms: usize, workspace_floats: usize, wgmma: bool) -> (TileShape, usize) {
    let wgmma = wgmma && shape.m >= FP32_TC_WGMMA_MIN_ROWS;
    let key = |s: &TileShape| {
        let running = tf32_blocks(s, shape).min(sms * s.blocks_per_sm as usize);
        (predicted_cost(s, shape, sms), std::cmp::Reverse(running), s.bm * s.bn)
    };
    let candidates: &[TileShape] = if wgmma {
        &MATMUL_3XTF32_WGMMA_VARIANTS
    } else {
        &MATMUL_3XTF32_VARIANTS
    };
    let tile = candidates
        .iter()
        .copied()
        .min_by_key(key)
        .expect("variant lists are not empty");
    let rule = SplitRule {
        k_tile: MATMUL_TF32_BK as usize,
        min_ktiles: FP32_TC_MIN_KTILES_PER_SPLIT,
        max_splits: FP32_TC_MAX_SPLITS,
    };
    (tile, rule.splits(&tile, shape, sms, workspace_floats))
}

/// How a plan splits `k` where a matmul's tiles leave the GPU idle: the
/// 3xTF32 plan's rule, which the bf16 `wgmma` plan shares.
#[derive(Clone, Copy, Debug)]
pub struct SplitRule {
    /// Depth of a k-tile.
    pub k_tile: usize,
    /// Fewest k-tiles a split takes.
    pub min_ktiles: usize,
    /// Most splits.
    pub max_splits: usize,
}

impl SplitRule {
    /// Splits for `tile` on `shape`: enough to fill the GPU's block slots
    /// (`sms` times the tile's blocks an SM) about once, each at least
    /// `min_ktiles` deep, at most `max_splits`, and the parts (one `m x n`
    /// output each) within `workspace_floats`; 1 where any of those allows
    /// no split.
    pub fn splits(self, tile: &TileShape, shape: MatmulShape, sms: usize, workspace_floats: usize) -> usize {
        let blocks = tf32_blocks(tile, shape).max(1);
        let slots = sms * tile.blocks_per_sm as usize;
        let ktiles = shape.k.div_ceil(self.k_tile);
        let fit = workspace_floats / shape.out_len().max(1);
        (slots / blocks)
            .min(ktiles / self.min_ktiles)
            .min(fit)
            .clamp(1, self.max_splits)
    }
}

/// `out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n])` at FP32's accuracy
/// on the TF32 tensor cores: each product as three TF32 products of the
/// operands' big and small halves (3xTF32; the dropped small·small term is
/// ~2^-22 of the product). Inputs and weights are plain f32 (no rounded
/// copies). Split over `k` ([`fp32_tc_plan`]) where the output has too few
/// tiles to fill the GPU, the partial sums in `workspace`. `k` must be a
/// multiple of 4. Twin of `cpu::ops::matmul_forward`; for the GELU epilogue,
/// [`fp32_tc_planned`] and [`matmul_forward_fp32_tc_with`].
pub fn matmul_forward_fp32_tc<O, I, W, B>(
    gpu: &Gpu,
    workspace: Option<&mut CudaSlice<f32>>,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let opts = fp32_tc_planned(gpu, workspace, shape);
    matmul_forward_fp32_tc_with(gpu, opts, out, inp, weight, bias, shape)
}

/// The options [`matmul_forward_fp32_tc`] runs an `m x n x k` matmul with:
/// [`fp32_tc_plan`]'s tile and splits within `workspace`, no GELU (set
/// `gelu` on the result for the epilogue, then call
/// [`matmul_forward_fp32_tc_with`]).
pub fn fp32_tc_planned<'a>(
    gpu: &Gpu,
    workspace: Option<&'a mut CudaSlice<f32>>,
    shape: MatmulShape,
) -> Tf32TileOptions<'a> {
    let floats = workspace.as_ref().map_or(0, |w| w.len());
    let (tile, splits) = fp32_tc_plan(shape, gpu.sm_count(), floats, fp32_tc_uses_wgmma(gpu));
    Tf32TileOptions {
        splits,
        split_workspace: workspace,
        ..Tf32TileOptions::new(tile)
    }
}

/// [`matmul_forward_fp32_tc`] with an explicit 3xTF32 tile (one of
/// [`fp32_tc_variants`]), split count (1: none; more needs a split
/// workspace of `splits * m * n` floats, and without one runs unsplit) and
/// GELU, for the bench's sweeps. `inp_rounded` is ignored.
pub fn matmul_forward_fp32_tc_with<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32TileOptions,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    run_fp32_tc(gpu, opts, out, inp, weight, bias, shape, SplitEnd::Reduce).map(|_| ())
}

/// [`matmul_forward_fp32_tc_with`] up to the partial sums where `opts`
/// splits `k`: they stay in the split workspace (`splits` slices of `m * n`
/// floats, no bias) for the consumer to add up in order, with the bias
/// (`layernorm::residual_layernorm_split_forward`), and no
/// `matmul_split_reduce` runs. Returns the parts: 1 means unsplit, and
/// `out` then holds the whole result, bias included. GELU is refused where
/// the parts are left (the consumer would have to apply it).
pub fn matmul_forward_fp32_tc_partials<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32TileOptions,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<usize, MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    if opts.gelu {
        return Err(MatmulTf32Error::GeluInParts);
    }
    run_fp32_tc(gpu, opts, out, inp, weight, bias, shape, SplitEnd::Parts)
}

/// The 3xTF32 calls' common part: the tile must be a 3xTF32 one, and
/// without a workspace the call runs unsplit.
#[allow(clippy::too_many_arguments)]
fn run_fp32_tc<O, I, W, B>(
    gpu: &Gpu,
    opts: Tf32TileOptions,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
    end: SplitEnd,
) -> Result<usize, MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let mut fp32_tc = MATMUL_3XTF32_VARIANTS.iter().chain(&MATMUL_3XTF32_WGMMA_VARIANTS);
    if !fp32_tc.any(|v| v.name == opts.tile.name) {
        return Err(MatmulTf32Error::NotFp32Tc(opts.tile.name));
    }
    let opts = Tf32TileOptions {
        splits: if opts.split_workspace.is_some() { opts.splits } else { 1 },
        inp_rounded: false,
        ..opts
    };
    run_tile(gpu, opts, out, inp, weight, bias, shape, end)
}

/// The size checks of every TF32 launch (`out_len`: floats of one output).
fn check_buffers<I, W, B>(
    out_len: usize,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let MatmulShape { m, n, k } = shape;
    let check = |what, have: usize, need: usize| {
        if have < need {
            Err(MatmulTf32Error::TooSmall(what, have, need))
        } else {
            Ok(())
        }
    };
    check("out", out_len, m * n)?;
    check("inp", inp.len(), m * k)?;
    check("weight", weight.len(), n * k)?;
    if let Some(b) = bias {
        check("bias", b.len(), n)?;
    }
    let biggest = m.max(n) * k.max(n).max(1);
    if u32::try_from(m).is_err()
        || u32::try_from(n).is_err()
        || u32::try_from(k).is_err()
        || biggest > u32::MAX as usize
    {
        return Err(MatmulTf32Error::TooLarge(biggest));
    }
    Ok(())
}

/// The tile for an `m x n` output with inner size `k`: the tune cache's
/// if it has one for this GPU (a wgmma tile only where the sm_90a module is
/// loaded), else [`choose_tile`]'s.
fn auto_tile(gpu: &Gpu, shape: MatmulShape) -> TileShape {
    let tuned = tune_cache(gpu)
        .and_then(|t| t.tile(shape))
        .filter(|s| s.engine == TileEngine::MmaSync || gpu.has_wgmma());
    tuned.unwrap_or_else(|| choose_tile(shape, gpu.sm_count(), gpu.has_wgmma()))
}

/// Environment variable naming a tune cache (the JSON the `tune` binary writes).
pub const TUNE_CACHE_ENV: &str = "GPT2_TUNE_CACHE";
/// The user's tune caches, under the cache directory (`$XDG_CACHE_HOME`, else
/// `$HOME/.cache`): `gpt2/tune/<device>.json`, where `tune` writes by default.
pub const TUNE_CACHE_SUBDIR: &str = "gpt2/tune";

/// The sweeps committed with this crate (`tune/`), embedded so a program
/// finds them from any directory: (file stem of the GPU's name, JSON).
const EMBEDDED_TUNE_CACHES: &[(&str, &str)] = &[
    (
        "nvidia-h100-80gb-hbm3",
        include_str!("../../tune/nvidia-h100-80gb-hbm3.json"),
    ),
    ("nvidia-h200", include_str!("../../tune/nvidia-h200.json")),
];

/// Measured best tile per GEMM shape for one GPU model: `tune`'s output.
#[derive(Debug, Clone)]
pub struct TuneCache {
    /// The GPU the sweep ran on; the cache applies only to the same model.
    pub device: String,
    tiles: HashMap<MatmulShape, TileShape>,
}

/// The part of `tune`'s JSON the engine reads (the timings beside it are
/// for people).
#[derive(serde::Deserialize)]
struct TuneFile {
    device: String,
    shapes: HashMap<String, TuneEntry>,
}

#[derive(serde::Deserialize)]
struct TuneEntry {
    best: String,
}

impl TuneCache {
    /// Parse `tune`'s JSON: `{"device": .., "shapes": {"M,N,K": {"best": "<kernel name>", ..}}}`.
    /// Unknown kernel names are an error (the cache is from another build).
    pub fn parse(json: &str) -> Result<TuneCache, String> {
        let doc: TuneFile = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let mut tiles = HashMap::new();
        for (key, entry) in &doc.shapes {
            let dims: Vec<usize> = key
                .split(',')
                .map(|d| d.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|_| format!("shape key {key:?} is not \"M,N,K\""))?;
            let [m, n, k] = dims[..] else {
                return Err(format!("shape key {key:?} is not \"M,N,K\""));
            };
            let best = &entry.best;
            let shape = MATMUL_TF32_VARIANTS
                .iter()
                .chain(&MATMUL_TF32_WGMMA_VARIANTS)
                .find(|v| v.name == best)
                .ok_or_else(|| format!("{key}: unknown kernel {best:?} (cache from another build?)"))?;
            tiles.insert(MatmulShape { m, n, k }, *shape);
        }
        Ok(TuneCache {
            device: doc.device,
            tiles,
        })
    }

    /// Read and parse a cache file.
    pub fn load(path: &Path) -> Result<TuneCache, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The tuned tile for `shape`, if swept.
    pub fn tile(&self, shape: MatmulShape) -> Option<TileShape> {
        self.tiles.get(&shape).copied()
    }

    /// A GPU's name as a file stem: lower case, spaces as dashes
    /// (`NVIDIA H200` -> `nvidia-h200`).
    pub fn file_stem(device: &str) -> String {
        device.to_lowercase().replace(' ', "-")
    }

    /// The user's cache file for a GPU (see [`TUNE_CACHE_SUBDIR`]); `None`
    /// when neither `XDG_CACHE_HOME` nor `HOME` is set.
    pub fn user_path(device: &str) -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(
            base.join(TUNE_CACHE_SUBDIR)
                .join(format!("{}.json", Self::file_stem(device))),
        )
    }

    /// The sweep committed with this crate for a GPU, if there is one.
    pub fn embedded(device: &str) -> Option<TuneCache> {
        let stem = Self::file_stem(device);
        let (_, json) = EMBEDDED_TUNE_CACHES.iter().find(|(s, _)| *s == stem)?;
        // The build's own kernels: a committed sweep that does not parse is
        // reported, not trusted.
        Self::parse(json)
            .map_err(|e| eprintln!("note: ignoring the embedded tune cache for {device}: {e}"))
            .ok()
    }
}

/// The tune cache for this process's GPU, read once: `$GPT2_TUNE_CACHE`, else
/// the user's ([`TuneCache::user_path`]) if it exists, else the one embedded
/// for this GPU model. A cache that cannot be read, or that was swept on
/// another GPU model, is reported once on stderr and ignored: the heuristic
/// [`choose_tile`] then decides, as without a cache.
fn tune_cache(gpu: &Gpu) -> Option<&'static TuneCache> {
    static CACHE: OnceLock<Option<TuneCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let device = gpu.name();
            let path = std::env::var_os(TUNE_CACHE_ENV)
                .map(PathBuf::from)
                .or_else(|| TuneCache::user_path(&device).filter(|p| p.is_file()));
            let Some(path) = path else {
                return TuneCache::embedded(&device);
            };
            match TuneCache::load(&path) {
                Ok(cache) if cache.device == device => Some(cache),
                Ok(cache) => {
                    eprintln!(
                        "note: ignoring tune cache {} (swept on {}, this GPU is {device})",
                        path.display(),
                        cache.device
                    );
                    None
                }
                Err(e) => {
                    eprintln!("note: ignoring tune cache: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// How [`launch`] runs one kernel: named, so its flags do not travel as a
/// row of positional `bool`s.
#[derive(Clone, Copy)]
struct Launch {
    tile: TileShape,
    gelu: bool,
    inp_rounded: bool,
    /// `(splits, k-tiles per split)`: `out` is then the workspace of
    /// `splits` partial outputs.
    split: Option<(usize, usize)>,
    round_out: bool,
}

fn launch<O, I, W, B>(
    gpu: &Gpu,
    how: Launch,
    out: &mut O,
    inp: &I,
    weight: &W,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), MatmulTf32Error>
where
    O: DevicePtrMut<f32>,
    I: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
{
    let Launch {
        tile,
        gelu,
        inp_rounded,
        split,
        round_out,
    } = how;
    let tile = &tile;
    let MatmulShape { m, n, k } = shape;
    if !k.is_multiple_of(TF32_C_MULTIPLE) {
        return Err(MatmulTf32Error::BadC(k));
    }
    if tile.engine == TileEngine::Wgmma && !gpu.has_wgmma() {
        return Err(MatmulTf32Error::NoWgmma(tile.name));
    }
    let (splits, per_split) = split.unwrap_or((1, 0));
    // Split: `out` is the workspace of `splits` partial outputs.
    check_buffers(out.len() / splits, inp, weight, bias, shape)?;
    let blocks = tf32_blocks(tile, shape);
    if blocks == 0 {
        return Ok(());
    }

    let stream = gpu.stream.clone();
    let (inp_p, _g1) = inp.device_ptr(&stream);
    let (w_p, _g2) = weight.device_ptr(&stream);
    let bias_p = bias.map(|b| b.device_ptr(&stream));
    let out_rows = out.len() / n.max(1);
    let (out_p, _g3) = out.device_ptr_mut(&stream);
    if inp_p % CP_ASYNC_ALIGN != 0 {
        return Err(MatmulTf32Error::Misaligned("inp"));
    }
    if w_p % CP_ASYNC_ALIGN != 0 {
        return Err(MatmulTf32Error::Misaligned("weight"));
    }
    // The epilogue's 16-byte stores (taken when n % 4 == 0) need it too.
    if out_p % CP_ASYNC_ALIGN != 0 {
        return Err(MatmulTf32Error::Misaligned("out"));
    }
    let bias_ptr = bias_p.as_ref().map_or(std::ptr::null(), |(p, _)| *p as *const f32);
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, splits as u32, 1),
        block_dim: (tile.threads(), 1, 1),
        shared_mem_bytes: tile.shared_bytes(),
    };
    gpu.set_max_dynamic_shared(tile.name, tile.shared_bytes())?;
    if tile.engine == TileEngine::Wgmma {
        // TMA boxes: MATMUL_TF32_BK columns (128 bytes) by the tile's rows.
        // The `inp` map spans the whole buffer (>= m rows, checked), not m
        // rows, so the engine's activation buffers get one map each whatever
        // the token count (no new upload, and no host wait, per new m). Rows
        // past m only feed output rows past m, which are never stored.
        let inp_rows = inp.len() / k.max(1);
        // Unsplit: the tiles below m go out through a map of `out` (all its
        // rows: one map per buffer, whatever m).
        let out_map = if splits == 1 {
            gpu.wgmma_out_map(TensorElem::F32, out_p, out_rows, n, tile.bm)?
        } else {
            std::ptr::null()
        };
        let params = MatmulTf32WgmmaParams {
            inp_map: gpu.tensor_map_2d(TensorElem::F32, inp_p, inp_rows, k, tile.bm, MATMUL_TF32_BK)?,
            weight_map: gpu.tensor_map_2d(TensorElem::F32, w_p, n, k, tile.bn, MATMUL_TF32_BK)?,
            out_map,
            out: out_p as *mut f32,
            bias: bias_ptr,
            n: m as u32,
            c: k as u32,
            oc: n as u32,
            gelu: gelu as u32,
            // 3xTF32 tiles read `inp` as it is (their big halves are its truncation).
            round_inp: (!inp_rounded && !tile.split_tf32) as u32,
            k_tiles_per_split: per_split as u32,
            round_out: round_out as u32,
        };
        // SAFETY: `tile.name` is the wgmma kernel compiled for `tile`
        // (present: the sm_90a module is loaded, checked above), whose
        // parameter type is MatmulTf32WgmmaParams; the maps describe `inp`
        // and `weight` with the sizes checked above and the boxes the kernel
        // was compiled with, and `out_map` (unsplit only) all of `out`'s rows
        // (>= m) with `WGMMA_OUT_BOX_BYTES` x `tile.bm` boxes; `out`/`bias` sizes checked, `out` 16-byte
        // aligned; grid, block and shared memory come from `tile`; with
        // `splits` grid rows `out` holds splits*m*n floats (checked).
        unsafe { gpu.launch(tile.name, cfg, params)? };
        return Ok(());
    }
    let params = MatmulTf32Params {
        out: out_p as *mut f32,
        inp: inp_p as *const f32,
        weight: w_p as *const f32,
        bias: bias_ptr,
        n: m as u32,
        c: k as u32,
        oc: n as u32,
        gelu: gelu as u32,
        k_tiles_per_split: per_split as u32,
    };
    // SAFETY: `tile.name` is the kernel compiled for `tile`, whose
    // parameter type is MatmulTf32Params (a wgmma one only when the sm_90a
    // module is loaded, checked above); the sizes of all four buffers were
    // checked above, inp/weight/out are 16-byte aligned and k % 4 == 0 (the
    // kernels' cp.async contract); grid, block and shared memory come from
    // the same TileShape the kernel was compiled with; with `splits` grid
    // rows `out` holds splits*m*n floats (checked).
    unsafe { gpu.launch(tile.name, cfg, params)? };
    Ok(())
}
