//! Weight matrices on the device in either storage format: f32, or bf16
//! (the bf16 engine's, half the bytes). Kernels generic over the format
//! (`gpu_kernels::ops::weight`) take the bf16 ones as their bits (`u16`).

use cudarc::driver::CudaSlice;
use half::bf16;

use super::args::{in_ptr, out_ptr};
use super::kv_cache::KvCache;
use crate::Gpu;

/// A weight matrix the engine owns.
pub enum DeviceWeight {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

/// A borrowed weight matrix.
#[derive(Clone, Copy, Debug)]
pub enum WeightRef<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<bf16>),
}

impl DeviceWeight {
    pub fn as_ref(&self) -> WeightRef<'_> {
        match self {
            DeviceWeight::F32(w) => WeightRef::F32(w),
            DeviceWeight::Bf16(w) => WeightRef::Bf16(w),
        }
    }

    /// The f32 matrix, if it is stored so.
    pub fn f32(&self) -> Option<&CudaSlice<f32>> {
        match self {
            DeviceWeight::F32(w) => Some(w),
            DeviceWeight::Bf16(_) => None,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WeightRef<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            WeightRef::F32(w) => w.len(),
            WeightRef::Bf16(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of one element.
    pub fn elem_bytes(&self) -> usize {
        match self {
            WeightRef::F32(_) => size_of::<f32>(),
            WeightRef::Bf16(_) => size_of::<bf16>(),
        }
    }
}

/// A weight element type as the kernels see it: `f32`, or `u16` for bf16
/// bits. The fused decode kernels keep the KV cache in the same type.
pub trait KernelWeight: Copy + 'static {
    /// The device address of `w`'s elements, if `w` holds this type.
    fn ptr(gpu: &Gpu, w: WeightRef<'_>) -> Option<*const Self>;

    /// The device addresses of the K and V caches, if they hold this type.
    fn cache_ptrs(gpu: &Gpu, kv: &mut KvCache) -> Option<(*mut Self, *mut Self)>;
}

impl KernelWeight for f32 {
    fn ptr(gpu: &Gpu, w: WeightRef<'_>) -> Option<*const f32> {
        match w {
            WeightRef::F32(w) => Some(in_ptr(gpu, w)),
            WeightRef::Bf16(_) => None,
        }
    }

    fn cache_ptrs(gpu: &Gpu, kv: &mut KvCache) -> Option<(*mut f32, *mut f32)> {
        match kv {
            KvCache::F32(k, v) => Some((out_ptr(gpu, k), out_ptr(gpu, v))),
            KvCache::Bf16(..) => None,
        }
    }
}

impl KernelWeight for u16 {
    fn ptr(gpu: &Gpu, w: WeightRef<'_>) -> Option<*const u16> {
        match w {
            WeightRef::F32(_) => None,
            // bf16 and u16 have the same size and alignment.
            WeightRef::Bf16(w) => Some(in_ptr(gpu, w) as *const u16),
        }
    }

    fn cache_ptrs(gpu: &Gpu, kv: &mut KvCache) -> Option<(*mut u16, *mut u16)> {
        match kv {
            KvCache::F32(..) => None,
            KvCache::Bf16(k, v) => Some((out_ptr(gpu, k).cast(), out_ptr(gpu, v).cast())),
        }
    }
}
