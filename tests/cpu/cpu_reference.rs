//! The CPU reference against independent naive formulas (in f64), and the
//! CPU model's own invariants: KV-cache decode equals full recomputation,
//! both checkpoint formats give the same logits, windowed attention masks.

use gpu_host::shape::{AttentionShape, EncoderShape, MatmulShape, RowShape};
use host::cpu::CpuModel;
use host::cpu::ops::{
    attention_forward, encoder_forward, gelu_forward, layernorm_forward, matmul_forward, residual_forward,
    softmax_forward,
};
use host::generate::{Backend, LogitsWanted};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, safetensors_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use rand::Rng;

/// Tolerance of f32 ops against their f64 formula on O(1) inputs.
const OP_TOL: f32 = 1e-5;
/// Tolerance of incremental decode against full recomputation.
const KV_TOL: f32 = 1e-5;

fn random_vec(n: usize, scale: f32) -> Vec<f32> {
    let mut rng = crate::seed::rng();
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol as f64 * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (err {err:e})"
        );
    }
}

#[test]
fn encoder_adds_token_and_position_rows() {
    let (b, t, c, vp, max_t, pos0) = (2, 5, 12, 20, 16, 3);
    let wte = random_vec(vp * c, 1.0);
    let wpe = random_vec(max_t * c, 1.0);
    let mut rng = crate::seed::rng();
    let inp: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..vp as u32)).collect();
    let mut out = vec![f32::NAN; b * t * c];
    encoder_forward(&mut out, &inp, &wte, &wpe, EncoderShape { b, t, c, pos0 });
    let mut want = vec![0f64; b * t * c];
    for bi in 0..b {
        for ti in 0..t {
            for i in 0..c {
                let tok = inp[bi * t + ti] as usize;
                want[(bi * t + ti) * c + i] = wte[tok * c + i] as f64 + wpe[(pos0 + ti) * c + i] as f64;
            }
        }
    }
    assert_close(&out, &want, OP_TOL, "encoder");
}

#[test]
fn layernorm_matches_formula() {
    let (n, c) = (7, 53);
    let inp: Vec<f32> = random_vec(n * c, 3.0).iter().map(|x| x + 1.5).collect();
    let (w, bias) = (random_vec(c, 1.0), random_vec(c, 1.0));
    let mut out = vec![f32::NAN; n * c];
    layernorm_forward(&mut out, &inp, &w, &bias, RowShape::new(n, c));
    let mut want = vec![0f64; n * c];
    for r in 0..n {
        let x: Vec<f64> = inp[r * c..(r + 1) * c].iter().map(|&v| v as f64).collect();
        let mean = x.iter().sum::<f64>() / c as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
        for i in 0..c {
            want[r * c + i] = (x[i] - mean) / (var + 1e-5).sqrt() * w[i] as f64 + bias[i] as f64;
        }
    }
    assert_close(&out, &want, OP_TOL, "layernorm");
}

fn naive_matmul(inp: &[f32], weight: &[f32], bias: Option<&[f32]>, n: usize, c: usize, oc: usize) -> Vec<f64> {
    let mut out = vec![0f64; n * oc];
    for r in 0..n {
        for o in 0..oc {
            let mut s = bias.map_or(0.0, |b| b[o] as f64);
            for i in 0..c {
                s += inp[r * c + i] as f64 * weight[o * c + i] as f64;
            }
            out[r * oc + o] = s;
        }
    }
    out
}

#[test]
fn matmul_matches_naive_with_and_without_bias() {
    let mut rng = crate::seed::rng();
    // Awkward sizes: partial row tiles, partial lane groups, several OC blocks.
    for _ in 0..3 {
        let n = rng.random_range(1..20);
        let c = rng.random_range(1..70);
        let oc = rng.random_range(1..150);
        let inp = random_vec(n * c, 1.0);
        let weight = random_vec(oc * c, 1.0);
        let bias = random_vec(oc, 1.0);
        let mut out = vec![f32::NAN; n * oc];
        matmul_forward(&mut out, &inp, &weight, Some(&bias), MatmulShape::new(n, oc, c));
        assert_close(
            &out,
            &naive_matmul(&inp, &weight, Some(&bias), n, c, oc),
            OP_TOL * 4.0,
            "matmul+bias",
        );
        matmul_forward(&mut out, &inp, &weight, None, MatmulShape::new(n, oc, c));
        assert_close(
            &out,
            &naive_matmul(&inp, &weight, None, n, c, oc),
            OP_TOL * 4.0,
            "matmul",
        );
    }
}

#[test]
fn matmul_row_does_not_depend_on_batch() {
    // A row computed with others (prefill) equals it computed alone (decode).
    let (n, c, oc) = (19, 77, 70);
    let inp = random_vec(n * c, 1.0);
    let weight = random_vec(oc * c, 1.0);
    let mut all = vec![0f32; n * oc];
    matmul_forward(&mut all, &inp, &weight, None, MatmulShape::new(n, oc, c));
    for r in [0, 8, n - 1] {
        let mut one = vec![0f32; oc];
        matmul_forward(
            &mut one,
            &inp[r * c..(r + 1) * c],
            &weight,
            None,
            MatmulShape::new(1, oc, c),
        );
        assert_eq!(one, all[r * oc..(r + 1) * oc], "row {r}");
    }
}

/// Attention straight from the definition, on qkv of the whole sequence
/// `0..t` of each row (no cache): positions `p-window+1..=p`.
fn naive_attention(qkv: &[f32], b: usize, t: usize, c: usize, nh: usize, window: usize) -> Vec<f64> {
    let hs = c / nh;
    let mut out = vec![0f64; b * t * c];
    for bi in 0..b {
        for h in 0..nh {
            for p in 0..t {
                let q = |i: usize| qkv[(bi * t + p) * 3 * c + h * hs + i] as f64;
                let k = |j: usize, i: usize| qkv[(bi * t + j) * 3 * c + c + h * hs + i] as f64;
                let v = |j: usize, i: usize| qkv[(bi * t + j) * 3 * c + 2 * c + h * hs + i] as f64;
                let lo = if window == 0 { 0 } else { (p + 1).saturating_sub(window) };
                let scores: Vec<f64> = (lo..=p)
                    .map(|j| (0..hs).map(|i| q(i) * k(j, i)).sum::<f64>() / (hs as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hs {
                    out[(bi * t + p) * c + h * hs + i] = (lo..=p).map(|j| e[j - lo] / z * v(j, i)).sum();
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_causal_and_windowed() {
    let mut rng = crate::seed::rng();
    let (b, c, nh, max_t) = (2, 24, 3, 40);
    let t = rng.random_range(5..max_t);
    let qkv = random_vec(b * t * 3 * c, 1.0);
    for window in [0, 1, 4, t + 3] {
        let mut out = vec![f32::NAN; b * t * c];
        let mut kc = vec![f32::NAN; b * nh * max_t * (c / nh)];
        let mut vc = kc.clone();
        attention_forward(
            &mut out,
            &mut kc,
            &mut vc,
            &qkv,
            AttentionShape {
                b,
                t,
                pos0: 0,
                max_t,
                c,
                nh,
                window,
            },
        );
        assert_close(
            &out,
            &naive_attention(&qkv, b, t, c, nh, window),
            OP_TOL,
            &format!("attention window {window}"),
        );
    }
}

#[test]
fn attention_with_cache_equals_whole_sequence() {
    // Feed the sequence in random chunks; each chunk's outputs must equal the
    // corresponding rows of the all-at-once computation.
    let mut rng = crate::seed::rng();
    let (b, c, nh, max_t) = (3, 16, 2, 30);
    let t = rng.random_range(8..max_t);
    let window = if rng.random_bool(0.5) {
        0
    } else {
        rng.random_range(1..6)
    };
    let qkv = random_vec(b * t * 3 * c, 1.0);
    let want = naive_attention(&qkv, b, t, c, nh, window);
    let mut kc = vec![f32::NAN; b * nh * max_t * (c / nh)];
    let mut vc = kc.clone();
    let mut pos = 0;
    while pos < t {
        let len = rng.random_range(1..=(t - pos).min(5));
        // this chunk's qkv rows, [b, len, 3c]
        let chunk: Vec<f32> = (0..b)
            .flat_map(|bi| qkv[(bi * t + pos) * 3 * c..(bi * t + pos + len) * 3 * c].to_vec())
            .collect();
        let mut out = vec![f32::NAN; b * len * c];
        attention_forward(
            &mut out,
            &mut kc,
            &mut vc,
            &chunk,
            AttentionShape {
                b,
                t: len,
                pos0: pos,
                max_t,
                c,
                nh,
                window,
            },
        );
        for bi in 0..b {
            let got = &out[bi * len * c..(bi + 1) * len * c];
            let w = &want[(bi * t + pos) * c..(bi * t + pos + len) * c];
            assert_close(got, w, OP_TOL, &format!("chunk at {pos}, row {bi}"));
        }
        pos += len;
    }
}

#[test]
fn windowed_attention_ignores_keys_outside_the_window() {
    let (b, t, c, nh, window) = (1, 12, 8, 2, 3);
    let qkv = random_vec(b * t * 3 * c, 1.0);
    let run = |qkv: &[f32]| {
        let mut out = vec![0f32; b * t * c];
        let mut kc = vec![0f32; b * nh * t * (c / nh)];
        let mut vc = kc.clone();
        attention_forward(
            &mut out,
            &mut kc,
            &mut vc,
            qkv,
            AttentionShape {
                b,
                t,
                pos0: 0,
                max_t: t,
                c,
                nh,
                window,
            },
        );
        out
    };
    let base = run(&qkv);
    // Change the key and value of position 0: only queries 0..window see it.
    let mut changed = qkv.clone();
    for x in &mut changed[c..3 * c] {
        *x += 5.0;
    }
    let other = run(&changed);
    for p in 0..t {
        let same = base[p * c..(p + 1) * c] == other[p * c..(p + 1) * c];
        assert_eq!(
            same,
            p >= window,
            "query {p}: window {window} {}",
            if same { "ignored key 0" } else { "saw key 0" }
        );
    }
}

#[test]
fn gelu_residual_softmax_match_formulas() {
    let n = 1000;
    let x = random_vec(n, 6.0);
    let y = random_vec(n, 6.0);
    let mut out = vec![f32::NAN; n];
    gelu_forward(&mut out, &x, n);
    let want: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    assert_close(&out, &want, OP_TOL, "gelu");
    residual_forward(&mut out, &x, &y, n);
    let want: Vec<f64> = x.iter().zip(&y).map(|(&a, &b)| a as f64 + b as f64).collect();
    assert_close(&out, &want, OP_TOL, "residual");

    let (rows, v, vp) = (5, 37, 48);
    let logits = random_vec(rows * vp, 10.0);
    let mut probs = vec![f32::NAN; rows * vp];
    softmax_forward(&mut probs, &logits, rows, v, vp);
    let mut want = vec![0f64; rows * vp];
    for r in 0..rows {
        let l = &logits[r * vp..r * vp + v];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        for i in 0..v {
            want[r * vp + i] = (l[i] as f64).exp() / z;
        }
    }
    assert_close(&probs, &want, OP_TOL, "softmax (padding must be 0)");
}

fn tiny_model(config: &ModelConfig, seed: u64, max_batch: usize) -> CpuModel {
    let ckpt = Checkpoint::from_bytes(llmc_bytes(config, seed, DType::F32).unwrap(), "tiny.bin", None).unwrap();
    CpuModel::new(&ckpt.weights().unwrap(), max_batch, config.max_seq_len).unwrap()
}

#[test]
fn kv_cache_decode_equals_full_recomputation() {
    let mut rng = crate::seed::rng();
    let cfg = tiny_config();
    let seed = rng.random();
    let (b, vp) = (3, cfg.padded_vocab_size);
    let t = rng.random_range(4..=cfg.max_seq_len.min(40));
    let prefill = rng.random_range(1..t);
    let tokens: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();

    let mut full = tiny_model(&cfg, seed, b);
    full.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    let want = full.logits().unwrap();

    let mut inc = tiny_model(&cfg, seed, b);
    let take = |from: usize, len: usize| -> Vec<u32> {
        (0..b)
            .flat_map(|bi| tokens[bi * t + from..bi * t + from + len].to_vec())
            .collect()
    };
    inc.forward(&take(0, prefill), b, prefill, 0, LogitsWanted::Last)
        .unwrap();
    for pos in prefill..=t {
        let got = inc.logits().unwrap();
        for bi in 0..b {
            let w = &want[(bi * t + pos - 1) * vp..(bi * t + pos) * vp];
            let g = &got[bi * vp..(bi + 1) * vp];
            let err = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                err <= KV_TOL,
                "row {bi}, position {}: max abs err {err:e} (T={t}, prefill={prefill})",
                pos - 1
            );
        }
        if pos < t {
            inc.forward(&take(pos, 1), b, 1, pos, LogitsWanted::Last).unwrap();
        }
    }
}

#[test]
fn llmc_and_safetensors_fixtures_give_identical_logits() {
    let mut rng = crate::seed::rng();
    let cfg = tiny_config();
    let seed = rng.random();
    let (b, t) = (2, 9);
    let tokens: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let llmc = Checkpoint::from_bytes(llmc_bytes(&cfg, seed, DType::F32).unwrap(), "m.bin", None).unwrap();
    let st = Checkpoint::from_bytes(
        safetensors_bytes(&cfg, seed, false, DType::F32).unwrap(),
        "model.safetensors",
        Some(cfg.num_heads),
    )
    .unwrap();
    let mut logits = Vec::new();
    for ckpt in [&llmc, &st] {
        let mut m = CpuModel::new(&ckpt.weights().unwrap(), b, t).unwrap();
        m.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
        logits.push(m.logits().unwrap());
    }
    assert!(
        logits[0] == logits[1],
        "llm.c and safetensors checkpoints of seed {seed} differ"
    );
}

#[test]
fn padded_vocab_is_never_chosen_and_logits_are_zero_there() {
    let cfg = tiny_config();
    let mut m = tiny_model(&cfg, crate::seed::rng().random(), 2);
    m.forward(&[1, 2, 3, 4], 2, 2, 0, LogitsWanted::Last).unwrap();
    let logits = m.logits().unwrap();
    let vp = cfg.padded_vocab_size;
    for bi in 0..2 {
        assert!(
            logits[bi * vp + cfg.vocab_size..(bi + 1) * vp]
                .iter()
                .all(|&x| x == 0.0)
        );
    }
    for id in m.argmax().unwrap() {
        assert!((id as usize) < cfg.vocab_size);
    }
}

#[test]
fn forward_rejects_bad_requests_with_errors() {
    let cfg = tiny_config();
    let mut m = tiny_model(&cfg, 1, 2);
    let e = m.forward(&[1, 2, 3], 3, 1, 0, LogitsWanted::Last).unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
    let e = m
        .forward(&[1, 2], 1, 2, cfg.max_seq_len - 1, LogitsWanted::Last)
        .unwrap_err();
    assert!(e.to_string().contains("exceed"), "{e}");
    let e = m
        .forward(&[cfg.vocab_size as u32], 1, 1, 0, LogitsWanted::Last)
        .unwrap_err();
    assert!(e.to_string().contains("vocabulary"), "{e}");
    assert!(m.logits().is_err(), "logits after a failed forward");
}

/// The test_gpt2 shape (B=4, T=64) on a seeded random 124M checkpoint held in
/// memory (~500 MB), checked against two other ways of computing the same
/// logits at full 124M size: one row alone (B=1: the same row must give the
/// same numbers whatever the batch), and that row's last position by
/// KV-cache decoding (prefill 63 tokens, then one step). Not timed: CI
/// machines vary.
#[test]
fn gpt2_124m_shape_b4_t64_agrees_with_one_row_and_kv_decode() {
    let cfg = ModelConfig::GPT2_124M;
    let (b, t) = (4, 64);
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let ckpt = Checkpoint::from_bytes(llmc_bytes(&cfg, 124, DType::F32).unwrap(), "gpt2_124M.bin", None).unwrap();
    let weights = ckpt.weights().unwrap();
    let mut m = CpuModel::new(&weights, b, t).unwrap();
    let mut rng = crate::seed::rng();
    let tokens: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let start = std::time::Instant::now();
    m.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    eprintln!(
        "124M forward B={b} T={t} on the CPU: {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let logits = m.logits().unwrap();
    assert_eq!(logits.len(), b * t * vp);
    assert!(logits.iter().all(|x| x.is_finite()));
    drop(m);

    // Row 2 alone: bit-identical (each row's arithmetic does not depend on
    // the others).
    let row = 2;
    let row_tokens = &tokens[row * t..(row + 1) * t];
    let batched = &logits[row * t * vp..(row + 1) * t * vp];
    let mut one = CpuModel::new(&weights, 1, t).unwrap();
    one.forward(row_tokens, 1, t, 0, LogitsWanted::All).unwrap();
    let alone = one.logits().unwrap();
    let differ = (0..t * vp)
        .filter(|&i| alone[i].to_bits() != batched[i].to_bits())
        .count();
    assert_eq!(differ, 0, "row {row}: {differ} logits differ between B=4 and B=1");

    // Its last position by KV-cache decoding: another order of work, so a
    // tolerance (FP32 sums over 768..3072 terms).
    let mut kv = CpuModel::new(&weights, 1, t).unwrap();
    kv.forward(&row_tokens[..t - 1], 1, t - 1, 0, LogitsWanted::Last)
        .unwrap();
    kv.forward(&row_tokens[t - 1..], 1, 1, t - 1, LogitsWanted::Last)
        .unwrap();
    let step = kv.logits().unwrap();
    let last = &batched[(t - 1) * vp..(t - 1) * vp + v];
    let max_abs = (0..v).map(|i| (step[i] - last[i]).abs()).fold(0f32, f32::max);
    eprintln!("124M: KV decode vs full forward, last position: max abs {max_abs:.2e}");
    assert!(max_abs < 1e-3, "KV decode differs from the full forward by {max_abs}");
    assert_eq!(
        host::cpu::forward::argmax(&step[..v]),
        host::cpu::forward::argmax(last),
        "greedy token"
    );
}
