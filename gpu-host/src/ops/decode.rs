//! Launch wrappers of the decode step's fused kernels (`gpu_kernels::ops::decode`):
//! [`decode_gemv`] (a matrix-vector product with the small ops folded in)
//! and [`decode_attention`] (flash-decoding at device-held positions).
//! CPU twin: the CPU forward at `t = 1` (`cpu::forward`).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;

use cudarc::driver::{CudaSlice, LaunchConfig};
use gpu_kernels::params::decode::*;
use gpu_kernels::params::decode_step::DECODE_STEP_ATTN_KEYS;

use super::args::{OpError, aligned16, check_len, in_ptr, out_ptr, to_u32};
use super::kv_cache::KvCache;
use super::weight::{KernelWeight, WeightRef};
use crate::{DecodeAttentionShape, Gpu, KvElem, KvRows, LayernormWeights, MatmulShape};
use gpu_kernels::params::{CacheBits, KernelParams};

const OP_GEMV: &str = "decode_gemv";
const OP_ATTN: &str = "decode_attention";
/// Dynamic shared memory a kernel gets without raising its limit.
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;
/// Floats per partial's (max, sum) pair.
const ML_FLOATS: usize = 2;

/// How the decode kernels are launched.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLaunch<'a> {
    /// Programmatic dependent launch: each kernel's weight loads overlap
    /// the previous kernel's tail. Only the sm_90a module's kernels wait on
    /// the dependency (`Gpu::has_wgmma`); elsewhere this is ignored.
    pub pdl: bool,
    /// Weights of later kernels this launch asks L2 to fetch.
    pub prefetch: L2Prefetch<'a>,
    /// Most GEMV blocks per SM (0: as many as are resident at once).
    pub blocks_per_sm: usize,
    /// Most warps per GEMV block (0: `DECODE_GEMV_MAX_WARPS`); at least
    /// one column group (`ceil(c / DECODE_GEMV_CHUNK)` warps) either way.
    pub block_warps: usize,
    /// Under PDL, trigger the next kernel's launch before the wait.
    pub early_trigger: bool,
    /// GEMVs of [`MMA_MIN_ROWS`] rows or more (and `c` a multiple of a
    /// step: 32 bf16, 16 f32) run on tensor cores (`DECODE_GEMV_BF16_MMA`;
    /// f32 as 3xTF32, `DECODE_GEMV_MMA`); off: the one-column-a-warp kernels.
    pub tensor_cores: bool,
}

impl DecodeLaunch<'_> {
    /// A launch with PDL on or off, nothing to prefetch, every resident
    /// block used, the next launch triggered after the wait.
    pub fn new(pdl: bool) -> Self {
        DecodeLaunch {
            pdl,
            prefetch: L2Prefetch::default(),
            blocks_per_sm: 0,
            block_warps: 0,
            early_trigger: false,
            tensor_cores: true,
        }
    }
}

/// Up to [`DECODE_PREFETCH_RANGES`] ranges of buffers a decode kernel asks
/// L2 to fetch for the kernels after it (a hint: no value changes). It
/// borrows the buffers, so they outlive the launch that names them.
#[derive(Clone, Copy, Debug)]
pub struct L2Prefetch<'a> {
    ranges: [PrefetchRange; DECODE_PREFETCH_RANGES],
    used: usize,
    late: bool,
    _bufs: PhantomData<&'a ()>,
}

impl Default for L2Prefetch<'_> {
    fn default() -> Self {
        L2Prefetch {
            ranges: [PrefetchRange::NONE; DECODE_PREFETCH_RANGES],
            used: 0,
            late: false,
            _bufs: PhantomData,
        }
    }
}

impl<'a> L2Prefetch<'a> {
    /// Add elements `range` of `buf` (rounded inwards to 16-byte bounds).
    /// Full ([`DECODE_PREFETCH_RANGES`] ranges) or empty: ignored, as a hint
    /// may be. Errors when the range is not inside `buf`.
    pub fn push<T>(&mut self, gpu: &Gpu, buf: &'a CudaSlice<T>, range: Range<usize>) -> Result<(), OpError> {
        if range.start > range.end || range.end > buf.len() {
            return Err(OpError::shape(
                OP_GEMV,
                format!("prefetch range {range:?} outside a buffer of {}", buf.len()),
            ));
        }
        const BYTES_16: usize = 16;
        let elem = size_of::<T>();
        let (lo, hi) = (
            (range.start * elem).next_multiple_of(BYTES_16),
            range.end * elem / BYTES_16 * BYTES_16,
        );
        if hi <= lo || self.used == DECODE_PREFETCH_RANGES {
            return Ok(());
        }
        let ptr = (in_ptr(gpu, buf) as *const u8).wrapping_add(lo);
        if !aligned16(&[ptr as usize]) {
            return Ok(());
        }
        self.ranges[self.used] = PrefetchRange {
            ptr,
            bytes: (hi - lo) as u64,
        };
        self.used += 1;
        Ok(())
    }

    /// Prefetch after the kernel's own loads, not before them: for a kernel
    /// that streams more than L2 holds.
    pub fn late(mut self, late: bool) -> Self {
        self.late = late;
        self
    }

    /// Bytes asked for.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.bytes).sum()
    }
}

/// Scratch of the decode kernels, sized once for up to `max_rows` rows of
/// `nh` heads over `max_t` positions: attention partials and arrival
/// counters, and the greedy LM head's per-block bests and counter. The
/// counters start at zero and every kernel leaves them at zero.
pub struct DecodeWorkspace {
    part_acc: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    attn_counters: CudaSlice<u32>,
    best_val: CudaSlice<f32>,
    best_idx: CudaSlice<u32>,
    best_counter: CudaSlice<u32>,
    max_rows: usize,
    nh: usize,
    max_t: usize,
    parts_stride: usize,
    /// Most GEMV blocks of a launch: the greedy partials hold that many rows.
    max_blocks: usize,
    /// Resident GEMV blocks per SM, per (kernel, threads, shared bytes).
    occupancy: HashMap<(&'static str, u32, u32), u32>,
}

/// Most GEMV blocks a launch uses per SM: the grid is sized to be resident
/// at once (warps stride over the columns), so no block waits for a slot.
const MAX_BLOCKS_PER_SM: usize = 16;

/// Element counts of a [`DecodeWorkspace`]'s buffers: the one place both
/// [`DecodeWorkspace::new`] and [`DecodeWorkspace::device_words`] read.
struct WorkspaceSizes {
    parts_stride: usize,
    /// Attention partial accumulators (`heads * parts_stride * HS`).
    part_acc: usize,
    /// Their (max, sum) pairs.
    part_ml: usize,
    /// (row, head) pairs: one arrival counter each.
    heads: usize,
    /// GEMV blocks a launch may use: the greedy partials hold that many rows.
    max_blocks: usize,
    /// Greedy partials (values, and as many indices).
    best: usize,
}

impl WorkspaceSizes {
    fn new(sm_count: usize, max_rows: usize, nh: usize, max_t: usize) -> Self {
        // Room for the attention kernel's partials (two per 64-key chunk) and
        // the persistent step's (one per `DECODE_STEP_ATTN_KEYS` keys).
        let parts_stride = (max_t.div_ceil(DECODE_ATTN_CHUNK as usize) * DECODE_ATTN_PARTS_PER_CHUNK as usize)
            .max(max_t.div_ceil(DECODE_STEP_ATTN_KEYS as usize));
        let heads = max_rows * nh;
        let max_blocks = sm_count * MAX_BLOCKS_PER_SM;
        WorkspaceSizes {
            parts_stride,
            part_acc: heads * parts_stride * DECODE_HEAD_SIZE as usize,
            part_ml: heads * parts_stride * ML_FLOATS,
            heads,
            max_blocks,
            best: max_blocks * max_rows,
        }
    }
}

impl DecodeWorkspace {
    /// Scratch for up to `max_rows` rows: the GEMV and the persistent step
    /// serve at most `DECODE_MAX_ROWS` of them, the attention kernel any
    /// number (a server's decode step over more rows runs the prefill
    /// path's matmuls around it).
    pub fn new(gpu: &Gpu, max_rows: usize, nh: usize, max_t: usize) -> Result<Self, OpError> {
        if max_rows == 0 {
            return Err(OpError::shape(OP_GEMV, "a workspace for no rows"));
        }
        let z = WorkspaceSizes::new(gpu.sm_count(), max_rows, nh, max_t);
        Ok(Self {
            part_acc: gpu.alloc(z.part_acc)?,
            part_ml: gpu.alloc(z.part_ml)?,
            attn_counters: gpu.alloc(z.heads)?,
            best_val: gpu.alloc(z.best)?,
            best_idx: gpu.alloc(z.best)?,
            best_counter: gpu.alloc(1)?,
            max_rows,
            nh,
            max_t,
            parts_stride: z.parts_stride,
            max_blocks: z.max_blocks,
            occupancy: HashMap::new(),
        })
    }

    /// Device words (4-byte floats and u32s) the workspace holds for these sizes.
    pub fn device_words(sm_count: usize, max_rows: usize, nh: usize, max_t: usize) -> usize {
        let z = WorkspaceSizes::new(sm_count, max_rows, nh, max_t);
        z.part_acc + z.part_ml + z.heads + 2 * z.best + 1
    }

    /// Rows, heads and positions the workspace was made for.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    pub fn nh(&self) -> usize {
        self.nh
    }

    pub fn max_t(&self) -> usize {
        self.max_t
    }

    /// The persistent step's scratch for a grid of `blocks`: the argmax
    /// partials, the attention partials and counters (device addresses),
    /// and the partials per (row, head).
    #[allow(clippy::type_complexity)]
    pub(crate) fn step_scratch(
        &mut self,
        gpu: &Gpu,
        blocks: usize,
    ) -> Result<(*mut f32, *mut u32, *mut f32, *mut f32, *mut u32, u32), OpError> {
        if blocks > self.max_blocks {
            return Err(OpError::shape(
                OP_GEMV,
                format!("{blocks} blocks: the workspace holds {}", self.max_blocks),
            ));
        }
        Ok((
            out_ptr(gpu, &mut self.best_val),
            out_ptr(gpu, &mut self.best_idx),
            out_ptr(gpu, &mut self.part_acc),
            out_ptr(gpu, &mut self.part_ml),
            out_ptr(gpu, &mut self.attn_counters),
            to_u32(OP_GEMV, "parts_stride", self.parts_stride)?,
        ))
    }

    fn resident(&mut self, gpu: &Gpu, kernel: &'static str, threads: u32, shared: u32) -> Result<u32, OpError> {
        if let Some(&b) = self.occupancy.get(&(kernel, threads, shared)) {
            return Ok(b);
        }
        let b = gpu.resident_blocks_per_sm(kernel, threads, shared)?;
        self.occupancy.insert((kernel, threads, shared), b);
        Ok(b)
    }
}

/// The embedding prologue's tables and state: row `r`'s input is
/// `wte[tokens[r]] + wpe[pos[r]]`, also written to `out` (the residual stream).
pub struct Embed<'a> {
    pub tokens: &'a CudaSlice<u32>,
    pub pos: &'a CudaSlice<u32>,
    /// `[vocab, c]`, in the same format as the GEMV's weight.
    pub wte: WeightRef<'a>,
    /// `[max_pos, c]`
    pub wpe: &'a CudaSlice<f32>,
    pub vocab: usize,
    pub max_pos: usize,
    pub out: &'a mut CudaSlice<f32>,
}

/// What the GEMV multiplies.
pub enum Input<'a> {
    /// `[n, c]` rows.
    Rows(&'a CudaSlice<f32>),
    /// The token + position embedding of each row.
    Embed(Embed<'a>),
}

/// Where the GEMV's results go.
pub enum Output<'a> {
    /// `out[n, oc] = (gelu?)(x·Wᵀ + bias) + residual`.
    Rows {
        out: &'a mut CudaSlice<f32>,
        residual: Option<&'a CudaSlice<f32>>,
        gelu: bool,
    },
    /// The qkv projection: q to `q` (`[n, oc/3]`), k and v into the caches
    /// (`[max_batch][nh][max_t][oc/3/nh]`, kept as the weights are) at each
    /// row's `pos`.
    Qkv {
        q: &'a mut CudaSlice<f32>,
        kv: &'a mut KvCache,
        pos: &'a CudaSlice<u32>,
        nh: usize,
        max_t: usize,
    },
    /// The LM head: logits to `logits` (`[n, oc]`), each row's argmax over
    /// the first `v` columns to `ids` and `tokens_next`, and `pos_next[r] += 1`.
    Greedy {
        logits: &'a mut CudaSlice<f32>,
        ids: &'a mut CudaSlice<u32>,
        tokens_next: &'a mut CudaSlice<u32>,
        pos_next: &'a mut CudaSlice<u32>,
        v: usize,
    },
}

/// The launch of a GEMV of `shape` (`m` rows, inner size `k`, `n`
/// columns), and its `k_warps`: warps per column (one per chunk of `k`),
/// groups of them per block, blocks (all resident at once: the groups
/// stride over the columns), and the dynamic shared memory
/// (`decode_gemv_shared_bytes`).
fn gemv_config(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    kernels: &GemvKernels,
    shape: MatmulShape,
    ln: bool,
    blocks_per_sm: usize,
    block_warps: usize,
) -> Result<(LaunchConfig, u32), OpError> {
    // The kernel's names: n rows, c inner, oc columns.
    let MatmulShape { m: n, n: oc, k: c } = shape;
    let k_warps = c.div_ceil(kernels.chunk as usize);
    let max_warps = match block_warps {
        0 => DECODE_GEMV_MAX_WARPS as usize,
        w => w.min(DECODE_GEMV_MAX_WARPS as usize),
    };
    // As many column groups as fit in a block of at most 8 warps, unless
    // that leaves SMs without a block (768 columns in groups of 8: 96
    // blocks on 132 SMs): then half as many.
    let mut groups = (max_warps / k_warps).max(1);
    if groups > 1 && oc.div_ceil(groups) < gpu.sm_count() {
        groups /= 2;
    }
    let threads = (groups * k_warps * 32) as u32;
    let kernel = kernels.for_rows(n);
    let shared = decode_gemv_shared_bytes(n as u32, c as u32, ln);
    let cfg =
        resident_grid(gpu, ws, kernel, threads, shared, oc.div_ceil(groups), blocks_per_sm)?.ok_or_else(|| {
            OpError::shape(
                OP_GEMV,
                format!("a block of {kernel} ({threads} threads) does not fit an SM"),
            )
        })?;
    Ok((cfg, k_warps as u32))
}

/// A grid of `kernel` blocks of `threads` and `shared` bytes, all resident
/// at once (at most `blocks_per_sm` a SM where nonzero, and the greedy
/// partials' `max_blocks`) and at most one per work unit (`units`: they
/// stride over the rest); `None` where not one block fits an SM.
fn resident_grid(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    kernel: &'static str,
    threads: u32,
    shared: u32,
    units: usize,
    blocks_per_sm: usize,
) -> Result<Option<LaunchConfig>, OpError> {
    if shared > DEFAULT_SHARED_LIMIT {
        gpu.set_max_dynamic_shared(kernel, shared)?;
    }
    let mut per_sm = (ws.resident(gpu, kernel, threads, shared)? as usize).min(MAX_BLOCKS_PER_SM);
    if per_sm == 0 {
        return Ok(None);
    }
    if blocks_per_sm > 0 {
        per_sm = per_sm.min(blocks_per_sm);
    }
    let blocks = units.min(gpu.sm_count() * per_sm).min(ws.max_blocks).max(1);
    Ok(Some(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    }))
}

/// Fewest rows the GEMV takes to the tensor cores: one row reads each
/// staged value once per column either way (a broadcast), and its kernel
/// keeps fewer registers.
pub const MMA_MIN_ROWS: usize = 2;

/// The launch of the tensor-core GEMV `kernel` of `shape` (`m` rows, inner
/// size `k` in steps of `step` elements a warp, `n` columns): `k_warps` warps a block
/// (two steps each, within the kernel's bounds), blocks striding over the
/// 16-column tiles (as many as are resident, at most one per tile); `None`
/// where not one block fits an SM (the caller takes the other kernel).
fn mma_config(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    kernel: &'static str,
    step: usize,
    shape: MatmulShape,
    ln: bool,
    blocks_per_sm: usize,
) -> Result<Option<(LaunchConfig, u32)>, OpError> {
    let MatmulShape { m: n, n: oc, k: c } = shape;
    let per_warp = step * DECODE_GEMV_MMA_BATCH as usize;
    let warps = c
        .div_ceil(per_warp)
        .clamp(DECODE_GEMV_MMA_MIN_WARPS as usize, DECODE_GEMV_MMA_MAX_WARPS as usize);
    let threads = (warps * 32) as u32;
    let shared = decode_gemv_mma_shared_bytes(n as u32, c as u32, ln, warps as u32);
    let tiles = oc.div_ceil(DECODE_GEMV_MMA_TILE as usize);
    let cfg = resident_grid(gpu, ws, kernel, threads, shared, tiles, blocks_per_sm)?;
    Ok(cfg.map(|cfg| (cfg, warps as u32)))
}

/// Bytes of one weight load of the GEMV: `c` is a multiple of the values it holds.
const LOAD_BYTES: usize = 16;

/// The GEMV kernels of one weight format.
struct GemvKernels {
    /// By the most rows they serve (`DECODE_GEMV_VARIANT_ROWS`).
    names: [&'static str; 4],
    /// Elements of a weight row one warp covers.
    chunk: u32,
    /// Elements the inner size must be a multiple of (one 16-byte load).
    c_multiple: usize,
    /// The tensor-core kernel for 2+ rows.
    mma: &'static str,
}

/// Where a weight format's GEMV kernels come from.
trait GemvWeight: KernelWeight
where
    DecodeGemvParams<Self>: KernelParams,
{
    const KERNELS: GemvKernels;
}

impl GemvWeight for f32 {
    const KERNELS: GemvKernels = GemvKernels {
        names: DECODE_GEMV_VARIANTS,
        chunk: DECODE_GEMV_CHUNK,
        c_multiple: LOAD_BYTES / size_of::<f32>(),
        mma: DECODE_GEMV_MMA,
    };
}

impl GemvWeight for u16 {
    const KERNELS: GemvKernels = GemvKernels {
        names: DECODE_GEMV_BF16_VARIANTS,
        chunk: DECODE_GEMV_CHUNK_BF16,
        c_multiple: LOAD_BYTES / size_of::<u16>(),
        mma: DECODE_GEMV_BF16_MMA,
    };
}

impl GemvKernels {
    /// The kernel for `n` rows: the one with the fewest accumulators that serves them.
    fn for_rows(&self, n: usize) -> &'static str {
        self.names
            .iter()
            .zip(DECODE_GEMV_VARIANT_ROWS)
            .find(|&(_, rows)| n <= rows as usize)
            .map_or(self.names[self.names.len() - 1], |(name, _)| name)
    }
}

/// The parameters one [`decode_gemv`] reads: the prologue's layernorm, the
/// weight and the epilogue's bias (one layer's linear, its input's
/// layernorm folded in).
#[derive(Clone, Copy)]
pub struct GemvWeights<'a> {
    /// Layernorm each input row first with these (`[k]` each).
    pub ln: Option<LayernormWeights<'a, CudaSlice<f32>>>,
    /// `[n, k]`.
    pub weight: WeightRef<'a>,
    /// `[n]`.
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// `Output = epilogue(prologue(Input) · weightᵀ)` for `shape.m` rows (see
/// `DecodeGemvParams` and [`GemvWeights`]).
pub fn decode_gemv(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    launch: DecodeLaunch<'_>,
    input: Input<'_>,
    weights: GemvWeights<'_>,
    output: Output<'_>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    match weights.weight {
        WeightRef::F32(_) => gemv_typed::<f32>(gpu, ws, launch, input, weights, output, shape),
        WeightRef::Bf16(_) => gemv_typed::<u16>(gpu, ws, launch, input, weights, output, shape),
    }
}

/// [`decode_gemv`] with weights of element type `W` (`weight`, and the
/// embedding's `wte`, must hold that type).
fn gemv_typed<W: GemvWeight>(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    launch: DecodeLaunch<'_>,
    input: Input<'_>,
    weights: GemvWeights<'_>,
    output: Output<'_>,
    shape: MatmulShape,
) -> Result<(), OpError>
where
    DecodeGemvParams<W>: KernelParams,
{
    // The kernel's names: n rows, c inner, oc columns.
    let MatmulShape { m: n, n: oc, k: c } = shape;
    let GemvWeights { ln, weight, bias } = weights;
    let kernels = &W::KERNELS;
    let weight_ptr = W::ptr(gpu, weight).ok_or_else(|| OpError::shape(OP_GEMV, "weight format mismatch"))?;
    if n == 0 || n > ws.max_rows || n > DECODE_MAX_ROWS as usize {
        return Err(OpError::shape(
            OP_GEMV,
            format!(
                "{n} rows: the workspace serves 1..={}, the GEMV 1..={DECODE_MAX_ROWS}",
                ws.max_rows
            ),
        ));
    }
    let cm = kernels.c_multiple;
    if c == 0 || !c.is_multiple_of(cm) || c > DECODE_GEMV_MAX_C as usize || oc == 0 {
        return Err(OpError::shape(
            OP_GEMV,
            format!("c = {c}, oc = {oc}: c must be a positive multiple of {cm} up to {DECODE_GEMV_MAX_C}"),
        ));
    }
    to_u32(OP_GEMV, "oc * c", oc * c)?;
    check_len(OP_GEMV, "weight", weight.len(), oc * c)?;
    let null = std::ptr::null::<f32>();
    let mut p = DecodeGemvParams::<W> {
        out: std::ptr::null_mut(),
        inp: null,
        ln_weight: null,
        ln_bias: null,
        weight: weight_ptr,
        bias: null,
        residual: null,
        tokens: std::ptr::null(),
        pos: std::ptr::null(),
        wte: std::ptr::null(),
        wpe: null,
        embed_out: std::ptr::null_mut(),
        vocab: 0,
        max_pos: 0,
        k_cache: std::ptr::null_mut(),
        v_cache: std::ptr::null_mut(),
        nh: 0,
        max_t: 0,
        ids: std::ptr::null_mut(),
        tokens_next: std::ptr::null_mut(),
        pos_next: std::ptr::null_mut(),
        part_val: std::ptr::null_mut(),
        part_idx: std::ptr::null_mut(),
        counter: std::ptr::null_mut(),
        v: 0,
        n: n as u32,
        c: c as u32,
        oc: oc as u32,
        gelu: 0,
        k_warps: 1,
        prefetch_late: launch.prefetch.late as u32,
        early_trigger: launch.early_trigger as u32,
        prefetch: launch.prefetch.ranges,
    };
    let mut addrs = vec![p.weight as usize];
    match input {
        Input::Rows(inp) => {
            check_len(OP_GEMV, "inp", inp.len(), n * c)?;
            p.inp = in_ptr(gpu, inp);
            addrs.push(p.inp as usize);
        }
        Input::Embed(e) => {
            if e.vocab == 0 || e.max_pos == 0 {
                return Err(OpError::shape(OP_GEMV, "empty embedding table"));
            }
            check_len(OP_GEMV, "tokens", e.tokens.len(), n)?;
            check_len(OP_GEMV, "pos", e.pos.len(), n)?;
            check_len(OP_GEMV, "wte", e.wte.len(), e.vocab * c)?;
            let wte =
                W::ptr(gpu, e.wte).ok_or_else(|| OpError::shape(OP_GEMV, "wte and weight must have one format"))?;
            check_len(OP_GEMV, "wpe", e.wpe.len(), e.max_pos * c)?;
            check_len(OP_GEMV, "embed out", e.out.len(), n * c)?;
            p.tokens = in_ptr(gpu, e.tokens);
            p.pos = in_ptr(gpu, e.pos);
            p.wte = wte;
            p.wpe = in_ptr(gpu, e.wpe);
            p.embed_out = out_ptr(gpu, e.out);
            p.vocab = to_u32(OP_GEMV, "vocab", e.vocab)?;
            p.max_pos = to_u32(OP_GEMV, "max_pos", e.max_pos)?;
            addrs.extend([p.wte as usize, p.wpe as usize, p.embed_out as usize]);
        }
    }
    if let Some(LayernormWeights { weight: w, bias: b }) = ln {
        check_len(OP_GEMV, "ln_weight", w.len(), c)?;
        check_len(OP_GEMV, "ln_bias", b.len(), c)?;
        p.ln_weight = in_ptr(gpu, w);
        p.ln_bias = in_ptr(gpu, b);
        addrs.extend([p.ln_weight as usize, p.ln_bias as usize]);
    }
    if let Some(b) = bias {
        check_len(OP_GEMV, "bias", b.len(), oc)?;
        p.bias = in_ptr(gpu, b);
    }
    match output {
        Output::Rows { out, residual, gelu } => {
            check_len(OP_GEMV, "out", out.len(), n * oc)?;
            p.out = out_ptr(gpu, out);
            if let Some(r) = residual {
                check_len(OP_GEMV, "residual", r.len(), n * oc)?;
                p.residual = in_ptr(gpu, r);
                if std::ptr::eq(p.residual, p.out) {
                    return Err(OpError::shape(OP_GEMV, "residual may not alias out"));
                }
            }
            p.gelu = gelu as u32;
        }
        Output::Qkv { q, kv, pos, nh, max_t } => {
            let cq = oc / 3;
            if !oc.is_multiple_of(3) || nh == 0 || !cq.is_multiple_of(nh) || max_t == 0 {
                return Err(OpError::shape(
                    OP_GEMV,
                    format!("qkv: oc = {oc} must be 3 x C with C divisible by nh = {nh}"),
                ));
            }
            check_len(OP_GEMV, "q", q.len(), n * cq)?;
            check_len(OP_GEMV, "pos", pos.len(), n)?;
            to_u32(OP_GEMV, "cache", n * cq * max_t)?;
            check_len(OP_GEMV, "KV cache", kv.len(), n * cq * max_t)?;
            p.out = out_ptr(gpu, q);
            (p.k_cache, p.v_cache) = W::cache_ptrs(gpu, kv)
                .ok_or_else(|| OpError::shape(OP_GEMV, "the KV cache must be kept as the weights are (f32 or bf16)"))?;
            p.pos = in_ptr(gpu, pos);
            p.nh = nh as u32;
            p.max_t = max_t as u32;
        }
        Output::Greedy {
            logits,
            ids,
            tokens_next,
            pos_next,
            v,
        } => {
            if v == 0 || v > oc {
                return Err(OpError::shape(OP_GEMV, format!("vocabulary {v} outside 1..={oc}")));
            }
            check_len(OP_GEMV, "logits", logits.len(), n * oc)?;
            check_len(OP_GEMV, "ids", ids.len(), n)?;
            check_len(OP_GEMV, "tokens_next", tokens_next.len(), n)?;
            check_len(OP_GEMV, "pos_next", pos_next.len(), n)?;
            p.out = out_ptr(gpu, logits);
            p.ids = out_ptr(gpu, ids);
            p.tokens_next = out_ptr(gpu, tokens_next);
            p.pos_next = out_ptr(gpu, pos_next);
            p.part_val = out_ptr(gpu, &mut ws.best_val);
            p.part_idx = out_ptr(gpu, &mut ws.best_idx);
            p.counter = out_ptr(gpu, &mut ws.best_counter);
            p.v = v as u32;
        }
    }
    addrs.push(p.out as usize);
    if !aligned16(&addrs) {
        return Err(OpError::shape(OP_GEMV, "buffers must be 16-byte aligned"));
    }
    let step = DECODE_GEMV_MMA_STEP_BYTES as usize / size_of::<W>();
    let mma = if launch.tensor_cores && n >= MMA_MIN_ROWS && c.is_multiple_of(step) {
        let (kernel, blocks_per_sm) = (kernels.mma, launch.blocks_per_sm);
        mma_config(gpu, ws, kernel, step, shape, ln.is_some(), blocks_per_sm)?.map(|l| (kernel, l))
    } else {
        None
    };
    let (kernel, (cfg, k_warps)) = match mma {
        Some(k) => k,
        None => (
            kernels.for_rows(n),
            gemv_config(
                gpu,
                ws,
                kernels,
                shape,
                ln.is_some(),
                launch.blocks_per_sm,
                launch.block_warps,
            )?,
        ),
    };
    p.k_warps = k_warps;
    // SAFETY: every buffer the params name was checked above to hold what
    // the kernel reads or writes for n rows, c, oc (and the greedy
    // partials hold max_blocks >= grid rows); 16-byte aligned; c a
    // multiple of the format's 16-byte load (4 f32, 8 bf16; the tensor-core
    // kernels: of a step, 16 f32 or 32 bf16), c <= MAX_C, n <= MAX_ROWS; the kernel's element type
    // is W, as weight and wte hold; the launch (`gemv_config`/`mma_config`)
    // gives the shared memory its kernel lays out, and k_warps as that
    // kernel reads it; the kernel keeps the PDL contract; the prefetch
    // ranges lie inside buffers `launch` borrows (L2Prefetch::push).
    unsafe { gpu.launch_pdl(kernel, cfg, p, launch.pdl && gpu.has_wgmma())? };
    Ok(())
}

/// Attention of one query per row over the KV cache, at each row's
/// position (keys `0..=pos[r]`, or the last `window`) of its cache row
/// ([`KvRows`]), heads of size [`DECODE_HEAD_SIZE`]: `out[n, c]` from
/// `q[n, c]`. A row at or past `max_t`, or whose cache row is past the
/// caches', is idle.
pub fn decode_attention<E: KvElem>(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    launch: DecodeLaunch<'_>,
    out: &mut CudaSlice<f32>,
    q: &CudaSlice<f32>,
    cache: KvRows<'_, &CudaSlice<E>, CudaSlice<u32>>,
    shape: DecodeAttentionShape,
) -> Result<(), OpError> {
    let KvRows {
        k_cache,
        v_cache,
        pos,
        cache_row,
    } = cache;
    let DecodeAttentionShape { rows: n, c, nh, window } = shape;
    let max_t = ws.max_t;
    if n == 0 || n > ws.max_rows || nh != ws.nh || nh * DECODE_HEAD_SIZE as usize != c {
        return Err(OpError::shape(
            OP_ATTN,
            format!(
                "n = {n}, nh = {nh}, c = {c}: the workspace serves up to {} rows of {} heads of size {DECODE_HEAD_SIZE}",
                ws.max_rows, ws.nh
            ),
        ));
    }
    check_len(OP_ATTN, "out", out.len(), n * c)?;
    check_len(OP_ATTN, "q", q.len(), n * c)?;
    check_len(OP_ATTN, "pos", pos.len(), n)?;
    let cache_rows = k_cache.len().min(v_cache.len()) / (c * max_t);
    match cache_row {
        Some(rows) => check_len(OP_ATTN, "cache_row", rows.len(), n)?,
        None => check_len(OP_ATTN, "cache rows", cache_rows, n)?,
    }
    let p = DecodeAttentionParams {
        out: out_ptr(gpu, out),
        q: in_ptr(gpu, q),
        k_cache: E::bits(in_ptr(gpu, k_cache)),
        v_cache: E::bits(in_ptr(gpu, v_cache)),
        pos: in_ptr(gpu, pos),
        cache_row: cache_row.map_or(std::ptr::null(), |r| in_ptr(gpu, r)),
        cache_rows: to_u32(OP_ATTN, "cache rows", cache_rows)?,
        part_acc: out_ptr(gpu, &mut ws.part_acc),
        part_ml: out_ptr(gpu, &mut ws.part_ml),
        counter: out_ptr(gpu, &mut ws.attn_counters),
        n: n as u32,
        max_t: max_t as u32,
        c: c as u32,
        nh: nh as u32,
        window: to_u32(OP_ATTN, "window", window)?,
        scale_log2e: std::f32::consts::LOG2_E / (DECODE_HEAD_SIZE as f32).sqrt(),
        parts_stride: ws.parts_stride as u32,
        early_trigger: launch.early_trigger as u32,
        prefetch: launch.prefetch.ranges,
    };
    if !aligned16(&[p.out as usize, p.q as usize, p.k_cache as usize, p.v_cache as usize]) {
        return Err(OpError::shape(OP_ATTN, "buffers must be 16-byte aligned"));
    }
    let cfg = LaunchConfig {
        grid_dim: (max_t.div_ceil(DECODE_ATTN_CHUNK as usize) as u32, nh as u32, n as u32),
        block_dim: (DECODE_ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = E::Bits::kernel(DECODE_ATTENTION, DECODE_ATTENTION_BF16);
    // SAFETY: the caches hold cache_rows rows of nh x max_t x 64 elements (the kernel's type) and
    // the kernel reads no row past them (cache_row holds n entries, or is
    // null and cache_rows >= n), q and out n x c (checked); the workspace's partials hold n*nh*parts_stride entries,
    // parts_stride >= chunks * 2 for this max_t, and its counters n*nh,
    // zero between launches; the kernel keeps the PDL contract; the
    // prefetch ranges lie inside buffers `launch` borrows.
    unsafe { gpu.launch_pdl(kernel, cfg, p, launch.pdl && gpu.has_wgmma())? };
    Ok(())
}
