//! Typed, zero-copy views of the parameters inside a memory-mapped checkpoint.
//!
//! A [`Tensor`] borrows the raw little-endian bytes of the map; it knows its
//! dtype and whether it is stored transposed. Consumers normalise: the CPU
//! reference converts to f32 (out, in) on the host, the GPU engine uploads the
//! bytes as they are and converts/transposes on the device, so the GPU path
//! never copies the mapped weights on the host.

use std::borrow::Cow;
use std::convert::Infallible;
use std::ops::Range;

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

/// One transformer block's parameters, llm.c's names and order: `V` for
/// the vectors (layernorm weights, biases), `M` for the four matrices,
/// stored (out, in). One type for every copy of them: the checkpoint's
/// views ([`LayerWeights`]), the CPU reference's f32 vectors and the GPU
/// engine's buffers, converted field by field with [`Layer::try_map`].
#[derive(Clone, Copy, Debug)]
pub struct Layer<V, M = V> {
    pub ln1w: V,     // (1, C)
    pub ln1b: V,     // (1, C)
    pub qkvw: M,     // (3C, C)
    pub qkvb: V,     // (1, 3C)
    pub attprojw: M, // (C, C)
    pub attprojb: V, // (1, C)
    pub ln2w: V,     // (1, C)
    pub ln2b: V,     // (1, C)
    pub fcw: M,      // (4C, C)
    pub fcb: V,      // (1, 4C)
    pub fcprojw: M,  // (C, 4C)
    pub fcprojb: V,  // (1, C)
}

impl<V, M> Layer<V, M> {
    /// Each field through `vec` (vectors) or `mat` (matrices), which also
    /// get the field's name (for error messages); the first error stops.
    pub fn try_map<V2, M2, E>(
        self,
        mut vec: impl FnMut(&'static str, V) -> Result<V2, E>,
        mut mat: impl FnMut(&'static str, M) -> Result<M2, E>,
    ) -> Result<Layer<V2, M2>, E> {
        Ok(Layer {
            ln1w: vec("ln1w", self.ln1w)?,
            ln1b: vec("ln1b", self.ln1b)?,
            qkvw: mat("qkvw", self.qkvw)?,
            qkvb: vec("qkvb", self.qkvb)?,
            attprojw: mat("attprojw", self.attprojw)?,
            attprojb: vec("attprojb", self.attprojb)?,
            ln2w: vec("ln2w", self.ln2w)?,
            ln2b: vec("ln2b", self.ln2b)?,
            fcw: mat("fcw", self.fcw)?,
            fcb: vec("fcb", self.fcb)?,
            fcprojw: mat("fcprojw", self.fcprojw)?,
            fcprojb: vec("fcprojb", self.fcprojb)?,
        })
    }

    /// The same fields, borrowed.
    pub fn as_ref(&self) -> Layer<&V, &M> {
        Layer {
            ln1w: &self.ln1w,
            ln1b: &self.ln1b,
            qkvw: &self.qkvw,
            qkvb: &self.qkvb,
            attprojw: &self.attprojw,
            attprojb: &self.attprojb,
            ln2w: &self.ln2w,
            ln2b: &self.ln2b,
            fcw: &self.fcw,
            fcb: &self.fcb,
            fcprojw: &self.fcprojw,
            fcprojb: &self.fcprojb,
        }
    }

    /// Field by field, this block's values beside `other`'s.
    pub fn zip<A, B>(self, other: Layer<A, B>) -> Layer<(V, A), (M, B)> {
        Layer {
            ln1w: (self.ln1w, other.ln1w),
            ln1b: (self.ln1b, other.ln1b),
            qkvw: (self.qkvw, other.qkvw),
            qkvb: (self.qkvb, other.qkvb),
            attprojw: (self.attprojw, other.attprojw),
            attprojb: (self.attprojb, other.attprojb),
            ln2w: (self.ln2w, other.ln2w),
            ln2b: (self.ln2b, other.ln2b),
            fcw: (self.fcw, other.fcw),
            fcb: (self.fcb, other.fcb),
            fcprojw: (self.fcprojw, other.fcprojw),
            fcprojb: (self.fcprojb, other.fcprojb),
        }
    }

    /// Each field through `vec` (vectors) or `mat` (matrices), which also
    /// get the field's name: [`Layer::try_map`] for conversions that cannot fail.
    pub fn map<V2, M2>(
        self,
        mut vec: impl FnMut(&'static str, V) -> V2,
        mut mat: impl FnMut(&'static str, M) -> M2,
    ) -> Layer<V2, M2> {
        let mapped = self.try_map::<_, _, Infallible>(|name, v| Ok(vec(name, v)), |name, m| Ok(mat(name, m)));
        match mapped {
            Ok(layer) => layer,
            Err(never) => match never {},
        }
    }

    /// The four matrices: qkv, attention projection, fc, fc projection.
    pub fn matrices_mut(&mut self) -> [&mut M; 4] {
        [&mut self.qkvw, &mut self.attprojw, &mut self.fcw, &mut self.fcprojw]
    }
}

impl Layer<usize> {
    /// How many values each parameter of a block of width `c` holds.
    pub fn sizes(c: usize) -> Layer<usize> {
        Layer {
            ln1w: c,
            ln1b: c,
            qkvw: 3 * c * c,
            qkvb: 3 * c,
            attprojw: c * c,
            attprojb: c,
            ln2w: c,
            ln2b: c,
            fcw: 4 * c * c,
            fcb: 4 * c,
            fcprojw: 4 * c * c,
            fcprojb: c,
        }
    }
}

/// One block's parameters as views into the checkpoint.
pub type LayerWeights<'a> = Layer<Tensor<'a>>;

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

/// Where one parameter tensor lies in a checkpoint: a [`Tensor`] with the
/// byte range of its data in place of the borrowed bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// As [`Tensor::shape`].
    pub shape: [usize; 2],
    pub dtype: DType,
    /// As [`Tensor::transposed`].
    pub transposed: bool,
    /// The data's bytes within the checkpoint.
    pub range: Range<usize>,
}

impl TensorLayout {
    /// The view of this tensor in `bytes`, the checkpoint it was found in.
    ///
    /// # Panics
    /// If the range lies past the end of `bytes` (another, shorter buffer).
    pub fn view<'a>(&self, bytes: &'a [u8]) -> Tensor<'a> {
        Tensor {
            shape: self.shape,
            dtype: self.dtype,
            transposed: self.transposed,
            bytes: &bytes[self.range.clone()],
        }
    }
}

/// Every parameter's place in a checkpoint, owned: what parsing and
/// validating the file found, kept so that views of it ([`Weights`]) are
/// handed out without parsing it again.
#[derive(Clone, Debug)]
pub struct Layout {
    pub config: ModelConfig,
    pub wte: TensorLayout,
    pub wpe: TensorLayout,
    pub layers: Vec<Layer<TensorLayout>>,
    pub lnfw: TensorLayout,
    pub lnfb: TensorLayout,
}

impl Layout {
    /// The dtype shared by all tensors (the parsers reject mixed ones).
    pub fn dtype(&self) -> DType {
        self.wte.dtype
    }

    /// Zero-copy views of every parameter in `bytes`, the checkpoint this
    /// layout was parsed from.
    ///
    /// # Panics
    /// If a tensor's range lies past the end of `bytes` (another, shorter buffer).
    pub fn weights<'a>(&self, bytes: &'a [u8]) -> Weights<'a> {
        let view = |_: &'static str, t: &TensorLayout| t.view(bytes);
        Weights {
            config: self.config,
            wte: self.wte.view(bytes),
            wpe: self.wpe.view(bytes),
            layers: self.layers.iter().map(|l| l.as_ref().map(view, view)).collect(),
            lnfw: self.lnfw.view(bytes),
            lnfb: self.lnfb.view(bytes),
        }
    }
}
