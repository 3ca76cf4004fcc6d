//! The CPU reference against Hugging Face transformers (the oracle). The
//! reference is made on the GPU machine by `scripts/hf_reference.py OUT_DIR`;
//! this test runs when `GPT2_ORACLE_DIR=OUT_DIR` is set, skips otherwise
//! (`SKIPPED: ...`, through `crate::skip::oracle_dir`; fails instead when
//! `GPT2_REQUIRE_ORACLE=1`).

use std::path::PathBuf;

use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::model::checkpoint::Checkpoint;

/// Largest allowed |CPU - transformers| over all logits.
const MAX_ABS_TOL: f32 = 1e-4;
const BATCH: usize = 4;
const SEQ_LEN: usize = 64;

fn read_le<T>(path: &PathBuf, conv: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    bytes.chunks_exact(4).map(|c| conv([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn cpu_logits_match_transformers() {
    let Some(dir) = crate::skip::oracle_dir() else { return };
    let ckpt = Checkpoint::open(&dir.join("model.safetensors")).expect("loading the transformers checkpoint");
    let cfg = *ckpt.config();
    let v = cfg.vocab_size;
    let tokens: Vec<u32> = read_le(&dir.join("tokens.bin"), |b| i32::from_le_bytes(b) as u32);
    let want: Vec<f32> = read_le(&dir.join("logits.bin"), f32::from_le_bytes);
    assert_eq!(tokens.len(), BATCH * SEQ_LEN, "tokens.bin");
    assert_eq!(want.len(), BATCH * SEQ_LEN * v, "logits.bin");

    let mut model = CpuModel::new(&ckpt.weights().unwrap(), BATCH, SEQ_LEN).unwrap();
    model.forward(&tokens, BATCH, SEQ_LEN, 0, LogitsWanted::All).unwrap();
    let got = model.logits().unwrap();
    let vp = cfg.padded_vocab_size;
    let (mut max_abs, mut sq, mut worst) = (0f32, 0f64, 0);
    for r in 0..BATCH * SEQ_LEN {
        for i in 0..v {
            let d = (got[r * vp + i] - want[r * v + i]).abs();
            sq += (d as f64) * (d as f64);
            if d > max_abs {
                max_abs = d;
                worst = r * v + i;
            }
        }
    }
    let rmse = (sq / (BATCH * SEQ_LEN * v) as f64).sqrt();
    let mismatched = (0..BATCH * SEQ_LEN)
        .filter(|&r| {
            host::cpu::forward::argmax(&got[r * vp..r * vp + v])
                != host::cpu::forward::argmax(&want[r * v..(r + 1) * v])
        })
        .count();
    println!(
        "oracle (B={BATCH}, T={SEQ_LEN}, {}): CPU vs transformers max abs {max_abs:.3e}, RMSE {rmse:.3e}, argmax mismatches {mismatched}/{}",
        dir.display(),
        BATCH * SEQ_LEN
    );
    assert!(
        max_abs <= MAX_ABS_TOL,
        "max abs error {max_abs:e} > {MAX_ABS_TOL:e} at row {}, token {}",
        worst / v,
        worst % v
    );
}
