//! llm.c's checkpoint format (`gpt2_124M.bin`, `gpt2_124M_bf16.bin`).
//!
//! A header of [`HEADER_INTS`] little-endian int32 followed by the 16
//! parameter tensors, each stacked over the layers, in the order of
//! [`TENSOR_NAMES`]. Weights are stored (out, in), so no tensor is transposed.

use super::config::ModelConfig;
use super::format::{FormatError, validate_config};
use super::weights::{DType, Layer, Layout, TensorLayout, Weights};

/// First int32 of an llm.c model file.
pub const MAGIC: i32 = 20240326;
/// First int32 of llm.c's debug-state file (not a model).
pub const STATE_MAGIC: i32 = 20240327;
/// First int32 of llm.c's tokenizer file (not a model).
pub const TOKENIZER_MAGIC: i32 = 20240328;
/// Version of a checkpoint with fp32 parameters.
pub const VERSION_F32: i32 = 3;
/// Version of a checkpoint with bf16 parameters.
pub const VERSION_BF16: i32 = 5;
/// Written for dtypes llm.c cannot store (f16), so the file is rejected.
const UNREPRESENTABLE_VERSION: i32 = 0;
/// The header is this many int32.
pub const HEADER_INTS: usize = 256;
const INT_BYTES: usize = 4;
/// The header's size in bytes.
pub const HEADER_BYTES: usize = HEADER_INTS * INT_BYTES;

/// Positions of the header fields.
pub mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const MAX_SEQ_LEN: usize = 2;
    pub const VOCAB_SIZE: usize = 3;
    pub const NUM_LAYERS: usize = 4;
    pub const NUM_HEADS: usize = 5;
    pub const CHANNELS: usize = 6;
    pub const PADDED_VOCAB_SIZE: usize = 7;
}

/// llm.c's names of the 16 parameter tensors, in file order.
pub const TENSOR_NAMES: [&str; 16] = [
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
    "fcprojb", "lnfw", "lnfb",
];

/// Number of tensors per layer stack (all but wte, wpe, lnfw, lnfb).
const PER_LAYER_TENSORS: usize = 12;

/// Shape of each of the 16 tensors as (count, [rows, cols]): `count` is L for
/// per-layer tensors (stacked), 1 otherwise. Vectors have 1 row. Call it on a
/// config that passed [`validate_config`] (which bounds C, so `4 * C` fits).
pub fn tensor_shapes(cfg: &ModelConfig) -> [(usize, [usize; 2]); 16] {
    let (c, l) = (cfg.channels, cfg.num_layers);
    [
        (1, [cfg.padded_vocab_size, c]),
        (1, [cfg.max_seq_len, c]),
        (l, [1, c]),
        (l, [1, c]),
        (l, [3 * c, c]),
        (l, [1, 3 * c]),
        (l, [c, c]),
        (l, [1, c]),
        (l, [1, c]),
        (l, [1, c]),
        (l, [4 * c, c]),
        (l, [1, 4 * c]),
        (l, [c, 4 * c]),
        (l, [1, c]),
        (1, [1, c]),
        (1, [1, c]),
    ]
}

/// Number of parameters stored in an llm.c file for `cfg` (padded wte),
/// with checked arithmetic.
pub fn num_parameters(cfg: &ModelConfig) -> Result<usize, FormatError> {
    let overflow = || FormatError::Overflow("the number of parameters");
    let mut total = 0usize;
    for (count, [rows, cols]) in tensor_shapes(cfg) {
        let n = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(count))
            .ok_or_else(overflow)?;
        total = total.checked_add(n).ok_or_else(overflow)?;
    }
    Ok(total)
}

/// The first little-endian int32 of `bytes`, if there are four bytes.
pub fn first_int(bytes: &[u8]) -> Option<i32> {
    let b: [u8; INT_BYTES] = bytes.get(..INT_BYTES)?.try_into().ok()?;
    Some(i32::from_le_bytes(b))
}

/// A parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub config: ModelConfig,
    pub dtype: DType,
}

impl Header {
    /// Exact file length this header describes.
    pub fn file_len(&self) -> Result<usize, FormatError> {
        num_parameters(&self.config)?
            .checked_mul(self.dtype.size())
            .and_then(|n| n.checked_add(HEADER_BYTES))
            .ok_or(FormatError::Overflow("the file length"))
    }

    /// The 1024 header bytes for this config and dtype.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut ints = [0i32; HEADER_INTS];
        let cfg = &self.config;
        // Sizes that do not fit an int32 cannot be written; saturate so the
        // header stays invalid rather than wrapping into a valid-looking one.
        let int = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        ints[field::MAGIC] = MAGIC;
        ints[field::VERSION] = match self.dtype {
            DType::F32 => VERSION_F32,
            DType::BF16 => VERSION_BF16,
            // llm.c has no fp16 format: write a version every reader rejects.
            DType::F16 => UNREPRESENTABLE_VERSION,
        };
        ints[field::MAX_SEQ_LEN] = int(cfg.max_seq_len);
        ints[field::VOCAB_SIZE] = int(cfg.vocab_size);
        ints[field::NUM_LAYERS] = int(cfg.num_layers);
        ints[field::NUM_HEADS] = int(cfg.num_heads);
        ints[field::CHANNELS] = int(cfg.channels);
        ints[field::PADDED_VOCAB_SIZE] = int(cfg.padded_vocab_size);
        ints.iter().flat_map(|i| i.to_le_bytes()).collect()
    }
}

/// Parses and validates the header (not the file length).
pub fn parse_header(bytes: &[u8]) -> Result<Header, FormatError> {
    let header = bytes.get(..HEADER_BYTES).ok_or(FormatError::TooShortForHeader {
        len: bytes.len(),
        need: HEADER_BYTES,
    })?;
    let int = |i: usize| {
        let b = &header[i * INT_BYTES..(i + 1) * INT_BYTES];
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    let magic = int(field::MAGIC);
    if magic != MAGIC {
        return Err(FormatError::BadMagic {
            found: magic,
            expected: MAGIC,
        });
    }
    let dtype = match int(field::VERSION) {
        VERSION_F32 => DType::F32,
        VERSION_BF16 => DType::BF16,
        found => {
            return Err(FormatError::UnsupportedVersion {
                found,
                f32_version: VERSION_F32,
                bf16_version: VERSION_BF16,
            });
        }
    };
    let size = |i: usize, name: &'static str| -> Result<usize, FormatError> {
        let v = int(i);
        usize::try_from(v).map_err(|_| FormatError::BadSize {
            field: name,
            value: v.into(),
            reason: "negative".into(),
        })
    };
    let config = ModelConfig {
        max_seq_len: size(field::MAX_SEQ_LEN, "max_seq_len")?,
        vocab_size: size(field::VOCAB_SIZE, "vocab_size")?,
        num_layers: size(field::NUM_LAYERS, "num_layers")?,
        num_heads: size(field::NUM_HEADS, "num_heads")?,
        channels: size(field::CHANNELS, "channels")?,
        padded_vocab_size: size(field::PADDED_VOCAB_SIZE, "padded_vocab_size")?,
    };
    validate_config(&config)?;
    Ok(Header { config, dtype })
}

/// Lays out consecutive tensors of one dtype in a file of `file_len` bytes.
struct Cursor {
    file_len: usize,
    pos: usize,
    dtype: DType,
}

impl Cursor {
    fn take(&mut self, shape: [usize; 2]) -> Result<TensorLayout, FormatError> {
        let overflow = FormatError::Overflow("a tensor's offset");
        let len = shape[0]
            .checked_mul(shape[1])
            .and_then(|n| n.checked_mul(self.dtype.size()))
            .ok_or(FormatError::Overflow("a tensor's size"))?;
        let end = self.pos.checked_add(len).ok_or(overflow)?;
        if end > self.file_len {
            return Err(FormatError::LengthMismatch {
                expected: end as u64,
                actual: self.file_len as u64,
            });
        }
        let range = self.pos..end;
        self.pos = end;
        Ok(TensorLayout {
            shape,
            dtype: self.dtype,
            transposed: false,
            range,
        })
    }
}

/// Parses a whole llm.c checkpoint held in `bytes` into zero-copy views.
/// The length must match the header exactly.
pub fn parse(bytes: &[u8]) -> Result<Weights<'_>, FormatError> {
    Ok(parse_layout(bytes)?.weights(bytes))
}

/// Parses and validates a whole llm.c checkpoint held in `bytes`, as
/// [`parse`], into where its tensors lie (owned: no borrow of `bytes`).
pub fn parse_layout(bytes: &[u8]) -> Result<Layout, FormatError> {
    let header = parse_header(bytes)?;
    let expected = header.file_len()?;
    if bytes.len() != expected {
        return Err(FormatError::LengthMismatch {
            expected: expected as u64,
            actual: bytes.len() as u64,
        });
    }
    let cfg = header.config;
    let mut cur = Cursor {
        file_len: bytes.len(),
        pos: HEADER_BYTES,
        dtype: header.dtype,
    };
    let mut stacks: Vec<Vec<TensorLayout>> = Vec::with_capacity(TENSOR_NAMES.len());
    for (count, shape) in tensor_shapes(&cfg) {
        let stack = (0..count).map(|_| cur.take(shape)).collect::<Result<Vec<_>, _>>()?;
        stacks.push(stack);
    }
    debug_assert_eq!(cur.pos, bytes.len());
    let single = |i: usize| stacks[i][0].clone();
    let layer_stack = |k: usize, l: usize| stacks[2 + k][l].clone();
    debug_assert_eq!(stacks.len(), 2 + PER_LAYER_TENSORS + 2);
    let layers = (0..cfg.num_layers)
        .map(|l| Layer {
            ln1w: layer_stack(0, l),
            ln1b: layer_stack(1, l),
            qkvw: layer_stack(2, l),
            qkvb: layer_stack(3, l),
            attprojw: layer_stack(4, l),
            attprojb: layer_stack(5, l),
            ln2w: layer_stack(6, l),
            ln2b: layer_stack(7, l),
            fcw: layer_stack(8, l),
            fcb: layer_stack(9, l),
            fcprojw: layer_stack(10, l),
            fcprojb: layer_stack(11, l),
        })
        .collect();
    Ok(Layout {
        config: cfg,
        wte: single(0),
        wpe: single(1),
        layers,
        lnfw: single(2 + PER_LAYER_TENSORS),
        lnfb: single(2 + PER_LAYER_TENSORS + 1),
    })
}
