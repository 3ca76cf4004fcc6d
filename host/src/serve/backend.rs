//! The model interface of continuous batching: a KV cache of independent
//! *slots*, each holding one sequence at its own position.
//!
//! [`crate::generate::Backend`] runs `b` rows that share one position, which
//! is what a static batch needs. A server's sequences arrive and leave at
//! different times, so each one owns a slot of the cache and its own
//! position; a decode step feeds one token to each running slot, whatever
//! its position. The shape is chosen so a GPU can run a whole decode step
//! (every row of [`SlotBackend::decode`]) as one batched launch with
//! per-row positions and cache rows, and sample every row on the device in
//! one more launch ([`SlotBackend::choose`]).

use anyhow::{Result, ensure};
use gpu_kernels::params::sample::SampleRow;

use crate::model::ModelConfig;

/// One row of a decode step: feed `token` at position `pos` of slot `slot`
/// (whose cache holds positions `0..pos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotToken {
    pub slot: usize,
    pub token: u32,
    pub pos: usize,
}

/// One piece of a prefill: `tokens` at positions `pos0..pos0 + tokens.len()`
/// of slot `slot`, whose cache holds positions `0..pos0` (`pos0 > 0`
/// continues it: chunked prefill; `pos0 == 0` starts the slot afresh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotChunk<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub pos0: usize,
}

/// How one row's next token is chosen: the sampling rule of
/// `gpu_kernels::params::sample` with `settings`, draw counter `counter`
/// (the position the chosen token will take, as [`crate::generate::Backend::sample`]
/// uses) and stream index `stream` (the batch row index of that rule; a
/// request's prompt `i` uses `i`, so its tokens equal those of the CLI run on
/// the same prompts with the same seed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub settings: SampleRow,
    pub counter: u32,
    pub stream: u32,
}

/// A model with a KV cache of [`SlotBackend::slots`] independent sequences,
/// each at its own position.
pub trait SlotBackend {
    fn config(&self) -> &ModelConfig;

    /// Number of sequences the cache holds at once.
    fn slots(&self) -> usize;

    /// Positions per slot (prompt + generated tokens of one sequence).
    fn max_seq_len(&self) -> usize;

    /// Run every chunk (distinct slots), as one call where the backend can:
    /// the prompts of several new sequences cost one forward pass, not one
    /// each. Afterwards [`SlotBackend::choose`] sees one row per chunk, in
    /// order: its last position.
    fn prefill_chunks(&mut self, chunks: &[SlotChunk<'_>]) -> Result<()>;

    /// Run `tokens` at positions `pos0..pos0 + tokens.len()` of slot `slot`
    /// (one [`SlotChunk`]). Afterwards [`SlotBackend::choose`] sees one row:
    /// the last position.
    fn prefill(&mut self, slot: usize, tokens: &[u32], pos0: usize) -> Result<()> {
        self.prefill_chunks(&[SlotChunk { slot, tokens, pos0 }])
    }

    /// One decode step: each row feeds its token at its position of its slot
    /// (distinct slots, any positions). Afterwards [`SlotBackend::choose`]
    /// sees one row per entry of `rows`, in that order.
    fn decode(&mut self, rows: &[SlotToken]) -> Result<()>;

    /// The next token of each row of the last [`SlotBackend::prefill`] or
    /// [`SlotBackend::decode`] (`draws[r]` for row `r`; greedy settings pick
    /// the argmax), over the real vocabulary only.
    fn choose(&mut self, draws: &[Draw]) -> Result<Vec<u32>>;

    /// The logits of each row of the last [`SlotBackend::prefill`] or
    /// [`SlotBackend::decode`], in [`SlotBackend::choose`]'s order, each
    /// row the padded vocabulary long (for tests and diagnostics: a server
    /// reads ids).
    fn slot_logits(&mut self) -> Result<Vec<f32>>;
}

/// The argument checks every [`SlotBackend::prefill`] and
/// [`SlotBackend::decode`] makes, with clear errors: slots below `slots`,
/// distinct within a step, positions inside `max_seq_len`, ids inside the
/// vocabulary.
pub fn check_slot_rows(rows: &[SlotToken], slots: usize, max_seq_len: usize, vocab_size: usize) -> Result<()> {
    ensure!(!rows.is_empty(), "empty decode step");
    let mut seen = vec![false; slots];
    for r in rows {
        ensure!(r.slot < slots, "slot {} is beyond the {slots} slots", r.slot);
        ensure!(!seen[r.slot], "slot {} appears twice in one decode step", r.slot);
        seen[r.slot] = true;
        ensure!(
            r.pos < max_seq_len,
            "position {} of slot {} is beyond the {max_seq_len} positions of a slot",
            r.pos,
            r.slot
        );
        ensure!(
            (r.token as usize) < vocab_size,
            "token id {} is outside the vocabulary of {vocab_size}",
            r.token
        );
    }
    Ok(())
}

/// The argument checks every [`SlotBackend::prefill_chunks`] makes, with
/// clear errors: at least one chunk, none empty, slots below `slots` and
/// distinct, positions inside `max_seq_len`, ids inside the vocabulary.
pub fn check_slot_chunks(chunks: &[SlotChunk<'_>], slots: usize, max_seq_len: usize, vocab_size: usize) -> Result<()> {
    ensure!(!chunks.is_empty(), "empty prefill");
    let mut seen = vec![false; slots];
    for ch in chunks {
        ensure!(ch.slot < slots, "slot {} is beyond the {slots} slots", ch.slot);
        ensure!(!seen[ch.slot], "slot {} appears twice in one prefill", ch.slot);
        seen[ch.slot] = true;
        ensure!(!ch.tokens.is_empty(), "empty prefill chunk for slot {}", ch.slot);
        ensure!(
            ch.pos0 + ch.tokens.len() <= max_seq_len,
            "positions {}..{} of slot {} exceed the {max_seq_len} positions of a slot",
            ch.pos0,
            ch.pos0 + ch.tokens.len(),
            ch.slot
        );
        if let Some(&bad) = ch.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            anyhow::bail!("token id {bad} is outside the vocabulary of {vocab_size}");
        }
    }
    Ok(())
}
