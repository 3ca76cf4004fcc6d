//! Seeded random GPT-2 checkpoints of any [`ModelConfig`], in both formats,
//! for tests and benchmarks (no real GPT-2 weights exist on our machines).
//!
//! The same seed gives the same parameter values in the llm.c and the
//! safetensors file, so the two loaders (and everything downstream) can be
//! compared. Values have GPT-2-like scales (weights ~N(0, 0.02²), layernorm
//! weights near 1, small non-zero biases) so forward passes are numerically
//! meaningful. The padded rows of llm.c's `wte` are zero, as llm.c writes
//! them; the safetensors `wte` has only `vocab_size` rows.

use std::path::Path;

use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::{Dtype, tensor::TensorView};

use super::config::ModelConfig;
use super::llmc::{self, Header};
use super::safetensors::{LAYER_TENSORS, PREFIX, layer_tensor_shapes};
use super::weights::DType;

/// Std of the token embeddings and of most linear weights (GPT-2's init).
pub const WEIGHT_STD: f32 = 0.02;
/// Std of the position embeddings (GPT-2's init).
pub const WPE_STD: f32 = 0.01;
/// Std of biases: small but non-zero, so bias handling is exercised.
pub const BIAS_STD: f32 = 0.02;
/// Layernorm weights are 1 + N(0, LN_WEIGHT_STD²).
pub const LN_WEIGHT_STD: f32 = 0.1;
/// Std of layernorm biases.
pub const LN_BIAS_STD: f32 = 0.02;

/// A small model for quick tests: L=2, NH=4, C=64, V=300 (padded to 384), maxT=128.
pub fn tiny_config() -> ModelConfig {
    let vocab_size = 300;
    ModelConfig {
        max_seq_len: 128,
        vocab_size,
        padded_vocab_size: ModelConfig::pad_vocab(vocab_size),
        num_layers: 2,
        num_heads: 4,
        channels: 64,
    }
}

/// A small model with awkward sizes (odd head count, head size 32, vocab not
/// a multiple of anything): L=3, NH=3, C=96, V=517 (padded to 640), maxT=80.
pub fn odd_config() -> ModelConfig {
    let vocab_size = 517;
    ModelConfig {
        max_seq_len: 80,
        vocab_size,
        padded_vocab_size: ModelConfig::pad_vocab(vocab_size),
        num_layers: 3,
        num_heads: 3,
        channels: 96,
    }
}

/// The 16 parameter tensors in llm.c order and layout ((out, in), stacked
/// over layers), as f32. `wte` has `padded_vocab_size` rows, zero past
/// `vocab_size`.
#[derive(Clone, Debug)]
pub struct RandomParams {
    pub config: ModelConfig,
    /// Indexed like [`llmc::TENSOR_NAMES`].
    pub tensors: Vec<Vec<f32>>,
}

/// One standard normal sample (Box-Muller; rand 0.9 has no normal distribution
/// without rand_distr).
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln stays finite
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// Generates the parameters of `config` from `seed`.
pub fn random_params(config: &ModelConfig, seed: u64) -> anyhow::Result<RandomParams> {
    super::format::validate_config(config).context("fixture config")?;
    let mut rng = StdRng::seed_from_u64(seed);
    // GPT-2 scales residual projections by 1/sqrt(2L).
    let proj_std = WEIGHT_STD / ((2 * config.num_layers) as f32).sqrt();
    let mut tensors = Vec::with_capacity(llmc::TENSOR_NAMES.len());
    for (name, (count, [rows, cols])) in llmc::TENSOR_NAMES.iter().zip(llmc::tensor_shapes(config)) {
        let n = count * rows * cols;
        let (mean, std) = match *name {
            "wte" => (0.0, WEIGHT_STD),
            "wpe" => (0.0, WPE_STD),
            "ln1w" | "ln2w" | "lnfw" => (1.0, LN_WEIGHT_STD),
            "ln1b" | "ln2b" | "lnfb" => (0.0, LN_BIAS_STD),
            "attprojw" | "fcprojw" => (0.0, proj_std),
            "qkvw" | "fcw" => (0.0, WEIGHT_STD),
            _ => (0.0, BIAS_STD),
        };
        // Only real vocabulary rows are random; padding stays zero and draws
        // nothing, so values do not depend on the padding.
        let random_len = if *name == "wte" { config.vocab_size * cols } else { n };
        let mut t: Vec<f32> = (0..random_len).map(|_| mean + std * normal(&mut rng)).collect();
        t.resize(n, 0.0);
        tensors.push(t);
    }
    Ok(RandomParams {
        config: *config,
        tensors,
    })
}

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest).
pub fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

/// The bytes of an llm.c checkpoint (`dtype` F32 or BF16).
pub fn llmc_bytes(config: &ModelConfig, seed: u64, dtype: DType) -> anyhow::Result<Vec<u8>> {
    if dtype == DType::F16 {
        bail!("llm.c checkpoints are F32 or BF16, not F16");
    }
    let params = random_params(config, seed)?;
    let header = Header { config: *config, dtype };
    let mut out = header.to_bytes();
    out.reserve(header.file_len()?.saturating_sub(out.len()));
    for t in &params.tensors {
        out.extend(encode(t, dtype));
    }
    Ok(out)
}

/// Writes a random llm.c checkpoint (`dtype` F32 or BF16).
pub fn write_llmc(path: &Path, config: &ModelConfig, seed: u64, dtype: DType) -> anyhow::Result<()> {
    let bytes = llmc_bytes(config, seed, dtype)?;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// One tensor of a safetensors file under construction.
#[derive(Clone, Debug)]
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    pub data: Vec<u8>,
}

impl HfTensor {
    /// A tensor of `values` (stored shape `shape`) encoded as `dtype`.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, values: &[f32], dtype: DType) -> HfTensor {
        let st_dtype = match dtype {
            DType::F32 => Dtype::F32,
            DType::BF16 => Dtype::BF16,
            DType::F16 => Dtype::F16,
        };
        HfTensor {
            name: name.into(),
            shape,
            dtype: st_dtype,
            data: encode(values, dtype),
        }
    }
}

/// Transposes a row-major (rows, cols) matrix.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = m[r * cols + c];
        }
    }
    out
}

/// The parameter tensors of a Hugging Face GPT-2 checkpoint holding the same
/// values as [`llmc_bytes`] for `seed`: Conv1D weights stored (in, out),
/// vectors 1-D, `wte` unpadded, names with `transformer.` when `prefix`.
pub fn hf_tensors(config: &ModelConfig, seed: u64, prefix: bool, dtype: DType) -> anyhow::Result<Vec<HfTensor>> {
    let p = random_params(config, seed)?;
    let (c, l) = (config.channels, config.num_layers);
    let pre = if prefix { PREFIX } else { "" };
    let mut out = vec![
        HfTensor::new(
            format!("{pre}wte.weight"),
            vec![config.vocab_size, c],
            &p.tensors[0][..config.vocab_size * c],
            dtype,
        ),
        HfTensor::new(
            format!("{pre}wpe.weight"),
            vec![config.max_seq_len, c],
            &p.tensors[1],
            dtype,
        ),
        HfTensor::new(format!("{pre}ln_f.weight"), vec![c], &p.tensors[14], dtype),
        HfTensor::new(format!("{pre}ln_f.bias"), vec![c], &p.tensors[15], dtype),
    ];
    let stored_shapes = layer_tensor_shapes(c);
    // llm.c index of each LAYER_TENSORS entry is 2 + k.
    for (k, (hf_name, (_, [rows, cols]))) in LAYER_TENSORS
        .iter()
        .zip(&llmc::tensor_shapes(config)[2..14])
        .enumerate()
    {
        let stack = &p.tensors[2 + k];
        let per = rows * cols;
        for layer in 0..l {
            let values = &stack[layer * per..(layer + 1) * per];
            let name = format!("{pre}h.{layer}.{hf_name}");
            out.push(if stored_shapes[k].len() == 1 {
                HfTensor::new(name, vec![*cols], values, dtype)
            } else {
                // llm.c (out, in) -> Conv1D (in, out).
                HfTensor::new(name, vec![*cols, *rows], &transpose(values, *rows, *cols), dtype)
            });
        }
    }
    Ok(out)
}

/// Serialises tensors into safetensors bytes.
pub fn serialize_safetensors(tensors: &[HfTensor]) -> anyhow::Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|t| Ok((t.name.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.data)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(safetensors::serialize(views, None)?)
}

/// The bytes of a random Hugging Face safetensors checkpoint.
pub fn safetensors_bytes(config: &ModelConfig, seed: u64, prefix: bool, dtype: DType) -> anyhow::Result<Vec<u8>> {
    serialize_safetensors(&hf_tensors(config, seed, prefix, dtype)?)
}

/// Writes a random F32 safetensors checkpoint (same values as [`write_llmc`]
/// with the same seed).
pub fn write_safetensors(path: &Path, config: &ModelConfig, seed: u64, prefix: bool) -> anyhow::Result<()> {
    write_safetensors_dtype(path, config, seed, prefix, DType::F32)
}

/// Like [`write_safetensors`] with a chosen dtype (F32, BF16 or F16).
pub fn write_safetensors_dtype(
    path: &Path,
    config: &ModelConfig,
    seed: u64,
    prefix: bool,
    dtype: DType,
) -> anyhow::Result<()> {
    let bytes = safetensors_bytes(config, seed, prefix, dtype)?;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Writes a Hugging Face `config.json` (the fields GPT2Config uses for sizes)
/// into `dir`, so a safetensors file there gets its head count.
pub fn write_hf_config(dir: &Path, config: &ModelConfig) -> anyhow::Result<()> {
    let json = serde_json::json!({
        "model_type": "gpt2",
        "n_embd": config.channels,
        "n_head": config.num_heads,
        "n_layer": config.num_layers,
        "n_positions": config.max_seq_len,
        "vocab_size": config.vocab_size,
    });
    let path = dir.join(super::checkpoint::HF_CONFIG_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&json)?).with_context(|| format!("writing {}", path.display()))
}
