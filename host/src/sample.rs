//! Choosing the next token from one row of logits: greedy, temperature,
//! top-k and top-p (nucleus), in the order Hugging Face applies them
//! (temperature, then top-k, then top-p).

use anyhow::{Result, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick tokens. `temperature == 0` means greedy (argmax).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Logits are divided by this; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches
    /// `top_p` (1.0 = all).
    pub top_p: f32,
    /// Seed of the random generator; `None` draws one (see [`Sampler::seed`]).
    pub seed: Option<u64>,
}

impl SamplingParams {
    /// Always the most likely token.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: None,
    };
}

/// A seeded sampler; the same seed and logits give the same tokens.
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: StdRng,
}

impl Sampler {
    /// Checks the parameters (clear errors for bad flags).
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        ensure!(
            params.temperature.is_finite() && params.temperature >= 0.0,
            "temperature must be a finite number >= 0 (0 = greedy), got {}",
            params.temperature
        );
        ensure!(
            params.top_p > 0.0 && params.top_p <= 1.0,
            "top-p must be in (0, 1], got {}",
            params.top_p
        );
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Ok(Sampler {
            params,
            seed,
            rng: StdRng::seed_from_u64(seed),
        })
    }

    /// The seed in use (drawn at random when none was given): pass it back
    /// as `seed` to repeat a run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when every choice is the argmax (no randomness involved).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0 || self.params.top_k == 1
    }

    /// Pick a token id from the logits of one position over the real
    /// vocabulary (the caller passes `vocab_size` entries, never the padding).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "no logits to sample from");
        if self.is_greedy() {
            return crate::cpu::forward::argmax(logits);
        }
        // Candidates, most likely first (ties: lowest id first).
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / self.params.temperature))
            .collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.params.top_k > 0 && self.params.top_k < cand.len() {
            cand.select_nth_unstable_by(self.params.top_k - 1, by_logit);
            cand.truncate(self.params.top_k);
        }
        cand.sort_unstable_by(by_logit);

        // Softmax over the candidates.
        let max = cand[0].1;
        let mut probs: Vec<f32> = cand.iter().map(|&(_, l)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);

        // Nucleus: the shortest prefix whose mass reaches top_p.
        let mut keep = probs.len();
        if self.params.top_p < 1.0 {
            let mut mass = 0.0;
            for (i, p) in probs.iter().enumerate() {
                mass += p;
                if mass >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept_mass: f32 = probs[..keep].iter().sum();
        let mut u = self.rng.random::<f32>() * kept_mass;
        for i in 0..keep {
            u -= probs[i];
            if u < 0.0 {
                return cand[i].0;
            }
        }
        cand[keep - 1].0
    }
}
