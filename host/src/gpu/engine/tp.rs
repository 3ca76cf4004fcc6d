//! GPT-2 split over several GPUs of one process: tensor parallelism
//! (Megatron-style, [`crate::tp`] says how the parameters split), the
//! partial projections summed by NCCL all-reduces.
//!
//! Per layer and rank: the (replicated) layernorm, the rank's qkv columns,
//! attention over its heads with a KV cache of those heads, its partial
//! attention projection; one all-reduce; the residual add and layernorm,
//! its MLP units, its partial MLP projection; one more all-reduce. The LM
//! head leaves each rank the logits of its vocabulary range: `logits`
//! gathers them on the host, `argmax` compares the ranks' best candidates.
//!
//! One host thread queues every rank's kernels and the collectives (NCCL
//! groups), each rank on its own GPU's stream, so the GPUs run side by side
//! while the thread moves on. Every forward call runs eagerly (no CUDA
//! graphs, no fused decode step): FP32 weights and the engine's FP32 kernels
//! (3xTF32 tensor cores beyond the GEMV's rows, as [`GpuEngine`] by
//! default). See docs/performance.md for where it pays.

use gpu_host::shape::{
    AttentionShape, DecodeAttentionShape, EncoderShape, KvCacheShape, KvRows, LayernormWeights, MatmulShape, RowShape,
};
use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use gpu_host::nccl::Collective;
use gpu_kernels::params::decode::DECODE_HEAD_SIZE;

use super::{
    Linear, MatmulScratch, Precision, attention, flash_options, flash_supported, fp32_matmul_workspace_floats, matmul,
    matmul_shapes,
};
use crate::cpu::forward::CpuParams;
use crate::generate::{Backend, ForwardLimits, LogitsWanted, check_forward_args};
use crate::gpu::Gpu;
use crate::gpu::ops::argmax::argmax_forward_values;
use crate::gpu::ops::decode::{DecodeLaunch, DecodeWorkspace, decode_attention};
use crate::gpu::ops::encoder::{encoder_forward, encoder_forward_rows};
use crate::gpu::ops::flash_attention::FlashWorkspace;
use crate::gpu::ops::gelu::gelu_forward;
use crate::gpu::ops::kv_cache::kv_cache_store;
use crate::gpu::ops::layernorm::{LayernormOut, layernorm_forward, residual_layernorm_forward};
use crate::gpu::ops::matmul::MatmulWorkspace;
use crate::gpu::ops::weight::WeightRef;
use crate::gpu::runtime::CudaContextExt;
use crate::model::{Layer, ModelConfig, Weights};
use crate::tp::{RankParams, RankShard, pick_best, plan, shard_params};

/// One rank's parameters on its GPU (shapes as [`RankParams`]).
struct DeviceRankParams {
    wte: CudaSlice<f32>,
    head: CudaSlice<f32>,
    wpe: CudaSlice<f32>,
    layers: Vec<Layer<CudaSlice<f32>>>,
    lnfw: CudaSlice<f32>,
    lnfb: CudaSlice<f32>,
}

/// One rank's activations for up to `rows` positions.
struct RankActs {
    tokens: CudaSlice<u32>,
    residual: CudaSlice<f32>,
    residual2: CudaSlice<f32>,
    ln: CudaSlice<f32>,
    /// `[rows, 3 Cr]`
    qkv: CudaSlice<f32>,
    /// `[rows, Cr]`
    atty: CudaSlice<f32>,
    /// `[rows, C]`: a partial projection, then (after the all-reduce) the whole.
    proj: CudaSlice<f32>,
    /// `[rows, Hr]` each
    fch: CudaSlice<f32>,
    fch_gelu: CudaSlice<f32>,
    head_in: CudaSlice<f32>,
    /// `[rows, Vr]`: the logits of the rank's vocabulary range.
    logits: CudaSlice<f32>,
    /// `[max_batch]`: each row's best id among the rank's and its logit.
    ids: CudaSlice<u32>,
    best: CudaSlice<f32>,
}

/// A rank's state for decode steps with per-row positions (graph-capturable:
/// the positions live on the device), where the head size has the decode
/// kernels.
struct RankStep {
    /// `[max_batch]` positions of a step's rows.
    pos: CudaSlice<u32>,
    /// `[max_batch, Cr]` queries of a step.
    q: CudaSlice<f32>,
    ws: DecodeWorkspace,
    /// Host staging of `pos`.
    host_pos: Vec<u32>,
}

/// Where a forward call's positions come from.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// Every row at positions `pos0..pos0 + t`, a kernel argument.
    Shared { pos0: usize },
    /// One token a row at its position in [`RankStep::pos`] (capturable).
    PerRow,
}

/// One GPU's share.
struct Rank {
    gpu: Gpu,
    shard: RankShard,
    params: DeviceRankParams,
    /// Per layer: K and V caches of the rank's heads, `[max_batch][NHr][max_seq_len][HS]`.
    kv_cache: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    acts: RankActs,
    flash: Option<FlashWorkspace>,
    matmul_ws: MatmulScratch,
    step: Option<RankStep>,
}

/// What the last successful `forward` produced.
#[derive(Clone, Copy, Debug)]
struct Last {
    b: usize,
    rows: usize,
}

/// GPT-2 split over several GPUs with NCCL.
pub struct TpEngine {
    config: ModelConfig,
    ranks: Vec<Rank>,
    collective: Collective,
    max_batch: usize,
    max_seq_len: usize,
    last: Option<Last>,
    /// Decode steps as CUDA graphs (one a rank, per batch size), made on first use.
    graphs: HashMap<usize, Vec<CudaGraph>>,
    /// Whether decode steps run as graphs ([`TpEngine::set_decode_graphs`];
    /// off after a capture failed).
    graphs_on: bool,
    /// Why capturing failed, if it did.
    graph_error: Option<String>,
}

impl Rank {
    fn new(
        gpu: Gpu,
        config: &ModelConfig,
        shard: RankShard,
        p: &RankParams,
        max_batch: usize,
        max_seq_len: usize,
    ) -> Result<Rank> {
        let (c, vp) = (config.channels, config.padded_vocab_size);
        let (cr, hr, vr) = (shard.channels(), shard.hidden.len(), shard.vocab.len());
        let rows = max_batch * max_seq_len;
        let name = gpu.name();
        let oom = |what: &str| {
            format!(
                "allocating {what} of rank {} on {name} (device {})",
                shard.rank,
                gpu.ordinal()
            )
        };
        let up = |v: &Vec<f32>| gpu.upload(v);
        let params = (|| {
            Ok::<_, crate::gpu::GpuError>(DeviceRankParams {
                wte: up(&p.wte)?,
                head: up(&p.head)?,
                wpe: up(&p.wpe)?,
                layers: p
                    .layers
                    .iter()
                    .map(|l| l.as_ref().try_map(|_, v| up(v), |_, m| up(m)))
                    .collect::<Result<_, _>>()?,
                lnfw: up(&p.lnfw)?,
                lnfb: up(&p.lnfb)?,
            })
        })()
        .with_context(|| oom("the weights"))?;
        debug_assert_eq!(p.wte.len(), vp * c);
        let cache = max_batch * max_seq_len * cr;
        let kv_cache = (0..config.num_layers)
            .map(|_| Ok((gpu.alloc::<f32>(cache)?, gpu.alloc::<f32>(cache)?)))
            .collect::<Result<Vec<_>, crate::gpu::GpuError>>()
            .with_context(|| oom("the KV cache"))?;
        let alloc = |n: usize| gpu.alloc::<f32>(n);
        let acts = (|| {
            Ok::<_, crate::gpu::GpuError>(RankActs {
                tokens: gpu.alloc::<u32>(rows)?,
                residual: alloc(rows * c)?,
                residual2: alloc(rows * c)?,
                ln: alloc(rows * c)?,
                qkv: alloc(rows * 3 * cr)?,
                atty: alloc(rows * cr)?,
                proj: alloc(rows * c)?,
                fch: alloc(rows * hr)?,
                fch_gelu: alloc(rows * hr)?,
                head_in: alloc(max_batch * c)?,
                logits: alloc(rows * vr)?,
                ids: gpu.alloc::<u32>(max_batch)?,
                best: alloc(max_batch)?,
            })
        })()
        .with_context(|| oom("the activations"))?;
        let rank_config = ModelConfig {
            num_heads: shard.num_heads(),
            channels: cr,
            ..*config
        };
        let flash = match flash_supported(&rank_config, max_batch, max_seq_len) {
            true => Some(
                FlashWorkspace::new(&gpu, max_batch, shard.num_heads(), max_seq_len)
                    .with_context(|| oom("the flash-attention workspace"))?,
            ),
            false => None,
        };
        let shapes = matmul_shapes(rows, c, cr, hr, vr);
        let floats = fp32_matmul_workspace_floats(&shapes, gpu.sm_count());
        let matmul_ws = MatmulScratch {
            fp32: MatmulWorkspace::new(&gpu, floats).with_context(|| oom("the matmul workspace"))?,
            fp32_tensor_cores: true,
            tf32_split: None,
        };
        let step = match shard.head_size == DECODE_HEAD_SIZE as usize {
            true => Some(RankStep {
                pos: gpu.alloc(max_batch).with_context(|| oom("the decode positions"))?,
                q: alloc(max_batch * cr).with_context(|| oom("the decode queries"))?,
                ws: DecodeWorkspace::new(&gpu, max_batch, shard.num_heads(), max_seq_len)
                    .with_context(|| oom("the decode attention workspace"))?,
                host_pos: Vec::with_capacity(max_batch),
            }),
            false => None,
        };
        Ok(Rank {
            gpu,
            shard,
            params,
            kv_cache,
            acts,
            flash,
            matmul_ws,
            step,
        })
    }

    /// A linear layer of this rank: `out[m, n] = inp[m, k] · w[n, k]ᵀ (+ bias)`.
    fn linear(
        gpu: &Gpu,
        ws: &mut MatmulScratch,
        out: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        shape: MatmulShape,
    ) -> Result<()> {
        let linear = Linear::new(WeightRef::F32(w), bias);
        matmul(gpu, Precision::Fp32, ws, out, inp, linear, shape)?;
        Ok(())
    }
}

impl TpEngine {
    /// Split `weights` over `gpus` (distinct devices, rank `i` on `gpus[i]`)
    /// and allocate each rank's activations and KV cache for batches of up
    /// to `max_batch` rows of `max_seq_len` positions. FP32 only.
    pub fn new(
        gpus: Vec<Gpu>,
        weights: &Weights,
        max_batch: usize,
        max_seq_len: usize,
        precision: Precision,
    ) -> Result<TpEngine> {
        let config = weights.config;
        ensure!(
            precision == Precision::Fp32,
            "tensor parallelism runs FP32 only for now ({precision:?} was asked for)"
        );
        ensure!(max_batch > 0 && max_seq_len > 0, "empty batch or sequence length");
        ensure!(
            max_seq_len <= config.max_seq_len,
            "a sequence length of {max_seq_len} exceeds the model's context window of {} positions",
            config.max_seq_len
        );
        let shards = plan(&config, gpus.len())?;
        let collective = Collective::new(&gpus.iter().collect::<Vec<_>>()).context("starting NCCL")?;
        let params = CpuParams::from_weights(weights).context("converting the checkpoint")?;
        // One rank's share on the host at a time.
        let ranks = gpus
            .into_iter()
            .zip(shards)
            .map(|(gpu, shard)| {
                let p = shard_params(&config, &params, &shard);
                Rank::new(gpu, &config, shard, &p, max_batch, max_seq_len)
            })
            .collect::<Result<Vec<_>>>()?;
        for r in &ranks {
            r.gpu.synchronize().context("uploading the weights")?;
        }
        Ok(TpEngine {
            config,
            ranks,
            collective,
            max_batch,
            max_seq_len,
            last: None,
            graphs: HashMap::new(),
            graphs_on: true,
            graph_error: None,
        })
    }

    /// Run decode steps (`t = 1`) as one CUDA graph a rank (`true`, the
    /// default, where the head size has the decode kernels) or queue every
    /// kernel (`false`; for comparison).
    pub fn set_decode_graphs(&mut self, on: bool) {
        self.graphs_on = on;
    }

    /// Run each rank's FP32 matmuls beyond the GEMV's rows on the tensor
    /// cores as 3xTF32 (`true`, the default, as [`GpuEngine`](super::GpuEngine)) or on the CUDA
    /// cores (`false`; see `GpuEngine::set_fp32_tensor_cores`). Decode
    /// graphs captured before are dropped, so the next step captures the
    /// kernels chosen now.
    pub fn set_fp32_tensor_cores(&mut self, on: bool) {
        for r in &mut self.ranks {
            r.matmul_ws.fp32_tensor_cores = on;
        }
        self.graphs.clear();
    }

    /// Why decode steps stopped running as graphs (a capture failed), if they did.
    pub fn decode_graph_error(&self) -> Option<&str> {
        self.graph_error.as_deref()
    }

    /// Number of ranks (GPUs).
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// Each rank's GPU, in rank order.
    pub fn gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.ranks.iter().map(|r| &r.gpu)
    }

    /// Wait until every rank's queued work is done.
    pub fn synchronize(&self) -> Result<()> {
        for r in &self.ranks {
            r.gpu.synchronize().context("waiting for a rank")?;
        }
        Ok(())
    }

    /// The all-reduce of every rank's `proj[..len]`.
    fn all_reduce_proj(&mut self, len: usize) -> Result<()> {
        let mut bufs: Vec<&mut CudaSlice<f32>> = self.ranks.iter_mut().map(|r| &mut r.acts.proj).collect();
        self.collective
            .all_reduce_sum(&mut bufs, len)
            .context("all-reduce of the projections")
    }

    /// The forward pass after the argument checks: a decode step (`t = 1`)
    /// as each rank's CUDA graph where it can, else every kernel queued.
    fn run(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> Result<()> {
        let n = b * t;
        let graphs = t == 1 && self.graphs_on && self.ranks.iter().all(|r| r.step.is_some());
        for r in &mut self.ranks {
            r.gpu
                .memcpy_htod(tokens, &mut r.acts.tokens.slice_mut(0..n))
                .ctx("uploading token ids")?;
            if let (true, Some(s)) = (graphs, r.step.as_mut()) {
                let pos = u32::try_from(pos0).context("position past u32")?;
                s.host_pos.clear();
                s.host_pos.resize(b, pos);
                r.gpu
                    .memcpy_htod(&s.host_pos, &mut s.pos.slice_mut(0..b))
                    .ctx("uploading positions")?;
            }
        }
        if !graphs {
            return self.enqueue(b, t, Place::Shared { pos0 }, want);
        }
        if !self.graphs.contains_key(&b) {
            match self.capture(b) {
                Ok(g) => {
                    self.graphs.insert(b, g);
                }
                // Not capturable here (e.g. an NCCL without graph support):
                // say why once, and queue the kernels from now on.
                Err(e) => {
                    self.graphs_on = false;
                    self.graph_error = Some(format!("{e:#}"));
                    return self.enqueue(b, t, Place::Shared { pos0 }, want);
                }
            }
        }
        for g in &self.graphs[&b] {
            g.launch().ctx("cuGraphLaunch")?;
        }
        Ok(())
    }

    /// Each rank's decode step of `b` rows captured into a graph (all ranks'
    /// streams at once: the all-reduces join them). Relaxed mode: NCCL's
    /// group end makes calls that the stricter modes forbid while a stream
    /// of this thread captures (they invalidated the capture, on 2 H200s).
    fn capture(&mut self, b: usize) -> Result<Vec<CudaGraph>> {
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let mut begun = 0;
        let mut result = Ok(());
        for r in &self.ranks {
            if let Err(e) = r.gpu.begin_capture(mode) {
                result = Err(anyhow::Error::new(e).context("cuStreamBeginCapture"));
                break;
            }
            begun += 1;
        }
        if result.is_ok() {
            result = self.enqueue(b, 1, Place::PerRow, LogitsWanted::Last);
        }
        // End every capture that began, whatever happened, so the streams work again.
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let ended: Vec<_> = self.ranks[..begun].iter().map(|r| r.gpu.end_capture(flags)).collect();
        result.context("capturing the tensor-parallel decode step")?;
        ended
            .into_iter()
            .map(|g| {
                let g = g.ctx("cuStreamEndCapture")?.context("the capture recorded no graph")?;
                g.upload().ctx("cuGraphUpload")?;
                Ok(g)
            })
            .collect()
    }

    /// Queue the forward pass of `b` rows of `t` tokens on every rank (token
    /// ids already uploaded; with [`Place::PerRow`], the positions too).
    fn enqueue(&mut self, b: usize, t: usize, place: Place, want: LogitsWanted) -> Result<()> {
        let cfg = self.config;
        let (c, n, max_t) = (cfg.channels, b * t, self.max_seq_len);
        for r in &mut self.ranks {
            let (gpu, p, a) = (&r.gpu, &r.params, &mut r.acts);
            match (place, r.step.as_ref()) {
                (Place::Shared { pos0 }, _) => encoder_forward(
                    gpu,
                    &mut a.residual,
                    &a.tokens,
                    &p.wte,
                    &p.wpe,
                    EncoderShape { b, t, c, pos0 },
                )?,
                (Place::PerRow, Some(s)) => encoder_forward_rows(
                    gpu,
                    &mut a.residual,
                    &a.tokens,
                    &s.pos,
                    WeightRef::F32(&p.wte),
                    &p.wpe,
                    RowShape::new(n, c),
                )?,
                (Place::PerRow, None) => anyhow::bail!("no per-row decode state"),
            }
            let first = p.layers.first().context("the model has no layers")?;
            layernorm_forward(
                gpu,
                &mut a.ln,
                &a.residual,
                &first.ln1w,
                &first.ln1b,
                RowShape::new(n, c),
            )?;
        }
        for li in 0..cfg.num_layers {
            // Attention over each rank's heads, then its share of the projection.
            for r in &mut self.ranks {
                let (gpu, lw, a, ws) = (&r.gpu, &r.params.layers[li], &mut r.acts, &mut r.matmul_ws);
                let (cr, nhr) = (r.shard.channels(), r.shard.num_heads());
                Rank::linear(
                    gpu,
                    ws,
                    &mut a.qkv,
                    &a.ln,
                    &lw.qkvw,
                    Some(&lw.qkvb),
                    MatmulShape::new(n, 3 * cr, c),
                )?;
                let (k, v) = &mut r.kv_cache[li];
                match (place, r.step.as_mut()) {
                    (Place::Shared { pos0 }, _) => {
                        let cache = 0..b * cr * max_t;
                        let (mut k, mut v) = (k.slice_mut(cache.clone()), v.slice_mut(cache));
                        let flash = r.flash.as_mut().map(|ws| flash_options(Precision::Fp32, ws));
                        attention(
                            gpu,
                            flash,
                            &mut a.atty,
                            &mut k,
                            &mut v,
                            &a.qkv,
                            AttentionShape {
                                b,
                                t,
                                pos0,
                                max_t,
                                c: cr,
                                nh: nhr,
                                window: 0,
                            },
                        )?;
                    }
                    (Place::PerRow, Some(s)) => {
                        let pos = &s.pos;
                        let cache = KvRows {
                            k_cache: &mut *k,
                            v_cache: &mut *v,
                            pos,
                            cache_row: None,
                        };
                        let shape = KvCacheShape {
                            rows: n,
                            c: cr,
                            nh: nhr,
                            max_t,
                        };
                        kv_cache_store(gpu, &mut s.q, cache, &a.qkv, shape)?;
                        let cache = KvRows {
                            k_cache: &*k,
                            v_cache: &*v,
                            pos,
                            cache_row: None,
                        };
                        let launch = DecodeLaunch::new(false);
                        let (out, shape) = (&mut a.atty, DecodeAttentionShape::new(n, cr, nhr));
                        decode_attention(gpu, &mut s.ws, launch, out, &s.q, cache, shape)?;
                    }
                    (Place::PerRow, None) => anyhow::bail!("no per-row decode state"),
                }
                Rank::linear(
                    gpu,
                    ws,
                    &mut a.proj,
                    &a.atty,
                    &lw.attprojw,
                    Some(&lw.attprojb),
                    MatmulShape::new(n, c, cr),
                )?;
            }
            self.all_reduce_proj(n * c)?;
            // The residual add and ln2, then each rank's MLP units and its share of their projection.
            for r in &mut self.ranks {
                let (gpu, lw, a, ws) = (&r.gpu, &r.params.layers[li], &mut r.acts, &mut r.matmul_ws);
                let hr = r.shard.hidden.len();
                let (res, ln) = (&mut a.residual2, LayernormOut::F32(&mut a.ln));
                let ln2 = LayernormWeights {
                    weight: &lw.ln2w,
                    bias: &lw.ln2b,
                };
                residual_layernorm_forward(gpu, res, ln, &a.residual, &a.proj, ln2, RowShape::new(n, c))?;
                Rank::linear(
                    gpu,
                    ws,
                    &mut a.fch,
                    &a.ln,
                    &lw.fcw,
                    Some(&lw.fcb),
                    MatmulShape::new(n, hr, c),
                )?;
                gelu_forward(gpu, &mut a.fch_gelu, &a.fch, n * hr)?;
                Rank::linear(
                    gpu,
                    ws,
                    &mut a.proj,
                    &a.fch_gelu,
                    &lw.fcprojw,
                    Some(&lw.fcprojb),
                    MatmulShape::new(n, c, hr),
                )?;
            }
            self.all_reduce_proj(n * c)?;
            // The residual stream, and the layernorm that reads it next.
            for r in &mut self.ranks {
                let (gpu, p, a) = (&r.gpu, &r.params, &mut r.acts);
                let (weight, bias) = match p.layers.get(li + 1) {
                    Some(next) => (&next.ln1w, &next.ln1b),
                    None => (&p.lnfw, &p.lnfb),
                };
                let next_ln = LayernormWeights { weight, bias };
                let (res, ln) = (&mut a.residual, LayernormOut::F32(&mut a.ln));
                residual_layernorm_forward(gpu, res, ln, &a.residual2, &a.proj, next_ln, RowShape::new(n, c))?;
            }
        }
        let rows = match want {
            LogitsWanted::All => n,
            LogitsWanted::Last => b,
        };
        for r in &mut self.ranks {
            let (gpu, p, a, ws) = (&r.gpu, &r.params, &mut r.acts, &mut r.matmul_ws);
            let head_in = super::head_rows(gpu, super::Heads::from_want(want, b, t), &a.ln, &mut a.head_in, c)?;
            let vr = r.shard.vocab.len();
            Rank::linear(
                gpu,
                ws,
                &mut a.logits,
                head_in,
                &p.head,
                None,
                MatmulShape::new(rows, vr, c),
            )?;
        }
        Ok(())
    }
}

impl Drop for TpEngine {
    /// The decode graphs hold NCCL work of the communicators, so they go
    /// first, once every rank is idle: destroying the communicators under
    /// live graphs hung (2 H100s).
    fn drop(&mut self) {
        let _ = self.synchronize();
        self.graphs.clear();
        let _ = self.synchronize();
    }
}

impl Backend for TpEngine {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> Result<()> {
        self.last = None;
        let v = self.config.vocab_size;
        check_forward_args(
            tokens,
            b,
            t,
            pos0,
            ForwardLimits {
                max_batch: self.max_batch,
                max_seq_len: self.max_seq_len,
                vocab_size: v,
                built: "engine",
            },
        )?;
        self.run(tokens, b, t, pos0, want)?;
        let rows = match want {
            LogitsWanted::All => b * t,
            LogitsWanted::Last => b,
        };
        self.last = Some(Last { b, rows });
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        let Last { rows, .. } = self.last.context("logits() called before a successful forward()")?;
        let vp = self.config.padded_vocab_size;
        let mut out = vec![0f32; rows * vp];
        for r in &self.ranks {
            let vocab = r.shard.vocab.clone();
            let mut local = vec![0f32; rows * vocab.len()];
            r.gpu
                .memcpy_dtoh(&r.acts.logits.slice(0..rows * vocab.len()), &mut local)
                .ctx("reading a rank's logits")?;
            for (row, part) in local.chunks_exact(vocab.len()).enumerate() {
                out[row * vp + vocab.start..row * vp + vocab.end].copy_from_slice(part);
            }
        }
        Ok(out)
    }

    fn argmax(&mut self) -> Result<Vec<u32>> {
        let Last { b, rows } = self.last.context("argmax() called before a successful forward()")?;
        let v = self.config.vocab_size;
        let per_row = rows / b;
        // Each rank's best among its real ids, with its logit, on its GPU;
        // all ranks' kernels queued before the first read.
        for r in &mut self.ranks {
            let (vr, n_real) = (r.shard.vocab.len(), r.shard.real_vocab(v).len());
            if n_real > 0 {
                let a = &mut r.acts;
                let last = a.logits.slice((per_row - 1) * vr..);
                argmax_forward_values(&r.gpu, &mut a.ids, &mut a.best, &last, b, n_real, per_row * vr)?;
            }
        }
        let mut best: Vec<Vec<Option<(f32, u32)>>> = Vec::with_capacity(self.ranks.len());
        for r in &self.ranks {
            if r.shard.real_vocab(v).is_empty() {
                best.push(vec![None; b]);
                continue;
            }
            let (mut ids, mut values) = (vec![0u32; b], vec![0f32; b]);
            r.gpu
                .memcpy_dtoh(&r.acts.ids.slice(0..b), &mut ids)
                .ctx("reading a rank's argmax")?;
            r.gpu
                .memcpy_dtoh(&r.acts.best.slice(0..b), &mut values)
                .ctx("reading a rank's best logits")?;
            let start = r.shard.vocab.start as u32;
            best.push(
                values
                    .into_iter()
                    .zip(ids)
                    .map(|(x, id)| Some((x, start + id)))
                    .collect(),
            );
        }
        (0..b)
            .map(|bi| pick_best(best.iter().map(|rank| rank[bi])).context("no rank holds a vocabulary id"))
            .collect()
    }
}
