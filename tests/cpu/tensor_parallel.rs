//! Tensor parallelism's arithmetic on the CPU: GPT-2 split over simulated
//! ranks (`host::tp::cpu::CpuTp`: heads, MLP units and vocabulary per rank,
//! partial projections summed as an all-reduce would) against the unsplit
//! CPU reference, prefill and KV-cache decode, for several rank counts and
//! an uneven split.

use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, odd_config, tiny_config};
use host::model::{DType, ModelConfig};
use host::tp::cpu::CpuTp;
use rand::Rng;

/// Logits of the split model against the unsplit one: both are f32 sums of
/// the same products, the split ones grouped per rank (each projection's
/// inner sum cut in `world` pieces), so they differ by a few roundings.
const TP_TOL: f32 = 1e-5;

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Prefill of `b` random rows of `t` tokens, then `steps` decode steps fed
/// the reference's greedy choices, comparing logits and choices at each.
fn split_matches_reference(config: ModelConfig, world: usize, b: usize, t: usize, steps: usize) {
    let mut rng = crate::seed::rng();
    let bytes = llmc_bytes(&config, rng.random(), DType::F32).unwrap();
    let ckpt = Checkpoint::from_bytes(bytes, "random.bin", None).unwrap();
    let weights = ckpt.weights().unwrap();
    let max_t = t + steps;
    let mut reference = CpuModel::new(&weights, b, max_t).unwrap();
    let mut split = CpuTp::new(&weights, world, b, max_t).unwrap();
    assert_eq!(split.world(), world);
    let mut tokens: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let (mut pos, mut len) = (0, t);
    for step in 0..=steps {
        let want = if step == 0 {
            LogitsWanted::All
        } else {
            LogitsWanted::Last
        };
        reference.forward(&tokens, b, len, pos, want).unwrap();
        split.forward(&tokens, b, len, pos, want).unwrap();
        let err = max_abs_diff(&split.logits().unwrap(), &reference.logits().unwrap());
        assert!(err <= TP_TOL, "{world} ranks, step {step}: max abs diff {err:e}");
        let chosen = reference.argmax().unwrap();
        assert_eq!(
            split.argmax().unwrap(),
            chosen,
            "{world} ranks, step {step}: greedy choice"
        );
        (pos, len, tokens) = (pos + len, 1, chosen);
    }
}

#[test]
fn tensor_parallel_matches_reference_tiny() {
    // 4 heads: 1, 2, 3 (uneven: 2 + 1 + 1) and 4 ranks.
    for world in 1..=4 {
        split_matches_reference(tiny_config(), world, 2, 9, 4);
    }
}

#[test]
fn tensor_parallel_matches_reference_odd_shape() {
    // 3 heads of 32, a vocabulary of 517 padded to 640: at 3 ranks it
    // splits 256 / 192 / 192 rows, the last holding ids 448..517 and the
    // padding (which the greedy choice must skip).
    for world in [2, 3] {
        split_matches_reference(odd_config(), world, 3, 7, 3);
    }
}

#[test]
fn tensor_parallel_refuses_more_ranks_than_heads() {
    let config = tiny_config();
    let bytes = llmc_bytes(&config, 1, DType::F32).unwrap();
    let ckpt = Checkpoint::from_bytes(bytes, "random.bin", None).unwrap();
    let err = CpuTp::new(&ckpt.weights().unwrap(), 5, 1, 8)
        .err()
        .expect("5 ranks over 4 heads");
    assert!(err.to_string().contains("attention heads"), "{err}");
}
