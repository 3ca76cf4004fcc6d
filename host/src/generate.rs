//! One generation loop over a [`Backend`]; the CPU reference and the GPU
//! engine differ only in how they compute logits.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
pub use gpu_kernels::params::crossentropy::IGNORED_TARGET;
use gpu_kernels::params::sample::SampleRow;
use rayon::prelude::*;

use crate::cpu::ops::token_nll;
use crate::cpu::sample::sample_row;
use crate::model::ModelConfig;
use crate::model::config::EOT_TOKEN;
use crate::prompt::{PromptLimits, check_prompts, first_out_of_vocab};
use crate::sample::Sampler;

/// Which logits a forward call must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// Only the last position of each row (generation).
    Last,
    /// Every position (tests, perplexity).
    All,
}

/// Something that runs GPT-2 forward with a KV cache.
pub trait Backend {
    fn config(&self) -> &ModelConfig;

    /// Longest sequence (prompt + generated) the backend was built for; the
    /// generation loop stops cleanly there.
    fn max_seq_len(&self) -> usize {
        self.config().max_seq_len
    }

    /// Run `tokens` (`b` rows of `t` ids, row-major) at positions
    /// `pos0..pos0 + t` of every row, appending their keys and values to the
    /// KV cache, which must already hold positions `0..pos0` of these rows
    /// (`pos0 == 0` starts fresh). Errors (never panics) when `b` or
    /// `pos0 + t` exceed what the backend was built for, or an id is out of
    /// the vocabulary.
    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> anyhow::Result<()>;

    /// Logits of the last `forward`: `[b, 1, Vp]` for `Last`, `[b, t, Vp]` for `All`.
    fn logits(&mut self) -> anyhow::Result<Vec<f32>>;

    /// Each logits row's negative log-likelihood (nats) of its target over
    /// the real vocabulary: `targets` holds one id per row of the last
    /// `forward` (`b * t` rows after `All`, `b` after `Last`), or
    /// [`IGNORED_TARGET`] for a row that is not scored (its loss is 0).
    /// Errors on a target outside the vocabulary. Default: from
    /// [`Backend::logits`], in f64 on the host (`cpu::ops::token_nll`).
    fn crossentropy(&mut self, targets: &[u32]) -> anyhow::Result<Vec<f64>> {
        let (v, vp) = (self.config().vocab_size, self.config().padded_vocab_size);
        let logits = self.logits()?;
        check_targets(targets, logits.len() / vp, v)?;
        Ok(targets
            .par_iter()
            .zip(logits.par_chunks(vp))
            .map(|(&target, row)| {
                if target == IGNORED_TARGET {
                    0.0
                } else {
                    token_nll(row, v, target)
                }
            })
            .collect())
    }

    /// Greedy choice at the last position of each row of the last `forward`,
    /// over the real vocabulary only (padded entries are never chosen; ties
    /// go to the lowest id).
    fn argmax(&mut self) -> anyhow::Result<Vec<u32>>;

    /// The settings the following steps will be sampled with (one per row;
    /// `None`: greedy), so a backend may fold the choice into its decode
    /// step. Default: nothing to prepare.
    fn prepare_sampling(&mut self, rows: Option<&[SampleRow]>) -> anyhow::Result<()> {
        let _ = rows;
        Ok(())
    }

    /// Each row's next token at the last position of the last `forward`, by
    /// the rule of `gpu_kernels::params::sample` with settings `rows[r]`,
    /// draw counter `pos` (the position the chosen token will take) and
    /// row index `r`. Default: from [`Backend::logits`], with the CPU twin
    /// of the rule (`cpu::sample`).
    fn sample(&mut self, rows: &[SampleRow], pos: usize) -> anyhow::Result<Vec<u32>> {
        let (v, vp) = (self.config().vocab_size, self.config().padded_vocab_size);
        let logits = self.logits()?;
        let b = rows.len();
        ensure!(
            b > 0 && logits.len().is_multiple_of(b * vp),
            "sample(): {b} rows of settings for {} logits",
            logits.len()
        );
        let per_row = logits.len() / (b * vp);
        let counter = u32::try_from(pos).context("position beyond the sampling counter")?;
        Ok(rows
            .iter()
            .enumerate()
            .map(|(r, cfg)| {
                let at = (r * per_row + per_row - 1) * vp;
                sample_row(&logits[at..at + v], cfg, counter, r as u32)
            })
            .collect())
    }

    /// Pipelined decoding, after a decode step (`forward` with `t = 1`):
    /// queue one more step that feeds each row the token the last step
    /// chose, at position `pos` (the next one), and return that choice
    /// (what `argmax` or, when sampling was prepared, `sample` would give),
    /// read while the new step runs. `None` when the backend cannot do this
    /// now (nothing was queued; use `forward`). Default: `None`.
    fn choose_and_step(&mut self, pos: usize) -> anyhow::Result<Option<Vec<u32>>> {
        let _ = pos;
        Ok(None)
    }

    /// Generate a batch: what [`generate`] does and returns, with the same
    /// arguments, checks and policy (it is the one implementation of the
    /// policy; this is how a caller holding a `dyn Backend` reaches it).
    /// `on_token(row, id)` receives every generated token exactly once, in
    /// order within each row; the rows' tokens may interleave in another
    /// order than one step at a time. Default: [`generate`] on `self`. A
    /// backend made of independent parts may run the loop on each part's
    /// rows at once (`Replicas`), its tokens those of one backend.
    fn generate_batch(
        &mut self,
        prompts: &[Vec<u32>],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> anyhow::Result<Generation> {
        generate(self, prompts, max_new_tokens, sampler, on_token)
    }
}

/// What a [`Backend`] was built for, which [`check_forward_args`] checks a
/// call against.
#[derive(Clone, Copy, Debug)]
pub struct ForwardLimits<'a> {
    /// Rows per call.
    pub max_batch: usize,
    /// Positions per sequence.
    pub max_seq_len: usize,
    /// Token ids below it are valid.
    pub vocab_size: usize,
    /// What was built, as the messages name it: "model", "engine".
    pub built: &'a str,
}

/// The argument checks every [`Backend::forward`] makes before touching its
/// buffers: a non-empty call of `b` rows of `t` ids from `pos0`, within the
/// rows and positions of `limits`, every id below its vocabulary.
pub fn check_forward_args(tokens: &[u32], b: usize, t: usize, pos0: usize, limits: ForwardLimits) -> Result<()> {
    let ForwardLimits {
        max_batch,
        max_seq_len,
        vocab_size,
        built,
    } = limits;
    ensure!(b > 0 && t > 0, "empty forward call (b = {b}, t = {t})");
    ensure!(
        b <= max_batch,
        "batch of {b} rows exceeds the {max_batch} this {built} was built for"
    );
    ensure!(
        pos0 + t <= max_seq_len,
        "positions {pos0}..{} exceed the {max_seq_len} this {built} was built for",
        pos0 + t
    );
    ensure!(
        tokens.len() == b * t,
        "{} tokens given for b = {b}, t = {t}",
        tokens.len()
    );
    if let Some((_, bad)) = first_out_of_vocab(tokens, vocab_size) {
        bail!("token id {bad} is outside the vocabulary of {vocab_size}");
    }
    Ok(())
}

/// The argument checks of every [`Backend::crossentropy`]: one target per
/// row of logits (`rows`), each below `vocab_size` or [`IGNORED_TARGET`].
pub fn check_targets(targets: &[u32], rows: usize, vocab_size: usize) -> Result<()> {
    ensure!(
        targets.len() == rows,
        "crossentropy(): {} targets for {rows} rows of logits",
        targets.len()
    );
    if let Some((i, &bad)) = targets
        .iter()
        .enumerate()
        .find(|&(_, &t)| t != IGNORED_TARGET && t as usize >= vocab_size)
    {
        bail!("target {i} is id {bad}, outside the vocabulary of {vocab_size}");
    }
    Ok(())
}

/// Why a row stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced `<|endoftext|>` (not part of the output).
    EndOfText,
    /// `max_new_tokens` tokens were generated.
    MaxTokens,
    /// The next position would reach the backend's `max_seq_len`.
    ContextLimit,
}

/// What [`generate`] did.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated ids per row (prompt and `<|endoftext|>` excluded).
    pub tokens: Vec<Vec<u32>>,
    /// Why each row stopped.
    pub stop: Vec<StopReason>,
    /// Sum of the rows' generated tokens.
    pub generated: usize,
    /// Positions in the cache at the end (prompt + generated, shared by all rows).
    pub positions: usize,
    /// Time of the first forward call (the shared part of the prompts).
    pub prefill_time: Duration,
    /// Time of everything after it.
    pub decode_time: Duration,
}

impl Generation {
    /// True when some row was cut by the context window.
    pub fn hit_context_limit(&self) -> bool {
        self.stop.contains(&StopReason::ContextLimit)
    }

    /// Generated tokens per second over the whole call.
    pub fn tokens_per_second(&self) -> f64 {
        let secs = (self.prefill_time + self.decode_time).as_secs_f64();
        if secs > 0.0 { self.generated as f64 / secs } else { 0.0 }
    }

    /// One batch's result from the results of its contiguous row ranges,
    /// given in row order, each generated on its own at the same time
    /// (data-parallel replicas): rows' tokens and stop reasons
    /// concatenated, `generated` summed, `positions` the furthest part's
    /// (the whole batch stops where its last row does), and
    /// `prefill_time` and `decode_time` each the slowest part's (the parts
    /// ran concurrently, so the call took about as long as its slowest
    /// part; the sum of the two maxima can exceed that part's own total
    /// when another part's prefill was the slower one).
    pub fn merge_concurrent(parts: impl IntoIterator<Item = Generation>) -> Generation {
        let mut out = Generation {
            tokens: Vec::new(),
            stop: Vec::new(),
            generated: 0,
            positions: 0,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
        };
        for part in parts {
            out.tokens.extend(part.tokens);
            out.stop.extend(part.stop);
            out.generated += part.generated;
            out.positions = out.positions.max(part.positions);
            out.prefill_time = out.prefill_time.max(part.prefill_time);
            out.decode_time = out.decode_time.max(part.decode_time);
        }
        out
    }
}

/// Generate up to `max_new_tokens` tokens after each prompt (one batch row
/// per prompt), calling `on_token(row, id)` as each one is chosen.
///
/// Policy (docs/design.md): all rows share one position. The prompts are
/// prefilled up to the shortest one's length; longer prompts continue through
/// decode steps with their own next token forced in place of the chosen one.
/// A row stops at `<|endoftext|>` or after `max_new_tokens` tokens; the whole
/// batch stops, with [`StopReason::ContextLimit`], when the next token would
/// sit at position `backend.max_seq_len()`.
///
/// Choosing: greedy reads back only the ids (`backend.argmax()`); other
/// sampling asks `backend.sample()` with the sampler's settings for every
/// row (the GPU engine samples on the device; the draw counter is the
/// position, so the same seed gives the same tokens on either backend where
/// their logits agree). Once every row is past its prompt, the loop
/// pipelines where the backend can (`choose_and_step`): the device runs
/// step k+1 while the host reads and streams step k's tokens (a row that
/// just finished costs one step that is thrown away).
///
/// The prompts are checked first ([`check_prompts`], against the backend's
/// positions and vocabulary), so a bad one fails before any forward call.
///
/// Of the sampler only its settings are read (`is_greedy`, `row`): every
/// random draw is keyed by the seed, the row and the position, so the
/// sampler's own draw counter ([`Sampler::sample`]'s) is left as it was.
/// Rows are therefore independent: a batch split into row ranges, each run
/// through this function with its rows' random streams
/// (`GpuEngine::set_sample_stream_offset`), gives the same tokens wherever
/// the logits agree ([`Backend::generate_batch`] of the replicas does this;
/// fewer rows or another shared prompt length may pick other kernels, whose
/// logits differ by rounding).
pub fn generate<B: Backend + ?Sized>(
    backend: &mut B,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Generation> {
    let b = prompts.len();
    let max_seq_len = backend.max_seq_len();
    let limits = PromptLimits {
        context: max_seq_len,
        vocab_size: backend.config().vocab_size,
    };
    check_prompts(prompts, Some(limits))?;
    let mut result = Generation {
        tokens: vec![Vec::new(); b],
        stop: vec![StopReason::MaxTokens; b],
        generated: 0,
        positions: 0,
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
    };
    if max_new_tokens == 0 {
        return Ok(result);
    }

    // Prefill the part every prompt has.
    let start = Instant::now();
    let shared = prompts.iter().map(Vec::len).min().unwrap_or(0);
    let mut batch: Vec<u32> = prompts.iter().flat_map(|p| p[..shared].iter().copied()).collect();
    backend.forward(&batch, b, shared, 0, LogitsWanted::Last)?;
    result.prefill_time = start.elapsed();
    let decode_start = Instant::now();

    let rows: Option<Vec<SampleRow>> = (!sampler.is_greedy()).then(|| vec![sampler.row(); b]);
    backend.prepare_sampling(rows.as_deref())?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);

    // `pos`: position of the token chosen next (= tokens in the cache).
    let mut pos = shared;
    let mut active = vec![true; b];
    let mut last_fed: Vec<u32> = prompts.iter().map(|p| p[shared - 1]).collect();
    // Whether a decode step has run (`choose_and_step` needs one).
    let mut decoded = false;
    loop {
        if pos >= max_seq_len {
            for (stop, _) in result.stop.iter_mut().zip(&active).filter(|(_, a)| **a) {
                *stop = StopReason::ContextLimit;
            }
            break;
        }
        let needs_choice = |row: usize| active[row] && pos >= prompts[row].len();
        // Pipeline when every row feeds its own choice next (all past their
        // prompts), a next step fits, and some row may still want it.
        let may_continue = (0..b).any(|r| active[r] && result.tokens[r].len() + 1 < max_new_tokens);
        let pipelined = decoded && pos >= longest && pos + 1 < max_seq_len && may_continue;
        let mut stepped = false;
        let chosen: Vec<u32> = if !(0..b).any(needs_choice) {
            vec![0; b]
        } else if let Some(ids) = if pipelined { backend.choose_and_step(pos)? } else { None } {
            stepped = true;
            ids
        } else if let Some(rows) = &rows {
            backend.sample(rows, pos)?
        } else {
            backend.argmax()?
        };
        batch.clear();
        for row in 0..b {
            let prompt = &prompts[row];
            let id = if pos < prompt.len() {
                prompt[pos] // teacher forcing: this row is still reading its prompt
            } else if active[row] {
                let id = chosen[row];
                if id == EOT_TOKEN {
                    active[row] = false;
                    result.stop[row] = StopReason::EndOfText;
                } else {
                    result.tokens[row].push(id);
                    result.generated += 1;
                    on_token(row, id);
                    if result.tokens[row].len() == max_new_tokens {
                        active[row] = false;
                        result.stop[row] = StopReason::MaxTokens;
                    }
                }
                id
            } else {
                // A finished row rides along, fed its previous token again
                // (always a valid id); its output is ignored.
                last_fed[row]
            };
            last_fed[row] = id;
            batch.push(id);
        }
        if !active.iter().any(|&a| a) {
            break;
        }
        // The chosen tokens occupy position `pos`; one more is wanted after it.
        if pos + 1 >= max_seq_len {
            pos += 1;
            continue; // reports the context limit
        }
        if !stepped {
            backend.forward(&batch, b, 1, pos, LogitsWanted::Last)?;
        }
        decoded = true;
        pos += 1;
    }
    result.positions = pos;
    result.decode_time = decode_start.elapsed();
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(
        tokens: Vec<Vec<u32>>,
        stop: Vec<StopReason>,
        positions: usize,
        prefill_ms: u64,
        decode_ms: u64,
    ) -> Generation {
        Generation {
            generated: tokens.iter().map(Vec::len).sum(),
            tokens,
            stop,
            positions,
            prefill_time: Duration::from_millis(prefill_ms),
            decode_time: Duration::from_millis(decode_ms),
        }
    }

    #[test]
    fn merged_generation_concatenates_rows_and_takes_the_slowest_part() {
        let first = part(
            vec![vec![1, 2, 3], vec![4]],
            vec![StopReason::MaxTokens, StopReason::EndOfText],
            10,
            5,
            40,
        );
        let second = part(vec![vec![7, 8]], vec![StopReason::ContextLimit], 12, 9, 30);
        let g = Generation::merge_concurrent([first, second]);
        assert_eq!(g.tokens, vec![vec![1, 2, 3], vec![4], vec![7, 8]]);
        assert_eq!(
            g.stop,
            vec![StopReason::MaxTokens, StopReason::EndOfText, StopReason::ContextLimit]
        );
        assert_eq!(g.generated, 6);
        assert_eq!(g.positions, 12);
        assert_eq!(g.prefill_time, Duration::from_millis(9));
        assert_eq!(g.decode_time, Duration::from_millis(40));
        assert!(g.hit_context_limit());

        // One part is that part; none is an empty batch.
        let alone = part(vec![vec![5]], vec![StopReason::MaxTokens], 3, 1, 2);
        let g = Generation::merge_concurrent([alone.clone()]);
        assert_eq!(
            (
                g.tokens,
                g.stop,
                g.generated,
                g.positions,
                g.prefill_time,
                g.decode_time
            ),
            (
                alone.tokens,
                alone.stop,
                alone.generated,
                alone.positions,
                alone.prefill_time,
                alone.decode_time
            )
        );
        let g = Generation::merge_concurrent([]);
        assert!(g.tokens.is_empty() && g.stop.is_empty());
        assert_eq!((g.generated, g.positions), (0, 0));
        assert_eq!(g.prefill_time + g.decode_time, Duration::ZERO);
    }
}
