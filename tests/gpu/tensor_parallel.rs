//! Tensor parallelism over NCCL (`host::gpu::engine::TpEngine`): two GPUs
//! against one GPU and the CPU reference, prefill and KV-cache decode; the
//! collectives themselves; and the refusals a one-GPU machine can check.
//!
//! Tests whose names hold `two_gpus` need two GPUs: elsewhere they skip
//! visibly, or fail where `GPT2_REQUIRE_MULTI_GPU=1` says two are required
//! (the GPU runner leaves them out on a one-GPU machine, and sets it on a
//! machine with more).

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::CudaSlice;
use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision, TpEngine};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::llmc_bytes;
use host::model::{DType, ModelConfig};
use rand::Rng;

use crate::decode::head64_config;
use crate::kernels::skip;

/// Makes a machine with fewer than two GPUs a failure for the `two_gpus` tests.
pub const REQUIRE_MULTI_GPU_ENV: &str = "GPT2_REQUIRE_MULTI_GPU";
/// The bar: TP logits against one GPU's, FP32 (both run the same
/// kinds of kernels; only the projections' inner sums are cut in two).
/// Checked with the FP32 matmuls on the CUDA cores, whose products are
/// exact f32 ones.
const TP_VS_ONE_GPU_TOL: f32 = 1e-5;
/// The same with the default 3xTF32 tensor-core matmuls, whose products
/// each carry up to ~2^-21 of relative error (the dropped small·small
/// term, the small halves rounded) and whose tiles and k splits follow the
/// shapes, which TP halves: two such engines differ by more than two plain
/// FP32 ones. Measured on 2 x H100 (2026-11-27, 13 seeds) at the 65-token
/// prefill of GPT-2's widths: 1.29-1.49e-5 between them, TP 2.0-2.4e-5 and
/// one GPU 2.5-3.1e-5 from the CPU reference (on the CUDA cores: 3.7-5.0e-6
/// between them, each under 4.1e-6 from the CPU); the bar leaves 2x.
const TP_VS_ONE_GPU_TC_TOL: f32 = 3e-5;
/// The FP32 bar against the CPU reference.
const FP32_TOL: f32 = 1e-3;

/// Held by every test that starts NCCL. Communicators used from several
/// threads at once on the same GPUs can deadlock (each one's kernels wait
/// for their peers while the other's hold the GPU): on two H100s, two of
/// these tests run side by side hung past the runner's timeout.
static NCCL: Mutex<()> = Mutex::new(());

/// The NCCL tests' turn (a failed test's poison is no reason to stop the rest).
fn nccl_turn() -> MutexGuard<'static, ()> {
    NCCL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// GPUs 0 and 1, or `None` after skipping (one GPU) or with no GPU.
pub fn two_gpus() -> Option<(Gpu, Gpu)> {
    let first = skip::gpu()?;
    match Gpu::new(1) {
        Ok(second) => Some((first, second)),
        Err(e) => {
            skip::unless_required(REQUIRE_MULTI_GPU_ENV, format_args!("needs two GPUs ({e})"));
            None
        }
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// GPT-2 124M's layer shapes (768 channels, 12 heads, the real vocabulary),
/// two layers.
fn gpt2_two_layers() -> ModelConfig {
    ModelConfig {
        num_layers: 2,
        ..ModelConfig::GPT2_124M
    }
}

/// Prefill `b` rows of `t` random tokens, then `steps` greedy decode steps
/// (as CUDA graphs or queued kernels), on TP over two GPUs, one GPU and the
/// CPU; every step's logits compared.
/// TP on two GPUs against one GPU and the CPU: a prefill of `t` tokens a
/// row (every position's logits), then `steps` greedy decode steps (as
/// graphs or queued), then the KV cache against recomputation. FP32
/// matmuls on the tensor cores (3xTF32) or the CUDA cores, in both engines
/// alike (`tensor_cores`), with the bar for that path.
fn tp_matches(config: ModelConfig, b: usize, t: usize, steps: usize, graphs: bool, tensor_cores: bool) {
    let tol = if tensor_cores {
        TP_VS_ONE_GPU_TC_TOL
    } else {
        TP_VS_ONE_GPU_TOL
    };
    let _turn = nccl_turn();
    let Some((g0, g1)) = two_gpus() else { return };
    let mut rng = crate::seed::rng();
    let bytes = llmc_bytes(&config, rng.random(), DType::F32).unwrap();
    let ckpt = Checkpoint::from_bytes(bytes, "random.bin", Some(config.num_heads)).unwrap();
    let weights = ckpt.weights().unwrap();
    let max_t = t + steps;
    let mut tp = TpEngine::new(vec![g0, g1], &weights, b, max_t, Precision::Fp32).unwrap();
    assert_eq!(tp.world(), 2);
    tp.set_decode_graphs(graphs);
    tp.set_fp32_tensor_cores(tensor_cores);
    let mut one = GpuEngine::new(Gpu::new(0).unwrap(), &weights, b, max_t, Precision::Fp32).unwrap();
    one.set_fp32_tensor_cores(tensor_cores);
    let mut cpu = CpuModel::new(&weights, b, max_t).unwrap();
    let mut tokens: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let mut history: Vec<Vec<u32>> = tokens.chunks(t).map(<[u32]>::to_vec).collect();
    let (mut pos, mut len) = (0, t);
    let mut worst = 0f32;
    for step in 0..=steps {
        let want = if step == 0 {
            LogitsWanted::All
        } else {
            LogitsWanted::Last
        };
        tp.forward(&tokens, b, len, pos, want).unwrap();
        one.forward(&tokens, b, len, pos, want).unwrap();
        cpu.forward(&tokens, b, len, pos, want).unwrap();
        let got = tp.logits().unwrap();
        let (one_l, cpu_l) = (one.logits().unwrap(), cpu.logits().unwrap());
        let (vs_one, vs_cpu) = (max_abs_diff(&got, &one_l), max_abs_diff(&got, &cpu_l));
        let one_vs_cpu = max_abs_diff(&one_l, &cpu_l);
        println!(
            "step {step} (FP32 tensor cores {tensor_cores}): TP vs one GPU {vs_one:.3e}, TP vs CPU {vs_cpu:.3e}, one GPU vs CPU {one_vs_cpu:.3e}"
        );
        assert!(vs_one <= tol, "step {step}: TP vs one GPU {vs_one:e} (bar {tol:e})");
        assert!(vs_cpu <= FP32_TOL, "step {step}: TP vs CPU {vs_cpu:e}");
        worst = worst.max(vs_one);
        let chosen = one.argmax().unwrap();
        assert_eq!(tp.argmax().unwrap(), chosen, "step {step}: greedy choice");
        for (h, &id) in history.iter_mut().zip(&chosen) {
            h.push(id);
        }
        (pos, len, tokens) = (pos + len, 1, chosen);
    }
    // The graphs really ran (a failed capture falls back to queued kernels).
    assert_eq!(tp.decode_graph_error(), None, "capturing the decode step");
    // KV-cache decoding equals recomputing the whole sequence (without the
    // last choice, which no step has fed yet).
    let full: Vec<u32> = history.iter().flat_map(|h| h[..h.len() - 1].to_vec()).collect();
    let n = t + steps;
    let decoded = tp.logits().unwrap();
    tp.forward(&full, b, n, 0, LogitsWanted::Last).unwrap();
    let recomputed = tp.logits().unwrap();
    let err = max_abs_diff(&decoded, &recomputed);
    assert!(err <= tol, "KV-cache decode vs recomputation: {err:e} (bar {tol:e})");
    println!("worst TP vs one GPU over the run: {worst:.3e}; decode vs recompute {err:.3e}");
}

#[test]
#[ignore = "needs two GPUs"]
fn tensor_parallel_two_gpus_head64_uneven() {
    // 3 heads over 2 ranks (2 + 1); a vocabulary of 1000 padded to 1024.
    tp_matches(head64_config(), 3, 37, 5, true, true);
}

#[test]
#[ignore = "needs two GPUs"]
fn tensor_parallel_two_gpus_queued_decode() {
    tp_matches(head64_config(), 2, 20, 3, false, true);
}

#[test]
#[ignore = "needs two GPUs"]
fn tensor_parallel_two_gpus_gpt2_shapes() {
    // GPT-2 124M's widths: 65 tokens a row take the tensor-core matmuls
    // (the default), or with them off the CUDA cores' FP32 kernels.
    tp_matches(gpt2_two_layers(), 2, 65, 4, true, false);
    tp_matches(gpt2_two_layers(), 2, 65, 4, true, true);
}

#[test]
#[ignore = "needs two GPUs"]
fn tensor_parallel_two_gpus_collectives() {
    let _turn = nccl_turn();
    let Some((g0, g1)) = two_gpus() else { return };
    let collective = host::gpu::nccl::Collective::new(&[&g0, &g1]).unwrap();
    assert_eq!(collective.ordinals(), &[0, 1]);
    let n = 10_001;
    let (a, b) = (crate::kernels::random_vec(n, 1.0), crate::kernels::random_vec(n, 1.0));
    let (mut da, mut db) = (g0.upload(&a).unwrap(), g1.upload(&b).unwrap());
    // Only the first n - 1 values take part: the last stays as it was.
    collective.all_reduce_sum(&mut [&mut da, &mut db], n - 1).unwrap();
    let (ra, rb) = (g0.download(&da).unwrap(), g1.download(&db).unwrap());
    for i in 0..n - 1 {
        assert_eq!(ra[i], a[i] + b[i], "rank 0, value {i}");
        assert_eq!(rb[i], a[i] + b[i], "rank 1, value {i}");
    }
    assert_eq!(
        (ra[n - 1], rb[n - 1]),
        (a[n - 1], b[n - 1]),
        "values past len untouched"
    );
    let (mut ga, mut gb): (CudaSlice<f32>, CudaSlice<f32>) = (g0.alloc(2 * n).unwrap(), g1.alloc(2 * n).unwrap());
    collective.all_gather(&[&da, &db], &mut [&mut ga, &mut gb], n).unwrap();
    let want: Vec<f32> = ra.iter().chain(&rb).copied().collect();
    assert_eq!(g0.download(&ga).unwrap(), want);
    assert_eq!(g1.download(&gb).unwrap(), want);
    // A buffer too short for the call is an error, not a read past its end.
    let err = collective.all_reduce_sum(&mut [&mut da, &mut db], n + 1).unwrap_err();
    assert!(err.to_string().contains("needs"), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn tensor_parallel_refuses_one_device_twice() {
    let Some(g0) = skip::gpu() else { return };
    let config = head64_config();
    let bytes = llmc_bytes(&config, 1, DType::F32).unwrap();
    let ckpt = Checkpoint::from_bytes(bytes, "random.bin", Some(config.num_heads)).unwrap();
    let twice = vec![g0, Gpu::new(0).unwrap()];
    let err = TpEngine::new(twice, &ckpt.weights().unwrap(), 1, 16, Precision::Fp32)
        .err()
        .expect("one device twice");
    assert!(format!("{err:#}").contains("distinct GPUs"), "{err:#}");
    let bf16 = TpEngine::new(
        vec![Gpu::new(0).unwrap()],
        &ckpt.weights().unwrap(),
        1,
        16,
        Precision::Bf16,
    )
    .err()
    .expect("bf16");
    assert!(format!("{bf16:#}").contains("FP32 only"), "{bf16:#}");
}
