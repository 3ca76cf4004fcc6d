//! The checks of user prompts, in one place for every program that runs
//! them (the `host` CLI, [`crate::generate::generate`]): a program checks
//! what it can before the slow parts (loading the model) and the rest once
//! the model is known, with the same messages everywhere.
//!
//! The server checks its requests itself (`serve::api`): its errors are
//! HTTP 400 bodies that name the request's fields.

use anyhow::{Result, bail};

use crate::model::ModelConfig;

/// What a prompt must fit once the model is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLimits {
    /// Positions a prompt may fill: the model's context window, or the
    /// positions a backend was built for.
    pub context: usize,
    /// Every id must be below this.
    pub vocab_size: usize,
}

impl PromptLimits {
    /// The model's own limits: its whole context window and vocabulary.
    pub fn of(config: &ModelConfig) -> PromptLimits {
        PromptLimits {
            context: config.max_seq_len,
            vocab_size: config.vocab_size,
        }
    }
}

/// Checks a batch of tokenized prompts: at least one prompt, none empty, and,
/// given the model's `limits`, each within its context window and every id
/// inside its vocabulary. Without `limits` (the model is not loaded yet) only
/// the first two are checked. Prompts are numbered from 1 in the messages,
/// as a user counts them.
pub fn check_prompts(prompts: &[Vec<u32>], limits: Option<PromptLimits>) -> Result<()> {
    if prompts.is_empty() {
        bail!("no prompt given");
    }
    for (i, p) in prompts.iter().enumerate() {
        let n = i + 1;
        if p.is_empty() {
            bail!("prompt {n} is empty");
        }
        let Some(limits) = limits else { continue };
        if p.len() > limits.context {
            bail!(
                "prompt {n} is {} tokens long, more than the context window of {} tokens",
                p.len(),
                limits.context
            );
        }
        if let Some((_, bad)) = first_out_of_vocab(p, limits.vocab_size) {
            bail!(
                "prompt {n} has token {bad}, outside this model's vocabulary of {}",
                limits.vocab_size
            );
        }
    }
    Ok(())
}

/// Positions that generating up to `max_new_tokens` tokens after `prompts`
/// can use: the longest prompt and its continuation, capped at `context`
/// (generation stops there). What a KV cache for the request needs.
pub fn positions_needed(prompts: &[Vec<u32>], max_new_tokens: usize, context: usize) -> usize {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    longest.saturating_add(max_new_tokens).min(context)
}

/// The first id of `ids` at or past `vocab_size`, with its index: the one
/// vocabulary test behind every check of token ids.
pub fn first_out_of_vocab(ids: &[u32], vocab_size: usize) -> Option<(usize, u32)> {
    ids.iter()
        .enumerate()
        .find(|&(_, &id)| id as usize >= vocab_size)
        .map(|(i, &id)| (i, id))
}
