//! Tensor parallelism simulated on the CPU: `world` ranks, each with its
//! share of the parameters ([`super::shard_params`]) and a KV cache of its
//! heads, run one after another on the CPU reference ops; the all-reduce is
//! a sum of the ranks' partial projections in rank order. It implements
//! [`Backend`], so it is checked against the unsplit CPU model (and drives
//! the generation loop) in `cargo test`, with no GPU: the sharding
//! arithmetic the GPU engine (`crate::gpu::tp`) runs, proven on its own.
//!
//! The replicated parts (embedding, layernorms, residual adds) are
//! computed once: every rank would compute the same values.

use anyhow::{Context, Result, ensure};
use gpu_host::shape::{AttentionShape, EncoderShape, MatmulShape, RowShape};

use super::{RankParams, RankShard, plan, shard_params};
use crate::cpu::forward::{CpuParams, argmax};
use crate::cpu::ops::{
    attention_forward, encoder_forward, gelu_forward, layernorm_forward, matmul_forward, residual_forward,
};
use crate::generate::{Backend, ForwardLimits, LogitsWanted, check_forward_args};
use crate::model::{ModelConfig, Weights};

/// One simulated rank.
struct Rank {
    shard: RankShard,
    params: RankParams,
    /// Per layer: K and V caches of the rank's heads, `[max_batch][NHr][max_seq_len][HS]`.
    kv_cache: Vec<(Vec<f32>, Vec<f32>)>,
}

/// GPT-2 split over simulated ranks, on the CPU.
pub struct CpuTp {
    config: ModelConfig,
    ranks: Vec<Rank>,
    max_batch: usize,
    max_seq_len: usize,
    /// `[rows, Vp]` logits of the last forward call, gathered from the ranks.
    logits: Vec<f32>,
    /// `(b, rows of logits)` of the last forward call.
    last: Option<(usize, usize)>,
}

impl CpuTp {
    /// Split `weights` over `world` ranks, with KV caches for `max_batch`
    /// rows of `max_seq_len` positions.
    pub fn new(weights: &Weights, world: usize, max_batch: usize, max_seq_len: usize) -> Result<CpuTp> {
        let config = weights.config;
        ensure!(max_batch > 0 && max_seq_len > 0, "empty batch or sequence length");
        ensure!(
            max_seq_len <= config.max_seq_len,
            "a sequence length of {max_seq_len} exceeds the model's context window of {}",
            config.max_seq_len
        );
        let params = CpuParams::from_weights(weights).context("converting the checkpoint for the CPU")?;
        let ranks = plan(&config, world)?
            .into_iter()
            .map(|shard| {
                let cache = max_batch * max_seq_len * shard.channels();
                Rank {
                    params: shard_params(&config, &params, &shard),
                    kv_cache: (0..config.num_layers)
                        .map(|_| (vec![0.0; cache], vec![0.0; cache]))
                        .collect(),
                    shard,
                }
            })
            .collect();
        Ok(CpuTp {
            config,
            ranks,
            max_batch,
            max_seq_len,
            logits: Vec::new(),
            last: None,
        })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }
}

/// `out += part`, element by element (one rank's contribution to an all-reduce).
fn accumulate(out: &mut [f32], part: &[f32]) {
    for (o, p) in out.iter_mut().zip(part) {
        *o += p;
    }
}

impl Backend for CpuTp {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> Result<()> {
        self.last = None;
        let cfg = self.config;
        check_forward_args(
            tokens,
            b,
            t,
            pos0,
            ForwardLimits {
                max_batch: self.max_batch,
                max_seq_len: self.max_seq_len,
                vocab_size: cfg.vocab_size,
                built: "model",
            },
        )?;
        let (c, vp, n) = (cfg.channels, cfg.padded_vocab_size, b * t);
        let max_t = self.max_seq_len;
        let mut residual = vec![0.0; n * c];
        let first = &self.ranks[0].params;
        encoder_forward(
            &mut residual,
            tokens,
            &first.wte,
            &first.wpe,
            EncoderShape { b, t, c, pos0 },
        );
        let (mut ln, mut residual2, mut reduced) = (vec![0.0; n * c], vec![0.0; n * c], vec![0.0; n * c]);
        let mut part = vec![0.0; n * c];
        for li in 0..cfg.num_layers {
            // The replicated layernorm parameters (rank 0's copy; the ranks then borrow mutably).
            let shared = &self.ranks[0].params.layers[li];
            let (ln2w, ln2b) = (shared.ln2w.clone(), shared.ln2b.clone());
            layernorm_forward(&mut ln, &residual, &shared.ln1w, &shared.ln1b, RowShape::new(n, c));
            reduced.fill(0.0);
            for rank in &mut self.ranks {
                let (lw, cr) = (&rank.params.layers[li], rank.shard.channels());
                let mut qkv = vec![0.0; n * 3 * cr];
                matmul_forward(&mut qkv, &ln, &lw.qkvw, Some(&lw.qkvb), MatmulShape::new(n, 3 * cr, c));
                let mut atty = vec![0.0; n * cr];
                let (k, v) = &mut rank.kv_cache[li];
                let nhr = rank.shard.num_heads();
                attention_forward(
                    &mut atty,
                    k,
                    v,
                    &qkv,
                    AttentionShape {
                        b,
                        t,
                        pos0,
                        max_t,
                        c: cr,
                        nh: nhr,
                        window: 0,
                    },
                );
                matmul_forward(
                    &mut part,
                    &atty,
                    &lw.attprojw,
                    Some(&lw.attprojb),
                    MatmulShape::new(n, c, cr),
                );
                accumulate(&mut reduced, &part);
            }
            residual_forward(&mut residual2, &residual, &reduced, n * c);
            layernorm_forward(&mut ln, &residual2, &ln2w, &ln2b, RowShape::new(n, c));
            reduced.fill(0.0);
            for rank in &self.ranks {
                let (lw, hr) = (&rank.params.layers[li], rank.shard.hidden.len());
                let mut fch = vec![0.0; n * hr];
                matmul_forward(&mut fch, &ln, &lw.fcw, Some(&lw.fcb), MatmulShape::new(n, hr, c));
                let mut gelu = vec![0.0; n * hr];
                gelu_forward(&mut gelu, &fch, n * hr);
                matmul_forward(
                    &mut part,
                    &gelu,
                    &lw.fcprojw,
                    Some(&lw.fcprojb),
                    MatmulShape::new(n, c, hr),
                );
                accumulate(&mut reduced, &part);
            }
            residual_forward(&mut residual, &residual2, &reduced, n * c);
        }
        let first = &self.ranks[0].params;
        layernorm_forward(&mut ln, &residual, &first.lnfw, &first.lnfb, RowShape::new(n, c));
        let rows = match want {
            LogitsWanted::All => n,
            LogitsWanted::Last => b,
        };
        let head_in: Vec<f32> = match want {
            LogitsWanted::All => ln,
            LogitsWanted::Last => (0..b)
                .flat_map(|bi| ln[(bi * t + t - 1) * c..(bi * t + t) * c].to_vec())
                .collect(),
        };
        // Each rank's logits are a column range of the whole: gathered in place.
        self.logits.clear();
        self.logits.resize(rows * vp, 0.0);
        for rank in &self.ranks {
            let vocab = rank.shard.vocab.clone();
            let mut local = vec![0.0; rows * vocab.len()];
            matmul_forward(
                &mut local,
                &head_in,
                &rank.params.head,
                None,
                MatmulShape::new(rows, vocab.len(), c),
            );
            for (r, row) in local.chunks_exact(vocab.len()).enumerate() {
                self.logits[r * vp + vocab.start..r * vp + vocab.end].copy_from_slice(row);
            }
        }
        self.last = Some((b, rows));
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        let (_, rows) = self.last.context("logits() called before a successful forward()")?;
        Ok(self.logits[..rows * self.config.padded_vocab_size].to_vec())
    }

    fn argmax(&mut self) -> Result<Vec<u32>> {
        let (b, rows) = self.last.context("argmax() called before a successful forward()")?;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let per_row = rows / b;
        // Each rank's best among its real ids, then the best over ranks.
        Ok((0..b)
            .map(|bi| {
                let row = &self.logits[(bi * per_row + per_row - 1) * vp..][..vp];
                let candidates = self.ranks.iter().map(|rank| {
                    let ids = rank.shard.real_vocab(v);
                    (!ids.is_empty()).then(|| {
                        let local = argmax(&row[ids.clone()]) as usize;
                        (row[ids.start + local], (ids.start + local) as u32)
                    })
                });
                super::pick_best(candidates).expect("rank 0 holds real vocabulary ids")
            })
            .collect())
    }
}
