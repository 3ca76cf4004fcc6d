//! Sliding-window perplexity on the GPU engine agrees with the CPU reference,
//! on random tokens and on a real text (tests/data/perplexity_sample.txt,
//! tokenized with GPT-2's tokenizer, scored by a random model of GPT-2's
//! vocabulary).

use host::cpu::CpuModel;
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use host::perplexity::{PerplexityConfig, PerplexityReport, perplexity, perplexity_with};
use host::tokenizer::Gpt2Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::kernels::skip;

/// Relative agreement of the GPU's and the CPU's total NLL.
const REL_TOL: f64 = 1e-3;
/// Seed of the random fixture models.
const MODEL_SEED: u64 = 11;
/// Windows per GPU forward call (batching is part of what is checked).
const GPU_BATCH: usize = 3;
/// GPT-2's vocabulary, so that real text can be scored.
const GPT2_VOCAB: usize = 50257;

/// The sample text, relative to the workspace root (tests run from there).
const SAMPLE_TEXT: &str = "tests/data/perplexity_sample.txt";
/// The tokenizer files, relative to the workspace root.
const TOKENIZER_DIR: &str = "weights/gpt2";

/// `relative` from the working directory (the GPU runner's copy of the tree),
/// else from where this crate was built.
fn workspace_path(relative: &str) -> std::path::PathBuf {
    let here = std::path::PathBuf::from(relative);
    if here.exists() {
        here
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
    }
}

/// A small model over GPT-2's full vocabulary.
fn gpt2_vocab_config() -> ModelConfig {
    ModelConfig {
        vocab_size: GPT2_VOCAB,
        padded_vocab_size: ModelConfig::pad_vocab(GPT2_VOCAB),
        ..tiny_config()
    }
}

/// Perplexity of `tokens` on the CPU (one window per call) and on the GPU
/// (`GPU_BATCH` windows per call) at `precision`.
fn both(
    gpu: Gpu,
    cfg: &ModelConfig,
    tokens: &[u32],
    window: usize,
    stride: usize,
    precision: Precision,
) -> (PerplexityReport, PerplexityReport) {
    let ckpt = Checkpoint::from_bytes(llmc_bytes(cfg, MODEL_SEED, DType::F32).unwrap(), "fixture.bin", None).unwrap();
    let weights = ckpt.weights().unwrap();
    let mut cpu = CpuModel::new(&weights, 1, window).unwrap();
    let mut engine = GpuEngine::new(gpu, &weights, GPU_BATCH, window, precision).unwrap();
    let on_cpu = perplexity(&mut cpu, tokens, window, stride).unwrap();
    let config = PerplexityConfig {
        window,
        stride,
        batch: GPU_BATCH,
    };
    let on_gpu = perplexity_with(&mut engine, tokens, &config, |_, _| {}).unwrap();
    (on_cpu, on_gpu)
}

fn assert_agree(cpu: &PerplexityReport, gpu: &PerplexityReport, what: &str) {
    assert_eq!(cpu.tokens_scored, gpu.tokens_scored, "{what}: tokens scored");
    assert_eq!(cpu.windows, gpu.windows, "{what}: windows");
    let rel = (gpu.total_nll - cpu.total_nll).abs() / cpu.total_nll.abs();
    assert!(
        gpu.total_nll.is_finite() && rel <= REL_TOL,
        "{what}: GPU NLL {} vs CPU {} (relative {rel:e}); PPL {} vs {}",
        gpu.total_nll,
        cpu.total_nll,
        gpu.perplexity(),
        cpu.perplexity()
    );
    eprintln!(
        "{what}: PPL GPU {:.4} CPU {:.4} (relative NLL difference {rel:.1e}), GPU {:.0} tokens/s",
        gpu.perplexity(),
        cpu.perplexity(),
        gpu.tokens_per_second()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_matches_cpu_on_random_tokens() {
    let Some(gpu) = skip::gpu() else {
        return;
    };
    let cfg = tiny_config();
    let mut rng = StdRng::seed_from_u64(1);
    let tokens: Vec<u32> = (0..500).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let (cpu, on_gpu) = both(gpu, &cfg, &tokens, 64, 24, Precision::Fp32);
    assert_agree(&cpu, &on_gpu, "random tokens, fp32");
    let gpu = Gpu::new(0).unwrap();
    let (cpu, on_gpu) = both(gpu, &cfg, &tokens, cfg.max_seq_len, cfg.max_seq_len, Precision::Tf32);
    assert_agree(&cpu, &on_gpu, "random tokens, tf32, stride = window");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_matches_cpu_on_text() {
    let Some(gpu) = skip::gpu() else {
        return;
    };
    let text = std::fs::read_to_string(workspace_path(SAMPLE_TEXT)).unwrap();
    let tokenizer = Gpt2Tokenizer::from_dir(&workspace_path(TOKENIZER_DIR)).unwrap();
    let tokens = tokenizer.encode(&text).unwrap();
    let cfg = gpt2_vocab_config();
    assert!(
        tokens.len() > 2 * cfg.max_seq_len,
        "the sample should span several windows"
    );
    let (cpu, on_gpu) = both(
        gpu,
        &cfg,
        &tokens,
        cfg.max_seq_len,
        cfg.max_seq_len / 2,
        Precision::Fp32,
    );
    assert_agree(&cpu, &on_gpu, "sample text, fp32");
}
