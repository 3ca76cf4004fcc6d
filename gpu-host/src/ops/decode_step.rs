//! Launch wrapper of the persistent decode step (`gpu_kernels::ops::decode_step`,
//! sm_90a module only): the whole step of up to eight rows in one launch. Its CPU
//! twin is the CPU forward at `t = 1` (`cpu::forward`), as for the fused
//! chain of `ops::decode`.

use cudarc::driver::{CudaSlice, LaunchConfig};
use gpu_kernels::params::KernelParams;
use gpu_kernels::params::decode::DECODE_HEAD_SIZE;
use gpu_kernels::params::decode_step::*;

use super::args::{OpError, aligned16, blocks_for, check_len, in_ptr, out_ptr, to_u32};
use super::decode::DecodeWorkspace;
use super::kv_cache::KvCache;
use super::weight::{KernelWeight, WeightRef};
use crate::Gpu;

const OP: &str = "decode_step";

/// One layer's tensors for [`decode_step`] (GPT-2's names and layouts).
pub struct StepLayer<'a> {
    pub ln1: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    pub qkv: (WeightRef<'a>, &'a CudaSlice<f32>),
    pub attproj: (WeightRef<'a>, &'a CudaSlice<f32>),
    pub ln2: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    pub fc: (WeightRef<'a>, &'a CudaSlice<f32>),
    pub fcproj: (WeightRef<'a>, &'a CudaSlice<f32>),
    /// K and V, `[max_batch][nh][max_t][64]` each, kept as the weights
    /// are (f32, or bf16 with bf16 weights).
    pub kv: &'a mut KvCache,
    /// ln1 folded into qkv and ln2 into fc ([`decode_step_fold`], `[2 *
    /// 3C]` and `[2 * 4C]`), or none: the one-row step then layernorms
    /// the row itself (slower: docs/performance.md, decode step 18). The
    /// step folds over bf16 weights only; f32 weights ignore these.
    pub qkv_fold: Option<&'a CudaSlice<f32>>,
    pub fc_fold: Option<&'a CudaSlice<f32>>,
}

/// The tensors outside the layers, and the sizes.
pub struct StepModel<'a> {
    /// `[vp, c]`, in the layers' format.
    pub wte: WeightRef<'a>,
    /// `[max_pos, c]`
    pub wpe: &'a CudaSlice<f32>,
    pub lnf: (&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    /// lnf folded into the LM head ([`decode_step_fold`], `[2 * vp]`), or
    /// none.
    pub lnf_fold: Option<&'a CudaSlice<f32>>,
    pub c: usize,
    pub nh: usize,
    /// Real and padded vocabulary.
    pub v: usize,
    pub vp: usize,
    pub max_pos: usize,
    pub max_t: usize,
    /// 0 = unlimited.
    pub window: usize,
}

/// The step's rows, state and activations (see `DecodeStepParams`).
pub struct StepBuffers<'a> {
    /// Rows of the step (`n`).
    pub rows: usize,
    pub tokens: &'a mut CudaSlice<u32>,
    pub pos: &'a mut CudaSlice<u32>,
    pub ids: &'a mut CudaSlice<u32>,
    /// `[n, c]`, `[n, c]`, `[n, c]`, `[n, 4c]`, `[n, vp]`.
    pub x: &'a mut CudaSlice<f32>,
    pub q: &'a mut CudaSlice<f32>,
    pub att: &'a mut CudaSlice<f32>,
    pub h: &'a mut CudaSlice<f32>,
    pub logits: &'a mut CudaSlice<f32>,
}

/// The device table of layer pointers the kernel reads, and the grid
/// barrier's counters. Re-uploaded only when a pointer changed (so graph
/// replays, which never call the wrapper, find it current).
pub struct DecodeStepTable {
    table: CudaSlice<u8>,
    /// What `table` holds.
    uploaded: Vec<u8>,
    /// Host staging of the next table (kept: a step allocates nothing).
    staging: Vec<u8>,
    sync: CudaSlice<u32>,
    /// The one-row step's flagged rows (`DecodeStepParams::flags`), zeroed
    /// once: their flags only ever advance.
    flags: CudaSlice<u64>,
    /// Where the kernel records its trace, when on (see
    /// `DecodeStepParams::trace`).
    trace: Option<CudaSlice<u64>>,
}

/// How a step launches.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepLaunch {
    /// The launch may start while the previous kernel finishes (its
    /// weights load meanwhile).
    pub pdl: bool,
    /// The weight ring asked for ([`decode_step_config`]'s `ring`).
    pub ring: RingAsk,
}

/// The weight ring a caller asks of the step ([`decode_step_config`]);
/// the default lets the step choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingAsk {
    /// Slots, 2 to `DECODE_STEP_MAX_SLOTS`; 0 chooses.
    pub slots: usize,
    /// With `slots`: the slots share all the shared memory left, each past
    /// a block's widest share where it fits (fewer, wider tiles).
    pub fill: bool,
}

impl DecodeStepTable {
    /// Room for `layers` layers of width `c`, and the flags of a cache of
    /// `max_t` positions.
    pub fn new(gpu: &Gpu, layers: usize, c: usize, max_t: usize) -> Result<Self, OpError> {
        let bytes = layers * size_of::<DecodeStepLayer<f32>>();
        Ok(DecodeStepTable {
            table: gpu.alloc(bytes)?,
            uploaded: Vec::with_capacity(bytes),
            staging: Vec::with_capacity(bytes),
            sync: gpu.alloc(DECODE_STEP_SYNC_WORDS)?,
            flags: gpu.alloc(decode_step_flag_words(to_u32(OP, "c", c)?, to_u32(OP, "max_t", max_t)?))?,
            trace: None,
        })
    }

    /// Turn the kernel's trace on (room for one block per SM) or off.
    pub fn set_trace(&mut self, gpu: &Gpu, on: bool) -> Result<(), OpError> {
        if !on {
            self.trace = None;
        } else if self.trace.is_none() {
            let layers = self.table.len() / size_of::<DecodeStepLayer<f32>>();
            let words = gpu.sm_count() * decode_step_trace_words(to_u32(OP, "layers", layers)?);
            self.trace = Some(gpu.alloc(words)?);
        }
        Ok(())
    }

    /// The trace buffer, when on: `gridDim.x` blocks of
    /// `decode_step_trace_words(layers)` words, as the last step left it.
    pub fn trace(&self) -> Option<&CudaSlice<u64>> {
        self.trace.as_ref()
    }
}

/// The weight ring a step gets unasked (`RingAsk::slots` 0), where it is not
/// the most slots of a block's widest share: this many slots sharing all
/// the shared memory left (`RingAsk::fill`). Measured on an H200 (`bench step
/// --step-ring-slots N --step-ring-fill`, docs/performance.md, decode step
/// 22): bf16 tiles are quick to multiply, so each tile's fixed costs (its
/// barrier wait, the block barriers, the epilogues) set the LM head's pace,
/// and two large slots (fewer, wider tiles) beat four of the widest share:
/// the LM head 28.8 → 24.1 µs at one row, 40.3 → 32.1 at 8. f32 at several
/// rows: three slots, 1.8 % faster than two (the next phases' tiles load
/// sooner). f32 at one row: the rule's two slots of the widest share; three
/// filled slots were 13 % slower there (the third tile in flight delays the
/// rows' loads), two filled ones 0.5-1 %.
fn filled_ring_slots(elem: usize, n: usize) -> Option<usize> {
    match (elem, n) {
        (2, _) => Some(FILLED_RING_SLOTS_BF16),
        (4, 2..) => Some(FILLED_RING_SLOTS_F32_ROWS),
        _ => None,
    }
}

/// [`filled_ring_slots`] for bf16 weights.
const FILLED_RING_SLOTS_BF16: usize = 2;
/// [`filled_ring_slots`] for f32 weights at two rows and more.
const FILLED_RING_SLOTS_F32_ROWS: usize = 3;

/// The launch of a step of `n` rows of width `c = 64 * nh`, `n_layer`
/// layers, over weights of `elem` bytes: one block per SM, and the weight
/// ring's slots and slot size, the largest that fit beside the fixed parts
/// of shared memory; or `None` where the step does not serve this (not the
/// sm_90a module, other head sizes, too many rows, or no slot that holds
/// the widest weight row). `ring.slots` asks for that many slots, each the
/// largest that fits (up to a block's widest share, or with `ring.fill`
/// past it: the slots then share all the shared memory left); 0 chooses
/// (`filled_ring_slots`, else the most slots of the widest share that
/// fit, at least two).
pub fn decode_step_config(
    gpu: &Gpu,
    n: usize,
    c: usize,
    nh: usize,
    n_layer: usize,
    elem: usize,
    ring: RingAsk,
) -> Option<(LaunchConfig, u32, u32)> {
    let blocks = gpu.sm_count();
    // The tensor-core tiles (two rows and more) take k in steps of 4
    // lanes' 16-byte loads: c = 64 * nh is a multiple of every step.
    let shape_ok = nh > 0 && c == nh * DECODE_HEAD_SIZE as usize && c.is_multiple_of(8) && n_layer > 0;
    if !gpu.has_wgmma() || !shape_ok || n == 0 || n > DECODE_STEP_MAX_ROWS as usize || blocks == 0 {
        return None;
    }
    // Each GEMV phase's (columns, inner size): qkv, attproj, fc, fcproj.
    let phases = [(3 * c, c), (c, c), (4 * c, c), (c, 4 * c)];
    let widest_row = 4 * c * elem;
    let slice = phases
        .iter()
        .map(|&(oc, c_in)| oc.div_ceil(blocks) * c_in * elem)
        .max()?
        .max(widest_row);
    let align = DECODE_STEP_SLOT_ALIGN as usize;
    let fixed = decode_step_smem(n as u32, c as u32, n_layer as u32, blocks as u32, 0, 0).total as usize;
    let avail = gpu.max_shared_per_block().checked_sub(fixed)?;
    let mut slot = slice.next_multiple_of(align);
    let mut slots = (avail / slot).min(DECODE_STEP_MAX_SLOTS as usize);
    // `k` slots: each the widest share, or with `fill` all there is; one
    // that does not hold the widest weight row serves nothing.
    let sized = |k: usize, fill: bool| {
        let share = avail / k / align * align;
        let s = if fill { share } else { slot.min(share) };
        (s >= widest_row).then_some(s)
    };
    if ring.slots != 0 {
        if !(2..=DECODE_STEP_MAX_SLOTS as usize).contains(&ring.slots) {
            return None;
        }
        slots = ring.slots;
        slot = sized(slots, ring.fill)?;
    } else if let Some((k, s)) = filled_ring_slots(elem, n).and_then(|k| Some((k, sized(k, true)?))) {
        (slots, slot) = (k, s);
    } else if slots < 2 {
        // Two smaller slots: a phase then takes several tiles.
        slots = 2;
        slot = avail / 2 / align * align;
        if slot < widest_row {
            return None;
        }
    }
    let total = decode_step_smem(
        n as u32,
        c as u32,
        n_layer as u32,
        blocks as u32,
        slots as u32,
        slot as u32,
    )
    .total;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (DECODE_STEP_THREADS, 1, 1),
        shared_mem_bytes: total,
    };
    Some((cfg, slots as u32, slot as u32))
}

/// The whole decode step of `bufs.rows` rows in one launch (see
/// `DecodeStepParams`): the logits, each row's argmax in `ids` and
/// `tokens`, `pos += 1`, k and v into the caches; launched as `launch` says.
pub fn decode_step<'a>(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    table: &mut DecodeStepTable,
    launch: StepLaunch,
    model: &StepModel<'_>,
    layers: impl ExactSizeIterator<Item = StepLayer<'a>>,
    bufs: StepBuffers<'_>,
) -> Result<(), OpError> {
    match model.wte {
        WeightRef::F32(_) => step_typed::<f32>(gpu, ws, table, launch, model, layers, bufs),
        WeightRef::Bf16(_) => step_typed::<u16>(gpu, ws, table, launch, model, layers, bufs),
    }
}

/// [`decode_step`] over weights of element type `W`.
fn step_typed<'a, W: KernelWeight>(
    gpu: &Gpu,
    ws: &mut DecodeWorkspace,
    table: &mut DecodeStepTable,
    launch: StepLaunch,
    model: &StepModel<'_>,
    layers: impl ExactSizeIterator<Item = StepLayer<'a>>,
    bufs: StepBuffers<'_>,
) -> Result<(), OpError>
where
    DecodeStepParams<W>: KernelParams,
{
    let n = bufs.rows;
    let (c, nh, v, vp, max_t) = (model.c, model.nh, model.v, model.vp, model.max_t);
    let elem = size_of::<W>();
    let n_layer = layers.len();
    let kernel = to_u32(OP, "rows", n)
        .ok()
        .and_then(|rows| decode_step_kernel(rows, elem, table.trace.is_some()))
        .ok_or_else(|| {
            OpError::shape(
                OP,
                format!("{n} rows: the persistent step serves 1 to {DECODE_STEP_MAX_ROWS} rows"),
            )
        })?;
    let Some((cfg, slots, slot_bytes)) = decode_step_config(gpu, n, c, nh, n_layer, elem, launch.ring) else {
        return Err(OpError::shape(
            OP,
            format!(
                "n = {n}, c = {c}, nh = {nh}: the persistent step serves up to {DECODE_STEP_MAX_ROWS} row(s) of heads of 64 on the sm_90a module, with a weight row fitting shared memory"
            ),
        ));
    };
    if n > ws.max_rows() || nh != ws.nh() || max_t != ws.max_t() {
        return Err(OpError::shape(OP, "the workspace was made for other sizes"));
    }
    if v == 0 || v > vp || model.max_pos == 0 || max_t == 0 {
        return Err(OpError::shape(
            OP,
            format!("vocabulary {v} of {vp}, max_pos {}", model.max_pos),
        ));
    }
    let wrong = || OpError::shape(OP, "every weight must have the wte's format");
    let cache = n * c * max_t;
    to_u32(OP, "cache", cache)?;
    to_u32(OP, "logits", n * vp)?;
    to_u32(OP, "wte", vp * c)?;
    let unaligned = || OpError::shape(OP, "buffers must be 16-byte aligned");
    table.staging.clear();
    for l in layers {
        let w = |(m, b): (WeightRef<'_>, &CudaSlice<f32>), oc: usize, c_in: usize| -> Result<_, OpError> {
            check_len(OP, "weight", m.len(), oc * c_in)?;
            check_len(OP, "bias", b.len(), oc)?;
            Ok((W::ptr(gpu, m).ok_or_else(wrong)?, in_ptr(gpu, b)))
        };
        for (lw, lb) in [l.ln1, l.ln2] {
            check_len(OP, "layernorm weight", lw.len(), c)?;
            check_len(OP, "layernorm bias", lb.len(), c)?;
        }
        check_len(OP, "KV cache", l.kv.len(), cache)?;
        let (k_cache, v_cache) = W::cache_ptrs(gpu, l.kv)
            .ok_or_else(|| OpError::shape(OP, "the KV cache must be kept as the weights are (f32 or bf16)"))?;
        let (qkv_w, qkv_b) = w(l.qkv, 3 * c, c)?;
        let (attproj_w, attproj_b) = w(l.attproj, c, c)?;
        let (fc_w, fc_b) = w(l.fc, 4 * c, c)?;
        let (fcproj_w, fcproj_b) = w(l.fcproj, c, 4 * c)?;
        let qkv_fold = fold_ptr(gpu, l.qkv_fold, 3 * c)?;
        let fc_fold = fold_ptr(gpu, l.fc_fold, 4 * c)?;
        let layer = DecodeStepLayer::<W> {
            ln1_w: in_ptr(gpu, l.ln1.0),
            ln1_b: in_ptr(gpu, l.ln1.1),
            qkv_w,
            qkv_b,
            attproj_w,
            attproj_b,
            ln2_w: in_ptr(gpu, l.ln2.0),
            ln2_b: in_ptr(gpu, l.ln2.1),
            fc_w,
            fc_b,
            fcproj_w,
            fcproj_b,
            k_cache,
            v_cache,
            qkv_fold,
            fc_fold,
        };
        if !aligned16(&[
            layer.ln1_w as usize,
            layer.ln1_b as usize,
            layer.qkv_w as usize,
            layer.attproj_w as usize,
            layer.ln2_w as usize,
            layer.ln2_b as usize,
            layer.fc_w as usize,
            layer.fcproj_w as usize,
            layer.k_cache as usize,
            layer.v_cache as usize,
        ]) {
            return Err(unaligned());
        }
        // SAFETY: `DecodeStepLayer` is `repr(C)` and made of 16 pointers
        // (no padding, no invalid byte patterns): its bytes are what the
        // kernel reads.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&layer as *const DecodeStepLayer<W>).cast::<u8>(),
                size_of::<DecodeStepLayer<W>>(),
            )
        };
        table.staging.extend_from_slice(bytes);
    }
    if table.staging.len() > table.table.len() {
        return Err(OpError::shape(
            OP,
            format!("{n_layer} layers: the table was made for fewer"),
        ));
    }
    if table.staging != table.uploaded {
        let len = table.staging.len();
        gpu.stream
            .memcpy_htod(&table.staging, &mut table.table.slice_mut(0..len))
            .map_err(|e| OpError::shape(OP, format!("uploading the layer table: {e}")))?;
        std::mem::swap(&mut table.staging, &mut table.uploaded);
    }
    check_len(OP, "wte", model.wte.len(), vp * c)?;
    check_len(OP, "wpe", model.wpe.len(), model.max_pos * c)?;
    check_len(OP, "lnf weight", model.lnf.0.len(), c)?;
    check_len(OP, "lnf bias", model.lnf.1.len(), c)?;
    for (what, len, need) in [
        ("tokens", bufs.tokens.len(), n),
        ("pos", bufs.pos.len(), n),
        ("ids", bufs.ids.len(), n),
    ] {
        check_len(OP, what, len, need)?;
    }
    for (what, len, need) in [
        ("x", bufs.x.len(), n * c),
        ("q", bufs.q.len(), n * c),
        ("att", bufs.att.len(), n * c),
        ("h", bufs.h.len(), n * 4 * c),
        ("logits", bufs.logits.len(), n * vp),
    ] {
        check_len(OP, what, len, need)?;
    }
    check_len(
        OP,
        "flags",
        table.flags.len(),
        decode_step_flag_words(c as u32, max_t as u32),
    )?;
    let (part_val, part_idx, att_acc, att_ml, att_counter, parts_stride) = ws.step_scratch(gpu, gpu.sm_count())?;
    let trace = match table.trace.as_mut() {
        Some(t) => {
            check_len(
                OP,
                "trace",
                t.len(),
                cfg.grid_dim.0 as usize * decode_step_trace_words(n_layer as u32),
            )?;
            out_ptr(gpu, t)
        }
        None => std::ptr::null_mut(),
    };
    let p = DecodeStepParams::<W> {
        layers: in_ptr(gpu, &table.table) as *const DecodeStepLayer<W>,
        wte: W::ptr(gpu, model.wte).ok_or_else(wrong)?,
        wpe: in_ptr(gpu, model.wpe),
        lnf_w: in_ptr(gpu, model.lnf.0),
        lnf_b: in_ptr(gpu, model.lnf.1),
        lnf_fold: fold_ptr(gpu, model.lnf_fold, vp)?,
        tokens: out_ptr(gpu, bufs.tokens),
        pos: out_ptr(gpu, bufs.pos),
        ids: out_ptr(gpu, bufs.ids),
        x: out_ptr(gpu, bufs.x),
        q: out_ptr(gpu, bufs.q),
        att: out_ptr(gpu, bufs.att),
        h: out_ptr(gpu, bufs.h),
        logits: out_ptr(gpu, bufs.logits),
        part_val,
        part_idx,
        att_acc,
        att_ml,
        att_counter,
        sync: out_ptr(gpu, &mut table.sync),
        flags: out_ptr(gpu, &mut table.flags),
        n_layer: to_u32(OP, "layers", n_layer)?,
        n: n as u32,
        c: c as u32,
        nh: nh as u32,
        v: v as u32,
        vp: vp as u32,
        max_t: max_t as u32,
        max_pos: to_u32(OP, "max_pos", model.max_pos)?,
        window: to_u32(OP, "window", model.window)?,
        parts_stride,
        scale_log2e: std::f32::consts::LOG2_E / (DECODE_HEAD_SIZE as f32).sqrt(),
        slots,
        slot_bytes,
        trace,
    };
    if !aligned16(&[
        p.wte as usize,
        p.wpe as usize,
        p.lnf_w as usize,
        p.lnf_b as usize,
        p.x as usize,
        p.q as usize,
        p.att as usize,
        p.h as usize,
        p.logits as usize,
        p.layers as usize,
    ]) {
        return Err(unaligned());
    }
    gpu.set_max_dynamic_shared(kernel, cfg.shared_mem_bytes)?;
    if gpu.occupancy_blocks_per_sm(kernel, cfg.block_dim.0, cfg.shared_mem_bytes)? == 0 {
        return Err(OpError::shape(OP, "a block does not fit an SM"));
    }
    // SAFETY: every buffer the params (and the uploaded layer table, which
    // the copy above made current, in stream order) name holds what the
    // kernel reads or writes for n rows, c, nh, max_t, vp (checked above),
    // 16-byte aligned, weights in W's format; the workspace's scratch holds
    // gridDim.x * n argmax partials and n * nh * parts_stride attention
    // partials with zeroed counters, and the first two sync words are zero
    // between launches (the kernel leaves them so), the third and the flags
    // (checked above) only ever written by this table's launches; the trace, when on, holds
    // gridDim.x blocks of its words (checked above); one block per SM, each fitting
    // (occupancy >= 1, so the grid is resident at once for its barriers);
    // shared memory as `decode_step_smem` lays out; the kernel keeps the
    // PDL contract (weights only before its wait).
    unsafe { gpu.launch_pdl(kernel, cfg, p, launch.pdl)? };
    Ok(())
}

/// The device address of a fold of `oc` columns, or null for none.
fn fold_ptr(gpu: &Gpu, fold: Option<&CudaSlice<f32>>, oc: usize) -> Result<*const f32, OpError> {
    match fold {
        None => Ok(std::ptr::null()),
        Some(f) => {
            check_len(OP, "fold", f.len(), DECODE_STEP_FOLD_PAIR * oc)?;
            Ok(in_ptr(gpu, f))
        }
    }
}

/// `decode_step_fold`: the layernorm `ln` (weight, bias: `[c]` each) folded
/// into the `[oc, c]` `weight` and its `bias` (none: zero), for the one-row
/// step ([`StepLayer::qkv_fold`]): `out[2j] = Σ_k γ_k weight[j][k]`,
/// `out[2j + 1] = bias_j + Σ_k β_k weight[j][k]` over the weight's values
/// as stored. CPU twin: `cpu::ops::decode_step_fold`. Made once per model:
/// a fold is stale once its weights change.
pub fn decode_step_fold(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    ln: (&CudaSlice<f32>, &CudaSlice<f32>),
    weight: WeightRef<'_>,
    bias: Option<&CudaSlice<f32>>,
    oc: usize,
    c: usize,
) -> Result<(), OpError> {
    const OP: &str = "decode_step_fold";
    check_len(OP, "out", out.len(), DECODE_STEP_FOLD_PAIR * oc)?;
    check_len(OP, "ln weight", ln.0.len(), c)?;
    check_len(OP, "ln bias", ln.1.len(), c)?;
    check_len(OP, "weight", weight.len(), oc * c)?;
    if let Some(b) = bias {
        check_len(OP, "bias", b.len(), oc)?;
    }
    if !c.is_multiple_of(8) {
        return Err(OpError::shape(OP, format!("c = {c}: a multiple of 8")));
    }
    let cfg = LaunchConfig {
        grid_dim: (blocks_for(to_u32(OP, "oc", oc)?, DECODE_STEP_FOLD_COLUMNS), 1, 1),
        block_dim: (DECODE_STEP_FOLD_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    if oc == 0 {
        return Ok(());
    }
    let (c, oc) = (to_u32(OP, "c", c)?, to_u32(OP, "oc", oc)?);
    let (ln_w, ln_b) = (in_ptr(gpu, ln.0), in_ptr(gpu, ln.1));
    let bias = bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b));
    let out = out_ptr(gpu, out);
    // The weight's own pointer is set by `launch_fold`, by its type.
    let template = DecodeStepFoldParams::<f32> {
        w: std::ptr::null(),
        ln_w,
        ln_b,
        bias,
        out,
        c,
        oc,
    };
    match weight {
        WeightRef::F32(_) => launch_fold::<f32>(gpu, DECODE_STEP_FOLD, cfg, weight, template),
        WeightRef::Bf16(_) => launch_fold::<u16>(gpu, DECODE_STEP_FOLD_BF16, cfg, weight, template),
    }
}

/// [`decode_step_fold`]'s launch by kernel `name` over `weight`'s elements
/// (type `W`), the other parameters as `template` holds them.
fn launch_fold<W: KernelWeight>(
    gpu: &Gpu,
    name: &'static str,
    cfg: LaunchConfig,
    weight: WeightRef<'_>,
    template: DecodeStepFoldParams<f32>,
) -> Result<(), OpError>
where
    DecodeStepFoldParams<W>: KernelParams,
{
    const OP: &str = "decode_step_fold";
    let w = W::ptr(gpu, weight).ok_or_else(|| OpError::shape(OP, "weight format"))?;
    if !aligned16(&[w as usize]) {
        return Err(OpError::shape(OP, "the weight must be 16-byte aligned"));
    }
    let DecodeStepFoldParams {
        ln_w,
        ln_b,
        bias,
        out,
        c,
        oc,
        ..
    } = template;
    let p = DecodeStepFoldParams::<W> {
        w,
        ln_w,
        ln_b,
        bias,
        out,
        c,
        oc,
    };
    // SAFETY: every buffer holds what the params say (checked by
    // `decode_step_fold`), the weight of the kernel's element type and
    // 16-byte aligned, c % 8 == 0; the grid covers oc columns.
    unsafe { gpu.launch(name, cfg, p)? };
    Ok(())
}

#[cfg(test)]
mod tests {
    use gpu_kernels::params::decode_step::{DECODE_STEP_WARPS, decode_step_rows_units};

    /// Steps on the busiest warp when `groups` column groups of `steps`
    /// loop steps are cut into `units` pieces each.
    fn busiest(groups: u32, steps: u32, units: u32) -> u32 {
        (groups * units).div_ceil(DECODE_STEP_WARPS) * steps.div_ceil(units)
    }

    #[test]
    fn rows_units_balance_the_warps_within_the_partials_room() {
        let room = 2 * DECODE_STEP_WARPS;
        for steps in 1..=130 {
            for groups in 1..=room + 8 {
                let units = decode_step_rows_units(groups, steps);
                assert!(
                    units >= 1 && units <= steps,
                    "{groups} groups, {steps} steps: {units} units"
                );
                if groups * units > room {
                    assert_eq!(units, 1, "{groups} groups, {steps} steps: past the room");
                    continue;
                }
                // No other cut within the room leaves the busiest warp fewer steps.
                let best = (1..=steps)
                    .filter(|&u| groups * u <= room)
                    .map(|u| busiest(groups, steps, u))
                    .min()
                    .unwrap();
                assert_eq!(
                    busiest(groups, steps, units),
                    best,
                    "{groups} groups, {steps} steps: {units} units"
                );
            }
        }
        // The case that motivated it: a 19-column tile (10 groups) at k = 768
        // (12 steps), 12 steps on the busiest warp as a power of two of units
        // a group (2), 8 with 3.
        assert_eq!(decode_step_rows_units(10, 12), 3);
        assert_eq!(busiest(10, 12, 2), 12);
        assert_eq!(busiest(10, 12, 3), 8);
    }
}
