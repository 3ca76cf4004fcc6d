//! What both checkpoint formats share: the errors of their parsers, the
//! limits a header's sizes must respect, and the check of a model's shape.
//! `llmc` and `safetensors` depend on this module, `checkpoint` on all three.

use safetensors::SafeTensorError;

use super::config::ModelConfig;
use super::weights::DType;

/// What is wrong with a checkpoint's bytes (the file name is added by
/// [`CheckpointError`](super::checkpoint::CheckpointError)).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("the file is empty")]
    Empty,
    #[error("file is {len} bytes, too short for an llm.c header ({need} bytes)")]
    TooShortForHeader { len: usize, need: usize },
    #[error("bad magic number {found} (llm.c model files start with {expected})")]
    BadMagic { found: i32, expected: i32 },
    #[error("this is an llm.c {what} file, not a model checkpoint")]
    WrongLlmcFile { what: &'static str },
    #[error("unsupported llm.c version {found} (supported: {f32_version} = fp32, {bf16_version} = bf16)")]
    UnsupportedVersion {
        found: i32,
        f32_version: i32,
        bf16_version: i32,
    },
    #[error("{field} = {value} is invalid: {reason}")]
    BadSize {
        field: &'static str,
        value: i64,
        reason: String,
    },
    #[error("sizes are too large (overflow computing {0})")]
    Overflow(&'static str),
    #[error("file is {actual} bytes but its header describes {expected} bytes ({})", if actual < expected { "truncated" } else { "trailing bytes" })]
    LengthMismatch { expected: u64, actual: u64 },
    #[error("not a valid safetensors file: {0}")]
    Safetensors(#[source] SafeTensorError),
    #[error("neither an llm.c checkpoint (magic {0}) nor a safetensors file: {1}")]
    UnrecognizedFormat(i32, #[source] SafeTensorError),
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("unexpected tensor {0}")]
    UnexpectedTensor(String),
    #[error("tensor {name} has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor {name} has unsupported dtype {dtype} (supported: F32, BF16, F16)")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("tensor {name} is {found:?} but {first} is {expected:?}: all tensors must share one dtype")]
    MixedDtypes {
        name: String,
        found: DType,
        first: String,
        expected: DType,
    },
    #[error("tensor {name} has {actual} dimensions, expected {expected}")]
    TensorRank {
        name: String,
        expected: usize,
        actual: usize,
    },
    #[error("transformer layers must be numbered 0..L without gaps: {0}")]
    LayerIndices(String),
    #[error(
        "number of attention heads unknown for width C = {channels}: put a config.json with n_head next to the checkpoint"
    )]
    UnknownHeadCount { channels: usize },
    #[error("config.json: {0}")]
    ConfigJson(String),
}

/// Upper bounds that no real GPT-2 comes near; they reject absurd headers
/// before any size arithmetic (which is checked anyway).
pub const MAX_SEQ_LEN_LIMIT: usize = 1 << 20;
pub const MAX_VOCAB_LIMIT: usize = 1 << 24;
pub const MAX_LAYERS_LIMIT: usize = 1 << 12;
pub const MAX_HEADS_LIMIT: usize = 1 << 12;
pub const MAX_CHANNELS_LIMIT: usize = 1 << 16;

/// A header field outside its limits.
pub(super) fn bad(field: &'static str, value: usize, reason: impl Into<String>) -> FormatError {
    FormatError::BadSize {
        field,
        value: value as i64,
        reason: reason.into(),
    }
}

/// Checks that a config is usable: sizes positive and within the limits,
/// C divisible by NH, padded vocab >= vocab. Shared by both loaders.
pub fn validate_config(cfg: &ModelConfig) -> Result<(), FormatError> {
    let limits = [
        ("max_seq_len", cfg.max_seq_len, MAX_SEQ_LEN_LIMIT),
        ("vocab_size", cfg.vocab_size, MAX_VOCAB_LIMIT),
        ("padded_vocab_size", cfg.padded_vocab_size, MAX_VOCAB_LIMIT),
        ("num_layers", cfg.num_layers, MAX_LAYERS_LIMIT),
        ("num_heads", cfg.num_heads, MAX_HEADS_LIMIT),
        ("channels", cfg.channels, MAX_CHANNELS_LIMIT),
    ];
    for (name, value, limit) in limits {
        if value == 0 {
            return Err(bad(name, value, "must be positive"));
        }
        if value > limit {
            return Err(bad(name, value, format!("exceeds the limit {limit}")));
        }
    }
    if !cfg.channels.is_multiple_of(cfg.num_heads) {
        return Err(bad(
            "channels",
            cfg.channels,
            format!("not divisible by num_heads = {}", cfg.num_heads),
        ));
    }
    if cfg.padded_vocab_size < cfg.vocab_size {
        return Err(bad(
            "padded_vocab_size",
            cfg.padded_vocab_size,
            format!("smaller than vocab_size = {}", cfg.vocab_size),
        ));
    }
    Ok(())
}
