//! The sampler and the generation loop (on the CPU model and on a scripted
//! backend that checks the batching policy).

use host::cpu::CpuModel;
use host::generate::{Backend, LogitsWanted, StopReason, generate};
use host::model::checkpoint::Checkpoint;
use host::model::config::EOT_TOKEN;
use host::model::fixtures::{llmc_bytes, tiny_config};
use host::model::{DType, ModelConfig};
use host::sample::{Sampler, SamplingParams};
use rand::Rng;

fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: Some(seed),
    }
}

fn random_logits(n: usize) -> Vec<f32> {
    let mut rng = crate::seed::rng();
    (0..n).map(|_| rng.random_range(-5.0..5.0)).collect()
}

fn argmax(x: &[f32]) -> u32 {
    host::cpu::forward::argmax(x)
}

#[test]
fn same_seed_same_tokens_other_seed_differs() {
    let logits = random_logits(1000);
    let seed = crate::seed::rng().random();
    let draw = |seed| {
        let mut s = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
        (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(draw(seed), draw(seed));
    assert_ne!(draw(seed), draw(seed.wrapping_add(1)));
}

#[test]
fn greedy_top_k_1_and_tiny_top_p_pick_the_argmax() {
    let seed = crate::seed::rng().random();
    for _ in 0..20 {
        let logits = random_logits(500);
        let want = argmax(&logits);
        assert_eq!(
            Sampler::new(params(0.0, 40, 0.9, seed)).unwrap().sample(&logits),
            want,
            "temperature 0"
        );
        assert_eq!(
            Sampler::new(params(1.5, 1, 1.0, seed)).unwrap().sample(&logits),
            want,
            "top-k 1"
        );
        assert_eq!(
            Sampler::new(params(1.5, 0, 1e-6, seed)).unwrap().sample(&logits),
            want,
            "top-p tiny"
        );
    }
}

#[test]
fn distribution_follows_softmax_top_k_and_top_p() {
    let probs = [0.5f32, 0.3, 0.15, 0.05];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let draws = 40_000;
    let freq = |p: SamplingParams| {
        let mut s = Sampler::new(p).unwrap();
        let mut count = [0usize; 4];
        for _ in 0..draws {
            count[s.sample(&logits) as usize] += 1;
        }
        count.map(|c| c as f32 / draws as f32)
    };
    let seed = crate::seed::rng().random();
    let close = |got: [f32; 4], want: [f32; 4], what: &str| {
        for i in 0..4 {
            assert!(
                (got[i] - want[i]).abs() < 0.015,
                "{what}: token {i} frequency {} vs {}",
                got[i],
                want[i]
            );
        }
    };
    close(freq(params(1.0, 0, 1.0, seed)), probs, "plain");
    close(freq(params(1.0, 2, 1.0, seed)), [0.625, 0.375, 0.0, 0.0], "top-k 2");
    // top-p 0.85: 0.5 + 0.3 < 0.85 <= 0.95, so three tokens stay.
    close(
        freq(params(1.0, 0, 0.85, seed)),
        [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0],
        "top-p 0.85",
    );
    // temperature 0.5 squares the probabilities before renormalising.
    let sq: f32 = probs.iter().map(|p| p * p).sum();
    close(
        freq(params(0.5, 0, 1.0, seed)),
        probs.map(|p| p * p / sq),
        "temperature 0.5",
    );
}

#[test]
fn bad_sampling_parameters_are_errors() {
    assert!(Sampler::new(params(-1.0, 0, 1.0, 0)).is_err());
    assert!(Sampler::new(params(f32::NAN, 0, 1.0, 0)).is_err());
    assert!(Sampler::new(params(1.0, 0, 0.0, 0)).is_err());
    assert!(Sampler::new(params(1.0, 0, 1.5, 0)).is_err());
    let s = Sampler::new(SamplingParams {
        seed: None,
        ..params(1.0, 0, 1.0, 0)
    })
    .unwrap();
    let again = Sampler::new(params(1.0, 0, 1.0, s.seed())).unwrap();
    assert_eq!(s.seed(), again.seed());
}

fn tiny_model(cfg: &ModelConfig, seed: u64, b: usize, max_seq_len: usize) -> CpuModel {
    let ckpt = Checkpoint::from_bytes(llmc_bytes(cfg, seed, DType::F32).unwrap(), "tiny.bin", None).unwrap();
    CpuModel::new(&ckpt.weights().unwrap(), b, max_seq_len).unwrap()
}

#[test]
fn batch_of_different_prompt_lengths_equals_each_prompt_alone() {
    let cfg = tiny_config();
    let mut rng = crate::seed::rng();
    let seed = rng.random();
    let prompts: Vec<Vec<u32>> = [3, 9, 5]
        .iter()
        .map(|&n| (0..n).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect())
        .collect();
    let n = 12;
    let mut greedy = Sampler::new(SamplingParams::GREEDY).unwrap();
    let mut batch_model = tiny_model(&cfg, seed, prompts.len(), cfg.max_seq_len);
    let mut streamed = vec![Vec::new(); prompts.len()];
    let together = generate(&mut batch_model, &prompts, n, &mut greedy, |row, id| {
        streamed[row].push(id)
    })
    .unwrap();
    assert_eq!(streamed, together.tokens, "on_token saw what was returned");
    for (row, prompt) in prompts.iter().enumerate() {
        let mut alone_model = tiny_model(&cfg, seed, 1, cfg.max_seq_len);
        let alone = generate(
            &mut alone_model,
            std::slice::from_ref(prompt),
            n,
            &mut greedy,
            |_, _| {},
        )
        .unwrap();
        assert_eq!(
            together.tokens[row],
            alone.tokens[0],
            "row {row} (prompt length {})",
            prompt.len()
        );
        assert_eq!(together.tokens[row].len(), n);
        assert_eq!(together.stop[row], StopReason::MaxTokens);
    }
    assert_eq!(together.generated, n * prompts.len());
}

#[test]
fn context_limit_stops_cleanly() {
    let cfg = tiny_config();
    let max_seq_len = 10;
    let mut m = tiny_model(&cfg, 7, 2, max_seq_len);
    let prompts = vec![vec![1, 2, 3, 4], vec![5, 6]];
    let mut s = Sampler::new(params(1.0, 0, 1.0, 3)).unwrap();
    let g = generate(&mut m, &prompts, 100, &mut s, |_, _| {}).unwrap();
    assert_eq!(g.stop, vec![StopReason::ContextLimit; 2]);
    assert!(g.hit_context_limit());
    // Every row fills the window: prompt + generated = max_seq_len.
    assert_eq!(g.tokens[0].len(), max_seq_len - 4);
    assert_eq!(g.tokens[1].len(), max_seq_len - 2);
    // A prompt longer than the window is an error naming both numbers.
    let long = vec![vec![1u32; max_seq_len + 1]];
    let e = generate(&mut m, &long, 5, &mut s, |_, _| {}).unwrap_err().to_string();
    assert!(
        e.contains(&format!("{}", max_seq_len + 1)) && e.contains(&format!("{max_seq_len}")),
        "{e}"
    );
    assert!(
        generate(&mut m, &[vec![]], 5, &mut s, |_, _| {}).is_err(),
        "empty prompt"
    );
}

/// A backend that replays scripted next tokens (as one-hot logits) and
/// records every forward call.
struct Scripted {
    config: ModelConfig,
    /// next[row][pos]: the token the model "predicts" after position `pos`.
    next: Vec<Vec<u32>>,
    calls: Vec<(Vec<u32>, usize, usize, usize)>,
    last_pos: usize,
    b: usize,
}

impl Backend for Scripted {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, _: LogitsWanted) -> anyhow::Result<()> {
        anyhow::ensure!(pos0 + t <= self.config.max_seq_len, "past the window");
        self.calls.push((tokens.to_vec(), b, t, pos0));
        self.last_pos = pos0 + t - 1;
        self.b = b;
        Ok(())
    }
    fn logits(&mut self) -> anyhow::Result<Vec<f32>> {
        let vp = self.config.padded_vocab_size;
        let mut l = vec![0f32; self.b * vp];
        for row in 0..self.b {
            l[row * vp + self.next[row][self.last_pos] as usize] = 100.0;
        }
        Ok(l)
    }
    fn argmax(&mut self) -> anyhow::Result<Vec<u32>> {
        Ok((0..self.b).map(|row| self.next[row][self.last_pos]).collect())
    }
}

#[test]
fn scripted_backend_shows_teacher_forcing_and_end_of_text() {
    let config = ModelConfig {
        max_seq_len: 16,
        ..ModelConfig::GPT2_124M
    };
    // Row 0: prompt of 2, then 7, 8, EOT. Row 1: prompt of 4, then 9 forever.
    let next = vec![
        vec![0, 7, 8, EOT_TOKEN, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        vec![99, 99, 99, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
    ];
    let prompts = vec![vec![10, 11], vec![20, 21, 22, 23]];
    for greedy in [true, false] {
        let mut backend = Scripted {
            config,
            next: next.clone(),
            calls: vec![],
            last_pos: 0,
            b: 0,
        };
        let p = if greedy {
            SamplingParams::GREEDY
        } else {
            params(1.0, 0, 1.0, 5)
        };
        let mut s = Sampler::new(p).unwrap();
        let g = generate(&mut backend, &prompts, 5, &mut s, |_, _| {}).unwrap();
        assert_eq!(g.tokens[0], vec![7, 8]);
        assert_eq!(g.stop[0], StopReason::EndOfText);
        assert_eq!(g.tokens[1], vec![9; 5]);
        assert_eq!(g.stop[1], StopReason::MaxTokens);
        // Prefill of the shared 2 positions, then one position per step,
        // row 1 fed its own prompt tokens 22 and 23 (not the predicted 99).
        assert_eq!(backend.calls[0], (vec![10, 11, 20, 21], 2, 2, 0));
        assert_eq!(backend.calls[1], (vec![7, 22], 2, 1, 2));
        assert_eq!(backend.calls[2], (vec![8, 23], 2, 1, 3));
        for (i, call) in backend.calls.iter().enumerate().skip(1) {
            assert_eq!(call.3, i + 1, "positions advance by one");
        }
    }
}
