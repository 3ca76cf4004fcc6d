//! The host side of `gpu-kernels`: load the PTX, launch kernels with their
//! parameter structs, and call GPT-2's ops on `cudarc` buffers.
//!
//! The role Rust-CUDA's `cust` plays, for the kernels of this workspace and
//! any other crate's:
//! - [`runtime`]: [`Gpu`] (one device, one stream, our PTX module loaded),
//!   [`Module`] (another crate's PTX, built with `kernel-builder`), typed
//!   launches of a `gpu_kernels::params::KernelParams` struct, allocation
//!   and copies with clear out-of-memory errors.
//! - [`ops`]: one safe wrapper per op (layernorm, matmul in FP32, TF32 and
//!   bf16, flash attention, softmax, GELU, residual, ...): each checks the
//!   buffer sizes, computes its launch configuration in one place and
//!   launches.
//! - [`shape`]: the sizes of an op's call as one value ([`MatmulShape`],
//!   [`RowShape`], [`EncoderShape`], [`AttentionShape`], [`KvCacheShape`]),
//!   shared with the ops' CPU twins.
//! - `nccl` (feature `nccl`): collectives (all-reduce, all-gather) across
//!   the GPUs of one process, on their [`Gpu`]s' streams.
//!
//! The PTX of `gpu-kernels` is compiled by this crate's build script
//! (through `kernel-builder`) and embedded: [`GPU_KERNELS_PTX`] for any GPU
//! from sm_80 on, [`GPU_KERNELS_SM90A_PTX`] with the Hopper-only kernels.
//!
//! ```no_run
//! use gpu_host::{Gpu, ops::gelu::gelu_forward};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::new(0)?;
//! let x = gpu.upload(&[0.5f32, -1.0, 2.0, 0.0])?;
//! let mut y = gpu.alloc::<f32>(4)?;
//! gelu_forward(&gpu, &mut y, &x, 4)?;
//! println!("{:?}", gpu.download(&y)?);
//! # Ok(())
//! # }
//! ```
//!
//! Where `unsafe` lives: [`runtime`]'s launch functions (a kernel trusts the
//! pointers inside its parameter struct), its raw device addresses
//! ([`runtime::dptr`]) and its driver calls without a safe cudarc API (PDL
//! launches, tensor maps). The op wrappers call those after checking every
//! buffer's length against what the kernel will touch.

#[cfg(feature = "nccl")]
pub mod nccl;
pub mod ops;
pub mod runtime;
pub mod shape;

pub use ops::kv_cache::KvElem;
pub use runtime::{Gpu, GpuError, Module, require_gpu_env, test_gpu};
pub use shape::{
    AttentionShape, DecodeAttentionShape, EncoderShape, KvCacheShape, KvRows, LayernormWeights, MatmulShape, RowShape,
    SampleShape, SplitSums,
};

/// The `cudarc` this crate is built on: buffers, launch configurations and
/// driver types, at the version the ops take.
pub use cudarc;

/// The `gpu-kernels` PTX module, for any GPU from sm_80 on (the build's
/// `GPU_KERNELS_ARCH`, default sm_80).
pub const GPU_KERNELS_PTX: &str = include_str!(env!("GPU_KERNELS_PTX_PATH"));

/// The same kernels plus the Hopper-only ones (`wgmma`, bulk copies),
/// compiled for sm_90a: it loads only on compute capability 9.0 (H100, H200).
pub const GPU_KERNELS_SM90A_PTX: &str = include_str!(env!("GPU_KERNELS_SM90A_PTX_PATH"));

/// Element type of a tensor in host memory (a checkpoint's), as the
/// conversion kernels (`ops::convert`) read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }
}
