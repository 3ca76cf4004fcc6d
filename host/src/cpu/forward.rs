//! The CPU reference model: GPT-2's forward pass over [`super::ops`], in the
//! paper's order, with a KV cache. It implements [`Backend`], so the
//! generation loop runs on it exactly as on the GPU engine.

use anyhow::{Context, Result, ensure};
use gpu_host::shape::{AttentionShape, EncoderShape, MatmulShape, RowShape};

use super::ops::{attention_forward, encoder_forward, layernorm_forward, matmul_forward, residual_forward};
use crate::cpu::sample::sample_row;
use crate::generate::{Backend, ForwardLimits, LogitsWanted, check_forward_args};
use crate::model::{Layer, ModelConfig, Tensor, Weights};
use crate::serve::backend::{Draw, SlotBackend, SlotChunk, SlotToken, check_slot_chunks, check_slot_rows};

/// One block's parameters as f32 vectors.
pub type CpuLayer = Layer<Vec<f32>>;

/// All parameters as f32 vectors; `wte` has `padded_vocab_size` rows (the
/// padding rows are zero).
pub struct CpuParams {
    pub wte: Vec<f32>,
    pub wpe: Vec<f32>,
    pub layers: Vec<CpuLayer>,
    pub lnfw: Vec<f32>,
    pub lnfb: Vec<f32>,
}

impl CpuParams {
    /// Convert the checkpoint's tensors once (any dtype, any storage order),
    /// checking every shape against the config.
    pub fn from_weights(w: &Weights) -> Result<CpuParams> {
        let cfg = &w.config;
        let (c, vp) = (cfg.channels, cfg.padded_vocab_size);
        let get = |name: &str, t: &Tensor, len: usize| -> Result<Vec<f32>> {
            ensure!(
                t.len() == len,
                "parameter {name} has {} values, the config needs {len}",
                t.len()
            );
            Ok(t.to_f32().into_owned())
        };
        ensure!(
            w.wte.shape[1] == c && (w.wte.shape[0] == cfg.vocab_size || w.wte.shape[0] == vp),
            "wte has shape {:?}, expected ({} or {vp}, {c})",
            w.wte.shape,
            cfg.vocab_size
        );
        let mut wte = w.wte.to_f32().into_owned();
        wte.resize(vp * c, 0.0);
        ensure!(
            w.layers.len() == cfg.num_layers,
            "checkpoint has {} layers, config says {}",
            w.layers.len(),
            cfg.num_layers
        );
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(l, lw)| {
                let conv = |name: &'static str, (t, len): (&Tensor, usize)| get(&format!("layer {l} {name}"), t, len);
                lw.as_ref().zip(Layer::sizes(c)).try_map(conv, conv)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuParams {
            wte,
            wpe: get("wpe", &w.wpe, cfg.max_seq_len * c)?,
            layers,
            lnfw: get("lnfw", &w.lnfw, c)?,
            lnfb: get("lnfb", &w.lnfb, c)?,
        })
    }
}

/// Activations of one forward call, grown on demand and then reused.
#[derive(Default)]
struct Activations {
    /// Residual stream `[N, C]` (N = B*T tokens of this call).
    residual: Vec<f32>,
    ln1: Vec<f32>,
    qkv: Vec<f32>,
    atty: Vec<f32>,
    attproj: Vec<f32>,
    residual2: Vec<f32>,
    ln2: Vec<f32>,
    fch: Vec<f32>,
    fch_gelu: Vec<f32>,
    fcproj: Vec<f32>,
    lnf: Vec<f32>,
    /// The rows of `lnf` whose logits are wanted.
    head_in: Vec<f32>,
    logits: Vec<f32>,
}

/// GPT-2 on the CPU with a KV cache for `max_batch` rows of `max_seq_len`
/// positions.
pub struct CpuModel {
    config: ModelConfig,
    params: CpuParams,
    max_batch: usize,
    max_seq_len: usize,
    /// Attention window (0 = unlimited, GPT-2's own behaviour).
    window: usize,
    /// Per layer: K and V caches, `[max_batch][NH][max_seq_len][HS]` each.
    kv_cache: Vec<(Vec<f32>, Vec<f32>)>,
    acts: Activations,
    /// `(b, rows of logits)` of the last forward call, if any.
    last: Option<(usize, usize)>,
    /// The bf16 twin ([`CpuModel::new_bf16`]): every matmul input is
    /// rounded to bf16 (its weights were at creation).
    bf16: bool,
    /// [`SlotBackend`]: logits `[rows, Vp]` of the last prefill or decode
    /// step, gathered row by row.
    slot_logits: Vec<f32>,
    slot_rows: usize,
}

impl CpuModel {
    /// Convert the weights to f32 once and allocate the KV cache.
    pub fn new(weights: &Weights, max_batch: usize, max_seq_len: usize) -> Result<CpuModel> {
        let params = CpuParams::from_weights(weights).context("converting the checkpoint for the CPU")?;
        Self::from_params(weights.config, params, max_batch, max_seq_len)
    }

    /// The reference of the GPU engine's bf16 precision: the weight
    /// matrices (qkv, attproj, fc, fcproj, wte) rounded to the nearest bf16
    /// once, and every matmul's input rounded to bf16 before it multiplies
    /// (f32 products of bf16 values are exact, sums in f32); the keys and
    /// values rounded to bf16 as the engine's bf16 KV cache keeps them;
    /// everything else (embedding positions, biases, layernorm, attention
    /// arithmetic) in f32, as the engine does it.
    pub fn new_bf16(weights: &Weights, max_batch: usize, max_seq_len: usize) -> Result<CpuModel> {
        let mut params = CpuParams::from_weights(weights).context("converting the checkpoint for the CPU")?;
        for l in &mut params.layers {
            for w in l.matrices_mut() {
                round_bf16(w);
            }
        }
        round_bf16(&mut params.wte);
        let mut model = Self::from_params(weights.config, params, max_batch, max_seq_len)?;
        model.bf16 = true;
        Ok(model)
    }

    /// Build from parameters already in memory (tests construct them directly).
    pub fn from_params(
        config: ModelConfig,
        params: CpuParams,
        max_batch: usize,
        max_seq_len: usize,
    ) -> Result<CpuModel> {
        ensure!(max_batch > 0, "the batch size must be at least 1");
        ensure!(max_seq_len > 0, "the sequence length must be at least 1");
        ensure!(
            max_seq_len <= config.max_seq_len,
            "a sequence length of {max_seq_len} exceeds the model's context window of {} positions",
            config.max_seq_len
        );
        ensure!(
            config.channels.is_multiple_of(config.num_heads),
            "channels {} not divisible by heads {}",
            config.channels,
            config.num_heads
        );
        let cache_len = max_batch * config.num_heads * max_seq_len * config.head_size();
        let kv_cache = (0..config.num_layers)
            .map(|_| (vec![0f32; cache_len], vec![0f32; cache_len]))
            .collect();
        Ok(CpuModel {
            config,
            params,
            max_batch,
            max_seq_len,
            window: 0,
            kv_cache,
            acts: Activations::default(),
            last: None,
            bf16: false,
            slot_logits: Vec::new(),
            slot_rows: 0,
        })
    }

    /// Limit attention to the last `window` positions (0 = unlimited).
    pub fn set_attention_window(&mut self, window: usize) {
        self.window = window;
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }
}

/// Round every value to the nearest bf16 (ties to even), kept as f32.
pub fn round_bf16(x: &mut [f32]) {
    for v in x {
        *v = half::bf16::from_f32(*v).to_f32();
    }
}

/// Resize an activation buffer to `n` values (keeps its allocation).
fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.resize(n, 0.0);
    &mut buf[..n]
}

impl Backend for CpuModel {
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
                built: "model",
            },
        )?;
        self.run_rows(tokens, b, t, pos0, want, 0);
        self.last = Some((b, if want == LogitsWanted::All { b * t } else { b }));
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        let (_, rows) = self.last.context("logits() called before a successful forward()")?;
        Ok(self.acts.logits[..rows * self.config.padded_vocab_size].to_vec())
    }

    fn argmax(&mut self) -> Result<Vec<u32>> {
        let (b, rows) = self.last.context("argmax() called before a successful forward()")?;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let per_row = rows / b;
        Ok((0..b)
            .map(|bi| {
                let r = bi * per_row + per_row - 1;
                argmax(&self.acts.logits[r * vp..r * vp + v])
            })
            .collect())
    }
}

impl CpuModel {
    /// The forward pass of `b` rows of `t` tokens at positions
    /// `pos0..pos0 + t` on cache rows `row0..row0 + b`, leaving the wanted
    /// logits in `acts.logits`. The caller has checked the arguments.
    fn run_rows(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted, row0: usize) {
        let cfg = self.config;
        let (c, nh, vp) = (cfg.channels, cfg.num_heads, cfg.padded_vocab_size);
        let n = b * t;
        let (p, bf16) = (&self.params, self.bf16);
        let a = &mut self.acts;
        let round_if = |on: bool, x: &mut Vec<f32>| {
            if on {
                round_bf16(x)
            }
        };
        encoder_forward(
            sized(&mut a.residual, n * c),
            tokens,
            &p.wte,
            &p.wpe,
            EncoderShape { b, t, c, pos0 },
        );
        let row_len = cfg.num_heads * self.max_seq_len * cfg.head_size();
        for (lw, (k_all, v_all)) in p.layers.iter().zip(self.kv_cache.iter_mut()) {
            let (k_cache, v_cache) = (&mut k_all[row0 * row_len..], &mut v_all[row0 * row_len..]);
            layernorm_forward(
                sized(&mut a.ln1, n * c),
                &a.residual,
                &lw.ln1w,
                &lw.ln1b,
                RowShape::new(n, c),
            );
            round_if(bf16, &mut a.ln1);
            matmul_forward(
                sized(&mut a.qkv, n * 3 * c),
                &a.ln1,
                &lw.qkvw,
                Some(&lw.qkvb),
                MatmulShape::new(n, 3 * c, c),
            );
            if bf16 {
                // The bf16 engine keeps its KV cache in bf16: K and V as stored.
                for row in a.qkv[..n * 3 * c].chunks_exact_mut(3 * c) {
                    round_bf16(&mut row[c..]);
                }
            }
            attention_forward(
                sized(&mut a.atty, n * c),
                k_cache,
                v_cache,
                &a.qkv,
                AttentionShape {
                    b,
                    t,
                    pos0,
                    max_t: self.max_seq_len,
                    c,
                    nh,
                    window: self.window,
                },
            );
            round_if(bf16, &mut a.atty);
            matmul_forward(
                sized(&mut a.attproj, n * c),
                &a.atty,
                &lw.attprojw,
                Some(&lw.attprojb),
                MatmulShape::new(n, c, c),
            );
            residual_forward(sized(&mut a.residual2, n * c), &a.residual, &a.attproj, n * c);
            layernorm_forward(
                sized(&mut a.ln2, n * c),
                &a.residual2,
                &lw.ln2w,
                &lw.ln2b,
                RowShape::new(n, c),
            );
            round_if(bf16, &mut a.ln2);
            matmul_forward(
                sized(&mut a.fch, n * 4 * c),
                &a.ln2,
                &lw.fcw,
                Some(&lw.fcb),
                MatmulShape::new(n, 4 * c, c),
            );
            super::ops::gelu_forward(sized(&mut a.fch_gelu, n * 4 * c), &a.fch, n * 4 * c);
            round_if(bf16, &mut a.fch_gelu);
            matmul_forward(
                sized(&mut a.fcproj, n * c),
                &a.fch_gelu,
                &lw.fcprojw,
                Some(&lw.fcprojb),
                MatmulShape::new(n, c, 4 * c),
            );
            residual_forward(sized(&mut a.residual, n * c), &a.residual2, &a.fcproj, n * c);
        }
        layernorm_forward(
            sized(&mut a.lnf, n * c),
            &a.residual,
            &p.lnfw,
            &p.lnfb,
            RowShape::new(n, c),
        );
        round_if(bf16, &mut a.lnf);

        // LM head (tied to wte, no bias) on the wanted rows only.
        let rows = match want {
            LogitsWanted::All => n,
            LogitsWanted::Last => b,
        };
        let head_in: &[f32] = match want {
            LogitsWanted::All => &a.lnf,
            LogitsWanted::Last => {
                let buf = sized(&mut a.head_in, b * c);
                for bi in 0..b {
                    let last = (bi * t + t - 1) * c;
                    buf[bi * c..(bi + 1) * c].copy_from_slice(&a.lnf[last..last + c]);
                }
                &a.head_in
            }
        };
        matmul_forward(
            sized(&mut a.logits, rows * vp),
            head_in,
            &p.wte,
            None,
            MatmulShape::new(rows, vp, c),
        );
    }
}

/// Continuous batching on the CPU: each row runs alone (b = 1) on its slot's
/// rows of the KV cache, through the same ops as [`Backend::forward`], so a
/// slot's logits equal those of a one-row `forward` of the same tokens.
impl SlotBackend for CpuModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn slots(&self) -> usize {
        self.max_batch
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// One chunk after the other, each alone (the oracle of a GPU's
    /// batched prefill).
    fn prefill_chunks(&mut self, chunks: &[SlotChunk<'_>]) -> Result<()> {
        self.slot_rows = 0;
        self.last = None;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        check_slot_chunks(chunks, self.max_batch, self.max_seq_len, v)?;
        self.slot_logits.clear();
        for ch in chunks {
            self.run_rows(ch.tokens, 1, ch.tokens.len(), ch.pos0, LogitsWanted::Last, ch.slot);
            self.slot_logits.extend_from_slice(&self.acts.logits[..vp]);
        }
        self.slot_rows = chunks.len();
        Ok(())
    }

    fn decode(&mut self, rows: &[SlotToken]) -> Result<()> {
        self.slot_rows = 0;
        self.last = None;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        check_slot_rows(rows, self.max_batch, self.max_seq_len, v)?;
        self.slot_logits.clear();
        for r in rows {
            self.run_rows(&[r.token], 1, 1, r.pos, LogitsWanted::Last, r.slot);
            self.slot_logits.extend_from_slice(&self.acts.logits[..vp]);
        }
        self.slot_rows = rows.len();
        Ok(())
    }

    fn choose(&mut self, draws: &[Draw]) -> Result<Vec<u32>> {
        ensure!(
            self.slot_rows > 0 && draws.len() == self.slot_rows,
            "choose(): {} draws for the {} rows of the last prefill or decode step",
            draws.len(),
            self.slot_rows
        );
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        Ok(draws
            .iter()
            .enumerate()
            .map(|(r, d)| sample_row(&self.slot_logits[r * vp..r * vp + v], &d.settings, d.counter, d.stream))
            .collect())
    }

    fn slot_logits(&mut self) -> Result<Vec<f32>> {
        ensure!(
            self.slot_rows > 0,
            "logits() called before a successful prefill or decode"
        );
        Ok(self.slot_logits.clone())
    }
}

/// Index of the largest value (the lowest index among ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in values.iter().enumerate() {
        if x > values[best] {
            best = i;
        }
    }
    best as u32
}
