//! Parameter structs and PTX names of the device-layer test kernels,
//! compiled for host and device alike.

/// `test_shfl_xor`: row `k < 32` of each output is `shfl_xor(inp, k)`, row
/// [`SHFL_LANE_ARG_ROW`] uses the per-lane `lane_arg[i]`.
pub const SHFL_XOR: &str = "test_shfl_xor";
/// `test_shfl_down`, laid out as [`SHFL_XOR`].
pub const SHFL_DOWN: &str = "test_shfl_down";
/// `test_shfl_idx`, laid out as [`SHFL_XOR`].
pub const SHFL_IDX: &str = "test_shfl_idx";
/// `test_warp_reduce`: every lane writes its warp's results.
pub const WARP_REDUCE: &str = "test_warp_reduce";
/// `test_block_reduce`: every thread writes its block's results.
pub const BLOCK_REDUCE: &str = "test_block_reduce";
/// `test_math`: row `f` of `out` is math function `f` (`MATH_*`) of `inp`.
pub const MATH: &str = "test_math";
/// `test_dynamic_shared`: a block-reversing round trip through shared memory.
pub const DYNAMIC_SHARED: &str = "test_dynamic_shared";
/// `test_mma_tf32`: one m16n8k8 TF32 tile per warp.
pub const MMA_TF32: &str = "test_mma_tf32";
/// `test_cp_async`: global -> shared by `cp.async`, shared -> global.
pub const CP_ASYNC: &str = "test_cp_async";

/// Rows 0..32 take a uniform lane argument equal to the row number.
pub const SHFL_UNIFORM_ROWS: u32 = 32;
/// The row whose lane argument comes from `lane_arg`, different per lane.
pub const SHFL_LANE_ARG_ROW: u32 = SHFL_UNIFORM_ROWS;
/// Rows of each shuffle output.
pub const SHFL_ROWS: u32 = SHFL_UNIFORM_ROWS + 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ShflParams {
    /// `[SHFL_ROWS][n]` each.
    pub out_f32: *mut f32,
    pub out_u32: *mut u32,
    pub out_i32: *mut i32,
    /// `[n]` each; `inp_u32` feeds both the u32 and (reinterpreted) i32 shuffles.
    pub inp_f32: *const f32,
    pub inp_u32: *const u32,
    pub lane_arg: *const u32,
    /// Threads, a multiple of 32.
    pub n: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WarpReduceParams {
    /// `[n]` each: thread i writes its warp's result.
    pub sum: *mut f32,
    pub max: *mut f32,
    pub min: *mut f32,
    pub sum_u32: *mut u32,
    pub max_u32: *mut u32,
    pub argmax_val: *mut f32,
    pub argmax_idx: *mut u32,
    pub inp: *const f32,
    pub inp_u32: *const u32,
    /// Argmax input, indexed by the global thread index (ties welcome).
    pub inp_argmax: *const f32,
    /// Threads, a multiple of 32.
    pub n: u32,
}

/// Dynamic shared memory [`BLOCK_REDUCE`] needs, in floats: the device
/// layer's `BLOCK_REDUCE_SCRATCH` (checked at compile time in the kernel).
pub const BLOCK_REDUCE_SCRATCH_F32S: u32 = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockReduceParams {
    /// `[n]` each: thread i writes its block's result.
    pub sum: *mut f32,
    pub max: *mut f32,
    pub min: *mut f32,
    pub inp: *const f32,
    /// Threads: grid size times block size.
    pub n: u32,
}

/// Rows of [`MATH`]'s output, one per function.
pub const MATH_EXP_FAST: u32 = 0;
pub const MATH_EXP2_APPROX: u32 = 1;
pub const MATH_TANH_APPROX: u32 = 2;
pub const MATH_TANH_PRECISE: u32 = 3;
pub const MATH_RSQRT_APPROX: u32 = 4;
pub const MATH_RSQRT_PRECISE: u32 = 5;
pub const MATH_SQRT_RN: u32 = 6;
pub const MATH_RCP_RN: u32 = 7;
pub const MATH_TO_TF32: u32 = 8;
pub const MATH_RCP_APPROX: u32 = 9;
pub const MATH_LOG2_APPROX: u32 = 10;
pub const MATH_LN_FAST: u32 = 11;
pub const MATH_ROWS: u32 = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MathParams {
    /// `[MATH_ROWS][n]`.
    pub out: *mut f32,
    pub inp: *const f32,
    pub n: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DynamicSharedParams {
    /// `out[b*bd + t] = inp[b*bd + bd-1-t]`, through shared memory.
    pub out: *mut f32,
    pub inp: *const f32,
    /// One flag per block: 1 when `dynamic_shared_align16` is 16-byte
    /// aligned and the same address as `dynamic_shared::<f32>()`.
    pub align_ok: *mut u32,
    /// Threads: grid size times block size.
    pub n: u32,
}

/// One m16n8k8 tile's dimensions.
pub const MMA_M: u32 = 16;
pub const MMA_N: u32 = 8;
pub const MMA_K: u32 = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmaParams {
    /// `[tiles][M][N]` row-major: D = A·B + C.
    pub d: *mut f32,
    /// `[tiles][M][K]` row-major.
    pub a: *const f32,
    /// `[tiles][K][N]` row-major (B\[k\]\[n\]).
    pub b: *const f32,
    /// `[tiles][M][N]` row-major.
    pub c: *const f32,
    /// Tiles, one per warp.
    pub tiles: u32,
}

/// Floats per `cp.async` chunk (16 bytes).
pub const CP_ASYNC_CHUNK: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpAsyncParams {
    /// `[chunks * 4]`: chunk c is `inp`'s chunk c when `c < valid_chunks`, zeros after.
    pub out: *mut f32,
    /// `[valid_chunks * 4]`, 16-byte aligned.
    pub inp: *const f32,
    pub valid_chunks: u32,
    /// One chunk per thread: grid size times block size.
    pub chunks: u32,
}

// SAFETY: every struct above is repr(C), made of u32/f32 fields and device
// pointers: the same layout on host and device.
gpu_kernels::kernel_params!(
    unsafe ShflParams,
    WarpReduceParams,
    BlockReduceParams,
    MathParams,
    DynamicSharedParams,
    MmaParams,
    CpAsyncParams,
);
