//! Hugging Face safetensors checkpoints of GPT-2 (`model.safetensors` of
//! openai-community/gpt2 and its larger siblings).
//!
//! Names may carry the `transformer.` prefix or not. Linear weights are
//! Conv1D, stored (in, out): their views are marked `transposed`. The file
//! has no head count: it comes from the caller (a `config.json`) or from the
//! table of standard GPT-2 sizes. `wte` has only `vocab_size` rows; consumers
//! pad it to `padded_vocab_size` (see [`Weights::wte`]).

use std::collections::BTreeMap;
use std::ops::Range;

use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensors};

use super::config::ModelConfig;
use super::format::{FormatError, MAX_VOCAB_LIMIT, validate_config};
use super::weights::{DType, Layer, Layout, TensorLayout, Weights};

/// Optional prefix of every parameter name (GPT2LMHeadModel's submodule).
pub const PREFIX: &str = "transformer.";
/// Tied LM head; must match wte's shape and is otherwise ignored.
pub const LM_HEAD: &str = "lm_head.weight";
/// Per-layer buffers (causal mask) that are not parameters.
pub const IGNORED_LAYER_BUFFERS: [&str; 2] = ["attn.bias", "attn.masked_bias"];

/// Head counts of the published GPT-2 sizes, by width C.
pub const STANDARD_HEAD_COUNTS: [(usize, usize); 4] = [(768, 12), (1024, 16), (1280, 20), (1600, 25)];

/// Per-layer parameter names (after `h.{i}.`), in [`Layer`] order.
pub const LAYER_TENSORS: [&str; 12] = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
];

/// Stored (Hugging Face) shape of each entry of [`LAYER_TENSORS`].
pub fn layer_tensor_shapes(c: usize) -> [Vec<usize>; 12] {
    [
        vec![c],
        vec![c],
        vec![c, 3 * c],
        vec![3 * c],
        vec![c, c],
        vec![c],
        vec![c],
        vec![c],
        vec![c, 4 * c],
        vec![4 * c],
        vec![4 * c, c],
        vec![c],
    ]
}

/// Head count for a standard GPT-2 width, if it is one.
pub fn standard_num_heads(channels: usize) -> Option<usize> {
    STANDARD_HEAD_COUNTS
        .iter()
        .find(|(c, _)| *c == channels)
        .map(|(_, nh)| *nh)
}

fn dtype_of(name: &str, d: Dtype) -> Result<DType, FormatError> {
    match d {
        Dtype::F32 => Ok(DType::F32),
        Dtype::BF16 => Ok(DType::BF16),
        Dtype::F16 => Ok(DType::F16),
        other => Err(FormatError::UnsupportedDtype {
            name: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}

/// Size of the little-endian u64 header length that opens a safetensors file.
const LEN_BYTES: usize = 8;

/// Rejects tensor offsets past the end of the buffer before the safetensors
/// crate sees them: its length check adds them unchecked, which a hostile
/// header can overflow.
fn check_offsets(bytes: &[u8]) -> Result<(), FormatError> {
    // Anything malformed here is left for the crate to report precisely.
    let Some(n) = bytes.get(..LEN_BYTES).and_then(|b| <[u8; LEN_BYTES]>::try_from(b).ok()) else {
        return Ok(());
    };
    let Some(end) = usize::try_from(u64::from_le_bytes(n))
        .ok()
        .and_then(|n| n.checked_add(LEN_BYTES))
    else {
        return Ok(());
    };
    let Some(header) = bytes.get(LEN_BYTES..end) else {
        return Ok(());
    };
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(header) else {
        return Ok(());
    };
    let data_len = (bytes.len() - end) as u64;
    for (name, info) in &map {
        let Some(offsets) = info.get("data_offsets").and_then(|o| o.as_array()) else {
            continue;
        };
        for o in offsets {
            if o.as_u64().is_some_and(|o| o > data_len) {
                return Err(FormatError::Safetensors(safetensors::SafeTensorError::InvalidOffset(
                    name.clone(),
                )));
            }
        }
    }
    Ok(())
}

/// Splits `h.{i}.{rest}` into (i, rest); `i` must be written canonically.
fn layer_name(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("h.")?;
    let (index, rest) = rest.split_once('.')?;
    let i: usize = index.parse().ok()?;
    (i.to_string() == index).then_some((i, rest))
}

/// Parses a whole safetensors GPT-2 checkpoint held in `bytes`.
/// `num_heads` overrides the standard-size table (from a `config.json`).
pub fn parse(bytes: &[u8], num_heads: Option<usize>) -> Result<Weights<'_>, FormatError> {
    Ok(parse_layout(bytes, num_heads)?.weights(bytes))
}

/// Parses and validates a whole safetensors GPT-2 checkpoint held in
/// `bytes`, as [`parse`], into where its tensors lie (owned: no borrow of
/// `bytes`).
pub fn parse_layout(bytes: &[u8], num_heads: Option<usize>) -> Result<Layout, FormatError> {
    check_offsets(bytes)?;
    // What `SafeTensors::deserialize` checks (header, offsets, length), with
    // the offsets kept rather than turned into borrowed views.
    let (header_len, metadata) = SafeTensors::read_metadata(bytes).map_err(FormatError::Safetensors)?;
    let data_start = LEN_BYTES + header_len;
    let range_of = |info: &TensorInfo| -> Range<usize> {
        let (begin, end) = info.data_offsets;
        data_start + begin..data_start + end
    };

    // Canonical name (prefix stripped) -> tensor; the file's own name kept for errors.
    let mut params: BTreeMap<String, (String, &TensorInfo)> = BTreeMap::new();
    let mut layer_indices: BTreeMap<usize, ()> = BTreeMap::new();
    let mut lm_head: Option<(String, &TensorInfo)> = None;
    // In file order (by offset), so the first bad name is the same every run.
    let names = metadata.offset_keys();
    for name in &names {
        let Some(view) = metadata.info(name) else { continue };
        let name = name.as_str();
        if name == LM_HEAD {
            lm_head = Some((name.to_string(), view));
            continue;
        }
        let key = name.strip_prefix(PREFIX).unwrap_or(name);
        let known = match key {
            "wte.weight" | "wpe.weight" | "ln_f.weight" | "ln_f.bias" => true,
            _ => match layer_name(key) {
                Some((_, rest)) if IGNORED_LAYER_BUFFERS.contains(&rest) => continue,
                Some((i, rest)) if LAYER_TENSORS.contains(&rest) => {
                    layer_indices.insert(i, ());
                    true
                }
                _ => false,
            },
        };
        if !known {
            return Err(FormatError::UnexpectedTensor(name.to_string()));
        }
        if params.insert(key.to_string(), (name.to_string(), view)).is_some() {
            return Err(FormatError::UnexpectedTensor(format!("{name} (duplicate of {key})")));
        }
    }

    let get = |key: &str| -> Result<&(String, &TensorInfo), FormatError> {
        params
            .get(key)
            .ok_or_else(|| FormatError::MissingTensor(key.to_string()))
    };
    let (wte_name, wte) = get("wte.weight")?;
    let dtype = dtype_of(wte_name, wte.dtype)?;
    for (name, view) in params.values() {
        let found = dtype_of(name, view.dtype)?;
        if found != dtype {
            return Err(FormatError::MixedDtypes {
                name: name.clone(),
                found,
                first: wte_name.clone(),
                expected: dtype,
            });
        }
    }

    let two_d = |name: &str, view: &TensorInfo| -> Result<[usize; 2], FormatError> {
        match view.shape[..] {
            [rows, cols] => Ok([rows, cols]),
            ref s => Err(FormatError::TensorRank {
                name: name.to_string(),
                expected: 2,
                actual: s.len(),
            }),
        }
    };
    let [vocab_size, channels] = two_d(wte_name, wte)?;
    let (wpe_name, wpe) = get("wpe.weight")?;
    let [max_seq_len, wpe_channels] = two_d(wpe_name, wpe)?;
    if wpe_channels != channels {
        return Err(FormatError::TensorShape {
            name: wpe_name.clone(),
            expected: vec![max_seq_len, channels],
            actual: wpe.shape.clone(),
        });
    }

    // Layers must be exactly 0..L.
    let num_layers = layer_indices.len();
    if let Some((&last, _)) = layer_indices.last_key_value()
        && last + 1 != num_layers
    {
        let missing = (0..=last).find(|i| !layer_indices.contains_key(i)).unwrap_or(last);
        return Err(FormatError::LayerIndices(format!(
            "layer h.{missing} is missing but h.{last} exists"
        )));
    }

    let num_heads = match num_heads.or_else(|| standard_num_heads(channels)) {
        Some(nh) => nh,
        None => return Err(FormatError::UnknownHeadCount { channels }),
    };
    let padded_vocab_size = if vocab_size <= MAX_VOCAB_LIMIT {
        ModelConfig::pad_vocab(vocab_size)
    } else {
        vocab_size
    };
    let config = ModelConfig {
        max_seq_len,
        vocab_size,
        padded_vocab_size,
        num_layers,
        num_heads,
        channels,
    };
    validate_config(&config)?;

    if let Some((name, view)) = &lm_head
        && view.shape != wte.shape
    {
        return Err(FormatError::TensorShape {
            name: name.clone(),
            expected: wte.shape.clone(),
            actual: view.shape.clone(),
        });
    }

    let c = channels;
    // Checks the stored shape and builds the logical (out, in) view.
    let view_of = |key: &str, stored: &[usize]| -> Result<TensorLayout, FormatError> {
        let (name, view) = get(key)?;
        if view.shape != stored {
            return Err(FormatError::TensorShape {
                name: name.clone(),
                expected: stored.to_vec(),
                actual: view.shape.clone(),
            });
        }
        let (shape, transposed) = match *stored {
            [n] => ([1, n], false),
            // Conv1D (in, out) -> logical (out, in).
            [rows, cols] => ([cols, rows], true),
            _ => {
                return Err(FormatError::TensorRank {
                    name: name.clone(),
                    expected: 2,
                    actual: stored.len(),
                });
            }
        };
        Ok(TensorLayout {
            shape,
            dtype,
            transposed,
            range: range_of(view),
        })
    };
    let shapes = layer_tensor_shapes(c);
    let mut layers = Vec::with_capacity(num_layers);
    for l in 0..num_layers {
        let t = |k: usize| view_of(&format!("h.{l}.{}", LAYER_TENSORS[k]), &shapes[k]);
        layers.push(Layer {
            ln1w: t(0)?,
            ln1b: t(1)?,
            qkvw: t(2)?,
            qkvb: t(3)?,
            attprojw: t(4)?,
            attprojb: t(5)?,
            ln2w: t(6)?,
            ln2b: t(7)?,
            fcw: t(8)?,
            fcb: t(9)?,
            fcprojw: t(10)?,
            fcprojb: t(11)?,
        });
    }
    let plain = |shape: [usize; 2], view: &TensorInfo| TensorLayout {
        shape,
        dtype,
        transposed: false,
        range: range_of(view),
    };
    Ok(Layout {
        config,
        wte: plain([vocab_size, channels], wte),
        wpe: plain([max_seq_len, channels], wpe),
        layers,
        lnfw: view_of("ln_f.weight", &[c])?,
        lnfb: view_of("ln_f.bias", &[c])?,
    })
}
