//! The GPU engine: GPT-2 forward with a KV cache, every kernel in Rust.
//!
//! Weights are uploaded once, straight from the checkpoint's mapped bytes
//! (converted or transposed on the device when needed). Activations and the
//! KV cache are allocated once for `(max_batch, max_seq_len)`; a forward call
//! allocates nothing on the device and synchronises with the host only when
//! results are read back (`logits`, `argmax`).
//!
//! Attention runs on the flash kernels by default ([`AttentionKind::Flash`]:
//! tiled prefill, on tensor cores under [`Precision::Tf32`], FP32 FMAs under
//! [`Precision::Fp32`]; flash-decoding for decode steps); the unfused attention kernel
//! stays selectable ([`AttentionKind::Unfused`]) for comparison, and is what
//! runs for head sizes the flash kernels were not built for.

use anyhow::{Context, Result, ensure};
use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use gpu_host::shape::{
    AttentionShape, DecodeAttentionShape, EncoderShape, KvCacheShape, KvRows, LayernormWeights, MatmulShape, RowShape,
    SampleShape, SplitSums,
};
use gpu_kernels::params::flash_attention::{
    FLASH_DECODE_CHUNK, FLASH_DECODE_MAX_T, FLASH_DECODE_PARTS_PER_CHUNK, FLASH_HEAD_SIZE,
};
use gpu_kernels::params::sample::SampleRow;
use half::bf16;

use crate::generate::{Backend, ForwardLimits, LogitsWanted, check_forward_args, check_targets};
use crate::gpu::Gpu;
use crate::gpu::ops::argmax::argmax_forward;
use crate::gpu::ops::args::OpError;
use crate::gpu::ops::attention::attention_forward;
use crate::gpu::ops::convert::{convert_to_bf16, convert_to_f32};
use crate::gpu::ops::convert::{f32_to_bf16, round_tf32};
use crate::gpu::ops::crossentropy::crossentropy_forward;
use crate::gpu::ops::decode::{DecodeLaunch, decode_attention};
use crate::gpu::ops::encoder::{encoder_forward, encoder_forward_bf16, encoder_forward_rows};
use crate::gpu::ops::flash_attention::{
    FlashOptions, FlashPrecision, FlashWorkspace, KvStore, attention_forward_flash, attention_forward_flash_bf16_out,
};
use crate::gpu::ops::kv_cache::{KvCache, KvElem, kv_cache_store_split};
use crate::gpu::ops::layernorm::{
    LayernormOut, layernorm_forward, layernorm_forward_bf16, layernorm_forward_tf32, residual_layernorm_forward,
    residual_layernorm_split_fits, residual_layernorm_split_forward,
};
use crate::gpu::ops::matmul::{
    MatmulKernel, MatmulOptions, MatmulWorkspace, choose, matmul_forward_with, split_k_workspace_floats,
};
use crate::gpu::ops::matmul_bf16::{
    BF16_C_MULTIPLE, Bf16Out, QkvCache, matmul_forward_bf16, matmul_forward_bf16_wgmma,
    matmul_forward_bf16_wgmma_partials,
};
use crate::gpu::ops::matmul_tf32::{
    TF32_C_MULTIPLE, TF32_MAX_SPLITS, Tf32Options, Tf32TileOptions, fp32_tc_planned, matmul_forward_fp32_tc_partials,
    matmul_forward_fp32_tc_with, matmul_forward_tf32_opts,
};
use crate::gpu::ops::sample::{DeviceSampleRow, Draws, sample_forward_streams};
use crate::gpu::ops::weight::{DeviceWeight, WeightRef};
use crate::gpu::runtime::CudaContextExt;
use crate::model::{DType, Layer, ModelConfig, Tensor, Weights};
use gpu_host::with_kv;

mod decode;
mod slots;
mod tp;
use decode::{Chosen, DecodeState};
pub use decode::{
    DecodePath, DecodeTuning, PERSISTENT_ROWS_MAX_KEYS, PERSISTENT_ROWS_MAX_KEYS_F32, PREFETCH_AHEAD_TRY_BYTES,
};
use slots::SlotState;
pub use tp::TpEngine;

/// Arithmetic of the matmuls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// FP32 on the CUDA cores: logits within 1e-3 of the CPU reference.
    #[default]
    Fp32,
    /// TF32 tensor cores for the large matmuls (prefill); decode-sized ones
    /// (a few rows) stay on the FP32 GEMV kernel, which is faster there.
    Tf32,
    /// Weight matrices stored in bf16 on the GPU (half the bytes a decode
    /// step reads): bf16 tensor cores for prefill (activations rounded to
    /// bf16, f32 accumulation), the bf16-weight GEMV for decode (f32
    /// activations). Embeddings' positions, biases, layernorm parameters,
    /// activations and the KV cache stay f32. Fixed when the engine is made
    /// (the weights are stored so); error measured in docs/precision.md.
    Bf16,
}

impl Precision {
    /// How the weight matrices are stored under this precision.
    pub fn weight_format(self) -> WeightFormat {
        match self {
            Precision::Fp32 | Precision::Tf32 => WeightFormat::F32,
            Precision::Bf16 => WeightFormat::Bf16,
        }
    }
}

/// Storage of the weight matrices (qkv, attention and MLP projections,
/// the token embedding / LM head) on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    Bf16,
}

impl WeightFormat {
    /// Bytes per stored element.
    pub fn bytes(self) -> usize {
        match self {
            WeightFormat::F32 => size_of::<f32>(),
            WeightFormat::Bf16 => size_of::<half::bf16>(),
        }
    }
}

/// Which attention kernels the engine runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Flash attention (`gpu::ops::flash_attention`): prefill in 64x64 tiles
    /// that never materialise the T x T scores (TF32 tensor cores under
    /// [`Precision::Tf32`], FP32 FMAs under [`Precision::Fp32`], so the FP32
    /// path keeps its 1e-3 bar); flash-decoding (split over the cache, then a
    /// combine) when a call has at most `FLASH_DECODE_MAX_T` positions. Only
    /// for head size `FLASH_HEAD_SIZE`; other models run [`Self::Unfused`].
    #[default]
    Flash,
    /// The unfused `attention_forward`: one block per (query, head), each re-reading
    /// its K/V range. Kept for comparison (tests, `bench`).
    Unfused,
}

/// One transformer block's parameters on the device, (out, in) layout: the
/// matrices in the engine's [`WeightFormat`], the vectors in f32.
type DeviceLayer = Layer<CudaSlice<f32>, DeviceWeight>;

/// All parameters on the device.
struct DeviceParams {
    /// `[Vp, C]`, in the engine's [`WeightFormat`]: rows past the file's
    /// vocabulary are zero.
    wte: DeviceWeight,
    wpe: CudaSlice<f32>,
    layers: Vec<DeviceLayer>,
    lnfw: CudaSlice<f32>,
    lnfb: CudaSlice<f32>,
}

/// TF32-rounded copies of the weights the TF32 matmuls read. On a Hopper GPU
/// the `wgmma` kernels take weights as given (they round only the
/// activations), so under [`Precision::Tf32`] the engine hands them these,
/// made once. The FP32 path, and the GEMV that small row counts take in
/// either precision, keep the originals.
struct Tf32Weights {
    /// Per layer: qkvw, attprojw, fcw, fcprojw.
    layers: Vec<[CudaSlice<f32>; 4]>,
    /// The LM head (wte).
    wte: CudaSlice<f32>,
}

impl Tf32Weights {
    fn new(gpu: &Gpu, p: &DeviceParams) -> Result<Tf32Weights> {
        let copy = |w: &DeviceWeight| -> Result<CudaSlice<f32>> {
            let w = w.f32().context("TF32 copies are made from f32 weights")?;
            let mut out = gpu.alloc::<f32>(w.len())?;
            gpu.memcpy_dtod(w, &mut out).ctx("copying a weight")?;
            round_tf32(gpu, &mut out, w.len())?;
            Ok(out)
        };
        let layers = p
            .layers
            .iter()
            .map(|l| Ok([copy(&l.qkvw)?, copy(&l.attprojw)?, copy(&l.fcw)?, copy(&l.fcprojw)?]))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tf32Weights {
            layers,
            wte: copy(&p.wte)?,
        })
    }
}

/// Activations for up to `max_batch * max_seq_len` rows (llm.c's names).
struct Activations {
    tokens: CudaSlice<u32>,
    residual: CudaSlice<f32>,
    residual2: CudaSlice<f32>,
    ln: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    atty: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    /// `gelu(fc(ln2(x)))`: fc's epilogue applies the GELU.
    fch_gelu: CudaSlice<f32>,
    /// `[max_batch, C]`: the last position of each row, for `LogitsWanted::Last`.
    head_in: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    ids: CudaSlice<u32>,
    /// `[rows]` targets and losses of `crossentropy` (one per logits row).
    targets: CudaSlice<u32>,
    losses: CudaSlice<f32>,
    /// A bf16 engine on a Hopper GPU: the matmuls' inputs in bf16.
    bf16: Option<Bf16Acts>,
}

/// bf16 copies of the activations the bf16 `wgmma` matmuls read, each
/// written once by its producer (layernorm, GELU epilogue, attention's
/// rounding) instead of the f32 ones; the same values the `mma.sync`
/// kernels get by rounding f32 inputs in every tile.
struct Bf16Acts {
    ln: CudaSlice<bf16>,
    atty: CudaSlice<bf16>,
    fch_gelu: CudaSlice<bf16>,
    head_in: CudaSlice<bf16>,
}

impl Bf16Acts {
    /// Elements (bf16) for `rows` positions and `max_batch` head rows.
    fn elements(rows: usize, max_batch: usize, c: usize) -> usize {
        rows * (c + c + 4 * c) + max_batch * c
    }
}

/// What the last successful `forward` produced.
#[derive(Clone, Copy, Debug)]
struct Last {
    b: usize,
    /// Rows of logits: `b` for `Last`, `b * t` for `All`.
    rows: usize,
}

/// Where a forward call's rows sit in the KV cache, at which positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// `b` sequences in cache rows `row0..row0 + b`, all at positions
    /// `pos0..pos0 + t` (a batch, or one slot's prefill).
    Shared { row0: usize, pos0: usize },
    /// One token a row (`t = 1`): row `r` is cache row `r`, feeding the
    /// token in `acts.tokens[r]` at its own position in the slot state's
    /// `pos`, both uploaded by the caller (so the call is kernels only, and
    /// capturable); a row at or past `max_seq_len` is idle.
    PerRow,
    /// The tokens of several slots' prefills in one call (`t = 1`, `b`
    /// tokens in all): as `PerRow`, but row `r` is cache row
    /// `cache_row[r]` of the slot state (rows of one slot share it, each at
    /// its own position), and the logits are those of the rows listed in
    /// its `head_rows` (each chunk's last token), in that order.
    Chunks,
}

/// GPT-2 on one GPU.
pub struct GpuEngine {
    gpu: Gpu,
    config: ModelConfig,
    precision: Precision,
    max_batch: usize,
    max_seq_len: usize,
    /// Positions a forward call may hold in all (`b * t`): the activations'
    /// rows ([`GpuEngine::with_rows`]).
    max_rows: usize,
    /// Whether the GPU chains kernels with PDL at all (`Gpu::chain_pdl` at
    /// construction); forward calls use it up to [`CHAIN_PDL_MAX_ROWS`].
    chain_pdl: bool,
    /// Attention window (0 = unlimited, GPT-2's own behaviour).
    window: usize,
    /// Attention kernels asked for (see [`GpuEngine::attention_in_use`] for what runs).
    attention: AttentionKind,
    /// Flash-decoding scratch, sized for `(max_batch, NH, max_seq_len)` at
    /// creation so that no forward call allocates; `None` when the model's
    /// head size has no flash kernel.
    flash: Option<FlashWorkspace>,
    /// Split-K partial sums of the matmuls, sized at creation for every
    /// shape a forward call can run (see [`model_workspace_floats`] and
    /// [`MatmulScratch::tf32_split`]).
    matmul_ws: MatmulScratch,
    params: DeviceParams,
    /// Made when TF32 is first asked for on a GPU with `wgmma` kernels.
    tf32_weights: Option<Tf32Weights>,
    /// Per layer: K and V caches, `[max_batch][NH][max_seq_len][HS]` each,
    /// f32, or bf16 in a bf16 engine.
    kv_cache: Vec<KvCache>,
    acts: Activations,
    last: Option<Last>,
    /// The fused decode step's state, scratch and graphs; `None` where its
    /// kernels do not serve the model. Its graphs hold the addresses of the
    /// buffers above, which never move: the engine allocates them once.
    decode: Option<DecodeState>,
    /// Per-row settings and draw counters of the device sampler.
    sampling: SamplingState,
    /// The slot interface's state ([`crate::serve::backend::SlotBackend`]),
    /// made by its first call.
    slots: Option<SlotState>,
}

/// The device sampler's inputs (`sample_forward`), made with the engine.
struct SamplingState {
    /// `[max_batch]` settings; rows `0..uploaded.len()` hold `uploaded`.
    rows: CudaSlice<DeviceSampleRow>,
    /// `[max_batch]` draw counters of an eager `sample`.
    counter: CudaSlice<u32>,
    /// `[max_batch]` each row's random stream, `stream_offset + row`: a
    /// replica holding rows `k..` of a larger batch draws what one engine
    /// would for those rows ([`GpuEngine::set_sample_stream_offset`]).
    streams: CudaSlice<u32>,
    /// What `streams` holds: row `r` draws from stream `stream_offset + r`.
    stream_offset: usize,
    /// The settings last uploaded.
    uploaded: Vec<SampleRow>,
    /// `prepare_sampling` asked for sampling: fused steps end by sampling.
    prepared: bool,
    /// Host staging of the counters (no allocation per call).
    host_counter: Vec<u32>,
}

impl SamplingState {
    fn new(gpu: &Gpu, max_batch: usize) -> Result<Self> {
        let mut streams = gpu.alloc(max_batch)?;
        upload_streams(gpu, &mut streams, 0)?;
        Ok(SamplingState {
            rows: gpu.alloc(max_batch)?,
            counter: gpu.alloc(max_batch)?,
            streams,
            stream_offset: 0,
            uploaded: Vec::with_capacity(max_batch),
            prepared: false,
            host_counter: Vec::with_capacity(max_batch),
        })
    }

    /// Device bytes [`SamplingState::new`] allocates.
    fn device_bytes(max_batch: usize) -> usize {
        // Settings, draw counters and streams.
        max_batch * (size_of::<DeviceSampleRow>() + 2 * size_of::<u32>())
    }

    /// Make `rows` the settings on the device (uploads only a change).
    fn upload(&mut self, gpu: &Gpu, rows: &[SampleRow]) -> Result<()> {
        if self.uploaded != rows {
            let dev: Vec<DeviceSampleRow> = rows.iter().copied().map(DeviceSampleRow).collect();
            gpu.memcpy_htod(&dev, &mut self.rows.slice_mut(0..rows.len()))
                .ctx("uploading the sampling settings")?;
            self.uploaded = rows.to_vec();
        }
        Ok(())
    }
}

/// Fill `streams` with `offset, offset + 1, ...` (row `r` draws from
/// stream `offset + r`).
fn upload_streams(gpu: &Gpu, streams: &mut CudaSlice<u32>, offset: usize) -> Result<()> {
    let n = streams.len();
    let first = u32::try_from(offset).context("sampling stream offset beyond u32")?;
    let last = u32::try_from(offset + n).context("sampling stream offset beyond u32")?;
    let host: Vec<u32> = (first..last).collect();
    gpu.memcpy_htod(&host, streams).ctx("uploading the sampling streams")?;
    Ok(())
}

/// Bytes of one f32.
const F32_BYTES: usize = 4;
/// Bytes of one bf16.
const BF16_BYTES: usize = 2;

/// Whether an engine keeps bf16 copies of its matmul inputs ([`Bf16Acts`]):
/// bf16 weights on a GPU with the `wgmma` kernels, which read bf16.
fn bf16_acts(format: WeightFormat, wgmma: bool) -> bool {
    format == WeightFormat::Bf16 && wgmma
}
/// Bytes per mebibyte, for messages.
const MIB: usize = 1 << 20;

impl GpuEngine {
    /// Upload `weights` and allocate activations and the KV cache for
    /// batches of up to `max_batch` rows of up to `max_seq_len` positions.
    pub fn new(
        gpu: Gpu,
        weights: &Weights,
        max_batch: usize,
        max_seq_len: usize,
        precision: Precision,
    ) -> Result<GpuEngine> {
        Self::with_rows(gpu, weights, max_batch, max_seq_len, max_batch * max_seq_len, precision)
    }

    /// [`GpuEngine::new`] with activations for forward calls of up to
    /// `max_rows` positions in all (`b * t`), instead of `max_batch *
    /// max_seq_len`. A server holds many sequences in the KV cache but
    /// prefills one chunk at a time and decodes one token a row: at 64
    /// sequences of 1024 positions the full-size logits alone would take 13 GB.
    pub fn with_rows(
        gpu: Gpu,
        weights: &Weights,
        max_batch: usize,
        max_seq_len: usize,
        max_rows: usize,
        precision: Precision,
    ) -> Result<GpuEngine> {
        let config = weights.config;
        ensure!(max_batch > 0, "the batch size must be at least 1");
        ensure!(
            max_rows >= max_batch,
            "activations for {max_rows} positions cannot hold a decode step of {max_batch} rows"
        );
        ensure!(max_seq_len > 0, "the sequence length must be at least 1");
        ensure!(
            max_seq_len <= config.max_seq_len,
            "a sequence length of {max_seq_len} exceeds the model's context window of {} positions",
            config.max_seq_len
        );
        ensure!(
            config.num_heads > 0 && config.channels.is_multiple_of(config.num_heads),
            "channels {} are not divisible by heads {}",
            config.channels,
            config.num_heads
        );
        ensure!(
            weights.layers.len() == config.num_layers,
            "the checkpoint has {} layers, its config says {}",
            weights.layers.len(),
            config.num_layers
        );
        let needed = Self::device_bytes(
            &config,
            max_batch,
            max_seq_len,
            max_rows,
            gpu.sm_count(),
            gpu.has_wgmma(),
            precision,
        );
        let oom = |what: &str| {
            format!(
                "allocating {what} on {} (the engine needs about {} MiB in all: weights, activations for \
                 {max_batch} x {max_seq_len} positions and the KV cache; try a smaller batch or sequence length)",
                gpu.name(),
                needed / MIB
            )
        };
        let format = precision.weight_format();
        ensure!(
            format == WeightFormat::F32 || config.channels.is_multiple_of(BF16_C_MULTIPLE),
            "bf16 needs the channel count to be a multiple of {BF16_C_MULTIPLE}; this model has {}",
            config.channels
        );
        let params = upload_params(&gpu, weights, format).with_context(|| oom("the weights"))?;
        let (c, l) = (config.channels, config.num_layers);
        let rows = max_rows.min(max_batch * max_seq_len);
        let cache_len = max_batch * max_seq_len * c;
        // The cache is kept as the weights are: bf16 halves its bytes.
        let kv_bf16 = format == WeightFormat::Bf16;
        let kv_cache = (0..l)
            .map(|_| KvCache::alloc(&gpu, cache_len, kv_bf16))
            .collect::<Result<Vec<_>, crate::gpu::GpuError>>()
            .with_context(|| oom("the KV cache"))?;
        let alloc = |n: usize| gpu.alloc::<f32>(n);
        let acts = (|| {
            Ok::<_, crate::gpu::GpuError>(Activations {
                tokens: gpu.alloc::<u32>(rows)?,
                residual: alloc(rows * c)?,
                residual2: alloc(rows * c)?,
                ln: alloc(rows * c)?,
                qkv: alloc(rows * 3 * c)?,
                atty: alloc(rows * c)?,
                proj: alloc(rows * c)?,
                fch_gelu: alloc(rows * 4 * c)?,
                head_in: alloc(max_batch * c)?,
                logits: alloc(rows * config.padded_vocab_size)?,
                ids: gpu.alloc::<u32>(max_batch)?,
                targets: gpu.alloc::<u32>(rows)?,
                losses: alloc(rows)?,
                bf16: match bf16_acts(format, gpu.has_wgmma()) {
                    true => Some(Bf16Acts {
                        ln: gpu.alloc::<bf16>(rows * c)?,
                        atty: gpu.alloc::<bf16>(rows * c)?,
                        fch_gelu: gpu.alloc::<bf16>(rows * 4 * c)?,
                        head_in: gpu.alloc::<bf16>(max_batch * c)?,
                    }),
                    false => None,
                },
            })
        })()
        .with_context(|| oom("the activations"))?;
        let flash = if flash_supported(&config, max_batch, max_seq_len) {
            Some(
                FlashWorkspace::new(&gpu, max_batch, config.num_heads, max_seq_len)
                    .with_context(|| oom("the flash-attention workspace"))?,
            )
        } else {
            None
        };
        let fp32_ws = MatmulWorkspace::new(&gpu, model_workspace_floats(&config, rows, gpu.sm_count()))
            .with_context(|| oom("the matmul split-K workspace"))?;
        let tf32_split = if gpu.has_wgmma() {
            let floats = TF32_MAX_SPLITS * rows.min(TF32_SPLIT_MAX_ROWS) * config.channels;
            Some(
                gpu.alloc::<f32>(floats)
                    .with_context(|| oom("the TF32 split-K workspace"))?,
            )
        } else {
            None
        };
        let matmul_ws = MatmulScratch {
            fp32: fp32_ws,
            fp32_tensor_cores: true,
            tf32_split,
        };
        let tf32_weights = if precision == Precision::Tf32 && gpu.has_wgmma() {
            Some(Tf32Weights::new(&gpu, &params).with_context(|| oom("the TF32-rounded weight copies"))?)
        } else {
            None
        };
        let decode =
            DecodeState::new(&gpu, &config, max_batch, max_seq_len).with_context(|| oom("the decode-step state"))?;
        let sampling = SamplingState::new(&gpu, max_batch).with_context(|| oom("the sampler's state"))?;
        gpu.synchronize().context("uploading the weights")?;
        Ok(GpuEngine {
            chain_pdl: gpu.chain_pdl(),
            gpu,
            config,
            precision,
            max_batch,
            max_seq_len,
            max_rows: rows,
            window: 0,
            attention: AttentionKind::default(),
            flash,
            matmul_ws,
            params,
            tf32_weights,
            kv_cache,
            acts,
            last: None,
            decode,
            sampling,
            slots: None,
        })
    }

    /// Device memory the engine allocates on a GPU of `sms` SMs, in bytes
    /// (weights padded to Vp), with activations for `max_rows` positions
    /// ([`GpuEngine::with_rows`]; [`GpuEngine::new`]: `max_batch *
    /// max_seq_len`); with `wgmma` (a Hopper GPU) also the TF32
    /// split-K scratch and, when created in `precision` TF32, the
    /// TF32-rounded weight copies (a later switch to TF32 adds those).
    pub fn device_bytes(
        config: &ModelConfig,
        max_batch: usize,
        max_seq_len: usize,
        max_rows: usize,
        sms: usize,
        wgmma: bool,
        precision: Precision,
    ) -> usize {
        let (c, l, vp) = (config.channels, config.num_layers, config.padded_vocab_size);
        let rows = max_rows.min(max_batch * max_seq_len);
        // The matrices (qkv, attproj, fc, fcproj: 12 C² per layer; wte
        // padded to Vp) in the precision's format, every other parameter f32.
        let matrices = l * 12 * c * c + vp * c;
        let others = config.num_parameters() - matrices;
        let weight_bytes = matrices * precision.weight_format().bytes() + others * F32_BYTES;
        let kv = 2 * l * max_batch * max_seq_len * c;
        // residual, residual2, ln, atty, proj (C each), qkv (3C), fch_gelu
        // (4C), logits (Vp), and crossentropy's targets and losses (1 each)
        let acts = rows * (5 * c + 3 * c + 4 * c) + rows * (vp + 2) + max_batch * c;
        let flash = if flash_supported(config, max_batch, max_seq_len) {
            flash_workspace_floats(max_batch, config.num_heads, max_seq_len)
        } else {
            0
        };
        let mut matmul_ws = model_workspace_floats(config, rows, sms);
        if wgmma {
            matmul_ws += TF32_MAX_SPLITS * rows.min(TF32_SPLIT_MAX_ROWS) * c;
            if precision == Precision::Tf32 {
                // qkvw, attprojw, fcw, fcprojw (12 C² per layer) and wte (Vp x C).
                matmul_ws += l * 12 * c * c + vp * c;
            }
        }
        let acts16 = if bf16_acts(precision.weight_format(), wgmma) {
            Bf16Acts::elements(rows, max_batch, c) * BF16_BYTES
        } else {
            0
        };
        weight_bytes
            + acts16
            + (kv + acts + flash + matmul_ws) * F32_BYTES
            + rows * 4
            + max_batch * 4
            + DecodeState::device_bytes(config, max_batch, max_seq_len, sms)
            + SamplingState::device_bytes(max_batch)
    }

    /// Run FP32 matmuls beyond the GEMV's rows on the tensor cores as
    /// 3xTF32 (`true`, the default: FP32's accuracy, several times the CUDA
    /// cores' rate at the server's and the prefill's row counts;
    /// docs/performance.md) or on the CUDA cores (`false`: the FP32 kernels
    /// before it, for comparison). The fused decode step is not affected.
    pub fn set_fp32_tensor_cores(&mut self, on: bool) {
        self.matmul_ws.fp32_tensor_cores = on;
    }

    /// Choose the attention kernels (no allocation: the flash workspace
    /// exists from creation whenever the model can use it).
    pub fn set_attention_kind(&mut self, kind: AttentionKind) {
        self.attention = kind;
    }

    /// The attention kernels asked for.
    pub fn attention_kind(&self) -> AttentionKind {
        self.attention
    }

    /// The attention kernels that actually run: `Unfused` when asked for, or
    /// when the model's head size has no flash kernel.
    pub fn attention_in_use(&self) -> AttentionKind {
        match (self.attention, &self.flash) {
            (AttentionKind::Flash, Some(_)) => AttentionKind::Flash,
            _ => AttentionKind::Unfused,
        }
    }

    /// Limit attention to the last `window` positions (0 = unlimited).
    pub fn set_attention_window(&mut self, window: usize) {
        self.window = window;
    }

    /// Switch the matmul precision; caches and buffers serve both. The first
    /// switch to TF32 on a Hopper GPU makes the TF32-rounded weight copies
    /// (an allocation: it can fail for lack of memory). The weight format
    /// is fixed at creation: switching between bf16 and the f32 precisions
    /// is an error (make another engine).
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        ensure!(
            precision.weight_format() == self.precision.weight_format(),
            "the engine stores its weights as {:?}; {precision:?} needs {:?}: create the engine with {precision:?}",
            self.precision.weight_format(),
            precision.weight_format()
        );
        if precision == Precision::Tf32 && self.gpu.has_wgmma() && self.tf32_weights.is_none() {
            self.tf32_weights =
                Some(Tf32Weights::new(&self.gpu, &self.params).context("allocating the TF32-rounded weight copies")?);
        }
        self.precision = precision;
        Ok(())
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The GPU this engine runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Make row `r` of every later sampled choice (`sample`, the fused
    /// step's sampling) draw from random stream `offset + r` instead of `r`:
    /// an engine holding rows `offset..` of a batch split over several
    /// engines ([`crate::gpu::replicas::Replicas`]) then draws what one
    /// engine would for those rows. Default 0.
    pub fn set_sample_stream_offset(&mut self, offset: usize) -> Result<()> {
        let s = &mut self.sampling;
        if s.stream_offset != offset {
            upload_streams(&self.gpu, &mut s.streams, offset)?;
            s.stream_offset = offset;
        }
        Ok(())
    }
}

/// Whether the flash kernels serve this model and these sizes: they are
/// built for one head size, and index the caches with 32-bit offsets (the
/// wrapper asserts both; checking here turns the assert into a fallback).
fn flash_supported(config: &ModelConfig, max_batch: usize, max_seq_len: usize) -> bool {
    /// The wrapper's bound: q, k and v offsets of the largest cache fit in u32.
    const QKV_PARTS: usize = 3;
    let hs = FLASH_HEAD_SIZE as usize;
    config.num_heads > 0
        && config.channels == config.num_heads * hs
        && u32::try_from(max_batch * config.num_heads * max_seq_len * hs * QKV_PARTS).is_ok()
}

/// Floats of a [`FlashWorkspace`] for these sizes (mirrors
/// `FlashWorkspace::new`: per (row, head, query) of a decode call, one
/// partial of HS accumulators plus (max, sum) per warp of each 64-key chunk).
fn flash_workspace_floats(max_batch: usize, nh: usize, max_seq_len: usize) -> usize {
    /// Running max and sum of each partial.
    const ML_FLOATS: usize = 2;
    let parts = max_seq_len.div_ceil(FLASH_DECODE_CHUNK as usize) * FLASH_DECODE_PARTS_PER_CHUNK as usize;
    max_batch * nh * FLASH_DECODE_MAX_T as usize * parts * (FLASH_HEAD_SIZE as usize + ML_FLOATS)
}

/// The shapes of a forward call's five matmuls (qkv, attention projection,
/// MLP up, MLP down, LM head) over `rows` positions, for `c` channels,
/// `heads_c` channels of heads, `hidden` MLP units and `vocab` LM-head rows:
/// the whole model (C, C, 4C, Vp) or a tensor-parallel rank's share.
fn matmul_shapes(rows: usize, c: usize, heads_c: usize, hidden: usize, vocab: usize) -> [MatmulShape; 5] {
    [
        MatmulShape::new(rows, 3 * heads_c, c),
        MatmulShape::new(rows, c, heads_c),
        MatmulShape::new(rows, hidden, c),
        MatmulShape::new(rows, c, hidden),
        MatmulShape::new(rows, vocab, c),
    ]
}

/// Split-K workspace floats for every FP32 matmul of `shapes` (as
/// [`matmul_shapes`]; each with its most rows).
fn fp32_matmul_workspace_floats(shapes: &[MatmulShape], sms: usize) -> usize {
    shapes
        .iter()
        .map(|&shape| split_k_workspace_floats(shape, sms))
        .max()
        .unwrap_or(0)
}

/// [`fp32_matmul_workspace_floats`] of the whole model.
fn model_workspace_floats(config: &ModelConfig, rows: usize, sms: usize) -> usize {
    let (c, vp) = (config.channels, config.padded_vocab_size);
    fp32_matmul_workspace_floats(&matmul_shapes(rows, c, c, 4 * c, vp), sms)
}

/// The matmuls' scratch memory, made once with the engine.
struct MatmulScratch {
    /// FP32 split-K partial sums.
    fp32: MatmulWorkspace,
    /// FP32 matmuls beyond the GEMV's rows on the tensor cores as 3xTF32
    /// (`matmul_forward_fp32_tc`, FP32's accuracy; the default), else on the
    /// CUDA cores (`matmul_forward_with` with a workspace). See [`GpuEngine::set_fp32_tensor_cores`].
    fp32_tensor_cores: bool,
    /// TF32 (wgmma) split-K partial sums, on GPUs with the wgmma kernels:
    /// [`TF32_MAX_SPLITS`] outputs of up to [`TF32_SPLIT_MAX_ROWS`] rows by
    /// `C` columns (the deep-`c` projection; larger calls run unsplit).
    tf32_split: Option<CudaSlice<f32>>,
}

/// Most rows a TF32 split-K call gets scratch for: split-K pays only while
/// the output has too few tiles to fill the GPU.
const TF32_SPLIT_MAX_ROWS: usize = 2048;

/// Most positions of a forward call whose kernels are chained with PDL
/// (`Gpu::launch`). Measured on an H100 (docs/performance.md, "Kernels
/// chained with PDL"): up to 256 rows chaining saved 4-19 % (server steps,
/// short prefills); at 1024 rows FP32 and TF32 prefill were 3-6 % slower
/// chained (why is not measured: perhaps grids planned by the wave lose
/// their even spread when blocks are placed early, as the previous kernel
/// drains).
const CHAIN_PDL_MAX_ROWS: usize = 256;

/// Whether [`matmul`] of `m` rows and inner size `k` runs on the TF32
/// tensor cores (else on an FP32 kernel: GEMV for few rows).
fn takes_tf32_path(precision: Precision, m: usize, k: usize) -> bool {
    precision == Precision::Tf32 && choose(m) != MatmulKernel::Gemv && k.is_multiple_of(TF32_C_MULTIPLE)
}

/// Layernorm, its output rounded to TF32 when `round` (for a TF32 matmul).
fn layernorm(
    gpu: &Gpu,
    round: bool,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    shape: RowShape,
) -> Result<(), OpError> {
    if round {
        layernorm_forward_tf32(gpu, out, inp, weight, bias, shape)
    } else {
        layernorm_forward(gpu, out, inp, weight, bias, shape)
    }
}

/// A linear layer, dispatched on precision and size: TF32 tensor cores for
/// prefill-sized TF32 calls; otherwise FP32 on GEMV (decode), chunked GEMV
/// or the tiled kernel, split over `c` when the grid would under-fill the
/// GPU (`MatmulKernel::Auto` with the engine's workspace picks). `linear`
/// holds the layer's weight (the original, where made its TF32-rounded copy:
/// see [`Tf32Weights`]) and bias, whether `inp` was rounded to TF32 by its
/// producer, and whether the TF32 path is to write TF32 values (both flags
/// ignored on the FP32 paths).
fn matmul(
    gpu: &Gpu,
    precision: Precision,
    ws: &mut MatmulScratch,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    linear: Linear<'_>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let Linear {
        weight,
        weight_tf32,
        bias,
        inp_rounded,
        round_out,
        gelu,
    } = linear;
    let weight = match weight {
        WeightRef::Bf16(w) => return matmul_forward_bf16(gpu, out, inp, w, bias, shape, gelu),
        WeightRef::F32(w) => w,
    };
    if takes_tf32_path(precision, shape.m, shape.k) {
        let opts = Tf32Options {
            gelu,
            inp_rounded,
            round_out,
            split_workspace: ws.tf32_split.as_mut(),
        };
        let w = weight_tf32.unwrap_or(weight);
        return matmul_forward_tf32_opts(gpu, opts, out, inp, w, bias, shape)
            .map_err(|e| OpError::shape("matmul_forward_tf32", e.to_string()));
    }
    if takes_fp32_tc_path(ws, shape) {
        let opts = Tf32TileOptions {
            gelu,
            ..fp32_tc_planned(gpu, Some(ws.fp32.partial_mut()), shape)
        };
        return matmul_forward_fp32_tc_with(gpu, opts, out, inp, weight, bias, shape)
            .map_err(|e| OpError::shape("matmul_forward_fp32_tc", e.to_string()));
    }
    matmul_forward_with(
        gpu,
        MatmulOptions {
            kernel: MatmulKernel::Auto,
            gelu,
            workspace: Some(&mut ws.fp32),
        },
        out,
        inp,
        weight,
        bias,
        shape,
    )
}

/// Whether [`matmul`] runs an f32-weight call that did not take the TF32
/// path on the 3xTF32 tensor-core kernels.
fn takes_fp32_tc_path(ws: &MatmulScratch, shape: MatmulShape) -> bool {
    ws.fp32_tensor_cores && choose(shape.m) != MatmulKernel::Gemv && shape.k.is_multiple_of(TF32_C_MULTIPLE)
}

/// How [`matmul_leaving_parts`] left its output for its reader.
#[derive(Clone, Copy)]
enum Projected {
    /// Whole, bias included, in the output buffer.
    Rows,
    /// As this many split-K parts in `ws.fp32.partial()`, the bias not added.
    Parts(usize),
}

/// [`matmul`] for an output whose only reader can add split-K parts itself
/// (`reader_takes_parts`): attproj's and fcproj's, read by the residual
/// layernorm after them ([`residual_layernorm_after`]); qkv's in a
/// per-row step, read by `kv_cache_store_split`. Where it runs as a split
/// 3xTF32 matmul, its parts stay in the scratch and the reader adds them
/// up: one launch where the split's reduction and the reader took two.
#[allow(clippy::too_many_arguments)]
fn matmul_leaving_parts(
    gpu: &Gpu,
    precision: Precision,
    ws: &mut MatmulScratch,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<f32>,
    linear: Linear<'_>,
    shape: MatmulShape,
    reader_takes_parts: bool,
) -> Result<Projected, OpError> {
    if reader_takes_parts
        && let WeightRef::F32(weight) = linear.weight
        && !takes_tf32_path(precision, shape.m, shape.k)
        && takes_fp32_tc_path(ws, shape)
        && !linear.gelu
    {
        let opts = fp32_tc_planned(gpu, Some(ws.fp32.partial_mut()), shape);
        let parts = matmul_forward_fp32_tc_partials(gpu, opts, out, inp, weight, linear.bias, shape)
            .map_err(|e| OpError::shape("matmul_forward_fp32_tc", e.to_string()))?;
        return Ok(if parts > 1 {
            Projected::Parts(parts)
        } else {
            Projected::Rows
        });
    }
    matmul(gpu, precision, ws, out, inp, linear, shape)?;
    Ok(Projected::Rows)
}

/// `residual = inp1 + proj` and `ln` = its layernorm, `proj` read as
/// [`matmul_leaving_parts`] left it (`proj_out` and `proj_bias` are its output
/// buffer and bias).
#[allow(clippy::too_many_arguments)]
fn residual_layernorm_after(
    gpu: &Gpu,
    ws: &MatmulScratch,
    projected: Projected,
    residual: &mut CudaSlice<f32>,
    ln: LayernormOut<'_>,
    inp1: &CudaSlice<f32>,
    (proj_out, proj_bias): (&CudaSlice<f32>, &CudaSlice<f32>),
    weights: LayernormWeights<'_, CudaSlice<f32>>,
    shape: RowShape,
) -> Result<(), OpError> {
    match projected {
        Projected::Rows => residual_layernorm_forward(gpu, residual, ln, inp1, proj_out, weights, shape),
        Projected::Parts(splits) => {
            let parts = SplitSums {
                partial: ws.fp32.partial(),
                splits,
                bias: Some(proj_bias),
            };
            residual_layernorm_split_forward(gpu, residual, ln, inp1, parts, weights, shape)
        }
    }
}

/// One linear layer as [`matmul`] runs it: its parameters, and how the TF32
/// path rounds around it (the two flags only matter there).
#[derive(Clone, Copy)]
struct Linear<'a> {
    weight: WeightRef<'a>,
    /// `weight` rounded to TF32, where the engine made that copy.
    weight_tf32: Option<&'a CudaSlice<f32>>,
    bias: Option<&'a CudaSlice<f32>>,
    /// The producer of `inp` rounded it to TF32.
    inp_rounded: bool,
    /// Write TF32 values.
    round_out: bool,
    /// GELU after the bias, in the matmul's epilogue.
    gelu: bool,
}

impl<'a> Linear<'a> {
    /// `weight` and `bias`, no TF32 copy, no rounding.
    fn new(weight: WeightRef<'a>, bias: Option<&'a CudaSlice<f32>>) -> Self {
        Linear {
            weight,
            weight_tf32: None,
            bias,
            inp_rounded: false,
            round_out: false,
            gelu: false,
        }
    }
}

/// The LM head's input rows: all of `ln` (`b * t` rows of `c`), or the last
/// position of each of the `b` sequences, gathered into `head_in`.
fn head_rows<'a, T: DeviceRepr>(
    gpu: &Gpu,
    heads: Heads<'_>,
    ln: &'a CudaSlice<T>,
    head_in: &'a mut CudaSlice<T>,
    c: usize,
) -> Result<&'a CudaSlice<T>> {
    let mut gather = |i: usize, row: usize| {
        gpu.memcpy_dtod(
            &ln.slice(row * c..(row + 1) * c),
            &mut head_in.slice_mut(i * c..(i + 1) * c),
        )
        .ctx("gathering the rows the LM head reads")
    };
    match heads {
        // Every row, or one position a row (every row is its last).
        Heads::All | Heads::Last { t: 1, .. } => return Ok(ln),
        Heads::Last { b, t } => {
            for bi in 0..b {
                gather(bi, bi * t + t - 1)?;
            }
        }
        Heads::Listed(rows) => {
            for (i, &row) in rows.iter().enumerate() {
                gather(i, row)?;
            }
        }
    }
    Ok(head_in)
}

/// The rows of the last layernorm's output that the LM head reads.
#[derive(Clone, Copy)]
enum Heads<'a> {
    /// Every position.
    All,
    /// The last position of each of `b` rows of `t`.
    Last { b: usize, t: usize },
    /// These rows, in this order.
    Listed(&'a [usize]),
}

impl Heads<'_> {
    fn from_want(want: LogitsWanted, b: usize, t: usize) -> Self {
        match want {
            LogitsWanted::All => Heads::All,
            LogitsWanted::Last => Heads::Last { b, t },
        }
    }
}

/// A linear layer on bf16 activations ([`Bf16Acts`]): the bf16 `wgmma`
/// matmul, which needs bf16 weights (an engine with bf16 activations has
/// them: [`bf16_acts`]).
fn matmul_bf16_acts(
    gpu: &Gpu,
    out: Bf16Out<'_>,
    inp: &CudaSlice<bf16>,
    weight: WeightRef<'_>,
    bias: Option<&CudaSlice<f32>>,
    shape: MatmulShape,
    gelu: bool,
) -> Result<(), OpError> {
    matmul_forward_bf16_wgmma(gpu, out, inp, bf16_weight(weight)?, bias, shape, gelu)
}

/// The bf16 matrix of a weight that bf16 activations multiply.
fn bf16_weight(weight: WeightRef<'_>) -> Result<&CudaSlice<bf16>, OpError> {
    match weight {
        WeightRef::Bf16(w) => Ok(w),
        _ => Err(OpError::shape(
            "matmul_forward_bf16_wgmma",
            "bf16 activations need bf16 weights",
        )),
    }
}

/// [`matmul_leaving_parts`] for the bf16 projections on Hopper (bf16
/// activations): split over `k` where the output has too few tiles to fill
/// the GPU (`matmul_bf16::bf16_wgmma_plan`: a short prompt's projections),
/// the parts left in the split-K workspace for the residual layernorm to add
/// up with the bias, when `reader_takes_parts`.
fn matmul_bf16_leaving_parts(
    gpu: &Gpu,
    ws: &mut MatmulScratch,
    out: &mut CudaSlice<f32>,
    inp: &CudaSlice<bf16>,
    (weight, bias): (WeightRef<'_>, &CudaSlice<f32>),
    shape: MatmulShape,
    reader_takes_parts: bool,
) -> Result<Projected, OpError> {
    if !reader_takes_parts {
        matmul_bf16_acts(gpu, Bf16Out::F32(out), inp, weight, Some(bias), shape, false)?;
        return Ok(Projected::Rows);
    }
    let w = bf16_weight(weight)?;
    let parts = matmul_forward_bf16_wgmma_partials(gpu, ws.fp32.partial_mut(), out, inp, w, Some(bias), shape)?;
    Ok(if parts > 1 {
        Projected::Parts(parts)
    } else {
        Projected::Rows
    })
}

/// One layer's attention on the kernels chosen: flash when `flash` holds the
/// workspace (prefill or flash-decoding, picked by `t` inside), else the
/// unfused kernel. Same contract either way (docs/design.md).
fn attention<E: KvElem>(
    gpu: &Gpu,
    flash: Option<FlashOptions<'_>>,
    out: &mut CudaSlice<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &CudaSlice<f32>,
    shape: AttentionShape,
) -> Result<()> {
    match flash {
        Some(opts) => attention_forward_flash(gpu, out, k_cache, v_cache, qkv, shape, opts)?,
        None => attention_forward(gpu, out, k_cache, v_cache, qkv, shape)?,
    }
    Ok(())
}

/// The flash kernels' options for an engine of `precision` with workspace
/// `ws`: each precision's own products (bf16 rounds Q, K, V and P as its
/// matmuls round their inputs).
fn flash_options(precision: Precision, ws: &mut FlashWorkspace) -> FlashOptions<'_> {
    let precision = match precision {
        Precision::Tf32 => FlashPrecision::Tf32,
        Precision::Bf16 => FlashPrecision::Bf16,
        Precision::Fp32 => FlashPrecision::Fp32,
    };
    FlashOptions { precision, ws }
}

impl GpuEngine {
    /// The forward pass proper (`Backend::forward` after its checks and
    /// the fused decode dispatch): `b * t` positions placed as `place` says.
    fn forward_placed(
        &mut self,
        tokens: &[u32],
        b: usize,
        t: usize,
        place: Placement,
        want: LogitsWanted,
    ) -> Result<()> {
        let cfg = self.config;
        let (c, nh, vp) = (cfg.channels, cfg.num_heads, cfg.padded_vocab_size);
        let n = b * t;
        // Every row-wise op of the call (layernorms, the per-row encoder).
        let row_shape = RowShape::new(n, c);
        // The layers' matmuls over the call's n rows.
        let [qkv_mm, attproj_mm, fc_mm, fcproj_mm, _] = matmul_shapes(n, c, c, 4 * c, vp);
        ensure!(
            n <= self.max_rows,
            "a forward call of {n} positions exceeds the {} this engine holds activations for",
            self.max_rows
        );
        self.gpu.set_chain_pdl(self.chain_pdl && n <= CHAIN_PDL_MAX_ROWS);
        let (gpu, prec, p, a) = (&self.gpu, self.precision, &self.params, &mut self.acts);
        // The TF32 matmuls' weights (rounded copies where the kernels need them).
        let tf32 = self.tf32_weights.as_ref().filter(|_| prec == Precision::Tf32);
        // Where the wgmma kernels run (rounded weights exist and the matmuls of
        // `n` rows take the TF32 path), the layernorm and GELU that feed them
        // round their outputs to TF32, so the matmuls need not.
        let round_acts = tf32.is_some() && takes_tf32_path(prec, n, c);
        let ws = &mut self.matmul_ws;
        let mut flash = match self.attention {
            AttentionKind::Flash => self.flash.as_mut(),
            AttentionKind::Unfused => None,
        };
        // On the wgmma path the qkv matmul writes TF32 values; when this call
        // is the whole cache (pos0 = 0) every K/V the flash kernel reads is
        // one, so it may skip rounding them (a cached prefix from a decode
        // step, written by the FP32 GEMV, would not be).
        if let Some(ws) = flash.as_deref_mut() {
            ws.set_kv_rounded(round_acts && matches!(place, Placement::Shared { pos0: 0, .. }));
        }
        // Per-row positions (and cache rows) live in the slot state,
        // uploaded by the caller.
        let mut per_row = match place {
            Placement::PerRow | Placement::Chunks => Some(self.slots.as_mut().context("the slot state is missing")?),
            Placement::Shared { .. } => None,
        };
        // A per-row step's caller uploads its tokens (with the positions),
        // so the step itself holds only kernels: a graph can capture it.
        if per_row.is_none() {
            gpu.memcpy_htod(tokens, &mut a.tokens.slice_mut(0..n))
                .ctx("uploading token ids")?;
        }

        // LM head (tied to wte, no bias) over the padded vocabulary, on the wanted rows only.
        let rows = match (want, place, per_row.as_deref()) {
            (_, Placement::Chunks, Some(s)) => s.head_rows.len(),
            (LogitsWanted::All, ..) => n,
            (LogitsWanted::Last, ..) => b,
        };
        let round_head = tf32.is_some() && takes_tf32_path(prec, rows, c);
        let head_mm = MatmulShape::new(rows, vp, c);

        match (place, p.wte.as_ref(), per_row.as_deref()) {
            (Placement::Shared { pos0, .. }, WeightRef::F32(wte), _) => encoder_forward(
                gpu,
                &mut a.residual,
                &a.tokens,
                wte,
                &p.wpe,
                EncoderShape { b, t, c, pos0 },
            )?,
            (Placement::Shared { pos0, .. }, WeightRef::Bf16(wte), _) => encoder_forward_bf16(
                gpu,
                &mut a.residual,
                &a.tokens,
                wte,
                &p.wpe,
                EncoderShape { b, t, c, pos0 },
            )?,
            (Placement::PerRow | Placement::Chunks, wte, Some(s)) => {
                encoder_forward_rows(gpu, &mut a.residual, &a.tokens, &s.pos, wte, &p.wpe, row_shape)?
            }
            (Placement::PerRow | Placement::Chunks, _, None) => anyhow::bail!("the slot state is missing"),
        }
        // Each residual add is fused with the layernorm after it (`ln2` of its
        // layer, then `ln1` of the next, `lnf` after the last); only the
        // first layernorm stands alone.
        // A bf16 engine on a Hopper GPU: the matmuls read bf16 copies of
        // their inputs, which the layernorms and the GELU epilogue write
        // instead of f32 ones ([`Bf16Acts`]).
        let mut a16 = a.bf16.as_mut();
        let first = p.layers.first().context("the model has no layers")?;
        match a16.as_deref_mut() {
            Some(x) => layernorm_forward_bf16(gpu, &mut x.ln, &a.residual, &first.ln1w, &first.ln1b, row_shape)?,
            None => layernorm(
                gpu,
                round_acts,
                &mut a.ln,
                &a.residual,
                &first.ln1w,
                &first.ln1b,
                row_shape,
            )?,
        }
        for (li, (lw, kv)) in p.layers.iter().zip(self.kv_cache.iter_mut()).enumerate() {
            let rounded = |i: usize| tf32.map(|t| &t.layers[li][i]);
            // attention sub-block: x + attproj(attention(qkv(ln1(x)))), ln1(x) already in a.ln
            // A bf16 prefill on the flash kernel, whose attention reads the
            // bf16 cache only: the qkv matmul writes this call's keys and
            // values there itself, so no store kernel runs.
            let mut kv_stored = false;
            let qkv_projected = match a16.as_deref_mut() {
                Some(x) => {
                    let out = match (place, &mut *kv) {
                        (Placement::Shared { row0, pos0 }, KvCache::Bf16(k_cache, v_cache))
                            if flash.is_some() && t > FLASH_DECODE_MAX_T as usize =>
                        {
                            let rows = row0 * c * self.max_seq_len..(row0 + b) * c * self.max_seq_len;
                            kv_stored = true;
                            let cache = QkvCache {
                                k_cache: k_cache.slice_mut(rows.clone()),
                                v_cache: v_cache.slice_mut(rows),
                                t,
                                pos0,
                                max_t: self.max_seq_len,
                                nh,
                            };
                            Bf16Out::QkvF32(&mut a.qkv, cache)
                        }
                        _ => Bf16Out::F32(&mut a.qkv),
                    };
                    matmul_bf16_acts(gpu, out, &x.ln, lw.qkvw.as_ref(), Some(&lw.qkvb), qkv_mm, false)?;
                    Projected::Rows
                }
                // Per-row placement: `kv_cache_store` alone reads the qkv rows,
                // and it can add split-K parts.
                None => matmul_leaving_parts(
                    gpu,
                    prec,
                    ws,
                    &mut a.qkv,
                    &a.ln,
                    Linear {
                        weight_tf32: rounded(0),
                        inp_rounded: round_acts,
                        round_out: round_acts,
                        ..Linear::new(lw.qkvw.as_ref(), Some(&lw.qkvb))
                    },
                    qkv_mm,
                    matches!(place, Placement::PerRow | Placement::Chunks),
                )?,
            };
            // Whether attention wrote its output as the bf16 acts' copy itself.
            let mut atty_in_bf16 = false;
            match (place, per_row.as_deref_mut()) {
                (Placement::Shared { row0, pos0 }, _) => with_kv!(&mut *kv, |k_cache, v_cache| {
                    // The call's rows are cache rows row0..row0 + b.
                    let rows = row0 * c * self.max_seq_len..(row0 + b) * c * self.max_seq_len;
                    let (k, v) = (&mut k_cache.slice_mut(rows.clone()), &mut v_cache.slice_mut(rows));
                    let shape = AttentionShape {
                        b,
                        t,
                        pos0,
                        max_t: self.max_seq_len,
                        c,
                        nh,
                        window: self.window,
                    };
                    match (a16.as_deref_mut(), flash.as_deref_mut()) {
                        // A bf16 prefill: the kernel writes the attention
                        // projection's bf16 input directly (no f32 output, no
                        // conversion pass).
                        (Some(x), Some(ws)) if t > FLASH_DECODE_MAX_T as usize => {
                            let store = if kv_stored { KvStore::Stored } else { KvStore::Store };
                            attention_forward_flash_bf16_out(gpu, &mut x.atty, k, v, &a.qkv, shape, ws, store)?;
                            atty_in_bf16 = true;
                        }
                        (_, ws) => {
                            let flash = ws.map(|ws| flash_options(prec, ws));
                            attention(gpu, flash, &mut a.atty, k, v, &a.qkv, shape)?
                        }
                    }
                }),
                (Placement::PerRow | Placement::Chunks, Some(s)) => with_kv!(&mut *kv, |k_cache, v_cache| {
                    // Row r is cache row r (or cache_row[r]), at its own position.
                    let max_t = self.max_seq_len;
                    let cache_row = (place == Placement::Chunks).then_some(&s.cache_row);
                    let pos = &s.pos;
                    let cache = KvRows {
                        k_cache: &mut *k_cache,
                        v_cache: &mut *v_cache,
                        pos,
                        cache_row,
                    };
                    let qkv = match qkv_projected {
                        Projected::Rows => SplitSums {
                            partial: &a.qkv,
                            splits: 1,
                            bias: None,
                        },
                        Projected::Parts(splits) => SplitSums {
                            partial: ws.fp32.partial(),
                            splits,
                            bias: Some(&lw.qkvb),
                        },
                    };
                    kv_cache_store_split(gpu, &mut s.q, cache, qkv, KvCacheShape { rows: n, c, nh, max_t })?;
                    let cache = KvRows {
                        k_cache: &*k_cache,
                        v_cache: &*v_cache,
                        pos,
                        cache_row,
                    };
                    // Chained with PDL as `Gpu::launch` chains its neighbours.
                    let launch = DecodeLaunch::new(gpu.chain_pdl());
                    let shape = DecodeAttentionShape {
                        rows: n,
                        c,
                        nh,
                        window: self.window,
                    };
                    decode_attention(gpu, &mut s.ws, launch, &mut a.atty, &s.q, cache, shape)?;
                }),
                (Placement::PerRow | Placement::Chunks, None) => anyhow::bail!("the slot state is missing"),
            }
            let projected = match a16.as_deref_mut() {
                Some(x) => {
                    if !atty_in_bf16 {
                        f32_to_bf16(gpu, &mut x.atty, &a.atty, n * c)?;
                    }
                    let attproj = (lw.attprojw.as_ref(), &lw.attprojb);
                    let takes_parts = residual_layernorm_split_fits(c);
                    matmul_bf16_leaving_parts(gpu, ws, &mut a.proj, &x.atty, attproj, attproj_mm, takes_parts)?
                }
                None => matmul_leaving_parts(
                    gpu,
                    prec,
                    ws,
                    &mut a.proj,
                    &a.atty,
                    Linear {
                        weight_tf32: rounded(1),
                        ..Linear::new(lw.attprojw.as_ref(), Some(&lw.attprojb))
                    },
                    attproj_mm,
                    residual_layernorm_split_fits(c),
                )?,
            };
            let (res, proj) = (&mut a.residual2, (&a.proj, &lw.attprojb));
            let ln2 = LayernormWeights {
                weight: &lw.ln2w,
                bias: &lw.ln2b,
            };
            let ln = match a16.as_deref_mut() {
                Some(x) => LayernormOut::Bf16(&mut x.ln),
                None => LayernormOut::f32(&mut a.ln, round_acts),
            };
            residual_layernorm_after(gpu, ws, projected, res, ln, &a.residual, proj, ln2, row_shape)?;
            // MLP sub-block: x + fcproj(gelu(fc(ln2(x)))), ln2(x) in a.ln
            match (lw.fcw.as_ref(), rounded(2).filter(|_| round_acts)) {
                // bf16 on Hopper: fc, GELU and the rounding fcproj wants.
                (fcw @ WeightRef::Bf16(_), _) if a16.is_some() => {
                    let x = a16.as_deref_mut().expect("checked by the guard");
                    let out = Bf16Out::Bf16(&mut x.fch_gelu);
                    matmul_bf16_acts(gpu, out, &x.ln, fcw, Some(&lw.fcb), fc_mm, true)?
                }
                // bf16: fc and GELU in one kernel.
                (WeightRef::Bf16(fcw), _) => {
                    matmul_forward_bf16(gpu, &mut a.fch_gelu, &a.ln, fcw, Some(&lw.fcb), fc_mm, true)?;
                }
                // On the wgmma path: fc, GELU and the rounding fcproj wants, in one kernel.
                (_, Some(fcw)) => {
                    let opts = Tf32Options {
                        gelu: true,
                        inp_rounded: true,
                        round_out: true,
                        split_workspace: None,
                    };
                    matmul_forward_tf32_opts(gpu, opts, &mut a.fch_gelu, &a.ln, fcw, Some(&lw.fcb), fc_mm)
                        .map_err(|e| OpError::shape("matmul_forward_tf32", e.to_string()))?;
                }
                // Elsewhere fc's epilogue applies GELU too.
                (fcw, None) => {
                    let fc = Linear {
                        weight_tf32: rounded(2),
                        gelu: true,
                        ..Linear::new(fcw, Some(&lw.fcb))
                    };
                    matmul(gpu, prec, ws, &mut a.fch_gelu, &a.ln, fc, fc_mm)?;
                }
            }
            let projected = match a16.as_deref_mut() {
                Some(x) => {
                    let fcproj = (lw.fcprojw.as_ref(), &lw.fcprojb);
                    let takes_parts = residual_layernorm_split_fits(c);
                    matmul_bf16_leaving_parts(gpu, ws, &mut a.proj, &x.fch_gelu, fcproj, fcproj_mm, takes_parts)?
                }
                None => matmul_leaving_parts(
                    gpu,
                    prec,
                    ws,
                    &mut a.proj,
                    &a.fch_gelu,
                    Linear {
                        weight_tf32: rounded(3),
                        inp_rounded: round_acts,
                        ..Linear::new(lw.fcprojw.as_ref(), Some(&lw.fcprojb))
                    },
                    fcproj_mm,
                    residual_layernorm_split_fits(c),
                )?,
            };
            // The residual stream, and the layernorm that reads it next.
            let (next_w, next_b, round_next) = match p.layers.get(li + 1) {
                Some(next) => (&next.ln1w, &next.ln1b, round_acts),
                None => (&p.lnfw, &p.lnfb, round_head),
            };
            let next_ln = LayernormWeights {
                weight: next_w,
                bias: next_b,
            };
            let (res, proj) = (&mut a.residual, (&a.proj, &lw.fcprojb));
            let ln = match a16.as_deref_mut() {
                Some(x) => LayernormOut::Bf16(&mut x.ln),
                None => LayernormOut::f32(&mut a.ln, round_next),
            };
            residual_layernorm_after(gpu, ws, projected, res, ln, &a.residual2, proj, next_ln, row_shape)?;
        }
        // The rows the head reads: every position, each row's last, or the
        // listed ones (a prefill of several chunks).
        let heads = match (place, per_row.as_deref()) {
            (Placement::Chunks, Some(s)) => Heads::Listed(&s.head_rows),
            _ => Heads::from_want(want, b, t),
        };
        match a16 {
            // bf16 rows (wte in bf16 too).
            Some(x) => {
                let head_in = head_rows(gpu, heads, &x.ln, &mut x.head_in, c)?;
                let out = Bf16Out::F32(&mut a.logits);
                matmul_bf16_acts(gpu, out, head_in, p.wte.as_ref(), None, head_mm, false)?;
            }
            None => {
                let head_in = head_rows(gpu, heads, &a.ln, &mut a.head_in, c)?;
                let head = Linear {
                    weight_tf32: tf32.map(|t| &t.wte),
                    inp_rounded: round_head,
                    ..Linear::new(p.wte.as_ref(), None)
                };
                matmul(gpu, prec, ws, &mut a.logits, head_in, head, head_mm)?;
            }
        }
        self.last = Some(Last { b, rows });
        Ok(())
    }
}

impl Backend for GpuEngine {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> Result<()> {
        let cfg = self.config;
        let v = cfg.vocab_size;
        self.last = None;
        self.mark_ids_stale();
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
        if t == 1 && want == LogitsWanted::Last && self.decode_path_in_use(b) != DecodePath::Unfused {
            return self.decode_forward(tokens, b, pos0);
        }
        if t == 1 && want == LogitsWanted::Last && self.per_row_decode_serves(b) {
            return self.decode_per_row(tokens, pos0);
        }
        self.forward_placed(tokens, b, t, Placement::Shared { row0: 0, pos0 }, want)
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        let last = self.last.context("logits() called before a successful forward()")?;
        let n = last.rows * self.config.padded_vocab_size;
        let mut out = vec![0f32; n];
        self.gpu
            .memcpy_dtoh(&self.acts.logits.slice(0..n), &mut out)
            .ctx("reading the logits")?;
        Ok(out)
    }

    fn crossentropy(&mut self, targets: &[u32]) -> Result<Vec<f64>> {
        let last = self
            .last
            .context("crossentropy() called before a successful forward()")?;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let n = last.rows;
        check_targets(targets, n, v)?;
        let a = &mut self.acts;
        self.gpu
            .memcpy_htod(targets, &mut a.targets.slice_mut(0..n))
            .ctx("uploading the targets")?;
        crossentropy_forward(&self.gpu, &mut a.losses, &a.logits, &a.targets, n, v, vp)?;
        let mut losses = vec![0f32; n];
        self.gpu
            .memcpy_dtoh(&a.losses.slice(0..n), &mut losses)
            .ctx("reading the losses")?;
        Ok(losses.into_iter().map(f64::from).collect())
    }

    fn argmax(&mut self) -> Result<Vec<u32>> {
        let last = self.last.context("argmax() called before a successful forward()")?;
        if let Some(ids) = self.fresh_ids(Chosen::Argmax) {
            // The fused step chose them already.
            let ids = ids.slice(0..last.b);
            let mut out = vec![0u32; last.b];
            self.gpu.memcpy_dtoh(&ids, &mut out).ctx("reading the argmax ids")?;
            return Ok(out);
        }
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let per_row = last.rows / last.b;
        // Row bi's last position is logits row bi * per_row + per_row - 1.
        let first = (per_row - 1) * vp;
        let a = &mut self.acts;
        argmax_forward(&self.gpu, &mut a.ids, &a.logits.slice(first..), last.b, v, per_row * vp)?;
        let mut ids = vec![0u32; last.b];
        self.gpu
            .memcpy_dtoh(&a.ids.slice(0..last.b), &mut ids)
            .ctx("reading the argmax ids")?;
        Ok(ids)
    }

    fn prepare_sampling(&mut self, rows: Option<&[SampleRow]>) -> Result<()> {
        match rows {
            Some(rows) => {
                ensure!(
                    rows.len() <= self.max_batch,
                    "sampling settings for {} rows; the engine was built for {}",
                    rows.len(),
                    self.max_batch
                );
                self.sampling.upload(&self.gpu, rows)?;
                self.sampling.prepared = true;
            }
            None => self.sampling.prepared = false,
        }
        Ok(())
    }

    fn sample(&mut self, rows: &[SampleRow], pos: usize) -> Result<Vec<u32>> {
        let last = self.last.context("sample() called before a successful forward()")?;
        ensure!(
            rows.len() == last.b,
            "sample(): {} rows of settings for a forward of {} rows",
            rows.len(),
            last.b
        );
        let b = last.b;
        // The fused step sampled already, with these settings, at this position.
        if self.sampling.uploaded == rows
            && let Some(ids) = self.fresh_ids(Chosen::Sampled)
            && self.decode_next_pos() == Some(pos)
        {
            let mut out = vec![0u32; b];
            self.gpu
                .memcpy_dtoh(&ids.slice(0..b), &mut out)
                .ctx("reading the sampled ids")?;
            return Ok(out);
        }
        let counter = u32::try_from(pos).context("position beyond the sampling counter")?;
        self.sampling.upload(&self.gpu, rows)?;
        let s = &mut self.sampling;
        s.host_counter.clear();
        s.host_counter.resize(b, counter);
        self.gpu
            .memcpy_htod(&s.host_counter, &mut s.counter.slice_mut(0..b))
            .ctx("uploading the draw counters")?;
        let (v, vp) = (self.config.vocab_size, self.config.padded_vocab_size);
        let per_row = last.rows / b;
        let first = (per_row - 1) * vp;
        let a = &mut self.acts;
        sample_forward_streams(
            &self.gpu,
            &mut a.ids,
            &a.logits.slice(first..),
            &s.rows,
            Draws {
                counter: Some(&s.counter),
                streams: Some(&s.streams),
            },
            None::<&mut CudaSlice<u32>>,
            SampleShape {
                n: b,
                v,
                row_stride: per_row * vp,
            },
        )?;
        let mut ids = vec![0u32; b];
        self.gpu
            .memcpy_dtoh(&a.ids.slice(0..b), &mut ids)
            .ctx("reading the sampled ids")?;
        Ok(ids)
    }

    fn choose_and_step(&mut self, pos: usize) -> Result<Option<Vec<u32>>> {
        self.fused_choose_and_step(pos)
    }
}

/// Upload every parameter (see [`upload_tensor`]), the matrices in `format`.
fn upload_params(gpu: &Gpu, w: &Weights, format: WeightFormat) -> Result<DeviceParams> {
    let cfg = &w.config;
    let (c, vp) = (cfg.channels, cfg.padded_vocab_size);
    ensure!(w.wte.shape[1] == c, "wte has {} columns, expected {c}", w.wte.shape[1]);
    ensure!(
        w.wte.shape[0] == cfg.vocab_size || w.wte.shape[0] == vp,
        "wte has {} rows, expected {} or {vp}",
        w.wte.shape[0],
        cfg.vocab_size
    );
    let up = |t: &Tensor, name: &str| upload_tensor(gpu, t, t.shape[0]).with_context(|| format!("uploading {name}"));
    let mat = |t: &Tensor, rows: usize, name: &str| {
        upload_matrix(gpu, t, rows, format).with_context(|| format!("uploading {name}"))
    };
    let layers = w
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let up = |t: &Tensor, name: &str| up(t, &format!("layer {i} {name}"));
            let mat = |t: &Tensor, name: &str| mat(t, t.shape[0], &format!("layer {i} {name}"));
            l.as_ref().try_map(|name, t| up(t, name), |name, t| mat(t, name))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(DeviceParams {
        wte: mat(&w.wte, vp, "wte")?,
        wpe: up(&w.wpe, "wpe")?,
        layers,
        lnfw: up(&w.lnfw, "lnfw")?,
        lnfb: up(&w.lnfb, "lnfb")?,
    })
}

/// One tensor to a new f32 device buffer of `rows` logical rows (more than
/// the tensor's own rows pads with zeros: wte to Vp): see [`upload_as`].
fn upload_tensor(gpu: &Gpu, t: &Tensor, rows: usize) -> Result<CudaSlice<f32>> {
    upload_as(gpu, t, rows, DType::F32, |dst, raw, [r, c], dt, tr| {
        convert_to_f32(gpu, dst, raw, r, c, dt, tr)
    })
}

/// A weight matrix to a new device buffer of `rows` logical rows in
/// `format` (see [`upload_as`]; bf16 stored untransposed is copied as it
/// is, f32 and f16 are rounded to the nearest bf16).
fn upload_matrix(gpu: &Gpu, t: &Tensor, rows: usize, format: WeightFormat) -> Result<DeviceWeight> {
    Ok(match format {
        WeightFormat::F32 => DeviceWeight::F32(upload_tensor(gpu, t, rows)?),
        WeightFormat::Bf16 => DeviceWeight::Bf16(upload_as(gpu, t, rows, DType::BF16, |dst, raw, [r, c], dt, tr| {
            convert_to_bf16(gpu, dst, raw, r, c, dt, tr)
        })?),
    })
}

/// One tensor to a new device buffer of `T` (whose checkpoint dtype is
/// `dtype`) with `rows` logical rows; extra rows are zero. Stored as `T`
/// already and untransposed, its bytes are copied as they are; otherwise
/// they are copied raw and `convert(dst, raw, shape, dtype, transposed)`
/// (`convert_to_f32` or `convert_to_bf16`) turns them into `T` on the device.
fn upload_as<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    t: &Tensor,
    rows: usize,
    dtype: DType,
    convert: impl FnOnce(&mut CudaViewMut<'_, T>, &CudaSlice<u8>, [usize; 2], DType, bool) -> Result<(), OpError>,
) -> Result<CudaSlice<T>> {
    let [trows, cols] = t.shape;
    ensure!(rows >= trows, "cannot fit {trows} rows into {rows}");
    let nbytes = trows * cols * t.dtype.size();
    ensure!(
        t.bytes.len() == nbytes,
        "tensor holds {} bytes, its shape needs {nbytes}",
        t.bytes.len()
    );
    let mut out = gpu.alloc::<T>(rows * cols)?;
    if t.dtype == dtype && !t.transposed {
        // SAFETY: the bytes are values of T as stored (f32 or bf16 bits: any
        // bits are valid); the view covers the first trows*cols values of
        // `out` (transmute_mut checks the size).
        let mut dst = unsafe { out.transmute_mut::<u8>(nbytes) }.context("upload view larger than the buffer")?;
        gpu.memcpy_htod(t.bytes, &mut dst).ctx("copying weights to the GPU")?;
    } else {
        let mut raw = gpu.alloc::<u8>(nbytes)?;
        gpu.memcpy_htod(t.bytes, &mut raw).ctx("copying weights to the GPU")?;
        let mut dst = out.slice_mut(0..trows * cols);
        convert(&mut dst, &raw, [trows, cols], t.dtype, t.transposed)?;
        // `raw` is freed in stream order, after the conversion.
    }
    Ok(out)
}
