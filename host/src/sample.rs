//! Choosing the next token from one row of logits: greedy, temperature,
//! top-k and top-p (nucleus), in the order Hugging Face applies them
//! (temperature, then top-k, then top-p).

use anyhow::{Result, ensure};
use gpu_kernels::params::sample::{SampleRow, is_greedy};
use rand::Rng;

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

/// A seeded sampler on the host; the same seed and logits give the same
/// tokens. It applies the rule of `gpu_kernels::params::sample` (the one the
/// GPU's `sample_forward` kernel applies; `cpu::sample` is its plain twin),
/// so the generation loop may sample on either side and get the same ids.
/// A clone carries the same settings and the same draw counter.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    row: SampleRow,
    /// Draws made by [`Sampler::sample`]: its Philox counter.
    draws: u32,
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
        let row = SampleRow {
            temperature: params.temperature,
            // Beyond u32::MAX keeps every token, as 0 does.
            top_k: u32::try_from(params.top_k).unwrap_or(0),
            top_p: params.top_p,
            _pad: 0,
            seed,
        };
        Ok(Sampler {
            params,
            seed,
            row,
            draws: 0,
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

    /// The per-row settings the sampling rule (and the GPU kernel) reads.
    pub fn row(&self) -> SampleRow {
        self.row
    }

    /// True when every choice is the argmax (no randomness involved).
    pub fn is_greedy(&self) -> bool {
        is_greedy(&self.row)
    }

    /// Pick a token id from the logits of one position over the real
    /// vocabulary (the caller passes `vocab_size` entries, never the
    /// padding). Successive calls draw successive random numbers (the
    /// rule's counter counts the calls; batch row 0).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "no logits to sample from");
        let id = crate::cpu::sample::sample_row(logits, &self.row, self.draws, 0);
        self.draws = self.draws.wrapping_add(1);
        id
    }
}

/// The settings of one row as the sampling rule (and the GPU kernel) reads
/// them: `params` checked as [`Sampler::new`] checks them, with `seed` (the
/// `Sampler`'s own, or any: the same seed and counter give the same token).
/// `top_k` above `u32::MAX` keeps every token, as 0 does.
pub fn device_row(params: &SamplingParams, seed: u64) -> Result<SampleRow> {
    let params = SamplingParams {
        seed: Some(seed),
        ..*params
    };
    Sampler::new(params).map(|s| s.row())
}
