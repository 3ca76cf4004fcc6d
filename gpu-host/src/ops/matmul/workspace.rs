//! Scratch memory for split-K partial sums, and how much of it every plan
//! needs.

use cudarc::driver::CudaSlice;
use gpu_kernels::params::matmul::{MATMUL_SMALL_PARTIAL_FLOATS, MATMUL_SMALL_TILE_M, MATMUL_TILE_M_MID};

use super::plan::{SMALL_MAX_ROWS, plan_small, plan_tiled};
use crate::{Gpu, GpuError, MatmulShape};

/// Workspace floats that let every call of `max` with at most `max.m`
/// rows on `sms` SMs run the plan [`plan_tiled`] picks with no limit. Plans depend on `m` only through `ceil(m / MATMUL_TILE_M_MID)`, so
/// one `m` per 64 rows (the largest) is checked; likewise the small-M
/// kernel's split plans for `m <= SMALL_MAX_ROWS`.
pub fn split_k_workspace_floats(max: MatmulShape, sms: usize) -> usize {
    let max_m = max.m;
    let step = MATMUL_TILE_M_MID as usize;
    let tiled = (1..=max_m.div_ceil(step)).map(|b| {
        let shape = max.with_rows((b * step).min(max_m));
        plan_tiled(shape, sms, usize::MAX).workspace_floats(shape)
    });
    // The small-M kernel's plans depend on m through ceil(m / 64) too.
    let small_rows = max_m.min(SMALL_MAX_ROWS);
    let small_step = MATMUL_SMALL_TILE_M as usize;
    let small = (1..=small_rows.div_ceil(small_step)).map(|b| {
        let shape = max.with_rows((b * small_step).min(small_rows));
        plan_small(shape, sms, usize::MAX).workspace_floats(shape)
    });
    tiled.chain(small).max().unwrap_or(0)
}

/// Scratch for split-K partial sums, allocated once by its owner (the engine
/// sizes it with [`split_k_workspace_floats`]) and reused by every call,
/// plus the small-M kernel's per-tile arrival counters (zero between calls).
/// Calls that share a workspace must run one after another (one stream).
pub struct MatmulWorkspace {
    pub(super) partial: CudaSlice<f32>,
    pub(super) floats: usize,
    pub(super) counters: CudaSlice<u32>,
}

impl MatmulWorkspace {
    /// A workspace of `floats` floats (0 is allowed: it disables split-K).
    pub fn new(gpu: &Gpu, floats: usize) -> Result<Self, GpuError> {
        Self::from_buffer(gpu, gpu.alloc(floats)?)
    }

    /// A workspace over an existing buffer (all of it); the counters are
    /// allocated here, zeroed.
    pub fn from_buffer(gpu: &Gpu, partial: CudaSlice<f32>) -> Result<Self, GpuError> {
        let floats = partial.len();
        // A split small-M plan has at least two partial tiles per output
        // tile, so this many counters cover any plan the partials fit.
        let counters = gpu.alloc(floats / (2 * MATMUL_SMALL_PARTIAL_FLOATS as usize) + 1)?;
        Ok(Self {
            partial,
            floats,
            counters,
        })
    }

    /// Its size in floats.
    pub fn floats(&self) -> usize {
        self.floats
    }

    /// The partial-sum buffer, for other kernels' split-K (the 3xTF32
    /// matmul's: `matmul_tf32::matmul_forward_fp32_tc`), which leave the
    /// counters alone.
    pub fn partial_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.partial
    }

    /// The partial-sum buffer, read: where a split-K call that left its
    /// parts for the consumer (`matmul_tf32::matmul_forward_fp32_tc_partials`)
    /// put them.
    pub fn partial(&self) -> &CudaSlice<f32> {
        &self.partial
    }
}
