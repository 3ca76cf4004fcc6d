//! Command-line pieces shared by the `host` and `perplexity` binaries: the
//! `--weights` lookup and the choice of backend (`--cpu`, `--precision`,
//! `--device`). Each is a clap `Args` struct to `#[command(flatten)]` into a
//! binary's own `Cli`.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::cpu::CpuModel;
use crate::generate::Backend;
use crate::gpu::engine::{GpuEngine, Precision};
use crate::hub::{HubOptions, resolve_weights};
use crate::model::Weights;
use crate::model::checkpoint::Checkpoint;

/// `--precision`: the arithmetic of the GPU matmuls.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    /// Plain f32 everywhere (the default).
    Fp32,
    /// TF32 tensor cores for the matmuls (faster, ~1e-3 relative error).
    Tf32,
}

impl From<PrecisionArg> for Precision {
    fn from(arg: PrecisionArg) -> Precision {
        match arg {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Tf32 => Precision::Tf32,
        }
    }
}

/// `--weights`: which checkpoint to load.
#[derive(Args, Debug)]
pub struct WeightsArgs {
    /// Checkpoint (llm.c .bin or Hugging Face .safetensors). Default:
    /// weights/gpt2/model.safetensors if present, else openai-community/gpt2
    /// from the Hugging Face Hub (cached; HF_ENDPOINT and HF_HOME apply).
    #[arg(long, value_name = "PATH")]
    pub weights: Option<PathBuf>,
}

impl WeightsArgs {
    /// The checkpoint's path (`--weights`, the local file or the Hub cache,
    /// downloading if need be) and the checkpoint opened there.
    pub fn open(&self) -> Result<(PathBuf, Checkpoint)> {
        let path = resolve_weights(self.weights.as_deref(), &HubOptions::from_env())?;
        let checkpoint = Checkpoint::open(&path)?;
        Ok((path, checkpoint))
    }
}

/// `--cpu`, `--precision`, `--device`: where the model runs.
#[derive(Args, Debug)]
pub struct BackendArgs {
    /// Run on the CPU reference instead of the GPU.
    #[arg(long)]
    pub cpu: bool,
    /// GPU matmul precision.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fp32)]
    pub precision: PrecisionArg,
    /// GPU to use.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

impl BackendArgs {
    /// The CPU reference (`--cpu`) or the GPU engine on device `--device` at
    /// `--precision`, sized for `max_batch` rows of `max_seq_len` tokens.
    pub fn backend(&self, weights: &Weights, max_batch: usize, max_seq_len: usize) -> Result<Box<dyn Backend>> {
        if self.cpu {
            return Ok(Box::new(CpuModel::new(weights, max_batch, max_seq_len)?));
        }
        let gpu = crate::gpu::Gpu::new(self.device)?;
        Ok(Box::new(GpuEngine::new(
            gpu,
            weights,
            max_batch,
            max_seq_len,
            self.precision.into(),
        )?))
    }
}
