//! Perplexity of a token sequence under a [`Backend`], by the sliding-window
//! method of Hugging Face's "Perplexity of fixed-length models" guide.
//!
//! Windows of `window` tokens start every `stride` tokens (`0, stride,
//! 2*stride, ...`; the last one may be shorter and the evaluation stops at the
//! first window that reaches the end of the text). Each window runs from a
//! fresh cache (positions `0..len`) and scores only the tokens that the
//! previous window did not score, so every scored token is predicted exactly
//! once, with at least `window - stride` tokens of context once the first
//! window is past. Token `j` is scored by the logits at `j - 1`, so the very
//! first token of the text is never scored, and the first token of a window
//! is never scored by that window. With `stride == window` the windows do not
//! overlap and the first token of each window goes unscored (as in Hugging
//! Face's loop); with `stride < window` every token after the first is scored
//! exactly once.
//!
//! The negative log-likelihood of each token is `logsumexp(logits[..V]) -
//! logits[target]` over the real vocabulary only (the padded entries `V..Vp`
//! are ignored), from [`Backend::crossentropy`]: in f64 on the host by
//! default, in f32 on the GPU (only one float per position comes back).
//! The sum is taken in f64. Perplexity is `exp(mean NLL)`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::generate::{Backend, IGNORED_TARGET, LogitsWanted};
use crate::prompt::first_out_of_vocab;

/// One window of the evaluation: the backend reads tokens `begin..end` at
/// positions `0..end - begin` and the window scores the targets
/// `score_from..end` (each from the logits of the token before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub begin: usize,
    pub end: usize,
    pub score_from: usize,
}

impl Window {
    /// Tokens the backend reads for this window.
    pub fn len(&self) -> usize {
        self.end - self.begin
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.begin
    }

    /// Tokens this window scores.
    pub fn scored(&self) -> usize {
        self.end - self.score_from
    }
}

/// Settings of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerplexityConfig {
    /// Tokens per window (at least 2, at most the backend's `max_seq_len`).
    pub window: usize,
    /// Tokens between the starts of consecutive windows (`1..=window`).
    pub stride: usize,
    /// Windows of equal length run together as one forward call of this many
    /// rows at most (the backend must have been built for that batch size).
    pub batch: usize,
}

/// What an evaluation measured.
#[derive(Clone, Debug)]
pub struct PerplexityReport {
    /// Tokens whose probability was scored.
    pub tokens_scored: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Token positions run through the model (overlaps counted each time).
    pub positions: usize,
    /// Sum of the scored tokens' negative log-likelihoods (nats).
    pub total_nll: f64,
    /// Wall time of the forward calls and the scoring.
    pub elapsed: Duration,
}

impl PerplexityReport {
    /// Mean negative log-likelihood per scored token (nats).
    pub fn mean_nll(&self) -> f64 {
        self.total_nll / self.tokens_scored as f64
    }

    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }

    /// Scored tokens per second.
    pub fn tokens_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.tokens_scored as f64 / secs
        } else {
            0.0
        }
    }
}

/// Fewest tokens a window needs to score anything (one of context, one target).
pub const MIN_WINDOW: usize = 2;
/// Fewest tokens a text needs to be scored at all.
pub const MIN_TOKENS: usize = 2;

/// The windows of a text of `n_tokens` tokens, checking the settings.
pub fn plan_windows(n_tokens: usize, window: usize, stride: usize) -> Result<Vec<Window>> {
    ensure!(
        n_tokens >= MIN_TOKENS,
        "the text has {n_tokens} token(s); at least {MIN_TOKENS} are needed to score one"
    );
    ensure!(
        window >= MIN_WINDOW,
        "a window of {window} token(s) scores nothing; it must be at least {MIN_WINDOW}"
    );
    ensure!(stride > 0, "the stride must be at least 1");
    ensure!(
        stride <= window,
        "a stride of {stride} is larger than the window of {window}: tokens between windows would never be read"
    );
    let mut windows = Vec::new();
    let mut prev_end = 0;
    let mut begin = 0;
    loop {
        let end = (begin + window).min(n_tokens);
        let score_from = prev_end.max(begin + 1);
        // A last window of one token (stride == window) has nothing to score.
        if score_from < end {
            windows.push(Window { begin, end, score_from });
        }
        if end == n_tokens {
            break;
        }
        prev_end = end;
        begin += stride;
    }
    Ok(windows)
}

/// Perplexity of `tokens` with windows of `window` tokens advanced by
/// `stride`, one window per forward call.
pub fn perplexity<B: Backend + ?Sized>(
    backend: &mut B,
    tokens: &[u32],
    window: usize,
    stride: usize,
) -> Result<PerplexityReport> {
    let config = PerplexityConfig {
        window,
        stride,
        batch: 1,
    };
    perplexity_with(backend, tokens, &config, |_, _| {})
}

/// Perplexity with every setting, calling `progress(windows_done, windows)`
/// after each forward call.
pub fn perplexity_with<B: Backend + ?Sized>(
    backend: &mut B,
    tokens: &[u32],
    config: &PerplexityConfig,
    mut progress: impl FnMut(usize, usize),
) -> Result<PerplexityReport> {
    let PerplexityConfig { window, stride, batch } = *config;
    let max_seq_len = backend.max_seq_len();
    let v = backend.config().vocab_size;
    ensure!(batch > 0, "the batch size must be at least 1");
    ensure!(
        window <= max_seq_len,
        "a window of {window} tokens is larger than the context of {max_seq_len} tokens"
    );
    if let Some((i, bad)) = first_out_of_vocab(tokens, v) {
        bail!("token {i} of the text is id {bad}, outside the vocabulary of {v}");
    }
    let windows = plan_windows(tokens.len(), window, stride)?;

    let start = Instant::now();
    let mut report = PerplexityReport {
        tokens_scored: 0,
        windows: windows.len(),
        positions: 0,
        total_nll: 0.0,
        elapsed: Duration::ZERO,
    };
    let mut done = 0;
    let mut input = Vec::new();
    let mut targets = Vec::new();
    while done < windows.len() {
        // A group of consecutive windows of one length (all full ones but the last).
        let t = windows[done].len();
        let rows = windows[done..].iter().take(batch).take_while(|w| w.len() == t).count();
        let group = &windows[done..done + rows];
        input.clear();
        for w in group {
            input.extend_from_slice(&tokens[w.begin..w.end]);
        }
        backend
            .forward(&input, rows, t, 0, LogitsWanted::All)
            .with_context(|| format!("forward pass of windows {}..{}", done, done + rows))?;
        // Position p of window r is scored against token p + 1 where that
        // token is one the window scores.
        targets.clear();
        targets.resize(rows * t, IGNORED_TARGET);
        for (r, w) in group.iter().enumerate() {
            for j in w.score_from..w.end {
                targets[r * t + (j - 1 - w.begin)] = tokens[j];
            }
        }
        let losses = backend
            .crossentropy(&targets)
            .with_context(|| format!("scoring windows {}..{}", done, done + rows))?;
        ensure!(
            losses.len() == rows * t,
            "the backend returned {} losses, expected {rows} x {t}",
            losses.len()
        );
        let nll: f64 = losses.iter().sum();
        ensure!(
            nll.is_finite(),
            "the negative log-likelihood of windows {}..{} is not finite ({nll}): the backend produced non-finite logits",
            done,
            done + rows
        );
        report.total_nll += nll;
        report.tokens_scored += group.iter().map(Window::scored).sum::<usize>();
        report.positions += rows * t;
        done += rows;
        progress(done, windows.len());
    }
    report.elapsed = start.elapsed();
    Ok(report)
}
