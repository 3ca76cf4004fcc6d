//! An outside consumer of the gpt2 crates: launch our own kernel
//! (`consumer_kernels::center_rows`, built on `gpu_kernels::device`), then
//! one of gpt2's ops (`gpu_host::ops::layernorm`) on its output, and check
//! both against the CPU. Layernorm does not change when a row is shifted,
//! so layernorm(center(x)) must equal layernorm(x).
//!
//! Exit status 0 and a last line `ok` when every value matches; 1 with a
//! message otherwise (no GPU included).

use std::process::ExitCode;

use consumer_kernels::{CENTER_ROWS, CENTER_ROWS_BLOCK, CenterRowsParams};
use gpu_host::cudarc::driver::LaunchConfig;
use gpu_host::ops::layernorm::layernorm_forward;
use gpu_host::runtime::{dptr, dptr_mut};
use gpu_host::{Gpu, Module, RowShape};

/// Our kernels, compiled by build.rs.
const PTX: &str = include_str!(env!("CONSUMER_KERNELS_PTX"));
const ROWS: usize = 300;
const COLS: usize = 768;
/// Largest difference allowed against the CPU (f32 sums of 768 values).
const TOLERANCE: f32 = 1e-4;
/// gpt2's layernorm epsilon (`gpu_kernels::params::layernorm`).
const EPS: f32 = 1e-5;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new(0)?;
    println!("device: {}", gpu.name());
    let module: Module = gpu.load_module(PTX)?;

    // Rows with large offsets, so a kernel that forgot to centre them fails.
    let x: Vec<f32> = (0..ROWS * COLS)
        .map(|i| {
            let (r, c) = (i / COLS, i % COLS);
            100.0 * (r as f32).sin() + ((r * 31 + c * 17) % 97) as f32 / 97.0 - 0.5
        })
        .collect();
    let inp = gpu.upload(&x)?;
    // NaN first: every output element must be written.
    let mut centred = gpu.upload(&vec![f32::NAN; ROWS * COLS])?;
    let rows_per_block = CENTER_ROWS_BLOCK / 32;
    let cfg = LaunchConfig {
        grid_dim: ((ROWS as u32).div_ceil(rows_per_block), 1, 1),
        block_dim: (CENTER_ROWS_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let params = CenterRowsParams {
        out: dptr_mut(&mut centred),
        inp: dptr(&inp),
        rows: ROWS as u32,
        cols: COLS as u32,
    };
    // SAFETY: `center_rows` takes `CenterRowsParams`; `centred` and `inp`
    // hold ROWS * COLS floats; the block is a multiple of 32 threads.
    unsafe { gpu.launch_in(&module, CENTER_ROWS, cfg, params)? };

    // gpt2's op on our kernel's output, with weight 1 and bias 0.
    let ones = gpu.upload(&vec![1f32; COLS])?;
    let zeros = gpu.upload(&vec![0f32; COLS])?;
    let mut normed = gpu.upload(&vec![f32::NAN; ROWS * COLS])?;
    layernorm_forward(&gpu, &mut normed, &centred, &ones, &zeros, RowShape::new(ROWS, COLS))?;

    let got_centred = gpu.download(&centred)?;
    let got_normed = gpu.download(&normed)?;
    let (mut worst_c, mut worst_n) = (0f32, 0f32);
    for (r, row) in x.chunks(COLS).enumerate() {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / COLS as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / COLS as f64;
        let rstd = 1.0 / (var + EPS as f64).sqrt();
        for (c, &v) in row.iter().enumerate() {
            let i = r * COLS + c;
            worst_c = worst_c.max(err(got_centred[i], v as f64 - mean));
            worst_n = worst_n.max(err(got_normed[i], (v as f64 - mean) * rstd));
        }
    }
    println!("center_rows (ours): max abs error {worst_c:.2e}");
    println!("layernorm_forward (gpu-host): max abs error {worst_n:.2e}");
    if !(worst_c <= TOLERANCE && worst_n <= TOLERANCE) {
        return Err(format!("an error exceeds {TOLERANCE:e}").into());
    }
    Ok(())
}

/// |got - want|, infinite for NaN (an element never written).
fn err(got: f32, want: f64) -> f32 {
    let e = (got as f64 - want).abs() as f32;
    if e.is_nan() { f32::INFINITY } else { e }
}
