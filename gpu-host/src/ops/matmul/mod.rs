//! `matmul_forward`: `out = inp · weightᵀ + bias` in FP32 (twin of
//! `cpu::ops::matmul_forward`), with an optional fused GELU epilogue. Sizes
//! travel as a [`MatmulShape`] (`out[m, n] = inp[m, k] · weight[n, k]ᵀ`).
//!
//! Kernels: GEMV (a handful of rows, decode), GEMV in chunks of rows (short
//! prompts, when predicted faster), and the shared-memory tiled kernel with a
//! 128x128 or 64x128 block tile, optionally split over `k` (split-K): each of
//! S splits writes a partial tile to a [`MatmulWorkspace`], and a second
//! kernel sums the S partials in a fixed order (deterministic, no atomics)
//! and applies bias and GELU. [`plan_tiled`] picks tile and S with a wave
//! model of the GPU ([`predict_tiled_us`]), for the device's real SM count.
//!
//! For few rows (`m <= SMALL_MAX_ROWS`) the small-M kernel
//! (`gpu_kernels::ops::matmul_small`: 64x64 tiles, split-K finished by the
//! last block of each tile, one launch) competes too; [`plan_auto`] holds
//! the rule that picks among all of them.

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use gpu_kernels::params::matmul::{
    MATMUL_FORWARD_GEMV, MATMUL_FORWARD_NAIVE, MATMUL_FORWARD_SMALL, MATMUL_GEMV_BLOCK, MATMUL_GEMV_MAX_ROWS,
    MATMUL_NAIVE_SIDE, MATMUL_SMALL_BLOCK, MATMUL_SMALL_TILE_K, MATMUL_SMALL_TILE_M, MATMUL_SMALL_TILE_N,
    MATMUL_SPLIT_REDUCE, MATMUL_SPLIT_REDUCE_BLOCK, MATMUL_SPLIT_REDUCE_PER_THREAD, MATMUL_TILE_K, MATMUL_TILE_M,
    MATMUL_TILE_M_MID, MATMUL_TILE_N, MatmulParams, MatmulSmallParams, MatmulSplitReduceParams, matmul_shared_bytes,
    matmul_small_shared_bytes,
};

mod plan;
mod workspace;

pub use plan::*;
pub use workspace::*;

use super::args::{MAX_GRID_YZ, OpError, check_len, count_u32, in_ptr, out_ptr, to_u32};
use crate::{Gpu, GpuError, MatmulShape};

const OP: &str = "matmul_forward";
/// Threads per warp (the GEMV kernel gives each output column one warp).
pub(super) const WARP: u32 = 32;

/// Which matmul kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// With a workspace ([`MatmulOptions::workspace`]): [`plan_auto`]'s choice
    /// (GEMV for `m <= MATMUL_GEMV_MAX_ROWS`, else the fastest predicted of
    /// the tiled plan with split-K, the small-M kernel and chunked GEMV).
    /// Without one: [`choose`].
    Auto,
    /// The tiled kernel unsplit, tile by [`plan_tiled`].
    Tiled,
    /// The tiled plan of [`plan_tiled`] with split-K allowed (needs a
    /// workspace; it may still pick an unsplit plan).
    SplitK,
    /// GEMV launches over chunks of `MATMUL_GEMV_MAX_ROWS` rows.
    GemvChunked,
    /// The small-M kernel, split-K by [`plan_small`] within the workspace.
    Small,
    Gemv,
    Naive,
}

/// The kernel [`MatmulKernel::Auto`] picks for `m` rows when no workspace is
/// given.
pub fn choose(m: usize) -> MatmulKernel {
    if m <= MATMUL_GEMV_MAX_ROWS as usize {
        MatmulKernel::Gemv
    } else {
        MatmulKernel::Tiled
    }
}

/// Launch configuration of the tiled kernel under `plan` for an `m x n`
/// output (grid z = splits).
pub fn tiled_launch_config(plan: &TiledPlan, m: u32, n: u32) -> Result<(&'static str, LaunchConfig), OpError> {
    let (name, threads, _) = plan.kernel();
    let rows = m.div_ceil(plan.tile_m);
    if rows > MAX_GRID_YZ {
        return Err(OpError::TooLarge {
            op: OP,
            what: "row blocks",
            value: rows as usize,
        });
    }
    if plan.splits > MAX_GRID_YZ {
        return Err(OpError::TooLarge {
            op: OP,
            what: "splits",
            value: plan.splits as usize,
        });
    }
    Ok((
        name,
        LaunchConfig {
            grid_dim: (n.div_ceil(MATMUL_TILE_N), rows, plan.splits),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: matmul_shared_bytes(plan.tile_m),
        },
    ))
}

/// Launch configuration of the small-M kernel under `plan` for an `m x n`
/// output: one block per 64x64 tile and split.
pub fn small_launch_config(plan: &SmallPlan, m: u32, n: u32) -> Result<LaunchConfig, OpError> {
    let rows = m.div_ceil(MATMUL_SMALL_TILE_M);
    for (what, value) in [("row blocks", rows), ("splits", plan.splits)] {
        if value > MAX_GRID_YZ {
            return Err(OpError::TooLarge {
                op: OP,
                what,
                value: value as usize,
            });
        }
    }
    Ok(LaunchConfig {
        grid_dim: (n.div_ceil(MATMUL_SMALL_TILE_N), rows, plan.splits.max(1)),
        block_dim: (MATMUL_SMALL_BLOCK, 1, 1),
        shared_mem_bytes: matmul_small_shared_bytes(),
    })
}

/// Kernel name and launch configuration of a one-launch kernel (`Tiled`,
/// `Gemv`, `Naive`; `Auto` as [`choose`]) for `shape` on `sms` SMs.
pub fn launch_config(
    kernel: MatmulKernel,
    shape: MatmulShape,
    sms: usize,
) -> Result<(&'static str, LaunchConfig), OpError> {
    let (m, n) = (to_u32(OP, "m", shape.m)?, to_u32(OP, "n", shape.n)?);
    match kernel {
        MatmulKernel::Auto => launch_config(choose(shape.m), shape, sms),
        MatmulKernel::Tiled => {
            let plan = plan_tiled(shape, sms, 0);
            tiled_launch_config(&plan, m, n)
        }
        MatmulKernel::Gemv => {
            if m > MATMUL_GEMV_MAX_ROWS {
                return Err(OpError::shape(
                    OP,
                    format!("the GEMV kernel takes at most {MATMUL_GEMV_MAX_ROWS} rows, got {m}"),
                ));
            }
            let cols_per_block = MATMUL_GEMV_BLOCK / WARP;
            Ok((
                MATMUL_FORWARD_GEMV,
                LaunchConfig {
                    grid_dim: (n.div_ceil(cols_per_block), 1, 1),
                    block_dim: (MATMUL_GEMV_BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                },
            ))
        }
        MatmulKernel::Naive => {
            let rows = m.div_ceil(MATMUL_NAIVE_SIDE);
            if rows > MAX_GRID_YZ {
                return Err(OpError::TooLarge {
                    op: OP,
                    what: "row blocks",
                    value: rows as usize,
                });
            }
            Ok((
                MATMUL_FORWARD_NAIVE,
                LaunchConfig {
                    grid_dim: (n.div_ceil(MATMUL_NAIVE_SIDE), rows, 1),
                    block_dim: (MATMUL_NAIVE_SIDE, MATMUL_NAIVE_SIDE, 1),
                    shared_mem_bytes: 0,
                },
            ))
        }
        MatmulKernel::Small => {
            let plan = plan_small(shape, sms, 0);
            Ok((MATMUL_FORWARD_SMALL, small_launch_config(&plan, m, n)?))
        }
        MatmulKernel::SplitK | MatmulKernel::GemvChunked => {
            Err(OpError::shape(OP, format!("{kernel:?} is not a single launch")))
        }
    }
}

/// How a matmul runs beyond [`matmul_forward`]'s defaults: which kernel,
/// the GELU epilogue, and the split-K scratch.
///
/// `K` is the kernel choice: a [`MatmulKernel`] for [`matmul_forward_with`],
/// an explicit [`TiledPlan`] for [`matmul_forward_plan`], an explicit
/// [`SmallPlan`] for [`matmul_forward_small`].
pub struct MatmulOptions<'a, K = MatmulKernel> {
    /// The kernel, or the plan, that runs.
    pub kernel: K,
    /// Apply GELU after the bias, in the epilogue.
    pub gelu: bool,
    /// Scratch for split-K partial sums. Without it `SplitK` is refused and
    /// `Auto` never splits ([`choose`]); a split plan needs
    /// `plan.workspace_floats(shape)` floats of it.
    pub workspace: Option<&'a mut MatmulWorkspace>,
}

impl Default for MatmulOptions<'_> {
    /// `Auto`, no GELU, no workspace: [`matmul_forward`].
    fn default() -> Self {
        MatmulOptions {
            kernel: MatmulKernel::Auto,
            gelu: false,
            workspace: None,
        }
    }
}

/// `out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n])`.
pub fn matmul_forward<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    matmul_forward_with(gpu, MatmulOptions::default(), out, inp, weight, bias, shape)
}

/// [`matmul_forward`] followed by GELU, fused into the epilogue.
pub fn matmul_forward_gelu<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let opts = MatmulOptions {
        gelu: true,
        ..MatmulOptions::default()
    };
    matmul_forward_with(gpu, opts, out, inp, weight, bias, shape)
}

/// [`matmul_forward`] on the baseline kernel.
pub fn matmul_forward_naive<B: DevicePtr<f32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let opts = MatmulOptions {
        kernel: MatmulKernel::Naive,
        ..MatmulOptions::default()
    };
    matmul_forward_with(gpu, opts, out, inp, weight, bias, shape)
}

/// The matmul on a chosen kernel, with or without the GELU epilogue. With a
/// split-K workspace this is the FP32 entry point of the engine (`Auto`:
/// GEMV, chunked GEMV or the tiled plan, whichever is predicted fastest,
/// split-K within the workspace); without one, `SplitK` is refused and
/// `Auto` never splits.
pub fn matmul_forward_with<B: DevicePtr<f32>>(
    gpu: &Gpu,
    opts: MatmulOptions,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let Some(args) = Args::new(gpu, opts.gelu, out, inp, weight, bias, shape)? else {
        return Ok(());
    };
    if let Some(ws) = opts.workspace {
        return args.run(gpu, opts.kernel, Some(ws));
    }
    let kernel = match opts.kernel {
        MatmulKernel::Auto => choose(shape.m),
        MatmulKernel::SplitK => {
            return Err(OpError::shape(
                OP,
                "split-K needs a MatmulWorkspace (MatmulOptions::workspace)",
            ));
        }
        k => k,
    };
    args.run(gpu, kernel, None)
}

/// The tiled kernel under an explicit plan (tests, tuning): `plan.splits >
/// 1` needs a workspace of `plan.workspace_floats(shape)` floats.
pub fn matmul_forward_plan<B: DevicePtr<f32>>(
    gpu: &Gpu,
    opts: MatmulOptions<'_, TiledPlan>,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let Some(args) = Args::new(gpu, opts.gelu, out, inp, weight, bias, shape)? else {
        return Ok(());
    };
    args.tiled(gpu, &opts.kernel, opts.workspace)
}

/// The small-M kernel under an explicit plan (tests, tuning): `plan.splits
/// > 1` needs a workspace of `plan.workspace_floats(shape)` floats.
pub fn matmul_forward_small<B: DevicePtr<f32>>(
    gpu: &Gpu,
    opts: MatmulOptions<'_, SmallPlan>,
    out: &mut impl DevicePtrMut<f32>,
    inp: &impl DevicePtr<f32>,
    weight: &impl DevicePtr<f32>,
    bias: Option<&B>,
    shape: MatmulShape,
) -> Result<(), OpError> {
    let Some(args) = Args::new(gpu, opts.gelu, out, inp, weight, bias, shape)? else {
        return Ok(());
    };
    args.small(gpu, &opts.kernel, opts.workspace)
}

/// One call's checked arguments: device addresses and sizes.
struct Args {
    out: *mut f32,
    inp: *const f32,
    weight: *const f32,
    bias: *const f32,
    shape: MatmulShape,
    gelu: bool,
}

impl Args {
    /// Checks sizes and buffer lengths; `None` when the output is empty.
    fn new<B: DevicePtr<f32>>(
        gpu: &Gpu,
        gelu: bool,
        out: &mut impl DevicePtrMut<f32>,
        inp: &impl DevicePtr<f32>,
        weight: &impl DevicePtr<f32>,
        bias: Option<&B>,
        shape: MatmulShape,
    ) -> Result<Option<Self>, OpError> {
        let MatmulShape { m, n, k } = shape;
        count_u32(OP, "m * k", &[m, k])?;
        count_u32(OP, "m * n", &[m, n])?;
        count_u32(OP, "n * k", &[n, k])?;
        check_len(OP, "out", out.len(), m * n)?;
        check_len(OP, "inp", inp.len(), m * k)?;
        check_len(OP, "weight", weight.len(), n * k)?;
        if let Some(b) = bias {
            check_len(OP, "bias", b.len(), n)?;
        }
        if m == 0 || n == 0 {
            return Ok(None);
        }
        Ok(Some(Args {
            out: out_ptr(gpu, out),
            inp: in_ptr(gpu, inp),
            weight: in_ptr(gpu, weight),
            bias: bias.map_or(std::ptr::null(), |b| in_ptr(gpu, b)),
            shape,
            gelu,
        }))
    }

    /// Kernel parameters for rows `r0..r0 + rows` of this call.
    fn params(&self, r0: usize, rows: usize) -> MatmulParams {
        MatmulParams {
            // Device addresses: offset, never dereferenced here.
            out: self.out.wrapping_add(r0 * self.shape.n),
            inp: self.inp.wrapping_add(r0 * self.shape.k),
            weight: self.weight,
            bias: self.bias,
            n: rows as u32,
            c: self.shape.k as u32,
            oc: self.shape.n as u32,
            gelu: self.gelu as u32,
            k_chunk: self.shape.k as u32,
        }
    }

    /// Run on `kernel`; `Auto` and `SplitK` plan with `ws`.
    fn run(&self, gpu: &Gpu, kernel: MatmulKernel, ws: Option<&mut MatmulWorkspace>) -> Result<(), OpError> {
        let (shape, sms) = (self.shape, gpu.sm_count());
        let ws_floats = ws.as_ref().map_or(0, |w| w.floats);
        match kernel {
            MatmulKernel::Auto => match plan_auto(shape, sms, ws_floats) {
                AutoPlan::Gemv => self.single(gpu, MatmulKernel::Gemv),
                AutoPlan::GemvChunked => self.gemv_chunked(gpu),
                AutoPlan::Small(plan) => self.small(gpu, &plan, ws),
                AutoPlan::Tiled(plan) => self.tiled(gpu, &plan, ws),
            },
            MatmulKernel::Small => self.small(gpu, &plan_small(shape, sms, ws_floats), ws),
            MatmulKernel::SplitK => {
                let plan = plan_tiled(shape, sms, ws_floats);
                self.tiled(gpu, &plan, ws)
            }
            MatmulKernel::Tiled => self.tiled(gpu, &plan_tiled(shape, sms, 0), None),
            MatmulKernel::GemvChunked => self.gemv_chunked(gpu),
            MatmulKernel::Gemv | MatmulKernel::Naive => self.single(gpu, kernel),
        }
    }

    /// One launch of `Gemv` or `Naive` over all rows.
    fn single(&self, gpu: &Gpu, kernel: MatmulKernel) -> Result<(), OpError> {
        let (name, cfg) = launch_config(kernel, self.shape, gpu.sm_count())?;
        // SAFETY: out m*n, inp m*k, weight n*k and bias n floats (checked
        // in `Args::new`); the configuration comes from `launch_config` for
        // this kernel (GEMV only for m <= MATMUL_GEMV_MAX_ROWS); kernels check
        // alignment before any 16-byte access.
        unsafe { gpu.launch(name, cfg, self.params(0, self.shape.m))? };
        Ok(())
    }

    /// The small-M kernel under `plan`.
    fn small(&self, gpu: &Gpu, plan: &SmallPlan, ws: Option<&mut MatmulWorkspace>) -> Result<(), OpError> {
        let shape = self.shape;
        let MatmulShape { m, n, k } = shape;
        let tk = MATMUL_SMALL_TILE_K as usize;
        let chunk = plan.k_chunk as usize;
        let splits = plan.splits.max(1) as usize;
        let valid = if splits == 1 {
            chunk >= k
        } else {
            chunk > 0 && chunk.is_multiple_of(tk) && k.div_ceil(chunk) == splits
        };
        if !valid {
            return Err(OpError::shape(
                OP,
                format!("small-M plan {plan:?} does not cut k = {k} into {splits} non-empty multiples of {tk}"),
            ));
        }
        let cfg = small_launch_config(plan, to_u32(OP, "m", m)?, to_u32(OP, "n", n)?)?;
        let (partial, counters) = if splits > 1 {
            let Some(ws) = ws else {
                return Err(OpError::shape(OP, "a split small-M plan needs a MatmulWorkspace"));
            };
            check_len(OP, "split-K workspace", ws.floats, plan.workspace_floats(shape))?;
            check_len(OP, "split-K counters", ws.counters.len(), SmallPlan::tiles(shape))?;
            (out_ptr(gpu, &mut ws.partial), out_ptr(gpu, &mut ws.counters))
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let params = MatmulSmallParams {
            out: self.out,
            inp: self.inp,
            weight: self.weight,
            bias: self.bias,
            partial,
            counters,
            n: m as u32,
            c: k as u32,
            oc: n as u32,
            gelu: self.gelu as u32,
            k_chunk: if splits == 1 { k as u32 } else { plan.k_chunk },
            splits: splits as u32,
        };
        // SAFETY: out m*n, inp m*k, weight n*k and bias n floats (checked
        // in `Args::new`); k_chunk and splits as the kernel requires (checked
        // above); when split, the workspace holds the plan's partials and at
        // least one counter per tile, zero between calls (the kernel's last
        // blocks reset them; a workspace's calls run in stream order), and
        // its buffer is a whole allocation (256-byte aligned); grid, block
        // and shared memory from `small_launch_config` (same params
        // constants as the kernel).
        unsafe { gpu.launch(MATMUL_FORWARD_SMALL, cfg, params)? };
        Ok(())
    }

    /// GEMV launches over chunks of `MATMUL_GEMV_MAX_ROWS` rows.
    fn gemv_chunked(&self, gpu: &Gpu) -> Result<(), OpError> {
        let rows = MATMUL_GEMV_MAX_ROWS as usize;
        for r0 in (0..self.shape.m).step_by(rows) {
            let m = rows.min(self.shape.m - r0);
            let (name, cfg) = launch_config(MatmulKernel::Gemv, self.shape.with_rows(m), gpu.sm_count())?;
            // SAFETY: rows r0..r0+m of out (m*n floats from r0*n) and inp
            // (m*k floats from r0*k) lie within the checked m*n and m*k;
            // weight and bias as checked; m <= MATMUL_GEMV_MAX_ROWS as the
            // GEMV kernel requires; it checks alignment before 16-byte loads.
            unsafe { gpu.launch(name, cfg, self.params(r0, m))? };
        }
        Ok(())
    }

    /// The tiled kernel under `plan`; split plans then run the reduction.
    fn tiled(&self, gpu: &Gpu, plan: &TiledPlan, ws: Option<&mut MatmulWorkspace>) -> Result<(), OpError> {
        let shape = self.shape;
        let MatmulShape { m, n, k } = shape;
        if plan.tile_m != MATMUL_TILE_M && plan.tile_m != MATMUL_TILE_M_MID {
            return Err(OpError::shape(
                OP,
                format!("no tiled kernel has {}-row tiles", plan.tile_m),
            ));
        }
        let (m32, n32) = (to_u32(OP, "m", m)?, to_u32(OP, "n", n)?);
        if plan.splits <= 1 {
            let (name, cfg) = tiled_launch_config(&TiledPlan::unsplit(plan.tile_m, k), m32, n32)?;
            // SAFETY: out m*n, inp m*k, weight n*k and bias n floats
            // (checked in `Args::new`); grid, block and shared memory from
            // `tiled_launch_config` for this tile (same params constants as
            // the kernel); one split with k_chunk = k; the kernel checks
            // alignment before any 16-byte access.
            unsafe { gpu.launch(name, cfg, self.params(0, m))? };
            return Ok(());
        }
        let tk = MATMUL_TILE_K as usize;
        let chunk = plan.k_chunk as usize;
        if chunk == 0 || !chunk.is_multiple_of(tk) || k.div_ceil(chunk) != plan.splits as usize {
            return Err(OpError::shape(
                OP,
                format!(
                    "split plan {plan:?} does not cut k = {k} into {} non-empty multiples of {tk}",
                    plan.splits
                ),
            ));
        }
        let need = plan.workspace_floats(shape);
        let Some(ws) = ws else {
            return Err(OpError::shape(OP, "a split-K plan needs a MatmulWorkspace"));
        };
        check_len(OP, "split-K workspace", ws.floats, need)?;
        let partial = out_ptr(gpu, &mut ws.partial);
        let (name, cfg) = tiled_launch_config(plan, m32, n32)?;
        let params = MatmulParams {
            out: partial,
            bias: std::ptr::null(),
            gelu: 0,
            k_chunk: plan.k_chunk,
            ..self.params(0, m)
        };
        // SAFETY: the workspace holds splits*m*n floats (checked above) and
        // block z writes only its [m, n] slice z; inp m*k and weight n*k
        // floats (checked in `Args::new`); k_chunk is a nonzero multiple of
        // MATMUL_TILE_K with ceil(k / k_chunk) = splits = grid z, bias null
        // and gelu 0 as a split launch requires; grid, block and shared
        // memory from `tiled_launch_config` for this tile.
        unsafe { gpu.launch(name, cfg, params)? };
        count_u32(OP, "m * n", &[m, n])?;
        let reduce = MatmulSplitReduceParams {
            out: self.out,
            partial,
            bias: self.bias,
            n: m32,
            oc: n32,
            splits: plan.splits,
            gelu: self.gelu as u32,
        };
        // SAFETY: out m*n and bias n floats (checked in `Args::new`), m*n
        // fits u32 (checked above); the workspace holds the splits*m*n
        // partials the launch above writes first (same stream).
        unsafe { launch_split_reduce(gpu, reduce)? };
        Ok(())
    }
}

/// Launch configuration of `matmul_split_reduce` over `outputs` floats: one
/// thread per `MATMUL_SPLIT_REDUCE_PER_THREAD` of them.
pub fn split_reduce_launch_config(outputs: u32) -> LaunchConfig {
    let groups = outputs.div_ceil(MATMUL_SPLIT_REDUCE_PER_THREAD);
    LaunchConfig {
        grid_dim: (groups.div_ceil(MATMUL_SPLIT_REDUCE_BLOCK), 1, 1),
        block_dim: (MATMUL_SPLIT_REDUCE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The split-K reduction every split matmul (FP32 tiled and TF32 `wgmma`)
/// finishes with: `p.out = epilogue(sum over s of p.partial[s])`.
///
/// # Safety
/// `p.out` holds `p.n * p.oc` floats (the product fits u32), `p.bias`
/// `p.oc` floats or is null, `p.partial` the `splits` partial outputs,
/// written by
/// work queued earlier on [`Gpu::stream`]. The kernel checks alignment
/// before its 16-byte accesses.
pub(crate) unsafe fn launch_split_reduce(gpu: &Gpu, p: MatmulSplitReduceParams) -> Result<(), GpuError> {
    let cfg = split_reduce_launch_config(p.n * p.oc);
    // SAFETY: the caller's contract; the grid covers p.n*p.oc outputs.
    unsafe { gpu.launch(MATMUL_SPLIT_REDUCE, cfg, p) }
}

#[cfg(test)]
mod tests {
    use super::plan::{MIN_SPLIT_DEPTH, SMALL_MIN_SPLIT_DEPTH};
    use super::*;
    use gpu_kernels::params::matmul::MATMUL_SMALL_PARTIAL_FLOATS;

    /// H100 / H200 SXM.
    const SMS: usize = 132;
    /// Most dynamic shared memory one block may use on sm_80/sm_90 (227 KiB).
    const SM_SHARED_LIMIT_BYTES: u32 = 227 * 1024;
    /// GPT-2 124M's (N, K) and the M of `bench gemm`.
    const GEMM_M: [usize; 3] = [64, 1024, 8192];
    const GEMM_NK: [(usize, usize); 5] = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)];

    /// `split(c, s)` gives at most `s` chunks of `c`, each a multiple of
    /// `step` deep, covering `c` with none empty (or one chunk of all of `c`).
    fn check_splits(step: u32, split: impl Fn(usize, usize) -> (u32, u32)) {
        for c in [0, 1, 7, 8, 63, 64, 130, 257, 768, 3072] {
            for s in 1..=70 {
                let (splits, k_chunk) = split(c, s);
                let (splits, k) = (splits as usize, k_chunk as usize);
                assert!(splits >= 1 && splits <= s.max(1), "{c} {s}: {splits} x {k}");
                if splits > 1 {
                    assert_eq!(k % step as usize, 0);
                    assert!((splits - 1) * k < c && splits * k >= c, "{c} {s}: {splits} x {k}");
                } else {
                    assert_eq!(k, c);
                }
            }
        }
    }

    #[test]
    fn split_covers_c_with_aligned_nonempty_chunks() {
        check_splits(MATMUL_TILE_K, |c, s| {
            let p = TiledPlan::split(MATMUL_TILE_M, c, s);
            (p.splits, p.k_chunk)
        });
        check_splits(MATMUL_SMALL_TILE_K, |c, s| {
            let p = SmallPlan::split(c, s);
            (p.splits, p.k_chunk)
        });
    }

    #[test]
    fn plans_respect_workspace_and_bounds() {
        for &m in &GEMM_M {
            for &(n, k) in &GEMM_NK {
                let shape = MatmulShape { m, n, k };
                let unsplit = plan_tiled(shape, SMS, 0);
                assert_eq!(unsplit.splits, 1);
                let ws = split_k_workspace_floats(shape, SMS);
                let plan = plan_tiled(shape, SMS, ws);
                assert!(plan.workspace_floats(shape) <= ws, "{m} {n} {k}: {plan:?}");
                assert!(plan.splits == 1 || plan.k_chunk as usize >= MIN_SPLIT_DEPTH);
                let t = predict_tiled_us(&plan, shape, SMS);
                assert!(t <= predict_tiled_us(&unsplit, shape, SMS));
                println!("M={m} N={n} K={k}: {plan:?} {t:.1} us (unsplit {unsplit:?})");
            }
        }
    }

    /// The shapes the split targets split; the large-M, many-tile ones do not.
    #[test]
    fn split_k_where_the_grid_underfills() {
        let plan = |m, n, k| plan_tiled(MatmulShape { m, n, k }, SMS, usize::MAX);
        assert!(plan(64, 768, 3072).splits > 1);
        assert!(plan(64, 768, 768).splits > 1);
        assert!(plan(1024, 768, 768).splits > 1);
        assert!(plan(1024, 768, 3072).splits > 1);
        assert!(plan(8192, 768, 768).splits > 1);
        assert_eq!(plan(8192, 3072, 768).splits, 1);
        assert_eq!(plan(8192, 50304, 768).splits, 1);
        assert_eq!(plan(1024, 50304, 768).splits, 1);
    }

    /// Auto takes the small-M kernel where it measured fastest on the H200
    /// (GPT-2's four layer projections at n = 64, 11 splits each) and the
    /// tiled plans where they did (the LM head, n = 128 with N = 3072,
    /// n = 1024); GEMV for decode.
    #[test]
    fn auto_takes_the_small_kernel_where_it_measured_faster() {
        let auto = |m, n, k| {
            let shape = MatmulShape { m, n, k };
            plan_auto(shape, SMS, split_k_workspace_floats(shape, SMS))
        };
        let small = |p: AutoPlan| matches!(p, AutoPlan::Small(_));
        for (m, n, k) in [(64, 2304, 768), (64, 3072, 768), (64, 768, 768), (64, 768, 3072)] {
            assert!(
                matches!(auto(m, n, k), AutoPlan::Small(SmallPlan { splits: 11, .. })),
                "{m} {n} {k}: {:?}",
                auto(m, n, k)
            );
        }
        for (m, n, k) in [(64, 50304, 768), (128, 3072, 768), (1024, 2304, 768), (1024, 768, 3072)] {
            assert!(!small(auto(m, n, k)), "{m} {n} {k}: {:?}", auto(m, n, k));
        }
        assert_eq!(auto(8, 768, 768), AutoPlan::Gemv);
    }

    /// A regression pin of the small kernel's cost model, not a
    /// calibration: the points are H200 timings (n = 64, µs; `bench gemm`
    /// rows `ours_fp32_small_s<S>`) that the model's constants were fitted
    /// to, and the model must still reproduce them within 12 %. It runs no
    /// kernel, so it cannot tell whether the GPU still runs at these speeds;
    /// it fails when the formula or its constants change without a re-fit.
    #[test]
    fn small_model_reproduces_its_fit_points() {
        for (n, k, splits, want) in [
            (2304, 768, 11, 18.5),
            (768, 768, 11, 12.3),
            (3072, 768, 11, 20.5),
            (768, 3072, 11, 22.7),
            (768, 768, 1, 41.5),
            (2304, 768, 6, 19.7),
            (768, 768, 4, 17.3),
        ] {
            let plan = SmallPlan::split(k, splits);
            let got = predict_small_us(&plan, MatmulShape { m: 64, n, k }, SMS);
            assert!((got / want - 1.0).abs() < 0.12, "{n} {k} {splits}: {got} vs {want}");
        }
    }

    /// Small-M plans stay within the workspace, and a workspace sized by
    /// `split_k_workspace_floats` has a counter for every tile of them.
    #[test]
    fn small_plans_respect_workspace() {
        for m in [9, 64, 100, 128] {
            for &(n, k) in &GEMM_NK {
                let shape = MatmulShape { m, n, k };
                assert_eq!(plan_small(shape, SMS, 0).splits, 1);
                let ws = split_k_workspace_floats(shape, SMS);
                let plan = plan_small(shape, SMS, ws);
                assert!(plan.workspace_floats(shape) <= ws, "{m} {n} {k}: {plan:?}");
                if plan.splits > 1 {
                    let counters = ws / (2 * MATMUL_SMALL_PARTIAL_FLOATS as usize) + 1;
                    assert!(SmallPlan::tiles(shape) <= counters);
                    assert!(plan.k_chunk as usize >= SMALL_MIN_SPLIT_DEPTH);
                }
                let t = predict_small_us(&plan, shape, SMS);
                println!("small M={m} N={n} K={k}: {plan:?} {t:.1} us");
            }
        }
    }

    #[test]
    fn small_launch_covers_the_output() {
        for plan in [SmallPlan::unsplit(768), SmallPlan::split(768, 11)] {
            for (m, n) in [(1, 1), (64, 2304), (65, 770), (128, 33)] {
                let cfg = small_launch_config(&plan, m, n).unwrap();
                assert!(cfg.grid_dim.0 * MATMUL_SMALL_TILE_N >= n && cfg.grid_dim.1 * MATMUL_SMALL_TILE_M >= m);
                assert_eq!(cfg.grid_dim.2, plan.splits);
                assert!(cfg.shared_mem_bytes <= SM_SHARED_LIMIT_BYTES);
            }
        }
    }

    /// A regression pin of the tiled kernels' wave model, not a
    /// calibration: the three times are the H200 measurements its constants
    /// were fitted to (µs), and the model must reproduce them within 5 %. No
    /// kernel runs; it fails when the formula or its constants change
    /// without a re-fit, never because of the hardware.
    #[test]
    fn wave_model_reproduces_its_fit_points() {
        let close = |got: f64, want: f64| (got / want - 1.0).abs() < 0.05;
        let large = |c| TiledPlan::unsplit(MATMUL_TILE_M, c);
        let t = predict_tiled_us(&large(768), MatmulShape::new(8192, 3072, 768), SMS);
        assert!(close(t, 963.0), "{t}");
        let t = predict_tiled_us(&large(768), MatmulShape::new(1024, 2304, 768), SMS);
        assert!(close(t, 164.0), "{t}");
        let t = predict_tiled_us(
            &TiledPlan::unsplit(MATMUL_TILE_M_MID, 768),
            MatmulShape::new(1024, 768, 768),
            SMS,
        );
        assert!(close(t, 75.5), "{t}");
    }
}
