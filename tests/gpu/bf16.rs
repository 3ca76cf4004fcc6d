//! The bf16 precision: the weight upload to bf16, the embedding
//! over a bf16 table, and the whole engine in bf16 against its CPU twin
//! (`CpuModel::new_bf16`: the same bf16 weights, every matmul input rounded
//! to bf16) and against the FP32 CPU reference (the error bf16 costs,
//! printed and held to a loose bound). The decode paths in bf16 are in
//! `decode.rs` (`decode_graph_bf16*`).

use gpu_host::shape::EncoderShape;
use half::bf16;
use host::cpu::CpuModel;
use host::cpu::ops as cpu;
use host::generate::{Backend, LogitsWanted};
use host::gpu::engine::{GpuEngine, Precision};
use host::gpu::ops::convert::convert_to_bf16;
use host::gpu::ops::encoder::encoder_forward_bf16;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{encode, llmc_bytes};
use host::model::{DType, ModelConfig, Tensor};
use rand::Rng;

use crate::kernels::{check, down, poisoned, random_vec};

/// The GPU bf16 engine against its CPU twin: both multiply the same bf16
/// values; what differs is summation order, bf16 attention in prefill, and
/// activations that f32 noise moves across a bf16 rounding boundary (see
/// `decode.rs`'s `BF16_TOL`, the same reasoning).
const TWIN_TOL: f32 = 5e-2;
/// bf16 against the FP32 reference: the error of the format itself, a
/// loose bound (the measured value is printed; docs/precision.md).
const FP32_REF_TOL: f32 = 0.25;

#[test]
#[ignore = "needs a GPU"]
fn convert_to_bf16_rounds_like_half() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for transposed in [false, true] {
            let (rows, cols) = (37, 129);
            let values = random_vec(rows * cols, 3.0);
            let bytes = encode(&values, dtype);
            let t = Tensor {
                shape: [rows, cols],
                dtype,
                transposed,
                bytes: &bytes,
            };
            let want: Vec<u16> = t.to_f32().iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
            let raw = gpu.upload(&bytes).unwrap();
            // Poison: 0xffff is a NaN pattern no conversion here produces.
            let mut out = gpu.upload(&vec![bf16::from_bits(0xffff); rows * cols]).unwrap();
            convert_to_bf16(&gpu, &mut out, &raw, rows, cols, dtype, transposed).unwrap();
            let got: Vec<u16> = gpu.download(&out).unwrap().iter().map(|x| x.to_bits()).collect();
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(
                bad, 0,
                "convert_to_bf16 {dtype:?} transposed={transposed}: {bad} values differ"
            );
        }
    }
    // Ties round to even, as half does: 1 + 2^-8 lies halfway between two
    // bf16 values and goes to 1.0; 1 + 3 * 2^-8 goes up.
    let ties = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -(1.0 + 2f32.powi(-8))];
    let bytes = encode(&ties, DType::F32);
    let raw = gpu.upload(&bytes).unwrap();
    let mut out = gpu.upload(&[bf16::from_bits(0xffff); 3]).unwrap();
    convert_to_bf16(&gpu, &mut out, &raw, 1, 3, DType::F32, false).unwrap();
    let got: Vec<f32> = gpu.download(&out).unwrap().iter().map(|x| x.to_f32()).collect();
    assert_eq!(got, vec![1.0, 1.0 + 4.0 * 2f32.powi(-8), -1.0]);
}

#[test]
#[ignore = "needs a GPU"]
fn encoder_bf16_matches_cpu() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (vocab, max_t) = (517, 1024);
    for &(b, t, c, pos0) in &[(1, 1, 768, 0), (3, 37, 768, 5), (2, 9, 192, 1000)] {
        let wte: Vec<bf16> = random_vec(vocab * c, 1.0).into_iter().map(bf16::from_f32).collect();
        let wte_f32: Vec<f32> = wte.iter().map(|x| x.to_f32()).collect();
        let wpe = random_vec(max_t * c, 1.0);
        let ids: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..vocab as u32)).collect();
        let mut want = vec![0f32; b * t * c];
        cpu::encoder_forward(&mut want, &ids, &wte_f32, &wpe, EncoderShape { b, t, c, pos0 });
        let (dwte, dwpe, dids) = (
            gpu.upload(&wte).unwrap(),
            gpu.upload(&wpe).unwrap(),
            gpu.upload(&ids).unwrap(),
        );
        let mut out = poisoned(&gpu, b * t * c);
        encoder_forward_bf16(&gpu, &mut out, &dids, &dwte, &dwpe, EncoderShape { b, t, c, pos0 }).unwrap();
        // Widening bf16 is exact, and the one f32 add is the CPU's.
        check(
            &format!("encoder bf16 b={b} t={t} c={c} pos0={pos0}"),
            &down(&gpu, &out),
            &want,
            0.0,
            0.0,
        );
    }
}

/// A small GPT-2 with head size 64 (the fused decode kernels') and C a
/// multiple of 8 (bf16's).
fn small_config() -> ModelConfig {
    let vocab_size = 1000;
    ModelConfig {
        max_seq_len: 128,
        vocab_size,
        padded_vocab_size: ModelConfig::pad_vocab(vocab_size),
        num_layers: 2,
        num_heads: 3,
        channels: 192,
    }
}

/// Prefill of every position (`LogitsWanted::All`) in bf16, then a few
/// greedy decode steps: against the bf16 CPU twin within [`TWIN_TOL`], and
/// against the FP32 CPU reference within [`FP32_REF_TOL`], from checkpoints
/// stored in f32 (converted at upload) and in bf16 (uploaded as stored).
fn engine_matches_twin(cfg: &ModelConfig, stored: DType, b: usize, t: usize, steps: usize) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let seed: u64 = crate::seed::rng().random();
    eprintln!("bf16 engine: checkpoint seed {seed}");
    let bytes = llmc_bytes(cfg, seed, stored).unwrap();
    let ck = Checkpoint::from_bytes(bytes, "random.bin", Some(cfg.num_heads)).unwrap();
    let w = ck.weights().unwrap();
    let mut rng = crate::seed::rng();
    let prompt: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let max_t = t + steps;
    let mut eng = GpuEngine::new(gpu, &w, b, max_t, Precision::Bf16).unwrap();
    let mut twin = CpuModel::new_bf16(&w, b, max_t).unwrap();
    let mut fp32 = CpuModel::new(&w, b, max_t).unwrap();
    let what = |s: &str| {
        format!(
            "{s} stored {stored:?} L={} C={} B={b} T={t}",
            cfg.num_layers, cfg.channels
        )
    };

    let run = |m: &mut dyn Backend, ids: &[u32], t: usize, pos0: usize, want: LogitsWanted| {
        m.forward(ids, b, t, pos0, want).unwrap();
        m.logits().unwrap()
    };
    let got = run(&mut eng, &prompt, t, 0, LogitsWanted::All);
    check(
        &what("bf16 prefill vs bf16 CPU twin"),
        &got,
        &run(&mut twin, &prompt, t, 0, LogitsWanted::All),
        TWIN_TOL,
        0.0,
    );
    check(
        &what("bf16 prefill vs FP32 CPU"),
        &got,
        &run(&mut fp32, &prompt, t, 0, LogitsWanted::All),
        FP32_REF_TOL,
        0.0,
    );
    // Decode steps (the fused bf16 GEMV path), fed the twin's choices so
    // both see the same tokens.
    let (mut on_gpu, mut on_twin) = (Vec::new(), Vec::new());
    let mut ids = twin.argmax().unwrap();
    for s in 0..steps {
        on_gpu.push(run(&mut eng, &ids, 1, t + s, LogitsWanted::Last));
        on_twin.push(run(&mut twin, &ids, 1, t + s, LogitsWanted::Last));
        ids = twin.argmax().unwrap();
    }
    check(
        &what("bf16 decode vs bf16 CPU twin"),
        &on_gpu.concat(),
        &on_twin.concat(),
        TWIN_TOL,
        0.0,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn engine_bf16_matches_its_cpu_twin() {
    engine_matches_twin(&small_config(), DType::F32, 3, 40, 8);
    engine_matches_twin(&small_config(), DType::BF16, 2, 17, 8);
}

#[test]
#[ignore = "needs a GPU"]
fn engine_bf16_124m_matches_its_cpu_twin() {
    engine_matches_twin(&ModelConfig::GPT2_124M, DType::F32, 1, 64, 8);
}

/// Precision is fixed with the weights' format: an engine made in bf16
/// refuses FP32, and one made in FP32 refuses bf16, with a message.
#[test]
#[ignore = "needs a GPU"]
fn bf16_engine_refuses_other_formats() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = small_config();
    let bytes = llmc_bytes(&cfg, 7, DType::F32).unwrap();
    let ck = Checkpoint::from_bytes(bytes, "random.bin", Some(cfg.num_heads)).unwrap();
    let w = ck.weights().unwrap();
    let mut eng = GpuEngine::new(gpu, &w, 1, 16, Precision::Bf16).unwrap();
    let err = eng.set_precision(Precision::Fp32).unwrap_err().to_string();
    assert!(err.contains("create the engine with Fp32"), "{err}");
    assert!(eng.set_precision(Precision::Bf16).is_ok());
}
