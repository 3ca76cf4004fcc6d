//! Benchmark plumbing shared by the `bench` and `tune` binaries: CUDA-event
//! timing (warm-up, then the median of many samples) and GEMM operand sets
//! rotated so that the working set exceeds L2.
//!
//! Timing rule of the project: speed is shown here, never by a timed test.

pub mod replicas;
pub mod step_trace;
pub mod tp;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas_sys};
use cudarc::driver::{CudaSlice, sys::CUevent_flags};
use gpu_kernels::params::matmul_tf32::TileShape;
use serde::Serialize;

use crate::gpu::runtime::{CudaContextExt, Gpu, GpuError};

/// Bytes the rotated operand sets of one measurement should span at least:
/// twice the L2 of an H200 (60 MB) / H100 (50 MB), so no run finds its
/// inputs left in L2 by the previous one.
pub const ROTATION_BYTES: usize = 128 << 20;
/// At most this many operand sets (small GEMMs would otherwise need hundreds).
pub const MAX_SETS: usize = 64;
/// Samples whose median is reported (the project's rule: at least 20).
pub const DEFAULT_SAMPLES: usize = 25;
/// Untimed passes first (module load, cuBLAS heuristics, clocks up).
pub const DEFAULT_WARMUP: usize = 3;

/// Median of `xs` (sorted in place; `xs` must not be empty).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Wall-clock seconds of `samples` calls of `run` (at least one), after
/// `warmup` untimed ones: for work spread over threads or GPUs, which CUDA
/// events on one stream would not see whole. `run` returns once its GPU
/// work is done.
pub fn wall_times(
    warmup: usize,
    samples: usize,
    mut run: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    for _ in 0..warmup {
        run()?;
    }
    (0..samples.max(1))
        .map(|_| {
            let start = std::time::Instant::now();
            run()?;
            Ok(start.elapsed().as_secs_f64())
        })
        .collect()
}

/// Median, min and max of the per-call times of one measurement, in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Timing {
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub samples: usize,
    /// Calls per sample (one per rotated operand set).
    pub calls_per_sample: usize,
}

/// Time `op(set)` with CUDA events: `warmup` untimed passes over all `sets`,
/// then `samples` timed passes; each sample is one pass over all sets
/// (so consecutive calls never reuse an operand set), divided by `sets`.
pub fn time_calls<E: From<GpuError>>(
    gpu: &Gpu,
    sets: usize,
    warmup: usize,
    samples: usize,
    mut op: impl FnMut(usize) -> Result<(), E>,
) -> Result<Timing, E> {
    let sets = sets.max(1);
    for _ in 0..warmup {
        for s in 0..sets {
            op(s)?;
        }
    }
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        let start = gpu
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ctx("cuEventRecord")?;
        for s in 0..sets {
            op(s)?;
        }
        let end = gpu
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ctx("cuEventRecord")?;
        let ms = start.elapsed_ms(&end).ctx("cuEventElapsedTime")?;
        times.push(ms as f64 * 1e3 / sets as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(Timing {
        median_us: times[times.len() / 2],
        min_us: times[0],
        max_us: times[times.len() - 1],
        samples: times.len(),
        calls_per_sample: sets,
    })
}

/// How many operand sets of `bytes_per_set` make the rotation exceed `ROTATION_BYTES`.
pub fn sets_for(bytes_per_set: usize) -> usize {
    ROTATION_BYTES.div_ceil(bytes_per_set.max(1)).clamp(1, MAX_SETS)
}

/// A cheap deterministic generator for benchmark operands (uniform in
/// [-1, 1)): the values only need to be nonzero and varied, and hundreds of MB
/// must be generated quickly.
pub fn fill_random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Top 24 bits -> [0, 1) -> [-1, 1).
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// One GEMM problem `out[m, n] = inp[m, k] · W[n, k]ᵀ` and its rotated
/// operand sets (each set has its own inp, W and out).
pub struct GemmSets {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub inp: Vec<CudaSlice<f32>>,
    pub w: Vec<CudaSlice<f32>>,
    pub bias: CudaSlice<f32>,
    pub out: Vec<CudaSlice<f32>>,
}

impl GemmSets {
    pub fn new(gpu: &Gpu, m: usize, n: usize, k: usize) -> Result<Self, GpuError> {
        let bytes = 4 * (m * k + n * k + m * n);
        let sets = sets_for(bytes);
        let mut s = Self {
            m,
            n,
            k,
            inp: vec![],
            w: vec![],
            bias: gpu.upload(&fill_random(n, 7))?,
            out: vec![],
        };
        for i in 0..sets {
            s.inp.push(gpu.upload(&fill_random(m * k, 2 * i as u64 + 1))?);
            s.w.push(gpu.upload(&fill_random(n * k, 2 * i as u64 + 2))?);
            // Poisoned, so an unwritten output is visible if anyone looks.
            s.out.push(gpu.upload(&vec![f32::NAN; m * n])?);
        }
        Ok(s)
    }

    pub fn sets(&self) -> usize {
        self.inp.len()
    }

    /// Floating-point operations of one call.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// cuBLAS math modes compared against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BlasMode {
    /// Plain FP32 SGEMM (`CUBLAS_PEDANTIC_MATH`: no TF32 even if the
    /// environment asks for it).
    Fp32,
    /// `CUBLAS_TF32_TENSOR_OP_MATH`.
    Tf32,
    /// `CUBLAS_DEFAULT_MATH`, for [`Blas::gemm_bf16`] (bf16 tensor cores).
    Bf16,
}

/// A cuBLAS handle on the engine's stream, in one math mode.
pub struct Blas {
    pub blas: CudaBlas,
    pub mode: BlasMode,
}

impl Blas {
    pub fn new(gpu: &Gpu, mode: BlasMode) -> anyhow::Result<Self> {
        // SAFETY: cuBLAS queues its work on our own stream, ordered with ours.
        let stream = unsafe { gpu.stream() }.clone();
        let blas = CudaBlas::new(stream)?;
        let math = match mode {
            BlasMode::Fp32 => blas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
            BlasMode::Tf32 => blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            BlasMode::Bf16 => blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: the handle is live (owned by `blas`); the call only sets a mode.
        let status = unsafe { blas_sys::cublasSetMathMode(*blas.handle(), math) };
        anyhow::ensure!(
            status == blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            "cublasSetMathMode: {status:?}"
        );
        Ok(Self { blas, mode })
    }

    /// `out[m, n] = inp[m, k] · W[n, k]ᵀ` on row-major buffers. cuBLAS is
    /// column-major, so compute `outᵀ (n x m) = W · inpᵀ`: W's row-major
    /// buffer read column-major is Wᵀ (k x n), hence `transa = T`; inp's
    /// row-major buffer read column-major is already inpᵀ (k x m).
    pub fn gemm(
        &self,
        out: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            out.len() >= m * n && inp.len() >= m * k && w.len() >= n * k,
            "cuBLAS gemm: buffers too small"
        );
        let cfg = row_major_config(m, n, k, 1.0f32, 0.0);
        // SAFETY: sizes checked above match (m, n, k, lda, ldb, ldc).
        unsafe { self.blas.gemm(cfg, w, inp, out)? };
        Ok(())
    }

    /// [`Blas::gemm`] in bf16: bf16 `inp`, `w` and `out`, f32 accumulation
    /// (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`).
    pub fn gemm_bf16(
        &self,
        out: &mut CudaSlice<half::bf16>,
        inp: &CudaSlice<half::bf16>,
        w: &CudaSlice<half::bf16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            out.len() >= m * n && inp.len() >= m * k && w.len() >= n * k,
            "cuBLAS gemm: buffers too small"
        );
        let cfg = row_major_config(m, n, k, half::bf16::ONE, half::bf16::ZERO);
        // SAFETY: sizes checked above match (m, n, k, lda, ldb, ldc).
        unsafe { self.blas.gemm(cfg, w, inp, out)? };
        Ok(())
    }
}

/// The cuBLAS configuration of `out[m, n] = alpha · inp[m, k] · W[n, k]ᵀ
/// (+ beta · out)` on row-major buffers (see [`Blas::gemm`]).
fn row_major_config<T>(m: usize, n: usize, k: usize, alpha: T, beta: T) -> GemmConfig<T> {
    GemmConfig {
        transa: blas_sys::cublasOperation_t::CUBLAS_OP_T,
        transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha,
        lda: k as i32,
        ldb: k as i32,
        beta,
        ldc: n as i32,
    }
}

/// One result row: what ran, on which shape, how fast.
#[derive(Clone, Debug, Serialize)]
pub struct GemmResult {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub variant: String,
    /// "fp32", "tf32" or "bf16": which cuBLAS mode it is compared against.
    pub precision: &'static str,
    pub timing: Timing,
    pub tflops: f64,
    /// cuBLAS time / this time (> 1: faster than cuBLAS) in the same precision.
    pub vs_cublas: Option<f64>,
}

/// The tile shapes a sweep should try: every variant the GPU's module has.
pub fn tf32_variants(gpu: &Gpu) -> Vec<TileShape> {
    crate::gpu::ops::matmul_tf32::tf32_variants(gpu.has_wgmma())
}

/// One attention problem (`b` rows, `t` new positions, caches of `max_t`
/// positions, `c` channels) and its rotated operand sets: each set has its
/// own qkv, K and V caches and output, so consecutive calls never find the
/// previous call's cache in L2. Caches start filled with random values, so a
/// decode step (t = 1 at pos0 = max_t - 1) attends over a full cache.
pub struct AttnSets {
    pub qkv: Vec<CudaSlice<f32>>,
    pub k: Vec<CudaSlice<f32>>,
    pub v: Vec<CudaSlice<f32>>,
    /// The same caches in bf16 (the bf16 kernels').
    pub k16: Vec<CudaSlice<half::bf16>>,
    pub v16: Vec<CudaSlice<half::bf16>>,
    pub out: Vec<CudaSlice<f32>>,
}

impl AttnSets {
    pub fn new(gpu: &Gpu, b: usize, t: usize, max_t: usize, c: usize) -> Result<Self, GpuError> {
        /// q, k and v per token.
        const QKV: usize = 3;
        let (qkv_len, cache_len, out_len) = (b * t * QKV * c, b * max_t * c, b * t * c);
        let bytes = 4 * (qkv_len + 2 * cache_len + out_len);
        let sets = sets_for(bytes);
        let mut s = Self {
            qkv: vec![],
            k: vec![],
            v: vec![],
            k16: vec![],
            v16: vec![],
            out: vec![],
        };
        // One random cache uploaded per set would take long for 64 sets of
        // small shapes; values only need to be finite and varied, so the sets
        // share host data (the device buffers are still distinct).
        let (qkv, cache) = (fill_random(qkv_len, 11), fill_random(cache_len, 13));
        let cache16: Vec<half::bf16> = cache.iter().map(|&x| half::bf16::from_f32(x)).collect();
        for _ in 0..sets {
            s.qkv.push(gpu.upload(&qkv)?);
            s.k.push(gpu.upload(&cache)?);
            s.v.push(gpu.upload(&cache)?);
            s.k16.push(gpu.upload(&cache16)?);
            s.v16.push(gpu.upload(&cache16)?);
            s.out.push(gpu.upload(&vec![f32::NAN; out_len])?);
        }
        Ok(s)
    }

    pub fn sets(&self) -> usize {
        self.qkv.len()
    }
}
