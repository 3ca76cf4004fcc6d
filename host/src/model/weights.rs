//! Typed, zero-copy views of the parameters inside a memory-mapped checkpoint.
//!
//! A [`Tensor`] borrows the raw little-endian bytes of the map; it knows its
//! dtype and whether it is stored transposed. Consumers normalise: the CPU
//! reference converts to f32 (out, in) on the host, the GPU engine uploads the
//! bytes as they are and converts/transposes on the device, so the GPU path
//! never copies the mapped weights on the host.

use std::borrow::Cow;

use super::ModelConfig;

/// Element type of a stored tensor (defined beside the GPU ops that convert
/// it on the device).
pub use gpu_host::DType;

/// A view of one parameter tensor in the checkpoint's bytes.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    /// Logical shape in llm.c's convention: linear weights are (out, in).
    pub shape: [usize; 2],
    pub dtype: DType,
    /// True when the bytes hold the transpose of `shape` (Hugging Face
    /// Conv1D stores linear weights (in, out)).
    pub transposed: bool,
    /// Raw little-endian bytes, `shape[0] * shape[1] * dtype.size()` long.
    pub bytes: &'a [u8],
}

impl<'a> Tensor<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 in logical (not stored) layout. Borrows the mapped
    /// bytes when they already are aligned, untransposed f32; copies otherwise.
    pub fn to_f32(&self) -> Cow<'a, [f32]> {
        let raw: Cow<'a, [f32]> = match self.dtype {
            DType::F32 => match bytemuck::try_cast_slice::<u8, f32>(self.bytes) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(
                    self.bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
            },
            DType::BF16 => Cow::Owned(
                self.bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
            DType::F16 => Cow::Owned(
                self.bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
        };
        if !self.transposed {
            return raw;
        }
        // Stored (in, out) = (shape[1], shape[0]); produce (out, in).
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let mut out = vec![0f32; rows * cols];
        for i in 0..cols {
            for o in 0..rows {
                out[o * cols + i] = raw[i * rows + o];
            }
        }
        Cow::Owned(out)
    }
}

/// One transformer block's parameters, llm.c's names and order.
#[derive(Clone, Copy, Debug)]
pub struct LayerWeights<'a> {
    pub ln1w: Tensor<'a>,     // (1, C)
    pub ln1b: Tensor<'a>,     // (1, C)
    pub qkvw: Tensor<'a>,     // (3C, C)
    pub qkvb: Tensor<'a>,     // (1, 3C)
    pub attprojw: Tensor<'a>, // (C, C)
    pub attprojb: Tensor<'a>, // (1, C)
    pub ln2w: Tensor<'a>,     // (1, C)
    pub ln2b: Tensor<'a>,     // (1, C)
    pub fcw: Tensor<'a>,      // (4C, C)
    pub fcb: Tensor<'a>,      // (1, 4C)
    pub fcprojw: Tensor<'a>,  // (C, 4C)
    pub fcprojb: Tensor<'a>,  // (1, C)
}

/// All parameters of a GPT-2 model.
#[derive(Clone, Debug)]
pub struct Weights<'a> {
    pub config: ModelConfig,
    /// Token embeddings, (Vp, C); also the LM head (tied). Rows past
    /// `vocab_size` may be absent in the file: then `wte.shape[0] == vocab_size`
    /// and consumers pad with zeros up to `padded_vocab_size`.
    pub wte: Tensor<'a>,
    /// Position embeddings, (maxT, C).
    pub wpe: Tensor<'a>,
    pub layers: Vec<LayerWeights<'a>>,
    pub lnfw: Tensor<'a>, // (1, C)
    pub lnfb: Tensor<'a>, // (1, C)
}
