//! The contract between host and kernels: for every kernel, its PTX name and
//! one `#[repr(C)]` struct of arguments, passed by value.
//!
//! This module compiles for the host too, so the host builds exactly the
//! struct the kernel reads. Device pointers are raw pointers here; the host
//! fills them with device addresses. One file per op, next to the op's
//! kernel module of the same name in `ops`.

/// Marker for kernel parameter structs.
///
/// # Safety
/// Implement only for `#[repr(C)]`, `Copy` structs made of plain numbers and
/// device pointers, whose layout is the same on host and device (both are
/// 64-bit little-endian, so that holds for such structs).
pub unsafe trait KernelParams: Copy {}

/// Implements [`KernelParams`] for parameter structs:
/// `kernel_params!(unsafe A, B<f32>)`. The `unsafe` is part of the syntax:
/// the caller promises the trait's contract for every type listed, as an
/// `unsafe impl` would (write the SAFETY comment above the call).
#[macro_export]
macro_rules! kernel_params {
    (unsafe $($t:ty),+ $(,)?) => {
        $(
            // SAFETY: promised by the caller, who wrote `unsafe`.
            unsafe impl $crate::params::KernelParams for $t {}
        )+
    };
}

/// The element types of a KV cache as the kernels take them: `f32`, or
/// bf16 bits (`u16`, the bf16 engine's: half the bytes). An op over the
/// cache has a kernel for each, the bf16 one named `..._bf16`; its
/// parameter struct is generic over the element.
pub trait CacheBits: Copy + 'static + cache_bits::Sealed {
    /// Whether the elements are bf16 bits.
    const BF16: bool;

    /// Of an op's two kernels, the one for these elements.
    fn kernel(f32_name: &'static str, bf16_name: &'static str) -> &'static str {
        if Self::BF16 { bf16_name } else { f32_name }
    }
}

mod cache_bits {
    /// Only the two element types the kernels are built for.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
}

impl CacheBits for f32 {
    const BF16: bool = false;
}

impl CacheBits for u16 {
    const BF16: bool = true;
}

/// Implements [`KernelParams`] for parameter structs generic over the
/// cache's element ([`CacheBits`]): `cache_kernel_params!(unsafe A, B)`,
/// the same promise as [`kernel_params!`] for every element type.
macro_rules! cache_kernel_params {
    (unsafe $($t:ident),+ $(,)?) => {
        $(
            // SAFETY: promised by the caller, who wrote `unsafe`: the
            // element type only names what the cache pointers point to.
            unsafe impl<K: $crate::params::CacheBits> $crate::params::KernelParams for $t<K> {}
        )+
    };
}
pub(crate) use cache_kernel_params;

pub mod saxpy;

/// Kernels of the sm_90a module launched with at most this many threads
/// per block, whose registers ptxas must fit to it (the build adds
/// `.maxntid`; see `gpu_kernel_builder::PtxBuilder::max_threads`).
pub const SM90A_MAX_THREADS: &[(&str, u32)] = &[
    (decode_step::DECODE_STEP, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_BF16, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_TRACED, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_BF16_TRACED, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_ROWS, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_ROWS_BF16, decode_step::DECODE_STEP_THREADS),
    (decode_step::DECODE_STEP_ROWS_TRACED, decode_step::DECODE_STEP_THREADS),
    (
        decode_step::DECODE_STEP_ROWS_BF16_TRACED,
        decode_step::DECODE_STEP_THREADS,
    ),
    (sample::SAMPLE_CLUSTER_FORWARD, sample::SAMPLE_BLOCK),
];

/// The `wgmma` matmul tiles of the sm_90a module, every family. The build
/// bounds each entry by its tile's threads and blocks an SM (`.maxntid`,
/// `.minnctapersm`: `gpu_kernel_builder::PtxBuilder::launch_bounds`), so
/// that registers beyond the block's share fail the build's ptxas check (a
/// spill) rather than the launch (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`:
/// unbounded, ptxas once gave the TF32 192x192 tile 141 registers, and
/// 416 threads may hold 128).
pub const SM90A_WGMMA_TILES: &[&[matmul_tf32::TileShape]] = &[
    &matmul_tf32::MATMUL_TF32_WGMMA_VARIANTS,
    &matmul_tf32::MATMUL_3XTF32_WGMMA_VARIANTS,
    &matmul_bf16::MATMUL_BF16_WGMMA_VARIANTS,
    &matmul_bf16::MATMUL_BF16_WGMMA_PERSISTENT,
];

/// Kernels of both modules whose blocks (of the given threads) must fit the
/// given number to an SM, registers included (the build adds `.maxntid` and
/// `.minnctapersm`; see `gpu_kernel_builder::PtxBuilder::launch_bounds`).
/// The 2-stage bf16 prefill attention: 256 threads need at most 128
/// registers each for two blocks an SM, which the host plans on (ptxas gave
/// it 130 without the bound: one block an SM). The 3-stage kernel takes 128
/// by itself and spills 16 bytes under the bound, so it goes without.
pub const LAUNCH_BOUNDS: &[(&str, u32, u32)] = &[(
    flash_attention::ATTENTION_FORWARD_FLASH_BF16_2STAGE,
    flash_attention::FLASH_TF32_THREADS,
    flash_attention::FLASH_BF16_BLOCKS_PER_SM,
)];
pub use saxpy::SaxpyParams;

/// PTX names of the kernels. Each op's file defines its own constants too;
/// these are the ones shared by tests.
pub mod names {
    pub use super::saxpy::SAXPY;
}
pub mod flash_attention;

// The forward pass (one file per op; import as `params::<op>::*`).
pub mod argmax;
pub mod attention;
pub mod convert;
pub mod crossentropy;
pub mod decode;
pub mod decode_step;
pub mod encoder;
pub mod gelu;
pub mod kv_cache;
pub mod layernorm;
pub mod matmul;
pub mod matmul_tf32;
pub mod residual;
pub mod softmax;

// GPU sampling: the rule shared by the kernel and its CPU twin, and the
// counter-based generator both draw from (host and device).
pub mod philox;
pub mod sample;
// bf16.
pub mod matmul_bf16;
