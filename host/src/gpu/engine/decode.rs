//! The decode step: one token per row through the fused kernels of
//! `gpu::ops::decode`, replayed from one CUDA graph per (rows, window).
//!
//! Per layer five kernels: ln1 + qkv GEMV (k, v into the cache), attention,
//! attproj GEMV + residual, ln2 + fc GEMV + GELU, fcproj GEMV + residual;
//! the first qkv GEMV also embeds the tokens, and the LM head GEMV
//! layernorms its input and picks each row's argmax. The step's state
//! (token ids, per-row positions) lives in device buffers that the kernels
//! read and the LM head advances, so a captured graph is valid for every
//! step: the host writes those buffers (or leaves them as the last step
//! left them), replays, and reads back the ids.

use std::collections::HashMap;
use std::ops::Range;

use anyhow::{Context, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, PinnedHostSlice};
use gpu_host::ops::attention::max_span;
use gpu_host::shape::{DecodeAttentionShape, KvRows, LayernormWeights, MatmulShape, SampleShape};
use gpu_host::with_kv;
use gpu_kernels::params::decode::{DECODE_GEMV_MAX_C, DECODE_HEAD_SIZE, DECODE_MAX_ROWS, DECODE_PREFETCH_RANGES};
use gpu_kernels::params::decode_step::{DECODE_STEP_ATTN_KEYS, DECODE_STEP_FOLD_PAIR, DECODE_STEP_WARPS};

use super::{Activations, DeviceParams, DeviceWeight, GpuEngine, Last};
use crate::gpu::Gpu;
use crate::gpu::ops::decode::{
    DecodeLaunch, DecodeWorkspace, Embed, GemvWeights, Input, L2Prefetch, Output, decode_attention, decode_gemv,
};
use crate::gpu::ops::decode_step::{
    DecodeStepTable, RingAsk, StepBuffers, StepLaunch, StepLayer, StepModel, decode_step, decode_step_config,
    decode_step_fold,
};
use crate::gpu::ops::kv_cache::KvCache;
use crate::gpu::ops::sample::{DeviceSampleRow, Draws, sample_forward_streams};
use crate::gpu::ops::weight::WeightRef;
use crate::gpu::runtime::CudaContextExt;
use crate::model::ModelConfig;

/// How a decode step (`forward` with `t = 1`, last-position logits) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodePath {
    /// The fused decode kernels, captured once per (rows, window) into a
    /// CUDA graph and replayed for every step (the default).
    #[default]
    Graph,
    /// The same fused kernels, launched one by one (the graph's reference,
    /// and the fallback where capture fails).
    Eager,
    /// The prefill kernels at `t = 1` (one launch per op): the path before
    /// the fused kernels, kept for comparison.
    Unfused,
}

/// The decode step's device state and scratch, made with the engine.
pub(super) struct DecodeState {
    ws: DecodeWorkspace,
    /// `[rows]`: the token each row feeds at this step.
    tokens: CudaSlice<u32>,
    /// `[rows]`: each row's position (tokens already in its cache).
    pos: CudaSlice<u32>,
    /// `[rows]`: the ids the last step chose.
    ids: CudaSlice<u32>,
    /// Pinned host copy of `ids`, for reading a step's choice while the
    /// next step runs (`choose_and_step`).
    ids_host: PinnedHostSlice<u32>,
    /// Rows the state serves (at most `DECODE_MAX_ROWS`).
    rows: usize,
    path: DecodePath,
    pdl: bool,
    /// Captured steps, by [`GraphKey`].
    graphs: HashMap<GraphKey, CudaGraph>,
    /// Set when capture failed once: the engine stays on the eager path.
    capture_failed: bool,
    /// What `ids` holds for the last `forward`.
    ids_hold: Chosen,
    /// Host staging of the positions a `forward` step uploads (so a step
    /// allocates nothing).
    host_pos: Vec<u32>,
    /// The position the next device-driven step decodes at (the state the
    /// last fused step left on the device).
    next_pos: usize,
    /// The most keys a row of the step being queued attends to: it picks
    /// the persistent step or the chain (`runs_persistent`).
    step_keys: usize,
    /// The launch knobs in force (see [`DecodeTuning`]).
    tuning: DecodeTuning,
    /// Each kernel's L2 prefetch under `tuning`, made by the first step
    /// after a change (so a step allocates nothing).
    plan: Option<Vec<KernelPrefetch>>,
    /// Recorded after the copy of `ids` to `ids_host`: the driver does not
    /// track the pinned buffer (the context's event tracking is off).
    ids_copied: CudaEvent,
    /// The persistent step's layer table, made by its first launch.
    step_table: Option<DecodeStepTable>,
    /// The one-row step's folded layernorms, made by its first launch.
    step_folds: Option<StepFolds>,
}

/// The layernorms folded into the GEMVs that read them, for the one-row
/// persistent step (`decode_step_fold`): per layer ln1 into qkv and ln2
/// into fc, then lnf into the LM head. Made once from the engine's
/// weights, which never change after the upload.
struct StepFolds {
    layers: Vec<[CudaSlice<f32>; 2]>,
    lnf: CudaSlice<f32>,
}

impl StepFolds {
    fn new(gpu: &Gpu, p: &DeviceParams, cfg: &ModelConfig) -> Result<StepFolds> {
        let c = cfg.channels;
        let fold = |ln: (&CudaSlice<f32>, &CudaSlice<f32>), w: &DeviceWeight, bias: Option<&CudaSlice<f32>>, oc| {
            let mut out = gpu.alloc::<f32>(DECODE_STEP_FOLD_PAIR * oc)?;
            decode_step_fold(gpu, &mut out, ln, w.as_ref(), bias, oc, c)?;
            anyhow::Ok(out)
        };
        let layers = p
            .layers
            .iter()
            .map(|l| {
                Ok([
                    fold((&l.ln1w, &l.ln1b), &l.qkvw, Some(&l.qkvb), 3 * c)?,
                    fold((&l.ln2w, &l.ln2b), &l.fcw, Some(&l.fcb), 4 * c)?,
                ])
            })
            .collect::<Result<Vec<_>>>()?;
        let lnf = fold((&p.lnfw, &p.lnfb), &p.wte, None, cfg.padded_vocab_size)?;
        Ok(StepFolds { layers, lnf })
    }
}

/// Launch knobs of the fused decode step, for experiments and the bench;
/// the default is what measured fastest (docs/performance.md): the
/// persistent step where it serves the batch, else the chain of fused
/// kernels with no prefetch, every resident block, the early trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeTuning {
    /// How far (bytes) past its own weights each kernel asks L2 to fetch
    /// the weights of the kernels after it (0: no prefetch; capped at a
    /// third of L2). See `plan_prefetch`.
    pub prefetch_ahead_bytes: usize,
    /// Most GEMV blocks per SM (0: as many as fit). Fewer leave room on
    /// each SM for the next kernel's blocks to start under PDL.
    pub gemv_blocks_per_sm: usize,
    /// Most warps per GEMV block (0: the kernels' maximum, 8). Smaller
    /// blocks pack more warps onto an SM when registers or shared memory
    /// (the staged rows: 8 rows of the MLP's 3072 floats are 96 KB) limit
    /// whole blocks.
    pub gemv_block_warps: usize,
    /// Under PDL, let the next kernel launch as soon as this one's blocks
    /// all started (before they wait), not after the wait.
    pub early_trigger: bool,
    /// bf16 GEMVs of two rows or more on tensor cores
    /// (`gpu::ops::decode::MMA_MIN_ROWS`; `DecodeLaunch::tensor_cores`).
    pub tensor_cores: bool,
    /// Run the step as one persistent kernel (`gpu::ops::decode_step`)
    /// where it serves the batch (the sm_90a module, up to
    /// `persistent_max_rows` rows), instead of the chain of fused kernels.
    /// The knobs above tune the chain only.
    pub persistent: bool,
    /// Most rows a step over f32 weights runs as the persistent kernel (it
    /// serves up to 8; from two rows on its tiles run on the FMA units).
    /// Default 8: at 8 rows it is faster than the chain while the caches
    /// are short (0.602 against 0.627 ms a step after 64 tokens on an H100),
    /// and `persistent_rows_max_keys` hands longer ones to the chain, where
    /// the persistent step's attention phase grows (docs/performance.md,
    /// decode steps 9 and 13).
    pub persistent_max_rows: usize,
    /// The same for bf16 weights. Default 8: at 8 rows the persistent step
    /// measured faster than the chain on an H100 (0.434 against 0.468 ms a
    /// step; docs/performance.md, decode steps 6 and 7).
    pub persistent_max_rows_bf16: usize,
    /// At two rows and more over f32 weights, the most keys a row may
    /// attend to (its cache, or the attention window) for the persistent
    /// step to serve the step; past it the chain does. Default
    /// [`PERSISTENT_ROWS_MAX_KEYS_F32`]: the persistent step's attention
    /// phase grows faster with the keys than the chain's
    /// (docs/performance.md, decode steps 11, 13 and 22).
    pub persistent_rows_max_keys: usize,
    /// The same for bf16 weights. Default [`PERSISTENT_ROWS_MAX_KEYS`].
    pub persistent_rows_max_keys_bf16: usize,
    /// The persistent step records when each block's phases start, get
    /// their inputs and end (`GpuEngine::decode_step_trace`): a diagnostic
    /// for the bench, one block barrier per phase dearer. Use it with
    /// `DecodePath::Eager`: the first traced launch allocates the trace
    /// buffer, which a graph capture cannot (the engine would fall back to
    /// eager launches for good).
    pub trace: bool,
    /// Slots of the persistent step's weight ring (2 to 4, each as large as
    /// fits up to a block's widest share; 0: `decode_step_config`'s choice,
    /// by weight type and rows).
    pub step_ring_slots: usize,
    /// With `step_ring_slots`: the slots share all the shared memory left,
    /// each past a block's widest share if it fits (fewer, larger tiles).
    pub step_ring_fill: bool,
    /// The one-row persistent step over bf16 weights multiplies the raw
    /// row by the weights with each layernorm folded into them
    /// (`decode_step_fold`), so no phase waits for a normalised row; off
    /// (and over f32 weights, where it measured 1 % slower): it layernorms
    /// the row first.
    pub fold_layernorms: bool,
}

impl DecodeTuning {
    /// The persistent step's weight ring, as these knobs ask for it.
    fn ring_ask(&self) -> RingAsk {
        RingAsk {
            slots: self.step_ring_slots,
            fill: self.step_ring_fill,
        }
    }
}

impl Default for DecodeTuning {
    fn default() -> Self {
        DecodeTuning {
            prefetch_ahead_bytes: 0,
            gemv_blocks_per_sm: 0,
            gemv_block_warps: 0,
            // Measured 0.4-1 % faster on an H200, at 1 and 8 rows, in two runs.
            early_trigger: true,
            tensor_cores: true,
            // On where it serves the batch (one row, sm_90a): 0.325 against
            // the chain's 0.351 ms a step in FP32, 0.307 against 0.332 in
            // bf16, on an H200 (`bench step`; docs/performance.md, decode
            // step 4).
            persistent: true,
            persistent_max_rows: DECODE_MAX_ROWS as usize,
            persistent_max_rows_bf16: DECODE_MAX_ROWS as usize,
            persistent_rows_max_keys: PERSISTENT_ROWS_MAX_KEYS_F32,
            persistent_rows_max_keys_bf16: PERSISTENT_ROWS_MAX_KEYS,
            trace: false,
            step_ring_slots: 0,
            step_ring_fill: false,
            // docs/performance.md, decode step 18.
            fold_layernorms: true,
        }
    }
}

/// What the `ids` buffer holds for the last `forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chosen {
    /// Nothing of it (the last `forward` was no fused step).
    Nothing,
    /// Each row's argmax (the LM head's greedy epilogue).
    Argmax,
    /// Each row's sampled token (the step ended with `sample_forward`).
    Sampled,
}

/// A captured step: rows, attention window, PDL, whether it samples,
/// whether it runs as the persistent kernel.
type GraphKey = (usize, usize, bool, bool, bool);

/// `DecodeTuning::persistent_rows_max_keys_bf16`'s default: while every row's
/// keys fit one of the persistent step's attention items (128 keys), its
/// attention merges nothing; past that its heads' items are merged across
/// blocks, and at 8 rows the chain is faster. On an H100 (`bench step
/// --step-pos0`, ms a step, persistent against chain): bf16 0.403 against
/// 0.460 after 64 tokens, 0.515 against 0.484 after 128, 0.585 against
/// 0.510 after 256; FP32 0.602 against 0.627, 0.711 against 0.652
/// (docs/performance.md, decode step 13).
pub const PERSISTENT_ROWS_MAX_KEYS: usize = (DECODE_STEP_WARPS * DECODE_STEP_ATTN_KEYS) as usize;

/// `DecodeTuning::persistent_rows_max_keys`'s default (f32 weights): two
/// of the persistent step's attention items. With its tiles' warps
/// balanced (decode step 22) the 8-row f32 step beats the chain up to
/// there and not reliably past it (H200, `bench step --step-pos0`, ms a
/// step, persistent against chain): 0.573 against 0.614 after 128
/// tokens, 0.583 against 0.615 after 192, 0.631 against 0.634 after 256;
/// 0.646 against 0.637 after 320, 0.709 against 0.685 after 576, 0.813
/// against 0.746 after 768. bf16 loses past one item (0.476 against 0.452
/// after 128 tokens).
pub const PERSISTENT_ROWS_MAX_KEYS_F32: usize = 2 * PERSISTENT_ROWS_MAX_KEYS;

/// A prefetch distance to try (`DecodeTuning::prefetch_ahead_bytes`): the
/// largest GPT-2 124M matrix (fc, 9.4 MB) and more, well inside a Hopper L2
/// (50 MB).
pub const PREFETCH_AHEAD_TRY_BYTES: usize = 16 << 20;
/// The prefetch distance never exceeds this fraction of L2, so prefetched
/// lines are not evicted by the traffic before their use.
const PREFETCH_L2_FRACTION: usize = 3;

impl DecodeState {
    /// Most rows a fused step serves.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// The path asked for ([`GpuEngine::set_decode_path`]).
    pub(super) fn path(&self) -> DecodePath {
        self.path
    }

    /// The state for up to `max_batch` rows (capped at the kernels'
    /// `DECODE_MAX_ROWS`), or `None` where the fused kernels do not serve
    /// the model (head size, widths).
    pub(super) fn new(gpu: &Gpu, config: &ModelConfig, max_batch: usize, max_seq_len: usize) -> Result<Option<Self>> {
        if !Self::supported(config) {
            return Ok(None);
        }
        let rows = max_batch.min(DECODE_MAX_ROWS as usize);
        Ok(Some(DecodeState {
            ws: DecodeWorkspace::new(gpu, rows, config.num_heads, max_seq_len)?,
            tokens: gpu.alloc(rows)?,
            pos: gpu.alloc(rows)?,
            ids: gpu.alloc(rows)?,
            ids_host: gpu.alloc_pinned_u32(rows)?,
            rows,
            path: DecodePath::default(),
            pdl: true,
            graphs: HashMap::new(),
            capture_failed: false,
            ids_hold: Chosen::Nothing,
            host_pos: Vec::with_capacity(rows),
            next_pos: 0,
            step_keys: 0,
            tuning: DecodeTuning::default(),
            plan: None,
            ids_copied: gpu.new_event().ctx("cuEventCreate")?,
            step_table: None,
            step_folds: None,
        }))
    }

    /// Whether the fused kernels serve this model: head size 64, and the
    /// widest GEMV input (the MLP's 4C) within what the GEMV stages.
    pub(super) fn supported(config: &ModelConfig) -> bool {
        let c = config.channels;
        config.num_heads > 0
            && c == config.num_heads * DECODE_HEAD_SIZE as usize
            && 4 * c <= DECODE_GEMV_MAX_C as usize
            && c.is_multiple_of(4)
    }

    /// Device bytes [`DecodeState::new`] allocates.
    pub(super) fn device_bytes(config: &ModelConfig, max_batch: usize, max_seq_len: usize, sms: usize) -> usize {
        if !Self::supported(config) {
            return 0;
        }
        let rows = max_batch.min(DECODE_MAX_ROWS as usize);
        (DecodeWorkspace::device_words(sms, rows, config.num_heads, max_seq_len) + 3 * rows) * 4
    }
}

impl GpuEngine {
    /// Choose how decode steps run (see [`DecodePath`]); `pdl` turns
    /// programmatic dependent launch on or off for the fused kernels (it
    /// takes effect on the sm_90a module only). A no-op for models the fused
    /// kernels do not serve.
    pub fn set_decode_path(&mut self, path: DecodePath, pdl: bool) {
        if let Some(d) = self.decode.as_mut() {
            d.path = path;
            d.pdl = pdl;
        }
    }

    /// Set the fused decode step's launch knobs (see [`DecodeTuning`]).
    /// Drops the captured graphs, which hold the old launches.
    pub fn set_decode_tuning(&mut self, tuning: DecodeTuning) {
        if let Some(d) = self.decode.as_mut() {
            d.tuning = tuning;
            d.plan = None;
            d.graphs.clear();
        }
    }

    /// The decode path that a step of `rows` rows takes now.
    pub fn decode_path_in_use(&self, rows: usize) -> DecodePath {
        match &self.decode {
            Some(d) if rows <= d.rows && self.flash.is_some() => match d.path {
                DecodePath::Graph if d.capture_failed => DecodePath::Eager,
                p => p,
            },
            _ => DecodePath::Unfused,
        }
    }

    /// The persistent step's trace as its last launch left it
    /// (`DecodeTuning::trace`; layout: `DecodeStepParams::trace`), after
    /// the stream's work; `None` when no traced persistent step ran.
    pub fn decode_step_trace(&self) -> Result<Option<Vec<u64>>> {
        let Some(t) = self
            .decode
            .as_ref()
            .and_then(|d| d.step_table.as_ref())
            .and_then(|t| t.trace())
        else {
            return Ok(None);
        };
        Ok(Some(self.gpu.clone_dtoh(t)?))
    }

    /// Whether a fused step of `rows` rows whose longest row is at
    /// position `pos` (attending to its keys up to `pos`, within the
    /// attention window) runs as the persistent kernel
    /// (`DecodeTuning::persistent`, where it serves the batch) rather than
    /// the chain of fused kernels.
    pub fn decode_step_is_persistent(&self, rows: usize, pos: usize) -> bool {
        self.decode_path_in_use(rows) != DecodePath::Unfused
            && self.decode.as_ref().is_some_and(|d| {
                let keys = max_span(pos as u32, 1, self.window as u32) as usize;
                runs_persistent(&self.gpu, &self.config, &self.params, &d.tuning, rows, keys)
            })
    }

    /// The ids the last fused step chose as `what`, if the last `forward`
    /// was such a step.
    pub(super) fn fresh_ids(&self, what: Chosen) -> Option<&CudaSlice<u32>> {
        self.decode.as_ref().filter(|d| d.ids_hold == what).map(|d| &d.ids)
    }

    /// Forget what the last fused step chose (any other `forward`).
    pub(super) fn mark_ids_stale(&mut self) {
        if let Some(d) = self.decode.as_mut() {
            d.ids_hold = Chosen::Nothing;
        }
    }

    /// The position the next device-fed step decodes at, after a fused step.
    pub(super) fn decode_next_pos(&self) -> Option<usize> {
        self.decode.as_ref().map(|d| d.next_pos)
    }

    /// Whether a fused step of `b` rows ends by sampling: sampling was
    /// prepared for exactly `b` rows.
    fn step_samples(&self, b: usize) -> bool {
        self.sampling.prepared && self.sampling.uploaded.len() == b
    }

    /// `Backend::choose_and_step` on the fused path: the choice of the last
    /// fused step (argmax, or the prepared sampling), copied to pinned
    /// memory, then one more step fed from the device at `pos`; the copy is
    /// read while that step runs.
    pub(super) fn fused_choose_and_step(&mut self, pos: usize) -> Result<Option<Vec<u32>>> {
        let Some(last) = self.last else { return Ok(None) };
        let b = last.b;
        let want = if self.step_samples(b) {
            Chosen::Sampled
        } else {
            Chosen::Argmax
        };
        let max_t = self.max_seq_len;
        let Some(d) = self.decode.as_mut() else { return Ok(None) };
        if d.ids_hold != want || d.next_pos != pos || pos >= max_t {
            return Ok(None);
        }
        self.gpu
            .memcpy_dtoh(&d.ids.slice(0..b), &mut d.ids_host)
            .ctx("copying the chosen ids")?;
        self.gpu.record(&d.ids_copied).ctx("cuEventRecord")?;
        self.decode_on_device(1)?;
        let d = self.decode.as_mut().context("the fused decode state is missing")?;
        d.ids_copied.synchronize().ctx("waiting for the chosen ids")?;
        let ids = d.ids_host.as_slice().ctx("reading the chosen ids")?;
        Ok(Some(ids[..b].to_vec()))
    }

    /// The step's inputs and the decode state, borrowed apart.
    fn split_for_step(&mut self, b: usize) -> Result<(Step<'_>, &mut DecodeState)> {
        let sample = self
            .step_samples(b)
            .then_some((&self.sampling.rows, &self.sampling.streams));
        let d = self.decode.as_mut().context("the fused decode state is missing")?;
        let step = Step {
            sample,
            gpu: &self.gpu,
            config: &self.config,
            params: &self.params,
            acts: &mut self.acts,
            kv_cache: &mut self.kv_cache,
            max_t: self.max_seq_len,
            window: self.window,
        };
        Ok((step, d))
    }

    /// One fused decode step: `tokens[r]` at position `pos0` of every row.
    pub(super) fn decode_forward(&mut self, tokens: &[u32], b: usize, pos0: usize) -> Result<()> {
        let d = self.decode.as_mut().context("the fused decode state is missing")?;
        let mut pos = std::mem::take(&mut d.host_pos);
        pos.clear();
        pos.resize(b, u32::try_from(pos0).context("position beyond u32")?);
        let done = self.decode_forward_at(tokens, &pos);
        if let Some(d) = self.decode.as_mut() {
            d.host_pos = pos;
            if done.is_ok() {
                d.next_pos = pos0 + 1;
            }
        }
        done
    }

    /// One fused decode step: `tokens[r]` at position `pos[r]` of row `r`,
    /// where a position at or past `max_seq_len` makes the row idle (it
    /// stores nothing in the cache; its outputs mean nothing). The rows'
    /// positions need not agree, so the device-fed continuation
    /// (`choose_and_step`, `decode_on_device`) is off until the next
    /// [`GpuEngine::decode_forward`].
    pub(super) fn decode_forward_at(&mut self, tokens: &[u32], pos: &[u32]) -> Result<()> {
        let b = tokens.len();
        anyhow::ensure!(pos.len() == b, "{} positions for {b} rows", pos.len());
        let path = self.decode_path_in_use(b);
        let (mut step, d) = self.split_for_step(b)?;
        d.ids_hold = Chosen::Nothing;
        // Not a shared position: nothing may continue from it on the device.
        d.next_pos = step.max_t;
        // Idle rows (at or past max_t) attend to nothing.
        d.step_keys = pos
            .iter()
            .filter(|&&p| (p as usize) < step.max_t)
            .map(|&p| step.keys_at(p as usize))
            .max()
            .unwrap_or(0);
        upload_state(step.gpu, d, tokens, pos)?;
        match path {
            DecodePath::Graph => {
                let key = step.graph_key(d, b);
                if !d.graphs.contains_key(&key) {
                    // One eager step first: it raises shared-memory limits
                    // and fills the launch caches, which capture must not do.
                    // Its results are those of this step, so the replay
                    // below only repeats them.
                    step.enqueue(d, b)?;
                    upload_state(step.gpu, d, tokens, pos)?;
                    capture_into(&mut step, d, b, key)?;
                }
                match d.graphs.get(&key) {
                    Some(g) => g.launch().ctx("cuGraphLaunch")?,
                    None => step.enqueue(d, b)?,
                }
            }
            DecodePath::Eager => step.enqueue(d, b)?,
            DecodePath::Unfused => anyhow::bail!("decode_forward called on the unfused path"),
        }
        d.ids_hold = step.chosen();
        self.last = Some(Last { b, rows: b });
        Ok(())
    }

    /// `steps` more fused decode steps of the last fused call's rows, driven
    /// by the device alone: each step feeds the ids the previous one chose,
    /// at the next position, from the state the last step left in device
    /// memory; the host only launches (one graph replay per step on the
    /// graph path). Afterwards `argmax`/`logits` describe the last step.
    /// For benchmarks and for generation loops that read ids back later.
    pub fn decode_on_device(&mut self, steps: usize) -> Result<()> {
        let last = self
            .last
            .context("decode_on_device() needs a fused decode step first")?;
        let b = last.b;
        let path = self.decode_path_in_use(b);
        let (mut step, d) = self.split_for_step(b)?;
        anyhow::ensure!(
            d.ids_hold == step.chosen() && path != DecodePath::Unfused,
            "decode_on_device() needs a fused decode step first"
        );
        anyhow::ensure!(
            d.next_pos + steps <= step.max_t,
            "{steps} more steps from position {} exceed the {} positions the engine was built for",
            d.next_pos,
            step.max_t
        );
        for i in 0..steps {
            d.step_keys = step.keys_at(d.next_pos + i);
            let key = step.graph_key(d, b);
            match (path, d.graphs.get(&key)) {
                (DecodePath::Graph, Some(g)) => g.launch().ctx("cuGraphLaunch")?,
                (DecodePath::Graph, None) if !d.capture_failed => {
                    // A graph this generation has not needed yet (the step
                    // moved from the persistent kernel to the chain as the
                    // cache grew): this step eagerly, which also raises the
                    // limits capture must not, then its capture for the next.
                    step.enqueue(d, b)?;
                    capture_into(&mut step, d, b, key)?;
                }
                _ => step.enqueue(d, b)?,
            }
        }
        d.next_pos += steps;
        Ok(())
    }
}

/// Write the step state of rows `0..tokens.len()`: their tokens and
/// positions.
fn upload_state(gpu: &Gpu, d: &mut DecodeState, tokens: &[u32], pos: &[u32]) -> Result<()> {
    let b = tokens.len();
    gpu.memcpy_htod(tokens, &mut d.tokens.slice_mut(0..b))
        .ctx("uploading token ids")?;
    gpu.memcpy_htod(pos, &mut d.pos.slice_mut(0..b))
        .ctx("uploading positions")?;
    Ok(())
}

/// Capture the step into `d.graphs` under `key` once the stream is idle;
/// where capture fails, warn and stay on eager launches for good.
fn capture_into(step: &mut Step<'_>, d: &mut DecodeState, b: usize, key: GraphKey) -> Result<()> {
    step.gpu.synchronize()?;
    match capture(step, d, b) {
        Ok(g) => {
            d.graphs.insert(key, g);
        }
        Err(e) => {
            eprintln!(
                "warning: capturing the decode step into a CUDA graph failed ({e:#}); decoding with one launch per kernel"
            );
            d.capture_failed = true;
        }
    }
    Ok(())
}

/// Capture one step into a graph (the stream must be idle).
fn capture(step: &mut Step<'_>, d: &mut DecodeState, b: usize) -> Result<CudaGraph> {
    let gpu = step.gpu;
    gpu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ctx("cuStreamBeginCapture")?;
    let queued = step.enqueue(d, b);
    // End the capture whatever happened, so the stream is usable again.
    let graph = gpu.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    queued?;
    let graph = graph
        .ctx("cuStreamEndCapture")?
        .context("the capture recorded no graph")?;
    graph.upload().ctx("cuGraphUpload")?;
    Ok(graph)
}

/// What one step's kernels read and write.
struct Step<'a> {
    /// Per-row sampling settings and random streams when the step ends by
    /// sampling.
    sample: Option<(&'a CudaSlice<DeviceSampleRow>, &'a CudaSlice<u32>)>,
    gpu: &'a Gpu,
    config: &'a ModelConfig,
    params: &'a DeviceParams,
    acts: &'a mut Activations,
    kv_cache: &'a mut Vec<KvCache>,
    max_t: usize,
    window: usize,
}

impl Step<'_> {
    /// What the step leaves in `ids`.
    fn chosen(&self) -> Chosen {
        if self.sample.is_some() {
            Chosen::Sampled
        } else {
            Chosen::Argmax
        }
    }

    /// The keys a row at position `pos` attends to.
    fn keys_at(&self, pos: usize) -> usize {
        max_span(pos as u32, 1, self.window as u32) as usize
    }

    /// Whether the step of `b` rows (at most `d.step_keys` keys a row)
    /// runs as the persistent kernel.
    fn persistent(&self, d: &DecodeState, b: usize) -> bool {
        runs_persistent(self.gpu, self.config, self.params, &d.tuning, b, d.step_keys)
    }

    /// The graph that replays this step (`d.step_keys` set).
    fn graph_key(&self, d: &DecodeState, b: usize) -> GraphKey {
        (b, self.window, d.pdl, self.sample.is_some(), self.persistent(d, b))
    }

    /// Queue the step as the persistent kernel (then the sampler, when the
    /// step samples).
    fn enqueue_persistent(&mut self, d: &mut DecodeState, b: usize) -> Result<()> {
        let (gpu, p, cfg) = (self.gpu, self.params, self.config);
        if d.step_table.is_none() {
            d.step_table = Some(DecodeStepTable::new(gpu, p.layers.len(), cfg.channels, self.max_t)?);
        }
        let table = d
            .step_table
            .as_mut()
            .context("the persistent step's table is missing")?;
        table.set_trace(gpu, d.tuning.trace)?;
        // The kernel folds bf16 weights only (`gpu_kernels::ops::decode_step`).
        let fold = b == 1 && d.tuning.fold_layernorms && matches!(p.wte, DeviceWeight::Bf16(_));
        if fold && d.step_folds.is_none() {
            d.step_folds = Some(StepFolds::new(gpu, p, cfg).context("folding the layernorms")?);
        }
        let folds = d.step_folds.as_ref().filter(|_| fold);
        let model = StepModel {
            wte: p.wte.as_ref(),
            wpe: &p.wpe,
            lnf: (&p.lnfw, &p.lnfb),
            lnf_fold: folds.map(|f| &f.lnf),
            c: cfg.channels,
            nh: cfg.num_heads,
            v: cfg.vocab_size,
            vp: cfg.padded_vocab_size,
            max_pos: cfg.max_seq_len,
            max_t: self.max_t,
            window: self.window,
        };
        let layers = p
            .layers
            .iter()
            .enumerate()
            .zip(self.kv_cache.iter_mut())
            .map(|((l, lw), kv)| StepLayer {
                ln1: (&lw.ln1w, &lw.ln1b),
                qkv: (lw.qkvw.as_ref(), &lw.qkvb),
                attproj: (lw.attprojw.as_ref(), &lw.attprojb),
                ln2: (&lw.ln2w, &lw.ln2b),
                fc: (lw.fcw.as_ref(), &lw.fcb),
                fcproj: (lw.fcprojw.as_ref(), &lw.fcprojb),
                kv,
                qkv_fold: folds.map(|f| &f.layers[l][0]),
                fc_fold: folds.map(|f| &f.layers[l][1]),
            });
        let a = &mut *self.acts;
        let bufs = StepBuffers {
            rows: b,
            tokens: &mut d.tokens,
            pos: &mut d.pos,
            ids: &mut d.ids,
            x: &mut a.residual,
            q: &mut a.qkv,
            att: &mut a.atty,
            h: &mut a.fch_gelu,
            logits: &mut a.logits,
        };
        let launch = StepLaunch {
            pdl: d.pdl,
            ring: d.tuning.ring_ask(),
        };
        decode_step(gpu, &mut d.ws, table, launch, &model, layers, bufs)?;
        if let Some((rows, streams)) = self.sample {
            // As after the chain's LM head (see `enqueue`).
            let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
            sample_forward_streams(
                gpu,
                &mut d.ids,
                &a.logits,
                rows,
                Draws {
                    counter: Some(&d.pos),
                    streams: Some(streams),
                },
                Some(&mut d.tokens),
                SampleShape {
                    n: b,
                    v,
                    row_stride: vp,
                },
            )?;
        }
        Ok(())
    }

    /// Queue the step's kernels for `b` rows, in the paper's order.
    fn enqueue(&mut self, d: &mut DecodeState, b: usize) -> Result<()> {
        if self.persistent(d, b) {
            return self.enqueue_persistent(d, b);
        }
        let (gpu, p) = (self.gpu, self.params);
        if d.plan.is_none() {
            // The plan counts elements; the weights share one format.
            let elem = p.wte.as_ref().elem_bytes();
            let sizes: Vec<usize> = (0..step_kernels(p))
                .map(|k| step_weight(p, k).map_or(0, |w| w.len()))
                .collect();
            let ahead = prefetch_elems(d.tuning.prefetch_ahead_bytes, gpu.l2_bytes(), elem);
            d.plan = Some(plan_prefetch(&sizes, ahead));
        }
        let (plan, tuning, pdl) = (d.plan.as_deref().unwrap_or_default(), d.tuning, d.pdl);
        // The launch of the step's next kernel, with its share of the plan.
        let mut kernel = 0;
        let mut next_launch = || -> Result<DecodeLaunch<'_>> {
            let kp = plan.get(kernel).context("the prefetch plan is shorter than the step")?;
            kernel += 1;
            let mut prefetch = L2Prefetch::default().late(kp.late);
            for (w, range) in &kp.pieces {
                match step_weight(p, *w) {
                    Some(WeightRef::F32(w)) => prefetch.push(gpu, w, range.clone())?,
                    Some(WeightRef::Bf16(w)) => prefetch.push(gpu, w, range.clone())?,
                    None => {}
                }
            }
            Ok(DecodeLaunch {
                pdl,
                prefetch,
                blocks_per_sm: tuning.gemv_blocks_per_sm,
                block_warps: tuning.gemv_block_warps,
                early_trigger: tuning.early_trigger,
                tensor_cores: tuning.tensor_cores,
            })
        };

        let (ws, tokens, pos, ids) = (&mut d.ws, &mut d.tokens, &mut d.pos, &mut d.ids);
        let cfg = self.config;
        let (c, nh, v, vp) = (cfg.channels, cfg.num_heads, cfg.vocab_size, cfg.padded_vocab_size);
        let a = &mut *self.acts;
        for (li, (lw, kv)) in p.layers.iter().zip(self.kv_cache.iter_mut()).enumerate() {
            // x + attproj(attention(qkv(ln1(x)))); layer 0's x is the embedding.
            let input = if li == 0 {
                Input::Embed(Embed {
                    tokens,
                    pos,
                    wte: p.wte.as_ref(),
                    wpe: &p.wpe,
                    vocab: v,
                    max_pos: cfg.max_seq_len,
                    out: &mut a.residual,
                })
            } else {
                Input::Rows(&a.residual)
            };
            let qkv_out = Output::Qkv {
                q: &mut a.qkv,
                kv: &mut *kv,
                pos,
                nh,
                max_t: self.max_t,
            };
            let qkv = GemvWeights {
                ln: Some(LayernormWeights {
                    weight: &lw.ln1w,
                    bias: &lw.ln1b,
                }),
                weight: lw.qkvw.as_ref(),
                bias: Some(&lw.qkvb),
            };
            decode_gemv(
                gpu,
                ws,
                next_launch()?,
                input,
                qkv,
                qkv_out,
                MatmulShape::new(b, 3 * c, c),
            )?;
            let shape = DecodeAttentionShape {
                rows: b,
                c,
                nh,
                window: self.window,
            };
            with_kv!(&*kv, |k_cache, v_cache| {
                let cache = KvRows {
                    k_cache,
                    v_cache,
                    pos: &*pos,
                    cache_row: None,
                };
                decode_attention(gpu, ws, next_launch()?, &mut a.atty, &a.qkv, cache, shape)?
            });
            let out = Output::Rows {
                out: &mut a.residual2,
                residual: Some(&a.residual),
                gelu: false,
            };
            let attproj = GemvWeights {
                ln: None,
                weight: lw.attprojw.as_ref(),
                bias: Some(&lw.attprojb),
            };
            decode_gemv(
                gpu,
                ws,
                next_launch()?,
                Input::Rows(&a.atty),
                attproj,
                out,
                MatmulShape::new(b, c, c),
            )?;
            // x + fcproj(gelu(fc(ln2(x))))
            let out = Output::Rows {
                out: &mut a.fch_gelu,
                residual: None,
                gelu: true,
            };
            let fc = GemvWeights {
                ln: Some(LayernormWeights {
                    weight: &lw.ln2w,
                    bias: &lw.ln2b,
                }),
                weight: lw.fcw.as_ref(),
                bias: Some(&lw.fcb),
            };
            decode_gemv(
                gpu,
                ws,
                next_launch()?,
                Input::Rows(&a.residual2),
                fc,
                out,
                MatmulShape::new(b, 4 * c, c),
            )?;
            let out = Output::Rows {
                out: &mut a.residual,
                residual: Some(&a.residual2),
                gelu: false,
            };
            let fcproj = GemvWeights {
                ln: None,
                weight: lw.fcprojw.as_ref(),
                bias: Some(&lw.fcprojb),
            };
            decode_gemv(
                gpu,
                ws,
                next_launch()?,
                Input::Rows(&a.fch_gelu),
                fcproj,
                out,
                MatmulShape::new(b, c, 4 * c),
            )?;
        }
        // lnf, the LM head (tied to wte, no bias) and the greedy choice,
        // which also advances tokens and positions for the next step.
        let out = Output::Greedy {
            logits: &mut a.logits,
            ids,
            tokens_next: tokens,
            pos_next: pos,
            v,
        };
        let head = GemvWeights {
            ln: Some(LayernormWeights {
                weight: &p.lnfw,
                bias: &p.lnfb,
            }),
            weight: p.wte.as_ref(),
            bias: None,
        };
        decode_gemv(
            gpu,
            ws,
            next_launch()?,
            Input::Rows(&a.residual),
            head,
            out,
            MatmulShape::new(b, vp, c),
        )?;
        if let Some((rows, streams)) = self.sample {
            // The sampled choice replaces the argmax as the ids and the next
            // step's tokens; the draw counter is the position it will take
            // (the LM head advanced `pos` to it).
            let streams = Some(streams);
            sample_forward_streams(
                gpu,
                ids,
                &a.logits,
                rows,
                Draws {
                    counter: Some(&*pos),
                    streams,
                },
                Some(tokens),
                SampleShape {
                    n: b,
                    v,
                    row_stride: vp,
                },
            )?;
        }
        Ok(())
    }
}

/// Whether `tuning` and the GPU let a step of `b` rows, each attending to
/// at most `keys` keys, run as the persistent kernel.
fn runs_persistent(
    gpu: &Gpu,
    cfg: &ModelConfig,
    p: &DeviceParams,
    tuning: &DecodeTuning,
    b: usize,
    keys: usize,
) -> bool {
    let elem = p.wte.as_ref().elem_bytes();
    let (max_rows, max_keys) = if elem == size_of::<f32>() {
        (tuning.persistent_max_rows, tuning.persistent_rows_max_keys)
    } else {
        (tuning.persistent_max_rows_bf16, tuning.persistent_rows_max_keys_bf16)
    };
    tuning.persistent
        && b <= max_rows
        && (b == 1 || keys <= max_keys)
        && decode_step_config(
            gpu,
            b,
            cfg.channels,
            cfg.num_heads,
            p.layers.len(),
            elem,
            tuning.ring_ask(),
        )
        .is_some()
}

/// Kernels per layer of the fused step: qkv, attention, attproj, fc, fcproj.
const KERNELS_PER_LAYER: usize = 5;

/// Kernels of a fused step: five per layer and the LM head.
fn step_kernels(p: &DeviceParams) -> usize {
    KERNELS_PER_LAYER * p.layers.len() + 1
}

/// The weight kernel `k` of the step streams, in launch order (per layer
/// qkv, attention (none), attproj, fc, fcproj; then the LM head's wte).
fn step_weight(p: &DeviceParams, k: usize) -> Option<WeightRef<'_>> {
    match p.layers.get(k / KERNELS_PER_LAYER) {
        Some(lw) => match k % KERNELS_PER_LAYER {
            0 => Some(lw.qkvw.as_ref()),
            1 => None,
            2 => Some(lw.attprojw.as_ref()),
            3 => Some(lw.fcw.as_ref()),
            _ => Some(lw.fcprojw.as_ref()),
        },
        None => Some(p.wte.as_ref()),
    }
}

/// Prefetch distance in elements of `elem` bytes for `bytes`, capped at a
/// `PREFETCH_L2_FRACTION` of an L2 of `l2_bytes`.
fn prefetch_elems(bytes: usize, l2_bytes: usize, elem: usize) -> usize {
    bytes.min(l2_bytes / PREFETCH_L2_FRACTION) / elem
}

/// What one kernel of the step prefetches: `(kernel, floats)` pieces of
/// later kernels' weights, and whether after its own loads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelPrefetch {
    pub pieces: Vec<(usize, Range<usize>)>,
    pub late: bool,
}

/// The L2 prefetch plan of a step whose kernels stream `sizes[k]` floats
/// of weights each, in launch order (0 for a kernel that streams none).
///
/// The weights form one stream that repeats every step. Each kernel asks
/// for the part of it from where earlier requests stopped up to `ahead`
/// floats past the end of its own weights, wrapping into the next step's
/// first weights at the end; the first kernel assumes the step before
/// asked for the first `ahead` floats. A kernel whose own weights are
/// longer than `ahead` asks late (its own stream would evict an early
/// request). At most `DECODE_PREFETCH_RANGES` pieces per kernel (one per
/// weight touched); a request that would need more stops there.
pub(crate) fn plan_prefetch(sizes: &[usize], ahead: usize) -> Vec<KernelPrefetch> {
    let total: usize = sizes.iter().sum();
    let mut plans = vec![KernelPrefetch::default(); sizes.len()];
    if ahead == 0 || total == 0 {
        return plans;
    }
    let ahead = ahead.min(total);
    // starts[k]: offset of kernel k's weights in the stream.
    let starts: Vec<usize> = sizes
        .iter()
        .scan(0, |at, &n| {
            let s = *at;
            *at += n;
            Some(s)
        })
        .collect();
    // The kernel whose weights hold stream offset `o` (modulo one step),
    // and the offset inside them. A kernel that streams nothing shares its
    // start with the next one, and the last start <= o is that next one.
    let owner = |o: usize| {
        let o = o % total;
        let k = starts.partition_point(|&s| s <= o) - 1;
        (k, o - starts[k])
    };
    let mut frontier = ahead;
    for (k, plan) in plans.iter_mut().enumerate() {
        let end = starts[k] + sizes[k];
        plan.late = sizes[k] > ahead;
        let target = end + ahead;
        let mut at = frontier.max(end);
        while at < target && plan.pieces.len() < DECODE_PREFETCH_RANGES {
            let (w, off) = owner(at);
            let n = (sizes[w] - off).min(target - at);
            plan.pieces.push((w, off..off + n));
            at += n;
        }
        frontier = frontier.max(at);
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offsets of each kernel's weights in the stream.
    fn starts(sizes: &[usize]) -> Vec<usize> {
        sizes
            .iter()
            .scan(0, |at, &n| {
                let s = *at;
                *at += n;
                Some(s)
            })
            .collect()
    }

    #[test]
    fn prefetch_plan_covers_the_stream_ahead_once() {
        // Two "layers" of [qkv, attention, attproj, fc, fcproj] and a head:
        // the stream is qkv0 [0, 30), attproj0 [30, 40), fc0 [40, 80), ...
        let sizes = [30, 0, 10, 40, 40, 30, 0, 10, 40, 40, 200];
        let plans = plan_prefetch(&sizes, 50);
        // qkv0 ends at 30: it asks for 50..80 (the step before asked for
        // the first 50), which is fc0's floats 10..40.
        assert_eq!(plans[0].pieces, vec![(3, 10..40)]);
        // Attention ends where qkv0 ends: nothing new.
        assert!(plans[1].pieces.is_empty());
        // fcproj0 ends at 120: 130..170 spans three weights.
        assert_eq!(plans[4].pieces, vec![(5, 10..30), (7, 0..10), (8, 0..10)]);
        // The head (200 > 50) asks late, for the next step's first 50.
        assert!(plans[10].late && plans[..10].iter().all(|p| !p.late));
        assert_eq!(plans[10].pieces, vec![(0, 0..30), (2, 0..10), (3, 0..10)]);
        // Within a step, every offset from 50 to 50 past fcproj1's end is
        // asked for exactly once.
        let at = starts(&sizes);
        let mut seen = vec![0u32; sizes.iter().sum()];
        for p in &plans[..10] {
            for (w, r) in &p.pieces {
                for o in r.clone() {
                    seen[at[*w] + o] += 1;
                }
            }
        }
        assert!(seen[50..290].iter().all(|&n| n == 1), "{seen:?}");
        assert!(seen[..50].iter().chain(&seen[290..]).all(|&n| n == 0), "{seen:?}");
    }

    #[test]
    fn prefetch_plan_off_and_tiny_streams() {
        assert!(
            plan_prefetch(&[10, 0, 10], 0)
                .iter()
                .all(|p| p.pieces.is_empty() && !p.late)
        );
        assert!(plan_prefetch(&[0, 0], 8).iter().all(|p| p.pieces.is_empty()));
        // A distance past the whole stream asks for each weight at most once per kernel.
        let plans = plan_prefetch(&[4, 4], 100);
        assert!(
            plans
                .iter()
                .all(|p| p.pieces.iter().map(|(_, r)| r.len()).sum::<usize>() <= 8)
        );
    }
}
