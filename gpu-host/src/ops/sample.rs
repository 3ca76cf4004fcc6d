//! `sample_forward`: the next token of each row chosen on the device
//! (greedy, temperature, top-k, top-p, a Philox draw), so only one id per
//! row comes back to the host. Twin of `cpu::sample::sample_forward`; the
//! rule is in `gpu_kernels::params::sample`.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use gpu_kernels::params::sample::{
    SAMPLE_BLOCK, SAMPLE_CLUSTER, SAMPLE_CLUSTER_FORWARD, SAMPLE_CLUSTER_MAX_ROWS, SAMPLE_FORWARD, SAMPLE_MAX_VOCAB,
    SampleParams, SampleRow, sample_cluster_shared_bytes, sample_shared_bytes,
};

use super::args::{MAX_GRID_YZ, OpError, check_len, in_ptr, out_ptr, to_u32};
use crate::{Gpu, SampleShape};

const OP: &str = "sample_forward";

/// A [`SampleRow`] as device memory holds it: cudarc's `DeviceRepr` cannot
/// be implemented for `gpu_kernels`' type in this crate, hence the wrapper.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSampleRow(pub SampleRow);
// SAFETY: SampleRow is repr(C) plain numbers (f32, u32, f32, u32, u64: 24
// bytes, no padding), the same layout on host and device, valid as zero bits
// (temperature 0: greedy).
unsafe impl DeviceRepr for DeviceSampleRow {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for DeviceSampleRow {}

/// Which kernel chooses: both give the same ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKernel {
    /// [`SampleKernel::Cluster`] where the sm_90a module is loaded and for
    /// at most `SAMPLE_CLUSTER_MAX_ROWS` rows, else [`SampleKernel::PerRow`].
    Auto,
    /// `sample_forward`: one block per row (any GPU).
    PerRow,
    /// `sample_forward_cluster`: a cluster of `SAMPLE_CLUSTER` blocks per
    /// row (the sm_90a module only).
    Cluster,
}

impl SampleKernel {
    /// The kernel `Auto` picks for `n` rows on `gpu`; the others as they are.
    pub fn resolve(self, gpu: &Gpu, n: usize) -> SampleKernel {
        match self {
            SampleKernel::Auto if gpu.has_wgmma() && n <= SAMPLE_CLUSTER_MAX_ROWS as usize => SampleKernel::Cluster,
            SampleKernel::Auto => SampleKernel::PerRow,
            k => k,
        }
    }
}

/// Launch configuration of `kernel` (`PerRow` or `Cluster`) for `n` rows.
pub fn launch_config(kernel: SampleKernel, n: u32) -> LaunchConfig {
    match kernel {
        SampleKernel::Cluster => LaunchConfig {
            grid_dim: (SAMPLE_CLUSTER, n, 1),
            block_dim: (SAMPLE_BLOCK, 1, 1),
            shared_mem_bytes: sample_cluster_shared_bytes(),
        },
        _ => LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (SAMPLE_BLOCK, 1, 1),
            shared_mem_bytes: sample_shared_bytes(),
        },
    }
}

/// For `i < n`: `out[i]` (and `next_tokens[i]` when given) = the id row `i`
/// chooses from the first `v` entries of `logits[i * row_stride..]` (the
/// padding after them is never read; see [`SampleShape`]), with settings
/// `rows[i]` and draw counter `counter[i]` (0 for every row when `None`; the
/// engine passes each row's position, so each step draws fresh numbers).
///
/// Rows may overlap (`row_stride` may be below `v`, even 0): logits are
/// only read. The same logits, settings, counter and row index give the
/// same id on every run and every GPU.
pub fn sample_forward<C: DevicePtr<u32>, N: DevicePtrMut<u32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<u32>,
    logits: &impl DevicePtr<f32>,
    rows: &impl DevicePtr<DeviceSampleRow>,
    counter: Option<&C>,
    next_tokens: Option<&mut N>,
    shape: SampleShape,
) -> Result<(), OpError> {
    let draws = Draws { counter, streams: None };
    sample_forward_streams(gpu, out, logits, rows, draws, next_tokens, shape)
}

/// Where each row's random numbers come from: its Philox counter and its
/// stream (`None`: 0 for every row, and stream `i` for row `i`).
pub struct Draws<'a, C> {
    /// Row `i`'s draw counter `counter[i]`.
    pub counter: Option<&'a C>,
    /// Row `i`'s stream `streams[i]` (a server's sequences sit in any row
    /// of a step, yet each draws what it would alone:
    /// `cpu::sample::sample_row`'s `stream`).
    pub streams: Option<&'a C>,
}

/// [`sample_forward`] with each row's counter and stream given by `draws`.
pub fn sample_forward_streams<C: DevicePtr<u32>, N: DevicePtrMut<u32>>(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<u32>,
    logits: &impl DevicePtr<f32>,
    rows: &impl DevicePtr<DeviceSampleRow>,
    draws: Draws<'_, C>,
    next_tokens: Option<&mut N>,
    shape: SampleShape,
) -> Result<(), OpError> {
    sample_forward_with(gpu, SampleKernel::Auto, out, logits, rows, draws, next_tokens, shape)
}

/// [`sample_forward_streams`] by the given kernel (tests and benchmarks
/// compare them); `Cluster` where the sm_90a module is not loaded is an
/// error.
#[allow(clippy::too_many_arguments)]
pub fn sample_forward_with<C: DevicePtr<u32>, N: DevicePtrMut<u32>>(
    gpu: &Gpu,
    kernel: SampleKernel,
    out: &mut impl DevicePtrMut<u32>,
    logits: &impl DevicePtr<f32>,
    rows: &impl DevicePtr<DeviceSampleRow>,
    draws: Draws<'_, C>,
    next_tokens: Option<&mut N>,
    shape: SampleShape,
) -> Result<(), OpError> {
    let SampleShape { n, v, row_stride } = shape;
    let kernel = kernel.resolve(gpu, n);
    if kernel == SampleKernel::Cluster {
        if !gpu.has_wgmma() {
            return Err(OpError::shape(
                SAMPLE_CLUSTER_FORWARD,
                "needs the sm_90a module (a Hopper GPU, portable kernels off)",
            ));
        }
        // Rows are the grid's y extent.
        if n > MAX_GRID_YZ as usize {
            return Err(OpError::TooLarge {
                op: SAMPLE_CLUSTER_FORWARD,
                what: "n",
                value: n,
            });
        }
    }
    let Draws { counter, streams } = draws;
    if v == 0 {
        return Err(OpError::shape(OP, "empty vocabulary"));
    }
    if v > SAMPLE_MAX_VOCAB as usize {
        return Err(OpError::TooLarge {
            op: OP,
            what: "v",
            value: v,
        });
    }
    check_len(OP, "out", out.len(), n)?;
    check_len(OP, "rows", rows.len(), n)?;
    if let Some(c) = counter {
        check_len(OP, "counter", c.len(), n)?;
    }
    if let Some(s) = streams {
        check_len(OP, "streams", s.len(), n)?;
    }
    if let Some(t) = &next_tokens {
        check_len(OP, "next_tokens", t.len(), n)?;
    }
    if n == 0 {
        return Ok(());
    }
    let need = (n - 1)
        .checked_mul(row_stride)
        .and_then(|s| s.checked_add(v))
        .ok_or(OpError::TooLarge {
            op: OP,
            what: "logits span",
            value: usize::MAX,
        })?;
    check_len(OP, "logits", logits.len(), need)?;
    let params = SampleParams {
        out: out_ptr(gpu, out),
        logits: in_ptr(gpu, logits),
        rows: in_ptr(gpu, rows).cast(),
        counter: counter.map_or(std::ptr::null(), |c| in_ptr(gpu, c)),
        next_tokens: next_tokens.map_or(std::ptr::null_mut(), |t| out_ptr(gpu, t)),
        streams: streams.map_or(std::ptr::null(), |s| in_ptr(gpu, s)),
        n: to_u32(OP, "n", n)?,
        v: v as u32,
        row_stride: to_u32(OP, "row_stride", row_stride)?,
    };
    let cfg = launch_config(kernel, params.n);
    // SAFETY: out, rows and (where given) counter, streams and next_tokens
    // hold n entries, logits every row's first v entries (checked above, the row
    // offsets in 64 bits as the kernel computes them); 1 <= v <= 2^31; the
    // launch gives one block of SAMPLE_BLOCK threads per row (a cluster of
    // SAMPLE_CLUSTER of them for the cluster kernel, which the sm_90a
    // module holds) and the kernel's shared memory (under the 48 KB default).
    unsafe {
        match kernel {
            SampleKernel::Cluster => gpu.launch_cluster(SAMPLE_CLUSTER_FORWARD, cfg, SAMPLE_CLUSTER, params)?,
            _ => gpu.launch(SAMPLE_FORWARD, cfg, params)?,
        }
    };
    Ok(())
}
