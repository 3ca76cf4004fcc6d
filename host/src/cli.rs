//! Command-line pieces shared by the `host` and `perplexity` binaries: their
//! `main` ([`main_with`]), the `--weights` lookup and the choice of backend
//! (`--cpu`, `--precision`, `--device`, `--devices`). The flags are clap `Args` structs to
//! `#[command(flatten)]` into a binary's own `Cli`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use clap::{Args, Parser, ValueEnum};

use crate::cpu::CpuModel;
use crate::generate::Backend;
use crate::gpu::engine::{GpuEngine, Precision, TpEngine};
use crate::gpu::replicas::{DeviceList, Replicas};
use crate::hub::{HubOptions, resolve_weights};
use crate::model::Weights;
use crate::model::checkpoint::Checkpoint;

/// A tool's `main`: parse its `Cli` (a usage error prints clap's message on
/// stderr and exits with code 2), then `run` it; an error prints as
/// `error: <chain>` on stderr with exit code 1.
pub fn main_with<C: Parser>(run: impl FnOnce(C) -> Result<()>) -> ExitCode {
    // SAFETY: a program's first call, before any thread starts.
    unsafe { crate::gpu::nccl::keep_nvls_off() };
    let cli = match C::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--precision`: the arithmetic of the GPU matmuls.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    /// Plain f32 everywhere (the default).
    Fp32,
    /// TF32 tensor cores for the matmuls (faster, ~1e-3 relative error).
    Tf32,
    /// Weights stored in bf16 on the GPU (half the memory and the bytes per
    /// token), bf16 tensor cores for prefill; activations stay f32.
    Bf16,
}

impl From<PrecisionArg> for Precision {
    fn from(arg: PrecisionArg) -> Precision {
        match arg {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Tf32 => Precision::Tf32,
            PrecisionArg::Bf16 => Precision::Bf16,
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

/// `--cpu`, `--precision`, `--device`, `--devices`: where the model runs.
#[derive(Args, Clone, Debug)]
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
    /// GPUs to spread the batch over, one model replica each (data
    /// parallel): ordinals such as 0,1, or `all`. An ordinal may repeat
    /// (0,0: two replicas on one GPU, which tests the split on a one-GPU
    /// machine but gains no speed).
    #[arg(long, value_name = "LIST", conflicts_with_all = ["device", "cpu"])]
    pub devices: Option<DeviceList>,
    /// Split the model over the `--devices` instead (tensor parallelism over
    /// NCCL: each GPU holds a share of every layer; for models too large or
    /// too slow for one GPU). FP32 only; the GPUs must be distinct, and
    /// NCCL's libnccl.so must be on the library path.
    #[arg(long, requires = "devices")]
    pub tensor_parallel: bool,
    /// Attend only to the last W positions (sliding-window causal
    /// attention); 0 attends to the whole context, as GPT-2 was trained.
    #[arg(long, value_name = "W", default_value_t = 0)]
    pub attention_window: usize,
}

impl BackendArgs {
    /// The GPUs the model runs on: `--devices` (checked against the
    /// machine's), else `--device`; none with `--cpu`.
    pub fn gpus(&self) -> Result<Vec<usize>> {
        match (&self.devices, self.cpu) {
            (_, true) => Ok(Vec::new()),
            (Some(list), false) => list.resolve(),
            (None, false) => Ok(vec![self.device]),
        }
    }

    /// The CPU reference (`--cpu`), the GPU engine on device `--device`, or
    /// with several `--devices` one replica on each ([`Replicas`]), at
    /// `--precision`, sized for `max_batch` rows (over all replicas) of
    /// `max_seq_len` tokens.
    pub fn backend(&self, weights: &Weights, max_batch: usize, max_seq_len: usize) -> Result<Box<dyn Backend>> {
        if self.cpu {
            let mut model = CpuModel::new(weights, max_batch, max_seq_len)?;
            model.set_attention_window(self.attention_window);
            return Ok(Box::new(model));
        }
        let gpus = self.gpus()?;
        if self.tensor_parallel {
            ensure!(
                self.attention_window == 0,
                "--attention-window is not supported with --tensor-parallel"
            );
            let gpus = gpus
                .into_iter()
                .map(crate::gpu::Gpu::new)
                .collect::<Result<Vec<_>, _>>()?;
            let tp = TpEngine::new(gpus, weights, max_batch, max_seq_len, self.precision.into())?;
            return Ok(Box::new(tp));
        }
        if gpus.len() > 1 {
            let mut replicas = Replicas::new(&gpus, weights, max_batch, max_seq_len, self.precision.into())?;
            let window = self.attention_window;
            replicas.with_each(move |_, e| {
                e.set_attention_window(window);
                Ok(())
            })?;
            return Ok(Box::new(replicas));
        }
        let &device = gpus.first().context("no GPU listed")?;
        let gpu = crate::gpu::Gpu::new(device)?;
        let mut engine = GpuEngine::new(gpu, weights, max_batch, max_seq_len, self.precision.into())?;
        engine.set_attention_window(self.attention_window);
        Ok(Box::new(engine))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program with only the backend flags.
    #[derive(Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        backend: BackendArgs,
    }

    fn parse(args: &[&str]) -> Result<BackendArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("prog").chain(args.iter().copied())).map(|f| f.backend)
    }

    #[test]
    fn devices_parse_and_conflict_with_device_and_cpu() {
        assert_eq!(
            parse(&["--devices", "0,1"]).unwrap().devices,
            Some(DeviceList::List(vec![0, 1]))
        );
        assert_eq!(
            parse(&["--devices", "0,0"]).unwrap().devices,
            Some(DeviceList::List(vec![0, 0]))
        );
        assert_eq!(parse(&["--devices", "all"]).unwrap().devices, Some(DeviceList::All));
        assert_eq!(parse(&[]).unwrap().devices, None);
        for bad in [
            &["--devices", "0,1", "--device", "1"][..],
            &["--cpu", "--devices", "0,1"],
            &["--devices", ""],
            &["--devices", "0,x"],
            &["--devices", "1,"],
            &["--devices"],
            &["--tensor-parallel"],
        ] {
            let e = parse(bad).expect_err(&format!("{bad:?}"));
            assert_ne!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{bad:?}");
        }
        let e = parse(&["--devices", "0,x"]).unwrap_err().to_string();
        assert!(e.contains("`x`") && e.contains("device list"), "{e}");
    }

    #[test]
    fn gpus_without_devices_is_the_device_and_none_on_the_cpu() {
        assert_eq!(parse(&["--device", "3"]).unwrap().gpus().unwrap(), vec![3]);
        assert_eq!(parse(&[]).unwrap().gpus().unwrap(), vec![0]);
        assert!(parse(&["--cpu"]).unwrap().gpus().unwrap().is_empty());
    }
}
