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

use anyhow::{Context, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use gpu_kernels::params::decode::{DECODE_GEMV_MAX_C, DECODE_HEAD_SIZE, DECODE_MAX_ROWS};

use super::{Activations, DeviceParams, GpuEngine, Last};
use crate::gpu::Gpu;
use crate::gpu::ops::decode::{DecodeLaunch, DecodeWorkspace, Embed, Input, Output, decode_attention, decode_gemv};
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
    /// Rows the state serves (at most `DECODE_MAX_ROWS`).
    rows: usize,
    path: DecodePath,
    pdl: bool,
    /// Captured steps, by (rows, window, pdl).
    graphs: HashMap<(usize, usize, bool), CudaGraph>,
    /// Set when capture failed once: the engine stays on the eager path.
    capture_failed: bool,
    /// The last `forward` was a fused step: its argmax is in `ids`.
    ids_fresh: bool,
    /// Host staging of the positions a `forward` step uploads.
    host_pos: Vec<u32>,
    /// The position the next device-driven step decodes at (the state the
    /// last fused step left on the device).
    next_pos: usize,
}

impl DecodeState {
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
            rows,
            path: DecodePath::default(),
            pdl: true,
            graphs: HashMap::new(),
            capture_failed: false,
            ids_fresh: false,
            host_pos: Vec::with_capacity(rows),
            next_pos: 0,
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

    /// The argmax of the last fused step, if the last `forward` was one.
    pub(super) fn fresh_ids(&self) -> Option<&CudaSlice<u32>> {
        self.decode.as_ref().filter(|d| d.ids_fresh).map(|d| &d.ids)
    }

    /// Forget that the ids are fresh (any other `forward`).
    pub(super) fn mark_ids_stale(&mut self) {
        if let Some(d) = self.decode.as_mut() {
            d.ids_fresh = false;
        }
    }

    /// The step's inputs and the decode state, borrowed apart.
    fn split_for_step(&mut self) -> Result<(Step<'_>, &mut DecodeState)> {
        let d = self.decode.as_mut().context("the fused decode state is missing")?;
        let step = Step {
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
        let path = self.decode_path_in_use(b);
        let (mut step, d) = self.split_for_step()?;
        d.ids_fresh = false;
        upload_state(step.gpu, d, tokens, pos0)?;
        match path {
            DecodePath::Graph => {
                let key = (b, step.window, d.pdl);
                if !d.graphs.contains_key(&key) {
                    // One eager step first: it raises shared-memory limits
                    // and fills the launch caches, which capture must not do.
                    // Its results are those of this step, so the replay
                    // below only repeats them.
                    step.enqueue(d, b)?;
                    upload_state(step.gpu, d, tokens, pos0)?;
                    step.gpu.synchronize()?;
                    match capture(&mut step, d, b) {
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
                }
                match d.graphs.get(&key) {
                    Some(g) => g.launch().ctx("cuGraphLaunch")?,
                    None => step.enqueue(d, b)?,
                }
            }
            DecodePath::Eager => step.enqueue(d, b)?,
            DecodePath::Unfused => anyhow::bail!("decode_forward called on the unfused path"),
        }
        d.ids_fresh = true;
        d.next_pos = pos0 + 1;
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
        let (mut step, d) = self.split_for_step()?;
        anyhow::ensure!(
            d.ids_fresh && path != DecodePath::Unfused,
            "decode_on_device() needs a fused decode step first"
        );
        anyhow::ensure!(
            d.next_pos + steps <= step.max_t,
            "{steps} more steps from position {} exceed the {} positions the engine was built for",
            d.next_pos,
            step.max_t
        );
        for _ in 0..steps {
            match (path, d.graphs.get(&(b, step.window, d.pdl))) {
                (DecodePath::Graph, Some(g)) => g.launch().ctx("cuGraphLaunch")?,
                _ => step.enqueue(d, b)?,
            }
        }
        d.next_pos += steps;
        Ok(())
    }
}

/// Write the step state of rows `0..tokens.len()`: their tokens, all at
/// position `pos0` (staged in a host buffer the state keeps, so a step
/// allocates nothing).
fn upload_state(gpu: &Gpu, d: &mut DecodeState, tokens: &[u32], pos0: usize) -> Result<()> {
    let b = tokens.len();
    d.host_pos.clear();
    d.host_pos.resize(b, pos0 as u32);
    gpu.stream
        .memcpy_htod(tokens, &mut d.tokens.slice_mut(0..b))
        .ctx("uploading token ids")?;
    gpu.stream
        .memcpy_htod(&d.host_pos, &mut d.pos.slice_mut(0..b))
        .ctx("uploading positions")?;
    Ok(())
}

/// Capture one step into a graph (the stream must be idle).
fn capture(step: &mut Step<'_>, d: &mut DecodeState, b: usize) -> Result<CudaGraph> {
    let stream = step.gpu.stream.clone();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ctx("cuStreamBeginCapture")?;
    let queued = step.enqueue(d, b);
    // End the capture whatever happened, so the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    queued?;
    let graph = graph
        .ctx("cuStreamEndCapture")?
        .context("the capture recorded no graph")?;
    graph.upload().ctx("cuGraphUpload")?;
    Ok(graph)
}

/// What one step's kernels read and write.
struct Step<'a> {
    gpu: &'a Gpu,
    config: &'a ModelConfig,
    params: &'a DeviceParams,
    acts: &'a mut Activations,
    kv_cache: &'a mut Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    max_t: usize,
    window: usize,
}

impl Step<'_> {
    /// Queue the step's kernels for `b` rows, in the paper's order.
    fn enqueue(&mut self, d: &mut DecodeState, b: usize) -> Result<()> {
        let launch = DecodeLaunch { pdl: d.pdl };
        let (ws, tokens, pos, ids) = (&mut d.ws, &mut d.tokens, &mut d.pos, &mut d.ids);
        let cfg = self.config;
        let (c, nh, v, vp) = (cfg.channels, cfg.num_heads, cfg.vocab_size, cfg.padded_vocab_size);
        let (gpu, p, a) = (self.gpu, self.params, &mut *self.acts);
        for (li, (lw, (k_cache, v_cache))) in p.layers.iter().zip(self.kv_cache.iter_mut()).enumerate() {
            // x + attproj(attention(qkv(ln1(x)))); layer 0's x is the embedding.
            let input = if li == 0 {
                Input::Embed(Embed {
                    tokens,
                    pos,
                    wte: &p.wte,
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
                k_cache,
                v_cache,
                pos,
                nh,
                max_t: self.max_t,
            };
            let ln1 = Some((&lw.ln1w, &lw.ln1b));
            decode_gemv(
                gpu,
                ws,
                launch,
                input,
                ln1,
                &lw.qkvw,
                Some(&lw.qkvb),
                qkv_out,
                b,
                c,
                3 * c,
            )?;
            decode_attention(
                gpu,
                ws,
                launch,
                &mut a.atty,
                &a.qkv,
                k_cache,
                v_cache,
                pos,
                b,
                c,
                nh,
                self.window,
            )?;
            let out = Output::Rows {
                out: &mut a.residual2,
                residual: Some(&a.residual),
                gelu: false,
            };
            let attproj = (&lw.attprojw, Some(&lw.attprojb));
            decode_gemv(
                gpu,
                ws,
                launch,
                Input::Rows(&a.atty),
                None,
                attproj.0,
                attproj.1,
                out,
                b,
                c,
                c,
            )?;
            // x + fcproj(gelu(fc(ln2(x))))
            let out = Output::Rows {
                out: &mut a.fch_gelu,
                residual: None,
                gelu: true,
            };
            let ln2 = Some((&lw.ln2w, &lw.ln2b));
            decode_gemv(
                gpu,
                ws,
                launch,
                Input::Rows(&a.residual2),
                ln2,
                &lw.fcw,
                Some(&lw.fcb),
                out,
                b,
                c,
                4 * c,
            )?;
            let out = Output::Rows {
                out: &mut a.residual,
                residual: Some(&a.residual2),
                gelu: false,
            };
            let fcproj = (&lw.fcprojw, Some(&lw.fcprojb));
            decode_gemv(
                gpu,
                ws,
                launch,
                Input::Rows(&a.fch_gelu),
                None,
                fcproj.0,
                fcproj.1,
                out,
                b,
                4 * c,
                c,
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
        let lnf = Some((&p.lnfw, &p.lnfb));
        decode_gemv(
            gpu,
            ws,
            launch,
            Input::Rows(&a.residual),
            lnf,
            &p.wte,
            None,
            out,
            b,
            c,
            vp,
        )?;
        Ok(())
    }
}
