//! Context, stream, module and typed kernel launches.
//!
//! One invariant holds the memory safety of everything here together: all
//! work on our buffers goes to one stream, [`Gpu`]'s, so cudarc's per-buffer
//! event tracking between streams is switched off (it would only cost time).
//! The context and the stream are therefore private: safe code gets the
//! stream's operations as [`Gpu`] methods (copies, events, graph capture),
//! and the stream itself only through the `unsafe` [`Gpu::stream`], whose
//! contract forbids work on our buffers from any other stream.
//!
//! Where `unsafe` lives: [`Gpu::launch`]/[`Gpu::launch_in`]/[`Gpu::launch_pdl`]
//! (a kernel trusts the pointers inside its parameter struct), [`Gpu::stream`]
//! (above), and the driver calls without a safe cudarc API (PDL launches,
//! tensor maps, pinned memory), each with its SAFETY comment. [`dptr`] and
//! [`dptr_mut`] are safe: a raw device address is only dangerous in a launch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, DriverError, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use gpu_kernels::params::KernelParams;
use gpu_kernels::params::matmul_tf32::{TensorMap, WGMMA_OUT_BOX_BYTES};

/// Environment variable that makes "no GPU" a failure instead of a skip in tests.
pub const REQUIRE_GPU_ENV: &str = "GPT2_REQUIRE_GPU";
/// Environment variable that makes a Hopper GPU load the portable (sm_80)
/// module instead of the sm_90a one, e.g. to compare the two matmul engines
/// end to end.
pub const PORTABLE_KERNELS_ENV: &str = "GPT2_PORTABLE_KERNELS";
/// Environment variable that turns off [`Gpu::launch`]'s chaining of kernels
/// with PDL (to compare; see [`Gpu::set_chain_pdl`]): `1` for every kernel,
/// or a comma-separated list of the kernels to keep out of the chain.
pub const NO_CHAIN_PDL_ENV: &str = "GPT2_NO_CHAIN_PDL";
/// Environment variable that turns off the `wgmma` matmuls' TMA-store
/// epilogue (to compare; see [`Gpu::set_tma_store`]): `1` for every output,
/// `f32` for f32 outputs only. Their tiles are then stored element-wise, as
/// the last row of tiles always is.
pub const NO_TMA_STORE_ENV: &str = "GPT2_NO_TMA_STORE";
/// Environment variable (`1`) that turns off the persistent bf16 `wgmma`
/// tiles (to compare; see [`Gpu::set_persistent_gemm_blocks`]): every tile
/// then gets a block of its own.
pub const NO_PERSISTENT_GEMM_ENV: &str = "GPT2_NO_PERSISTENT_GEMM";
/// The compute capability the sm_90a module (with `wgmma`) runs on: PTX for
/// an architecture-specific target loads on exactly that architecture.
const SM90A_CAPABILITY: (i32, i32) = (9, 0);

/// Why the GPU could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded): this needs an NVIDIA GPU and its driver; use --cpu to run on the CPU"
    )]
    NoDriver,
    #[error("no CUDA device is available ({0}); use --cpu to run on the CPU")]
    NoDevice(String),
    #[error("GPU device {0} does not exist (this machine has {1})")]
    BadOrdinal(usize, i32),
    #[error("loading the PTX module failed: {0} (is the driver older than the PTX version?)")]
    ModuleLoad(DriverError),
    #[error("kernel `{0}` is not in the PTX module")]
    MissingKernel(&'static str),
    #[error("out of GPU memory: {0} bytes were requested ({1})")]
    OutOfMemory(usize, DriverError),
    #[error("CUDA error in {0}: {1}")]
    Driver(&'static str, DriverError),
}

/// `Ok` when the CUDA error is `CUDA_SUCCESS`, else [`GpuError::Driver`] naming the call.
pub trait CudaContextExt<T> {
    fn ctx(self, what: &'static str) -> Result<T, GpuError>;
}

impl<T> CudaContextExt<T> for Result<T, DriverError> {
    fn ctx(self, what: &'static str) -> Result<T, GpuError> {
        self.map_err(|e| GpuError::Driver(what, e))
    }
}

/// Kernel parameters travel to the driver as the struct's bytes.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct ParamBlock<P>(P);
// SAFETY: `KernelParams` promises a repr(C) plain-data struct with the same
// layout on host and device, which is what DeviceRepr requires.
unsafe impl<P: KernelParams> DeviceRepr for ParamBlock<P> {}

/// One GPU: its context, the stream all our work goes to, and the kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    /// A non-default stream: work on it can be captured into CUDA graphs.
    pub(crate) stream: Arc<CudaStream>,
    /// The `gpu-kernels` PTX module.
    kernels: Module,
    /// Whether `kernels` is the sm_90a build, which has the `wgmma` matmuls.
    wgmma: bool,
    /// Tensor maps already encoded and uploaded (see [`Gpu::tensor_map_2d`]).
    tensor_maps: Mutex<TensorMapCache>,
    /// Dynamic shared-memory limits already raised, per kernel of `kernels`.
    shared_limits: Mutex<HashMap<&'static str, u32>>,
    /// Multiprocessors of the device, read once (launch configurations use it).
    sm_count: usize,
    /// L2 bytes (the decode step's prefetch distance is bounded by it).
    l2_bytes: usize,
    /// Dynamic shared memory a block may opt in to.
    max_shared_optin: usize,
    /// Kernels of `kernels` that start with the PDL wait
    /// (`device::grid_dependency_sync`), found in the PTX; empty for the
    /// portable module, where the wait compiles to nothing.
    chainable: HashSet<String>,
    /// Whether [`Gpu::launch`] chains the `chainable` kernels with PDL.
    chain_pdl: AtomicBool,
    /// Whether the `wgmma` matmuls store their tiles through the copy engine
    /// (see [`Gpu::tma_store`]): bf16 outputs, f32 outputs.
    tma_store: [AtomicBool; 2],
    /// The most blocks of a persistent `wgmma` launch, 0 for none (see
    /// [`Gpu::persistent_gemm_blocks`]).
    persistent_blocks: AtomicUsize,
}

impl Gpu {
    /// Open device `ordinal` and load the `gpu-kernels` PTX into it.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(|e| GpuError::NoDevice(e.to_string()))?;
        if count == 0 {
            return Err(GpuError::NoDevice("the driver reports 0 devices".into()));
        }
        if ordinal >= count as usize {
            return Err(GpuError::BadOrdinal(ordinal, count));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::NoDevice(e.to_string()))?;
        // One stream, so cudarc's per-buffer event tracking only costs time.
        // SAFETY: every buffer of ours is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().ctx("cuStreamCreate")?;
        use cudarc::driver::sys::CUdevice_attribute as Attr;
        let attr = |a| ctx.attribute(a).ctx("cuDeviceGetAttribute");
        let capability = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let portable = env_flag(PORTABLE_KERNELS_ENV);
        let wgmma = capability == SM90A_CAPABILITY && !portable;
        let ptx = if wgmma {
            crate::GPU_KERNELS_SM90A_PTX
        } else {
            crate::GPU_KERNELS_PTX
        };
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(GpuError::ModuleLoad)?;
        let sm_count = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let l2_bytes = attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as usize;
        let max_shared_optin = attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as usize;
        let mut chainable = if wgmma {
            kernels_waiting_first(ptx)
        } else {
            HashSet::new()
        };
        unchain(&mut chainable, &std::env::var(NO_CHAIN_PDL_ENV).unwrap_or_default());
        Ok(Self {
            ctx,
            stream,
            sm_count,
            l2_bytes,
            max_shared_optin,
            wgmma,
            chain_pdl: AtomicBool::new(!chainable.is_empty()),
            chainable,
            tma_store: tma_store_from_env(),
            persistent_blocks: AtomicUsize::new(if env_flag(NO_PERSISTENT_GEMM_ENV) { 0 } else { sm_count }),
            tensor_maps: Mutex::new(TensorMapCache::default()),
            shared_limits: Mutex::new(HashMap::new()),
            kernels: Module::new(module),
        })
    }

    /// The device address of a tensor map for TMA copies of `box_rows x
    /// box_cols` boxes, with the 128-byte swizzle, out of the row-major
    /// matrix of `rows x cols` elements of `elem` at device address `ptr`
    /// (out-of-range parts of a box read as zeros). Encoded and uploaded once
    /// per distinct request, then served from a cache: a map holds only the
    /// address and shape, so it stays valid for any buffer later allocated
    /// at `ptr`. `ptr` must be 16-byte aligned and a row's bytes a multiple
    /// of 16; a box row at most 128 bytes.
    pub fn tensor_map_2d(
        &self,
        elem: TensorElem,
        ptr: u64,
        rows: usize,
        cols: usize,
        box_rows: u32,
        box_cols: u32,
    ) -> Result<*const TensorMap, GpuError> {
        let key = (elem, ptr, rows, cols, box_rows, box_cols);
        let mut cache = self.tensor_maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&addr) = cache.maps.get(&key) {
            return Ok(addr as *const TensorMap);
        }
        if cache.maps.len() >= TENSOR_MAP_CACHE_LIMIT {
            // Kernels queued earlier may still read the old maps.
            self.synchronize()?;
            *cache = TensorMapCache::default();
        }
        let map = encode_tensor_map_2d(elem, ptr, rows, cols, box_rows, box_cols)?;
        if cache.used == TENSOR_MAPS_PER_CHUNK || cache.chunks.is_empty() {
            let chunk = self.alloc::<DeviceTensorMap>(TENSOR_MAPS_PER_CHUNK)?;
            cache.chunks.push(chunk);
            cache.used = 0;
        }
        let slot = cache.used;
        let chunk = cache.chunks.last_mut().expect("a chunk was just ensured");
        let mut view = chunk.slice_mut(slot..slot + 1);
        self.stream
            .memcpy_htod(&[DeviceTensorMap(map)], &mut view)
            .ctx("cuMemcpyHtoD (tensor map)")?;
        let addr = dptr(chunk) as u64 + (slot * std::mem::size_of::<TensorMap>()) as u64;
        cache.used += 1;
        cache.maps.insert(key, addr);
        Ok(addr as *const TensorMap)
    }

    /// The map a `wgmma` matmul stores its whole tiles through (the
    /// TMA-store epilogue): boxes of [`WGMMA_OUT_BOX_BYTES`] of a row by
    /// `box_rows` (the tile's rows) over all `rows` of the output buffer at
    /// `ptr` (at least the launch's m; the kernel stores only tiles below
    /// m), `cols` elements of `elem` a row. Null, for the element-wise
    /// epilogue, while [`Gpu::tma_store`] is off for `elem` or where the
    /// copy engine cannot address the buffer: `ptr` and each row's bytes
    /// must be 16-byte multiples. Whether a launch may take it at all (no
    /// split-K; no persistent twin with KV caches) is the caller's to decide.
    pub fn wgmma_out_map(
        &self,
        elem: TensorElem,
        ptr: u64,
        rows: usize,
        cols: usize,
        box_rows: u32,
    ) -> Result<*const TensorMap, GpuError> {
        if !self.wgmma_out_mappable(elem, ptr, cols) {
            return Ok(std::ptr::null());
        }
        let box_cols = WGMMA_OUT_BOX_BYTES / elem.size() as u32;
        self.tensor_map_2d(elem, ptr, rows, cols, box_rows, box_cols)
    }

    /// Whether [`Gpu::wgmma_out_map`] gives a map (not null) for an output
    /// at `ptr` of `cols` elements of `elem` a row: the TMA-store switch is
    /// on for `elem`, and `ptr` and the row's bytes are 16-byte multiples.
    pub fn wgmma_out_mappable(&self, elem: TensorElem, ptr: u64, cols: usize) -> bool {
        let aligned = ptr.is_multiple_of(TMA_ALIGN as u64) && (cols * elem.size()).is_multiple_of(TMA_ALIGN);
        self.tma_store(elem) && aligned
    }

    /// Whether the loaded kernels include the Hopper `wgmma` matmuls (the
    /// sm_90a module, loaded on compute capability 9.0 unless
    /// [`PORTABLE_KERNELS_ENV`] is set).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// The device's ordinal (as given to [`Gpu::new`]).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Number of multiprocessors (SMs) of the device.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Bytes of the device's L2 cache.
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    /// A kernel of the module by name (looked up once, then cached).
    pub fn function(&self, name: &'static str) -> Result<CudaFunction, GpuError> {
        self.kernels.function(name)
    }

    /// Launch kernel `name` with its parameter struct, on [`Gpu::stream`].
    ///
    /// # Safety
    /// `name` must be the kernel whose parameter type is `P`; every pointer in
    /// `params` must be a live device allocation of this context large enough
    /// for what the kernel reads and writes under `cfg` (the op wrappers in
    /// `ops` check those sizes before calling this); `cfg` must respect
    /// the kernel's block-size and shared-memory assumptions.
    ///
    /// A kernel that starts with the PDL wait (`device::grid_dependency_sync`)
    /// is launched with PDL while [`Gpu::chain_pdl`] is on: its launch and
    /// its weight loads overlap the previous kernel's tail.
    pub unsafe fn launch<P: KernelParams>(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        params: P,
    ) -> Result<(), GpuError> {
        if self.chained(name) {
            // SAFETY: forwarded; the kernel waits on its dependency before it
            // reads or writes anything an earlier kernel touches (its PTX
            // starts with the wait, and `grid_dependency_sync`'s contract).
            return unsafe { self.launch_pdl(name, cfg, params, true) };
        }
        // SAFETY: forwarded from this function's contract (`name` is a kernel
        // of the `gpu-kernels` module).
        unsafe { self.launch_in(&self.kernels, name, cfg, params) }
    }

    /// Whether [`Gpu::launch`] chains kernels with PDL (on by default where
    /// the sm_90a module is loaded, unless [`NO_CHAIN_PDL_ENV`] is set).
    pub fn chain_pdl(&self) -> bool {
        self.chain_pdl.load(Ordering::Relaxed)
    }

    /// Whether the `wgmma` matmuls (TF32, 3xTF32 and bf16, unsplit) with an
    /// output of `elem` get a tensor map of it and store whole tiles through
    /// the copy engine (on unless [`NO_TMA_STORE_ENV`] says otherwise).
    pub fn tma_store(&self, elem: TensorElem) -> bool {
        self.tma_store[usize::from(elem == TensorElem::F32)].load(Ordering::Relaxed)
    }

    /// Turn the `wgmma` matmuls' TMA-store epilogue on or off for every
    /// output type (tests run both paths; the results are the same bits).
    pub fn set_tma_store(&self, on: bool) {
        for flag in &self.tma_store {
            flag.store(on, Ordering::Relaxed);
        }
    }

    /// The most blocks a persistent bf16 `wgmma` launch may have (each looping
    /// over output tiles), or `None` while those tiles are off. By default
    /// one an SM, unless [`NO_PERSISTENT_GEMM_ENV`] is set. Only launches
    /// with an output map ([`Gpu::wgmma_out_map`]) go persistent.
    pub fn persistent_gemm_blocks(&self) -> Option<usize> {
        match self.persistent_blocks.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        }
    }

    /// Set [`Gpu::persistent_gemm_blocks`]: `None` turns the persistent tiles
    /// off, `Some(b)` allows up to `b` blocks (at most one an SM, and at
    /// least one); tests pass a few, so that blocks loop over many tiles.
    pub fn set_persistent_gemm_blocks(&self, blocks: Option<usize>) {
        let b = blocks.map_or(0, |b| b.clamp(1, self.sm_count));
        self.persistent_blocks.store(b, Ordering::Relaxed);
    }

    /// Whether [`Gpu::launch`] (and [`Gpu::launch_cluster`]) launch kernel
    /// `name` with PDL now: chaining is on and its PTX waits first.
    fn chained(&self, name: &str) -> bool {
        self.chain_pdl() && self.chainable.contains(name)
    }

    /// Turn [`Gpu::launch`]'s PDL chaining on or off; it stays off where no
    /// loaded kernel waits on its dependency. The GPT-2 engine sets it for
    /// each of its forward calls (by their size), within what the GPU
    /// allowed when the engine was made.
    pub fn set_chain_pdl(&self, on: bool) {
        self.chain_pdl
            .store(on && !self.chainable.is_empty(), Ordering::Relaxed);
    }

    /// [`Gpu::launch`] with programmatic dependent launch (PDL) when `pdl`:
    /// the kernel may start while the previous kernel on the stream is still
    /// running, and must call `device::grid_dependency_wait` before touching
    /// anything an earlier kernel writes. Through `cuLaunchKernelEx` with
    /// programmatic stream serialisation (cudarc has no safe API for launch
    /// attributes); stream capture turns it into a programmatic graph edge.
    /// Without `pdl` this is [`Gpu::launch`].
    ///
    /// # Safety
    /// As for [`Gpu::launch`]; with `pdl`, the kernel also keeps the PDL
    /// contract above (the `ops::decode` kernels do).
    pub unsafe fn launch_pdl<P: KernelParams>(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        params: P,
        pdl: bool,
    ) -> Result<(), GpuError> {
        if !pdl {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.launch_in(&self.kernels, name, cfg, params) };
        }
        // SAFETY: forwarded from this function's contract; the kernel keeps
        // the PDL contract.
        unsafe { self.launch_ex(name, cfg, params, &mut [programmatic_serialization()]) }
    }

    /// [`Gpu::launch`] in thread block clusters of `cluster` blocks along x
    /// (sm_90 and later; `cfg.grid_dim.0` a multiple of `cluster`): the
    /// cluster-dimension launch attribute through `cuLaunchKernelEx` (cudarc
    /// has no safe API for it), plus PDL as [`Gpu::launch`] would chain it.
    ///
    /// # Safety
    /// As for [`Gpu::launch`]; the kernel expects clusters of this shape.
    pub unsafe fn launch_cluster<P: KernelParams>(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        cluster: u32,
        params: P,
    ) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        let clusters = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster, y: 1, z: 1 },
            },
        };
        let mut attrs = [clusters, programmatic_serialization()];
        let attrs = if self.chained(name) {
            &mut attrs[..]
        } else {
            &mut attrs[..1]
        };
        // SAFETY: forwarded from this function's contract; PDL only for a
        // kernel whose PTX waits first (`chainable`).
        unsafe { self.launch_ex(name, cfg, params, attrs) }
    }

    /// `cuLaunchKernelEx` of kernel `name` on [`Gpu::stream`] with launch
    /// attributes `attrs` (cudarc has no safe API for them).
    ///
    /// # Safety
    /// As for [`Gpu::launch`], and the kernel keeps what each attribute
    /// asks of it (PDL: it waits before touching what earlier kernels
    /// write; clusters: it expects that cluster shape).
    unsafe fn launch_ex<P: KernelParams>(
        &self,
        name: &'static str,
        cfg: LaunchConfig,
        params: P,
        attrs: &mut [cudarc::driver::sys::CUlaunchAttribute],
    ) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        let f = self.function(name)?;
        let mut block = ParamBlock(params);
        let mut args = [&mut block as *mut ParamBlock<P> as *mut std::ffi::c_void];
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: `config`, `attrs`, `args` and `block` outlive the call (the
        // driver copies the parameters at launch); `args` holds one pointer
        // to the kernel's single by-value parameter, the struct `P`, as the
        // kernel's signature says (this function's contract); the function
        // belongs to this context's module.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .ctx(name)?;
        Ok(())
    }

    /// Blocks of kernel `name` one SM holds at once with `threads` threads and
    /// `shared_bytes` of dynamic shared memory (the driver's occupancy
    /// calculator), at least 1.
    pub fn resident_blocks_per_sm(&self, name: &'static str, threads: u32, shared_bytes: u32) -> Result<u32, GpuError> {
        Ok(self.occupancy_blocks_per_sm(name, threads, shared_bytes)?.max(1))
    }

    /// Blocks of kernel `name` one SM holds at once (the driver's occupancy
    /// calculator), 0 when one does not fit.
    pub fn occupancy_blocks_per_sm(
        &self,
        name: &'static str,
        threads: u32,
        shared_bytes: u32,
    ) -> Result<u32, GpuError> {
        let f = self.function(name)?;
        f.occupancy_max_active_blocks_per_multiprocessor(threads, shared_bytes as usize, None)
            .ctx("cuOccupancyMaxActiveBlocksPerMultiprocessor")
    }

    /// The most dynamic shared memory one block may ask for (after raising
    /// a kernel's limit, `set_max_dynamic_shared`).
    pub fn max_shared_per_block(&self) -> usize {
        self.max_shared_optin
    }

    /// Raise a kernel's dynamic shared-memory limit above the default 48 KiB.
    /// Remembered per kernel, so the driver is asked once, not every launch.
    pub fn set_max_dynamic_shared(&self, name: &'static str, bytes: u32) -> Result<(), GpuError> {
        let mut set = self.shared_limits.lock().unwrap_or_else(|p| p.into_inner());
        if set.get(name).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        let f = self.function(name)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .ctx("cuFuncSetAttribute")?;
        set.insert(name, bytes);
        Ok(())
    }

    /// Allocate `n` elements, reporting out-of-memory clearly.
    pub fn alloc<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, GpuError> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| GpuError::OutOfMemory(n * std::mem::size_of::<T>(), e))
    }

    /// Page-locked host memory of `n` zeroed `u32`s: device-to-host copies
    /// into it are asynchronous (the slice's event says when one landed).
    pub fn alloc_pinned_u32(&self, n: usize) -> Result<PinnedHostSlice<u32>, GpuError> {
        // SAFETY: the memory is zeroed below before anything reads it; no
        // flags: plain pinned memory the host reads back (not write-combined).
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u32>(n.max(1), 0) }
            .map_err(|e| GpuError::OutOfMemory(n * std::mem::size_of::<u32>(), e))?;
        host.as_mut_slice()
            .map_err(|e| GpuError::OutOfMemory(n * std::mem::size_of::<u32>(), e))?
            .fill(0);
        Ok(host)
    }

    /// Copy host data to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, GpuError> {
        self.stream
            .clone_htod(data)
            .map_err(|e| GpuError::OutOfMemory(std::mem::size_of_val(data), e))
    }

    /// Copy a device buffer to a new host vector (synchronises the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>, GpuError> {
        self.stream.clone_dtoh(buf).ctx("cuMemcpyDtoH")
    }

    /// Wait for all queued work; surfaces asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().ctx("cuStreamSynchronize")
    }

    /// The stream all our work goes to, for libraries that take one (cuBLAS
    /// in the benchmarks and tests).
    ///
    /// # Safety
    /// Work queued on it is ordered with ours, which is the point. Do not use
    /// it, or its context, to create other streams that touch buffers used
    /// on this one: event tracking between streams is off (module docs), so
    /// nothing would order them.
    pub unsafe fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copy host values into a device buffer (asynchronous for pinned
    /// sources). `dst` must hold at least `src.len()` values: an error, not
    /// cudarc's panic, otherwise.
    pub fn memcpy_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        fits(src.len(), dst.len())?;
        self.stream.memcpy_htod(src, dst)
    }

    /// Copy a device buffer into host memory (asynchronous into pinned
    /// memory: record an event and wait on it before reading). `dst` must
    /// hold at least `src.len()` values.
    pub fn memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>, Dst: HostSlice<T> + ?Sized>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        fits(src.len(), dst.len())?;
        self.stream.memcpy_dtoh(src, dst)
    }

    /// Copy between device buffers. `dst` must hold at least `src.len()` values.
    pub fn memcpy_dtod<T, Src: DevicePtr<T>, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        fits(src.len(), dst.len())?;
        self.stream.memcpy_dtod(src, dst)
    }

    /// A device buffer's values in a new vector (synchronises the stream).
    pub fn clone_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(&self, src: &Src) -> Result<Vec<T>, DriverError> {
        self.stream.clone_dtoh(src)
    }

    /// A new event, nothing recorded yet.
    pub fn new_event(&self) -> Result<CudaEvent, DriverError> {
        self.ctx.new_event(None)
    }

    /// Record `event` at this point of the stream.
    pub fn record(&self, event: &CudaEvent) -> Result<(), DriverError> {
        event.record(&self.stream)
    }

    /// A new event recorded at this point of the stream (for timing: pass
    /// `CU_EVENT_DEFAULT`).
    pub fn record_event(&self, flags: Option<CUevent_flags>) -> Result<CudaEvent, DriverError> {
        self.stream.record_event(flags)
    }

    /// Start capturing the stream's work into a graph (the stream must be idle).
    pub fn begin_capture(&self, mode: CUstreamCaptureMode) -> Result<(), DriverError> {
        self.stream.begin_capture(mode)
    }

    /// End the capture [`Gpu::begin_capture`] started: the instantiated
    /// graph, or `None` when nothing was captured.
    pub fn end_capture(&self, flags: CUgraphInstantiate_flags) -> Result<Option<CudaGraph>, DriverError> {
        self.stream.end_capture(flags)
    }

    /// A device attribute (compute capability, SM count, ...).
    pub fn attribute(&self, attr: cudarc::driver::sys::CUdevice_attribute) -> Result<i32, DriverError> {
        self.ctx.attribute(attr)
    }
}

/// A PTX module in a [`Gpu`]'s context, its kernels looked up once: the
/// `gpu-kernels` module every `Gpu` holds, or a further one with kernels of
/// another crate (such as a kernel crate built with `kernel-builder`), loaded with
/// [`Gpu::load_module`] and launched with [`Gpu::launch_in`].
pub struct Module {
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
}

impl Module {
    fn new(module: Arc<CudaModule>) -> Module {
        Module {
            module,
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// A kernel of this module by name (looked up once, then cached).
    pub fn function(&self, name: &'static str) -> Result<CudaFunction, GpuError> {
        let mut fns = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = fns.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module
            .load_function(name)
            .map_err(|_| GpuError::MissingKernel(name))?;
        fns.insert(name, f.clone());
        Ok(f)
    }
}

impl Gpu {
    /// Load another PTX module into this GPU's context (the driver
    /// JIT-compiles it); its kernels share the context and [`Gpu::stream`].
    pub fn load_module(&self, ptx: &str) -> Result<Module, GpuError> {
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(GpuError::ModuleLoad)?;
        Ok(Module::new(module))
    }

    /// [`Gpu::launch`] for a kernel of `module`.
    ///
    /// # Safety
    /// As for [`Gpu::launch`]: `name` is the kernel of `module` whose
    /// parameter type is `P`, the pointers in `params` are live allocations of
    /// this context large enough for the kernel under `cfg`.
    pub unsafe fn launch_in<P: KernelParams>(
        &self,
        module: &Module,
        name: &'static str,
        cfg: LaunchConfig,
        params: P,
    ) -> Result<(), GpuError> {
        let f = module.function(name)?;
        let block = ParamBlock(params);
        let mut args = self.stream.launch_builder(&f);
        args.arg(&block);
        // SAFETY: forwarded from this function's contract.
        unsafe { args.launch(cfg) }.ctx(name)?;
        Ok(())
    }
}

/// Whether environment variable `name` is set to something other than "" or "0".
/// The TMA-store switches (bf16 outputs, f32 outputs) [`NO_TMA_STORE_ENV`]
/// leaves on.
fn tma_store_from_env() -> [AtomicBool; 2] {
    let (bf16, f32) = match std::env::var(NO_TMA_STORE_ENV).unwrap_or_default().trim() {
        "" | "0" => (true, true),
        "f32" => (true, false),
        _ => (false, false),
    };
    [AtomicBool::new(bf16), AtomicBool::new(f32)]
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The launch attribute that lets a kernel start while the previous one on
/// its stream finishes (PDL: programmatic stream serialisation).
fn programmatic_serialization() -> cudarc::driver::sys::CUlaunchAttribute {
    use cudarc::driver::sys;
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    }
}

/// Take kernels out of the PDL chain as [`NO_CHAIN_PDL_ENV`]'s `value`
/// says: "" or "0" none, "1" all, otherwise the comma-separated names.
fn unchain(chainable: &mut HashSet<String>, value: &str) {
    match value.trim() {
        "" | "0" => {}
        "1" => chainable.clear(),
        names => {
            for name in names.split(',') {
                chainable.remove(name.trim());
            }
        }
    }
}

/// The kernels of a PTX module whose body issues `griddepcontrol.wait`
/// before anything else that touches memory, so they may be launched with
/// PDL (`device::grid_dependency_sync` at their start). An entry's body runs
/// from its `.entry` line to the first line that is a lone `}`. Loads of a
/// kernel's weights may come first (they are never written by a kernel):
/// what counts is that no store and no atomic precedes the wait, and no
/// load other than `ld.param` and `cp.async` (the weight prefetch of the
/// matmuls) does.
fn kernels_waiting_first(ptx: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix(".visible .entry ") else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        for body in lines.by_ref() {
            let op = body.trim_start();
            if body == "}" {
                break;
            }
            if op.starts_with("griddepcontrol.wait") {
                found.insert(name.clone());
                // Skip the rest of this entry.
                for rest in lines.by_ref() {
                    if rest == "}" {
                        break;
                    }
                }
                break;
            }
            let touches_memory = op.starts_with("st.")
                || op.starts_with("atom.")
                || op.starts_with("red.")
                || op.starts_with("cp.async.bulk")
                || (op.starts_with("ld.") && !op.starts_with("ld.param"));
            if touches_memory {
                break;
            }
        }
    }
    found
}

/// Alignment the copy engine needs of a tensor map's base address and of
/// its row stride (`cuTensorMapEncodeTiled`).
const TMA_ALIGN: usize = 16;

/// Tensor maps per device allocation of the cache.
const TENSOR_MAPS_PER_CHUNK: usize = 256;
/// Distinct maps kept before the cache starts over (after a synchronize).
const TENSOR_MAP_CACHE_LIMIT: usize = 16 * TENSOR_MAPS_PER_CHUNK;

/// Tensor maps in device memory, keyed by (address, rows, cols, box rows,
/// box cols); filled chunk by chunk.
#[derive(Default)]
struct TensorMapCache {
    maps: HashMap<(TensorElem, u64, usize, usize, u32, u32), u64>,
    chunks: Vec<CudaSlice<DeviceTensorMap>>,
    used: usize,
}

/// A tensor map as device memory holds it.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct DeviceTensorMap(TensorMap);
// SAFETY: TensorMap is 128 plain bytes (repr(C, align(64))), valid as zero bits.
unsafe impl DeviceRepr for DeviceTensorMap {}
// SAFETY: as above: all-zero bytes are a (null) tensor map.
unsafe impl cudarc::driver::ValidAsZeroBits for DeviceTensorMap {}

/// The element type of a matrix a tensor map describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorElem {
    F32,
    Bf16,
}

impl TensorElem {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            TensorElem::F32 => 4,
            TensorElem::Bf16 => 2,
        }
    }
}

/// `cuTensorMapEncodeTiled` for a row-major matrix, 128-byte swizzle.
fn encode_tensor_map_2d(
    elem: TensorElem,
    ptr: u64,
    rows: usize,
    cols: usize,
    box_rows: u32,
    box_cols: u32,
) -> Result<TensorMap, GpuError> {
    use cudarc::driver::sys;
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // Innermost dimension first; the stride of dimension 0 is implicit.
    let dims = [cols as u64, rows as u64];
    let strides = [(cols * elem.size()) as u64];
    let dtype = match elem {
        TensorElem::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        TensorElem::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    };
    let boxes = [box_cols, box_rows];
    let element_strides = [1u32, 1];
    // SAFETY: every pointer argument points to a live local array of the
    // length the rank (2) implies; the driver only reads them and writes `map`.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().ctx("cuTensorMapEncodeTiled")?;
    Ok(TensorMap(map.opaque))
}

/// `Err(CUDA_ERROR_INVALID_VALUE)` when `have` values do not fit in `room`.
fn fits(have: usize, room: usize) -> Result<(), DriverError> {
    if have <= room {
        Ok(())
    } else {
        Err(DriverError(
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
        ))
    }
}

/// The device address of a buffer, as a kernel parameter struct carries it.
pub fn dptr<T>(buf: &CudaSlice<T>) -> *const T {
    let (p, _sync) = buf.device_ptr(buf.stream());
    p as *const T
}

/// The device address of a buffer the kernel will write.
pub fn dptr_mut<T>(buf: &mut CudaSlice<T>) -> *mut T {
    let stream = buf.stream().clone();
    let (p, _sync) = buf.device_ptr_mut(&stream);
    p as *mut T
}

/// True when the environment says GPU tests must not skip.
pub fn require_gpu_env() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// For GPU tests: the GPU, or `None` after printing why the test is skipped.
/// Panics (fails the test) instead of skipping when `GPT2_REQUIRE_GPU=1`.
pub fn test_gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) if require_gpu_env() => panic!("{REQUIRE_GPU_ENV} is set but the GPU is unusable: {e}"),
        Err(e) => {
            eprintln!("skipped: no usable GPU ({e})");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{kernels_waiting_first, unchain};
    use std::collections::HashSet;

    /// The kernels of the engine's forward pass that `Gpu::launch` chains
    /// with PDL on Hopper: each must start with the wait in the sm_90a PTX.
    const CHAINED: [&str; 14] = [
        "encoder_forward",
        "layernorm_forward",
        "residual_layernorm_forward",
        "residual_layernorm_split_forward",
        "matmul_forward_3xtf32_32x64",
        "matmul_forward_3xtf32_64x64",
        "matmul_split_reduce",
        "matmul_forward_bf16_wgmma_128x128",
        "matmul_forward_tf32_wgmma_128x256",
        "kv_cache_store",
        "gelu_forward",
        "attention_forward_flash_tf32",
        "sample_forward",
        "sample_forward_cluster",
    ];

    #[test]
    fn the_forward_kernels_wait_first_in_the_sm90a_module() {
        let found = kernels_waiting_first(crate::GPU_KERNELS_SM90A_PTX);
        for name in CHAINED {
            assert!(found.contains(name), "{name} does not start with griddepcontrol.wait");
        }
        // The decode GEMV loads its first weights before the wait with plain
        // loads: it is launched with PDL by its own flag, never chained.
        assert!(!found.contains("decode_gemv"));
        // Kept out of the chain on purpose (slower chained, see the kernel).
        assert!(!found.contains("matmul_forward_small"));
    }

    #[test]
    fn no_chain_pdl_takes_all_none_or_the_named_kernels() {
        let all = || -> HashSet<String> { ["a_kernel", "b_kernel"].map(String::from).into() };
        for (value, left) in [
            ("", vec!["a_kernel", "b_kernel"]),
            ("0", vec!["a_kernel", "b_kernel"]),
            ("1", vec![]),
            ("a_kernel", vec!["b_kernel"]),
            (" b_kernel , a_kernel ", vec![]),
        ] {
            let mut set = all();
            unchain(&mut set, value);
            let mut left_now: Vec<_> = set.into_iter().collect();
            left_now.sort();
            assert_eq!(left_now, left, "GPT2_NO_CHAIN_PDL={value:?}");
        }
    }

    #[test]
    fn the_portable_module_has_no_waits() {
        assert!(kernels_waiting_first(crate::GPU_KERNELS_PTX).is_empty());
    }

    #[test]
    fn a_store_or_load_before_the_wait_disqualifies_a_kernel() {
        let ptx = "\
.visible .entry good(
\t.param .align 8 .b8 good_param_0[8]
)
{
\tld.param.u64 \t%rd1, [good_param_0];
\tcp.async.cg.shared.global [%r1], [%rd1], 16;
\tgriddepcontrol.wait;
\tst.global.f32 \t[%rd1], %f1;
}
.visible .entry stores_first(
)
{
\tst.global.f32 \t[%rd1], %f1;
\tgriddepcontrol.wait;
}
.visible .entry loads_first(
)
{
\tld.global.nc.f32 \t%f1, [%rd1];
\tgriddepcontrol.wait;
}
.visible .entry never(
)
{
\tret;
}
";
        let found = kernels_waiting_first(ptx);
        assert_eq!(found.into_iter().collect::<Vec<_>>(), vec!["good".to_string()]);
    }
}
