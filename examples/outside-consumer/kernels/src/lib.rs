//! One kernel, written on `gpu_kernels::device`: `center_rows` subtracts each
//! row's mean (one warp a row, the device layer's warp reduction).
//!
//! The parameter struct compiles for the host and the GPU alike, so both
//! sides agree on it; the kernel itself exists only on nvptx.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

/// PTX name of [`center_rows`].
pub const CENTER_ROWS: &str = "center_rows";
/// Threads of a block: one warp per row, this many rows a block.
pub const CENTER_ROWS_BLOCK: u32 = 256;

/// `out[r][i] = inp[r][i] - mean(inp[r])` for `r < rows`, `i < cols`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CenterRowsParams {
    /// `[rows][cols]`, written.
    pub out: *mut f32,
    /// `[rows][cols]`, read.
    pub inp: *const f32,
    pub rows: u32,
    pub cols: u32,
}

// SAFETY: repr(C), two device pointers and two u32: the same layout on host
// and device.
gpu_kernels::kernel_params!(unsafe CenterRowsParams);

/// # Safety
/// `out` and `inp` hold `rows * cols` floats; `blockDim.x` is a multiple of
/// 32; any grid (warps past the last row do nothing).
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn center_rows(p: CenterRowsParams) {
    use gpu_kernels::device::{WARP_SIZE, block_dim_x, block_idx_x, lane_id, warp_id, warp_reduce_sum};
    let row = block_idx_x() * (block_dim_x() / WARP_SIZE) + warp_id();
    // Whole warps leave together: the reduction below needs all 32 lanes.
    if row >= p.rows {
        return;
    }
    let (cols, lane) = (p.cols as usize, lane_id() as usize);
    let base = row as usize * cols;
    let mut sum = 0f32;
    let mut i = lane;
    while i < cols {
        // SAFETY: base + i < rows * cols (row < rows, i < cols).
        sum += unsafe { *p.inp.add(base + i) };
        i += WARP_SIZE as usize;
    }
    let mean = warp_reduce_sum(sum) / p.cols as f32;
    let mut i = lane;
    while i < cols {
        // SAFETY: as above; each element has one writer (its lane).
        unsafe { *p.out.add(base + i) = *p.inp.add(base + i) - mean };
        i += WARP_SIZE as usize;
    }
}

// The module's panic handler, defined only when kernel-builder compiles this
// crate as the root (a trap: bounds checks end the kernel).
gpu_kernels::panic_handler!();
