//! The GPU engine as a [`SlotBackend`]: the KV cache's batch rows are a
//! server's slots, each sequence at its own position.
//!
//! - A prefill of one chunk runs the forward pass on one slot's cache rows
//!   ([`Placement::Shared`] at that row); of several, one call of all their
//!   tokens, each at its slot and position ([`Placement::Chunks`]).
//! - A decode step runs rows `0..n`, `n` one past the highest slot that
//!   steps (the scheduler hands out the lowest free slot, so `n` stays near
//!   the number of running sequences); the rows in between that do not step
//!   are idle (position `max_seq_len`: no cache write, no attention). Up to
//!   the fused kernels' rows it is the fused step (graph, persistent kernel)
//!   with per-row positions; beyond, the prefill path's matmuls with
//!   per-row embedding, K/V stores and decode attention
//!   ([`Placement::PerRow`]).
//! - [`SlotBackend::choose`] samples every row on the device in one launch,
//!   each row with its own settings, draw counter and stream, and reads back
//!   one id per row; all-greedy steps on the fused path reuse the LM head's
//!   argmax.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use gpu_host::shape::SampleShape;
use gpu_kernels::params::decode::DECODE_HEAD_SIZE;
use gpu_kernels::params::sample::{SampleRow, is_greedy};

use super::{AttentionKind, Chosen, DecodePath, GpuEngine, Last, Placement, Precision};
use crate::generate::LogitsWanted;
use crate::gpu::Gpu;
use crate::gpu::ops::decode::DecodeWorkspace;
use crate::gpu::ops::sample::{DeviceSampleRow, Draws, sample_forward_streams};
use crate::gpu::runtime::CudaContextExt;
use crate::model::ModelConfig;
use crate::serve::backend::{Draw, SlotBackend, SlotChunk, SlotToken, check_slot_chunks, check_slot_rows};

/// The settings of a row nobody draws for (an idle row): greedy.
const IDLE_DRAW: SampleRow = SampleRow {
    temperature: 0.0,
    top_k: 0,
    top_p: 1.0,
    _pad: 0,
    seed: 0,
};

/// The token an idle row feeds (any id inside the vocabulary).
const IDLE_TOKEN: u32 = 0;

/// The slot interface's device buffers and host staging, sized for every
/// slot (the engine's `max_batch` rows), made by the first slot call.
pub(super) struct SlotState {
    /// `[rows]`: each row's position in a per-row step (idle rows at
    /// `max_seq_len`) or a prefill of several chunks; `rows` is the larger
    /// of the slots and the engine's activation rows.
    pub(super) pos: CudaSlice<u32>,
    /// `[rows]`: each row's cache row in a prefill of several chunks.
    pub(super) cache_row: CudaSlice<u32>,
    /// The rows whose logits a prefill of several chunks keeps (each
    /// chunk's last token), in chunk order.
    pub(super) head_rows: Vec<usize>,
    /// `[rows, C]`: the queries of a per-row step.
    pub(super) q: CudaSlice<f32>,
    /// Decode attention's scratch for `rows` rows.
    pub(super) ws: DecodeWorkspace,
    /// `[slots]` each: the sampler's per-row settings, draw counters,
    /// streams, and the ids it chose.
    settings: CudaSlice<DeviceSampleRow>,
    counter: CudaSlice<u32>,
    streams: CudaSlice<u32>,
    ids: CudaSlice<u32>,
    /// Host staging, so a step allocates nothing once warm.
    host_tokens: Vec<u32>,
    host_pos: Vec<u32>,
    host_cache_row: Vec<u32>,
    /// A static batch's decode rows ([`GpuEngine::decode_per_row`]).
    host_rows: Vec<SlotToken>,
    host_settings: Vec<DeviceSampleRow>,
    host_counter: Vec<u32>,
    host_streams: Vec<u32>,
    host_ids: Vec<u32>,
    /// The logits row of each row of the last prefill or decode, in the
    /// order [`SlotBackend::choose`] answers.
    rows: Vec<usize>,
    /// Captured per-row steps, by (rows, precision, window, attention):
    /// they hold the addresses of the engine's buffers, which never move.
    graphs: HashMap<GraphKey, CudaGraph>,
    /// Set when a capture failed once: per-row steps stay eager.
    capture_failed: bool,
}

/// What a captured per-row step depends on.
type GraphKey = (usize, Precision, usize, AttentionKind);

/// Per-row steps run rows in multiples of this (idle rows pad them), so a
/// handful of graphs serves every batch size.
const ROW_BUCKET: usize = 8;

impl SlotState {
    /// For `slots` slots and per-row calls of up to `rows` rows (at least `slots`).
    fn new(gpu: &Gpu, config: &ModelConfig, slots: usize, rows: usize, max_t: usize) -> Result<Self> {
        let rows = rows.max(slots);
        Ok(SlotState {
            pos: gpu.alloc(rows)?,
            cache_row: gpu.alloc(rows)?,
            head_rows: Vec::with_capacity(slots),
            q: gpu.alloc(rows * config.channels)?,
            ws: DecodeWorkspace::new(gpu, rows, config.num_heads, max_t)?,
            settings: gpu.alloc(slots)?,
            counter: gpu.alloc(slots)?,
            streams: gpu.alloc(slots)?,
            ids: gpu.alloc(slots)?,
            host_tokens: Vec::with_capacity(rows),
            host_pos: Vec::with_capacity(rows),
            host_cache_row: Vec::with_capacity(rows),
            host_rows: Vec::with_capacity(slots),
            host_settings: Vec::with_capacity(slots),
            host_counter: Vec::with_capacity(slots),
            host_streams: Vec::with_capacity(slots),
            host_ids: Vec::with_capacity(slots),
            rows: Vec::with_capacity(slots),
            graphs: HashMap::new(),
            capture_failed: false,
        })
    }
}

/// Whether capturing the per-row step failed once (the engine then stays
/// on eager launches).
fn s_capture_failed(e: &GpuEngine) -> bool {
    e.slots.as_ref().is_none_or(|s| s.capture_failed)
}

/// Capture one per-row step of `rows` rows into a graph (the stream must be
/// idle; the inputs are on the device already).
fn capture_per_row(e: &mut GpuEngine, rows: usize) -> Result<CudaGraph> {
    e.gpu
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ctx("cuStreamBeginCapture")?;
    let queued = e.forward_placed(&[], rows, 1, Placement::PerRow, LogitsWanted::Last);
    // End the capture whatever happened, so the stream is usable again.
    let graph = e
        .gpu
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    queued?;
    let graph = graph
        .ctx("cuStreamEndCapture")?
        .context("the capture recorded no graph")?;
    graph.upload().ctx("cuGraphUpload")?;
    Ok(graph)
}

impl GpuEngine {
    /// Whether this engine can serve as a [`SlotBackend`]: a step past the
    /// fused kernels' rows runs decode attention, built for GPT-2's head
    /// size only.
    pub fn check_slots(&self) -> Result<()> {
        let (c, nh) = (self.config.channels, self.config.num_heads);
        ensure!(
            nh > 0 && c == nh * DECODE_HEAD_SIZE as usize,
            "the GPU server needs heads of {DECODE_HEAD_SIZE} channels (GPT-2's); this model has {nh} heads over {c} channels (use --cpu)"
        );
        Ok(())
    }

    /// Whether a decode step of `b` rows past the fused kernels' rows runs
    /// as the slot interface's per-row step (one captured graph per 8-row
    /// bucket) instead of the prefill kernels launched one by one: where the
    /// fused path is on (not forced to [`DecodePath::Unfused`]) and the
    /// per-row kernels serve the model's heads.
    pub(super) fn per_row_decode_serves(&self, b: usize) -> bool {
        self.decode
            .as_ref()
            .is_some_and(|d| b > d.rows() && d.path() != DecodePath::Unfused)
            && self.check_slots().is_ok()
    }

    /// A static batch's decode step (`forward` with `t = 1`, all rows at
    /// `pos0`) through the per-row step: row `r` is slot `r`, which holds
    /// the batch's row `r` in the same cache layout.
    pub(super) fn decode_per_row(&mut self, tokens: &[u32], pos0: usize) -> Result<()> {
        // The rows go through the slot state's staging (no allocation per
        // step once warm), taken out while the step borrows the engine.
        let mut rows = std::mem::take(&mut self.slot_state()?.host_rows);
        rows.clear();
        rows.extend(
            tokens
                .iter()
                .enumerate()
                .map(|(slot, &token)| SlotToken { slot, token, pos: pos0 }),
        );
        // The slot interface samples in `choose`; a batch keeps what
        // `prepare_sampling` set.
        let prepared = self.sampling.prepared;
        let stepped = SlotBackend::decode(self, &rows);
        self.sampling.prepared = prepared;
        if let Some(s) = self.slots.as_mut() {
            s.host_rows = rows;
        }
        stepped?;
        // The step ran a bucket of rows; the batch's are the first b.
        let b = tokens.len();
        self.last = Some(Last { b, rows: b });
        Ok(())
    }

    /// The slot state, made on first use.
    fn slot_state(&mut self) -> Result<&mut SlotState> {
        if self.slots.is_none() {
            self.check_slots()?;
            let rows = self.max_rows;
            let state = SlotState::new(&self.gpu, &self.config, self.max_batch, rows, self.max_seq_len)
                .context("allocating the slot state")?;
            self.slots = Some(state);
        }
        self.slots.as_mut().context("the slot state is missing")
    }
}

impl SlotBackend for GpuEngine {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn slots(&self) -> usize {
        self.max_batch
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// One chunk runs as a forward call on its slot's cache rows (flash
    /// attention where it applies). Several run as one call of all their
    /// tokens (`Placement::Chunks`): each token at its own position of its
    /// own slot through the per-row kernels, and the LM head on each
    /// chunk's last token only.
    fn prefill_chunks(&mut self, chunks: &[SlotChunk<'_>]) -> Result<()> {
        self.last = None;
        self.mark_ids_stale();
        let (max_t, v) = (self.max_seq_len, self.config.vocab_size);
        check_slot_chunks(chunks, self.max_batch, max_t, v)?;
        if let [one] = chunks {
            let s = self.slot_state()?;
            s.rows.clear();
            s.rows.push(0);
            let place = Placement::Shared {
                row0: one.slot,
                pos0: one.pos0,
            };
            return self.forward_placed(one.tokens, 1, one.tokens.len(), place, LogitsWanted::Last);
        }
        let n: usize = chunks.iter().map(|ch| ch.tokens.len()).sum();
        ensure!(
            n <= self.max_rows,
            "a prefill of {n} tokens exceeds the {} positions this engine holds activations for",
            self.max_rows
        );
        self.slot_state()?;
        let s = self.slots.as_mut().context("the slot state is missing")?;
        s.host_tokens.clear();
        s.host_pos.clear();
        s.host_cache_row.clear();
        s.head_rows.clear();
        s.rows.clear();
        for (i, ch) in chunks.iter().enumerate() {
            s.host_tokens.extend_from_slice(ch.tokens);
            // Positions below max_t and slots below max_batch (checked) fit u32.
            s.host_pos
                .extend((ch.pos0..ch.pos0 + ch.tokens.len()).map(|p| p as u32));
            s.host_cache_row
                .extend(std::iter::repeat_n(ch.slot as u32, ch.tokens.len()));
            s.head_rows.push(s.host_tokens.len() - 1);
            s.rows.push(i);
        }
        let gpu = &self.gpu;
        gpu.memcpy_htod(&s.host_pos, &mut s.pos.slice_mut(0..n))
            .ctx("uploading positions")?;
        gpu.memcpy_htod(&s.host_cache_row, &mut s.cache_row.slice_mut(0..n))
            .ctx("uploading cache rows")?;
        gpu.memcpy_htod(&s.host_tokens, &mut self.acts.tokens.slice_mut(0..n))
            .ctx("uploading token ids")?;
        self.forward_placed(&[], n, 1, Placement::Chunks, LogitsWanted::Last)?;
        self.last = Some(Last {
            b: chunks.len(),
            rows: chunks.len(),
        });
        Ok(())
    }

    fn decode(&mut self, rows: &[SlotToken]) -> Result<()> {
        self.last = None;
        self.mark_ids_stale();
        let (max_t, v) = (self.max_seq_len, self.config.vocab_size);
        check_slot_rows(rows, self.max_batch, max_t, v)?;
        let n = rows.iter().map(|r| r.slot).max().map_or(0, |m| m + 1);
        let idle_pos = u32::try_from(max_t).context("max_seq_len beyond u32")?;
        let s = self.slot_state()?;
        s.host_tokens.clear();
        s.host_tokens.resize(n, IDLE_TOKEN);
        s.host_pos.clear();
        s.host_pos.resize(n, idle_pos);
        s.rows.clear();
        for r in rows {
            s.host_tokens[r.slot] = r.token;
            // Below max_t (checked), so it fits.
            s.host_pos[r.slot] = r.pos as u32;
            s.rows.push(r.slot);
        }
        // The slot interface samples in `choose`, not inside the step.
        self.sampling.prepared = false;
        if self.decode_path_in_use(n) != DecodePath::Unfused {
            let s = self.slots.as_mut().context("the slot state is missing")?;
            let (tokens, pos) = (std::mem::take(&mut s.host_tokens), std::mem::take(&mut s.host_pos));
            let done = self.decode_forward_at(&tokens, &pos);
            let s = self.slots.as_mut().context("the slot state is missing")?;
            (s.host_tokens, s.host_pos) = (tokens, pos);
            return done;
        }
        // Rows in buckets of ROW_BUCKET (idle rows pad them): one graph per
        // bucket serves every step of that size.
        let rows_run = n.next_multiple_of(ROW_BUCKET).min(self.max_batch);
        let s = self.slots.as_mut().context("the slot state is missing")?;
        s.host_tokens.resize(rows_run, IDLE_TOKEN);
        s.host_pos.resize(rows_run, idle_pos);
        self.gpu
            .memcpy_htod(&s.host_pos, &mut s.pos.slice_mut(0..rows_run))
            .ctx("uploading positions")?;
        self.gpu
            .memcpy_htod(&s.host_tokens, &mut self.acts.tokens.slice_mut(0..rows_run))
            .ctx("uploading token ids")?;
        let key = (rows_run, self.precision, self.window, self.attention);
        if let Some(g) = s.graphs.get(&key) {
            g.launch().ctx("cuGraphLaunch")?;
            self.last = Some(Last {
                b: rows_run,
                rows: rows_run,
            });
            return Ok(());
        }
        // No graph yet: one eager step (it also loads the kernels and sets
        // their attributes, which a capture must not do), then capture.
        self.forward_placed(&[], rows_run, 1, Placement::PerRow, LogitsWanted::Last)?;
        if !s_capture_failed(self) {
            self.gpu.synchronize().context("the per-row decode step")?;
            let graph = capture_per_row(self, rows_run);
            let s = self.slots.as_mut().context("the slot state is missing")?;
            match graph {
                Ok(g) => {
                    s.graphs.insert(key, g);
                }
                Err(e) => {
                    eprintln!(
                        "warning: capturing the per-row decode step into a CUDA graph failed ({e:#}); decoding with one launch per kernel"
                    );
                    s.capture_failed = true;
                }
            }
        }
        Ok(())
    }

    fn choose(&mut self, draws: &[Draw]) -> Result<Vec<u32>> {
        let last = self
            .last
            .context("choose() called before a successful prefill or decode")?;
        let n = last.rows;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let Some(s) = self.slots.as_mut() else {
            anyhow::bail!("choose() called before a successful prefill or decode");
        };
        ensure!(
            draws.len() == s.rows.len(),
            "choose(): {} draws for the {} rows of the last prefill or decode step",
            draws.len(),
            s.rows.len()
        );
        let mut host_ids = std::mem::take(&mut s.host_ids);
        host_ids.clear();
        host_ids.resize(n, 0);
        // The fused step's LM head chose every row's argmax already.
        let fused = match self.fresh_ids(Chosen::Argmax) {
            Some(ids) if draws.iter().all(|d| is_greedy(&d.settings)) => {
                self.gpu
                    .memcpy_dtoh(&ids.slice(0..n), &mut host_ids)
                    .ctx("reading the chosen ids")?;
                true
            }
            _ => false,
        };
        let s = self.slots.as_mut().context("the slot state is missing")?;
        if !fused {
            s.host_settings.clear();
            s.host_settings.resize(n, DeviceSampleRow(IDLE_DRAW));
            s.host_counter.clear();
            s.host_counter.resize(n, 0);
            s.host_streams.clear();
            s.host_streams.resize(n, 0);
            for (d, &row) in draws.iter().zip(&s.rows) {
                s.host_settings[row] = DeviceSampleRow(d.settings);
                s.host_counter[row] = d.counter;
                s.host_streams[row] = d.stream;
            }
            let gpu = &self.gpu;
            gpu.memcpy_htod(&s.host_settings, &mut s.settings.slice_mut(0..n))
                .ctx("uploading the sampling settings")?;
            gpu.memcpy_htod(&s.host_counter, &mut s.counter.slice_mut(0..n))
                .ctx("uploading the draw counters")?;
            gpu.memcpy_htod(&s.host_streams, &mut s.streams.slice_mut(0..n))
                .ctx("uploading the draw streams")?;
            let (counter, streams) = (s.counter.slice(0..n), s.streams.slice(0..n));
            sample_forward_streams(
                gpu,
                &mut s.ids.slice_mut(0..n),
                &self.acts.logits,
                &s.settings.slice(0..n),
                Draws {
                    counter: Some(&counter),
                    streams: Some(&streams),
                },
                None::<&mut CudaSlice<u32>>,
                SampleShape { n, v, row_stride: vp },
            )?;
            gpu.memcpy_dtoh(&s.ids.slice(0..n), &mut host_ids)
                .ctx("reading the chosen ids")?;
        }
        let chosen = s.rows.iter().map(|&r| host_ids[r]).collect();
        s.host_ids = host_ids;
        Ok(chosen)
    }

    fn slot_logits(&mut self) -> Result<Vec<f32>> {
        let last = self
            .last
            .context("slot_logits() called before a successful prefill or decode")?;
        let vp = self.config.padded_vocab_size;
        let s = self
            .slots
            .as_ref()
            .context("slot_logits() called before a successful prefill or decode")?;
        let mut all = vec![0f32; last.rows * vp];
        self.gpu
            .memcpy_dtoh(&self.acts.logits.slice(0..last.rows * vp), &mut all)
            .ctx("reading the logits")?;
        Ok(s.rows
            .iter()
            .flat_map(|&r| all[r * vp..(r + 1) * vp].iter().copied())
            .collect())
    }
}
