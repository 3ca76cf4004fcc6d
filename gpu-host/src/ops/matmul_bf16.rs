//! `matmul_forward_bf16`: the prefill matmul with bf16 weights, on the bf16
//! tensor cores (`mma.sync.m16n8k16`): `inp` (f32) is rounded to bf16 (to
//! nearest, ties to even) in the kernel, products are accumulated in f32,
//! then the bias and optionally GELU. CPU twin: `cpu::ops::matmul_forward_bf16`.
//!
//! Two tile shapes are compiled (`MATMUL_BF16_VARIANTS`); [`choose_tile`]
//! picks one per GEMM shape, [`matmul_forward_bf16_with`] runs a given one.
//!
//! On Hopper, [`matmul_forward_bf16_wgmma`]: `inp` already in bf16 (rounded
//! once by its producer), operands staged by TMA into `wgmma` tiles, the
//! result in f32 or bf16 ([`Bf16Out`]). Where the output has too few tiles
//! to fill the GPU and its reader adds split-K parts (the projections into
//! the residual stream), [`matmul_forward_bf16_wgmma_partials`] splits `k`
//! ([`bf16_wgmma_plan`]).

use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig};
use gpu_kernels::params::matmul_bf16::{
    Bf16TileShape, MATMUL_BF16_64X64, MATMUL_BF16_128X128, MATMUL_BF16_C_MULTIPLE, MATMUL_BF16_WGMMA_BK,
    MATMUL_BF16_WGMMA_VARIANTS, MatmulBf16Params, MatmulBf16WgmmaParams, QKV_CACHE_HEAD_SIZE, QkvCacheOut,
    bf16_wgmma_persistent_twin,
};
use gpu_kernels::params::matmul_tf32::{TileShape, WGMMA_M};

use super::args::{OpError, aligned16, check_len, count_u32, in_ptr, out_ptr, to_u32};
use super::matmul_tf32::{SplitRule, persistent_predicted_cost, predicted_cost, tf32_blocks};
use crate::runtime::TensorElem;
use crate::{Gpu, MatmulShape};

const OP: &str = "matmul_forward_bf16";

/// `k` must be a multiple of this (see `MATMUL_BF16_C_MULTIPLE`).
pub const BF16_C_MULTIPLE: usize = MATMUL_BF16_C_MULTIPLE as usize;

/// Blocks a launch of `tile` needs for an `m x n` output: one per tile.
pub fn bf16_blocks(tile: &Bf16TileShape, shape: MatmulShape) -> usize {
    let MatmulShape { m, n, .. } = shape;
    m.div_ceil(tile.bm as usize) * n.div_ceil(tile.bn as usize)
}

/// The tile for an `m x n` output on a GPU of `sms` multiprocessors:
/// 128x128 (the most tensor work per staged byte) when it gives every SM a
/// block at least, else 64x64, which makes four times the blocks, so a short
/// prompt still spreads over the whole GPU.
pub fn choose_tile(shape: MatmulShape, sms: usize) -> Bf16TileShape {
    if bf16_blocks(&MATMUL_BF16_128X128, shape) >= sms {
        MATMUL_BF16_128X128
    } else {
        MATMUL_BF16_64X64
    }
}

/// Launch configuration of `tile` for an `m x n` output: a 1-D grid of
/// one block per output tile (the kernel maps block index to tile, grouped
/// along M), the shape's threads and dynamic shared memory.
pub fn launch_config(tile: &Bf16TileShape, shape: MatmulShape) -> Result<LaunchConfig, OpError> {
    Ok(LaunchConfig {
        grid_dim: (to_u32(OP, "blocks", bf16_blocks(tile, shape))?, 1, 1),
        block_dim: (tile.threads(), 1, 1),
        shared_mem_bytes: tile.shared_bytes(),
    })
}

/// The checks both kernel families share: `k` a multiple of 8 (weight rows
/// move in 16-byte chunks), 32-bit element counts, `inp` (`inp_len`),
/// `weight` and `bias` long enough.
fn check_shape(
    op: &'static str,
    inp_len: usize,
    weight_len: usize,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let MatmulShape { m, n, k } = shape;
    if !k.is_multiple_of(BF16_C_MULTIPLE) {
        return Err(OpError::shape(
            op,
            format!("k = {k} is not a multiple of {BF16_C_MULTIPLE} (weight rows move in 16-byte chunks)"),
        ));
    }
    count_u32(op, "m * k", &[m, k])?;
    count_u32(op, "n * k", &[n, k])?;
    count_u32(op, "m * n", &[m, n])?;
    check_len(op, "inp", inp_len, m * k)?;
    check_len(op, "weight", weight_len, n * k)?;
    if let Some(b) = bias {
        check_len(op, "bias", b.len(), n)?;
    }
    Ok(())
}

/// `out[m, n] = round_bf16(inp[m, k]) · weight[n, k]ᵀ (+ bias[n])`, then
/// GELU if `gelu`, f32 accumulation; the tile shape is chosen for the
/// GEMM's size ([`choose_tile`]). `k` must be a multiple of 8.
pub fn matmul_forward_bf16(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
    gelu: bool,
) -> Result<(), OpError> {
    let opts = Bf16TileOptions {
        gelu,
        ..Bf16TileOptions::new(choose_tile(shape, gpu.sm_count()))
    };
    matmul_forward_bf16_with(gpu, opts, out, inp, weight, bias, shape)
}

/// An explicit bf16 kernel and its epilogue: what [`matmul_forward_bf16_with`]
/// (`T` = [`Bf16TileShape`]) and [`matmul_forward_bf16_wgmma_with`] (`T` =
/// [`TileShape`]) take (the bench's sweeps, the tests), where the plain entry
/// points choose the tile.
#[derive(Clone, Copy, Debug)]
pub struct Bf16TileOptions<T = Bf16TileShape> {
    /// The tile shape: one of `MATMUL_BF16_VARIANTS` (mma.sync) or of
    /// `MATMUL_BF16_WGMMA_VARIANTS` (wgmma).
    pub tile: T,
    /// Apply GELU after the bias.
    pub gelu: bool,
}

impl<T> Bf16TileOptions<T> {
    /// `tile`, no GELU.
    pub fn new(tile: T) -> Self {
        Bf16TileOptions { tile, gelu: false }
    }
}

/// [`matmul_forward_bf16`] with an explicit tile shape.
pub fn matmul_forward_bf16_with(
    gpu: &Gpu,
    opts: Bf16TileOptions,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let Bf16TileOptions { tile, gelu } = opts;
    let tile = &tile;
    let MatmulShape { m, n, k } = shape;
    check_len(OP, "out", out.len(), m * n)?;
    check_shape(OP, inp.len(), weight.len(), bias, shape)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let params = MatmulBf16Params {
        out: out_ptr(gpu, out),
        inp: in_ptr(gpu, inp),
        weight: in_ptr(gpu, weight).cast::<u16>(),
        bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        n: to_u32(OP, "m", m)?,
        c: to_u32(OP, "k", k)?,
        oc: to_u32(OP, "n", n)?,
        gelu: gelu as u32,
    };
    if !aligned16(&[params.out as usize, params.inp as usize, params.weight as usize]) {
        return Err(OpError::shape(OP, "inp, weight and out must be 16-byte aligned"));
    }
    let cfg = launch_config(tile, shape)?;
    gpu.set_max_dynamic_shared(tile.name, tile.shared_bytes())?;
    // SAFETY: `tile.name` is the kernel compiled for `tile` (its name and
    // tile come from the same constant), whose parameter type is
    // MatmulBf16Params. `out` holds m*n floats, `inp` m*k, `weight` n*k
    // bf16 (two bytes each, as the kernel's u16), `bias` n floats or is
    // null (all checked above); inp/weight/out are 16-byte aligned and
    // k % 8 == 0 (the kernel's cp.async contract). Grid, block and dynamic
    // shared memory come from `tile` (the kernel checks at compile time that
    // its layout takes `shared_bytes`), and the limit was raised for it.
    unsafe { gpu.launch(tile.name, cfg, params)? };
    Ok(())
}

/// Where [`matmul_forward_bf16_wgmma`] writes `[m, n]`.
pub enum Bf16Out<'a> {
    /// f32 (16-byte aligned).
    F32(&'a mut CudaSlice<f32>),
    /// bf16, rounded to nearest even (8-byte aligned): for a bf16 matmul
    /// that reads the result next, which would round it the same way.
    Bf16(&'a mut CudaSlice<half::bf16>),
    /// f32 as [`Bf16Out::F32`], of a qkv matmul (`n = 3C`) whose keys and
    /// values also go, rounded to bf16, into a bf16 KV cache
    /// ([`QkvCache`]), so that the attention after it stores nothing.
    QkvF32(&'a mut CudaSlice<f32>, QkvCache<'a>),
}

/// The bf16 KV caches a qkv matmul also fills ([`Bf16Out::QkvF32`]):
/// `[seqs][nh][max_t][QKV_CACHE_HEAD_SIZE]` each (`C = nh * 64`), output
/// row `r` going to sequence `r / t`'s position `pos0 + r % t` (`m` a
/// multiple of `t`, `pos0 + t <= max_t`). CPU twin: the f32 output's keys
/// and values stored as `cpu::ops::kv_cache_store` does, rounded as the
/// bf16 cache keeps them.
pub struct QkvCache<'a> {
    pub k_cache: CudaViewMut<'a, half::bf16>,
    pub v_cache: CudaViewMut<'a, half::bf16>,
    pub t: usize,
    pub pos0: usize,
    pub max_t: usize,
    pub nh: usize,
}

impl QkvCache<'_> {
    /// The kernel's view of the caches, checked against an `m x n` output.
    fn params(&mut self, gpu: &Gpu, m: usize, n: usize) -> Result<QkvCacheOut, OpError> {
        let (t, pos0, max_t, nh) = (self.t, self.pos0, self.max_t, self.nh);
        let hs = QKV_CACHE_HEAD_SIZE as usize;
        let c = n / 3;
        if n != 3 * c || c != nh * hs {
            return Err(OpError::shape(
                OP_WGMMA,
                format!("a qkv matmul's n = 3 * nh * {hs}; got n = {n}, nh = {nh}"),
            ));
        }
        if t == 0 || !m.is_multiple_of(t) || pos0 + t > max_t {
            return Err(OpError::shape(
                OP_WGMMA,
                format!(
                    "KV cache rows: m = {m} must be whole sequences of t = {t}, pos0 + t = {} <= max_t = {max_t}",
                    pos0 + t
                ),
            ));
        }
        let len = (m / t) * c * max_t;
        // The kernel indexes the caches in u32.
        to_u32(OP_WGMMA, "KV cache elements", len)?;
        check_len(OP_WGMMA, "k_cache", self.k_cache.len(), len)?;
        check_len(OP_WGMMA, "v_cache", self.v_cache.len(), len)?;
        let (k, v) = (out_ptr(gpu, &mut self.k_cache), out_ptr(gpu, &mut self.v_cache));
        if !(k as usize).is_multiple_of(8) || !(v as usize).is_multiple_of(8) {
            return Err(OpError::shape(OP_WGMMA, "the KV caches must be 8-byte aligned"));
        }
        Ok(QkvCacheOut {
            k: k.cast(),
            v: v.cast(),
            t: to_u32(OP_WGMMA, "t", t)?,
            pos0: to_u32(OP_WGMMA, "pos0", pos0)?,
            max_t: to_u32(OP_WGMMA, "max_t", max_t)?,
        })
    }
}

const OP_WGMMA: &str = "matmul_forward_bf16_wgmma";

/// Consumer warpgroups of one bf16 `wgmma` block from which
/// [`BF16_WIDE_BLOCK_COST`] applies.
pub const BF16_WIDE_BLOCK_WARPGROUPS: u32 = 3;
/// What [`choose_wgmma_tile`] charges a wide bf16 block (three consumer
/// warpgroups, 192 rows) against the shared cost model, as a fraction: its
/// B tile feeds 192 rows, not 128, so a third fewer operand bytes go
/// through the copy engine per output. Fit on an H200 at M = 8192, K = 768:
/// per tile, 192x192 ran 1.27-1.42x as long as 128x192 (one-tile and
/// persistent, N = 2304 and 3072), against their areas' 1.5x. bf16 only:
/// TF32 tiles load twice the bytes per k, and there 192x192 ran 1.15-1.2x
/// as long as 128x256 at N = 50304, slower per output, not faster.
pub const BF16_WIDE_BLOCK_COST: (u64, u64) = (9, 10);

/// The bf16 `wgmma` tile for an `m x n` output on `sms` SMs: the least
/// predicted cost (`matmul_tf32::predicted_cost`: wave quantisation and
/// tile efficiency; where the launch runs `persistent` and the tile has a
/// twin, `matmul_tf32::persistent_predicted_cost`), wide blocks charged
/// [`BF16_WIDE_BLOCK_COST`] of it; on a tie, the tile that keeps more
/// blocks running, then the larger one, whose operands each feed more
/// output (measured on an H200 at 8192 x 2304 x 768: one-tile 192x192 65
/// µs against 128x192's 77; persistent, 59.8 against 62.8).
///
/// `persistent`: the launch has an output map and persistent tiles are on
/// (`launch_persists` says so for a given output).
pub fn choose_wgmma_tile(shape: MatmulShape, sms: usize, persistent: bool) -> TileShape {
    let key = |s: &TileShape| {
        let running = tf32_blocks(s, shape).min(sms * s.blocks_per_sm as usize);
        let cost = match bf16_wgmma_persistent_twin(s) {
            Some(twin) if persistent => persistent_predicted_cost(&twin, shape, sms),
            _ => predicted_cost(s, shape, sms),
        };
        let cost = if s.bm / WGMMA_M >= BF16_WIDE_BLOCK_WARPGROUPS {
            let (num, den) = BF16_WIDE_BLOCK_COST;
            cost * num / den
        } else {
            cost
        };
        (cost, std::cmp::Reverse(running), std::cmp::Reverse(s.bm * s.bn))
    };
    MATMUL_BF16_WGMMA_VARIANTS
        .iter()
        .copied()
        .min_by_key(key)
        .expect("the variant list is not empty")
}

/// `out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n])`, then GELU if
/// `gelu`: bf16 operands on Hopper's `wgmma` tensor cores (sm_90a module),
/// f32 accumulation, the tile chosen by [`choose_wgmma_tile`] (persistent
/// as `launch_persists` says for `out`). CPU twin:
/// `cpu::ops::matmul_forward_bf16` (which rounds an f32 `inp` as the
/// producer of this `inp` did). `k` must be a multiple of 8.
pub fn matmul_forward_bf16_wgmma(
    gpu: &Gpu,
    out: Bf16Out<'_>,
    inp: &CudaSlice<half::bf16>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
    gelu: bool,
) -> Result<(), OpError> {
    let outs = wgmma_out(gpu, out, shape)?;
    let tile = choose_wgmma_tile(shape, gpu.sm_count(), launch_persists(gpu, &outs, shape.n));
    let opts = Bf16TileOptions {
        gelu,
        ..Bf16TileOptions::new(tile)
    };
    launch_wgmma(gpu, opts, outs, inp, weight, bias, shape, UNSPLIT)
}

/// Fewest k-tiles (of `MATMUL_BF16_WGMMA_BK`) one split of a split-K
/// launch takes: below it the pipeline's fill and the partial tile's store
/// outweigh the k-steps they spread (as the 3xTF32 plan's
/// `matmul_tf32::FP32_TC_MIN_KTILES_PER_SPLIT`).
pub const BF16_WGMMA_MIN_KTILES_PER_SPLIT: usize = 4;
/// Most splits of a split-K launch: each is a slice of `m x n` partial sums
/// that the reader adds up.
pub const BF16_WGMMA_MAX_SPLITS: usize = 8;

/// The tile ([`choose_wgmma_tile`]) and split count for an `m x n x k`
/// matmul whose reader adds split-K parts: where the tiles leave the GPU's
/// block slots mostly empty, `k` is split by the 3xTF32 plan's
/// [`SplitRule`], each split at least [`BF16_WGMMA_MIN_KTILES_PER_SPLIT`]
/// k-tiles, at most [`BF16_WGMMA_MAX_SPLITS`], the parts within
/// `workspace_floats`. A split launch stores element-wise (no output map);
/// an unsplit one takes the tile chosen for `persistent` (whether it would
/// run persistent, as `launch_persists` says).
/// Small `m` is the case: at 64 x 768 x 3072 (the MLP projection of a
/// 64-token prompt) the 64x64 tile makes 12 blocks of 48 k-tiles each.
pub fn bf16_wgmma_plan(
    shape: MatmulShape,
    sms: usize,
    workspace_floats: usize,
    persistent: bool,
) -> (TileShape, usize) {
    let tile = choose_wgmma_tile(shape, sms, false);
    let rule = SplitRule {
        k_tile: MATMUL_BF16_WGMMA_BK as usize,
        min_ktiles: BF16_WGMMA_MIN_KTILES_PER_SPLIT,
        max_splits: BF16_WGMMA_MAX_SPLITS,
    };
    let ktiles = shape.k.div_ceil(rule.k_tile);
    match effective_splits(ktiles, rule.splits(&tile, shape, sms, workspace_floats)) {
        1 => (choose_wgmma_tile(shape, sms, persistent), 1),
        splits => (tile, splits),
    }
}

/// Splits of `ktiles` k-tiles asked for as `splits` that all get some: each
/// takes `ceil(ktiles / splits)`, so fewer may be needed.
fn effective_splits(ktiles: usize, splits: usize) -> usize {
    let per = ktiles.div_ceil(splits.max(1)).max(1);
    ktiles.div_ceil(per).max(1)
}

/// [`matmul_forward_bf16_wgmma`] (f32 out) for a reader that adds split-K
/// parts: split over `k` as [`bf16_wgmma_plan`] says for `parts`' size.
/// Returns the split count: 1 means `out` holds the result (bias added);
/// `s > 1` means `parts` holds `s` slices of `m * n` partial sums, no
/// bias, for the reader to add in order with the bias
/// (`layernorm::residual_layernorm_split_forward`), and `out` is untouched.
pub fn matmul_forward_bf16_wgmma_partials(
    gpu: &Gpu,
    parts: &mut CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<half::bf16>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
) -> Result<usize, OpError> {
    let outs = wgmma_out(gpu, Bf16Out::F32(out), shape)?;
    let persistent = launch_persists(gpu, &outs, shape.n);
    let (tile, splits) = bf16_wgmma_plan(shape, gpu.sm_count(), parts.len(), persistent);
    if splits > 1 {
        matmul_forward_bf16_wgmma_split(gpu, tile, splits, parts, inp, weight, shape)
    } else {
        launch_wgmma(gpu, Bf16TileOptions::new(tile), outs, inp, weight, bias, shape, UNSPLIT)?;
        Ok(1)
    }
}

/// The split-K launch itself, with an explicit tile and split count (the
/// bench's sweeps): `parts` gets the partial sums of up to `splits` slices
/// of `k` (no bias, no GELU), slice `s` at `s * m * n`. Returns the slices
/// written (fewer than `splits` where `ceil(k-tiles / splits)` covers `k`
/// in fewer).
pub fn matmul_forward_bf16_wgmma_split(
    gpu: &Gpu,
    tile: TileShape,
    splits: usize,
    parts: &mut CudaSlice<f32>,
    inp: &CudaSlice<half::bf16>,
    weight: &CudaSlice<half::bf16>,
    shape: MatmulShape,
) -> Result<usize, OpError> {
    if splits == 0 {
        return Err(OpError::shape(OP_WGMMA, "splits must be at least 1"));
    }
    let ktiles = shape.k.div_ceil(MATMUL_BF16_WGMMA_BK as usize);
    let splits = effective_splits(ktiles, splits);
    check_len(OP_WGMMA, "parts", parts.len(), splits.saturating_mul(shape.out_len()))?;
    let split = WgmmaSplit {
        splits,
        ktiles_per_split: ktiles.div_ceil(splits),
    };
    let out = WgmmaOut {
        f32: out_ptr(gpu, parts),
        bf16: std::ptr::null_mut(),
        kv: QkvCacheOut::NONE,
        rows: shape.m,
    };
    launch_wgmma(gpu, Bf16TileOptions::new(tile), out, inp, weight, None, shape, split)?;
    Ok(splits)
}

/// How a launch splits `k`: `splits` grid rows of `ktiles_per_split`
/// k-tiles (1 and 0: unsplit).
#[derive(Clone, Copy)]
struct WgmmaSplit {
    splits: usize,
    ktiles_per_split: usize,
}

const UNSPLIT: WgmmaSplit = WgmmaSplit {
    splits: 1,
    ktiles_per_split: 0,
};

/// [`matmul_forward_bf16_wgmma`] with an explicit tile (one of
/// `MATMUL_BF16_WGMMA_VARIANTS`).
pub fn matmul_forward_bf16_wgmma_with(
    gpu: &Gpu,
    opts: Bf16TileOptions<TileShape>,
    out: Bf16Out<'_>,
    inp: &CudaSlice<half::bf16>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let outs = wgmma_out(gpu, out, shape)?;
    launch_wgmma(gpu, opts, outs, inp, weight, bias, shape, UNSPLIT)
}

/// `out` as one unsplit launch writes it, its length checked for `shape`
/// (and the caches, if any, by [`QkvCache::params`]).
fn wgmma_out(gpu: &Gpu, out: Bf16Out<'_>, shape: MatmulShape) -> Result<WgmmaOut, OpError> {
    let MatmulShape { m, n, .. } = shape;
    // The output's rows as allocated (its tensor map spans them all, so one
    // map serves every m; the kernel stores through it only tiles below m).
    let rows = |len: usize| len / n.max(1);
    Ok(match out {
        Bf16Out::F32(o) => {
            check_len(OP_WGMMA, "out", o.len(), m * n)?;
            WgmmaOut {
                f32: out_ptr(gpu, o),
                bf16: std::ptr::null_mut(),
                kv: QkvCacheOut::NONE,
                rows: rows(o.len()),
            }
        }
        Bf16Out::Bf16(o) => {
            check_len(OP_WGMMA, "out", o.len(), m * n)?;
            WgmmaOut {
                f32: std::ptr::null_mut(),
                bf16: out_ptr(gpu, o).cast::<u16>(),
                kv: QkvCacheOut::NONE,
                rows: rows(o.len()),
            }
        }
        Bf16Out::QkvF32(o, mut kv) => {
            check_len(OP_WGMMA, "out", o.len(), m * n)?;
            let kv = kv.params(gpu, m, n)?;
            WgmmaOut {
                f32: out_ptr(gpu, o),
                bf16: std::ptr::null_mut(),
                kv,
                rows: rows(o.len()),
            }
        }
    })
}

/// Whether an unsplit launch writing `outs` (`n` columns) runs its tile's
/// persistent twin, where the tile has one: no KV caches (the kernel writes
/// them from a tile's staged boxes after the last, which a persistent
/// block's ring has reused by then), an output map
/// ([`Gpu::wgmma_out_mappable`]) and persistent tiles on
/// ([`Gpu::persistent_gemm_blocks`]). [`launch_wgmma`] applies the same rule.
fn launch_persists(gpu: &Gpu, outs: &WgmmaOut, n: usize) -> bool {
    let (elem, ptr) = outs.target();
    outs.kv.k.is_null() && gpu.persistent_gemm_blocks().is_some() && gpu.wgmma_out_mappable(elem, ptr, n)
}

/// Where one bf16 `wgmma` launch writes: exactly one of `f32` and `bf16`
/// non-null, `kv` the KV caches a qkv matmul also fills (or none), `rows`
/// the output buffer's rows (at least m; for the tensor map an unsplit
/// launch stores through).
struct WgmmaOut {
    f32: *mut f32,
    bf16: *mut u16,
    kv: QkvCacheOut,
    rows: usize,
}

impl WgmmaOut {
    /// The element type and address of the output matrix (what a map of it
    /// describes).
    fn target(&self) -> (TensorElem, u64) {
        if self.bf16.is_null() {
            (TensorElem::F32, self.f32 as u64)
        } else {
            (TensorElem::Bf16, self.bf16 as u64)
        }
    }
}

/// One launch of a bf16 `wgmma` tile: `outs` sized by the caller
/// (`split.splits * m * n` floats for a split launch, whose bias is `None`,
/// GELU off and caches none), the caches checked by [`QkvCache::params`].
/// An unsplit launch whose output rows are 16-byte multiples stores its
/// tiles through a tensor map of the output (while [`Gpu::tma_store`]); a
/// qkv launch's blocks then also write the caches from the staged tile,
/// and it never runs persistent.
#[allow(clippy::too_many_arguments)]
fn launch_wgmma(
    gpu: &Gpu,
    opts: Bf16TileOptions<TileShape>,
    outs: WgmmaOut,
    inp: &CudaSlice<half::bf16>,
    weight: &CudaSlice<half::bf16>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
    split: WgmmaSplit,
) -> Result<(), OpError> {
    let Bf16TileOptions { tile, gelu } = opts;
    let tile = &tile;
    let WgmmaOut {
        f32: out_f32,
        bf16: out_bf16,
        kv,
        ..
    } = outs;
    if !gpu.has_wgmma() {
        return Err(OpError::shape(
            OP_WGMMA,
            "needs the sm_90a (wgmma) kernels, which this GPU's module lacks",
        ));
    }
    if !MATMUL_BF16_WGMMA_VARIANTS.contains(tile) {
        return Err(OpError::shape(
            OP_WGMMA,
            format!("{} is not a bf16 wgmma tile", tile.name),
        ));
    }
    if split.splits > 1 && (bias.is_some() || gelu || out_f32.is_null() || !kv.k.is_null()) {
        return Err(OpError::shape(
            OP_WGMMA,
            "a split-K launch writes f32 partial sums, without bias, GELU or KV caches",
        ));
    }
    check_shape(OP_WGMMA, inp.len(), weight.len(), bias, shape)?;
    let MatmulShape { m, n, k } = shape;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (inp_p, w_p) = (in_ptr(gpu, inp) as u64, in_ptr(gpu, weight) as u64);
    if !aligned16(&[inp_p as usize, w_p as usize, out_f32 as usize]) || !(out_bf16 as usize).is_multiple_of(8) {
        return Err(OpError::shape(
            OP_WGMMA,
            "inp, weight and an f32 out must be 16-byte aligned, a bf16 out 8-byte",
        ));
    }
    let bk = MATMUL_BF16_WGMMA_BK;
    // The `inp` map spans the whole buffer, not m rows (as the TF32 kernels'
    // do): one map per activation buffer, whatever the token count; rows
    // past m only feed output rows that are never stored.
    let inp_rows = inp.len() / k.max(1);
    let (elem, ptr) = outs.target();
    let out_map = if split.splits <= 1 {
        gpu.wgmma_out_map(elem, ptr, outs.rows, n, tile.bm)?
    } else {
        std::ptr::null()
    };
    // With an output map, a one-block-an-SM tile runs as its persistent twin
    // (same tile, same maps): at most a block an SM, each looping over
    // tiles, so the producer loads the next tile while the last is stored.
    let tiles = tf32_blocks(tile, shape);
    let (tile, blocks) = match (
        out_map.is_null() || !kv.k.is_null(),
        gpu.persistent_gemm_blocks(),
        bf16_wgmma_persistent_twin(tile),
    ) {
        (false, Some(most), Some(twin)) => (twin, tiles.min(most)),
        _ => (*tile, tiles),
    };
    let tile = &tile;
    let params = MatmulBf16WgmmaParams {
        inp_map: gpu.tensor_map_2d(TensorElem::Bf16, inp_p, inp_rows, k, tile.bm, bk)?,
        weight_map: gpu.tensor_map_2d(TensorElem::Bf16, w_p, n, k, tile.bn, bk)?,
        out_map,
        out: out_f32,
        out_bf16,
        bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
        n: to_u32(OP_WGMMA, "m", m)?,
        c: to_u32(OP_WGMMA, "k", k)?,
        oc: to_u32(OP_WGMMA, "n", n)?,
        gelu: gelu as u32,
        k_tiles_per_split: to_u32(OP_WGMMA, "k-tiles per split", split.ktiles_per_split)?,
        kv,
    };
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(OP_WGMMA, "blocks", blocks)?,
            to_u32(OP_WGMMA, "splits", split.splits)?,
            1,
        ),
        block_dim: (tile.threads(), 1, 1),
        shared_mem_bytes: tile.shared_bytes(),
    };
    gpu.set_max_dynamic_shared(tile.name, tile.shared_bytes())?;
    // SAFETY: `tile.name` is a bf16 wgmma kernel (checked: one of the
    // variants or, only with an output map, its persistent twin, whose grid
    // may be smaller than a block a tile; and the sm_90a module is loaded),
    // whose parameter type is MatmulBf16WgmmaParams. The maps describe `inp` (>= m rows) and
    // `weight` (n rows) of k bf16 with the boxes the kernel was compiled
    // with, and `out_map` (unsplit; never persistent with caches) all of the output buffer's
    // rows (>= m) with `WGMMA_OUT_BOX_BYTES` x `tile.bm` boxes; exactly one of `out` (m*n f32, 16-byte aligned; splits*m*n for
    // a split launch, the callers' checks) and `out_bf16` (m*n bf16, 8-byte
    // aligned) is set, `bias` holds n floats or is null, `kv` is null or
    // names caches that `QkvCache::params` checked against this m x n
    // (every row's position inside them), and a split launch has no bias,
    // no GELU, no caches and f32 out (checked above); grid row `y` takes
    // k-tiles `y * k_tiles_per_split..` and writes slice `y`. Grid, block
    // and shared memory come from `tile`, and the shared-memory limit was
    // raised for it.
    unsafe { gpu.launch(tile.name, cfg, params)? };
    Ok(())
}
