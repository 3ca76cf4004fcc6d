//! Thread, block and grid indices (the `threadIdx`/`blockIdx`/`blockDim`/`gridDim` of CUDA C).

use core::arch::nvptx;

macro_rules! special_reg {
    ($(#[$doc:meta] $name:ident => $intr:ident;)*) => {$(
        #[$doc]
        #[inline(always)]
        pub fn $name() -> u32 {
            // SAFETY: reading a special register has no preconditions.
            unsafe { nvptx::$intr() as u32 }
        }
    )*};
}

/// `x`, as a value LLVM cannot see through (an asm `mov` that is not
/// `pure`): what is computed from it stays in the loop that computes it,
/// where [`thread_idx_x`] (a pure intrinsic) or a kernel parameter would
/// let LLVM work it out once before the loop and hold it in registers
/// across every iteration (the persistent `wgmma` matmuls' epilogue
/// offsets, beside their accumulators).
#[inline(always)]
pub fn opaque_u32(x: u32) -> u32 {
    let y: u32;
    // SAFETY: a register move; not `pure`, so it is neither hoisted nor merged.
    unsafe {
        core::arch::asm!("mov.u32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nomem, nostack, preserves_flags))
    };
    y
}

special_reg! {
    /// `threadIdx.x`
    thread_idx_x => _thread_idx_x;
    /// `threadIdx.y`
    thread_idx_y => _thread_idx_y;
    /// `threadIdx.z`
    thread_idx_z => _thread_idx_z;
    /// `blockIdx.x`
    block_idx_x => _block_idx_x;
    /// `blockIdx.y`
    block_idx_y => _block_idx_y;
    /// `blockIdx.z`
    block_idx_z => _block_idx_z;
    /// `blockDim.x`
    block_dim_x => _block_dim_x;
    /// `blockDim.y`
    block_dim_y => _block_dim_y;
    /// `blockDim.z`
    block_dim_z => _block_dim_z;
    /// `gridDim.x`
    grid_dim_x => _grid_dim_x;
    /// `gridDim.y`
    grid_dim_y => _grid_dim_y;
    /// `gridDim.z`
    grid_dim_z => _grid_dim_z;
}

/// Global index of this thread along x: `blockIdx.x * blockDim.x + threadIdx.x`.
#[inline(always)]
pub fn global_idx_x() -> u32 {
    block_idx_x() * block_dim_x() + thread_idx_x()
}

/// Number of threads in the grid along x (the stride of a grid-stride loop).
#[inline(always)]
pub fn grid_stride_x() -> u32 {
    grid_dim_x() * block_dim_x()
}

/// This thread's lane within its warp (0..32), for 1-D blocks.
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() % super::WARP_SIZE
}

/// This thread's warp within its block, for 1-D blocks.
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() / super::WARP_SIZE
}

/// This SM's cycle counter (`%clock64`). Counters of different SMs are not
/// synchronised: compare readings of one block only.
#[inline(always)]
pub fn clock64() -> u64 {
    let t: u64;
    // SAFETY: reading a special register; not `pure`, so each call reads anew
    // where it stands in the program.
    unsafe { core::arch::asm!("mov.u64 {t}, %clock64;", t = out(reg64) t, options(nomem, nostack)) };
    t
}

/// The GPU's global nanosecond timer (`%globaltimer`), common to every SM;
/// its resolution may be as coarse as a microsecond.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reading a special register.
    unsafe { core::arch::asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}
