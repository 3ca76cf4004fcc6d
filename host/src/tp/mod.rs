//! Tensor parallelism, Megatron-style: how GPT-2's parameters split over
//! `world` ranks, and each rank's share of them.
//!
//! Per layer, every rank holds the whole residual stream and:
//! - a contiguous range of heads: its rows of the q, k and v parts of `qkvw`
//!   (and of `qkvb`), so attention runs on its heads alone, with a KV cache
//!   of those heads only;
//! - the matching columns of `attprojw`: its product with the rank's
//!   attention output is a partial sum of the projection, and one
//!   all-reduce (sum) over the ranks completes it;
//! - a contiguous range of the MLP's `4C` hidden units: its rows of `fcw`
//!   (and `fcb`), its columns of `fcprojw`, one more all-reduce;
//! - a contiguous range of the padded vocabulary for the LM head; the
//!   logits stay split, and the ranks' best candidates are compared for a
//!   greedy choice.
//!
//! The projection biases live on rank 0 only (the other ranks hold zeros,
//! which add exactly nothing), so the all-reduced sum counts each once. The
//! layernorms, the embeddings and everything on the residual stream are
//! replicated.
//!
//! This module is plain arithmetic on f32 vectors, shared by the simulated
//! ranks of [`cpu`] (which check it against the CPU reference in `cargo
//! test`) and the GPU engine over NCCL (`crate::gpu::tp`).

use std::ops::Range;

use anyhow::{Result, ensure};

use crate::cpu::forward::{CpuLayer, CpuParams};
use crate::model::ModelConfig;

pub mod cpu;

/// Hidden units of the MLP and vocabulary rows are split in multiples of
/// this many (when the size allows), so every rank's matrices keep the
/// alignment the matmul kernels like (their inner sizes are multiples of 8
/// or 32 on the tensor-core paths).
pub const SHARD_UNIT: usize = 64;

/// What one rank holds: ranges of heads, of MLP hidden units and of the
/// padded vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankShard {
    pub rank: usize,
    pub world: usize,
    /// Heads `heads.start..heads.end` of every layer.
    pub heads: Range<usize>,
    /// Hidden units of the MLP (rows of `fcw`, columns of `fcprojw`).
    pub hidden: Range<usize>,
    /// Rows of the padded vocabulary (of `wte` as the LM head).
    pub vocab: Range<usize>,
    /// Head size of the model.
    pub head_size: usize,
}

impl RankShard {
    /// Heads this rank runs.
    pub fn num_heads(&self) -> usize {
        self.heads.len()
    }

    /// Channels of this rank's heads (`num_heads * head_size`): the width of
    /// its attention output, a third of its qkv output.
    pub fn channels(&self) -> usize {
        self.heads.len() * self.head_size
    }

    /// The rank's vocabulary rows that are real ids (below `vocab_size`; the
    /// rest is padding, never chosen). Empty for a rank of padding only.
    pub fn real_vocab(&self, vocab_size: usize) -> Range<usize> {
        self.vocab.start.min(vocab_size)..self.vocab.end.min(vocab_size)
    }

    /// The same channels as a range of the model's `C`.
    pub fn channel_range(&self) -> Range<usize> {
        self.heads.start * self.head_size..self.heads.end * self.head_size
    }
}

/// The `rank`-th of `world` near-equal contiguous parts of `0..n`, cut at
/// multiples of `unit` (the first parts take one unit more when they do not
/// divide evenly).
fn part(n: usize, unit: usize, rank: usize, world: usize) -> Range<usize> {
    let units = n / unit;
    let (base, extra) = (units / world, units % world);
    let start = rank * base + rank.min(extra);
    let len = base + usize::from(rank < extra);
    start * unit..(start + len) * unit
}

/// The unit a size of `n` splits in: [`SHARD_UNIT`] where it divides `n`, else 1.
fn unit_of(n: usize) -> usize {
    if n.is_multiple_of(SHARD_UNIT) { SHARD_UNIT } else { 1 }
}

/// How `config` splits over `world` ranks: one [`RankShard`] per rank.
/// Errors when a rank would get no head, no hidden unit or no vocabulary
/// row (more ranks than heads: GPT-2 124M has 12, gpt2-xl 25).
pub fn plan(config: &ModelConfig, world: usize) -> Result<Vec<RankShard>> {
    ensure!(world > 0, "tensor parallelism needs at least one rank");
    let (nh, c, vp) = (config.num_heads, config.channels, config.padded_vocab_size);
    ensure!(
        nh > 0 && c.is_multiple_of(nh),
        "channels {c} are not divisible by heads {nh}"
    );
    ensure!(
        world <= nh,
        "{world} ranks cannot split {nh} attention heads (each rank needs at least one)"
    );
    let hidden = 4 * c;
    let (hu, vu) = (unit_of(hidden), unit_of(vp));
    ensure!(
        world <= hidden / hu && world <= vp / vu,
        "{world} ranks are more than the MLP's {hidden} hidden units or the vocabulary's {vp} rows can be split into"
    );
    Ok((0..world)
        .map(|rank| RankShard {
            rank,
            world,
            heads: part(nh, 1, rank, world),
            hidden: part(hidden, hu, rank, world),
            vocab: part(vp, vu, rank, world),
            head_size: c / nh,
        })
        .collect())
}

/// One rank's parameters, f32, llm.c's (out, in) layout. Each layer is a
/// [`CpuLayer`] whose matrices and vectors have the rank's shapes:
/// `qkvw` `[3 * Cr, C]` (q rows, then k, then v, of the rank's heads),
/// `qkvb` `[3 * Cr]`, `attprojw` `[C, Cr]`, `fcw` `[Hr, C]`, `fcb` `[Hr]`,
/// `fcprojw` `[C, Hr]`, with `Cr` = [`RankShard::channels`] and `Hr` the
/// rank's hidden units; `attprojb` and `fcprojb` are the model's on rank 0
/// and zeros elsewhere; the layernorms are the model's.
pub struct RankParams {
    /// The whole `[Vp, C]` token embedding: every rank embeds every token.
    pub wte: Vec<f32>,
    /// The LM head's rows of the rank's vocabulary: `[Vr, C]`.
    pub head: Vec<f32>,
    pub wpe: Vec<f32>,
    pub layers: Vec<CpuLayer>,
    pub lnfw: Vec<f32>,
    pub lnfb: Vec<f32>,
}

/// Rows `range` of a row-major matrix of `cols` columns.
fn rows_of(m: &[f32], cols: usize, range: Range<usize>) -> Vec<f32> {
    m[range.start * cols..range.end * cols].to_vec()
}

/// Columns `range` of a row-major matrix of `cols` columns, as a row-major
/// matrix of `range.len()` columns.
fn cols_of(m: &[f32], cols: usize, range: Range<usize>) -> Vec<f32> {
    m.chunks_exact(cols)
        .flat_map(|row| &row[range.clone()])
        .copied()
        .collect()
}

/// The rank's share of `params` (a model of `config`), as [`RankParams`] says.
pub fn shard_params(config: &ModelConfig, params: &CpuParams, shard: &RankShard) -> RankParams {
    let c = config.channels;
    let ch = shard.channel_range();
    let bias = |b: &Vec<f32>| if shard.rank == 0 { b.clone() } else { vec![0.0; b.len()] };
    let layers = params
        .layers
        .iter()
        .map(|l| {
            // q, k and v are the three C-row blocks of qkvw: the rank's rows of each.
            let qkv_rows = |part: usize| part * c + ch.start..part * c + ch.end;
            let qkvw = (0..3).flat_map(|p| rows_of(&l.qkvw, c, qkv_rows(p))).collect();
            let qkvb = (0..3).flat_map(|p| l.qkvb[qkv_rows(p)].to_vec()).collect();
            CpuLayer {
                ln1w: l.ln1w.clone(),
                ln1b: l.ln1b.clone(),
                qkvw,
                qkvb,
                attprojw: cols_of(&l.attprojw, c, ch.clone()),
                attprojb: bias(&l.attprojb),
                ln2w: l.ln2w.clone(),
                ln2b: l.ln2b.clone(),
                fcw: rows_of(&l.fcw, c, shard.hidden.clone()),
                fcb: l.fcb[shard.hidden.clone()].to_vec(),
                fcprojw: cols_of(&l.fcprojw, 4 * c, shard.hidden.clone()),
                fcprojb: bias(&l.fcprojb),
            }
        })
        .collect();
    RankParams {
        wte: params.wte.clone(),
        head: rows_of(&params.wte, c, shard.vocab.clone()),
        wpe: params.wpe.clone(),
        layers,
        lnfw: params.lnfw.clone(),
        lnfb: params.lnfb.clone(),
    }
}

/// The greedy choice over ranks: each rank's best `(logit, id)` among its
/// real vocabulary rows (`None` when it holds none), the highest logit
/// winning and ties going to the lowest id (the lower rank: ranks hold
/// increasing ids), as one GPU's argmax does.
pub fn pick_best(candidates: impl IntoIterator<Item = Option<(f32, u32)>>) -> Option<u32> {
    let mut best: Option<(f32, u32)> = None;
    for (value, id) in candidates.into_iter().flatten() {
        if best.is_none_or(|(bv, bid)| value > bv || (value == bv && id < bid)) {
            best = Some((value, id));
        }
    }
    best.map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::{odd_config, tiny_config};

    /// gpt2-xl's shape (25 heads of 64, 1600 channels).
    fn xl() -> ModelConfig {
        ModelConfig {
            max_seq_len: 1024,
            vocab_size: 50257,
            padded_vocab_size: 50304,
            num_layers: 48,
            num_heads: 25,
            channels: 1600,
        }
    }

    #[test]
    fn plans_cover_everything_once() {
        for config in [ModelConfig::GPT2_124M, xl(), tiny_config(), odd_config()] {
            for world in 1..=config.num_heads.min(8) {
                let p = plan(&config, world).unwrap();
                let mut next = (0, 0, 0);
                for s in &p {
                    assert!(!s.heads.is_empty() && !s.hidden.is_empty() && !s.vocab.is_empty());
                    assert_eq!((s.heads.start, s.hidden.start, s.vocab.start), next);
                    next = (s.heads.end, s.hidden.end, s.vocab.end);
                }
                assert_eq!(
                    next,
                    (config.num_heads, 4 * config.channels, config.padded_vocab_size),
                    "{config:?} over {world}"
                );
            }
        }
    }

    #[test]
    fn xl_over_two_ranks() {
        let p = plan(&xl(), 2).unwrap();
        assert_eq!((p[0].heads.clone(), p[1].heads.clone()), (0..13, 13..25));
        assert_eq!((p[0].channels(), p[1].channels()), (832, 768));
        assert_eq!((p[0].hidden.clone(), p[1].hidden.clone()), (0..3200, 3200..6400));
        assert_eq!((p[0].vocab.clone(), p[1].vocab.clone()), (0..25152, 25152..50304));
        assert_eq!(
            (p[0].real_vocab(50257), p[1].real_vocab(50257)),
            (0..25152, 25152..50257)
        );
        assert!(p[1].real_vocab(1000).is_empty());
    }

    #[test]
    fn refuses_more_ranks_than_heads() {
        let err = plan(&tiny_config(), 5).unwrap_err().to_string();
        assert!(err.contains("4 attention heads"), "{err}");
        assert!(plan(&tiny_config(), 0).is_err());
    }

    #[test]
    fn columns_and_rows() {
        let m: Vec<f32> = (0..12).map(|x| x as f32).collect(); // 3 x 4
        assert_eq!(rows_of(&m, 4, 1..3), (4..12).map(|x| x as f32).collect::<Vec<_>>());
        assert_eq!(cols_of(&m, 4, 1..3), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    }

    #[test]
    fn best_over_ranks() {
        assert_eq!(pick_best([Some((1.0, 3)), Some((2.0, 40))]), Some(40));
        assert_eq!(pick_best([Some((2.0, 3)), Some((2.0, 40))]), Some(3));
        assert_eq!(pick_best([None, Some((-1.0, 40))]), Some(40));
        assert_eq!(pick_best([None, None]), None);
    }
}
