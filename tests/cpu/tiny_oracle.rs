//! The CPU model against Hugging Face transformers on a committed tiny GPT-2
//! (tests/data/tiny_oracle, made by scripts/make_tiny_oracle.py): runs in every
//! `cargo test`, with no GPU, torch or network. The checkpoint is loaded by the
//! normal loader (safetensors + config.json), so loader and model are checked
//! together. The full 124M-shape oracle (tests/cpu/oracle.rs) still needs the
//! GPU machine.

use std::path::{Path, PathBuf};

use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted};
use host::model::{Checkpoint, DType, Format, ModelConfig};

/// Largest allowed |CPU - transformers| over all logits.
const MAX_ABS_TOL: f32 = 1e-4;
/// Shapes written by the script (see its constants and reference.json).
const BATCH: usize = 2;
const SEQ_LEN: usize = 32;
const CONFIG: ModelConfig = ModelConfig {
    max_seq_len: 64,
    vocab_size: 500,
    padded_vocab_size: 512,
    num_layers: 2,
    num_heads: 4,
    channels: 64,
};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_oracle")
}

fn read_le<T>(path: &Path, conv: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(
        bytes.len() % 4,
        0,
        "{}: not a whole number of 4-byte values",
        path.display()
    );
    bytes.chunks_exact(4).map(|c| conv([c[0], c[1], c[2], c[3]])).collect()
}

/// The committed reference: the opened checkpoint, token ids `[B, T]` and
/// logits `[B, T, V]`.
fn reference() -> (Checkpoint, Vec<u32>, Vec<f32>) {
    let dir = data_dir();
    let ckpt = Checkpoint::open(&dir.join("model.safetensors")).expect("loading the committed tiny checkpoint");
    assert_eq!(ckpt.format(), Format::Safetensors);
    assert_eq!(ckpt.dtype(), DType::BF16);
    assert_eq!(
        *ckpt.config(),
        CONFIG,
        "config read from model.safetensors + config.json"
    );
    let tokens: Vec<u32> = read_le(&dir.join("tokens.bin"), |b| {
        u32::try_from(i32::from_le_bytes(b)).expect("negative token id")
    });
    let logits: Vec<f32> = read_le(&dir.join("logits.bin"), f32::from_le_bytes);
    assert_eq!(tokens.len(), BATCH * SEQ_LEN, "tokens.bin");
    assert_eq!(logits.len(), BATCH * SEQ_LEN * CONFIG.vocab_size, "logits.bin");
    assert!(tokens.iter().all(|&t| (t as usize) < CONFIG.vocab_size));
    // The reference must be informative: a tolerance of 1e-4 means little
    // against logits that are all close to zero.
    let max_logit = logits.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(
        max_logit > 1.0,
        "reference logits are too small (max |x| = {max_logit})"
    );
    (ckpt, tokens, logits)
}

/// Max abs difference, RMSE, and the (row, token) of the worst difference
/// between `got` rows (stride Vp) and `want` rows (stride V).
struct Diff {
    max_abs: f32,
    rmse: f64,
    worst: (usize, usize),
    argmax_mismatches: usize,
}

fn compare(got: &[f32], want: &[f32], rows: usize) -> Diff {
    let (v, vp) = (CONFIG.vocab_size, CONFIG.padded_vocab_size);
    assert_eq!(got.len(), rows * vp, "CPU logits length");
    assert_eq!(want.len(), rows * v, "reference logits length");
    let (mut max_abs, mut sq, mut worst, mut argmax_mismatches) = (0f32, 0f64, (0, 0), 0);
    for r in 0..rows {
        let (g, w) = (&got[r * vp..r * vp + v], &want[r * v..(r + 1) * v]);
        for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
            let d = (a - b).abs();
            assert!(d.is_finite(), "row {r}, token {i}: CPU {a}, transformers {b}");
            sq += f64::from(d) * f64::from(d);
            if d > max_abs {
                max_abs = d;
                worst = (r, i);
            }
        }
        if host::cpu::forward::argmax(g) != host::cpu::forward::argmax(w) {
            argmax_mismatches += 1;
        }
    }
    Diff {
        max_abs,
        rmse: (sq / (rows * v) as f64).sqrt(),
        worst,
        argmax_mismatches,
    }
}

fn check(what: &str, d: &Diff, rows: usize) {
    let summary = format!(
        "{what}: CPU vs transformers over {rows} positions x {} tokens: max abs {:.3e} (row {}, token {}), RMSE {:.3e}, argmax mismatches {}",
        CONFIG.vocab_size, d.max_abs, d.worst.0, d.worst.1, d.rmse, d.argmax_mismatches
    );
    println!("{summary}");
    assert!(
        d.max_abs <= MAX_ABS_TOL,
        "{summary}: above the tolerance {MAX_ABS_TOL:e}"
    );
}

#[test]
fn cpu_prefill_logits_match_transformers() {
    let (ckpt, tokens, want) = reference();
    let mut model = CpuModel::new(&ckpt.weights().unwrap(), BATCH, SEQ_LEN).unwrap();
    model.forward(&tokens, BATCH, SEQ_LEN, 0, LogitsWanted::All).unwrap();
    let got = model.logits().unwrap();
    check(
        "prefill (B=2, T=32)",
        &compare(&got, &want, BATCH * SEQ_LEN),
        BATCH * SEQ_LEN,
    );
}

/// A prefix through `forward`, then one token at a time through the KV cache:
/// every step's logits against transformers' logits of that position.
#[test]
fn cpu_kv_cache_decode_matches_transformers() {
    const PREFIX: usize = 7;
    let (ckpt, tokens, want) = reference();
    let v = CONFIG.vocab_size;
    let mut model = CpuModel::new(&ckpt.weights().unwrap(), BATCH, SEQ_LEN).unwrap();
    let row_slice = |t0: usize, t1: usize| -> Vec<u32> {
        (0..BATCH)
            .flat_map(|b| tokens[b * SEQ_LEN + t0..b * SEQ_LEN + t1].iter().copied())
            .collect()
    };
    let want_at = |t: usize| -> Vec<f32> {
        (0..BATCH)
            .flat_map(|b| want[(b * SEQ_LEN + t) * v..(b * SEQ_LEN + t + 1) * v].iter().copied())
            .collect()
    };
    model
        .forward(&row_slice(0, PREFIX), BATCH, PREFIX, 0, LogitsWanted::Last)
        .unwrap();
    let mut got = model.logits().unwrap();
    let mut ref_rows = want_at(PREFIX - 1);
    for t in PREFIX..SEQ_LEN {
        model
            .forward(&row_slice(t, t + 1), BATCH, 1, t, LogitsWanted::Last)
            .unwrap();
        got.extend(model.logits().unwrap());
        ref_rows.extend(want_at(t));
    }
    let rows = BATCH * (SEQ_LEN - PREFIX + 1);
    check(
        "prefill of 7 then KV-cache decode (B=2)",
        &compare(&got, &ref_rows, rows),
        rows,
    );
}
