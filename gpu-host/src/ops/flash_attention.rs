//! Flash attention: the `attention_forward` op (docs/design.md) as fused
//! kernels that never hold a T x T matrix in memory.
//!
//! Three entry points, all with `attention_forward`'s arguments plus a
//! [`FlashPrecision`] and a [`FlashWorkspace`]; each first appends this call's
//! K,V to the cache (the `attention_kv_store` kernel it shares with the unfused path;
//! a TF32 prefill from position 0 does it inside the attention kernel) and then attends:
//! - [`attention_forward_flash`]: picks the path by `t`: flash-decoding for
//!   `t <= FLASH_DECODE_MAX_T` (decode steps), prefill flash attention otherwise.
//! - [`attention_forward_flash_prefill`]: always the prefill kernel.
//! - [`attention_forward_flash_decode`]: always flash-decoding (`t <= FLASH_DECODE_MAX_T`).
//! - [`attention_forward_flash_bf16_out`]: the bf16 prefill kernel writing
//!   its output in bf16 (what the bf16 engine's attention projection reads);
//!   it may skip the store where the caller's qkv matmul filled the cache
//!   ([`KvStore::Stored`]).
//!
//! Precision: [`FlashPrecision::Tf32`] runs QKᵀ and PV of prefill on tensor
//! cores (TF32 inputs, f32 accumulate), [`FlashPrecision::Bf16`] likewise
//! with bf16 inputs (Q, K, V and the probabilities rounded to bf16);
//! [`FlashPrecision::Fp32`] uses FP32 FMAs (exact path). Flash-decoding is
//! FP32 in every case (it is memory-bound, tensor cores would not help).
//! Softmax is FP32 with `ex2.approx` in all.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::CacheBits;
use gpu_kernels::params::attention::AttentionParams;
use gpu_kernels::params::flash_attention::*;
use half::bf16;

use super::args::{aligned16, in_ptr, out_ptr};
use crate::KvElem;
use crate::runtime::{Gpu, GpuError};

/// Whether a call's own K,V rows still go into the caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvStore {
    /// The call stores them (the store kernel, or the TF32 prefill kernel
    /// itself from position 0).
    Store,
    /// The caller did: the bf16 qkv matmul wrote them
    /// (`matmul_bf16::Bf16Out::QkvF32`), at the call's positions.
    Stored,
}

/// Product precision of the prefill kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashPrecision {
    /// Tensor cores, TF32 inputs (10-bit mantissa), f32 accumulate.
    Tf32,
    /// Tensor cores, bf16 inputs (7-bit mantissa), f32 accumulate: the bf16
    /// engine's prefill.
    Bf16,
    /// FP32 FMAs: matches the CPU reference to float rounding.
    Fp32,
}

/// Scratch of flash-decoding (the per-chunk partials), sized once for the
/// largest batch, head count and cache length, so no call allocates. Creating
/// it also raises the prefill kernels' shared-memory limit above 48 KiB.
pub struct FlashWorkspace {
    part_acc: cudarc::driver::CudaSlice<f32>,
    part_ml: cudarc::driver::CudaSlice<f32>,
    max_b: usize,
    nh: usize,
    max_t: usize,
    parts_stride: usize,
    /// TF32 and bf16 prefill `kv_split` forced by [`Self::force_tf32_kv_split`]; `None`: by grid size.
    tf32_kv_split: Option<u32>,
    /// Set by [`Self::set_kv_rounded`]: the caller's K/V are TF32 values.
    kv_rounded: bool,
    /// bf16 prefill ring depth forced by [`Self::force_bf16_stages`]; `None`: by grid size.
    bf16_stages: Option<u32>,
    /// Tensor-core prefill key chunks: each block's state
    /// (`FLASH_PREFILL_BLOCK_STATE` floats) for grids of up to
    /// `chunk_blocks` blocks, and one arrival counter per block (a split
    /// grid has at least as many blocks as (query tile, pair) units).
    part_state: cudarc::driver::CudaSlice<f32>,
    part_count: cudarc::driver::CudaSlice<u32>,
    chunk_blocks: u32,
    /// Key-chunk size forced by [`Self::force_prefill_chunk_tiles`]; `None`: by grid size.
    chunk_tiles: Option<u32>,
}

/// Floats per partial's (max, sum) pair.
const ML_FLOATS: usize = 2;

impl FlashWorkspace {
    pub fn new(gpu: &Gpu, max_b: usize, nh: usize, max_t: usize) -> Result<Self, GpuError> {
        gpu.set_max_dynamic_shared(ATTENTION_FORWARD_FLASH_TF32, FLASH_SMEM_BYTES_TF32)?;
        gpu.set_max_dynamic_shared(ATTENTION_FORWARD_FLASH_BF16, FLASH_SMEM_BYTES_BF16)?;
        gpu.set_max_dynamic_shared(ATTENTION_FORWARD_FLASH_BF16_2STAGE, FLASH_SMEM_BYTES_BF16_2STAGE)?;
        gpu.set_max_dynamic_shared(ATTENTION_FORWARD_FLASH_FP32, FLASH_SMEM_BYTES_FP32)?;
        let parts_stride = max_t.div_ceil(FLASH_DECODE_CHUNK as usize) * FLASH_DECODE_PARTS_PER_CHUNK as usize;
        let rows = max_b * nh * FLASH_DECODE_MAX_T as usize;
        let chunk_blocks = FLASH_PREFILL_SPLIT_MAX_BLOCKS_PER_SM * gpu.sm_count() as u32;
        Ok(Self {
            part_acc: gpu.alloc(rows * parts_stride * FLASH_HEAD_SIZE as usize)?,
            part_ml: gpu.alloc(rows * parts_stride * ML_FLOATS)?,
            max_b,
            nh,
            max_t,
            parts_stride,
            tf32_kv_split: None,
            kv_rounded: false,
            bf16_stages: None,
            part_state: gpu.alloc(chunk_blocks as usize * FLASH_PREFILL_BLOCK_STATE as usize)?,
            // Zero between launches: each split launch's last blocks reset theirs.
            part_count: gpu.alloc(chunk_blocks as usize)?,
            chunk_blocks,
            chunk_tiles: None,
        })
    }

    /// Force the tensor-core prefill kernels' key chunks (`Some(0)`: every
    /// query tile's keys in one block; `Some(n)`: tiles with more than `n`
    /// key tiles split into chunks of at most `n`, merged by the last block;
    /// enlarged where the grid would outgrow the workspace), for tests and
    /// benchmarks; `None` restores the choice by grid size
    /// (`FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM`, `FLASH_PREFILL_MIN_CHUNK_TILES`).
    /// Results agree within the precision's rounding either way.
    pub fn force_prefill_chunk_tiles(&mut self, tiles: Option<u32>) {
        self.chunk_tiles = tiles;
    }

    /// Force the TF32 and bf16 prefill kernels' `kv_split` (1: 128-query tiles; 2:
    /// 64-query tiles, each K/V tile's keys split between two warps), for
    /// tests and benchmarks; `None` restores the automatic choice (by grid
    /// size, see `FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM`). Results agree
    /// either way.
    pub fn force_tf32_kv_split(&mut self, split: Option<u32>) {
        assert!(
            matches!(split, None | Some(1) | Some(2)),
            "FlashWorkspace: kv_split must be 1 or 2, got {split:?}"
        );
        self.tf32_kv_split = split;
    }

    /// Force the bf16 prefill kernel's ring depth (3 or 2 tiles), for tests
    /// and benchmarks; `None` restores the choice by grid
    /// size (`FLASH_BF16_2STAGE_MIN_BLOCKS_PER_SM`). Results agree either way.
    pub fn force_bf16_stages(&mut self, stages: Option<u32>) {
        assert!(
            matches!(stages, None | Some(2) | Some(3)),
            "FlashWorkspace: bf16 stages must be 2 or 3, got {stages:?}"
        );
        self.bf16_stages = stages;
    }

    /// Promise (true) that every K/V value the TF32 prefill kernel will read
    /// is already a TF32 value: this call's K,V thirds of `qkv` and the cached
    /// prefix (low 13 mantissa bits zero, as a matmul that rounds its output
    /// to TF32 writes them). The kernel then skips rounding each K/V tile in
    /// shared memory, with identical results. Default false (any f32 input).
    /// Breaking the promise only costs accuracy: the tensor cores then see
    /// the unrounded values.
    pub fn set_kv_rounded(&mut self, rounded: bool) {
        self.kv_rounded = rounded;
    }
}

/// The problem of one call (see [`crate::shape::AttentionShape`]), checked
/// once by the entry points; the flash kernels need `c = 64 * nh`.
pub use crate::shape::AttentionShape;

/// The shape's short name inside this module.
type Shape = AttentionShape;

/// Where a call writes its output: f32 rows, or (the bf16 prefill kernel
/// only) bf16 rows.
#[derive(Clone, Copy)]
enum Out {
    F32(*mut f32),
    Bf16(*mut u16),
}

impl Shape {
    fn check(&self, out: usize, k: usize, v: usize, qkv: usize) {
        let Shape {
            b,
            t,
            pos0,
            max_t,
            c,
            nh,
            ..
        } = *self;
        assert!(b >= 1 && t >= 1, "attention_forward_flash: empty batch (b={b}, t={t})");
        assert!(
            nh >= 1 && c == nh * FLASH_HEAD_SIZE as usize,
            "attention_forward_flash: head size must be {FLASH_HEAD_SIZE} (c={c}, nh={nh})"
        );
        assert!(
            pos0 + t <= max_t,
            "attention_forward_flash: positions {pos0}..{} exceed the cache ({max_t})",
            pos0 + t
        );
        assert!(
            out >= b * t * c,
            "attention_forward_flash: out has {out} floats, needs {}",
            b * t * c
        );
        assert!(
            qkv >= b * t * 3 * c,
            "attention_forward_flash: qkv has {qkv} floats, needs {}",
            b * t * 3 * c
        );
        let cache = b * nh * max_t * FLASH_HEAD_SIZE as usize;
        assert!(
            k >= cache && v >= cache,
            "attention_forward_flash: caches have {k}/{v} floats, need {cache}"
        );
        assert!(
            u32::try_from(b * nh * max_t * FLASH_HEAD_SIZE as usize * 3).is_ok(),
            "attention_forward_flash: sizes exceed u32"
        );
    }

    fn scale_log2e(&self) -> f32 {
        std::f32::consts::LOG2_E / (FLASH_HEAD_SIZE as f32).sqrt()
    }

    /// Keys the last query of the call attends to (the longest range).
    fn max_keys(&self) -> usize {
        let n = self.pos0 + self.t;
        if self.window > 0 { n.min(self.window) } else { n }
    }
}

/// Launch configurations of every kernel of this op.
mod configs {
    use super::*;

    /// Query tiles of the TF32 prefill grid (rows per block: ROWS_MAX / kv_split).
    fn tf32_q_tiles(s: &Shape, kv_split: u32) -> u32 {
        (s.t as u32).div_ceil(FLASH_TF32_ROWS_MAX / kv_split)
    }

    /// TF32 prefill `kv_split`: 128-query tiles (each K/V tile read once per
    /// 128 queries) unless that grid would leave SMs short of blocks; then
    /// halve the tiles (twice the blocks, half the longest chain) until it
    /// does not or FLASH_TF32_KV_SPLIT_MAX is reached (B=1, T=1024: 96 -> 192 blocks).
    pub fn tf32_kv_split(gpu: &Gpu, s: &Shape, forced: Option<u32>) -> u32 {
        forced.unwrap_or_else(|| {
            let want = FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM as usize * gpu.sm_count();
            let mut split = 1;
            while split < FLASH_TF32_KV_SPLIT_MAX && (tf32_q_tiles(s, split) as usize * s.nh * s.b) < want {
                split *= 2;
            }
            split
        })
    }

    /// Blocks of the tensor-core prefill grid without key chunks.
    fn tc_blocks(s: &Shape, kv_split: u32) -> u32 {
        tf32_q_tiles(s, kv_split) * (s.nh * s.b) as u32
    }

    /// The tensor-core prefill's key chunks (0: none) for a call whose
    /// window is `window` (0 where it covers every key). Where the unsplit
    /// bf16 grid leaves SMs short of blocks (fewer than
    /// `FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM` an SM: B=1, T=1024 has 192 on
    /// 132 SMs, the longest a 16-tile chain), chunks of the key tiles' total
    /// over that many blocks, but at least half the longest tile's
    /// (`FLASH_PREFILL_MAX_CHUNKS`) and `FLASH_PREFILL_MIN_CHUNK_TILES`:
    /// at B=1, T=1024 on an H200, bf16 attention 30.6 µs unsplit, 26.6 at
    /// chunks of 4 tiles, 25.7 at 6, 24.6 at 7, 22.8 at 8, 22.9 at 10, 24.5
    /// at 12 (docs/performance.md). `forced` as
    /// [`FlashWorkspace::force_prefill_chunk_tiles`]. A chunk no shorter
    /// than the longest tile is no split; a grid past `capacity` blocks
    /// takes longer chunks.
    pub fn chunk_tiles(
        gpu: &Gpu,
        s: &Shape,
        precision: FlashPrecision,
        window: u32,
        kv_split: u32,
        forced: Option<u32>,
        capacity: u32,
    ) -> u32 {
        let (t, pos0, pairs) = (s.t as u32, s.pos0 as u32, (s.nh * s.b) as u32);
        let bq = FLASH_TF32_ROWS_MAX / kv_split;
        let slots = FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM * gpu.sm_count() as u32;
        let longest = (0..t.div_ceil(bq))
            .map(|q| flash_prefill_key_tiles(q, bq, t, pos0, window))
            .max()
            .unwrap_or(0);
        let mut chunk = forced.unwrap_or_else(|| {
            // TF32 (over 128 registers: one block an SM) measured slower
            // split at every chunk size.
            if precision != FlashPrecision::Bf16 || tc_blocks(s, kv_split) >= slots {
                0
            } else {
                // Every key tile of every query tile, one block each.
                let work = flash_prefill_blocks(t, bq, pos0, window, pairs, 1);
                work.div_ceil(slots)
                    .max(longest.div_ceil(FLASH_PREFILL_MAX_CHUNKS))
                    .max(FLASH_PREFILL_MIN_CHUNK_TILES)
            }
        });
        if chunk >= longest {
            return 0;
        }
        while chunk > 0 && flash_prefill_blocks(t, bq, pos0, window, pairs, chunk) > capacity {
            chunk += 1;
        }
        if chunk >= longest { 0 } else { chunk }
    }

    /// The bf16 prefill kernel and its shared memory: the 2-stage one where
    /// the grid has two blocks an SM or more, else the 3-stage one (a deeper
    /// ring where an SM has one block).
    /// `forced`: a ring depth asked for (2 or 3).
    pub fn bf16_kernel(gpu: &Gpu, s: &Shape, kv_split: u32, forced: Option<u32>) -> (&'static str, u32) {
        let two = FLASH_BF16_2STAGE_MIN_BLOCKS_PER_SM as usize * gpu.sm_count();
        let short = match forced {
            Some(stages) => stages == FLASH_BF16_SHORT_STAGES,
            None => tc_blocks(s, kv_split) as usize >= two,
        };
        if short {
            (ATTENTION_FORWARD_FLASH_BF16_2STAGE, FLASH_SMEM_BYTES_BF16_2STAGE)
        } else {
            (ATTENTION_FORWARD_FLASH_BF16, FLASH_SMEM_BYTES_BF16)
        }
    }

    /// `shared`: the bf16 kernel's bytes ([`bf16_kernel`]); the other
    /// precisions' are fixed.
    /// `window` and `chunk` as the params carry them ([`chunk_tiles`]).
    pub fn prefill(
        s: &Shape,
        precision: FlashPrecision,
        kv_split: u32,
        shared: u32,
        window: u32,
        chunk: u32,
    ) -> LaunchConfig {
        // 1-D grid: the kernel orders the blocks heaviest query tile first.
        let bq = FLASH_TF32_ROWS_MAX / kv_split;
        let tensor_cores = |shared_mem_bytes| LaunchConfig {
            grid_dim: (
                flash_prefill_blocks(s.t as u32, bq, s.pos0 as u32, window, (s.nh * s.b) as u32, chunk),
                1,
                1,
            ),
            block_dim: (FLASH_TF32_THREADS, 1, 1),
            shared_mem_bytes,
        };
        match precision {
            FlashPrecision::Tf32 => tensor_cores(FLASH_SMEM_BYTES_TF32),
            FlashPrecision::Bf16 => tensor_cores(shared),
            FlashPrecision::Fp32 => LaunchConfig {
                grid_dim: ((s.t as u32).div_ceil(FLASH_BLOCK_Q), s.nh as u32, s.b as u32),
                block_dim: (FLASH_THREADS, 1, 1),
                shared_mem_bytes: FLASH_SMEM_BYTES_FP32,
            },
        }
    }

    /// Chunks of the longest key range: every query's partials fit in them.
    pub fn decode_chunks(s: &Shape) -> u32 {
        (s.max_keys() as u32).div_ceil(FLASH_DECODE_CHUNK)
    }

    pub fn decode(s: &Shape) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (decode_chunks(s), s.nh as u32, (s.b * s.t) as u32),
            block_dim: (FLASH_DECODE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub fn combine(s: &Shape) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((s.b * s.t * s.nh) as u32, 1, 1),
            block_dim: (FLASH_COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Kernels read 16-byte vectors: every base address must be 16-byte aligned.
fn assert_aligned(p: usize) {
    assert!(aligned16(&[p]), "attention_forward_flash: buffer not 16-byte aligned");
}

/// Device address of an input buffer, checked aligned.
fn addr<E, T: DevicePtr<E>>(gpu: &Gpu, buf: &T) -> *const E {
    let p = in_ptr(gpu, buf);
    assert_aligned(p as usize);
    p
}

/// Device address of an output buffer, checked aligned.
fn addr_mut<E, T: DevicePtrMut<E>>(gpu: &Gpu, buf: &mut T) -> *mut E {
    let p = out_ptr(gpu, buf);
    assert_aligned(p as usize);
    p
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Auto,
    Prefill,
    Decode,
}

/// What the flash entry points take after `attention_forward`'s arguments
/// (the unfused kernel's and the CPU twin's): the prefill kernel's product
/// precision (flash-decoding is FP32 either way) and the workspace.
pub struct FlashOptions<'a> {
    pub precision: FlashPrecision,
    pub ws: &'a mut FlashWorkspace,
}

/// `attention_forward` with flash kernels: stores K,V, then prefill or
/// flash-decoding by `t` (see the module docs). Panics on inconsistent sizes.
pub fn attention_forward_flash<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
    opts: FlashOptions<'_>,
) -> Result<(), GpuError> {
    let plan = Plan {
        opts,
        path: Path::Auto,
        kv: KvStore::Store,
    };
    run(gpu, f32_out(gpu, out), k_cache, v_cache, qkv, shape, plan)
}

/// [`attention_forward_flash`] forced onto the prefill kernel (any `t`).
pub fn attention_forward_flash_prefill<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
    opts: FlashOptions<'_>,
) -> Result<(), GpuError> {
    let plan = Plan {
        opts,
        path: Path::Prefill,
        kv: KvStore::Store,
    };
    run(gpu, f32_out(gpu, out), k_cache, v_cache, qkv, shape, plan)
}

/// [`attention_forward_flash`] forced onto flash-decoding (`t <= FLASH_DECODE_MAX_T`).
pub fn attention_forward_flash_decode<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
    ws: &mut FlashWorkspace,
) -> Result<(), GpuError> {
    let plan = Plan {
        opts: FlashOptions {
            precision: FlashPrecision::Fp32,
            ws,
        },
        path: Path::Decode,
        kv: KvStore::Store,
    };
    run(gpu, f32_out(gpu, out), k_cache, v_cache, qkv, shape, plan)
}

/// [`attention_forward_flash_prefill`] in [`FlashPrecision::Bf16`], its
/// output rounded to bf16 (to nearest even) into `out` (`[b, t, c]` bf16):
/// the values [`attention_forward_flash_prefill`] would write, rounded, with
/// no f32 output and no conversion pass. `kv`: whether this call's K,V
/// rows still go into the caches ([`KvStore::Stored`]: `qkv`'s K,V
/// columns are not read). Panics on inconsistent sizes.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_flash_bf16_out<E: KvElem>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<bf16>,
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    shape: AttentionShape,
    ws: &mut FlashWorkspace,
    kv: KvStore,
) -> Result<(), GpuError> {
    let len = out.len();
    let p = out_ptr(gpu, out) as *mut u16;
    // Each lane stores pairs of bf16 (4 bytes).
    assert!(
        (p as usize).is_multiple_of(4),
        "attention_forward_flash_bf16_out: out not 4-byte aligned"
    );
    let plan = Plan {
        opts: FlashOptions {
            precision: FlashPrecision::Bf16,
            ws,
        },
        path: Path::Prefill,
        kv,
    };
    run(gpu, (Out::Bf16(p), len), k_cache, v_cache, qkv, shape, plan)
}

/// An f32 output buffer as [`run`] takes it: its address (checked aligned)
/// and length.
fn f32_out(gpu: &Gpu, out: &mut impl DevicePtrMut<f32>) -> (Out, usize) {
    let len = out.len();
    (Out::F32(addr_mut(gpu, out)), len)
}

/// What an entry point asks [`run`] for: its options, its path, and
/// whether the call's K,V rows still go into the caches.
struct Plan<'a> {
    opts: FlashOptions<'a>,
    path: Path,
    kv: KvStore,
}

/// Every entry point's body: the output as an address and its length in
/// elements.
fn run<E: KvElem>(
    gpu: &Gpu,
    (out, out_len): (Out, usize),
    k_cache: &mut impl DevicePtrMut<E>,
    v_cache: &mut impl DevicePtrMut<E>,
    qkv: &impl DevicePtr<f32>,
    s: Shape,
    plan: Plan<'_>,
) -> Result<(), GpuError> {
    let Plan {
        opts: FlashOptions { precision, ws },
        path,
        kv,
    } = plan;
    s.check(out_len, k_cache.len(), v_cache.len(), qkv.len());
    let decode = match path {
        Path::Auto => s.t <= FLASH_DECODE_MAX_T as usize,
        Path::Prefill => false,
        Path::Decode => true,
    };
    if decode {
        assert!(
            s.t <= FLASH_DECODE_MAX_T as usize,
            "attention_forward_flash_decode: t={} > {FLASH_DECODE_MAX_T}",
            s.t
        );
        assert!(
            s.b <= ws.max_b && s.nh == ws.nh && s.max_t <= ws.max_t,
            "attention_forward_flash: workspace is for b<={}, nh={}, max_t<={}; call has b={}, nh={}, max_t={}",
            ws.max_b,
            ws.nh,
            ws.max_t,
            s.b,
            s.nh,
            s.max_t
        );
    }
    // The prefill kernels are built for one cache type each: bf16 for the
    // bf16 kernel, f32 for the others.
    assert!(
        decode || E::Bits::BF16 == (precision == FlashPrecision::Bf16),
        "attention_forward_flash: the bf16 prefill kernel takes a bf16 KV cache, the others an f32 one"
    );
    let (k, v) = (E::bits_mut(addr_mut(gpu, k_cache)), E::bits_mut(addr_mut(gpu, v_cache)));
    let q = addr(gpu, qkv);
    let (o, o16) = match out {
        Out::F32(p) => (p, std::ptr::null_mut()),
        Out::Bf16(p) => {
            // Only the bf16 prefill kernel writes bf16.
            assert!(
                !decode && precision == FlashPrecision::Bf16,
                "attention_forward_flash: a bf16 output needs the bf16 prefill kernel"
            );
            (std::ptr::null_mut(), p)
        }
    };
    let (b, t, pos0, max_t, c, nh, window) = (
        s.b as u32,
        s.t as u32,
        s.pos0 as u32,
        s.max_t as u32,
        s.c as u32,
        s.nh as u32,
        s.window as u32,
    );

    // The op's first half, K,V into the cache, is the shared store kernel,
    // except where the TF32 prefill kernel does it: a call from position 0
    // (each block stores its own rows while reading K/V from `qkv`). The
    // bf16 prefill kernel reads the bf16 cache only (half the bytes of f32
    // `qkv` rows, no conversion pass), so the store runs first, unless the
    // caller's qkv matmul has written the rows already (`KvStore::Stored`).
    let kv_from_qkv = kv == KvStore::Store && !decode && precision == FlashPrecision::Tf32 && s.pos0 == 0;
    let store = AttentionParams {
        out: std::ptr::null_mut(),
        k_cache: k,
        v_cache: v,
        qkv: q,
        b,
        t,
        pos0,
        max_t,
        c,
        nh,
        window,
        scale: 0.0,
    };
    if kv == KvStore::Store && !kv_from_qkv {
        // SAFETY: sizes checked by `s.check` (cache >= b*nh*max_t*HS, pos0+t <= max_t, qkv >= b*t*3c);
        // the store kernel does not touch `out`.
        unsafe { super::attention::launch_kv_store(gpu, &store)? };
    }

    if decode {
        let chunks = configs::decode_chunks(&s);
        let parts = chunks * FLASH_DECODE_PARTS_PER_CHUNK;
        debug_assert!(parts as usize <= ws.parts_stride);
        let (part_acc, part_ml) = (addr_mut(gpu, &mut ws.part_acc), addr_mut(gpu, &mut ws.part_ml));
        let dp = FlashDecodeParams {
            part_acc,
            part_ml,
            k_cache: k,
            v_cache: v,
            qkv: q,
            b,
            t,
            pos0,
            max_t,
            c,
            nh,
            window,
            scale_log2e: s.scale_log2e(),
            parts,
            parts_stride: ws.parts_stride as u32,
        };
        let kernel = E::Bits::kernel(ATTENTION_FORWARD_FLASH_DECODE, ATTENTION_FORWARD_FLASH_DECODE_BF16);
        // SAFETY: as above; the workspace holds max_b*nh*DECODE_MAX_T rows of
        // parts_stride partials, and b <= max_b, t <= DECODE_MAX_T, parts <= parts_stride
        // (max_keys <= max_t <= ws.max_t); the kernel is the one for the cache's elements.
        unsafe { gpu.launch(kernel, configs::decode(&s), dp)? };
        let cp = FlashCombineParams {
            out: o,
            part_acc,
            part_ml,
            b,
            t,
            c,
            nh,
            parts,
            parts_stride: ws.parts_stride as u32,
        };
        // SAFETY: reads the partials just written; out holds b*t*c floats.
        unsafe { gpu.launch(ATTENTION_FORWARD_FLASH_COMBINE, configs::combine(&s), cp)? };
    } else {
        let (name, kv_split, shared) = match precision {
            FlashPrecision::Tf32 => (
                ATTENTION_FORWARD_FLASH_TF32,
                configs::tf32_kv_split(gpu, &s, ws.tf32_kv_split),
                FLASH_SMEM_BYTES_TF32,
            ),
            FlashPrecision::Bf16 => {
                let kv_split = configs::tf32_kv_split(gpu, &s, ws.tf32_kv_split);
                let (name, shared) = configs::bf16_kernel(gpu, &s, kv_split, ws.bf16_stages);
                (name, kv_split, shared)
            }
            FlashPrecision::Fp32 => (ATTENTION_FORWARD_FLASH_FP32, 1, FLASH_SMEM_BYTES_FP32),
        };
        // A window covering every key is no window; this also keeps the
        // kernel's u32 position + window sums far from overflow.
        let window = if s.window >= s.pos0 + s.t { 0 } else { window };
        let chunk = match precision {
            FlashPrecision::Fp32 => 0,
            _ => configs::chunk_tiles(gpu, &s, precision, window, kv_split, ws.chunk_tiles, ws.chunk_blocks),
        };
        let pp = FlashAttentionParams {
            out: o,
            k_cache: k,
            v_cache: v,
            qkv: q,
            b,
            t,
            pos0,
            max_t,
            c,
            nh,
            window,
            scale_log2e: s.scale_log2e(),
            kv_split,
            kv_rounded: u32::from(ws.kv_rounded),
            kv_from_qkv: u32::from(kv_from_qkv),
            out_bf16: o16,
            chunk_tiles: chunk,
            part_state: addr_mut(gpu, &mut ws.part_state),
            part_count: addr_mut(gpu, &mut ws.part_count),
        };
        let config = configs::prefill(&s, precision, kv_split, shared, window, chunk);
        // `chunk_tiles` enlarges the chunks until the grid fits the workspace.
        assert!(
            chunk == 0 || config.grid_dim.0 <= ws.chunk_blocks,
            "attention_forward_flash: {} blocks of key chunks exceed the workspace's {}",
            config.grid_dim.0,
            ws.chunk_blocks
        );
        // SAFETY: as above; the config gives the kernel the grid, threads and
        // shared memory it lays out for this kv_split (1, 2, or 4 only where
        // FlashWorkspace::new could raise the limit to the split-4 size).
        // kv_rounded only changes rounding, never what memory is touched.
        // The kernel takes the cache's element type (asserted above). With
        // key chunks the grid (`flash_prefill_blocks`, the kernel's own count)
        // fits the workspace's states and counters (asserted above), which
        // no other launch uses meanwhile (one stream).
        unsafe { gpu.launch(name, config, pp)? };
    }
    Ok(())
}
