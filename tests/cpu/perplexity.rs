//! Sliding-window perplexity (`host::perplexity`) on the CPU reference:
//! the window plan covers every token once, the evaluation equals
//! independent per-chunk and per-token computations, batching changes
//! nothing, a random model scores near the uniform bound, bad input errors.

use host::cpu::CpuModel;
use host::cpu::ops::{crossentropy_forward, token_nll};
use host::generate::{Backend, IGNORED_TARGET, LogitsWanted};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use host::perplexity::{PerplexityConfig, perplexity, perplexity_with, plan_windows};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Relative agreement of two f64 NLL sums over the same f32 logits (only the
/// summation order differs).
const SUM_TOL: f64 = 1e-9;
/// Seed of the random fixture model.
const MODEL_SEED: u64 = 5;

fn tiny_model(config: &ModelConfig, max_batch: usize) -> CpuModel {
    let ckpt = Checkpoint::from_bytes(llmc_bytes(config, MODEL_SEED, DType::F32).unwrap(), "tiny.bin", None).unwrap();
    CpuModel::new(&ckpt.weights().unwrap(), max_batch, config.max_seq_len).unwrap()
}

fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// `-log softmax(logits[..v])[target]`, written independently of the library
/// (two passes, no shared helper).
fn naive_nll(row: &[f32], v: usize, target: u32) -> f64 {
    let max = row[..v].iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = max + row[..v].iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    log_z - row[target as usize] as f64
}

fn assert_rel(got: f64, want: f64, tol: f64, what: &str) {
    let err = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
    assert!(err <= tol, "{what}: got {got}, want {want} (relative error {err:e})");
}

#[test]
fn token_nll_is_log_softmax_over_the_real_vocabulary() {
    let (v, vp) = (300, 384);
    // Uniform logits: NLL = ln V whatever the level; padding must not count.
    let mut row = vec![3.5f32; vp];
    for x in &mut row[v..] {
        *x = 1e4;
    }
    assert_rel(token_nll(&row, v, 17), (v as f64).ln(), 1e-12, "uniform");
    // One token much likelier than the rest.
    row[17] = 3.5 + 10.0;
    let want = ((v - 1) as f64 + 10f64.exp()).ln() - 10.0;
    assert_rel(token_nll(&row, v, 17), want, 1e-12, "peaked, target");
    assert_rel(token_nll(&row, v, 18), want + 10.0, 1e-12, "peaked, other");
    // Large logits do not overflow.
    let big = vec![80.0f32; v];
    assert!(token_nll(&big, v, 0).is_finite());
}

#[test]
fn crossentropy_scores_each_row_and_skips_ignored_ones() {
    let cfg = tiny_config();
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let (b, t) = (2, 9);
    let tokens = random_tokens(b * t, v, 4);
    let mut model = tiny_model(&cfg, b);
    model.forward(&tokens, b, t, 0, LogitsWanted::All).unwrap();
    let logits = model.logits().unwrap();
    let mut targets = random_tokens(b * t, v, 6);
    targets[3] = IGNORED_TARGET;
    targets[b * t - 1] = v as u32 - 1;
    let got = model.crossentropy(&targets).unwrap();
    let mut twin = vec![f32::NAN; b * t];
    crossentropy_forward(&mut twin, &logits, &targets, b * t, v, vp);
    for (i, &target) in targets.iter().enumerate() {
        let want = if target == IGNORED_TARGET {
            0.0
        } else {
            naive_nll(&logits[i * vp..(i + 1) * vp], v, target)
        };
        assert_rel(got[i].max(1e-300), want.max(1e-300), 1e-12, &format!("row {i}"));
        // The f32 twin is the f64 value rounded once.
        assert_eq!(twin[i], want as f32, "twin, row {i}");
    }
    // A target outside the vocabulary, or a wrong count, is an error.
    targets[0] = v as u32;
    let err = model.crossentropy(&targets).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let err = model.crossentropy(&targets[1..]).unwrap_err().to_string();
    assert!(err.contains("targets for"), "{err}");
}

#[test]
fn windows_score_every_token_once_after_the_first() {
    for n in 2..70 {
        for window in 2..24 {
            for stride in 1..=window {
                let plan = plan_windows(n, window, stride).unwrap();
                let mut scored = vec![0u32; n];
                for (k, w) in plan.iter().enumerate() {
                    assert!(
                        w.len() <= window && w.end <= n,
                        "{n}/{window}/{stride}: window {k} {w:?}"
                    );
                    assert_eq!(w.begin, k * stride, "{n}/{window}/{stride}: window {k} start");
                    assert!(
                        w.begin < w.score_from && w.score_from < w.end,
                        "{n}/{window}/{stride}: {w:?}"
                    );
                    for count in &mut scored[w.score_from..w.end] {
                        *count += 1;
                    }
                }
                // Only a last window of one token (nothing to score in it) is left out.
                let last_end = plan.last().unwrap().end;
                let dropped_single = stride == window && last_end == n - 1 && (n - 1) % window == 0;
                assert!(
                    last_end == n || dropped_single,
                    "{n}/{window}/{stride}: text read to {last_end} only"
                );
                assert_eq!(scored[0], 0, "the first token has no context");
                for (j, &count) in scored.iter().enumerate().skip(1) {
                    // stride == window: a window's first token has no context in it.
                    let window_start = stride == window && j % window == 0;
                    let want = if window_start { 0 } else { 1 };
                    assert_eq!(count, want, "{n}/{window}/{stride}: token {j} scored {count} times");
                }
                // Once past the first window, every target sees at least window - stride tokens.
                if stride < window {
                    for w in &plan[1..] {
                        assert!(
                            w.score_from - w.begin >= window - stride,
                            "{n}/{window}/{stride}: {w:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn stride_equal_to_window_matches_independent_chunks() {
    let cfg = tiny_config();
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let window = 48;
    let tokens = random_tokens(3 * window + 17, v, 1);
    let mut model = tiny_model(&cfg, 1);
    let report = perplexity(&mut model, &tokens, window, window).unwrap();

    let (mut total, mut scored) = (0f64, 0usize);
    for chunk in tokens.chunks(window) {
        let t = chunk.len();
        model.forward(chunk, 1, t, 0, LogitsWanted::All).unwrap();
        let logits = model.logits().unwrap();
        for i in 1..t {
            total += naive_nll(&logits[(i - 1) * vp..i * vp], v, chunk[i]);
            scored += 1;
        }
    }
    assert_eq!(report.tokens_scored, scored);
    assert_eq!(report.tokens_scored, tokens.len() - tokens.len().div_ceil(window));
    assert_eq!(report.windows, tokens.len().div_ceil(window));
    assert_rel(report.total_nll, total, SUM_TOL, "total NLL");
    assert_rel(report.perplexity(), (total / scored as f64).exp(), SUM_TOL, "PPL");
}

#[test]
fn overlapping_windows_match_per_token_contexts() {
    let cfg = tiny_config();
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let (window, stride) = (40, 12);
    let tokens = random_tokens(137, v, 2);
    let n = tokens.len();
    let mut model = tiny_model(&cfg, 1);
    let report = perplexity(&mut model, &tokens, window, stride).unwrap();

    // Token j is scored by the first window k (start k*stride) whose end
    // passes j, from the tokens of that window before it; run each alone.
    let mut total = 0f64;
    for j in 1..n {
        let k = (0..).find(|k| (k * stride + window).min(n) > j).unwrap();
        let context = &tokens[k * stride..j];
        model.forward(context, 1, context.len(), 0, LogitsWanted::Last).unwrap();
        total += naive_nll(&model.logits().unwrap()[..vp], v, tokens[j]);
    }
    assert_eq!(report.tokens_scored, n - 1);
    assert_rel(report.total_nll, total, SUM_TOL, "total NLL");
}

#[test]
fn window_covering_the_text_equals_one_forward() {
    let cfg = tiny_config();
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let tokens = random_tokens(cfg.max_seq_len - 5, v, 3);
    let mut model = tiny_model(&cfg, 1);
    let report = perplexity(&mut model, &tokens, cfg.max_seq_len, 1).unwrap();
    model.forward(&tokens, 1, tokens.len(), 0, LogitsWanted::All).unwrap();
    let logits = model.logits().unwrap();
    let total: f64 = (1..tokens.len())
        .map(|i| naive_nll(&logits[(i - 1) * vp..i * vp], v, tokens[i]))
        .sum();
    assert_eq!(report.windows, 1);
    assert_eq!(report.tokens_scored, tokens.len() - 1);
    assert_rel(report.total_nll, total, SUM_TOL, "total NLL");
}

#[test]
fn batching_windows_changes_nothing() {
    let cfg = tiny_config();
    let window = 32;
    // 9 windows; the last one is shorter, so groups of 4 split as 4 + 3 + 1 + 1.
    let tokens = random_tokens(8 * 16 + 27, cfg.vocab_size, 4);
    let mut one = tiny_model(&cfg, 1);
    let mut four = tiny_model(&cfg, 4);
    let single = perplexity(&mut one, &tokens, window, window / 2).unwrap();
    let mut calls = 0;
    let config = PerplexityConfig {
        window,
        stride: window / 2,
        batch: 4,
    };
    let batched = perplexity_with(&mut four, &tokens, &config, |done, total| {
        calls += 1;
        assert!(done <= total);
    })
    .unwrap();
    assert_eq!(single.windows, batched.windows);
    assert_eq!(single.tokens_scored, batched.tokens_scored);
    assert_eq!(single.positions, batched.positions);
    assert!(
        calls < batched.windows,
        "{calls} forward calls for {} windows: nothing was batched",
        batched.windows
    );
    assert_rel(batched.total_nll, single.total_nll, SUM_TOL, "batched NLL");
}

#[test]
fn random_model_is_close_to_uniform() {
    let cfg = tiny_config();
    let v = cfg.vocab_size as f64;
    let tokens = random_tokens(400, cfg.vocab_size, 6);
    let mut model = tiny_model(&cfg, 1);
    let report = perplexity(&mut model, &tokens, 64, 32).unwrap();
    let ppl = report.perplexity();
    // Small random weights give nearly flat logits: PPL near V, never far from it.
    assert!(ppl.is_finite(), "PPL {ppl}");
    assert!(
        ppl > v / 2.0 && ppl < 2.0 * v,
        "PPL {ppl} implausible for a random model over {v} tokens"
    );
    assert!(report.tokens_per_second() > 0.0);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let cfg = tiny_config();
    let mut model = tiny_model(&cfg, 1);
    let tokens = random_tokens(50, cfg.vocab_size, 7);
    let err = |r: anyhow::Result<host::perplexity::PerplexityReport>| format!("{:#}", r.unwrap_err());

    assert!(err(perplexity(&mut model, &[], 16, 8)).contains("0 token"));
    assert!(err(perplexity(&mut model, &tokens[..1], 16, 8)).contains("1 token"));
    assert!(err(perplexity(&mut model, &tokens, 0, 1)).contains("window"));
    assert!(err(perplexity(&mut model, &tokens, 1, 1)).contains("window"));
    assert!(err(perplexity(&mut model, &tokens, 16, 0)).contains("stride"));
    assert!(err(perplexity(&mut model, &tokens, 16, 17)).contains("stride of 17"));
    let long = err(perplexity(&mut model, &tokens, cfg.max_seq_len + 1, 8));
    assert!(
        long.contains(&format!("{}", cfg.max_seq_len + 1)) && long.contains(&format!("{}", cfg.max_seq_len)),
        "{long}"
    );
    let mut bad = tokens.clone();
    bad[9] = cfg.vocab_size as u32;
    assert!(err(perplexity(&mut model, &bad, 16, 8)).contains("token 9"));
    let zero_batch = PerplexityConfig {
        window: 16,
        stride: 8,
        batch: 0,
    };
    assert!(
        format!(
            "{:#}",
            perplexity_with(&mut model, &tokens, &zero_batch, |_, _| {}).unwrap_err()
        )
        .contains("batch")
    );
    // A batch larger than the backend was built for is the backend's error, not a panic.
    let big_batch = PerplexityConfig {
        window: 16,
        stride: 8,
        batch: 4,
    };
    assert!(perplexity_with(&mut model, &tokens, &big_batch, |_, _| {}).is_err());
}
