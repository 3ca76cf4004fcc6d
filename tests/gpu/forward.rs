//! The whole GPU forward pass: logits against the CPU reference
//! (`test_gpt2` style, B=4 T=64), KV-cache decoding against full
//! recomputation on the GPU, checkpoint dtypes/layouts, bad requests, and
//! the transformers oracle when `GPT2_ORACLE_DIR` is set.

use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::gpu::engine::{AttentionKind, GpuEngine, Precision};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, odd_config, safetensors_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use rand::Rng;

use crate::kernels::check;

/// FP32 end-to-end bar against the CPU reference (max abs on logits).
const FP32_LOGITS_TOL: f32 = 1e-3;
/// TF32 matmuls (and flash attention's tensor-core products) against the CPU's FP32.
const TF32_LOGITS_TOL: f32 = 5e-2;
/// KV-cache decode against full recomputation, same engine.
const KV_TOL: f32 = 1e-3;

fn checkpoint(cfg: &ModelConfig, seed: u64, dtype: DType, safetensors: bool) -> Checkpoint {
    let bytes = if safetensors {
        safetensors_bytes(cfg, seed, false, dtype).unwrap()
    } else {
        llmc_bytes(cfg, seed, dtype).unwrap()
    };
    let name = if safetensors {
        "random.safetensors"
    } else {
        "random.bin"
    };
    Checkpoint::from_bytes(bytes, name, Some(cfg.num_heads)).unwrap()
}

fn random_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = crate::seed::rng();
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// How [`compare_with_cpu`]'s random checkpoint is stored: its weights'
/// dtype, and safetensors (else llm.c's format).
#[derive(Clone, Copy)]
struct CheckpointFormat {
    dtype: DType,
    safetensors: bool,
}

/// llm.c's format in f32, the engine's usual checkpoint.
const LLMC_F32: CheckpointFormat = CheckpointFormat {
    dtype: DType::F32,
    safetensors: false,
};

/// GPU logits (all positions) against the CPU model's, for a random
/// checkpoint (made only when a GPU is there: the 124M one is large).
fn compare_with_cpu(
    what: &str,
    cfg: &ModelConfig,
    format: CheckpointFormat,
    b: usize,
    t: usize,
    precision: Precision,
    tol: f32,
) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let CheckpointFormat { dtype, safetensors } = format;
    let ckpt = checkpoint(cfg, crate::seed::rng().random(), dtype, safetensors);
    let w = ckpt.weights().unwrap();
    let cfg = w.config;
    let tokens = random_tokens(b * t, cfg.vocab_size);
    let mut cpu = CpuModel::new(&w, b, t).unwrap();
    cpu.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    let want = cpu.logits().unwrap();
    let mut eng = GpuEngine::new(gpu, &w, b, t, precision).unwrap();
    eng.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    let got = eng.logits().unwrap();
    assert_eq!(got.len(), b * t * cfg.padded_vocab_size);
    check(
        &format!("{what} logits {precision:?} B={b} T={t}"),
        &got,
        &want,
        tol,
        0.0,
    );
    // greedy ids at the last positions agree too (unless two logits are within the error)
    let ids = eng.argmax().unwrap();
    let cpu_ids = cpu.argmax().unwrap();
    let vp = cfg.padded_vocab_size;
    for (bi, (&g, &c)) in ids.iter().zip(&cpu_ids).enumerate() {
        let row = &want[((bi * t + t - 1) * vp)..((bi * t + t) * vp)];
        assert!(
            g == c || (row[g as usize] - row[c as usize]).abs() <= 2.0 * tol,
            "row {bi}: gpu {g}, cpu {c}"
        );
        assert!((g as usize) < cfg.vocab_size);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn logits_match_cpu_small_models() {
    compare_with_cpu(
        "tiny",
        &tiny_config(),
        LLMC_F32,
        4,
        64,
        Precision::Fp32,
        FP32_LOGITS_TOL,
    );
    compare_with_cpu("odd", &odd_config(), LLMC_F32, 3, 80, Precision::Fp32, FP32_LOGITS_TOL);
}

#[test]
#[ignore = "needs a GPU"]
fn logits_match_cpu_from_transposed_and_half_checkpoints() {
    // safetensors: Conv1D weights stored transposed, wte without padding rows
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let what = format!("tiny safetensors {dtype:?}");
        compare_with_cpu(
            &what,
            &tiny_config(),
            CheckpointFormat {
                dtype,
                safetensors: true,
            },
            4,
            64,
            Precision::Fp32,
            FP32_LOGITS_TOL,
        );
    }
    compare_with_cpu(
        "tiny llm.c bf16",
        &tiny_config(),
        CheckpointFormat {
            dtype: DType::BF16,
            safetensors: false,
        },
        2,
        33,
        Precision::Fp32,
        FP32_LOGITS_TOL,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn logits_match_cpu_gpt2_124m_b4_t64() {
    compare_with_cpu(
        "gpt2-124M",
        &ModelConfig::GPT2_124M,
        LLMC_F32,
        4,
        64,
        Precision::Fp32,
        FP32_LOGITS_TOL,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn tf32_logits_are_close_to_cpu() {
    // TF32 rounds inputs to 10 mantissa bits: a looser, documented bar.
    compare_with_cpu(
        "gpt2-124M",
        &ModelConfig::GPT2_124M,
        LLMC_F32,
        4,
        64,
        Precision::Tf32,
        TF32_LOGITS_TOL,
    );
}

/// Prefill `prompt` tokens for `b` rows, decode `steps` greedy tokens one at
/// a time, then recompute the whole sequence in one call: same tokens, and
/// each step's logits equal the recomputed ones at that position.
fn kv_decode_equals_recompute(cfg: &ModelConfig, b: usize, prompt: usize, steps: usize) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let ck = checkpoint(cfg, crate::seed::rng().random(), DType::F32, false);
    let w = ck.weights().unwrap();
    let (vp, total) = (cfg.padded_vocab_size, prompt + steps);
    let mut eng = GpuEngine::new(gpu, &w, b, total, Precision::Fp32).unwrap();
    let mut seqs: Vec<Vec<u32>> = (0..b).map(|_| random_tokens(prompt, cfg.vocab_size)).collect();
    let flat: Vec<u32> = seqs.concat();
    eng.forward(&flat, b, prompt, 0, LogitsWanted::Last).unwrap();
    let mut step_logits = vec![eng.logits().unwrap()];
    let mut next = eng.argmax().unwrap();
    for s in 0..steps - 1 {
        for (seq, &id) in seqs.iter_mut().zip(&next) {
            seq.push(id);
        }
        eng.forward(&next, b, 1, prompt + s, LogitsWanted::Last).unwrap();
        step_logits.push(eng.logits().unwrap());
        next = eng.argmax().unwrap();
    }
    for (seq, &id) in seqs.iter_mut().zip(&next) {
        seq.push(id);
    }
    // full recomputation of prompt + the first steps-1 generated tokens
    let t = total - 1;
    let flat: Vec<u32> = seqs.iter().flat_map(|s| s[..t].to_vec()).collect();
    eng.forward(&flat, b, t, 0, LogitsWanted::All).unwrap();
    let full = eng.logits().unwrap();
    let mut got = Vec::new();
    let mut want = Vec::new();
    for (s, logits) in step_logits.iter().enumerate() {
        let pos = prompt - 1 + s;
        for bi in 0..b {
            got.extend_from_slice(&logits[bi * vp..(bi + 1) * vp]);
            let row = bi * t + pos;
            let want_row = &full[row * vp..(row + 1) * vp];
            want.extend_from_slice(want_row);
            // the greedy token of the step is the argmax of the recomputed row
            let id = seqs[bi][pos + 1];
            let best = host::cpu::forward::argmax(&want_row[..cfg.vocab_size]);
            assert!(
                id == best || (want_row[id as usize] - want_row[best as usize]).abs() <= 2.0 * KV_TOL,
                "row {bi} step {s}: decoded {id}, recompute says {best}"
            );
        }
    }
    check(
        &format!(
            "KV decode vs recompute L={} C={} B={b} {steps} steps",
            cfg.num_layers, cfg.channels
        ),
        &got,
        &want,
        KV_TOL,
        0.0,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn kv_cache_decode_equals_full_recomputation_64_steps() {
    kv_decode_equals_recompute(&tiny_config(), 3, 8, 64);
    kv_decode_equals_recompute(&odd_config(), 1, 5, 64);
}

#[test]
#[ignore = "needs a GPU"]
fn kv_cache_decode_equals_full_recomputation_124m() {
    kv_decode_equals_recompute(&ModelConfig::GPT2_124M, 2, 16, 64);
}

/// Flash attention (the default) and the unfused attention kernel on one random
/// GPT-2 124M checkpoint (head size 64, so flash really runs): both within
/// the FP32 bar of the CPU, and of each other. T = 160 is not a multiple of
/// the 64-query tile; 4 decode steps then take the flash-decoding path.
#[test]
#[ignore = "needs a GPU"]
fn flash_and_unfused_attention_agree_124m() {
    const B: usize = 2;
    const T: usize = 160;
    const STEPS: usize = 4;
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = ModelConfig::GPT2_124M;
    let ck = checkpoint(&cfg, crate::seed::rng().random(), DType::F32, false);
    let w = ck.weights().unwrap();
    let tokens = random_tokens(B * T, cfg.vocab_size);
    let steps: Vec<Vec<u32>> = (0..STEPS).map(|_| random_tokens(B, cfg.vocab_size)).collect();
    let mut cpu = CpuModel::new(&w, B, T + STEPS).unwrap();
    cpu.forward(&tokens, B, T, 0, LogitsWanted::All).unwrap();
    let mut want = vec![cpu.logits().unwrap()];
    for (s, step) in steps.iter().enumerate() {
        cpu.forward(step, B, 1, T + s, LogitsWanted::Last).unwrap();
        want.push(cpu.logits().unwrap());
    }
    let mut eng = GpuEngine::new(gpu, &w, B, T + STEPS, Precision::Fp32).unwrap();
    assert_eq!(eng.attention_kind(), AttentionKind::Flash, "flash is the default");
    let mut got = Vec::new();
    for kind in [AttentionKind::Flash, AttentionKind::Unfused] {
        eng.set_attention_kind(kind);
        assert_eq!(eng.attention_in_use(), kind, "GPT-2 124M has head size 64");
        eng.forward(&tokens, B, T, 0, LogitsWanted::All).unwrap();
        let mut per_kind = vec![eng.logits().unwrap()];
        for (s, step) in steps.iter().enumerate() {
            eng.forward(step, B, 1, T + s, LogitsWanted::Last).unwrap();
            per_kind.push(eng.logits().unwrap());
        }
        for (i, (g, w)) in per_kind.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len());
            let what = if i == 0 {
                format!("prefill T={T}")
            } else {
                format!("decode step {i}")
            };
            check(
                &format!("{kind:?} attention vs CPU, {what}"),
                g,
                w,
                FP32_LOGITS_TOL,
                0.0,
            );
        }
        got.push(per_kind);
    }
    for (i, (f, u)) in got[0].iter().zip(&got[1]).enumerate() {
        check(&format!("flash vs unfused, call {i}"), f, u, FP32_LOGITS_TOL, 0.0);
    }
    // TF32 flash (tensor-core prefill) against the CPU, at the TF32 bar.
    eng.set_precision(Precision::Tf32).unwrap();
    eng.set_attention_kind(AttentionKind::Flash);
    eng.forward(&tokens, B, T, 0, LogitsWanted::All).unwrap();
    check(
        "flash TF32 vs CPU",
        &eng.logits().unwrap(),
        &want[0],
        TF32_LOGITS_TOL,
        0.0,
    );
}

/// Windowed attention end to end: engine with window W against CpuModel with
/// the same window, prefill of T >> W then decode steps (every query sees
/// only its last W keys), on both attention kinds. GPT-2 124M exercises the
/// flash kernels (W = 48 straddles the 64-key tiles); the tiny model (head
/// size 16) the unfused fallback.
#[test]
#[ignore = "needs a GPU"]
fn windowed_attention_matches_cpu() {
    windowed_case(&ModelConfig::GPT2_124M, 1, 256, 48, 4);
    windowed_case(&tiny_config(), 2, 100, 7, 8);
}

fn windowed_case(cfg: &ModelConfig, b: usize, t: usize, window: usize, steps: usize) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let ck = checkpoint(cfg, crate::seed::rng().random(), DType::F32, false);
    let w = ck.weights().unwrap();
    let tokens = random_tokens(b * t, cfg.vocab_size);
    let step_tokens: Vec<Vec<u32>> = (0..steps).map(|_| random_tokens(b, cfg.vocab_size)).collect();
    let mut cpu = CpuModel::new(&w, b, t + steps).unwrap();
    cpu.set_attention_window(window);
    cpu.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    let mut want = vec![cpu.logits().unwrap()];
    for (s, step) in step_tokens.iter().enumerate() {
        cpu.forward(step, b, 1, t + s, LogitsWanted::Last).unwrap();
        want.push(cpu.logits().unwrap());
    }
    let mut eng = GpuEngine::new(gpu, &w, b, t + steps, Precision::Fp32).unwrap();
    eng.set_attention_window(window);
    for kind in [AttentionKind::Flash, AttentionKind::Unfused] {
        eng.set_attention_kind(kind);
        eng.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
        let mut got = vec![eng.logits().unwrap()];
        for (s, step) in step_tokens.iter().enumerate() {
            eng.forward(step, b, 1, t + s, LogitsWanted::Last).unwrap();
            got.push(eng.logits().unwrap());
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            check(
                &format!(
                    "window {window} C={} {kind:?} (runs {:?}) B={b} T={t} call {i}",
                    cfg.channels,
                    eng.attention_in_use()
                ),
                g,
                w,
                FP32_LOGITS_TOL,
                0.0,
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bad_requests_are_errors() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = tiny_config();
    let ck = checkpoint(&cfg, 1, DType::F32, false);
    let w = ck.weights().unwrap();
    let mut eng = GpuEngine::new(gpu, &w, 2, 16, Precision::Fp32).unwrap();
    assert!(eng.logits().is_err(), "logits before forward");
    assert!(
        eng.forward(&[1; 3 * 4], 3, 4, 0, LogitsWanted::Last).is_err(),
        "b > max_batch"
    );
    assert!(
        eng.forward(&[1; 2 * 4], 2, 4, 13, LogitsWanted::Last).is_err(),
        "pos0 + t > max_seq_len"
    );
    assert!(
        eng.forward(&[cfg.vocab_size as u32, 0], 1, 2, 0, LogitsWanted::Last)
            .is_err(),
        "id >= vocab"
    );
    assert!(
        eng.forward(&[1; 3], 1, 2, 0, LogitsWanted::Last).is_err(),
        "wrong token count"
    );
    // still usable after the errors
    eng.forward(&[1, 2, 3, 4], 2, 2, 0, LogitsWanted::Last).unwrap();
    assert_eq!(eng.argmax().unwrap().len(), 2);
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    assert!(
        GpuEngine::new(gpu, &w, 1, cfg.max_seq_len + 1, Precision::Fp32).is_err(),
        "longer than the model's context"
    );
}

/// A tiny checkpoint whose padded vocabulary would win every greedy choice
/// if the argmax did not exclude it: the final layernorm's output is all
/// ones at every position (weight 0, bias 1), so a token's logit is the sum
/// of its `wte` row; the real rows sum to about -C (each entry in -1.5..-0.5)
/// and the padding rows of the file to +C. Whether an engine keeps the
/// file's padding rows (logit C) or zeroes them (logit 0), padding beats
/// every real token.
fn padding_would_win_checkpoint(cfg: &ModelConfig) -> Checkpoint {
    let (v, vp, c) = (cfg.vocab_size, cfg.padded_vocab_size, cfg.channels);
    assert!(vp > v, "the config must have padding");
    let mut bytes = llmc_bytes(cfg, 5, DType::F32).unwrap();
    let mut rng = crate::seed::rng();
    let put = |bytes: &mut [u8], float: usize, x: f32| {
        bytes[float * 4..float * 4 + 4].copy_from_slice(&x.to_le_bytes());
    };
    // llm.c F32: a 256-int header, then wte [Vp, C] first ... ln_f weight and
    // bias [C] each last.
    let header_floats = 256;
    for id in 0..vp {
        for k in 0..c {
            let x = if id < v {
                -1.0 + rng.random_range(-0.5f32..0.5)
            } else {
                1.0
            };
            put(&mut bytes, header_floats + id * c + k, x);
        }
    }
    let total_floats = bytes.len() / 4;
    for k in 0..c {
        put(&mut bytes, total_floats - 2 * c + k, 0.0);
        put(&mut bytes, total_floats - c + k, 1.0);
    }
    Checkpoint::from_bytes(bytes, "padding-wins.bin", Some(cfg.num_heads)).unwrap()
}

/// The engine's greedy choice (prefill, then decode steps) never picks a
/// padding id on logits where padding is the largest, and equals the CPU
/// reference's choice over the real vocabulary.
#[test]
#[ignore = "needs a GPU"]
fn argmax_excludes_padding_that_would_win() {
    let cfg = tiny_config();
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let ck = padding_would_win_checkpoint(&cfg);
    let w = ck.weights().unwrap();
    let (b, prompt, steps) = (3, 5, 6);
    let tokens = random_tokens(b * prompt, v);
    // The construction holds on the CPU reference: over the padded row the
    // maximum is in the padding, over the real vocabulary it is not.
    let mut cpu = CpuModel::new(&w, b, prompt + steps).unwrap();
    cpu.forward(&tokens, b, prompt, 0, LogitsWanted::Last).unwrap();
    let cpu_logits = cpu.logits().unwrap();
    for r in 0..b {
        let row = &cpu_logits[r * vp..(r + 1) * vp];
        let real_max = row[..v].iter().copied().fold(f32::MIN, f32::max);
        assert!(real_max < 0.0, "row {r}: a real logit {real_max} >= 0");
    }
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut eng = GpuEngine::new(gpu, &w, b, prompt + steps, Precision::Fp32).unwrap();
    eng.forward(&tokens, b, prompt, 0, LogitsWanted::Last).unwrap();
    let gpu_logits = eng.logits().unwrap();
    for r in 0..b {
        let row = &gpu_logits[r * vp..(r + 1) * vp];
        let real_max = row[..v].iter().copied().fold(f32::MIN, f32::max);
        let pad_max = row[v..].iter().copied().fold(f32::MIN, f32::max);
        assert!(
            pad_max > real_max,
            "row {r}: padding {pad_max} does not beat {real_max}: the test proves nothing"
        );
    }
    let mut next = eng.argmax().unwrap();
    let mut want = cpu.argmax().unwrap();
    for (s, pos) in (0..steps).zip(prompt..) {
        assert!(
            next.iter().all(|&id| (id as usize) < v),
            "step {s}: a padding id was chosen: {next:?}"
        );
        assert_eq!(next, want, "step {s}: GPU and CPU greedy choices differ");
        if s + 1 == steps {
            break;
        }
        eng.forward(&next, b, 1, pos, LogitsWanted::Last).unwrap();
        cpu.forward(&next, b, 1, pos, LogitsWanted::Last).unwrap();
        next = eng.argmax().unwrap();
        want = cpu.argmax().unwrap();
    }
}

/// `GPT2_ORACLE_DIR` holds what `scripts/hf_reference.py` writes (the format
/// `tests/cpu/oracle.rs` reads): a random-init transformers GPT-2 as
/// `model.safetensors` (+ `config.json`), `tokens.bin` (B*T little-endian
/// i32) and transformers' logits `logits.bin` (`[B, T, vocab_size]` f32).
#[test]
#[ignore = "needs a GPU"]
fn transformers_oracle() {
    const B: usize = 4;
    const T: usize = 64;
    let Some(dir) = crate::kernels::skip::oracle_dir() else {
        return;
    };
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let ck = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
    let w = ck.weights().unwrap();
    let ids: Vec<u32> = read_le_words(&dir.join("tokens.bin"))
        .into_iter()
        .map(|b| i32::from_le_bytes(b) as u32)
        .collect();
    let want: Vec<f32> = read_le_words(&dir.join("logits.bin"))
        .into_iter()
        .map(f32::from_le_bytes)
        .collect();
    let (v, vp) = (w.config.vocab_size, w.config.padded_vocab_size);
    assert_eq!(ids.len(), B * T, "tokens.bin");
    assert_eq!(want.len(), B * T * v, "logits.bin");
    let mut eng = GpuEngine::new(gpu, &w, B, T, Precision::Fp32).unwrap();
    for precision in [Precision::Fp32, Precision::Tf32] {
        eng.set_precision(precision).unwrap();
        eng.forward(&ids, B, T, 0, LogitsWanted::All).unwrap();
        let got = eng.logits().unwrap();
        let got: Vec<f32> = (0..B * T).flat_map(|r| got[r * vp..r * vp + v].to_vec()).collect();
        match precision {
            // The FP32 path must meet the bar.
            Precision::Fp32 => {
                check("transformers oracle logits fp32", &got, &want, FP32_LOGITS_TOL, 0.0);
            }
            // TF32 rounds matmul inputs to 10-bit mantissas: measured and reported, held to a loose bar.
            Precision::Tf32 => {
                check("transformers oracle logits tf32", &got, &want, TF32_ORACLE_TOL, 0.0);
            }
            Precision::Bf16 => unreachable!("the bf16 engine is made below"),
        }
    }
    // bf16 stores the weights so: another engine.
    drop(eng);
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut eng = GpuEngine::new(gpu, &w, B, T, Precision::Bf16).unwrap();
    eng.forward(&ids, B, T, 0, LogitsWanted::All).unwrap();
    let got = eng.logits().unwrap();
    let got: Vec<f32> = (0..B * T).flat_map(|r| got[r * vp..r * vp + v].to_vec()).collect();
    check("transformers oracle logits bf16", &got, &want, BF16_ORACLE_TOL, 0.0);
}

/// Loose bound for TF32 logits against transformers' FP32 (measured error is printed).
const TF32_ORACLE_TOL: f32 = 5e-2;
/// Loose bound for bf16 logits against transformers' FP32: bf16 keeps 8
/// mantissa bits to TF32's 11, so about 8x TF32's error (measured error is
/// printed; docs/precision.md has the table).
const BF16_ORACLE_TOL: f32 = 0.4;

/// A file of little-endian 4-byte words.
fn read_le_words(path: &std::path::Path) -> Vec<[u8; 4]> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| [b[0], b[1], b[2], b[3]])
        .collect()
}
